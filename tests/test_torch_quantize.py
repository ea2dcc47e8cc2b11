"""fpemu.torch.quantize / encode / decode: fpemu's rounding written again in
torch integer operations, checked bit for bit against fpemu's Numba kernels
(whose own oracles are the table and rational ones of test_quantize.py and
test_fast_paths.py).

The inputs: for every format, every value of its grid (all codes of the
formats up to 16 bits), every midpoint between neighbours, the float32
neighbours of both, and the class edges; then every sign and float32 exponent
with the mantissas around every rounding boundary (test_fast_paths's sample);
then random bit patterns. ``FPEMU_EXHAUSTIVE=1`` adds all 2**32 float32
inputs for bf16, fp16, e4m3fn, e5m2 and e2m1, in chunks.

The device is the CPU here (CI has no GPU); ``bench/torch_cuda_checks.py``
runs the same comparisons on CUDA where a GPU is lent.
"""

import os
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu  # noqa: E402
import fpemu.torch  # noqa: E402
from fpemu.errors import FpemuTypeError, FpemuValueError  # noqa: E402
from fpemu.formats import FORMATS, Format  # noqa: E402
from fpemu.quantize import Cast  # noqa: E402
from test_fast_paths import _sample  # noqa: E402

MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")
CUSTOM = (Format.custom(6, 9, name="e6m9"), Format.custom(8, 3, name="e8m3"),
          Format.custom(3, 0, nan_encoding="none", name="e3m0"),
          Format.custom(4, 3, bias=11, nan_encoding="fnuz"),
          Format.custom(4, 2, bias=140, nan_encoding="fn"),        # binades below float32's
          Format.custom(5, 1, signed=False, has_subnormals=False, name="ue5m1"))
ALL = tuple(FORMATS) + CUSTOM


@pytest.fixture(autouse=True, params=["numba", "torch"])
def cpu_path(request, monkeypatch):
    """Every test twice: CPU tensors through fpemu's Numba kernels (what the
    CPU runs), and through the element-wise torch code (what CUDA and other
    devices run), forced onto the CPU."""
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", request.param == "numba")
    return request.param


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _grid_sample(fmt):
    """Every finite value of ``fmt`` (every code up to 16 bits), the midpoints
    of neighbours, the float32 neighbours of both, and the class edges, both
    signs, as float32."""
    if fmt.bits <= 16:
        v = fpemu.decode(np.arange(1 << fmt.bits).astype(fmt.code_dtype), fmt).astype(np.float64)
        v = np.unique(np.abs(v[np.isfinite(v)]))
        mid = (v[1:] + v[:-1]) / 2
    else:                                   # tf32, fp32: a sample of the grid, each next_up
        rng = np.random.default_rng(5)
        v = rng.standard_normal(1 << 14) * np.exp2(rng.integers(-150, 128, 1 << 14))
        v = np.abs(fpemu.quantize(v, fmt).astype(np.float64))
        v = v[np.isfinite(v) & (v < fmt.max)]
        up = fpemu.next_up(v, fmt).astype(np.float64)
        mid = (v + up) / 2 if fmt.mantissa_bits < 23 else up   # fp32 has no midpoints in fp32
    edges = [0.0, fmt.max + float(fpemu.ulp(fmt.max, fmt)) / 2, fmt.max * 2, 2.0 ** -149,
             float(np.finfo(np.float32).max), np.inf, np.nan]
    if fmt.has_subnormals:
        edges.append(fmt.min_subnormal / 2)
    with np.errstate(over="ignore"):                # fp32's edges past its max: inf
        pts = np.concatenate([v, mid, edges]).astype(np.float32)
    assert np.array_equal(pts[:v.size + mid.size].astype(np.float64), np.r_[v, mid]), \
        "every value and midpoint is a float32"
    with np.errstate(over="ignore"):
        pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                              np.nextafter(pts, np.float32(0))])
    return np.concatenate([pts, -pts])


def _inputs(fmt, x):
    """``x`` as ``fmt`` can take it: no NaN into a format without one."""
    return x if fmt.has_nan else x[~np.isnan(x)]


def _check(fmt, x, **kw):
    """quantize and encode of torch equal fpemu's, bit for bit."""
    x = _inputs(fmt, x)
    t = torch.from_numpy(x)
    want, got = fpemu.quantize(x, fmt, **kw), fpemu.torch.quantize(t, fmt, **kw)
    assert got.dtype == torch.float32 and got.shape == t.shape
    bad = np.flatnonzero(_bits(want) != _bits(got.numpy()))
    assert bad.size == 0, (fmt.name, kw, "quantize", bad.size, x[bad[:4]], want[bad[:4]],
                           got.numpy()[bad[:4]])
    want, got = fpemu.encode(x, fmt, **kw), fpemu.torch.encode(t, fmt, **kw).numpy()
    assert got.dtype == want.dtype
    bad = np.flatnonzero(want != got)
    assert bad.size == 0, (fmt.name, kw, "encode", bad.size, x[bad[:4]], want[bad[:4]],
                           got[bad[:4]])


