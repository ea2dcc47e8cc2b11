"""Shape ops and indexing. Views (``view``, ``transpose``, ``permute``,
``squeeze``, ``unsqueeze``, ``expand``, ``split``, ``chunk``, ``unbind``,
``narrow``, ``select`` and basic indexing) share their input's storage and
version counter, as in torch; ``reshape`` and ``flatten`` are views when the
layout allows, copies otherwise; advanced indexing copies."""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["broadcast_tensors", "broadcast_to", "cat", "chunk", "concat", "concatenate",
           "contiguous", "diag", "diagonal", "expand", "expand_as", "flatten", "flip", "gather",
           "getitem", "index_put", "index_select", "masked_select", "meshgrid", "movedim",
           "narrow", "nonzero", "permute", "repeat", "repeat_interleave", "reshape", "roll",
           "select", "split", "squeeze", "stack", "swapaxes", "swapdims", "t", "tensor_split",
           "trace", "transpose", "tril", "triu", "unbind", "unflatten", "unsqueeze", "view",
           "view_as"]

import warnings

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from .._autocast import cast_inputs
from .._core import (
    _named, _result, _store, _sum_to, as_dtype, bool_, check_memory_format, int64, is_float,
    np_dtype, result_type, Tensor, to_dtype,
)
from .._common import shape_arg, wrap_dim
from .inplace import _needs_graph, apply_inplace, copy_into, write_out
from .reduce import sum as _sum


def _infer(shape, numel, what):
    shape = list(shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        i = shape.index(-1)
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '[{', '.join(map(str, shape))}]' is invalid for input "
                               f"of size {numel}")
        shape[i] = numel // known
    if int(np.prod(shape)) != numel:
        raise RuntimeError(f"shape '[{', '.join(map(str, shape))}]' is invalid for input of "
                           f"size {numel}")
    return tuple(shape)


def _view_array(arr, shape):
    """A numpy view of ``arr`` with ``shape``, or None if the strides do not
    allow one."""
    v = arr.view()
    try:
        v.shape = shape
    except AttributeError:
        return None
    return v


def view(x, *shape):
    """A view with a new shape; raises as torch when the layout has no view."""
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int, np.integer)):
        return _view_dtype(x, as_dtype(shape[0]))
    shape = _infer(shape_arg(shape, "view()"), x._data.size, "view")
    v = _view_array(x._data, shape)
    if v is None:
        raise RuntimeError("view size is not compatible with input tensor's size and stride "
                           "(at least one dimension spans across two contiguous subspaces). "
                           "Use .reshape(...) instead.")
    return _as_view(x, v, "view")


def _view_dtype(x, dtype):
    raise FpemuTypeError(f"view({dtype}): reinterpreting bits as another dtype is not "
                         f"emulated; use fpemu.encode / fpemu.decode for bit patterns")


def _as_view(x, v, op):
    shape = x.shape

    def backward(g):
        return (g.reshape(shape),)
    return _result(v, x.dtype, (x,), backward, view_of=x, op=op, stored=True)


def reshape(x, *shape):
    shape = _infer(shape_arg(shape, "reshape()"), x._data.size, "reshape")
    v = _view_array(x._data, shape)
    if v is not None:
        return _as_view(x, v, "view")
    src = x.shape

    def backward(g):
        return (g.reshape(src),)
    return _result(x._data.reshape(shape), x.dtype, (x,), backward, op="reshape", stored=True)


def view_as(x, other):
    return view(x, other.shape)


def reshape_as(x, other):
    return reshape(x, other.shape)


def contiguous(x, memory_format=None):
    """The tensor itself if it is C-contiguous, else a contiguous copy (any
    ``memory_format``: fpemu keeps one layout, the values are the same)."""
    check_memory_format(x, memory_format, "contiguous()")
    if memory_format is not None and memory_format._name == "preserve_format":
        raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
    if x._data.flags.c_contiguous:
        return x

    def backward(g):
        return (g,)
    return _result(np.ascontiguousarray(x._data), x.dtype, (x,), backward, op="clone",
                   stored=True)


def transpose(x, dim0, dim1):
    d0, d1 = wrap_dim(dim0, x.ndim), wrap_dim(dim1, x.ndim)
    if x.ndim == 0:
        return _as_view(x, x._data.view(), "transpose")
    v = np.swapaxes(x._data, d0, d1)

    def backward(g):
        return (np.swapaxes(g, d0, d1),)
    return _result(v, x.dtype, (x,), backward, view_of=x, op="transpose", stored=True)


