"""Under the CPU profile the losses of fpemu.autograd.nn.functional whose
steps fpemu reproduces (mse, l1, smooth_l1, huber, binary_cross_entropy,
binary_cross_entropy_with_logits, kl_div without log targets) and rsqrt,
expm1, log1p give torch CPU's float32 / float64 bit codes: lengths 1..70
(the vector bodies and tails of 8 / 16 lanes), strided inputs, every
reduction, inf / NaN / -0 where meaningful. The profile takes the vector
width and thread count from torch, so the tests also hold under
``bench/isa.py avx2``. (poisson_nll_loss, gaussian_nll_loss and kl_div with
``log_target`` go through torch's MKL exp / log, not reproduced.)"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.autograd as ft                                      # noqa: E402

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
F = torch.nn.functional
G = ft.nn.functional
DTYPES = (np.float32, np.float64)
REDUCTIONS = ("none", "mean", "sum")


def _same(got, want):
    got = np.asarray(got._data if isinstance(got, ft.Tensor) else got)
    want = want.detach().numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    codes = np.uint32 if got.dtype == np.float32 else np.uint64
    a, b = got.view(codes), want.view(codes)
    both_nan = np.isnan(got) & np.isnan(want)
    bad = np.flatnonzero((a != b) & ~both_nan)
    assert bad.size == 0, f"{bad.size} of {a.size} differ, first at {bad[:5]}"


def _check(fn_ft, fn_torch, *arrays):
    ts = [torch.from_numpy(a) for a in arrays]
    with ft.use_profile(CPU):
        got = fn_ft(*(ft.nn.from_torch(t) for t in ts))
    _same(got, fn_torch(*ts))


def _normal(n, dt, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_pointwise_losses(name, dt):
    extra = [{}] + ([{"beta": 0.3}, {"beta": 0.0}] if name == "smooth_l1_loss" else
                    [{"delta": 0.7}] if name == "huber_loss" else [])
    for n in list(range(1, 40)) + [63, 64, 65, 70]:
        a, b = _normal(n, dt, n), _normal(n, dt, n + 1000)
        if n > 6:
            a[:4] = [np.inf, -0.0, np.nan, 1e30]
        for kw in extra:
            for red in REDUCTIONS:
                _check(lambda x, y: getattr(G, name)(x, y, reduction=red, **kw),
                       lambda x, y: getattr(F, name)(x, y, reduction=red, **kw), a, b)
    a, b = _normal((12, 7), dt, 1), _normal((12, 7), dt, 2)
    _check(lambda x, y: getattr(G, name)(x.t(), y.t()), lambda x, y: getattr(F, name)(x.t(), y.t()),
           a, b)


@pytest.mark.parametrize("dt", DTYPES)
def test_binary_cross_entropy(dt):
    rng = np.random.default_rng(7)
    for n in list(range(1, 36)) + [64, 70, 257]:
        x, t = rng.random(n).astype(dt), rng.random(n).astype(dt)
        x[::5] = np.resize(np.array([0.0, 1.0, 1e-30, 1 - 1e-7, 0.5], dt), x[::5].size)
        w = rng.random(n).astype(dt)
        for red in REDUCTIONS:
            _check(lambda a, b: G.binary_cross_entropy(a, b, reduction=red),
                   lambda a, b: F.binary_cross_entropy(a, b, reduction=red), x, t)
            _check(lambda a, b, c: G.binary_cross_entropy(a, b, c, reduction=red),
                   lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=red), x, t, w)


@pytest.mark.parametrize("dt", DTYPES)
def test_binary_cross_entropy_with_logits(dt):
    rng = np.random.default_rng(8)
    for n in list(range(1, 36)) + [64, 70, 257]:
        x, t = _normal(n, dt, n, 6), rng.random(n).astype(dt)
        if n > 6:
            x[:5] = [np.inf, -np.inf, -0.0, 40.0, -120.0]
        for red in REDUCTIONS:
            _check(lambda a, b: G.binary_cross_entropy_with_logits(a, b, reduction=red),
                   lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=red), x, t)
    x, t = _normal((6, 5), dt, 1, 4), rng.random((6, 5)).astype(dt)
    w, pw = rng.random((6, 5)).astype(dt), (rng.random(5) * 3).astype(dt)
    for red in REDUCTIONS:
        _check(lambda a, b, c, d: G.binary_cross_entropy_with_logits(
                   a, b, c, reduction=red, pos_weight=d),
               lambda a, b, c, d: F.binary_cross_entropy_with_logits(
                   a, b, c, reduction=red, pos_weight=d), x, t, w, pw)


@pytest.mark.parametrize("dt", DTYPES)
def test_kl_div(dt):
    rng = np.random.default_rng(9)
    for shape in [(1,), (5,), (3, 17), (4, 33), (2, 70)]:
        x = _normal(shape, dt, 3)
        t = rng.random(shape).astype(dt)
        t.reshape(-1)[::4] = 0
        for red in ("none", "mean", "sum", "batchmean"):
            with warnings.catch_warnings():          # both warn of "mean"'s meaning
                warnings.simplefilter("ignore", UserWarning)
                _check(lambda a, b: G.kl_div(a, b, reduction=red),
                       lambda a, b: F.kl_div(a, b, reduction=red), x, t)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", ["rsqrt", "expm1", "log1p"])
def test_rsqrt_expm1_log1p(name, dt):
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, -1.0, 89.0, 710.0, -800.0,
                         1e-30, np.finfo(dt).tiny / 4, np.finfo(dt).max], dt)
    for n in list(range(1, 40)) + [64, 65, 70]:
        x = _normal(n, dt, n, 8)
        if name != "expm1":
            x = np.abs(x) if n % 2 else x
        x[:min(n, specials.size)] = specials[:min(n, specials.size)]
        _check(getattr(ft, name), getattr(torch, name), x)
    x = _normal((9, 40), dt, 3, 8)
    _check(lambda a: getattr(ft, name)(a.t()), lambda a: getattr(torch, name)(a.t()), x)
