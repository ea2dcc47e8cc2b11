"""The fused Triton block kernels (fpemu/torch/_triton_blocks.py), on this CPU.

``TRITON_INTERPRET=1`` runs the kernels' source through Triton's interpreter
on CPU tensors (set before the kernels are defined; CI has no GPU), and the
fixture routes CPU tensors to them as CUDA tensors are routed. Then
:func:`fpemu.torch.quantize_blocks` must give the codes, scales, clip flags
and tensor scale of :func:`fpemu.block.quantize_blocks` bit for bit: every
preset and scale rule (Four Over Six and ``"srN"`` take the torch path for
their element step, their amaxes the kernel), blocks along the last and the
first axis and 2-D tiles, partial last blocks, one row, strided and sliced
input, nearest, directed and stochastic rounding, inputs holding NaN,
infinities, zeros of both signs, float32 subnormals and huge values. The two
kernels are also checked alone: the block amaxes against a loop over the
blocks, the element step against the driver's NumPy array code
(:func:`fpemu.block.driver.scale_round`) with factors of every kind (zero,
infinite, overflowing, underflowing, a division), on strided block layouts.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined (module text)

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import fpemu.torch  # noqa: E402
from fpemu import block  # noqa: E402
from fpemu.block import driver, fused, host  # noqa: E402
from fpemu.block.rules import Job, array_namespace  # noqa: E402
from fpemu.formats import format as lookup  # noqa: E402
from fpemu.torch import _blocks, _quantize, _triton_blocks  # noqa: E402
from block_data import spread  # noqa: E402

f32 = np.float32


@pytest.fixture(autouse=True)
def triton_on_cpu(monkeypatch):
    """CPU tensors routed to the Triton kernels, as CUDA tensors are."""
    monkeypatch.setattr(_quantize, "CPU_KERNELS", False)
    monkeypatch.setattr(_quantize, "TRITON_DEVICES", ("cuda", "cpu"))


def _hard(shape, seed):
    """Magnitudes over many binades with NaNs, infinities, signed zeros,
    float32 subnormals and huge values planted, and (2-D, more than three
    rows) a row of zeros, one of negative zeros and one of subnormals."""
    rng = np.random.default_rng(seed)
    x = spread(shape, seed, -30, 30)
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-39, 3e38, -448.0, 6.0):
        flat[rng.integers(flat.size, size=2)] = v
    flat[rng.integers(flat.size)] = np.uint32(0xFFC12345).view(f32)     # a NaN's payload
    if x.ndim == 2 and x.shape[0] > 3:
        x[1] = 0.0
        x[2] = -0.0
        x[3] = f32(1e-40) * np.sign(rng.standard_normal(x.shape[1])).astype(f32)
    return x


def _bits(v):
    return None if v is None else np.float32(v).view(np.uint32)


def _same(t, x, *args, **kw):
    """fpemu.torch.quantize_blocks of the tensor ``t`` (holding ``x``) and
    fpemu.block.quantize_blocks of ``x`` give the same bits."""
    got = fpemu.torch.quantize_blocks(t, *args, **kw)
    want = block.quantize_blocks(x, *args, **kw)
    what = (args, kw, tuple(x.shape))
    for name in ("codes", "scales", "clipped"):
        u, v = getattr(got, name).numpy(), np.asarray(getattr(want, name))
        assert u.shape == v.shape, (what, name, u.shape, v.shape)
        bad = np.flatnonzero(u.astype(np.int64).reshape(-1) != v.astype(np.int64).reshape(-1))
        assert bad.size == 0, (what, name, bad.size, u.reshape(-1)[bad[:4]],
                               v.reshape(-1)[bad[:4]])
    assert got.codes.dtype == _quantize._CODE_DTYPES[want.codes.dtype.itemsize]
    assert _bits(got.tensor_scale) == _bits(want.tensor_scale), what
    assert _bits(got.tensor_amax) == _bits(want.tensor_amax), what


def _transposed(x):
    """A non-contiguous tensor holding ``x`` (2-D)."""
    return torch.from_numpy(np.ascontiguousarray(x.T)).t()


# -------------------------------------------------------------- quantize_blocks
@pytest.mark.parametrize("name", sorted(block.PRESETS))
def test_every_preset_in_every_layout(name):
    spec = block.PRESETS[name]
    tiles = isinstance(spec.block, tuple)
    blen = spec.block[1] if tiles else spec.block
    # partial last blocks both ways (the interpreter is slow: 128-long blocks get few rows)
    x = _hard((20, 100) if tiles and blen > 32 else (9, 140) if blen > 32
              else (blen + 1, 2 * blen + 6), 1)
    t = torch.from_numpy(x)
    _same(t, x, name)
    _same(_transposed(x), x, name, rounding="rtz")
    if blen <= 32:                      # (stochastic 128-long blocks: fp8-block's host time)
        _same(t, x, name, rounding="sr", seed=7)
    if not tiles:
        _same(t, x, name, axis=0)
        _same(t, x, name, axis=0, rounding="rup")


_KIND_FORMATS = {"mx": ("e4m3fn", "e8m0", 32), "fp4": ("e2m1", "e4m3fn", 16),
                 "fp32": ("e4m3fn", "fp32", 32)}


@pytest.mark.parametrize("rule", sorted(block.SCALE_RULES))
def test_every_scale_rule(rule):
    """Every rule in each layout under another rounding: the kernels run
    what it decides per block (cuDNN's rule divides, torchao's may give an
    infinite factor)."""
    elem, scale_fmt, blen = _KIND_FORMATS[block.SCALE_RULES[rule].kind]
    x = _hard((blen + 3, 2 * blen + 5), 3)
    t = torch.from_numpy(x)
    _same(t, x, elem, scale_fmt, blen, scale_rule=rule)
    _same(t, x, elem, scale_fmt, blen, scale_rule=rule, axis=0, rounding="rtz")
    _same(t, x, elem, scale_fmt, (16, 16), scale_rule=rule, rounding="rup")
    _same(t, x, elem, scale_fmt, blen, scale_rule=rule, rounding="sr", seed=11)
    if block.SCALE_RULES[rule].two_level:
        tiny = spread((3, 2 * blen), 5, -12, 12) * f32(1e-37)     # a tiny tensor amax
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)       # torchao's tiny-amax warning
            _same(torch.from_numpy(tiny), tiny, elem, scale_fmt, blen, scale_rule=rule)


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "nvfp4-2d"])
def test_odd_shapes(name):
    """One row, a slice (strided, at an offset), one axis, three axes
    blocked along the middle one, partial tiles of a batch, no elements."""
    row = _hard((1, 45), 6)
    _same(torch.from_numpy(row), row, name)
    big = _hard((37, 75), 4)
    _same(torch.from_numpy(big)[1:, 3:], np.ascontiguousarray(big[1:, 3:]), name, axis=0)
    line = _hard((70,), 7)
    if name != "nvfp4-2d":
        _same(torch.from_numpy(line), line, name)
        cube = _hard((3, 37, 5), 8)
        _same(torch.from_numpy(cube), cube, name, axis=1)
    batch = _hard((2, 19, 21), 9)
    _same(torch.from_numpy(batch), batch, name, rounding="sr", seed=3)
    empty = np.zeros((0, 32), np.float32)
    _same(torch.from_numpy(empty), empty, name)


@pytest.mark.parametrize("elem", ["bf16", "fp16", "e5m2", "e3m2", "e2m3"])
def test_other_element_formats(elem):
    """MX blocks of every element width the kernels take (16-bit codes
    too), infinite blocks saturated or NaN, Philox's draws."""
    x = _hard((9, 70), 10)
    t = torch.from_numpy(x)
    _same(t, x, elem, "e8m0", 32, scale_rule="rceil", axis=0, inf_block="nan")
    _same(t, x, elem, "e8m0", 32, scale_rule="nearest", rounding="sr", seed=2,
          rng="philox")


