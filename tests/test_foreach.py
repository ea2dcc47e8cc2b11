"""``torch._foreach_*`` and the GradScaler's kernels in fpemu.autograd
(``fpemu/autograd/ops/foreach.py``), against torch's on this CPU bit for bit
under the CPU profile: float32, bfloat16 and float16 lists of several sizes
(under 32768 elements: one parallel chunk), numbers and one number per
tensor."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu.autograd as ft

torch = pytest.importorskip("torch")

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
DTYPES = ("float32", "bfloat16", "float16")
SIZES = (1, 7, 33, 100, 1000)


def _lists(dtype, seed, positive=False):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    if positive:
        arrays = [np.abs(a) + np.float32(0.01) for a in arrays]
    tl = [torch.tensor(a).to(getattr(torch, dtype)) for a in arrays]
    fl = [ft.tensor(a).to(getattr(ft, dtype)) for a in arrays]
    return tl, fl


def _bits(ts):
    return [np.asarray(t.float().numpy() if hasattr(t, "float") else t).view(np.uint32)
            for t in ts]


def _same(tl, fl):
    for a, b in zip(_bits(tl), _bits(fl)):
        np.testing.assert_array_equal(a, b)


CASES = {
    "add_ scalar": (lambda L, M, N: L._foreach_add_(M, 0.3), 1),
    "add_ scalars": (lambda L, M, N: L._foreach_add_(M, [0.1 * i for i in range(len(SIZES))]),
                     1),
    "mul_ scalar": (lambda L, M, N: L._foreach_mul_(M, 0.9), 1),
    "div_ scalars": (lambda L, M, N: L._foreach_div_(M, [1.7, 3.0, 0.3, 9.0, 1.1]), 1),
    "lerp_": (lambda L, M, N: L._foreach_lerp_(M, N, 0.1), 2),
    "addcmul_": (lambda L, M, N: L._foreach_addcmul_(M, N, N, value=0.001), 2),
    "addcdiv_ scalars": (lambda L, M, N: L._foreach_addcdiv_(
        M, N, N, [-1e-3, 2e-3, 1.0, 0.5, -0.25]), 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_foreach_kernels_are_torch_cpu_s(case, dtype):
    fn, _ = CASES[case]
    tm, fm = _lists(dtype, 1)
    tn, fn_ = _lists(dtype, 2, positive=True)
    fn(torch, tm, tn)
    with ft.use_profile(CPU):
        fn(ft, fm, fn_)
    _same(tm, fm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_foreach_sqrt_returns_new_tensors(dtype):
    tl, fl = _lists(dtype, 3, positive=True)
    tout = torch._foreach_sqrt(tl)
    with ft.use_profile(CPU):
        fout = ft._foreach_sqrt(fl)
    assert all(isinstance(t, ft.Tensor) and t.dtype is f.dtype for t, f in zip(fout, fl))
    if dtype == "float32":            # CPU float32 sqrt goes through MKL's VML (not modelled)
        for a, b in zip(_bits(tout), _bits(fout)):
            assert (a.view(np.int32) - b.view(np.int32)).__abs__().max() <= 1
    else:
        _same(tout, fout)


def test_the_grad_scaler_kernels_are_torch_s():
    for dtype in ("float32", "float16"):
        tl, fl = _lists(dtype, 4)
        tl[2][5] = float("inf")
        fl[2][5] = float("inf")
        tf, ff = torch.zeros(1), ft.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(tl, tf, torch.tensor(1 / 3.0))
        with ft.use_profile(CPU):
            ft._amp_foreach_non_finite_check_and_unscale_(fl, ff, ft.tensor(1 / 3.0))
        _same(tl, fl)
        assert float(tf) == float(ff) == 1.0
    for found, tracker, want in ((0.0, 9, (131072.0, 0)), (0.0, 3, (65536.0, 4)),
                                 (1.0, 5, (32768.0, 0))):
        ts, tt = torch.tensor([65536.0]), torch.tensor([tracker], dtype=torch.int32)
        fs, fti = ft.tensor([65536.0]), ft.tensor(np.array([tracker], np.int32))
        torch._amp_update_scale_(ts, tt, torch.tensor([found]), 2.0, 0.5, 10)
        ft._amp_update_scale_(fs, fti, ft.tensor([found]), 2.0, 0.5, 10)
        assert (float(ts), int(tt)) == (float(fs), int(fti)) == want


def test_bad_lists_are_refused():
    with pytest.raises(TypeError, match="_foreach_mul_: expected a list of floating-point "
                                        "fpemu tensors, got int in it"):
        ft._foreach_mul_([ft.ones(2), 3], 2.0)
    with pytest.raises(RuntimeError, match="same number of tensors, got 2 and 1"):
        ft._foreach_lerp_([ft.ones(2), ft.ones(2)], [ft.ones(2)], 0.5)
    with pytest.raises(ValueError, match="expected 2 scalars, one per tensor, got 3"):
        ft._foreach_div_([ft.ones(2), ft.ones(2)], [1.0, 2.0, 3.0])