swapaxes = swapdims = transpose


def t(x):
    if x.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.ndim}D")
    return _named(transpose(x, 0, 1), "T") if x.ndim == 2 else x


def permute(x, *dims):
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    if len(dims) != x.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does "
                           f"not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {x.ndim} is not equal to len(dims) = {len(dims)}")
    dims = tuple(wrap_dim(d, x.ndim) for d in dims)
    v = np.transpose(x._data, dims)
    inv = np.argsort(dims)

    def backward(g):
        return (np.transpose(g, inv),)
    return _result(v, x.dtype, (x,), backward, view_of=x, op="permute", stored=True)


def movedim(x, source, destination):
    src = list(source) if isinstance(source, (tuple, list)) else [source]
    dst = list(destination) if isinstance(destination, (tuple, list)) else [destination]
    if len(src) != len(dst):
        raise FpemuRuntimeError(f"movedim: Invalid source or destination dims: source ({src} "
                                f"dims) should contain the same number of dims as destination "
                                f"({dst} dims)")
    ws, wd = [wrap_dim(d, x.ndim) for d in src], [wrap_dim(d, x.ndim) for d in dst]
    for name, given, wrapped in (("source", src, ws), ("destination", dst, wd)):
        if len(set(wrapped)) != len(wrapped):
            raise FpemuRuntimeError(f"movedim: repeated dim in `{name}` ({given})")
    source, destination = ws, wd
    v = np.moveaxis(x._data, source, destination)

    def backward(g):
        return (np.moveaxis(g, destination, source),)
    return _result(v, x.dtype, (x,), backward, view_of=x, op="movedim", stored=True)


def unsqueeze(x, dim):
    d = wrap_dim(dim, x.ndim + 1)
    return _as_view(x, np.expand_dims(x._data, d), "unsqueeze")


def squeeze(x, dim=None):
    if dim is None:
        return _as_view(x, np.squeeze(x._data), "squeeze")
    dims = dim if isinstance(dim, (tuple, list)) else (dim,)
    axes = tuple(a for a in (wrap_dim(d, x.ndim) for d in dims)
                 if x.ndim and x.shape[a] == 1)
    # torch: SqueezeBackward0 for all dims, 1 for one dim, 2 for a tuple of them
    return _named(_as_view(x, np.squeeze(x._data, axis=axes) if axes else x._data.view(),
                           "squeeze"),
                  "SqueezeBackward2" if isinstance(dim, (tuple, list)) else "SqueezeBackward1")


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        wrap_dim(start_dim, 0), wrap_dim(end_dim, 0)
        return reshape(x, (1,))
    s, e = wrap_dim(start_dim, x.ndim), wrap_dim(end_dim, x.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shape = x.shape[:s] + (int(np.prod(x.shape[s:e + 1])),) + x.shape[e + 1:]
    return reshape(x, shape)


def unflatten(x, dim, sizes):
    d = wrap_dim(dim, x.ndim)
    sizes = _infer(tuple(sizes), x.shape[d], "unflatten")
    return reshape(x, x.shape[:d] + sizes + x.shape[d + 1:])


def expand(x, *sizes):
    sizes = shape_arg(sizes, "expand()")
    if len(sizes) < x.ndim:
        raise RuntimeError(f"expand(torch.FloatTensor{{{list(x.shape)}}}, size={list(sizes)}): "
                           f"the number of sizes provided ({len(sizes)}) must be greater or "
                           f"equal to the number of dimensions in the tensor ({x.ndim})")
    lead = len(sizes) - x.ndim
    target = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    for i, s in enumerate(x.shape):
        if s != 1 and s != target[i + lead]:
            raise RuntimeError(f"The expanded size of the tensor ({target[i + lead]}) must "
                               f"match the existing size ({s}) at non-singleton dimension "
                               f"{i + lead}.  Target sizes: {list(sizes)}.  Tensor sizes: "
                               f"{list(x.shape)}")
    v = np.broadcast_to(x._data, target)
    return _result(v, x.dtype, (x,), lambda g: (g,), view_of=x, op="expand")


def meshgrid(*tensors, indexing=None):
    """Coordinate grids of 1-D tensors (views, as torch's): ``indexing="ij"``
    (torch's default, with its warning when not given) or ``"xy"`` (the first
    two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        warnings.warn("torch.meshgrid: in an upcoming release, it will be required to pass "
                      "the indexing argument.", UserWarning, stacklevel=2)
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise ValueError(f'torch.meshgrid: indexing must be one of "xy" or "ij", but received: '
                         f'{indexing}')
    for t_ in tensors:
        if not isinstance(t_, Tensor) or t_.ndim > 1:
            raise RuntimeError("torch.meshgrid: Expected 0D or 1D tensor in the tensor list")
    ts = [t_.reshape(-1) for t_ in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t_.shape[0] for t_ in ts)
    out = []
    for i, t_ in enumerate(ts):
        view = [1] * len(ts)
        view[i] = shape[i]
        out.append(expand(t_.reshape(*view), shape))
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)


def expand_as(x, other):
    return expand(x, other.shape)


def broadcast_to(x, shape):
    return expand(x, tuple(shape))


def broadcast_tensors(*tensors):
    """``torch.broadcast_tensors``: each tensor expanded to the common shape."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    try:
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in tensors))
    except ValueError:
        raise RuntimeError("The size of tensors must match for broadcasting: got shapes "
                           + ", ".join(str(list(t.shape)) for t in tensors)) from None
    return tuple(expand(t, shape) for t in tensors)


