"""fpemu.testing on the bits of real GPU conversions, recorded on an H100.

``python bench/cuda_casts.py`` ran torch's CUDA casts, CUDA's own conversion
functions (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h, cuda_fp6.h, cuda_fp4.h) and
Triton's casts on an NVIDIA H100 (torch 2.11.0+cu130, CUDA 13.0, Triton
3.6.0), on every edge input of each format and on all 2**32 float32 inputs.
The codes they gave for ``edge_inputs(fmt, per_kind=1024)`` (and the
negatives, for the unsigned e8m0) are in tests/data/cuda_casts_h100_cuda13.0.npz,
the counts of every check in the .json beside it. CI has no GPU: these tests
hold fpemu's rounding and fpemu.testing's diagnosis to those recorded bits.

The oracle here is the hardware and the libraries: the codes come from the
GPU, not from fpemu.
"""

import json
import os

import numpy as np
import pytest

from fpemu.testing import assert_quantized_equal, compare

HERE = os.path.join(os.path.dirname(__file__), "data")
DATA = np.load(os.path.join(HERE, "cuda_casts_h100_cuda13.0.npz"))
with open(os.path.join(HERE, "cuda_casts_h100_cuda13.0.json")) as fh:
    SUMMARY = json.load(fh)
NAMES = sorted(k[2:] for k in DATA.files if k.startswith("y/"))

#: conversions whose claim (bench/cuda_casts.py's KERNELS) the GPU refuted, and what they do
REFUTED = {"torch float8_e8m0fnu", "triton float8e5 rtne",
           "__nv_cvt_float_to_e8m0 SATFINITE RoundZero",
           "__nv_cvt_float_to_e8m0 SATFINITE RoundPosInf",
           "__nv_cvt_float_to_e8m0 NOSAT RoundPosInf"}


def _recorded(name):
    k = SUMMARY["kernels"][name]
    return DATA[f"x/{k['fmt']}"].view(np.float32), DATA[f"y/{name}"], k


def test_the_recording_is_whole():
    meta = SUMMARY["meta"]
    assert meta["device_name"] == "NVIDIA H100 80GB HBM3" and meta["torch"] == "2.11.0+cu130"
    assert len(NAMES) == 34      # 7 torch, 20 CUDA, 7 Triton (its e4m3 rtz did not compile)
    assert "PassManager::run failed" in SUMMARY["kernels"]["triton float8e4nv rtz"]["error"]
    for name in NAMES:
        x, y, k = _recorded(name)
        assert y.shape == x.shape and y.dtype == (np.uint16 if k["fmt"] in ("bf16", "fp16")
                                                  else np.uint8)
        held = k["edges"]["mismatches"] == 0
        assert held == (name not in REFUTED), name
        # on the GPU: all 2**32 float32 inputs against the claim (or the setting found)
        full = [s for s in k["device_sweeps"] if s["compared"] + s["skipped_nan"] == 1 << 32]
        assert full, name
        if held:
            assert full[0]["mismatches"] == 0


@pytest.mark.parametrize("name", [n for n in NAMES if n not in REFUTED])
def test_a_conversion_the_gpu_does_as_claimed_passes(name):
    """Each claim that held on the GPU (nearest even, toward zero, toward
    +-inf; saturating or not; fp8, fp6, fp4, bf16, fp16) holds here, code
    for code, on the recorded edge inputs."""
    x, y, k = _recorded(name)
    assert x.size >= 80
    assert_quantized_equal(y, x, k["fmt"], **k["claim"])


@pytest.mark.parametrize("name,claim,rule", [
    ("triton bfloat16 rtz", {}, "round toward zero (truncation)"),
    ("__float2half_rd", {}, "round toward -inf"),
    ("__float2bfloat16_ru", {}, "round toward +inf"),
    ("torch float8_e4m3fn", {}, "no saturation: overflow to NaN"),
    ("__nv_cvt_float_to_fp8 E5M2 SATFINITE", {}, "saturation where the format has inf"),
    ("__nv_cvt_float_to_fp8 E4M3 NOSAT", {}, "no saturation: overflow to NaN"),
    ("__nv_cvt_float_to_fp4 E2M1 RoundZero", {}, "round toward zero (truncation)"),
])
def test_asked_for_another_rounding_the_assertion_names_what_the_gpu_did(name, claim, rule):
    """Real GPU bits as the 'wrong' conversions: asked for fpemu's default
    rounding, the assertion fails and names the rule the kernel follows, for
    every mismatch."""
    x, y, k = _recorded(name)
    r = compare(y, x, k["fmt"], **claim)
    assert r.mismatches > 0
    assert r.by_rule[rule] == r.mismatches, r.message()


