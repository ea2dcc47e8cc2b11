"""``torch.linalg``: norms, ``vecdot``, the matrix products, and the linear
solvers ``solve``, ``solve_triangular``, ``inv``, ``lu_factor``, ``lu_solve``.

Norms compute in float64 and round once to the output dtype (the norms of
:func:`fpemu.autograd.norm`); the matrix norms take the spectral ones from
numpy's SVD in float64. The solvers compute in float64 (LAPACK's
factorizations through numpy, a partial-pivoting LU of fpemu's own) and round
once: torch's LAPACK in float32 rounds at every step, so they are tier 2,
within the problem's condition number times a few ulps. Their gradients are
torch's formulas. The eigen- and singular-value decompositions (``svd``,
``eigh``, ``qr``) are not emulated: their signs and orders are LAPACK's
choice; compute them with torch and pass the result in.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FpemuRuntimeError
from ._autocast import cast_inputs
from ._core import _result, _store, as_dtype, int32, is_float, Tensor, to_dtype
from ._missing import module_getattr as _module_getattr
from ._common import f64, sum_to_shape as _sum_to, wrap_dim
from .ops.elementwise import mul
from .ops.inplace import write_out
from .ops.linalg import matmul  # noqa: F401  (torch.linalg.matmul)
from .ops.reduce import amax, amin, norm as _norm, singular_norm, sum as _sum


def _float_input(name, x, dtype):
    if not isinstance(x, Tensor):
        raise TypeError(f"linalg.{name}(): argument 'input' must be Tensor, not "
                        f"{type(x).__name__}")
    if dtype is not None:
        x = to_dtype(x, as_dtype(dtype, f"linalg.{name}()"))
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f"linalg.{name}: Expected a floating point or complex tensor "
                                f"as input. Got {x.dtype}")
    return x


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """The ``ord``-norm of the elements over ``dim`` (all by default): 2, 1,
    inf (the largest magnitude), -inf, 0 (the count of nonzeros) or any p.
    Autocast: the op runs with dtype=float32."""
    (x,) = cast_inputs("linalg_vector_norm", x)
    x = _float_input("vector_norm", x, dtype)
    if isinstance(ord, str):
        raise TypeError(f"linalg.vector_norm(): argument 'ord' must be Number, not str "
                        f"({ord!r})")
    dims = dim if dim is None or isinstance(dim, (tuple, list)) else (dim,)
    if (ord < 0 or math.isinf(ord)) and x.numel() == 0:
        reduced = range(x.ndim) if not dims else [wrap_dim(d, x.ndim) for d in dims]
        if x.ndim == 0 or any(x.shape[d] == 0 for d in reduced):
            raise FpemuRuntimeError(f"linalg.vector_norm cannot compute the {ord} norm on an "
                                    f"empty tensor because the operation does not have an "
                                    f"identity")
    flat = dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0)
    res = _norm(x if not flat or x.ndim <= 1 else x.reshape(-1), ord,
                None if flat else tuple(dims), keepdim and not flat)
    if flat and keepdim:
        res = res.reshape((1,) * x.ndim)
    return write_out(out, res, "linalg_vector_norm")


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):
    """The matrix norm over the two ``dim``: "fro", "nuc", inf / -inf (largest /
    smallest row sum of magnitudes), 1 / -1 (column sums), 2 / -2 (largest /
    smallest singular value)."""
    (A,) = cast_inputs("linalg_matrix_norm", A)
    A = _float_input("matrix_norm", A, dtype)
    if A.ndim < 2:
        raise FpemuRuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 "
                                "dimensions.")
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise FpemuRuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {dim}")
    d0, d1 = (wrap_dim(d, A.ndim) for d in dim)
    if d0 == d1:
        raise FpemuRuntimeError(f"linalg.matrix_norm: dims must be different. Got ({d0}, {d1})")
    if ord == "fro":
        res = vector_norm(A, 2, (d0, d1), keepdim)
    elif ord == "nuc" or ord in (2, -2):
        if A.numel() == 0 and ord != "nuc" or (ord == -2 and 0 in (A.shape[d0], A.shape[d1])):
            raise FpemuRuntimeError("linalg.matrix_norm: The input tensor A must not be empty "
                                    "for the 2 and -2 norms")
        res = singular_norm(A, d0, d1, keepdim, "nuc" if ord == "nuc" else str(int(ord)))
    elif ord in (math.inf, -math.inf, 1, -1):
        # rows (inf) or columns (1): the 1-norms over the other dim first
        # (torch's linalg_matrix_norm: vector_norm(A, 1, dim), then amax / amin)
        first, then = (d1, d0) if math.isinf(ord) else (d0, d1)
        sums = vector_norm(A, 1, (first,), keepdim=True)
        pick = amax if ord > 0 else amin
        res = pick(sums, then, keepdim=True)
        if not keepdim:
            res = res.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    else:
        raise FpemuRuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    return write_out(out, res, "linalg_matrix_norm")


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):
    """``torch.linalg.norm``: a vector norm over one dim (or all, when ``ord``
    is None), a matrix norm over two (or of a 2-D input when ``ord`` is given)."""
    if dim is not None:
        dims = (dim,) if not isinstance(dim, (tuple, list)) else tuple(dim)
        if len(dims) == 2:
            return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype=dtype,
                               out=out)
        if len(dims) != 1:
            raise FpemuRuntimeError(f"linalg.norm: If dim is specified, it mut be of length 1 "
                                    f"or 2. Got {list(dims)}")
        return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype, out=out)
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype, out=out)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype, out=out)
    if A.ndim == 1 and not isinstance(ord, str):
        return vector_norm(A, ord, None, keepdim, dtype=dtype, out=out)
    raise FpemuRuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must "
                            f"be 1D or 2D. Got {A.ndim}D.")


def vecdot(x, y, *, dim=-1, out=None):
    """``sum(x * y, dim)``: the products rounded, then summed (torch's)."""
    x, y = cast_inputs("linalg_vecdot", x, y)
    if x.dtype is not y.dtype:
        raise FpemuRuntimeError(f"linalg.vecdot: Expected x and y to have the same dtype, but "
                                f"found x of type {x.dtype} and y of type {y.dtype} instead")
    # the sum in the products' dtype, as torch's kernel runs it (a listed op's
    # inner ops are not looked up again: dtype= skips the sum's own autocast rule)
    p = mul(x, y)
    return write_out(out, _sum(p, dim, dtype=p.dtype), "linalg_vecdot")


# ------------------------------------------------------------------ solvers
def _square(name, A):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg.{name}(): argument 'A' must be Tensor, not {type(A).__name__}")
    if A.ndim < 2:
        raise FpemuRuntimeError(f"linalg.{name}: The input tensor A must have at least 2 "
                                f"dimensions.")
    if A.shape[-1] != A.shape[-2]:
        raise FpemuRuntimeError(f"linalg.{name}: A must be batches of square matrices, but they "
                                f"are {A.shape[-2]} by {A.shape[-1]} matrices")
    if not is_float(A.dtype):
        raise FpemuRuntimeError(f"linalg.{name}: Expected a floating point or complex tensor "
                                f"as input. Got {A.dtype}")


def _mT(X):
    return np.swapaxes(X, -1, -2)


def _singular(name):
    return FpemuRuntimeError(f"linalg.{name}: The solver failed because the input matrix is "
                             f"singular.")


def _batched_solve(A, B, name):
    """X with A X = B, float64, B (..., n, k) broadcast with A's batch."""
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = np.broadcast_to(A, batch + A.shape[-2:])
    B = np.broadcast_to(B, batch + B.shape[-2:])
    try:
        return np.linalg.solve(A, B)
    except np.linalg.LinAlgError:
        raise _singular(name) from None


def _solve_grads(A, X, G, left, name):
    """torch's gradients of X = A^-1 B (``left``) or X = B A^-1 for the
    cotangent G: gB = A^-H G (or G A^-H), gA = -gB X^H (or -X^H gB)."""
    if left:
        gB = _batched_solve(_mT(A), G, name)
        return -gB @ _mT(X), gB
    gB = _mT(_batched_solve(A, _mT(G), name))
    return -_mT(X) @ gB, gB


def solve(A, B, *, left=True, out=None):
    """X with A X = B (``left``) or X A = B, in float64 rounded once; B a
    vector (n,) or a batch of matrices. Gradients: torch's (gB = solve(A^H,
    g), gA = -gB X^H)."""
    _square("solve", A)
    A, B = cast_inputs("linalg_solve", A, B)
    if A.dtype is not B.dtype:
        raise FpemuRuntimeError(f"linalg.solve: Expected A and B to have the same dtype, but "
                                f"found A of type {A.dtype} and B of type {B.dtype} instead")
    Af, Bf = f64(A), f64(B)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    if vector:
        Bm = Bf[..., None]
    else:
        Bm = Bf
    n = A.shape[-1]
    if (Bm.shape[-2] if left else Bm.shape[-1]) != n:
        raise FpemuRuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation "
                                f"{'AX = B' if left else 'XA = B'} ({list(A.shape)} and "
                                f"{list(B.shape)})")
    if left:
        X = _batched_solve(Af, Bm, "solve")
    else:
        X = _mT(_batched_solve(_mT(Af), _mT(Bm), "solve"))
    Xv = X[..., 0] if vector else X
    dt = A.dtype
    res = _store(Xv, dt)

    def backward(g):
        G = g.astype(np.float64)
        gA, gB = _solve_grads(Af, X, G[..., None] if vector else G, left, "solve")
        gBv = gB[..., 0] if vector else gB
        return (_store(_sum_to(gA, A.shape), dt), _store(_sum_to(gBv, B.shape), dt))
    return write_out(out, _result(res, dt, (A, B), backward, op="linalg_solve"),
                     "linalg_solve")


