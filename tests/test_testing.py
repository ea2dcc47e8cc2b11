"""fpemu.testing: the strategies reach every kind they claim, the assertion
catches seeded wrong conversions and names the rule each breaks, correct
conversions (torch's bf16 cast, ml_dtypes' e4m3fn) pass, the sweeps and the
pytest plugin work.

Oracles: the kinds of a drawn value are decided here with Fractions from
the format's published parameters (not by the strategies' code); the wrong
conversions are written here on the float32 bits, or are ml_dtypes' and
torch's casts with one rule changed.
"""

import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as hst

import fpemu
from fpemu.errors import FpemuTypeError, FpemuValueError
from fpemu.formats import FORMATS, Format
from fpemu.testing import assert_quantized_equal, exhaustive, strategies

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

CUSTOM = (Format.custom(3, 3, nan_encoding="none", name="e3m3"),
          Format.custom(4, 3, bias=11, nan_encoding="fnuz"),
          Format.custom(5, 4, has_subnormals=False, name="e5m4nosub"),
          Format.custom(6, 9, name="e6m9"))


# ------------------------------------------------------------------ coverage
def _kinds(v, f, dt):
    """Every kind the float ``v`` (of dtype ``dt``) is, decided from the
    format's parameters with exact arithmetic."""
    out = set()
    if np.isnan(v):
        return {"nan"}
    if np.isinf(v):
        return {"inf"}
    a = Fraction(abs(float(v)))
    M, emin, top = f.mantissa_bits, f.emin, Fraction(f.max)
    if a == 0:
        out.add("zero")
    else:
        m, e = np.frexp(float(a))
        if m == 0.5:
            out.add("power_of_two")
        e = int(e) - 1                                     # a in [2**e, 2**(e + 1))
        step = Fraction(2) ** (max(e, emin) - M)
        on_grid = (a / step).denominator == 1 and a <= top
        if a == top:
            out.add("max")
        if on_grid:
            out.add("subnormal" if a < Fraction(2) ** emin else "normal")
        elif (2 * a / step).denominator == 1 and a < top and (
                a > step or not f.has_subnormals or e >= emin):
            out.add("midpoint")
    ulp = Fraction(2) ** (f.emax - M)
    near = {}
    for t, kind in ((top + ulp / 2, "overflow_threshold"), (top + ulp, "overflow_threshold"),
                    (Fraction(f.min_subnormal) / 2, "flush_threshold")):
        with np.errstate(over="ignore"):                  # fp32's threshold: inf in float32
            c = np.array(float(t), dt)
            pts = {float(np.nextafter(c, dt.type(-np.inf))), float(c),
                   float(np.nextafter(c, dt.type(np.inf)))}
        near.setdefault(kind, set()).update(pts)
    for kind, pts in near.items():
        if float(a) in pts and not (kind == "flush_threshold" and not f.has_zero):
            out.add(kind)
    for d in (-np.inf, np.inf):
        with np.errstate(over="ignore"):
            w = np.nextafter(np.array(abs(float(v)), dt), dt.type(d))
        if "midpoint" in _kinds_mid_only(float(w), f):
            out.add("near_midpoint")
    return out


def _kinds_mid_only(w, f):
    if w == 0 or not np.isfinite(w):
        return set()
    a = Fraction(w)
    e = int(np.frexp(w)[1]) - 1
    step = Fraction(2) ** (max(e, f.emin) - f.mantissa_bits)
    if (a / step).denominator != 1 and (2 * a / step).denominator == 1 and a < Fraction(f.max):
        return {"midpoint"}
    return set()


