"""Numba kernels for dot products under accumulation models.

Every kernel computes ``out[i, j] = dot(A[i, :], BT[j, :])`` (plus an
initial accumulator ``C[i, j]``) for float64 arrays holding values of the
input format, so every product ``A[i, k] * BT[j, k]`` is exact in float64.
``p`` / ``flags`` describe the accumulator format as in :mod:`fpemu._kernels`.

The models:

* ``exact``: the exact sum in a fixed-point accumulator of 32-bit limbs
  (every product of two float32 values is an integer multiple of 2**-350
  below 2**256), rounded once;
* ``sequential``: each product rounded into the accumulator format, then each
  addition rounded, in index order (with a native float32 loop for an fp32
  accumulator in round-to-nearest-even: binary32 arithmetic *is* that model);
* ``pairwise``: products rounded, then added in a balanced tree, level by
  level (element 2t with 2t + 1; an odd last element moves up unchanged);
* ``fma``: ``acc = fma(a_k, b_k, acc)``, one rounding per step;
* ``tc``: the tensor-core model of Fasi et al. (2021) as MMA-Sim states it
  (Xie et al. 2025): in each block of L products plus the accumulator, every
  term is truncated toward zero to the grid ``2**(emax - F)`` where ``emax``
  is the largest exponent of the block's terms (products not renormalised:
  ``e(a) + e(b)``; zeros count as ``e_zero``), the truncated terms are added
  exactly, and the sum is normalised and truncated to fp32 (``out_f = 23``
  fraction bits; Hopper's fp8 path keeps 13).

``blocked`` runs one of these on blocks of ``block`` elements with a fresh
zero accumulator and adds each block's result into an fp32 accumulator
(binary32 round to nearest even), as DeepSeek-V3 promotes its fp8 partial
sums every N_C = 128 elements.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import leading_zeros

from . import _arith_kernels
from ._arith_kernels import ADD, FMA, _exact_op, _to_odd
from ._jit import cache_unit, f64_bits, f64_from_bits, jit, pjit
from ._kernels import SOURCES, RDN, _finish, _mag_value, _quantize_one, _round, _split_f64

# the kernels below inline fpemu._kernels' and fpemu._arith_kernels' functions:
# their cache is valid only while those files are as they are (fpemu._jit.cache_unit)
cache_unit(__name__, SOURCES + (_arith_kernels.__file__,))

EXACT, SEQUENTIAL, PAIRWISE, FMA_MODEL, TC = range(5)
MODELS = {"exact": EXACT, "sequential": SEQUENTIAL, "pairwise": PAIRWISE, "fma": FMA_MODEL,
          "tc": TC}

_NL = 24          # limbs of 32 bits: 768 bits
_OFF = 352        # bit position of 2**0 in the limbs (products are >= 2**-350)
_MASK = (1 << 32) - 1


# ----------------------------------------------------------- rounding helpers
@jit
def _round_acc(x, sticky, mode, p, flags, key, index):
    """float64 x (with the sign of the exact value minus x) rounded into the
    accumulator format, once."""
    r = _to_odd(x, sticky)
    neg, e, sig, special, frac_nz = _split_f64(r, flags)
    return _quantize_one(neg, e, sig, special, frac_nz, 52, mode, p, flags, key, index)


@jit
def _add_acc(acc, t, mode, p, flags, key, index):
    s, st = _exact_op(ADD, mode, acc, t, 0.0)
    return _round_acc(s, st, mode, p, flags, key, index)


@jit
def _pow2(e):
    """2.0**e for -1022 <= e <= 1023."""
    return f64_from_bits(np.int64(e + 1023) << 52)


# ----------------------------------------------------------------- exact sum
@jit
def _limb_add(limbs, x):
    """Add float64 x (finite, a product of two float32 values) exactly."""
    b = f64_bits(x)
    ef = (b >> 52) & 0x7FF
    sig = (b & 0xFFFFFFFFFFFFF) | (np.int64(ef != 0) << 52)
    if sig == 0:
        return
    pos = max(ef, 1) - 1075 + _OFF
    li = pos >> 5
    sh = pos & 31
    sgn = np.int64(-1) if b < 0 else np.int64(1)
    v0 = (sig & _MASK) << sh
    v1 = (sig >> 32) << sh
    limbs[li] += sgn * (v0 & _MASK)
    limbs[li + 1] += sgn * ((v0 >> 32) + (v1 & _MASK))
    limbs[li + 2] += sgn * (v1 >> 32)


@jit
def _limb_carry(limbs):
    for i in range(_NL - 1):
        c = limbs[i] >> 32  # arithmetic shift: floor division
        limbs[i] -= c << 32
        limbs[i + 1] += c


@jit
def _limb_round(limbs, neg_zero, mode, p, flags, key, index):
    """The exact sum held in ``limbs``, rounded once (its float64 value)."""
    _limb_carry(limbs)
    neg = limbs[_NL - 1] < 0
    if neg:
        for i in range(_NL):
            limbs[i] = -limbs[i]
        _limb_carry(limbs)
    t = _NL - 1
    while t >= 0 and limbs[t] == 0:
        t -= 1
    if t < 0:
        return -0.0 if neg_zero else 0.0
    below1 = limbs[t - 1] if t >= 1 else np.int64(0)
    sig = (limbs[t] << 29) | (below1 >> 3)  # at most 61 bits
    sticky = (below1 & 7) != 0
    for i in range(t - 1):
        sticky = sticky | (limbs[i] != 0)
    sig = sig | np.int64(sticky)  # far below any format's last bit
    unit = 32 * (t - 1) + 3 - _OFF  # sig * 2**unit is the value
    lz = np.int64(leading_zeros(sig)) - 2  # normalise: leading 1 at bit 61
    sig = sig << lz
    e = unit - lz + 61
    mag, ovf, ovf_inf = _round(neg, e, sig, 61, mode, p, key, index)
    mag, negative, nan = _finish(neg, mag, ovf, ovf_inf, False, False, False, p, flags)
    return _mag_value(mag, negative, nan, p, flags)


# ------------------------------------------------------------ tensor cores
@jit
def _exponent(x, emin):
    """Exponent of x's leading bit, at least emin (subnormals of the format)."""
    ef = (f64_bits(x) >> 52) & 0x7FF
    return max(ef - 1023, emin)