def _policies(fmt):
    """Every overflow policy the format allows, with subnormals kept and
    flushed."""
    for overflow in ("inf", "saturate", "nan"):
        try:
            Cast.of(fmt, "rne", True, overflow)
        except FpemuValueError:
            continue
        for subnormals in (True, False):
            yield {"overflow": overflow, "subnormals": subnormals}


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_mode_on_the_grid_its_midpoints_and_neighbours(fmt):
    x = np.concatenate([_grid_sample(fmt), _sample()[::7]])
    for mode in MODES:
        _check(fmt, x, rounding=mode, seed=11)
    for kw in _policies(fmt):
        for mode in ("rne", "rup", "rto"):
            _check(fmt, x, rounding=mode, **kw)


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_random_bit_patterns_every_mode(fmt):
    rng = np.random.default_rng(zlib.crc32(fmt.name.encode()))      # a seed per format
    u = rng.integers(0, 1 << 32, 1 << 15, dtype=np.uint64)
    x = u.astype(np.uint32).view(np.float32)
    for mode in MODES:
        _check(fmt, x, rounding=mode, seed=(3, 12345))


def test_every_sign_and_exponent_around_every_rounding_boundary_for_the_wide_path():
    """bf16 and tf32 to nearest even take the one-addition path
    (``_wide_rne``); every exponent, float32 subnormals included, and NaN
    payloads of both signs come out as fpemu's."""
    from fpemu.torch._quantize import _wide_rne
    x = _sample()
    for name in ("bf16", "tf32"):
        assert _wide_rne(Cast.of(name))
        _check(fpemu.format(name), x)


