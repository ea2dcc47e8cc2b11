"""Ops torch writes as compositions of other ops (its CompositeImplicitAutograd
kernels), composed here from fpemu's ops in the same order, so each step
rounds where torch's does and the gradient comes from the steps:
``diff``, ``tile``, ``rot90``, ``diag_embed``, ``combinations``, ``nansum``,
``nanmean``, ``var_mean``, ``std_mean``, ``dist``, ``copysign``,
``kthvalue``, ``median``, ``nanmedian``, ``quantile``, ``nanquantile`` and
``broadcast_shapes``.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["broadcast_shapes", "combinations", "copysign", "diag_embed", "diff", "dist",
           "kthvalue", "median", "nanmean", "nanmedian", "nanquantile", "nansum", "quantile",
           "rot90", "std_mean", "tile", "var_mean"]

import itertools

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from .._autocast import cast_inputs
from .._core import (
    _result, _store, _sum_to, bool_, float32, float64, int64, is_float, result_type, Size,
    Tensor,
)
from .._common import wrap_dim
from .._profile import get_profile
from .elementwise import bitwise_xor, clone, div, isnan, lerp, logical_not, mul, sub, where
from .reduce import (
    _sum_impl, _values_indices, _var_std, mean, norm, sort, std, sum as _sum, var,
)
from .shape import cat, flip, gather, movedim, narrow, repeat, stack, transpose, unsqueeze
from .creation import empty, full
from .inplace import write_out


def _tensor(name, x):
    if not isinstance(x, Tensor):
        raise FpemuTypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not "
                             f"{type(x).__name__}")


def diff(input, n=1, dim=-1, prepend=None, append=None):
    """The n-th forward difference along ``dim``: ``x[1:] - x[:-1]``, n times
    (``logical_xor`` for bools), after ``prepend`` / ``append``."""
    _tensor("diff", input)
    if input.ndim == 0:
        raise FpemuRuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise FpemuRuntimeError(f"order must be non-negative but got {n}")
    d = wrap_dim(dim, input.ndim)
    x = input
    if n == 0:
        return input                    # torch: the input itself, prepend / append unused
    parts = [t for t in (prepend, x, append) if t is not None]
    if len(parts) > 1:
        parts = [t if isinstance(t, Tensor) and t.ndim == x.ndim else
                 _expand_like(t, x, d) for t in parts]
        x = cat(parts, d)
    for _ in range(n):
        length = x.shape[d]
        if length == 0:
            break
        hi, lo = narrow(x, d, 1, length - 1), narrow(x, d, 0, length - 1)
        x = bitwise_xor(hi, lo) if x.dtype is bool_ else sub(hi, lo)
    return x


def _expand_like(t, x, d):
    """A 0-d tensor or number for prepend / append: size 1 along ``dim``."""
    value = t.item() if isinstance(t, Tensor) else t
    shape = list(x.shape)
    shape[d] = 1
    return full(tuple(shape), value, dtype=x.dtype if not isinstance(t, Tensor) else t.dtype)


def tile(input, dims):
    """``repeat`` with ``dims`` padded with leading ones to the input's rank."""
    _tensor("tile", input)
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(dims) < input.ndim:
        dims = (1,) * (input.ndim - len(dims)) + dims
    return repeat(input, dims)


def rot90(input, k=1, dims=(0, 1)):
    """Rotate by 90 degrees k times in the plane of ``dims`` (flips and a
    transpose, as torch's)."""
    _tensor("rot90", input)
    if len(dims) != 2:
        raise FpemuRuntimeError(f"expected total rotation dims == 2, but got dims = "
                                f"{len(dims)}")
    if input.ndim < 2:
        raise FpemuRuntimeError(f"expected total dims >= 2, but got total dims = {input.ndim}")
    d0, d1 = (wrap_dim(d, input.ndim) for d in dims)
    if d0 == d1:
        raise FpemuRuntimeError(f"expected rotation dims to be different, but got dim0 = {d0} "
                                f"and dim1 = {d1}")
    k = k % 4
    if k == 1:
        return transpose(flip(input, (d1,)), d0, d1)
    if k == 2:
        return flip(input, (d0, d1))
    if k == 3:
        return transpose(flip(input, (d0,)), d0, d1)
    return clone(input)


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """Each last-dim vector of the input as the ``offset`` diagonal of a
    matrix in dims ``dim1``, ``dim2`` of the result (zeros elsewhere)."""
    _tensor("diag_embed", input)
    nd = input.ndim + 1
    d1, d2 = wrap_dim(dim1, nd), wrap_dim(dim2, nd)
    if d1 == d2:
        raise FpemuRuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    n = input.shape[-1] + abs(offset)
    lead = tuple(input.shape[:-1])
    m = input.shape[-1]
    out = np.zeros(lead + (n, n), input._data.dtype)
    i = np.arange(m)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    out[..., rows, cols] = input._data
    # the two matrix dims move to dim1, dim2; the others keep their order
    order = [None] * nd
    order[d1], order[d2] = nd - 2, nd - 1
    rest = iter(range(nd - 2))
    order = [o if o is not None else next(rest) for o in order]
    res = np.ascontiguousarray(np.transpose(out, order))
    if not is_float(input.dtype):
        return Tensor(res, input.dtype)
    inverse = np.argsort(order)

    def backward(g):
        G = np.transpose(g, inverse)
        return (np.ascontiguousarray(G[..., rows, cols]),)
    return _result(res, input.dtype, (input,), backward, op="diag_embed", stored=True)


