"""Writes of values at indices: ``scatter``, ``scatter_add`` and ``index_add``.

Where several values land on one element, torch's CPU kernels add (or write)
them one after the other in the order of their position along ``dim``:
``self[index[i]] += src[i]`` for i = 0, 1, ... for each destination, each
addition rounded to the tensor's dtype. fpemu does the same (so a bf16
``scatter_add`` rounds after every addition, as torch's). CUDA's kernels add
with atomics in an order no one fixes; the emulation keeps the CPU's order
under both profiles.

``index_add`` with ``alpha`` computes as torch's kernels do: on a tensor of
two or more dims, each selected slice takes ``add_(source_slice, alpha)``
(the fused ``fma(alpha, src, self)``, ``_aten.add_alpha``); a 1-d tensor's
loop on the CPU, and CUDA's atomic adds, round ``src * alpha`` first.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["index_add", "scatter", "scatter_add"]

import warnings

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError
from .. import _aten
from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, float64, int64, is_float, opmath
from .._profile import get_profile
from .._common import wrap_dim
from .inplace import write_out


def _check_index(name, index):
    if not isinstance(index, Tensor):
        raise FpemuTypeError(f"{name}(): argument 'index' must be Tensor, not "
                             f"{type(index).__name__}")
    if index.dtype is not int64 and getattr(index.dtype, "name", "") != "int32":
        raise FpemuRuntimeError(f"{name}(): Expected dtype int32/int64 for index, got "
                                f"{index.dtype}: pass index.long()")


def _scatter_checks(name, x, d, index, src):
    """torch's scatter_gather_dtype_check and scatter_shape_check."""
    _check_index(name, index)
    if isinstance(src, Tensor) and src.dtype is not x.dtype:
        raise FpemuRuntimeError(f"{name}(): Expected self.dtype to be equal to src.dtype "
                                f"(self {x.dtype}, src {src.dtype}): cast src with "
                                f"src.to(self.dtype)")
    if index.numel() == 0:
        return
    if index.ndim != x.ndim or (isinstance(src, Tensor) and src.ndim != x.ndim):
        raise FpemuRuntimeError(f"{name}(): Index tensor must have the same number of "
                                f"dimensions as self tensor ({index.ndim} and {x.ndim})" +
                                ("" if not isinstance(src, Tensor) else
                                 f" and as src ({src.ndim})"))
    ishape = index.shape if index.ndim else (1,)
    xshape = x.shape if x.ndim else (1,)
    sshape = (src.shape if src.ndim else (1,)) if isinstance(src, Tensor) else None
    for k in range(len(ishape)):
        if (k != d and ishape[k] > xshape[k]) or (sshape is not None and ishape[k] > sshape[k]):
            raise FpemuRuntimeError(
                f"Expected index {list(index.shape)} to be no larger than self "
                f"{list(x.shape)} apart from dimension {d}" +
                ("" if sshape is None else f" and to be no larger size than src "
                                           f"{list(src.shape)}"))


def _destinations(x, d, index):
    """The flat positions in ``x`` each element of ``index`` writes to, in
    torch's CPU order (index's own positions, C order: for one destination,
    increasing along ``dim``), and the index's shape (1 for a 0-d one)."""
    xshape = x.shape if x.ndim else (1,)
    idx = index._data.reshape(index.shape if index.ndim else (1,)).astype(np.int64)
    size = xshape[d]
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        raise FpemuRuntimeError(f"index {int(idx[bad].flat[0])} is out of bounds for dimension "
                                f"{d} with size {size}")
    idx = np.where(idx < 0, idx + size, idx)
    grid = list(np.indices(idx.shape, sparse=True))
    grid[d] = idx
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*grid)), xshape)
    return flat.reshape(-1), idx.shape


def _ranks(dest):
    """For each write, how many earlier writes go to the same place: the
    writes of one rank go to distinct places and can be done at once."""
    order = np.argsort(dest, kind="stable")
    sd = dest[order]
    start = np.r_[0, np.flatnonzero(sd[1:] != sd[:-1]) + 1] if sd.size else np.zeros(0, int)
    first = np.repeat(start, np.diff(np.r_[start, sd.size]))
    rank = np.empty(dest.size, np.int64)
    rank[order] = np.arange(sd.size) - first
    return rank


def _in_order(out, dest, vals, combine):
    """``out[dest[i]] = combine(out[dest[i]], vals[i])`` for i in order (the
    rows of a 2-d ``vals`` go to rows of ``out``)."""
    if dest.size == 0:
        return out
    rank = _ranks(dest)
    for r in range(int(rank.max()) + 1):
        sel = np.flatnonzero(rank == r)
        out[dest[sel]] = combine(out[dest[sel]], vals[sel])
    return out