def inv(A, *, out=None):
    """A^-1 in float64 rounded once; gradient -A^-H g A^-H."""
    _square("inv", A)
    (A,) = cast_inputs("linalg_inv", A)
    Af = f64(A)
    try:
        Ai = np.linalg.inv(Af) if Af.size else Af.copy()
    except np.linalg.LinAlgError:
        raise _singular("inv") from None
    dt = A.dtype

    def backward(g):
        return (_store(-_mT(Ai) @ g.astype(np.float64) @ _mT(Ai), dt),)
    return write_out(out, _result(_store(Ai, dt), dt, (A,), backward, op="linalg_inv"),
                     "linalg_inv")


def _triangle(A, upper, unit):
    T = np.triu(A) if upper else np.tril(A)
    if unit:
        n = A.shape[-1]
        T = T * (1 - np.eye(n)) + np.eye(n)
    return T


def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
    """X with T X = B (``left``) or X T = B, T the upper or lower triangle of
    A (unit diagonal with ``unitriangular``; the other triangle is never
    read), in float64 rounded once. Gradients: torch's, gA kept to the
    triangle that was read."""
    if not isinstance(A, Tensor) or not isinstance(B, Tensor):
        raise TypeError("linalg.solve_triangular(): A and B must be Tensors")
    if A.ndim < 2 or B.ndim < 2:
        raise FpemuRuntimeError(f"linalg.solve_triangular: The input tensor "
                                f"{'A' if A.ndim < 2 else 'B'} must have at least 2 dimensions.")
    _square("solve_triangular", A)
    if A.dtype is not B.dtype:
        raise FpemuRuntimeError(f"linalg.solve_triangular: Expected A and B to have the same "
                                f"dtype, but found A of type {A.dtype} and B of type {B.dtype} "
                                f"instead")
    n = A.shape[-1]
    if (B.shape[-2] if left else B.shape[-1]) != n:
        raise FpemuRuntimeError(f"linalg.solve_triangular: Incompatible shapes of A and B for "
                                f"the equation {'AX = B' if left else 'XA = B'} "
                                f"({A.shape[-2]}x{A.shape[-1]} and {B.shape[-2]}x{B.shape[-1]})")
    T = _triangle(f64(A), upper, unitriangular)
    Bf = f64(B)
    with np.errstate(all="ignore"):
        X = _tri_solve(T, Bf, left)
    dt = A.dtype

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            if left:
                gB = _tri_solve(_mT(T), G, True)
                gA = -gB @ _mT(X)
            else:
                gB = _tri_solve(_mT(T), G, False)
                gA = -_mT(X) @ gB
        gA = np.triu(gA) if upper else np.tril(gA)
        if unitriangular:
            gA = gA * (1 - np.eye(n))
        return (_store(_sum_to(gA, A.shape), dt), _store(_sum_to(gB, B.shape), dt))
    return write_out(out, _result(_store(X, dt), dt, (A, B), backward,
                                  op="linalg_solve_triangular"), "linalg_solve_triangular")


