"""The element-wise loops of quantize, encode and decode.

Output order. The loops visit blocks of :data:`LANES` elements from the last
block down to the first (each block in ascending order, which LLVM
vectorises as one vector), then the tail. A freshly allocated output
(``quantize(x, f)`` without ``out=``) is not yet backed by memory: its first
write takes a page fault, and for an array of 4 MB or more (numpy asks for
transparent huge pages) the kernel zeroes a whole 2 MB page there. Writing
2**24 float32 values into such memory in ascending order took 2.4x the time
of the same loop on touched memory on this project's test machine (AMD EPYC,
Linux 6.18), and 1.3x in descending order (``bench/first_touch.py``); C
showed the same (``docs/performance.md``). Every element is still computed
on its own, so the order changes no bit; stochastic rounding draws by
element index.

Each factory below returns a parallel loop whose closure holds only ints
(the rounding mode, and the flags or -1: constants to the compiler), and which
reaches its helpers as module globals. Numba's on-disk cache keys a closure
by the pickle of its cells: a cell holding a dispatcher pickles differently
in every process, so such a kernel would never hit the cache (every process
recompiled it and added another file). ``tests/test_cache.py`` checks that a
second process loads every kernel from the cache.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from .._jit import f32_bits, pjit
from .round32 import _decode32, _encode32, _quantize32
from .round64 import _encode_one, _quantize_one, _split_f64

#: elements per block of the element-wise loops (see "Output order")
LANES = 16


def _encode_f4(mode, flags):
    @pjit
    def encode_f4(x, out, p, key, offset, flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES               # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _encode32(f32_bits(xs[j]), mode, p, fl, key, offset + i0 + j)
        for i in range(nb * LANES, n):
            out[i] = _encode32(f32_bits(x[i]), mode, p, fl, key, offset + i)

    return encode_f4


def _quantize_f4(mode, flags):
    @pjit
    def quantize_f4(x, out, p, key, offset, flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES               # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _quantize32(f32_bits(xs[j]), mode, p, fl, key, offset + i0 + j)
        for i in range(nb * LANES, n):
            out[i] = _quantize32(f32_bits(x[i]), mode, p, fl, key, offset + i)

    return quantize_f4


def _encode_f8(mode, flags):
    @pjit
    def encode_f8(x, out, p, key, offset, flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES               # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                neg, e, sig, special, frac_nz = _split_f64(xs[j], fl)
                o[j] = _encode_one(neg, e, sig, special, frac_nz, 52, mode, p, fl, key,
                                   offset + i0 + j)
        for i in range(nb * LANES, n):
            neg, e, sig, special, frac_nz = _split_f64(x[i], fl)
            out[i] = _encode_one(neg, e, sig, special, frac_nz, 52, mode, p, fl, key,
                                 offset + i)

    return encode_f8


def _quantize_f8(mode, flags):
    @pjit
    def quantize_f8(x, out, p, key, offset, flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES               # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                neg, e, sig, special, frac_nz = _split_f64(xs[j], fl)
                o[j] = np.float32(_quantize_one(neg, e, sig, special, frac_nz, 52, mode, p,
                                                fl, key, offset + i0 + j))
        for i in range(nb * LANES, n):
            neg, e, sig, special, frac_nz = _split_f64(x[i], fl)
            out[i] = np.float32(_quantize_one(neg, e, sig, special, frac_nz, 52, mode, p, fl,
                                              key, offset + i))

    return quantize_f8


_FACTORIES = {("encode", "f4"): _encode_f4, ("quantize", "f4"): _quantize_f4,
              ("encode", "f8"): _encode_f8, ("quantize", "f8"): _quantize_f8}


@functools.lru_cache(maxsize=None)
def rounding_kernel(op, in_dtype, mode, flags):
    """The parallel loop for ``op`` ("quantize" or "encode") on float32 or
    float64 input (``in_dtype`` "f4" / "f8") and one rounding mode, called as
    ``kernel(x, out, p, key, offset, flags)``; float32 input runs the 32-bit
    kernels.

    ``flags`` >= 0 compiles a loop for those flags alone (the constant folds
    into lean code that LLVM vectorises); ``flags`` = -1 compiles one loop
    for every set of flags, which reads them at run time: about 15 % slower
    for codes and 40 % for values, but compiled once per mode instead of once
    per set of flags (each compilation takes about half a second).
    :func:`fpemu.quantize` specialises the flags of the named formats'
    defaults. (Passing ``mode`` and ``flags`` as ``numba.literally``
    arguments instead made the parallel loop twice as slow.)
    """
    return _FACTORIES[(op, in_dtype)](int(mode), int(flags))


#   code:  [sign] | exponent field | mantissa      (no sign bit with UNSIGNED)
@functools.lru_cache(maxsize=None)
def decode_kernel(flags):
    """The parallel loop ``kernel(codes, out, p)``: out[i] = value of codes[i]."""

    @pjit
    def decode(codes, out, p):
        n = codes.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES               # descending (see "Output order")
            xs = codes[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _decode32(xs[j], p, flags)
        for i in range(nb * LANES, n):
            out[i] = _decode32(codes[i], p, flags)

    return decode