def repeat(x, *sizes):
    sizes = shape_arg(sizes, "repeat()")
    if len(sizes) < x.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    lead = len(sizes) - x.ndim
    src = x._data.reshape((1,) * lead + x.shape)
    res = np.tile(src, sizes)
    shape = src.shape

    def backward(g):
        G = g.astype(np.float64)
        split = []
        for r, s in zip(sizes, shape):
            split += [r, s]
        G = G.reshape(split).sum(axis=tuple(range(0, 2 * len(sizes), 2)))
        return (_store(G.reshape(x.shape), x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="repeat")


def repeat_interleave(x, repeats, dim=None, *, output_size=None):
    """Each element repeated ``repeats`` times along ``dim`` (flattened if
    None); ``output_size``, torch's hint of the result's length, is checked."""
    if dim is None:
        x, dim = reshape(x, (-1,)), 0
    d = wrap_dim(dim, x.ndim)
    reps = repeats._data if isinstance(repeats, Tensor) else int(repeats)
    idx = np.repeat(np.arange(x.shape[d]), reps)
    if output_size is not None and int(output_size) != idx.size:
        raise FpemuRuntimeError(f"repeat_interleave(): output_size={output_size} is not the "
                                f"result's length along dim {d}, {idx.size}")
    return index_select(x, d, Tensor(idx.astype(np.int64), int64))


def narrow(x, dim, start, length):
    if x.ndim == 0:
        raise FpemuRuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    d = wrap_dim(dim, x.ndim)
    if isinstance(start, Tensor):
        if start.ndim or is_float(start.dtype) or start.dtype is bool_:
            raise FpemuRuntimeError("start must be an 0-dim integral Tensor.")
        start = int(start.item())
    n = x.shape[d]
    if not -n <= start <= n:
        raise IndexError(f"start out of range (expected to be in range of [{-n}, {n}], but got "
                         f"{start})")
    start = start % n if start < 0 else start
    if length < 0:
        raise FpemuRuntimeError("narrow(): length must be non-negative.")
    if start + length > n:
        raise FpemuRuntimeError(f"start ({start}) + length ({length}) exceeds dimension size "
                                f"({n}).")
    idx = [slice(None)] * x.ndim
    idx[d] = slice(start, start + length)
    return getitem(x, tuple(idx))


def select(x, dim, index):
    d = wrap_dim(dim, x.ndim)
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return getitem(x, tuple(idx))


def split(x, split_size_or_sections, dim=0):
    """Views of consecutive pieces along ``dim``: pieces of
    ``split_size`` (the last smaller) or the given list of sizes."""
    d = wrap_dim(dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                               f"(input tensor's size at dimension {d}), but got "
                               f"split_sizes={sizes}")
    else:
        step = int(split_size_or_sections)
        if step <= 0 and n:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got "
                               f"dimension size of {n}")
        sizes = [min(step, n - i) for i in range(0, n, step)] if n else [0]
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, d, start, s))
        start += s
    return tuple(out)


