"""Inputs and exact helpers shared by the block-format tests (no torch)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

#: e2m1's sixteen codes, as TransformerEngine's table lists them.
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def spread(shape, seed, lo=-30, hi=30):
    """float32 values whose rows span many binades, with planted edge blocks."""
    rng = np.random.default_rng(seed)
    rows = (shape[0],) + (1,) * (len(shape) - 1)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(lo, hi, rows))
    x *= np.exp2(rng.integers(-3, 4, shape))
    return x.astype(np.float32)


def rceil_of_fp32_quotient(amax, elem_max):
    """ceil(log2(fp32(amax / elem_max))) with exact rationals."""
    d = Fraction(float(np.float32(amax) / np.float32(elem_max)))
    e = d.numerator.bit_length() - d.denominator.bit_length()
    while Fraction(2) ** e < d:
        e += 1
    while Fraction(2) ** (e - 1) >= d:
        e -= 1
    return max(-127, min(127, e))
