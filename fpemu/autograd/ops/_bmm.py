"""The batched float32 matmul kernels of the default ("sequential")
accumulation model: out[b, i, j] = (((c + a0*b0) + a1*b1) + ...), every
product and every sum rounded to float32 in index order.

The kernel rounds each product, then each sum (no fma). It takes four rows
of A at a time, so each row of B is read once from memory for four rows of
the output (twice the throughput of one row at a time; eight or sixteen rows
were slower); the order of the adds of every output element is unchanged.
"""

import numpy as np
from numba import prange

from ..._jit import pjit

ROWS = 4


@pjit
def bmm_sequential(A, B, out):
    """A (batch, M, K), B (batch, K, N), out (batch, M, N), all float32 and
    C-contiguous; the accumulator starts at -0.0 (an empty sum is +0.0)."""
    nb, M, K = A.shape
    N = B.shape[2]
    nrb = (M + ROWS - 1) // ROWS
    for t in prange(nb * nrb):
        b = t // nrb
        i0 = (t - b * nrb) * ROWS
        rows = min(ROWS, M - i0)
        acc = np.empty((ROWS, N), np.float32)
        start = np.float32(0.0) if K == 0 else np.float32(-0.0)
        for r in range(rows):
            for j in range(N):
                acc[r, j] = start
        for k in range(K):
            for r in range(rows):
                a = A[b, i0 + r, k]
                for j in range(N):
                    p = a * B[b, k, j]
                    acc[r, j] = acc[r, j] + p
        for r in range(rows):
            for j in range(N):
                out[b, i0 + r, j] = acc[r, j]
