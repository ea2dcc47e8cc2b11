"""Numba kernels: rounding on integer bit patterns.

Contract shared by every kernel here: 1-D contiguous arrays and integers in,
arrays out; no Python objects; no exceptions (the callers in
:mod:`fpemu.quantize` check the input first). A format reaches a kernel as the
tuple ``p`` and the int ``flags`` of a :class:`fpemu.quantize.Cast`
(``Cast.params``, ``Cast.flags``)::

    p[0]  M        mantissa bits              p[4]  maxmag   code of max (no sign)
    p[1]  emin     exponent of min normal     p[5]  infmag   code of inf, or -1
    p[2]  emax     exponent of max            p[6]  nancode  canonical NaN code
    p[3]  bias                                 p[7]  sign_shift  E + M

    flags: bits 0-1 overflow policy (0 inf, 1 saturate, 2 nan), then one bit
    each for FLUSH (subnormal results -> 0), FNUZ (no -0; NaN there),
    UNSIGNED (no sign bit), NO_ZERO (field 0 is a normal binade: e8m0) and
    NORMALIZE (binades below 2**-126: normalise float32 subnormal inputs).

``mode`` and ``flags`` are compile-time constants: :func:`rounding_kernel`
builds one loop per combination, which LLVM vectorises.

Rounding model. A finite input is ``sig * 2**(e - in_m)`` with an integer
significand ``sig < 2**(in_m + 1)`` read from the float32 (in_m = 23) or
float64 (in_m = 52) bits. On the target grid the quantum at exponent ``e`` is
``2**(max(e, emin) - M)``, so the input drops ``shift`` low bits::

    sig:  1 xxxxxxxx xxxx | r ssssssss      kept = sig >> shift
          \\ kept (M+1) /   \\  rem  /       rem  = the dropped bits

``kept`` is incremented or not according to the mode and ``rem``. The code of
the result is then ``((max(e, emin) + bias - 1) << M) + kept``: a carry out of
the significand moves into the exponent field by itself, and a subnormal
result (``kept < 2**M``) lands in exponent field 0. One rounding, from the
exact input, in integers; ``quantize`` then builds the float32 value exactly,
as an integer significand times a power of two.

Output order. The element-wise loops visit blocks of :data:`LANES` elements
from the last block down to the first (each block in ascending order, which
LLVM vectorises as one vector), then the tail. A freshly allocated output
(``quantize(x, f)`` without ``out=``) is not yet backed by memory: its first
write takes a page fault, and for an array of 4 MB or more (numpy asks for
transparent huge pages) the kernel zeroes a whole 2 MB page there. Writing
2**24 float32 values into such memory in ascending order took 2.4x the time
of the same loop on touched memory on this project's test machine (AMD EPYC,
Linux 6.18), and 1.3x in descending order (``bench/first_touch.py``); C
showed the same (``docs/performance.md``). Every element is still computed
on its own, so the order changes no bit; stochastic rounding draws by
element index.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import leading_zeros

from ._jit import (ashr32, clz32, f32_from_ubits, f32_ubits, f64_bits, f64_from_bits, jit,
                   lshr32, pjit, shl32)

RNE, RNA, RTZ, RUP, RDN, RTO, SR = range(7)
#: the kernels' mode number of stochastic rounding drawing from Philox4x32-10
#: (``rng="philox"``); SR draws from splitmix64. Every mode test below treats
#: both as "the other mode" (the last branch), so only the draw differs.
SR_PHILOX = 7
OVF_INF, OVF_SATURATE, OVF_NAN = range(3)
POLICY_MASK, FLUSH, FNUZ, UNSIGNED, NO_ZERO, NORMALIZE = 3, 4, 8, 16, 32, 64

#: elements per block of the element-wise loops (see "Output order")
LANES = 16

# splitmix64 constants (Steele, Lea, Flood 2014): the counter-based generator
# behind stochastic rounding. Element i of a call gets the bits
# splitmix64(key + (offset + i + 1) * GOLDEN), whatever thread computes it.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S1 = np.uint64(1)
_S27 = np.uint64(27)
_S30 = np.uint64(30)
_S31 = np.uint64(31)


@jit
def _splitmix63(key, index):
    """63 uniform random bits for element ``index`` under ``key`` (splitmix64)."""
    z = np.uint64(key) + np.uint64(index + 1) * _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return np.int64(z >> _S1)


# Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
# easy as 1, 2, 3", SC 2011; cuRAND's and PyTorch CUDA's generator): ten
# rounds of two 32 x 32 -> 64-bit products over a 128-bit counter, the 64-bit
# key bumped by the Weyl constants between rounds. Element i of a call takes
# the block of counter (offset + i, 0) under the seed's 64-bit key: its first
# two words make the draw.
_PH_M0 = np.uint64(0xD2511F53)
_PH_M1 = np.uint64(0xCD9E8D57)
_PH_W0 = np.uint64(0x9E3779B9)
_PH_W1 = np.uint64(0xBB67AE85)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four 32-bit output words (uint64) of Philox4x32-10 for counter
    words ``c0..c3`` and key words ``k0, k1`` (each below 2**32)."""
    c0, c1, c2, c3 = np.uint64(c0), np.uint64(c1), np.uint64(c2), np.uint64(c3)
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = _PH_M0 * c0
        p1 = _PH_M1 * c2
        c0, c1, c2, c3 = (((p1 >> _S32) ^ c1 ^ k0) & _M32, p1 & _M32,
                          ((p0 >> _S32) ^ c3 ^ k1) & _M32, p0 & _M32)
        k0 = (k0 + _PH_W0) & _M32
        k1 = (k1 + _PH_W1) & _M32
    return c0, c1, c2, c3


@jit
def _philox63(key, index):
    """63 uniform random bits for element ``index`` under ``key``: the top 63
    bits of Philox4x32-10's first two words (word 1 high)."""
    k = np.uint64(key)
    i = np.uint64(index)
    w0, w1, _, _ = philox4x32(i & _M32, i >> _S32, 0, 0, k & _M32, k >> _S32)
    return np.int64(((w1 << _S32) | w0) >> _S1)


@jit
def _random63(key, index, mode):
    """63 uniform random bits for element ``index`` under ``key``, from the
    generator of ``mode`` (SR: splitmix64, SR_PHILOX: Philox4x32-10)."""
    if mode == SR_PHILOX:
        return _philox63(key, index)
    return _splitmix63(key, index)


@pjit
def random63_kernel(key, offset, mode, out):
    """``out[i]`` = the 63-bit draw of element ``offset + i`` under ``key``
    from the generator of ``mode`` (SR or SR_PHILOX)."""
    for i in prange(out.size):
        out[i] = _random63(key, offset + i, mode)


# ----------------------------------------------------------------- input split
#   float64:  s | eeeeeeeeeee | ffff...(52)...ffff
@jit
def _split_f64(x, flags):
    """(negative, e, sig, special, fraction != 0) of a float64.

    float64 subnormals lie far below every format's smallest value, so they
    are never normalised (``flags`` is unused: the float32 input path,
    :func:`_split32`, normalises float32 subnormals under NORMALIZE).
    """
    b = f64_bits(x)
    ef = (b >> 52) & 0x7FF
    fr = b & 0xFFFFFFFFFFFFF
    sig = fr | (np.int64(ef != 0) << 52)
    return b < 0, max(ef, 1) - 1023, sig, ef == 0x7FF, fr != 0


