"""Arithmetic against exact rational results rounded by the oracles.

The expected results never touch floating-point arithmetic: operands become
Fractions, the operation is exact (square roots are compared through their
squares), and the oracles of ``oracle.py`` round them, comparing exactly.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np
import pytest

import fpemu
from oracle import MODES, SPECS, Sqrt, TableOracle, round_to_ieee

SMALL = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3", "e3m4", "e2m3", "e3m2", "e2m1",
         "e8m0"]
OPS = {"add": fpemu.add, "sub": fpemu.sub, "mul": fpemu.mul, "div": fpemu.div,
       "sqrt": fpemu.sqrt, "fma": fpemu.fma}


# ------------------------------------------------------------- exact results
def _neg(x):
    return math.copysign(1.0, x) < 0 if isinstance(x, float) else x < 0


def _prod(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.nan
    sign = -1.0 if _neg(a) != _neg(b) else 1.0
    if math.isinf(a) or math.isinf(b):
        return math.nan if (a == 0 or b == 0) else sign * math.inf
    if a == 0 or b == 0:
        return sign * 0.0
    return Fraction(a) * Fraction(b)


def _sum(x, y, mode):
    """x + y for Fractions or float specials (±0, ±inf, NaN), IEEE 754 §6."""
    fx, fy = isinstance(x, float), isinstance(y, float)
    if (fx and math.isnan(x)) or (fy and math.isnan(y)):
        return math.nan
    xi, yi = fx and math.isinf(x), fy and math.isinf(y)
    if xi and yi:
        return x if x == y else math.nan
    if xi or yi:
        return x if xi else y
    s = Fraction(x) + Fraction(y)
    if s != 0:
        return s
    if x == 0 and y == 0 and _neg(x) == _neg(y):
        return -0.0 if _neg(x) else 0.0
    return -0.0 if mode == "rdn" else 0.0


def exact(op, a, b=0.0, c=0.0, mode="rne"):
    """The exact result of ``op`` on floats a, b, c (values of a format)."""
    if op == "sub":
        return _sum(Fraction(a) if math.isfinite(a) and a != 0 else a,
                    -b if not math.isfinite(b) or b == 0 else -Fraction(b), mode)
    if op == "add":
        return _sum(a if not math.isfinite(a) or a == 0 else Fraction(a),
                    b if not math.isfinite(b) or b == 0 else Fraction(b), mode)
    if op == "mul":
        return _prod(a, b)
    if op == "div":
        if math.isnan(a) or math.isnan(b):
            return math.nan
        sign = -1.0 if _neg(a) != _neg(b) else 1.0
        if (math.isinf(a) and math.isinf(b)) or (a == 0 and b == 0):
            return math.nan
        if math.isinf(a) or b == 0:
            return sign * math.inf
        if math.isinf(b) or a == 0:
            return sign * 0.0
        return Fraction(a) / Fraction(b)
    if op == "sqrt":
        if math.isnan(a) or a == 0 or a == math.inf:
            return a
        return math.nan if a < 0 else Sqrt(Fraction(a))
    p = _prod(a, b)  # fma
    return _sum(p, c if not math.isfinite(c) or c == 0 else Fraction(c), mode)


# ---------------------------------------------------------------- operands
def operands(name):
    """Every value of a small format, -0, inf and NaN where it has them."""
    o = TableOracle(SPECS[name])
    fmt = fpemu.format(name)
    vals = list(o.all_values())
    if fmt.has_negative_zero:
        vals.append(-0.0)
    if fmt.has_inf:
        vals += [math.inf, -math.inf]
    if fmt.has_nan:
        vals.append(math.nan)
    return np.array(vals, np.float64)


def flush(x, name):
    """Denormals-are-zero: subnormal operands read as zeros of their sign."""
    fmt = fpemu.format(name)
    sub = (np.abs(x) < fmt.min_normal) & (x != 0)
    return np.where(sub, np.copysign(0.0, x), x)


def bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def assert_same(got, want, label, a, b=None, c=None):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    bad = bits(got) != bits(want)
    bad &= ~(np.isnan(got) & np.isnan(want))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ops = [v[i] for v in (a, b, c) if v is not None]
        raise AssertionError(
            f"{label}: {int(bad.sum())} of {bad.size} differ; first operands {ops}: "
            f"got {got.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}"
        )


@functools.lru_cache(maxsize=None)
def _pairs(name, op="add", daz=False):
    """All operand pairs; without NaN in the format, not 0 / 0 (an error,
    tested on its own; with daz, subnormals count as zeros)."""
    v = operands(name)
    a, b = (g.reshape(-1) for g in np.meshgrid(v, v, indexing="ij"))
    if op == "div" and not fpemu.format(name).has_nan:
        fa, fb = (flush(a, name), flush(b, name)) if daz else (a, b)
        keep = ~((fa == 0) & (fb == 0))
        a, b = a[keep], b[keep]
    return a, b


@functools.lru_cache(maxsize=None)
def _positions(name, op, daz, rdn):
    """Oracle positions of the exact results over all pairs (cached). The
    rounding mode reaches an exact result only through the sign of an exact
    zero sum (IEEE 754 §6.3: -0 under roundTowardNegative), so the "rdn"
    positions are the others with the exact zeros worked out again."""
    if rdn:
        neg, nan_in, inf_in, pos = _positions(name, op, daz, False)
        zeros = np.flatnonzero(pos["zero"] & ~nan_in & ~inf_in)
        if op in ("mul", "div") or not zeros.size:
            return neg, nan_in, inf_in, pos
        a, b = _operands_of(name, op, daz)
        neg = neg.copy()
        for i in zeros.tolist():
            neg[i] = _neg(exact(op, float(a[i]), float(b[i]), mode="rdn"))
        return neg, nan_in, inf_in, pos
    a, b = _operands_of(name, op, daz)
    q = [exact(op, x, y, mode="rne") for x, y in zip(a.tolist(), b.tolist())]
    return TableOracle(SPECS[name]).positions_exact(q)


def _operands_of(name, op, daz):
    a, b = _pairs(name, op, daz)
    return (flush(a, name), flush(b, name)) if daz else (a, b)


def _expected(name, op, mode, subnormals=True, overflow=None):
    o = TableOracle(SPECS[name])
    pos = _positions(name, op, not subnormals, mode == "rdn")
    codes = o._decide(*pos, mode, subnormals, overflow)
    return o.value_of(codes)


# ------------------------------------------------------ exhaustive, 8 bits
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("name", SMALL)
def test_all_pairs_every_mode(name, op):
    a, b = _pairs(name, op)
    for mode in MODES:
        got = OPS[op](a, b, name, rounding=mode)
        assert_same(got, _expected(name, op, mode), f"{name} {op} {mode}", a, b)


@pytest.mark.parametrize("op", ["add", "mul", "div"])
@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e4m3fnuz", "e3m2"])
def test_all_pairs_flush_to_zero(name, op):
    a, b = _pairs(name, op, True)
    for mode in ("rne", "rdn"):
        got = OPS[op](a, b, name, rounding=mode, subnormals=False)
        want = _expected(name, op, mode, subnormals=False)
        assert_same(got, want, f"{name} {op} {mode} ftz", a, b)


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("name,policy", [("e5m2", "saturate"), ("e5m2", "nan"),
                                         ("e4m3fn", "nan"), ("e4m3", "saturate")])
def test_all_pairs_overflow_policies(name, policy, op):
    a, b = _pairs(name)
    for mode in ("rne", "rup"):
        got = OPS[op](a, b, name, rounding=mode, overflow=policy)
        want = _expected(name, op, mode, overflow=policy)
        assert_same(got, want, f"{name} {op} {mode} {policy}", a, b)


@pytest.mark.parametrize("name", SMALL)
def test_sqrt_every_value_every_mode(name):
    a = operands(name)
    if not fpemu.format(name).has_nan:  # sqrt of a negative number: an error there
        a = a[~(a < 0)]
    o = TableOracle(SPECS[name])
    pos = o.positions_exact([exact("sqrt", x) for x in a.tolist()])
    for mode in MODES:
        want = o.value_of(o._decide(*pos, mode, True, None))
        assert_same(fpemu.sqrt(a, name, rounding=mode), want, f"{name} sqrt {mode}", a)


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e5m2fnuz", "e3m4", "e2m1"])
def test_fma_all_pairs(name):
    """All pairs (a, b), each with c drawn from every value in turn, plus the
    c = -a*b cancellations; for fp4 (e2m1) every triple."""
    vals = operands(name)
    if name == "e2m1":
        a, b, c = (g.reshape(-1) for g in np.meshgrid(vals, vals, vals, indexing="ij"))
    else:
        a, b = _pairs(name)
        c = vals[(np.arange(a.size) * 7 + 3) % vals.size]
    o = TableOracle(SPECS[name])
    al, bl, cl = a.tolist(), b.tolist(), c.tolist()
    # exact results and their places on the grid once; the mode reaches them
    # only through the sign of an exact zero (IEEE 754 §6.3), worked out
    # again for each mode
    q = [exact("fma", x, y, z, "rne") for x, y, z in zip(al, bl, cl)]
    neg, nan_in, inf_in, pos = o.positions_exact(q)
    zeros = [i for i, v in enumerate(q) if v == 0]
    for mode in MODES:
        neg_m = neg.copy()
        for i in zeros:
            neg_m[i] = math.copysign(1.0, exact("fma", al[i], bl[i], cl[i], mode)) < 0
        want = o.value_of(o._decide(neg_m, nan_in, inf_in, pos, mode, True, None))
        assert_same(fpemu.fma(a, b, c, name, rounding=mode), want, f"{name} fma {mode}", a, b, c)


# -------------------------------------------- 16 and 32 bits: edge-biased
def edge_operands(name, n, rng):
    """Random values of a format, biased towards its edges: zeros, the
    subnormal/normal boundary, max, powers of two and their neighbours."""
    fmt = fpemu.format(name)
    M = fmt.mantissa_bits
    nbits = fmt.bits
    codes = rng.integers(0, 1 << nbits, n, dtype=np.int64)
    mag_max = fmt.max_code
    special = np.array([0, 1, 2, (1 << M) - 1, 1 << M, (1 << M) + 1, mag_max, mag_max - 1,
                        (fmt.bias << M), (fmt.bias << M) - 1, (fmt.bias << M) + 1], np.int64)
    pick = rng.random(n) < 0.3
    codes = np.where(pick, special[rng.integers(0, special.size, n)]
                     | (rng.integers(0, 2, n) << (nbits - 1)), codes)
    # Exponents near each other, so that additions cancel and carry.
    near = rng.random(n) < 0.3
    mid = ((fmt.bias + rng.integers(-3, 4, n)) << M) | rng.integers(0, 1 << M, n)
    codes = np.where(near, mid | (rng.integers(0, 2, n) << (nbits - 1)), codes)
    if name == "fp32":
        with np.errstate(invalid="ignore"):  # signalling NaN patterns
            vals = codes.astype(np.uint32).view(np.float32).astype(np.float64)
    else:
        vals = fpemu.decode(codes.astype(fmt.code_dtype), name).astype(np.float64)
    return vals


def _wide_expected(name, q, mode):
    if name == "fp32":
        return np.array([round_to_ieee(v, 8, 23, mode) for v in q])
    o = TableOracle(SPECS[name])
    return o.value_of(o.round_exact(q, mode))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sqrt", "fma"])
@pytest.mark.parametrize("name", ["fp16", "bf16", "tf32", "fp32"])
def test_wide_formats_edge_biased(name, op):
    rng = np.random.default_rng([7, len(name), len(op)])
    n = 600
    a, b, c = (edge_operands(name, n, rng) for _ in range(3))
    if op == "add":  # add cancellations: b close to -a
        b[: n // 4] = -a[: n // 4]
    if op == "fma":  # c close to -a*b, so the product's low bits decide
        c[: n // 3] = -fpemu.mul(a[: n // 3], b[: n // 3], name)
    if op == "sqrt":
        a = np.abs(a)
    for mode in MODES:
        q = [exact(op, x, y, z, mode) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())]
        want = _wide_expected(name, q, mode)
        args = {"sqrt": (a,), "fma": (a, b, c)}.get(op, (a, b))
        got = OPS[op](*args, name, rounding=mode)
        assert_same(got, want, f"{name} {op} {mode}", a, b, c)


def test_fp32_rne_matches_numpy_float32():
    """numpy's float32 arithmetic is IEEE binary32 with round to nearest even."""
    rng = np.random.default_rng(3)
    a = edge_operands("fp32", 20000, rng).astype(np.float32)
    b = edge_operands("fp32", 20000, rng).astype(np.float32)
    with np.errstate(all="ignore"):
        assert_same(fpemu.add(a, b, "fp32"), a + b, "add", a, b)
        assert_same(fpemu.sub(a, b, "fp32"), a - b, "sub", a, b)
        assert_same(fpemu.mul(a, b, "fp32"), a * b, "mul", a, b)
        assert_same(fpemu.div(a, b, "fp32"), a / b, "div", a, b)
        assert_same(fpemu.sqrt(np.abs(a), "fp32"), np.sqrt(np.abs(a)), "sqrt", a)


