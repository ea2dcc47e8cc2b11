"""Exact numbers into float64 with one rounding to odd, so that the one later
rounding into a format is the correct rounding of the exact number.

Text, :class:`~fractions.Fraction`, :class:`~decimal.Decimal`, Python ints
above 2**53, 64-bit integer arrays and ``longdouble`` values may not be
float64 values. Rounding them to nearest float64 first and then into a format
rounds twice (``1.00390625000000000001`` to bf16 would give 1.0, not the
correct 1.0078125). Rounding to *odd* first does not: the float64 result
keeps the exact value's side of every point of a coarser grid and its
inexactness in the last bit (Boldo and Melquiond, "Emulation of FMA and
correctly rounded sums: proved algorithms using rounding to odd", IEEE TC
57(4), 2008). Every fpemu format fits float32 (precision <= 24, values >=
2**-149), so float64 keeps at least 29 more bits at every magnitude; then
rne, rna, rtz, rup, rdn and rto from the float64 value equal the rounding of
the exact number, and stochastic rounding draws with the probability of the
float64 value, within 2**-28 of the exact one.

Past float64's range the rounding to odd gives ±DBL_MAX, which overflows
every format as the exact value does; a nonzero value below 2**-1074 gives
±2**-1074, which sits below every format's smallest subnormal as the exact
value does.
"""

from __future__ import annotations

import decimal
import math
import numbers
from fractions import Fraction

import numpy as np
from .errors import FpemuTypeError, FpemuValueError

__all__ = ["to_float64_odd", "array_to_float64_odd", "parse_real", "EXACT_TYPES"]

#: Python number types read exactly (float64-exact ones pass through unchanged)
EXACT_TYPES = (numbers.Rational, decimal.Decimal)
_DBL_MAX = float(np.finfo(np.float64).max)


def _odd_from_nearest(r: float, exact: Fraction) -> float:
    """The float64 rounding to odd of ``exact``, given its nearest float64 ``r``
    (±inf when it overflows)."""
    if math.isinf(r):
        return math.copysign(_DBL_MAX, r)           # DBL_MAX's last bit is 1
    fr = Fraction(r)
    if fr == exact or np.float64(r).view(np.int64) & 1:
        return r                                    # exact, or the nearest is odd
    return math.nextafter(r, math.inf if exact > fr else -math.inf)


def _fraction_to_odd(q: Fraction) -> float:
    try:
        r = float(q)                     # CPython rounds int / int correctly (to nearest)
    except OverflowError:
        r = math.inf if q > 0 else -math.inf
    return _odd_from_nearest(r, q)


def to_float64_odd(v) -> float:
    """A real scalar as float64: itself if it is one, else its rounding to odd.

    Accepts float, int (any size), Fraction, Decimal (with its ±0, ±inf and
    NaN) and numpy scalars, longdouble included.
    """
    if isinstance(v, (bool, np.bool_)):
        return float(v)
    if isinstance(v, float):
        return v
    if isinstance(v, np.floating):
        if v.dtype.itemsize <= 8:
            return float(v)
        return float(array_to_float64_odd(np.asarray(v)))
    if isinstance(v, decimal.Decimal):
        if v.is_nan():
            return math.nan
        if v.is_infinite():
            return -math.inf if v.is_signed() else math.inf
        if v.is_zero():
            return -0.0 if v.is_signed() else 0.0
        return _fraction_to_odd(Fraction(v))
    if isinstance(v, (numbers.Integral, np.integer)):
        return _fraction_to_odd(Fraction(int(v)))
    if isinstance(v, numbers.Rational):
        return _fraction_to_odd(Fraction(v.numerator, v.denominator))
    if isinstance(v, numbers.Real):
        return float(v)
    raise FpemuTypeError(f"expected a real number, got {type(v).__name__}")


def parse_real(text: str):
    """Decimal text (``"0.1"``, ``"-3e-5"``, ``"1e400"``, ``"-inf"``, ``"nan"``)
    as an exact :class:`~decimal.Decimal`; ValueError names what is accepted."""
    t = text.strip().replace("_", "") if isinstance(text, str) else text
    try:
        d = decimal.Decimal(t)
    except (decimal.InvalidOperation, TypeError, ValueError):
        raise FpemuValueError(f"expected a number such as 0.1, -3e-5, 1e400, inf or nan; "
                              f"got {text!r}") from None
    if d.is_snan():
        d = decimal.Decimal("-nan" if d.is_signed() else "nan")
    return d