@jit
def _rz_fp32(v, out_f):
    """float64 v normalised and truncated to fp32 with out_f fraction bits
    (fp32's subnormal grid below 2**-126; inf from 2**128)."""
    if v == 0.0:
        return 0.0  # -0 becomes +0, as the hardware does
    e = max(((f64_bits(v) >> 52) & 0x7FF) - 1023, -126)
    q = _pow2(e - out_f)
    t = np.trunc(v / q) * q
    if abs(t) >= 2.0**128:
        t = np.inf if t > 0 else -np.inf
    return t + 0.0  # a sum truncated to zero is +0, as the hardware gives


@jit
def _dot_one(A, BT, i, j, k0, k1, c, p, tc, key, model, mode, flags):
    """dot(A[i, k0:k1], BT[j, k0:k1]) + c under one model, mode and flags
    (compile-time constants: one lean function per combination)."""
    numba.literally(model)
    numba.literally(mode)
    numba.literally(flags)
    K = A.shape[1]
    base = (i * BT.shape[0] + j) * K
    if model == EXACT:
        limbs = np.zeros(_NL, np.int64)
        _limb_add(limbs, c)
        all_neg = np.signbit(c)
        any_neg = np.signbit(c)
        for k in range(k0, k1):
            pr = A[i, k] * BT[j, k]
            _limb_add(limbs, pr)
            all_neg = all_neg & np.signbit(pr)
            any_neg = any_neg | np.signbit(pr)
        neg_zero = any_neg if mode == RDN else all_neg
        return _limb_round(limbs, neg_zero, mode, p, flags, key, base)
    if model == FMA_MODEL:
        for k in range(k0, k1):
            s, st = _exact_op(FMA, mode, A[i, k], BT[j, k], c)
            c = _round_acc(s, st, mode, p, flags, key, base + k)
        return c
    if model == SEQUENTIAL:
        for k in range(k0, k1):
            pr = _round_acc(A[i, k] * BT[j, k], 0, mode, p, flags, key, base + k)
            c = _add_acc(c, pr, mode, p, flags, key, base + k)
        return c
    # PAIRWISE
    n = k1 - k0
    buf = np.empty(max(n, 1), np.float64)
    for k in range(k0, k1):
        buf[k - k0] = _round_acc(A[i, k] * BT[j, k], 0, mode, p, flags, key, base + k)
    step = 0
    while n > 1:
        half = n // 2
        for t in range(half):
            buf[t] = _add_acc(buf[2 * t], buf[2 * t + 1], mode, p, flags, key,
                              base + step * K + t)
        if n % 2 == 1:
            buf[half] = buf[n - 1]
        n = half + n % 2
        step += 1
    if k1 > k0:
        return _add_acc(c, buf[0], mode, p, flags, key, base)
    return c