def test_fp32_fma_rounds_once_where_float64_would_round_twice():
    a = b = np.float32(1 + 2**-12)     # a*b = 1 + 2**-11 + 2**-24: a float32 tie...
    c = np.float32(2**-80)             # ... and c puts the exact sum just above it
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    assert naive == np.float32(1 + 2**-11)
    want = round_to_ieee(Fraction(float(a)) ** 2 + Fraction(2**-80), 8, 23)
    assert want == 1 + 2**-11 + 2**-23
    assert float(fpemu.fma(a, b, c, "fp32")) == want
    assert float(fpemu.fma(a, b, -c, "fp32")) == 1 + 2**-11   # just below the tie: down


# ------------------------------------------------------------- semantics
def test_ieee_special_cases():
    inf, nan = math.inf, math.nan
    assert np.isnan(fpemu.add(inf, -inf, "fp16"))
    assert np.isnan(fpemu.mul(0.0, inf, "bf16"))
    assert np.isnan(fpemu.fma(0.0, inf, 1.0, "fp32"))
    assert np.isnan(fpemu.sqrt(-1.0, "fp16"))
    assert np.isnan(fpemu.add(nan, 1.0, "fp16"))
    assert fpemu.div(-1.0, 0.0, "fp16") == -inf
    assert np.signbit(fpemu.sqrt(-0.0, "fp16"))
    for mode in ("rne", "rna", "rtz", "rup", "rto", "sr"):
        assert not np.signbit(fpemu.add(1.0, -1.0, "fp16", rounding=mode, seed=1)), mode
        assert not np.signbit(fpemu.sub(2.0, 2.0, "bf16", rounding=mode, seed=1)), mode
    assert np.signbit(fpemu.add(1.0, -1.0, "fp16", rounding="rdn"))
    assert np.signbit(fpemu.add(-0.0, -0.0, "fp16"))
    assert not np.signbit(fpemu.add(-0.0, 0.0, "fp16"))
    assert np.signbit(fpemu.fma(1.0, -2.0, 2.0, "fp32", rounding="rdn"))


