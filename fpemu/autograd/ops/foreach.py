"""``torch._foreach_*`` and the GradScaler's kernels, one tensor list at a time.

The foreach optimizers (the default on CUDA) and ``torch.amp.GradScaler``
call these ATen kernels; their arithmetic differs from the single-tensor ops
in places (``docs/pytorch-numerics.md`` §3: a scalar kept in float32 or
rounded to a 16-bit dtype, an ``fma``), which :mod:`fpemu.autograd._aten`
holds. Each function here applies one kernel to every tensor of a list, in
place where torch's name ends in ``_``, under the active profile, and
returns what torch returns (None for the in-place ones, a list otherwise).
fpemu.autograd exports them under torch's names (``_foreach_mul_``, ...).

The op-stream replay (``fpemu parity --first-difference``) runs a recorded
optimizer step through them.
"""

from __future__ import annotations

import numpy as np

from .. import _aten
from .._core import Tensor, float64, is_float, _store

__all__ = ["add_", "mul_", "div_", "lerp_", "addcmul_", "addcdiv_", "sqrt",
           "non_finite_check_and_unscale_", "update_scale_"]


def _tensors(xs, what):
    xs = list(xs)
    for t in xs:
        if not isinstance(t, Tensor) or not is_float(t.dtype):
            got = f"a tensor of {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(f"{what}: expected a list of floating-point fpemu tensors, got "
                            f"{got} in it")
    return xs


def _om(t):
    """A tensor's values in its kernels' opmath (float32; float64 for float64)."""
    return np.asarray(t._data, np.float64 if t.dtype is float64 else np.float32)


