"""The batched float32 matmul kernel of the default ("sequential")
accumulation model: out[b, i, j] = (((c + a0*b0) + a1*b1) + ...), every
product and every sum rounded to float32 in index order (no fma)."""

import numpy as np
from numba import prange

from ..._jit import pjit


@pjit
def bmm_sequential(A, B, out):
    """A (batch, M, K), B (batch, K, N), out (batch, M, N), all float32 and
    C-contiguous; the accumulator starts at -0.0 (an empty sum is +0.0)."""
    nb, M, K = A.shape
    N = B.shape[2]
    for t in prange(nb * M):
        b = t // M
        i = t - b * M
        acc = np.empty(N, np.float32)
        if K == 0:
            for j in range(N):
                acc[j] = np.float32(0.0)
        else:
            for j in range(N):
                acc[j] = np.float32(-0.0)
        for k in range(K):
            a = A[b, i, k]
            for j in range(N):
                p = a * B[b, k, j]
                acc[j] = acc[j] + p
        for j in range(N):
            out[b, i, j] = acc[j]
