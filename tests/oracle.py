"""A table oracle for rounding to small formats. Shares no code with fpemu.

Everything is rebuilt here from a format's defining numbers (exponent bits,
mantissa bits, bias, where NaN and inf live): the list of all finite values,
then rounding by ``searchsorted`` between the two neighbours and the rules of
IEEE 754-2019 §4.3 (rounding) and §7.4 (overflow), written out plainly.
It is slow-ish but obviously right; it needs formats of at most ~20 bits.
"""

from __future__ import annotations

import dataclasses
import math

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


# The named formats, from their specifications (IEEE 754, OCP OFP8 v1.0,
# OCP MX v1.0, ml_dtypes' definitions of the fnuz and e4m3 / e3m4 types).
SPECS = {
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
}


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
        s = self.spec
        overflow = s.default_overflow if overflow is None else overflow
        x = np.asarray(x, dtype=np.float64)
        neg = np.signbit(x)
        a = np.abs(x)
        nan_in = np.isnan(x)
        inf_in = np.isinf(x)
        a_f = np.where(nan_in | inf_in, 0.0, a)

        ext, codes = self.ext_values, self.ext_codes
        i = np.searchsorted(ext, a_f, side="right") - 1  # ext[i] <= a
        below = (i < 0) & ~nan_in & ~inf_in  # only without zero: under the smallest value
        lo_i = np.clip(i, 0, ext.size - 1)
        exact = ext[lo_i] == a_f
        hi_i = np.where(exact | (i >= ext.size - 1), lo_i, lo_i + 1)
        past_grid = a_f > ext[-1]
        lo, hi = ext[lo_i], ext[hi_i]
        mid = (lo + hi) / 2
        # The last significand digit: with M = 0 it is the implicit 1 (odd),
        # except for zero, whose digit is 0 (even).
        hi_odd = (codes[hi_i] % 2 == 1) | ((s.M == 0) & (hi != 0))
        lo_odd = (codes[lo_i] % 2 == 1) | ((s.M == 0) & (lo != 0))
        hi_even = ~(hi_odd & ~lo_odd)  # a tie with no even side goes away from 0
        if mode == "rne":
            up = (a_f > mid) | ((a_f == mid) & hi_even)
        elif mode == "rna":
            up = a_f >= mid
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
            nan_out = nan_out | neg | (a == 0)
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