def chunk(x, chunks, dim=0):
    d = wrap_dim(dim, x.ndim)
    n = x.shape[d]
    step = -(-n // chunks) if n else 1
    return split(x, step, d) if n else (x,)


def tensor_split(x, sections, dim=0):
    """``sections`` pieces of near-equal size, or the pieces between the given
    indices (a list or a 1-D int tensor; a 0-d tensor is a count), each
    ``x[a:b]`` along ``dim`` as a slice (indices out of order give empty or
    overlapping pieces, as torch's)."""
    d = wrap_dim(dim, x.ndim)
    n = x.shape[d]
    if isinstance(sections, Tensor):
        if is_float(sections.dtype) or sections.ndim > 1:
            raise FpemuRuntimeError(f"tensor_split expected tensor_indices_or_sections to be a "
                                    f"zero-dimensional or one-dimensional tensor of int64, but "
                                    f"got a {sections.ndim}-D {sections.dtype} tensor")
        sections = int(sections.item()) if sections.ndim == 0 else [
            int(v) for v in sections._data]
    if isinstance(sections, (int, np.integer)):
        if sections <= 0:
            raise FpemuRuntimeError(f"number of sections must be larger than 0, got {sections}")
        q, r = divmod(n, int(sections))
        return split(x, [q + 1] * r + [q] * (int(sections) - r), d)
    bounds = [0] + [int(b) for b in sections] + [n]
    pieces = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = [slice(None)] * x.ndim
        idx[d] = slice(a, b)
        pieces.append(getitem(x, tuple(idx)))
    return tuple(pieces)


def unbind(x, dim=0):
    d = wrap_dim(dim, x.ndim)
    return tuple(select(x, d, i) for i in range(x.shape[d]))


def cat(tensors, dim=0, out=None):
    """Concatenate along ``dim`` (type promotion across the inputs)."""
    if isinstance(tensors, Tensor):
        raise FpemuTypeError("cat(): argument 'tensors' (position 1) must be tuple of Tensors, "
                             "not Tensor")
    tensors = list(tensors)
    if not tensors:
        raise FpemuValueError("torch.cat(): expected a non-empty list of Tensors")
    for t_ in tensors:
        if not isinstance(t_, Tensor):
            raise FpemuTypeError(f"cat(): expected a sequence of Tensors, got "
                                 f"{type(t_).__name__}")
    tensors = list(cast_inputs("cat", *tensors))        # AutocastCPU: promote
    if any(t_.ndim == 0 for t_ in tensors):
        i = next(i for i, t_ in enumerate(tensors) if t_.ndim == 0)
        raise FpemuRuntimeError(f"zero-dimensional tensor (at position {i}) cannot be "
                                f"concatenated")
    legacy = [t_.ndim == 1 and t_.shape[0] == 0 for t_ in tensors]   # torch skips these
    if all(legacy):
        legacy[0] = False                   # all empty: the first stands for them
    keep = [t_ for t_, e in zip(tensors, legacy) if not e]
    d = wrap_dim(dim, keep[0].ndim)
    for i, t_ in enumerate(keep):
        if t_.ndim != keep[0].ndim:
            raise FpemuRuntimeError(f"Tensors must have same number of dimensions: got "
                                    f"{keep[0].ndim} and {t_.ndim}")
        for k in range(t_.ndim):
            if k != d and t_.shape[k] != keep[0].shape[k]:
                raise FpemuRuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size "
                    f"{keep[0].shape[k]} but got size {t_.shape[k]} for tensor number {i} in "
                    f"the list.")
    dt = result_type(*keep)
    parts = [_store(t_._data, dt) if t_.dtype != dt else t_._data for t_ in keep]
    try:
        res = np.concatenate(parts, axis=d)
    except ValueError as err:
        raise RuntimeError(f"Sizes of tensors must match except in dimension {d}: "
                           f"{[tuple(t_.shape) for t_ in keep]} ({err})") from None
    bounds = np.cumsum([t_.shape[d] for t_ in keep])[:-1]

    def backward(g):
        # the skipped empty tensors get empty gradients, as torch's cat gives them
        pieces = iter(np.split(g, bounds, axis=d))
        return tuple(np.zeros((0,), g.dtype) if e else next(pieces) for e in legacy)
    res_t = _result(res, dt, tuple(tensors), backward, op="cat")
    if out is not None:
        return copy_into(out, res_t)
    return res_t


concat = concatenate = cat


