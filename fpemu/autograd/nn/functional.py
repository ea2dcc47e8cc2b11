"""The functional forms, as ``torch.nn.functional``: activations, softmax,
norms, losses, dropout, embedding, attention, convolution and pooling.

Softmax, the norms and the losses compute in float64 and round once to the
output dtype (tier 2: CUDA's fp32 reductions are within a few ulp of that).
Attention follows the backend model of ``docs/pytorch-numerics.md`` §11
("Attention"); convolution is im2col followed by the emulated matmul.

The functions live by family, as torch's ``nn/modules`` do: ``_activation``
(activations, softmax), ``_norm``, ``_loss``, ``_dropout`` (dropout,
embedding, pad), ``_attention``, ``_conv``, ``_pooling`` and ``_resample``;
this module gathers them under torch's names (each family module's
``__all__``: a new function is its definition and its name there) and holds
the pooling wrappers.
"""

from __future__ import annotations

from ..ops.elementwise import (  # noqa: F401  (torch.nn.functional's names)
    gelu, masked_fill, relu, sigmoid, silu, tanh,
)
from ..ops.linalg import linear  # noqa: F401
from . import _pooling
from ._resample import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._activation import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._norm import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._loss import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._loss import _reduction  # noqa: F401  (torch's private names)
from ._dropout import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._attention import *  # noqa: F401,F403  (torch.nn.functional's names)
from ._attention import _canonical_mask, _none_or_dtype  # noqa: F401  (torch's private names)
from ._conv import *  # noqa: F401,F403  (torch.nn.functional's names)


# ----------------------------------------------------------------- pooling
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    """The maximum over each window (exact; ``_pooling``); with
    ``return_indices`` also each maximum's index in the input row."""
    return _pooling.max_pool("max_pool1d", input, 1, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    """The maximum over each window (exact; ``_pooling``); the gradient goes
    to the window's first maximum (its last NaN)."""
    return _pooling.max_pool("max_pool2d", input, 2, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode=False, return_indices=False):
    """3-D max pooling, as :func:`max_pool2d`."""
    return _pooling.max_pool("max_pool3d", input, 3, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """The mean over each window in float64, rounded once (``_pooling``)."""
    return _pooling.avg_pool("avg_pool1d", input, 1, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """The mean over each window in float64, rounded once (``_pooling``)."""
    return _pooling.avg_pool("avg_pool2d", input, 2, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """3-D average pooling, as :func:`avg_pool2d`."""
    return _pooling.avg_pool("avg_pool3d", input, 3, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0,
                 output_size=None):
    """Each value written at its index of a zero output (``_pooling``)."""
    return _pooling.max_unpool("max_unpool1d", input, indices, 1, kernel_size, stride,
                               padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0,
                 output_size=None):
    """The inverse of :func:`max_pool2d` with ``return_indices``."""
    return _pooling.max_unpool("max_unpool2d", input, indices, 2, kernel_size, stride,
                               padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0,
                 output_size=None):
    """The inverse of :func:`max_pool3d` with ``return_indices``."""
    return _pooling.max_unpool("max_unpool3d", input, indices, 3, kernel_size, stride,
                               padding, output_size)


from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.nn.functional (torch.nn.functional)')