def test_quantize_blocks_runs_the_kernels(monkeypatch):
    """The Triton kernels run (and fpemu.block's Numba kernels do not): the
    amaxes always, the element step where fused.fuses says so."""
    calls = []
    for mod, names in ((_triton_blocks, ("block_amax", "scale_round")),
                       (fused, ("block_amax", "scale_round"))):
        for name in names:
            real = getattr(mod, name)

            def spy(*a, _r=real, _n=f"{mod.__name__.split('.')[-1]}.{name}", **k):
                calls.append(_n)
                return _r(*a, **k)
            monkeypatch.setattr(mod, name, spy)
    x = _hard((8, 64), 11)
    t = torch.from_numpy(x)
    for args, kw, want in (
            (("mxfp8",), {}, ["block_amax", "scale_round"]),
            (("nvfp4-2d",), {"rounding": "sr", "seed": 1}, ["block_amax", "scale_round"]),
            (("bf16", "e8m0", 32), {"scale_rule": "floor", "axis": 0},
             ["block_amax", "scale_round"]),
            (("nvfp4-4over6",), {}, ["block_amax"]),                 # the rule rounds itself
            (("nvfp4",), {"rounding": "sr8", "seed": 1}, ["block_amax"]),  # srN: torch code
            (("e4m3fn", "fp32", 32), {"scale_rule": "current"}, ["block_amax", "scale_round"])):
        calls.clear()
        fpemu.torch.quantize_blocks(t, *args, **kw)
        assert calls == ["_triton_blocks." + n for n in want], (args, kw, calls)