# -------------------------------------------------------------- the kernels
@functools.lru_cache(maxsize=None)
def dot_kernel(model, mode, flags, block, native, paired):
    """``kernel(A, BT, C, out, p, tc, key)``: out[i, j] under one model
    (``paired``: out[i, 0] = dot(A[i], BT[i]), for row-wise dot products).

    ``block`` > 0 runs the model on blocks of that many elements and promotes
    each block into an fp32 accumulator; ``native`` takes the float32 loop
    for the sequential fp32/rne model. ``tc`` = (L, F, out_f, e_zero,
    emin_a, emin_b) for the tensor-core model.

    The kernel's closure holds only ints and bools and reaches
    :func:`_dot_one` as a global, so that Numba's disk cache hits in a new
    process (see the note above :func:`fpemu._kernels.rounding_kernel`).
    """
    model, mode, flags, block = int(model), int(mode), int(flags), int(block)
    paired = bool(paired)

    if native:
        @pjit
        def kernel(A, BT, C, out, p, tc, key):
            M, K = A.shape
            N = BT.shape[0]
            B = np.ascontiguousarray(BT.T).astype(np.float32)
            A32 = A.astype(np.float32)
            for i in prange(M):
                acc = C[i, :].astype(np.float32)
                for k in range(K):
                    a = A32[i, k]
                    for j in range(N):
                        acc[j] = acc[j] + a * B[k, j]
                for j in range(N):
                    out[i, j] = acc[j]

        return kernel

    @pjit
    def kernel(A, BT, C, out, p, tc, key):
        M, K = A.shape
        N = out.shape[1]
        for i in prange(M):
            for jj in range(N):
                j = i if paired else jj
                if block > 0:
                    total = np.float32(C[i, jj])
                    for k0 in range(0, K, block):
                        part = _dot_one(A, BT, i, j, k0, min(k0 + block, K), 0.0, p, tc, key,
                                        model, mode, flags)
                        total = total + np.float32(part)
                    out[i, jj] = total
                else:
                    out[i, jj] = np.float32(_dot_one(A, BT, i, j, 0, K, C[i, jj], p, tc,
                                                     key, model, mode, flags))

    return kernel


#: The exponent that marks a zero input of the tensor-core models (far below
#: any real one); a sum of exponents below ZERO_BELOW holds a zero.
ZERO_EXPONENT = -10000
ZERO_BELOW = -5000


@jit
def _tc_row(a, ea, B, EB, c, L, F, out_f, e_zero):
    """The tensor-core model for one row: ``c[j] += dot(a, B[:, j])`` for
    every column j, in instructions of L products. ``a`` (K,) and ``B``
    (K, N) float64 values, ``ea`` / ``EB`` their exponents (at least the
    input format's emin; ZERO_EXPONENT for zeros), ``c`` (N,) float64, the
    accumulator, updated in place. Per instruction: the largest exponent of
    the accumulator and of the products sets the alignment; every term is
    truncated to F fraction bits below it and the exact sum is truncated to
    fp32 (out_f fraction bits)."""
    K = a.shape[0]
    N = B.shape[1]
    # int32 exponents (every sum of two lies within -20000..300): the pass that
    # finds emax runs on twice the lanes of int64 (a fifth of the kernel's time)
    emax = np.empty(N, np.int32)
    scale = np.empty(N, np.float64)
    s = np.empty(N, np.float64)
    # the loops over j hold no branch and no call that is not inlined, so that
    # they run on vectors: each is one step of the model for every column
    for kb in range(0, K, L):
        k1 = min(kb + L, K)
        for j in range(N):
            ec = max(((f64_bits(c[j]) >> 52) & 0x7FF) - 1023, -126)   # _exponent(c, -126)
            emax[j] = e_zero if c[j] == 0.0 else ec
        if e_zero <= -126:
            # a zero term's exponent sum is below ZERO_BELOW and counts as
            # e_zero, which cannot raise emax: it starts at e_zero or at -126
            for k in range(kb, k1):
                eak = ea[k]
                for j in range(N):
                    emax[j] = max(emax[j], eak + EB[k, j])
        else:                       # a model whose zeros align above fp32's emin
            for k in range(kb, k1):
                eak = ea[k]
                for j in range(N):
                    e = eak + EB[k, j]
                    emax[j] = max(emax[j], e_zero if e < ZERO_BELOW else e)
        for j in range(N):
            scale[j] = _pow2(F - emax[j])
            s[j] = np.trunc(c[j] * scale[j])
        for k in range(kb, k1):
            x = a[k]
            for j in range(N):
                s[j] += np.trunc((x * B[k, j]) * scale[j])  # exact: < 2**33 in all
        for j in range(N):
            # _rz_fp32(v, out_f) without its branches: scaling by powers of two
            # is exact, so v * 2**(out_f - e) is v / 2**(e - out_f)
            v = s[j] * _pow2(emax[j] - F)
            e = max(((f64_bits(v) >> 52) & 0x7FF) - 1023, -126)
            t = np.trunc(v * _pow2(out_f - e)) * _pow2(e - out_f)
            t = t if abs(t) < 2.0**128 else np.copysign(np.inf, t)
            c[j] = t + 0.0          # -0 and a sum truncated to zero are +0 (the hardware's)


