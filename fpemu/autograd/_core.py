"""Tensors: the :class:`Tensor` class and its storage, type promotion, how
tensors are made, cast and pickled, and the backward pass.

A tensor holds a numpy array of its values: float32 for every fpemu
:class:`~fpemu.Format` (each of them fits float32 exactly), float64 for
``float64``, and the integer types as themselves. Ops compute in "opmath"
(float32 for every Format, float64 for float64), as CUDA's kernels do, and
:func:`_store` rounds the opmath result once to the output dtype.

Storage follows PyTorch (``docs/pytorch-numerics.md`` §9, "Storage, views and
versions"): a view (``view``, ``transpose``, basic indexing, ``detach``,
``.data``, ``state_dict`` values, ...) is a numpy view of its base's array, so
an in-place op on either writes into both. A view shares its base's version
counter; every in-place write bumps it, and a backward that needs a tensor
saved at an older version raises, as autograd does.

An op makes its output with :func:`_result`, which links it into the graph of
:class:`Node` objects (``_graph``); :func:`run_backward` runs the backward
pass over that graph.

The layers above import all of the tensor layer from here: this module
re-exports the dtypes (``_dtypes``), grad mode (``_grad_mode``), the seeds
(``_random``), devices and memory formats (``_device``), the graph
(``_graph``) and the hook handle (``_hooks``).
"""

from __future__ import annotations

import weakref

import numpy as np

from .. import checks
from ..formats import Format
from ..errors import (
    FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError, FpemuValueError,
)
from ._profile import get_profile
from ._state import State, grad_mode
from ._print import tensor_repr


from ._dtypes import (  # noqa: F401  (re-exported: the layers above import them from here)
    DType, _FORMAT_FIELDS, TorchFormat, _torch_format, float64, int64, int32, int16, int8,
    uint8, bool_, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz,
    float8_e5m2fnuz, _TORCH_FORMATS, _CANON, _CANON_ID, canonical, _dtype_by_name,
    _BY_NAME, as_dtype, is_float, np_dtype, opmath, _store, _category, _widest_float,
    _INT_RANK, _widest_int,
)
from . import _device
from ._device import (  # noqa: F401  (re-exported)
    channels_last, channels_last_3d, check_device, check_memory_format, contiguous_format,
    current_device, preserve_format, _MEMORY_FORMATS, _memory_format_named,
)
from ._grad_mode import (  # noqa: F401  (re-exported)
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled, _GradModeBase,
)
from ._graph import (  # noqa: F401  (re-exported)
    AccumulateGrad, Node, _NUMBERED, _SAVED_FREED, _accumulate, _check_saved, _named,
    _node_name, _shape_str, _sum_to, _topo,
)
from ._hooks import RemovableHandle  # noqa: F401  (re-exported)
from ._random import (  # noqa: F401  (re-exported)
    get_rng_state, initial_seed, manual_seed, seed, set_rng_state,
)

# re-exported too, bound rather than imported: Tensor has a ``device`` property and
# a ``memory_format`` argument of the same names
device, memory_format = _device.device, _device.memory_format


# -------------------------------------------------------------- type promotion
def result_type(*operands):
    """PyTorch's type promotion: tensors with dimensions first, then 0-dim
    tensors, then Python numbers; a lower group only counts if it is of a
    higher category (bool < integer < floating)."""
    # the common case first: tensors of one floating dtype (any dims) give it
    first = operands[0] if operands else None
    if isinstance(first, Tensor):
        d = first.dtype
        if isinstance(d, Format) or d is float64:
            for x in operands:
                if not (isinstance(x, Tensor) and x.dtype is d):
                    break
            else:
                return d
    groups = ([], [], [])
    for x in operands:
        if isinstance(x, Tensor):
            groups[0 if x.ndim else 1].append(x.dtype)
        elif isinstance(x, bool):
            groups[2].append(bool_)
        elif isinstance(x, (int, np.integer)):
            groups[2].append(int64)
        elif isinstance(x, (float, np.floating)):
            groups[2].append(float32)
        else:
            raise TypeError(f"expected a Tensor or a Python number, got {type(x).__name__}")
    result = None
    for g in groups:
        if not g:
            continue
        cat = max(_category(d) for d in g)
        top = [d for d in g if _category(d) == cat]
        d = _widest_float(top) if cat == 2 else _widest_int(top)
        if result is None or cat > _category(result):
            result = d
    return result


