"""fpemu's Hopper fp8 GEMMs against mmaemu 0.1.0, an independent emulator of
``torch._scaled_mm`` validated bit for bit on an H100 PCIe by its authors
(cuBLASLt 12.8.3.14): the tensor-core accumulator (fast and slow
accumulation, mixed e5m2 x e4m3 operands), the epilogue, and
``fpemu.autograd._scaled_mm``'s checks against torch's CUDA kernel."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fpemu
import fpemu.autograd as ft
from fpemu import accumulate
from fpemu.autograd.fp8 import scaled_gemm

import torch  # installed by `make` (the dev extras), as mmaemu, the oracle
import mmaemu

FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _mmaemu(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # mmaemu's notes on validation envelopes
        return fn(*args, splitk=1, profile="hopper", **kwargs)


def _operand(rng, shape, fmt, special=False):
    """fp8 values over the format's whole range: normals, subnormals, zeros of
    both signs, and (``special``) a NaN and an infinity or the maximum."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)
    x[rng.random(shape) < 0.05] = 0.0
    x[rng.random(shape) < 0.03] = -0.0
    if special:
        x.reshape(-1)[rng.integers(0, x.size)] = np.nan
        x.reshape(-1)[rng.integers(0, x.size)] = np.inf
    q = fpemu.quantize(x.astype(np.float32), fmt)
    return q, torch.tensor(q).to(FP8[fmt])


def _bits(a):
    a = np.asarray(a, np.float32)
    return a.view(np.uint32)


PAIRS = [("e4m3fn", "e4m3fn"), ("e5m2", "e4m3fn"), ("e4m3fn", "e5m2")]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-accum", "slow-accum"])
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_accumulator_bit_for_bit(fa, fb, fast):
    rng = np.random.default_rng(hash((fa, fb, fast)) % 2**32)
    for M, K, N in ((4, 32, 4), (8, 96, 8), (4, 416, 6)):
        qa, ta = _operand(rng, (M, K), fa)
        qb, tb = _operand(rng, (N, K), fb)
        ref = _mmaemu(mmaemu.accumulate, ta, tb, use_fast_accum=fast).numpy()
        if fast:
            ours = accumulate.matmul(qa, qb.T, (fa, fb), model="h100-fp8")
        else:
            ours = accumulate.matmul(qa, qb.T, (fa, fb), model="blocked", block=128,
                                     inner="h100-fp8")
        np.testing.assert_array_equal(_bits(ours), _bits(ref))


def test_the_cases_the_oracles_found():
    one = np.ones((1, 1), np.float32)
    # mixed e5m2 x e4m3: the e4m3 subnormal 2**-9 aligns at e4m3's emin (-6),
    # so 2**-5 falls below the 13 fraction bits of the 2**9 block: 64, not 64.03125
    a = np.zeros((1, 32), np.float32)
    b = np.zeros((1, 32), np.float32)
    a[0, :2], b[0, :2] = [32768.0, 2.0**-5], [2.0**-9, 1.0]
    assert scaled_gemm(a, one, b, one, 32, fpemu.formats.e5m2, fpemu.formats.e4m3fn,
                       "h100-fp8", False)[0, 0] == 64.0
    ref = _mmaemu(mmaemu.accumulate, torch.tensor(a).to(FP8["e5m2"]),
                  torch.tensor(b).to(FP8["e4m3fn"]), use_fast_accum=True)
    assert ref.item() == 64.0
    # a negative product that underflows in the epilogue is -0, as on the GPU
    a = np.zeros((1, 16), np.float32)
    b = np.zeros((1, 16), np.float32)
    a[0, 0], b[0, 0] = -0.25, 1.0
    out = scaled_gemm(a, np.full((1, 1), 2.0**-75, np.float32), b,
                      np.full((1, 1), 2.0**-74, np.float32), 16, fpemu.formats.e4m3fn,
                      fpemu.formats.e4m3fn, "h100-fp8", False)
    assert out[0, 0] == 0 and np.signbit(out[0, 0])
    # NaN is the tensor core's canonical 0x7FFFFFFF
    r = accumulate.matmul(np.array([[np.nan, 1.0]]), np.ones((2, 1)), "e4m3fn",
                          model="h100-fp8")
    assert _bits(r)[0, 0] == 0x7FFFFFFF


