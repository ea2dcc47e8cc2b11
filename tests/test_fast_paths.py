"""The fast paths against the generic kernels and independent oracles.

* ``quantize`` and ``encode`` of float32 to nearest even into an IEEE-style
  format or e4m3fn, under any overflow policy, run a bit trick
  (``_kernels/fast.py``: ``quantize_rne_ieee``, ``encode_rne_ieee``), and in the other
  deterministic modes (RNA, RTZ, RUP, RDN, RTO) another
  (``_kernels.directed_kernel``); the generic kernel (float64 input takes
  it) must give the same bits. The sample below covers every sign and
  exponent with the mantissas around every rounding boundary; with
  ``FPEMU_EXHAUSTIVE=1`` the tests run all 2**32 float32 inputs (about 30 s
  per format, mode and policy).
* ``fma`` of float32 operands in fp32 to nearest even runs the processor's
  fused multiply-add; the generic kernel (float64 operands) and exact
  rationals must agree.
* Other roundings of float32 input run 32-bit kernels; the float64-input
  kernels (64-bit integers) must give the same bits, in every mode and
  overflow policy.
* Parallel kernels run as serial twins on small arrays: same bits.
"""

import os
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fpemu
from fpemu import _jit
from fpemu.formats import Format
from fpemu.quantize import Cast
from oracle import round_to_ieee

#: bf16, tf32 and e8m3 have float32's exponent range ("wide": their kernels
#: round every finite input on the bits, subnormals included)
FORMATS = {"bf16": "bf16", "fp16": "fp16", "e5m2": "e5m2", "e4m3fn": "e4m3fn",
           "e6m9": Format.custom(6, 9, name="e6m9"), "tf32": "tf32",
           "e8m3": Format.custom(8, 3, name="e8m3")}
OVERFLOWS = (None, "saturate", "nan")


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _mantissas(rng):
    """Mantissa fields (23 bits) at and around the rounding boundary of every
    target precision from 1 to 22 bits, plus random ones."""
    m = {0, 1, 2, (1 << 23) - 1, (1 << 23) - 2}
    for keep in range(1, 23):
        s = 23 - keep
        half = 1 << (s - 1)
        for hi in (0, 1, 2, 3, (1 << keep) - 2, (1 << keep) - 1):
            for lo in (half - 1, half, half + 1, 0, 1, (1 << s) - 1):
                m.add(((hi << s) | lo) & ((1 << 23) - 1))
    m.update(rng.integers(0, 1 << 23, 600).tolist())
    return np.array(sorted(m), np.uint32)


def _sample():
    rng = np.random.default_rng(11)
    top = np.arange(512, dtype=np.uint32) << np.uint32(23)        # sign and exponent
    u = (top[:, None] | _mantissas(rng)[None, :]).reshape(-1)
    return u.view(np.float32)


def _chunks():
    """The boundary sample in slices below ``_jit.SERIAL_BELOW`` (they run the
    serial twins, which compile in about half the time of the parallel loops
    and give the same bits: test_small_arrays_run_the_serial_twin_with_the_same_bits),
    or all 2**32 float32 inputs in chunks of 2**26 (the parallel loops) under
    ``FPEMU_EXHAUSTIVE=1``."""
    if os.environ.get("FPEMU_EXHAUSTIVE"):
        return (np.arange(s, s + (1 << 26), dtype=np.uint64).astype(np.uint32).view(np.float32)
                for s in range(0, 1 << 32, 1 << 26))
    x = _sample()
    return [x[i:i + 16000] for i in range(0, x.size, 16000)]


FAST_MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto")


def _takes_fast_path(fmt, kw, op):
    cast = Cast.of(fmt, **kw)
    if cast.rounding.name == "RNE":
        return (cast.fast if op == "quantize" else cast.fast_encode) is not None
    return (cast.fast_directed if op == "quantize" else cast.fast_directed_encode) is not None


