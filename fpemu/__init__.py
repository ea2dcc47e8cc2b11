"""fpemu: bit-exact emulation of low-precision floating point.

>>> import fpemu
>>> float(fpemu.quantize(0.1, "bf16"))
0.10009765625
"""

from .formats import (
    FORMATS,
    Format,
    bf16,
    e2m1,
    e2m3,
    e3m2,
    e3m4,
    e4m3,
    e4m3fn,
    e4m3fnuz,
    e5m2,
    e5m2fnuz,
    e8m0,
    format,
    format_names,
    fp16,
    fp32,
    tf32,
)
from . import accumulate
from .arith import add, div, fma, mul, sqrt, sub
from .explain import explain
from .stats import stats
from .quantize import CLASSES, classify, decode, encode, next_down, next_up, quantize, ulp
from .rounding import Overflow, Rounding

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "Format", "format", "format_names", "Rounding", "Overflow", "CLASSES",
    "quantize", "encode", "decode", "next_up", "next_down", "ulp", "classify",
    "fp32", "tf32", "fp16", "bf16", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3",
    "e3m4", "e2m3", "e3m2", "e2m1", "e8m0",
    "add", "sub", "mul", "div", "sqrt", "fma", "accumulate", "explain", "stats",
]
