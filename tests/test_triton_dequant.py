"""The fused dequantization kernel (fpemu/torch/_triton_dequant.py), on this
CPU.

``TRITON_INTERPRET=1`` runs the kernel's source through Triton's interpreter
on CPU tensors (set before the kernel is defined; CI has no GPU). Its float32
values must be those of the CPU's Numba pass,
:func:`fpemu.block.host.scaled_values`, bit for bit (NaN at the same places),
and the exact products (element values times scale values in float64,
rounded once to float32, NumPy only). Inputs: codes and scales of
:func:`fpemu.block.quantize_blocks` on random data, with every code of the
element format planted and some scales replaced by codes of every kind (the
NaN scale, zero, the smallest and largest, negative ones for E4M3 scales);
elements e4m3fn, e5m2, e2m1, e2m3, e3m2 and bf16 (16-bit codes) under E8M0
scales (MX) and e2m1 and e4m3fn under E4M3 scales (NVFP4); blocks of 32 and
16 along axis 1, 32 along axis 0, 16x16 tiles; partial last blocks, one row,
one column, and strided, transposed and int32 codes.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"     # before the kernel is defined (module text)

import zlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import fpemu  # noqa: E402
from fpemu import block  # noqa: E402
from fpemu.block import host  # noqa: E402
from fpemu.errors import FpemuValueError  # noqa: E402
from fpemu.torch import _triton_dequant  # noqa: E402
from block_data import spread  # noqa: E402

PAIRS = [("e4m3fn", "e8m0"), ("e5m2", "e8m0"), ("e2m1", "e8m0"), ("e2m3", "e8m0"),
         ("e3m2", "e8m0"), ("bf16", "e8m0"), ("e2m1", "e4m3fn"), ("e4m3fn", "e4m3fn")]
LAYOUTS = [(32, 1), (16, 1), (32, 0), ((16, 16), -1)]
SHAPES = [(37, 70), (1, 45), (45, 1)]


def _seed(*what):
    return zlib.crc32(repr(what).encode())


def _inputs(elem, sfmt, shape, blk, axis):
    """Codes and scale codes of quantize_blocks on random data, every element
    code planted (as many as fit) and a third of the scales replaced by
    random scale codes, the NaN scale among them where the format has one.
    Returns (codes, scale codes, the quantization)."""
    rng = np.random.default_rng(_seed(elem, sfmt, shape, blk, axis))
    rule = "floor" if sfmt == "e8m0" else "nvfp4"
    q = block.quantize_blocks(spread(shape, _seed(shape), -20, 20), elem, scale_fmt=sfmt,
                              block=blk, axis=axis, scale_rule=rule)
    e, s = fpemu.format(elem), fpemu.format(sfmt)
    codes, scodes = np.array(q.codes), np.array(q.scales)
    every = rng.permutation(1 << e.bits)[:codes.size].astype(codes.dtype)
    codes.reshape(-1)[rng.permutation(codes.size)[:every.size]] = every
    flat = scodes.reshape(-1)
    pick = rng.random(flat.size) < 1 / 3
    flat[pick] = rng.integers(0, 1 << s.bits, pick.sum())
    if s.has_nan:
        flat[rng.integers(flat.size)] = s.nan_code
    return codes, scodes, q


def _exact(codes, svals, elem, blk, axis):
    """The exact products rounded once to float32 (float64 holds every
    product of these formats exactly)."""
    vals = fpemu.decode(codes, elem).astype(np.float64)
    by, bx = blk if isinstance(blk, tuple) else ((blk, 1) if axis == 0 else (1, blk))
    full = np.repeat(np.repeat(svals.astype(np.float64), by, axis=0), bx, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        return (vals * full[:codes.shape[0], :codes.shape[1]]).astype(np.float32)


def _same_bits(got, want, what):
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=str(what))
    bad = np.flatnonzero(got[~nan].view(np.uint32) != want[~nan].view(np.uint32))
    assert bad.size == 0, (what, bad.size, got[~nan][bad[:4]], want[~nan][bad[:4]])


def _check(ct, codes, scodes, q, what, st=None):
    """The kernel on the codes tensor ``ct`` (holding ``codes``) against both
    oracles."""
    e, s = fpemu.format(q.elem), fpemu.format(q.scale_fmt)
    svals = fpemu.decode(scodes, s).astype(np.float32)
    got = _triton_dequant.scaled_values(ct, torch.from_numpy(svals) if st is None else st, e,
                                        q.block, q.axis)
    assert got.is_contiguous()
    got = got.numpy()
    _same_bits(got, host.scaled_values(np.ascontiguousarray(codes), svals, e, q.block, q.axis),
               what + ("host",))
    _same_bits(got, _exact(codes, svals, e, q.block, q.axis), what + ("exact",))
    return svals


@pytest.mark.parametrize("elem, sfmt", PAIRS, ids=lambda v: v)
def test_each_value_is_the_hosts(elem, sfmt):
    for blk, axis in LAYOUTS:
        for shape in SHAPES:
            codes, scodes, q = _inputs(elem, sfmt, shape, blk, axis)
            _check(torch.from_numpy(codes), codes, scodes, q, (elem, sfmt, blk, axis, shape))


@pytest.mark.parametrize("blk, axis", LAYOUTS, ids=str)
def test_strided_transposed_and_int32_codes(blk, axis):
    for elem, sfmt in (("e4m3fn", "e8m0"), ("e2m1", "e4m3fn"), ("bf16", "e8m0")):
        codes, scodes, q = _inputs(elem, sfmt, (37, 70), blk, axis)
        what = (elem, sfmt, blk, axis)
        big = np.zeros((37, 140), codes.dtype)
        big[:, 1::2] = codes
        _check(torch.from_numpy(big)[:, 1::2], codes, scodes, q, what + ("strided",))
        svals = _check(torch.from_numpy(codes.T.copy()).t(), codes, scodes, q,
                       what + ("transposed",))
        st = torch.from_numpy(svals.T.copy()).t()              # strided scale values too
        _check(torch.from_numpy(codes.astype(np.int32)), codes, scodes, q, what + ("int32",),
               st=st)


def test_every_bf16_code_under_every_e8m0_scale():
    """All 65536 bf16 codes, each block of 256 of them under one of the 256
    E8M0 scales (2**-127 .. 2**127, NaN): overflow to inf, products below
    float32's normals, NaN and infinite elements."""
    rng = np.random.default_rng(_seed("bf16-all"))
    codes = rng.permutation(1 << 16).astype(np.uint16).reshape(256, 256)
    scodes = rng.permutation(256).astype(np.uint8).reshape(256, 1)
    q = block.quantize_blocks(np.zeros((256, 256), np.float32), "bf16", scale_fmt="e8m0",
                              block=256, axis=1, scale_rule="floor")
    _check(torch.from_numpy(codes), codes, scodes, q, ("bf16", "all"))


