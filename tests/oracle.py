"""A table oracle for rounding to small formats. Shares no code with fpemu.

Everything is rebuilt here from a format's defining numbers (exponent bits,
mantissa bits, bias, where NaN and inf live): the list of all finite values,
then rounding by ``searchsorted`` between the two neighbours and the rules of
IEEE 754-2019 §4.3 (rounding) and §7.4 (overflow), written out plainly.
It is slow-ish but obviously right; it needs formats of at most ~20 bits.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from fractions import Fraction

import numpy as np

MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A format as a test writer describes it, independently of fpemu."""

    name: str
    E: int
    M: int
    bias: int
    layout: str  # "ieee" | "fn" | "fnuz" | "none"
    signed: bool = True
    zero: bool = True  # exponent field 0 holds zero and subnormals
    default_overflow: str = "inf"
    nan: int | None = None  # the canonical NaN code, where a layout has several


class _Specs(dict):
    """The table below; a format it lacks is a KeyError that says where to add it."""

    def __missing__(self, name):
        raise KeyError(f"the test oracle has no Spec for format {name!r}: add one to SPECS in "
                       "tests/oracle.py, written from the format's specification (not from "
                       "fpemu.formats)")


# The named formats, from their specifications (IEEE 754, OCP OFP8 v1.0,
# OCP MX v1.0, ml_dtypes' definitions of the fnuz and e4m3 / e3m4 types).
# Every format of fpemu.formats.FORMATS has its line here: the oracle tests
# (tests/test_quantize.py, tests/test_properties.py, ...) run over this table,
# and tests/test_contributing.py fails for a named format it lacks.
SPECS = _Specs({
    "fp32": Spec("fp32", 8, 23, 127, "ieee"),
    "tf32": Spec("tf32", 8, 10, 127, "ieee"),
    "fp16": Spec("fp16", 5, 10, 15, "ieee"),
    "bf16": Spec("bf16", 8, 7, 127, "ieee"),
    "e4m3fn": Spec("e4m3fn", 4, 3, 7, "fn", default_overflow="saturate"),
    "e5m2": Spec("e5m2", 5, 2, 15, "ieee", nan=0x7F),  # as PyTorch's cast
    "e4m3fnuz": Spec("e4m3fnuz", 4, 3, 8, "fnuz", default_overflow="nan"),
    "e5m2fnuz": Spec("e5m2fnuz", 5, 2, 16, "fnuz", default_overflow="nan"),
    "e4m3": Spec("e4m3", 4, 3, 7, "ieee"),
    "e3m4": Spec("e3m4", 3, 4, 3, "ieee"),
    "e2m3": Spec("e2m3", 2, 3, 1, "none", default_overflow="saturate"),
    "e3m2": Spec("e3m2", 3, 2, 3, "none", default_overflow="saturate"),
    "e2m1": Spec("e2m1", 2, 1, 1, "none", default_overflow="saturate"),
    "e8m0": Spec("e8m0", 8, 0, 127, "fn", signed=False, zero=False, default_overflow="nan"),
})


