"""Tensors and their storage, dtypes, type promotion, the rounding to a
storage dtype, and the backward pass.

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

The graph is made of :class:`Node` objects, as autograd's ``grad_fn``: an
op's output points at its node, the node at the nodes of the inputs (a leaf
that requires grad has an ``AccumulateGrad`` node). An in-place op gives the
tensor a new node and leaves the old one to the ops that read the old value.
"""

from __future__ import annotations

import functools
import re
import weakref

import numpy as np

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


# ------------------------------------------------------------------ grad modes
def manual_seed(seed):
    """Seed the default generator, as ``torch.manual_seed``: the integers,
    uniforms and permutations that follow are torch's CPU ones (``_rng``)."""
    return State.generator.manual_seed(seed)


def initial_seed():
    return State.generator.initial_seed()


def seed():
    return State.generator.seed()


def get_rng_state():
    return State.generator.get_state()


def set_rng_state(state):
    State.generator.set_state(state)


def is_grad_enabled() -> bool:
    return State.grad_enabled


def is_inference_mode_enabled() -> bool:
    return State.inference


class _GradModeBase:
    """A context manager that is also a decorator (``@no_grad()``)."""

    _flag = False

    def __init__(self, mode=True):
        self._mode = mode

    def __enter__(self):
        self._old = (State.grad_enabled, State.inference)
        State.grad_enabled = self._flag

    def __exit__(self, *exc):
        State.grad_enabled, State.inference = self._old
        return False

    def __call__(self, fn):

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with type(self)(self._mode):
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradModeBase):
    """Ops inside record no graph (a context manager and a decorator)."""


class enable_grad(_GradModeBase):
    _flag = True


class set_grad_enabled(_GradModeBase):
    """``set_grad_enabled(False)``: as a call it switches for good, as a
    context manager for the region."""

    def __init__(self, mode):
        super().__init__(mode)
        self._flag = bool(mode)
        self._old = (State.grad_enabled, State.inference)
        State.grad_enabled = bool(mode)

    def __enter__(self):
        pass


class inference_mode(_GradModeBase):
    """``inference_mode()`` is ``no_grad()`` here (fpemu keeps no version
    counters apart); ``inference_mode(False)`` changes nothing."""

    def __enter__(self):
        self._old = (State.grad_enabled, State.inference)
        if self._mode:
            State.grad_enabled, State.inference = False, True


# ---------------------------------------------------------------------- devices
class device:
    """``torch.device``: fpemu computes every tensor as the active profile's
    device does; a device object records what the program asked for."""

    def __init__(self, type, index=None):  # noqa: A002 - torch's name
        if isinstance(type, device):
            type, index = type.type, type.index
        if isinstance(type, int) and not isinstance(type, bool):
            type, index = "cuda", type
        if not isinstance(type, str):
            raise FpemuTypeError(f"device(): expected a string such as 'cuda' or 'cpu', got "
                                 f"{type!r}")
        if ":" in type:
            type, _, idx = type.partition(":")
            index = int(idx)
        if type not in ("cuda", "cpu", "meta", "mps", "xpu"):
            raise FpemuTypeError(f"Expected one of cpu, cuda, mps, xpu, meta device type at "
                                 f"start of device string: {type}")
        self.type, self.index = type, index

    def __repr__(self):
        idx = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{idx})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return (isinstance(other, device)
                and (self.type, self.index) == (other.type, other.index))

    def __hash__(self):
        return hash((self.type, self.index))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_device(dev, what="to()"):
    """``dev`` as a :class:`device`, refused as torch refuses it on a machine
    with one CUDA device and no MPS or XPU (fpemu emulates exactly that):
    ``mps`` and ``xpu`` are not there, ``cuda:1`` is an invalid ordinal, and
    ``meta`` tensors (shapes without values) are not emulated."""
    d = dev if isinstance(dev, device) else device(dev)
    if d.type == "mps":
        raise FpemuRuntimeError(f"{what}: PyTorch is not linked with support for mps devices "
                                f"(fpemu emulates one CUDA device; use 'cuda' or 'cpu')")
    if d.type == "xpu":
        raise FpemuRuntimeError(f"{what}: Torch not compiled with XPU enabled (fpemu emulates "
                                f"one CUDA device; use 'cuda' or 'cpu')")
    if d.type == "meta":
        raise FpemuNotImplementedError(
            f"{what}: meta tensors (shapes without values) are not emulated; fpemu computes "
            f"every value. Build the model on 'cuda' or 'cpu'.")
    if d.type == "cuda" and d.index not in (None, 0):
        raise FpemuRuntimeError(f"{what}: CUDA error: invalid device ordinal (fpemu emulates "
                                f"one device, cuda:0; got {d})")
    return d