def test_torch_2_11_e4m3fn_cast_on_cuda_gives_nan_past_448():
    x, y, _ = _recorded("torch float8_e4m3fn")
    big = np.isfinite(x) & (np.abs(x) > 464)        # 464: the midpoint above 448 (to 448)
    assert big.sum() >= 8
    assert np.isin(y[big], (0x7F, 0xFF)).all()      # e4m3fn's NaN codes
    assert y[np.abs(x) == 464].tolist() == [0x7E, 0xFE]    # the tie: to even, +-448


def test_triton_e5m2_saturates_and_inf_too():
    """Triton 3.6's fp32 -> fp8e5 ("rtne") on Hopper saturates: overflow and
    inf become +-57344 (torch's and CUDA's NOSAT cast give inf)."""
    x, y, k = _recorded("triton float8e5 rtne")
    with pytest.raises(AssertionError) as info:
        assert_quantized_equal(y, x, "e5m2")
    assert "saturation where the format has inf" in str(info.value)
    assert_quantized_equal(y, x, "e5m2", overflow="saturate")
    assert y[x == np.inf].tolist() == [0x7B] and y[x == -np.inf].tolist() == [0xFB]
    assert k["edges"]["passing_configs"] == [{"overflow": "saturate", "rounding": "rne",
                                             "subnormals": True}]


@pytest.mark.parametrize("name,rounding,overflow", [
    ("__nv_cvt_float_to_e8m0 SATFINITE RoundZero", "rtz", "saturate"),
    ("__nv_cvt_float_to_e8m0 SATFINITE RoundPosInf", "rup", "saturate"),
    ("__nv_cvt_float_to_e8m0 NOSAT RoundPosInf", "rup", "nan"),
])
def test_cuda_e8m0_rounds_the_magnitude(name, rounding, overflow):
    """CUDA's __nv_cvt_float_to_e8m0 is fpemu's e8m0 rounding of |x|: the
    non-negative inputs pass as claimed, every negative one is named "the
    sign dropped"."""
    x, y, _ = _recorded(name)
    pos = ~np.signbit(x)
    assert_quantized_equal(y[pos], x[pos], "e8m0", rounding=rounding, overflow=overflow)
    r = compare(y, x, "e8m0", rounding=rounding, overflow=overflow)
    # fpemu's e8m0 has NaN for every negative input: each one the GPU gave a number for differs
    assert r.mismatches == int((np.signbit(x) & (y != 0xFF)).sum()) > 1000
    label = "the sign dropped: a negative input rounded as its magnitude (same rounding)"
    assert r.by_rule[label] == r.mismatches, r.message()


def test_torch_e8m0fnu_rounds_to_nearest_but_not_float32_subnormals():
    """torch 2.11's float32 -> float8_e8m0fnu on CUDA: round to nearest on
    the magnitude (the sign dropped), except the float32 subnormals between
    2**-127 and the midpoint 1.5 * 2**-127, which go up to 2**-126."""
    x, y, _ = _recorded("torch float8_e8m0fnu")
    pos = ~np.signbit(x)
    r = compare(y[pos], x[pos], "e8m0", rounding="rne")
    assert r.mismatches == 1, r.message()
    ex = r.examples[0]
    assert np.float32(ex.x).view(np.uint32) == 0x005FFFFF and float(ex.actual) == 2.0**-126
    assert float(np.float32(ex.x)) < 1.5 * 2.0**-127 < 2.0**-126
    r = compare(y, x, "e8m0", rounding="rne")
    label = "the sign dropped: a negative input rounded as its magnitude (same rounding)"
    # all negatives but -0x005FFFFF (which goes up as its magnitude does), and the positive one
    assert r.by_rule[label] == r.mismatches - 2 > 1000, r.message()
    assert y[np.abs(x) == np.uint32(0x005FFFFF).view(np.float32)].tolist() == [0x01, 0x01]
    assert SUMMARY["kernels"]["torch float8_e8m0fnu"]["device_sweeps"][0]["mismatches"] \
        == 2136997888