def _tri_solve(T, B, left):
    """Back / forward substitution through numpy's solver (a singular
    triangle gives infinities and NaNs, as LAPACK's trtrs without a check)."""
    batch = np.broadcast_shapes(T.shape[:-2], B.shape[:-2])
    T = np.broadcast_to(T, batch + T.shape[-2:])
    B = np.broadcast_to(B, batch + B.shape[-2:])
    if not left:
        return _mT(_tri_solve(_mT(T), _mT(B), True))
    n = T.shape[-1]
    if n == 0 or B.size == 0:
        return np.zeros(B.shape)
    upper = np.allclose(np.tril(T, -1), 0)
    X = np.zeros(np.broadcast_shapes(T.shape[:-1] + (1,), B.shape))
    order = range(n - 1, -1, -1) if upper else range(n)
    for i in order:
        acc = B[..., i, :] - np.einsum("...j,...jk->...k", T[..., i, :], X)
        X[..., i, :] = acc / T[..., i, i, None]
    return X


def lu_factor(A, *, pivot=True, out=None):
    """``(LU, pivots)`` of A = P L U by partial pivoting (the largest
    magnitude of each column below the diagonal, the first of equal ones, as
    LAPACK's getrf), L unit lower and U upper packed in one matrix, pivots
    1-based int32, in float64 rounded once. The gradient is torch's
    ``linalg_lu_backward`` (square, wide and tall matrices)."""
    if not isinstance(A, Tensor) or A.ndim < 2:
        raise FpemuRuntimeError("linalg.lu_factor: The input tensor A must have at least 2 "
                                "dimensions.")
    if not pivot:
        raise FpemuRuntimeError("linalg.lu_factor: LU without pivoting is not implemented on "
                                "the CPU")
    if not is_float(A.dtype):
        raise FpemuRuntimeError(f"linalg.lu_factor: Expected a floating point or complex "
                                f"tensor as input. Got {A.dtype}")
    LU = f64(A).copy()
    m, n = LU.shape[-2:]
    k = min(m, n)
    piv = np.zeros(LU.shape[:-2] + (k,), np.int32)
    flat = LU.reshape(-1, m, n)
    pflat = piv.reshape(-1, k)
    with np.errstate(all="ignore"):
        for b in range(flat.shape[0]):
            M = flat[b]
            for j in range(k):
                p = j + int(np.argmax(np.abs(M[j:, j])))
                pflat[b, j] = p + 1
                if p != j:
                    M[[j, p]] = M[[p, j]]
                if M[j, j] != 0:
                    M[j + 1:, j] /= M[j, j]
                M[j + 1:, j + 1:] -= np.outer(M[j + 1:, j], M[j, j + 1:])
    dt = A.dtype
    LUr = _store(LU, dt)

    def backward(g, _gpiv=None):
        return (_store(_lu_backward(g.astype(np.float64), LU, piv), dt),)
    res = (_result(LUr, dt, (A,), backward, op="linalg_lu_factor_ex"), Tensor(piv, int32))
    if out is not None:
        write_out(out[0], res[0], "linalg_lu_factor")
        write_out(out[1], res[1], "linalg_lu_factor")
        return out
    return res


