"""``torch.nn.modules.instancenorm``: :class:`InstanceNorm1d`,
:class:`InstanceNorm2d`, :class:`InstanceNorm3d`."""

from __future__ import annotations

from .. import functional as F
from .batchnorm import _NormBase


class _InstanceNorm(_NormBase):
    _ndim = 4

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, bias=bias)

    def forward(self, input):
        if input.ndim not in (self._ndim - 1, self._ndim):
            raise ValueError(f"expected {self._ndim - 1}D or {self._ndim}D input (got "
                             f"{input.ndim}D input)")
        x = input if input.ndim == self._ndim else input.unsqueeze(0)
        use_stats = self.training or not self.track_running_stats
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              use_stats, self.momentum if self.momentum is not None else 0.1,
                              self.eps)
        return out if input.ndim == self._ndim else out.squeeze(0)


class InstanceNorm1d(_InstanceNorm):
    _ndim = 3


class InstanceNorm2d(_InstanceNorm):
    _ndim = 4


class InstanceNorm3d(_InstanceNorm):
    _ndim = 5
