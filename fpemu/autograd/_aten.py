"""One function per ATen kernel whose formula differs between builds.

Ops (``ops/``) and optimizers (``optim.py``) call these instead of writing
the arithmetic themselves, so a kernel's formula lives in one place. Each
function takes opmath arrays (float32, or float64 for float64 tensors), asks
the active :class:`~._profile.Profile` which build it computes like, and
returns the result rounded to the dtype ``D`` (``L`` below is that rounding,
``r`` a float32 rounding). The formulas and how they were established are in
``docs/pytorch-numerics.md``.

================  ==================================  ==================================
kernel            CUDA                                CPU (x86-64 build)
================  ==================================  ==================================
``add_alpha``     ``L(fma(alpha, b, a))``             16-bit: alpha rounded to D; the
                                                      tail after the last 32-element
                                                      block ``L(a + L(alpha*b))``
``mul_scalar``    ``L(x * float32(s))``               ``_foreach_mul_`` on 16-bit: s
                                                      rounded to D first
``div_scalar``    ``L(x * r(1 / s))``                 ``L(x / s)``
``foreach_div``   ``L(x / s)``                        ``L(x / s)``
``lerp``          ``fma`` form by weight (< 0.5 from  same
                  the start, else from the end)
``addcmul``       ``L(fma(v, r(t1*t2), self))``       ``L(fma(r(v*t1), t2, self))``
``addcdiv``       ``L(fma(v, r(t1/t2), self))``       ``L(self + r(r(v*t1)/t2))``
``add_scalar``    ``L(x + float32(s))``               16-bit: s rounded to D first
================  ==================================  ==================================
"""

from __future__ import annotations

import numpy as np

from ..arith import fma_fp32
from .._exact import fma64
from ..arith import fma as _fma_exact
from ..formats import Format
from ._core import _store, float64, opmath
from ._profile import get_profile

_f = np.float32


def fma(a, b, c, dt=None):
    """fma(a, b, c) in opmath: exact, then one rounding to float32; for
    float64, one rounding to float64 (torch's 64-bit CPU kernels fuse it too:
    ``Vectorized<double>::fmadd``)."""
    if dt is not None and opmath(dt) is np.float64:
        return fma64(a, b, c)
    ops = [np.asarray(v) for v in (a, b, c)]
    if all(v.dtype == np.float32 for v in ops):
        # float32 operands are fp32 values: fpemu.arith's fp32 fast path,
        # called without its argument checks and conversions
        shape = np.broadcast_shapes(*(v.shape for v in ops))
        flat = [np.ascontiguousarray(np.broadcast_to(v, shape)).reshape(-1) for v in ops]
        return fma_fp32(*flat).reshape(shape)
    return np.asarray(_fma_exact(a, b, c, "fp32"), np.float32)


def cpu_rounds_scalars(D) -> bool:
    """True under the CPU profile for 16-bit (and smaller) float dtypes: CPU
    kernels take a Python number as the tensor's own dtype."""
    return get_profile().cpu and isinstance(D, Format) and D.bits < 32


def scalar(x, D):
    """A Python number (``alpha``, an added scalar) as the kernel sees it:
    float32 on CUDA (float64 for float64 tensors); the CPU profile first
    rounds it to a 16-bit dtype."""
    if D is float64:
        return np.float64(x)
    if cpu_rounds_scalars(D):
        return _f(_store(_f(x), D))
    return _f(x)