class TableOracle:
    """Round float64 values to a format by looking them up in its value table."""

    def __init__(self, spec: Spec):
        self.spec = s = spec
        nmag = 2 ** (s.E + s.M)
        mags = np.arange(nmag, dtype=np.int64)
        field = mags >> s.M
        frac = mags & (2**s.M - 1)
        if s.zero:
            sig = np.where(field == 0, frac, frac + 2**s.M)
            exp = np.maximum(field, 1) - s.bias - s.M
        else:
            sig = frac + 2**s.M
            exp = field - s.bias - s.M
        vals = sig * np.exp2(exp.astype(np.float64))
        if s.layout == "ieee":
            finite = field < 2**s.E - 1
        elif s.layout == "fn":
            finite = mags < nmag - 1
        else:
            finite = np.ones(nmag, bool)
        self.codes = mags[finite]
        self.values = vals[finite]
        assert np.all(np.diff(self.values) > 0)
        self.max = self.values[-1]
        self.max_code = int(self.codes[-1])
        self.min_normal = 2.0 ** ((1 if s.zero else 0) - s.bias)
        # The grid with an unbounded exponent continues past max by one step.
        top_step = 2.0 ** (math.floor(math.log2(self.max)) - s.M)
        self.ext_values = np.append(self.values, self.max + top_step)
        self.ext_codes = np.append(self.codes, self.max_code + 1)
        self.sign_bit = nmag if s.signed else 0
        self.inf_code = ((2**s.E - 1) << s.M) if s.layout == "ieee" else None
        self.nan_code = {
            "ieee": ((2**s.E - 1) << s.M) | (1 << (s.M - 1)) if s.M else None,
            "fn": nmag - 1,
            "fnuz": nmag,
            "none": None,
        }[s.layout]
        if s.nan is not None:
            self.nan_code = s.nan

    # ------------------------------------------------------------------ values
    def all_values(self):
        """Every finite value, both signs, sorted, float64 (-0 included once)."""
        pos = self.values
        if not self.spec.signed:
            return pos
        neg = -pos[::-1]
        if self.spec.zero:
            neg = neg[:-1]  # the zero
        return np.concatenate([neg, pos])

    def midpoints(self):
        """Midpoints between neighbours, both signs, plus the one past max."""
        ext = self.ext_values
        mid = (ext[1:] + ext[:-1]) / 2  # exact: one bit more than the format
        if self.spec.signed:
            mid = np.concatenate([-mid[::-1], mid])
        return mid

    # --------------------------------------------------------------- rounding
    def round(self, x, mode="rne", subnormals=True, overflow=None):
        """Expected codes (int64 array) for float64 inputs x."""
        x = np.asarray(x, dtype=np.float64)
        nan_in = np.isnan(x)
        inf_in = np.isinf(x)
        a_f = np.where(nan_in | inf_in, 0.0, np.abs(x))
        ext = self.ext_values
        i = np.searchsorted(ext, a_f, side="right") - 1  # ext[i] <= a
        lo_i = np.clip(i, 0, ext.size - 1)
        hi_i = np.minimum(lo_i + 1, ext.size - 1)
        mid = (ext[lo_i] + ext[hi_i]) / 2
        pos = dict(i=i, exact=ext[lo_i] == a_f, above_mid=a_f > mid, at_mid=a_f == mid,
                   past_grid=a_f > ext[-1], zero=a_f == 0)
        return self._decide(np.signbit(x), nan_in, inf_in, pos, mode, subnormals, overflow)

    def round_exact(self, q, mode="rne", subnormals=True, overflow=None):
        """Expected codes for exact results (see :meth:`positions_exact`)."""
        return self._decide(*self.positions_exact(q), mode, subnormals, overflow)

    def positions_exact(self, q):
        """Where exact results lie on the grid: ``q`` holds Fractions (or
        objects comparable with floats exactly, such as :class:`Sqrt`), and
        floats for ±0, ±inf and NaN. Python compares a Fraction with a float
        exactly, so no comparison here rounds."""
        ext = self.__dict__.get("_ext_list")
        if ext is None:                  # a Python list for bisect, made once per oracle
            ext = self._ext_list = [float(v) for v in self.ext_values]
        n = len(ext)
        # the midpoint above each grid value, as a Fraction (each made once)
        mids = {}
        neg, nan_in, inf_in = [], [], []
        cols = {k: [] for k in ("i", "exact", "above_mid", "at_mid", "past_grid", "zero")}
        for v in q:
            if isinstance(v, float):
                neg.append(math.copysign(1.0, v) < 0)
                nan_in.append(math.isnan(v))
                inf_in.append(math.isinf(v))
                a = 0.0 if (math.isnan(v) or math.isinf(v)) else abs(v)
            else:
                neg.append(v < 0)
                nan_in.append(False)
                inf_in.append(False)
                a = abs(v)
            i = bisect.bisect_right(ext, float(a)) - 1  # a guess: float(a) may be rounded
            while i >= 0 and ext[i] > a:
                i -= 1
            while i + 1 < n and ext[i + 1] <= a:
                i += 1
            j = max(i, 0)
            lo = ext[j]
            mid = mids.get(j)
            if mid is None:
                mid = mids[j] = (Fraction(lo) + Fraction(ext[min(j + 1, n - 1)])) / 2
            cols["i"].append(i)
            cols["exact"].append(lo == a)
            cols["above_mid"].append(a > mid)
            cols["at_mid"].append(a == mid)
            cols["past_grid"].append(a > ext[-1])
            cols["zero"].append(a == 0)
        pos = {k: np.array(v, dtype=np.int64 if k == "i" else bool) for k, v in cols.items()}
        return np.array(neg, bool), np.array(nan_in, bool), np.array(inf_in, bool), pos

    def _decide(self, neg, nan_in, inf_in, pos, mode, subnormals, overflow):
        """Codes from where each |value| lies on the grid (IEEE 754 §4.3, §7.4)."""
        s = self.spec
        overflow = s.default_overflow if overflow is None else overflow
        ext, codes = self.ext_values, self.ext_codes
        i = pos["i"]
        special = nan_in | inf_in
        below = (i < 0) & ~special  # only without zero: under the smallest value
        lo_i = np.clip(i, 0, ext.size - 1)
        exact = pos["exact"] & ~special | special
        hi_i = np.where(exact | (i >= ext.size - 1), lo_i, lo_i + 1)
        past_grid = pos["past_grid"] & ~special
        lo, hi = ext[lo_i], ext[hi_i]
        # The last significand digit: with M = 0 it is the implicit 1 (odd),
        # except for zero, whose digit is 0 (even).
        hi_odd = (codes[hi_i] % 2 == 1) | ((s.M == 0) & (hi != 0))
        lo_odd = (codes[lo_i] % 2 == 1) | ((s.M == 0) & (lo != 0))
        hi_even = ~(hi_odd & ~lo_odd)  # a tie with no even side goes away from 0
        if mode == "rne":
            up = pos["above_mid"] | (pos["at_mid"] & hi_even)
        elif mode == "rna":
            up = pos["above_mid"] | pos["at_mid"]
        elif mode == "rtz":
            up = np.zeros_like(exact)
        elif mode == "rup":
            up = ~neg
        elif mode == "rdn":
            up = neg
        elif mode == "rto":
            up = hi_odd & ~lo_odd  # both odd (M = 0): toward zero
        else:
            raise ValueError(mode)
        up = up & ~exact
        r_i = np.where(up, hi_i, lo_i)
        mag = codes[r_i]
        ovf = past_grid | (mag > self.max_code)

        # IEEE 754 §7.4: where an overflow goes, per mode.
        to_inf = {
            "rne": np.ones_like(neg), "rna": np.ones_like(neg),
            "rtz": np.zeros_like(neg), "rto": np.zeros_like(neg),
            "rup": ~neg, "rdn": neg,
        }[mode]
        pol_code = {"inf": self.inf_code, "saturate": self.max_code,
                    "nan": None}[overflow]
        mag = np.where(ovf, self.max_code, mag)
        goes_policy = (ovf & to_inf) | inf_in
        if pol_code is not None:
            mag = np.where(goes_policy, pol_code, mag)
        nan_out = nan_in | (goes_policy & (overflow == "nan"))

        if not subnormals and s.zero:  # flush after rounding
            mag = np.where((mag > 0) & (mag < 2**s.M), 0, mag)
        if not s.zero:
            mag = np.where(below, 0, mag)  # the smallest value (ml_dtypes' choice)
        if s.signed:
            neg_out = neg & ~((s.layout == "fnuz") & (mag == 0))
            code = mag | np.where(neg_out, self.sign_bit, 0)
        else:
            code = mag
            nan_out = nan_out | neg | (pos["zero"] & ~special)
        if self.nan_code is not None:
            code = np.where(nan_out, self.nan_code, code)
        else:
            assert not nan_out.any(), "NaN into a format without NaN"
        return code.astype(np.int64)

    def value_of(self, codes):
        """float64 value of codes (NaN for NaN codes, ±inf for inf codes)."""
        codes = np.asarray(codes, dtype=np.int64)
        s = self.spec
        mag = codes & (self.sign_bit - 1) if s.signed else codes
        neg = (codes & self.sign_bit) != 0 if s.signed else np.zeros(codes.shape, bool)
        table = np.full(2 ** (s.E + s.M), np.nan)
        table[self.codes] = self.values
        v = table[mag]
        if self.inf_code is not None:
            v = np.where(mag == self.inf_code, np.inf, v)
        v = np.where(neg, -v, v)
        if self.nan_code is not None:
            v = np.where(codes == self.nan_code, np.nan, v)
        if s.layout == "fnuz":
            v = np.where(codes == self.sign_bit, np.nan, v)
        return v


