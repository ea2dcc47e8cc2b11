"""Tensor methods and operators, bound to the functions of ``_ops``."""

from __future__ import annotations

import numpy as np

from . import _ops as F
from ._core import DType, Tensor, as_dtype, bfloat16, float16, float32, float64, int32, int64
from ..formats import Format


def _to(self, *args, **kwargs):
    """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(tensor)``;
    devices are accepted and ignored (fpemu emulates one CUDA device)."""
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("device", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("copy", None)
    if kwargs:
        raise TypeError(f"to(): unexpected arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (Format, DType)):
            dtype = a
        elif isinstance(a, str):
            if not a.startswith(("cuda", "cpu")):
                raise ValueError(f"to(): {a!r} is not a device; pass a dtype object such as "
                                 f"fpemu.autograd.bfloat16")
        elif a is not None:
            raise TypeError(f"to(): expected a dtype, a device or a tensor, got {a!r}")
    if dtype is None:
        return self
    return F.to_dtype(self, as_dtype(dtype, "to()"))


def _inplace_op(fn):
    def method(self, *args, **kwargs):
        return F._inplace(self, fn(self, *args, **kwargs))
    return method


def _sub_inplace(self, other, alpha=1):
    with_grad = F._State.grad_enabled
    F._State.grad_enabled = False
    try:
        return F.sub(self, other, alpha)._a
    finally:
        F._State.grad_enabled = with_grad


def _no_graph(op):
    def values(self, *args, **kwargs):
        with_grad = F._State.grad_enabled
        F._State.grad_enabled = False
        try:
            return op(self, *args, **kwargs)._a
        finally:
            F._State.grad_enabled = with_grad
    return values


_METHODS = dict(
    __add__=F.add, __radd__=lambda a, b: F.add(b, a), add=F.add,
    __sub__=F.sub, __rsub__=lambda a, b: F.add(F.neg(a), b), sub=F.sub,
    __mul__=F.mul, __rmul__=lambda a, b: F.mul(b, a), mul=F.mul,
    __truediv__=F.div, __rtruediv__=lambda a, b: F.rdiv(a, b), div=F.div,
    __neg__=F.neg, neg=F.neg,
    __pow__=F.pow, pow=F.pow,
    __matmul__=F.matmul, __rmatmul__=lambda a, b: F.matmul(b, a), matmul=F.matmul,
    __getitem__=F.getitem,
    __eq__=F.eq, __ne__=F.ne, __lt__=F.lt, __le__=F.le, __gt__=F.gt, __ge__=F.ge,
    eq=F.eq, ne=F.ne, lt=F.lt, le=F.le, gt=F.gt, ge=F.ge,
    sum=F.sum, mean=F.mean, amax=F.amax, argmax=F.argmax,
    exp=F.exp, log=F.log, sqrt=F.sqrt, tanh=F.tanh, sigmoid=F.sigmoid, relu=F.relu,
    reciprocal=F.reciprocal,
    softmax=F.softmax, log_softmax=F.log_softmax,
    reshape=F.reshape, view=F.reshape, transpose=F.transpose, permute=F.permute,
    unsqueeze=F.unsqueeze, squeeze=F.squeeze, flatten=F.flatten,
    masked_fill=F.masked_fill, clone=F.clone,
    to=_to,
    float=lambda self: F.to_dtype(self, float32),
    half=lambda self: F.to_dtype(self, float16),
    bfloat16=lambda self: F.to_dtype(self, bfloat16),
    double=lambda self: F.to_dtype(self, float64),
    long=lambda self: F.to_dtype(self, int64),
    int=lambda self: F.to_dtype(self, int32),
    contiguous=lambda self: self,
    zero_=_inplace_op(lambda self: np.zeros_like(self._a)),
    fill_=_inplace_op(lambda self, v: np.full_like(self._a, v, dtype=np.float64)),
    copy_=_inplace_op(lambda self, src: np.broadcast_to(
        F._store(src._a, self.dtype), self.shape).copy()),
    add_=_inplace_op(_no_graph(F.add)),
    sub_=_inplace_op(_sub_inplace),
    mul_=_inplace_op(_no_graph(F.mul)),
    div_=_inplace_op(_no_graph(F.div)),
)

for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)
Tensor.T = property(lambda self: F.permute(self, tuple(reversed(range(self.ndim)))))
Tensor.mT = property(lambda self: F.transpose(self, -2, -1))
