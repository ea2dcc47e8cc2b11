"""``interpolate`` against torch CPU: nearest and nearest-exact pick the same
input for every output (bit for bit) over 1-, 2- and 3-d inputs, sizes and
scale factors whose float32 reciprocals decide the pick; the linear modes and
their gradients to a few float32 ulps (docs/autograd.md, tier 2); and the
argument errors torch raises."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu.autograd as ft

torch = pytest.importorskip("torch")
TF = torch.nn.functional
CPU = ft.Profile("cpu", "2.13.0")

SIZES = [dict(size=s) for s in (1, 2, 3, 4, 7, 10, 20, 31)] + [
    dict(scale_factor=f) for f in (0.3, 0.5, 0.7, 1.05, 1.5, 2.0, 2.3, 3.0, 1 / 3)]


def _run(x, **kw):
    with ft.use_profile(CPU):
        return ft.nn.functional.interpolate(ft.nn.from_torch(x), **kw)


def _codes(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("nd", [1, 2, 3])
def test_nearest_picks_torchs_inputs(mode, nd):
    """Each spatial dim in turn is resized (the others kept at 2), by size and
    by scale factor: the codes equal torch's, NaNs and -0 included."""
    g = torch.Generator().manual_seed(nd)
    checked = 0
    for n_in in (1, 2, 3, 5, 10, 13):
        for kw in SIZES:
            for axis in range(nd):
                shape = [2] * nd
                shape[axis] = n_in
                x = torch.randn((1, 2, *shape), generator=g)
                x.view(-1)[0] = float("nan")
                x.view(-1)[-1] = -0.0
                arg = dict(kw)
                key = next(iter(kw))
                per_dim = [1.0 if key == "scale_factor" else 2] * nd
                per_dim[axis] = kw[key]
                arg[key] = tuple(per_dim)
                try:
                    want = TF.interpolate(x, mode=mode, **arg)
                except RuntimeError:
                    continue                    # an output size of 0: torch refuses it too
                got = _run(x, mode=mode, **arg)
                assert got.shape == tuple(want.shape), (n_in, arg)
                assert np.array_equal(_codes(got.numpy()), _codes(want.numpy())), (n_in, arg)
                checked += 1
    assert checked >= 80 * nd           # most of the sizes torch accepts


@pytest.mark.parametrize("mode, shape", [("linear", (2, 3, 9)), ("bilinear", (2, 3, 9, 7)),
                                         ("bicubic", (2, 3, 9, 7)),
                                         ("trilinear", (1, 2, 5, 4, 6))])
@pytest.mark.parametrize("align_corners", [False, True])
def test_linear_modes_and_their_gradients(mode, shape, align_corners):
    g = torch.Generator().manual_seed(7)
    for kw in (dict(scale_factor=0.6), dict(scale_factor=1.7), dict(scale_factor=3.0),
               dict(size=tuple(max(1, n * 2 - 1) for n in shape[2:]))):
        x = torch.randn(shape, generator=g, requires_grad=True)
        want = TF.interpolate(x, mode=mode, align_corners=align_corners, **kw)
        cot = torch.randn(want.shape, generator=g)
        (tg,) = torch.autograd.grad(want, x, cot)
        fx = ft.nn.from_torch(x.detach()).requires_grad_(True)
        with ft.use_profile(CPU):
            got = ft.nn.functional.interpolate(fx, mode=mode, align_corners=align_corners,
                                               **kw)
            got.backward(ft.nn.from_torch(cot))
        assert got.shape == tuple(want.shape)
        w = want.detach().numpy()
        # torch rounds each product and partial sum in float32: a few ulps of the scale
        assert np.abs(got.detach().numpy().astype(np.float64) - w).max() <= \
            16 * np.spacing(np.float32(np.abs(w).max())), kw
        t = tg.numpy()
        assert np.abs(fx.grad.numpy().astype(np.float64) - t).max() <= \
            64 * np.spacing(np.float32(np.abs(t).max())), kw


def test_float64_stays_float64():
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    want = TF.interpolate(x, scale_factor=1.5, mode="bilinear")
    got = _run(x, scale_factor=1.5, mode="bilinear")
    assert got.dtype is ft.float64
    assert np.abs(got.numpy() - want.numpy()).max() < 1e-14


def test_area_is_the_adaptive_average():
    x = torch.randn(1, 2, 7, 5, 6)
    for size in ((3, 2, 4), (7, 5, 6), (2, 5, 1)):
        want = TF.interpolate(x, size=size, mode="area")
        got = _run(x, size=size, mode="area")
        assert np.abs(got.numpy() - want.numpy()).max() < 1e-6


@pytest.mark.parametrize("kw, err", [
    (dict(size=3, scale_factor=2.0), ValueError),
    (dict(), ValueError),
    (dict(size=(2, 3)), ValueError),                      # a 1-d input, two sizes
    (dict(size=3, mode="nearest", align_corners=True), ValueError),
    (dict(size=3, mode="bilinear"), NotImplementedError),   # bilinear needs 4-d
    (dict(size=3, mode="cubic"), NotImplementedError),
    (dict(size=3, recompute_scale_factor=True), ValueError),
    (dict(size=3, mode="linear", antialias=True), ValueError),
])
def test_errors_are_torchs(kw, err):
    x = torch.randn(1, 2, 5)
    with pytest.raises(err):
        TF.interpolate(x, **kw)
    with pytest.raises(err):
        _run(x, **kw)


def test_antialias_is_refused_as_not_emulated():
    x = torch.randn(1, 2, 8, 8)
    with pytest.raises(NotImplementedError, match="not emulated"):
        _run(x, size=(3, 3), mode="bilinear", antialias=True)
