"""Compare a replayed array with a recorded one, in the storage format's bits.

Every recorded array carries the dtype it had in PyTorch. Two values are the
same when their codes in that dtype are the same, so +0 and -0 differ; two NaNs
are the same whatever their sign and payload, which PyTorch leaves to the code
path (``docs/pytorch-numerics.md`` §1.4). A difference is measured in ulps of the
storage dtype: the distance between the two codes on the number line.

Each array is judged by a :class:`Tier`:

* ``exact``: every code must match ("bit-exact" or "failed");
* ``ulps``: codes may differ by at most ``n`` ulps of the storage dtype;
* ``rel``: ``|a - b| <= r * |b|`` elementwise (NaN and inf must match);
* ``abs``: ``|a - b| <= d`` elementwise (NaN and inf must match);
* ``none``: recorded and reported, never judged: for a PyTorch behaviour fpemu
  deliberately does not reproduce (a bug in PyTorch), named in the reason.

A tolerance tier always carries its reason. An array inside a tolerance tier
that happens to match every bit is still reported "bit-exact".
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..formats import format as _format
from ._env import LOW_PRECISION

BIT_EXACT = "bit-exact"
WITHIN = "within tolerance"
FAILED = "failed"
NOT_COMPARED = "not compared"


@dataclasses.dataclass(frozen=True)
class Tier:
    """How closely a replayed array must follow the recording."""

    kind: str = "exact"
    bound: float = 0.0
    reason: str = ""

    def __post_init__(self):
        if self.kind not in ("exact", "ulps", "rel", "abs", "none"):
            raise ValueError(f"Tier kind must be 'exact', 'ulps', 'rel', 'abs' or 'none', "
                             f"got {self.kind!r}")
        if self.kind != "exact" and not self.reason:
            raise ValueError("a tolerance tier needs its reason: Tier('ulps', 2, reason=...)")

    def describe(self):
        if self.kind == "exact":
            return "bit-exact"
        if self.kind == "none":
            return "not judged"
        unit = {"ulps": " ulp", "rel": " relative", "abs": " absolute"}[self.kind]
        return f"≤ {self.bound:g}{unit}"


EXACT = Tier()


@dataclasses.dataclass
class Comparison:
    """The outcome for one array."""

    name: str
    dtype: str
    tier: Tier
    status: str
    n: int
    n_diff: int
    max_ulps: float
    max_rel: float
    note: str = ""

    def line(self):
        worst = f"max {self.max_ulps:g} ulp" if self.n_diff else ""
        if self.n_diff and self.tier.kind in ("rel", "abs"):
            worst += f", max rel {self.max_rel:.3g}"
        return (f"{self.name:<22} {self.dtype:<15} {self.tier.describe():<18} "
                f"{self.status:<17} {self.n_diff:>7}/{self.n:<7} {worst} {self.note}").rstrip()


def _ordered(a, dtype):
    """Codes of ``a`` (values of ``dtype``) as signed ints along the number
    line (+0 and -0 both 0), the sign bits, and a NaN mask."""
    a = np.asarray(a)
    nan = np.isnan(a) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
    if dtype in ("int64", "int32", "bool") or a.dtype.kind in "iub":
        v = a.astype(np.int64)
        return v, np.zeros(a.shape, bool), nan
    if dtype == "float64":
        bits = np.asarray(a, np.float64).view(np.int64)
        mag = bits & np.int64(0x7FFFFFFFFFFFFFFF)
        neg = bits < 0
    elif dtype == "float32":
        bits = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
        mag = bits & 0x7FFFFFFF
        neg = bits < 0
    elif dtype in LOW_PRECISION:
        from ..quantize import encode  # needs Numba; recording runs without it
        fmt = _format(dtype)
        x = np.where(nan, 0, np.asarray(a, np.float32)).astype(np.float32)
        codes = encode(x, fmt).astype(np.int64)
        back = np.asarray(_decode_exact(codes, fmt))
        if not np.array_equal(back.view(np.int32), x.view(np.int32)):
            raise ValueError(f"recorded values are not all {dtype} values: the trace is "
                             f"corrupt or was widened wrongly")
        sign = 1 << (fmt.bits - 1)
        mag = codes & (sign - 1)
        neg = (codes & sign) != 0
    else:
        raise ValueError(f"no comparison for dtype {dtype!r}")
    return np.where(neg, -mag, mag), neg & ~nan, nan


def _decode_exact(codes, fmt):
    from ..quantize import decode  # needs Numba; recording runs without it
    return np.asarray(decode(codes.astype(np.uint32 if fmt.bits > 16 else
                                          (np.uint16 if fmt.bits > 8 else np.uint8)), fmt),
                      np.float32)


def compare(name, replayed, recorded, dtype, tier=EXACT):
    """Judge one array; returns a :class:`Comparison`."""
    a, b = np.asarray(replayed), np.asarray(recorded)
    if a.shape != b.shape:
        return Comparison(name, dtype, tier, FAILED, b.size, b.size, np.inf, np.inf,
                          f"shape {a.shape} replayed, {b.shape} recorded")
    oa, sa, na = _ordered(a, dtype)
    ob, sb, nb = _ordered(b, dtype)
    both_nan = na & nb
    diff = (na != nb) | (~both_nan & ((oa != ob) | (sa != sb)))
    n_diff = int(diff.sum())
    ulps = np.where(both_nan | (na != nb), 0, np.abs(oa - ob))
    max_ulps = float(np.max(ulps, initial=0)) if n_diff else 0.0
    if np.any(na != nb):
        max_ulps = np.inf
    with np.errstate(all="ignore"):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        fin = np.isfinite(fa) & np.isfinite(fb)
        err = np.where(fin, np.abs(fa - fb), 0.0)
        rel = np.where(fin & (fb != 0), err / np.abs(fb), np.where(err > 0, np.inf, 0.0))
    max_rel = float(np.max(rel, initial=0.0))
    if n_diff == 0:
        status = BIT_EXACT
    elif tier.kind == "none":
        status = NOT_COMPARED
    elif tier.kind == "exact":
        status = FAILED
    else:
        special = (na != nb) | ((np.isinf(fa) | np.isinf(fb)) & (fa != fb))
        if np.any(special):
            ok = False
        elif tier.kind == "ulps":
            ok = max_ulps <= tier.bound
        elif tier.kind == "rel":
            ok = bool(np.all(err <= tier.bound * np.abs(fb)))
        else:
            ok = bool(np.all(err <= tier.bound))
        status = WITHIN if ok else FAILED
    note = ""
    if n_diff and np.any(na != nb):
        note = f"NaN in {int((na & ~nb).sum())} replayed / {int((nb & ~na).sum())} recorded only"
    return Comparison(name, dtype, tier, status, int(b.size), n_diff, max_ulps, max_rel, note)
