"""fpemu.block.driver: the steps written once for the host and the device.

The host-versus-device tests (tests/test_torch_blocks.py) hold the driver
to one answer on both namespaces; these hold its two choices that the
caller does not see: the in-place block layout gives the codes of the block
layout, and "srN" computed in float32 gives the float64 computation's bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from fpemu.block import driver, host
from fpemu.block.rules import Job, array_namespace
from fpemu.formats import e2m1, e4m3fn, e5m2

NP = array_namespace("numpy")


def _x(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))
    x = x.astype(np.float32)
    x.flat[:4] = [0.0, -0.0, 1e-40, -3e-39][:x.size]     # zeros and float32 subnormals
    return x


@pytest.mark.parametrize("preset,block,axis", [
    ("mxfp8", 32, 0), ("mxfp4", 32, 0), ("nvfp4", (16, 16), -1), ("fp8-block", (128, 128), -1),
    ("nvfp4", 16, 0), ("mxfp8", (32, 32), -1),
])
@pytest.mark.parametrize("shape", [(70, 45), (3, 33, 20)])
def test_in_place_layout_gives_the_block_layouts_codes(preset, block, axis, shape):
    x = _x(shape)
    cfg = driver.configure(preset, None, block, None, "rne", None, None, None, "saturate")
    ax = axis % len(shape) if isinstance(block, int) else len(shape) - 1
    flat = driver.run(x, cfg, ax, NP, host.OPS, allow_in_place=False)
    view = driver.run(x, cfg, ax, NP, host.OPS, allow_in_place=True)
    for a, b in zip(flat[:3], view[:3]):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert flat.tensor_scale == view.tensor_scale or (
        np.isnan(flat.tensor_scale) and np.isnan(view.tensor_scale))


@pytest.mark.parametrize("elem", [e2m1, e4m3fn, e5m2])
@pytest.mark.parametrize("n", [1, 4, 8, 13, 23])
def test_srn_float32_equals_float64(elem, n):
    rng = np.random.default_rng(n)
    big = float(elem.max)
    v = np.concatenate([
        (rng.uniform(-big, big, 4000)).astype(np.float32),
        (rng.standard_normal(4000) * 2.0**rng.integers(-30, 2, 4000)).astype(np.float32),
        np.array([0.0, -0.0, big, -big, np.float32(np.nextafter(np.float32(big), 0)),
                  1e-45, -1e-45], np.float32),
    ])
    draws = rng.integers(0, 2**n, v.size).astype(np.uint64)
    r32 = driver.round_srn(v, elem, n, draws, NP)
    r64 = driver.round_srn(v.astype(np.float64), elem, n, draws, NP)
    assert r32.dtype == np.float32 and r64.dtype == np.float64
    assert np.array_equal(r32.astype(np.float64).view(np.int64), r64.view(np.int64))


def test_srn_by_hand():
    """e2m1 (values 0, 0.5, 1, 1.5, 2, 3, 4, 6): 1.25 lies a half step above
    1 (step 0.5), so with 2 random bits r = 2 and the draw rounds up from
    R = 2 on; 5.0 is halfway from 4 to 6."""
    v = np.array([1.25] * 4 + [-5.0] * 4, np.float32)
    draws = np.array([0, 1, 2, 3] * 2, np.uint64)
    got = driver.round_srn(v, e2m1, 2, draws, NP)
    assert got.tolist() == [1.0, 1.0, 1.5, 1.5, -4.0, -4.0, -6.0, -6.0]


def test_to_blocks_round_trip_and_padding():
    x = _x((5, 7, 9))
    for block_, axis in [(4, 0), (4, 1), (4, 2), ((2, 4), 2)]:
        for in_place in (False, True):
            Bk, back, sshape, sback, ex = driver.to_blocks(x, block_, axis, NP, in_place)
            assert np.array_equal(back(Bk).view(np.uint32), x.view(np.uint32))
            amax = NP.block_amax(Bk, driver.amax_dims(block_, axis, in_place))
            assert amax.shape == sshape
            assert ex(amax).ndim == Bk.ndim
    Bk = driver.to_blocks(x, 4, 2, NP)[0]
    assert Bk.shape == (5, 7, 3, 4) and not Bk[..., 2, 1:].any()    # zero padded


def test_round_elements_saturates_and_rounds_nan_as_zero():
    """The element step: codes saturate at the format's largest, and with
    ``has_nan`` (a NaN-scaled block, whose codes the driver replaces) a NaN
    rounds as 0; without it a NaN keeps the format's NaN."""
    V = np.array([[1.0, 7.0, -1e9, np.nan]], np.float32)
    job = Job(V, None, e4m3fn, None, "floor", "rne", None, None, "saturate", driver._ex_last,
              NP, host.OPS)
    codes = driver.round_elements(V, job, has_nan=True)
    assert codes.tolist() == [[0x38, 0x4E, 0xFE, 0x00]]
    assert driver.round_elements(V, job, has_nan=False).tolist() == [[0x38, 0x4E, 0xFE, 0x7F]]
    assert type(host.OPS).round_elements is driver.Ops.round_elements   # the rules' job.ops


@pytest.mark.parametrize("preset", ["nvfp4-4over6", "mxfp8", "nvfp4"])
def test_values_of_every_rule_on_the_host_chunked_or_not(preset):
    """``run(..., values=True)`` on the host: each element's value times its
    block's scale value, float32, equal to the codes and scales decoded and
    multiplied here, for a rule the host runs in chunks of
    ``chunk_elements`` (4over6: three chunks here) and for rules it runs
    whole. The chunked run once gave its scale codes in a flat layout, and
    the values step failed to broadcast them against the blocks."""
    from fpemu import decode
    x = _x((3, 512, 400), 3)                          # 614400 elements: 3 chunks of 2**18
    cfg = driver.configure(preset, None, None, None, "rne", None, None, None, "saturate")
    r = driver.run(x, cfg, 2, NP, host.OPS, allow_in_place=True, values=True)
    blen = cfg.block
    elems = decode(np.asarray(r.codes), cfg.elem).astype(np.float32)
    scales = decode(np.asarray(r.scodes), cfg.scale_fmt).astype(np.float32)
    want = elems * np.repeat(scales, blen, axis=-1)[..., :x.shape[-1]]
    assert r.values.shape == x.shape and r.values.dtype == np.float32
    assert np.array_equal(r.values.view(np.uint32), want.view(np.uint32))