def stack(tensors, dim=0, out=None):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    shapes = {tuple(t_.shape) for t_ in tensors}
    if len(shapes) > 1:
        i = next(i for i, t_ in enumerate(tensors) if t_.shape != tensors[0].shape)
        raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                           f"{list(tensors[0].shape)} at entry 0 and {list(tensors[i].shape)} "
                           f"at entry {i}")
    d = wrap_dim(dim, tensors[0].ndim + 1)
    tensors = cast_inputs("stack", *tensors)            # AutocastCPU: promote
    return _named(cat([unsqueeze(t_, d) for t_ in tensors], d, out=out), "Stack")


def flip(x, dims):
    dims = dims if isinstance(dims, (list, tuple)) else (dims,)
    dims = tuple(wrap_dim(d, x.ndim) for d in dims)
    res = np.flip(x._data, dims).copy()
    return _result(res, x.dtype, (x,), lambda g: (np.flip(g, dims),), op="flip")


def roll(x, shifts, dims=None):
    sh = list(shifts) if isinstance(shifts, (tuple, list)) else [shifts]
    if not sh:
        raise FpemuRuntimeError("roll(): `shifts` required")
    if dims is not None:
        dl = list(dims) if isinstance(dims, (tuple, list)) else [dims]
        if len(dl) != len(sh):
            raise FpemuRuntimeError(f"roll(): shifts and dimensions must align. shifts: "
                                    f"{len(sh)}, dims: {len(dl)}")
        if x.ndim == 0:
            raise IndexError("Dimension specified as 0 but tensor has no dimensions")
        dims = tuple(wrap_dim(d, x.ndim) for d in dl)
        shifts = tuple(sh)
    elif len(sh) != 1:
        raise FpemuRuntimeError(f"roll(): shifts and dimensions must align. shifts: {len(sh)}, "
                                f"dims: 0")
    res = np.roll(x._data, shifts, dims)
    neg = tuple(-s for s in shifts) if isinstance(shifts, (tuple, list)) else -shifts
    return _result(res, x.dtype, (x,), lambda g: (np.roll(g, neg, dims),), op="roll")


def tril(x, diagonal=0):
    return _triangle(x, diagonal, np.tril, "tril")


def triu(x, diagonal=0):
    return _triangle(x, diagonal, np.triu, "triu")


def _triangle(x, k, npop, name):
    if x.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    res = npop(x._data, k)
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)
    return _result(res, x.dtype, (x,), lambda g: (npop(g, k),), op=name)


def _diag_index(rows, cols, k):
    """(row, col) indices of the ``k``-th diagonal of a rows x cols matrix."""
    n = max(0, min(rows + min(k, 0), cols - max(k, 0)))
    i = np.arange(n)
    return i - min(k, 0), i + max(k, 0)


def diagonal(x, offset=0, dim1=0, dim2=1):
    """``torch.diagonal``: the ``offset``-th diagonal of the (dim1, dim2)
    planes, as the last dim (a copy here; torch returns a view)."""
    return _diagonal(x, offset, dim1, dim2)


def _diagonal(x, offset, dim1, dim2):
    if x.ndim < 2:
        raise RuntimeError(f"diagonal dimensions requires ndim larger than 1, got {x.ndim}")
    d1, d2 = wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    moved = np.moveaxis(x._data, (d1, d2), (-2, -1))
    r, c = _diag_index(moved.shape[-2], moved.shape[-1], int(offset))
    res = np.ascontiguousarray(moved[..., r, c])
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        G = np.zeros(moved.shape, g.dtype)
        G[..., r, c] = g
        return (np.ascontiguousarray(np.moveaxis(G, (-2, -1), (d1, d2))),)
    return _result(res, x.dtype, (x,), backward, op="diagonal")


def diag(x, diagonal=0):  # noqa: F811 - torch's argument name shadows the function
    """``torch.diag``: a 1-D input becomes the ``diagonal``-th diagonal of a
    square matrix (zeros elsewhere); a 2-D input gives its diagonal."""
    k = int(diagonal)
    if x.ndim == 2:
        return _diagonal(x, k, 0, 1)
    if x.ndim != 1:
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {x.ndim}D")
    n = x.shape[0] + abs(k)
    r, c = _diag_index(n, n, k)
    res = np.zeros((n, n), x._data.dtype)
    res[r, c] = x._data
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)
    return _result(res, x.dtype, (x,), lambda g: (np.ascontiguousarray(g[r, c]),), op="diag")