def _lu_backward(G, LU, piv):
    """torch's ``lu_factor_ex_backward``: the gradient of A from the packed
    gradient G of LU (its strict lower part is L's, its upper part U's)."""
    m, n = LU.shape[-2:]
    k = min(m, n)
    perm, L, U = _unpack(LU, piv, m)
    Pm = np.zeros(perm.shape + (m,))
    np.put_along_axis(Pm, perm[..., None], 1.0, -1)
    P = _mT(Pm)
    gL, gU = G[..., :, :k], G[..., :k, :]
    with np.errstate(all="ignore"):
        if m == n:
            Ag = np.tril(_mT(L) @ gL, -1) + np.triu(gU @ _mT(U))
            Ag = _tri_solve(_mT(U), Ag, False)
            Ag = _tri_solve(_mT(L), Ag, True)
        elif m < n:
            U1 = U[..., :, :k]
            Ag = _mT(L) @ gL - np.triu(gU) @ _mT(U)
            Ag = _tri_solve(_mT(U1), np.tril(Ag, -1), False)
            Ag = np.concatenate([Ag + np.triu(gU[..., :, :k]), gU[..., :, k:]], -1)
            Ag = _tri_solve(_mT(L), Ag, True)
        else:
            L1 = L[..., :k, :]
            Ag = gU @ _mT(U) - _mT(L) @ np.tril(gL, -1)
            Ag = _tri_solve(_mT(L1), np.triu(Ag), True)
            Ag = np.concatenate([Ag + np.tril(gL[..., :k, :], -1), gL[..., k:, :]], -2)
            Ag = _tri_solve(_mT(U), Ag, False)
    return P @ Ag