# ---------------------------------------------------------------- the rounding
@jit
def _round(neg, e, sig, in_m, mode, p, key, index):
    """Round ``±sig * 2**(e - in_m)`` to the grid of ``p``.

    Returns ``(mag, ovf, ovf_to_inf)``: the magnitude code of the result
    unless ``ovf`` (it exceeds max), in which case IEEE 754 §7.4 sends it to
    infinity when ``ovf_to_inf`` and to max otherwise.
    """
    M = p[0]
    emin = p[1]
    emax = p[2]
    shift = (in_m - M) + max(emin - e, 0)
    s = min(shift, 62)  # sig < 2**53: any shift >= 54 drops everything
    one = np.int64(1)
    kept = sig >> s
    rem = sig & ((one << s) - 1)
    half = (one << s) >> 1
    inexact = rem != 0
    if mode == RNE:
        inc = (rem > half) | ((rem == half) & inexact & ((kept & 1) != 0))
    elif mode == RNA:
        inc = (rem >= half) & inexact
    elif mode == RTZ:
        inc = False
    elif mode == RUP:
        inc = inexact & (not neg)
    elif mode == RDN:
        inc = inexact & neg
    elif mode == RTO:
        inc = inexact & ((kept & 1) == 0)
    else:
        # Up with probability rem / 2**shift, read as a 63-bit threshold.
        up = rem << (63 - min(shift, 63))
        down = rem >> min(max(shift - 63, 0), 63)
        threshold = up if shift <= 63 else down
        inc = _random63(key, index, mode) < threshold
    kept = kept + np.int64(inc)
    q = min(max(e, emin), emax)
    mag = ((q + p[3] - 1) << M) + kept
    ovf = (e > emax) | (mag > p[4])
    # IEEE 754 §7.4: the directed modes overflow to infinity only outward.
    if mode == RTZ or mode == RTO:
        to_inf = False
    elif mode == RUP:
        to_inf = not neg
    elif mode == RDN:
        to_inf = neg
    else:
        to_inf = True
    return mag, ovf, ovf & to_inf


@jit
def _finish(neg, mag, ovf, ovf_to_inf, zero_in, special, nan_in, p, flags):
    """Apply overflow, the overflow policy, flushing and the sign rules.

    Returns ``(mag, negative, nan)``: the final magnitude code, whether the
    result carries a minus sign, and whether it is NaN.
    """
    maxmag = p[4]
    policy = flags & POLICY_MASK
    to_policy = ovf_to_inf | (special & (not nan_in))  # overflow to inf, or ±inf input
    mag = maxmag if ovf else mag
    if policy == OVF_INF:
        mag = p[5] if to_policy else mag
    else:
        mag = maxmag if to_policy else mag
    if flags & FLUSH:  # flush subnormal results (after rounding) to zero
        mag = 0 if mag < (np.int64(1) << p[0]) else mag
    if flags & NO_ZERO:  # below the smallest value gives the smallest
        mag = max(mag, 0)
    nan = special & nan_in
    if policy == OVF_NAN:
        nan = nan | to_policy
    if flags & UNSIGNED:  # zero and negative numbers are NaN
        nan = nan | neg | zero_in
    if flags & FNUZ:  # no -0
        negative = neg & (mag != 0)
    else:
        negative = neg
    return mag, negative, nan


@jit
def _mag_value(mag, negative, nan, p, flags):
    """The float64 value of magnitude code ``mag`` (and sign, NaN flag)."""
    M = p[0]
    field = mag >> M
    frac = mag & ((np.int64(1) << M) - 1)
    if flags & NO_ZERO:
        sig = frac | (np.int64(1) << M)
        ex = field - p[3] - M
    else:
        sig = frac | (np.int64(field != 0) << M)
        ex = max(field, 1) - p[3] - M
    v = np.float64(sig) * f64_from_bits((ex + 1023) << 52)
    v = np.inf if mag == p[5] else v
    v = -v if negative else v
    return np.nan if nan else v


@jit
def _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    """(magnitude code, negative, nan) of one input rounded to the format."""
    mag, ovf, ovf_inf = _round(neg, e, sig, in_m, mode, p, key, index)
    zero_in = (sig == 0) & (not special)
    return _finish(neg, mag, ovf, ovf_inf, zero_in, special, frac_nz, p, flags)


@jit
def _encode_one(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    mag, negative, nan = _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index)
    code = mag | (np.int64(negative) << p[7])
    return p[6] if nan else code


@jit
def _quantize_one(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    mag, negative, nan = _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index)
    return _mag_value(mag, negative, nan, p, flags)


# ------------------------------------------- float32 input, in 32-bit lanes
#
# The same rounding for float32 input, written so that every integer stays 32
# bits wide (each result wrapped in np.int32 / np.uint32, constants typed):
# LLVM then packs 8 lanes per AVX2 vector and 16 per AVX-512 vector, where the
# int64 code above fits 4 and 8. The significand is below 2**24, so a shift
# clamped to 30 drops exactly what the int64 code drops (any shift >= 25
# drops everything, and half of 2**30 is still positive in int32). Only
# stochastic rounding reaches 64 bits, for its random draw, which stays the
# splitmix64 of :func:`_random63`: the bits do not depend on the input's
# width. ``tests/test_fast_paths.py`` checks these
# kernels against the float64-input kernels above, bit for bit.
_I0 = np.int32(0)
_I1 = np.int32(1)
_U0 = np.uint32(0)
_U1 = np.uint32(1)


@jit
def _pow2_f32(k):
    """2.0**k as float32 for k in -149..127 (a subnormal below -126)."""
    normal = np.uint32(shl32(np.int32(max(k, np.int32(-126)) + np.int32(127)), np.int32(23)))
    sub = np.uint32(shl32(_I1, min(max(np.int32(k + np.int32(149)), _I0), np.int32(22))))
    return f32_from_ubits(normal if k >= np.int32(-126) else sub)


@jit
def _split32(u, flags):
    """(negative, e, sig, special, fraction != 0) of the float32 with bits
    ``u``: its value is ``sig * 2**(e - 23)`` with ``sig`` an int32 below
    2**24. Subnormals are normalised (``sig`` shifted up to bit 23, ``e``
    below -126) under NORMALIZE: formats such as e8m0 have binades below
    float32's normal range."""
    neg = (u >> np.uint32(31)) != np.uint32(0)
    a = u & np.uint32(0x7FFFFFFF)
    ef = np.int32(a >> np.uint32(23))
    fr = np.int32(a & np.uint32(0x7FFFFF))
    special = ef == np.int32(255)
    frac_nz = fr != _I0
    sig = np.int32(fr | shl32(np.int32(ef != _I0), np.int32(23)))
    e = np.int32(max(ef, _I1) - np.int32(127))
    if flags & NORMALIZE:
        lz = np.int32(min(np.int32(clz32(sig) - np.int32(8)), np.int32(23)))
        e = np.int32(e - lz)
        sig = shl32(sig, lz)
    return neg, e, sig, special, frac_nz


