"""fpemu against the GEMM and attention bits an NVIDIA H200 wrote.

``make gpu-check`` (bench/gpu_check.py) ran on an H200 with torch
2.11.0+cu130 (CUDA 13.0, driver 580.159.04) and recorded the output bits of
150 GEMM probes (bf16 / fp16 ``torch.mm`` into float32, TF32 matmul,
``torch._scaled_mm`` in every output dtype, fast and slow accumulation,
tensor-wise and row-wise scales, a bias) and 28 fused-attention probes, in
``bench/gpu_check/nvidia-h200-torch2.11.0``. The inputs are made from each
probe's seed on the CPU (their sha256 is recorded and checked here); the
oracle is what the GPU wrote, not fpemu. CI has no GPU: these tests hold
fpemu to those bits.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402

import fpemu.autograd as ft  # noqa: E402
import fpemu.cublaslt  # noqa: E402
from fpemu import accumulate  # noqa: E402

torch = pytest.importorskip("torch")

RUN = os.path.join(ROOT, "bench", "gpu_check", "nvidia-h200-torch2.11.0")
with open(os.path.join(RUN, "gemm.json")) as fh:
    GEMM = json.load(fh)
GEMM_BITS = np.load(os.path.join(RUN, "gemm.npz"))
with open(os.path.join(RUN, "attention.json")) as fh:
    ATTN = json.load(fh)
ATTN_BITS = np.load(os.path.join(RUN, "attention.npz"))


def _probes(kind, dtype=None):
    return sorted(cid for cid, c in GEMM["cases"].items()
                  if c["kind"] == kind and (dtype is None or c["dtype"] == dtype))


def _inputs(cid):
    case = GEMM["cases"][cid]
    ins = gpu_check.gemm_inputs(torch, case)
    assert gpu_check._digest(ins) == case["sha256"], f"{cid}: the inputs are not the recorded ones"
    return case, ins


def test_the_recording_is_whole():
    assert GEMM["device"] == "cuda" and len(GEMM["cases"]) == len(GEMM_BITS.files) == 150
    assert not [c for c in GEMM["cases"].values() if "error" in c]
    assert len(ATTN["cases"]) == 28 and not [c for c in ATTN["cases"].values() if "error" in c]
    with open(os.path.join(RUN, "env.json")) as fh:
        env = json.load(fh)
    assert env["gpu"] == "NVIDIA H200" and env["torch"] == "2.11.0+cu130"


#: fast-accumulation probes the H200 split three ways where fpemu's recorded
#: table (cuBLASLt on an H100 PCIe) has no entry, so ``splitk="auto"`` says 1
#: (``source="unrecorded"``): 16x16x8192 and 16x32x8192 with tensor-wise scales
H200_SPLITS = {(16, 8192, 16): 3, (16, 8192, 32): 3}


@pytest.mark.parametrize("cid", _probes("scaled_mm"))
def test_scaled_mm_under_the_cuda_profile_is_the_h200_bit_for_bit(cid):
    """fast and slow accumulation, K 16 to 12288 (the split-K shapes too),
    float32 / bf16 / fp16 / e4m3fn outputs, row-wise scales, a bias: every
    output bit, with the split the table predicts (16x64x8192 and
    64x128x8192: 3, 16x64x12288: 4) or, for two shapes it lacks, the split
    the H200 made. The e4m3fn probes pass ``scale_result=0.5``, which the
    GPU ignores."""
    case, ins = _inputs(cid)
    split = "auto"
    if case["fast"] and case["scales"] == "tensor":
        split = H200_SPLITS.get((case["M"], case["K"], case["N"]), "auto")
    d = fpemu.cublaslt.splitk_decision(case["M"], case["N"], case["K"], case["dtype"],
                                       case["dtype"], case["out"], fast=case["fast"])
    if split != "auto":
        assert (d.splits, d.source) == (1, "unrecorded")
    # "auto" on a shape the table lacks, K over one k-tile: fpemu says it ran unsplit
    warned = split == "auto" and d.source == "unrecorded" and case["K"] > 128
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", fpemu.cublaslt.UnrecordedSplitWarning)
        ours = gpu_check._scaled_mm_fpemu(torch, case, ins, split, False, "2.11.0")
    assert [type(w.message) for w in seen] == [fpemu.cublaslt.UnrecordedSplitWarning] * warned
    rec = GEMM_BITS[cid]
    np.testing.assert_array_equal(np.asarray(ours, np.float32).view(np.uint32), rec)


def test_scale_result_is_ignored_on_the_gpu():
    """The e4m3fn probes are the unscaled product, saturated: with
    ``scale_result=0.5`` applied, most of them would differ."""
    cid = "scaled_mm-float8_e4m3fn-16x16x16-float8_e4m3fn-slow-tensor"
    case, ins = _inputs(cid)
    y32 = gpu_check._scaled_mm_fpemu(torch, dict(case, out="float32"), ins, 1, False, "2.11.0")
    fmt = ft.float8_e4m3fn
    ignored = np.asarray(ft.tensor(np.clip(y32, -448, 448)).to(fmt).float().numpy())
    halved = np.asarray(ft.tensor(np.clip(y32 * 0.5, -448, 448)).to(fmt).float().numpy())
    rec = GEMM_BITS[cid].view(np.float32)
    np.testing.assert_array_equal(ignored.view(np.uint32), rec.view(np.uint32))
    assert (halved != rec).mean() > 0.9


@pytest.mark.parametrize("cid", [c for c in _probes("matmul") if "tf32" not in c])
def test_bf16_fp16_products_are_the_h100_tensor_core_model(cid):
    """``torch.mm(a, b, out_dtype=float32)`` in bf16 and fp16: accumulate's
    ``"h100"`` model (16 products a step, aligned to 25 fraction bits) gives
    every bit for K up to 2048; at K = 4096 cuBLAS split K three ways (the
    same 128-wide k-tiles as cuBLASLt's fp8 split), at K = 8192 six ways."""
    case, ins = _inputs(cid)
    fmt = {"bfloat16": "bf16", "float16": "fp16"}[case["dtype"]]
    A = ins["a"].float().numpy().astype(np.float64)
    B = ins["b"].float().numpy().astype(np.float64)
    split = {4096: 3, 8192: 6}.get(case["K"], 1)
    ours = accumulate.matmul(A, B, fmt, "fp32", "fp32", model="h100", splitk=split)
    np.testing.assert_array_equal(np.asarray(ours, np.float32).view(np.uint32), GEMM_BITS[cid])
    if split > 1:                       # and the split is seen: one chain differs
        one = accumulate.matmul(A, B, fmt, "fp32", "fp32", model="h100")
        assert (np.asarray(one, np.float32).view(np.uint32) != GEMM_BITS[cid]).any()


def test_the_flash_forward_and_gradients_are_the_h200_on_the_smallest_probe():
    """scaled_dot_product_attention (fpemu's model, docs/pytorch-numerics.md
    §11) against the flash backend, bf16, 16 queries and keys, 64 wide:
    the output and all three gradients bit for bit."""
    cid = "flash-bfloat16-L16-E64"
    case = ATTN["cases"][cid]
    ours = gpu_check.fpemu_attention(torch, case, False, "2.11.0")
    for k in ("out", "dq", "dk", "dv"):
        rec = ATTN_BITS[f"{cid}.{k}"]
        mine = np.asarray(ours[k], np.float32).reshape(rec.shape)
        np.testing.assert_array_equal(mine.view(np.uint32), rec, err_msg=k)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_cuda_profile_multiplies_like_the_h200_by_default(dtype):
    """No model chosen: ``torch.mm`` of bf16 / fp16 tensors under
    ``Profile("cuda", gpu="h200")`` is the Hopper tensor-core model with
    cuBLAS's split (gemm16_decision), and gives the H200's accumulator bits
    on all 20 probes of the dtype; its bf16 / fp16 output is that accumulator
    rounded once. The CPU profile keeps fp32 adds in index order, which
    misses some of them."""
    assert ft.ops.linalg.State.matmul.model == "auto"
    missed_by_cpu = 0
    for cid in _probes("matmul", dtype):
        case, ins = _inputs(cid)
        a, b = ft.nn.from_torch(ins["a"]), ft.nn.from_torch(ins["b"])
        rec = GEMM_BITS[cid]
        with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")):
            acc = ft.ops.linalg.mm_acc(a._data, b._data, a.dtype)
            out = ft.mm(a, b)
        np.testing.assert_array_equal(acc.view(np.uint32), rec, err_msg=cid)
        want = ft.tensor(rec.view(np.float32)).to(a.dtype)
        np.testing.assert_array_equal(out.float().numpy().view(np.uint32),
                                      want.float().numpy().view(np.uint32), err_msg=cid)
        with ft.use_profile(ft.Profile("cpu", "2.13.0")):
            cpu = ft.ops.linalg.mm_acc(a._data, b._data, a.dtype)
        missed_by_cpu += bool((cpu.view(np.uint32) != rec).any())
    assert missed_by_cpu >= 5


def test_a_chosen_model_overrides_the_profile_and_auto_returns_to_it():
    case, ins = _inputs("matmul-bfloat16-16x8192x16")
    a, b = ft.nn.from_torch(ins["a"]), ft.nn.from_torch(ins["b"])
    rec = GEMM_BITS["matmul-bfloat16-16x8192x16"]
    with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")):
        with ft.matmul_model("sequential"):
            seq = ft.ops.linalg.mm_acc(a._data, b._data, a.dtype)
        with ft.matmul_model("h100"):       # the model without cuBLAS's six-way split
            unsplit = ft.ops.linalg.mm_acc(a._data, b._data, a.dtype)
        auto = ft.ops.linalg.mm_acc(a._data, b._data, a.dtype)
    np.testing.assert_array_equal(auto.view(np.uint32), rec)
    assert (seq.view(np.uint32) != rec).any() and (unsplit.view(np.uint32) != rec).any()
    assert ft.ops.linalg.State.matmul.model == "auto"


def test_gemm16_splits_are_the_recorded_ones_and_an_unrecorded_long_k_warns():
    assert fpemu.cublaslt.gemm16_decision(16, 16, 4096, "bfloat16").splits == 3
    assert fpemu.cublaslt.gemm16_decision(64, 10, 64, "float16").source == "observed"
    d = fpemu.cublaslt.gemm16_decision(32, 32, 4096, "bfloat16")
    assert (d.splits, d.source) == (1, "unrecorded") and "may split" in d.note
    with pytest.raises(ValueError, match="bfloat16 or float16.*float32"):
        fpemu.cublaslt.gemm16_decision(16, 16, 16, "float32")
    a = ft.ones(32, 4096, dtype=ft.bfloat16)
    with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")):
        with pytest.warns(fpemu.cublaslt.UnrecordedSplitWarning, match="32x4096 @ 4096x32"):
            y = ft.mm(a, a.t())
    assert float(y[0, 0]) == 4096.0


def test_the_profile_names_its_gpu():
    p = ft.Profile("cuda", gpu="a100")
    assert (p.sm_count, p.gpu_spec.tensor_core) == (108, "a100")
    assert ft.Profile("cuda").gpu == "h100"
    with pytest.raises(ValueError, match="gpu must be one of.*'v100'"):
        ft.Profile("cuda", gpu="v100")
    from fpemu.reference.parity import UnknownGpuWarning, gpu_of
    assert [gpu_of(n) for n in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
                                "NVIDIA A100-SXM4-80GB", "NVIDIA A800 80GB PCIe", "cpu x86_64")
            ] == ["h200", "h100", "h100-pcie", "a100", "a100", "h100"]
    assert ft.Profile("cuda", gpu="h100-pcie").sm_count == 114
    with pytest.warns(UnknownGpuWarning, match="RTX 4090.*replayed under h100"):
        assert gpu_of("NVIDIA GeForce RTX 4090") == "h100"


