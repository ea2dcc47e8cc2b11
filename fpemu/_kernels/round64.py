"""Rounding of float64 input, in int64 lanes, and the float64 value of a code.

A finite float64 is ``sig * 2**(e - 52)`` with an integer significand ``sig <
2**53``; :func:`_round` rounds ``sig * 2**(e - in_m)`` at the format's quantum
as :mod:`fpemu._elemround` does for float32 input in int32 lanes (its module
note draws the bits), here in int64 lanes, which float64's significand
needs. :func:`fpemu.arith` and :mod:`fpemu.accumulate` round their exact
results with these functions too (``in_m`` is their significand's width).
"""

from __future__ import annotations

import numpy as np

from .._elemround import (FLUSH, FNUZ, NO_ZERO, OVF_INF, OVF_NAN, POLICY_MASK, RDN, RNA, RNE,
                          RTO, RTZ, RUP, UNSIGNED)
from .._jit import f64_bits, f64_from_bits, jit
from .draws import _random63


# ----------------------------------------------------------------- input split
#   float64:  s | eeeeeeeeeee | ffff...(52)...ffff
@jit
def _split_f64(x, flags):
    """(negative, e, sig, special, fraction != 0) of a float64.

    float64 subnormals lie far below every format's smallest value, so they
    are never normalised (``flags`` is unused: the float32 input path,
    :func:`fpemu._elemround.split`, normalises float32 subnormals under
    NORMALIZE).
    """
    b = f64_bits(x)
    ef = (b >> 52) & 0x7FF
    fr = b & 0xFFFFFFFFFFFFF
    sig = fr | (np.int64(ef != 0) << 52)
    return b < 0, max(ef, 1) - 1023, sig, ef == 0x7FF, fr != 0


# ---------------------------------------------------------------- the rounding
@jit
def _round(neg, e, sig, in_m, mode, p, key, index):
    """Round ``±sig * 2**(e - in_m)`` to the grid of ``p``.

    Returns ``(mag, ovf, ovf_to_inf)``: the magnitude code of the result
    unless ``ovf`` (it exceeds max), in which case IEEE 754 §7.4 sends it to
    infinity when ``ovf_to_inf`` and to max otherwise.
    """
    M = p[0]
    emin = p[1]
    emax = p[2]
    shift = (in_m - M) + max(emin - e, 0)
    s = min(shift, 62)  # sig < 2**53: any shift >= 54 drops everything
    one = np.int64(1)
    kept = sig >> s
    rem = sig & ((one << s) - 1)
    half = (one << s) >> 1
    inexact = rem != 0
    if mode == RNE:
        inc = (rem > half) | ((rem == half) & inexact & ((kept & 1) != 0))
    elif mode == RNA:
        inc = (rem >= half) & inexact
    elif mode == RTZ:
        inc = False
    elif mode == RUP:
        inc = inexact & (not neg)
    elif mode == RDN:
        inc = inexact & neg
    elif mode == RTO:
        inc = inexact & ((kept & 1) == 0)
    else:
        # Up with probability rem / 2**shift, read as a 63-bit threshold.
        up = rem << (63 - min(shift, 63))
        down = rem >> min(max(shift - 63, 0), 63)
        threshold = up if shift <= 63 else down
        inc = _random63(key, index, mode) < threshold
    kept = kept + np.int64(inc)
    q = min(max(e, emin), emax)
    mag = ((q + p[3] - 1) << M) + kept
    ovf = (e > emax) | (mag > p[4])
    # IEEE 754 §7.4: the directed modes overflow to infinity only outward.
    if mode == RTZ or mode == RTO:
        to_inf = False
    elif mode == RUP:
        to_inf = not neg
    elif mode == RDN:
        to_inf = neg
    else:
        to_inf = True
    return mag, ovf, ovf & to_inf


@jit
def _finish(neg, mag, ovf, ovf_to_inf, zero_in, special, nan_in, p, flags):
    """Apply overflow, the overflow policy, flushing and the sign rules.

    Returns ``(mag, negative, nan)``: the final magnitude code, whether the
    result carries a minus sign, and whether it is NaN.
    """
    maxmag = p[4]
    policy = flags & POLICY_MASK
    to_policy = ovf_to_inf | (special & (not nan_in))  # overflow to inf, or ±inf input
    mag = maxmag if ovf else mag
    if policy == OVF_INF:
        mag = p[5] if to_policy else mag
    else:
        mag = maxmag if to_policy else mag
    if flags & FLUSH:  # flush subnormal results (after rounding) to zero
        mag = 0 if mag < (np.int64(1) << p[0]) else mag
    if flags & NO_ZERO:  # below the smallest value gives the smallest
        mag = max(mag, 0)
    nan = special & nan_in
    if policy == OVF_NAN:
        nan = nan | to_policy
    if flags & UNSIGNED:  # zero and negative numbers are NaN
        nan = nan | neg | zero_in
    if flags & FNUZ:  # no -0
        negative = neg & (mag != 0)
    else:
        negative = neg
    return mag, negative, nan


@jit
def _mag_value(mag, negative, nan, p, flags):
    """The float64 value of magnitude code ``mag`` (and sign, NaN flag)."""
    M = p[0]
    field = mag >> M
    frac = mag & ((np.int64(1) << M) - 1)
    if flags & NO_ZERO:
        sig = frac | (np.int64(1) << M)
        ex = field - p[3] - M
    else:
        sig = frac | (np.int64(field != 0) << M)
        ex = max(field, 1) - p[3] - M
    v = np.float64(sig) * f64_from_bits((ex + 1023) << 52)
    v = np.inf if mag == p[5] else v
    v = -v if negative else v
    return np.nan if nan else v


@jit
def _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    """(magnitude code, negative, nan) of one input rounded to the format."""
    mag, ovf, ovf_inf = _round(neg, e, sig, in_m, mode, p, key, index)
    zero_in = (sig == 0) & (not special)
    return _finish(neg, mag, ovf, ovf_inf, zero_in, special, frac_nz, p, flags)


@jit
def _encode_one(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    mag, negative, nan = _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index)
    code = mag | (np.int64(negative) << p[7])
    return p[6] if nan else code


@jit
def _quantize_one(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index):
    mag, negative, nan = _rounded(neg, e, sig, special, frac_nz, in_m, mode, p, flags, key, index)
    return _mag_value(mag, negative, nan, p, flags)