@jit
def _round32(neg, e, sig, special, frac_nz, mode, p, flags, key, index):
    """:func:`_round` and :func:`_finish` of ``±sig * 2**(e - 23)`` (int32
    ``e`` and ``sig`` < 2**24, as :func:`_split32` gives them), in int32
    arithmetic: (magnitude code, negative, nan)."""
    M = np.int32(p[0])
    emin = np.int32(p[1])
    emax = np.int32(p[2])
    shift = np.int32(np.int32(23) - M + max(np.int32(emin - e), _I0))
    s = np.int32(min(shift, np.int32(30)))
    kept = ashr32(sig, s)
    rem = np.int32(sig & np.int32(shl32(_I1, s) - _I1))
    half = ashr32(shl32(_I1, s), _I1)
    inexact = rem != _I0
    if mode == RNE:
        # add half an ulp, less one unless the kept lowest bit is odd (ties
        # to even), and drop the low bits: the carry is the increment
        up = np.int32(half - _I1 + np.int32(kept & _I1)) if s > _I0 else _I0
        kept = ashr32(np.int32(sig + up), s)
    elif mode == RNA:
        kept = ashr32(np.int32(sig + half), s)
    else:
        if mode == RTZ:
            inc = False
        elif mode == RUP:
            inc = inexact & (not neg)
        elif mode == RDN:
            inc = inexact & neg
        elif mode == RTO:
            inc = inexact & ((kept & _I1) == _I0)
        else:
            # up with probability rem / 2**shift, read as a 63-bit threshold
            sh = np.int64(shift)
            r64 = np.int64(rem)
            up64 = r64 << (63 - min(sh, 63))
            down64 = r64 >> min(max(sh - 63, 0), 63)
            threshold = up64 if sh <= 63 else down64
            inc = _random63(key, index, mode) < threshold
        kept = np.int32(kept + np.int32(inc))
    q = np.int32(min(max(e, emin), emax))
    mag = np.int32(shl32(np.int32(q + np.int32(p[3]) - _I1), M) + kept)
    maxmag = np.int32(p[4])
    ovf = (e > emax) | (mag > maxmag)
    if mode == RTZ or mode == RTO:
        to_inf = False
    elif mode == RUP:
        to_inf = not neg
    elif mode == RDN:
        to_inf = neg
    else:
        to_inf = True
    ovf_to_inf = ovf & to_inf
    # _finish, in int32
    policy = flags & POLICY_MASK
    to_policy = ovf_to_inf | (special & (not frac_nz))
    mag = maxmag if ovf else mag
    if policy == OVF_INF:
        mag = np.int32(p[5]) if to_policy else mag
    else:
        mag = maxmag if to_policy else mag
    if flags & FLUSH:
        mag = _I0 if mag < shl32(_I1, M) else mag
    if flags & NO_ZERO:
        mag = max(mag, _I0)
    nan = special & frac_nz
    if policy == OVF_NAN:
        nan = nan | to_policy
    if flags & UNSIGNED:
        nan = nan | neg | ((sig == _I0) & (not special))
    if flags & FNUZ:
        negative = neg & (mag != _I0)
    else:
        negative = neg
    return mag, negative, nan


@jit
def _rounded32(u, mode, p, flags, key, index):
    """(magnitude code, negative, nan) of the float32 with bits ``u`` rounded
    to the format: :func:`_split32`, then :func:`_round32`."""
    neg, e, sig, special, frac_nz = _split32(u, flags)
    return _round32(neg, e, sig, special, frac_nz, mode, p, flags, key, index)


@jit
def _encode32(u, mode, p, flags, key, index):
    """The code of the float32 with bits ``u`` (uint32)."""
    mag, negative, nan = _rounded32(u, mode, p, flags, key, index)
    code = np.uint32(mag | shl32(np.int32(negative), np.int32(p[7])))
    return np.uint32(p[6]) if nan else code


@jit
def _value32(mag, negative, nan, p, flags):
    """The float32 value of magnitude code ``mag``.

    Where the format's normal binades are float32 normals (emin >= -126:
    every format but e8m0 and some custom ones), a normal code's float32 bits
    are the code shifted into place plus the difference of the biases, and a
    subnormal code is the integer ``mag`` times the subnormal step, one exact
    product. Otherwise the integer significand is converted exactly and
    multiplied by 2**ex in one or two exact products (two when 2**ex is below
    float32's range; every value of a format fits float32).
    """
    M = np.int32(p[0])
    emin = np.int32(p[1])
    bias = np.int32(p[3])
    if (emin >= np.int32(-126)) and not (flags & NO_ZERO):
        normal = np.uint32(shl32(mag, np.int32(np.int32(23) - M))
                           + shl32(np.int32(np.int32(127) - bias), np.int32(23)))
        # a subnormal code: mag * 2**k, k = emin - M, from bits, not a product:
        # where 2**k is itself a float32 subnormal (bf16, tf32, fp32) a product
        # takes the CPU's slow subnormal path on every element (7x the time)
        k = np.int32(emin - M)
        fb = f32_ubits(np.float32(mag))                 # exact: mag < 2**24
        top = np.int32(np.int32(fb >> np.uint32(23)) + k)
        if top >= _I1:
            sub = np.uint32(np.int32(fb) + shl32(k, np.int32(23)))
        else:                                           # a float32 subnormal: 2**-149 units
            sub = np.uint32(shl32(mag, np.int32(min(max(k + np.int32(149), _I0), np.int32(31)))))
        sub = np.uint32(0) if mag == _I0 else sub
        bits = sub if mag < shl32(_I1, M) else normal
    else:
        field = ashr32(mag, M)
        frac = np.int32(mag & np.int32(shl32(_I1, M) - _I1))
        if flags & NO_ZERO:
            sig = np.int32(frac | shl32(_I1, M))
            ex = np.int32(field - bias - M)
        else:
            sig = np.int32(frac | shl32(np.int32(field != _I0), M))
            ex = np.int32(max(field, _I1) - bias - M)
        low = ex < np.int32(-100)
        v = np.float32(sig) * _pow2_f32(np.int32(ex + np.int32(24)) if low else ex)
        bits = f32_ubits(v * _pow2_f32(np.int32(-24) if low else _I0))
    bits = np.uint32(0x7F800000) if mag == np.int32(p[5]) else bits
    bits = np.uint32(bits | np.uint32(np.uint32(negative) << np.uint32(31)))
    return f32_from_ubits(np.uint32(0x7FC00000) if nan else bits)


@jit
def _quantize32(u, mode, p, flags, key, index):
    """The rounded value (float32) of the float32 with bits ``u``."""
    mag, negative, nan = _rounded32(u, mode, p, flags, key, index)
    return _value32(mag, negative, nan, p, flags)


# --------------------------------------------------------------- array kernels
#
# Each factory below returns a parallel loop whose closure holds only ints
# (the rounding mode, and the flags or -1: constants to the compiler), and which
# reaches its helpers as module globals. Numba's on-disk cache keys a closure
# by the pickle of its cells: a cell holding a dispatcher pickles differently
# in every process, so such a kernel would never hit the cache (every process
# recompiled it and added another file). ``tests/test_cache.py`` checks that a
# second process loads every kernel from the cache.
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
                o[j] = _encode32(f32_ubits(xs[j]), mode, p, fl, key, offset + i0 + j)
        for i in range(nb * LANES, n):
            out[i] = _encode32(f32_ubits(x[i]), mode, p, fl, key, offset + i)

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
                o[j] = _quantize32(f32_ubits(xs[j]), mode, p, fl, key, offset + i0 + j)
        for i in range(nb * LANES, n):
            out[i] = _quantize32(f32_ubits(x[i]), mode, p, fl, key, offset + i)

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
@jit
def _decode_one(code, p, flags):
    sign_shift = p[7]
    mag = code & ((np.int64(1) << sign_shift) - 1)
    if flags & UNSIGNED:
        negative = False
    else:
        negative = ((code >> sign_shift) & 1) != 0
    nan = (mag > p[4]) & (mag != p[5])
    if flags & FNUZ:
        nan = nan | (negative & (mag == 0))
    return _mag_value(mag, negative, nan, p, flags)


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
                o[j] = np.float32(_decode_one(np.int64(xs[j]), p, flags))
        for i in range(nb * LANES, n):
            out[i] = np.float32(_decode_one(np.int64(codes[i]), p, flags))

    return decode