@pytest.mark.parametrize("fast", [True, False], ids=["fast-accum", "slow-accum"])
@pytest.mark.parametrize("out", ["float32", "bfloat16", "float16", "float8_e4m3fn"])
def test_scaled_mm_bit_for_bit(out, fast):
    rng = np.random.default_rng(7)
    for fa, fb in PAIRS:
        M, K, N = 16, 16 * int(rng.integers(1, 12)), 32
        qa, ta = _operand(rng, (M, K), fa, special=fa == "e5m2")
        qb, tb = _operand(rng, (N, K), fb)
        sa, sb = (np.float32(rng.uniform(0.01, 4)) for _ in range(2))
        kw = {}
        if out.startswith("float8"):
            # torch's CUDA _scaled_mm leaves scale_result out of the epilogue (an
            # H200 with torch 2.11: tests/test_gpu_probes.py); mmaemu, a model of
            # cuBLASLt itself, would apply it as the D scale, so it is not given one
            kw["scale_result"] = ft.tensor(np.float32(0.7))
        ref = _mmaemu(mmaemu.scaled_mm, ta, tb.t(), torch.tensor(sa), torch.tensor(sb),
                      out_dtype=getattr(torch, out), use_fast_accum=fast)
        ours = ft._scaled_mm(ft.nn.from_torch(ta), ft.nn.from_torch(tb).t(), ft.tensor(sa),
                             ft.tensor(sb), out_dtype=getattr(ft, out), use_fast_accum=fast,
                             splitk=1, **kw)          # as mmaemu's, one chain
        assert str(ours.dtype) == str(ref.dtype)
        x, y = ref.float().numpy(), ours.float().numpy()
        both_nan = np.isnan(x) & np.isnan(y)
        np.testing.assert_array_equal(np.where(both_nan, 0, _bits(y)),
                                      np.where(both_nan, 0, _bits(x)))


def test_scaled_mm_refuses_what_torchs_cuda_kernel_refuses():
    a = ft.ones(16, 32).to(ft.float8_e4m3fn)
    w = ft.ones(16, 32).to(ft.float8_e4m3fn)
    s = ft.tensor(1.0)
    cases = [
        (lambda: ft._scaled_mm(a, w, s, s), RuntimeError, "shapes cannot be multiplied"),
        (lambda: ft._scaled_mm(a[:, :8], w[:, :8].t(), s, s), RuntimeError,
         r"divisible by 16 but got mat1 shape: \(16x8\)"),
        (lambda: ft._scaled_mm(a, w.t().contiguous(), s, s), RuntimeError,
         "row-major and column-major"),
        (lambda: ft._scaled_mm(a.to(ft.float8_e5m2), w.t().to(ft.float8_e5m2), s, s),
         ValueError, "two Float8_e5m2 matrices is not supported"),
        (lambda: ft._scaled_mm(a, w.t(), s.double(), s), ValueError,
         "Invalid scaling configuration"),
        (lambda: ft._scaled_mm(a.float(), w.t().float(), s, s), ValueError,
         "Invalid scaling configuration"),
        (lambda: ft._scaled_mm(a, w.t(), s, s, bias=ft.zeros(16), out_dtype=ft.float32),
         RuntimeError, "Bias is not supported when out_dtype is set to Float32"),
        (lambda: ft._scaled_mm(a, w.t(), s, s, bias=ft.zeros(16, dtype=ft.float16),
                               out_dtype=ft.bfloat16), RuntimeError,
         "Bias must be BFloat16 to compute BFloat16 output, but got Half"),
        (lambda: ft._scaled_mm(a, w.t(), s, s, bias=ft.zeros(8, dtype=ft.bfloat16),
                               out_dtype=ft.bfloat16), RuntimeError,
         "Bias must be size 16 but got 8"),
    ]
    for call, err, msg in cases:
        with pytest.raises(err, match=msg):
            call()
    assert ft._scaled_mm(a, w.t(), s, s).dtype is ft.float8_e4m3fn    # out_dtype: a's
    rows = ft._scaled_mm(a, w.t(), ft.full((16, 1), 0.5), ft.full((1, 16), 0.25),
                         out_dtype=ft.bfloat16)
    assert rows.float().numpy().tolist() == [[4.0] * 16] * 16        # 32 * 0.5 * 0.25
    x = ft.ones(16, 32, requires_grad=True)
    y = ft._scaled_mm(x.to(ft.float8_e4m3fn), w.t(), s, s, out_dtype=ft.float32)
    with pytest.raises(NotImplementedError, match="derivative for '_scaled_mm'"):
        y.sum().backward()


