"""Adam's foreach step for float32 parameters as one Numba loop.

``Adam._op_by_op`` writes torch's ``_multi_tensor_adam`` (and
``_single_tensor_adam``) on CUDA as one ATen kernel per line, each a pass
over the parameters with its own temporaries (``fpemu.autograd._aten``).
For float32 parameters every kernel's result is float32, and the loop below
computes the same lines per element, in the same order, with the same
roundings: float32 ``+ - * / sqrt`` (IEEE, as numpy's) and the fused
multiply-adds nvcc contracts (``llvm.fma.f32``, one rounding), a NaN from an
fma made the canonical 0x7fc00000 as :func:`fpemu.arith.fma_fp32` makes it.
One pass instead of about ten: the README MLP's optimizer step 5.3 -> 0.6 ms
(2 cores). ``tests/test_amp_optim.py`` compares it bit for bit with the
op-by-op form, special values included, and both with exact rationals.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..._jit import f32_from_ubits, fma32, jit, pjit, run_kernel

#: flags of :func:`adam_fp32_step`
DECOUPLED, L2, MAXIMIZE, AMSGRAD, SINGLE = 1, 2, 4, 8, 16


@jit
def _fma(a, b, c):
    r = fma32(a, b, c)
    return f32_from_ubits(np.uint32(0x7FC00000)) if r != r else r


@pjit
def _adam_fp32_loop(P, G, M, V, MX, s, flags, outP, outM, outV):
    """One step of every element; ``s`` holds the float32 scalars (``wd``,
    ``1 - lr*wd``, ``1 - beta1``, ``beta2``, ``1 - beta2``, the bias
    correction ``bc2_sqrt`` (divided by) or its rounded reciprocal
    (``SINGLE``: multiplied by), ``eps``, ``-lr / bc1``). ``MX`` (amsgrad's
    running maximum) is updated in place."""
    wd, keep, w, b2, c2, bc2, eps, step = s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
    one = np.float32(1.0)
    small_w = abs(w) < np.float32(0.5)
    for i in prange(P.size):
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
        outP[i] = _fma(step, m / d, p)                      # param.addcdiv_(m, d, ss)
        outM[i] = m
        outV[i] = v


def adam_fp32_step(P, G, M, V, MX, scalars, flags):
    """:func:`_adam_fp32_loop` on flat float32 arrays, writing ``P``, ``M``
    and ``V`` (and ``MX``) in place. It always runs as a parallel loop
    (``run_kernel(twin=False)``): LLVM vectorises the parallel body and not
    the serial twin (1 thread, 400k elements: 0.18 against 1.4 ms), and a
    new user's first step compiles one loop, not two."""
    run_kernel(_adam_fp32_loop, P, G, M, V, MX, scalars, flags, P, M, V, inputs=4,
               twin=False)