class Sqrt:
    """The exact square root of a nonnegative Fraction, compared exactly
    (for v >= 0: v <= sqrt(a) if and only if v * v <= a)."""

    def __init__(self, a):
        self.a = Fraction(a)
        assert self.a >= 0

    def __abs__(self):
        return self

    def __float__(self):
        return math.sqrt(self.a)

    def _cmp(self, other):
        o = Fraction(other)
        if o < 0:
            return 1
        sq = o * o
        return (self.a > sq) - (self.a < sq)

    def __lt__(self, other):
        return self._cmp(other) < 0

    def __le__(self, other):
        return self._cmp(other) <= 0

    def __gt__(self, other):
        return self._cmp(other) > 0

    def __ge__(self, other):
        return self._cmp(other) >= 0

    def __eq__(self, other):
        return self._cmp(other) == 0

    __hash__ = None


def _cmp(q, v):
    """Sign of q - v for a Fraction or Sqrt q and a Fraction v >= 0."""
    if isinstance(q, Sqrt):  # sqrt(a) vs v  <=>  a vs v * v
        return (q.a > v * v) - (q.a < v * v)
    return (q > v) - (q < v)


def round_to_ieee(q, E, M, mode="rne"):
    """Round an exact result to an IEEE 754 binary format with E exponent and
    M fraction bits (overflow to inf per §7.4); returns a float. Table-free,
    for formats too wide to list (fp32). ``q`` is a Fraction, a
    :class:`Sqrt`, or a float special (±0, ±inf, NaN)."""
    if isinstance(q, float) and (q == 0 or math.isnan(q) or math.isinf(q)):
        return q
    if not isinstance(q, Sqrt):
        q = Fraction(q)
    neg = q < 0
    a = abs(q)
    bias = 2 ** (E - 1) - 1
    emin, emax = 1 - bias, bias
    e = int(math.floor(math.log2(float(a))))  # a guess, then made exact
    while _cmp(a, Fraction(2) ** e) < 0:
        e -= 1
    while _cmp(a, Fraction(2) ** (e + 1)) >= 0:
        e += 1
    quantum = Fraction(2) ** (max(e, emin) - M)
    k = math.floor(float(a) / quantum)  # a guess, then made exact: k*quantum <= a
    while _cmp(a, k * quantum) < 0:
        k -= 1
    while _cmp(a, (k + 1) * quantum) >= 0:
        k += 1
    at_k = _cmp(a, k * quantum) == 0
    vs_mid = _cmp(a, (k + Fraction(1, 2)) * quantum)
    if at_k:
        up = False
    elif mode == "rne":
        up = vs_mid > 0 or (vs_mid == 0 and k % 2 == 1)
    elif mode == "rna":
        up = vs_mid >= 0
    elif mode == "rtz":
        up = False
    elif mode == "rup":
        up = not neg
    elif mode == "rdn":
        up = neg
    elif mode == "rto":
        up = k % 2 == 0
    else:
        raise ValueError(mode)
    v = (k + up) * quantum
    largest = (2 - Fraction(2) ** -M) * Fraction(2) ** emax
    if v > largest:
        to_inf = {"rne": True, "rna": True, "rtz": False, "rto": False,
                  "rup": not neg, "rdn": neg}[mode]
        v = math.inf if to_inf else largest
    v = float(v)  # exact: v is on the binary64 grid
    return -v if neg else v