# --------------------------------------------------------------------- Tensor
_LEGACY = object()          # an argument Tensor(...) was not given
_DTYPE_CLASSES = frozenset((DType, TorchFormat, Format))


#: torch's legacy constructor (``fpemu.autograd._legacy``, which registers it
#: here when the package is imported: this module does not import that one)
_LEGACY_INIT = [None]


def set_legacy_constructor(init):
    """Install ``init(tensor, dtype, args, kwargs)``, the legacy constructor
    that ``Tensor(2, 3)`` and ``Tensor([1.0])`` run."""
    _LEGACY_INIT[0] = init


class Tensor:
    """An array of values of one dtype, with a gradient and a graph.

    Build one with :func:`tensor`; ops are methods and functions of
    :mod:`fpemu.autograd`. ``Tensor(2, 3)``, ``Tensor([1.0, 2.0])`` and the
    other forms of torch's legacy constructor build float32 tensors by
    torch's rules (:mod:`fpemu.autograd._legacy`).
    """

    __array_priority__ = 1000
    __hash__ = object.__hash__

    def __init__(self, array=_LEGACY, dtype=_LEGACY, /, *sizes, requires_grad=None, _vc=None,
                 _base=None, **kwargs):
        # fpemu builds tensors as Tensor(array, dtype); anything else is torch's
        # legacy constructor, Tensor(2, 3) or Tensor([1.0, 2.0]) (fpemu/autograd/_legacy.py)
        if dtype.__class__ not in _DTYPE_CLASSES and not isinstance(dtype, (DType, Format)):
            args = tuple(a for a in (array, dtype) if a is not _LEGACY) + sizes
            if requires_grad is not None:
                kwargs["requires_grad"] = requires_grad
            _LEGACY_INIT[0](self, None, args, kwargs)
            return
        if sizes or kwargs:
            raise FpemuTypeError(f"Tensor(array, dtype, *, requires_grad): unexpected arguments "
                                 f"{sizes or ''}{kwargs or ''}")
        self._data = array if isinstance(array, np.ndarray) else np.asarray(array)
        self.dtype = _CANON_ID.get(id(dtype)) or canonical(dtype)
        self._vc = [0] if _vc is None else _vc
        self._base = _base
        self._requires_grad = False
        self.grad_fn = None
        self._acc = None
        self._grad = None
        self._retain = False
        self._name = None
        if requires_grad:
            self.requires_grad_(True)

    # -- storage
    @property
    def _a(self):
        return self._data

    @_a.setter
    def _a(self, values):
        """Write ``values`` into this tensor's storage (an in-place update that
        every view sees), and bump the version."""
        self._data[...] = values
        self._vc[0] += 1

    def _set_data(self, array, dtype=None):
        """Point this tensor at new storage (``.data = ...``, ``Module.to``)."""
        self._data = array if isinstance(array, np.ndarray) else np.asarray(array)
        if dtype is not None:
            self.dtype = canonical(dtype)

    @property
    def _version(self):
        return self._vc[0]

    def _bump(self):
        self._vc[0] += 1

    def untyped_storage(self):
        return self._data.base if self._data.base is not None else self._data

    def data_ptr(self):
        return self._data.__array_interface__["data"][0]

    def is_contiguous(self, memory_format=None):
        return bool(self._data.flags.c_contiguous)

    def stride(self, dim=None):
        item = self._data.itemsize
        st = tuple(s // item for s in self._data.strides)
        return st if dim is None else st[dim]

    def storage_offset(self):
        base = self._data
        while base.base is not None and isinstance(base.base, np.ndarray):
            base = base.base
        return (self.data_ptr() - base.__array_interface__["data"][0]) // self._data.itemsize

    # -- basic facts
    @property
    def shape(self):
        return Size(self._data.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[wrap_dim(dim, self._data.ndim)]

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    ndimension = dim

    def numel(self):
        return int(self._data.size)

    nelement = numel

    def element_size(self):
        return 8 if self.dtype is float64 else (
            (self.dtype.bits + 7) // 8 if isinstance(self.dtype, Format)
            else np.dtype(self.dtype.np_dtype).itemsize)

    def __len__(self):
        if self._data.ndim == 0:
            raise FpemuTypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    @property
    def is_leaf(self):
        return self.grad_fn is None

    @property
    def requires_grad(self):
        return self._requires_grad or self.grad_fn is not None

    @requires_grad.setter
    def requires_grad(self, flag):
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad=True):
        if self.grad_fn is not None:
            if not requires_grad:
                raise FpemuRuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want to "
                    "use a computed variable in a subgraph that doesn't require differentiation "
                    "use var_no_grad = var.detach().")
            return self
        if requires_grad and not is_float(self.dtype):
            raise FpemuRuntimeError("only Tensors of floating point dtype can require "
                                    "gradients")
        self._requires_grad = bool(requires_grad)
        if not requires_grad:
            self._acc = None
        return self

    @property
    def grad(self):
        if self.grad_fn is not None and not self._retain and self._grad is None:
            return None
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None and not isinstance(value, Tensor):
            raise FpemuTypeError(f"assigned grad expected to be a Tensor or None but got grad "
                                 f"of type {type(value).__name__}")
        if value is not None and tuple(value.shape) != tuple(self.shape):
            raise FpemuRuntimeError(f"assigned grad has data of a different size: "
                                    f"{tuple(value.shape)} vs {tuple(self.shape)}")
        self._grad = value

    def _edge(self):
        """The node a gradient for this tensor flows into."""
        if self.grad_fn is not None:
            return self.grad_fn
        if self._acc is None:
            self._acc = AccumulateGrad(self)
        return self._acc

    def is_floating_point(self):
        return is_float(self.dtype)

    def is_complex(self):
        return False

    @property
    def device(self):
        return current_device()

    @property
    def is_cuda(self):
        return get_profile().device == "cuda"

    @property
    def is_cpu(self):
        return not self.is_cuda

    # devices fpemu never emulates, and tensors it has no kind of
    is_xpu = is_mps = is_meta = is_quantized = is_mkldnn = is_nested = property(
        lambda self: False)

    # layout and is_sparse: fpemu/autograd/sparse.py (a sparse COO tensor is
    # emulated as a dense one, marked)

    @property
    def data(self):
        """A tensor sharing this storage, outside the graph and with its own
        version counter."""
        return Tensor(self._data, self.dtype)

    @data.setter
    def data(self, other):
        if not isinstance(other, Tensor):
            raise FpemuTypeError(f".data = expects a Tensor, got {type(other).__name__}")
        self._set_data(other._data, other.dtype)

    def numpy(self, force=False):
        if self.requires_grad and not force:
            raise FpemuRuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                                    "tensor.detach().numpy() instead.")
        return self._data

    def item(self):
        if self._data.size != 1:
            raise FpemuRuntimeError(f"a Tensor with {self._data.size} elements cannot be "
                                    f"converted to Scalar")
        return self._data.reshape(-1)[0].item()

    def tolist(self):
        return self._data.tolist()

    def detach(self):
        """This storage and version counter, outside the graph."""
        return Tensor(self._data, self.dtype, _vc=self._vc)

    def detach_(self):
        if self._base is not None and self._base.requires_grad:
            raise FpemuRuntimeError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self._requires_grad = False
        self._acc = None
        return self

    def retain_grad(self):
        """Keep ``.grad`` on a non-leaf tensor after backward()."""
        if self.grad_fn is None:
            if not self._requires_grad:
                raise FpemuRuntimeError("can't retain_grad on Tensor that has "
                                        "requires_grad=False")
            return
        self._retain = True
        self.grad_fn.retained = weakref.ref(self)

    @property
    def retains_grad(self):
        return self._retain

    def register_hook(self, hook):
        """``hook(grad) -> Tensor or None``, called when this tensor's gradient
        is computed; returning a tensor replaces the gradient."""
        if not self.requires_grad:
            raise FpemuRuntimeError("cannot register a hook on a tensor that doesn't require "
                                    "gradient")
        return self._edge().register_hook(hook)

    def cpu(self):
        return self

    def cuda(self, *args, **kwargs):
        return self

    def pin_memory(self, *args, **kwargs):
        return self

    def is_pinned(self, *args, **kwargs):
        return False

    def share_memory_(self):
        return self

    def __repr__(self) -> str:
        return tensor_repr(self)

    def __reduce_ex__(self, protocol):
        # values as bytes (no numpy object in the pickle, so a weights-only
        # load needs nothing but _rebuild_tensor); like torch, no gradient
        arr = self._data
        return (_rebuild_tensor, (arr.tobytes(order="C"), arr.dtype.str, tuple(arr.shape),
                                  _dtype_key(self.dtype), self.requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise FpemuRuntimeError("Only Tensors created explicitly by the user (graph "
                                    "leaves) support the deepcopy protocol at the moment.")
        new = type(self).__new__(type(self))
        Tensor.__init__(new, self._data.copy(), self.dtype, requires_grad=self.requires_grad)
        new.__dict__.update({k: v for k, v in self.__dict__.items()
                             if k not in new.__dict__})
        if self._grad is not None:
            new._grad = Tensor(self._grad._data.copy(), self._grad.dtype)
        memo[id(self)] = new
        return new

    # -- graph
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into the ``.grad`` of every leaf."""
        run_backward([self], [gradient], retain_graph, create_graph, inputs)


class Size(tuple):
    """``torch.Size``: a tuple of ints."""

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n

    def __repr__(self):
        return f"torch.Size([{', '.join(str(s) for s in self)}])"

    def __getitem__(self, i):
        out = tuple.__getitem__(self, i)
        return Size(out) if isinstance(i, slice) else out


def wrap_dim(dim, ndim):
    """``dim`` in ``[-ndim, ndim)`` as an index, as torch's ``maybe_wrap_dim``
    (a 0-d tensor takes -1 and 0; out of range is torch's IndexError)."""
    n = max(ndim, 1)
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise FpemuTypeError(f"dim must be an int, got {type(dim).__name__} ({dim!r})")
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return int(dim) % n


# -------------------------------------------------------------------- pickling
def _dtype_key(dtype):
    """How a pickle names a tensor's dtype: its name when the name finds it
    again, else the Format itself (a custom format)."""
    try:
        if as_dtype(dtype.name) == dtype:
            return dtype.name
    except (TypeError, ValueError):
        pass
    return dtype


def _rebuild_tensor(data, np_dtype_str, shape, key, requires_grad):
    """Unpickling a tensor: its values from bytes (checked against the
    shape), its dtype by name."""
    npdt = np.dtype(np_dtype_str)
    if npdt.kind not in "biuf" or npdt.hasobject:
        raise FpemuValueError(f"a pickled tensor holds values of numpy dtype {npdt}; fpemu "
                              f"stores bool, integer and float values only")
    count = 1
    for n in shape:
        count *= int(n)
    if count * npdt.itemsize != len(data):
        raise FpemuValueError(f"a pickled tensor of shape {tuple(shape)} and dtype {npdt} "
                              f"needs {count * npdt.itemsize} bytes, the file holds "
                              f"{len(data)}: the file is damaged")
    array = np.frombuffer(data, npdt).reshape(shape).copy()
    t = Tensor(array, as_dtype(key))
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild(array, key, requires_grad, grad):
    """Unpickling a tensor pickled by earlier fpemu releases (a numpy array and
    its grad); ``load(..., weights_only=False)`` reads those files."""
    t = Tensor(array, as_dtype(key))
    if requires_grad:
        t.requires_grad_(True)
    t._grad = grad
    return t


# ------------------------------------------------------------------ the engine
def _grad_array(t, g):
    if g is None:
        if t._data.size != 1:
            raise FpemuRuntimeError("grad can be implicitly created only for scalar outputs")
        if not is_float(t.dtype):
            raise FpemuRuntimeError(f"grad can be implicitly created only for real scalar "
                                    f"outputs but got {t.dtype}")
        return np.ones(t.shape, np_dtype(t.dtype))
    arr = _store(g._data if isinstance(g, Tensor) else np.asarray(g), t.dtype)
    if arr.shape != t.shape:
        raise FpemuRuntimeError(f"Mismatch in shape: grad_output[0] has a shape of "
                                f"torch.Size({list(arr.shape)}) and output[0] has a shape of "
                                f"torch.Size({list(t.shape)}).")
    return arr.copy()


#: the backward pass skips rounding the gradients of ``stored`` nodes (False:
#: it rounds them anyway, which must change nothing; the tests compare)
_TRUST_STORED = True


def run_backward(tensors, grads, retain_graph=None, create_graph=False, inputs=None,
                 capture=None):
    """The backward pass from ``tensors`` (with gradients ``grads``). With
    ``capture`` (a list of tensors), their gradients are returned instead of
    accumulated into leaves (``autograd.grad``)."""
    if create_graph:
        raise FpemuNotImplementedError("fpemu's backward does not build a graph of the "
                                       "backward pass (create_graph=True, higher-order "
                                       "gradients); compute second derivatives in torch")
    retain = bool(retain_graph)
    roots, init = [], {}
    for t, g in zip(tensors, grads):
        if not t.requires_grad:
            raise FpemuRuntimeError("element 0 of tensors does not require grad and does not "
                                    "have a grad_fn")
        arr = _grad_array(t, g)
        node = t._edge()
        roots.append(node)
        init[id(node)] = _accumulate(init.get(id(node)), arr, t.dtype)
    targets = only = None
    if capture is not None:
        targets = {id(t._edge()): i for i, t in enumerate(capture)}
    elif inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        only = {id(t._edge()) for t in inputs}
    captured = [None] * (len(capture) if capture is not None else 0)
    grads_of = dict(init)
    dtype_of = {id(t._edge()): t.dtype for t in tensors}
    with grad_mode(False):
        for node in _topo(roots):
            g = grads_of.pop(id(node), None)
            if g is None:
                continue
            dt = dtype_of.get(id(node))
            for hook in list(node.hooks):
                out = hook(Tensor(g, dt))
                if out is not None:
                    g = _store(out._data, dt)
            if node.retained is not None:
                t = node.retained()
                if t is not None and t.grad_fn is node:
                    prev = t._grad
                    t._grad = Tensor(g.copy() if prev is None
                                     else _accumulate(prev._data, g, dt), dt)
            if targets is not None and id(node) in targets:
                captured[targets[id(node)]] = Tensor(g.copy(), dt)
                if isinstance(node, AccumulateGrad):
                    continue
            if isinstance(node, AccumulateGrad):
                if capture is None and (only is None or id(node) in only):
                    var = node.variable()
                    if var is not None:
                        _accumulate_into_leaf(var, g)
                continue
            _check_saved(node)
            parts = node.back(g)
            if not retain and node.saved:
                node.freed = True
            for edge, pg in zip(node.inputs, parts):
                if edge is None or pg is None:
                    continue
                nxt, pdt, pshape = edge
                if not (node.stored and _TRUST_STORED):
                    pg = _store(pg, pdt)
                if pg.shape != pshape:
                    pg = _sum_to(np.broadcast_to(pg, np.broadcast_shapes(pg.shape, pshape)),
                                 pshape, pdt)
                grads_of[id(nxt)] = _accumulate(grads_of.get(id(nxt)), pg, pdt)
                dtype_of[id(nxt)] = pdt
    return captured


def _accumulate_into_leaf(var, g):
    """AccumulateGrad: a new ``.grad`` holds a copy; later ones add into it in
    place (so references to ``p.grad`` see the sum, as in torch)."""
    if var._grad is None:
        var._grad = Tensor(np.array(g, np_dtype(var.dtype), copy=True), var.dtype)
    else:
        var._grad._a = _accumulate(var._grad._data, g, var._grad.dtype)


def _result(array, dtype, parents, backward, saved=(), view_of=None, op=None, stored=False):
    """The output tensor of an op; a graph node if any parent needs a grad.

    ``saved``: the tensors ``backward`` reads (their versions are checked
    when it runs; the string "out" stands for the output). ``view_of``: the
    output is a view of that tensor's storage (shares its version counter).
    ``stored``: every gradient ``backward`` returns is already a value of its
    parent's dtype (:class:`Node`): pass it only where ``backward`` rounds
    each part to that dtype itself or moves the values of its ``g`` without
    arithmetic (views, transposes, basic indexing).
    """
    if view_of is not None:
        t = Tensor(array, dtype, _vc=view_of._vc,
                   _base=view_of._base if view_of._base is not None else view_of)
    else:
        array = array if isinstance(array, np.ndarray) else np.asarray(array)
        owns = array.base is None
        for p in parents:
            # two arrays that each own their memory overlap only if they are
            # one (the test below is cheap; may_share_memory costs a microsecond)
            if isinstance(p, Tensor) and (array is p._data if owns and p._data.base is None
                                          else np.may_share_memory(array, p._data)):
                array = array.copy()
                break
        t = Tensor(array, dtype)
    if State.grad_enabled:
        inputs, any_grad = [], False
        for p in parents:
            if isinstance(p, Tensor) and p.requires_grad:
                inputs.append((p._edge(), p.dtype, tuple(p.shape)))
                any_grad = True
            else:
                inputs.append(None)
        if any_grad:
            name = op or getattr(backward, "__qualname__", "Op").split(".")[0]
            sv = tuple((t if s == "out" else s, (t if s == "out" else s)._vc[0])
                       for s in saved if s is not None)
            t.grad_fn = Node(_node_name(name), backward, tuple(inputs), sv, stored)
    return t


# ------------------------------------------------------------------------ casts
def to_dtype(x, dtype):
    """Cast (RNE, the target's overflow rule); the backward casts back."""
    dtype = as_dtype(dtype, "to()")
    if dtype == x.dtype:
        return x
    if is_float(dtype):
        with np.errstate(over="ignore", invalid="ignore"):
            out = _store(x._data, dtype)
    else:
        if is_float(x.dtype) and not np.all(np.isfinite(x._data)):
            raise FpemuRuntimeError(f"to({dtype}): the tensor holds inf or NaN, which have no "
                                    f"integer value")
        if dtype is bool_:
            out = x._data != 0
        elif is_float(x.dtype):
            out = np.trunc(x._data).astype(dtype.np_dtype)
        else:
            out = x._data.astype(dtype.np_dtype)
        return Tensor(out, dtype)

    def backward(g):
        return (g,)
    return _result(out, dtype, (x,), backward, op="to_copy")


# ------------------------------------------------------------------ factories
def from_torch(t):
    """A real torch tensor as an fpemu tensor of the same dtype, exactly (its
    bits decoded where numpy has no such dtype)."""
    name = str(t.dtype).replace("torch.", "")
    arr = checks.from_torch(t, "from_torch")
    return tensor(arr, dtype=as_dtype(name), requires_grad=False)


def tensor(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A tensor from nested lists, numbers, numpy arrays or a Tensor (always a
    copy).

    Python floats are doubles: as in PyTorch, they reach a 16-bit or 8-bit
    dtype through float32 (two roundings, ``docs/pytorch-numerics.md``).
    Without ``dtype``: float32 for floats, int64 for integers, bool for bools.
    """
    if device is not None:
        check_device(device, "tensor()")
    if isinstance(data, Tensor):
        src = data
        arr = data._data
        if dtype is None:
            dtype = src.dtype
    elif isinstance(data, (list, tuple)) and any(isinstance(d, Tensor)
                                                 for d in checks.flatten(data)):
        arr = np.asarray([_item_of(d) for d in data]) if all(
            not isinstance(d, (list, tuple)) for d in data) else np.asarray(
            _to_nested(data))
    else:
        arr = np.asarray(data)
    if arr.dtype.kind in "OUSVcmM":
        raise FpemuTypeError(f"tensor(): expected numbers, got an array of dtype {arr.dtype}")
    if dtype is None:
        dtype = {"b": bool_, "i": int64, "u": _unsigned(arr.dtype)}.get(arr.dtype.kind,
                                                                        float32)
        if arr.dtype == np.float64 and isinstance(data, np.ndarray):
            dtype = float64
    dtype = as_dtype(dtype, "tensor()")
    t = Tensor(_values_as(arr, dtype), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _unsigned(npdt):
    return uint8 if npdt == np.uint8 else int64


def _item_of(d):
    return d._data if isinstance(d, Tensor) else d


def _to_nested(data):
    return [_to_nested(d) if isinstance(d, (list, tuple)) else _item_of(d) for d in data]


def _values_as(arr, dtype):
    """A fresh array of ``arr``'s values in ``dtype``'s storage (floats reach a
    small format through float32, as torch's casts)."""
    if is_float(dtype):
        if dtype is float64:
            return np.array(arr, np.float64, copy=True)
        with np.errstate(over="ignore"):
            out = _store(np.asarray(arr).astype(np.float32), dtype)
        return np.array(out, copy=True)
    if np.asarray(arr).dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise FpemuValueError("tensor(): can't make an integer tensor from inf or NaN")
    return np.array(np.asarray(arr).astype(dtype.np_dtype), copy=True)