def current_device():
    prof = get_profile()
    return device("cuda", 0) if prof.device == "cuda" else device("cpu")


# --------------------------------------------------------------------- the graph
_SAVED_FREED = ("Trying to backward through the graph a second time (or directly access "
                "saved tensors after they have already been freed). Saved intermediate values "
                "of the graph are freed when you call .backward() or autograd.grad(). Specify "
                "retain_graph=True if you need to backward through the graph a second time or "
                "if you need to access saved tensors after calling backward.")


class Node:
    """A step of the backward graph (``tensor.grad_fn``).

    ``back(g)`` returns one gradient (or None) per input; ``inputs`` holds,
    per input, ``(node, dtype, shape)`` or None for an input that needs no
    gradient. ``saved`` lists ``(tensor, version)`` pairs that ``back`` reads.
    ``stored``: ``back`` returns values of each input's dtype already (it
    rounds them itself, or only moves the values of ``g``), so the backward
    pass does not round them again.
    """

    __slots__ = ("back", "inputs", "saved", "freed", "hooks", "retained", "op", "stored",
                 "__weakref__")

    def __init__(self, op, back, inputs, saved=(), stored=False):
        self.op, self.back, self.inputs = op, back, inputs
        self.saved = saved
        self.stored = stored
        self.freed = False
        self.hooks = []
        self.retained = None

    def name(self):
        # a custom autograd.Function's node is named as torch names it ("MyReLUBackward");
        # an op of another overload carries its number ("SumBackward1")
        if self.op.endswith("Backward") or _NUMBERED.search(self.op):
            return self.op
        return f"{self.op}Backward0"

    @property
    def next_functions(self):
        return tuple((i[0] if i else None, 0) for i in self.inputs)

    def register_hook(self, hook):
        self.hooks.append(hook)
        return _Handle(self.hooks, hook)

    def __repr__(self):
        return f"<{self.name()} object>"


class AccumulateGrad(Node):
    """The node of a leaf that requires grad: adds the gradient into ``.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__("AccumulateGrad", None, ())
        self.variable = weakref.ref(variable)

    def name(self):
        return "AccumulateGrad"


def _shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_saved(node):
    if node.freed:
        raise FpemuRuntimeError(_SAVED_FREED)
    for t, version in node.saved:
        if t._vc[0] != version:
            raise FpemuRuntimeError(
                f"one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: [{t.dtype} {_shape_str(t.shape)}], which is an input "
                f"of {node.name()}, is at version {t._vc[0]}; expected version {version} "
                f"instead. Hint: the in-place operation changed a value this backward needs; "
                f"use the out-of-place form (x = x + y rather than x += y), or .clone() first.")


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
        return self._data.shape[_wrap(dim, self._data.ndim)]

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


def _wrap(dim, ndim):
    n = max(ndim, 1)
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise FpemuTypeError(f"dim must be an int, got {type(dim).__name__} ({dim!r})")
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return int(dim) % n


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


class _Handle:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


# ------------------------------------------------------------------ the engine
def _topo(roots):
    """Nodes reachable from ``roots``, each after every node that feeds it a
    gradient (reverse topological order of the forward)."""
    order, seen, stack = [], set(), [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for edge in node.inputs:
            if edge is not None and id(edge[0]) not in seen:
                stack.append((edge[0], False))
    order.reverse()
    return order


def _accumulate(old, new, dtype):
    if old is None:
        return new
    dt = opmath(dtype)
    return _store(old.astype(dt, copy=False) + new.astype(dt, copy=False), dtype)


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


def _named(t, name):
    """``t`` with its graph node named ``name`` as torch names it ("T",
    "SqueezeBackward1"): ops that fpemu composes of others, or that torch
    counts as another overload of one function, print torch's grad_fn."""
    node = t.grad_fn
    if node is not None and not isinstance(node, AccumulateGrad):
        node.op = name
    return t


