"""Block-scaled formats against torchao's MX and NVFP4 quantizers, a
test-side transcription of TransformerEngine's NVFP4 reference quantizer,
and exhaustive tables.

None of the oracles here calls fpemu: torchao runs its own PyTorch code;
the TransformerEngine oracle below is written from the formulas of
``NVFP4QuantizerRef._quantize_blockwise_reference`` in
``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` (TE commit
1498424: the block scale is ``vec_max * (S * reciprocal(6))``; before commit
d0067d0, ``(vec_max / 6) * S``) in PyTorch float32 arithmetic, with its
threshold table for e2m1.
"""

from __future__ import annotations

import logging
from fractions import Fraction

import numpy as np
import pytest

from fpemu import block

torch = pytest.importorskip("torch")
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from torchao.prototype.mx_formats.constants import (  # noqa: E402
    DTYPE_FP6_E2M3,
    DTYPE_FP6_E3M2,
)
from torchao.prototype.mx_formats.kernels import unpack_uint4  # noqa: E402
from torchao.prototype.mx_formats.nvfp4_tensor import (  # noqa: E402
    nvfp4_quantize,
    per_tensor_amax_to_scale,
)

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
TORCHAO_ELEMS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
                 "e2m3": DTYPE_FP6_E2M3, "e3m2": DTYPE_FP6_E3M2,
                 "e2m1": torch.float4_e2m1fn_x2}


def spread(shape, seed, lo=-30, hi=30):
    """float32 values whose rows span many binades, with planted edge blocks."""
    rng = np.random.default_rng(seed)
    rows = (shape[0],) + (1,) * (len(shape) - 1)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(lo, hi, rows))
    x *= np.exp2(rng.integers(-3, 4, shape))
    return x.astype(np.float32)


# ------------------------------------------------------------- torchao MX
def torchao_mx(x, elem, mode, block=32):
    s, d = mx.to_mx(torch.tensor(x), TORCHAO_ELEMS[elem], block,
                    getattr(ScaleCalculationMode, mode.upper()))
    s = s.view(torch.uint8).numpy()
    if elem in ("e4m3fn", "e5m2"):
        d = d.view(torch.uint8).numpy()
    elif elem == "e2m1":
        d = unpack_uint4(d.view(torch.uint8)).numpy()
    else:
        d = d.numpy()
    return s, d


@pytest.mark.parametrize("mode", ["floor", "rceil", "ceil", "even"])
@pytest.mark.parametrize("elem", sorted(TORCHAO_ELEMS))
def test_mx_matches_torchao_bit_for_bit(mode, elem):
    """Scale and element codes of torchao's ``to_mx`` (every scale mode,
    every element format) on 128 x 512 values over 60 binades, with zero
    blocks, an infinity, a block at the largest float32 values and blocks
    whose amax is exactly a power of two (the boundary of every rule)."""
    x = spread((128, 512), [len(mode), len(elem)])
    x[0, :32] = 0.0
    x[1, 32:64] = np.float32(np.finfo(np.float32).max) * np.float32(0.75)
    x[2, 7] = np.inf
    x[3, 64:96] = np.float32(2.0**-5)
    x[4, :] = np.exp2(np.arange(-100, 412) % 200 - 100).astype(np.float32)
    x[5, :32] = np.float32(448.0 * 2**-30)
    want_s, want_d = torchao_mx(x, elem, mode)
    q = block.quantize_blocks(x, elem, "e8m0", 32, scale_rule=mode)
    assert q.scales.dtype == np.uint8 and q.scales.shape == (128, 16)
    np.testing.assert_array_equal(q.scales, want_s)
    np.testing.assert_array_equal(q.codes, want_d)


