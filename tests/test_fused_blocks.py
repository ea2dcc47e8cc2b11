"""The fused block kernels (fpemu/block/fused.py) against the driver's array code.

A block quantization reads its elements in two passes, the block amaxes and
the element step (each element times its block's factor, a zero kept with
its sign, clamped, rounded, a NaN block's signed zeros). The host and CPU
tensors run both as Numba kernels; the driver's array code
(``fpemu.block.driver.Ops``' own ``block_amax`` and ``scale_round``, NumPy's
``abs``/``max``, ``rules.scale_elements`` and the element encode) is the
oracle, run here with the NumPy namespace and, for CPU tensors, torch's. Both
are driven by the same rule, so the comparison is of the two element passes:
codes, scales, clip flags and tensor scale, bit for bit, for every preset
and scale rule, every rounding mode of the element rounding, 1-D blocks along
the last, the first and a middle axis and 2-D tiles (read in place and in
the block layout), partial last blocks, one row, non-contiguous input, and
inputs holding NaN, infinities, zeros of both signs and float32 subnormals.
"""

import warnings

import numpy as np
import pytest

import fpemu
from fpemu import block
from fpemu.block import driver, fused, host
from fpemu.block.rules import array_namespace
from fpemu.formats import format as lookup
from block_data import spread

NP = array_namespace("numpy")
f32 = np.float32


class _ArrayOps(type(host.OPS)):
    """The host's backend with the driver's array code for the two passes."""

    block_amax = staticmethod(driver.Ops.block_amax)
    scale_round = staticmethod(driver.Ops.scale_round)


ARRAY_OPS = _ArrayOps()


def _hard(shape, seed):
    """Spread magnitudes with NaN, infinities, signed zeros and float32
    subnormals planted, and a few all-zero and all-subnormal rows."""
    rng = np.random.default_rng(seed)
    x = spread(shape, seed, -30, 30)
    flat = x.reshape(-1)
    for v in (np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-39, 3e38, -448.0, 6.0):
        flat[rng.integers(flat.size, size=2)] = v
    if x.ndim == 2 and x.shape[0] > 3:
        x[1] = 0.0
        x[2] = -0.0
        x[3] = f32(1e-40) * np.sign(rng.standard_normal(x.shape[1])).astype(f32)
    return x


def _run(x, ops, args, kw, axis=-1, in_place=True):
    cfg = driver.configure(*args, kw.get("rounding", "rne"), kw.get("seed"), kw.get("rng"),
                           kw.get("tensor_amax"), kw.get("inf_block", "saturate"))
    ax = axis % x.ndim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # torchao's tiny-amax warning
        return driver.run(x, cfg, ax, NP, ops, allow_in_place=in_place)


def _same(x, args, kw=None, axis=-1):
    """The fused backend and the array code give the same bits, in place
    and in the block layout."""
    kw = kw or {}
    for in_place in (True, False):
        a = _run(x, host.OPS, args, kw, axis, in_place)
        b = _run(x, ARRAY_OPS, args, kw, axis, in_place)
        what = (args, kw, axis, in_place, x.shape)
        for name in ("codes", "scodes", "clipped"):
            u, v = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
            assert u.shape == v.shape, (what, name)
            bad = np.flatnonzero((u.astype(np.int64) != v.astype(np.int64)).reshape(-1))
            assert bad.size == 0, (what, name, bad.size, u.reshape(-1)[bad[:4]],
                                   v.reshape(-1)[bad[:4]])
        for name in ("tensor_scale", "tensor_amax"):
            u, v = getattr(a, name), getattr(b, name)
            assert (u is None) == (v is None)
            if u is not None:
                assert np.float32(u).tobytes() == np.float32(v).tobytes() or \
                    (np.isnan(u) and np.isnan(v)), (what, name)


ROUNDINGS = ({}, {"rounding": "rna"}, {"rounding": "rtz"}, {"rounding": "rup"},
             {"rounding": "rdn"}, {"rounding": "rto"}, {"rounding": "sr", "seed": 7},
             {"rounding": "sr", "seed": 7, "rng": "philox"}, {"rounding": "sr8", "seed": 7},
             {"rounding": "sr1", "seed": 3}, {"rounding": "sr32", "seed": 5, "rng": "pcg64"})


