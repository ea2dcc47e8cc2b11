"""``torch.sparse`` and sparse COO tensors, emulated as dense ones.

Graph networks build an adjacency with ``torch.sparse_coo_tensor(indices,
values, size)`` and multiply it with ``torch.sparse.mm`` / ``torch.spmm``.
fpemu keeps such a tensor dense (its values scattered into zeros, duplicate
indices added) and marks it sparse: ``is_sparse``, ``layout``,
``indices()`` / ``values()`` (its nonzeros, coalesced: sorted, duplicates
added; an explicit zero among the values is not kept), ``to_dense()``,
``to_sparse()``, ``coalesce()``, ``_nnz()``. Products run as dense matrix
products under fpemu's accumulation rules (``docs/autograd.md``): a product
with zeros adds nothing, and the default ``"sequential"`` model adds a row's
products in column order, as torch's CPU sparse kernel walks a coalesced
row, but rounds each product before the add where that kernel fuses them
(an FMA per nonzero): the two differ by an ulp or two now and then
(``tests/test_sparse.py``). Every op returns a dense tensor; a gradient to
a sparse tensor's values is the dense gradient at its indices.
"""

from __future__ import annotations

import numpy as np

from ._core import Tensor, _result, _store, as_dtype, is_float, tensor
from .ops.linalg import addmm as _addmm, mm as _mm
from .ops.reduce import sum as _sum

sparse_coo = "torch.sparse_coo"


def _mark(t):
    t._sparse = True
    return t


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None,
                      requires_grad=False, check_invariants=None, is_coalesced=None):
    """``torch.sparse_coo_tensor``: ``indices`` (sparse_dim, nnz) ints,
    ``values`` (nnz, *dense_dims), ``size`` (default: one past the largest
    index in each sparse dim, then the values' dense dims)."""
    idx = np.asarray(indices._data if isinstance(indices, Tensor) else indices)
    if idx.dtype.kind not in "iu" and idx.size:
        raise RuntimeError(f"indices must be an int64 tensor, got {idx.dtype}")
    idx = idx.astype(np.int64).reshape(idx.shape if idx.ndim == 2 else (-1, 0))
    vals = values if isinstance(values, Tensor) else tensor(values, dtype=dtype)
    if dtype is not None and vals.dtype != as_dtype(dtype):
        vals = vals.to(as_dtype(dtype))
    sparse_dim, nnz = idx.shape
    if vals.ndim < 1 or vals.shape[0] != nnz:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: "
                           f"{nnz}, nnz from values: {vals.shape[0] if vals.ndim else 0}")
    dense_dims = tuple(vals.shape[1:])
    if size is None:
        size = tuple(int(m) + 1 for m in idx.max(axis=1)) if nnz else (0,) * sparse_dim
        size = size + dense_dims
    size = tuple(int(s) for s in size)
    if len(size) != sparse_dim + len(dense_dims):
        raise RuntimeError(f"number of dimensions must be sparse_dim ({sparse_dim}) + dense_dim "
                           f"({len(dense_dims)}), but got {len(size)}")
    for d in range(sparse_dim):
        if nnz and (idx[d].min() < 0 or idx[d].max() >= size[d]):
            bad = idx[d].max() if idx[d].max() >= size[d] else idx[d].min()
            raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is "
                               f"{size[d]} but found index {bad}")
    where = tuple(idx)
    acc = np.zeros(size, np.float64 if vals.dtype.name == "float64" else np.float32)
    np.add.at(acc, where, vals._data)                 # duplicates added, in index order
    dense = _store(acc, vals.dtype) if is_float(vals.dtype) else acc.astype(vals._data.dtype)
    out = _result(dense, vals.dtype, (vals,), lambda g: (np.ascontiguousarray(g[where]),),
                  op="sparse_coo_tensor")
    if requires_grad:
        out.requires_grad_()
    return _mark(out)


def mm(mat1, mat2, reduce=None):
    """``torch.sparse.mm``: a (sparse) matrix times a dense one, a dense
    result (module docstring)."""
    if reduce is not None:
        raise RuntimeError("sparse.mm(reduce=...) is not emulated; use reduce=None (a sum)")
    return _mm(mat1, mat2)


def addmm(mat, mat1, mat2, beta=1.0, alpha=1.0):
    return _addmm(mat, mat1, mat2, beta=beta, alpha=alpha)


def sum(input, dim=None, dtype=None):  # torch's name
    return _sum(input, dim=dim, dtype=dtype) if dim is not None else _sum(input, dtype=dtype)


# --------------------------------------------------------------- Tensor methods
def _is_sparse(self):
    return bool(getattr(self, "_sparse", False))


def _layout(self):
    return sparse_coo if _is_sparse(self) else "torch.strided"


def to_dense(self, dtype=None):
    if not _is_sparse(self) and dtype is None:
        return self
    out = _result(self._data.copy(), self.dtype, (self,), lambda g: (g,), op="to_dense",
                  stored=True)
    return out if dtype is None else out.to(dtype)


def to_sparse(self, sparse_dim=None):
    out = _result(self._data.copy(), self.dtype, (self,), lambda g: (g,), op="to_sparse",
                  stored=True)
    return _mark(out)


def _nonzero_index(self):
    if not _is_sparse(self):
        raise RuntimeError("indices() / values() need a sparse tensor (layout "
                           "torch.sparse_coo); call .to_sparse() first")
    return np.nonzero(self._data)                      # row-major: coalesced order


def indices(self):
    return tensor(np.stack(_nonzero_index(self)).astype(np.int64))


def values(self):
    where = _nonzero_index(self)
    return _result(np.ascontiguousarray(self._data[where]), self.dtype, (self,),
                   lambda g: (_scatter(g, where, self.shape),), op="values", stored=True)


def _scatter(g, where, shape):
    full = np.zeros(shape, g.dtype)
    full[where] = g
    return full


def coalesce(self):
    return self


def is_coalesced(self):
    return True


def _nnz(self):
    return int(np.count_nonzero(self._data)) if _is_sparse(self) else self.numel()


def sparse_dim(self):
    return self.ndim if _is_sparse(self) else 0


def dense_dim(self):
    return 0


Tensor.is_sparse = property(_is_sparse)
Tensor.layout = property(_layout)
for _name, _fn in (("to_dense", to_dense), ("to_sparse", to_sparse), ("indices", indices),
                   ("values", values), ("_indices", indices), ("_values", values),
                   ("coalesce", coalesce), ("is_coalesced", is_coalesced), ("_nnz", _nnz),
                   ("sparse_dim", sparse_dim), ("dense_dim", dense_dim)):
    setattr(Tensor, _name, _fn)
del _name, _fn
