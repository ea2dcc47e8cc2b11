"""``clip_grad_norm_`` with the rounding points of ``torch/nn/utils/clip_grad.py``."""

from __future__ import annotations

import numpy as np

from .._core import Tensor, _store, float32, opmath


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """Scale the gradients so that their joint norm is at most ``max_norm``.

    ``total = norm(stack(norm(g) for g))`` (the reduction computed in float64,
    rounded to float32); ``coef = max_norm / (total + 1e-6)`` as torch's
    ``__rdiv__`` does it (``reciprocal(total + 1e-6) * max_norm``, two
    roundings), clamped to 1.0; every gradient is multiplied by the coef, even
    when it is 1. Returns the total norm (a float32 tensor).
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return Tensor(np.asarray(0.0, np.float32), float32)
    p = float(norm_type)
    with np.errstate(all="ignore"):
        if p == float("inf"):
            norms = [np.float32(np.max(np.abs(g._a))) if g._a.size else np.float32(0)
                     for g in grads]
            total = np.float32(np.max(norms))
        else:
            norms = [np.float32(np.sum(np.abs(g._a.astype(np.float64)) ** p) ** (1 / p))
                     for g in grads]
            total = np.float32(np.sum(np.asarray(norms, np.float64) ** p) ** (1 / p))
        denom = np.float32(total + np.float32(1e-6))
        coef = np.float32(np.float32(1) / denom) * np.float32(max_norm)
        coef = np.float32(min(coef, np.float32(1.0))) if not np.isnan(coef) else coef
        for g in grads:
            om = opmath(g.dtype)
            g._a = _store(g._a.astype(om) * om(coef), g.dtype)
    return Tensor(np.asarray(total, np.float32), float32)
