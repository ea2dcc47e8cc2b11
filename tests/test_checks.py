"""fpemu.checks reads torch tensors of the dtypes numpy lacks exactly."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu
from fpemu.checks import TORCH_FORMATS, from_torch

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(TORCH_FORMATS))
def test_every_code_of_each_low_precision_torch_dtype_reads_as_its_value(name):
    """Each of the 256 (65536 for bfloat16) codes, viewed as the torch dtype,
    reads as the value fpemu.decode gives the code (bit for bit: signed
    zeros, NaN where the code is NaN)."""
    fmt = fpemu.formats.format(TORCH_FORMATS[name])
    n = 1 << fmt.bits
    raw = torch.arange(n, dtype=torch.int32)
    raw = raw.to(torch.uint8) if fmt.bits == 8 else raw.to(torch.int16)
    got = from_torch(raw.view(getattr(torch, name)), "test")
    want = fpemu.decode(np.arange(n, dtype=fmt.code_dtype), fmt)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