def _src_values(src, ishape, x):
    """The part of ``src`` each index element takes (its leading block of
    the index's shape), flattened in index order; a number is converted to
    x's dtype (through float32, as torch's fill)."""
    if not isinstance(src, Tensor):
        v = _store(np.float32(src), x.dtype) if is_float(x.dtype) and x.dtype is not float64 \
            else src
        return np.full(int(np.prod(ishape)), v, x._data.dtype)
    S = src._data.reshape(src.shape if src.ndim else (1,))
    return S[tuple(slice(0, n) for n in ishape)].reshape(-1)


def _scatter_into(x, d, index, src, combine):
    """A copy of ``x`` with ``src`` combined in at ``index`` (torch's order)."""
    X = np.array(x._data, copy=True).reshape(-1)
    if index.numel():
        dest, ishape = _destinations(x, d, index)
        _in_order(X, dest, _src_values(src, ishape, x), combine)
    return X.reshape(x.shape)


def _gather_back(g, x, d, index, shape):
    """``g.gather(d, index)`` padded with zeros to ``shape`` (src's): the
    gradient of the values taken from src."""
    G = g.reshape(x.shape if x.ndim else (1,))
    out = np.zeros(shape if len(shape) else (1,), g.dtype)
    if index.numel():
        idx = index._data.reshape(index.shape if index.ndim else (1,)).astype(np.int64)
        idx = np.where(idx < 0, idx + G.shape[d], idx)
        block = tuple(slice(None) if k == d else slice(0, n) for k, n in enumerate(idx.shape))
        out[tuple(slice(0, n) for n in idx.shape)] = np.take_along_axis(G[block], idx, axis=d)
    return out.reshape(shape)


def scatter(input, dim, index, src=None, *, value=None, reduce=None, out=None):
    """``input`` with ``src`` (a tensor, or a number: ``value``) written at
    ``index`` along ``dim``: ``out[i][index[i][j]] = src[i][j]`` (dim 1).
    ``reduce`` "add" / "multiply" combines instead of writing (torch's
    deprecated form; its backward raises torch's error, as torch's does)."""
    if src is None:
        src = value
    if src is None:
        raise FpemuTypeError("scatter() missing 1 required positional argument: 'src' (a "
                             "tensor) or 'value' (a number)")
    x = input
    d = wrap_dim(dim, x.ndim)
    _scatter_checks("scatter", x, d, index, src)
    if reduce is None:
        def combine(old, new):
            return new
    elif reduce in ("add", "multiply"):
        if isinstance(src, Tensor):
            warnings.warn("The reduce argument of torch.scatter with Tensor src is deprecated "
                          "and will be removed in a future PyTorch release. Use "
                          "torch.scatter_reduce instead for more reduction options.",
                          UserWarning, stacklevel=2)
        npop = np.add if reduce == "add" else np.multiply
        om = opmath(x.dtype) if is_float(x.dtype) else None

        def combine(old, new):
            if om is None:
                return npop(old, new)
            with np.errstate(all="ignore"):
                return _store(npop(old.astype(om), new.astype(om)), x.dtype)
    else:
        raise FpemuRuntimeError(f"reduce argument must be either add or multiply, got "
                                f"{reduce!r}")
    res = _scatter_into(x, d, index, src, combine)
    if not is_float(x.dtype):
        return write_out(out, Tensor(res, x.dtype), "scatter")
    src_t = src if isinstance(src, Tensor) else None

    def backward(g):
        if reduce is not None:          # torch's result needs a gradient it cannot give
            raise FpemuRuntimeError("derivative for aten::scatter is not implemented (torch "
                                    "has none for scatter with reduce=): use scatter_add")
        # torch: self gets grad.scatter(dim, index, 0), src grad.gather(dim, index)
        gx = _scatter_into(Tensor(g, x.dtype), d, index, 0, lambda old, new: new) \
            if x.requires_grad else None
        gs = _gather_back(g, x, d, index, src_t.shape) \
            if src_t is not None and src_t.requires_grad else None
        return gx, None, gs
    return write_out(out, _result(res, x.dtype, (x, index, src_t), backward, op="scatter"),
                     "scatter")


