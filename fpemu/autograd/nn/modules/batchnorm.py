"""``torch.nn.modules.batchnorm``: :class:`BatchNorm1d`, :class:`BatchNorm2d`,
:class:`BatchNorm3d`."""

from __future__ import annotations

import numpy as np

from ..._core import int64, tensor
from .. import functional as F
from .module import Module
from .normalization import _affine


class _NormBase(Module):
    """The state of batch and instance norms, registered in torch's order:
    weight, bias, then the running_mean, running_var and num_batches_tracked
    buffers."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, *, bias=True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _affine(self, num_features, affine, bias)
        if track_running_stats:
            self.register_buffer("running_mean", tensor(np.zeros(num_features, np.float32)))
            self.register_buffer("running_var", tensor(np.ones(num_features, np.float32)))
            self.register_buffer("num_batches_tracked", tensor(np.zeros((), np.int64),
                                                               dtype=int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        if dtype is not None:
            self.to(dtype)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            self.weight.data.fill_(1.0)
            if self.bias is not None:
                self.bias.data.zero_()

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class _BatchNorm(_NormBase):
    def forward(self, input):
        """torch's BatchNorm forward: count the batch, pick the averaging
        factor (``momentum``, or 1/batches for a cumulative average with
        ``momentum=None``), normalise by batch statistics in training (or
        without running statistics), by the running ones in eval."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked.item())
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if keep else None,
                            self.running_var if keep else None, self.weight, self.bias,
                            use_batch, factor, self.eps)


def _dims(name, allowed):
    def check(self, input):
        if input.ndim not in allowed:
            want = " or ".join(f"{d}D" for d in allowed)
            raise ValueError(f"expected {want} input (got {input.ndim}D input)")
    check.__name__ = "_check_input_dim"
    return check


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L) inputs."""

    _check_input_dim = _dims("BatchNorm1d", (2, 3))


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W) inputs."""

    _check_input_dim = _dims("BatchNorm2d", (4,))


class BatchNorm3d(_BatchNorm):
    """Over (N, C, D, H, W) inputs."""

    _check_input_dim = _dims("BatchNorm3d", (5,))
