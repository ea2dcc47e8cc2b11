"""Fast paths of float32 input into IEEE-style formats, every mode but SR.

Formats that are signed, with subnormals, a NaN and an exponent range within
float32's (bf16, fp16, e5m2, e4m3fn and the like), under their overflow
policy and with subnormals kept, round a float32 by integer operations on
its own bit pattern (normal results) or by a float32 addition (subnormal
ones): fewer operations than the general rounding of
:mod:`fpemu._kernels.round32`, which gives the same bits on all 2**32 inputs
(``tests/test_fast_paths.py``, ``FPEMU_EXHAUSTIVE=1``). :meth:`fpemu.Cast.fast_path`
chooses them.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from .._elemround import RDN, RNA, RTZ, RUP
from .._jit import f32_from_ubits, f32_ubits, jit, lshr32, pjit
from .loops import LANES


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