def combinations(input, r=2, with_replacement=False):
    """The length-r combinations of a 1-d tensor's elements, as rows, in
    itertools' order (torch's)."""
    _tensor("combinations", input)
    if input.ndim != 1:
        raise FpemuRuntimeError(f"Expect a 1D vector, but got shape {list(input.shape)}")
    if r < 0:
        raise FpemuRuntimeError(f"Expect a non-negative number, but got {r}")
    if r == 0:
        return empty(0, dtype=input.dtype)
    maker = itertools.combinations_with_replacement if with_replacement else \
        itertools.combinations
    combos = np.array(list(maker(range(input.shape[0]), r)), np.int64).reshape(-1, r)
    return stack([gather(input, 0, Tensor(combos[:, j].copy(), int64)) for j in range(r)], 1)


def nansum(input, dim=None, keepdim=False, *, dtype=None):
    """The sum with NaNs counted as zero (their gradient is zero): under the
    CPU profile ATen's nansum kernel (cascade_sum loading NaN as 0, in the
    input's layout), else the sum of the NaN-free tensor."""
    _tensor("nansum", input)
    if not is_float(input.dtype):
        return _sum(input, dim, keepdim, dtype=dtype)
    if get_profile().cpu:
        return _sum_impl(input, dim, keepdim, dtype, nan=True)
    return _sum(where(isnan(input), 0.0, input), dim, keepdim, dtype=dtype)


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """``nansum / (number of non-NaN elements)``, torch's two steps."""
    _tensor("nanmean", input)
    if not is_float(input.dtype):
        raise FpemuRuntimeError(f"nanmean(): expected input to have floating point or complex "
                                f"dtype but got {input.dtype}")
    count = _sum(logical_not(isnan(input)), dim, keepdim)
    return div(nansum(input, dim, keepdim, dtype=dtype), count)


def var_mean(input, dim=None, *args, **kwargs):
    """``(var(input, ...), mean(input, ...))``; ``var_mean(x, unbiased)`` too."""
    return _stat_mean("var_mean", var, input, dim, args, kwargs)


def std_mean(input, dim=None, *args, **kwargs):
    """``(std(input, ...), mean(input, ...))``; ``std_mean(x, unbiased)`` too."""
    return _stat_mean("std_mean", std, input, dim, args, kwargs)


def _stat_mean(name, stat, x, dim, args, kwargs):
    _tensor(name, x)
    if isinstance(dim, bool):                   # torch's (input, unbiased) overload
        kwargs = dict(kwargs, unbiased=dim)
        dim = None
    keep = kwargs.get("keepdim", args[1] if len(args) > 1 and isinstance(args[1], bool) else
                      False)
    if get_profile().cpu and x.dtype in (float32, float64) and x.numel():
        # torch CPU's var_mean / std_mean: one Welford pass gives both (even
        # for a full reduction, which var alone sums otherwise); the mean is
        # its double mean rounded to the dtype (its gradient: mean's)
        names = ("unbiased", "keepdim", "correction")
        kw = dict(zip(names, args), **kwargs)
        res, m = _var_std(x, dim, kw.get("unbiased"), kw.get("keepdim", False),
                          kw.get("correction"), stat is std, with_mean=True)
        mu = mean(x, dim, keepdim=keep)
        mu._data = np.asarray(m, mu._data.dtype).reshape(mu._data.shape)
        return res, mu
    return stat(x, dim, *args, **kwargs), mean(x, dim, keepdim=keep)


def dist(input, other, p=2):
    """The p-norm of ``input - other``."""
    _tensor("dist", input)
    input, other = cast_inputs("dist", input, other)
    return norm(sub(input, other), p)


