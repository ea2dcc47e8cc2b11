"""Adam's foreach step for float32 parameters as one Numba loop.

``Adam._op_by_op`` writes torch's ``_multi_tensor_adam`` (and
``_single_tensor_adam``) on CUDA as one ATen kernel per line, each a pass
over the parameters with its own temporaries (``fpemu.autograd._aten``).
For float32 parameters every kernel's result is float32, and the loop below
computes the same lines per element, in the same order, with the same
roundings: float32 ``+ - * / sqrt`` (IEEE, as numpy's) and the fused
multiply-adds nvcc contracts (``llvm.fma.f32``, one rounding), a NaN from an
fma made the canonical 0x7fc00000 as :func:`fpemu.arith.fma_fp32` makes it.
One pass instead of about ten: the README MLP's optimizer step 5.3 -> 0.5 ms.
``tests/test_amp_optim.py`` compares it bit for bit with the op-by-op form,
special values included, and both with exact rationals.
"""

from __future__ import annotations

import numpy as np

from ..._jit import f32_from_ubits, fma32, jit, run_kernel

#: flags of :func:`adam_fp32_step`
DECOUPLED, L2, MAXIMIZE, AMSGRAD, SINGLE = 1, 2, 4, 8, 16


@jit
def _fma(a, b, c):
    r = fma32(a, b, c)
    return f32_from_ubits(np.uint32(0x7FC00000)) if r != r else r


@jit
def _adam_fp32_loop(G, P, M, V, MX, s, flags):
    """One step of every element, written into ``P``, ``M`` and ``V`` (and
    ``MX``, amsgrad's running maximum); ``s`` holds the float32 scalars
    (``wd``, ``1 - lr*wd``, ``1 - beta1``, ``beta2``, ``1 - beta2``, the bias
    correction ``bc2_sqrt`` (divided by) or its rounded reciprocal
    (``SINGLE``: multiplied by), ``eps``, ``-lr / bc1``)."""
    wd, keep, w, b2, c2, bc2, eps, step = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
    one = np.float32(1.0)
    small_w = abs(w) < np.float32(0.5)
    for i in range(P.size):
        p = P[i]
        g = G[i]
        if flags & MAXIMIZE:
            g = -g
        if flags & DECOUPLED:
            p = p * keep                                    # param.mul_(1 - lr*wd)
        elif flags & L2:
            g = _fma(wd, p, g)                              # grad.add(param, alpha=wd)
        m = M[i]
        diff = g - m                                        # exp_avg.lerp_(grad, 1-b1)
        m = _fma(w, diff, m) if small_w else _fma(-diff, one - w, g)
        v = V[i] * b2                                       # exp_avg_sq.mul_(b2)
        v = _fma(c2, g * g, v)                              # .addcmul_(g, g, 1-b2)
        u = v
        if flags & AMSGRAD:
            old = MX[i]
            u = old if old != old else (v if v != v else max(old, v))
            MX[i] = u
        d = np.sqrt(u)                                      # exp_avg_sq.sqrt()
        d = d * bc2 if flags & SINGLE else d / bc2          # / bias_correction2_sqrt
        d = d + eps                                         # .add_(eps)
        P[i] = _fma(step, m / d, p)                         # param.addcdiv_(m, d, ss)
        M[i] = m
        V[i] = v


def adam_fp32_step(P, G, M, V, MX, scalars, flags):
    """:func:`_adam_fp32_loop` on flat float32 arrays, writing ``P``, ``M``
    and ``V`` (and ``MX``) in place. The loop is serial: it runs near memory
    speed on one core (LLVM vectorises it: 0.16 ms for 400k elements), and
    one serial loop compiles in half the time of a parallel one and its
    serial twin. (With separate output arrays LLVM did not vectorise it:
    too many pairs of arrays to check for overlap.)"""
    run_kernel(_adam_fp32_loop, G, P, M, V, MX, scalars, flags, inputs=1)
