"""``torch.nn.modules.utils``: argument helpers shared by the layers."""

from __future__ import annotations

import numpy as np

from ..._core import tensor
from ..parameter import Parameter


def _ntuple(n, name):
    def parse(x):
        if isinstance(x, (tuple, list)):
            return tuple(x)
        return (x,) * n
    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
_triple = _ntuple(3, "_triple")


def _empty_param(*shape):
    """A float32 parameter of zeros, to be initialised by the layer."""
    return Parameter(tensor(np.zeros(shape, np.float32)))