def copysign(input, other):
    """|input| with the sign of ``other`` (-0 and NaN signs included), exact;
    the gradient of input is ``g * copysign(x, y) / x`` (0 at x = 0)."""
    _tensor("copysign", input)
    a = input
    dt = result_type(input, other)
    if not is_float(dt):
        dt = float32
    om = np.float64 if dt.name == "float64" else np.float32
    X = input._data.astype(om)
    Y = other._data.astype(om) if isinstance(other, Tensor) else om(other)
    res = _store(np.copysign(X, Y), dt)

    def backward(g):
        with np.errstate(all="ignore"):
            ratio = np.where(X == 0, 0.0, res.astype(np.float64) / X)
        gx = _sum_to(_store(g.astype(np.float64) * ratio, dt), a.shape, dt)
        gy = np.zeros(other.shape, g.dtype) if isinstance(other, Tensor) else None
        return gx, gy
    return _result(res, dt, (input, other), backward, op="copysign")


def _selection(name, input, k, dim, keepdim):
    """The k-th smallest (0-based) along ``dim`` with its index, from a
    stable sort (NaN last, as torch's)."""
    d = wrap_dim(dim, max(input.ndim, 1))
    x = input if input.ndim else input.reshape(1)
    vals, idx = sort(x, d, stable=True)
    v = narrow(vals, d, k, 1)
    i = narrow(idx, d, k, 1)
    if not keepdim:
        v, i = v.squeeze(d), i.squeeze(d)
    if input.ndim == 0:
        v, i = v.reshape(()), i.reshape(())
    return v, i


def kthvalue(input, k, dim=-1, keepdim=False, *, out=None):
    """``(values, indices)`` of the k-th smallest element along ``dim``."""
    _tensor("kthvalue", input)
    n = input.shape[wrap_dim(dim, max(input.ndim, 1))] if input.ndim else 1
    if not 1 <= k <= n:
        raise FpemuRuntimeError(f"kthvalue(): selected number k out of range for dimension "
                                f"{dim} (k = {k}, size {n})")
    return _named(_selection("kthvalue", input, k - 1, dim, keepdim), "kthvalue", out)


def _named(pair, name, out=None):
    """torch's ``return_types`` pair (values, indices), written into ``out``
    (a pair of tensors) when given."""
    if out is None:
        return _values_indices(*pair)
    return _values_indices(write_out(out[0], pair[0], name), write_out(out[1], pair[1], name))


def median(input, dim=None, keepdim=False, *, out=None):
    """The lower median (the ((n - 1) // 2)-th smallest); NaN where the
    reduced elements hold one. With ``dim``: ``(values, indices)``."""
    _tensor("median", input)
    return _median(input, dim, keepdim, ignore_nan=False, out=out)


def nanmedian(input, dim=None, keepdim=False, *, out=None):
    """The lower median of the non-NaN elements (NaN where all are NaN)."""
    _tensor("nanmedian", input)
    return _median(input, dim, keepdim, ignore_nan=True, out=out)


def _median(x, dim, keepdim, ignore_nan, out=None):
    name = "nanmedian" if ignore_nan else "median"
    if dim is None:
        flat = x.reshape(-1)
        if flat.shape[0] == 0:
            v = full((), float("nan"), dtype=x.dtype)
        else:
            v = _median_along(flat, 0, ignore_nan)[0].reshape(())
        if out is not None:
            return write_out(out, v, name)
        return v
    d = wrap_dim(dim, max(x.ndim, 1))
    if x.ndim and x.shape[d] == 0:
        raise FpemuRuntimeError(f"{name}() cannot compute median for a dimension of size 0 "
                                f"(dim {d} of {list(x.shape)})")
    xx = x if x.ndim else x.reshape(1)
    v, i = _median_along(xx, d, ignore_nan)
    if keepdim:
        v, i = unsqueeze(v, d), unsqueeze(i, d)
    if x.ndim == 0:
        v, i = v.reshape(()), i.reshape(())
    return _named((v, i), name, out)