def test_every_kind_of_input_of_every_format_custom_ones_too():
    """Dogfood: fpemu.testing's strategies draw the formats (named and custom)
    and, for each, arrays of every kind of edge input; the torch quantizer
    equals the host one on them, value and code."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fpemu.testing import assert_quantized_equal, strategies

    @settings(max_examples=60, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        fmt = data.draw(strategies.formats())
        x = data.draw(strategies.arrays(fmt, 64))
        t = torch.from_numpy(x)
        assert_quantized_equal(fpemu.torch.quantize(t, fmt), x, fmt)
        assert_quantized_equal(fpemu.torch.encode(t, fmt).numpy().astype(np.int64), x, fmt)

    check()


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_decode_every_code(fmt):
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits)
    else:
        codes = np.random.default_rng(2).integers(0, 1 << fmt.bits, 1 << 16)
    want = fpemu.decode(codes.astype(fmt.code_dtype), fmt)
    for dtype in (torch.int64, torch.int32 if fmt.bits < 32 else torch.uint32):
        got = fpemu.torch.decode(torch.from_numpy(codes).to(dtype), fmt).numpy()
        np.testing.assert_array_equal(_bits(got), _bits(want))
    if fmt.bits <= 8:
        got = fpemu.torch.decode(torch.from_numpy(codes.astype(np.uint8)), fmt).numpy()
        np.testing.assert_array_equal(_bits(got), _bits(want))


def test_the_in_range_encode_on_every_in_range_edge():
    """Where the caller knows the values finite and within the format's
    largest (quantize_blocks' scaled elements), the short nearest-even encode
    drops its saturation and NaN operations: the same codes as fpemu.encode
    on every in-range value of the grid sample and of the sign-exponent
    sample, for every format that takes that path."""
    from fpemu.torch import _quantize as tq
    fmts = [f for f in ALL if tq._small_rne(tq._plan(f, "rne", True, "saturate", None))]
    assert {"e4m3fn", "e5m2", "e2m1", "e2m3", "e3m2"} <= {f.name for f in fmts}
    for fmt in fmts:
        x = np.concatenate([_grid_sample(fmt), _sample()])
        x = x[np.isfinite(x) & (np.abs(x) <= fmt.max)]
        got = tq.encode_trusted(torch.from_numpy(x), fmt, overflow="saturate", in_range=True)
        want = fpemu.encode(x, fmt, overflow="saturate")
        bad = np.flatnonzero(want != got.numpy())
        assert bad.size == 0, (fmt.name, x[bad[:4]], want[bad[:4]], got.numpy()[bad[:4]])


def test_decode_of_encode_is_quantize_and_codes_have_numpys_widths():
    x = torch.from_numpy(_inputs(fpemu.format("e2m1"), _sample()))
    for name, dtype in (("e2m1", torch.uint8), ("bf16", torch.uint16), ("fp32", torch.uint32),
                        ("tf32", torch.uint32)):
        codes = fpemu.torch.encode(x, name)
        assert codes.dtype == dtype
        back = fpemu.torch.decode(codes.to(torch.int64), name)
        np.testing.assert_array_equal(_bits(back.numpy()),
                                      _bits(fpemu.torch.quantize(x, name).numpy()))


def test_stochastic_rounding_draws_by_flat_index_and_offset():
    """The bits of element i depend on (seed, offset + i) only: a slice with
    its offset gets the bits of the whole tensor's call, as on the host; a
    transposed (non-contiguous) tensor is read in its own row-major order,
    as t.numpy() would be."""
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((64, 300)).astype(np.float32))
    whole = fpemu.torch.quantize(x, "e4m3fn", rounding="sr", seed=99)
    part = fpemu.torch.quantize(x.reshape(-1)[1000:], "e4m3fn", rounding="sr", seed=(99, 1000))
    np.testing.assert_array_equal(_bits(part.numpy()), _bits(whole.reshape(-1)[1000:].numpy()))
    assert not torch.equal(whole, fpemu.torch.quantize(x, "e4m3fn", rounding="sr", seed=98))
    xt = x.T
    np.testing.assert_array_equal(
        _bits(fpemu.torch.quantize(xt, "fp16", rounding="sr", seed=5).numpy()),
        _bits(fpemu.quantize(xt.numpy(), "fp16", rounding="sr", seed=5)))
    # both neighbours are drawn, in proportion
    y = fpemu.torch.quantize(torch.full((1 << 16,), 1 + 2 ** -9), "bf16", rounding="sr", seed=1)
    up = (y == 1 + 2 ** -7).double().mean().item()
    assert set(y.unique().tolist()) == {1.0, 1 + 2 ** -7} and 0.23 < up < 0.27


def test_narrow_float_inputs_are_widened_exactly_and_shapes_kept():
    x = np.random.default_rng(8).standard_normal((3, 5, 7)).astype(np.float32) * 300
    for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        t = torch.from_numpy(x).to(dtype)
        exact = t.to(torch.float32).numpy()
        got = fpemu.torch.quantize(t, "e5m2", rounding="rtz")
        assert got.shape == (3, 5, 7)
        np.testing.assert_array_equal(_bits(got.numpy()),
                                      _bits(fpemu.quantize(exact, "e5m2", rounding="rtz")))
    t64 = torch.from_numpy(x).double()               # float64 holding float32 values
    np.testing.assert_array_equal(fpemu.torch.quantize(t64, "fp16").numpy(),
                                  fpemu.quantize(x, "fp16"))
    assert fpemu.torch.quantize(torch.tensor(3.0), "e2m1").item() == 3.0    # 0-d
    assert fpemu.torch.quantize(torch.empty(0, 4), "e2m1").shape == (0, 4)
    assert fpemu.torch.quantize(torch.tensor(-0.0), "bf16").numpy().view(np.uint32) == 0x80000000
    assert fpemu.torch.quantize(torch.tensor(-1e-30), "e4m3fnuz").numpy().view(np.uint32) == 0


def test_pieces_on_the_cpu_give_the_bits_of_one_call(monkeypatch):
    """Large CPU tensors are rounded in pieces (``_by_pieces``); with pieces
    of 1000 elements, a ragged last one, stochastic rounding's offsets, out=
    and codes come out as fpemu's."""
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_PIECE", 1000)
    x = _sample()[:25_500].reshape(51, 500)
    t = torch.from_numpy(x)
    for name, kw in (("e4m3fn", {"rounding": "sr", "seed": (5, 77)}), ("fp16", {}),
                     ("e8m0", {"rounding": "rup"})):
        fmt = fpemu.format(name)
        _check(fmt, x.reshape(-1), **kw)
        got = fpemu.torch.quantize(t, fmt, **kw)
        assert got.shape == (51, 500)
        np.testing.assert_array_equal(_bits(got.numpy()), _bits(fpemu.quantize(x, fmt, **kw)))
        out = torch.empty_like(t)
        fpemu.torch.quantize(t, fmt, out=out, **kw)
        np.testing.assert_array_equal(_bits(out.numpy()), _bits(got.numpy()))
        codes = fpemu.torch.encode(t, fmt, **kw)
        assert codes.shape == (51, 500)
        np.testing.assert_array_equal(codes.numpy(), fpemu.encode(x, fmt, **kw))


def test_out_receives_the_result_in_place_too():
    x = torch.from_numpy(_sample())
    want = fpemu.quantize(x.numpy(), "bf16")
    for name in ("bf16", "e4m3fn"):
        out = torch.empty_like(x)
        assert fpemu.torch.quantize(x, name, out=out) is not None
        np.testing.assert_array_equal(_bits(out.numpy()), _bits(fpemu.quantize(x.numpy(), name)))
    y = x.clone()
    fpemu.torch.quantize(y, "bf16", out=y)
    np.testing.assert_array_equal(_bits(y.numpy()), _bits(want))


def test_bad_input_names_what_was_expected_and_the_fix():
    q = fpemu.torch.quantize
    with pytest.raises(FpemuTypeError, match="torch tensor.*got list.*fpemu.quantize"):
        q([1.0], "bf16")
    with pytest.raises(FpemuTypeError, match="got torch.int64.*t.to\\(torch.float32\\)"):
        q(torch.arange(3), "bf16")
    with pytest.raises(FpemuTypeError, match="complex64.*t.real"):
        q(torch.ones(2, dtype=torch.complex64), "bf16")
    with pytest.raises(FpemuValueError, match="float64 values that float32 does not hold "
                       "\\(the first: 0.1\\).*round twice.*fpemu.quantize"):
        q(torch.tensor([0.5, 0.1], dtype=torch.float64), "bf16")
    with pytest.raises(FpemuValueError, match="meta tensor.*CPU or a GPU"):
        q(torch.ones(3, device="meta"), "bf16")
    with pytest.raises(FpemuTypeError, match="dense tensor.*sparse_coo.*to_dense"):
        q(torch.ones(3).to_sparse(), "bf16")
    with pytest.raises(FpemuValueError, match="NaN and e2m1 has no NaN.*nan_to_num"):
        fpemu.torch.encode(torch.tensor([1.0, float("nan")]), "e2m1")
    with pytest.raises(FpemuValueError, match="no infinity; pass overflow='saturate'"):
        q(torch.ones(2), "e4m3fn", overflow="inf")
    with pytest.raises(FpemuValueError, match="unknown rounding mode 'nearest'"):
        q(torch.ones(2), "bf16", rounding="nearest")
    with pytest.raises(FpemuValueError, match="out=.*contiguous float32 tensor of the "
                       "input's shape \\(4,\\).*got torch.float16, shape \\(4,\\)"):
        q(torch.ones(4), "bf16", out=torch.empty(4, dtype=torch.float16))
    with pytest.raises(FpemuTypeError, match="integer codes, got torch.float32"):
        fpemu.torch.decode(torch.ones(2), "e4m3fn")
    with pytest.raises(FpemuValueError, match="e2m1 codes are 4-bit, in 0..15; got 16"):
        fpemu.torch.decode(torch.tensor([3, 16]), "e2m1")


@pytest.mark.skipif(not os.environ.get("FPEMU_EXHAUSTIVE"),
                    reason="all 2**32 inputs: 1-2 minutes a format, 2 cores (FPEMU_EXHAUSTIVE=1)")
@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3fn", "e5m2", "e2m1", "e5m2-saturate"])
def test_all_float32_inputs(name):
    """Every float32 input; e4m3fn and e2m1 (saturating by default) and
    e5m2 with saturation take the short nearest-even path (_encode_small)."""
    name, _, policy = name.partition("-")
    fmt = fpemu.format(name)
    kw = {"overflow": policy} if policy else {}
    for s in range(0, 1 << 32, 1 << 24):
        x = np.arange(s, s + (1 << 24), dtype=np.uint64).astype(np.uint32).view(np.float32)
        _check(fmt, x, **kw)


def test_cpu_tensors_run_the_kernels_serial_below_torch_s_threshold(monkeypatch, cpu_path):
    """fpemu.torch runs the Numba kernels of CPU tensors inside
    ``_jit.serial_below(TORCH_SERIAL_BELOW)`` (a parallel launch between
    torch's own parallel operations costs about a millisecond), and only
    there: the same kernels called from NumPy keep the layer's threshold."""
    from fpemu import _jit
    from fpemu.quantize import Cast
    seen = []
    real = Cast.round_into

    def spy(self, *a, **k):
        seen.append(getattr(_jit._scope, "below", 0))
        return real(self, *a, **k)
    monkeypatch.setattr(Cast, "round_into", spy)
    x = torch.randn(64, 64)
    fpemu.torch.quantize(x, "bf16")
    fpemu.torch.encode(x, "e4m3fn")
    # (the element-wise torch code, forced onto the CPU, calls no kernel)
    assert seen == ([_jit.TORCH_SERIAL_BELOW] * 2 if cpu_path == "numba" else [])
    assert getattr(_jit._scope, "below", 0) == 0
