"""``torch.linalg``: norms, ``vecdot`` and the matrix products.

Norms compute in float64 and round once to the output dtype (the norms of
:func:`fpemu.autograd.norm`); the matrix norms take the spectral ones from
numpy's SVD in float64. Decompositions and solvers (``svd``, ``solve``,
``lu_solve``, ...) are not emulated: compute them with torch and pass the
result in.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import FpemuRuntimeError
from ._autocast import cast_inputs
from ._core import Tensor, _result, _store, is_float, to_dtype, as_dtype
from ._missing import module_getattr as _module_getattr
from .ops._common import f64, wrap_dim
from .ops.elementwise import abs as _abs
from .ops.elementwise import mul
from .ops.inplace import write_out
from .ops.linalg import matmul  # noqa: F401  (torch.linalg.matmul)
from .ops.reduce import amax, amin, norm as _norm, sum as _sum


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


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
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


def _spectral(x, d0, d1, keepdim, kind):
    """Sum (nuclear), largest or smallest singular value over two dims, in
    float64 rounded once; gradients U V^T, u1 v1^T, un vn^T (shared among
    tied singular values)."""
    X = np.moveaxis(f64(x), (d0, d1), (-2, -1))
    U, S, Vh = np.linalg.svd(X, full_matrices=False)
    pick = {"nuc": None, "2": 0, "-2": -1}[kind]
    n = S.sum(-1) if pick is None else S[..., pick]
    if keepdim:
        n = np.expand_dims(n, tuple(sorted((d0, d1))))
    res = _store(n, x.dtype)

    def backward(g):
        G = np.asarray(g, np.float64)
        if keepdim:
            G = np.squeeze(G, axis=tuple(sorted((d0, d1))))
        if pick is None:
            part = U @ Vh
        else:
            # torch takes amax / amin of the singular values: tied ones
            # share the gradient equally
            tie = S == S[..., pick, None]
            w = tie / tie.sum(-1, keepdims=True)
            part = (U * w[..., None, :]) @ Vh
        return (_store(np.moveaxis(G[..., None, None] * part, (-2, -1), (d0, d1)), x.dtype),)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="linalg_matrix_norm")


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):  # noqa: A002
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
        res = _spectral(A, d0, d1, keepdim, "nuc" if ord == "nuc" else str(int(ord)))
    elif ord in (math.inf, -math.inf, 1, -1):
        # rows (inf) or columns (1): sum the magnitudes over the other dim first
        first, then = (d1, d0) if math.isinf(ord) else (d0, d1)
        sums = _sum(_abs(A), first, keepdim=True)
        pick = amax if ord > 0 else amin
        res = pick(sums, then, keepdim=True)
        if not keepdim:
            res = res.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    else:
        raise FpemuRuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    return write_out(out, res, "linalg_matrix_norm")


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
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
    if x.dtype is not y.dtype:
        raise FpemuRuntimeError(f"linalg.vecdot: Expected x and y to have the same dtype, but "
                                f"found x of type {x.dtype} and y of type {y.dtype} instead")
    return write_out(out, _sum(mul(x, y), dim), "linalg_vecdot")


__getattr__ = _module_getattr("fpemu.autograd.linalg (torch.linalg)")
