"""Number formats: one frozen dataclass, every derived fact a property.

A format is a sign bit (optional), ``exponent_bits`` of biased exponent and
``mantissa_bits`` of fraction::

    bit   n-1 | n-2 ........ M | M-1 ........ 0
          sign|  exponent (E)  |  mantissa (M)

How the top and bottom of the code space are used is the ``nan_encoding``:

``"ieee"``
    IEEE 754: the all-ones exponent holds ±inf (mantissa 0) and NaNs.
``"fn"``
    finite (OCP OFP8 E4M3): no infinity; only the all-ones codes are NaN.
``"fnuz"``
    finite, unsigned zero (AMD/Graphcore fp8): no infinity, no -0; the
    code of -0 (sign bit alone) is the one NaN.
``"none"``
    no infinity and no NaN: every code is a number (OCP MX fp6, fp4).

With ``has_subnormals=False`` the exponent field 0 is an ordinary binade, so
the format has no zero and no subnormals (the MX scale format E8M0).
The module holds data; rounding lives in :mod:`fpemu.quantize`.
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import numpy as np

from .errors import FpemuTypeError, FpemuValueError
from .rounding import OVERFLOW_NAMES

NAN_ENCODINGS = ("ieee", "fn", "fnuz", "none")


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format, defined by a few fields.

    Parameters
    ----------
    name : str
        Short name, e.g. ``"e4m3fn"``.
    exponent_bits, mantissa_bits : int
        Widths of the exponent and mantissa (fraction) fields.
    bias : int, optional
        Exponent bias; default ``2**(exponent_bits - 1) - 1``.
    nan_encoding : {"ieee", "fn", "fnuz", "none"}
        Where infinities and NaNs live (see the module docstring).
    signed : bool
        Whether there is a sign bit (E8M0 has none).
    has_subnormals : bool
        Whether the exponent field 0 encodes zero and subnormals.
    default_overflow : {"inf", "saturate", "nan"}, optional
        What an overflow gives when the caller passes ``overflow=None``.
        By default: ``inf`` with infinities, ``nan`` for fnuz,
        ``saturate`` otherwise (PyTorch on CUDA).
    long_name : str, optional
        The ml_dtypes / PyTorch name (``"float8_e4m3fn"``).
    canonical_nan : int, optional
        The code NaN inputs produce. By default the positive quiet NaN
        (IEEE: top mantissa bit set) or the layout's only NaN code.

    Examples
    --------
    >>> from fpemu import format
    >>> f = format("float8_e4m3fn")
    >>> f.max, f.min_normal, f.min_subnormal, f.eps
    (448.0, 0.015625, 0.001953125, 0.125)
    >>> Format("e3m3", 3, 3).max
    15.0
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int | None = None
    nan_encoding: str = "ieee"
    signed: bool = True
    has_subnormals: bool = True
    default_overflow: str | None = None
    long_name: str | None = dataclasses.field(default=None, compare=False)
    canonical_nan: int | None = None

    def __post_init__(self):
        E, M = self.exponent_bits, self.mantissa_bits
        where = f"format {self.name!r}"
        for field, value in (("exponent_bits", E), ("mantissa_bits", M)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise FpemuTypeError(f"{where}: {field} must be an int, got {value!r}")
        if not 1 <= E <= 8:
            raise FpemuValueError(
                f"{where}: exponent_bits must be in 1..8 (values must fit float32), got {E}"
            )
        if not 0 <= M <= 23:
            raise FpemuValueError(
                f"{where}: mantissa_bits must be in 0..23 (values must fit float32), got {M}"
            )
        if self.nan_encoding not in NAN_ENCODINGS:
            raise FpemuValueError(
                f"{where}: nan_encoding must be one of {', '.join(NAN_ENCODINGS)}, "
                f"got {self.nan_encoding!r}"
            )
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (E - 1) - 1)
        elif not isinstance(self.bias, (int, np.integer)) or isinstance(self.bias, bool):
            raise FpemuTypeError(f"{where}: bias must be an int or None, got {self.bias!r}")
        object.__setattr__(self, "bias", int(self.bias))
        if self.nan_encoding == "ieee" and (M == 0 or E < 2):
            raise FpemuValueError(
                f"{where}: an IEEE layout needs mantissa_bits >= 1 and exponent_bits >= 2 "
                "to hold both infinity and NaN; use nan_encoding='fn' or 'none'"
            )
        if self.nan_encoding == "fnuz" and not (self.signed and self.has_subnormals):
            raise FpemuValueError(f"{where}: nan_encoding='fnuz' needs a sign bit and a zero")
        if not self.signed and self.has_subnormals:
            raise FpemuValueError(
                f"{where}: unsigned formats are supported only as scale formats "
                "with has_subnormals=False (like e8m0)"
            )
        if self.emax > 127 or self.emin - (M if self.has_subnormals else 0) < -149:
            raise FpemuValueError(
                f"{where}: values from 2**{self.emin - M} to 2**{self.emax} do not all fit "
                "float32 (2**-149 .. 2**127); choose another bias or exponent width"
            )
        if self.num_finite_positive < 1:
            raise FpemuValueError(f"{where}: the layout leaves no finite positive value")
        if self.canonical_nan is not None:
            c = self.canonical_nan
            if not isinstance(c, (int, np.integer)) or isinstance(c, (bool, np.bool_)):
                raise FpemuTypeError(
                    f"{where}: canonical_nan must be an int code (e.g. 0x7F), got "
                    f"{type(c).__name__} {c!r}; pass the code of the NaN pattern, or None"
                )
            c = int(c)
            object.__setattr__(self, "canonical_nan", c)
            nan_like = (
                self.nan_encoding == "ieee"
                and (c & (self.sign_code - 1)) >> M == 2**E - 1
                and c & (2**M - 1) != 0
            ) or (self.nan_encoding != "ieee" and c == self._layout_nan_code())
            if not (isinstance(c, int) and 0 <= c < 2**self.bits and nan_like):
                raise FpemuValueError(
                    f"{where}: canonical_nan={c!r} is not a NaN code of the layout")
        if self.default_overflow is None:
            if self.has_inf:
                default = "inf"
            elif self.nan_encoding == "fnuz":
                default = "nan"
            else:
                default = "saturate"
            object.__setattr__(self, "default_overflow", default)
        elif self.default_overflow not in OVERFLOW_NAMES:
            raise FpemuValueError(
                f"{where}: default_overflow must be one of {', '.join(OVERFLOW_NAMES)}, "
                f"got {self.default_overflow!r}"
            )
        if self.default_overflow == "inf" and not self.has_inf:
            raise FpemuValueError(
                f"{where} has no infinity, so it cannot default to overflow='inf'")
        if self.default_overflow == "nan" and not self.has_nan:
            raise FpemuValueError(f"{where} has no NaN, so it cannot default to overflow='nan'")

    # ----------------------------------------------------------------- layout
    @property
    def bits(self) -> int:
        """Total width of a code in bits."""
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def precision(self) -> int:
        """Significand precision p in bits, the implicit bit included."""
        return self.mantissa_bits + 1

    @property
    def has_inf(self) -> bool:
        return self.nan_encoding == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.nan_encoding != "none"

    @property
    def has_zero(self) -> bool:
        return self.has_subnormals

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.has_zero and self.nan_encoding != "fnuz"

    @property
    def code_dtype(self) -> np.dtype:
        """Unsigned integer dtype that holds one code."""
        for dt in (np.uint8, np.uint16, np.uint32):
            if self.bits <= np.dtype(dt).itemsize * 8:
                return np.dtype(dt)
        raise AssertionError("formats are at most 32 bits")  # excluded in __post_init__

    @property
    def sign_code(self) -> int:
        """The sign bit as a code (0 for unsigned formats)."""
        return (1 << (self.exponent_bits + self.mantissa_bits)) if self.signed else 0

    @property
    def max_code(self) -> int:
        """Code of the largest finite value (positive)."""
        E, M = self.exponent_bits, self.mantissa_bits
        if self.nan_encoding == "ieee":
            return ((2**E - 2) << M) | (2**M - 1)
        if self.nan_encoding == "fn":
            return 2 ** (E + M) - 2
        return 2 ** (E + M) - 1

    @property
    def inf_code(self) -> int | None:
        """Code of +inf, or None."""
        if not self.has_inf:
            return None
        return (2**self.exponent_bits - 1) << self.mantissa_bits

    @property
    def nan_code(self) -> int | None:
        """The canonical NaN code (positive where there is a choice), or None."""
        E, M = self.exponent_bits, self.mantissa_bits
        if self.canonical_nan is not None:
            return self.canonical_nan
        return {
            "ieee": ((2**E - 1) << M) | (1 << (M - 1)) if M else None,
            "fn": 2 ** (E + M) - 1,
            "fnuz": 1 << (E + M),
            "none": None,
        }[self.nan_encoding]

    def _layout_nan_code(self):
        E, M = self.exponent_bits, self.mantissa_bits
        return {"fn": 2 ** (E + M) - 1, "fnuz": 1 << (E + M)}.get(self.nan_encoding)

    @property
    def num_finite_positive(self) -> int:
        """How many finite codes are > 0."""
        return self.max_code + (0 if self.has_subnormals else 1)

    # ----------------------------------------------------------------- values
    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value."""
        return 1 - self.bias if self.has_subnormals else -self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value."""
        return (self.max_code >> self.mantissa_bits) - self.bias

    @functools.cached_property
    def max(self) -> float:
        """Largest finite value (computed once: every rounding asks for it)."""
        M = self.mantissa_bits
        frac = self.max_code & (2**M - 1)
        return float(Fraction(2**M + frac, 2**M) * Fraction(2) ** self.emax)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**emin."""
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (the smallest normal if there are no subnormals)."""
        return 2.0 ** (self.emin - self.mantissa_bits) if self.has_subnormals else 2.0**self.emin

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger value, 2**-mantissa_bits."""
        return 2.0**-self.mantissa_bits

    def __str__(self) -> str:
        return self.name

    @classmethod
    def custom(
        cls,
        exponent_bits: int,
        mantissa_bits: int,
        *,
        bias: int | None = None,
        nan_encoding: str = "ieee",
        signed: bool = True,
        has_subnormals: bool = True,
        default_overflow: str | None = None,
        name: str | None = None,
    ) -> "Format":
        """A format from its exponent and mantissa widths.

        Examples
        --------
        >>> Format.custom(4, 3, bias=11, nan_encoding="fnuz").max
        30.0
        """
        if name is None:
            suffix = {"fn": "fn", "fnuz": "fnuz", "none": "fn"}.get(nan_encoding, "")
            name = f"e{exponent_bits}m{mantissa_bits}{suffix}"
            if bias is not None and bias != 2 ** (exponent_bits - 1) - 1:
                name += f"_b{bias}"
        return cls(
            name,
            exponent_bits,
            mantissa_bits,
            bias,
            nan_encoding,
            signed,
            has_subnormals,
            default_overflow,
        )


