"""Rounding of float32 input in int32 lanes: :mod:`fpemu._elemround` in Numba.

:data:`elements` is the element rounding of :mod:`fpemu._elemround`, its
primitives bound to Numba's scalars (one element per call, which LLVM
vectorises across a loop): ``where`` a conditional expression, the shifts
LLVM's 32-bit ones (:func:`fpemu._jit.shl32`), ``i32`` ``np.int32``. Numba
types a Python int as int64 and int32 arithmetic as int64; ``i32`` wraps
each int32 result back, and ``where``, ``minimum`` and ``maximum`` return
int32 where one operand is int32, so that LLVM keeps every lane 32 bits
wide: 16 lanes per AVX-512 vector, where int64 code fits 8. Only stochastic
rounding reaches 64 bits, for its draw (:mod:`fpemu._kernels.draws`), so the
bits do not depend on the input's width. ``tests/test_fast_paths.py`` checks
these functions against the float64-input ones (:mod:`fpemu._kernels.round64`),
bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from .. import _elemround
from .._jit import ashr32, f32_bits, f32_from_ubits, jit, shl32
from .draws import _random63


def _where(c, a, b):
    """``a if c else b`` (a Numba overload: int32 if ``a`` or ``b`` is)."""
    return a if c else b


def _minimum(a, b):
    """``min(a, b)`` (a Numba overload: int32 if ``a`` or ``b`` is)."""
    return min(a, b)


def _maximum(a, b):
    """``max(a, b)`` (a Numba overload: int32 if ``a`` or ``b`` is)."""
    return max(a, b)


def _int32_if_either(a, b):
    """Whether an overload of two integers returns int32: where one of them
    is int32 and the other an int32 or a Python int (typed int64)."""
    return a == types.int32 or b == types.int32


@overload(_where)
def _where_numba(c, a, b):
    if _int32_if_either(a, b):
        return lambda c, a, b: np.int32(a) if c else np.int32(b)
    return lambda c, a, b: a if c else b


@overload(_minimum)
def _minimum_numba(a, b):
    if _int32_if_either(a, b):
        return lambda a, b: np.int32(min(np.int32(a), np.int32(b)))
    return lambda a, b: min(a, b)


@overload(_maximum)
def _maximum_numba(a, b):
    if _int32_if_either(a, b):
        return lambda a, b: np.int32(max(np.int32(a), np.int32(b)))
    return lambda a, b: max(a, b)


@jit
def _shl(a, s):
    return shl32(np.int32(a), np.int32(s))


@jit
def _ashr(a, s):
    return ashr32(np.int32(a), np.int32(s))


@jit
def _lnot(b):
    return not b


@jit
def _float_bits(n):
    return f32_bits(np.float32(n))


#: :mod:`fpemu._elemround` on Numba's scalars, each function compiled by
#: :func:`fpemu._jit.jit` (its cache entries belong to the cache unit of
#: :mod:`fpemu._kernels`).
elements = _elemround.bind("fpemu._kernels.elements", dict(
    where=_where, minimum=_minimum, maximum=_maximum, i32=np.int32, i64=np.int64, shl=_shl,
    ashr=_ashr, lnot=_lnot, float_bits=_float_bits, draw63=_random63), wrap=jit)


@jit
def _rounded32(u, mode, p, flags, key, index):
    """(magnitude code, negative, nan) of the float32 with bits ``u`` (int32
    or uint32) rounded to the format of ``p``."""
    return elements.rounded(np.int32(u), np.int32(p[0]), np.int32(p[1]), np.int32(p[2]),
                            np.int32(p[3]), np.int32(p[4]), np.int32(p[5]), flags, mode, key,
                            index)


@jit
def _encode32(u, mode, p, flags, key, index):
    """The code (int32) of the float32 with bits ``u``."""
    mag, negative, nan = _rounded32(u, mode, p, flags, key, index)
    return elements.code(mag, negative, nan, np.int32(p[7]), np.int32(p[6]))


@jit
def _value32(mag, negative, nan, p, flags):
    """The float32 of magnitude code ``mag`` (int32), its sign and NaN flag."""
    return f32_from_ubits(np.uint32(elements.value_bits(mag, negative, nan, np.int32(p[0]),
                                                        np.int32(p[1]), np.int32(p[3]),
                                                        np.int32(p[5]), flags)))


@jit
def _quantize32(u, mode, p, flags, key, index):
    """The rounded value (float32) of the float32 with bits ``u``."""
    mag, negative, nan = _rounded32(u, mode, p, flags, key, index)
    return _value32(mag, negative, nan, p, flags)


@jit
def _decode32(code, p, flags):
    """The float32 value of a valid code of the format of ``p``."""
    mag, negative, nan = elements.decoded(np.int32(code), np.int32(p[0]), np.int32(p[1]),
                                          np.int32(p[3]), np.int32(p[4]), np.int32(p[5]),
                                          np.int32(p[7]), flags)
    return _value32(mag, negative, nan, p, flags)