def test_mx_nan_block_has_the_nan_scale_as_torchao():
    x = spread((4, 64), 3)
    x[1, 40] = np.nan
    for mode in ("floor", "ceil", "even", "rceil"):
        want_s, _ = torchao_mx(x, "e4m3fn", mode)
        q = block.quantize_blocks(x, "e4m3fn", "e8m0", 32, scale_rule=mode)
        np.testing.assert_array_equal(q.scales, want_s)
        assert q.scales[1, 1] == 0xFF
        v = q.values
        assert np.isnan(v[1, 32:]).all() and not np.isnan(v[1, :32]).any()
        assert not np.isnan(np.delete(v, 1, axis=0)).any()


def rceil_exact(amax, elem_max):
    """ceil(log2(fp32(amax / elem_max))) with exact rationals."""
    d = Fraction(float(np.float32(amax) / np.float32(elem_max)))
    e = d.numerator.bit_length() - d.denominator.bit_length()
    while Fraction(2) ** e < d:
        e += 1
    while Fraction(2) ** (e - 1) >= d:
        e -= 1
    return max(-127, min(127, e))


def test_rceil_is_exact_just_above_a_power_of_two():
    """amax / 448 one float32 ulp above a power of two must round the scale
    up. torchao's CPU fallback takes ``ceil(log2(.))`` in float32, where
    log2 of 2**k (1 + 2**-23) rounds to k: it keeps 2**k, and the block's
    largest element then clips to 448. fpemu follows the hardware rule
    (``cvt.rp``), checked here against exact rationals."""
    ks = np.arange(-20, 21)
    d = (np.exp2(ks) * (1 + 2.0**-23)).astype(np.float32)
    amax = np.array([np.nextafter(np.float32(v) * np.float32(448), np.float32(np.inf))
                     for v in d], np.float32)
    x = np.zeros((len(ks), 32), np.float32)
    x[:, 0] = amax
    q = block.quantize_blocks(x, "e4m3fn", "e8m0", 32, scale_rule="rceil")
    want = np.array([rceil_exact(a, 448.0) for a in amax]) + 127
    np.testing.assert_array_equal(q.scales[:, 0], want)
    assert not q.clipped.any()
    ao, _ = torchao_mx(x, "e4m3fn", "rceil")
    assert (ao[:, 0] != want).any(), "torchao's fallback now rounds exactly: update the docs"


# ---------------------------------------------------------- torchao NVFP4
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_torchao_preset_matches_torchao(seed):
    x = spread((64, 256), seed, -12, 12)
    x[0, :16] = 0.0
    x[3, 16:32] *= np.float32(2.0**-20)      # block scales clamped at 2**-6
    t = torch.tensor(x)
    pts = per_tensor_amax_to_scale(t.abs().max())
    s, d = nvfp4_quantize(t, 16, pts)
    q = block.quantize_blocks(x, "nvfp4-torchao")
    np.testing.assert_array_equal(q.scales, s.view(torch.uint8).numpy())
    np.testing.assert_array_equal(q.codes, unpack_uint4(d).numpy())
    assert np.float32(q.tensor_scale) == np.float32(pts.item())


@pytest.mark.parametrize("x", [np.array([[1e-36] + [0.0] * 15], np.float32),
                               np.full((1, 17), 1e-38, np.float32)],
                         ids=["tiny-amax", "tiny-amax-padded-tail"])
def test_nvfp4_torchao_tiny_tensor_amax_matches_torchao_but_zeros(x):
    """1/t overflows: torchao's nonzero elements become 6 and its scales 448,
    as fpemu's; its zero elements are 0 * inf = NaN written as a code (CPU:
    11), fpemu's are 0, with a warning naming the deviation."""
    t = torch.tensor(x)
    pts = per_tensor_amax_to_scale(t.abs().max())
    s, d = nvfp4_quantize(torch.nn.functional.pad(t, (0, (-x.shape[1]) % 16)), 16, pts)
    with pytest.warns(RuntimeWarning, match="torchao's element multiplier 1/t overflows"):
        q = block.quantize_blocks(x, "nvfp4-torchao")
    np.testing.assert_array_equal(q.scales, s.view(torch.uint8).numpy())
    ao = unpack_uint4(d).numpy()[:, :x.shape[1]]
    nz = x != 0
    np.testing.assert_array_equal(q.codes[nz], ao[nz])
    assert (q.codes[nz] == 7).all() and (q.codes[~nz] == 0).all()


