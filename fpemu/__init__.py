"""fpemu: bit-exact emulation of low-precision floating point.

>>> import fpemu
>>> float(fpemu.quantize(0.1, "bf16"))
0.10009765625
"""

from . import formats as _formats
from .formats import *  # noqa: F401,F403  (the class, the lookup and every named format)
from .rounding import Overflow, Rounding

# Everything below needs Numba. Where Numba is missing (a bare GPU machine
# running ``fpemu record``, which needs only NumPy and PyTorch) the package still
# imports, and these names fail with Numba's ImportError when first used.
_LAZY = {
    "accumulate": (".accumulate", None),
    "add": (".arith", "add"), "sub": (".arith", "sub"), "mul": (".arith", "mul"),
    "div": (".arith", "div"), "sqrt": (".arith", "sqrt"), "fma": (".arith", "fma"),
    "explain": (".explain", None), "stats": (".stats", None),
    "CLASSES": (".quantize", "CLASSES"), "classify": (".quantize", "classify"),
    "decode": (".quantize", "decode"), "encode": (".quantize", "encode"),
    "next_down": (".quantize", "next_down"), "next_up": (".quantize", "next_up"),
    "quantize": (".quantize", "quantize"), "ulp": (".quantize", "ulp"),
    "Cast": (".quantize", "Cast"),
}

try:
    import numba as _numba  # noqa: F401
except ImportError:
    def __getattr__(name):
        entry = _LAZY.get(name)
        if entry is None:
            raise AttributeError(f"module 'fpemu' has no attribute {name!r}")
        import importlib  # only on this path without Numba
        module = importlib.import_module(entry[0], __name__)
        return module if entry[1] is None else getattr(module, entry[1])
else:
    from . import accumulate  # noqa: F401
    from .arith import add, div, fma, mul, sqrt, sub  # noqa: F401
    # explain and stats are modules that can be called as their main function:
    # fpemu.explain(0.1, "bf16") and fpemu.explain.values("e2m1") both work
    from . import explain, stats  # noqa: F401
    from .quantize import (  # noqa: F401
        CLASSES, Cast, classify, decode, encode, next_down, next_up, quantize, ulp,
    )
    del _numba

__version__ = "0.1.0"

__all__ = list(_formats.__all__) + [
    "Rounding", "Overflow", "CLASSES",
    "quantize", "encode", "decode", "next_up", "next_down", "ulp", "classify", "Cast",
    "add", "sub", "mul", "div", "sqrt", "fma", "accumulate", "explain", "stats",
]
