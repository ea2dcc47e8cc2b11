"""Correctly rounded arithmetic in any format and rounding mode.

``add``, ``sub``, ``mul``, ``div``, ``sqrt`` and ``fma`` take operands that
are values of the format (float32/float64 arrays, numpy broadcasting) and
return the exact mathematical result rounded once into the format, as
float32 values, the way an IEEE 754 unit for that format would. How the
kernels get the exact result is in :mod:`fpemu._arith_kernels`.

Special cases follow IEEE 754-2019: a NaN operand gives NaN; inf - inf,
0 * inf, 0 / 0, inf / inf and the square root of a negative number give NaN;
x / 0 is an infinity of the sign of the quotient (then the overflow policy,
as for :func:`fpemu.quantize`); an exact zero sum or difference is +0 in every
mode except ``"rdn"``, where it is -0 (§6.3); sqrt(-0) = -0. A result that is
NaN in a format without NaN is an error.
"""

from __future__ import annotations

import numpy as np

from . import _arith_kernels
from ._jit import run_kernel
from .checks import real_array
from .errors import FpemuValueError
from .formats import Format
from .quantize import Cast, not_in_format
from .rounding import Rounding

__all__ = ["add", "sub", "mul", "div", "sqrt", "fma", "fma_fp32"]

_NAMES = {1: ("a",), 2: ("a", "b"), 3: ("a", "b", "c")}


def _operands(values, fmt: Format, fname):
    arrays = []
    for v in values:
        flat, shape = real_array(v, fname)
        arrays.append(flat.reshape(shape))
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise FpemuValueError(
            f"{fname}(): operands of shapes {shapes} do not broadcast together; "
            "give them equal shapes or shapes numpy can broadcast"
        ) from None
    dtype = np.float32 if all(a.dtype == np.float32 for a in arrays) else np.float64
    flat = [np.ascontiguousarray(np.broadcast_to(a.astype(dtype, copy=False), shape)).reshape(-1)
            for a in arrays]
    return flat, shape


def _report_bad(flat, fmt: Format, fname):
    label = fmt.long_name or fmt.name
    for name, arr in zip(_NAMES[len(flat)], flat):
        bad = not_in_format(arr, fmt)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise FpemuValueError(
                f"{fname}(): operand {name} holds {int(bad.sum())} value(s) that are not "
                f"{label} values (the first, {float(arr[first])!r}, at flat index {first}); "
                f"arithmetic in {label} takes {label} operands: round them first with "
                f"fpemu.quantize({name}, {fmt.name!r})"
            )
    raise AssertionError("the kernel flagged an operand that the check accepts")  # pragma: no cover


def _elementwise(opname, values, fmt, rounding, subnormals, overflow, seed):
    cast = Cast.of(fmt, rounding, subnormals, overflow)
    fmt, mode, params, flags = cast.fmt, cast.rounding, cast.params, cast.flags
    key, offset = cast.seed_key(seed)
    flat, shape = _operands(values, fmt, opname)
    out = np.empty(shape, np.float32)
    if out.size:
        a = flat[0]
        b = flat[1] if len(flat) > 1 else a
        c = flat[2] if len(flat) > 2 else a
        if (opname == "fma" and fmt.name == "fp32" and mode is Rounding.RNE and flags == 0
                and a.dtype == np.float32):
            return fma_fp32(a, b, c, out.reshape(-1)).reshape(shape)
        kernel = _arith_kernels.arith_kernel(int(mode), flags)
        bad = run_kernel(kernel, a, b, c, out.reshape(-1), params, key, offset,
                         _arith_kernels.OPS[opname], inputs=3)
        if bad:
            _report_bad(flat, fmt, opname)
        if not fmt.has_nan:
            nan = np.isnan(out)
            if nan.any():
                first = int(np.flatnonzero(nan)[0])
                raise FpemuValueError(
                    f"{opname}(): the exact result at flat index {first} is NaN (0/0, inf - inf, "
                    f"0 * inf or the square root of a negative number), and "
                    f"{fmt.long_name or fmt.name} has no NaN; keep such operands out or "
                    "compute in a format with NaN"
                )
    return out


