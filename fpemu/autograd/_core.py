"""Tensors, dtypes, type promotion, the rounding to a storage dtype, and the
backward pass.

A tensor holds a numpy array of its values: float32 for every fpemu
:class:`~fpemu.Format` (each of them fits float32 exactly), float64 for
``float64``, and int64 / int32 / bool for the integer dtypes. Ops compute in
"opmath" (float32 for every Format, float64 for float64), as CUDA's kernels
do, and :func:`_store` rounds the opmath result once to the output dtype.

The backward pass is micrograd's: a topological order of the graph, each op's
backward closure called once with the gradient of its output, gradients of a
tensor used twice summed in that tensor's dtype (as autograd does).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ..formats import Format, format as _lookup
from ..formats import bf16, e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, fp16, fp32
from ..quantize import quantize
from ._profile import get_profile


# ---------------------------------------------------------------------- dtypes
@dataclasses.dataclass(frozen=True)
class DType:
    """A dtype that is not an fpemu Format: float64 and the integer types."""

    name: str
    np_dtype: str
    is_floating_point: bool

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


float64 = DType("float64", "float64", True)
int64 = DType("int64", "int64", False)
int32 = DType("int32", "int32", False)
bool_ = DType("bool", "bool", False)

float32 = fp32
float16 = fp16
bfloat16 = bf16
float8_e4m3fn = e4m3fn
float8_e5m2 = e5m2
float8_e4m3fnuz = e4m3fnuz
float8_e5m2fnuz = e5m2fnuz

_FP8 = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3", "e3m4", "e2m3", "e3m2", "e2m1",
        "e8m0")
_BY_NAME = {"float64": float64, "double": float64, "int64": int64, "long": int64,
            "int32": int32, "int": int32, "bool": bool_}


def as_dtype(dtype, what="dtype"):
    """A dtype from a dtype object, a Format, or a name (``"bfloat16"``)."""
    if isinstance(dtype, (Format, DType)):
        return dtype
    if isinstance(dtype, str):
        if dtype in _BY_NAME:
            return _BY_NAME[dtype]
        try:
            return _lookup(dtype)
        except ValueError as err:
            raise ValueError(f"{what}: unknown dtype {dtype!r}; pass one of "
                             f"fpemu.autograd.float32, bfloat16, float16, float8_e4m3fn, "
                             f"float8_e5m2, float64, int64, ... ({err})") from None
    if dtype is float:
        return float64
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:                               # numpy and ml_dtypes dtypes: np.float16, "<f4", ...
        npdt = np.dtype(dtype)
    except TypeError:
        npdt = None
    if npdt is not None:
        name = {"float16": "fp16", "float32": "fp32"}.get(npdt.name, npdt.name)
        if name in _BY_NAME:
            return _BY_NAME[name]
        try:
            return _lookup(name)
        except ValueError:
            pass
    raise TypeError(f"{what}: expected a dtype (fpemu.autograd.float32, bfloat16, ... or a "
                    f"fpemu Format), got {dtype!r}")


def is_float(dtype) -> bool:
    return isinstance(dtype, Format) or dtype is float64


def np_dtype(dtype):
    """The numpy dtype a tensor of ``dtype`` stores its values in."""
    if isinstance(dtype, Format):
        return np.float32
    return np.dtype(dtype.np_dtype)


def opmath(dtype):
    """The numpy dtype ops compute in: float64 for float64, else float32."""
    return np.float64 if dtype is float64 else np.float32


def _store(x, dtype):
    """Round an opmath result once to ``dtype`` (float64 -> float32 -> format,
    as c10's casts do: float64 results reach a 16-bit type through float32)."""
    if dtype is float64:
        return np.asarray(x, np.float64)
    if not isinstance(dtype, Format):
        return np.asarray(x).astype(dtype.np_dtype)
    x32 = np.asarray(x, np.float32)
    if dtype is fp32 or dtype.name == "fp32":
        return x32
    if dtype.name == "e4m3fn":        # version-dependent (numerics-pytorch.md §1.1)
        return quantize(x32, dtype, overflow=get_profile().e4m3_overflow)
    return quantize(x32, dtype)


def _category(dtype) -> int:
    return 2 if is_float(dtype) else (0 if dtype is bool_ else 1)


def _widest_float(dtypes):
    ds = list(dict.fromkeys(dtypes))
    if len(ds) == 1:
        return ds[0]
    if float64 in ds:
        return float64
    eight = [d for d in ds if isinstance(d, Format) and d.bits <= 8]
    if eight:
        raise TypeError(f"type promotion between {', '.join(map(str, ds))} is not defined "
                        f"(PyTorch has none for float8 types); cast with .to(dtype) first")
    return fp32


def _widest_int(dtypes):
    ds = set(dtypes)
    if int64 in ds:
        return int64
    if int32 in ds:
        return int32
    return bool_


def result_type(*operands):
    """PyTorch's type promotion: tensors with dimensions first, then 0-dim
    tensors, then Python numbers; a lower group only counts if it is of a
    higher category (bool < integer < floating)."""
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


# ------------------------------------------------------------------- the state
class _State:
    grad_enabled = True
    rng = np.random.default_rng(0)


def manual_seed(seed):
    """Seed fpemu's generator (numpy PCG64; its numbers are not torch's)."""
    _State.rng = np.random.default_rng(int(seed))
    return _State.rng


def is_grad_enabled() -> bool:
    return _State.grad_enabled


@contextlib.contextmanager
def _grad_mode(flag):
    old = _State.grad_enabled
    _State.grad_enabled = flag
    try:
        yield
    finally:
        _State.grad_enabled = old


class no_grad(contextlib.ContextDecorator):
    """Ops inside record no graph (a context manager and a decorator)."""

    def __enter__(self):
        self._old = _State.grad_enabled
        _State.grad_enabled = False

    def __exit__(self, *exc):
        _State.grad_enabled = self._old
        return False


class enable_grad(no_grad):
    def __enter__(self):
        self._old = _State.grad_enabled
        _State.grad_enabled = True


# --------------------------------------------------------------------- Tensor
class Tensor:
    """An array of values of one dtype, with a gradient and a graph.

    Build one with :func:`tensor`; ops are methods and functions of
    :mod:`fpemu.autograd`.
    """

    __array_priority__ = 1000
    __hash__ = object.__hash__

    def __init__(self, array, dtype, requires_grad=False):
        self._a = array
        self.dtype = dtype
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._back = None
        self._parents = ()
        self._hooks = []
        self._retain = False
        self._name = None

    # -- basic facts
    @property
    def shape(self):
        return self._a.shape

    def size(self, dim=None):
        return self._a.shape if dim is None else self._a.shape[dim]

    @property
    def ndim(self):
        return self._a.ndim

    def dim(self):
        return self._a.ndim

    def numel(self):
        return int(self._a.size)

    def __len__(self):
        return self._a.shape[0]

    @property
    def is_leaf(self):
        return self._back is None

    def is_floating_point(self):
        return is_float(self.dtype)

    @property
    def device(self):
        return "cuda (emulated)"

    @property
    def data(self):
        """A tensor sharing these values, outside the graph."""
        return Tensor(self._a, self.dtype)

    @data.setter
    def data(self, other):
        if not isinstance(other, Tensor):
            raise TypeError(f".data = expects a Tensor, got {type(other).__name__}")
        self._a, self.dtype = other._a, other.dtype

    def numpy(self):
        if self.requires_grad and _State.grad_enabled:
            raise RuntimeError("Can't call numpy() on a Tensor that requires grad; use "
                               "tensor.detach().numpy()")
        return self._a

    def item(self):
        if self._a.size != 1:
            raise ValueError(f"item(): only a one-element tensor converts to a Python number; "
                             f"this one has shape {self.shape}")
        return self._a.reshape(-1)[0].item()

    def tolist(self):
        return self._a.tolist()

    def detach(self):
        return Tensor(self._a, self.dtype)

    def requires_grad_(self, flag=True):
        if flag and not is_float(self.dtype):
            raise RuntimeError(f"only floating-point tensors can require gradients; this one is "
                               f"{self.dtype}")
        self.requires_grad = bool(flag)
        return self

    def retain_grad(self):
        """Keep ``.grad`` on a non-leaf tensor after backward()."""
        self._retain = True

    def register_hook(self, hook):
        """``hook(grad) -> Tensor or None``, called when this tensor's gradient
        is complete; returning a tensor replaces the gradient."""
        self._hooks.append(hook)
        return _Handle(self._hooks, hook)

    def cpu(self):
        return self

    def cuda(self, *args, **kwargs):
        return self

    def __repr__(self) -> str:
        body = np.array2string(self._a, separator=", ", precision=8)
        extra = ""
        if self.dtype not in (float32, int64):
            extra = f", dtype={self.dtype}"
        if self._back is not None:
            extra += f", grad_fn=<{self._back.__qualname__.split('.')[0]}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    # -- graph
    def backward(self, gradient=None, retain_graph=None):
        """Accumulate d(self)/d(leaf) into the ``.grad`` of every leaf."""
        if not self.requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have "
                               "a grad_fn; call .requires_grad_() on an input first")
        if gradient is None:
            if self._a.size != 1:
                raise RuntimeError(f"grad can be implicitly created only for one-element "
                                   f"outputs; this one has shape {self.shape}: pass gradient=")
            g = np.ones(self.shape, np_dtype(self.dtype))
        else:
            g = _store(gradient._a if isinstance(gradient, Tensor) else gradient, self.dtype)
            if g.shape != self.shape:
                raise RuntimeError(f"gradient has shape {g.shape}, the tensor {self.shape}")
        _run_backward(self, g)


