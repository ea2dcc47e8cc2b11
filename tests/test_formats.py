"""Format facts against published numbers (papers.md, OCP OFP8 / MX, IEEE 754)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fpemu
from oracle import SPECS

# name: (bits, max, min_normal, min_subnormal, eps)
PUBLISHED = {
    "fp32": (32, float(np.finfo(np.float32).max), 2.0**-126, 2.0**-149, 2.0**-23),
    "tf32": (19, (2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136, 2.0**-10),
    "fp16": (16, 65504.0, 2.0**-14, 2.0**-24, 2.0**-10),
    "bf16": (16, 3.3895313892515355e38, 2.0**-126, 2.0**-133, 2.0**-7),
    "e4m3fn": (8, 448.0, 2.0**-6, 2.0**-9, 0.125),
    "e5m2": (8, 57344.0, 2.0**-14, 2.0**-16, 0.25),
    "e4m3fnuz": (8, 240.0, 2.0**-7, 2.0**-10, 0.125),
    "e5m2fnuz": (8, 57344.0, 2.0**-15, 2.0**-17, 0.25),
    "e4m3": (8, 240.0, 2.0**-6, 2.0**-9, 0.125),
    "e3m4": (8, 15.5, 0.25, 2.0**-6, 2.0**-4),
    "e2m3": (6, 7.5, 1.0, 0.125, 0.125),
    "e3m2": (6, 28.0, 0.25, 0.0625, 0.25),
    "e2m1": (4, 6.0, 1.0, 0.5, 0.5),
    "e8m0": (8, 2.0**127, 2.0**-127, 2.0**-127, 1.0),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_constants(name):
    f = fpemu.format(name)
    bits, mx, mn, sub, eps = PUBLISHED[name]
    assert (f.bits, f.max, f.min_normal, f.min_subnormal, f.eps) == (bits, mx, mn, sub, eps)
    s = SPECS[name]
    assert (f.exponent_bits, f.mantissa_bits, f.bias) == (s.E, s.M, s.bias)
    assert f.precision == s.M + 1
    assert 2.0**f.emin == mn and f.max < 2.0 ** (f.emax + 1) <= 2 * f.max
    assert f.default_overflow == s.default_overflow


@pytest.mark.parametrize("name,dtype", [
    ("bf16", ml_dtypes.bfloat16), ("e4m3fn", ml_dtypes.float8_e4m3fn),
    ("e5m2", ml_dtypes.float8_e5m2), ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
    ("e5m2fnuz", ml_dtypes.float8_e5m2fnuz), ("e4m3", ml_dtypes.float8_e4m3),
    ("e3m4", ml_dtypes.float8_e3m4), ("e2m3", ml_dtypes.float6_e2m3fn),
    ("e3m2", ml_dtypes.float6_e3m2fn), ("e2m1", ml_dtypes.float4_e2m1fn),
    ("fp16", np.float16),
])
def test_agrees_with_ml_dtypes_finfo(name, dtype):
    f, fi = fpemu.format(name), ml_dtypes.finfo(dtype)
    assert f.max == float(fi.max)
    assert f.min_normal == float(fi.tiny)
    assert f.min_subnormal == float(fi.smallest_subnormal)
    assert f.eps == float(fi.eps)


def test_lookup_by_every_alias():
    assert fpemu.format("float8_e4m3fn") is fpemu.e4m3fn
    assert fpemu.format("bfloat16") is fpemu.bf16
    for alias in ("half", "float16", "FP16", " fp16 "):
        assert fpemu.format(alias) is fpemu.fp16
    for alias in ("float", "float32", "fp32"):
        assert fpemu.format(alias) is fpemu.fp32
    assert fpemu.format("float6_e2m3fn") is fpemu.e2m3
    assert fpemu.format("float4_e2m1fn") is fpemu.e2m1
    assert fpemu.format("float8_e8m0fnu") is fpemu.e8m0
    assert fpemu.format(fpemu.tf32) is fpemu.tf32
    assert set(fpemu.FORMATS) == {fpemu.format(n) for n in fpemu.format_names()}


def test_every_named_format_is_a_package_attribute_under_its_name():
    """fpemu exports each format of FORMATS as ``fpemu.<name>``: a format's
    variable in fpemu/formats.py must carry the format's own name."""
    for f in fpemu.FORMATS:
        assert getattr(fpemu.formats, f.name, None) is f, (
            f"fpemu/formats.py: name the variable of Format({f.name!r}, ...) {f.name}")
        assert getattr(fpemu, f.name) is f and f.name in fpemu.__all__
    assert {"Format", "FORMATS", "format", "format_names", "quantize"} <= set(fpemu.__all__)


def test_layout_facts():
    assert fpemu.e4m3fn.nan_code == 0x7F and fpemu.e4m3fn.inf_code is None
    assert fpemu.fp16.nan_code == 0x7E00 and fpemu.fp16.inf_code == 0x7C00
    assert fpemu.bf16.nan_code == 0x7FC0 and fpemu.tf32.nan_code == 0x7FC00000 >> 13
    assert fpemu.e5m2.nan_code == 0x7F  # PyTorch's cast
    assert fpemu.e4m3fnuz.nan_code == 0x80 and not fpemu.e4m3fnuz.has_negative_zero
    assert fpemu.e2m1.nan_code is None and not fpemu.e2m1.has_nan
    assert not fpemu.e8m0.has_zero and not fpemu.e8m0.signed and fpemu.e8m0.nan_code == 0xFF
    assert fpemu.fp32.code_dtype == np.uint32 and fpemu.tf32.code_dtype == np.uint32
    assert fpemu.fp16.code_dtype == np.uint16 and fpemu.e2m1.code_dtype == np.uint8


def test_custom_formats():
    b11 = fpemu.Format.custom(4, 3, bias=11, nan_encoding="fnuz")
    assert b11.name == "e4m3fnuz_b11" and b11.max == float(ml_dtypes.finfo(
        ml_dtypes.float8_e4m3b11fnuz).max) == 30.0
    assert b11.default_overflow == "nan"
    codes = np.arange(256, dtype=np.uint8)
    ref = codes.view(ml_dtypes.float8_e4m3b11fnuz).astype(np.float32)
    got = fpemu.decode(codes, b11)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.array_equal(got[ok].view(np.uint32), ref[ok].view(np.uint32))
    e3m3 = fpemu.Format.custom(3, 3)
    assert e3m3.max == 15.0 and e3m3.has_inf and e3m3.bits == 7
    assert fpemu.Format.custom(5, 2) == fpemu.Format("e5m2", 5, 2)  # same fields, same format
    # a format whose binades reach below float32's normal range
    low = fpemu.Format.custom(8, 3, bias=130)
    assert low.min_subnormal == 2.0**-132
    # 1.3 * 2**-129 is a float32 subnormal but a normal number of `low`
    assert float(fpemu.quantize(np.float32(2.0**-129 * 1.3), low)) == 2.0**-129 * 1.25
    assert float(fpemu.quantize(np.float32(2.0**-131 * 1.3), low)) == 2.0**-131 * 1.5