# ------------------------------------------------------ rceil, inf blocks
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


def test_rceil_of_the_fp32_quotient_and_of_the_exact_one_part_below_2_to_minus_126():
    """amax one ulp above 448 * 2**-127: the float32 quotient rounds down to
    2**-127 (TE's kernel, torchao: scale code 0), the exact one is above it
    (code 1)."""
    a = np.nextafter(np.float32(448 * 2.0**-127), np.float32(1))
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = a
    assert block.quantize_blocks(x, "mxfp8", scale_rule="rceil").scales.tolist() == [[0]]
    assert block.quantize_blocks(x, "mxfp8", scale_rule="rceil-exact").scales.tolist() == [[1]]
    ao, _ = torchao_mx(x, "e4m3fn", "rceil")
    assert ao.tolist() == [[0]]


@pytest.mark.parametrize("rule", ["floor", "rceil", "ceil", "even", "rceil-exact"])
def test_an_infinity_saturates_its_block_or_makes_it_nan(rule):
    x = spread((4, 64), 11, -3, 3)
    x[1, 40] = -np.inf
    sat = block.quantize_blocks(x, "mxfp8", scale_rule=rule)
    nan = block.quantize_blocks(x, "mxfp8", scale_rule=rule, inf_block="nan")
    assert sat.scales[1, 1] != 0xFF and sat.values[1, 40] == -448.0 * 2.0 ** (
        int(sat.scales[1, 1]) - 127)
    assert nan.scales[1, 1] == 0xFF and np.isnan(nan.values[1, 32:]).all()
    keep = np.ones(sat.scales.shape, bool)
    keep[1, 1] = False
    np.testing.assert_array_equal(sat.scales[keep], nan.scales[keep])
    np.testing.assert_array_equal(np.delete(sat.codes, np.s_[32:], 1)[1],
                                  np.delete(nan.codes, np.s_[32:], 1)[1])
    if rule != "rceil-exact":
        want_s, _ = torchao_mx(x, "e4m3fn", rule)      # torchao 0.18 saturates
        np.testing.assert_array_equal(sat.scales, want_s)


# ------------------------------------------------ TransformerEngine NVFP4
def te_cast_to_fp4(x):
    """TE's threshold table (codes 0..15), ties to even."""
    r = torch.zeros_like(x, dtype=torch.uint8)
    for lo, hi, code, lo_in, hi_in in [
            (0.0, 0.25, 0, True, True), (0.25, 0.75, 1, False, False),
            (0.75, 1.25, 2, True, True), (1.25, 1.75, 3, False, False),
            (1.75, 2.5, 4, True, True), (2.5, 3.5, 5, False, False),
            (3.5, 5.0, 6, True, True)]:
        r[((x >= lo) if lo_in else (x > lo)) & ((x <= hi) if hi_in else (x < hi))] = code
    r[x > 5.0] = 7
    for lo, hi, code, lo_in, hi_in in [
            (-0.25, -0.0, 8, True, False), (-0.75, -0.25, 9, False, False),
            (-1.25, -0.75, 10, True, True), (-1.75, -1.25, 11, False, False),
            (-2.5, -1.75, 12, True, True), (-3.5, -2.5, 13, False, False),
            (-5.0, -3.5, 14, True, True)]:
        r[((x >= lo) if lo_in else (x > lo)) & ((x <= hi) if hi_in else (x < hi))] = code
    r[x < -5.0] = 15
    return r


