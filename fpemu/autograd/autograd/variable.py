"""``torch.autograd.Variable``: the deprecated wrapper of torch < 0.4.

Since torch 0.4 a Variable is a Tensor: ``Variable(t, requires_grad=True)``
returns ``t.detach()`` (the same storage and version counter, outside the
graph) with ``requires_grad`` set, and ``isinstance(x, Variable)`` holds for
every tensor. As torch's ``_LegacyVariableBase`` (torch/csrc/autograd/
python_legacy_variable.cpp): ``Variable()`` is an empty float32 tensor,
``volatile=True`` warns that it has no effect, anything but a tensor as data
raises TypeError.
"""

from __future__ import annotations

import warnings

from ...errors import FpemuRuntimeError, FpemuTypeError
from .._core import Tensor, float32, is_float, tensor

_KEYWORDS = ("data", "requires_grad", "volatile", "_grad_fn", "name")


class _VariableMeta(type):
    def __instancecheck__(cls, other):
        return isinstance(other, Tensor)

    def __call__(cls, *args, **kwargs):
        if len(args) > len(_KEYWORDS):
            raise FpemuTypeError(f"Variable() takes at most {len(_KEYWORDS)} arguments "
                                 f"({len(args)} given)")
        for k in kwargs:
            if k not in _KEYWORDS:
                raise FpemuTypeError(f"'{k}' is an invalid keyword argument for this function "
                                     f"(Variable takes {', '.join(_KEYWORDS)})")
        given = dict(zip(_KEYWORDS, args))
        for k, v in kwargs.items():
            if k in given:
                raise FpemuTypeError(f"argument for Variable() given by name ('{k}') and "
                                     f"position ({_KEYWORDS.index(k) + 1})")
            given[k] = v
        data = given.get("data")
        if given.get("volatile"):
            warnings.warn("volatile was removed and now has no effect. Use `with "
                          "torch.no_grad():` instead.", UserWarning, stacklevel=2)
        if given.get("_grad_fn") is not None:
            raise FpemuTypeError("Variable(_grad_fn=...) is not emulated: a graph node cannot "
                                 "be attached to a tensor; build the tensor with the ops")
        if data is None:
            var = tensor([], dtype=float32)
        elif not isinstance(data, Tensor):
            raise FpemuTypeError(f"Variable data has to be a tensor, but got "
                                 f"{type(data).__name__} (wrap it first: "
                                 f"torch.tensor(data))")
        else:
            var = data.detach()
        if given.get("requires_grad"):
            if not is_float(var.dtype):
                raise FpemuRuntimeError("Only Tensors of floating point and complex dtype can "
                                        "require gradients")
            var.requires_grad_(True)
        return var


class Variable(metaclass=_VariableMeta):
    """``Variable(data=None, requires_grad=False, volatile=False, _grad_fn=None,
    name=None)``: ``data.detach()`` with ``requires_grad`` set (module doc)."""
