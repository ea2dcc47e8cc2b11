"""Numba kernels for correctly rounded arithmetic in any format.

Same contract as :mod:`fpemu._kernels` (arrays and ints in, no exceptions);
``p`` and ``flags`` describe the target format as there.

The method. Operands are values of the format (at most 24 significant bits,
exponents within float32's), so in float64

* a product ``a * b`` is exact (at most 48 bits);
* a sum ``s = a + b`` is exact up to its error ``a + b - s``, which TwoSum
  (Knuth) computes exactly;
* a quotient or square root is exact up to a remainder ``a - q * b`` or
  ``a - s * s``, which one fused multiply-add computes exactly.

The sign of that error is a sticky bit. Folding it into the float64 result by
rounding to odd (keep ``s`` if its last bit is 1, else step one float64 ulp
towards the exact value) gives a 53-bit value that lies on the same side of
every point of any grid with at most 51 bits of precision as the exact result
(Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", IEEE TC 57(4), 2008). Rounding it once
more into the format, in any mode, therefore gives the exact result rounded
once.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange

from ._jit import cache_unit, f32_from_ubits, f64_bits, f64_from_bits, fma, fma32, jit, pjit
from ._kernels import SOURCES, FLUSH, FNUZ, NO_ZERO, RDN, UNSIGNED, _quantize_one, _split_f64

# the kernels below inline fpemu._kernels' functions: their cache is valid only
# while those files are as they are (fpemu._jit.cache_unit)
cache_unit(__name__, SOURCES)

ADD, SUB, MUL, DIV, SQRT, FMA = range(6)
OPS = {"add": ADD, "sub": SUB, "mul": MUL, "div": DIV, "sqrt": SQRT, "fma": FMA}


@jit
def _operand(x, p, flags):
    """(value, ok): x as an operand of the format, and whether it is one.

    ``ok`` is False when x is not a value of the format (more significant bits,
    out of range, inf or NaN the format lacks, -0 in fnuz, zero or a negative
    number in an unsigned format). With FLUSH, subnormal operands read as a
    zero of their sign (denormals-are-zero, as GPUs' flush-to-zero mode).
    """
    numba.literally(flags)
    neg, e, sig, special, frac_nz = _split_f64(x, flags)
    M = p[0]
    emin = p[1]
    emax = p[2]
    if special:
        ok = (p[6] >= 0) if frac_nz else (p[5] >= 0)
        if flags & UNSIGNED:
            ok = ok & (frac_nz | (not neg))
        return x, ok
    s = min((52 - M) + max(emin - e, 0), 62)
    rem = sig & ((np.int64(1) << s) - 1)
    q = min(max(e, emin), emax)
    mag = ((q + p[3] - 1) << M) + (sig >> s)
    zero = sig == 0
    ok = (rem == 0) & (e <= emax) & (mag <= p[4])
    if flags & FNUZ:
        ok = ok & (not (zero & neg))
    if flags & (UNSIGNED | NO_ZERO):
        ok = ok & (not zero) & (not neg)
    if flags & FLUSH:
        if (not zero) & (mag < (np.int64(1) << M)):
            x = -0.0 if neg else 0.0
    return x, ok


@jit
def _sign(v):
    """-1, 0 or +1 (0 for NaN)."""
    return np.int64(v > 0.0) - np.int64(v < 0.0)


@jit
def _two_sum(a, b):
    """(s, sign of the error a + b - s) for s = a + b rounded to float64."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return s, _sign(err)


@jit
def _exact_op(op, mode, a, b, c):
    """(float64 result, sticky): the float64 result of the operation and the
    sign of (exact result - it), for operands of a format of <= 24 bits."""
    if op == ADD or op == SUB:
        if op == SUB:
            b = -b
        s, st = _two_sum(a, b)
        if mode == RDN and s == 0.0 and st == 0 and (np.signbit(a) or np.signbit(b)):
            s = -0.0  # IEEE 754 §6.3: an exact zero sum is -0 when rounding down
        return s, st
    if op == MUL:
        return a * b, np.int64(0)
    if op == DIV:
        q = a / b
        r = fma(-q, b, a)  # exact: the remainder of a correctly rounded quotient
        return q, _sign(r) * _sign(b)
    if op == SQRT:
        r = np.sqrt(a)
        return r, _sign(fma(-r, r, a))  # sqrt(-0) = -0 and sqrt(<0) = NaN come with np.sqrt
    pr = a * b  # FMA: the product is exact
    s, st = _two_sum(pr, c)
    if mode == RDN and s == 0.0 and st == 0 and (np.signbit(pr) or np.signbit(c)):
        s = -0.0
    return s, st


@jit
def _to_odd(x, sticky):
    """x moved to the odd neighbour on the side of the exact value if inexact.

    x is finite and nonzero whenever sticky != 0: float64 sums, quotients and
    square roots of these operands neither overflow nor underflow to zero.
    """
    b = f64_bits(x)
    if sticky != 0 and (b & 1) == 0:
        away = (sticky > 0) == (b >= 0)  # the exact value is farther from 0
        b = b + 1 if away else b - 1
    return f64_from_bits(b)


@functools.lru_cache(maxsize=None)
def arith_kernel(mode, flags):
    """The parallel loop ``kernel(a, b, c, out, p, key, offset, op) -> bad``
    for one rounding mode and set of flags; ``bad`` counts operands that are
    not values of the format (the caller raises; ``out`` then holds no
    meaningful values). ``b`` and ``c`` are ignored where ``op`` does not use
    them.

    The mode and the flags are compiled in; the operation is read at run
    time. A loop per operation as well ran add about 1.5x as fast
    (``bench/bench_arith.py``) but compiled five times as often:
    ``tests/test_arith.py`` (every operation, mode and format family) took
    168 loops, 105 s of compiling, against 34 loops and 53 s. Reading the
    mode at run time as well ran 5x slower.
    """

    @pjit
    def kernel(a, b, c, out, p, key, offset, op):
        arity = 1 if op == SQRT else 3 if op == FMA else 2
        bad = 0
        for i in prange(out.size):
            x, ok_a = _operand(np.float64(a[i]), p, flags)
            y, ok_b = x, ok_a
            z, ok_c = x, ok_a
            if arity >= 2:
                y, ok_b = _operand(np.float64(b[i]), p, flags)
            if arity == 3:
                z, ok_c = _operand(np.float64(c[i]), p, flags)
            bad += np.int64(not (ok_a & ok_b & ok_c))
            r, sticky = _exact_op(op, mode, x, y, z)
            r = _to_odd(r, sticky)
            neg, e, sig, special, frac_nz = _split_f64(r, flags)
            out[i] = np.float32(_quantize_one(neg, e, sig, special, frac_nz, 52, mode, p, flags,
                                              key, offset + i))
        return bad

    return kernel


@pjit
def fma_fp32_rne(a, b, c, out):
    """The fast path of :func:`fpemu.arith.fma` for float32 operands in fp32,
    to nearest even, with subnormals and overflow to inf: the processor's
    fused multiply-add (``llvm.fma.f32``, correctly rounded by definition;
    libm's fmaf where the CPU has no FMA), NaN made the canonical
    0x7fc00000 as the generic kernel makes it. Same bits as
    :func:`arith_kernel` (``tests/test_fast_paths.py``)."""
    nan = f32_from_ubits(np.uint32(0x7FC00000))
    for i in prange(out.size):
        r = fma32(a[i], b[i], c[i])
        out[i] = nan if r != r else r