class _Handle:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def _topo(root):
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for p in node._parents:
            if isinstance(p, Tensor) and p.requires_grad and id(p) not in seen:
                stack.append((p, False))
    return order


def _accumulate(old, new, dtype):
    if old is None:
        return new
    dt = opmath(dtype)
    return _store(old.astype(dt) + new.astype(dt), dtype)


def _run_backward(root, grad):
    grads = {id(root): grad}
    with _grad_mode(False):
        for node in reversed(_topo(root)):
            g = grads.pop(id(node), None)
            if g is None:
                continue
            for hook in list(node._hooks):
                out = hook(Tensor(g, node.dtype))
                if out is not None:
                    g = _store(out._a, node.dtype)
            if node._back is None or node._retain:
                prev = None if node.grad is None else node.grad._a
                node.grad = Tensor(_accumulate(prev, g, node.dtype).copy()
                                   if prev is not None else g.copy(), node.dtype)
            if node._back is None:
                continue
            for p, pg in zip(node._parents, node._back(g)):
                if pg is None or not isinstance(p, Tensor) or not p.requires_grad:
                    continue
                pg = _store(pg, p.dtype)
                if pg.shape != p.shape:
                    pg = np.broadcast_to(pg, p.shape).copy()
                grads[id(p)] = _accumulate(grads.get(id(p)), pg, p.dtype)


