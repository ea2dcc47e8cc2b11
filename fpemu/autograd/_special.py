"""Elementwise float64 functions numpy lacks, as Numba loops: erf, erfc, GELU and
its gradient (by table for 16-bit inputs), and the row sums of the embedding
backward."""

import math

import numpy as np
from numba import prange

from .._jit import f32_ubits, jit, pjit, run_kernel
from ..formats import format as _format
from ..quantize import decode


@pjit
def _erf_loop(x, out):
    for i in prange(x.size):
        out[i] = math.erf(x[i])


def erf(x):
    """erf of a float64 array (libm's, via Numba), same shape."""
    return _flat_loop(_erf_loop, x)


@pjit
def _erfc_loop(x, out):
    for i in prange(x.size):
        out[i] = math.erfc(x[i])


def erfc(x):
    """erfc = 1 - erf of a float64 array (libm's, via Numba: accurate where
    erf is near 1), same shape."""
    return _flat_loop(_erfc_loop, x)


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


@jit
def _add_rows_at(rows, vals, G):
    for r in range(rows.size):
        i = rows[r]
        for c in range(G.shape[1]):
            G[i, c] = G[i, c] + vals[r, c]


def add_rows_at(G, rows, vals):
    """``np.add.at(G, rows, vals)`` for a float64 matrix ``G``, int64 row
    indices in range and float64 ``vals`` (len(rows), G.shape[1]): the rows
    added one after the other in index order, as ``ufunc.at`` adds them (the
    same sums, bit for bit), without its per-element dispatch."""
    run_kernel(_add_rows_at, np.ascontiguousarray(rows, np.int64),
               np.ascontiguousarray(vals, np.float64), G, inputs=2)


# GELU of 16-bit inputs by table. A bf16 or fp16 tensor holds at most 2**16
# distinct values, so its GELU and the factor of its gradient are looked up in
# tables of all 2**16 codes, computed once per format by the loops above from
# the same float64 inputs: the same bits as computing every element, for a
# gather instead of an erf (about 25 ns) per element. The codes come from the
# tensor's float32 storage, with no float64 copy.
_TABLES16 = {}


@jit
def _bf16_codes(x, codes):
    """The bf16 codes of a float32 array, or False when an element is not a
    finite bf16 value (a loop with no exit: LLVM vectorises it)."""
    bad = np.uint32(0)
    for i in range(x.size):
        b = f32_ubits(x[i])
        bad |= ((b & np.uint32(0xFFFF))
                | np.uint32((b & np.uint32(0x7F800000)) == np.uint32(0x7F800000)))
        codes[i] = b >> np.uint32(16)
    return bad == np.uint32(0)


@jit
def _gather(table, codes, out):
    """``out[i] = table[codes[i]]``."""
    for i in range(codes.size):
        out[i] = table[codes[i]]


@jit
def _times_factor(g, table, codes, out):
    """``out[i] = float32(float64(g[i]) * table[codes[i]])``: the float64
    product, rounded to float32 as numpy's cast rounds it (to nearest even)."""
    for i in range(g.size):
        out[i] = np.float32(np.float64(g[i]) * table[codes[i]])


def codes16(x32, fmt):
    """The codes (uint32) of a float32 array of finite ``fmt`` ("bf16" or
    "fp16") values, flattened, or None when an element is not one of them.
    Infinities and NaNs take the element loops: their results are NaNs, and a
    gradient multiplied by a NaN from a table could keep another payload than
    the loop's product."""
    flat = np.ascontiguousarray(x32, np.float32).reshape(-1)
    if fmt == "bf16":
        codes = np.empty(flat.size, np.uint32)
        return codes if run_kernel(_bf16_codes, flat, codes, inputs=1) else None
    with np.errstate(all="ignore"):
        h = flat.astype(np.float16)
    if not (np.isfinite(flat).all() and np.array_equal(h.astype(np.float32), flat)):
        return None
    return h.view(np.uint16).astype(np.uint32)


def table16(fmt):
    """(GELU, gradient factor) of every code of ``fmt`` as float64, from
    :func:`gelu_erf` and :func:`gelu_erf_grad`."""
    t = _TABLES16.get(fmt)
    if t is None:
        codes = np.arange(1 << 16).astype(_format(fmt).code_dtype)
        x = decode(codes, fmt).astype(np.float64)          # every value, by its code
        with np.errstate(all="ignore"):                   # the NaN codes
            y, cdf = gelu_erf(x)
            fac = gelu_erf_grad(np.ones_like(x), x, cdf)       # 1 * factor: exact
        t = _TABLES16[fmt] = (y, fac)
    return t


def gather(table, codes):
    """``table[codes]`` (a flat array of ``table``'s dtype)."""
    out = np.empty(codes.size, table.dtype)
    run_kernel(_gather, table, codes, out, inputs=2)
    return out


def times_factor(g, codes, fmt):
    """``float32(g * factor)`` per element: the gradient of GELU before its
    rounding to the dtype, from the codes :func:`codes16` returned."""
    G = np.ascontiguousarray(g, np.float32).reshape(-1)
    out = np.empty(G.size, np.float32)
    run_kernel(_times_factor, G, table16(fmt)[1], codes, out, inputs=3)
    return out