# ------------------------------------------- fast path: IEEE-style formats, RNE
#
# A format whose exponent range is float32's (bf16, tf32, any eight-bit
# exponent with bias 127: "wide") has float32's grid in its subnormal range
# too: its subnormal step 2**(-126 - M) is 2**(23 - M) steps of float32's
# own subnormals, so rounding the low bits of the pattern is exact for every
# finite input, subnormal ones included. Its kernels ("wide" as a
# compile-time constant) take that integer path alone: the float32 branch
# of the narrower formats, ``(|x| + magic) - magic``, would compute a
# float32 subnormal there, and an x86 core takes a microcode assist of
# about a hundred cycles for each vector holding one (bf16's quantize ran
# 3.5x slower on inputs spanning float32's range than on normal ones).
def _quantize_rne(wide):
    """The loop of :func:`quantize_rne_ieee` for narrow (``wide`` False) or
    wide formats (see above)."""
    @pjit
    def quantize_rne_ieee(x, out, shift, normal_bits, overflow_bits, magic, ovf_mag, ovf_sign):
        """Round float32 ``x`` to nearest, ties to even, into a signed format with
        subnormals, a NaN and an exponent range within float32's (IEEE-style
        bf16, fp16, e5m2, and e4m3fn, whose top binade holds numbers) and write
        the values as float32: the fast path of :func:`fpemu.quantize`.

        ``shift`` = 23 - mantissa bits; ``normal_bits`` is the float32 bit
        pattern of 2**emin; ``overflow_bits`` the first pattern that overflows
        (the halfway point above the largest finite value where that tie rounds
        up, as in IEEE formats, one above it where the largest value is even, as
        e4m3fn's 448); ``magic`` is 2**(emin - mantissa bits + 23), whose float32
        ulp is the format's subnormal step. An overflow and an infinite input
        give ``(sign & ovf_sign) | ovf_mag``: ±inf (0x7f800000, 0x80000000),
        ±max (saturation) or the canonical NaN (0x7fc00000, 0).

        * normal results: add half an ulp less one, plus the kept lowest bit
          (ties to even), to the magnitude's bits and clear the dropped bits; a
          carry into the exponent is the correct rounding up;
        * subnormal results: ``(|x| + magic) - magic`` in float32 arithmetic,
          whose addition rounds |x| to a multiple of the subnormal step, to
          nearest even (the processor's float32 add; Numba sets no
          flush-to-zero mode) and whose subtraction is exact;
        * NaN becomes the canonical quiet NaN 0x7fc00000, and the sign is put
          back on every other result (-0 stays -0).

        The generic kernel gives the same bits on all 2**32 inputs
        (``tests/test_fast_paths.py``).
        """
        half = np.uint32((1 << (shift - 1)) - 1)
        keep = ~np.uint32((1 << shift) - 1)
        one = np.uint32(1)
        sh = np.uint32(shift)
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES                       # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _rne_ieee_one(xs[j], wide, half, keep, one, sh, normal_bits,
                                     overflow_bits, magic, ovf_mag, ovf_sign)
        for i in range(nb * LANES, n):
            out[i] = _rne_ieee_one(x[i], wide, half, keep, one, sh, normal_bits, overflow_bits,
                                   magic, ovf_mag, ovf_sign)

    return quantize_rne_ieee


@jit
def _rne_ieee_one(xv, wide, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag,
                  ovf_sign):
    """One element of :func:`quantize_rne_ieee` (``wide``: every finite
    input on the integer path)."""
    u = f32_ubits(xv)
    sign = np.uint32(u & np.uint32(0x80000000))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    if a > np.uint32(0x7F800000):
        r = np.uint32(0x7FC00000)
    elif a >= overflow_bits:
        r = np.uint32((sign & ovf_sign) | ovf_mag)
    elif wide or a >= normal_bits:
        r = np.uint32(sign | (np.uint32(a + half + (lshr32(a, sh) & one)) & keep))
    else:
        t = (abs(xv) + magic) - magic
        r = np.uint32(sign | f32_ubits(t))
    return f32_from_ubits(r)


def _encode_rne(wide):
    """The loop of :func:`encode_rne_ieee` for narrow or wide formats."""
    @pjit
    def encode_rne_ieee(x, out, shift, normal_bits, overflow_bits, magic, rebias, nan_code,
                        ovf_code, ovf_sign, sign_code):
        """The codes of :func:`quantize_rne_ieee`'s values (``encode`` of float32
        to nearest even, the same formats and arguments) written into ``out``
        (uint8 or uint16): a normal result's code is its rounded float32 bits
        shifted down by ``shift`` less ``rebias`` = (127 - bias) << mantissa bits,
        a subnormal one's the number of subnormal steps, read off the bits of
        ``|x| + magic``; NaN gives ``nan_code``, an overflow ``(sign & ovf_sign) |
        ovf_code``, and ``sign_code`` is the sign bit of a code."""
        half = np.uint32((1 << (shift - 1)) - 1)
        keep = ~np.uint32((1 << shift) - 1)
        sh = np.uint32(shift)
        magic_bits = f32_ubits(magic)
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES                       # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _encode_rne_ieee_one(xs[j], wide, half, keep, sh, normal_bits,
                                            overflow_bits, magic, magic_bits, rebias, nan_code,
                                            ovf_code, ovf_sign, sign_code)
        for i in range(nb * LANES, n):
            out[i] = _encode_rne_ieee_one(x[i], wide, half, keep, sh, normal_bits, overflow_bits,
                                          magic, magic_bits, rebias, nan_code, ovf_code, ovf_sign,
                                          sign_code)

    return encode_rne_ieee


@jit
def _encode_rne_ieee_one(xv, wide, half, keep, sh, normal_bits, overflow_bits, magic, magic_bits,
                         rebias, nan_code, ovf_code, ovf_sign, sign_code):
    """One element of :func:`encode_rne_ieee`, as a uint32."""
    u = f32_ubits(xv)
    sign = sign_code if (u >> np.uint32(31)) != np.uint32(0) else np.uint32(0)
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    if a > np.uint32(0x7F800000):
        r = nan_code
    elif a >= overflow_bits:
        r = np.uint32((sign & ovf_sign) | ovf_code)
    elif wide or a >= normal_bits:
        rounded = np.uint32(np.uint32(a + half + (lshr32(a, sh) & np.uint32(1))) & keep)
        r = np.uint32(sign | np.uint32(lshr32(rounded, sh) - rebias))
    else:
        r = np.uint32(sign | (f32_ubits(abs(xv) + magic) - magic_bits))
    return r


@functools.lru_cache(maxsize=None)
def rne_kernel(op, wide):
    """The nearest-even fast path of ``op`` ("quantize" or "encode") of
    float32 into a narrow (``wide`` False) or a wide format (see "fast path:
    IEEE-style formats, RNE"), called with ``quantize.Cast.fast`` /
    ``fast_encode``."""
    return (_quantize_rne if op == "quantize" else _encode_rne)(bool(wide))