@pjit
def tc_matmul(A, EA, B, EB, C, out, L, F, out_f, e_zero):
    """The tensor-core model for a whole product ``C + A @ B``: ``A`` (M, K)
    and ``B`` (K, N) float64 with their exponents ``EA`` / ``EB``, row by
    row (:func:`_tc_row`)."""
    M = A.shape[0]
    N = B.shape[1]
    for i in prange(M):
        c = np.empty(N, np.float64)
        for j in range(N):
            c[j] = C[i, j]
        _tc_row(A[i], EA[i], B, EB, c, L, F, out_f, e_zero)
        for j in range(N):
            out[i, j] = np.float32(c[j])


@pjit
def tc_dot_rows(A, EA, BT, EBT, C, out, L, F, out_f, e_zero):
    """Row-wise dot products under the tensor-core model: ``out[i, 0] =
    C[i, 0] + dot(A[i], BT[i])`` (:func:`_tc_row` with one column)."""
    M, K = A.shape
    for i in prange(M):
        c = np.empty(1, np.float64)
        c[0] = C[i, 0]
        b = np.empty((K, 1), np.float64)
        eb = np.empty((K, 1), np.int64)
        for k in range(K):
            b[k, 0] = BT[i, k]
            eb[k, 0] = EBT[i, k]
        _tc_row(A[i], EA[i], b, eb, c, L, F, out_f, e_zero)
        out[i, 0] = np.float32(c[0])


@jit
def _tc_exponent(x, emin):
    """The exponent a tensor-core model aligns ``x`` by: that of its leading
    bit, at least ``emin`` (the input format's subnormals); ZERO_EXPONENT for
    a zero (``x`` finite)."""
    return ZERO_EXPONENT if x == 0.0 else _exponent(x, emin)


@pjit
def tc_bmm(A, B, C, out, L, F, out_f, e_zero, emin_a, emin_b, block):
    """The tensor-core model for a batch of products ``C[b] + A[b] @ B[b]``:
    ``A`` (nb, M, K) and ``B`` (nb, K, N) float64 holding finite values of the
    input formats, ``C`` (nb, M, N) float64, ``out`` (nb, M, N) float32. The
    exponents are taken here (:func:`_tc_exponent`, once per element), each
    row runs :func:`_tc_row`. With ``block`` > 0, each block of K runs from a
    +0 accumulator and its fp32 result joins a binary32 sum that starts at
    ``C`` (the ``blocked`` promotion)."""
    nb, M, K = A.shape
    N = B.shape[2]
    EB = np.empty((nb, K, N), np.int32)
    for r in prange(nb * K):
        b, k = r // K, r % K
        for j in range(N):
            EB[b, k, j] = _tc_exponent(B[b, k, j], emin_b)
    for r in prange(nb * M):
        b, i = r // M, r % M
        a = A[b, i]
        ea = np.empty(K, np.int32)
        for k in range(K):
            ea[k] = _tc_exponent(a[k], emin_a)
        c = np.empty(N, np.float64)
        if block == 0:
            for j in range(N):
                c[j] = C[b, i, j]
            _tc_row(a, ea, B[b], EB[b], c, L, F, out_f, e_zero)
            for j in range(N):
                out[b, i, j] = np.float32(c[j])
        else:
            total = np.empty(N, np.float32)
            for j in range(N):
                total[j] = np.float32(C[b, i, j])
            for k0 in range(0, K, block):
                k1 = min(k0 + block, K)
                for j in range(N):
                    c[j] = 0.0
                _tc_row(a[k0:k1], ea[k0:k1], B[b, k0:k1], EB[b, k0:k1], c, L, F, out_f,
                        e_zero)
                for j in range(N):
                    total[j] = total[j] + np.float32(c[j])     # binary32, to nearest even
            for j in range(N):
                out[b, i, j] = total[j]


