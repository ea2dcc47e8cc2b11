"""Stochastic rounding's random draws: splitmix64 and Philox4x32-10.

Element ``i`` of a call draws 63 uniform random bits from its index alone
(``offset + i``) under the seed's 64-bit key, whatever thread computes it, so
a seed gives the same bits in any chunking and on any device (the torch code
and the Triton kernels of :mod:`fpemu.torch` compute the same generators).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._elemround import SR_PHILOX
from .._jit import jit, pjit

# splitmix64 constants (Steele, Lea, Flood 2014): the counter-based generator
# behind stochastic rounding. Element i of a call gets the bits
# splitmix64(key + (offset + i + 1) * GOLDEN), whatever thread computes it.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S1 = np.uint64(1)
_S27 = np.uint64(27)
_S30 = np.uint64(30)
_S31 = np.uint64(31)


@jit
def _splitmix63(key, index):
    """63 uniform random bits for element ``index`` under ``key`` (splitmix64)."""
    z = np.uint64(key) + np.uint64(index + 1) * _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return np.int64(z >> _S1)


# Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
# easy as 1, 2, 3", SC 2011; cuRAND's and PyTorch CUDA's generator): ten
# rounds of two 32 x 32 -> 64-bit products over a 128-bit counter, the 64-bit
# key bumped by the Weyl constants between rounds. Element i of a call takes
# the block of counter (offset + i, 0) under the seed's 64-bit key: its first
# two words make the draw.
_PH_M0 = np.uint64(0xD2511F53)
_PH_M1 = np.uint64(0xCD9E8D57)
_PH_W0 = np.uint64(0x9E3779B9)
_PH_W1 = np.uint64(0xBB67AE85)
_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@jit
def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four 32-bit output words (uint64) of Philox4x32-10 for counter
    words ``c0..c3`` and key words ``k0, k1`` (each below 2**32)."""
    c0, c1, c2, c3 = np.uint64(c0), np.uint64(c1), np.uint64(c2), np.uint64(c3)
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = _PH_M0 * c0
        p1 = _PH_M1 * c2
        c0, c1, c2, c3 = (((p1 >> _S32) ^ c1 ^ k0) & _M32, p1 & _M32,
                          ((p0 >> _S32) ^ c3 ^ k1) & _M32, p0 & _M32)
        k0 = (k0 + _PH_W0) & _M32
        k1 = (k1 + _PH_W1) & _M32
    return c0, c1, c2, c3


@jit
def _philox63(key, index):
    """63 uniform random bits for element ``index`` under ``key``: the top 63
    bits of Philox4x32-10's first two words (word 1 high)."""
    k = np.uint64(key)
    i = np.uint64(index)
    w0, w1, _, _ = philox4x32(i & _M32, i >> _S32, 0, 0, k & _M32, k >> _S32)
    return np.int64(((w1 << _S32) | w0) >> _S1)


@jit
def _random63(key, index, mode):
    """63 uniform random bits for element ``index`` under ``key``, from the
    generator of ``mode`` (SR: splitmix64, SR_PHILOX: Philox4x32-10)."""
    if mode == SR_PHILOX:
        return _philox63(key, index)
    return _splitmix63(key, index)


@pjit
def random63_kernel(key, offset, mode, out):
    """``out[i]`` = the 63-bit draw of element ``offset + i`` under ``key``
    from the generator of ``mode`` (SR or SR_PHILOX)."""
    for i in prange(out.size):
        out[i] = _random63(key, offset + i, mode)