# ---------------------------------- fast path: IEEE-style formats, other modes
#
# The same formats as the nearest-even fast path, rounded toward zero, up,
# down, to nearest with ties away, or to odd. A normal result is the float32
# pattern of |x| with the dropped bits cleared after adding 0 (toward zero),
# half an ulp (ties away) or an ulp less one (away from zero: up for positive
# x, down for negative), or with the kept last bit set when any dropped bit is
# (to odd); a carry into the exponent is the correct rounding up, and a
# result above the largest pattern overflows. A subnormal result starts from
# the nearest-even one, t = (|x| + magic) - magic, and the residual
# |x| - t, which is exact (both are multiples of the ulp of |x|, and the
# residual is no larger than |x|): its sign says on which side of |x| t lies
# and whether |x| was a tie, and one step (exact: a multiple of the step)
# moves t to the neighbour the mode asks for. The parity of t's step count is
# the last bit of |x| + magic, whose ulp is the step. ``tests/test_fast_paths.py``
# compares these kernels with the generic ones on all 2**32 inputs
# (``FPEMU_EXHAUSTIVE=1``). A wide format (see the nearest-even fast path)
# takes the integer path alone, subnormal results too.


@jit
def _directed_ieee(a, neg, ax, mode, wide, sh, keep, magic, half_step):
    """One float32 with magnitude bits ``a`` (|x| = ``ax``, sign ``neg``)
    rounded in ``mode`` (RNA, RTZ, RUP, RDN or RTO): (the normal result's
    float32 bits, above the largest pattern where it overflows; y = |x| +
    magic, whose ulp is the subnormal step and whose mantissa counts the
    steps of the nearest-even subnormal result; the step count, -1, 0 or 1,
    that moves that result to the mode's; whether an overflow goes to
    infinity). A ``wide`` format computes no subnormal result (y = magic, no
    step): its integer result covers them."""
    mask = np.uint32(~keep)
    # RUP and RDN round the magnitude away from zero on one side of zero
    # and toward it on the other
    away = (not neg) if mode == RUP else (neg if mode == RDN else False)
    if mode == RNA:
        rn = np.uint32(np.uint32(a + np.uint32(lshr32(mask, np.uint32(1)) + np.uint32(1))) & keep)
    elif mode == RTZ:
        rn = np.uint32(a & keep)
    elif mode == RUP or mode == RDN:
        rn = np.uint32(np.uint32(a + (mask if away else np.uint32(0))) & keep)
    else:                                                   # RTO: set the last kept bit
        lsb = np.uint32(mask + np.uint32(1))
        dropped = np.uint32(a & mask)
        rn = np.uint32(np.uint32(a & keep) | (lsb if dropped != np.uint32(0) else np.uint32(0)))
    to_inf = (mode == RNA) | away
    if wide:
        return rn, magic, np.int32(0), to_inf
    y = ax + magic
    t = y - magic
    res = ax - t                                # exact
    below = np.int32(res < np.float32(0))       # t lies above |x|
    if mode == RNA:
        adj = np.int32(res == half_step)        # a tie that RNE sent down, to even
    elif mode == RTZ:
        adj = -below                            # toward zero
    elif mode == RUP or mode == RDN:
        adj = np.int32(res > np.float32(0)) if away else -below
    else:                                       # RTO: the neighbour with an odd step count
        floor_even = np.int32(np.uint32(f32_ubits(y) & np.uint32(1))) == below
        adj = np.int32((res != np.float32(0)) & floor_even) - below
    return rn, y, adj, to_inf


def _quantize_directed(mode, wide):
    @pjit
    def quantize_directed_ieee(x, out, shift, normal_bits, max_bits, magic, step, ovf_mag,
                               ovf_sign):
        keep = ~np.uint32((1 << shift) - 1)
        sh = np.uint32(shift)
        half_step = np.float32(0.5) * step
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES                   # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _quantize_directed_one(xs[j], mode, wide, sh, keep, normal_bits, max_bits,
                                              magic, step, half_step, ovf_mag, ovf_sign)
        for i in range(nb * LANES, n):
            out[i] = _quantize_directed_one(x[i], mode, wide, sh, keep, normal_bits, max_bits,
                                            magic, step, half_step, ovf_mag, ovf_sign)

    return quantize_directed_ieee


@jit
def _quantize_directed_one(xv, mode, wide, sh, keep, normal_bits, max_bits, magic, step,
                           half_step, ovf_mag, ovf_sign):
    u = f32_ubits(xv)
    sign = np.uint32(u & np.uint32(0x80000000))
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    rn, y, adj, to_inf = _directed_ieee(a, sign != np.uint32(0), abs(xv), mode, wide, sh, keep,
                                        magic, half_step)
    if a > np.uint32(0x7F800000):
        r = np.uint32(0x7FC00000)
    elif (a == np.uint32(0x7F800000)) | ((rn > max_bits) & to_inf):
        r = np.uint32((sign & ovf_sign) | ovf_mag)
    elif rn > max_bits:
        r = np.uint32(sign | max_bits)
    elif wide or a >= normal_bits:
        r = np.uint32(sign | rn)
    else:
        moved = f32_from_ubits(np.uint32(f32_ubits(y) + np.uint32(adj)))   # adj steps on
        r = np.uint32(sign | f32_ubits(moved - magic))
    return f32_from_ubits(r)


def _encode_directed(mode, wide):
    @pjit
    def encode_directed_ieee(x, out, shift, normal_bits, max_bits, magic, step, rebias, nan_code,
                             ovf_code, ovf_sign, sign_code, max_code):
        keep = ~np.uint32((1 << shift) - 1)
        sh = np.uint32(shift)
        half_step = np.float32(0.5) * step
        magic_bits = f32_ubits(magic)
        n = x.size
        nb = n // LANES
        for b in prange(nb):
            i0 = (nb - 1 - b) * LANES                   # descending (see "Output order")
            xs = x[i0:i0 + LANES]
            o = out[i0:i0 + LANES]
            for j in range(LANES):
                o[j] = _encode_directed_one(xs[j], mode, wide, sh, keep, normal_bits, max_bits,
                                            magic, magic_bits, half_step, rebias, nan_code,
                                            ovf_code, ovf_sign, sign_code, max_code)
        for i in range(nb * LANES, n):
            out[i] = _encode_directed_one(x[i], mode, wide, sh, keep, normal_bits, max_bits, magic,
                                          magic_bits, half_step, rebias, nan_code, ovf_code,
                                          ovf_sign, sign_code, max_code)

    return encode_directed_ieee


@jit
def _encode_directed_one(xv, mode, wide, sh, keep, normal_bits, max_bits, magic, magic_bits,
                         half_step, rebias, nan_code, ovf_code, ovf_sign, sign_code, max_code):
    u = f32_ubits(xv)
    neg = (u >> np.uint32(31)) != np.uint32(0)
    sign = sign_code if neg else np.uint32(0)
    a = np.uint32(u & np.uint32(0x7FFFFFFF))
    rn, y, adj, to_inf = _directed_ieee(a, neg, abs(xv), mode, wide, sh, keep, magic,
                                        half_step)
    if a > np.uint32(0x7F800000):
        r = nan_code
    elif (a == np.uint32(0x7F800000)) | ((rn > max_bits) & to_inf):
        r = np.uint32((sign & ovf_sign) | ovf_code)
    elif rn > max_bits:
        r = np.uint32(sign | max_code)
    elif wide or a >= normal_bits:
        r = np.uint32(sign | np.uint32(lshr32(rn, sh) - rebias))
    else:
        r = np.uint32(sign | np.uint32(np.uint32(f32_ubits(y) - magic_bits) + np.uint32(adj)))
    return r