# ------------------------------------------------------------- the kernels alone
def test_block_amax_against_a_loop_over_blocks():
    """Each block's largest magnitude (NaN wins, as the canonical NaN; -0
    and subnormals count) by a Python loop over the blocks, for the three
    shapes of the block layout, strided views among them."""
    x = _hard((9, 40), 12)
    xs = torch.from_numpy(np.ascontiguousarray(x.T)).t()        # strides (1, 9), holding x
    rows = x.reshape(9, 5, 8)
    cols = x.reshape(3, 3, 40).transpose(0, 2, 1)
    tiles = x.reshape(3, 3, 5, 8).transpose(0, 2, 1, 3).reshape(3, 5, 24)
    cases = []
    for t in (torch.from_numpy(x), xs):                         # contiguous, then strided views
        cases += [(t.unflatten(1, (5, 8)), -1, rows), (t.unflatten(0, (3, 3)), 1, cols),
                  (t.unflatten(1, (5, 8)).unflatten(0, (3, 3)), (-3, -1), tiles)]
    for B, dims, blocks in cases:
        got = _triton_blocks.block_amax(B, dims).numpy()
        want = np.empty(blocks.shape[:-1], f32)
        for idx in np.ndindex(*want.shape):
            mags = [abs(float(v)) for v in blocks[idx]]
            want[idx] = np.nan if any(m != m for m in mags) else max(mags)
        assert got.shape == want.shape, (dims, got.shape, want.shape)
        assert np.array_equal(got, want, equal_nan=True), dims
        assert (got[np.isnan(got)].view(np.uint32) == 0x7FC00000).all()


NP, TORCH = array_namespace("numpy"), array_namespace("torch")


def _factors(shape, rng):
    """Block factors over many binades (products overflow and underflow),
    a zero, an infinity and the smallest subnormal among them."""
    f = (rng.random(shape) + 0.5) * np.exp2(rng.integers(-140, 127, shape))
    f = f.astype(f32)
    f.reshape(-1)[:3] = (0.0, np.inf, 2.0 ** -149)
    return f


@pytest.mark.parametrize("layout", ["last", "axis", "tiles"])
def test_scale_round_against_the_array_code(layout):
    """The element step alone, against the driver's NumPy array code, with
    factors of every kind, multiplied and divided, NaN blocks or none, and
    the stochastic draws at an offset; the tensor's block layout strided."""
    rng = np.random.default_rng(13)
    block_, axis = {"last": (16, 1), "axis": (8, 0), "tiles": ((4, 16), 1)}[layout]
    in_place = layout != "last"
    dims = driver.amax_dims(block_, axis, in_place)
    hard = _hard((16, 48), 14)
    # without NaN blocks every element is finite (the rules make a block holding a NaN,
    # or an infinity they do not saturate, a NaN block)
    finite = np.where(np.isfinite(hard), hard, f32(1.5))
    layouts = {}
    for has_nan, X in ((True, hard), (False, finite)):
        Bk, _, sshape, _, ex = driver.to_blocks(X, block_, axis, NP, in_place)
        Bt, _, _, _, ext = driver.to_blocks(_transposed(X), block_, axis, TORCH, in_place)
        assert not Bt.is_contiguous()
        layouts[has_nan] = Bk, ex, Bt, ext
    modes = (("e4m3fn", "rne", None, None), ("e2m1", "rtz", None, None),
             ("e5m2", "rup", None, None), ("e2m1", "sr", 5, None), ("bf16", "sr", 5, "philox"))
    # (divide, has_nan): each pair under several modes, two pairs a mode
    pairs = ((False, False), (True, True), (False, True), (True, False))
    for i, (elem, rounding, seed, rng_name) in enumerate(modes):
        for divide, has_nan in (pairs[i % 4], pairs[(i + 1) % 4]):
            Bk, ex, Bt, ext = layouts[has_nan]
            factor = _factors(sshape, rng)
            nan = np.zeros(sshape, bool)
            if has_nan:
                # the blocks holding a NaN and one more are NaN; those holding an
                # infinity, not NaN, get a zero factor: a NaN product, rounded as 0
                amax = np.max(np.abs(Bk), axis=dims)
                nan = np.isnan(amax)
                nan.reshape(-1)[-1] = True
                factor[np.isinf(amax)] = 0
                assert np.isinf(amax).any()

            def job(B, xp, ops, ex_):
                return Job(B, None, lookup(elem), None, "floor", rounding, seed, None,
                           "saturate", ex_, xp, ops, offset=1000, rng=rng_name, dims=dims)

            want = driver.scale_round(job(Bk, NP, host.OPS, ex), factor, divide, nan, has_nan)
            got = _triton_blocks.scale_round(job(Bt, TORCH, _blocks._OPS, ext),
                                             torch.from_numpy(factor), divide,
                                             torch.from_numpy(nan), has_nan)
            what = (layout, elem, rounding, divide, has_nan)
            assert tuple(got.shape) == want.shape, what
            assert got.dtype == _quantize._CODE_DTYPES[lookup(elem).code_dtype.itemsize]
            u, v = got.numpy().astype(np.int64), want.astype(np.int64)
            bad = np.flatnonzero((u != v).reshape(-1))
            assert bad.size == 0, (what, bad.size, Bk.reshape(-1)[bad[:4]],
                                   u.reshape(-1)[bad[:4]], v.reshape(-1)[bad[:4]])