def scatter_add(input, dim, index, src, *, out=None):
    """``input`` with ``src`` added at ``index`` along ``dim``, one addition
    after the other in torch's CPU order, each rounded to the dtype."""
    x = input
    d = wrap_dim(dim, x.ndim)
    if not isinstance(src, Tensor):
        raise FpemuTypeError(f"scatter_add(): argument 'src' (position 4) must be Tensor, not "
                             f"{type(src).__name__}")
    x, src = cast_inputs("scatter_add", x, src)       # autocast: promote
    _scatter_checks("scatter_add", x, d, index, src)
    if is_float(x.dtype):
        om = opmath(x.dtype)

        def combine(old, new):
            with np.errstate(all="ignore"):
                return _store(old.astype(om) + new.astype(om), x.dtype)
    else:
        def combine(old, new):
            return old + new
    res = _scatter_into(x, d, index, src, combine)
    if not is_float(x.dtype):
        return write_out(out, Tensor(res, x.dtype), "scatter_add")

    def backward(g):
        # torch: self gets grad, src grad.gather(dim, index)
        gs = _gather_back(g, x, d, index, src.shape) if src.requires_grad else None
        return g, None, gs
    return write_out(out, _result(res, x.dtype, (x, index, src), backward, op="scatter_add"),
                     "scatter_add")


def index_add(input, dim, index, source, *, alpha=1, out=None):
    """``input`` with ``alpha * source[i]`` added to the slice ``index[i]`` of
    ``dim``, for i in order, as torch's kernels round it (module doc)."""
    x = input
    d = wrap_dim(dim, x.ndim)
    if not isinstance(index, Tensor) or not isinstance(source, Tensor):
        bad = index if not isinstance(index, Tensor) else source
        raise FpemuTypeError(f"index_add(): index and source must be Tensors, got "
                             f"{type(bad).__name__}")
    if index.dtype is not int64 and index.dtype.name != "int32":
        raise FpemuRuntimeError(f"index_add_(): Expected dtype int32/int64 for index, got "
                                f"{index.dtype}")
    if index.ndim > 1:
        raise FpemuRuntimeError("index_add_(): Index is supposed to be a vector")
    if source.dtype is not x.dtype:
        raise FpemuRuntimeError(f"index_add_(): self ({x.dtype}) and source ({source.dtype}) "
                                f"must have the same scalar type: cast source with "
                                f"source.to(self.dtype)")
    n = index.numel()
    sshape = source.shape if source.ndim else (1,)
    xshape = x.shape if x.ndim else (1,)
    if source.ndim and n != sshape[d]:
        raise FpemuRuntimeError(f"index_add_(): Number of indices ({n}) should be equal to "
                                f"source.size(dim) ({sshape[d]})")
    if x.ndim and source.ndim and x.ndim != source.ndim or any(
            k != d and sshape[k] != xshape[k] for k in range(min(len(sshape), len(xshape)))):
        raise FpemuRuntimeError(f"index_add_(): source {list(source.shape)} and self "
                                f"{list(x.shape)} must match in every dimension but {d}")
    idx = index._data.reshape(-1).astype(np.int64)
    bad = (idx < -xshape[d]) | (idx >= xshape[d])
    if bad.any():
        raise IndexError(f"index out of range in self (index {int(idx[bad][0])}, dim {d} of "
                         f"size {xshape[d]})")
    idx = np.where(idx < 0, idx + xshape[d], idx)
    dt = x.dtype
    X = np.moveaxis(np.array(x._data.reshape(xshape), copy=True), d, 0)
    rows = X.reshape(X.shape[0], -1)
    S = np.moveaxis(source._data.reshape(sshape), d, 0).reshape(n, -1)
    if not is_float(dt):
        _in_order(rows, idx, S * alpha, lambda old, new: old + new)
    else:
        om = opmath(dt)
        fused = len(xshape) > 1 and get_profile().cpu and x.ndim > 1
        a = _aten.scalar(alpha, dt)

        def combine(old, new):
            O, N = old.astype(om), new.astype(om)
            with np.errstate(all="ignore"):
                if alpha == 1:
                    return _store(O + N, dt)
                if fused:
                    return _aten.add_alpha(O, N, a, dt)
                return _store(O + _store(N * a, dt).astype(om), dt)

        if fused and alpha != 1 and _aten.cpu_rounds_scalars(dt):
            for i in range(n):                  # the 16-bit kernel's tail rule is per slice
                rows[idx[i]] = combine(rows[idx[i]][None], S[i][None])[0]
        else:
            _in_order(rows, idx, S, combine)
    res = np.moveaxis(X, 0, d).reshape(x.shape)
    if not is_float(dt):
        return write_out(out, Tensor(res, dt), "index_add")
    a_o = opmath(dt)(alpha)

    def backward(g):
        # torch: self gets grad, source grad.index_select(dim, index) * alpha
        gs = None
        if source.requires_grad:
            G = np.take(g.reshape(xshape), idx, axis=d)
            gs = G if alpha == 1 else _store(G.astype(opmath(dt)) * a_o, dt)
            gs = gs.reshape(source.shape)
        return g, None, gs
    return write_out(out, _result(res, dt, (x, index, source), backward, op="index_add"),
                     "index_add")
