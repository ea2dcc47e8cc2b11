"""``cdist``: the p-norm distance between every row of x1 and every row of x2.

torch chooses between two computations (``aten/src/ATen/native/Distance.cpp``):

* p = 2 with ``compute_mode`` "use_mm_for_euclid_dist", or the default
  "use_mm_for_euclid_dist_if_necessary" with more than 25 rows on either side:
  one matrix product of the rows extended by their squared norms,
  ``[-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T``, clamped at 0, then the square
  root (fast, and inexact for near points: the cancellation is torch's, and
  fpemu computes it the same way, the product under the matmul model);
* otherwise the distances themselves, ``(sum |x1_i - x2_j|^p)^(1/p)``
  (p = 0 counts the differing coordinates, p = inf takes the largest),
  here in float64 rounded once.

The gradients are torch's formulas (``_cdist_backward``,
``_euclidean_dist_backward``): zero where a distance is zero.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["cdist"]

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError
from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, float32, float64, is_float
from .._cpu_reduce import cpu_cdist
from .._profile import get_profile
from . import linalg as _linalg
from .._common import sum_to_shape

_MODES = ("use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist",
          "donot_use_mm_for_euclid_dist")


def cdist(x1, x2, p=2.0, compute_mode="use_mm_for_euclid_dist_if_necessary"):
    """Distances (..., P, R) between the rows of x1 (..., P, M) and x2 (..., R, M)."""
    for name, t in (("x1", x1), ("x2", x2)):
        if not isinstance(t, Tensor):
            raise FpemuTypeError(f"cdist(): argument '{name}' must be Tensor, not "
                                 f"{type(t).__name__}")
    x1, x2 = cast_inputs("cdist", x1, x2)
    if x1.ndim < 2 or x2.ndim < 2:
        which, nd = (1, x1.ndim) if x1.ndim < 2 else (2, x2.ndim)
        raise FpemuRuntimeError(f"cdist only supports at least 2D tensors, X{which} got: {nd}D")
    if x1.shape[-1] != x2.shape[-1]:
        raise FpemuRuntimeError(f"X1 and X2 must have the same number of columns. X1: "
                                f"{x1.shape[-1]} X2: {x2.shape[-1]}")
    if not is_float(x1.dtype) or not is_float(x2.dtype):
        raise FpemuRuntimeError(f"cdist only supports floating-point dtypes, X1 got: "
                                f"{x1.dtype}" if not is_float(x1.dtype) else
                                f"cdist only supports floating-point dtypes, X2 got: {x2.dtype}")
    if x1.dtype is not x2.dtype:
        raise FpemuRuntimeError(f"cdist: X1 and X2 must have the same dtype ({x1.dtype} and "
                                f"{x2.dtype})")
    if p < 0:
        raise FpemuRuntimeError(f"cdist only supports non-negative p values, got {p}")
    if compute_mode not in _MODES:
        raise FpemuRuntimeError(f"{compute_mode} is not a valid value for compute_mode")
    batch = np.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    P, R, M = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    dt = x1.dtype
    A = np.broadcast_to(x1._data, batch + (P, M)).astype(np.float64)
    B = np.broadcast_to(x2._data, batch + (R, M)).astype(np.float64)
    mm = p == 2 and (compute_mode == "use_mm_for_euclid_dist" or (
        compute_mode == _MODES[0] and (P > 25 or R > 25)))
    if mm:
        res = _euclid_mm(A, B, dt)
    else:
        res = _direct(A, B, p, dt)
    R64 = res.astype(np.float64)

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            if mm:
                ratio = np.where(R64 == 0, 0.0, G / R64)
                g1 = A * ratio.sum(-1, keepdims=True) - ratio @ B
                g2 = B * ratio.sum(-2)[..., None] - np.swapaxes(ratio, -1, -2) @ A
            else:
                g1, g2 = _direct_grad(A, B, p, G, R64, dt)
        return (_store(sum_to_shape(g1, x1.shape), dt), _store(sum_to_shape(g2, x2.shape), dt))
    return _result(res, dt, (x1, x2), backward, op="cdist")


def _euclid_mm(A, B, dt):
    """torch's ``_euclidean_dist``: every step in the tensors' precision."""
    om = np.float64 if dt is float64 else np.float32
    A, B = A.astype(om), B.astype(om)
    with np.errstate(all="ignore"):
        n1 = _store(np.sum(_store(A * A, dt).astype(np.float64), -1, keepdims=True), dt)
        n2 = _store(np.sum(_store(B * B, dt).astype(np.float64), -1, keepdims=True), dt)
        a = np.concatenate([_store(A * om(-2), dt), n1, np.ones_like(n1)], -1).astype(om)
        b = np.concatenate([B, np.ones_like(n2), n2], -1).astype(om)
        prod = _store(_linalg.mm_acc(a, np.swapaxes(b, -1, -2), dt), dt).astype(om)
        return _store(np.sqrt(np.maximum(prod, om(0))), dt)


def _direct(A, B, p, dt):
    prof = get_profile()
    if prof.cpu and dt in (float32, float64) and np.isfinite(p) and p > 0 and A.size \
            and B.size:
        # torch CPU's own kernel, in the dtype and its order (_cpu_reduce.cpu_cdist)
        om = np.float64 if dt is float64 else np.float32
        shape = A.shape[:-2]
        res = cpu_cdist(A.astype(om).reshape((-1,) + A.shape[-2:]),
                        B.astype(om).reshape((-1,) + B.shape[-2:]), p, prof.cpu_capability)
        return res.reshape(shape + res.shape[1:])
    D = np.abs(A[..., :, None, :] - B[..., None, :, :])
    with np.errstate(all="ignore"):
        if p == 0:
            r = (D != 0).sum(-1).astype(np.float64)
        elif p == 1:
            r = D.sum(-1)
        elif p == 2:
            r = np.sqrt((D * D).sum(-1))
        elif np.isinf(p):
            r = D.max(-1) if D.shape[-1] else np.zeros(D.shape[:-1])
        else:
            r = (D ** p).sum(-1) ** (1.0 / p)
    return _store(r, dt)


def _direct_grad(A, B, p, G, R, dt):
    """torch's ``_cdist_backward``: the derivative of each distance with
    respect to each coordinate difference, summed over the other side (the
    differences in the dtype, as torch's: p = inf finds the maximum by
    comparing them with the distance)."""
    diff = _store(A[..., :, None, :] - B[..., None, :, :], dt).astype(np.float64)
    Gx = G[..., None]
    Rx = R[..., None]
    if p == 0 or diff.shape[-1] == 0:
        part = np.zeros_like(diff)
    elif p == 1:
        part = Gx * np.sign(diff)
    elif p == 2:
        part = np.where(Rx == 0, 0.0, Gx * diff / Rx)
    elif np.isinf(p):
        part = Gx * np.sign(diff) * (np.abs(diff) == Rx)
    elif p < 2:
        part = np.where((Rx == 0) | (diff == 0), 0.0,
                        Gx * np.sign(diff) * np.abs(diff) ** (p - 1) / Rx ** (p - 1))
    else:
        part = np.where(Rx == 0, 0.0, Gx * diff * np.abs(diff) ** (p - 2) / Rx ** (p - 1))
    return part.sum(-2), -part.sum(-3)