def _median_along(x, d, ignore_nan):
    """Values and indices of the lower median of each slice along ``d``."""
    vals, idx = sort(x, d, stable=True)
    nan = np.isnan(x._data) if is_float(x.dtype) else np.zeros(x.shape, bool)
    n_nan = nan.sum(axis=d)
    n = x.shape[d]
    if ignore_nan:
        pos = np.maximum((n - n_nan - 1) // 2, 0)
    else:
        # any NaN: the first NaN of the sorted slice (they sort last)
        pos = np.where(n_nan > 0, n - n_nan, (n - 1) // 2)
    pos_t = Tensor(np.expand_dims(pos, d).astype(np.int64), int64)
    return gather(vals, d, pos_t).squeeze(d), gather(idx, d, pos_t).squeeze(d)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def quantile(input, q, dim=None, keepdim=False, *, interpolation="linear",
             out=None):
    """The q-quantiles along ``dim`` (of all elements by default), torch's
    way: sort, rank = q (n - 1), the values at the ranks below and above,
    ``lerp`` between them in the dtype; NaN where the slice holds a NaN."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, ignore_nan=False)


def nanquantile(input, q, dim=None, keepdim=False, *, interpolation="linear",
                out=None):
    """:func:`quantile` over the non-NaN elements of each slice."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, ignore_nan=True)


def _quantile(name, x, q, dim, keepdim, interpolation, ignore_nan):
    _tensor(name, x)
    (x,) = cast_inputs(name, x)                 # AutocastCPU: float32
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f"{name}() input tensor must be either float or double dtype")
    if interpolation not in _INTERPOLATIONS:
        raise FpemuValueError(f"{name}() interpolation must be one of linear, lower, higher, "
                              f"midpoint or nearest. Got {interpolation}")
    if x.numel() == 0 and dim is None:
        raise FpemuRuntimeError(f"{name}() input tensor must be non-empty")
    qt = q if isinstance(q, Tensor) else None
    if qt is not None:
        if qt.ndim > 1:
            raise FpemuRuntimeError(f"{name}() q must be a scalar or 1D tensor")
        if qt.dtype is not x.dtype:
            raise FpemuRuntimeError(f"{name}() q tensor must be same dtype as the input tensor")
        qv = qt._data.astype(np.float64).reshape(-1)
    else:
        qv = np.array([float(q)])
    if np.any((qv < 0) | (qv > 1)):
        raise FpemuRuntimeError(f"{name}() q values must be in the range [0, 1]")
    # the reduced dim last (all elements flattened when dim is None)
    if dim is None:
        flat = x.reshape(-1)
        d = 0
        src = flat
    else:
        d = wrap_dim(dim, max(x.ndim, 1))
        src = x if x.ndim else x.reshape(1)
        if src.shape[d] == 0:
            raise FpemuRuntimeError(f"{name}() input tensor cannot be empty along dim {d}")
        src = movedim(src, d, -1)
    vals, _ = sort(src, -1, stable=True)
    n = src.shape[-1]
    nan = np.isnan(src._data)
    count = (n - nan.sum(-1)) if ignore_nan else np.full(nan.shape[:-1], n)
    om = np.float64 if x.dtype.name == "float64" else np.float32
    # torch's ranks: q * (n - 1), or q * (non-NaN count - 1) for nanquantile,
    # in the dtype (a graph node when q is a tensor: it gets the gradient of
    # the linear weights); a slice with a NaN (quantile) ranks its last
    # element, an all-NaN one (nanquantile) its first: the result is NaN
    span = (count - 1) if ignore_nan else np.full(count.shape, n - 1)
    span_t = Tensor(span.astype(om), x.dtype)
    if ignore_nan:
        reset, to = (count == 0), 0
    else:
        reset, to = nan.any(-1), n - 1
    outs = []
    for j, qq in enumerate(qv):
        qj = (qt.reshape(-1)[j] if qt.ndim else qt) if qt is not None else None
        rank_t = mul(qj, span_t) if qj is not None else Tensor(
            (om(qq) * span.astype(om)).astype(om), x.dtype)
        if reset.any():
            rank_t = where(Tensor(reset, bool_), float(to), rank_t)
        rank = rank_t._data.astype(om)
        if interpolation == "lower":
            rank = np.floor(rank)
        elif interpolation == "higher":
            rank = np.ceil(rank)
        elif interpolation == "nearest":
            rank = np.round(rank)                        # half to even, torch's round_
        below = rank.astype(np.int64)
        r = gather(vals, -1, Tensor(below[..., None], int64))
        if interpolation in ("linear", "midpoint"):
            above = np.ceil(rank).astype(np.int64)
            va = gather(vals, -1, Tensor(above[..., None], int64))
            if interpolation == "linear":
                wt = sub(rank_t, Tensor(below.astype(om), x.dtype))
            else:
                wt = Tensor(np.full(below.shape, 0.5, om), x.dtype)
            r = lerp(r, va, unsqueeze(wt, -1))
        r = r.squeeze(-1)
        if keepdim:
            if dim is None:
                r = r.reshape((1,) * x.ndim)
            else:
                r = unsqueeze(r, d) if x.ndim else r
        outs.append(r)
    if qt is not None and qt.ndim == 1:
        return stack(outs, 0)
    return outs[0]


def broadcast_shapes(*shapes):
    """The shape the given shapes broadcast to (torch's error if they do not)."""
    dims = []
    for s in shapes:
        dims.append((s,) if isinstance(s, (int, np.integer)) else tuple(s))
    try:
        return Size(np.broadcast_shapes(*dims))
    except ValueError:
        raise FpemuRuntimeError(f"Shape mismatch: objects cannot be broadcast to a single shape "
                                f"({', '.join(str(list(s)) for s in dims)})") from None
