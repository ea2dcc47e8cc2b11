"""The epilogue of a GEMM with fp32 scales per row and K block, as one Numba
pass on the CPU.

:func:`fpemu.autograd.fp8.k_block_epilogue` states it with array operations:
for each K block ``j`` in K order, ``part_j * (sa[:, j] sb[:, j]^T)`` added
to the accumulator, each operation one float32 rounding. Written that way
each block costs an outer product of the scales, a product and a sum, each a
pass over the (M, N) output. :func:`k_block_epilogue_stacked` computes the
same float32 operations in the same order for every output element, reading
each block's partial product once and writing the output once.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import pjit, run_kernel

__all__ = ["k_block_epilogue_stacked"]


@pjit
def _epilogue(P, sa, sbt, out):
    """out[m, n] = sum over j in order of P[j, m, n] * (sa[m, j] * sbt[j, n])
    in float32, the first term the accumulator."""
    nk, M, N = P.shape
    for m in prange(M):
        o = out[m]
        s0 = sa[m, 0]
        p0 = P[0, m]
        b0 = sbt[0]
        for n in range(N):
            o[n] = p0[n] * (s0 * b0[n])
        for j in range(1, nk):
            s = sa[m, j]
            pj = P[j, m]
            bj = sbt[j]
            for n in range(N):
                o[n] = o[n] + pj[n] * (s * bj[n])


def k_block_epilogue_stacked(P, sa, sb):
    """:func:`fpemu.autograd.fp8.k_block_epilogue` of the partial products
    stacked in K order, ``P`` (nk, M, N) float32, with the scales ``sa``
    (M, >= nk) and ``sb`` (N, >= nk): the (M, N) float32 result, the same
    bits."""
    nk, M, N = P.shape
    out = np.empty((M, N), np.float32)
    if out.size:
        run_kernel(_epilogue, np.ascontiguousarray(P, np.float32),
                   np.ascontiguousarray(sa[:, :nk], np.float32),
                   np.ascontiguousarray(np.asarray(sb[:, :nk], np.float32).T), out, inputs=3)
    return out
