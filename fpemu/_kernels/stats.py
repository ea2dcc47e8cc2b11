"""The counting loops of :func:`fpemu.stats.stats` and ``stats_many``.

One pass over the input scales each element, rounds it to the format and
counts its class, overflow target and log2 bin into a row of counts per
block of elements (so that threads never share a counter), with the block's
largest finite magnitude; no per-element temporaries. Float32 input with a
power-of-two scale runs in int32 lanes (:func:`stats32_kernel`), and where
rounding to nearest even is monotonic in ``|x|`` by comparisons with
precomputed thresholds alone (:func:`stats32_fast`, :func:`stats32_fast4`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import leading_zeros

from .._elemround import NO_ZERO, NORMALIZE
from .._jit import (ashr32, clz32, f32_from_ubits, f32_ubits, f64_bits, f64_from_bits, jit,
                    pjit, shl32)
from .round32 import elements
from .round64 import _quantize_one, _split_f64

_I0 = np.int32(0)
_I1 = np.int32(1)
_U0 = np.uint32(0)


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
    neg, e, sig, special, frac_nz = elements.split(np.int32(u), flags | NORMALIZE)
    a = u & np.uint32(0x7FFFFFFF)
    zero = a == _U0
    es = np.int32(e + s)                             # floor(log2 |x * 2**s|)
    mag, negative, nan = elements.round_split(
        neg, es, sig, special, frac_nz, np.int32(p[0]), np.int32(p[1]), np.int32(p[2]),
        np.int32(p[3]), np.int32(p[4]), np.int32(p[5]), flags, mode, key, index)
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
