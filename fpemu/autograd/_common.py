"""Helpers shared by the ops: operands in opmath, output dtypes, gradient
parts."""

from __future__ import annotations

import numpy as np

from ..errors import FpemuRuntimeError, FpemuTypeError
from ._core import Tensor, _sum_to, float32, is_float, opmath, result_type
from ._core import wrap_dim  # noqa: F401  (re-exported: the ops and nn import it from here)


def t_or_number(x, what):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number)):
        return x
    raise FpemuTypeError(f"{what}: expected a Tensor or a Python number, got "
                         f"{type(x).__name__}")


def broadcast_check(a, b):
    """torch's error where two tensors' shapes do not broadcast (a
    RuntimeError naming the first dim that differs, not numpy's ValueError)."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        return
    sa, sb = a._data.shape, b._data.shape
    if sa == sb:
        return
    n = max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    for k in range(n - 1, -1, -1):
        if pa[k] != pb[k] and pa[k] != 1 and pb[k] != 1:
            raise FpemuRuntimeError(f"The size of tensor a ({pa[k]}) must match the size of "
                                    f"tensor b ({pb[k]}) at non-singleton dimension {k}")


def operand(x, dt):
    """``x`` widened exactly to the opmath of ``dt`` (a Python number: one
    conversion, as CUDA's wrapped scalars)."""
    om = opmath(dt)
    if isinstance(x, Tensor):
        return x._data.astype(om, copy=False)
    return om(x)


def f64(x):
    return x._data.astype(np.float64)


def float_dt(*xs):
    dt = result_type(*xs)
    return dt if is_float(dt) else float32


def grad_part(g, x, dt):
    if not isinstance(x, Tensor):
        return None
    return _sum_to(g, x.shape, dt)


def sum_to_shape(g, shape):
    """A broadcast gradient (any float array) summed back to an input's shape,
    without rounding (the caller rounds once)."""
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def int_binary(npop, a, b, dt):
    A = a._data if isinstance(a, Tensor) else a
    B = b._data if isinstance(b, Tensor) else b
    return Tensor(np.asarray(npop(A, B)).astype(dt.np_dtype), dt)


#: torch's error for ``float(t)``, ``int(t)`` or a tensor among a new tensor's
#: numbers when ``t`` holds more than one element
ONE_ELEMENT_ONLY = "only one element tensors can be converted to Python scalars"


def shape_arg(size, what="shape"):
    """``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])`` or ``f(torch.Size(...))`` as a tuple."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = s.item()
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)):
            raise FpemuTypeError(f"{what}: expected a sequence of ints, got {size!r}")
        out.append(int(s))
    return tuple(out)


_C10_NAMES = {"fp32": "float", "float64": "double", "bf16": "c10::BFloat16", "fp16": "c10::Half",
              "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
              "uint8": "unsigned char", "bool": "bool"}


def c10_name(dt):
    """The dtype as ATen's error messages spell it (``c10::BFloat16``)."""
    name = getattr(dt, "name", str(dt))
    if name in _C10_NAMES:
        return _C10_NAMES[name]
    long = getattr(dt, "long_name", None) or name
    return "c10::" + long[0].upper() + long[1:].replace("float8", "Float8")


def scalar_type(dt):
    """The dtype as ATen's ScalarType names it (``BFloat16``, ``Float``)."""
    c10 = c10_name(dt).replace("c10::", "")
    return {"float": "Float", "double": "Double", "long int": "Long", "int": "Int",
            "short int": "Short", "signed char": "Char", "unsigned char": "Byte",
            "bool": "Bool"}.get(c10, c10)