def te_reference(x, tile=(1, 16), fp8_max=448.0, map_to=6.0, global_amax=None, fold=True):
    """TE's ``_quantize_blockwise_reference`` for one 2-D float32 tensor
    (padded to the tile like ``_pad_tensor``); returns element codes,
    e4m3fn scale codes per tile and the fp32 global decode scale. Global
    amax 0 gives encode scale 1 as TE's CUDA kernel (the Python reference
    would give FLT_MAX there; the codes are the same). ``fold``: the block
    scale as TE computes it now, ``vec_max * (S * reciprocal(6))``; else
    the older ``(vec_max / 6) * S``."""
    X = torch.tensor(x, dtype=torch.float32)
    M, N = X.shape
    ty, tx = tile
    Xp = torch.nn.functional.pad(X, (0, (-N) % tx, 0, (-M) % ty))
    m, n = Xp.shape
    amax = torch.max(torch.abs(X)) if global_amax is None else torch.tensor(global_amax)
    amax = amax.to(torch.float32)
    blocks = Xp.unfold(0, ty, ty).unfold(1, tx, tx)           # (m/ty, n/tx, ty, tx)
    vec_max = torch.amax(torch.abs(blocks), dim=(-1, -2))
    fmax = torch.tensor(torch.finfo(torch.float32).max)
    gen = torch.div(torch.tensor(fp8_max * 6.0, dtype=torch.float32), amax)
    gen = torch.min(gen, fmax)
    if amax == 0 or gen == 0:
        gen = torch.tensor(1.0, dtype=torch.float32)
    gdec = torch.div(torch.tensor(1.0, dtype=torch.float32), gen)
    if fold:
        mult = gen * torch.reciprocal(torch.tensor(map_to, dtype=torch.float32))
        ds = torch.min(vec_max * mult, fmax)
    else:
        ds = torch.div(vec_max, torch.tensor(map_to, dtype=torch.float32))
        ds = torch.min(ds * gen, fmax)
    ds = torch.clamp(ds, min=-448.0, max=448.0).to(torch.float8_e4m3fn)
    enc = torch.min(torch.div(1.0, ds.to(torch.float32) * gdec), fmax)
    full = enc.repeat_interleave(ty, 0).repeat_interleave(tx, 1)
    scaled = Xp * full
    clipped = torch.clamp(scaled, -6.0, 6.0)
    codes = te_cast_to_fp4(clipped)[:M, :N]
    return codes.numpy(), ds.view(torch.uint8).numpy(), np.float32(gdec.item())


@pytest.mark.parametrize("tile", [(1, 16), (16, 16)])
@pytest.mark.parametrize("shape", [(64, 256), (40, 72)])
def test_nvfp4_matches_transformer_engine_reference(tile, shape):
    """Random tensors, 1-D blocks and 16 x 16 tiles, with a padded tail
    (72 = 4.5 blocks, 40 rows = 2.5 tiles), zero blocks, blocks whose scales
    are e4m3 subnormals and a block at the tensor's amax (scale 448)."""
    x = spread(shape, [shape[0], tile[0]], -8, 8)
    x[:16, :16] = 0.0
    x[20:22, 32:48] *= np.float32(2.0**-14)    # scale below 2**-6: an e4m3 subnormal
    x = np.where(x == 0, np.float32(0), x)     # no -0.0 (TE's table maps it to +0)
    want_c, want_s, want_g = te_reference(x, tile)
    q = block.quantize_blocks(x, "e2m1", "e4m3fn", tile if tile[0] > 1 else 16,
                              scale_rule="nvfp4")
    np.testing.assert_array_equal(q.codes, want_c)
    np.testing.assert_array_equal(q.scales, want_s)
    assert np.float32(q.tensor_scale).view(np.uint32) == want_g.view(np.uint32)
    assert (q.scales < 8).any(), "no subnormal e4m3 scale was exercised"


