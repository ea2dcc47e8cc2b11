"""next_up, next_down, ulp and classify against independent references."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu
from oracle import SPECS, TableOracle


def test_next_up_down_fp16_match_numpy_nextafter():
    codes = np.arange(65536, dtype=np.uint16)
    x = codes.view(np.float16)
    x = x[np.isfinite(x)]
    with np.errstate(over="ignore"):
        up = np.nextafter(x, np.float16(np.inf)).astype(np.float32)
        down = np.nextafter(x, np.float16(-np.inf)).astype(np.float32)
    assert np.array_equal(fpemu.next_up(x, "fp16").view(np.uint32), up.view(np.uint32))
    assert np.array_equal(fpemu.next_down(x, "fp16").view(np.uint32), down.view(np.uint32))


def test_next_up_fp32_is_nextafter():
    x = np.array([0.0, -0.0, 1.0, -1.0, 3.4028235e38, -np.inf, 1e-45], np.float32)
    with np.errstate(over="ignore"):
        want = np.nextafter(x, np.float32(np.inf))
    assert np.array_equal(fpemu.next_up(x, "fp32").view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", ["bf16", "e4m3fn", "e5m2fnuz", "e2m1", "e8m0"])
def test_next_up_down_off_grid_and_at_ends(name):
    o = TableOracle(SPECS[name])
    vals = o.all_values()
    rng = np.random.default_rng(0)
    x = rng.uniform(vals[0] * 1.1, vals[-1] * 1.1, 5000)
    up = fpemu.next_up(x, name).astype(np.float64)
    down = fpemu.next_down(x, name).astype(np.float64)
    ext = np.concatenate([[-np.inf], vals, [np.inf]])
    want_up = ext[np.searchsorted(ext, x, side="right")]
    want_down = ext[np.searchsorted(ext, x, side="left") - 1]
    assert np.array_equal(up, want_up) and np.array_equal(down, want_down)
    fmt = fpemu.format(name)
    assert float(fpemu.next_up(fmt.max, name)) == np.inf
    assert float(fpemu.next_up(np.nan, name)) != float(fpemu.next_up(np.nan, name))  # NaN


def test_next_up_of_negative_smallest_is_negative_zero():
    r = fpemu.next_up(-2.0**-24, "fp16")
    assert float(r) == 0 and np.signbit(r)
    r = fpemu.next_up(-2.0**-10, "e4m3fnuz")
    assert float(r) == 0 and not np.signbit(r)


def test_ulp_matches_numpy_spacing_for_fp16():
    x = np.arange(65536, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x) & (x >= 0) & (x < 65504)]
    want = np.spacing(x).astype(np.float32)
    assert np.array_equal(fpemu.ulp(x, "fp16"), want)
    assert float(fpemu.ulp(np.inf, "bf16")) == np.inf
    assert float(fpemu.ulp(0.0, "e4m3fn")) == 2.0**-9
    assert float(fpemu.ulp(100.0, "e8m0")) == 64.0


def test_classify():
    x = [0.0, -0.0, 1e-6, 1.0, 7e4, -np.inf, np.nan]
    assert fpemu.classify(x, "fp16").tolist() == [
        "zero", "zero", "subnormal", "normal", "inf", "inf", "nan"]
    assert fpemu.classify(x, "e4m3fn").tolist() == [
        "zero", "zero", "zero", "normal", "normal", "normal", "nan"]
    assert fpemu.classify([1e-6], "fp16", subnormals=False).tolist() == ["zero"]
    assert fpemu.classify([500.0], "e4m3fn", overflow="nan").tolist() == ["nan"]
    assert fpemu.classify([1.0, 2.0**-127, 0.0], "e8m0").tolist() == ["normal", "normal", "nan"]
    assert fpemu.classify(np.zeros((2, 3)), "bf16").shape == (2, 3)