def _unpack(LU, piv, m=None):
    """P (as a row permutation of the m rows), unit-lower L (m, k) and upper
    U (k, n) of a packed (m, n) LU."""
    mm, n = LU.shape[-2:]
    m = mm if m is None else m
    k = min(m, n)
    L = np.tril(LU[..., :, :k], -1) + np.eye(m, k)
    U = np.triu(LU[..., :k, :])
    perm = np.broadcast_to(np.arange(m), LU.shape[:-2] + (m,)).copy()
    P = piv.astype(np.int64) - 1
    if perm.size and P.size:
        flat, pf = perm.reshape(-1, m), P.reshape(-1, P.shape[-1])
        for b in range(flat.shape[0]):
            for j, p in enumerate(pf[b]):
                flat[b, [j, p]] = flat[b, [p, j]]
    return perm, L, U


def lu_solve(LU, pivots, B, *, left=True, adjoint=False, out=None):
    """X with A X = B (or A^H X = B with ``adjoint``, or X A = B when not
    ``left``) for A = P L U given by :func:`lu_factor`'s output, in float64
    rounded once. Gradient with respect to B (torch's); the factors get
    torch's gradient through A = P L U (gL the strict lower part of
    P^T gA U^H, gU the upper part of L^H P^T gA)."""
    _square("lu_solve", LU)
    if LU.dtype is not B.dtype:
        raise FpemuRuntimeError(f"linalg.lu_solve: Expected LU and B to have the same dtype, "
                                f"but found LU of type {LU.dtype} and B of type {B.dtype} "
                                f"instead")
    if B.ndim < 2:
        raise FpemuRuntimeError("linalg.lu_solve: The input tensor B must have at least 2 "
                                "dimensions.")
    n = LU.shape[-1]
    if (B.shape[-2] if left else B.shape[-1]) != n:
        raise FpemuRuntimeError(f"linalg.lu_solve: Incompatible shapes of A and B for the "
                                f"equation {'AX = B' if left else 'XA = B'} "
                                f"({n}x{n} and {B.shape[-2]}x{B.shape[-1]})")
    if n == 0 or B.numel() == 0:
        shape = np.broadcast_shapes(LU.shape[:-2], B.shape[:-2]) + tuple(B.shape[-2:])
        return write_out(out, _result(np.zeros(shape, B._data.dtype), B.dtype, (LU, pivots, B),
                                      lambda g: (np.zeros(LU.shape, g.dtype), None,
                                                 np.zeros(B.shape, g.dtype)),
                                      op="linalg_lu_solve"), "linalg_lu_solve")
    perm, L, U = _unpack(f64(LU), pivots._data)
    Pm = np.zeros(perm.shape + (n,))
    np.put_along_axis(Pm, perm[..., None], 1.0, -1)      # rows of P^T: (P^T A) = L U
    A = _mT(Pm) @ L @ U                                  # A = P L U
    Aop = _mT(A) if adjoint else A
    Bf = f64(B)
    with np.errstate(all="ignore"):
        X = _batched_solve(Aop, Bf, "lu_solve") if left else \
            _mT(_batched_solve(_mT(Aop), _mT(Bf), "lu_solve"))
    dt = B.dtype

    def backward(g):
        gAop, gB = _solve_grads(Aop, X, g.astype(np.float64), left, "lu_solve")
        gA = _mT(gAop) if adjoint else gAop
        PtgA = Pm @ gA
        gLU = np.tril(PtgA @ _mT(U), -1) + np.triu(_mT(L) @ PtgA)
        return (_store(_sum_to(gLU, LU.shape), dt), None, _store(_sum_to(gB, B.shape), dt))
    return write_out(out, _result(_store(X, dt), dt, (LU, pivots, B), backward,
                                  op="linalg_lu_solve"), "linalg_lu_solve")


__getattr__ = _module_getattr("fpemu.autograd.linalg (torch.linalg)")