@pytest.mark.parametrize("rule", ["nvfp4", "nvfp4-div6"])
def test_nvfp4_scale_rounding_boundaries_match_te(rule):
    """Block amaxes that put ``amax / 6 * S`` exactly on a midpoint between
    two e4m3 values (ties to even, both directions) and one float32 ulp to
    either side, under a tensor scale of 1 and one that is not a power of
    two; TE's current rule and its older one."""
    mids = []
    e4m3 = [v for v in (2.0 ** e * (1 + m / 8) for e in range(-6, 9) for m in range(8))
            if v <= 448]
    for lo, hi in zip(e4m3[20:60], e4m3[21:61]):
        mids.append((lo + hi) / 2)
    mids = np.array(mids, np.float32)
    amaxes = np.concatenate([mids, np.nextafter(mids, np.float32(0)),
                             np.nextafter(mids, np.float32(np.inf))]).astype(np.float32) * 6
    x = np.zeros((len(amaxes) + 1, 16), np.float32)
    x[:-1, 0] = amaxes
    x[:-1, 1:] = amaxes[:, None] * np.linspace(-0.9, 0.9, 15, dtype=np.float32)[None, :]
    x[-1, 0] = np.float32(2688.0)                 # global amax: S = 1 exactly
    fold = rule == "nvfp4"
    for amax in (None, 3.0):                      # S = 896: the two rules part
        want_c, want_s, _ = te_reference(x, global_amax=amax, fold=fold)
        q = block.quantize_blocks(x, "nvfp4", scale_rule=rule, tensor_amax=amax)
        np.testing.assert_array_equal(q.scales, want_s)
        np.testing.assert_array_equal(q.codes, want_c)


def test_nvfp4_current_te_rule_and_the_older_one_part_on_a_midpoint():
    """a / 6 * S = 10.5 exactly (a tie, to even: 10) in the older rule; TE's
    current fp32(S * fp32(1/6)) is a little above 149 1/3, so 11."""
    x = np.array([[0.0703125]], np.float32)
    for rule, code, fold in (("nvfp4", 83, True), ("nvfp4-div6", 82, False)):
        q = block.quantize_blocks(x, "nvfp4", tensor_amax=3.0, scale_rule=rule)
        assert q.scales.tolist() == [[code]]
        _, want_s, _ = te_reference(np.pad(x, ((0, 0), (0, 15))), global_amax=3.0, fold=fold)
        assert want_s.tolist() == [[code]]


def test_nvfp4_edge_tensors_match_te():
    # an infinity: the tensor scale falls back to 1 and its block saturates
    x = spread((8, 32), 9, -4, 4)
    x[2, 3] = np.inf
    want_c, want_s, want_g = te_reference(x)
    q = block.quantize_blocks(x, "nvfp4")
    np.testing.assert_array_equal(q.codes, want_c)
    np.testing.assert_array_equal(q.scales, want_s)
    assert q.scales[2, 0] == 0x7E and q.codes[2, 3] == 7 and want_g == 1
    # scale saturation: a block amax far above the global amax given
    y = spread((4, 32), 10, -2, 2)
    want_c, want_s, _ = te_reference(y, global_amax=1e-3)
    q = block.quantize_blocks(y, "nvfp4", tensor_amax=1e-3)
    np.testing.assert_array_equal(q.codes, want_c)
    np.testing.assert_array_equal(q.scales, want_s)
    assert (q.scales == 0x7E).all() and q.clipped.all()
    # an all-zero tensor
    z = np.zeros((2, 32), np.float32)
    q = block.quantize_blocks(z, "nvfp4")
    assert (q.codes == 0).all() and (q.scales == 0).all() and q.tensor_scale == 1
    assert (q.values == 0).all()


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


# ------------------------------------------------------------ 4 over 6
def test_four_over_six_picks_the_smaller_error_of_two_te_quantizations():
    x = spread((32, 128), 12, -6, 6)
    c6, s6, g = te_reference(x, fp8_max=256.0, map_to=6.0, fold=False)
    c4, s4, g4 = te_reference(x, fp8_max=256.0, map_to=4.0, fold=False)
    assert g == g4

    def sse(c, s):
        vals = np.array(E2M1_VALUES)[c.astype(int)]
        sv = torch.tensor(s).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
        deq = vals * np.repeat(sv, 16, axis=1) * np.float64(g)
        return ((x.astype(np.float64) - deq) ** 2).reshape(32, 8, 16).sum(-1)

    use4 = sse(c4, s4) < sse(c6, s6)
    assert 0 < use4.sum() < use4.size
    q = block.quantize_blocks(x, "nvfp4-4over6")
    np.testing.assert_array_equal(q.scales, np.where(use4, s4, s6))
    np.testing.assert_array_equal(q.codes, np.where(np.repeat(use4, 16, axis=1), c4, c6))
    plain = block.quantize_blocks(x, "nvfp4")

    def err(v):
        return float(((x.astype(np.float64) - v) ** 2).sum())
    assert err(q.values) < err(plain.values)


