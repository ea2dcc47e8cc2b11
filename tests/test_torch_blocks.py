"""fpemu.torch.quantize_blocks / dequantize_blocks against fpemu.block, bit for bit.

The oracle is the host implementation (``fpemu/block.py``, NumPy and fpemu's
Numba kernels), whose rules the block tests check against TransformerEngine,
torchao and OCP's text; the torch code shares none of its array code (only
the scalar tensor-scale functions, which take one number). Inputs put block
amaxes on every edge a rule has: powers of two and one float32 ulp above,
the rceil quotient just above ``elem_max * 2**-127``, e4m3 scales at their
subnormal edge and their maximum, zero, inf and NaN blocks, tiny tensor
amaxes, and tails shorter than a block.
"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.torch  # noqa: E402
from fpemu import block  # noqa: E402
from fpemu.errors import FpemuTypeError, FpemuValueError  # noqa: E402
from fpemu.formats import Format  # noqa: E402
from block_data import spread  # noqa: E402


@pytest.fixture(autouse=True, params=["numba", "torch"])
def cpu_path(request, monkeypatch):
    """Every test twice: CPU tensors as the CPU runs them (the host's driver
    on the tensor's memory, fpemu's Numba kernels: there this file checks
    the wrapping into a TensorBlocks, the codes' dtypes and the tensor
    scale's type, the numerics being the oracle's own) and through the torch
    code that CUDA and other devices run (the rules in torch, the
    element-wise torch rounding), forced onto the CPU: there it checks the
    device's numerics against the host, sharing none of its array code."""
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", request.param == "numba")
    return request.param


f32 = np.float32


def _edge_rows(blen, seed):
    """One block row per edge amax: the amax planted once among smaller values."""
    rng = np.random.default_rng(seed)
    amaxes = [1.0, np.nextafter(f32(1), f32(2)), 448 * 2.0**-127,
              np.nextafter(f32(448 * 2.0**-127), f32(1)), 6 * 2.0**-127, 6 * 2.0**-9,
              6 * 448.0, np.nextafter(f32(2688), f32(0)), 2.0**-140, 3e38, 1e-30, 0.0,
              np.inf, np.nan]
    rows = []
    for amax in amaxes:
        r = np.clip(rng.standard_normal(blen) * 0.3, -1, 1).astype(f32)
        r *= f32(amax) if np.isfinite(amax) else f32(1)
        r[rng.integers(blen)] = amax
        r[rng.integers(blen)] *= -1
        rows.append(r)
    return np.array(rows, f32)


def _inputs(spec):
    blen = spec.block if isinstance(spec.block, int) else spec.block[1]
    e = _edge_rows(2 * blen + 3, 5)
    xs = [spread((24, 3 * blen + 5), 3), spread((17, 70), 4, -8, 8), e,
          e[np.isfinite(e).all(1)], e[~np.isnan(e).any(1)]]
    if isinstance(spec.block, tuple):
        xs.append(spread((2, spec.block[0] + 3, 2 * spec.block[1] + 1), 6, -4, 4))
    else:
        xs.append(spread((3, 5, 2 * blen - 1), 7, -4, 4))
    return xs


def _same(a, b, what):
    """A host BlockQuantized and a TensorBlocks hold the same bits."""
    assert isinstance(b, fpemu.torch.TensorBlocks)
    h = b.numpy()
    assert h.codes.dtype == a.codes.dtype and h.scales.dtype == a.scales.dtype, what
    for name in ("codes", "scales", "clipped"):
        x, y = getattr(a, name), getattr(h, name)
        bad = np.flatnonzero(np.asarray(x != y).reshape(-1))
        assert bad.size == 0, (what, name, bad.size, x.reshape(-1)[bad[:4]],
                               y.reshape(-1)[bad[:4]])
    for name in ("tensor_scale", "tensor_amax"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), (what, name)
        if x is not None and not np.isnan(x):   # (a NaN amax's payload is no contract)
            assert np.float32(x).view(np.uint32) == np.float32(y).view(np.uint32), (what, name)
        elif x is not None:
            assert np.isnan(y), (what, name)
    fields = ("block", "axis", "scale_rule", "shape")
    assert [getattr(a, k) for k in fields] == [getattr(b, k) for k in fields], what
    v = b.values
    assert v.dtype == torch.float64 and tuple(v.shape) == tuple(a.shape)
    assert np.array_equal(v.numpy().view(np.uint64), a.values.view(np.uint64)) or \
        np.array_equal(v.numpy(), a.values, equal_nan=True), (what, "values")