def test_every_kind_appears_in_at_least_one_percent_of_the_draws():
    """1,000 examples, each drawing one value of every named format and of
    four custom ones: every kind each format claims is in at least 1% of
    its 1,000 draws, and every draw is of a claimed kind."""
    dt = np.dtype(np.float32)
    fmts = list(FORMATS) + list(CUSTOM)
    seen = {f.name: [] for f in fmts}

    @settings(max_examples=1000, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(hst.tuples(*(strategies.values(f) for f in fmts)))
    def draw(xs):
        for f, x in zip(fmts, xs):
            assert x.shape == () and x.dtype == np.float32
            seen[f.name].append(float(x))

    draw()
    short = {}
    for f in fmts:
        claimed = set(strategies.kinds_of(f))
        counts = {k: 0 for k in claimed}
        for v in seen[f.name]:
            ks = _kinds(np.float32(v), f, dt)
            assert ks & claimed, (f.name, v, ks)              # every draw is of a claimed kind
            for k in ks & claimed:
                counts[k] += 1
        low = {k: n for k, n in counts.items() if n < 0.01 * len(seen[f.name])}
        if low or len(seen[f.name]) < 1000:
            short[f.name] = (len(seen[f.name]), counts)
    assert not short, short


def test_edge_inputs_hold_every_value_of_every_kind_and_nothing_else():
    """Every value edge_inputs gives is of a claimed kind (the Fraction
    oracle above), every claimed kind is there, both signs of each, and for
    the formats of at most 8 bits every positive value of the format (read
    off fpemu.decode of every code, not the strategies' grid) is among them."""
    dt = np.dtype(np.float32)
    for f in [fpemu.format(n) for n in ("bf16", "fp16", "e4m3fn", "e5m2", "e4m3fnuz", "e2m1",
                                        "e8m0", "e3m2")] + list(CUSTOM):
        # all of them for the narrow formats; bf16's and fp16's kinds of thousands of
        # values spread over 1,024 (the exact oracle takes ~0.1 ms a value)
        x = strategies.edge_inputs(f, per_kind=None if f.bits <= 12 else 1024)
        assert x.dtype == np.float32 and x.ndim == 1
        claimed, seen = set(strategies.kinds_of(f)), set()
        for v in np.unique(x):
            ks = _kinds(v, f, dt)
            assert ks & claimed, (f.name, float(v), ks)
            seen |= ks & claimed
        nans = x[np.isnan(x)]
        assert seen | ({"nan"} if nans.size else set()) == claimed, (f.name, claimed - seen)
        if f.signed:                              # every value has its negative
            finite = x[~np.isnan(x)]
            assert np.array_equal(np.sort(-finite), np.sort(finite)), f.name
            assert np.signbit(nans).sum() * 2 == nans.size
        else:
            assert not np.signbit(x).any()
        if f.bits <= 8:
            codes = np.arange(1 << f.bits, dtype=np.uint64).astype(f.code_dtype)
            with np.errstate(invalid="ignore"):
                values = fpemu.decode(codes, f)
            pos = values[np.isfinite(values) & (values > 0)]
            assert np.isin(pos, x).all(), f.name


def test_edge_inputs_per_kind_spreads_a_large_kind_and_keeps_its_ends():
    x = strategies.edge_inputs("fp32", kinds="normal", per_kind=1000)
    pos = x[x > 0]
    assert pos.size <= 1000 and pos.size > 990
    assert pos.min() == np.finfo(np.float32).tiny and pos.max() == np.finfo(np.float32).max
    assert np.all(np.diff(pos) > 0)               # spread through the kind, in order
    assert strategies.edge_inputs("bf16", kinds="normal").size == 2 * 254 * 128
    assert strategies.edge_inputs("e4m3fn", kinds=("max",)).tolist() == [448.0, -448.0]
    x16 = strategies.edge_inputs("e4m3fn", kinds="midpoint", dtype=np.float16)
    assert x16.dtype == np.float16 and x16.size > 0
    for bad in (1, 0, 2.5, "all"):
        with pytest.raises(FpemuValueError, match="per_kind must be an int >= 2"):
            strategies.edge_inputs("bf16", per_kind=bad)
    with pytest.raises(FpemuValueError, match="has no input of kind"):
        strategies.edge_inputs("fp32", kinds="midpoint")


def test_arrays_kinds_dtypes_and_formats():
    @settings(max_examples=50, database=None, deadline=None)
    @given(strategies.arrays("e4m3fn", (3, 4), kinds=["midpoint", "max"], dtype=np.float64),
           strategies.formats())
    def draw(a, f):
        assert a.shape == (3, 4) and a.dtype == np.float64
        mids = [_kinds(v, fpemu.format("e4m3fn"), np.dtype(np.float64)) for v in a.ravel()]
        assert all(k & {"midpoint", "max"} for k in mids)
        assert isinstance(f, Format)

    draw()
    assert "midpoint" not in strategies.kinds_of("fp32")       # float32 cannot hold them
    assert "midpoint" in strategies.kinds_of("fp32", np.float64)
    assert "nan" not in strategies.kinds_of("e2m1") and "zero" not in strategies.kinds_of("e8m0")


def test_strategies_bad_input_names_the_fix():
    with pytest.raises(FpemuValueError, match="unknown kinds.*'middle'"):
        strategies.values("bf16", kinds=["middle"])
    with pytest.raises(FpemuValueError, match="no input of kind midpoint.*wider dtype"):
        strategies.values("fp32", kinds=["midpoint"])
    with pytest.raises(FpemuValueError, match="dtype must be one of"):
        strategies.values("bf16", dtype=np.int32)
    with pytest.raises(FpemuTypeError, match="format name"):
        strategies.values(3.5)
    with pytest.raises(FpemuValueError, match="negative"):
        strategies.arrays("bf16", (2, -1))


# ------------------------------------------------------------- mutation test
def _f32_bits(x):
    return np.array(x, np.float32).view(np.uint32)     # (0-d stays 0-d)


def _bf16_rne_bits(u):
    """Nearest-even bf16 on the bits (finite inputs; NaN handled by callers)."""
    return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


def _bf16_ok(x):
    u = _f32_bits(x)
    r = _bf16_rne_bits(u).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), r)