def test_tf32_under_the_cuda_profile_is_the_h200_bit_for_bit(monkeypatch):
    """``allow_tf32 = True`` and no model chosen: float32 ``torch.mm`` under
    ``Profile("cuda", gpu="h200")`` rounds to tf32 and runs the Hopper TF32
    model with cuBLAS's recorded split (cublaslt.tf32_decision): all 20 TF32
    probes. Before, the profile added the tf32 products in index order."""
    monkeypatch.setattr(ft.backends.cuda.matmul, "allow_tf32", True)
    probes = _probes("matmul", "tf32")
    assert len(probes) == 20
    for cid in probes:
        case, ins = _inputs(cid)
        a, b = ft.nn.from_torch(ins["a"]), ft.nn.from_torch(ins["b"])
        with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")):
            out = ft.mm(a, b)
        np.testing.assert_array_equal(out.numpy().view(np.uint32), GEMM_BITS[cid], err_msg=cid)
    monkeypatch.setattr(ft.backends.cuda.matmul, "allow_tf32", False)
    with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")):
        plain = ft.mm(a, b)                 # TF32 off: float32 adds in index order
    assert (plain.numpy().view(np.uint32) != GEMM_BITS[cid]).any()


def test_tf32_splits_the_recorded_way_and_follows_the_rule_below_512():
    d = fpemu.cublaslt.tf32_decision(64, 10, 64)
    assert (d.splits, d.source) == (1, "table")
    assert fpemu.cublaslt.tf32_decision(16, 16, 8192).splitk == accumulate.SplitK(52, 32)
    d = fpemu.cublaslt.tf32_decision(100, 100, 384)
    assert (d.splits, d.tile, d.source) == (12, 32, "rule")
    d = fpemu.cublaslt.tf32_decision(100, 100, 1000)
    assert (d.splits, d.source) == (1, "unrecorded")
    assert fpemu.cublaslt.tf32_decision(32, 32, 16).source == "unrecorded"   # 16x16x16 split
    assert fpemu.cublaslt.tf32_decision(32, 32, 32).source == "rule"
    assert fpemu.cublaslt.tf32_decision(1, 1, 1).splits == 1
    a = ft.ones(8, 1000)
    with ft.use_profile(ft.Profile("cuda", "2.11.0")), _tf32_on():
        with pytest.warns(fpemu.cublaslt.UnrecordedSplitWarning, match="TF32 product"):
            y = ft.mm(a, a.t())
    assert float(y[0, 0]) == 1000.0