# --------------------------------------------------------- layout, tails
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


# ------------------------------------------------- stochastic rounding
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


# -------------------------------------------------------------- Hadamard
def test_hadamard_matches_a_float64_matmul_and_is_orthogonal():
    H = block.hadamard_matrix(16, "te")
    np.testing.assert_array_equal(H @ H.T, np.eye(16))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    y = block.hadamard(x)
    # TransformerEngine's get_wgrad_sign_vector(), copied from its source
    S = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0,
                      1.0, -1.0, -1.0], dtype=torch.float64)
    Hs = torch.tensor([[1.0]], dtype=torch.float64)
    while Hs.shape[0] < 16:
        Hs = torch.cat([torch.cat([Hs, Hs], 1), torch.cat([Hs, -Hs], 1)], 0)
    T = (torch.diag(S) @ Hs) / 4
    want = (torch.tensor(x, dtype=torch.float64).reshape(-1, 16) @ T).reshape(64, 48).float()
    np.testing.assert_array_equal(y, want.numpy())
    assert not np.array_equal(block.hadamard(x, signs=3), y)
    np.testing.assert_array_equal(block.hadamard(x, signs=3), block.hadamard(x, signs=3))


def test_rht_spreads_an_outlier_over_its_block():
    x = np.zeros((1, 16), np.float32)
    x[0, 5] = 100.0
    y = block.hadamard(x)
    assert np.all(np.abs(y) == 25.0)


# ----------------------------------------------------------------- errors
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


# ------------------------------------------------------------- recipes
def rht_oracle(x):
    """x (R, K) with each run of 16 along K times diag(s) H / 4, in float64
    then rounded once to float32 (exact sums for these inputs)."""
    S = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0,
                      1.0, -1.0, -1.0], dtype=torch.float64)
    H = torch.tensor([[1.0]], dtype=torch.float64)
    while H.shape[0] < 16:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    T = torch.diag(S) @ H / 4
    R, K = x.shape
    y = torch.tensor(x, dtype=torch.float64).reshape(-1, 16) @ T
    return y.reshape(R, K).float().numpy()


def test_nvfp4_recipe_operands_are_te_quantizations():
    from fpemu.autograd import fp8
    rng = np.random.default_rng(20)
    X = rng.standard_normal((32, 64)).astype(np.float32)       # tokens x features
    W = rng.standard_normal((48, 64)).astype(np.float32)
    G = rng.standard_normal((32, 48)).astype(np.float32)
    r = fp8.NVFP4BlockScaling()
    q, amax, bk = r.quantize(X, None, "input")
    assert bk == 16 and amax == np.max(np.abs(X))
    c, s, _ = te_reference(X)
    np.testing.assert_array_equal(q.codes, c)
    np.testing.assert_array_equal(q.scales, s)
    q, _, _ = r.quantize(W, None, "weight")
    c, s, _ = te_reference(W, (16, 16))
    np.testing.assert_array_equal(q.codes, c)
    np.testing.assert_array_equal(q.scales, s)
    qt, _, _ = r.transpose(W, q, None, None, "weight")          # the same tiles, transposed
    np.testing.assert_array_equal(qt.values, q.values.T)
    qt, amax_t, _ = r.transpose(X, None, None, None, "input")  # wgrad operand: RHT along tokens
    xr = rht_oracle(np.ascontiguousarray(X.T))
    c, s, _ = te_reference(xr)
    np.testing.assert_array_equal(qt.codes, c)
    np.testing.assert_array_equal(qt.scales, s)
    assert amax_t == np.max(np.abs(xr))
    # gradients: stochastic rounding changes elements by at most one step, never scales
    qg, _, _ = r.quantize(G, None, "grad_output")
    c, s, _ = te_reference(G)
    np.testing.assert_array_equal(qg.scales, s)
    vals = np.array(E2M1_VALUES)
    assert 0 < (qg.codes != c).mean() < 0.5
    up_or_down = np.abs(vals[qg.codes.astype(int)] - vals[c.astype(int)]) <= 2.0
    assert up_or_down.all()
    plain = fp8.NVFP4BlockScaling(disable_stochastic_rounding=True).quantize(G, None,
                                                                             "grad_output")
    np.testing.assert_array_equal(plain[0].codes, c)
    with pytest.raises(ValueError, match="multiple of 16.*disable_rht=True"):
        r.transpose(X[:24], None, None, None, "input")


