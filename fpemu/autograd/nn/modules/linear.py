"""``torch.nn.modules.linear``: :class:`Identity`, :class:`Linear`."""

from __future__ import annotations

import math

from .. import functional as F
from .. import init
from .module import Module
from .utils import _empty_param
from ... import fp8


class Identity(Module):
    """Returns its input; its arguments are accepted and ignored, as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x @ W.T + b, W of shape (out, in). Inside ``fp8_autocast`` the GEMMs
    are scaled fp8 GEMMs under the active recipe."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty_param(out_features, in_features)
        self.bias = _empty_param(out_features) if bias else None
        self.fp8_state = None
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """torch's: kaiming_uniform_(a=sqrt(5)) for the weight, uniform in
        +-1/sqrt(fan_in) for the bias, drawn in that order."""
        _reset_fan_in(self.weight, self.bias)

    def forward(self, input):
        recipe = fp8.active_recipe()
        if recipe is not None and not recipe.keeps_high_precision(self):
            return fp8.fp8_linear(self, input, recipe)
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """The class of ``MultiheadAttention.out_proj`` in torch: a Linear."""


def _reset_fan_in(weight, bias, fan_in=None):
    """torch's initialisation of Linear and the convolutions: kaiming_uniform_
    with a = sqrt(5) for the weight, then the bias uniform in +-1/sqrt(fan_in)."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        if fan_in is None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)
