"""Elementwise float64 functions numpy lacks, as Numba loops."""

import math

import numpy as np
from numba import prange

from .._jit import f32_ubits, jit, pjit, run_kernel


@pjit
def _erf_loop(x, out):
    for i in prange(x.size):
        out[i] = math.erf(x[i])


def erf(x):
    """erf of a float64 array (libm's, via Numba), same shape."""
    return _flat_loop(_erf_loop, x)


_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


@pjit
def _gelu_fwd_loop(v, out, cdf):
    for i in prange(v.size):
        x = v[i]
        e = math.erf(x * _SQRT1_2)
        out[i] = 0.5 * x * (1.0 + e)
        cdf[i] = 0.5 * (1.0 + e)


@pjit
def _gelu_bwd_loop(g, v, cdf, out):
    for i in prange(v.size):
        x = v[i]
        out[i] = g[i] * (cdf[i] + x * math.exp(-0.5 * x * x) * _INV_SQRT_2PI)


def _flat_loop(loop, *arrays):
    shape = np.shape(arrays[-1])
    flat = [np.ascontiguousarray(a, np.float64).reshape(-1) for a in arrays]
    out = np.empty(flat[-1].size, np.float64)
    run_kernel(loop, *flat, out, inputs=len(flat))
    return out.reshape(shape)


def gelu_erf(v):
    """x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) of a float64 array, in float64
    with libm's erf (one fused loop: no temporaries), and Phi(x) for
    :func:`gelu_erf_grad` (the backward pass then needs no second erf)."""
    flat = np.ascontiguousarray(v, np.float64).reshape(-1)
    out, cdf = np.empty(flat.size, np.float64), np.empty(flat.size, np.float64)
    run_kernel(_gelu_fwd_loop, flat, out, cdf, inputs=1)
    return out.reshape(np.shape(v)), cdf.reshape(np.shape(v))


def gelu_erf_grad(g, v, cdf):
    """g * (Phi(x) + x phi(x)), the gradient of :func:`gelu_erf`, in float64
    with libm's exp; ``cdf``: Phi(x) as :func:`gelu_erf` returned it."""
    return _flat_loop(_gelu_bwd_loop, g, v, cdf)


# GELU of 16-bit inputs by table. A bf16 or fp16 tensor holds at most 2**16
# distinct values, so its GELU and the factor of its gradient are looked up in
# tables of all 2**16 codes, computed once per format by the loops above from
# the same float64 inputs: the same bits as computing every element, for a
# gather instead of an erf (about 25 ns) per element.
_TABLES16 = {}


@jit
def _bf16_lookup(v, table, codes, out):
    """``out[i] = table[code of v[i]]``, keeping the codes, for float64 ``v``
    whose elements are finite bf16 values; False (and ``out`` unwritten)
    otherwise. The codes and the check come first, in a loop with no exit
    (LLVM vectorises it), then the look-ups."""
    bad = np.uint32(0)
    for i in range(v.size):
        x = v[i]
        f = np.float32(x)
        b = f32_ubits(f)
        bad |= ((b & np.uint32(0xFFFF)) | np.uint32(np.float64(f) != x)
                | np.uint32((b & np.uint32(0x7F800000)) == np.uint32(0x7F800000)))
        codes[i] = b >> np.uint32(16)
    if bad != np.uint32(0):
        return False
    for i in range(v.size):
        out[i] = table[codes[i]]
    return True


@jit
def _lookup_times(g, table, codes, out):
    """``out[i] = g[i] * table[codes[i]]`` (float64)."""
    for i in range(g.size):
        out[i] = g[i] * table[codes[i]]


def _codes16(v, fmt):
    """The codes of a float64 array of finite ``fmt`` ("bf16" or "fp16")
    values, or None when an element is not one of them. Infinities and NaNs
    take the loops: their results are NaNs, and a gradient multiplied by a
    NaN from a table could keep another payload than the loop's product."""
    if not np.isfinite(v).all():
        return None
    if fmt == "bf16":
        bits = v.astype(np.float32).view(np.uint32)
        if (bits & np.uint32(0xFFFF)).any() or not np.array_equal(
                bits.view(np.float32).astype(np.float64), v):
            return None
        return bits >> np.uint32(16)
    h = v.astype(np.float16)
    if not np.array_equal(h.astype(np.float64), v):
        return None
    return h.view(np.uint16)


def _table16(fmt):
    t = _TABLES16.get(fmt)
    if t is None:
        codes = np.arange(1 << 16, dtype=np.uint32)
        with np.errstate(all="ignore"):                   # the NaN codes
            x = ((codes << np.uint32(16)).view(np.float32) if fmt == "bf16"
                 else codes.astype(np.uint16).view(np.float16)).astype(np.float64)
            y, cdf = gelu_erf(x)
            fac = gelu_erf_grad(np.ones_like(x), x, cdf)       # 1 * factor: exact
        t = _TABLES16[fmt] = (y, fac)
    return t


class GeluErf:
    """:func:`gelu_erf` and :func:`gelu_erf_grad` of one call, through the
    tables of its format when the input is bf16 or fp16 (``fmt``: the input
    dtype's name)."""

    def __init__(self, fmt):
        self.fmt = fmt if fmt in ("bf16", "fp16") else None
        self.codes = self.cdf = None

    def forward(self, v):
        if self.fmt == "bf16":                      # one pass: check, code, look up
            flat = np.ascontiguousarray(v, np.float64).reshape(-1)
            codes, out = np.empty(flat.size, np.uint32), np.empty(flat.size, np.float64)
            if run_kernel(_bf16_lookup, flat, _table16("bf16")[0], codes, out, inputs=2):
                self.codes = codes
                return out.reshape(np.shape(v))
        elif self.fmt is not None:
            self.codes = _codes16(v, self.fmt)
            if self.codes is not None:
                return _table16(self.fmt)[0][self.codes]
        y, self.cdf = gelu_erf(v)
        return y

    def backward(self, g, v):
        if self.codes is not None:
            G = np.ascontiguousarray(np.broadcast_to(g, np.shape(v)), np.float64).reshape(-1)
            out = np.empty(G.size, np.float64)
            codes = self.codes.reshape(-1).astype(np.uint32, copy=False)
            run_kernel(_lookup_times, G, _table16(self.fmt)[1], codes, out, inputs=3)
            return out.reshape(np.shape(v))
        return gelu_erf_grad(np.broadcast_to(g, v.shape), v, self.cdf)
