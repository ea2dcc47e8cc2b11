"""Reductions: float64 accumulation, one rounding to the output dtype.

CUDA reduces in float32 with a tree whose order depends on the launch; the
float64 sum rounded once is within a few float32 ulp of it (tier 2,
``docs/autograd.md``). Max, min, argmax, topk and sort are exact.
"""

from __future__ import annotations

import builtins
import collections

import numpy as np

from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, bool_, int64, is_float, to_dtype
from ...errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from .._common import f64, wrap_dim
from .elementwise import _tensor_args, maximum, minimum, sqrt
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


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001 - torch's name
    """Sum with a float64 accumulator, rounded once to the output dtype.
    Integer and bool inputs sum to int64. Under autocast the op runs with
    dtype=float32 (fp32 output)."""
    if dtype is None:
        (x,) = cast_inputs("sum", x)
    else:
        x = to_dtype(x, dtype)
    dt = x.dtype if is_float(x.dtype) else int64
    axes = _axes(dim, x.ndim)
    if not is_float(dt):
        return Tensor(np.asarray(np.sum(x._data, axis=axes, keepdims=keepdim)).astype(
            np.int64), int64)
    res = _store(np.sum(f64(x), axis=axes, keepdims=keepdim), dt)

    def backward(g):
        return (_expand_back(g, axes, keepdim, x.shape),)
    return _result(res, dt, (x,), backward, op="sum")


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean with a float64 accumulator (not in the autocast lists: a bf16
    input gives a bf16 output)."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    if not is_float(x.dtype):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either "
                           f"a floating point or complex dtype. Got: {_scalar_name(x.dtype)}")
    dt = x.dtype
    axes = _axes(dim, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    with np.errstate(all="ignore"):
        res = _store(np.sum(f64(x), axis=axes, keepdims=keepdim) / n, dt)

    def backward(g):
        return (_expand_back(_store(g.astype(np.float64) / n, dt), axes, keepdim, x.shape),)
    return _result(res, dt, (x,), backward, op="mean")


def _scalar_name(dt):
    return {"int64": "Long", "int32": "Int", "bool": "Bool", "int16": "Short",
            "int8": "Char", "uint8": "Byte"}.get(dt.name, dt.name)


def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    """Variance in float64 (``correction`` 1 by default, as torch);
    ``var(x, False)`` is torch's older ``var(input, unbiased)``."""
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
    with np.errstate(all="ignore"):
        v = (dev * dev).sum(axis=axes, keepdims=keepdim) / denom
    res = _store(v, x.dtype)

    def backward(g):
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        with np.errstate(all="ignore"):
            return (_store(G * 2 * dev / denom, x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="var")


def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    return sqrt(var(x, dim, unbiased, keepdim, correction))


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


def max(x, dim=None, keepdim=False, *, other=None):  # noqa: A001 - torch's name
    """``max(x)`` (all elements), ``max(x, dim)`` (values, indices) or
    ``max(a, b)`` (elementwise, as ``maximum``)."""
    _tensor_args("max", x, dim)
    if isinstance(dim, Tensor):
        return maximum(x, dim)
    if dim is None:
        return amax(x)
    return _select_extreme(x, dim, keepdim, np.argmax, "max")


def min(x, dim=None, keepdim=False):  # noqa: A001 - torch's name
    _tensor_args("min", x, dim)
    if isinstance(dim, Tensor):
        return minimum(x, dim)
    if dim is None:
        return amin(x)
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


def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - torch's name
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
    res = _store(np.cumsum(f64(x), axis=d).reshape(x.shape), x.dtype)     # 0-d stays 0-d

    def backward(g):
        G = g.astype(np.float64).reshape(res.shape if x.ndim else (1,))
        return (_store(np.flip(np.cumsum(np.flip(G, d), axis=d), d).reshape(x.shape),
                       x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="cumsum")


def cumprod(x, dim, *, dtype=None, out=None):
    """Running product along ``dim`` in float64, each prefix rounded once
    (torch's CPU kernel keeps the running product in double). The gradient
    is torch's ``cumprod_backward``: exact where the input has zeros."""
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
        G = np.moveaxis(g.astype(np.float64).reshape(X.shape), d, -1)
        Xm = np.moveaxis(X, d, -1)
        Pm = np.moveaxis(P, d, -1)
        with np.errstate(all="ignore"):
            # no zero before position i: sum_{j >= i} g_j P_j / x_i (P_j is 0
            # from the first zero on, so only the terms before it count)
            tail = np.flip(np.cumsum(np.flip(G * Pm, -1), -1), -1)
            zero = Xm == 0
            before = np.cumsum(zero, -1) - zero          # zeros strictly before i
            gx = np.where(before == 0, np.where(zero, 0.0, tail / np.where(zero, 1.0, Xm)),
                          0.0)
            # at the first zero z: sum_{j >= z} g_j prod_{k <= j, k != z} x_k
            first = zero & (before == 0)
            if first.any():
                Q = np.cumprod(np.where(first, 1.0, Xm), -1)
                after = np.cumsum(first, -1) > 0                # j >= z
                at_z = np.sum(np.where(after, G * Q, 0.0), -1, keepdims=True)
                gx = np.where(first, at_z, gx)
        return (_store(np.moveaxis(gx, -1, d).reshape(x.shape), x.dtype),)
    t = _result(res, x.dtype, (x,), backward, op="cumprod")
    return t if out is None else write_out(out, t, "cumprod")


def prod(x, dim=None, keepdim=False, dtype=None):
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
    """The p-norm (2 by default) in float64, rounded once."""
    if p == "fro":
        p = 2
    if p == "nuc":
        return _nuclear_norm(x, dim, keepdim)
    if isinstance(p, str) or not isinstance(p, (int, float, np.number)):
        raise FpemuValueError(f"norm(): p must be a number, 'fro' or 'nuc', got {p!r}")
    p = float(p)
    axes = _axes(dim, x.ndim)
    X = f64(x)
    with np.errstate(all="ignore"):
        if p == np.inf:
            n = np.max(np.abs(X), axis=axes, keepdims=True)
        elif p == -np.inf:
            n = np.min(np.abs(X), axis=axes, keepdims=True)
        elif p == 0:
            n = (X != 0).sum(axis=axes, keepdims=True).astype(np.float64)
        else:
            n = (np.abs(X) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
    res = _store(n if keepdim else np.squeeze(n, axis=axes), x.dtype)

    def backward(g):
        G = _expand_back(g.astype(np.float64), axes, keepdim, x.shape)
        with np.errstate(all="ignore"):
            if p in (np.inf, -np.inf):
                hit = np.abs(X) == n
                gx = G * np.sign(X) * hit / hit.sum(axis=axes, keepdims=True)
            elif p == 0:
                gx = np.zeros_like(X)
            else:
                gx = G * np.sign(X) * np.abs(X) ** (p - 1) / n ** (p - 1)
                gx = np.where(n == 0, 0.0, gx)
        return (_store(gx, x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="norm")


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


def any(x, dim=None, keepdim=False):  # noqa: A001 - torch's name
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.any(x._data, axis=axes, keepdims=keepdim)), bool_)


def all(x, dim=None, keepdim=False):  # noqa: A001 - torch's name
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.all(x._data, axis=axes, keepdims=keepdim)), bool_)


def count_nonzero(x, dim=None):
    axes = _axes(dim, x.ndim)
    return Tensor(np.asarray(np.count_nonzero(x._data, axis=axes)).astype(np.int64), int64)
