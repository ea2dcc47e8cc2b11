"""ATen's CPU statistics for the normalizations, in ATen's own order.

Models (torch 2.13's sources; the order checked against torch CPU by inputs
crafted so that other orders give other bits, ``tests/test_cpu_norm_pool.py``):

* :func:`rowwise_moments`: ``RowwiseMoments`` of ``cpu/moments_utils.h``, the
  mean and biased variance of each row as layer_norm and the contiguous
  group_norm compute them. The row is read in vectors of ``V`` elements
  (``Vectorized<T>::size()``: 16 floats / 8 doubles under AVX512, 8 / 4 under
  AVX2, 32 / 16 sixteen-bit elements); chunks of 16 vectors each run a
  Welford update per lane (``UpdateMomentsVec``: ``m1 = fmadd(1/(j+1), d,
  m1)``, ``m2 = fmadd(d, x - m1, m2)``, both FMAs); each chunk's lanes are
  merged into a binary cascade of partial moments (``AddMomentsVec``, whose
  ``m2`` update is an FMA); the leftover ``N % V`` elements run a scalar
  Welford that divides by the count; then the lanes merge into that scalar
  one by one (``AddMoments``, no FMA). A 16-bit row converts each vector
  into two float vectors that both merge into the cascade.
* :func:`columnwise_sums`: group_norm's channels-last ``ColumnwiseMoments``
  (feature maps under 1024 positions): per (n, g) one vector accumulator of
  x and one of x*x over the positions, the group's channels in vectors and a
  zero-padded partial vector, then ``vec_reduce_all``.
* :func:`reduce_lanes`: ``vec_reduce_all`` with addition: for float the
  shuffle tree of ``VecReduceAllSIMD`` (lane i plus lane i ^ 8, ^ 4, ^ 2,
  ^ 1 under AVX512; ^ 4, ^ 2, ^ 1 under AVX2), for double lane 0 plus the
  other lanes in order.
"""

from __future__ import annotations

import numpy as np

from numba import types
from numba.extending import overload

from .._jit import fma_any, jit
from ._profile import cpu_vector_lanes

CHUNK = 16           # kChunkSize


def _as(x, ref):
    """x converted to the floating type of ``ref`` (a Numba overload)."""
    raise NotImplementedError("_as is a Numba overload: call it from a @jit function")


@overload(_as)
def _as_impl(x, ref):
    if ref == types.float32:
        return lambda x, ref: np.float32(x)
    return lambda x, ref: np.float64(x)


@jit
def _ceil_log2(x):
    if x <= 2:
        return 1
    v = x - 1
    bits = 0
    while v > 0:
        v >>= 1
        bits += 1
    return bits


@jit
def _add_moments_vec(m0_add, m1_add, m2_add, m0, m1, m2, L):
    """AddMomentsVec: merge (m0_add, m1_add, m2_add) into (m0, m1, m2) lane
    by lane; returns the new count."""
    z = m1[0]
    n = m0 + m0_add
    c = _as(0.0, z) if n == 0 else _as(m0_add, z) / _as(n, z)
    fm0 = _as(m0, z)
    for q in range(L):
        delta = m1_add[q] - m1[q]
        m2_tmp = m2[q] + m2_add[q]
        cd = c * delta
        m0d = delta * fm0
        m1[q] = m1[q] + cd
        m2[q] = fma_any(m0d, cd, m2_tmp)
    return n


@jit
def _rowwise_moments_kernel(X, L, V, mean, var):
    """X (R, N) in opmath precision; L lanes of the accumulator vector, V
    elements per load (L, or 2 L for 16-bit inputs)."""
    R, N = X.shape
    n = N // V
    m = (n + CHUNK - 1) // CHUNK
    depth = _ceil_log2(m)
    dt = X.dtype
    cvec = np.empty(CHUNK, dt)
    one = _as(1.0, X[0, 0]) if X.size else _as(1.0, cvec[0])
    for j in range(CHUNK):
        cvec[j] = one / _as(j + 1, one)
    halves = V // L
    for r in range(R):
        m0_stk = np.zeros(depth, np.int64)
        m1_stk = np.zeros((depth, L), dt)
        m2_stk = np.zeros((depth, L), dt)
        m1v = np.empty(L, dt)
        m2v = np.empty(L, dt)
        for i in range(m):
            base = i * CHUNK * V
            m0 = min(CHUNK, n - i * CHUNK)
            for h in range(halves):
                m1v[:] = 0
                m2v[:] = 0
                for j in range(m0):
                    cj = cvec[j]
                    off = base + j * V + h * L
                    for q in range(L):
                        x = X[r, off + q]
                        d = x - m1v[q]
                        m1v[q] = fma_any(cj, d, m1v[q])
                        m2v[q] = fma_any(d, x - m1v[q], m2v[q])
                m0_stk[0] = _add_moments_vec(m0, m1v, m2v, m0_stk[0], m1_stk[0], m2_stk[0], L)
            mask = i + 1
            j = 1
            while j < depth and (mask & 1) == 0:
                m0_stk[j] = _add_moments_vec(m0_stk[j - 1], m1_stk[j - 1], m2_stk[j - 1],
                                             m0_stk[j], m1_stk[j], m2_stk[j], L)
                m0_stk[j - 1] = 0
                m1_stk[j - 1, :] = 0
                m2_stk[j - 1, :] = 0
                mask >>= 1
                j += 1
        for i in range(1, depth):
            m0_stk[0] = _add_moments_vec(m0_stk[i], m1_stk[i], m2_stk[i],
                                         m0_stk[0], m1_stk[0], m2_stk[0], L)
        c0 = 0
        s1 = _as(0.0, one)
        s2 = _as(0.0, one)
        for i in range(n * V, N):
            x = X[r, i]
            d = x - s1
            c0 += 1
            s1 += d / _as(c0, one)
            s2 += d * (x - s1)
        m0_add = n * V // L
        for q in range(L):                      # AddMoments, scalar
            nn = c0 + m0_add
            c = _as(0.0, one) if nn == 0 else _as(m0_add, one) / _as(nn, one)
            d = m1_stk[0, q] - s1
            s1 = fma_any(c, d, s1)
            s2 += fma_any(d * d * c, _as(c0, one), m2_stk[0, q])
            c0 = nn
        mean[r] = s1
        var[r] = s2 / _as(N, one)