def trace(x):
    """``torch.trace``: the sum of a matrix's main diagonal (``diagonal().sum()``,
    as torch computes it)."""
    if x.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {x.ndim}")
    (x,) = cast_inputs("trace", x)
    return _sum(_diagonal(x, 0, 0, 1))


def gather(x, dim, index, *, sparse_grad=False, out=None):
    return write_out(out, _gather(x, dim, index), "gather")


def _gather(x, dim, index):
    d = wrap_dim(dim, x.ndim)
    # torch takes a 0-d input or index as one of one element
    X = x._data.reshape(1) if x.ndim == 0 else x._data
    idx = index._data.astype(np.int64)
    idx = idx.reshape(1) if idx.ndim == 0 else idx
    if idx.size == 0:               # torch checks nothing more of an empty index
        return _result(np.zeros(index.shape, x._data.dtype), x.dtype, (x, index),
                       lambda g: (np.zeros(x.shape, g.dtype), None), op="gather") if is_float(
            x.dtype) else Tensor(np.zeros(index.shape, x._data.dtype), x.dtype)
    if idx.ndim != X.ndim:
        raise FpemuRuntimeError(f"gather(): Index tensor must have the same number of "
                                f"dimensions as input tensor ({index.ndim} and {x.ndim})")
    for k in range(X.ndim):
        if k != d and idx.shape[k] > X.shape[k]:
            raise FpemuRuntimeError(f"gather(): Size does not match at dimension {k} expected "
                                    f"index {list(index.shape)} to be no larger than self "
                                    f"{list(x.shape)} apart from dimension {d}")
    bad = (idx < -X.shape[d]) | (idx >= X.shape[d])
    if bad.any():
        raise FpemuRuntimeError(f"gather(): index {int(idx[bad].flat[0])} is out of bounds for "
                                f"dimension {d} with size {X.shape[d]}")
    res = np.take_along_axis(X, idx, axis=d).reshape(index.shape)
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        G = np.zeros(X.shape, np.float64)
        _scatter_add(G, d, idx, g.astype(np.float64).reshape(idx.shape))
        return (_store(G.reshape(x.shape), x.dtype), None)
    return _result(res, x.dtype, (x, index), backward, op="gather")


def _scatter_add(G, d, idx, src):
    grid = list(np.indices(idx.shape, sparse=True))
    grid[d] = idx
    np.add.at(G, tuple(grid), src)


def index_select(x, dim, index, *, out=None):
    return write_out(out, _index_select(x, dim, index), "index_select")


def _index_select(x, dim, index):
    if x.ndim == 0:                 # torch: a 0-d input gives a 0-d result
        return reshape(_index_select(reshape(x, (1,)), 0, index), ())
    d = wrap_dim(dim, x.ndim)
    idx = [slice(None)] * x.ndim
    idx[d] = index
    return getitem(x, tuple(idx))


# ---------------------------------------------------------------- indexing
def _index(idx):
    """A torch index as a numpy one; 0-d integer tensors act as ints."""
    if isinstance(idx, Tensor):
        if idx.ndim == 0 and idx.dtype is not bool_ and not is_float(idx.dtype):
            return int(idx.item())
        if is_float(idx.dtype):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        return idx._data if idx.dtype is bool_ else idx._data.astype(np.int64)
    if isinstance(idx, tuple):
        return tuple(_index(i) for i in idx)
    if isinstance(idx, list):
        if any(isinstance(i, (Tensor, list, slice)) or i is None or i is Ellipsis
               for i in idx):
            return tuple(_index(i) for i in idx)
        return np.asarray(idx, dtype=np.int64 if not any(isinstance(i, bool) for i in idx)
                          else bool)
    return idx


def _is_basic(idx):
    parts = idx if isinstance(idx, tuple) else (idx,)
    return all(isinstance(p, (int, np.integer, slice)) and not isinstance(p, (bool, np.bool_))
               or p is None or p is Ellipsis for p in parts)


def _basic(idx):
    """A basic index with an Ellipsis, so that numpy returns a view even when
    every dim is taken by an integer."""
    parts = idx if isinstance(idx, tuple) else (idx,)
    if not any(p is Ellipsis for p in parts):
        parts = parts + (Ellipsis,)
    return parts