def _ml(name, x):
    with np.errstate(invalid="ignore", over="ignore"):       # (NaN and overflow: their rules)
        return np.asarray(x, np.float32).astype(getattr(ml_dtypes, name)).astype(np.float32)


BF16_MAX = np.float32(3.3895313892515355e38)
E4M3_MAX, E5M2_MAX = np.float32(448.0), np.float32(57344.0)


def _flush(fmt_min_normal, x, q):
    return np.where(np.abs(x) < fmt_min_normal, np.copysign(np.float32(0), x), q)


def _double_fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _e4m3fn_ties_away(x):
    """ml_dtypes' e4m3fn, but an exact midpoint between two neighbours (the
    results of the float32 values either side) goes to the larger one."""
    a = np.abs(np.asarray(x, np.float32))
    with np.errstate(invalid="ignore"):
        up = _ml("float8_e4m3fn", np.nextafter(a, np.float32(np.inf)))
        dn = _ml("float8_e4m3fn", np.nextafter(a, np.float32(0)))
        tie = (up != dn) & (a.astype(np.float64) == (up.astype(np.float64) + dn) / 2)
    r = np.where(tie, np.maximum(up, dn), _ml("float8_e4m3fn", a))
    return np.where(np.isnan(x), x, np.copysign(r, x))


#: (name, format, what fpemu is asked for, the wrong conversion, words of the rule)
MUTANTS = [
    ("bf16 ties away", "bf16", {},
     lambda x: np.where(np.isnan(x), x, ((_f32_bits(x) + np.uint32(0x8000))
                                         & np.uint32(0xFFFF0000)).view(np.float32)),
     "ties away from zero"),
    ("bf16 truncation", "bf16", {},
     lambda x: np.where(np.isnan(x), x, (_f32_bits(x) & np.uint32(0xFFFF0000)).view(np.float32)),
     "toward zero"),
    ("bf16 NaN into inf", "bf16", {},
     lambda x: _bf16_rne_bits(_f32_bits(x)).view(np.float32), "NaN turned into inf"),
    ("bf16 subnormals flushed", "bf16", {},
     lambda x: _flush(np.float32(2.0**-126), x, _bf16_ok(x)), "flushed subnormal"),
    ("bf16 saturates", "bf16", {},
     lambda x: np.where(np.isnan(x), x, np.clip(_bf16_ok(x), -BF16_MAX, BF16_MAX)),
     "saturation where the format has inf"),
    ("bf16 exponent bias off by one", "bf16", {},
     lambda x: _bf16_ok(x) * np.float32(2), "off-by-one exponent"),
    ("bf16 sign of zero", "bf16", {}, lambda x: _bf16_ok(x) + np.float32(0),
     "sign of zero lost"),
    ("e4m3fn ties away", "e4m3fn", {"overflow": "nan"}, _e4m3fn_ties_away,
     "ties away from zero"),
    ("e4m3fn no saturation", "e4m3fn", {},
     lambda x: _ml("float8_e4m3fn", x), "no saturation: overflow to NaN"),
    ("e4m3fn subnormals flushed", "e4m3fn", {"overflow": "nan"},
     lambda x: _flush(np.float32(2.0**-6), x, _ml("float8_e4m3fn", x)), "flushed subnormal"),
    ("e4m3fn NaN into a number", "e4m3fn", {"overflow": "nan"},
     lambda x: np.where(np.isnan(x), np.float32(0), _ml("float8_e4m3fn", x)),
     "NaN turned into a number"),
    ("e4m3fn through fp16", "e4m3fn", {"overflow": "nan"},
     lambda x: _ml("float8_e4m3fn", _double_fp16(x)), "double rounding: through fp16"),
    ("e4m3fn exponent bias off by one", "e4m3fn", {"overflow": "nan"},
     lambda x: _ml("float8_e4m3fn", x) / np.float32(2), "off-by-one exponent"),
    ("e5m2 saturates", "e5m2", {},
     lambda x: np.where(np.isnan(x), x, np.clip(_ml("float8_e5m2", x), -E5M2_MAX, E5M2_MAX)),
     "saturation where the format has inf"),
    ("e5m2 truncation", "e5m2", {},
     lambda x: np.where(np.isnan(x), x, _ml("float8_e5m2", (_f32_bits(x) & np.uint32(
         0xFFE00000)).view(np.float32))), "toward zero"),
]