@pytest.mark.parametrize("name", sorted(block.PRESETS))
def test_every_preset_every_mode_every_layout(name):
    spec = block.PRESETS[name]
    blen = spec.block if isinstance(spec.block, int) else spec.block[1]
    x = _hard((2 * blen + 3, 3 * blen + 5), 1)          # partial last blocks both ways
    for kw in ROUNDINGS:
        _same(x, (name, None, None, None), kw)
    _same(x, (name, None, None, None), axis=0)
    _same(np.ascontiguousarray(x[:1]), (name, None, None, None))          # one row
    _same(x.T, (name, None, None, None))                                  # strided input
    if isinstance(spec.block, int):
        _same(_hard((3, 2 * blen + 1, 5), 2), (name, None, None, None), axis=1)


_KIND_FORMATS = {"mx": ("e4m3fn", "e8m0", 32), "fp4": ("e2m1", "e4m3fn", 16),
                 "fp32": ("e4m3fn", "fp32", 32)}


@pytest.mark.parametrize("rule", sorted(block.SCALE_RULES))
def test_every_scale_rule_every_layout(rule):
    """Every rule, a new one too (the kernels run what it decides per block:
    cuDNN's rule divides, torchao's may give an infinite factor)."""
    elem, scale_fmt, blen = _KIND_FORMATS[block.SCALE_RULES[rule].kind]
    x = _hard((2 * blen + 5, 3 * blen + 1), 3)
    for args in ((elem, scale_fmt, blen, rule), (elem, scale_fmt, (blen, blen), rule)):
        for kw in ({}, {"rounding": "rtz"}, {"rounding": "sr", "seed": 2},
                   {"rounding": "sr8", "seed": 2}):
            _same(x, args, kw)
    _same(x, (elem, scale_fmt, blen, rule), axis=0)
    finite = spread((blen + 1, 2 * blen + 3), 4, -12, 12)
    _same(finite, (elem, scale_fmt, blen, rule))
    if block.SCALE_RULES[rule].two_level:
        _same(finite * f32(1e-37), (elem, scale_fmt, blen, rule))        # tiny tensor amax


@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e3m2", "e2m3", "e2m1"])
def test_mx_elements_and_infinite_blocks(elem):
    x = _hard((40, 70), 5)
    for inf_block in block.INF_BLOCK:
        for rule in ("floor", "rceil", "nearest"):
            _same(x, (elem, "e8m0", 32, rule), {"inf_block": inf_block})


def test_block_amax_against_a_loop_over_blocks():
    """Each block's amax by a Python loop over the blocks (NaN wins; -0 and
    subnormal magnitudes count), in the three shapes of the block layout."""
    x = _hard((9, 40), 6)
    cases = [(x.reshape(9, 5, 8), -1, lambda a: a.reshape(9, 5, 8)),
             (x.reshape(3, 3, 40), 1, lambda a: a.reshape(3, 3, 40).transpose(0, 2, 1)),
             (x.reshape(3, 3, 5, 8), (-3, -1),
              lambda a: a.reshape(3, 3, 5, 8).transpose(0, 2, 1, 3).reshape(3, 5, 24))]
    for B, dims, blocks in cases:
        got = fused.block_amax(B, dims)
        want = np.empty(blocks(x).shape[:-1], f32)
        for idx in np.ndindex(*want.shape):
            vals = blocks(x)[idx]
            mags = [abs(float(v)) for v in vals]
            want[idx] = np.nan if any(m != m for m in mags) else max(mags)
        assert got.shape == want.shape
        assert np.array_equal(got, want, equal_nan=True)
        assert (got[np.isnan(got)].view(np.uint32) == 0x7FC00000).all()


def test_which_roundings_fuse():
    assert fused.fuses(lookup("e2m1"), "rne") and fused.fuses(lookup("e4m3fn"), "sr")
    assert not fused.fuses(lookup("e2m1"), "sr8")            # srN: not in Triton's kernel
    assert fused.fuses(lookup("e2m1"), "sr8", srn=True)      # but in Numba's
    assert not fused.fuses(lookup("fp32"), "rne")            # codes wider than 16 bits


def test_the_host_runs_the_kernels(monkeypatch):
    """block.quantize_blocks calls the fused kernels (the tests above would
    compare the array code with itself otherwise)."""
    calls = []
    for name in ("block_amax", "scale_round"):
        real = getattr(fused, name)

        def spy(*a, _r=real, _n=name, **k):
            calls.append(_n)
            return _r(*a, **k)
        monkeypatch.setattr(fused, name, spy)
    block.quantize_blocks(spread((4, 64), 1), "mxfp8")
    assert calls == ["block_amax", "scale_round"]
    calls.clear()
    block.quantize_blocks(spread((4, 64), 1), "nvfp4", rounding="sr8", seed=1)   # srN too
    assert calls == ["block_amax", "scale_round"]


