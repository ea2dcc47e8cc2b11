"""Numbers as text, one way each, for every place fpemu prints one (the
CLI, explanations, tables, the lessons, experiment results and the report),
and the colours of a code's bit fields.

Every function takes a real number (a Python or numpy float) and writes
NaN as ``nan`` (or what ``nan=`` says), infinities as ``inf`` / ``-inf`` and
keeps the sign of zero.

>>> from fpemu import numtext
>>> numtext.shortest(0.1), numtext.cell(2.0**-24), numtext.readable(-0.0)
('0.1', '5.96e-08', '-0')
>>> numtext.float32_text(0.1), numtext.float32_text(3.0), numtext.summary([1 / 3, float("inf")])
('0.1', '3', '[0.333333, inf]')
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["shortest", "cell", "readable", "float32_text", "summary", "FIELD_COLORS",
           "FIELD_TINTS"]

#: The colours of a code's sign, exponent and mantissa bits in figures.
FIELD_COLORS = {"sign": "#bd1f01", "exponent": "#3f90da", "mantissa": "#ffa90e"}


def _tint(hex_color, keep=0.3):
    """``hex_color`` mixed with white (``keep`` of the colour): a background
    that black text reads well on."""
    rgb = [int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - c) * keep):02x}" for c in rgb)


#: The same hues, light, as backgrounds of the bits in HTML tables and widgets.
FIELD_TINTS = {k: _tint(v) for k, v in FIELD_COLORS.items()}


def _special(v, nan="nan"):
    """The text of NaN, an infinity or a zero, else None."""
    if v != v:
        return nan
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return None


def shortest(v) -> str:
    """The shortest decimal that reads back as this float64 (``repr``)."""
    v = float(v)
    if v != v or math.isinf(v):
        return _special(v)
    return repr(v)


def cell(v, digits: int = 4, nan: str = "nan") -> str:
    """A value in a table cell: ``digits`` significant digits."""
    v = float(v)
    return _special(v, nan) or f"{v:.{digits}g}"


def readable(v) -> str:
    """A value as a person reads it: the shortest repr between 1e-5 and 1e7,
    six significant digits outside."""
    v = float(v)
    return _special(v) or (repr(v) if 1e-5 <= abs(v) < 1e7 else f"{v:.6g}")


def float32_text(v) -> str:
    """An integer as an integer (below 1e7), anything else as the shortest
    decimal that reads back as its float32."""
    v = float(v)
    text = _special(v)
    if text is not None:
        return text
    if v == int(v) and abs(v) < 1e7:
        return str(int(v))
    return str(np.float32(v))


def summary(v) -> str:
    """A result value in a summary: floats to six digits, lists of them,
    anything else as ``str``."""
    if isinstance(v, float):
        if v != v or math.isinf(v):
            return str(v)
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(summary(x) for x in v) + "]"
    return str(v)
