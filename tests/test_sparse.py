"""Sparse COO tensors and ``torch.sparse.mm`` as graph networks use them,
emulated as dense (``fpemu/autograd/sparse.py``), against torch: the dense
form, the coalesced indices and values exactly; the products and their
gradients within 2 ulps, counted on the codes (torch's CPU kernel fuses each
nonzero's multiply-add, fpemu's dense product rounds the product first); and
the sparse product equal to fpemu's own dense one, code for code."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): the reference behaviour

IDX = np.array([[0, 1, 1, 3, 2, 1], [2, 0, 2, 3, 1, 0]])      # (1, 0) twice: added
VALS = np.random.default_rng(0).standard_normal(6).astype(np.float32)
X = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)


def _run(lib, conv):
    v = conv(VALS.copy()).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # torch's note on invariant checks
        A = lib.sparse_coo_tensor(conv(IDX), v, (4, 4))
    x = conv(X.copy()).requires_grad_()
    y = lib.sparse.mm(A, x)
    (y * y).sum().backward()
    C = A.coalesce()
    return A, y, lib.spmm(A, x), x.grad, v.grad, C.indices(), C.values()


def test_sparse_coo_and_sparse_mm_match_torch():
    tA, ty, tz, tgx, tgv, ti, tv = _run(torch, torch.from_numpy)
    fA, fy, fz, fgx, fgv, fi, fv = _run(ft, ft.tensor)
    assert fA.is_sparse and tA.is_sparse and str(fA.layout) == str(tA.layout)
    assert not fy.is_sparse and fA._nnz() == tA.coalesce()._nnz() == 5
    np.testing.assert_array_equal(fA.to_dense().detach().numpy(),
                                  tA.to_dense().detach().numpy())
    np.testing.assert_array_equal(fi.numpy(), ti.numpy())
    np.testing.assert_array_equal(fv.detach().numpy(), tv.detach().numpy())
    for a, b in ((ty, fy), (tz, fz), (tgx, fgx), (tgv, fgv)):     # torch's FMAs: 1-2 ulps
        a, b = a.detach().numpy(), b.detach().numpy()
        assert (np.signbit(a) == np.signbit(b)).all()
        assert np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32)).max() <= 2
    np.testing.assert_array_equal(fy.detach().numpy().view(np.uint32),
                                  fz.detach().numpy().view(np.uint32))
    # what fpemu promises: the sparse product is its dense product, code for code
    dense = ft.mm(fA.to_dense(), ft.tensor(X)).detach().numpy()
    np.testing.assert_array_equal(fy.detach().numpy().view(np.uint32), dense.view(np.uint32))


def test_to_sparse_round_trip_and_bad_indices():
    t = ft.tensor(X)
    s = t.to_sparse()
    assert s.is_sparse and not s.to_dense().is_sparse and not t.is_sparse
    assert str(t.layout) == "torch.strided" and t.to_dense() is t
    np.testing.assert_array_equal(s.to_dense().numpy(), X)
    with pytest.raises(RuntimeError, match="size is inconsistent with indices: for dim 0, "
                                           "size is 2 but found index 3"):
        ft.sparse_coo_tensor(IDX, VALS, (2, 4))
    with pytest.raises(RuntimeError, match="indices and values must have same nnz"):
        ft.sparse_coo_tensor(IDX, VALS[:5], (4, 4))
    with pytest.raises(RuntimeError, match="need a sparse tensor"):
        t.indices()
