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

import importlib
import logging

import numpy as np
import pytest

from block_data import E2M1_VALUES, rceil_of_fp32_quotient, spread
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

TORCHAO_ELEMS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
                 "e2m3": DTYPE_FP6_E2M3, "e3m2": DTYPE_FP6_E3M2,
                 "e2m1": torch.float4_e2m1fn_x2}


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
    want = np.array([rceil_of_fp32_quotient(a, 448.0) for a in amax]) + 127
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


# ------------------------------------------------- stochastic rounding


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


def _f32_of_fraction(q):
    """The exact rational q rounded once to float32, to nearest even (an
    oracle: integer arithmetic on q's numerator and denominator)."""
    from fractions import Fraction
    if q == 0:
        return np.float32(0.0)
    sign, q = (-1 if q < 0 else 1), abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    e = max(e, -126)                                   # subnormals share 2**-149's step
    step = Fraction(2) ** (e - 23)
    n, rem = divmod(q, step)
    n = int(n) + (1 if rem > step / 2 or (rem == step / 2 and int(n) % 2) else 0)
    v = float(n * step) if n * step < Fraction(2) ** 128 else np.inf
    return np.float32(sign * v)


@pytest.mark.parametrize("size,signs", [(4, None), (16, "te"), (16, None), (64, 3)])
def test_hadamard_is_the_exact_sum_rounded_once(size, signs, monkeypatch):
    """Every output against exact rational sums rounded once to float32, -0
    where every product is -0: runs summed in one float64 pass (a narrow
    spread of magnitudes, the limit itself) and by the exact model (one
    binade wider, float32 subnormals among normals, inf and NaN)."""
    from fractions import Fraction
    rng = np.random.default_rng(size)
    limit = 29 - (size.bit_length() - 1)
    X = (rng.standard_normal((24, 2 * size)) * np.exp2(rng.integers(-40, 40, (24, 2 * size)))
         ).astype(np.float32)
    X[:4] *= np.float32(2.0**-120)
    X[4], X[5], X[6, ::2] = 0.0, -0.0, -0.0
    X[7, 3], X[8, 5], X[9, 7] = np.inf, np.nan, -np.inf
    X[10] = np.float32(2.0**-149) * np.arange(2 * size)
    X[11, :size] = [1.0, 2.0**-limit] * (size // 2)
    X[12, :size] = [1.0, 2.0**-(limit + 1)] * (size // 2)
    X[13] = np.float32(2.0**127 * 1.75)
    module = importlib.import_module("fpemu.block.hadamard")   # (the package exports the function)
    sent = []

    def exact(runs, *a, **k):
        sent.extend(map(tuple, runs))
        return real(runs, *a, **k)

    real = module.matmul
    monkeypatch.setattr(module, "matmul", exact)
    got = block.hadamard(X, size, signs=signs)
    # the runs left to the exact model: inf or NaN, or nonzero magnitudes whose
    # float32 exponent fields (a subnormal's counted as 1) span more than the limit
    want_sent = []
    for run in X.reshape(-1, size):
        fields = [max(int(b) >> 23, 1) for b in run.view(np.uint32) & 0x7FFFFFFF if b]
        if not np.isfinite(run).all() or (fields and max(fields) - min(fields) > limit):
            want_sent.append(tuple(run.astype(np.float64)))
    assert len(sent) == len(want_sent) >= 4
    assert all(u == v or np.isnan(u).any() for u, v in zip(sent, want_sent))
    H = block.hadamard_matrix(size, signs)
    for r, c in np.ndindex(X.shape):
        run = X[r, c - c % size:c - c % size + size].astype(np.float64)
        terms = run * H[:, c % size]
        if not np.isfinite(run).all():
            want = np.float32(np.sum(terms))           # inf or NaN: only which one matters
            assert (np.isnan(got[r, c]) and np.isnan(want)) or got[r, c] == want, (r, c)
            continue
        want = _f32_of_fraction(sum(Fraction(t) for t in terms))
        if want == 0 and np.all(np.signbit(terms)):
            want = np.float32(-0.0)
        assert got[r, c].tobytes() == want.tobytes(), (r, c, got[r, c], want)


# ----------------------------------------------------------------- errors


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
    q = r.quantize(X, None, "input")
    assert q.block == 16 and q.tensor_amax == np.max(np.abs(X))
    c, s, _ = te_reference(X)
    np.testing.assert_array_equal(q.codes, c)
    np.testing.assert_array_equal(q.scales, s)
    q = r.quantize(W, None, "weight")
    c, s, _ = te_reference(W, (16, 16))
    np.testing.assert_array_equal(q.codes, c)
    np.testing.assert_array_equal(q.scales, s)
    qt = r.transpose(W, q, None, "weight")                    # the same tiles, transposed
    np.testing.assert_array_equal(qt.values, q.values.T)
    qt = r.transpose(X, None, None, "input")                  # wgrad operand: RHT along tokens
    xr = rht_oracle(np.ascontiguousarray(X.T))
    c, s, _ = te_reference(xr)
    np.testing.assert_array_equal(qt.codes, c)
    np.testing.assert_array_equal(qt.scales, s)
    assert qt.tensor_amax == np.max(np.abs(xr))
    # gradients: stochastic rounding changes elements by at most one step, never scales
    qg = r.quantize(G, None, "grad_output")
    c, s, _ = te_reference(G)
    np.testing.assert_array_equal(qg.scales, s)
    vals = np.array(E2M1_VALUES)
    assert 0 < (qg.codes != c).mean() < 0.5
    up_or_down = np.abs(vals[qg.codes.astype(int)] - vals[c.astype(int)]) <= 2.0
    assert up_or_down.all()
    plain = fp8.NVFP4BlockScaling(disable_stochastic_rounding=True).quantize(G, None,
                                                                             "grad_output")
    np.testing.assert_array_equal(plain.codes, c)
    with pytest.raises(ValueError, match="multiple of 16.*disable_rht=True"):
        r.transpose(X[:24], None, None, "input")


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


def test_cudnn_rule_rounds_the_scale_up_and_divides():
    """cuDNN's documented NVFP4 equation: scale = the smallest e4m3 value not
    below fp32(amax / 6); elements fp32(x / scale) rounded to nearest even
    (TE's threshold table is that rounding); no tensor scale."""
    x = spread((32, 64), 24, -6, 6)
    x[0, :16] = 0.0
    q = block.quantize_blocks(x, "e2m1", "e4m3fn", 16, scale_rule="cudnn")  # the rule, not a preset
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
