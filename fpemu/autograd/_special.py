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
    x = np.ascontiguousarray(x, np.float64)
    out = np.empty(x.size, np.float64)
    _erf_loop(x.reshape(-1), out)
    return out.reshape(x.shape)
