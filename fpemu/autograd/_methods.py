"""Tensor methods and operators, bound to the ops of ``ops/`` and
``nn/functional.py``. In-place methods (``add_``, ``x += y``, ``x[i] = v``,
...) write into the tensor's storage (``ops/inplace.py``)."""

from __future__ import annotations

import warnings

import numpy as np

from ..formats import Format
from . import ops as O  # noqa: E741
from ._common import ONE_ELEMENT_ONLY
from ._core import (
    as_dtype, bfloat16, bool_, check_device, check_memory_format, device as _device, DType,
    float16, float32, float64, int16, int32, int64, int8, is_float, Tensor, tensor, to_dtype,
    uint8,
)
from ._state import State
from .nn import functional as F
from .ops import inplace as I  # noqa: E741
from .ops import shape as S
from ._missing import missing
from .ops.creation import _check_std


def _to(self, *args, **kwargs):
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(tensor)``,
    with ``non_blocking`` and ``copy``; devices are accepted (fpemu computes
    as the active profile's device)."""
    dtype = kwargs.pop("dtype", None)
    dev = kwargs.pop("device", None)
    if dev is not None:
        check_device(dev, "to()")
    kwargs.pop("non_blocking", None)
    copy = kwargs.pop("copy", False)
    check_memory_format(self, kwargs.pop("memory_format", None), "to()")
    if kwargs:
        raise TypeError(f"to() received an invalid combination of arguments: "
                        f"{sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (Format, DType)):
            dtype = a
        elif isinstance(a, (str, _device)):
            check_device(a, "to()")
        elif isinstance(a, bool) or a is None:
            continue
        else:
            raise TypeError(f"to(): expected a dtype, a device or a tensor, got {a!r}")
    if dtype is None or as_dtype(dtype, "to()") == self.dtype:
        return O.clone(self) if copy else self
    return to_dtype(self, as_dtype(dtype, "to()"))


def _convert(dtype):
    """``x.float()``, ``x.half()``, ...: ``x.to(dtype)``, with torch's
    ``memory_format`` argument."""
    def method(self, memory_format=None):
        return _to(self, dtype, memory_format=memory_format)
    method.__name__ = {"fp32": "float", "fp16": "half", "bf16": "bfloat16", "float64": "double",
                       "int64": "long", "int32": "int", "int16": "short", "int8": "char",
                       "uint8": "byte", "bool": "bool"}.get(dtype.name, dtype.name)
    return method


def _type(self, dtype=None, non_blocking=False):
    if dtype is None:
        names = {"fp32": "Float", "float64": "Double", "fp16": "Half", "bf16": "BFloat16",
                 "int64": "Long", "int32": "Int", "bool": "Bool", "uint8": "Byte",
                 "int8": "Char", "int16": "Short"}
        return f"torch.{names.get(self.dtype.name, self.dtype.name)}Tensor"
    if isinstance(getattr(dtype, "dtype", None), (DType, Format)) and not isinstance(
            dtype, Tensor):
        dtype = dtype.dtype                 # x.type(torch.LongTensor): a legacy type class
    if isinstance(dtype, str):
        table = {"torch.FloatTensor": float32, "torch.DoubleTensor": float64,
                 "torch.HalfTensor": float16, "torch.BFloat16Tensor": bfloat16,
                 "torch.LongTensor": int64, "torch.IntTensor": int32,
                 "torch.cuda.FloatTensor": float32, "torch.cuda.LongTensor": int64}
        dtype = table.get(dtype, dtype)
    return _to(self, dtype)


def _inplace(op):
    def method(self, *args, **kwargs):
        return I.apply_inplace(self, op, *args, **kwargs)
    method.__name__ = op.__name__ + "_"
    method.__wrapped__ = op                 # the op it runs (tests/op_registry.py reads it)
    return method


def _new(factory):
    def method(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
        return factory(*size, dtype=self.dtype if dtype is None else dtype,
                       requires_grad=requires_grad)
    method.__wrapped__ = factory
    return method


def _new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
    return O.full(size, fill_value, dtype=self.dtype if dtype is None else dtype,
                  requires_grad=requires_grad)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    return tensor(data, dtype=self.dtype if dtype is None else dtype,
                  requires_grad=requires_grad)


def _uniform_(self, a=0.0, b=1.0, generator=None):
    """Uniform in [a, b) from the generator, torch's CPU numbers for float32."""
    gen = State.generator if generator is None else generator
    vals = gen.uniform(self.numel(), a, b, double=self.dtype is float64)
    with _no_grad():
        return I.write(self, vals.reshape(self.shape))


def _normal_(self, mean=0.0, std=1.0, generator=None):
    _check_std(std)
    gen = State.generator if generator is None else generator
    vals = gen.normal(self.numel(), mean, std, fill32=self.dtype is float32,
                      fill64=self.dtype is float64)
    with _no_grad():
        return I.write(self, vals.reshape(self.shape))


def _random_(self, low=0, high=None, generator=None):
    gen = State.generator if generator is None else generator
    if high is None:
        low, high = 0, low if low else 2 ** 24 + 1
    return I.write(self, gen.randint(low, high, self.numel()).reshape(self.shape))


def _bernoulli_(self, p=0.5, generator=None):
    gen = State.generator if generator is None else generator
    return I.write(self, (gen.uniform(self.numel()) < p).reshape(self.shape).astype(
        np.float64))


def _exponential_(self, lambd=1.0, generator=None):
    gen = State.generator if generator is None else generator
    u = gen.uniform(self.numel(), double=True)
    return I.write(self, (-np.log1p(-u) / lambd).reshape(self.shape))


class _no_grad:
    def __enter__(self):
        self._old = State.grad_enabled
        State.grad_enabled = False

    def __exit__(self, *exc):
        State.grad_enabled = self._old


def _bool(self):
    if self._data.size != 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(self._data.reshape(-1)[0])


def _element(self):
    """The one element of ``self``, for ``float(t)`` and ``int(t)``."""
    if self._data.size != 1:
        raise TypeError(ONE_ELEMENT_ONLY)
    return self._data.reshape(-1)[0]


def _float(self):
    return float(_element(self))


def _int(self):
    return int(_element(self))


def _index(self):
    if is_float(self.dtype) or self._data.size != 1:
        raise TypeError("only integer tensors of a single element can be converted to an "
                        "index")
    return int(self._data.reshape(-1)[0])


def _format(self, spec):
    if self._data.ndim == 0:
        return format(self.item(), spec)
    if spec:
        raise TypeError("unsupported format string passed to Tensor.__format__")
    return repr(self)


# -- the reflected operators (``2 + t`` calls ``t.__radd__(2)``), as torch defines them:
# __radd__, __rmul__, __rand__, __ror__, __rxor__ are C methods of torch._C.TensorBase (they
# refuse a self that is not a tensor, and a TypeError inside turns into NotImplemented);
# __rsub__, __rtruediv__, __rpow__, __rmod__, __rfloordiv__, __rmatmul__ are Python functions
# of torch/_tensor.py under _handle_torch_function_and_wrap_type_error_to_not_implemented
# (a TypeError, wrong arguments included, turns into NotImplemented)

def _not_implemented_on_type_error(fn):
    def op(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except TypeError:
            return NotImplemented
    op.__name__ = op.__qualname__ = fn.__name__
    op.__wrapped__ = fn
    return op


def _tensor_method(name, fn):
    wrapped = _not_implemented_on_type_error(fn)

    def op(self, *args, **kwargs):
        if not isinstance(self, Tensor):
            raise TypeError(f"descriptor '{name}' for 'Tensor' objects doesn't apply to a "
                            f"'{type(self).__name__}' object")
        return wrapped(self, *args, **kwargs)
    op.__name__ = op.__qualname__ = name
    op.__wrapped__ = fn
    return op


def _radd(self, other, *alpha_other, alpha=1):
    if alpha_other:
        # t.__radd__(2, 3): torch's deprecated add(Number alpha, Tensor other), self + 2 * 3
        if len(alpha_other) != 1 or isinstance(other, Tensor) or \
                not isinstance(other, (int, float, bool, np.number)):
            raise TypeError("add(): the deprecated form is add(Number alpha, Tensor other)")
        (other_t,) = alpha_other
        warnings.warn("This overload of add is deprecated:\n\tadd(Number alpha, Tensor other)\n"
                      "Consider using one of the following signatures instead:\n\t"
                      "add(Tensor other, *, Number alpha = 1)", UserWarning, stacklevel=3)
        return O.add(self, other_t, alpha=other)
    return O.add(other, self) if alpha == 1 else O.add(self, other, alpha=alpha)


def _rsub(self, other):
    return O.rsub(self, other)


def _rdiv(self, other):
    # torch: self.reciprocal() * other (two roundings); a self that is not a tensor
    # raises its AttributeError there
    return O.elementwise.rdiv(self, other) if isinstance(self, Tensor) else \
        self.reciprocal() * other


def _rand(self, other):
    return O.bitwise_and(self, other)


def _ror(self, other):
    return O.bitwise_or(self, other)


def _rxor(self, other):
    return O.bitwise_xor(self, other)


def _swapped(op, name):
    """``other OP self``: the reflected form of a binary op."""
    def reflected(self, other):
        return op(other, self)
    reflected.__name__ = reflected.__qualname__ = name
    return reflected


def _rmatmul(self, other):
    if not isinstance(other, Tensor) or not isinstance(self, Tensor):
        raise TypeError(f"matmul(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(other).__name__}")
    return O.matmul(other, self)


_REFLECTED = dict(
    __radd__=_tensor_method("__radd__", _radd),
    __rmul__=_tensor_method("__rmul__", _swapped(O.mul, "_rmul")),
    __rand__=_tensor_method("__rand__", _rand),
    __ror__=_tensor_method("__ror__", _ror),
    __rxor__=_tensor_method("__rxor__", _rxor),
    __rsub__=_not_implemented_on_type_error(_rsub),
    __rtruediv__=_not_implemented_on_type_error(_rdiv),
    __rdiv__=_not_implemented_on_type_error(_rdiv),
    __rpow__=_not_implemented_on_type_error(_swapped(O.pow, "_rpow")),
    __rmod__=_not_implemented_on_type_error(_swapped(O.remainder, "_rmod")),
    __rfloordiv__=_not_implemented_on_type_error(_swapped(O.floor_divide, "_rfloordiv")),
    __rmatmul__=_not_implemented_on_type_error(_rmatmul),
)


def _iadd(self, other):
    return I.apply_inplace(self, O.add, other)


def _isub(self, other):
    return I.apply_inplace(self, O.sub, other)


def _imul(self, other):
    return I.apply_inplace(self, O.mul, other)


def _itruediv(self, other):
    return I.apply_inplace(self, O.div, other)


def _setitem(self, idx, value):
    S.setitem(self, idx, value)


def _iter(self):
    """Iteration over the first dim: the views ``unbind(self, 0)``."""
    if self._data.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return iter(S.unbind(self, 0))


_METHODS = dict(
    __add__=O.add, add=O.add,
    __sub__=O.sub, sub=O.sub, subtract=O.sub,
    __mul__=O.mul, mul=O.mul, multiply=O.mul,
    __truediv__=O.div, div=O.div,
    divide=O.div, true_divide=O.div,
    __floordiv__=O.floor_divide, __mod__=O.remainder, remainder=O.remainder,
    floor_divide=O.floor_divide,
    __neg__=O.neg, neg=O.neg, negative=O.neg, __pos__=lambda self: self,
    __abs__=O.abs, abs=O.abs, sign=O.sign,
    __pow__=O.pow, pow=O.pow, square=O.square,
    __matmul__=O.matmul, matmul=O.matmul,
    mm=O.mm, bmm=O.bmm, addmm=O.addmm, baddbmm=O.baddbmm, mv=O.mv, dot=O.dot, outer=O.outer,
    __getitem__=O.getitem, __setitem__=_setitem, __iter__=_iter,
    __eq__=O.eq, __ne__=O.ne, __lt__=O.lt, __le__=O.le, __gt__=O.gt, __ge__=O.ge,
    eq=O.eq, ne=O.ne, lt=O.lt, le=O.le, gt=O.gt, ge=O.ge,
    __and__=O.bitwise_and, __or__=O.bitwise_or, __xor__=O.bitwise_xor,
    __invert__=O.bitwise_not, logical_not=O.logical_not, logical_and=O.logical_and,
    logical_or=O.logical_or,
    __bool__=_bool, __float__=_float, __int__=_int, __index__=_index, __format__=_format,
    __iadd__=_iadd, __isub__=_isub, __imul__=_imul, __itruediv__=_itruediv,
    isnan=O.isnan, isinf=O.isinf, isfinite=O.isfinite, equal=O.equal, isclose=O.isclose,
    allclose=O.allclose,
    sum=O.sum, mean=O.mean, amax=O.amax, amin=O.amin, max=O.max, min=O.min,
    argmax=O.argmax, argmin=O.argmin, topk=O.topk, sort=O.sort, argsort=O.argsort,
    std=O.std, var=O.var, norm=O.norm, cumsum=O.cumsum, prod=O.prod, any=O.any, all=O.all,
    logsumexp=O.logsumexp, count_nonzero=O.count_nonzero,
    exp=O.exp, log=O.log, log1p=O.log1p, expm1=O.expm1, sqrt=O.sqrt, rsqrt=O.rsqrt,
    tanh=O.tanh, sigmoid=O.sigmoid, relu=O.relu, cos=O.cos, sin=O.sin,
    reciprocal=O.reciprocal, clamp=O.clamp, clip=O.clamp,
    clamp_min=O.clamp_min, clamp_max=O.clamp_max, floor=O.floor, ceil=O.ceil, trunc=O.trunc,
    fix=O.trunc, round=O.round, frac=O.frac, erf=O.erf, erfc=O.erfc, nan_to_num=O.nan_to_num,
    addcmul=O.addcmul, addcdiv=O.addcdiv, cumprod=O.cumprod,
    scatter=O.scatter, scatter_add=O.scatter_add, index_add=O.index_add,
    unique=O.unique, unique_consecutive=O.unique_consecutive, histc=O.histc,
    histogram=O.histogram,
    diff=O.diff, tile=O.tile, rot90=O.rot90, diag_embed=O.diag_embed, nansum=O.nansum,
    nanmean=O.nanmean, dist=O.dist, copysign=O.copysign, kthvalue=O.kthvalue,
    median=O.median, nanmedian=O.nanmedian, quantile=O.quantile, nanquantile=O.nanquantile,
    maximum=O.maximum, minimum=O.minimum,
    softmax=lambda self, dim, dtype=None: F.softmax(self, dim, dtype=dtype),
    log_softmax=lambda self, dim, dtype=None: F.log_softmax(self, dim, dtype=dtype),
    reshape=O.reshape, view=O.view, view_as=O.view_as, reshape_as=S.reshape_as,
    transpose=O.transpose, swapaxes=O.swapaxes, permute=O.permute, t=O.t,
    movedim=O.movedim, unsqueeze=O.unsqueeze, squeeze=O.squeeze, flatten=O.flatten,
    unflatten=O.unflatten, expand=O.expand, expand_as=O.expand_as, repeat=O.repeat,
    repeat_interleave=O.repeat_interleave,
    split=O.split, chunk=O.chunk, unbind=O.unbind, narrow=O.narrow, select=O.select,
    tensor_split=O.tensor_split, flip=O.flip, roll=O.roll, tril=O.tril, triu=O.triu,
    diag=O.diag, diagonal=O.diagonal, trace=O.trace,
    gather=O.gather, index_select=O.index_select, masked_select=O.masked_select,
    nonzero=O.nonzero,
    contiguous=O.contiguous, masked_fill=O.masked_fill, clone=O.clone,
    where=lambda self, cond, other: O.where(cond, self, other),
    to=_to, type=_type,
    type_as=lambda self, other: _to(self, other.dtype),
    float=_convert(float32), half=_convert(float16), bfloat16=_convert(bfloat16),
    double=_convert(float64), long=_convert(int64), int=_convert(int32),
    short=_convert(int16), char=_convert(int8), byte=_convert(uint8), bool=_convert(bool_),
    new_zeros=_new(O.zeros), new_ones=_new(O.ones), new_empty=_new(O.empty),
    new_full=_new_full, new_tensor=_new_tensor,
    zero_=I.zero, fill_=I.fill, copy_=lambda self, src, non_blocking=False: I.copy_into(
        self, src),
    add_=_inplace(O.add), sub_=_inplace(O.sub), mul_=_inplace(O.mul), div_=_inplace(O.div),
    pow_=_inplace(O.pow), neg_=_inplace(O.neg), abs_=_inplace(O.abs),
    clamp_=_inplace(O.clamp), clip_=_inplace(O.clamp), exp_=_inplace(O.exp),
    log_=_inplace(O.log), sqrt_=_inplace(O.sqrt), rsqrt_=_inplace(O.rsqrt),
    tanh_=_inplace(O.tanh), sigmoid_=_inplace(O.sigmoid), relu_=_inplace(O.relu),
    reciprocal_=_inplace(O.reciprocal), masked_fill_=_inplace(O.masked_fill),
    tril_=_inplace(O.tril), triu_=_inplace(O.triu),
    clamp_min_=_inplace(O.clamp_min), clamp_max_=_inplace(O.clamp_max),
    floor_=_inplace(O.floor), ceil_=_inplace(O.ceil), trunc_=_inplace(O.trunc),
    fix_=_inplace(O.trunc), round_=_inplace(O.round), frac_=_inplace(O.frac),
    erf_=_inplace(O.erf), erfc_=_inplace(O.erfc), nan_to_num_=_inplace(O.nan_to_num),
    addcmul_=_inplace(O.addcmul), addcdiv_=_inplace(O.addcdiv),
    cumprod_=_inplace(O.cumprod), cumsum_=_inplace(O.cumsum),
    scatter_=_inplace(O.scatter), scatter_add_=_inplace(O.scatter_add),
    index_add_=_inplace(O.index_add),
    uniform_=_uniform_, normal_=_normal_, random_=_random_, bernoulli_=_bernoulli_,
    exponential_=_exponential_,
)


_METHODS.update(_REFLECTED)
_METHODS["lerp"] = O.lerp
_METHODS["lerp_"] = _inplace(O.lerp)

for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)
Tensor.T = property(lambda self: O.permute(self, tuple(reversed(range(self.ndim)))))
Tensor.mT = property(lambda self: O.transpose(self, -2, -1))
Tensor.H = Tensor.T
Tensor.itemsize = property(lambda self: self.element_size())


def _tensor_getattr(self, name):
    raise missing("Tensor", name)


Tensor.__getattr__ = _tensor_getattr
