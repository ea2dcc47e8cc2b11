"""pow under the CPU profile against torch CPU, bit for bit (float32 /
float64): ``pow_tensor_scalar_kernel`` / ``pow_tensor_tensor_kernel`` of
PowKernel.cpp, SLEEF's pow in the vector body and libm's in the tail
(:func:`fpemu.autograd._cpu_math.pow_model`)."""

import numpy as np
import pytest
import torch

import fpemu.autograd as ft

DTYPES = [(torch.float32, np.uint32), (torch.float64, np.uint64)]
SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 0.5, -3.0, 1e-40,
           -1e-40, 1e30, -1e30, 3e38, 1e-45, 7.25, -0.75]


@pytest.fixture(autouse=True)
def _cpu_profile():
    p = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                   cpu_capability=torch.backends.cpu.get_cpu_capability())
    with ft.use_profile(p):
        yield


def _same(got, want, ui):
    g = np.ascontiguousarray(got.numpy()).view(ui)
    w = np.ascontiguousarray(want.numpy()).view(ui)
    assert g.shape == w.shape
    bad = np.nonzero(g != w)
    assert bad[0].size == 0, (bad, g[bad][:4], w[bad][:4])


def _bases(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 3
    x[::3] = np.abs(x[::3])
    k = min(n, len(SPECIAL))
    x[rng.permutation(n)[:k]] = SPECIAL[:k]
    return x


@pytest.mark.parametrize("tdt,ui", DTYPES)
@pytest.mark.parametrize("e", [1.5, -2.7, 0.3, 3.0, 2, 4, -1.25, 1e-3, 100.5])
def test_tensor_scalar(tdt, ui, e):
    for n in list(range(1, 71)) + [0, 257]:
        x = torch.tensor(_bases(n, n), dtype=tdt)
        _same(ft.tensor(x.numpy()) ** e, x ** e, ui)
    x = torch.tensor(_bases(24 * 37, 1), dtype=tdt).reshape(24, 37)
    _same(ft.tensor(x.numpy()).t() ** e, x.t() ** e, ui)              # strided
    _same(ft.tensor(x.numpy())[:, ::2] ** e, x[:, ::2] ** e, ui)


@pytest.mark.parametrize("tdt,ui", DTYPES)
def test_tensor_tensor(tdt, ui):
    rng = np.random.default_rng(5)
    for n in list(range(1, 71)) + [0, 300]:
        x = torch.tensor(_bases(n, n + 100), dtype=tdt)
        y = torch.tensor(rng.standard_normal(n) * 4, dtype=tdt)
        y[::4] = torch.round(y[::4])
        _same(ft.tensor(x.numpy()) ** ft.tensor(y.numpy()), x ** y, ui)
    sp = torch.tensor(SPECIAL, dtype=tdt)
    X, Y = (t.contiguous() for t in torch.meshgrid(sp, sp, indexing="ij"))
    _same(ft.tensor(X.numpy()) ** ft.tensor(Y.numpy()), X ** Y, ui)
    _same(ft.tensor(X.numpy()).t() ** ft.tensor(Y.numpy()), X.t() ** Y, ui)
    b = torch.tensor(_bases(40, 7), dtype=tdt).reshape(8, 5)
    _same(ft.tensor(b.numpy()) ** ft.tensor(sp.numpy()[:5]), b ** sp[:5], ui)   # broadcast


@pytest.mark.parametrize("tdt,ui", DTYPES)
@pytest.mark.parametrize("s", [2.0, 0.3, -1.7, 10.0, 2, 0.0, -2.0])
def test_rpow(tdt, ui, s):
    rng = np.random.default_rng(9)
    for n in list(range(1, 71)) + [200]:
        y = torch.tensor(rng.standard_normal(n) * 5, dtype=tdt)
        y[::5] = torch.round(y[::5])
        _same(s ** ft.tensor(y.numpy()), s ** y, ui)
