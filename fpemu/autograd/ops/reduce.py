"""Reductions.

Under the CUDA profile ``sum``, ``mean`` and the 1- and 2-norms add in float32
(float64 for float64 tensors) in the order of ATen's CUDA reduction kernel
(``aten/src/ATen/native/cuda/Reduce.cuh``, modelled in
:mod:`fpemu.autograd._cuda_reduce`; ``docs/pytorch-numerics.md`` §6.1) and round
the accumulator once to the output dtype. Under the CPU profile ``sum``,
``mean``, ``nansum``, ``prod``, the norms, ``var`` and ``std`` compute as ATen's
CPU kernels do, in their dtype and order (:mod:`fpemu.autograd._cpu_reduce`,
``docs/pytorch-numerics.md`` §6.2), for the tensor's layout, the profile's
capability and thread count. The rest (the CUDA profile's var, std, prod and
other norms; ``logsumexp``, whose exp and log torch CPU takes from MKL) sum in
float64 and round once (tier 2, ``docs/autograd.md``). Max, min, argmax,
topk and sort are exact.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["all", "amax", "amin", "any", "argmax", "argmin", "argsort", "count_nonzero", "cumprod",
           "cumsum", "logsumexp", "max", "mean", "min", "norm", "prod", "sort", "std", "sum",
           "topk", "var"]

import builtins
import collections

import numpy as np

from .. import _aten
from .._autocast import cast_inputs
from .._core import (
    Tensor, _named, _result, _store, bfloat16, bool_, float16, float32, float64, int64,
    is_float, to_dtype,
)
from ...errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from .._common import f64, wrap_dim
from .._cpu_reduce import cpu_norm, cpu_prod, cpu_sum, cpu_var
from .._cuda_reduce import cuda_mean, cuda_norm, cuda_sum
from .._profile import get_profile
from .elementwise import _tensor_args, maximum, minimum
from .inplace import write_out

_values_indices = collections.namedtuple("torch_return_types", ["values", "indices"])


def _axes(dim, ndim):
    """The numpy axes of a reduction over ``dim`` (None or () for all);
    a 0-d tensor reduces over nothing."""
    if dim is None:
        return tuple(range(ndim))
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    axes = [wrap_dim(d, ndim) for d in dims]
    for a in set(axes):
        if axes.count(a) > 1:
            raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(axes)) if ndim else ()


def _expand_back(g, axes, keepdim, shape):
    if not keepdim:
        for ax in axes:
            g = np.expand_dims(g, ax)
    return np.broadcast_to(g, shape)


def _cuda():
    return get_profile().device == "cuda"


def _cpu_sum(x, axes, keepdim, nan=False):
    """The CPU profile's sum of a floating tensor: ATen's cascade_sum order
    (:func:`fpemu.autograd._cpu_reduce.cpu_sum`), stored in the tensor's
    dtype (a bfloat16 / float16 sum rounds as torch's kernel does)."""
    p = get_profile()
    data = x._data
    half = "bfloat16" if x.dtype is bfloat16 else "float16" if x.dtype is float16 else None
    res = cpu_sum(data, axes, keepdim, threads=p.cpu_threads, capability=p.cpu_capability,
                  nan=nan, dtype=half)
    return _store(res, x.dtype) if half is None else res


def sum(x, dim=None, keepdim=False, dtype=None):
    """Sum: under the CUDA profile in float32 (float64 for float64) in the
    order of ATen's CUDA kernel (:func:`fpemu.autograd._cuda_reduce.cuda_sum`),
    rounded once to the output dtype; under the CPU profile in ATen's CPU
    order (:func:`fpemu.autograd._cpu_reduce.cpu_sum`). Integer and bool
    inputs sum to int64. Under autocast the op runs with dtype=float32 (fp32
    output)."""
    return _sum_impl(x, dim, keepdim, dtype, nan=False)


def _sum_impl(x, dim, keepdim, dtype, nan):
    """sum, and nansum's CPU kernel (``nan``: NaN loaded as 0; its gradient 0)."""
    if dtype is None:
        (x,) = cast_inputs("nansum" if nan else "sum", x)
    else:
        x = to_dtype(x, dtype)
    dt = x.dtype if is_float(x.dtype) else int64
    axes = _axes(dim, x.ndim)
    if not is_float(dt):
        return Tensor(np.asarray(np.sum(x._data, axis=axes, keepdims=keepdim)).astype(
            np.int64), int64)
    if _cuda():
        res = cuda_sum(x._data, axes, keepdim, dt)
    else:
        res = _cpu_sum(x, axes, keepdim, nan)

    def backward(g):
        gi = _expand_back(g, axes, keepdim, x.shape)
        if nan:
            gi = np.where(np.isnan(x._data), np.zeros((), gi.dtype), gi)
        return (gi,)
    name = ("nansum" if dim is None else "NansumBackward0") if nan else (
        "sum" if dim is None else "SumBackward1")
    return _result(res, dt, (x,), backward, op=name)


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean (not in the autocast lists: a bf16 input gives a bf16 output).
    CUDA profile: the float32 sum in ATen's CUDA order times
    ``float(outputs) / numel`` (MeanOps, :func:`fpemu.autograd._cuda_reduce.cuda_mean`);
    CPU profile: float64 sum divided by the count, rounded once."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    if not is_float(x.dtype):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either "
                           f"a floating point or complex dtype. Got: {_scalar_name(x.dtype)}")
    dt = x.dtype
    axes = _axes(dim, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    if _cuda() and x._data.size:
        res = cuda_mean(x._data, axes, keepdim, dt)
    elif x._data.size:
        # ReduceOps.cpp mean_out on CPU: the sum (16-bit tensors: of a float32
        # copy, in float32) divided by the count, then stored in the dtype
        xs = x if dt in (float32, float64) else to_dtype(x, float32)
        om = np.float64 if dt is float64 else np.float32
        with np.errstate(all="ignore"):
            res = _store(_cpu_sum(xs, axes, keepdim) / om(n), dt)
    else:
        with np.errstate(all="ignore"):
            res = _store(np.sum(f64(x), axis=axes, keepdims=keepdim) / n, dt)

    def backward(g):
        # torch's mean_backward divides by the count, a number: on CUDA a
        # multiplication by its reciprocal (docs/pytorch-numerics.md §3.2)
        om = np.float64 if dt is float64 else np.float32
        with np.errstate(all="ignore"):
            gi = _aten.div_scalar(np.asarray(g, om), n, dt) if n else _store(
                np.asarray(g, np.float64) / n, dt)
        return (_expand_back(gi, axes, keepdim, x.shape),)
    return _result(res, dt, (x,), backward, op="mean" if dim is None else "MeanBackward1")


def _scalar_name(dt):
    return {"int64": "Long", "int32": "Int", "bool": "Bool", "int16": "Short",
            "int8": "Char", "uint8": "Byte"}.get(dt.name, dt.name)


def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Variance (``correction`` 1 by default, as torch); ``var(x, False)`` is
    torch's older ``var(input, unbiased)``. Under the CPU profile float32 and
    float64 as ATen's CPU kernels compute it (the full reduction's double sum
    of squared deviations from the float mean, Welford in double per output
    elsewhere: :func:`fpemu.autograd._cpu_reduce.cpu_var`); otherwise in
    float64, rounded once."""
    return _var_std(x, dim, unbiased, keepdim, correction, False)[0]


def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """The square root of :func:`var`, taken before the rounding to the dtype
    (as torch's kernels do)."""
    return _var_std(x, dim, unbiased, keepdim, correction, True)[0]


def _var_std(x, dim, unbiased, keepdim, correction, take_sqrt, with_mean=False):
    """var or std (``take_sqrt``), and with ``with_mean`` the mean torch's
    var_mean / std_mean return with it (their Welford mean under the CPU
    profile), as (tensor, mean array or None)."""
    if isinstance(dim, (bool, np.bool_)):
        if unbiased is not None:
            raise FpemuTypeError("var(): unbiased passed twice (positionally as the second "
                                 "argument and by name)")
        dim, unbiased = None, bool(dim)
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    axes = _axes(dim, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    X = f64(x)
    mu = X.mean(axis=axes, keepdims=True)
    dev = X - mu
    denom = builtins.max(n - correction, 0)
    mean = None
    if not _cuda() and x.dtype in (float32, float64) and x._data.size:
        v, mean = cpu_var(x._data, axes, correction, keepdim, take_sqrt=take_sqrt,
                          threads=get_profile().cpu_threads, with_mean=with_mean)
        res = _store(v, x.dtype)
    else:
        with np.errstate(all="ignore"):
            v = (dev * dev).sum(axis=axes, keepdims=keepdim) / denom
            res = _store(np.sqrt(v) if take_sqrt else v, x.dtype)

    def backward(g):
        # torch's var_backward: 2 / dof * grad * (x - mean); std_backward
        # divides the gradient by 2 * std first
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        with np.errstate(all="ignore"):
            if take_sqrt:
                G = G / _expand_back(2.0 * res.astype(np.float64), axes, keepdim, x.shape)
            return (_store(G * 2 * dev / denom, x.dtype),)
    out = _result(res, x.dtype, (x,), backward, saved=(x,), op="std" if take_sqrt else "var")
    return out, mean


def amax(x, dim=None, keepdim=False, *, out=None):
    return write_out(out, _extreme(x, dim, keepdim, np.max, "amax"), "amax")


def amin(x, dim=None, keepdim=False, *, out=None):
    return write_out(out, _extreme(x, dim, keepdim, np.min, "amin"), "amin")


def _extreme(x, dim, keepdim, npop, name):
    axes = _axes(() if dim is None else dim, x.ndim)
    if x._data.size == 0:
        if dim is None or dim == () or dim == []:
            raise FpemuRuntimeError(f"{name}(): Expected reduction dim to be specified for "
                                    f"input.numel() == 0. Specify the reduction dim with the "
                                    f"'dim' argument.")
        empty = [a for a in axes if x.shape[a] == 0]
        if empty:
            raise IndexError(f"{name}(): Expected reduction dim {empty[0]} to have non-zero "
                             f"size.")
    res = np.asarray(npop(x._data, axis=axes, keepdims=keepdim))
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        full = npop(x._data, axis=axes, keepdims=True)
        hit = (x._data == full)
        count = hit.sum(axis=axes, keepdims=True)
        G = _expand_back(g, axes, keepdim, x.shape).astype(np.float64)
        return (_store(np.where(hit, G / count, 0.0), x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op=name)


def _select_extreme(x, dim, keepdim, arg, name):
    """max(x, dim) / min(x, dim): values and int64 indices (the first one
    on ties; NaN propagates, as torch)."""
    d = wrap_dim(dim, x.ndim)
    if x.ndim == 0:
        return _values_indices(x, Tensor(np.asarray(0, np.int64), int64))
    idx = arg(x._data, axis=d)
    nan = np.isnan(x._data).any(axis=d) if is_float(x.dtype) else None
    if nan is not None and nan.any():
        idx = np.where(nan, np.argmax(np.isnan(x._data), axis=d), idx)
    idx_k = np.expand_dims(idx, d)
    vals = np.take_along_axis(x._data, idx_k, axis=d)
    if not keepdim:
        vals, idx_out = np.squeeze(vals, d), idx
    else:
        idx_out = idx_k

    def backward(g):
        G = np.zeros(x.shape, g.dtype)
        np.put_along_axis(G, idx_k, g if keepdim else np.expand_dims(g, d), axis=d)
        return (G,)
    values = _result(np.array(vals), x.dtype, (x,), backward, op=name) if is_float(
        x.dtype) else Tensor(np.array(vals), x.dtype)
    return _values_indices(values, Tensor(np.asarray(idx_out, np.int64), int64))


def max(x, dim=None, keepdim=False, *, other=None):
    """``max(x)`` (all elements), ``max(x, dim)`` (values, indices) or
    ``max(a, b)`` (elementwise, as ``maximum``)."""
    _tensor_args("max", x, dim)
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return _named(amax(x), "MaxBackward1")
    return _select_extreme(x, dim, keepdim, np.argmax, "max")


def min(x, dim=None, keepdim=False):
    _tensor_args("min", x, dim)
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return _named(amin(x), "MinBackward1")
    return _select_extreme(x, dim, keepdim, np.argmin, "min")


def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return Tensor(np.asarray(np.argmax(x._data)), int64)
    d = wrap_dim(dim, x.ndim)
    return Tensor(np.argmax(x._data, axis=d, keepdims=keepdim).astype(np.int64), int64)


def argmin(x, dim=None, keepdim=False):
    if dim is None:
        return Tensor(np.asarray(np.argmin(x._data)), int64)
    d = wrap_dim(dim, x.ndim)
    return Tensor(np.argmin(x._data, axis=d, keepdims=keepdim).astype(np.int64), int64)


def topk(x, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) values along ``dim`` and their indices;
    ties keep the lower index first (a stable sort)."""
    d = wrap_dim(dim, x.ndim)
    # a 0-d tensor sorts as one element (torch takes dim 0 or -1 there)
    data = x._data if x.ndim else x._data.reshape(1)
    d = d if x.ndim else 0
    n = data.shape[d]
    if not 0 <= k <= n:
        raise RuntimeError("selected index k out of range")
    if not x.ndim:
        k = 1                       # torch returns the element itself for k = 0 too
    key = -data if largest else data
    order = np.argsort(key, axis=d, kind="stable")
    if is_float(x.dtype) and np.isnan(data).any():
        # NaN counts as larger than every number, +inf included (torch's
        # comparator): a second stable pass moves the NaNs to the end that
        # holds the largest values
        nan = np.isnan(np.take_along_axis(data, order, axis=d))
        order = np.take_along_axis(order, np.argsort(~nan if largest else nan, axis=d,
                                                     kind="stable"), axis=d)
    idx = np.take(order, np.arange(k), axis=d)
    vals = np.take_along_axis(data, idx, axis=d)
    shape = idx.shape if x.ndim else ()

    def backward(g):
        G = np.zeros(data.shape, g.dtype)
        np.put_along_axis(G, idx, g.reshape(idx.shape), axis=d)
        return (G.reshape(x.shape),)
    out = np.array(vals.reshape(shape))
    values = _result(out, x.dtype, (x,), backward, op="topk") if is_float(
        x.dtype) else Tensor(out, x.dtype)
    return _values_indices(values, Tensor(idx.reshape(shape).astype(np.int64), int64))


def sort(x, dim=-1, descending=False, stable=False):
    d = wrap_dim(dim, x.ndim)
    return topk(x, x.shape[d] if x.ndim else 1, d, largest=descending)


def argsort(x, dim=-1, descending=False, stable=False):
    return sort(x, dim, descending).indices


def cumsum(x, dim, dtype=None):
    """Running sum along ``dim`` in float64, each prefix rounded once."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    else:
        (x,) = cast_inputs("cumsum", x)
    d = wrap_dim(dim, x.ndim)
    if not is_float(x.dtype):
        return Tensor(np.cumsum(x._data, axis=d).astype(np.int64).reshape(x.shape), int64)
    # + 0.0: ATen's running sum starts at +0, so a prefix of -0s sums to +0
    res = _store((np.cumsum(f64(x), axis=d) + 0.0).reshape(x.shape), x.dtype)   # 0-d stays 0-d

    def backward(g):
        G = g.astype(np.float64).reshape(res.shape if x.ndim else (1,))
        return (_store(np.flip(np.cumsum(np.flip(G, d), axis=d) + 0.0, d).reshape(x.shape),
                       x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="cumsum")


def _cumprod_backward(g, X, out, d, dt):
    """ATen's ``cumprod_backward`` (FunctionsManual.cpp, its first-order path)
    at its rounding points: ``w = output * grad`` rounded to the dtype; with no
    zero in the input, ``reversed_cumsum(w) / input``, the cumulative sum kept
    in the CPU kernel's accumulator (double for float32 / float64, float for
    the 16-bit types) and rounded at every prefix; with zeros, the same before
    the first zero, 0 after it, and at the first zero the sum of ``grad`` times
    the running product of the inputs up to the second zero, times the output
    before the zero. That one sum is float64 rounded once (ATen's CPU sum order
    is not modelled here: ``docs/autograd.md``'s tier 2)."""
    shape = X.shape
    if X.size <= 1 or shape[d] == 1:
        return _store(g.astype(np.float64).reshape(shape), dt)
    acc = np.float64 if dt is float64 or getattr(dt, "name", "") == "fp32" else np.float32

    def st(a):
        return _store(a, dt).astype(np.float64)

    def running(fn, a):           # ATen's cpu_cum_base_kernel: acc type, each prefix stored
        return st(fn(a.astype(acc), axis=-1))

    def reversed_cumsum(a):       # + 0.0: the running sum starts at +0 (-0 + +0 is +0)
        return np.flip(running(np.cumsum, np.flip(a, -1)) + 0.0, -1)

    G = np.moveaxis(g.astype(np.float64).reshape(shape), d, -1)
    Xm = np.moveaxis(X, d, -1)
    Om = np.moveaxis(np.asarray(out, np.float64).reshape(shape), d, -1)
    w = st(Om * G)
    zero = Xm == 0
    with np.errstate(all="ignore"):
        if not zero.any():
            gx = st(reversed_cumsum(w) / Xm)
        else:
            seen = np.cumsum(zero, -1)                   # zeros up to and including i
            before = seen == 0                           # [0, z1)
            gx = np.where(before, st(reversed_cumsum(np.where(before, w, 0.0)) / Xm), 0.0)
            upto2 = seen == 1                            # [z1, z2)
            first = upto2 & (np.cumsum(upto2, -1) == 1)  # z1
            between = upto2 & ~first                     # (z1, z2)
            cp = running(np.cumprod, np.where(between, Xm, 1.0))
            s = st(np.sum(st(cp * np.where(upto2, G, 0.0)), -1, keepdims=True))
            z = np.argmax(first, -1)[..., None]
            prev = np.where(z == 0, 1.0, np.take_along_axis(Om, np.maximum(z - 1, 0), -1))
            gx = np.where(first, st(s * prev), gx)
    return _store(np.moveaxis(gx, -1, d), dt)


def cumprod(x, dim, *, dtype=None, out=None):
    """Running product along ``dim`` in float64, each prefix rounded once
    (torch's CPU kernel keeps the running product in double). The gradient
    is torch's ``cumprod_backward`` at its rounding points (``_cumprod_backward``)."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    else:
        (x,) = cast_inputs("cumprod", x)
    d = wrap_dim(dim, x.ndim)
    if not is_float(x.dtype):
        res = np.cumprod(x._data.astype(np.int64), axis=d) if x.ndim else x._data.astype(
            np.int64)
        t = Tensor(np.asarray(res).reshape(x.shape), int64)
        return t if out is None else write_out(out, t, "cumprod")
    X = f64(x).reshape(x.shape if x.ndim else (1,))
    with np.errstate(all="ignore"):
        P = np.cumprod(X, axis=d)
    res = _store(P.reshape(x.shape), x.dtype)

    def backward(g):
        return (_cumprod_backward(g, X, res, d, x.dtype).reshape(x.shape),)
    t = _result(res, x.dtype, (x,), backward, op="cumprod")
    return t if out is None else write_out(out, t, "cumprod")


def prod(x, dim=None, keepdim=False, dtype=None):
    """The product: under the CPU profile in the dtype and the order of
    ATen's ``binary_kernel_reduce_vec`` (:func:`fpemu.autograd._cpu_reduce.cpu_prod`),
    otherwise in float64, rounded once."""
    if dtype is None:
        (x,) = cast_inputs("prod", x)      # autocast: fp32 (CPU), dtype=float32 (CUDA)
    else:
        x = to_dtype(x, dtype)
    axes = _axes(dim, x.ndim)
    if not is_float(x.dtype):
        return Tensor(np.asarray(np.prod(x._data, axis=axes, keepdims=keepdim)).astype(
            np.int64), int64)
    X = f64(x)
    P = np.prod(X, axis=axes, keepdims=True)
    if not _cuda() and x._data.size and x.dtype in (float32, float64, bfloat16, float16):
        prof = get_profile()
        half = {bfloat16: "bfloat16", float16: "float16"}.get(x.dtype)
        res = cpu_prod(x._data, axes, keepdim, threads=prof.cpu_threads,
                       capability=prof.cpu_capability, dtype=half)
        res = _store(res, x.dtype) if half is None else res
    else:
        res = _store(np.prod(X, axis=axes, keepdims=keepdim), x.dtype)

    def backward(g):
        # the product of the other elements: P / X where no element of the
        # group is zero; with one zero, the others' product at the zero and
        # 0 elsewhere; with two or more, 0 (torch's prod_backward)
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        zero = X == 0
        zeros = zero.sum(axis=axes, keepdims=True)
        others = np.prod(np.where(zero, 1.0, X), axis=axes, keepdims=True)
        with np.errstate(all="ignore"):
            gx = np.where(zeros == 0, G * P / np.where(zero, 1.0, X),
                          np.where((zeros == 1) & zero, G * others, 0.0))
        return (_store(gx, x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="prod")


def norm(x, p="fro", dim=None, keepdim=False):
    """The p-norm (2 by default). Under the CUDA profile p = 1 and p = 2 add
    in float32 (float64 for float64) in ReduceNormKernel.cu's order
    (:func:`fpemu.autograd._cuda_reduce.cuda_norm`); under the CPU profile
    every finite nonzero p as ReduceOpsKernel.cpp computes it
    (:func:`fpemu.autograd._cpu_reduce.cpu_norm`: the accumulator's type,
    its order, libm's pow); the rest in float64, rounded once (0 and
    +-inf count or select: exact)."""
    if p == "fro":
        p = 2
    if p == "nuc":
        return _nuclear_norm(x, dim, keepdim)
    if isinstance(p, str) or not isinstance(p, (int, float, np.number)):
        raise FpemuValueError(f"norm(): p must be a number, 'fro' or 'nuc', got {p!r}")
    p = float(p)
    axes = _axes(dim, x.ndim)
    X = f64(x)
    value = None
    with np.errstate(all="ignore"):
        if _cuda() and p in (1.0, 2.0) and X.size:
            n = cuda_norm(x._data, int(p), axes, True).astype(np.float64)
        elif (np.isfinite(p) and p != 0 and X.size and not _cuda()
              and x.dtype in (float32, float64, bfloat16, float16)):
            prof = get_profile()
            half = {bfloat16: "bfloat16", float16: "float16"}.get(x.dtype)
            value = cpu_norm(x._data, p, axes, True, threads=prof.cpu_threads,
                             capability=prof.cpu_capability, dtype=half,
                             size_one_abs=x.ndim > 0 or dim is None or dim == ()).astype(
                                 np.float64)
            # the gradient takes the norm in float64 (gradients: float64,
            # rounded once); the value is torch's
            if p == 2:
                n = np.sqrt((X * X).sum(axis=axes, keepdims=True))
            elif p == 1:
                n = np.abs(X).sum(axis=axes, keepdims=True)
            else:
                n = (np.abs(X) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
        elif p == np.inf:
            n = np.max(np.abs(X), axis=axes, keepdims=True)
        elif p == -np.inf:
            n = np.min(np.abs(X), axis=axes, keepdims=True)
        elif p == 0:
            n = (X != 0).sum(axis=axes, keepdims=True).astype(np.float64)
        else:
            n = (np.abs(X) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
    if value is None:
        value = n
    res = _store(value if keepdim else np.squeeze(value, axis=axes), x.dtype)

    def backward(g):
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        # torch's norm_backward (FunctionsManual.cpp), case by case: where the
        # zero-norm mask goes decides what a NaN or inf gradient becomes (p = 2
        # masks self / norm, so a NaN gradient stays NaN; 1 < p != 2 masks
        # grad / norm^(p-1), so it becomes 0)
        with np.errstate(all="ignore"):
            sgn = np.where(np.isnan(X), 0.0, np.sign(X))      # torch's sgn(NaN) is 0
            if p in (np.inf, -np.inf):
                hit = (np.abs(X) == n) | np.isnan(X)
                gx = sgn * ((G / hit.sum(axis=axes, keepdims=True)) * hit)
            elif p == 0:
                gx = np.zeros_like(X)
            elif p == 1:
                gx = sgn * G
            elif p == 2:
                gx = G * np.where(n == 0, 0.0, X / n)
            elif p < 1:
                gx = (sgn * np.where(X == 0, 0.0, np.abs(X) ** (p - 1))) * G * \
                    n ** (1 - p)
            elif p < 2:
                gx = sgn * np.abs(X) ** (p - 1) * np.where(n == 0, 0.0, G / n ** (p - 1))
            else:
                gx = X * np.abs(X) ** (p - 2) * np.where(n == 0, 0.0, G / n ** (p - 1))
        return (_store(gx, x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="linalg_vector_norm")


def _nuclear_norm(x, dim, keepdim):
    """The sum of the singular values over two dims (the last two of a 2-D
    input by default), in float64 rounded once; its gradient U V^T."""
    if dim is None:
        if x.ndim != 2:
            raise FpemuValueError(f"norm(): the nuclear norm needs a 2-D input or two dims, "
                                  f"got a {x.ndim}-D input and dim=None")
        dim = (0, 1)
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise FpemuValueError(f"norm(): the nuclear norm takes two dims, got dim={dim!r}")
    d0, d1 = (wrap_dim(d, x.ndim) for d in dim)
    return singular_norm(x, d0, d1, keepdim, "nuc", op="norm")


def singular_norm(x, d0, d1, keepdim, kind, op="linalg_matrix_norm"):
    """The sum ("nuc"), largest ("2") or smallest ("-2") singular value over
    dims d0, d1, from numpy's SVD in float64, rounded once; gradients U V^T,
    u1 v1^T, un vn^T (tied singular values share it, as torch's amax /
    amin of them do)."""
    X = np.moveaxis(f64(x), (d0, d1), (-2, -1))
    U, S, Vh = np.linalg.svd(X, full_matrices=False)
    pick = {"nuc": None, "2": 0, "-2": -1}[kind]
    n = S.sum(-1) if pick is None else S[..., pick]
    if keepdim:
        n = np.expand_dims(n, tuple(sorted((d0, d1))))
    res = _store(n, x.dtype)

    def backward(g):
        G = np.asarray(g, np.float64)
        if keepdim:
            G = np.squeeze(G, axis=tuple(sorted((d0, d1))))
        if pick is None:
            part = U @ Vh
        else:
            tie = S == S[..., pick, None]
            part = (U * (tie / tie.sum(-1, keepdims=True))[..., None, :]) @ Vh
        return (_store(np.moveaxis(G[..., None, None] * part, (-2, -1), (d0, d1)), x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op=op)


def logsumexp(x, dim, keepdim=False):
    (x,) = cast_inputs("logsumexp", x)
    axes = _axes(dim, x.ndim)
    X = f64(x)
    m = np.max(X, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(all="ignore"):
        s = np.log(np.exp(X - m).sum(axis=axes, keepdims=True)) + m
    res = _store(s if keepdim else np.squeeze(s, axis=axes), x.dtype)

    def backward(g):
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        with np.errstate(all="ignore"):
            return (_store(G * np.exp(X - s), x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="logsumexp")


def any(x, dim=None, keepdim=False):
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.any(x._data, axis=axes, keepdims=keepdim)), bool_)


def all(x, dim=None, keepdim=False):
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.all(x._data, axis=axes, keepdims=keepdim)), bool_)


def count_nonzero(x, dim=None):
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.count_nonzero(x._data, axis=axes)).astype(np.int64), int64)