def test_the_k_block_epilogue_in_one_pass():
    """fp8-block's GEMM epilogue (fpemu.autograd._cpu_fp8) against the array
    statement of fp8.k_block_epilogue: the same float32 operations in the
    same order, overflow, underflow to -0 and NaN included, bit for bit."""
    from fpemu.autograd import fp8
    from fpemu.autograd.fp8 import k_block_epilogue_stacked
    rng = np.random.default_rng(9)
    for nk, M, N in ((1, 3, 5), (4, 17, 33), (7, 40, 24)):
        P = (rng.standard_normal((nk, M, N)) * 10.0 ** rng.integers(-40, 38, (nk, M, N)))
        P = P.astype(f32)
        P[0, 0, :2] = (-1e-45, np.nan)
        sa = (rng.random((M, nk + 1)) * 2.0 ** rng.integers(-70, 70, (M, nk + 1))).astype(f32)
        sb = (rng.random((N, nk)) * 2.0 ** rng.integers(-70, 70, (N, nk))).astype(f32)
        sa[0, 0] = sb[0, 0] = f32(1e-30)
        want = fp8.k_block_epilogue(((j, P[j].copy()) for j in range(nk)), sa, sb)
        got = k_block_epilogue_stacked(P, sa, sb)
        if nk == 1:                                 # the first term is the accumulator
            assert np.signbit(got[0, 0]) and got[0, 0] == 0
        ok = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert ok.all(), (nk, M, N, np.flatnonzero(~ok)[:4])


torch = pytest.importorskip("torch")


def test_cpu_tensors_run_the_kernels_on_their_memory(monkeypatch):
    """fpemu.torch on a CPU tensor: the same kernels, reading the tensor's
    memory where it lies (a transposed view too), equal to the host's."""
    import fpemu.torch
    calls = []
    real = fused.scale_round
    monkeypatch.setattr(fused, "scale_round",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    x = _hard((48, 80), 8)
    for t in (torch.from_numpy(x), torch.from_numpy(np.ascontiguousarray(x.T)).t()):
        for name, axis in (("mxfp8", -1), ("mxfp8", 0), ("nvfp4", -1), ("fp8-block", -1)):
            before = len(calls)
            q = fpemu.torch.quantize_blocks(t, name, axis=axis)
            assert len(calls) == before + 1
            h = block.quantize_blocks(x, name, axis=axis)
            assert np.array_equal(q.codes.numpy(), h.codes)
            assert np.array_equal(q.scales.numpy(), h.scales)


@pytest.mark.parametrize("path", ["fused", "array"])
def test_scaled_values_from_the_same_pass(path):
    """emulate's operand values (each element times its block scale, float32)
    written by the element step (fused: fpemu.torch on a CPU tensor; array:
    the driver's block_values on NumPy) equal the codes decoded and
    multiplied by the decoded scales afterwards
    (fpemu.block.host.scaled_values), in every layout, NaN blocks included."""
    from fpemu.torch import _blocks
    x = _hard((40, 96), 10)
    for name, block_, axis, rnd, seed in (
            ("mxfp8", 32, 1, "rne", None), ("mxfp8", 32, 0, "rne", None),
            ("nvfp4", 16, 1, "rne", None), ("nvfp4", (16, 16), 1, "rne", None),
            ("mxfp4", 32, 0, "rne", None), ("nvfp4", 16, 1, "sr8", 4)):
        spec = block.PRESETS[name]
        args = (spec.elem, spec.scale_fmt, block_, spec.scale_rule)
        if path == "fused":
            q = _blocks.quantize_blocks_scaled(torch.from_numpy(x), *args[:3], axis,
                                               args[3], rnd, seed)
            got = q.cache["scaled32"].numpy()
            codes = q.codes.numpy().astype(q.elem.code_dtype)
            scodes = q.scales.numpy().astype(q.scale_fmt.code_dtype)
            elem, sfmt = q.elem, q.scale_fmt
        else:
            cfg = driver.configure(*args, rnd, seed, None, None, "saturate")
            r = driver.run(x, cfg, axis, NP, ARRAY_OPS, allow_in_place=True, values=True)
            got, codes, scodes = r.values, r.codes, r.scodes
            elem, sfmt = cfg.elem, cfg.scale_fmt
            codes = codes.astype(elem.code_dtype)
            scodes = scodes.astype(sfmt.code_dtype)
        want = host.scaled_values(np.ascontiguousarray(codes), fpemu.decode(scodes, sfmt),
                                  elem, block_, axis)
        assert np.isnan(want).any()
        ok = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert ok.all(), (name, block_, axis, np.flatnonzero(~ok)[:4])
