"""fpemu.torch's quantizers as fused Triton kernels, for CUDA tensors.

One kernel per call of :func:`fpemu.torch.quantize`, :func:`fpemu.torch.encode`
and :func:`fpemu.torch.decode`: each element is read once, rounded and
written once, where the element-wise torch code (``_quantize.py``, the path
of other devices) launches a few dozen kernels, one per operation, each a
pass over memory. The arithmetic is that code's, line for line: integer
operations on the float32 bits (split, round at the format's quantum, the
magnitude code with its carry into the exponent field, overflow and the
policy, flushing, the sign rules, NaN; then the float32 bits of a code built
with shifts and the exact integer-to-float32 conversion), so no
floating-point mode of the GPU can change a bit. Stochastic rounding draws
in the kernel by element index: splitmix64 (64-bit integer products) or
Philox4x32-10 (32-bit products and ``umulhi``), the bits of the host.

The format, mode, policy and flags are ``tl.constexpr``: Triton compiles one
kernel per configuration, as Numba does per set of flags. Triton is imported
only here, and this module only for CUDA tensors (``triton`` is the
``cuda`` extra). ``TRITON_INTERPRET=1`` runs the same source on CPU tensors
through Triton's interpreter: ``tests/test_triton_kernels.py`` checks every
kernel that way against fpemu's Numba kernels, bit for bit, on CI's CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..quantize import Cast
from ..rounding import Overflow, Rounding

__all__ = ["round_bits", "decode_codes", "philox_draws", "BLOCK"]

#: Elements per Triton program.
BLOCK = 1024

# The kernels spell the mode, policy and flag numbers as literals (Triton reads
# module globals only when they are constexpr objects); they are these:
assert [int(m) for m in Rounding] + [Cast.SR_PHILOX] == list(range(8))
assert (int(Overflow.INF), int(Overflow.SATURATE), int(Overflow.NAN)) == (0, 1, 2)
assert (Cast.FLUSH, Cast.FNUZ, Cast.UNSIGNED, Cast.NO_ZERO, Cast.NORMALIZE) == (4, 8, 16, 32, 64)


# ------------------------------------------------------------------ the draws
@triton.jit
def _splitmix63(key, idx):
    """splitmix64(key + (idx + 1) * golden) >> 1 (uint64 products wrap)."""
    z = key.to(tl.uint64, bitcast=True) + (idx + 1).to(tl.uint64, bitcast=True) * \
        0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 1).to(tl.int64, bitcast=True)


@triton.jit
def _philox63(key, idx):
    """The top 63 bits of Philox4x32-10's words 1 (high) and 0 of counter
    (idx, 0) under the 64-bit key."""
    k = key.to(tl.uint64, bitcast=True)
    k0 = (k & 0xFFFFFFFF).to(tl.uint32)
    k1 = (k >> 32).to(tl.uint32)
    i = idx.to(tl.uint64, bitcast=True)
    c0 = (i & 0xFFFFFFFF).to(tl.uint32)
    c1 = (i >> 32).to(tl.uint32)
    c2 = tl.zeros_like(c0)
    c3 = tl.zeros_like(c0)
    m0 = tl.full(c0.shape, 0xD2511F53, tl.uint32)
    m1 = tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, m0)
        lo0 = c0 * m0
        hi1 = tl.umulhi(c2, m1)
        lo1 = c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    r = (c1.to(tl.uint64) << 32) | c0.to(tl.uint64)
    return (r >> 1).to(tl.int64, bitcast=True)


# ------------------------------------------------------------------ rounding
@triton.jit
def _leading_bit(sig):
    """floor(log2(sig)) of int32 sig in 1 .. 2**24 (from its float32 bits)."""
    return (sig.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127


@triton.jit
def _bits_of(sig, ex):
    """The float32 bits of sig * 2**ex (sig in 0 .. 2**24, a value float32
    holds exactly); every shift stays within 0 .. 31."""
    f = sig.to(tl.float32).to(tl.int32, bitcast=True)
    top = (f >> 23) - 127 + ex
    normal = (tl.minimum(tl.maximum(top + 127, 0), 254) << 23) | (f & 0x7FFFFF)
    up = ex + 149
    sub = tl.where(up >= 0, sig << tl.minimum(tl.maximum(up, 0), 31),
                   sig >> tl.minimum(tl.maximum(-up, 0), 31))
    return tl.where(sig == 0, 0, tl.where(top >= -126, normal, sub))


@triton.jit
def _rounded(u, idx, key, M: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
             BIAS: tl.constexpr, MAXMAG: tl.constexpr, INFMAG: tl.constexpr,
             FLAGS: tl.constexpr, MODE: tl.constexpr):
    """(magnitude code, negative, nan) of float32 bits u (int32)."""
    neg = u < 0
    pos = u >= 0
    a = u & 0x7FFFFFFF
    ef = a >> 23
    fr = a & 0x7FFFFF
    special = ef == 255
    frac_nz = fr != 0
    sig = tl.where(ef != 0, fr | 0x800000, fr)
    e = tl.maximum(ef, 1) - 127
    if (FLAGS & 64) != 0:                               # NORMALIZE
        lz = tl.where(sig == 0, 23, 23 - _leading_bit(sig))
        e = e - lz
        sig = sig << lz
    shift = tl.maximum(EMIN - e, 0) + (23 - M)
    s = tl.minimum(shift, 30)
    one_s = tl.full(u.shape, 1, tl.int32) << s
    kept = sig >> s
    rem = sig & (one_s - 1)
    half = one_s >> 1
    if MODE == 0:                                       # RNE
        up = tl.where(s > 0, half - 1 + (kept & 1), 0)
        kept = (sig + up) >> s
    elif MODE == 1:                                     # RNA
        kept = (sig + half) >> s
    elif MODE != 2:                                     # not RTZ
        inexact = rem != 0
        if MODE == 3:
            inc = inexact & pos
        elif MODE == 4:
            inc = inexact & neg
        elif MODE == 5:
            inc = inexact & ((kept & 1) == 0)
        else:                                           # SR: a 63-bit threshold
            sh = shift.to(tl.int64)
            r64 = rem.to(tl.int64)
            threshold = tl.where(sh <= 63, r64 << (63 - tl.minimum(sh, 63)),
                                 r64 >> tl.minimum(tl.maximum(sh - 63, 0), 63))
            if MODE == 7:
                draw = _philox63(key, idx)
            else:
                draw = _splitmix63(key, idx)
            inc = draw < threshold
        kept = kept + inc.to(tl.int32)
    q = tl.minimum(tl.maximum(e, EMIN), EMAX)
    mag = (q + (BIAS - 1)) * (1 << M) + kept
    ovf = (e > EMAX) | (mag > MAXMAG)
    if MODE == 2 or MODE == 5:
        ovf_to_inf = ovf & False
    elif MODE == 3:
        ovf_to_inf = ovf & pos
    elif MODE == 4:
        ovf_to_inf = ovf & neg
    else:
        ovf_to_inf = ovf
    to_policy = ovf_to_inf | (special & (fr == 0))
    if (FLAGS & 3) == 0:                                # inf
        mag = tl.where(ovf | to_policy, INFMAG, mag)
        mag = tl.where(ovf & (to_policy == 0), MAXMAG, mag)
    else:
        mag = tl.where(ovf | to_policy, MAXMAG, mag)
    if (FLAGS & 4) != 0:                                # FLUSH
        mag = tl.where(mag < (1 << M), 0, mag)
    if (FLAGS & 32) != 0:                               # NO_ZERO
        mag = tl.maximum(mag, 0)
    nan = special & frac_nz
    if (FLAGS & 3) == 2:                                # NaN policy
        nan = nan | to_policy
    if (FLAGS & 16) != 0:                               # UNSIGNED
        nan = nan | neg | ((sig == 0) & (special == 0))
    if (FLAGS & 8) != 0:                                # FNUZ: no -0
        negative = neg & (mag != 0)
    else:
        negative = neg
    return mag, negative, nan


@triton.jit
def _value_bits(mag, negative, nan, M: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                INFMAG: tl.constexpr, FLAGS: tl.constexpr):
    """The float32 bits (int32) of magnitude codes."""
    if EMIN >= -126 and (FLAGS & 32) == 0:
        normal = (mag << (23 - M)) + ((127 - BIAS) << 23)
        bits = tl.where(mag < (1 << M), _bits_of(mag, tl.zeros_like(mag) + (EMIN - M)), normal)
    else:
        field = mag >> M
        frac = mag & ((1 << M) - 1)
        if (FLAGS & 32) != 0:                           # NO_ZERO (e8m0)
            sig = frac | (1 << M)
            ex = field - (BIAS + M)
        else:
            sig = tl.where(field != 0, frac | (1 << M), frac)
            ex = tl.maximum(field, 1) - (BIAS + M)
        bits = _bits_of(sig, ex)
    if INFMAG >= 0:
        bits = tl.where(mag == INFMAG, 0x7F800000, bits)
    bits = tl.where(negative, bits | (-2147483647 - 1), bits)
    return tl.where(nan, 0x7FC00000, bits)


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, key, offset,
                  M: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr, BIAS: tl.constexpr,
                  MAXMAG: tl.constexpr, INFMAG: tl.constexpr, NANCODE: tl.constexpr,
                  SIGN_SHIFT: tl.constexpr, FLAGS: tl.constexpr, MODE: tl.constexpr,
                  ENCODE: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    """quantize (float32 bits out) or encode (codes out) of n float32 bits."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    u = tl.load(x_ptr + idx, mask=m, other=0)
    mag, negative, nan = _rounded(u, idx + offset, key, M, EMIN, EMAX, BIAS, MAXMAG, INFMAG,
                                  FLAGS, MODE)
    if ENCODE:
        sign = tl.full(mag.shape, 1, tl.int32) << SIGN_SHIFT     # (bit 31: int32's minimum)
        code = tl.where(negative, mag | sign, mag)
        code = tl.where(nan, NANCODE, code)
        if WIDE:                                        # 32-bit codes: the pattern as uint32
            tl.store(out_ptr + idx, code.to(tl.uint32, bitcast=True), mask=m)
        else:
            tl.store(out_ptr + idx, code.to(out_ptr.dtype.element_ty), mask=m)
    else:
        bits = _value_bits(mag, negative, nan, M, EMIN, BIAS, INFMAG, FLAGS)
        tl.store(out_ptr + idx, bits, mask=m)


