"""``torch.nn.utils.clip_grad``: gradient clipping with the op sequence of
``torch/nn/utils/clip_grad.py`` (torch 2.13), built from fpemu's tensor ops
so that every rounding follows the active profile:

* each gradient's norm, in its own dtype (``vector_norm`` and
  ``_foreach_norm`` compute alike here: float64, rounded once);
* the total, the norm of the stacked norms;
* ``clip_coef = max_norm / (total + 1e-6)``: torch's ``__rdiv__``,
  ``reciprocal(total + 1e-6) * max_norm``, two roundings;
* clamped to 1.0 and multiplied into every gradient, even when it is 1.
"""

from __future__ import annotations

import math
import types
import warnings

from ..._core import Tensor, no_grad, tensor
from ...ops.elementwise import add, clamp, rdiv
from ...ops.reduce import norm
from ...ops.shape import stack

_FOREACH_DEVICES = ("cuda", "cpu")


def _tensor_list(parameters, warn=False):
    if isinstance(parameters, Tensor):
        return [parameters]
    is_generator = isinstance(parameters, types.GeneratorType)
    out = list(parameters)
    if warn and is_generator and not out:
        warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                      stacklevel=3)
    return out


def _check_foreach(foreach, tensors):
    if foreach and tensors and tensors[0].device.type not in _FOREACH_DEVICES:
        raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                           f"{tensors[0].device.type} tensors")


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the tensors' norms, as if they were one vector."""
    tensors = _tensor_list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    _check_foreach(foreach, tensors)
    norms = [norm(g, norm_type) for g in tensors]
    total = norm(stack(norms), norm_type)
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            f"non-finite, so it cannot be clipped. To disable this error and scale the "
            f"gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
    return total


def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
    """Scale every gradient by ``clamp(max_norm / (total_norm + 1e-6), max=1)``."""
    params = _tensor_list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    max_norm = float(max_norm)
    if not grads:
        return
    _check_foreach(foreach, grads)
    with no_grad():
        coef = clamp(rdiv(add(total_norm, 1e-6), max_norm), max=1.0)
        for g in grads:
            g.mul_(coef)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """Scale the gradients so that their joint norm is at most ``max_norm``;
    returns the total norm (before clipping)."""
    params = _tensor_list(parameters, warn=True)
    grads = [p.grad for p in params if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(params, max_norm, total, foreach)
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                   foreach=None):
    """The deprecated spelling of :func:`clip_grad_norm_`."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into ``[-clip_value, clip_value]``."""
    params = _tensor_list(parameters)
    clip_value = float(clip_value)
    grads = [p.grad for p in params if p.grad is not None]
    _check_foreach(foreach, grads)
    with no_grad():
        for g in grads:
            g.clamp_(min=-clip_value, max=clip_value)