def fma_fp32(a, b, c, out=None):
    """fma(a, b, c) in fp32, nearest even, of C-contiguous 1-D float32 arrays
    of one length, with no argument checks (the fast path of :func:`fma`,
    for callers that have checked already: fpemu.autograd's kernel formulas).
    Exact: the product and the sum are rounded once."""
    res = np.empty(a.shape, np.float32) if out is None else out
    if a.size:
        run_kernel(_arith_kernels.fma_fp32_rne, a, b, c, res, inputs=3)
    return res


_DOC_ARGS = """
    fmt : str or Format
        The format of the operands and of the result.
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode of the one rounding.
    subnormals : bool
        False is flush-to-zero mode: subnormal operands read as zeros of their
        sign, and subnormal results (after rounding) become zeros.
    overflow : {None, "inf", "saturate", "nan"}
        Overflow policy, as for :func:`fpemu.quantize` (None: the format's default).
    seed : int, (int, int) or None
        Stochastic rounding only, as for :func:`fpemu.quantize`.

    Returns
    -------
    ndarray of float32 of the broadcast shape (0-d for scalars).

    Raises
    ------
    ValueError
        If an operand is not a value of the format, or a NaN result has no
        code in the format."""


def add(a, b, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """a + b rounded once into fmt.

    Examples
    --------
    >>> import fpemu
    >>> float(fpemu.add(256.0, 1.0, "bf16"))          # 257 is a tie: to even
    256.0
    >>> float(fpemu.add(256.0, 1.0, "bf16", rounding="rup"))
    258.0
    >>> float(fpemu.add(1.0, -1.0, "fp16", rounding="rdn"))   # IEEE: -0 when rounding down
    -0.0
    """
    return _elementwise("add", (a, b), fmt, rounding, subnormals, overflow, seed)


def sub(a, b, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """a - b rounded once into fmt (IEEE 754: exactly a + (-b)).

    Examples
    --------
    >>> import fpemu
    >>> float(fpemu.sub(1.0, 2.0**-9, "bf16"))   # 1 - 2**-9 is a tie between 1 - 2**-8 and 1
    1.0
    """
    return _elementwise("sub", (a, b), fmt, rounding, subnormals, overflow, seed)


def mul(a, b, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """a * b rounded once into fmt.

    Examples
    --------
    >>> import fpemu
    >>> fpemu.mul([448.0, 2.0**-6], [2.0, 2.0**-3], "e4m3fn").tolist()   # saturates; subnormal
    [448.0, 0.001953125]
    """
    return _elementwise("mul", (a, b), fmt, rounding, subnormals, overflow, seed)


def div(a, b, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """a / b rounded once into fmt.

    Examples
    --------
    >>> import fpemu
    >>> float(fpemu.div(1.0, 3.0, "bf16")), float(fpemu.div(1.0, 3.0, "bf16", rounding="rup"))
    (0.333984375, 0.333984375)
    >>> fpemu.div([1.0, -1.0, 0.0], 0.0, "fp16").tolist()
    [inf, -inf, nan]
    """
    return _elementwise("div", (a, b), fmt, rounding, subnormals, overflow, seed)


def sqrt(a, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """The square root of a rounded once into fmt (sqrt(-0) = -0, sqrt(<0) = NaN).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.sqrt([2.0, -0.0, 4.0], "fp16").tolist()
    [1.4140625, -0.0, 2.0]
    """
    return _elementwise("sqrt", (a,), fmt, rounding, subnormals, overflow, seed)


def fma(a, b, c, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """a * b + c with one rounding into fmt (fused multiply-add; exact for fp32 too).

    Examples
    --------
    >>> import fpemu
    >>> x = 1 + 2.0**-23                       # (1 + u)(1 - u) - 1 = -u**2 exactly
    >>> float(fpemu.fma(x, 1 - 2.0**-23, -1.0, "fp32")) == -2.0**-46
    True
    >>> float(fpemu.add(fpemu.mul(x, 1 - 2.0**-23, "fp32"), -1.0, "fp32"))   # unfused: lost
    0.0
    """
    return _elementwise("fma", (a, b, c), fmt, rounding, subnormals, overflow, seed)


for _f in (add, sub, mul, div, sqrt, fma):
    _f.__doc__ = _f.__doc__.replace("\n\n    Examples", "\n\n    Parameters\n    ----------\n"
                                    "    a, b, c : array_like\n        Operands: values of fmt."
                                    + _DOC_ARGS + "\n\n    Examples", 1)
del _f