@pjit
def gst_matmul(A, B, SAs, SAe, SBs, SBe, C, out, G, L, F, e_zero, sblock):
    """Blackwell's ``kind::mxf4nvf4`` block-scaled model (MMA-Sim's
    ``gst_fdpa``) for a whole product, a row of the output at a time.

    ``A`` (M, K) and ``B`` (K, N) hold fp4 element values (float64; K a
    multiple of L); ``SAs``/``SAe`` (M, K / sblock) and ``SBs``/``SBe``
    (K / sblock, N) the scales split into significand and exponent. Per
    instruction of L products: each group of G products is summed exactly
    (an unnormalised integer multiple of 2**-2) and multiplied by the two
    scale significands; its alignment exponent is the scales' exponent sum
    (``e_zero`` if the group's products are all zero or a scale is zero);
    the accumulator ``c`` joins with its own exponent; every term is
    truncated toward zero to ``2**(emax - F)``, summed exactly, and the sum
    normalised and truncated to fp32 (2**128 and above: inf, which later
    instructions keep; a NaN or infinite accumulator only adds the groups'
    products).

    Each output element takes exactly these steps in this order; the loops
    run over the row's columns innermost, without branches, so that each is
    one step for every column on vectors (the accumulator that is not finite
    takes its own sum beside the truncated one, and a select keeps it).
    """
    M, K = A.shape
    N = B.shape[1]
    ng = L // G
    for i in prange(M):
        c = np.empty(N, np.float64)
        for j in range(N):
            c[j] = C[i, j]
        p = np.empty((ng, N), np.float64)
        e = np.empty((ng, N), np.int64)
        emax = np.empty(N, np.int64)
        s = np.empty(N, np.float64)
        nz = np.empty(N, np.bool_)
        alt = np.empty(N, np.float64)
        for kb in range(0, K, L):
            for j in range(N):
                emax[j] = e_zero if c[j] == 0.0 else _exponent(c[j], -126)
            for g in range(ng):
                k0 = kb + g * G
                for j in range(N):
                    s[j] = 0.0
                    nz[j] = False
                for k in range(k0, k0 + G):
                    a = A[i, k]
                    for j in range(N):
                        pr = a * B[k, j]
                        s[j] += pr               # exact: multiples of 2**-2 below 2**10
                        nz[j] = nz[j] | (pr != 0.0)
                blk = k0 // sblock
                sa = SAs[i, blk]
                sae = SAe[i, blk]
                for j in range(N):
                    ss = sa * SBs[blk, j]
                    p[g, j] = s[j] * ss
                    eg = sae + SBe[blk, j]
                    eg = eg if nz[j] and ss != 0.0 else e_zero
                    e[g, j] = eg
                    emax[j] = max(emax[j], eg)
            for j in range(N):
                alt[j] = c[j]
                s[j] = np.trunc(c[j] * _pow2(F - emax[j]))
            for g in range(ng):
                for j in range(N):
                    alt[j] += p[g, j]            # inf stays; a NaN scale gives NaN
                    s[j] += np.trunc(p[g, j] * _pow2(e[g, j] - emax[j] + F))
            for j in range(N):
                # _rz_fp32(v, 23) without its branches: scaling by powers of two
                # is exact, so v * 2**(23 - ev) is v / 2**(ev - 23); a zero
                # gives +0, as _rz_fp32's; NaN stays NaN
                v = s[j] * _pow2(emax[j] - F)
                ev = max(((f64_bits(v) >> 52) & 0x7FF) - 1023, -126)
                t = np.trunc(v * _pow2(23 - ev)) * _pow2(ev - 23)
                t = np.copysign(np.inf, t) if abs(t) >= 2.0**128 else t
                c[j] = t + 0.0 if np.isfinite(c[j]) else alt[j]
        for j in range(N):
            out[i, j] = np.float32(c[j])


