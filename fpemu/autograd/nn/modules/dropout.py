"""``torch.nn.modules.dropout``: :class:`Dropout` and the channel-wise
:class:`Dropout1d`, :class:`Dropout2d`, :class:`Dropout3d`.

The masks come from fpemu's seeded generator with torch's probability law,
not torch's exact draws (torch's CPU dropout draws through MKL;
``docs/autograd.md``)."""

from __future__ import annotations

from .. import functional as F
from .._dropout import check_probability
from .module import Module


class _DropoutNd(Module):
    _fn = None

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        self.p, self.inplace = check_probability(p), inplace

    def forward(self, input):
        return type(self)._fn(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    """Each element zeroed with probability p, the rest scaled by 1/(1-p);
    the identity in eval()."""

    _fn = staticmethod(F.dropout)


class Dropout1d(_DropoutNd):
    """Whole channels of (N, C, L) or (C, L) inputs zeroed."""

    _fn = staticmethod(F.dropout1d)


class Dropout2d(_DropoutNd):
    """Whole channels of (N, C, H, W) or (C, H, W) inputs zeroed."""

    _fn = staticmethod(F.dropout2d)


class Dropout3d(_DropoutNd):
    """Whole channels of (N, C, D, H, W) or (C, D, H, W) inputs zeroed."""

    _fn = staticmethod(F.dropout3d)
