"""fpemu.torch's quantizers as fused Triton kernels, for CUDA tensors.

One kernel per call of :func:`fpemu.torch.quantize`, :func:`fpemu.torch.encode`
and :func:`fpemu.torch.decode`: each element is read once, rounded and
written once, where the element-wise torch code (``_quantize.py``, the path
of other devices) launches a few dozen kernels, one per operation, each a
pass over memory. The arithmetic is fpemu's element rounding,
:mod:`fpemu._elemround`, the source that the Numba kernels and the torch
code run too, compiled by ``triton.jit`` with Triton's primitives
(:data:`_elements`): integer operations on the float32 bits, so no
floating-point mode of the GPU can change a bit. Stochastic rounding draws
in the kernel by element index: splitmix64 (64-bit integer products) or
Philox4x32-10 (32-bit products and ``umulhi``), the bits of the host.

The format, mode, policy and flags are ``tl.constexpr``: Triton compiles one
kernel per configuration, as Numba does per set of flags, and the ``if``
statements of :mod:`fpemu._elemround` on them are resolved while it
compiles. Triton is imported only here, and this module only for CUDA
tensors (``triton`` is the ``cuda`` extra). ``TRITON_INTERPRET=1`` runs the
same source on CPU tensors through Triton's interpreter:
``tests/test_triton_kernels.py`` checks every kernel that way against
fpemu's Numba kernels, bit for bit, on CI's CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from .. import _elemround

__all__ = ["round_bits", "decode_codes", "philox_draws", "BLOCK"]

#: Elements per Triton program.
BLOCK = 1024


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


# ------------------------------------------------- the element rounding
#: the kernels' mode number of Philox stochastic rounding, as Triton reads a
#: constant
_SR_PHILOX = tl.constexpr(_elemround.SR_PHILOX)


@triton.jit
def _draw63(key, idx, mode):
    if mode == _SR_PHILOX:
        draw = _philox63(key, idx)
    else:
        draw = _splitmix63(key, idx)
    return draw


# Triton's primitives for fpemu._elemround: each a jit function calling
# triton.language through its module (the interpreter replaces the module's
# functions while it runs a kernel). tl.cast turns a constant into a tensor
# first, so ``shl(1, 31)`` is int32's -2**31, as in the other backends.
@triton.jit
def _where(c, a, b):
    return tl.where(c, a, b)


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _i32(x):
    return tl.cast(x, tl.int32)


@triton.jit
def _i64(x):
    return tl.cast(x, tl.int64)


@triton.jit
def _shl(a, s):
    return tl.cast(a, tl.int32) << s


@triton.jit
def _ashr(a, s):
    return tl.cast(a, tl.int32) >> s


@triton.jit
def _lnot(b):
    return b == 0


@triton.jit
def _float_bits(n):
    return n.to(tl.float32).to(tl.int32, bitcast=True)


#: :mod:`fpemu._elemround` compiled by Triton: its functions under
#: ``triton.jit``, its constants ``tl.constexpr`` (the only globals a
#: compiled kernel reads); under the interpreter, which runs the functions
#: as Python with the kernel's constexpr arguments as ints, Python ints.
_elements = _elemround.bind("fpemu.torch._triton.elements", dict(
    where=_where, minimum=_minimum, maximum=_maximum, i32=_i32, i64=_i64, shl=_shl, ashr=_ashr,
    lnot=_lnot, float_bits=_float_bits, draw63=_draw63, tl=tl),
    wrap=triton.jit, constant=None if isinstance(_where, InterpretedFunction) else tl.constexpr)


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
    mag, negative, nan = _elements.rounded(u, M, EMIN, EMAX, BIAS, MAXMAG, INFMAG, FLAGS, MODE,
                                           key, idx + offset)
    if ENCODE:
        code = _elements.code(mag, negative, nan, SIGN_SHIFT, NANCODE)
        if WIDE:                                        # 32-bit codes: the pattern as uint32
            tl.store(out_ptr + idx, code.to(tl.uint32, bitcast=True), mask=m)
        else:
            tl.store(out_ptr + idx, code.to(out_ptr.dtype.element_ty), mask=m)
    else:
        bits = _elements.value_bits(mag, negative, nan, M, EMIN, BIAS, INFMAG, FLAGS)
        tl.store(out_ptr + idx, bits, mask=m)


@triton.jit
def _decode_kernel(c_ptr, out_ptr, n, M: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                   MAXMAG: tl.constexpr, INFMAG: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                   FLAGS: tl.constexpr, BLOCK: tl.constexpr):
    """The float32 bits of n valid codes (any unsigned integer dtype)."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = idx < n
    c = tl.load(c_ptr + idx, mask=m, other=0).to(tl.int64).to(tl.int32)   # (wraps 32-bit codes)
    mag, negative, nan = _elements.decoded(c, M, EMIN, BIAS, MAXMAG, INFMAG, SIGN_SHIFT, FLAGS)
    bits = _elements.value_bits(mag, negative, nan, M, EMIN, BIAS, INFMAG, FLAGS)
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


def _int32(v):
    """The int32 of 32-bit pattern ``v`` (a code of a 32-bit format)."""
    return v - (1 << 32) if v >= 1 << 31 else v


def round_bits(u, plan, out, encode):
    """Round the float32 bits ``u`` (a contiguous int32 tensor) under the
    ``fpemu.torch`` plan ``plan`` into ``out`` (contiguous: int32 bits for
    quantize, the format's code dtype for encode). Returns ``out``."""
    n = u.numel()
    if n:
        L = plan.layout
        _round_kernel[_grid(n)](
            u, out, n, plan.key, plan.offset, M=L.mantissa_bits, EMIN=L.emin, EMAX=L.emax,
            BIAS=L.bias, MAXMAG=L.max_code, INFMAG=L.inf_code, NANCODE=_int32(L.nan_code),
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