def test_division_by_zero_in_a_format_without_inf_follows_the_policy():
    assert float(fpemu.div(1.0, 0.0, "e4m3fn")) == 448.0           # saturates (default)
    assert np.isnan(fpemu.div(1.0, 0.0, "e4m3fn", overflow="nan"))


def test_broadcasting_and_shapes():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = fpemu.mul(a, np.float32([1.0, 2.0, 0.5]), "bf16")
    assert got.shape == (2, 3) and got.dtype == np.float32
    assert np.array_equal(got, a * np.float32([1.0, 2.0, 0.5]))
    assert fpemu.add(1.0, 2.0, "fp16").shape == ()
    assert fpemu.add(np.zeros((0, 3)), 1.0, "fp16").shape == (0, 3)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    a = np.full(200000, 1.0, np.float32)
    b = np.full(200000, 2.0**-9, np.float32)  # 1 + 2**-9: a quarter of a bf16 ulp above 1
    r1 = fpemu.add(a, b, "bf16", rounding="sr", seed=5)
    r2 = fpemu.add(a, b, "bf16", rounding="sr", seed=5)
    assert np.array_equal(r1, r2)
    assert set(np.unique(r1).tolist()) == {1.0, 1.0078125}
    frac = float(np.mean(r1 == 1.0078125))
    sigma = math.sqrt(0.25 * 0.75 / a.size)
    assert abs(frac - 0.25) < 5 * sigma