@triton.jit
def _decode_kernel(c_ptr, out_ptr, n, M: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                   MAXMAG: tl.constexpr, INFMAG: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                   FLAGS: tl.constexpr, BLOCK: tl.constexpr):
    """The float32 bits of n valid codes (any unsigned integer dtype)."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    c = tl.load(c_ptr + idx, mask=m, other=0).to(tl.int64)
    mag = (c & ((1 << SIGN_SHIFT) - 1)).to(tl.int32)
    if (FLAGS & 16) != 0:                               # UNSIGNED
        negative = tl.zeros_like(mag) != 0
    else:
        negative = ((c >> SIGN_SHIFT) & 1) != 0
    nan = (mag > MAXMAG) & (mag != INFMAG)
    if (FLAGS & 8) != 0:                                # FNUZ: the -0 code is NaN
        nan = nan | (negative & (mag == 0))
    bits = _value_bits(mag, negative, nan, M, EMIN, BIAS, INFMAG, FLAGS)
    tl.store(out_ptr + idx, bits, mask=m)


@triton.jit
def _draws_kernel(out_ptr, n, key, offset, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """The top 63 - SHIFT bits of each element's Philox draw (srN's bits)."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    tl.store(out_ptr + idx, _philox63(key, idx + offset) >> SHIFT, mask=m)


