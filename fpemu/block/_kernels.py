"""The block formats' own Numba kernels.

* :func:`scaled_values`: elements times their block scales, one pass over
  the codes (:func:`fpemu.block.host.scaled_values`; ``fpemu.torch``'s
  emulated GEMMs take their operands' values from it on the CPU);
* :func:`hadamard_runs`: the Hadamard transform of the runs whose sum is
  exact in float64 (:func:`fpemu.block.hadamard`);
* :func:`block_amax5` and :func:`scale_round_kernel`: the two passes of a
  block quantization over its elements, each one read of them
  (:mod:`fpemu.block.fused`): the block amaxes, and the element step (each
  element times its block's factor, clamped, rounded by fpemu's element
  rounding, a NaN block's signed zeros).

The two fused kernels read the blocks as a 5-D array ``(L, NR, TY, NC,
TX)``, each block a ``(TY, TX)`` slice of it: blocks along the last axis
are ``(rows, 1, 1, nblocks, block)``, blocks along another axis read where
they lie ``(before, nblocks, block, after, 1)``, 2-D tiles ``(lead, tile
rows, rows, tile columns, columns)``. They loop over ``(l, r)`` in parallel
and within it in memory order, so every layout is read in the order it lies.

The element step inlines fpemu's element rounding (:mod:`fpemu._kernels`'
``_encode32``): this module joins that cache unit
(:func:`fpemu._jit.cache_unit`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

import math

from .._jit import cache_unit, f32_bits, f64_bits, f64_from_bits, jit, pjit
from .._kernels import SOURCES, _encode32, _encode_rne_ieee_one

# the kernels below inline the unit's functions: their cache is valid only
# while its files are as they are
cache_unit(__name__, SOURCES)

#: float32 bits: the magnitude mask, +inf, the canonical NaN
_MAG, _INF, _QNAN = 0x7FFFFFFF, 0x7F800000, 0x7FC00000


@pjit
def scaled_values(codes, table, scales, rows, cols, by, bx, out):
    """``out[r, c] = table[codes[r, c]] * scales[r // by, c // bx]`` in
    float32 over a (rows, cols) array flattened row-major (``scales``
    flattened too, ``ceil(cols / bx)`` per row of blocks): one product of two
    float32 numbers per element, as torch's or NumPy's float32 product."""
    nc = (cols + bx - 1) // bx
    for r in prange(rows):
        base = r * cols
        srow = (r // by) * nc
        if bx == 1:                             # blocks down the columns: a scale each
            for c in range(cols):
                out[base + c] = table[codes[base + c]] * scales[srow + c]
        else:                                   # runs of bx elements share a scale
            for cb in range(nc):
                s = scales[srow + cb]
                for c in range(cb * bx, min(cb * bx + bx, cols)):
                    out[base + c] = table[codes[base + c]] * s


@pjit
def hadamard_runs(runs, H, out, hard, spread):
    """``out[r] = runs[r] @ H`` (float32 runs of ``size`` values, ``H`` the
    float64 ``size x size`` matrix of ±2**-k), each sum taken in float64
    from -0.0 in k order and rounded once to float32, for every run without
    inf or NaN whose nonzero magnitudes' float32 exponent fields (a
    subnormal's taken as 1, whose last bit it shares) span at most
    ``spread``; the other runs are marked in ``hard`` and their ``out`` is
    not written. With ``spread = 29 - log2(size)`` every product and every
    partial sum is a float64 number: a product is a multiple of
    2**(smallest field - 150 - k) below 2**(largest field - 126 - k), a sum
    of ``size = 4**k`` of them below 2**(largest field - 126 + k), 53 bits
    in all. So each sum is the exact one, its zero signed as IEEE 754 signs
    an exact sum (-0 only where every product is -0)."""
    n, size = runs.shape
    for r in prange(n):
        lo, hi, bad = 255, 0, False
        for k in range(size):
            b = f32_bits(runs[r, k]) & _MAG
            f = b >> 23
            bad = bad or f == 255
            if b != 0:
                f = max(f, 1)
                lo = min(lo, f)
                hi = max(hi, f)
        hard[r] = bad or hi - lo > spread
        if hard[r]:
            continue
        for j in range(size):
            acc = -0.0
            for k in range(size):
                acc += np.float64(runs[r, k]) * H[k, j]
            out[r, j] = np.float32(acc)


@pjit
def block_amax5(B, out):
    """``out[l, r, c]``: the float32 bits of ``max |x|`` over block ``(l, r,
    c)`` of the 5-D float32 array ``B`` (module text), the canonical NaN
    where the block holds one: the largest magnitude bits, NaN's above
    inf's above every number's."""
    L, NR, TY, NC, TX = B.shape
    for lr in prange(L * NR):
        lead = lr // NR
        r = lr - lead * NR
        acc = out[lead, r]
        for c in range(NC):
            acc[c] = 0
        for y in range(TY):
            for c in range(NC):
                m = acc[c]
                for x in range(TX):
                    b = f32_bits(B[lead, r, y, c, x]) & _MAG
                    if b > m:
                        m = b
                acc[c] = m
        for c in range(NC):
            if acc[c] > _INF:
                acc[c] = _QNAN


@jit
def _signed_zero(v, sign_shift):
    """The code of a zero of v's sign (a NaN block's)."""
    return ((f32_bits(v) >> 31) & 1) << sign_shift


@jit
def _round_srn_one(w, draw, sr):
    """``"srN"`` rounding of the float32 value ``w`` (at most the element
    format's largest magnitude, or NaN) as
    :func:`fpemu.block.driver.round_srn` computes it, in float64, where every
    step is exact: ``sr`` = (2**N, the format's mantissa bits, its emin,
    its largest value); ``u`` the spacing of the format's values at
    ``|w|``, ``t = |w| / u`` and its integer part ``k`` (exact: a power of
    two divides a float32 number), ``r`` the first N bits of the fraction
    ``t - k`` (times 2**N: exact), rounded up where ``r + draw`` reaches
    2**N (both below 2**32: exact), at most the largest value. The result
    is one of the format's values (NaN stays NaN), which the caller
    encodes to nearest."""
    two_n, M, emin, top = sr
    a = abs(np.float64(w))
    if a != a:
        return w
    e = max(((f64_bits(a) >> 52) & 0x7FF) - 1023, emin)    # floor(log2 a); 0: emin
    u = f64_from_bits((e - M + 1023) << 52)                 # 2**(e - M)
    t = a / u
    k = np.floor(t)
    r = np.floor((t - k) * two_n)
    if r + draw >= two_n:
        k += 1.0
    return np.float32(math.copysign(min(k * u, top), np.float64(w)))


def _scale_round(mode, flags, fast, values, srn):
    @jit
    def one(v, f, divide, has_nan, maxv, p, fl, key, index, fa, draw, sr):
        """The code of element v of a block with factor f (``"srN"``: its
        draw, ``sr`` the rounding's constants)."""
        zero = np.float32(0)
        w = np.float32(v / f) if divide else np.float32(v * f)
        w = v if v == zero else w                   # a zero keeps its sign
        w = maxv if w > maxv else w                 # (NaN stays NaN)
        w = -maxv if w < -maxv else w
        if has_nan:
            w = zero if w != w else w
        if srn:
            w = _round_srn_one(w, draw, sr)        # a value of the format: encoded exactly
        if fast:
            return np.int32(_encode_rne_ieee_one(w, fast == 2, fa[0], fa[1], fa[2], fa[3], fa[4],
                                                 fa[5], fa[6], fa[7], fa[8], fa[9], fa[10],
                                                 fa[11]))
        return _encode32(f32_bits(w), mode, p, fl, key, index)

    @pjit
    def scale_round5(B, TX, factor, block_nan, divide, has_nan, maxv, sign_shift, p, key, offset,
                     flags_arg, fa, table, dq, draws, sr, out, vals):
        fl = flags_arg if flags < 0 else flags
        L, NR, TY, W = B.shape
        NC = W // TX
        per = TY * W
        for i in prange(L * NR):
            lr = L * NR - 1 - i             # descending: fresh outputs (fpemu._kernels.loops)
            lead = lr // NR
            r = lr - lead * NR
            frow = factor[lead, r]
            nrow = block_nan[lead, r]
            for y in range(TY):
                src = B[lead, r, y]
                dst = out[lead, r, y]
                drw = draws[lead, r, y] if srn else draws[0, 0, 0]
                i0 = offset + lr * per + y * W
                if TX == 1:                     # blocks down the columns: a factor each
                    for c in range(NC):
                        dst[c] = one(src[c], frow[c], divide, has_nan, maxv, p, fl, key,
                                     i0 + c, fa, np.float64(drw[c]) if srn else 0.0, sr)
                else:
                    for c in range(NC):
                        f = frow[c]
                        s = src[c * TX:c * TX + TX]
                        d = dst[c * TX:c * TX + TX]
                        i1 = i0 + c * TX
                        for x in range(TX):
                            d[x] = one(s[x], f, divide, has_nan, maxv, p, fl, key, i1 + x, fa,
                                       np.float64(drw[c * TX + x]) if srn else 0.0, sr)
                if has_nan:                     # NaN blocks: a zero of each input's sign
                    for c in range(NC):
                        if nrow[c]:
                            for x in range(c * TX, c * TX + TX):
                                dst[x] = _signed_zero(src[x], sign_shift)
                if values:                      # each code's value times its block's scale
                    drow = dq[lead, r]
                    v = vals[lead, r, y]
                    if TX == 1:
                        for c in range(NC):
                            v[c] = table[dst[c]] * drow[c]
                    else:
                        for c in range(NC):
                            sc = drow[c]
                            dd = dst[c * TX:c * TX + TX]
                            vv = v[c * TX:c * TX + TX]
                            for x in range(TX):
                                vv[x] = table[dd[x]] * sc

    return scale_round5


@functools.lru_cache(maxsize=None)
def scale_round_kernel(mode, flags, fast=0, values=False, srn=False):
    """The element step for one rounding mode (the kernels' number) and
    flags (>= 0: compiled for them alone; -1: read at run time), called as
    ``kernel(B, TX, factor, block_nan, divide, has_nan, maxv, sign_shift,
    params, key, offset, flags, fast_args, table, dq, out, vals)`` with ``B``
    the 5-D layout
    (module text) with its last two axes merged, ``(L, NR, TY, NC TX)`` (a
    row of it is contiguous wherever the layout is), ``factor`` and
    ``block_nan`` per block ``(L, NR, NC)`` and ``out`` the codes in
    ``B``'s shape. Element ``(l, r, y, j)`` is element ``offset + ((l NR +
    r) TY + y) NC TX + j`` of stochastic rounding: its index in ``B``'s
    order, which is the driver's block layout. ``fast`` (1: a narrow
    format, 2: a wide one) rounds to nearest even by the fast path of
    IEEE-style formats (:mod:`fpemu._kernels.fast`, the same bits),
    ``fast_args`` its unpacked arguments (else a tuple of 12 zeros).
    ``values``: also ``vals`` (float32, ``out``'s shape), each code's value
    (``table[code]``) times its block's ``dq`` (float32, per block), one
    float32 product as :func:`scaled_values`' (else ``table``, ``dq`` and
    ``vals`` are not read). ``srn``: ``"srN"`` rounding before the encode
    (:func:`_round_srn_one`; ``mode`` and ``flags`` then those of round to
    nearest), each element's draw from ``draws`` (uint64, ``out``'s shape)
    and ``sr`` = (2**N, mantissa bits, emin, largest value) (else
    ``draws`` is not read)."""
    return _scale_round(int(mode), int(flags), int(fast), bool(values), bool(srn))