@pytest.mark.parametrize("name,fmt,kw,wrong,rule", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_wrong_conversion_is_caught_within_200_examples_and_its_rule_named(
        name, fmt, kw, wrong, rule):
    @settings(max_examples=200, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategies.values(fmt))
    def check(x):
        with np.errstate(all="ignore"):
            got = wrong(x)
        assert_quantized_equal(got, x, fmt, **kw)

    with pytest.raises(AssertionError) as info:
        check()
    msg = str(info.value)
    assert "fpemu.testing:" in msg and rule in msg, msg
    assert "reproduce: python -c" in msg


@pytest.mark.parametrize("name,fmt,kw,wrong,rule", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_a_wrong_conversion_fails_on_its_formats_edge_inputs_at_once(
        name, fmt, kw, wrong, rule):
    """The same wrong conversions as below, given the edge inputs in one
    array (as a GPU kernel would be; up to 2,048 of each kind)."""
    x = strategies.edge_inputs(fmt, per_kind=2048)
    with np.errstate(all="ignore"):
        got = wrong(x)
    with pytest.raises(AssertionError) as info:
        assert_quantized_equal(got, x, fmt, **kw)
    assert rule in str(info.value)


def test_correct_conversions_pass_10000_examples():
    """torch's bf16 cast and ml_dtypes' e4m3fn (its overflow: NaN) each on
    10,000 examples (one run; each example draws an input for both)."""
    @settings(max_examples=10_000, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategies.values("bf16"), strategies.values("e4m3fn"))
    def check(x, y):
        assert_quantized_equal(torch.from_numpy(x).to(torch.bfloat16), x, "bf16")
        assert_quantized_equal(_ml("float8_e4m3fn", y), y, "e4m3fn", overflow="nan")

    check()


def test_the_message_in_full_for_one_truncating_cast():
    """Classes, the rules, each example's input, codes, interval and reproducer."""
    x = np.array([[1.0, 1 + 3 * 2.0**-8], [-(1 + 3 * 2.0**-8), 2.0**-133 * 3.75]], np.float32)
    got = (_f32_bits(x) & np.uint32(0xFFFF0000)).view(np.float32)
    with pytest.raises(AssertionError) as info:
        assert_quantized_equal(torch.from_numpy(got), x, "bf16")
    msg = str(info.value)
    assert msg.startswith("fpemu.testing: 3 of 4 values differ from fpemu.quantize(x, 'bf16', "
                          "rounding='rne', overflow='inf', subnormals=True)")
    assert "mismatches by class: normal 2, subnormal 1" in msg
    assert "round toward zero (truncation) (3 of 3)" in msg
    assert "[0,1] x = 1.01171875 (float32 0x3F818000), class normal" in msg
    assert "expected 1.015625 (code 0x3F82), actual 1.0078125 (code 0x3F81)" in msg
    assert "rounding interval [1.0078125, 1.015625], midpoint 1.01171875" in msg
    assert ("reproduce: python -c \"import numpy as np, fpemu; print(fpemu.explain("
            "np.uint32(0x3F818000).view(np.float32), 'bf16'))\"") in msg
    # the reproducer runs and shows fpemu's answer
    line = next(s for s in msg.splitlines() if "reproduce:" in s).split("reproduce: ", 1)[1]
    assert line.startswith("python -c ")
    out = subprocess.run([sys.executable, "-c", line[len("python -c "):].strip('"')],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "1.015625" in out.stdout, out.stderr
    # a value that is not on the grid says so; codes compare as codes
    with pytest.raises(AssertionError, match=r"actual 1\.01171875 \(not a value of bf16\)"):
        assert_quantized_equal(x, x, "bf16")
    assert_quantized_equal(np.array([0x3F80, 0x3F82], np.uint16), x[0], "bf16")


def test_assertion_bad_input_names_the_fix():
    x = np.ones(3, np.float32)
    with pytest.raises(FpemuValueError, match=r"shape \(2,\) and x \(3,\)"):
        assert_quantized_equal(np.ones(2, np.float32), x, "bf16")
    with pytest.raises(FpemuTypeError, match="floating-point inputs"):
        assert_quantized_equal(x, np.ones(3, np.int32), "bf16")
    with pytest.raises(FpemuValueError):
        assert_quantized_equal(x, x, "bf16", rounding="nearest")
    # complex input: the imaginary part would be dropped, and the check pass
    with pytest.raises(FpemuTypeError, match="must be real, got dtype complex64"):
        assert_quantized_equal(np.complex64([1 + 5j]), np.complex64([1 + 7j]), "bf16")
    with pytest.raises(FpemuTypeError, match="actual must be real"):
        assert_quantized_equal(np.complex64([1 + 5j]), np.float32([1]), "bf16")


# ------------------------------------------------------------------ sweeps
def test_exhaustive_sweeps_a_source_and_reports_global_indices():
    r = exhaustive(lambda v: torch.from_numpy(v).to(torch.float8_e5m2), "e5m2", "fp16")
    assert r.compared == 1 << 16 and r.mismatches == 0
    r = exhaustive(lambda v: _ml("float8_e4m3fn", v), "e4m3fn", "bf16", overflow="nan")
    assert r.compared == 1 << 16
    # a slice of the float32 sweep, in chunks; the index is the input's bit pattern
    start = 0x3F800000

    def trunc(v):
        return (_f32_bits(v) & np.uint32(0xFFFF0000)).view(np.float32)

    with pytest.raises(AssertionError) as info:
        exhaustive(trunc, "bf16", "float32", start=start, stop=start + (1 << 17),
                   chunk=1 << 15, progress=False)
    msg = str(info.value)
    assert f"of {1 << 17} values differ" in msg and f"[{start + 0x8001}] x = " in msg
    assert "round toward zero" in msg
    with pytest.raises(FpemuValueError, match="source must be one of"):
        exhaustive(trunc, "bf16", "fp64")
    with pytest.raises(FpemuValueError, match="one result per input"):
        exhaustive(lambda v: v[:3], "bf16", "fp8")


def test_a_sweep_into_a_format_without_nan_skips_and_counts_the_nan_inputs():
    def e2m1(v):
        with np.errstate(all="ignore"):
            return np.asarray(v, np.float32).astype(ml_dtypes.float4_e2m1fn).astype(np.float32)

    r = exhaustive(e2m1, "e2m1", "fp16")          # fp16 has 2 * 1023 NaN patterns
    assert (r.compared, r.skipped_nan, r.mismatches) == (65536 - 2046, 2046, 0)
    with pytest.raises(AssertionError) as info:
        exhaustive(lambda v: e2m1(v) * np.float32(2), "e2m1", "fp16")
    assert "(2046 NaN inputs not compared: e2m1 has no NaN" in str(info.value)
    with pytest.raises(FpemuValueError, match="has no NaN"):   # given inputs: refused
        assert_quantized_equal(np.zeros(1, np.float32), np.full(1, np.nan, np.float32), "e2m1")


def _e8m0_exponent_field(x):
    """An e8m0 "cast" that takes the float32 exponent field of |x|: rounds the
    magnitude toward zero, drops the sign, maps zero to the smallest value
    2**-127 (code 0) and inf and NaN to the NaN code 0xFF (CUDA's
    __nv_cvt_float_to_e8m0 on an H100 drops the sign and maps zero to code 0
    the same way: tests/test_cuda_casts.py)."""
    return ((_f32_bits(x) & np.uint32(0x7FFFFFFF)) >> np.uint32(23)).astype(np.uint8)


def test_an_unsigned_format_names_a_dropped_sign_and_zero_into_its_smallest_value():
    x = strategies.edge_inputs("e8m0")
    x = np.concatenate([x, -x[~np.isnan(x)], np.float32([0.0, -0.0])])
    r = fpemu.testing.compare(_e8m0_exponent_field(x), x, "e8m0", rounding="rtz")
    neg = int(((x < 0) & np.isfinite(x)).sum())   # (-inf becomes NaN, as fpemu's does)
    over = int(((x < -fpemu.format("e8m0").max) & np.isfinite(x)).sum())
    assert r.by_class == {"negative": neg - over, "overflow": over, "zero": 2}, r.by_class
    msg = r.message()
    assert (f"the sign dropped: a negative input rounded as its magnitude (same rounding) "
            f"({neg} of {neg + 2})") in msg, msg
    assert f"zero into the smallest value (e8m0 has no zero) (2 of {neg + 2})" in msg, msg
    # the magnitude rounded otherwise: the rule names that rounding
    pos = x[(x > 0) & np.isfinite(x)]
    r = fpemu.testing.compare(_e8m0_exponent_field(-pos), -pos, "e8m0", rounding="rup")
    assert "rounded as its magnitude (round toward zero (truncation))" in r.message()


def test_the_pytest_plugin_gives_the_fixture_and_the_marker(pytester):
    """A project's test file, run by pytest in this process: the entry point
    gives the fixture, and the marker selects or skips the sweep."""
    pytester.makepyfile(test_mine=textwrap.dedent("""
        import numpy as np
        import pytest
        from hypothesis import given, settings
        from fpemu.testing import strategies

        @settings(max_examples=20, database=None)
        @given(strategies.values("bf16"))
        def test_oracle(fpemu_oracle, x):
            fpemu_oracle.assert_quantized_equal(fpemu_oracle.quantize(x, "bf16"), x, "bf16")

        @pytest.mark.fpemu_exhaustive
        def test_sweep(fpemu_oracle):
            fpemu_oracle.exhaustive(lambda v: fpemu_oracle.quantize(v, "e4m3fn"), "e4m3fn", "fp8")
    """))
    for sel, ran in (("not fpemu_exhaustive", "test_oracle"), ("fpemu_exhaustive", "test_sweep")):
        res = pytester.runpytest_inprocess("--strict-markers", "-p", "no:cacheprovider", "-m",
                                           sel, "-v")
        res.assert_outcomes(passed=1, deselected=1)
        assert any(ran in line and "PASSED" in line for line in res.outlines), res.outlines


# ------------------------------------------------------------------- blocks
from fpemu import block  # noqa: E402
from fpemu.testing import assert_blocks_equal  # noqa: E402


def _block_kinds(x, spec):
    """The kinds of each block of x (a set per draw), decided here: amaxes by
    the preset's layout, scale edges by TransformerEngine's two-level rule
    (e4m3 scales) or amax / element max (e8m0)."""
    ty, tx = spec.block if isinstance(spec.block, tuple) else (1, spec.block)
    R, C = x.shape
    out = set()
    if C % tx:
        out.add("tail")
    finite = np.abs(x[np.isfinite(x)]).astype(np.float64)
    T = finite.max() if finite.size else 0.0
    if 0 < T < 2.0**-99:
        out.add("tiny_tensor_amax")
    emax = float(fpemu.format(spec.elem).max)
    targets = {"scale_min": [2.0**-9], "scale_subnormal_edge": [7 * 2.0**-9, 2.0**-6],
               "scale_max": [448.0]} if spec.scale_fmt == "e4m3fn" else (
        {"scale_min": [2.0**-127], "scale_max": [2.0**127]} if spec.scale_fmt == "e8m0" else {})
    for r in range(0, R, ty):
        for c in range(0, C, tx):
            b = x[r:r + ty, c:c + tx].astype(np.float64)
            if np.isnan(b).any():
                out.add("nan")
                continue
            if np.isinf(b).any():
                out.add("inf")
                continue
            a = np.abs(b).max()
            if a == 0:
                out.add("zero")
                continue
            for base in (1.0, emax):
                m, _ = np.frexp(a / base)
                if m == 0.5:
                    out.add("pow2_amax")
                prev = float(np.nextafter(np.float32(a), np.float32(0)))
                if np.frexp(prev / base)[0] == 0.5 and prev != a:
                    out.add("pow2_amax_ulp")
            for kind, ss in targets.items():
                for s in ss:
                    want = s * T / 448.0 if spec.scale_fmt == "e4m3fn" else min(
                        s * emax, float(np.finfo(np.float32).max))
                    if want > 0 and abs(a - want) <= 1e-6 * want + 2.0**-149:
                        out.add(kind)
            out.add("random")
    return out


def test_every_block_kind_appears_in_at_least_one_percent_of_the_draws():
    """1,000 examples, each drawing an array for every block preset: every
    kind each preset claims is in at least 1% of its 1,000 draws."""
    presets = sorted(block.PRESETS)
    seen = {p: [] for p in presets}

    @settings(max_examples=1000, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(hst.tuples(*(strategies.blocks(p, n_blocks=2) for p in presets)))
    def draw(xs):
        for p, x in zip(presets, xs):
            assert x.dtype == np.float32 and x.ndim == 2
            seen[p].append(_block_kinds(x, block.PRESETS[p]))

    draw()
    short = {}
    for p in presets:
        spec = block.PRESETS[p]
        claimed = set(strategies.BLOCK_KINDS) - (
            {"scale_min", "scale_subnormal_edge", "scale_max"}
            - set(strategies._scale_targets(spec)))
        counts = {k: sum(k in s for s in seen[p]) for k in claimed}
        if any(n < 0.01 * len(seen[p]) for n in counts.values()) or len(seen[p]) < 1000:
            short[p] = (len(seen[p]), counts)
    assert not short, short


def _torchao_mx(x, mode):
    from torchao.prototype.mx_formats import mx_tensor as mx
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    s, d = mx.to_mx(torch.from_numpy(x), torch.float8_e4m3fn, 32,
                    getattr(ScaleCalculationMode, mode))
    return d.view(torch.uint8), s.view(torch.uint8)


def _torchao_nvfp4(x):
    from torchao.prototype.mx_formats.kernels import unpack_uint4
    from torchao.prototype.mx_formats.nvfp4_tensor import (
        nvfp4_quantize,
        per_tensor_amax_to_scale,
    )
    t = torch.from_numpy(x)
    s, d = nvfp4_quantize(t, 16, per_tensor_amax_to_scale(t.abs().max()))
    return unpack_uint4(d), s.view(torch.uint8)


def _plain_hadamard(x):
    """16-runs times the Sylvester Hadamard matrix / 4, no sign vector, exact
    in float64, rounded once to float32 (written here, not fpemu's)."""
    H = np.ones((1, 1))
    while H.shape[0] < 16:
        H = np.block([[H, H], [H, -H]])
    R, C = x.shape
    return (x.astype(np.float64).reshape(R, C // 16, 16) @ (H / 4)).reshape(R, C).astype(
        np.float32)


def _unclamped(x):
    c, s = _torchao_nvfp4(x)
    s = s.clone()
    s[s == 0x7E] = 0x7F                       # 448 written as e4m3fn's NaN: no clamp
    return c, s


def _finite(preset):
    """The block kinds on which torchao's quantizers are fpemu's presets: its
    NaN blocks, tiny tensor amaxes (NVFP4) and the 2**-127 MX scale (it
    divides by 2**-126) are its own choices, documented in
    docs/block-formats.md."""
    spec = block.PRESETS[preset]
    have = set(strategies._scale_targets(spec))
    if spec.scale_fmt == "e8m0":
        have.discard("scale_min")
    return [k for k in ("random", "pow2_amax", "pow2_amax_ulp", "scale_min",
                        "scale_subnormal_edge", "scale_max", "zero")
            if not k.startswith("scale_") or k in have]


BLOCK_MUTANTS = [
    ("MX scale rounded down instead of up", "mxfp8-te", {}, None,
     lambda x: _torchao_mx(x, "FLOOR"), "the scale rounded down"),
    ("torchao's rceil (its CPU fallback)", "mxfp8-te", {}, None,
     lambda x: _torchao_mx(x, "RCEIL"), "the scale rounded down"),
    ("NVFP4 e4m3 scale not clamped", "nvfp4-torchao", {}, None, _unclamped,
     "e4m3fn scale not clamped"),
    ("NVFP4 RHT sign vector wrong", "nvfp4-torchao", {"rht": True}, None,
     lambda x: _torchao_nvfp4(_plain_hadamard(x)), "without TransformerEngine's sign vector"),
    ("NVFP4 no RHT", "nvfp4-torchao", {"rht": True}, None, _torchao_nvfp4,
     "no RHT applied"),
]


@pytest.mark.parametrize("name,preset,kw,kinds,wrong,rule", BLOCK_MUTANTS,
                         ids=[m[0] for m in BLOCK_MUTANTS])
def test_a_wrong_block_quantizer_is_caught_within_200_examples_and_its_rule_named(
        name, preset, kw, kinds, wrong, rule):
    @settings(max_examples=200, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategies.blocks(preset, n_blocks=4, kinds=_finite(preset)))
    def check(x):
        codes, scales = wrong(x)
        assert_blocks_equal(codes, scales, x, preset, **kw)

    with pytest.raises(AssertionError) as info:
        check()
    msg = str(info.value)
    assert "fpemu.testing: the block quantization differs" in msg and rule in msg, msg
    assert "reproduce: python -c" in msg


def test_correct_block_quantizers_pass():
    """torchao's floor MX and its NVFP4 quantizer, on the finite kinds
    (torchao's tiny-amax zeros and NaN blocks are its own: docs/block-formats.md)."""
    @settings(max_examples=300, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategies.blocks("mxfp8", 4, kinds=_finite("mxfp8")),
           strategies.blocks("nvfp4", 4, kinds=_finite("nvfp4")))
    def check(x, y):
        assert_blocks_equal(*_torchao_mx(x, "FLOOR"), x, "mxfp8")
        assert_blocks_equal(*_torchao_nvfp4(y), y, "nvfp4-torchao")

    check()


def test_blocks_bad_input_names_the_fix():
    x = np.ones((1, 32), np.float32)
    q = block.quantize_blocks(x, "mxfp8")
    with pytest.raises(FpemuValueError, match=r"scales have shape \(2,\).*\(1, 1\)"):
        assert_blocks_equal(q.codes, np.zeros(2, np.uint8), x, "mxfp8")
    with pytest.raises(FpemuValueError, match="preset must be a name"):
        assert_blocks_equal(q.codes, q.scales, x, "mxfp9")
    with pytest.raises(FpemuValueError, match="not a value of e8m0"):
        assert_blocks_equal(q.codes, np.full((1, 1), 3.0, np.float32), x, "mxfp8")
    with pytest.raises(FpemuValueError, match="no kind 'scale_subnormal_edge'"):
        strategies.blocks("mxfp8", kinds=["scale_subnormal_edge"])
    assert_blocks_equal(q.codes, q.scales, x, "mxfp8")          # and equal ones pass


def test_the_block_message_details_elements_under_a_scale_that_agrees():
    """An MX quantizer written here with OCP's floor scale but elements
    truncated, not rounded: no scale differs; the message names the element
    rounding, counts the elements by class, and details each with its scaled
    input, the interval it lies in and a reproducer printing fpemu's code."""
    x = np.linspace(1.0, 1.74, 64, dtype=np.float32).reshape(1, 64)
    x[0, 63] = 1.75                     # -> 448, the largest e4m3fn: exact either way
    x[0, 5] = 1 + 2.0**-4               # a midpoint of e4m3fn (after the 2**-8 scale)
    scales = np.full((1, 2), 127 - 8, np.uint8)          # floor(log2 amax) - emax(e4m3fn)
    y = (_f32_bits(x * np.float32(256)) & np.uint32(0xFFF00000)).view(np.float32)
    codes = _ml("float8_e4m3fn", y).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    with pytest.raises(AssertionError) as info:
        assert_blocks_equal(codes, scales, x, "mxfp8")
    msg = str(info.value)
    n = int((np.asarray(fpemu.block.quantize_blocks(x, "mxfp8").codes) != codes).sum())
    assert n > 20
    assert f"scales: 0 of 2 blocks differ; elements: {n} of 64 differ (0 in blocks whose " \
           f"scale differs, {n} elsewhere)" in msg
    assert "the elements: round toward zero (truncation) (every mismatch)" in msg
    n_max = int((x * 256 >= 432).sum()) - 1    # up to 448 from the midpoint 432 (1.75: exact)
    assert f"elements under a scale that agrees, by fpemu's element: normal {n - n_max}, " \
           f"max {n_max}" in msg
    assert "element (0, 5)" not in msg               # the midpoint 272: to even, 256, as truncated
    first = msg.split("  element ")[1]
    assert "x / scale = " in first and ", midpoint " in first
    line = next(s for s in first.splitlines() if "reproduce:" in s).split("reproduce: ", 1)[1]
    out = subprocess.run([sys.executable, "-c", line[len("python -c "):].strip('"')],
                         capture_output=True, text=True, timeout=120)
    idx = int(first.split(")")[0].split(", ")[1])
    want = int(np.asarray(fpemu.block.quantize_blocks(x, "mxfp8").codes)[0, idx])
    assert out.returncode == 0 and out.stdout.strip() == str(want), out.stdout + out.stderr


#: OCP's MXFP6 E2M3 as a block format of one's own: the element a custom Format (the same
#: parameters as float6_e2m3fn, not the named one), e8m0 scales, blocks of 32, floor
E2M3_CUSTOM = Format.custom(2, 3, bias=1, nan_encoding="none", name="my_e2m3")
MY_MX = fpemu.block.BlockSpec("my-mxfp6", E2M3_CUSTOM, "e8m0", 32, "floor", "a test's own")


def _my_mx(x, truncate=False):
    """OCP MX with E2M3 elements, written here: the shared scale 2**(floor(log2
    amax) - 2) (2: the element's largest binade), elements by ml_dtypes'
    float6_e2m3fn cast of x / scale (or of its bits truncated to 3 mantissa
    bits)."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float64)
    amax = np.abs(b).max(-1)
    k = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127)
    k = np.clip(k, -127, 127)
    v = (b / np.exp2(k)[..., None]).astype(np.float32)
    if truncate:
        v = (_f32_bits(v) & np.uint32(0xFFF00000)).view(np.float32)
    codes = v.astype(ml_dtypes.float6_e2m3fn).view(np.uint8).reshape(x.shape)
    return codes, (k + 127).astype(np.uint8)


def test_a_block_format_of_ones_own_with_a_custom_element():
    """strategies.blocks and assert_blocks_equal take a BlockSpec with a
    custom element format: an MX quantizer written here passes 200 drawn
    examples; with its elements truncated it fails, the message names the
    element rounding, spells the custom format, and its reproducer runs."""
    kinds = ["random", "pow2_amax", "pow2_amax_ulp", "zero", "scale_min", "scale_max"]

    @settings(max_examples=200, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategies.blocks(MY_MX, 3, kinds=kinds))
    def good(x):
        assert x.shape[1] == 96
        assert_blocks_equal(*_my_mx(x), x, MY_MX)

    good()
    x = np.linspace(-6.5, 7.3, 64, dtype=np.float32).reshape(1, 64)
    with pytest.raises(AssertionError) as info:
        assert_blocks_equal(*_my_mx(x, truncate=True), x, MY_MX)
    msg = str(info.value)
    assert "quantize_blocks(x, fpemu.Format.custom(2, 3, bias=1, nan_encoding='none'" in msg
    assert "the elements: round toward zero (truncation) (every mismatch)" in msg
    line = next(s for s in msg.splitlines() if "reproduce:" in s).split("reproduce: ", 1)[1]
    out = subprocess.run([sys.executable, "-c", line[len("python -c "):].strip('"')],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().isdigit(), out.stdout + out.stderr
    with pytest.raises(FpemuValueError, match="or an fpemu.block.BlockSpec"):
        strategies.blocks("mxfp7")


def test_the_block_message_and_its_reproducer():
    """torchao's CPU rceil on a block whose amax / 448 is one ulp above a
    power of two: one scale differs, the message names the rounded-down
    scale, and the block's reproducer prints fpemu's scale."""
    x = np.full((1, 64), 0.01, np.float32)
    x[0, 40] = np.nextafter(np.float32(448 * 2.0**-10), np.float32(1))    # 0x3EE00001
    with pytest.raises(AssertionError) as info:
        assert_blocks_equal(*_torchao_mx(x, "RCEIL"), x, "mxfp8-te")
    msg = str(info.value)
    assert "scales: 1 of 2 blocks differ; elements: 32 of 64 differ (32 in blocks whose " \
           "scale differs, 0 elsewhere)" in msg
    assert "the scale rounded down (floor: OCP MX's rule) (every mismatch)" in msg
    assert "block (0, 1): amax 0.4375000298023224 (float32 0x3EE00001), expected scale " \
           "0.001953125 (code 0x76), actual 0.0009765625 (code 0x75)" in msg
    line = next(s for s in msg.splitlines() if "reproduce:" in s).split("reproduce: ", 1)[1]
    out = subprocess.run([sys.executable, "-c", line[len("python -c "):].strip('"')],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[[118]]", out.stdout + out.stderr