def _index_op(idx):
    """torch's grad_fn of basic indexing: the last step that does something
    (an int selects, a slice that is not the whole dimension slices, None
    unsqueezes); none at all is an alias."""
    steps = idx if isinstance(idx, tuple) else (idx,)
    for s in reversed(steps):
        if s is None:
            return "unsqueeze"
        if isinstance(s, slice):
            if not (s.start in (None, 0) and s.stop is None and s.step in (None, 1)):
                return "slice"
        elif s is not Ellipsis:
            return "select"
    return "alias"


def getitem(x, idx):
    idx = _index(idx)
    if _is_basic(idx):
        try:
            v = x._data[_basic(idx)]
        except IndexError as err:
            raise IndexError(str(err).replace("axis", "dimension")) from None

        def backward_view(g):
            G = np.zeros(x.shape, g.dtype)
            G[_basic(idx)] = g
            return (G,)
        return _result(v, x.dtype, (x,), backward_view, view_of=x, op=_index_op(idx),
                       stored=True)
    try:
        res = np.array(x._data[idx], copy=True)
    except IndexError as err:
        raise IndexError(str(err)) from None

    def backward(g):
        G = np.zeros(x.shape, np.float64)
        np.add.at(G, idx, g.astype(np.float64))
        return (_store(G, x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="index")


def index_put(x, idx, value, accumulate=False):
    """``x[idx] = value`` as an out-of-place op (the graph form of
    ``__setitem__``): value rounded to x's dtype; gradients flow to x where not
    overwritten and to value from the written places. Under CUDA's autocast
    lists x and value first widen to the wider of the two (``promote``)."""
    x, value = cast_inputs("index_put", x, value)
    return _index_put(x, idx, value, accumulate)


def _index_put(x, idx, value, accumulate=False):
    """:func:`index_put` without the autocast lookup: ``x[idx] = value``
    (``index_put_``, which no autocast list names) writes through it."""
    idx = _index(idx)
    res = np.array(x._data, copy=True)
    if isinstance(value, Tensor):
        V = _store(value._data, x.dtype) if is_float(x.dtype) else value._data.astype(
            res.dtype)
    else:
        V = _store(np.float32(value), x.dtype) if is_float(x.dtype) else value
    if accumulate:
        np.add.at(res, idx, V)
    else:
        res[idx] = V
    res = _store(res, x.dtype) if is_float(x.dtype) else res
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)
    vshape = value.shape if isinstance(value, Tensor) else None

    def backward(g):
        gx = g.copy()
        if not accumulate:
            gx[idx] = 0
        gv = None
        if vshape is not None:
            sel = np.broadcast_to(g[idx], np.broadcast_shapes(g[idx].shape, vshape))
            gv = _sum_to(np.array(sel), vshape, value.dtype) if sel.shape != tuple(vshape) \
                else np.array(sel)
        return gx, gv
    return _result(res, x.dtype, (x, value), backward, op="index_put")


def masked_select(x, mask, *, out=None):
    """The elements of ``x`` where ``mask`` holds, as one 1-D tensor (the two
    broadcast against each other first)."""
    if tuple(x.shape) != tuple(mask.shape):
        x, mask = broadcast_tensors(x, mask)
    return write_out(out, getitem(reshape(x, (-1,)), reshape(mask, (-1,))), "masked_select")


def nonzero(x, as_tuple=False):
    if x.ndim == 0:                 # torch takes a 0-d tensor as one element
        n = int(bool(x._data))
        if as_tuple:
            return (Tensor(np.zeros(n, np.int64), int64),)
        return Tensor(np.zeros((n, 0), np.int64), int64)
    idx = np.nonzero(x._data)
    if as_tuple:
        return tuple(Tensor(i.astype(np.int64), int64) for i in idx)
    return Tensor(np.stack(idx, axis=-1).astype(np.int64), int64)


def setitem(x, idx, value):
    """``x[idx] = value``: value rounded to x's dtype (a Python number through
    float32, as torch's fill), written into x's storage."""
    if not _needs_graph(x, (value,)):
        np_idx = _index(idx)
        if isinstance(value, Tensor):
            v = to_dtype(Tensor(value._data, value.dtype), x.dtype)._data if \
                value.dtype != x.dtype else value._data
        elif is_float(x.dtype):
            v = _store(np.asarray(value, np.float64).astype(np.float32), x.dtype)
        else:
            v = np.asarray(value).astype(np_dtype(x.dtype))
        try:
            x._data[np_idx] = v
        except ValueError as err:
            raise RuntimeError(str(err)) from None
        x._bump()
        return x
    return apply_inplace(x, _index_put, idx, value)