def test_scaled_mm_under_the_cpu_profile_is_torch_cpus():
    """torch's CPU kernel dequantizes and runs a float32 GEMM."""
    torch.manual_seed(0)
    a = (torch.randn(16, 64) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(16, 64) * 4).to(torch.float8_e5m2)
    sa, sb = torch.tensor(0.37), torch.tensor(1.9)
    ref = torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.float32)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        ours = ft._scaled_mm(ft.nn.from_torch(a), ft.nn.from_torch(b).t(), ft.nn.from_torch(sa),
                             ft.nn.from_torch(sb), out_dtype=ft.float32)
    # Both dequantize (code times scale, rounded to float32) and add the K
    # products in float32, fpemu in index order and torch CPU's BLAS in blocks,
    # so each lies within K u sum|terms| of the exact sum of the same products
    # (float64 here: 64 products of float32 values add with error far below that).
    da = (a.float() * sa).numpy().astype(np.float64)
    db = (b.float() * sb).numpy().astype(np.float64)
    exact = da @ db.T
    bound = 64 * 2.0**-24 * (np.abs(da) @ np.abs(db).T)
    assert np.all(np.abs(ref.numpy() - exact) <= bound)
    assert np.all(np.abs(ours.numpy() - exact) <= bound)
    # A scale applied inverted or twice falls far outside the bound.
    assert not np.allclose(ours.numpy() * 0.37, exact, rtol=1e-3)


@pytest.mark.parametrize("out", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("scale_result", [0.1, 0.5, 3.0, 2.0**-8])
def test_scaled_mm_fp8_output_under_the_cpu_profile_is_torch_cpus(out, scale_result):
    """torch's CPU kernel (``_scaled_mm_out_cpu``'s reference path) multiplies
    an fp8 output by fp32(1 / scale_result) and casts it with ``.to()``
    (e5m2 overflows to inf; e4m3fn saturates from torch 2.12 on). The oracle
    is that path written with torch's own ops, not ``torch._scaled_mm``
    itself: on a CPU with AVX-512 FP16, torch 2.13 takes oneDNN's fp8 GEMM
    instead, whose e4m3fn overflow is NaN (docs/pytorch-numerics.md).
    Integer operands: every float32 sum is exact, so the order of the sums
    cannot hide a difference."""
    rng = np.random.default_rng(11)
    a = torch.from_numpy(rng.integers(-16, 17, (16, 32)).astype(np.float32))
    b = torch.from_numpy(rng.integers(-16, 17, (16, 32)).astype(np.float32))
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    sr = torch.tensor(np.float32(scale_result))
    y32 = a8.float() @ b8.float().t()                   # exact: small integers
    ref = (y32 * (1 / sr)).to(getattr(torch, out))
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        ours = ft._scaled_mm(ft.nn.from_torch(a8), ft.nn.from_torch(b8).t(), ft.tensor(1.0),
                             ft.tensor(1.0), out_dtype=getattr(ft, out),
                             scale_result=ft.nn.from_torch(sr))
    x, y = ref.float().numpy(), ours.float().numpy()
    both_nan = np.isnan(x) & np.isnan(y)
    np.testing.assert_array_equal(np.where(both_nan, 0, _bits(y)), np.where(both_nan, 0, _bits(x)))
    if scale_result == 2.0**-8:          # the overflow is there to see
        assert (np.isinf(x) if out == "float8_e5m2" else np.abs(x) == 448).any()
