"""Rounding modes and overflow policies.

Both are small integer enums (the kernels receive the integer), parsed from
the strings the public functions accept.
"""

from __future__ import annotations

import enum

from .errors import FpemuValueError


class Rounding(enum.IntEnum):
    """How a value between two neighbours of a format picks one of them."""

    RNE = 0  #: to nearest, ties to even (IEEE 754 roundTiesToEven; the default)
    RNA = 1  #: to nearest, ties away from zero (IEEE 754 roundTiesToAway)
    RTZ = 2  #: toward zero (truncation)
    RUP = 3  #: toward +infinity
    RDN = 4  #: toward -infinity
    RTO = 5  #: to odd: exact values stay, others take the neighbour with an odd last bit
    SR = 6  #: stochastic: up with probability equal to the distance from the lower neighbour


class Overflow(enum.IntEnum):
    """What a result that overflows to infinity (IEEE 754 §7.4) becomes."""

    INF = 0  #: keep the infinity (the format must have one)
    SATURATE = 1  #: the largest finite value of the same sign
    NAN = 2  #: the format's NaN (the format must have one)


ROUNDING_NAMES = tuple(m.name.lower() for m in Rounding)
OVERFLOW_NAMES = tuple(m.name.lower() for m in Overflow)


def _parse(enum_type, value, what, expected):
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str) and value.lower() in expected:
        return enum_type[value.upper()]
    raise FpemuValueError(f"unknown {what} {value!r}; expected {', '.join(expected)}")


def parse_rounding(rounding) -> Rounding:
    """Return the :class:`Rounding` for a name such as ``"rne"`` or a member."""
    return _parse(Rounding, rounding, "rounding mode", ROUNDING_NAMES)


#: The generators of stochastic rounding (``rng=``): ``"splitmix64"`` (the
#: default, fpemu's stream since its first release: earlier results
#: reproduce) and ``"philox"`` (Philox4x32-10, the counter-based generator of
#: cuRAND and of PyTorch on CUDA). Both give element ``i`` bits that depend on
#: (seed, offset + i) only, computed where the data lies (Numba, torch,
#: Triton): see docs/numeric-contract.md.
RNGS = ("splitmix64", "philox")
DEFAULT_RNG = "splitmix64"


def parse_rng(rng) -> str:
    """The generator name of ``rng=`` (None: :data:`DEFAULT_RNG`)."""
    if rng is None:
        return DEFAULT_RNG
    if isinstance(rng, str) and rng.lower() in RNGS:
        return rng.lower()
    raise FpemuValueError(f"unknown stochastic-rounding generator rng={rng!r}; expected "
                          f"{' or '.join(repr(r) for r in RNGS)} (or None: {DEFAULT_RNG!r})")


def parse_overflow(overflow) -> Overflow:
    """Return the :class:`Overflow` for ``"inf"``, ``"saturate"`` or ``"nan"``."""
    return _parse(Overflow, overflow, "overflow policy",
                  OVERFLOW_NAMES)