# ------------------------------------------------ batched float32 matmul
# The "sequential" model for whole batches of float32 matrices, as
# fpemu.autograd's matmul runs it: out[b, i, j] = (((c + a0*b0) + a1*b1) + ...),
# every product and every sum rounded to float32 in index order (no fma:
# Numba leaves LLVM's fp-contract off). A task takes four rows of A and keeps
# their sums in a (4, N) block that stays in L1; each pass over the block adds
# four terms (k .. k+3) to every sum, so a sum is loaded and stored once per
# four terms and each row of B is read once for four rows of the output. The
# order of the adds of every output element is unchanged: the four terms are
# added one after the other, as the single-term loop for the last K % 4 and
# the last M % 4 rows adds them. (One term per pass was bound by the stores
# of the sums: about half the speed; eight or sixteen rows were slower.)

#: rows of A per task of :func:`bmm_sequential`
BMM_ROWS = 4


@jit
def _a4(A, b, i, k, trans_a):
    """A's terms k .. k+3 of row i (A stored transposed when ``trans_a``)."""
    if trans_a:
        return A[b, k, i], A[b, k + 1, i], A[b, k + 2, i], A[b, k + 3, i]
    return A[b, i, k], A[b, i, k + 1], A[b, i, k + 2], A[b, i, k + 3]


@pjit
def bmm_sequential(A, B, out, trans_a):
    """A (batch, M, K), B (batch, K, N), out (batch, M, N), all float32 (or
    all float64: the same order in float64) and C-contiguous; the
    accumulator starts at -0.0 (an empty sum is +0.0).
    ``trans_a``: A is given as its transpose (batch, K, M), C-contiguous (the
    weight gradient's ``g.T @ x`` reads ``g`` where it lies; the terms are
    read one at a time, so the layout costs nothing)."""
    nb = A.shape[0]
    M = A.shape[2] if trans_a else A.shape[1]
    K = B.shape[1]
    N = B.shape[2]
    nrb = (M + BMM_ROWS - 1) // BMM_ROWS
    K4 = K - K % 4
    for t in prange(nb * nrb):
        b = t // nrb
        i0 = (t - b * nrb) * BMM_ROWS
        rows = min(BMM_ROWS, M - i0)
        acc = np.empty((BMM_ROWS, N), out.dtype)
        start = np.float32(0.0) if K == 0 else np.float32(-0.0)     # stored exactly
        for r in range(rows):
            for j in range(N):
                acc[r, j] = start
        k0 = 0
        if rows == BMM_ROWS:
            for k in range(0, K4, 4):
                a00, a01, a02, a03 = _a4(A, b, i0, k, trans_a)
                a10, a11, a12, a13 = _a4(A, b, i0 + 1, k, trans_a)
                a20, a21, a22, a23 = _a4(A, b, i0 + 2, k, trans_a)
                a30, a31, a32, a33 = _a4(A, b, i0 + 3, k, trans_a)
                for j in range(N):
                    b0 = B[b, k, j]
                    b1 = B[b, k + 1, j]
                    b2 = B[b, k + 2, j]
                    b3 = B[b, k + 3, j]
                    acc[0, j] = (((acc[0, j] + a00 * b0) + a01 * b1) + a02 * b2) + a03 * b3
                    acc[1, j] = (((acc[1, j] + a10 * b0) + a11 * b1) + a12 * b2) + a13 * b3
                    acc[2, j] = (((acc[2, j] + a20 * b0) + a21 * b1) + a22 * b2) + a23 * b3
                    acc[3, j] = (((acc[3, j] + a30 * b0) + a31 * b1) + a32 * b2) + a33 * b3
            k0 = K4
        for k in range(k0, K):
            for r in range(rows):
                a = A[b, k, i0 + r] if trans_a else A[b, i0 + r, k]
                for j in range(N):
                    p = a * B[b, k, j]
                    acc[r, j] = acc[r, j] + p
        for r in range(rows):
            for j in range(N):
                out[b, i0 + r, j] = acc[r, j]