class _tf32_on:
    def __enter__(self):
        self.old = ft.backends.cuda.matmul.allow_tf32
        ft.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc):
        ft.backends.cuda.matmul.allow_tf32 = self.old


def test_batched_products_are_the_per_matrix_products_bit_for_bit():
    """The CUDA profile's batched bf16 products (many small matrices in one
    row-by-row kernel call, larger ones one call each) give the bits of each
    matrix's own product under the same model, broadcast batch dims, inf,
    NaN and -0 included; a batched product is not split (cuBLAS's recorded
    splits are of single GEMMs)."""
    rng = np.random.default_rng(7)
    from fpemu import quantize
    from fpemu.autograd.ops import linalg as L
    for (ba, bb, M, K, N) in (((3, 1), (1, 4), 8, 16, 8), ((2,), (2,), 48, 40, 40),
                              ((5,), (5,), 16, 4096, 16)):
        A = quantize(rng.standard_normal(ba + (M, K)).astype(np.float32), "bf16")
        B = quantize(rng.standard_normal(bb + (K, N)).astype(np.float32), "bf16")
        A[..., 0, 1], A[..., 1, :] = np.inf, -0.0
        B[..., 2, 3] = np.nan
        with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")), warnings.catch_warnings():
            warnings.simplefilter("error")      # no split warning: batched GEMMs run unsplit
            got = L.mm_acc(A, B, ft.bfloat16)
        batch = np.broadcast_shapes(ba, bb)
        plan = accumulate.Plan.of("bf16", "fp32", "fp32", model="h100")
        for idx in np.ndindex(*batch):
            want = plan.matmul(np.broadcast_to(A, batch + (M, K))[idx],
                               np.broadcast_to(B, batch + (K, N))[idx]).astype(np.float32)
            np.testing.assert_array_equal(got[idx].view(np.uint32), want.view(np.uint32))


def test_other_16_bit_formats_and_gpus_without_recorded_splits():
    """A custom 16-bit format multiplies in fp32 in index order (no tensor-core
    model claims it); on an A100 profile the Ampere model runs unsplit and a
    long K says that its split is not recorded."""
    from fpemu.formats import Format
    e6m9 = Format.custom(6, 9)
    from fpemu.autograd.ops import linalg as L
    a = np.ones((4, 64), np.float32)
    with ft.use_profile(ft.Profile("cuda")):
        assert L.effective_model(e6m9, False, 4, 4, 64)[0] == "sequential"
        np.testing.assert_array_equal(L.mm_acc(a, a.T, e6m9), np.full((4, 4), 64, np.float32))
    with ft.use_profile(ft.Profile("cuda", gpu="a100")):
        assert L.effective_model(ft.bfloat16, False, 16, 16, 512) == ("a100", 128, "sequential", 1)
        x = ft.ones(16, 8192, dtype=ft.bfloat16)
        with pytest.warns(fpemu.cublaslt.UnrecordedSplitWarning, match="on a100 is not recorded"):
            ft.mm(x, x.t())