_NUMBERED = re.compile(r"Backward\d+$")


@functools.lru_cache(maxsize=None)
def _node_name(name):
    return "".join(part[:1].upper() + part[1:] for part in name.strip("_").split("_"))


def _sum_to(g, shape, dtype):
    """Sum a gradient over broadcast axes, one reduction as ATen's ``sum_to``
    (ExpandUtils.h): the gradient's values in ``dtype`` added in float32
    (float64 for float64) in the order of ATen's reduction kernel, under the
    CUDA profile its CUDA kernel's (``fpemu.autograd._cuda_reduce``), under
    the CPU profile ``cascade_sum``'s (``fpemu.autograd._cpu_reduce``, which
    also rounds a 16-bit sum as torch's kernel does); other formats in
    float64, rounded once."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    if get_profile().device == "cuda" and g.size and is_float(dtype):
        from ._cuda_reduce import cuda_sum
        vals = np.asarray(g, np.float64) if dtype is float64 else (
            g if g.dtype == np.float32 and dtype.name == "fp32" else _store(g, dtype))
        return cuda_sum(vals, axes, True, dtype).reshape(shape)
    if g.size and dtype in (float32, float64, bfloat16, float16):
        from ._cpu_reduce import cpu_sum
        prof = get_profile()
        vals = np.asarray(g, np.float64) if dtype is float64 else (
            g if g.dtype == np.float32 and dtype is float32 else _store(g, dtype))
        half = "bfloat16" if dtype is bfloat16 else "float16" if dtype is float16 else None
        return cpu_sum(vals, axes, True, threads=prof.cpu_threads,
                       capability=prof.cpu_capability, dtype=half).reshape(shape)
    s = g.astype(np.float64).sum(axis=axes, keepdims=True)
    return _store(s.reshape(shape), dtype)


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
    from ..checks import from_torch     # (local: this function has the same name)
    name = str(t.dtype).replace("torch.", "")
    arr = from_torch(t, "from_torch")
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
    elif isinstance(data, (list, tuple)) and any(isinstance(d, Tensor) for d in _flat(data)):
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


def _flat(data):
    for d in data:
        if isinstance(d, (list, tuple)):
            yield from _flat(d)
        else:
            yield d


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


class memory_format:
    """``torch.memory_format``: how torch lays a tensor out in memory. fpemu's
    values do not depend on it: the formats are accepted and checked
    (channels_last needs 4 dims, channels_last_3d 5), not stored."""

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"torch.{self._name}"

    def __reduce__(self):
        return (_memory_format_named, (self._name,))


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")
_MEMORY_FORMATS = {m._name: m for m in (contiguous_format, channels_last, channels_last_3d,
                                        preserve_format)}


def _memory_format_named(name):
    return _MEMORY_FORMATS[name]


def check_memory_format(x, fmt, what):
    """torch's checks of a ``memory_format=`` argument for tensor ``x``."""
    if fmt is None:
        return
    if not isinstance(fmt, memory_format):
        raise TypeError(f"{what}: argument 'memory_format' must be torch.memory_format, not "
                        f"{type(fmt).__name__}")
    rank = {"channels_last": 4, "channels_last_3d": 5}.get(fmt._name)
    if rank is not None and x.ndim != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {fmt._name} format")