@functools.lru_cache(maxsize=None)
def directed_kernel(op, mode, wide):
    """The fast path of ``op`` ("quantize" or "encode") of float32 in
    ``mode`` (RNA, RTZ, RUP, RDN or RTO) into the narrow or wide formats of
    :func:`rne_kernel`, called with ``quantize.Cast.fast_directed`` /
    ``fast_directed_encode`` (see "fast path: IEEE-style formats, other
    modes")."""
    return (_quantize_directed if op == "quantize" else _encode_directed)(int(mode), bool(wide))


# ------------------------------------------------------------------ statistics
# Slots of the per-block count rows of :func:`stats_kernel` (fpemu.stats).
S_NAN, S_INF, S_ZERO, S_FLUSHED, S_SUBNORMAL, S_NORMAL, S_OVERFLOW = range(7)
S_TO_INF, S_TO_NAN, S_SATURATED, S_ZERO_BIN, S_HIST = 7, 8, 9, 10, 11


_STATS_BLOCK = 2048


@jit
def _stats_one(v, scale, mode, p, flags, key, index, fmax, min_normal, has_zero, signed, lo,
               nbins):
    """(class slot, histogram slot, |v| if finite else 0) of one element;
    branch-free, so that the first pass over a block vectorises. Elements
    that are not binned (NaN, inf, zero) get the histogram slot past the
    end of the row (``S_HIST + nbins``), which the caller drops."""
    a = abs(v)
    nan_in = v != v
    inf_in = a == np.inf
    finite = not (nan_in | inf_in)
    xs = (v if finite else 0.0) * scale
    neg, e, sig, special, frac_nz = _split_f64(xs, flags)
    q = _quantize_one(neg, e, sig, special, frac_nz, 52, mode, p, flags, key, index)
    aq = abs(q)
    invalid = finite & (((q != q) & (xs == 0.0)) | ((not signed) & (xs < 0.0)))
    big = abs(xs) > fmax
    cls = (S_NAN if nan_in | invalid else S_INF if inf_in else S_ZERO if v == 0.0
           else S_OVERFLOW if big else S_FLUSHED if aq == 0.0
           else S_SUBNORMAL if has_zero & (aq < min_normal) else S_NORMAL)
    to = S_TO_NAN if q != q else S_TO_INF if aq == np.inf else S_SATURATED
    # floor(log2 |xs|) from the float64 bits; inf (a finite x times a huge
    # scale) falls in the last bin, an underflow to zero in the first
    b = f64_bits(abs(xs))
    ef = b >> 52
    sub_e = -1011 - np.int64(leading_zeros(b | 1))
    k = nbins - 1 if ef == 0x7FF else (sub_e if ef == 0 else ef - 1023) - lo
    k = 0 if b == 0 else k
    binned = finite & (v != 0.0)
    slot = S_HIST + (min(max(k, 0), nbins - 1) if binned else nbins)
    code = cls | (np.int64(to) << 8 if cls == S_OVERFLOW else 0)
    return code, slot, a if finite else 0.0


