"""Hypothesis properties of quantize, over float64 values and every format.

Each property is stated for every named format and mode; where a property
needs a neighbour or a spacing, it comes from the table oracle (no fpemu code).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import fpemu
from oracle import MODES, SPECS, TableOracle

NAMES = list(SPECS)
SIGNED = [n for n in NAMES if SPECS[n].signed]
_oracles = {}


def oracle(name):
    if name not in _oracles and SPECS[name].E + SPECS[name].M <= 20:
        _oracles[name] = TableOracle(SPECS[name])
    return _oracles.get(name)


finite = st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=True, width=64)
reals = st.floats(allow_nan=True, allow_infinity=True, width=64)


def q(x, name, mode="rne", **kw):
    return float(fpemu.quantize(np.float64(x), name, rounding=mode, **kw))


def in_range(name, x):
    """Finite x whose rounding cannot overflow (|x| <= max)."""
    return abs(x) <= fpemu.format(name).max


@given(st.sampled_from(NAMES), st.sampled_from(MODES), finite)
@example("bf16", "rne", 1 + 2**-8 + 2**-30)
@example("fp16", "rne", 65520.0)
@example("e4m3fn", "rne", 464.0)
@example("e8m0", "rne", 3.0)
def test_idempotent(name, mode, x):
    if not fpemu.format(name).signed:
        x = abs(x)
    once = fpemu.quantize(x, name, rounding=mode)
    twice = fpemu.quantize(once, name, rounding=mode)
    assert np.array_equal(once.view(np.uint32), twice.view(np.uint32)) or (
        np.isnan(once) and np.isnan(twice))


@given(st.sampled_from(NAMES), st.sampled_from(MODES), finite, finite)
@example("fp16", "rne", 65519.0, 65520.0)
def test_monotone(name, mode, a, b):
    fmt = fpemu.format(name)
    if not fmt.signed:
        a, b = abs(a), abs(b)
    lo, hi = min(a, b), max(a, b)
    if fmt.nan_encoding == "fnuz" and fmt.default_overflow == "nan":
        kw = dict(overflow="saturate")  # NaN is unordered
    elif name == "e8m0":
        kw = dict(overflow="saturate")
        if lo == 0:
            return  # zero is NaN in e8m0
    else:
        kw = {}
    assert q(lo, name, mode, **kw) <= q(hi, name, mode, **kw)


@given(st.sampled_from(NAMES), finite)
@example("fp16", 2.0**-25)
@example("e4m3fn", -450.0)
def test_directed_modes_bracket_the_input(name, x):
    fmt = fpemu.format(name)
    if not fmt.signed:
        x = abs(x)
    if not in_range(name, x) or (not fmt.has_zero and abs(x) < fmt.min_normal):
        return
    down, up = q(x, name, "rdn"), q(x, name, "rup")
    assert down <= x <= up
    assert q(x, name, "rtz") == (down if x >= 0 else up)
    if down == up:
        assert down == x  # exact: every mode gives x
        assert all(q(x, name, m) == x for m in MODES)
    else:
        for m in MODES:
            assert q(x, name, m) in (down, up)


@given(st.sampled_from([n for n in NAMES if oracle(n) is not None]), finite)
@example("fp16", 65519.0)
@example("bf16", 3 * 2.0**-134)
def test_rne_error_is_at_most_half_an_ulp(name, x):
    fmt = fpemu.format(name)
    if not fmt.signed:
        x = abs(x)
    if not in_range(name, x) or (not fmt.has_zero and abs(x) < fmt.min_normal):
        return
    o = oracle(name)
    vals = o.values
    a = abs(x)
    i = np.searchsorted(vals, a, side="right") - 1
    spacing = (vals[i + 1] - vals[i]) if i + 1 < vals.size else o.ext_values[-1] - vals[-1]
    r = q(x, name)
    assert abs(r - x) <= spacing / 2
    r_na = q(x, name, "rna")
    assert abs(r_na - x) <= spacing / 2


@given(st.sampled_from(SIGNED), st.sampled_from(MODES), reals)
@example("fp16", "rne", -0.0)
@example("e4m3fnuz", "rtz", -1e-30)
def test_sign_symmetry(name, mode, x):
    """rne, rna, rtz, rto are odd functions; rup(-x) = -rdn(x)."""
    fmt = fpemu.format(name)
    if np.isnan(x) and not fmt.has_nan:
        return
    mirror = {"rup": "rdn", "rdn": "rup"}.get(mode, mode)
    a = fpemu.quantize(np.float64(x), name, rounding=mode)
    b = fpemu.quantize(np.float64(-x), name, rounding=mirror)
    if np.isnan(a):
        assert np.isnan(b)
    elif fmt.nan_encoding == "fnuz" and a == 0:
        assert b == 0 and not np.signbit(a) and not np.signbit(b)  # fnuz has no -0
    else:
        assert a.view(np.uint32) == (-b).view(np.uint32)


@given(st.sampled_from(NAMES), st.sampled_from(MODES + ("sr",)), reals)
def test_quantize_is_decode_of_encode(name, mode, x):
    fmt = fpemu.format(name)
    if np.isnan(x) and not fmt.has_nan:
        return
    v = fpemu.quantize(x, name, rounding=mode, seed=3)
    c = fpemu.encode(x, name, rounding=mode, seed=3)
    d = fpemu.decode(c, name)
    assert (np.isnan(v) and np.isnan(d)) or v.view(np.uint32) == d.view(np.uint32)


@given(st.sampled_from(NAMES), st.sampled_from(MODES),
       st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_float32_and_float64_inputs_agree(name, mode, x):
    fmt = fpemu.format(name)
    if not fmt.signed:
        x = abs(x)
    a = fpemu.encode(np.float32(x), name, rounding=mode)
    b = fpemu.encode(np.float64(np.float32(x)), name, rounding=mode)
    assert a == b


# ------------------------------------------------------------ stochastic rounding
@pytest.mark.parametrize("name,x", [("bf16", 1 + 2**-9), ("bf16", 1 + 0.3 * 2**-7),
                                    ("fp16", 2.0**-26), ("e4m3fn", 0.3), ("e2m1", 2.6),
                                    ("e5m2", -3 * 2.0**-18)])
def test_sr_rounds_up_with_the_fractional_probability(name, x):
    n = 200_000
    down = q(x, name, "rdn")
    up = q(x, name, "rup")
    p = (x - down) / (up - down)
    r = fpemu.quantize(np.full(n, x), name, rounding="sr", seed=12345)
    assert set(np.unique(r).tolist()) <= {down, up}
    k = int(np.sum(r == up))
    # 5 standard deviations of Binomial(n, p): fails by chance with prob ~6e-7
    assert abs(k - n * p) <= 5 * np.sqrt(n * p * (1 - p)), (k, n * p)


def test_sr_on_exact_values_is_exact():
    x = fpemu.decode(np.arange(256, dtype=np.uint8), "e4m3fn")
    x = x[~np.isnan(x)]
    for seed in range(5):
        assert np.array_equal(fpemu.quantize(x, "e4m3fn", rounding="sr", seed=seed).view(
            np.uint32), x.view(np.uint32))


def test_sr_is_reproducible_and_seed_dependent():
    x = np.random.default_rng(0).standard_normal(10_000)
    a = fpemu.encode(x, "bf16", rounding="sr", seed=7)
    assert np.array_equal(a, fpemu.encode(x, "bf16", rounding="sr", seed=7))
    assert not np.array_equal(a, fpemu.encode(x, "bf16", rounding="sr", seed=8))


def test_sr_does_not_depend_on_thread_count_or_chunking():
    x = np.random.default_rng(1).standard_normal(100_003).astype(np.float32)
    before = numba.get_num_threads()
    try:
        results = []
        for threads in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(threads)
            results.append(fpemu.encode(x, "e5m2", rounding="sr", seed=99))
    finally:
        numba.set_num_threads(before)
    assert all(np.array_equal(results[0], r) for r in results[1:])
    whole = results[0]
    # chunk by chunk, each chunk told its offset in the whole array
    pieces = [fpemu.encode(x[i:i + 9999], "e5m2", rounding="sr", seed=(99, i))
              for i in range(0, x.size, 9999)]
    assert np.array_equal(np.concatenate(pieces), whole)
    # the layout of the input does not matter: element order is C order
    m = x[:100_000].reshape(100, 1000)
    assert np.array_equal(fpemu.encode(np.asfortranarray(m), "e5m2", rounding="sr", seed=99),
                          whole[:100_000].reshape(100, 1000))


def test_sr_without_seed_is_fresh_each_call():
    x = np.full(1000, 1 + 2**-9)
    a = fpemu.encode(x, "bf16", rounding="sr")
    b = fpemu.encode(x, "bf16", rounding="sr")
    assert not np.array_equal(a, b)
