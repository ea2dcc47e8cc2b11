"""One rounding from the exact input, for inputs float64 cannot hold: decimal
text, Fraction, Decimal, Python ints above 2**53, 64-bit integer arrays and
longdouble arrays. The oracle (tests/oracle.py ``round_to_ieee``) rounds the
exact Fraction and shares no code with fpemu."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import fpemu
from oracle import MODES, round_to_ieee

IEEE = {"bf16": (8, 7), "fp16": (5, 10), "fp32": (8, 23)}


def _bits(v):
    return np.asarray(v, np.float32).view(np.uint32)


def _want(q, fmt, mode):
    return np.float32(round_to_ieee(Fraction(q), *IEEE[fmt], mode))


@given(num=st.integers(-2**90, 2**90).filter(bool), den=st.integers(1, 2**90),
       fmt=st.sampled_from(sorted(IEEE)), mode=st.sampled_from(MODES))
@example(num=2**8 + 1, den=2**8, fmt="bf16", mode="rne")           # a bf16 tie, exactly
@example(num=2**8 * 10**20 + 1, den=2**8 * 10**20, fmt="bf16", mode="rne")  # just past it
@example(num=2**53 + 1, den=1, fmt="fp32", mode="rup")
def test_fractions_round_once(num, den, fmt, mode):
    q = Fraction(num, den)
    got = fpemu.quantize(q, fmt, rounding=mode)
    assert _bits(got) == _bits(_want(q, fmt, mode)), (q, fmt, mode)


@given(digits=st.integers(1, 10**30), exp=st.integers(-70, 30), neg=st.booleans(),
       fmt=st.sampled_from(sorted(IEEE)), mode=st.sampled_from(MODES))
@example(digits=100390625000000000001, exp=-20, neg=False, fmt="bf16", mode="rne")
def test_decimal_text_rounds_once(digits, exp, neg, fmt, mode):
    text = f"{'-' if neg else ''}{digits}e{exp}"
    want = _want(Fraction(decimal.Decimal(text)), fmt, mode)
    assert _bits(fpemu.quantize(decimal.Decimal(text), fmt, rounding=mode)) == _bits(want)
    assert _bits(fpemu.explain(text, fmt, rounding=mode).value) == _bits(want)


def test_the_reported_cases():
    assert int(fpemu.encode(decimal.Decimal("1.00390625000000000001"), "bf16")) == 0x3F81
    assert int(fpemu.encode(Fraction(2**8 + 1, 2**8) + Fraction(1, 10**30), "bf16")) == 0x3F81
    assert float(fpemu.quantize(decimal.Decimal("1e-400"), "bf16", rounding="rup")) == 2.0**-133
    assert float(fpemu.quantize(decimal.Decimal("-1e-400"), "bf16", rounding="rup")) == 0.0
    assert np.signbit(fpemu.quantize(decimal.Decimal("-1e-400"), "bf16", rounding="rup"))
    bf16_max = float(fpemu.bf16.max)
    assert float(fpemu.quantize(decimal.Decimal("1e400"), "bf16", rounding="rtz")) == bf16_max
    assert float(fpemu.quantize(decimal.Decimal("1e400"), "bf16")) == np.inf
    assert float(fpemu.quantize(-(10**400), "fp16", rounding="rdn")) == -np.inf
    assert float(fpemu.quantize(-(10**400), "fp16", rounding="rup")) == -65504.0
    for z in ("-0", "-0.000"):
        assert np.signbit(fpemu.quantize(decimal.Decimal(z), "bf16"))


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_64_bit_integer_arrays(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    x = rng.integers(info.min, info.max, 4000, dtype=dtype, endpoint=True)
    x = np.concatenate([x, np.array([info.min, info.max, 0, 1, 2**53 + 1, 2**63 - 1,
                                     2**24 + 1], dtype=dtype)])
    for fmt in ("fp32", "bf16"):
        for mode in ("rne", "rtz", "rup", "rto"):
            got = fpemu.quantize(x, fmt, rounding=mode)
            want = np.array([_want(int(v), fmt, mode) if v else 0.0 for v in x], np.float32)
            assert np.array_equal(_bits(got), _bits(want)), (dtype, fmt, mode)


def test_big_and_empty_integers_are_accepted():
    assert float(fpemu.quantize(np.uint64(2**63), "bf16")) == 2.0**63
    assert float(fpemu.quantize(2**70, "fp32")) == 2.0**70
    assert float(fpemu.quantize(2**70 + 1, "fp32", rounding="rup")) == float(
        np.nextafter(np.float32(2.0**70), np.float32(np.inf)))
    assert fpemu.quantize([2**70, Fraction(1, 3), decimal.Decimal("0.1")], "bf16").shape == (3,)
    for dt in (np.int64, np.uint64, np.int8):
        out = fpemu.quantize(np.array([], dt), "bf16")
        assert out.shape == (0,) and out.dtype == np.float32


def test_longdouble_arrays():
    if np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("longdouble is float64 on this platform: nothing to round twice")
    one = np.longdouble(1)
    x = np.array([one + one / 2**8 + one / 2**60,       # just past a bf16 tie
                  one + one / 2**8,                      # the tie itself
                  one / 3, -one / 3, np.longdouble(2)**-140 * 3], np.longdouble)
    q = [one + one / 2**8 + one / 2**60, one + one / 2**8, Fraction(1, 3), Fraction(-1, 3),
         Fraction(3, 2**140)]
    for mode in ("rne", "rtz", "rup"):
        got = fpemu.quantize(x, "bf16", rounding=mode)
        want = [_want(v if isinstance(v, Fraction) else Fraction(*v.as_integer_ratio()),
                      "bf16", mode) for v in q]
        assert np.array_equal(_bits(got), _bits(want)), mode


# ------------------------------------------------------ next_up, next_down, ulp
def _fp32_neighbours(x):
    """Oracle: the fp32 neighbours of real x, from round_to_ieee and
    np.nextafter on float32 (no fpemu)."""
    f = np.float32(x)
    if float(f) == x:                  # compared in float64 (a Python float is weak in NumPy 2)
        return (float(np.nextafter(f, np.float32(-np.inf))),
                float(np.nextafter(f, np.float32(np.inf))))
    return round_to_ieee(Fraction(x), 8, 23, "rdn"), round_to_ieee(Fraction(x), 8, 23, "rup")


def test_fp32_neighbours_of_values_off_the_grid():
    assert float(fpemu.next_up(0.1, "fp32")) == 0.10000000149011612
    assert float(fpemu.next_down(0.1, "fp32")) == 0.09999999403953552
    rng = np.random.default_rng(3)
    xs = np.concatenate([[0.1, 1 / 3, -0.1, 1e-40, -1e-44, 3.0, 2.0**-149, 1e38, 3.4e38],
                         rng.standard_normal(60) * 10.0 ** rng.integers(-40, 38, 60)])
    for x in xs:
        lo, hi = _fp32_neighbours(float(x))
        assert float(fpemu.next_down(x, "fp32")) == lo, x
        assert float(fpemu.next_up(x, "fp32")) == hi, x


def test_ulp_is_exact_for_exact_inputs():
    # 2**53 + 1 lies in [2**53, 2**54): its fp32 ulp is 2**(53 - 23)
    assert float(fpemu.ulp(2**53 + 1, "fp32")) == 2.0**30
    # just below 2**-126 as a Fraction: a subnormal's ulp, 2**-149
    assert float(fpemu.ulp(Fraction(2**126 - 1, 2**252), "fp32")) == 2.0**-149
    for x in (0.1, 1 / 3, 2.0**-130, 1e38, 6e4):
        e = Fraction(x).numerator.bit_length() - Fraction(x).denominator.bit_length()
        if Fraction(2) ** e > Fraction(x):
            e -= 1                                      # floor(log2 x), exactly
        want = 2.0 ** (min(max(e, -126), 127) - 23)
        assert float(fpemu.ulp(x, "fp32")) == want, x
    assert float(fpemu.ulp(1e39, "fp16")) == 32.0      # past max: the top binade's spacing


def test_explain_lists_the_true_fp32_neighbours():
    e = fpemu.explain(0.1, "fp32")
    assert (e.below, e.above) == (0.09999999403953552, 0.10000000149011612)
    e = fpemu.explain("1.00390625000000000001", "bf16")
    assert (e.code, e.below, e.above) == (0x3F81, 1.0, 1.0078125)
    assert e.input == "1.00390625000000000001"
    assert "0.00390624999999999999 away against 0.00390625000000000001" in e.reason
    assert str(e).startswith("1.00390625000000000001 in bf16")
    e = fpemu.explain(decimal.Decimal("1e400"), "bf16", rounding="rtz")
    assert e.value == float(fpemu.bf16.max) and e.x == np.inf


def test_classify_of_a_scalar_is_a_0d_array_like_quantize():
    for x in (1.0, np.float64(1e-6), np.array(1e-9)):
        c = fpemu.classify(x, "fp16")
        assert isinstance(c, np.ndarray) and c.shape == () and c.dtype == np.dtype("<U9")
    assert fpemu.classify(np.array([[1.0], [1e-9]]), "fp16").tolist() == [["normal"], ["zero"]]


def test_fma64_is_the_exact_result_rounded_once():
    """fpemu._exact.fma64 against Fraction arithmetic (the oracle: exact
    rationals, Python's correctly rounded ``float(Fraction)``) on random
    operands over the whole exponent range, cancellations, halfway cases,
    subnormal results, overflow and the special values."""
    from fpemu._exact import fma64
    rng = np.random.default_rng(64)
    n = 20000
    cases = []
    e = rng.integers(-1070, 1020, (3, n))
    a, b, c = (rng.random((3, n)) + 1) * np.ldexp(1.0, e) * rng.choice([-1, 1], (3, n))
    cases.append((a, b, c))
    a, b = rng.standard_normal((2, n))
    cases.append((a, b, -(a * b) * (1 + rng.integers(-3, 4, n) * 2.0 ** -52)))   # cancellation
    a = (rng.integers(1, 2 ** 26, n) * 2 + 1).astype(float)                    # halfway ties
    cases.append((a, np.full(n, 2.0 ** 27 + 1), np.full(n, 2.0 ** 60)))
    a = rng.standard_normal(n) * 2.0 ** -540                                    # subnormal a*b
    cases.append((a, rng.standard_normal(n) * 2.0 ** -540, rng.standard_normal(n) * 2.0 ** -1070))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1.7976931348623157e308,
                        5e-324])
    g = np.meshgrid(special, special, special, indexing="ij")
    cases.append(tuple(v.reshape(-1) for v in g))
    for a, b, c in cases:
        got = fma64(a, b, c)
        want = np.empty_like(got)
        for i, (x, y, z) in enumerate(zip(a.tolist(), b.tolist(), c.tolist())):
            if all(math.isfinite(v) for v in (x, y, z)):
                q = Fraction(x) * Fraction(y) + Fraction(z)
                try:
                    if q != 0:
                        want[i] = float(q)
                    else:
                        # an exact 0 (IEEE 754 6.3): -0 only when a*b and c are
                        # both zeros of negative sign, else +0 to nearest
                        ab_neg = math.copysign(1, x) * math.copysign(1, y) < 0
                        both = (x == 0 or y == 0) and z == 0
                        want[i] = -0.0 if both and ab_neg and math.copysign(1, z) < 0 else 0.0
                except OverflowError:
                    want[i] = math.inf if q > 0 else -math.inf
            elif math.isfinite(x) and math.isfinite(y):
                want[i] = z                   # the exact product is finite: c decides
            else:                             # inf * 0 is NaN, inf * finite inf, then + c
                with np.errstate(all="ignore"):
                    want[i] = np.float64(x) * np.float64(y) + np.float64(z)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got[~nan].view(np.int64), want[~nan].view(np.int64))
