"""A recipe of one's own (fpemu.autograd.fp8.Recipe): its operand plans are
what both drivers run, and a per-tensor plan without tensor_scale is refused
with the fix."""

import numpy as np
import pytest

import fpemu
from fpemu.autograd import fp8


class _Pow2PerTensor(fp8.Recipe):
    """Every operand e4m3fn with one power-of-two scale: amax to 256."""

    def operand_plan(self, role, shape, fmt=None):
        return fp8.OperandPlan(role, fmt or fpemu.format("e4m3fn"), fpemu.format("fp32"),
                               None, "pow2")

    def tensor_scale(self, plan, amax, state=None):
        e = np.floor(np.log2(256.0 / amax)) if amax > 0 else 0.0
        return np.float32(2.0 ** e), np.float32(2.0 ** -e)


class _NoScale(_Pow2PerTensor):
    tensor_scale = fp8.Recipe.tensor_scale


def test_a_recipe_of_ones_own_quantizes_by_its_plan():
    x = np.array([[0.5, -3.0, 100.0, 1e-3]], np.float32)
    q = _Pow2PerTensor().quantize(x, None, "input")
    # scale 2 (256 / 100 -> 2**1): codes of 2x, decoded back over the scale
    want = fpemu.quantize(x * 2, "e4m3fn", overflow="saturate") / 2
    np.testing.assert_array_equal(q.values.astype(np.float32), want)


def test_a_per_tensor_plan_needs_tensor_scale():
    with pytest.raises(NotImplementedError, match="_NoScale.operand_plan returned a plan with "
                       "block=None.*role 'input'.*define it.*or give the plan a block"):
        _NoScale().quantize(np.ones((2, 4), np.float32), None, "input")