# ------------------------------------------------------------------ launchers
def _grid(n):
    return (triton.cdiv(n, BLOCK),)


def round_bits(u, plan, out, encode):
    """Round the float32 bits ``u`` (a contiguous int32 tensor) under the
    ``fpemu.torch`` plan ``plan`` into ``out`` (contiguous: int32 bits for
    quantize, the format's code dtype for encode). Returns ``out``."""
    n = u.numel()
    if n:
        L = plan.layout
        _round_kernel[_grid(n)](
            u, out, n, plan.key, plan.offset, M=L.mantissa_bits, EMIN=L.emin, EMAX=L.emax,
            BIAS=L.bias, MAXMAG=L.max_code, INFMAG=L.inf_code, NANCODE=L.nan_code,
            SIGN_SHIFT=L.sign_shift, FLAGS=plan.flags, MODE=plan.mode, ENCODE=bool(encode),
            WIDE=plan.code_bytes == 4, BLOCK=BLOCK)
    return out


def philox_draws(out, key, offset, bits):
    """The top ``bits`` bits of the 63-bit Philox draw of elements ``offset
    ..`` under ``key`` into the int64 tensor ``out``. Returns ``out``."""
    n = out.numel()
    if n:
        _draws_kernel[_grid(n)](out, n, key, offset, SHIFT=63 - bits, BLOCK=BLOCK)
    return out


def decode_codes(c, plan, out):
    """The float32 bits (into the int32 tensor ``out``) of the valid codes
    ``c`` (a contiguous unsigned integer tensor). Returns ``out``."""
    n = c.numel()
    if n:
        L = plan.layout
        _decode_kernel[_grid(n)](
            c, out, n, M=L.mantissa_bits, EMIN=L.emin, BIAS=L.bias, MAXMAG=L.max_code,
            INFMAG=L.inf_code, SIGN_SHIFT=L.sign_shift, FLAGS=plan.flags, BLOCK=BLOCK)
    return out
