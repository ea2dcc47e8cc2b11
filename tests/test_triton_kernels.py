"""fpemu.torch's Triton kernels (what CUDA tensors run), checked on this CPU.

``TRITON_INTERPRET=1`` makes Triton run the kernels' source through its
interpreter on CPU tensors (set here before the kernels are defined; CI has no
GPU). Every kernel against fpemu's Numba kernels, bit for bit: quantize,
encode and decode for every format (custom ones too), every rounding mode
(stochastic rounding under both generators), every overflow policy, with
subnormals kept and flushed. The inputs are the edge sets of
:func:`fpemu.testing.strategies.edge_inputs` (every kind of value of the
format, both signs, including the midpoints and the neighbours of its edges)
and random float32 bit patterns, small enough for the interpreter. Then the
wiring: ``fpemu.torch.quantize`` / ``encode`` / ``decode`` and
``quantize_blocks`` route a tensor of a Triton device to the kernels.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"     # before the kernels are defined (module text)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import fpemu  # noqa: E402
import fpemu.torch  # noqa: E402
from fpemu.errors import FpemuValueError  # noqa: E402
from fpemu.formats import FORMATS, Format  # noqa: E402
from fpemu.testing.strategies import edge_inputs  # noqa: E402
from fpemu.torch import _quantize  # noqa: E402
from fpemu.torch import _triton  # noqa: E402
from test_torch_quantize import _policies  # noqa: E402

MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")
CUSTOM = (Format.custom(6, 9, name="e6m9"), Format.custom(3, 0, nan_encoding="none",
                                                          name="e3m0"),
          Format.custom(4, 3, bias=11, nan_encoding="fnuz"),
          Format.custom(4, 2, bias=140, nan_encoding="fn"),        # binades below float32's
          Format.custom(5, 1, signed=False, has_subnormals=False, name="ue5m1"))
ALL = tuple(FORMATS) + CUSTOM


def _inputs(fmt):
    """The format's edge set and 300 random bit patterns, as float32 (no NaN
    into a format without one)."""
    bits = np.random.default_rng(zlib_seed(fmt.name)).integers(0, 1 << 32, 300, dtype=np.uint64)
    x = np.concatenate([edge_inputs(fmt, per_kind=48), bits.astype(np.uint32).view(np.float32),
                        np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0])])
    return x if fmt.has_nan else x[~np.isnan(x)]


def zlib_seed(name):
    return sum(name.encode()) * 7919


def _configs(fmt):
    """(rounding, subnormals, overflow, rng): every mode under the default
    policy, Philox stochastic rounding, then every policy the format allows
    with subnormals kept and flushed (nearest even)."""
    for mode in MODES:
        yield mode, True, None, None
    yield "sr", True, None, "philox"
    for kw in _policies(fmt):
        yield "rne", kw["subnormals"], kw["overflow"], None
    yield "rtz", False, None, None


@pytest.mark.parametrize("fmt", ALL, ids=lambda f: f.name)
def test_every_kernel_gives_the_numba_kernels_bits(fmt):
    x = _inputs(fmt)
    u = torch.from_numpy(x).view(torch.int32)
    dplan = _quantize._plan(fmt, "rne", True, "saturate", None)
    for rounding, subnormals, overflow, rng in _configs(fmt):
        kw = dict(rounding=rounding, subnormals=subnormals, overflow=overflow, seed=(9, 123),
                  rng=rng)
        plan = _quantize._plan(fmt, rounding, subnormals, overflow, (9, 123), rng)
        got = _triton.round_bits(u, plan, torch.empty_like(u), encode=False).numpy()
        want = fpemu.quantize(x, fmt, **kw).view(np.int32)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (fmt.name, kw, "quantize", x[bad[:4]], want[bad[:4]], got[bad[:4]])
        codes = torch.empty(u.shape, dtype=_quantize._CODE_DTYPES[plan.code_bytes])
        got = _triton.round_bits(u, plan, codes, encode=True).numpy()
        want = fpemu.encode(x, fmt, **kw)
        assert got.dtype == want.dtype
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (fmt.name, kw, "encode", x[bad[:4]], want[bad[:4]], got[bad[:4]])
        vals = _triton.decode_codes(codes, dplan, torch.empty_like(u)).numpy()
        np.testing.assert_array_equal(vals, fpemu.decode(want, fmt).view(np.int32))


def test_decode_every_code_of_the_formats_up_to_16_bits():
    for fmt in ALL:
        if fmt.bits > 16:
            continue
        c = np.arange(1 << fmt.bits).astype(fmt.code_dtype)
        plan = _quantize._plan(fmt, "rne", True, "saturate", None)
        out = torch.empty(c.shape, dtype=torch.int32)
        got = _triton.decode_codes(torch.from_numpy(c), plan, out).numpy()
        np.testing.assert_array_equal(got, fpemu.decode(c, fmt).view(np.int32), err_msg=fmt.name)


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """CPU tensors routed to the Triton kernels, as CUDA tensors are."""
    monkeypatch.setattr(_quantize, "CPU_KERNELS", False)
    monkeypatch.setattr(_quantize, "TRITON_DEVICES", ("cuda", "cpu"))


def test_the_public_functions_route_a_triton_device_to_the_kernels(triton_on_cpu,
                                                                   monkeypatch):
    calls = []
    for name in ("round_bits", "decode_codes"):
        real = getattr(_triton, name)
        monkeypatch.setattr(_triton, name,
                            lambda *a, _real=real, _name=name, **k: (calls.append(_name),
                                                                     _real(*a, **k))[1])
    x = np.random.default_rng(2).standard_normal((7, 33)).astype(np.float32)
    t = torch.from_numpy(x)
    for fmt, kw in (("e4m3fn", {}), ("bf16", {"rounding": "sr", "seed": 4, "rng": "philox"}),
                    ("e2m1", {"rounding": "rtz"})):
        q = fpemu.torch.quantize(t, fmt, **kw)
        assert q.shape == (7, 33) and q.dtype == torch.float32
        np.testing.assert_array_equal(q.numpy().view(np.int32),
                                      fpemu.quantize(x, fmt, **kw).view(np.int32))
        out = torch.empty_like(t)
        fpemu.torch.quantize(t, fmt, out=out, **kw)
        np.testing.assert_array_equal(out.numpy(), q.numpy())
        c = fpemu.torch.encode(t.T, fmt, **kw)                  # strided: read row-major
        np.testing.assert_array_equal(c.numpy(), fpemu.encode(x.T, fmt, **kw))
        np.testing.assert_array_equal(fpemu.torch.decode(c, fmt).numpy(),
                                      fpemu.decode(c.numpy(), fmt))
    assert calls.count("round_bits") == 9 and calls.count("decode_codes") == 3
    with pytest.raises(FpemuValueError, match="holds NaN and e2m1 has no NaN"):
        fpemu.torch.quantize(torch.tensor([1.0, float("nan")]), "e2m1")


@pytest.mark.parametrize("preset, rounding", [("mxfp8", "rne"), ("nvfp4", "sr8"),
                                              ("mxfp4", "sr"), ("fp8-block", "rne")])
def test_block_quantization_rounds_its_elements_in_the_kernels(triton_on_cpu, preset,
                                                               rounding):
    from fpemu import block
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32) * 3
    kw = {"seed": 5} if rounding != "rne" else {}
    want = block.quantize_blocks(x, preset, rounding=rounding, **kw)
    got = fpemu.torch.quantize_blocks(torch.from_numpy(x), preset, rounding=rounding, **kw)
    np.testing.assert_array_equal(got.codes.numpy(), want.codes)
    np.testing.assert_array_equal(got.scales.numpy(), want.scales)
    np.testing.assert_array_equal(got.values.numpy(), want.values)
