"""fpemu's "h100-tf32" model against the TF32 GEMM bits an H200 wrote.

``make gpu-check`` (bench/gpu_check.py) recorded 20 float32 ``torch.matmul``
probes with ``torch.backends.cuda.matmul.allow_tf32 = True`` on an NVIDIA
H200 (torch 2.11.0+cu130), in ``bench/gpu_check/nvidia-h200-torch2.11.0``:
the output bit codes, and the inputs' seed and sha256 (checked here). The
oracle is what the GPU wrote. ``bench/fit_tf32.py`` fitted the model: the
operands rounded to tf32 to nearest even, the tensor-core algorithm with 8
products a step and F = 25 (``TENSOR_CORES["h100-tf32"]``), and cuBLAS's
split of K into contiguous runs of 32-wide k-tiles, each run from +0, the
runs' sums added in fp32 in order (``SplitK(S, tile=32)``; the 16x16x16
probe ran as four runs of 4). Every output bit of all 20 probes.

The 14 split probes are missed by the models fpemu had before: the same
tensor-core steps over all of K in one chain (the candidate of
``bench/gpu_check.py``'s grid that fits the 6 unsplit probes), and the
CUDA profile's TF32 path (tf32 inputs, fp32 adds in index order).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402

from fpemu import accumulate, quantize  # noqa: E402
from fpemu.accumulate import SplitK, TensorCore  # noqa: E402

torch = pytest.importorskip("torch")

RUN = os.path.join(ROOT, "bench", "gpu_check", "nvidia-h200-torch2.11.0")
with open(os.path.join(RUN, "gemm.json")) as fh:
    GEMM = json.load(fh)
GEMM_BITS = np.load(os.path.join(RUN, "gemm.npz"))

#: probe -> (splits, k-tile width) of the split the H200's cuBLAS made (M x K x N)
SPLITS = {
    "matmul-tf32-16x16x16": (4, 4),
    "matmul-tf32-8x32x8": (1, 32),
    "matmul-tf32-16x32x16": (1, 32),
    "matmul-tf32-64x32x64": (1, 32),
    "matmul-tf32-128x32x32": (1, 32),
    "matmul-tf32-128x32x64": (1, 32),
    "matmul-tf32-64x64x10": (1, 32),
    "matmul-tf32-10x64x64": (2, 32),
    "matmul-tf32-16x64x16": (2, 32),
    "matmul-tf32-64x64x32": (2, 32),
    "matmul-tf32-128x64x32": (2, 32),
    "matmul-tf32-16x128x16": (4, 32),
    "matmul-tf32-32x128x32": (4, 32),
    "matmul-tf32-64x128x32": (4, 32),
    "matmul-tf32-16x256x16": (8, 32),
    "matmul-tf32-16x512x16": (16, 32),
    "matmul-tf32-16x1024x16": (16, 32),     # 2 k-tiles a split
    "matmul-tf32-16x2048x16": (22, 32),     # 3 k-tiles a split, the last split 1
    "matmul-tf32-16x4096x16": (22, 32),     # 6, the last 2
    "matmul-tf32-16x8192x16": (52, 32),     # 5, the last 1
}
SPLIT_PROBES = sorted(cid for cid, (S, _) in SPLITS.items() if S > 1)
#: the probes whose inputs hold a tf32 tie that ties-away rounding breaks
TIE_PROBES = ("matmul-tf32-128x32x32", "matmul-tf32-16x64x16", "matmul-tf32-16x128x16",
              "matmul-tf32-32x128x32", "matmul-tf32-64x128x32", "matmul-tf32-16x512x16",
              "matmul-tf32-16x1024x16", "matmul-tf32-16x2048x16", "matmul-tf32-16x4096x16",
              "matmul-tf32-16x8192x16")


def _operands(cid):
    case = GEMM["cases"][cid]
    ins = gpu_check.gemm_inputs(torch, case)
    assert gpu_check._digest(ins) == case["sha256"], f"{cid}: the inputs are not the recorded ones"
    return ins["a"].numpy().astype(np.float64), ins["b"].numpy().astype(np.float64)


def _misses(y, cid):
    """Outputs whose float32 bit code differs from the H200's."""
    return int((np.asarray(y, np.float32).view(np.uint32) != GEMM_BITS[cid]).sum())