def test_nvfp4_linear_forward_is_the_scaled_gemm_of_te_operands():
    """y = alpha * sum(dequantized products) to within the tensor core's
    truncation, with alpha = amax_x amax_w / (6 6 448 448) in float32."""
    import fpemu.autograd as ft
    from fpemu.autograd import fp8, nn
    ft.manual_seed(3)
    layer = nn.Linear(64, 32, bias=False)
    x = ft.randn(16, 64)
    with fp8.fp8_autocast(fp8_recipe=fp8.NVFP4BlockScaling()):
        y = layer(x).detach().numpy().astype(np.float64)
    X, W = x.numpy(), layer.weight.detach().numpy()
    cx, sx, _ = te_reference(X)
    cw, sw, _ = te_reference(W, (16, 16))
    e4 = torch.tensor(sx).view(torch.float8_e4m3fn).double().numpy()
    ew = torch.tensor(sw).view(torch.float8_e4m3fn).double().numpy()
    vals = np.array(E2M1_VALUES)
    dx = vals[cx.astype(int)] * np.repeat(e4, 16, axis=1)
    dw = vals[cw.astype(int)] * np.repeat(np.repeat(ew, 16, axis=0), 16, axis=1)
    alpha = np.float32(np.float32(np.max(np.abs(X)) * np.max(np.abs(W)))
                       / np.float32(6 * 6 * 448 * 448))
    want = (dx @ dw.T) * np.float64(alpha)
    assert np.all(np.abs(y - want) <= np.abs(want) * 2.0**-21 + 1e-30)


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
    assert fp8.MXFP8BlockScaling(scale_rounding="down").scale_rule == "floor"
    q, s, _ = up.quantize(x, fp8.e4m3fn, "input")
    assert s[0, 0] == 2.0 and q[0, 0] == 256.0                # 500 / 2 = 250 -> 256
    q, s, _ = fp8.MXFP8BlockScaling(scale_rule="floor").quantize(x, fp8.e4m3fn, "input")
    assert s[0, 0] == 1.0 and q[0, 0] == 448.0                # clipped
    r = fp8.MXFP8BlockScaling(block_2d_weights=True)
    qw, sw, _ = r.quantize(W, fp8.e4m3fn, "weight")
    qt, st, _ = r.transpose(W, qw, sw, fp8.e4m3fn, "weight")
    np.testing.assert_array_equal(qt * np.repeat(st, 32, axis=1)[:, :64],
                                  (qw * np.repeat(sw, 32, axis=1)).T)
    assert np.all(sw[:32, 0] == sw[0, 0])
    with pytest.raises(ValueError, match="scale_rule must be one of"):
        fp8.MXFP8BlockScaling(scale_rule="round")