def array_to_float64_odd(a: np.ndarray) -> np.ndarray:
    """64-bit integer or longdouble arrays as float64, each element rounded to
    odd where float64 cannot hold it (exactly converted otherwise)."""
    if a.dtype.kind in "iu":
        if a.dtype.itemsize < 8:
            return a.astype(np.float64)              # |x| < 2**32: exact
        hi = (a >> 32).astype(np.float64) * 2.0**32  # arithmetic shift for int64: exact
        lo = (a & 0xFFFFFFFF).astype(np.float64)     # 0 .. 2**32 - 1: exact
        s = hi + lo                                  # rounded to nearest ...
        t = s - hi                                   # ... with its exact error (TwoSum)
        err = (hi - (s - t)) + (lo - t)
        up, down = err > 0, err < 0
    elif a.dtype.kind == "f" and a.dtype.itemsize > 8:
        with np.errstate(over="ignore"):
            s = a.astype(np.float64)
        up, down = a > s, a < s                      # compared in longdouble: exact
    else:
        return a.astype(np.float64)
    move = (up | down) & ((s.view(np.int64) & 1) == 0)
    if move.any():
        s = np.where(move, np.nextafter(s, np.where(up, np.inf, -np.inf)), s)
    return s


# ------------------------------------------------------------- float64 fma
_SPLIT = 134217729.0                      # 2**27 + 1: Veltkamp's splitter for binary64


def _two_sum(x, y):
    s = x + y
    v = s - x
    return s, (x - (s - v)) + (y - v)


def _two_prod(a, b):
    """p + e == a * b exactly (Dekker), where no part under- or overflows."""
    p = a * b
    t = _SPLIT * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLIT * b
    bh = t - (t - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _add_odd(x, y):
    """x + y rounded to odd: where the sum is inexact and its nearest float
    has an even last bit, the neighbour towards the exact sum."""
    s, err = _two_sum(x, y)
    bump = (err != 0) & ((s.view(np.int64) & 1) == 0)
    if bump.any():
        s = np.where(bump, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s


def fma64(a, b, c):
    """``a * b + c`` rounded once to binary64, elementwise (as an FMA unit,
    and as torch's 64-bit CPU kernels compute ``add(..., alpha=)``): Boldo
    and Melquiond's emulation, RN(th + RO(tl + ul)) with a*b = uh + ul and
    uh + c = th + tl ("Emulation of FMA and correctly rounded sums: proved
    algorithms using rounding to odd", IEEE Trans. Computers 57(4), 2008).
    Where a part could leave the normal range (|a|, |b|, |a*b| or |c| beyond
    2**990, a nonzero |a| or |b| or the product of two under 2**-960, or a
    non-finite operand: Veltkamp's split and Dekker's product are exact only
    inside it)
    the element is computed exactly with fractions instead."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (a, b, c)))
    with np.errstate(all="ignore"):
        uh, ul = _two_prod(a, b)
        th, tl = _two_sum(c, uh)
        out = th + _add_odd(tl, ul)
        zeros = ((a == 0) | (b == 0)) & (c == 0)
        if zeros.any():             # 0 * x + 0: the sum of two zeros, sign and all
            out = np.where(zeros, a * b + c, out)
        big, small = 2.0 ** 990, 2.0 ** -960
        aa, ab = np.abs(a), np.abs(b)
        hard = ~(np.isfinite(a) & np.isfinite(b) & np.isfinite(c)) | (np.abs(uh) > big) | (
            np.abs(c) > big) | ((aa != 0) & (ab != 0) & (np.abs(uh) < small)) | (
            np.maximum(aa, ab) > big) | ((aa != 0) & (aa < small)) | ((ab != 0) & (ab < small))
    if hard.any():
        out = np.array(out, np.float64)
        for i in zip(*np.nonzero(hard)):
            x, y, z = float(a[i]), float(b[i]), float(c[i])
            if all(math.isfinite(v) for v in (x, y, z)):
                exact = Fraction(x) * Fraction(y) + Fraction(z)
                try:
                    r = float(exact)              # correctly rounded (ties to even)
                except OverflowError:
                    r = math.inf if exact > 0 else -math.inf
                if exact == 0:
                    with np.errstate(all="ignore"):            # an exact 0: IEEE's sign
                        r = float(np.float64(x) * np.float64(y) + np.float64(z))
                out[i] = r
            elif math.isfinite(x) and math.isfinite(y):
                out[i] = z                    # a finite product leaves an inf or NaN c
            else:
                with np.errstate(all="ignore"):
                    out[i] = np.float64(x) * np.float64(y) + np.float64(z)
    return out