# --------------------------------------------------------------- named formats
fp32 = Format("fp32", 8, 23, long_name="float32")
tf32 = Format("tf32", 8, 10, long_name="tensorfloat32")
fp16 = Format("fp16", 5, 10, long_name="float16")
bf16 = Format("bf16", 8, 7, long_name="bfloat16")
e4m3fn = Format("e4m3fn", 4, 3, nan_encoding="fn", long_name="float8_e4m3fn")
# PyTorch's e5m2 cast gives NaN as 0x7F (docs/pytorch-numerics.md §1.2).
e5m2 = Format("e5m2", 5, 2, long_name="float8_e5m2", canonical_nan=0x7F)
e4m3fnuz = Format("e4m3fnuz", 4, 3, bias=8, nan_encoding="fnuz", long_name="float8_e4m3fnuz")
e5m2fnuz = Format("e5m2fnuz", 5, 2, bias=16, nan_encoding="fnuz", long_name="float8_e5m2fnuz")
e4m3 = Format("e4m3", 4, 3, long_name="float8_e4m3")
e3m4 = Format("e3m4", 3, 4, long_name="float8_e3m4")
e2m3 = Format("e2m3", 2, 3, nan_encoding="none", long_name="float6_e2m3fn")
e3m2 = Format("e3m2", 3, 2, nan_encoding="none", long_name="float6_e3m2fn")
e2m1 = Format("e2m1", 2, 1, nan_encoding="none", long_name="float4_e2m1fn")
e8m0 = Format(
    "e8m0",
    8,
    0,
    nan_encoding="fn",
    signed=False,
    has_subnormals=False,
    default_overflow="nan",
    long_name="float8_e8m0fnu",
)

