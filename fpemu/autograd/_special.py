"""Elementwise float64 functions numpy lacks, as Numba loops."""

import math

import numpy as np
from numba import prange

from .._jit import pjit


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
    from .._jit import run_kernel
    shape = np.shape(arrays[-1])
    flat = [np.ascontiguousarray(a, np.float64).reshape(-1) for a in arrays]
    out = np.empty(flat[-1].size, np.float64)
    run_kernel(loop, *flat, out, inputs=len(flat))
    return out.reshape(shape)


def gelu_erf(v):
    """x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) of a float64 array, in float64
    with libm's erf (one fused loop: no temporaries), and Phi(x) for
    :func:`gelu_erf_grad` (the backward pass then needs no second erf)."""
    from .._jit import run_kernel
    flat = np.ascontiguousarray(v, np.float64).reshape(-1)
    out, cdf = np.empty(flat.size, np.float64), np.empty(flat.size, np.float64)
    run_kernel(_gelu_fwd_loop, flat, out, cdf, inputs=1)
    return out.reshape(np.shape(v)), cdf.reshape(np.shape(v))


def gelu_erf_grad(g, v, cdf):
    """g * (Phi(x) + x phi(x)), the gradient of :func:`gelu_erf`, in float64
    with libm's exp; ``cdf``: Phi(x) as :func:`gelu_erf` returned it."""
    return _flat_loop(_gelu_bwd_loop, g, v, cdf)
