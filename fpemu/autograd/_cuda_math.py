"""CUDA's float32 ``powf``, bit for bit.

Fused Adam and AdamW on CUDA compute their bias corrections as ``1 -
powf(float32(beta), float32(step))``, and CUDA's ``powf`` is not correctly
rounded: for beta = 0.999 about 6 % of the steps get a power one ulp off the
correctly rounded one, which changes the parameter by an ulp and, from then
on, its whole trajectory.

:func:`powf` follows, operation by operation, the machine code that nvcc 13.0
generates for ``powf`` on sm_90 (``nvcc -arch=sm_90 -cubin``, then
``cuobjdump -sass``): the logarithm of the significand, reduced to
[sqrt(1/2), sqrt(2)), as a float-float pair from a polynomial, the product
with the exponent split exactly with an fma, and 2**x from a degree-6
polynomial scaled by two powers of two. Every step is an IEEE float32 add,
multiply or fma except one: the reciprocal ``MUFU.RCP`` (PTX
``rcp.approx.ftz.f32``) of m + 1, which is not correctly rounded and not
documented bit for bit. Its value on every input powf can give it, each
float32 in [1.70, 2.43], was measured on an NVIDIA H200 (an H100 gave the
same) and is stored in ``cuda_rcp_sm90.npz`` as the difference from the
correctly rounded reciprocal (-1, 0 or +1 ulp; 13.5 % of the inputs differ).

Checked (``tests/test_cuda_powf.py``) against powf measured on that GPU: every
step up to ``beta**step < 2**-26`` of 15 common betas (257,303 values) and
65,536 random positive bases and exponents. With the correctly rounded
reciprocal instead of the measured one, 31 of 262,144 random powers differ.
How the GPU and the data were measured: ``bench/cuda_powf.py``.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._aten import fma

_f = np.float32
_DATA = os.path.join(os.path.dirname(__file__), "cuda_rcp_sm90.npz")


@functools.lru_cache(maxsize=1)
def _rcp_table():
    with np.load(_DATA) as d:
        return int(d["first_bits"]), d["ulps"].astype(np.int32)


def rcp_approx(x):
    """MUFU.RCP (``rcp.approx.ftz.f32``) of float32 ``x`` in [1.70, 2.43], as
    measured on sm_90."""
    x = np.asarray(x, np.float32)
    first, ulps = _rcp_table()
    i = x.view(np.uint32).astype(np.int64) - first
    if np.any((i < 0) | (i >= ulps.size)):
        raise ValueError("rcp_approx: only [1.70, 2.43] was measured (the values powf's "
                         f"logarithm reciprocates); got {x.min()} .. {x.max()}")
    with np.errstate(all="ignore"):
        rn = (_f(1) / x).astype(np.float32)
    return (rn.view(np.int32) + ulps[i]).astype(np.int32).view(np.float32)


def _bits(u):
    return (np.asarray(u, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


# the constants of the machine code, as float32 bit patterns
_LOG2E_HI, _LOG2E_LO = _bits(0x3FB8AA3B), _bits(0x32A55E34)
_LOG_POLY = [_bits(c) for c in (0x3A2C32E4, 0x3B52E7DB, 0x3C93BB73, 0x3DF6384F)]
_EXP_POLY = [_bits(c) for c in (0x391FCB8E, 0x3AAF85ED, 0x3C1D9856, 0x3D6357BB, 0x3E75FDEC,
                                0x3F317218)]


def _pow_abs(a, b):
    """|a| ** b for finite nonzero a (the main path)."""
    A = np.abs(a)
    sub = A < _f(2.0**-126)
    A = np.where(sub, A * _f(2.0**24), A).astype(np.float32)
    e0 = np.where(sub, _f(-24), _f(0)).astype(np.float32)
    # m = A / 2**k in [sqrt(1/2), sqrt(2)): k from the bits of A - 0x3f3504f3
    kbits = (A.view(np.uint32).astype(np.int64) - 0x3F3504F3) & 0xFF800000
    kbits = kbits.astype(np.uint32).view(np.int32)
    m = _bits(A.view(np.uint32).astype(np.int64) - kbits.astype(np.int64))
    e = fma(kbits.astype(np.float32), _f(2.0**-23), e0)              # k (+ -24)
    mp1 = (m + _f(1)).astype(np.float32)
    mm1 = (m - _f(1)).astype(np.float32)
    r = rcp_approx(mp1)
    u = (r * (mm1 + mm1)).astype(np.float32)                          # 2(m-1)/(m+1)
    u2 = (u * u).astype(np.float32)
    hi = fma(u, _LOG2E_HI, e)
    corr = fma(mm1, -u, ((mm1 - u) + (mm1 - u)).astype(np.float32))
    corr = (r * corr).astype(np.float32)                              # u's rounding error
    poly = fma(u2, _LOG_POLY[0], _LOG_POLY[1])
    poly = fma(u2, poly, _LOG_POLY[2])
    poly = fma(u2, poly, _LOG_POLY[3])
    poly = (u2 * poly).astype(np.float32)
    lo = fma(u, _LOG2E_HI, (e - hi).astype(np.float32))
    lo = fma(corr, _LOG2E_HI, lo)
    lo = fma(u, _LOG2E_LO, lo)
    lo = fma(corr, (poly * _f(3)).astype(np.float32), lo)
    lo = fma(u, poly, lo)
    H = (hi + lo).astype(np.float32)                                  # log2|a| = H + L
    L = (lo - (H - hi)).astype(np.float32)
    P = (b * H).astype(np.float32)
    N = np.rint(P).astype(np.float32)
    x = (fma(b, L, fma(b, H, -P)) + (P - N)).astype(np.float32)      # b log2|a| - N
    q = fma(x, _EXP_POLY[0], _EXP_POLY[1])
    for c in _EXP_POLY[2:]:
        q = fma(x, q, c)
    q = fma(x, q, _f(1))                                              # 2**x
    sel = np.where(N > 0, 0, 0x83000000).astype(np.int64)
    n = np.clip(np.nan_to_num(N), -200, 200).astype(np.int64)    # |P| > 152: replaced below
    out = ((q * _bits(sel + 0x7F000000)).astype(np.float32) * _bits((n << 23) - sel))
    out = out.astype(np.float32)
    return np.where(np.abs(P) > _f(152), np.where(P >= 0, _f(np.inf), _f(0)), out)


def powf(a, b):
    """CUDA's ``powf(a, b)`` for float32 arrays (or numbers), as an H200 with
    nvcc 13.0 computes it, special cases included (C99's, NaN as a + b)."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with np.errstate(all="ignore"):
        finite_nz = np.isfinite(a) & (a != 0)
        main = _pow_abs(np.where(finite_nz, a, _f(1)), np.where(np.isnan(b), _f(0), b))
        odd = np.abs(b - _f(2) * np.trunc(b * _f(0.5))) == _f(1)
        integer = np.floor(b) == b
        out = np.where(a < 0, np.where(integer, np.where(odd, -main, main), _f(np.nan)), main)
        # a = ±0 or ±inf: 2a, turned 0 <-> inf for b < 0, the sign kept only for odd b
        z = (a + a).astype(np.float32).view(np.uint32)
        z = np.where(b < 0, z ^ np.uint32(0x7F800000), z)
        z = np.where(odd, z, z & np.uint32(0x7FFFFFFF)).view(np.float32)
        out = np.where(finite_nz, out, z)
        out = np.where(np.isinf(b) & (a == -1), _f(1), out)
        out = np.where(np.isnan(a) | np.isnan(b), (a + b).astype(np.float32), out)
        out = np.where((a == 1) | (b == 0), _f(1), out)
    return out.astype(np.float32)