def _result(array, dtype, parents, backward):
    """The output tensor of an op; a graph node if any parent needs a grad."""
    t = Tensor(array, dtype)
    if _State.grad_enabled and any(isinstance(p, Tensor) and p.requires_grad
                                   for p in parents):
        t.requires_grad = True
        t._parents = tuple(parents)
        t._back = backward
    return t


def _sum_to(g, shape, dtype):
    """Sum a gradient over broadcast axes (fp32 accumulation, one rounding)."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    s = g.astype(np.float64).sum(axis=axes, keepdims=True)
    s = s.reshape(g.shape[lead:] if lead else s.shape)
    return _store(s.reshape(shape), dtype)


# ------------------------------------------------------------------ factories
def tensor(data, dtype=None, requires_grad=False, device=None):
    """A tensor from nested lists, numbers, numpy arrays or a Tensor.

    Python floats are doubles: as in PyTorch, they reach a 16-bit or 8-bit
    dtype through float32 (two roundings, ``numerics-pytorch.md`` §1.3).
    Without ``dtype``: float32 for floats, int64 for integers, bool for bools.
    """
    if isinstance(data, Tensor):
        data = data._a
    arr = np.asarray(data)
    if arr.dtype.kind in "OUSVcmM":
        raise TypeError(f"tensor(): expected numbers, got an array of dtype {arr.dtype}")
    if dtype is None:
        dtype = {"b": bool_, "i": int64, "u": int64}.get(arr.dtype.kind, float32)
        if arr.dtype == np.float64 and isinstance(data, np.ndarray):
            dtype = float64
    dtype = as_dtype(dtype, "tensor()")
    if is_float(dtype):
        if dtype is float64:
            values = arr.astype(np.float64)
        else:
            with np.errstate(over="ignore"):
                values = _store(arr.astype(np.float32), dtype)
    else:
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValueError("tensor(): can't make an integer tensor from inf or NaN")
        values = arr.astype(dtype.np_dtype)
    t = Tensor(np.array(values, copy=True), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(int(s) for s in size)


def full(size, fill_value, dtype=None, requires_grad=False, device=None):
    size = size if isinstance(size, (tuple, list)) else (size,)
    dtype = result_type(fill_value) if dtype is None else dtype
    return tensor(np.full(tuple(size), fill_value), dtype, requires_grad)


def zeros(*size, dtype=None, requires_grad=False, device=None):
    return tensor(np.zeros(_shape(size)), dtype or float32, requires_grad)


def ones(*size, dtype=None, requires_grad=False, device=None):
    return tensor(np.ones(_shape(size)), dtype or float32, requires_grad)


def zeros_like(t, dtype=None, requires_grad=False):
    return zeros(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def ones_like(t, dtype=None, requires_grad=False):
    return ones(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def randn(*size, dtype=None, requires_grad=False, device=None, generator=None):
    """Standard normal values from fpemu's generator (see :func:`manual_seed`),
    drawn in float32 and rounded to ``dtype``."""
    rng = generator or _State.rng
    return tensor(rng.standard_normal(_shape(size), np.float32), dtype or float32,
                  requires_grad)


def rand(*size, dtype=None, requires_grad=False, device=None, generator=None):
    rng = generator or _State.rng
    return tensor(rng.random(_shape(size), np.float32), dtype or float32, requires_grad)


def randint(low, high=None, size=(), dtype=None, device=None, generator=None):
    if high is None:
        low, high = 0, low
    rng = generator or _State.rng
    return tensor(rng.integers(low, high, size=tuple(size)), dtype or int64)


def arange(start, end=None, step=1, dtype=None, requires_grad=False, device=None):
    if end is None:
        start, end = 0, start
    values = np.arange(start, end, step)
    if dtype is None:
        dtype = float32 if values.dtype.kind == "f" else int64
    return tensor(values, dtype, requires_grad)