def _both(x, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # torchao's tiny-amax warning
        a = block.quantize_blocks(x, *args, **kw)
        b = fpemu.torch.quantize_blocks(torch.from_numpy(x), *args, **kw)
    _same(a, b, (args, kw, x.shape))
    return a, b


ROUNDINGS = ({}, {"rounding": "rtz"}, {"rounding": "sr", "seed": 3},
             {"rounding": "sr8", "seed": 4})


@pytest.mark.parametrize("name", sorted(block.PRESETS))
def test_every_preset_every_rounding_on_the_edges(name):
    spec = block.PRESETS[name]
    for x in _inputs(spec):
        for kw in ROUNDINGS:
            _both(x, name, **kw)
        if isinstance(spec.block, int):
            _both(np.ascontiguousarray(x.T), name, axis=0)
            if x.ndim == 3:
                _both(x, name, axis=1)


def test_sr_n_on_both_sides_of_the_float32_path():
    """srN rounds in float32 where N <= 23 and the element format's smallest
    step is a normal float32, else in float64: both give the host's codes."""
    x = _edge_rows(37, 6)
    for n in (1, 8, 23, 24, 32):
        for name in ("nvfp4", "mxfp8", "mxfp6-e3m2", "mxfp4"):
            _both(x, name, rounding=f"sr{n}", seed=n)
    tiny = Format.custom(8, 3, bias=130, nan_encoding="fn", name="e8m3b130")   # steps to 2**-132
    _both(spread((8, 64), 12, -140, 10), tiny, "e8m0", 32, scale_rule="rceil",
          rounding="sr8", seed=2)


@pytest.mark.parametrize("rule", block.MX_RULES)
def test_every_mx_rule_and_what_an_infinite_block_gets(rule):
    x = _edge_rows(37, 8)
    for elem in ("e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1"):
        for inf_block in block.INF_BLOCK:
            _both(x, elem, "e8m0", 32, scale_rule=rule, inf_block=inf_block)
    _both(spread((16, 96), 9), "e4m3fn", "e8m0", (32, 32), scale_rule=rule)


#: A rule's formats by its kind (ScaleRule.kind): elements, scales, 1-D block.
_KIND_FORMATS = {"mx": ("e4m3fn", "e8m0", 32), "fp4": ("e2m1", "e4m3fn", 16),
                 "fp32": ("e4m3fn", "fp32", 32)}


@pytest.mark.parametrize("rule", sorted(block.SCALE_RULES))
def test_every_scale_rule_in_every_layout(rule):
    """Every entry of SCALE_RULES, a new one too, on the device against the
    host: 1-D blocks along the last axis (the block layout), along the first
    axis and 2-D tiles (blocks read where they lie), edge and finite inputs,
    nearest and stochastic rounding."""
    elem, scale_fmt, blen = _KIND_FORMATS[block.SCALE_RULES[rule].kind]
    edges = _edge_rows(2 * blen + 3, 11)
    finite = spread((2 * blen + 5, 3 * blen + 1), 12, -8, 8)
    for x in (edges, edges[np.isfinite(edges).all(1)], finite):
        for kw in ({}, {"rounding": "sr8", "seed": 5}):
            _both(x, elem, scale_fmt, blen, scale_rule=rule, **kw)
        _both(np.ascontiguousarray(x.T), elem, scale_fmt, blen, axis=0, scale_rule=rule)
        _both(x, elem, scale_fmt, (blen, blen), scale_rule=rule)


def test_the_other_rules_tensor_amax_and_custom_formats():
    x = spread((20, 64), 10, -6, 6)
    _both(x, "nvfp4", scale_rule="nvfp4-div6")
    _both(x, "nvfp4", tensor_amax=1e-3)          # block scales saturate at 448
    _both(x, "nvfp4-torchao", tensor_amax=2.0**-120)
    _both(x, "fp8-block-1d", scale_rule="current")
    _both(x, "e5m2", "fp32", 16, scale_rule="current")
    _both(_edge_rows(20, 3), "e2m1", "fp32", 16, scale_rule="pow2")   # NaN-less elements
    e3m3 = Format.custom(3, 3, nan_encoding="none", name="e3m3")
    _both(x, e3m3, "e8m0", 8, scale_rule="rceil")
    _both(x, "e2m1", Format.custom(5, 3, nan_encoding="fn", name="e5m3"), 16,
          scale_rule="nvfp4")
    _both(np.zeros((3, 32), f32), "nvfp4")       # an all-zero tensor: tensor scale 1
    _both(np.zeros((0, 32), f32), "mxfp8")       # no rows
    a, b = _both(x[:1, :5], "mxfp4")             # one block shorter than its length
    assert b.scales.shape == (1, 1)


def test_four_over_six_sums_errors_in_one_fixed_order():
    """Four Over Six compares float64 sums of squared errors; both
    implementations add them in the halving order, so that even a block
    whose two candidates' errors are within rounding of each other picks
    the same one."""
    x = spread((256, 64), 12, -6, 6)
    a, b = _both(x, "nvfp4-4over6")
    plain = block.quantize_blocks(x, "nvfp4")
    assert (a.scales != plain.scales).any()
    s = np.arange(7.0)
    assert block.halving_sum(s) == ((0 + 3) + (1 + 4)) + (2 + 5 + 6)


def test_dequantize_codes_and_scales_given_separately():
    x = spread((6, 40), 13)
    for name in ("mxfp8", "nvfp4", "nvfp4-2d", "fp8-block"):
        q = fpemu.torch.quantize_blocks(torch.from_numpy(x), name)
        h = q.numpy()
        kw = dict(elem=q.elem, scale_fmt=q.scale_fmt, block=q.block, tensor_scale=q.tensor_scale)
        got = fpemu.torch.dequantize_blocks(q.codes, q.scales, **kw)
        want = block.dequantize_blocks(h.codes, h.scales, **kw)
        np.testing.assert_array_equal(got.numpy(), want)
        assert torch.equal(q.dequantize(), got.to(torch.float32))
    q = fpemu.torch.quantize_blocks(torch.from_numpy(x), "mxfp8")
    with pytest.raises(FpemuValueError, match=r"need scales of shape \(6, 2\), got \(6, 1\)"):
        fpemu.torch.dequantize_blocks(q.codes, q.scales[:, :1], elem="e4m3fn",
                                      scale_fmt="e8m0", block=32)


def test_under_torch_compile_the_same_codes():
    x = torch.from_numpy(spread((8, 64), 14))

    def f(t):
        return fpemu.torch.quantize_blocks(t * 2, "nvfp4").codes + 0

    want = block.quantize_blocks(x.numpy() * 2, "nvfp4").codes
    np.testing.assert_array_equal(torch.compile(f)(x).numpy(), want)


def test_bad_input_names_what_was_expected_and_the_fix():
    q = fpemu.torch.quantize_blocks
    with pytest.raises(FpemuTypeError, match="got torch.int32"):
        q(torch.ones(4, 32, dtype=torch.int32), "mxfp8")
    with pytest.raises(FpemuValueError, match="would round twice"):
        q(torch.full((2, 32), 0.1, dtype=torch.float64), "mxfp8")
    with pytest.raises(FpemuValueError, match="meta tensor"):
        q(torch.ones(2, 32, device="meta"), "mxfp8")
    with pytest.raises(FpemuTypeError, match="to_dense"):
        q(torch.ones(2, 32).to_sparse(), "mxfp8")
    with pytest.raises(FpemuValueError, match="0-d"):
        q(torch.tensor(1.0), "mxfp8")
    with pytest.raises(FpemuValueError, match="two axes or more"):
        q(torch.ones(32), "nvfp4-2d")
    with pytest.raises(FpemuValueError, match="far longer than the array"):
        q(torch.ones(2, 8), "mxfp8", block=2**26)
    with pytest.raises(FpemuValueError, match="unknown scale_rule"):
        q(torch.ones(2, 8), "mxfp8", scale_rule="round")
    with pytest.raises(FpemuValueError, match="needs seed="):
        q(torch.ones(2, 32), "nvfp4", rounding="sr8")
    # float64 that holds float32 values is read exactly
    x = spread((4, 32), 15)
    _same(block.quantize_blocks(x, "mxfp8"),
          q(torch.from_numpy(x).double(), "mxfp8"), "float64 input")


def test_every_preset_on_drawn_adversarial_blocks():
    """Dogfood: fpemu.testing's block strategy (power-of-two and rceil-edge
    amaxes and one ulp above, scale-format edges, zero / NaN / inf blocks,
    tiny tensor amax, tails) for every preset; the device quantizer's codes
    and scales equal the host's (fpemu.testing.assert_blocks_equal)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fpemu.testing import assert_blocks_equal, strategies

    @settings(max_examples=80, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        preset = data.draw(st.sampled_from(sorted(block.PRESETS)))
        x = data.draw(strategies.blocks(preset, 2))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # torchao's tiny-amax warning
            q = fpemu.torch.quantize_blocks(torch.from_numpy(x), preset)
            assert_blocks_equal(q.codes, q.scales, x, preset)

    check()


_TWO_LEVEL = sorted(r for r, spec in block.SCALE_RULES.items() if spec.two_level)


@pytest.mark.parametrize("rule", _TWO_LEVEL)
def test_an_all_nan_tensor_has_one_nan_tensor_scale_on_both_sides(rule):
    """torch's max of an all-NaN tensor writes 0xffffffff; the tensor amax and
    scale are fpemu's one NaN, 0x7fc00000, as on the host."""
    x = np.full((2, 32), np.nan, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = block.quantize_blocks(x, "nvfp4", scale_rule=rule)
        dev = fpemu.torch.quantize_blocks(torch.from_numpy(x), "nvfp4", scale_rule=rule)

    def bits(v):
        return int(np.float32(v.item() if hasattr(v, "item") else v).view(np.uint32))
    for name in ("tensor_scale", "tensor_amax"):
        assert bits(getattr(dev, name)) == bits(getattr(host, name)) == 0x7FC00000, name