def _h100_tf32(A, B, split, rounding="rne"):
    return accumulate.matmul(quantize(A, "tf32", rounding=rounding),
                             quantize(B, "tf32", rounding=rounding), "tf32", "fp32",
                             model="h100-tf32", splitk=split)


def test_every_tf32_probe_is_here():
    tf32 = {cid for cid, c in GEMM["cases"].items() if c["dtype"] == "tf32"}
    assert tf32 == set(SPLITS) and len(tf32) == 20
    assert all(GEMM["cases"][cid]["out"] == "float32" for cid in tf32)
    core = accumulate.TENSOR_CORES["h100-tf32"]
    assert (core.terms, core.fraction_bits, core.out_fraction_bits) == (8, 25, 23)
    assert "h100-tf32" in accumulate.MODELS


@pytest.mark.parametrize("cid", sorted(SPLITS))
def test_h100_tf32_with_the_split_is_the_h200_bit_for_bit(cid):
    A, B = _operands(cid)
    S, tile = SPLITS[cid]
    y = _h100_tf32(A, B, SplitK(S, tile))
    assert y.shape == GEMM_BITS[cid].shape
    assert _misses(y, cid) == 0


@pytest.mark.parametrize("cid", SPLIT_PROBES)
def test_the_models_before_miss_the_split_probes(cid):
    """The unsplit chain (gpu_check's grid candidate ``tc8f25 tf32-rne``,
    built here by hand) and the CUDA profile's TF32 path of today
    (tf32 inputs, fp32 adds in index order) both miss outputs."""
    A, B = _operands(cid)
    qa, qb = quantize(A, "tf32"), quantize(B, "tf32")
    one_chain = accumulate.matmul(qa, qb, "tf32", "fp32", model=TensorCore("tc8f25", 8, 25))
    in_order = accumulate.matmul(qa, qb, "tf32", "fp32", model="sequential")
    assert _misses(one_chain, cid) > 0
    assert _misses(in_order, cid) > 0


@pytest.mark.parametrize("cid", SPLIT_PROBES)
def test_a_run_one_k_tile_longer_or_shorter_misses(cid):
    """The split is pinned: runs of one k-tile more (and, where the runs
    hold more than one, one fewer) miss outputs (16x16x16: runs of 8, not 4)."""
    A, B = _operands(cid)
    K = A.shape[1]
    S, tile = SPLITS[cid]
    fitted = SplitK(S, tile).parts(K)
    q = (fitted[0][1] - fitted[0][0]) // tile
    for width in {q + 1, q - 1} - {0}:
        other = SplitK(-(-(-(-K // tile)) // width), tile)
        assert other.parts(K) != fitted
        assert _misses(_h100_tf32(A, B, other), cid) > 0, (cid, other)


@pytest.mark.parametrize("cid", TIE_PROBES)
def test_inputs_rounded_ties_away_or_truncated_miss(cid):
    """cuBLAS rounds the float32 operands to tf32 to nearest even: ties away
    from zero (CUTLASS's round_half_ulp_truncate, ``cvt.rna.tf32.f32``) miss
    the probes whose inputs hold a tie, and truncation (a tensor core reading
    only the top 19 bits) misses too."""
    A, B = _operands(cid)
    S, tile = SPLITS[cid]
    assert _misses(_h100_tf32(A, B, SplitK(S, tile), "rna"), cid) > 0
    assert _misses(_h100_tf32(A, B, SplitK(S, tile), "rtz"), cid) > 0