def test_operand_not_in_format_is_an_error():
    with pytest.raises(ValueError, match=r"operand b holds 1 value.*not bfloat16 values.*"
                                         r"fpemu.quantize\(b, 'bf16'\)"):
        fpemu.add(1.0, 0.1, "bf16")
    with pytest.raises(ValueError, match="operand a .* not float8_e4m3fn"):
        fpemu.mul(np.inf, 1.0, "e4m3fn")   # e4m3fn has no infinity
    with pytest.raises(ValueError, match="operand a .*float8_e4m3fnuz"):
        fpemu.mul(-0.0, 1.0, "e4m3fnuz")   # fnuz has no -0
    with pytest.raises(ValueError, match="operand c"):
        fpemu.fma(1.0, 1.0, 1e-30, "fp16")


def test_nan_result_without_nan_is_an_error():
    with pytest.raises(ValueError, match="flat index 1 is NaN.*float4_e2m1fn has no NaN"):
        fpemu.div([1.0, 0.0], [1.0, 0.0], "e2m1")
    with pytest.raises(ValueError, match="flat index 0 is NaN.*float6_e3m2fn has no NaN"):
        fpemu.sqrt(-1.0, "e3m2")
    with pytest.raises(ValueError, match="do not broadcast"):
        fpemu.add(np.zeros(3), np.zeros(4), "fp16")