def add_alpha(A, B, alpha, D):
    """``add(a, b, alpha=alpha)`` with alpha != 1; ``alpha`` as :func:`scalar`
    returns it. CUDA: the exact fma nvcc contracts it to. CPU on 16-bit dtypes:
    the vector body is the fma, the tail after the last full 32-element block
    computes ``L(a + L(alpha*b))`` (c10's 16-bit operators round each step)."""
    out = _store(fma(alpha, B, A, D), D)
    if cpu_rounds_scalars(D) and out.size:
        lanes = get_profile().cpu_binary_body((D.bits + 7) // 8)
        start = (out.size // lanes) * lanes
        if start < out.size:
            Af = np.broadcast_to(A, out.shape).reshape(-1)[start:]
            Bf = np.broadcast_to(B, out.shape).reshape(-1)[start:]
            flat = out.reshape(-1)
            flat[start:] = _store(Af + _store(alpha * Bf, D), D)
            out = flat.reshape(out.shape)
    return out


def mul_scalar(X, s, D, foreach=False):
    """``x.mul_(s)`` for a Python number: float32 ``s``, except that CPU's
    ``_foreach_mul_`` rounds it to a 16-bit dtype first (bf16 times 0.9
    multiplies by 0.8984375); the single-tensor ``mul_`` does not."""
    factor = scalar(s, D) if foreach else (np.float64(s) if D is float64 else _f(s))
    return _store(X * factor, D)


def div_scalar(X, s, D):
    """``tensor / number``: CUDA's ``div_true`` multiplies by the reciprocal
    of the number, taken in double and rounded to opmath (measured with torch
    2.11 on an H200: single-tensor Adam's ``sqrt(v) / bc2_sqrt`` matches it on
    every element of 200 steps, and not the float reciprocal of the float
    number); the CPU divides."""
    om = opmath(D)
    if get_profile().cpu:
        return _store(X / om(s), D)
    return _store(X * om(1.0 / float(s)), D)


def foreach_div(X, s, D):
    """``_foreach_div_(tensors, scalars)``: a true division on both builds."""
    return _store(X / opmath(D)(s), D)


def lerp_opmath(start, end, weight):
    """ATen's ``lerp`` in float32 opmath, not yet stored: ``fma(w, end -
    start, start)`` where |w| < 0.5, else ``fma(-(end - start), 1 - w,
    end)``. ``weight`` is a Python number or an array (torch's tensor
    weight); both branches are the fma nvcc contracts on CUDA and the
    explicit fmadd of the CPU kernels (torch 2.13 CPU agrees bit for bit)."""
    diff = end - start
    om = np.float64 if np.asarray(diff).dtype == np.float64 else _f   # float64 tensors
    dt = float64 if om is np.float64 else None
    if np.ndim(weight) == 0:
        w = om(weight)
        if abs(w) < 0.5:
            return fma(w, diff, start, dt)
        return fma(-diff, om(1) - w, end, dt)
    w = np.asarray(weight, om)
    small = np.abs(w) < 0.5
    return np.where(small, fma(w, diff, start, dt), fma(-diff, om(1) - w, end, dt))


def lerp(start, end, weight, D):
    """``lerp(start, end, w)`` (:func:`lerp_opmath`) rounded once to ``D``
    (float64 tensors in float64 throughout)."""
    if D is float64:
        start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    return _store(lerp_opmath(start, end, weight), D)


def addcmul(S, T1, T2, value, D):
    """``self + value * t1 * t2``. CUDA: ``fma(v, r(t1*t2), self)``; CPU:
    ``fma(r(v*t1), t2, self)`` (float64 tensors: the same in float64)."""
    om = opmath(D)
    v = om(value)
    with np.errstate(all="ignore"):
        if get_profile().cpu:
            return _store(fma(v * T1, T2, S, D), D)
        return _store(fma(v, T1 * T2, S, D), D)


def addcdiv(S, T1, T2, value, D):
    """``self + value * t1 / t2``. CUDA: ``fma(v, r(t1/t2), self)``; CPU:
    ``r(self + r(r(v*t1)/t2))`` (float64 tensors: the same in float64)."""
    om = opmath(D)
    v = om(value)
    with np.errstate(all="ignore"):
        if get_profile().cpu:
            return _store(S + (v * T1) / T2, D)
        return _store(fma(v, T1 / T2, S, D), D)


def add_scalar(X, s, D):
    """``x + s`` for a Python number."""
    return _store(X + scalar(s, D), D)


def sqrt(X, D):
    """IEEE square root in opmath (CPU float32 goes through MKL VML, about 1
    ulp off on a fifth of inputs: not modelled)."""
    with np.errstate(all="ignore"):
        return _store(np.sqrt(X), D)
