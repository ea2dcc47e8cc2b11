"""Numba kernels of :mod:`fpemu.collectives`.

``gloo_ring(V, out, bounds, op, rne, ...)`` folds the ranks' arrays the way
gloo's ring all-reduce does (``gloo/allreduce.cc``, ``ring()``; the order is
derived in :mod:`fpemu.collectives`): chunk ``c`` of the buffer (elements
``bounds[c]:bounds[c + 1]``) starts as rank ``c - 1``'s values, then ranks
``c - 2, c - 3, ..., c`` (modulo the world size) each combine their own value
``a`` with the partial result ``b`` they received, ``reduce(a, b)``:

* sum: the float32 sum ``a + b`` (the processor's binary32 add, as gloo's
  ``float16`` and c10's ``BFloat16`` ``operator+`` compute it), rounded to
  the wire format to nearest even when ``rne`` (bf16, fp16) with the
  arguments of :func:`fpemu._kernels.quantize_rne_ieee`;
* max: ``std::max(a, b)``, that is ``b if a < b else a``;
* min: ``std::min(a, b)``, that is ``b if b < a else a``.

A NaN compares false, so max and min keep whichever operand is ``a`` when
either is NaN: gloo's own rule, kept here.
"""

from __future__ import annotations

import numpy as np

from numba import prange

from ._jit import pjit
from ._kernels import _rne_ieee_one

SUM, MAX, MIN = range(3)


@pjit
def gloo_ring(V, out, bounds, op, rne, shift, normal_bits, overflow_bits, magic, ovf_mag,
              ovf_sign):
    """Fold the rows of ``V`` (ranks x elements, float32) into ``out``; the
    chunks are independent, one task each."""
    P = V.shape[0]
    half = np.uint32((1 << (shift - 1)) - 1)
    keep = ~np.uint32((1 << shift) - 1)
    one = np.uint32(1)
    sh = np.uint32(shift)
    for c in prange(P):
        lo = bounds[c]
        hi = bounds[c + 1]
        first = V[(c - 1) % P]
        for e in range(lo, hi):
            out[e] = first[e]
        for h in range(1, P):
            own = V[(c - 1 - h) % P]
            if op == SUM:
                if rne:
                    for e in range(lo, hi):
                        out[e] = _rne_ieee_one(np.float32(own[e] + out[e]), half, keep, one, sh,
                                               normal_bits, overflow_bits, magic, ovf_mag,
                                               ovf_sign)
                else:
                    for e in range(lo, hi):
                        out[e] = np.float32(own[e] + out[e])
            elif op == MAX:
                for e in range(lo, hi):
                    a = own[e]
                    b = out[e]
                    out[e] = b if a < b else a
            else:
                for e in range(lo, hi):
                    a = own[e]
                    b = out[e]
                    out[e] = b if b < a else a
