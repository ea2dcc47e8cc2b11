"""Teaching views: one value bit by bit, every value of a format, the code grid.

``explain(x, fmt)`` rounds one real number and says everything about it:
the bit fields, the exponent, the class, the exact decimal value, the error,
the two neighbours and why the rounding picked its side. ``values(fmt)``
lists every code of a format of up to 16 bits; ``table(fmt)`` lays the codes
of an 8-bit (or smaller) format out as rows of 16 (row = high nibble).
"""

from __future__ import annotations

import dataclasses
import decimal
import numbers
import textwrap
from fractions import Fraction

import numpy as np

from ._callable import make_callable
from ._exact import parse_real, to_float64_odd
from .errors import FpemuTypeError, FpemuValueError
from .formats import Format
from .numtext import cell as _cell
from .numtext import shortest as _show
from .checks import (
    ML_DTYPES_INTS, ML_DTYPES_NAMES, as_format, flatten, from_torch, is_torch_tensor,
)
from .quantize import classify, decode, encode, next_down, next_up, quantize, ulp
from .rounding import parse_overflow, parse_rounding

__all__ = ["Explanation", "explain", "values", "table", "table_text"]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Everything about one value rounded into a format (see :func:`explain`)."""

    x: float
    format: str
    rounding: str
    code: int
    bits: str
    sign: str
    exponent_bits: str
    mantissa_bits: str
    biased_exponent: int
    exponent: int
    cls: str
    value: float
    exact_value: str
    abs_error: float
    rel_error: float
    ulp_error: float
    below: float
    above: float
    reason: str
    #: the input as given (decimal text, Fraction, ...); ``x`` is its nearest float64
    input: str = ""

    def __str__(self) -> str:
        hexw = (len(self.bits) + 3) // 4
        lines = [
            f"{self.input or _show(self.x)} in {self.format} (rounding {self.rounding})",
            f"  code      0x{self.code:0{hexw}X} = {self._spaced()}  "
            f"(sign | exponent | mantissa)",
            f"  exponent  field {self.biased_exponent} -> "
            + (f"2^{self.exponent}" if self.cls not in ("inf", "nan") else "all ones: inf/NaN"),
            f"  class     {self.cls}",
            f"  value     {self.exact_value}",
            f"  error     {self.abs_error:.6g} absolute, {self.rel_error:.6g} relative, "
            f"{self.ulp_error:.6g} ulp",
            f"  between   {_show(self.below)} and {_show(self.above)}",
        ]
        # the reason is prose: wrapped so that it reads in a terminal or a notebook
        lines.append(textwrap.fill(self.reason, 88, initial_indent="  why       ",
                                   subsequent_indent=" " * 12, break_long_words=False))
        return "\n".join(lines)

    def _spaced(self) -> str:
        return " ".join(p for p in (self.sign, self.exponent_bits, self.mantissa_bits) if p)


def _fields(code: int, fmt: Format):
    bits = format(code, f"0{fmt.bits}b")
    s = 1 if fmt.signed else 0
    return bits, bits[:s], bits[s:s + fmt.exponent_bits], bits[s + fmt.exponent_bits:]


def _reason(x, exact, q, lo, hi, fmt: Format, mode, overflow, cls) -> str:
    name = fmt.name
    if x != x:
        return "NaN stays NaN (the format's canonical NaN code)."
    if x in (np.inf, -np.inf):
        return (f"{_show(x)} becomes {_show(q)} under the overflow policy {overflow!r}.")
    if q != q or q in (np.inf, -np.inf) or (abs(x) > fmt.max and abs(q) == fmt.max):
        return (f"|x| is beyond the largest finite {name} value {fmt.max!r}: it overflows, and "
                f"under rounding {mode} with overflow policy {overflow!r} that gives {_show(q)}.")
    if lo == hi and exact == Fraction(lo):
        return f"x is a {name} value: nothing to round."
    if not fmt.has_zero and abs(exact) < Fraction(fmt.min_normal):
        return (f"x is below the smallest {name} value, so it becomes that value "
                f"({fmt.min_normal!r}).")
    d_lo = exact - Fraction(lo)
    d_hi = Fraction(hi) - exact
    side = "the neighbour above" if q == hi else "the neighbour below"
    if mode == "rne" or mode == "rna":
        if d_lo == d_hi:
            rule = ("ties go to the neighbour with an even last significand bit" if mode == "rne"
                    else "ties go away from zero")
            msg = f"x lies exactly halfway between {lo!r} and {hi!r}; {rule}: {_show(q)}."
        else:
            near = "below" if d_lo < d_hi else "above"
            a, b = _distinct(min(d_lo, d_hi), max(d_lo, d_hi))
            msg = (f"x is nearer the neighbour {near} ({a} away against {b}), and round to "
                   f"nearest takes it.")
    elif mode == "rtz":
        msg = f"rounding toward zero takes {side}, the one nearer zero."
    elif mode == "rup":
        msg = f"rounding toward +inf takes the neighbour above, {hi!r}."
    elif mode == "rdn":
        msg = f"rounding toward -inf takes the neighbour below, {lo!r}."
    elif mode == "rto":
        msg = f"round to odd takes the neighbour whose last significand bit is 1: {_show(q)}."
    else:
        p_up = _float(d_lo / (d_lo + d_hi))
        msg = (f"stochastic rounding goes up with probability {p_up:.6g} (the distance from "
               f"the neighbour below over the gap); this draw took {side}.")
    if q == 0 and x != 0:
        msg += " The result is zero: x underflowed."
    elif cls == "subnormal":
        msg += f" The result is subnormal: below {fmt.min_normal!r}, with fewer significant bits."
    return msg


def _read_one(x):
    """(exact value as a Fraction or None for inf/NaN, float64 rounded to odd,
    the input as text) of one real number: float, int, Fraction, Decimal,
    decimal text, a numpy scalar or a one-element array."""
    typed = x.strip() if isinstance(x, str) else ""
    if isinstance(x, str):
        x = parse_real(x)
    x = _one_value(x)
    if isinstance(x, (complex, np.complexfloating)):
        raise FpemuTypeError(f"explain() takes a real number, got the complex {x!r}; pass x.real "
                             "and x.imag separately")
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (numbers.Real, decimal.Decimal)):
        raise FpemuTypeError(f"explain() takes one real number (a float, int, Fraction, Decimal or "
                             f"decimal text such as '0.1'), got {type(x).__name__} {x!r:.40}")
    text = str(x) if isinstance(x, (decimal.Decimal, Fraction, numbers.Integral)) else ""
    if isinstance(x, np.floating) and x.dtype.itemsize > 8:
        text = np.format_float_positional(x, unique=True, trim="-")
    text = typed or text
    xv = to_float64_odd(x)
    if isinstance(x, float) or (isinstance(x, np.floating) and x.dtype.itemsize <= 8):
        exact = Fraction(float(x)) if np.isfinite(x) else None
    elif xv != xv or xv in (np.inf, -np.inf):
        exact = None                                   # Decimal inf / nan
    elif isinstance(x, decimal.Decimal):
        exact = Fraction(x)
    elif isinstance(x, np.floating):
        exact = Fraction(*x.as_integer_ratio())
    else:
        exact = Fraction(x)
    return exact, xv, text


def _one_value(x):
    """The one number a user holds, as a Python or numpy real: a 0-d or
    one-element torch tensor, numpy or ml_dtypes array, list or tuple gives
    its element; numpy ints (uint64 too) and bools become Python ints,
    ml_dtypes scalars their exact float32 value."""
    if is_torch_tensor(x):
        x = from_torch(x, "explain")
    if isinstance(x, (list, tuple)):
        flat = list(flatten(x))
        if len(flat) != 1:
            raise FpemuValueError(f"explain() takes one number, got a {type(x).__name__} of "
                                  f"{len(flat)}; use fpemu.quantize for arrays")
        return _one_value(flat[0])
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise FpemuValueError(f"explain() takes one number, got an array of shape "
                                  f"{x.shape}; use fpemu.quantize for arrays")
        x = x.reshape(-1)[0]
    if isinstance(x, (bool, np.bool_)):
        return int(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.generic) and x.dtype.name in ML_DTYPES_NAMES:
        return float(np.float32(x))
    if isinstance(x, np.generic) and x.dtype.name in ML_DTYPES_INTS:
        return int(np.int64(x))
    return x


def _float(q: Fraction) -> float:
    """A Fraction as the nearest float (±inf past float64's range)."""
    try:
        return float(q)
    except OverflowError:
        return float("inf") if q > 0 else float("-inf")


def _distinct(a: Fraction, b: Fraction):
    """Two different distances as text with enough digits to tell them apart."""
    for digits in (6, 12, 17):
        ta, tb = f"{_float(a):.{digits}g}", f"{_float(b):.{digits}g}"
        if ta != tb:
            return ta, tb
    ctx = decimal.Context(prec=40)
    return tuple(format(ctx.divide(decimal.Decimal(v.numerator), decimal.Decimal(v.denominator)),
                        "g") for v in (a, b))


def _nearest(exact, xv) -> float:
    """The float64 nearest the exact input (±inf past float64's range)."""
    if exact is None:
        return xv
    return _float(exact)


def explain(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None) -> Explanation:
    """Round one real number into fmt and explain the result.

    Returns an :class:`Explanation` (printing it gives a readable block).

    Examples
    --------
    >>> import fpemu
    >>> e = fpemu.explain(0.1, "bf16")
    >>> e.bits, e.value, e.cls
    ('0011110111001101', 0.10009765625, 'normal')
    >>> print(e)                                      # doctest: +NORMALIZE_WHITESPACE
    0.1 in bf16 (rounding rne)
      code      0x3DCD = 0 01111011 1001101  (sign | exponent | mantissa)
      exponent  field 123 -> 2^-4
      class     normal
      value     0.10009765625
      error     9.76562e-05 absolute, 0.000976562 relative, 0.2 ulp
      between   0.099609375 and 0.10009765625
      why       x is nearer the neighbour above (9.76562e-05 away against 0.000390625), and
                round to nearest takes it.
    """
    fmt = as_format(fmt)
    xe, xv, text = _read_one(x)
    mode = parse_rounding(rounding).name.lower()
    kw = dict(rounding=mode, subnormals=subnormals, overflow=overflow, seed=seed)
    code = int(encode(xv, fmt, **kw))
    q = float(quantize(xv, fmt, **kw))
    pol = parse_overflow(fmt.default_overflow if overflow is None else overflow).name.lower()
    cls = str(classify(xv, fmt, **kw))
    bits, s, e, m = _fields(code, fmt)
    field = int(e, 2)
    if cls in ("zero", "subnormal") or (fmt.has_zero and field == 0):
        exp = 1 - fmt.bias if fmt.has_zero else field - fmt.bias
    else:
        exp = field - fmt.bias
    if xv != xv or xv in (np.inf, -np.inf):
        lo = hi = xv
    else:
        lo = xv if float(quantize(xv, fmt, rounding="rdn", overflow="saturate")) == xv \
            else float(next_down(xv, fmt))
        hi = xv if lo == xv else float(next_up(xv, fmt))
    finite = q == q and q not in (np.inf, -np.inf) and xe is not None
    if finite:
        err = abs(Fraction(q) - xe)
        abs_err = _float(err)
        rel_err = _float(err / abs(xe)) if xe != 0 else 0.0
        ulp_err = _float(err / Fraction(float(ulp(xv, fmt))))
    else:
        abs_err = rel_err = ulp_err = float("nan")
    exact = "nan" if q != q else _show(q) if q in (np.inf, -np.inf) else \
        format(decimal.Decimal(q), "f") if abs(q) >= 1e-12 else str(decimal.Decimal(q))
    if q == 0:
        exact = "-0" if np.signbit(q) else "0"
    return Explanation(
        x=_nearest(xe, xv), format=fmt.name, rounding=mode, code=code, bits=bits, sign=s,
        exponent_bits=e, mantissa_bits=m, biased_exponent=field, exponent=exp, cls=cls, value=q,
        exact_value=exact, abs_error=abs_err, rel_error=rel_err, ulp_error=ulp_err,
        below=lo, above=hi, reason=_reason(xv, xe, q, lo, hi, fmt, mode, pol, cls),
        input=text,
    )


def values(fmt) -> np.ndarray:
    """Every code of a format of at most 16 bits with its value and class.

    Returns a structured array with fields ``code`` (uint32), ``bits`` (the
    bit string), ``value`` (float64; NaN for NaN codes) and ``cls``, in code
    order.

    Examples
    --------
    >>> from fpemu.explain import values
    >>> v = values("e2m1")
    >>> v["value"][:8].tolist()
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    >>> str(v["bits"][3]), str(v["cls"][1])
    ('0011', 'subnormal')
    """
    fmt = as_format(fmt)
    if fmt.bits > 16:
        raise FpemuValueError(f"values() lists formats of at most 16 bits; {fmt.name} has "
                              f"{fmt.bits} ({2 ** fmt.bits} codes)")
    codes = np.arange(2 ** fmt.bits, dtype=np.uint32)
    vals = decode(codes.astype(fmt.code_dtype), fmt).astype(np.float64)
    out = np.empty(codes.size, dtype=[("code", np.uint32), ("bits", f"U{fmt.bits}"),
                                      ("value", np.float64), ("cls", "U9")])
    out["code"] = codes
    out["bits"] = [format(int(c), f"0{fmt.bits}b") for c in codes]
    out["value"] = vals
    nan = np.isnan(vals)
    cls = np.full(codes.size, "normal", dtype="U9")
    finite = np.isfinite(vals)
    if fmt.has_zero:
        cls[finite & (vals == 0)] = "zero"
        cls[finite & (vals != 0) & (np.abs(vals) < fmt.min_normal)] = "subnormal"
    cls[np.isinf(vals)] = "inf"
    cls[nan] = "nan"
    out["cls"] = cls
    return out


def table(fmt) -> np.ndarray:
    """The values of all codes of a format of at most 8 bits as a grid of
    16 columns: entry (r, c) is code ``16 * r + c`` (row = high nibble).

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu.explain import table
    >>> t = table("e4m3fn")
    >>> t.shape, float(t[7, 14]), bool(np.isnan(t[7, 15]))
    ((16, 16), 448.0, True)
    """
    fmt = as_format(fmt)
    if fmt.bits > 8:
        raise FpemuValueError(f"table() lays out formats of at most 8 bits (256 codes); "
                              f"{fmt.name} has {fmt.bits}; use "
                              f"fpemu.explain.values({fmt.name!r}) for every value")
    v = values(fmt)["value"]
    rows = max(1, v.size // 16)
    return v.reshape(rows, -1)


def table_text(fmt) -> str:
    """:func:`table` as text: a header of low nibbles, one row per high nibble.

    Examples
    --------
    >>> from fpemu.explain import table_text
    >>> print(table_text("e2m1"))
    e2m1: value of each code (row = high nibble, column = low nibble)
           .0   .1   .2   .3   .4   .5   .6   .7   .8   .9   .A   .B   .C   .D   .E   .F
    0.      0  0.5    1  1.5    2    3    4    6   -0 -0.5   -1 -1.5   -2   -3   -4   -6
    """
    fmt = as_format(fmt)
    t = table(fmt)
    cells = [[_cell(v) for v in row] for row in t]
    w = max(len(c) for row in cells for c in row)
    head = "     " + " ".join(f"{'.' + format(c, 'X'):>{w}}" for c in range(t.shape[1]))
    lines = [f"{fmt.name}: value of each code (row = high nibble, column = low nibble)", head]
    for r, row in enumerate(cells):
        lines.append(f"{format(r, 'X')}.   " + " ".join(c.rjust(w) for c in row))
    return "\n".join(lines)


make_callable(__name__)   # fpemu.explain(x, fmt) is explain(x, fmt); see fpemu._callable