@pytest.mark.parametrize("mode", FAST_MODES)
@pytest.mark.parametrize("overflow", OVERFLOWS)
@pytest.mark.parametrize("name", list(FORMATS))
def test_quantize_fast_path_matches_the_generic_kernel(name, overflow, mode):
    fmt = FORMATS[name]
    kw = {"rounding": mode} if overflow is None else {"rounding": mode, "overflow": overflow}
    assert _takes_fast_path(fmt, kw, "quantize")
    for x in _chunks():
        fast = fpemu.quantize(x, fmt, **kw)
        with np.errstate(invalid="ignore"):                     # signalling NaNs
            x64 = x.astype(np.float64)
        generic = fpemu.quantize(x64, fmt, **kw)                # the generic kernel
        np.testing.assert_array_equal(_bits(fast), _bits(generic))


@pytest.mark.parametrize("mode", FAST_MODES)
@pytest.mark.parametrize("overflow", OVERFLOWS)
@pytest.mark.parametrize("name", list(FORMATS))
def test_encode_fast_path_matches_the_generic_kernel(name, overflow, mode):
    """``encode`` of float32 runs ``_kernels.encode_rne_ieee`` to nearest
    even and ``_kernels.directed_kernel("encode", mode)`` in the other
    deterministic modes (the codes of the quantize fast paths' values); the
    generic kernel (float64 input) must give the same codes. All 2**32 inputs
    under ``FPEMU_EXHAUSTIVE=1``."""
    fmt = FORMATS[name]
    kw = {"rounding": mode} if overflow is None else {"rounding": mode, "overflow": overflow}
    assert _takes_fast_path(fmt, kw, "encode")
    for x in _chunks():
        fast = fpemu.encode(x, fmt, **kw)
        with np.errstate(invalid="ignore"):
            x64 = x.astype(np.float64)
        np.testing.assert_array_equal(fast, fpemu.encode(x64, fmt, **kw))


def test_directed_fast_path_against_exact_rationals():
    """An oracle that shares no code with either kernel: each mode's result
    for float32 inputs at and between the subnormal steps, near the top of
    the range and around 1, from exact rationals (the two grid neighbours of
    |x| and the mode's rule), saturating."""
    rng = np.random.default_rng(8)
    for name in ("bf16", "fp16", "e5m2", "e4m3fn"):
        f = fpemu.format(name)
        m, emin = f.mantissa_bits, f.emin
        step = Fraction(2) ** (emin - m)
        grid = [k * step / 4 for k in range(0, 4 * (1 << m) + 9)]       # subnormal quarters
        grid += [v for v in (Fraction(f.max) * (1 + Fraction(k, 1 << (m + 3)))
                             for k in range(-9, 12)) if v < 2 ** 128]
        grid += [1 + Fraction(k, 1 << (m + 2)) for k in range(-9, 9)]
        x = np.array([float(v) for v in grid], np.float32)
        x = np.concatenate([x, -x, rng.standard_normal(200).astype(np.float32)])
        vals = [Fraction(float(v)) for v in x]
        for mode in FAST_MODES[1:]:
            got = fpemu.quantize(x, name, rounding=mode, overflow="saturate")
            for v, xv, g in zip(vals, x, got):
                want = _round_rational(v, m, emin, float(f.max), mode)
                assert float(g) == want and np.signbit(g) == np.signbit(xv), (
                    name, mode, xv, g, want)