def test_empty_and_wrong_shapes():
    e = fpemu.format("e4m3fn")
    out = _triton_dequant.scaled_values(torch.zeros((0, 40), dtype=torch.uint8),
                                        torch.zeros((0, 2)), e, 32, 1)
    assert out.shape == (0, 40) and out.dtype == torch.float32
    with pytest.raises(FpemuValueError, match="scales' shape"):
        _triton_dequant.scaled_values(torch.zeros((4, 40), dtype=torch.uint8),
                                      torch.zeros((4, 1)), e, 32, 1)
    with pytest.raises(FpemuValueError, match="2-D"):
        _triton_dequant.scaled_values(torch.zeros(40, dtype=torch.uint8), torch.zeros(2), e, 32,
                                      1)


def test_emulate_takes_a_triton_devices_operand_values_from_the_kernel(monkeypatch):
    """fpemu.torch.emulate's GEMM operands on a Triton device (CPU tensors
    routed as CUDA tensors are): the values come from this kernel, and equal
    the CPU's, in every layout the recipes use."""
    from fpemu.torch import _emulate, _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", False)
    monkeypatch.setattr(_quantize, "TRITON_DEVICES", ("cuda", "cpu"))
    calls = []
    real = _triton_dequant.scaled_values

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(_triton_dequant, "scaled_values", spy)
    x = spread((40, 96), 3)
    for name, axis in (("mxfp8", 1), ("mxfp8", 0), ("nvfp4", 1), ("nvfp4-2d", 1)):
        q = fpemu.torch.quantize_blocks(torch.from_numpy(x), name, axis=axis)
        got = _emulate._block_scaled(q).numpy()
        h = q.numpy()
        want = host.scaled_values(np.ascontiguousarray(h.codes), fpemu.decode(h.scales,
                                  h.scale_fmt), h.elem, h.block, h.axis)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, axis)
    assert len(calls) == 4
