"""fpemu.block.host.scaled_values (the CPU's GEMM operands in
fpemu.torch.emulate) against the exact products: each element's value times
its block's scale, expanded with NumPy and multiplied in float64 (exact
here), then rounded once to float32."""

import zlib

import numpy as np
import pytest

import fpemu
from fpemu.block.host import scaled_values


def _oracle(codes, svals, elem, block, axis):
    vals = fpemu.decode(codes, elem).astype(np.float64)
    by, bx = block if isinstance(block, tuple) else ((block, 1) if axis == 0 else (1, block))
    full = np.repeat(np.repeat(svals.astype(np.float64), by, axis=0), bx, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        return (vals * full[:codes.shape[0], :codes.shape[1]]).astype(np.float32)


@pytest.mark.parametrize("elem, sfmt", [("e4m3fn", "e8m0"), ("e2m1", "e4m3fn"),
                                        ("e5m2", "e8m0"), ("e2m3", "e8m0")])
@pytest.mark.parametrize("shape, block, axis", [((64, 96), 32, 1), ((96, 64), 32, 0),
                                                ((37, 70), 16, 1), ((70, 37), 16, 0),
                                                ((48, 80), (16, 16), None),
                                                ((45, 70), (16, 16), None)])
def test_each_element_times_its_blocks_scale(elem, sfmt, shape, block, axis):
    rng = np.random.default_rng(zlib.crc32(f"{elem}{shape}".encode()))
    e, s = fpemu.format(elem), fpemu.format(sfmt)
    codes = rng.integers(0, 1 << e.bits, shape).astype(e.code_dtype)
    by, bx = block if isinstance(block, tuple) else ((block, 1) if axis == 0 else (1, block))
    sshape = (-(-shape[0] // by), -(-shape[1] // bx))
    scodes = rng.integers(0, 1 << s.bits, sshape).astype(s.code_dtype)
    svals = fpemu.decode(scodes, s)
    got = scaled_values(codes, svals, e, block, axis)
    want = _oracle(codes, svals, e, block, axis)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
