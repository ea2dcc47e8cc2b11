"""The CPU profile's ``interpolate`` and adaptive average poolings against
torch CPU, bit for bit (fpemu/autograd/nn/_cpu_resample.py): float32 and
float64, every kernel torch picks (the generic separable one; the
channels-last ones, reached through small 2-d outputs, channels-last input
of more than 3 channels, or 3 channels on one thread; the nearest kernels'
two index formulas), channel counts around the vector width (the vector
body, AVX512's half-vector tail, the scalar tail), align_corners on and
off, sizes and scale factors, up- and downsampling, odd sizes, one-element
outputs, NaN / inf / -0 inputs.

The profile takes torch's own instruction set and thread count, so the same
tests check the AVX2 model under ``python bench/isa.py avx2 -- ...``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import fpemu.autograd as ft
from fpemu.autograd.nn import _cpu_resample

torch = pytest.importorskip("torch")
TF = torch.nn.functional
CAP = torch.backends.cpu.get_cpu_capability()
CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(), cpu_capability=CAP)
pytestmark = pytest.mark.skipif(CAP.upper() not in _cpu_resample.CAPABILITIES,
                                reason=f"fpemu models ATen's AVX2 / AVX512 kernels, not {CAP}")
DTYPES = (torch.float32, torch.float64)


def _lanes(dtype):
    return CPU.cpu_lanes(4 if dtype == torch.float32 else 8)


def _channels(dtype):
    """Channel counts through every part of a channels-last kernel: the
    scalar tail alone, the half-vector tail, whole vectors and both tails."""
    L = _lanes(dtype)
    return sorted({1, 3, 4, L // 2 - 1, L // 2, L - 1, L, L + L // 2, 2 * L + L // 2 + 1})


def _input(shape, dtype, seed, layout="contiguous"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.ndim == 4
                         else torch.channels_last_3d)
    return x


def _codes(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _same(fn_torch, fn_fpemu, x, what):
    want = fn_torch(x).numpy()
    with ft.use_profile(CPU):
        got = fn_fpemu(ft.nn.from_torch(x)).numpy()
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, what
    bad = _codes(got) != _codes(want)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ, first at " \
                          f"{np.argwhere(bad)[0]}: {got[bad][0]!r} vs torch {want[bad][0]!r}"


def _interp(x, **kw):
    _same(lambda t: TF.interpolate(t, **kw), lambda f: ft.nn.functional.interpolate(f, **kw),
          x, f"{tuple(x.shape)} {x.dtype} stride {x.stride()} {kw}")


#: (input spatial size, a size or a scale factor) per spatial rank: up and
#: down, odd sizes, one-element outputs, out == in and out == 2 in
RESIZES = {
    1: [(13, dict(size=5)), (4, dict(size=17)), (7, dict(size=1)), (6, dict(size=6)),
        (9, dict(scale_factor=1.7)), (10, dict(scale_factor=0.35)), (5, dict(scale_factor=2.0))],
    2: [((7, 9), dict(size=(5, 6))), ((4, 5), dict(size=(11, 3))), ((6, 6), dict(size=(1, 1))),
        ((5, 7), dict(size=(5, 14))), ((6, 5), dict(scale_factor=1.7)),
        ((9, 10), dict(scale_factor=(0.6, 0.45))), ((3, 4), dict(scale_factor=2.1)),
        ((9, 7), dict(size=(70, 61)))],          # 131 > 128: the generic 2-d kernel
    3: [((3, 4, 5), dict(size=(5, 3, 7))), ((4, 4, 3), dict(size=(1, 6, 3))),
        ((5, 3, 4), dict(scale_factor=1.6)), ((6, 5, 4), dict(scale_factor=(0.5, 0.7, 1.0)))],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["linear", "bilinear", "trilinear", "bicubic"])
def test_interpolate_linear_modes_bit_for_bit(mode, dtype):
    nd = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}[mode]
    layouts = ("contiguous",) if nd == 1 else ("contiguous", "channels_last")
    channels = _channels(dtype) if mode != "bicubic" else (1, 3, _lanes(dtype) + 1)
    seed = 0
    for (n_in, kw), C, layout in itertools.product(RESIZES[nd], channels, layouts):
        if layout == "channels_last" and C < 4 and mode != "bilinear":
            continue
        spatial = (n_in,) if nd == 1 else n_in
        for ac in (False, True):
            seed += 1
            _interp(_input((2, C) + tuple(spatial), dtype, seed, layout), mode=mode,
                    align_corners=ac, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_interpolate_specials_and_strides(dtype):
    """NaN, inf and -0 inputs (an inf times a zero weight is NaN, as in the
    kernels), and a transposed (non-contiguous, not channels-last) input."""
    x = _input((1, 5, 6, 7), dtype, 99)
    x[0, 0, 2, 3] = float("nan")
    x[0, 1, 1, 1] = float("inf")
    x[0, 2, 4, 0] = -float("inf")
    x[0, 3] = -0.0
    for mode, kw in (("bilinear", dict(size=(9, 4))), ("bicubic", dict(size=(4, 11))),
                     ("bilinear", dict(size=(80, 60))), ("nearest", dict(size=(9, 13)))):
        for ac in ((False, True) if mode != "nearest" else (None,)):
            _interp(x, mode=mode, align_corners=ac, **kw)
            _interp(x.transpose(2, 3), mode=mode, align_corners=ac, **kw)
            _interp(x.contiguous(memory_format=torch.channels_last), mode=mode,
                    align_corners=ac, **kw)
    y = _input((1, 6, 3, 4, 5), dtype, 98)
    y[0, :, 1, 2, 3] = float("inf")
    _interp(y, mode="trilinear", size=(4, 6, 3), align_corners=False)
    _interp(y.contiguous(memory_format=torch.channels_last_3d), mode="trilinear",
            size=(4, 6, 3), align_corners=True)


def test_upsample_bilinear_is_the_align_corners_map():
    for dtype, kw in itertools.product(DTYPES, (dict(size=(5, 7)), dict(scale_factor=1.7))):
        x = _input((2, 3, 4, 6), dtype, 5)
        with pytest.warns(UserWarning):
            want = TF.upsample_bilinear(x, **kw).numpy()
        with ft.use_profile(CPU), pytest.warns(UserWarning):
            got = ft.nn.functional.upsample_bilinear(ft.nn.from_torch(x), **kw).numpy()
        assert (_codes(got) == _codes(want)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_modes_pick_torchs_inputs(mode, dtype):
    """Both index formulas: the 2-d and channels-last kernels' float32
    ``nearest_idx`` (with its out == in and out == 2 in copies) and the
    generic kernel's opmath scale (large 2-d outputs, 1-d, 3-d)."""
    seed = 0
    for nd, cases in RESIZES.items():
        for (n_in, kw), C, layout in itertools.product(
                cases + ([((5, 4), dict(scale_factor=2.1)), ((5, 6), dict(size=(90, 70))),
                          ((7, 5), dict(scale_factor=(13.0, 14.0)))] if nd == 2 else []),
                (3, 5), ("contiguous", "channels_last") if nd > 1 else ("contiguous",)):
            seed += 1
            spatial = (n_in,) if nd == 1 else n_in
            _interp(_input((2, C) + tuple(spatial), dtype, seed, layout), mode=mode, **kw)


