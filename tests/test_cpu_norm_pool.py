"""The CPU profile's average pooling and normalizations against torch CPU,
bit for bit (fpemu.autograd._cpu_norm, nn/_norm.py, nn/_pooling.py).

Shapes cover each kernel's paths: rows around the 8-float / 4-double vector
of ATen's AVX2 build (which AVX512 CPUs also run for these kernels), several
16-vector chunks (RowwiseMoments' cascade), scalar tails, contiguous and
channels-last layouts, with and without weight and bias, float32, float64 and
bfloat16 where the op takes it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fpemu.autograd as ft                                  # noqa: E402
from fpemu.autograd._cpu_norm import aten_lanes, rowwise_moments  # noqa: E402

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
RNG = np.random.default_rng(68)


def bits(a):
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a.view(np.int64)
    return np.asarray(a, np.float32).view(np.int32)


def same(ref, out):
    r = ref.detach().float().numpy() if ref.dtype in (torch.bfloat16, torch.float16) \
        else ref.detach().numpy()
    return np.array_equal(bits(r), bits(np.asarray(out._data, r.dtype)))


def fp(t):
    return None if t is None else ft.nn.from_torch(t)


def rand(shape, dt, scale=3.0, shift=2.0):
    return torch.from_numpy(RNG.standard_normal(shape) * scale + shift).to(dt)


# ------------------------------------------------------------ RowwiseMoments
@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_rowwise_moments_lane_order(dt):
    """Rows whose statistics depend on the lane count: the model with ATen's
    lanes equals torch's saved mean and rstd, the other lane count does not
    (the order is checked, not only the values)."""
    npdt = np.float32 if dt is torch.float32 else np.float64
    L = aten_lanes(np.dtype(npdt).itemsize)
    N = 16 * L * 5 + 3                          # 5 chunks: the cascade merges, a tail
    X = (RNG.standard_normal((64, N)) * 3 + 1e3).astype(npdt)
    _, tm, tr = torch.native_layer_norm(torch.from_numpy(X), (N,), None, None, 1e-5)
    tm, tr = tm.numpy().ravel(), tr.numpy().ravel()

    def stats(lanes):
        mean, var = rowwise_moments(X, lanes)
        return mean, (npdt(1) / np.sqrt(var + npdt(1e-5))).astype(npdt)
    mean, rstd = stats(L)
    assert np.array_equal(bits(mean), bits(tm)) and np.array_equal(bits(rstd), bits(tr))
    other_mean, other_rstd = stats(2 * L)
    assert not (np.array_equal(bits(other_mean), bits(tm))
                and np.array_equal(bits(other_rstd), bits(tr)))


# ---------------------------------------------------------------- layer_norm
LN_SIZES = [1, 3, 7, 8, 9, 15, 16, 17, 33, 128, 129, 257, 16 * 8 * 3 + 5]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm(dt):
    for N in LN_SIZES:
        for wb in ("", "w", "b", "wb"):
            x = rand((4, N), dt)
            w = rand(N, dt, 1, 0) if "w" in wb else None
            b = rand(N, dt, 1, 0) if "b" in wb else None
            eps = 1e-5 if N % 2 else 1e-3
            ref = F.layer_norm(x, (N,), w, b, eps)
            with ft.use_profile(CPU):
                out = ft.nn.functional.layer_norm(fp(x), (N,), fp(w), fp(b), eps)
            assert same(ref, out), (dt, N, wb)


def test_layer_norm_bf16_float_params_and_3d():
    x = rand((2, 3, 40), torch.bfloat16)
    w, b = rand((3, 40), torch.float32, 1, 0), rand((3, 40), torch.float32, 1, 0)
    ref = F.layer_norm(x, (3, 40), w, b)
    with ft.use_profile(CPU):
        out = ft.nn.functional.layer_norm(fp(x), (3, 40), fp(w), fp(b))
    assert same(ref, out)


# ---------------------------------------------------------------- group_norm
GN_CASES = [((2, 6, 5, 5), 3), ((3, 4, 7), 2), ((2, 16, 3, 3), 4), ((2, 32, 9, 9), 4),
            ((1, 12, 4, 4), 12), ((2, 8, 20, 20), 2), ((2, 40, 3, 3), 5), ((2, 64, 33), 8)]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64, torch.bfloat16])
def test_group_norm(dt):
    for shape, G in GN_CASES:
        for cl in (False, True):
            if cl and (len(shape) != 4 or dt is torch.bfloat16):
                continue                         # bfloat16 channels-last: not modelled
            for wb in ("", "w", "b", "wb"):
                C = shape[1]
                x = rand(shape, dt)
                if cl:
                    x = x.to(memory_format=torch.channels_last)
                w = rand(C, dt, 1, 0) if "w" in wb else None
                b = rand(C, dt, 1, 0) if "b" in wb else None
                ref = F.group_norm(x, G, w, b, 1e-5)
                with ft.use_profile(CPU):
                    out = ft.nn.functional.group_norm(fp(x), G, fp(w), fp(b), 1e-5)
                assert same(ref, out), (dt, shape, G, cl, wb)


# ----------------------------------------------------- batch / instance norm
BN_SHAPES = [(4, 3), (5, 17), (2, 6, 5, 5), (3, 4, 7), (2, 16, 3, 3), (2, 17, 9, 9),
             (1, 12, 4, 4), (3, 5, 2, 3, 4)]


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_batch_norm(dt):
    for shape in BN_SHAPES:
        for cl in (False, True):
            if cl and len(shape) != 4:
                continue
            for train in (True, False):
                for wb in ("", "w", "b", "wb"):
                    C = shape[1]
                    x = rand(shape, dt)
                    if cl:
                        x = x.to(memory_format=torch.channels_last)
                    w = rand(C, dt, 1, 0) if "w" in wb else None
                    b = rand(C, dt, 1, 0) if "b" in wb else None
                    rm, rv = rand(C, dt, 1, 0), torch.rand(C, dtype=dt) + 0.5
                    frm, frv = fp(rm), fp(rv)
                    ref = F.batch_norm(x, rm, rv, w, b, train, 0.1, 1e-5)
                    with ft.use_profile(CPU):
                        out = ft.nn.functional.batch_norm(fp(x), frm, frv, fp(w), fp(b),
                                                          train, 0.1, 1e-5)
                    assert same(ref, out), (dt, shape, cl, train, wb)


@pytest.mark.parametrize("dt", [torch.float32, torch.float64])
def test_instance_norm(dt):
    for shape in [(2, 3, 7), (3, 4, 5, 5), (2, 2, 3, 4, 5), (1, 5, 33)]:
        for wb in ("", "wb"):
            C = shape[1]
            x = rand(shape, dt)
            w = rand(C, dt, 1, 0) if wb else None
            b = rand(C, dt, 1, 0) if wb else None
            ref = F.instance_norm(x, weight=w, bias=b)
            with ft.use_profile(CPU):
                out = ft.nn.functional.instance_norm(fp(x), weight=fp(w), bias=fp(b))
            assert same(ref, out), (dt, shape, wb)


# ------------------------------------------------------------------ avg_pool
POOL_ARGS = [(3, 2, 1, False, True, None), (3, 2, 1, True, False, None),
             (2, 1, 0, False, True, None), (4, 3, 2, True, True, None),
             (3, 1, 1, False, False, 5), (5, 2, 2, True, False, None)]


#: torch CPU has no bfloat16 avg_pool3d: that pair is not a case
POOL_CASES = [(dt, nd) for dt in (torch.float32, torch.float64, torch.bfloat16)
              for nd in (1, 2, 3) if (dt, nd) != (torch.bfloat16, 3)]


@pytest.mark.parametrize("dt, nd", POOL_CASES)
def test_avg_pool(dt, nd):
    f = getattr(F, f"avg_pool{nd}d")
    g = getattr(ft.nn.functional, f"avg_pool{nd}d")
    for cl in ((False, True) if nd > 1 else (False,)):
        for k, s, p, ceil, cip, dov in POOL_ARGS:
            x = rand((2, 19) + (9,) * nd, dt, 100, 0)
            if cl:
                x = x.to(memory_format=torch.channels_last if nd == 2 else
                         torch.channels_last_3d)
            kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil,
                      count_include_pad=cip)
            if nd > 1:
                kw["divisor_override"] = dov
            ref = f(x, **kw)
            with ft.use_profile(CPU):
                out = g(fp(x), **kw)
            assert same(ref, out), (dt, nd, cl, kw)


def test_avg_pool_specials():
    """inf, NaN and -0 in the windows; the contiguous kernel's +0."""
    x = torch.tensor([[[-0.0, -0.0, 1.0, float("inf"), float("nan"), -1e-45, -0.0, 2.0]]])
    for kw in (dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1),
               dict(kernel_size=2, stride=2, ceil_mode=True)):
        ref = F.avg_pool1d(x, **kw)
        with ft.use_profile(CPU):
            out = ft.nn.functional.avg_pool1d(fp(x), **kw)
        assert same(ref, out), kw