def test_error_table_against_torchao_and_te_dequantizations():
    """SQNR, MSE, clipped and flushed shares from values decoded by the
    oracles' own codes (torchao's MXFP4, TE's NVFP4)."""
    x = spread((64, 128), 22, -3, 3)
    rows = {r["preset"]: r for r in block.error_table(x, ["mxfp4", "nvfp4"])}
    ref = x.astype(np.float64)

    def check(row, v, q):
        """fpemu's dequantized values equal the oracle's bit for bit, so every
        statistic of the row is the same computation on the same numbers."""
        np.testing.assert_array_equal(q.values, v)
        err = np.sum((ref - v) ** 2)
        assert row["sse"] == err and row["mse"] == err / x.size
        assert row["sqnr_db"] == 10 * np.log10(np.sum(ref ** 2) / err)
        nz = ref != 0
        assert row["flushed_values"] == np.sum(v[nz] == 0)
        assert row["flushed"] == row["flushed_values"] / np.sum(nz)
    s, d = torchao_mx(x, "e2m1", "floor")
    scale = np.exp2(s.astype(np.float64) - 127)
    v = np.array(E2M1_VALUES)[d.astype(int)] * np.repeat(scale, 32, axis=1)
    check(rows["mxfp4"], v, block.quantize_blocks(x, "mxfp4"))
    assert rows["mxfp4"]["bits"] == 4.25
    scaled = np.abs(x.reshape(64, 4, 32)) / np.exp2(s.astype(np.float64) - 127)[..., None]
    clipped = np.any(scaled > 7.0, axis=-1)
    assert rows["mxfp4"]["clipped_blocks"] == clipped.sum() > 0
    assert rows["mxfp4"]["clipped"] == clipped.sum() / clipped.size
    c, sc, g = te_reference(x)
    sv = torch.tensor(sc).view(torch.float8_e4m3fn).double().numpy()
    v = np.array(E2M1_VALUES)[c.astype(int)] * np.repeat(sv, 16, axis=1) * np.float64(g)
    check(rows["nvfp4"], v, block.quantize_blocks(x, "nvfp4"))
    assert rows["nvfp4"]["clipped"] == 0


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


def test_cudnn_rule_rounds_the_scale_up_and_divides():
    """cuDNN's documented NVFP4 equation: scale = the smallest e4m3 value not
    below fp32(amax / 6); elements fp32(x / scale) rounded to nearest even
    (TE's threshold table is that rounding); no tensor scale."""
    x = spread((32, 64), 24, -6, 6)
    x[0, :16] = 0.0
    q = block.quantize_blocks(x, "nvfp4-cudnn")
    e4 = np.array(sorted({(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                          for e in range(16) for m in range(8) if (e, m) != (15, 7)}))
    amax = np.abs(x.reshape(32, 4, 16)).max(-1)
    d = (amax / np.float32(6)).astype(np.float32).astype(np.float64)
    want = e4[np.searchsorted(e4, d)]                      # smallest value >= d
    np.testing.assert_array_equal(q.scale_values, want)
    assert q.tensor_scale is None and not q.clipped.any()
    with np.errstate(invalid="ignore"):
        scaled = (x.reshape(32, 4, 16) / want[..., None].astype(np.float32)).astype(np.float32)
    scaled = np.nan_to_num(scaled).reshape(32, 64)
    codes = te_cast_to_fp4(torch.tensor(scaled)).numpy()
    ok = x != 0                                            # TE's table drops the sign of -0
    np.testing.assert_array_equal(q.codes[ok], codes[ok])
    assert (q.values[0, :16] == 0).all()


def test_fp32_scales_with_nan_keep_the_nan():
    x = spread((2, 256), 25, -2, 2)
    x[0, 5] = np.nan
    q = block.quantize_blocks(x, "fp8-block-1d")          # e4m3fn has a NaN: TE's cast
    v = q.values
    assert np.isnan(v[0, 5]) and np.isnan(v).sum() == 1
    q = block.quantize_blocks(x, "e2m1", "fp32", 128, scale_rule="pow2")   # no NaN code
    v = q.values
    assert np.isnan(v[0, :128]).all() and not np.isnan(v[0, 128:]).any()