def rowwise_moments(X, lanes, sixteen_bit=False):
    """Mean and biased variance of each row of ``X`` (R, N), float32 or
    float64 (a 16-bit input given as its float32 values), as ATen's
    ``RowwiseMoments``; ``lanes`` is the opmath vector's width in elements."""
    X = np.ascontiguousarray(X)
    R = X.shape[0]
    mean = np.empty(R, X.dtype)
    var = np.empty(R, X.dtype)
    V = 2 * lanes if sixteen_bit else lanes
    if R:
        _rowwise_moments_kernel(X, lanes, V, mean, var)
    return mean, var


def reduce_lanes(A):
    """``vec_reduce_all`` with addition over the last axis (the lanes) of
    ``A``: float32's shuffle tree, float64's lane order (module note)."""
    L = A.shape[-1]
    if A.dtype == np.float32:
        v = A
        step = L // 2
        while step >= 1:
            idx = np.arange(L) ^ step
            v = v + v[..., idx]
            step //= 2
        return v[..., 0]
    acc = A[..., 0].copy()
    for i in range(1, L):
        acc = acc + A[..., i]
    return acc


def columnwise_sums(X, G, lanes, sixteen_bit=False):
    """group_norm's channels-last ``ColumnwiseMoments``: X (N, HxW, C) in
    opmath precision; returns the sums of x and of x*x per (n, g), (N, G)."""
    N, HW, C = X.shape
    D = C // G
    Xg = X.reshape(N, HW, G, D)
    V = 2 * lanes if sixteen_bit else lanes
    inner = D // V * V
    dt = X.dtype
    acc0 = np.zeros((N, G, lanes), dt)
    acc1 = np.zeros((N, G, lanes), dt)
    for m in range(HW):
        row = Xg[:, m]                               # (N, G, D)
        for d in range(0, inner, V):
            if sixteen_bit:
                a = row[..., d:d + lanes]
                b = row[..., d + lanes:d + V]
                acc0 = acc0 + (a + b)
                acc1 = acc1 + (a * a + b * b)
            else:
                x = row[..., d:d + V]
                acc0 = acc0 + x
                acc1 = acc1 + x * x
        rem = D - inner
        if rem:
            x = np.zeros((N, G, V), dt)
            x[..., :rem] = row[..., inner:]
            if sixteen_bit and rem > lanes:
                a, b = x[..., :lanes], x[..., lanes:]
                acc0 = acc0 + (a + b)
                acc1 = acc1 + (a * a + b * b)
            else:
                a = x[..., :lanes]
                acc0 = acc0 + a
                acc1 = acc1 + a * a
    return reduce_lanes(acc0), reduce_lanes(acc1)


def aten_lanes(itemsize):
    """Elements of one ``Vectorized`` in the build of a kernel registered
    with plain ``REGISTER_DISPATCH``: DispatchStub gives such a kernel no
    AVX512 entry, so an AVX512 CPU runs its AVX2 build, 32-byte vectors
    (measured: torch 2.13's layer_norm statistics follow 8 float lanes on an
    AVX512 machine; :func:`fpemu.autograd._profile.cpu_vector_lanes`)."""
    return cpu_vector_lanes("AVX2", itemsize)


@jit
def _fma_rows(A, B, C, out):
    """out = fma(A, B, C) element by element (broadcast arrays, same shape)."""
    a = A.ravel()
    b = B.ravel()
    c = C.ravel()
    o = out.ravel()
    for i in range(a.size):
        o[i] = fma_any(a[i], b[i], c[i])


def fmadd(a, b, c):
    """``fma(a, b, c)`` elementwise in the arrays' common float dtype (what
    GCC's contraction or ``vec::fmadd`` computes)."""
    a, b, c = (np.asarray(v) for v in (a, b, c))
    dt = np.result_type(a, b, c)
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    a, b, c = (np.ascontiguousarray(np.broadcast_to(v.astype(dt, copy=False), shape))
               for v in (a, b, c))
    out = np.empty(a.shape, dt)
    if out.size:
        _fma_rows(a, b, c, out)
    return out