def _adaptive(x, size):
    nd = len(size)
    fns = {1: "adaptive_avg_pool1d", 2: "adaptive_avg_pool2d", 3: "adaptive_avg_pool3d"}
    _same(lambda t: getattr(TF, fns[nd])(t, size),
          lambda f: getattr(ft.nn.functional, fns[nd])(f, size),
          x, f"{tuple(x.shape)} {x.dtype} stride {x.stride()} -> {size}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_adaptive_avg_pools_bit_for_bit(dtype):
    """Windows of unequal lengths, one-element and whole-dim windows, the
    channels-last 2-d kernel's vector and tail channels; and
    interpolate(mode="area"), which is these poolings."""
    seed = 0
    for C in _channels(dtype):
        for (H, W), size in (((7, 9), (5, 4)), ((13, 11), (3, 5)), ((8, 8), (8, 3)),
                             ((6, 10), (1, 7)), ((5, 5), (None, 2))):
            for layout in ("contiguous", "channels_last"):
                seed += 1
                _adaptive(_input((2, C, H, W), dtype, seed, layout), size)
        seed += 1
        _adaptive(_input((C, 9, 7), dtype, seed), (4, 3))
        _adaptive(_input((2, C, 11), dtype, seed), (4,))
        for layout in ("contiguous", "channels_last"):
            seed += 1
            _adaptive(_input((1, C, 3, 5, 7), dtype, seed, layout), (2, 3, 3))
    _adaptive(_input((3, 4, 6, 5, 7), dtype, 7), (5, 1, None))
    for shape, size in (((2, 3, 7), (3,)), ((2, 3, 7, 9), (5, 4)), ((1, 2, 4, 5, 6), (3, 2, 4))):
        _interp(_input(shape, dtype, 8), mode="area", size=size)
        _interp(_input(shape, dtype, 9), mode="area", scale_factor=0.6)


def test_one_element_adaptive_pool_is_mean():
    """ATen computes a one-element-per-plane adaptive average as ``mean``
    over the spatial dims: so does fpemu (its CPU ``mean`` model)."""
    x = _input((2, 3, 5, 7), torch.float32, 3)
    with ft.use_profile(CPU):
        f = ft.nn.from_torch(x)
        got = ft.nn.functional.adaptive_avg_pool2d(f, 1).numpy()
        want = f.mean((-1, -2), keepdim=True).numpy()
    assert (_codes(got) == _codes(want)).all()


def test_three_channels_on_one_thread_take_the_channels_last_kernel():
    """ATen's bilinear picks the channels-last kernel for 3 channels when it
    runs on one thread, whatever the output size (upsample_bilinear2d_kernel_impl_float)."""
    one = ft.Profile("cpu", "2.13.0", cpu_threads=1, cpu_capability=CAP)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype, C in itertools.product(DTYPES, (3, 2)):
            x = _input((1, C, 9, 7), dtype, C)
            want = TF.interpolate(x, size=(80, 61), mode="bilinear").numpy()
            with ft.use_profile(one):
                got = ft.nn.functional.interpolate(ft.nn.from_torch(x), size=(80, 61),
                                                   mode="bilinear").numpy()
            assert (_codes(got) == _codes(want)).all(), (dtype, C)
    finally:
        torch.set_num_threads(threads)