def _round_rational(v, m, emin, fmax, mode):
    """The value of rational ``v`` rounded in ``mode`` to a format with ``m``
    mantissa bits, minimum exponent ``emin`` and largest value ``fmax``,
    saturating: the two grid neighbours of |v| by exact arithmetic."""
    a = abs(v)
    e = emin
    while a >= Fraction(2) ** (e + 1):
        e += 1
    unit = Fraction(2) ** (e - m)
    lo = (a // unit) * unit
    hi = lo if lo == a else lo + unit
    k = int(lo / unit)
    if mode == "rtz":
        r = lo
    elif mode == "rna":
        r = hi if a - lo >= hi - a else lo
    elif mode == "rto":
        r = lo if (lo == a or k % 2 == 1) else hi
    else:
        up = (mode == "rup") == (v >= 0)                 # the magnitude rounds away from zero
        r = hi if up else lo
    return float(min(r, Fraction(fmax))) * (-1.0 if v < 0 else 1.0)


def test_encode_fast_path_matches_ml_dtypes_and_numpy_codes():
    """Independent oracles for the codes: ml_dtypes' bfloat16, float8_e5m2 and
    float8_e4m3fn and numpy's float16, viewed as integers (NaN compared as a
    NaN code: the oracles keep the input's sign and payload, fpemu writes the
    canonical code)."""
    x = _sample()
    with np.errstate(all="ignore"):
        for name, oracle, itype, kw in (
                ("bf16", ml_dtypes.bfloat16, np.uint16, {}), ("fp16", np.float16, np.uint16, {}),
                ("e5m2", ml_dtypes.float8_e5m2, np.uint8, {}),
                ("e4m3fn", ml_dtypes.float8_e4m3fn, np.uint8, {"overflow": "nan"})):
            cast = x.astype(oracle)
            nan = np.isnan(cast.astype(np.float32))
            got = fpemu.encode(x, name, **kw)
            np.testing.assert_array_equal(got[nan], fpemu.format(name).nan_code)
            np.testing.assert_array_equal(got[~nan], cast.view(itype)[~nan])


# One format per kind of flags the 32-bit kernels compile for: IEEE with inf
# (fp32, tf32, bf16, fp16, e5m2), fn (e4m3fn, the MX fp6 / fp4), fnuz, e8m0
# (unsigned, no zero, binades below float32's normal range) and a custom
# format without subnormals whose normal range reaches float32's subnormals.
WIDE = ("fp32", "tf32", "bf16", "fp16", "e5m2", "e4m3fn", "e4m3fnuz", "e5m2fnuz", "e3m2", "e2m3",
        "e2m1", "e8m0", Format.custom(8, 3, bias=136, has_subnormals=False, name="e8m3low"))
POLICIES = ({}, {"overflow": "saturate"}, {"overflow": "nan"}, {"subnormals": False})
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")


def _cases():
    """Every format and policy to nearest even (the policies live in code that
    all modes share), and every other mode for formats with three different
    sets of flags. Each new (mode, flags) pair compiles four kernels."""
    for fmt in WIDE:
        for kw in POLICIES:
            yield fmt, kw, "rne"
    for fmt in ("bf16", "e4m3fn", "e8m0"):
        for mode in MODES[1:]:
            yield fmt, {}, mode


def _compare(fmt, kw, mode, x):
    if not fmt.has_nan:
        x = np.where(np.isnan(x), np.float32(0), x)
    if not fmt.signed:
        x = np.abs(x)
    with np.errstate(invalid="ignore"):                         # signalling NaNs
        x64 = x.astype(np.float64)
    for op in (fpemu.encode, fpemu.quantize):
        got = op(x, fmt, rounding=mode, seed=7, **kw)
        want = op(x64, fmt, rounding=mode, seed=7, **kw)
        if got.dtype == np.float32:
            got, want = _bits(got), _bits(want)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (fmt.name, mode, kw, op.__name__, bad.size, x[bad[:5]],
                               got[bad[:5]], want[bad[:5]])


def test_float32_kernels_match_the_float64_kernels():
    """float32 input runs the 32-bit kernels (``_kernels/round32.py``), float64
    input the int64 ones: the same rounding written twice, in different
    integer widths. Codes and values, every policy; the fast rne path of
    ``quantize`` is not taken where the format or policy rules it out, and
    the codes never take it. SR: the same seed, and the same slices, for both.
    ``FPEMU_EXHAUSTIVE=1`` adds all 2**32 float32 inputs in every mode for
    bf16, fp16, e4m3fn, e5m2 and e2m1."""
    x = _sample()
    for fmt, kw, mode in _cases():
        fmt = fpemu.format(fmt)
        if kw.get("overflow") == "nan" and not fmt.has_nan:
            continue
        if kw.get("subnormals") is False and not fmt.has_subnormals:
            continue
        # slices below _jit.SERIAL_BELOW run the serial twins, which compile
        # in about half the time of the parallel loops (the twins give the
        # same bits: test_small_arrays_run_the_serial_twin_with_the_same_bits)
        for i in range(0, x.size, 16000):
            _compare(fmt, kw, mode, x[i:i + 16000])
    if os.environ.get("FPEMU_EXHAUSTIVE"):        # all 2**32 inputs: about a minute each
        for name in ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1"):
            for mode in MODES:
                for s in range(0, 1 << 32, 1 << 26):
                    x = np.arange(s, s + (1 << 26), dtype=np.uint64).astype(np.uint32)
                    _compare(fpemu.format(name), {}, mode, x.view(np.float32))


def test_quantize_fast_path_matches_ml_dtypes_and_numpy():
    """Independent oracles: ml_dtypes' bfloat16, float8_e5m2 and float8_e4m3fn
    casts and numpy's float16 cast (all round to nearest even; ml_dtypes'
    e4m3fn gives NaN beyond 464, fpemu's overflow="nan"); NaNs compared as NaN."""
    x = _sample()
    with np.errstate(all="ignore"):
        for name, oracle, kw in (("bf16", ml_dtypes.bfloat16, {}), ("fp16", np.float16, {}),
                                 ("e5m2", ml_dtypes.float8_e5m2, {}),
                                 ("e4m3fn", ml_dtypes.float8_e4m3fn, {"overflow": "nan"})):
            want = x.astype(oracle).astype(np.float32)
            got = fpemu.quantize(x, name, **kw)
            nan = np.isnan(want)
            np.testing.assert_array_equal(np.isnan(got), nan)
            np.testing.assert_array_equal(_bits(got)[~nan], _bits(want)[~nan])


@pytest.mark.parametrize("fmt,kw", [("e4m3fnuz", {}), ("e4m3fnuz", {"rounding": "rtz"}),
                                    ("e4m3fn", {"rounding": "sr"}),
                                    ("fp16", {"subnormals": False}),
                                    ("fp16", {"subnormals": False, "rounding": "rup"}),
                                    ("e2m1", {}), ("e2m1", {"rounding": "rdn"}), ("e8m0", {})])
def test_other_formats_and_modes_take_the_generic_kernel(fmt, kw):
    cast = Cast.of(fmt, **kw)
    assert (cast.fast, cast.fast_encode, cast.fast_directed, cast.fast_directed_encode) == (
        None, None, None, None)


def test_fp32_fma_fast_path_matches_the_generic_kernel_and_exact_rationals():
    rng = np.random.default_rng(5)
    n = 1 << 16
    u = rng.integers(0, 1 << 32, (3, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    g = (rng.standard_normal((3, n)) * 2.0 ** rng.integers(-140, 120, (3, n))).astype(
        np.float32)
    a, b, c = np.where(rng.random((3, n)) < 0.3, u, g)
    with np.errstate(all="ignore"):
        c[: n // 4] = (-(a[: n // 4].astype(np.float64) * b[: n // 4])).astype(np.float32)
    fast = fpemu.fma(a, b, c, "fp32")
    with np.errstate(invalid="ignore"):                         # signalling NaNs
        a64, b64, c64 = (v.astype(np.float64) for v in (a, b, c))
    generic = fpemu.fma(a64, b64, c64, "fp32")                  # the generic kernel
    np.testing.assert_array_equal(_bits(fast), _bits(generic))
    finite = np.flatnonzero(np.isfinite(a) & np.isfinite(b) & np.isfinite(c))[:400]
    for i in finite:
        want = round_to_ieee(Fraction(float(a[i])) * Fraction(float(b[i]))
                             + Fraction(float(c[i])), 8, 23)
        got = float(fast[i])
        assert got == want or (got == 0 == want), (a[i], b[i], c[i], got, want)


def test_small_arrays_run_the_serial_twin_with_the_same_bits():
    x = np.random.default_rng(2).standard_normal(1 << 18).astype(np.float32) * 1e3
    whole = fpemu.quantize(x, "e5m2")                 # parallel kernel
    parts = np.concatenate([fpemu.quantize(x[i:i + 1000], "e5m2")
                            for i in range(0, x.size, 1000)])
    np.testing.assert_array_equal(_bits(whole), _bits(parts))
    twins = [t for t in _jit._SERIAL.values() if "quantize_rne_ieee" in t.py_func.__name__]
    assert twins and twins[0].py_func.__name__ == "quantize_rne_ieee_serial"
    assert not twins[0].targetoptions.get("parallel")


def test_serial_below_runs_the_serial_twin_inside_it_only(monkeypatch):
    """``_jit.serial_below(n)`` (fpemu.torch's CPU paths): arrays below ``n``
    run the serial twin within it, nested scopes keep the larger threshold,
    and outside it the layer's own threshold holds again."""
    x = np.random.default_rng(3).standard_normal(1 << 15).astype(np.float32)
    want = _bits(fpemu.quantize(x, "e5m2"))                 # (its kernel's entry made here)
    calls = []

    def spying(twin):
        def spy(*a):
            calls.append(a[0].size)
            return twin(*a)
        return spy
    # every serial twin the process has made (the kernel that quantize runs among them)
    for key, (kernel, twin) in list(_jit._TWINS.items()):
        if twin is not None:
            monkeypatch.setitem(_jit._TWINS, key, (kernel, spying(twin)))
    monkeypatch.setattr(_jit, "_layer", "tbb")             # a layer whose threshold is 2**14
    runs = []
    for scope in (None, 1 << 17, (1 << 17, 1 << 10), None):
        if scope is None:
            got = fpemu.quantize(x, "e5m2")
        elif isinstance(scope, tuple):
            with _jit.serial_below(scope[0]), _jit.serial_below(scope[1]):
                got = fpemu.quantize(x, "e5m2")
        else:
            with _jit.serial_below(scope):
                got = fpemu.quantize(x, "e5m2")
        np.testing.assert_array_equal(_bits(got), want)
        runs.append(len(calls))
    assert runs == [0, 1, 2, 2]


def test_cast_names_its_kernel_parameters():
    """Cast.layout reads the kernel parameters by name; each equals what the
    format's definition says (e4m3fn: 3 mantissa bits, bias 7, largest
    magnitude code 0x7E, NaN 0x7F, no infinity; e5m2: infinity 0x7C) and the
    flag bits are named."""
    from fpemu.quantize import Cast
    e4 = Cast.of("e4m3fn").layout
    assert (e4.mantissa_bits, e4.emin, e4.emax, e4.bias) == (3, -6, 8, 7)
    assert (e4.max_code, e4.inf_code, e4.nan_code, e4.sign_shift) == (0x7E, -1, 0x7F, 7)
    e5 = Cast.of("e5m2").layout
    assert (e5.max_code, e5.inf_code, e5.sign_shift) == (0x7B, 0x7C, 7)
    assert tuple(Cast.of("bf16").layout) == Cast.of("bf16").params
    assert Cast.of("fp16", subnormals=False).flags & Cast.FLUSH
    assert Cast.of("e4m3fnuz").flags & Cast.FNUZ and Cast.of("e8m0").flags & Cast.UNSIGNED
