"""Block formats checked without torch or torchao: exact rationals, the
rules' definitions, layouts, stochastic rounding's probabilities, the
recipes' settings and the errors. (tests/test_block.py holds the
comparisons with torchao and TransformerEngine's reference, which need
torch.)"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from block_data import E2M1_VALUES, spread
from fpemu import block


@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1"])
def test_rceil_exact_is_the_smallest_power_of_two_that_clips_nothing(elem):
    """``"rceil-exact"`` against exact rationals: the smallest e with
    amax <= elem_max * 2**e, over amaxes at and one ulp either side of
    elem_max * 2**k (subnormal float32 included), zero and inf."""
    emax = {"e4m3fn": 448.0, "e5m2": 57344.0, "e2m3": 7.5, "e3m2": 28.0, "e2m1": 6.0}[elem]
    base = np.array([emax * 2.0**k for k in range(-140, 110, 7)], np.float32)
    base = base[(base > 0) & np.isfinite(base)]
    amax = np.concatenate([base, np.nextafter(base, np.float32(0)),
                           np.nextafter(base, np.float32(np.inf)), [0.0, np.inf]])
    x = np.zeros((amax.size, 32), np.float32)
    x[:, 5] = amax
    q = block.quantize_blocks(x, elem, "e8m0", 32, scale_rule="rceil-exact")

    def want(a):
        if a == 0:
            return 0
        if np.isinf(a):
            return 254
        d, e = Fraction(float(a)) / Fraction(emax), -200
        while Fraction(2) ** e < d:
            e += 1
        return min(127, max(-127, e)) + 127
    np.testing.assert_array_equal(q.scales[:, 0], [want(a) for a in amax])


def test_nvfp4_nan_block_is_nan_and_negative_zero_is_kept():
    x = spread((2, 32), 11, -2, 2)
    x[0, 20] = np.nan
    q = block.quantize_blocks(x, "nvfp4", tensor_amax=8.0)
    assert q.scales[0, 1] == 0x7F                        # e4m3fn NaN
    v = q.values
    assert np.isnan(v[0, 16:]).all() and not np.isnan(v[0, :16]).any()
    assert not np.isnan(v[1]).any()
    # -0.0 and tiny negatives keep their sign (code 8); TE's Python table
    # sends an exact -0.0 to code 0, the hardware conversion keeps the sign
    y = np.array([[6.0, -0.0, -1e-6, 0.0] + [1.0] * 12], np.float32)
    q = block.quantize_blocks(y, "nvfp4")
    assert q.codes[0, 1:4].tolist() == [8, 8, 0]


def test_every_e2m1_code_under_every_e4m3_scale():
    """Exhaustive: for each positive finite e4m3fn scale s and each e2m1
    code c, a block holding 6 s (the anchor) and c's value times s
    quantizes (tensor scale exactly 1) to scale s and code c, and
    dequantizes to exactly value(c) * s."""
    scales = []
    for code in range(1, 0x7F):
        e, m = code >> 3, code & 7
        scales.append((code, (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)))
    rows = []
    for code, s in scales:
        row = [6.0 * s] + [E2M1_VALUES[c] * s for c in range(16)] + [0.0] * 15
        rows.append(row)
    rows.append([2688.0] + [0.0] * 31)
    x = np.array(rows, np.float32)
    q = block.quantize_blocks(x, "nvfp4")
    assert q.tensor_scale == 1.0
    np.testing.assert_array_equal(q.scales[:-1, 0], [c for c, _ in scales])
    np.testing.assert_array_equal(q.codes[:-1, 1:17], np.tile(np.arange(16), (len(scales), 1)))
    want = np.array([[E2M1_VALUES[c] * s for c in range(16)] for _, s in scales])
    got = q.values[:-1, 1:17]
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got) == np.signbit(want)).all()


def test_blocks_along_any_axis_and_padded_tails():
    x = spread((3, 50, 7), 13, -5, 5)
    q = block.quantize_blocks(x, "mxfp8", axis=1)
    assert q.codes.shape == x.shape and q.scales.shape == (3, 2, 7)
    for i in range(3):
        for j in range(7):
            col = np.zeros(64, np.float32)
            col[:50] = x[i, :, j]
            one = block.quantize_blocks(col, "mxfp8")
            np.testing.assert_array_equal(one.codes[:50], q.codes[i, :, j])
            np.testing.assert_array_equal(one.scales, q.scales[i, :, j])
    np.testing.assert_array_equal(q.values, np.moveaxis(
        block.quantize_blocks(np.moveaxis(x, 1, -1), "mxfp8").values, -1, 1))


def test_2d_tiles_share_one_scale_per_tile():
    x = spread((40, 300), 14, -4, 4)
    q = block.quantize_blocks(x, "fp8-block")
    assert q.scales.shape == (1, 3) and q.codes.shape == x.shape
    sv = q.scale_values
    assert np.all(np.log2(sv) == np.round(np.log2(sv)))             # powers of two
    for j in range(3):
        tile = x[:, 128 * j:128 * (j + 1)]
        amax = np.float32(np.max(np.abs(tile)))
        assert sv[0, j] >= amax / 448 and sv[0, j] < 2 * amax / 448
    assert np.all(np.abs(q.values - x) <= np.abs(x) * 2.0**-4 + sv.max() * 2.0**-9)


def test_sr_n_bits_round_up_with_probability_of_the_top_n_bits():
    """e2m1 at 1.0 has spacing 0.5. 1.0 + 0.5 * (3/8) has top 3 bits 011:
    up with probability 3/8 under sr3; 1.0 + 0.5 * 2**-4 has zero in the
    top 3 bits: never up under sr3, sometimes under full-width sr."""
    n = 40000
    x = np.empty((n, 16), np.float32)
    x[:, 0] = 6.0
    x[:, 1] = 1.0 + 0.5 * 3 / 8
    x[:, 2] = -(1.0 + 0.5 * 2.0**-4)
    x[:, 3] = 1.0 + 0.5 * (3 / 8 + 2.0**-6)      # bits below the top 3 are dropped
    x[:, 4:] = 0.0
    q = block.quantize_blocks(x, "e2m1", "e8m0", 16, scale_rule="floor", rounding="sr3",
                              seed=5)
    assert (q.scales == 127).all()
    v = q.values
    up = (v[:, 1] == 1.5).mean()
    assert abs(up - 3 / 8) < 4 * np.sqrt(3 / 8 * 5 / 8 / n)
    assert (v[:, 2] == -1.0).all()
    assert abs((v[:, 3] == 1.5).mean() - 3 / 8) < 4 * np.sqrt(3 / 8 * 5 / 8 / n)
    again = block.quantize_blocks(x, "e2m1", "e8m0", 16, scale_rule="floor", rounding="sr3",
                                  seed=5)
    np.testing.assert_array_equal(again.codes, q.codes)
    full = block.quantize_blocks(x, "e2m1", "e8m0", 16, scale_rule="floor", rounding="sr",
                                 seed=5).values
    assert 0 < (full[:, 2] == -1.5).mean() < 0.1


def test_sr8_nvfp4_is_unbiased_on_average():
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2000, 16)) * 2).astype(np.float32)
    x[:, 0] = 6.0
    vals = np.mean([block.quantize_blocks(x, "nvfp4", rounding="sr8", seed=s).values
                    for s in range(8)], axis=0)
    rne = block.quantize_blocks(x, "nvfp4").values
    bias_sr = abs(float(np.mean(vals[:, 1:] - x[:, 1:])))
    assert bias_sr < 2e-3
    assert np.mean(np.abs(vals - x)) < np.mean(np.abs(rne - x))


def test_rht_spreads_an_outlier_over_its_block():
    x = np.zeros((1, 16), np.float32)
    x[0, 5] = 100.0
    y = block.hadamard(x)
    assert np.all(np.abs(y) == 25.0)


def test_errors_name_what_was_expected():
    with pytest.raises(ValueError, match="scale_rule 'nvfp4' needs a small float scale"):
        block.quantize_blocks(np.ones(32, np.float32), "e2m1", "e8m0", 32, scale_rule="nvfp4")
    with pytest.raises(ValueError, match="unknown scale_rule"):
        block.quantize_blocks(np.ones(32, np.float32), "mxfp8", scale_rule="round")
    with pytest.raises(ValueError, match="not float32 values.*fpemu.quantize"):
        block.quantize_blocks(np.array([0.1] * 32), "mxfp8")
    with pytest.raises(TypeError, match="block must be an int"):
        block.quantize_blocks(np.ones(32, np.float32), "mxfp8", block=2.5)
    with pytest.raises(ValueError, match="needs seed="):
        block.quantize_blocks(np.ones(32, np.float32), "mxfp4", rounding="sr8")
    with pytest.raises(ValueError, match="power of four"):
        block.hadamard(np.ones(8, np.float32), size=8)


def test_high_precision_modules_skip_the_recipe():
    import fpemu.autograd as ft
    from fpemu.autograd import fp8, nn
    ft.manual_seed(4)
    net = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 16))
    x = ft.randn(16, 32)
    plain0 = net[0](x).detach().numpy()
    r = fp8.NVFP4BlockScaling(high_precision_modules=(net[0],))
    with fp8.fp8_autocast(fp8_recipe=r):
        h = net[0](x)
        y = net[1](h)
    np.testing.assert_array_equal(h.detach().numpy(), plain0)
    plain1 = net[1](h).detach().numpy()
    assert not np.array_equal(y.detach().numpy(), plain1)
    r_all = fp8.NVFP4BlockScaling(high_precision_modules=(net,))
    with fp8.fp8_autocast(fp8_recipe=r_all):
        np.testing.assert_array_equal(net(x).detach().numpy(), net[1](net[0](x)).detach()
                                      .numpy())


def test_mxfp8_recipe_scale_rules_and_2d_weights():
    from fpemu.autograd import fp8
    rng = np.random.default_rng(21)
    W = (rng.standard_normal((64, 96)) * np.exp2(rng.integers(-4, 4, (64, 96)))).astype(
        np.float32)
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 500.0
    up = fp8.MXFP8BlockScaling()
    assert up.scale_rule == "rceil"
    with pytest.warns(DeprecationWarning, match="pass scale_rule='floor'"):
        assert fp8.MXFP8BlockScaling(scale_rounding="down").scale_rule == "floor"
    q = up.quantize(x, fp8.e4m3fn, "input")
    assert q.scale_values[0, 0] == 2.0 and q.values[0, 0] == 512.0   # 500 / 2 = 250 -> 256
    q = fp8.MXFP8BlockScaling(scale_rule="floor").quantize(x, fp8.e4m3fn, "input")
    assert q.scale_values[0, 0] == 1.0 and q.values[0, 0] == 448.0   # clipped
    r = fp8.MXFP8BlockScaling(block_2d_weights=True)
    qw = r.quantize(W, fp8.e4m3fn, "weight")
    qt = r.transpose(W, qw, fp8.e4m3fn, "weight")
    assert qw.block == (32, 32) and qw.scales.shape == (2, 3)      # one scale per tile
    np.testing.assert_array_equal(qt.values, qw.values.T)
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        fp8.MXFP8BlockScaling(scale_rule="round")


def test_fp32_block_scales_follow_te_compute_scale_from_amax():
    """Per-block encode scales: 448 / amax in float32, rounded down to a power
    of two (Float8BlockScaling); zero blocks get scale 1."""
    x = spread((4, 512), 23, -10, 10)
    x[0, :128] = 0.0
    for rule in ("pow2", "current"):
        q = block.quantize_blocks(x, "e4m3fn", "fp32", 128, scale_rule=rule)
        dec = q.scale_values
        for i in range(4):
            for j in range(4):
                amax = np.float32(np.max(np.abs(x[i, 128 * j:128 * (j + 1)])))
                enc = np.float32(448.0) / amax if amax > 0 else np.float32(1.0)
                if rule == "pow2":
                    enc = np.float32(2.0 ** np.floor(np.log2(enc)))
                assert dec[i, j] == np.float32(np.float32(1.0) / enc), (rule, i, j)


def test_fp32_scales_with_nan_keep_the_nan():
    x = spread((2, 256), 25, -2, 2)
    x[0, 5] = np.nan
    q = block.quantize_blocks(x, "fp8-block-1d")          # e4m3fn has a NaN: TE's cast
    v = q.values
    assert np.isnan(v[0, 5]) and np.isnan(v).sum() == 1
    q = block.quantize_blocks(x, "e2m1", "fp32", 128, scale_rule="pow2")   # no NaN code
    v = q.values
    assert np.isnan(v[0, :128]).all() and not np.isnan(v[0, 128:]).any()


def test_the_rule_table_and_the_typed_results():
    """Every preset names a rule of the table; each rule has a kind that
    says which scale format it takes; results carry their declared fields
    and survive pickling."""
    import pickle
    assert {p.scale_rule for p in block.PRESETS.values()} <= set(block.SCALE_RULES)
    assert {r.kind for r in block.SCALE_RULES.values()} == {"mx", "fp4", "fp32"}
    assert block.MX_RULES == tuple(n for n, r in block.SCALE_RULES.items() if r.kind == "mx")
    assert set(block.MX_RULES) >= {"floor", "rceil", "ceil", "even", "rceil-exact", "nearest"}
    with pytest.raises(TypeError, match="block must be an int >= 1 or a pair"):
        block.BlockSpec("bad", "e2m1", "e8m0", 0, "floor", "test")
    x = spread((4, 64), 31, -3, 3)
    for preset in block.PRESETS:
        q = block.quantize_blocks(x, preset)
        r = pickle.loads(pickle.dumps(q))
        np.testing.assert_array_equal(r.codes, q.codes)
        np.testing.assert_array_equal(r.scales, q.scales)
        assert (r.elem, r.scale_fmt, r.block, r.axis, r.scale_rule, r.rounding, r.shape) == \
            (q.elem, q.scale_fmt, q.block, q.axis, q.scale_rule, q.rounding, q.shape)
        np.testing.assert_array_equal(r.values, q.values)


def test_the_nearest_rule_rounds_the_quotient_to_the_nearest_power_of_two():
    """``"nearest"`` (ml_dtypes' E8M0 cast, the scale of
    ``MXFP8BlockScaling(scale_rule="nearest")``): the float32 quotient
    ``amax / elem_max`` to the nearer power of two, a tie (1.5 * 2**k) up;
    a zero or NaN amax takes 2**-127 and no block is marked NaN. The oracle
    reads the quotient's exponent and first mantissa bit from Python's
    float.hex, sharing nothing with the rule."""
    rng = np.random.default_rng(5)
    amax = np.float32(2.0) ** rng.integers(-130, 120, 400).astype(np.float32) * \
        rng.uniform(1, 2, 400).astype(np.float32)
    amax[:4] = [0.0, 448 * 1.5, 448 * 1.4999999, 448 * 0.75]
    x = np.zeros((400, 32), np.float32)
    x[:, 0] = amax
    q = block.quantize_blocks(x, "e4m3fn", "e8m0", 32, scale_rule="nearest")

    def oracle(a):
        d = float(np.float32(np.float32(a) / np.float32(448.0)))
        if not d > 0:
            return -127
        mant, exp = d.hex().split("p")
        e = int(exp) if mant.startswith("0x1") else int(exp) - 1
        half = d >= 1.5 * 2.0 ** e if mant.startswith("0x1") else False
        return max(-127, min(127, e + half))

    want = np.array([oracle(a) for a in amax]) + 127
    np.testing.assert_array_equal(q.scales[:, 0].astype(np.int64), want)
    assert q.scales[1, 0] == 128 and q.scales[2, 0] == 127 and q.scales[3, 0] == 127
    nan = block.quantize_blocks(np.full((1, 32), np.nan, np.float32), "mxfp8",
                                scale_rule="nearest")
    assert nan.scales[0, 0] == 0 and np.isnan(nan.values).all()
    nan = block.quantize_blocks(np.full((1, 32), np.nan, np.float32), "mxfp4",
                                scale_rule="nearest")     # e2m1 has no NaN: the NaN scale
    assert nan.scales[0, 0] == 0xFF and np.isnan(nan.values).all()