def _stats_factory(mode, flags):
    @pjit
    def stats_blocks(x, p, key, offset, scale, fmax, min_normal, has_zero, signed, lo,
                     counts, amax, flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nblocks = counts.shape[0]
        nbins = counts.shape[1] - S_HIST - 1
        step = (n + nblocks - 1) // nblocks
        for t in prange(nblocks):
            c = counts[t]
            # four histograms, element j into j % 4: a run of equal bins would
            # otherwise wait on one counter's store before each increment
            h = np.zeros((4, nbins + 1), np.int64)
            slots = np.empty(_STATS_BLOCK, np.int64)
            # the largest |x| as the largest bit pattern (non-negative floats
            # order as their bits): an integer max vectorises, a float one not
            am = 0
            n_nan = n_inf = n_zero = n_flushed = n_sub = n_normal = n_over = 0
            n_to_inf = n_to_nan = n_sat = n_zero_bin = 0
            end = min(n, (t + 1) * step)
            for start in range(t * step, end, _STATS_BLOCK):
                m = min(_STATS_BLOCK, end - start)
                for j in range(m):                     # vectorised; sums, no stores
                    v = np.float64(x[start + j])
                    code, slot, a = _stats_one(v, scale, mode, p, fl, key,
                                               offset + start + j, fmax, min_normal,
                                               has_zero, signed, lo, nbins)
                    cls = code & 255
                    to = code >> 8
                    n_nan += cls == S_NAN
                    n_inf += cls == S_INF
                    n_zero += cls == S_ZERO
                    n_flushed += cls == S_FLUSHED
                    n_sub += cls == S_SUBNORMAL
                    n_normal += cls == S_NORMAL
                    n_over += cls == S_OVERFLOW
                    n_to_inf += to == S_TO_INF
                    n_to_nan += to == S_TO_NAN
                    n_sat += to == S_SATURATED
                    n_zero_bin += v == 0.0
                    slots[j] = slot - S_HIST
                    am = max(am, f64_bits(a))
                for j in range(m):
                    h[j & 3, slots[j]] += 1
            c[S_NAN] = n_nan
            c[S_INF] = n_inf
            c[S_ZERO] = n_zero
            c[S_FLUSHED] = n_flushed
            c[S_SUBNORMAL] = n_sub
            c[S_NORMAL] = n_normal
            c[S_OVERFLOW] = n_over
            c[S_TO_INF] = n_to_inf
            c[S_TO_NAN] = n_to_nan
            c[S_SATURATED] = n_sat
            c[S_ZERO_BIN] = n_zero_bin
            for k in range(nbins + 1):
                c[S_HIST + k] = h[0, k] + h[1, k] + h[2, k] + h[3, k]
            amax[t] = f64_from_bits(am)

    return stats_blocks


# What the 32-bit stats kernel counts, one code per element (its class, the
# NaN class split by whether x is zero, overflow split by where it goes),
# counted in pairs: code c adds 1 << 16 * (c & 1) to counter c >> 1, so five
# int32 counters hold the ten counts (at most 2048 each) in 16-bit halves.
(_K_NAN, _K_NAN_ZERO, _K_INF, _K_ZERO, _K_FLUSHED, _K_SUBNORMAL, _K_NORMAL, _K_SATURATED,
 _K_TO_INF, _K_TO_NAN) = (np.int32(k) for k in range(10))
#: the slots of fpemu.stats' count rows that each code adds to (-1: none)
_K_SLOTS = np.array([(S_NAN, -1), (S_NAN, S_ZERO_BIN), (S_INF, -1), (S_ZERO, S_ZERO_BIN),
                     (S_FLUSHED, -1), (S_SUBNORMAL, -1), (S_NORMAL, -1),
                     (S_OVERFLOW, S_SATURATED), (S_OVERFLOW, S_TO_INF),
                     (S_OVERFLOW, S_TO_NAN)], np.int64)


@jit
def _stats32_one(u, s, mode, p, flags, key, index, big_bits, has_zero, signed, lo, nbins):
    """:func:`_stats_one` for the float32 with bits ``u`` scaled by ``2**s``,
    in int32 lanes: the scale is added to the exponent (exact, as the
    float64 product is while ``s`` keeps every float32 inside float64's
    normal range), and the classes are read off the magnitude code rather
    than the rounded value. ``big_bits`` is the largest float32 at or below
    ``fmax / 2**s``, as bits: ``|x| * 2**s > fmax`` is ``|x|``'s bits above
    it. Returns (count code ``_K_*``, histogram slot, bits of |x| if finite
    else 0)."""
    neg, e, sig, special, frac_nz = _split32(u, flags | NORMALIZE)
    a = u & np.uint32(0x7FFFFFFF)
    zero = a == _U0
    es = np.int32(e + s)                             # floor(log2 |x * 2**s|)
    mag, negative, nan = _round32(neg, es, sig, special, frac_nz, mode, p, flags, key, index)
    invalid = (not special) & ((nan & zero) | ((not signed) & neg & (not zero)))
    big = a > big_bits
    flushed = (not nan) & (mag == _I0) & (not (flags & NO_ZERO))
    sub = has_zero & (not nan) & (mag < shl32(_I1, np.int32(p[0])))
    # the codes by arithmetic on the flags, not a chain of selects between
    # ten constants (which LLVM keeps in vector registers, spilling others)
    over = np.int32(_K_SATURATED + (np.int32(2) if nan else np.int32(mag == np.int32(p[5]))))
    finite = np.int32(_K_NORMAL - np.int32(sub) - np.int32(flushed))
    rest = over if big else finite
    code = (np.int32(zero) if (special & frac_nz) | invalid else
            _K_INF if special else _K_ZERO if zero else rest)
    k = np.int32(min(max(np.int32(es - lo), _I0), np.int32(nbins - _I1)))
    slot = k if not (special | zero) else nbins
    return code, slot, np.uint32(a if not special else _U0)


@jit
def _add_counts(c, pair, k):
    """Add the two 16-bit counts of ``pair`` (codes 2k and 2k + 1) to row ``c``."""
    for code in (2 * k, 2 * k + 1):
        n = (pair >> (16 * (code & 1))) & 0xFFFF
        for slot in _K_SLOTS[code]:
            if slot >= 0:
                c[slot] += n


def _stats32_factory(mode, flags):
    @pjit
    def stats32_blocks(x, p, key, offset, s, big_bits, has_zero, signed, lo, counts, amax,
                       flags_arg):
        fl = flags_arg if flags < 0 else flags
        n = x.size
        nblocks = counts.shape[0]
        nbins = counts.shape[1] - S_HIST - 1
        step = (n + nblocks - 1) // nblocks
        s32 = np.int32(s)
        bb = np.uint32(big_bits)
        lo32 = np.int32(lo)
        nb32 = np.int32(nbins)
        for t in prange(nblocks):
            c = counts[t]
            h = np.zeros((4, nbins + 1), np.int64)
            slots = np.empty(_STATS_BLOCK, np.uint32)   # unsigned: no wrap-around test
            am = _U0
            end = min(n, (t + 1) * step)
            for start in range(t * step, end, _STATS_BLOCK):
                m = min(_STATS_BLOCK, end - start)
                c01 = c23 = c45 = c67 = c89 = _I0
                xb = x[start:start + m]     # (x[start + j] would be a gather: j could wrap)
                for j in range(m):                     # vectorised; sums, no stores
                    code, slot, a = _stats32_one(
                        f32_ubits(xb[j]), s32, mode, p, fl, key, offset + start + j, bb,
                        has_zero, signed, lo32, nb32)
                    one = shl32(_I1, shl32(np.int32(code & _I1), np.int32(4)))
                    pair = ashr32(code, _I1)
                    c01 = np.int32(c01 + (one if pair == _I0 else _I0))
                    c23 = np.int32(c23 + (one if pair == _I1 else _I0))
                    c45 = np.int32(c45 + (one if pair == np.int32(2) else _I0))
                    c67 = np.int32(c67 + (one if pair == np.int32(3) else _I0))
                    c89 = np.int32(c89 + (one if pair == np.int32(4) else _I0))
                    slots[j] = np.uint32(slot)
                    am = np.uint32(max(am, a))
                for j in range(m):
                    h[j & 3, slots[j]] += 1
                _add_counts(c, c01, 0)
                _add_counts(c, c23, 1)
                _add_counts(c, c45, 2)
                _add_counts(c, c67, 3)
                _add_counts(c, c89, 4)
            for k in range(nbins + 1):
                c[S_HIST + k] = h[0, k] + h[1, k] + h[2, k] + h[3, k]
            amax[t] = np.float64(f32_from_ubits(am))

    return stats32_blocks


@pjit
def stats32_fast(x, s, big_bits, th, lo, counts, amax):
    """:func:`stats32_kernel` for the formats and overflow policies of the
    nearest-even fast path (:func:`quantize_rne_ieee`), to nearest even.
    Rounding |x| * 2**s there is monotonic in |x|, so each class is an
    interval of |x|'s bits, bounded by thresholds computed exactly in advance
    (``fpemu.stats._fast_thresholds``): ``th[0]``, the bits of the largest
    float32 that rounds to zero; ``th[1]``, of the smallest that rounds to a
    normal; ``big_bits`` (as in :func:`_stats32_one`), the largest at or
    below the largest value; ``th[2]``, the smallest whose overflow goes
    where the overflow policy sends it rather than down to the largest value;
    ``th[3]``, the count slot of that destination. The loop counts how many
    bits fall at or below, or above, each bound (a compare and an add per
    bound) and the classes are the differences; the histogram slot is
    floor(log2 |x|) + s, read off the exponent field (or a float32
    subnormal's leading bit)."""
    n = x.size
    nblocks = counts.shape[0]
    nbins = counts.shape[1] - S_HIST - 1
    step = (n + nblocks - 1) // nblocks
    s32 = np.int32(s)
    bb = np.uint32(big_bits)
    t0 = np.uint32(th[0])
    t1 = np.uint32(th[1])
    t2 = np.uint32(th[2])
    lo32 = np.int32(lo)
    nb32 = np.int32(nbins)
    top = np.int32(nbins - 1)
    inf = np.uint32(0x7F800000)
    for t in prange(nblocks):
        c = counts[t]
        h = np.zeros((4, nbins + 1), np.int64)
        slots = np.empty(_STATS_BLOCK, np.uint32)       # unsigned: no wrap-around test
        am = _U0
        end = min(n, (t + 1) * step)
        for start in range(t * step, end, _STATS_BLOCK):
            m = min(_STATS_BLOCK, end - start)
            le0 = lt1 = gtb = ge2 = zero = isinf = nan = _I0
            xb = x[start:start + m]
            for j in range(m):                          # vectorised; sums, no stores
                a = np.uint32(f32_ubits(xb[j]) & np.uint32(0x7FFFFFFF))
                le0 = np.int32(le0 + np.int32(a <= t0))
                lt1 = np.int32(lt1 + np.int32(a < t1))
                gtb = np.int32(gtb + np.int32(a > bb))
                ge2 = np.int32(ge2 + np.int32(a >= t2))
                zero = np.int32(zero + np.int32(a == _U0))
                isinf = np.int32(isinf + np.int32(a == inf))
                nan = np.int32(nan + np.int32(a > inf))
                ef = np.int32(a >> np.uint32(23))
                e = np.int32(ef - np.int32(127)) if ef != _I0 else np.int32(
                    np.int32(-118) - clz32(np.int32(a)))        # a subnormal's leading bit
                k = np.int32(min(max(np.int32(np.int32(e + s32) - lo32), _I0), top))
                finite_nonzero = (a != _U0) & (a < inf)
                slots[j] = np.uint32(k if finite_nonzero else nb32)
                am = np.uint32(max(am, a if a < inf else _U0))
            for j in range(m):
                h[j & 3, slots[j]] += 1
            special = isinf + nan
            c[S_ZERO] += zero
            c[S_ZERO_BIN] += zero
            c[S_NAN] += nan
            c[S_INF] += isinf
            c[S_FLUSHED] += le0 - zero
            c[S_SUBNORMAL] += lt1 - le0
            c[S_OVERFLOW] += gtb - special
            c[th[3]] += ge2 - special
            c[S_SATURATED] += gtb - ge2
            c[S_NORMAL] += m - lt1 - gtb
        for k in range(nbins + 1):
            c[S_HIST + k] = h[0, k] + h[1, k] + h[2, k] + h[3, k]
        amax[t] = np.float64(f32_from_ubits(am))


@pjit
def stats32_fast4(x, s, bigs, ths, lo, counts, amax):
    """:func:`stats32_fast` for up to four formats in one pass (the monitor
    counts each tensor in several): the histogram slot, the amax and the
    zero / inf / NaN counts depend on no format and are taken once; each
    format adds its four compares. ``bigs`` (4,) and ``ths`` (4, 4) hold the
    formats' ``big_bits`` and thresholds (a format given fewer than four
    repeats one; the caller drops the copies); ``counts`` is (blocks, 4,
    S_HIST + nbins + 1), every format's row getting the same histogram."""
    n = x.size
    nblocks = counts.shape[0]
    nbins = counts.shape[2] - S_HIST - 1
    step = (n + nblocks - 1) // nblocks
    s32 = np.int32(s)
    b0, b1, b2, b3 = (np.uint32(bigs[0]), np.uint32(bigs[1]), np.uint32(bigs[2]),
                      np.uint32(bigs[3]))
    z0, z1, z2, z3 = (np.uint32(ths[0, 0]), np.uint32(ths[1, 0]), np.uint32(ths[2, 0]),
                      np.uint32(ths[3, 0]))
    n0, n1, n2, n3 = (np.uint32(ths[0, 1]), np.uint32(ths[1, 1]), np.uint32(ths[2, 1]),
                      np.uint32(ths[3, 1]))
    o0, o1, o2, o3 = (np.uint32(ths[0, 2]), np.uint32(ths[1, 2]), np.uint32(ths[2, 2]),
                      np.uint32(ths[3, 2]))
    lo32 = np.int32(lo)
    nb32 = np.int32(nbins)
    top = np.int32(nbins - 1)
    inf = np.uint32(0x7F800000)
    for t in prange(nblocks):
        c = counts[t]
        h = np.zeros((4, nbins + 1), np.int64)
        slots = np.empty(_STATS_BLOCK, np.uint32)
        am = _U0
        end = min(n, (t + 1) * step)
        for start in range(t * step, end, _STATS_BLOCK):
            m = min(_STATS_BLOCK, end - start)
            zero = isinf = nan = _I0
            le00 = lt10 = gtb0 = ge20 = _I0
            le01 = lt11 = gtb1 = ge21 = _I0
            le02 = lt12 = gtb2 = ge22 = _I0
            le03 = lt13 = gtb3 = ge23 = _I0
            xb = x[start:start + m]
            for j in range(m):                          # vectorised; sums, no stores
                a = np.uint32(f32_ubits(xb[j]) & np.uint32(0x7FFFFFFF))
                zero = np.int32(zero + np.int32(a == _U0))
                isinf = np.int32(isinf + np.int32(a == inf))
                nan = np.int32(nan + np.int32(a > inf))
                le00 = np.int32(le00 + np.int32(a <= z0))
                lt10 = np.int32(lt10 + np.int32(a < n0))
                gtb0 = np.int32(gtb0 + np.int32(a > b0))
                ge20 = np.int32(ge20 + np.int32(a >= o0))
                le01 = np.int32(le01 + np.int32(a <= z1))
                lt11 = np.int32(lt11 + np.int32(a < n1))
                gtb1 = np.int32(gtb1 + np.int32(a > b1))
                ge21 = np.int32(ge21 + np.int32(a >= o1))
                le02 = np.int32(le02 + np.int32(a <= z2))
                lt12 = np.int32(lt12 + np.int32(a < n2))
                gtb2 = np.int32(gtb2 + np.int32(a > b2))
                ge22 = np.int32(ge22 + np.int32(a >= o2))
                le03 = np.int32(le03 + np.int32(a <= z3))
                lt13 = np.int32(lt13 + np.int32(a < n3))
                gtb3 = np.int32(gtb3 + np.int32(a > b3))
                ge23 = np.int32(ge23 + np.int32(a >= o3))
                ef = np.int32(a >> np.uint32(23))
                e = np.int32(ef - np.int32(127)) if ef != _I0 else np.int32(
                    np.int32(-118) - clz32(np.int32(a)))        # a subnormal's leading bit
                k = np.int32(min(max(np.int32(np.int32(e + s32) - lo32), _I0), top))
                finite_nonzero = (a != _U0) & (a < inf)
                slots[j] = np.uint32(k if finite_nonzero else nb32)
                am = np.uint32(max(am, a if a < inf else _U0))
            for j in range(m):
                h[j & 3, slots[j]] += 1
            special = isinf + nan
            for f, le0, lt1, gtb, ge2 in ((0, le00, lt10, gtb0, ge20), (1, le01, lt11, gtb1, ge21),
                                          (2, le02, lt12, gtb2, ge22), (3, le03, lt13, gtb3, ge23)):
                cf = c[f]
                cf[S_ZERO] += zero
                cf[S_ZERO_BIN] += zero
                cf[S_NAN] += nan
                cf[S_INF] += isinf
                cf[S_FLUSHED] += le0 - zero
                cf[S_SUBNORMAL] += lt1 - le0
                cf[S_OVERFLOW] += gtb - special
                cf[ths[f, 3]] += ge2 - special
                cf[S_SATURATED] += gtb - ge2
                cf[S_NORMAL] += m - lt1 - gtb
        for k in range(nbins + 1):
            v = h[0, k] + h[1, k] + h[2, k] + h[3, k]
            for f in range(4):
                c[f, S_HIST + k] = v
        amax[t] = np.float64(f32_from_ubits(am))


@functools.lru_cache(maxsize=None)
def stats32_kernel(mode, flags):
    """:func:`stats_kernel` for float32 input and a power-of-two scale
    ``2**s``, in 32-bit lanes (several times faster). Called as
    ``kernel(x, p, key, offset, s, big_bits, has_zero, signed, lo, counts,
    amax, flags)``, ``big_bits`` as in :func:`_stats32_one`."""
    return _stats32_factory(int(mode), int(flags))


@functools.lru_cache(maxsize=None)
def stats_kernel(mode, flags):
    """The loop behind :func:`fpemu.stats.stats`: one pass over ``x`` that
    scales each element (in float64), rounds it to the format and counts its
    class, overflow target and log2 bin into row ``t`` of ``counts`` (one row
    per block of elements, so that threads never share a counter) and the
    block's largest finite magnitude into ``amax[t]``; no per-element
    temporaries. Called as ``kernel(x, p, key, offset, scale, fmax,
    min_normal, has_zero, signed, lo, counts, amax, flags)``; ``flags`` as in
    :func:`rounding_kernel`."""
    return _stats_factory(int(mode), int(flags))