#: The named formats, narrowest-first within each family.
FORMATS = (fp32, tf32, fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e4m3, e3m4,
           e2m3, e3m2, e2m1, e8m0)

#: The public names: the class, the lookup, the table and each named format
#: under its name (``fpemu`` exports them all, so a format added to FORMATS
#: is ``fpemu.<name>`` too; ``tests/test_formats.py`` checks the names).
__all__ = ["Format", "FORMATS", "format", "format_names"] + [f.name for f in FORMATS]

_EXTRA_ALIASES = {
    "float": fp32,
    "single": fp32,
    "f32": fp32,
    "half": fp16,
    "f16": fp16,
    "tensorfloat32": tf32,
}

_REGISTRY = {f.name: f for f in FORMATS}
_REGISTRY.update({f.long_name: f for f in FORMATS})
_REGISTRY.update(_EXTRA_ALIASES)


def format_names() -> tuple:
    """All names and aliases :func:`format` accepts."""
    return tuple(_REGISTRY)


def format(name) -> Format:  # the public name the design asks for
    """Look a format up by name or alias; a :class:`Format` is returned as is.

    Examples
    --------
    >>> format("bfloat16") is format("bf16")
    True
    >>> format("half").max
    65504.0
    """
    if isinstance(name, Format):
        return name
    if isinstance(name, str):
        key = name.strip().lower()
        if key in _REGISTRY:
            return _REGISTRY[key]
        raise FpemuValueError(
            f"unknown format {name!r}; valid names are: {', '.join(format_names())} "
            "(or build one with Format.custom(exponent_bits, mantissa_bits))"
        )
    raise FpemuTypeError(
        f"fmt must be a format name (str) or a fpemu.Format, got {type(name).__name__} "
        f"{name!r}"
    )