def _per_tensor(value, n, what):
    """A scalar or one scalar per tensor (a ScalarList)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{what}: expected {n} scalars, one per tensor, got {len(value)}")
        return list(value)
    return [value] * n


def _same_length(a, b, what):
    if len(a) != len(b):
        raise RuntimeError(f"{what}: tensor lists must have the same number of tensors, got "
                           f"{len(a)} and {len(b)}")


def add_(tensors, other, alpha=1):
    """``torch._foreach_add_(tensors, scalar | scalars | tensor, alpha=1)``:
    a number (or one per tensor) added in the kernel's opmath (the CPU
    profile rounds it to a 16-bit dtype first), or a tensor (a step counter)
    times alpha."""
    xs = _tensors(tensors, "_foreach_add_")
    if isinstance(other, Tensor):
        for t in xs:
            o = np.asarray(other._data, np.float64)
            if alpha == 1:
                t._a = _store(np.asarray(t._data, np.float64) + o, t.dtype)
            else:
                t._a = _aten.add_alpha(_om(t), o.astype(_om(t).dtype),
                                       _aten.scalar(alpha, t.dtype), t.dtype)
        return None
    for t, s in zip(xs, _per_tensor(other, len(xs), "_foreach_add_")):
        t._a = _aten.add_scalar(_om(t), s, t.dtype)
    return None


def mul_(tensors, scalar):
    """``torch._foreach_mul_(tensors, scalar | scalars)``."""
    xs = _tensors(tensors, "_foreach_mul_")
    for t, s in zip(xs, _per_tensor(scalar, len(xs), "_foreach_mul_")):
        t._a = _aten.mul_scalar(_om(t), s, t.dtype, True)
    return None


def div_(tensors, scalar):
    """``torch._foreach_div_(tensors, scalar | scalars)``: a true division."""
    xs = _tensors(tensors, "_foreach_div_")
    for t, s in zip(xs, _per_tensor(scalar, len(xs), "_foreach_div_")):
        with np.errstate(all="ignore"):
            t._a = _aten.foreach_div(_om(t), s, t.dtype)
    return None


def lerp_(tensors, ends, weight):
    """``torch._foreach_lerp_(tensors, ends, weight)`` with a number."""
    xs, es = _tensors(tensors, "_foreach_lerp_"), _tensors(ends, "_foreach_lerp_")
    _same_length(xs, es, "_foreach_lerp_")
    for t, e in zip(xs, es):
        t._a = _aten.lerp(_om(t), _om(e), weight, t.dtype)
    return None


def _pointwise_(kernel, name, tensors, tensors1, tensors2, value):
    """``self <- kernel(self, t1, t2, value)`` over three lists (addcmul /
    addcdiv), ``value`` a number or one per tensor."""
    xs = _tensors(tensors, name)
    a, b = _tensors(tensors1, name), _tensors(tensors2, name)
    _same_length(xs, a, name)
    _same_length(xs, b, name)
    for t, x, y, v in zip(xs, a, b, _per_tensor(value, len(xs), name)):
        with np.errstate(all="ignore"):
            t._a = kernel(_om(t), _om(x), _om(y), v, t.dtype)
    return None


def addcmul_(tensors, tensors1, tensors2, value=1):
    """``torch._foreach_addcmul_(self, t1, t2, value | values)``."""
    return _pointwise_(_aten.addcmul, "_foreach_addcmul_", tensors, tensors1, tensors2, value)


def addcdiv_(tensors, tensors1, tensors2, value=1):
    """``torch._foreach_addcdiv_(self, t1, t2, value | values)``."""
    return _pointwise_(_aten.addcdiv, "_foreach_addcdiv_", tensors, tensors1, tensors2, value)


def sqrt(tensors):
    """``torch._foreach_sqrt(tensors)``: new tensors."""
    xs = _tensors(tensors, "_foreach_sqrt")
    with np.errstate(all="ignore"):
        return [Tensor(_aten.sqrt(_om(t), t.dtype), t.dtype) for t in xs]


def non_finite_check_and_unscale_(grads, found_inf, inv_scale):
    """``torch._amp_foreach_non_finite_check_and_unscale_``: every gradient
    times the float32 ``inv_scale`` (unless it is 1), rounded to its dtype;
    ``found_inf`` (a one-element float32 tensor) set to 1 if any value is
    inf or NaN."""
    xs = _tensors(grads, "_amp_foreach_non_finite_check_and_unscale_")
    inv = np.float32(np.asarray(inv_scale._data if isinstance(inv_scale, Tensor)
                                else inv_scale).reshape(()))
    bad = False
    for t in xs:
        v = np.asarray(t._data, np.float32)
        with np.errstate(all="ignore"):
            bad |= not np.isfinite(v).all()
            if inv != 1:
                t._a = _store(v * inv, t.dtype)
    if bad:
        found_inf._a = np.ones_like(found_inf._data)
    return None


def update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                  growth_interval):
    """``torch._amp_update_scale_``: after an inf the scale times the backoff
    factor and the tracker 0; else the tracker counts up, and at the interval
    the scale grows (if the grown scale is finite) and the tracker restarts.
    The factor multiplies in double, rounded once to float32 (AmpKernels.cu)."""
    s = np.float32(np.asarray(scale._data).reshape(()))
    n = int(np.asarray(growth_tracker._data).reshape(()))
    if float(np.asarray(found_inf._data).reshape(())) != 0:
        with np.errstate(under="ignore"):
            s, n = np.float32(np.float64(s) * backoff_factor), 0
    else:
        n += 1
        if n == growth_interval:
            with np.errstate(over="ignore"):
                grown = np.float32(np.float64(s) * growth_factor)
            s, n = (grown if np.isfinite(grown) else s), 0
    scale._a = np.asarray(s, scale._data.dtype).reshape(scale._data.shape)
    growth_tracker._a = np.asarray(n, growth_tracker._data.dtype).reshape(
        growth_tracker._data.shape)
    return scale


#: torch's names, as fpemu.autograd exports them
TORCH_NAMES = {"_foreach_add_": add_, "_foreach_mul_": mul_, "_foreach_div_": div_,
               "_foreach_lerp_": lerp_, "_foreach_addcmul_": addcmul_,
               "_foreach_addcdiv_": addcdiv_, "_foreach_sqrt": sqrt,
               "_amp_foreach_non_finite_check_and_unscale_": non_finite_check_and_unscale_,
               "_amp_update_scale_": update_scale_}
