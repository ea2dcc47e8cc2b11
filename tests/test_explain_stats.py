"""The teaching views and the underflow / overflow accounting."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu
from fpemu.explain import table, table_text, values
from fpemu.stats import CLASSES, stats, stats_chunked, stats_dask
from oracle import SPECS, TableOracle


# ----------------------------------------------------------------- explain
def test_explain_fields_of_a_tie():
    e = fpemu.explain(257.0, "bf16")
    assert (e.sign, e.exponent_bits, e.mantissa_bits) == ("0", "10000111", "0000000")
    assert (e.biased_exponent, e.exponent, e.cls) == (135, 8, "normal")
    assert (e.value, e.below, e.above) == (256.0, 256.0, 258.0)
    assert (e.abs_error, e.ulp_error) == (1.0, 0.5)
    assert "exactly halfway" in e.reason and "even" in e.reason
    assert fpemu.explain(257.0, "bf16", rounding="rna").value == 258.0
    assert "away from zero" in fpemu.explain(257.0, "bf16", rounding="rna").reason


@pytest.mark.parametrize("x,fmt,mode,cls,words", [
    (1e-8, "fp16", "rne", "zero", "underflowed"),
    (1e-6, "fp16", "rtz", "subnormal", "toward zero"),
    (465.0, "e4m3fn", "rne", "normal", "overflows"),
    (7e4, "fp16", "rne", "inf", "overflows"),
    (0.3, "e2m1", "rup", "subnormal", "toward +inf"),
    (-0.3, "e2m1", "rdn", "subnormal", "toward -inf"),
    (0.75, "fp16", "rne", "normal", "nothing to round"),
    (float("nan"), "bf16", "rne", "nan", "NaN stays NaN"),
])
def test_explain_says_why(x, fmt, mode, cls, words):
    e = fpemu.explain(x, fmt, rounding=mode)
    assert e.cls == cls
    assert words in e.reason
    assert e.value == float(fpemu.quantize(x, fmt, rounding=mode)) or np.isnan(e.value)
    text = str(e)
    assert fmt in text and "why" in text and e.bits.replace("", "")[:1] in text


def test_explain_bits_agree_with_the_code():
    for x in (0.1, -2.5, 1e-7, 448.0):
        for fmt in ("fp16", "bf16", "e4m3fn", "e5m2"):
            e = fpemu.explain(x, fmt)
            assert int(e.bits, 2) == e.code == int(fpemu.encode(x, fmt))
            assert e.sign + e.exponent_bits + e.mantissa_bits == e.bits


def test_explain_rejects_arrays():
    with pytest.raises(ValueError, match="takes one number"):
        fpemu.explain([1.0, 2.0], "fp16")


# ------------------------------------------------------------ values, table
@pytest.mark.parametrize("name", ["e4m3fn", "e5m2", "e4m3fnuz", "e2m1", "e3m2", "fp16"])
def test_values_agree_with_the_table_oracle(name):
    v = values(name)
    o = TableOracle(SPECS[name])
    want = o.value_of(np.arange(v.size))
    assert np.array_equal(v["value"], want, equal_nan=True)
    num = ~np.isnan(want)
    assert np.array_equal(np.signbit(v["value"][num]), np.signbit(want[num]))
    assert (v["cls"] == "nan").sum() == np.isnan(want).sum()
    assert all(int(b, 2) == c for b, c in zip(v["bits"][:50], v["code"][:50]))


def test_table_is_a_16_by_16_grid():
    t = table("e5m2")
    assert t.shape == (16, 16)
    assert t[7, 11] == 57344.0 and t[7, 12] == np.inf and np.isnan(t[7, 13])
    assert t[8, 0] == 0 and np.signbit(t[8, 0])
    assert table("e2m1").shape == (1, 16) and table("e3m2").shape == (4, 16)
    text = table_text("e4m3fnuz")
    assert text.splitlines()[10].split()[1] == "nan"  # 0x80 is NaN in fnuz
    with pytest.raises(ValueError, match="at most 8 bits"):
        table("bf16")
    with pytest.raises(ValueError, match="at most 16 bits"):
        values("fp32")


# ------------------------------------------------------------------- stats
def _by_hand(x, fmt, scale=1.0):
    """Classes counted one element at a time with the table oracle."""
    o = TableOracle(SPECS[fmt])
    f = fpemu.format(fmt)
    counts = dict.fromkeys(CLASSES, 0)
    for v in x:
        if np.isnan(v):
            counts["nan"] += 1
        elif np.isinf(v):
            counts["inf"] += 1
        elif v == 0:
            counts["zero"] += 1
        elif abs(v * scale) > f.max:
            counts["overflow"] += 1
        else:
            r = abs(o.value_of(o.round([v * scale]))[0])
            key = "flushed" if r == 0 else "subnormal" if r < f.min_normal else "normal"
            counts[key] += 1
    return counts


def test_stats_counts_every_class():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.lognormal(-12, 5, 3000) * rng.choice([-1, 1], 3000),
                        [0.0, -0.0, np.nan, np.inf, -np.inf, 65520.0, 65519.0]])
    for scale in (1.0, 1024.0):
        c = fpemu.stats(x, "fp16", scale=scale)
        assert c.counts == _by_hand(x, "fp16", scale)
        assert c.total == x.size
        assert c.hist.sum() + c.zero_bin == x.size - 3  # NaN and inf are not binned
        assert c.amax == np.nanmax(np.abs(x[np.isfinite(x)]))
    c = fpemu.stats([500.0, 1e6], "e4m3fn")
    assert c.overflow_to == {"inf": 0, "nan": 0, "saturated": 2}
    assert fpemu.stats([500.0], "e4m3fnuz").overflow_to["nan"] == 1
    assert fpemu.stats([7e4], "fp16").overflow_to["inf"] == 1


def _recount(x, fmt, scale, **kw):
    """What stats() counts, from whole-array numpy and fpemu.quantize (the
    classification and the histogram the fused kernel does in one pass)."""
    f = fpemu.format(fmt)
    x64 = np.asarray(x, np.float64)
    finite = np.isfinite(x64)
    xs = np.where(finite, x64, 0.0) * scale
    q = fpemu.quantize(xs, f, **kw).astype(np.float64)
    aq = np.abs(q)
    invalid = finite & (((xs == 0) & np.isnan(q)) | ((not f.signed) & (xs < 0)))
    big = finite & ~invalid & (np.abs(xs) > f.max)
    zero = finite & ~invalid & (x64 == 0)
    rest = finite & ~invalid & ~zero & ~big
    sub = rest & (aq > 0) & (aq < f.min_normal) if f.has_zero else np.zeros_like(rest)
    counts = {"nan": int(np.isnan(x64).sum() + invalid.sum()), "inf": int(np.isinf(x64).sum()),
              "zero": int(zero.sum()), "flushed": int((rest & (aq == 0)).sum()),
              "subnormal": int(sub.sum()), "normal": int((rest & (aq != 0) & ~sub).sum()),
              "overflow": int(big.sum())}
    to = {"inf": int((big & np.isinf(q)).sum()), "nan": int((big & np.isnan(q)).sum()),
          "saturated": int((big & np.isfinite(q)).sum())}
    _, e = np.frexp(np.abs(xs[finite & (x64 != 0)]))
    hist = np.bincount(np.clip(e - 1, -160, 159) + 160, minlength=320)
    return counts, to, hist, int((finite & (x64 == 0)).sum())


@pytest.mark.parametrize("fmt,kw", [("bf16", {}), ("e4m3fn", {}), ("e5m2", {"rounding": "sr"}),
                                    ("e4m3fnuz", {"rounding": "rtz"}),
                                    ("fp16", {"subnormals": False}), ("e8m0", {}),
                                    ("e2m1", {"overflow": "saturate"})])
def test_stats_one_pass_kernel_matches_a_numpy_recount(fmt, kw):
    """The fused kernel (blocks counted by threads, summed) against numpy over
    2**18 + 3 elements of every magnitude and class, float32 and float64."""
    rng = np.random.default_rng(8)
    n = (1 << 18) + 3
    x = rng.standard_normal(n) * np.exp2(rng.integers(-150, 130, n))
    x[rng.integers(0, n, 500)] = 0.0
    x[rng.integers(0, n, 300)] = np.inf
    x[rng.integers(0, n, 300)] = -np.inf
    if fpemu.format(fmt).has_nan:
        x[rng.integers(0, n, 300)] = np.nan
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)                     # some overflow to inf
    for arr in (x, x32):
        for scale in (1.0, 2.0**-20, 3.0):
            c = fpemu.stats(arr, fmt, scale=scale, seed=4, **kw)
            counts, to, hist, zeros = _recount(arr, fmt, scale, seed=4, **kw)
            assert c.counts == counts and c.overflow_to == to and c.zero_bin == zeros
            np.testing.assert_array_equal(c.hist, hist)
            assert c.amax == np.max(np.abs(arr[np.isfinite(arr)]))


@pytest.mark.parametrize("fmt,kw", [("e4m3fn", {}), ("e8m0", {"rounding": "rup"}),
                                    ("fp16", {"rounding": "sr"}), ("e5m2", {"rounding": "rdn"}),
                                    ("e3m2", {"subnormals": False})])
def test_stats_of_float32_at_extreme_power_of_two_scales(fmt, kw):
    """float32 input with a power-of-two scale 2**s takes the 32-bit kernel,
    which adds s to the exponent and tests overflow on the bits of |x|
    (against the largest float32 at or below fmax / 2**s), while x * 2**s
    stays a float64 normal (s in -873..895); past that, the float64 kernel.
    Both against the numpy recount, at and just past each limit, with the
    float32 neighbours of fmax / 2**s in the input."""
    rng = np.random.default_rng(11)
    n = 30000
    x = (rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
         * np.exp2(rng.integers(-149, 128, n))).astype(np.float32)
    x[:40] = 0.0
    x[40:60] = -0.0
    x[60:80] = np.inf
    x[80:90] = np.nan
    x[90:100] = np.float32(2.0**-149) * np.arange(1, 11)      # float32 subnormals
    fmax = fpemu.format(fmt).max
    for s in (-874, -873, -300, -160, -20, 0, 20, 150, 160, 300, 895, 896):
        with np.errstate(over="ignore", under="ignore"):
            t = np.float32(np.ldexp(fmax, -s))
        edge = [t, np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(0)), -t]
        xs = np.concatenate([x, np.array(edge, np.float32)])
        c = fpemu.stats(xs, fmt, scale=2.0**s, seed=3, **kw)
        counts, to, hist, zeros = _recount(xs, fmt, 2.0**s, seed=3, **kw)
        assert c.counts == counts and c.overflow_to == to and c.zero_bin == zeros, s
        np.testing.assert_array_equal(c.hist, hist)
        assert c.amax == np.max(np.abs(xs[np.isfinite(xs)]))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "e5m2", "e4m3fn"])
@pytest.mark.parametrize("overflow", [None, "saturate", "nan"])
def test_stats_fast_path_at_its_thresholds(fmt, overflow):
    """float32 input, a power-of-two scale, to nearest even in the formats
    and policies of the nearest-even fast path: ``stats`` counts the classes
    as intervals of |x|'s bits (``_kernels.stats32_fast``) between
    thresholds computed in advance. Against the numpy recount (fpemu.quantize
    of x * 2**s in float64: the generic kernel), with every threshold and its
    float32 neighbours in the input, at scales from one end of the float32
    kernel's range to the other."""
    from fpemu.quantize import Cast
    from fpemu.stats import _above_bits, _fast_thresholds
    kw = {} if overflow is None else {"overflow": overflow}
    cast = Cast.of(fmt, **kw)
    rng = np.random.default_rng(12)
    n = 4000
    base = (rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
            * np.exp2(rng.integers(-149, 128, n))).astype(np.float32)
    base[:20] = [0.0, -0.0, np.inf, -np.inf, np.nan] * 4
    for s in (-873, -200, -126, -40, -10, 0, 10, 40, 126, 140, 200, 895):
        th = _fast_thresholds(cast, s)
        assert th is not None
        bounds = np.array(list(th[:3]) + [_above_bits(float(cast.fmt.max), s)], np.int64)
        near = (bounds[:, None] + np.arange(-2, 3)[None, :]).reshape(-1)
        near = np.clip(near, 0, 0x7F800000).astype(np.uint32).view(np.float32)
        xs = np.concatenate([base, near, -near])
        c = fpemu.stats(xs, fmt, scale=2.0**s, **kw)
        counts, to, hist, zeros = _recount(xs, fmt, 2.0**s, **kw)
        assert c.counts == counts and c.overflow_to == to and c.zero_bin == zeros, s
        np.testing.assert_array_equal(c.hist, hist)
        assert c.amax == np.max(np.abs(xs[np.isfinite(xs)]))


def test_stats_many_counts_like_stats_in_one_pass():
    """stats_many (one pass for up to four fast-path formats, the monitor's
    way) against stats per format: the fast formats in groups of four and
    a remainder, formats without the fast path (e2m1, e3m2) and policies,
    scales at the float32 kernel's ends and one that is not a power of two,
    every threshold's float32 neighbours in the input."""
    from fpemu.quantize import Cast
    from fpemu.stats import _above_bits, _fast_thresholds, stats_many
    rng = np.random.default_rng(13)
    n = 3000
    base = (rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
            * np.exp2(rng.integers(-149, 128, n))).astype(np.float32)
    base[:20] = [0.0, -0.0, np.inf, -np.inf, np.nan] * 4
    fmts = ["fp16", "bf16", "e4m3fn", "e5m2", "e2m1", "e5m2", "e4m3fnuz", "e3m2", "tf32"]
    pols = [None, None, "nan", "saturate", None, "inf", None, None, None]
    for s in (-873, -126, -10, 0, 10, 126, 895, None):
        scale = 1 / 3 if s is None else 2.0**s
        near = []
        for f, o in zip(fmts, pols):
            th = None if s is None else _fast_thresholds(Cast.of(f, "rne", True, o), s)
            if th is not None:
                b = np.array(list(th[:3]) + [_above_bits(float(fpemu.format(f).max), s)])
                near.append((b[:, None] + np.arange(-2, 3)[None, :]).reshape(-1))
        near = np.clip(np.concatenate(near or [np.zeros(0)]), 0, 0x7F800000)
        near = near.astype(np.uint32).view(np.float32)
        xs = np.concatenate([base, near, -near])
        got = stats_many(xs, fmts, scale=scale, overflows=pols)
        for f, o, c in zip(fmts, pols, got):
            assert c == stats(xs, f, scale=scale, overflow=o), (f, o, s)


def test_stats_makes_no_per_element_temporaries():
    """One fused pass: the memory stats() takes does not grow with the array
    (the kernel's own buffers are per block of 2**16 elements)."""
    import tracemalloc
    x = np.random.default_rng(3).standard_normal(1 << 21).astype(np.float32)
    fpemu.stats(x, "e5m2", scale=64.0)                     # compile outside the measurement
    tracemalloc.start()
    c = fpemu.stats(x, "e5m2", scale=64.0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert c.total == x.size
    assert peak < 0.05 * x.nbytes, f"{peak / x.size:.2f} bytes per element"


def test_loss_scaling_recovers_underflow():
    rng = np.random.default_rng(0)
    g = rng.lognormal(-20, 2, 20000)
    before = fpemu.stats(g, "fp16")
    after = fpemu.stats(g, "fp16", scale=2.0**15)
    assert before.fraction("flushed") > 0.2
    assert after.fraction("flushed") < before.fraction("flushed") / 20
    assert np.array_equal(np.flatnonzero(after.hist), np.flatnonzero(before.hist) + 15)


def test_counts_merge_by_addition_and_chunks(tmp_path):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(50001) * np.exp2(rng.integers(-30, 20, 50001))).astype(np.float32)
    x[::97] = 0
    whole = fpemu.stats(x, "bf16", scale=8.0)
    halves = fpemu.stats(x[:20000], "bf16", scale=8.0) + fpemu.stats(x[20000:], "bf16", scale=8.0)
    assert halves == whole
    path = tmp_path / "grads.npy"
    np.save(path, x.reshape(3, -1)[:, :16667])
    mm = np.load(path, mmap_mode="r")
    assert stats_chunked(path, "bf16", chunk=4096, scale=8.0) == fpemu.stats(
        np.asarray(mm), "bf16", scale=8.0)
    with pytest.raises(ValueError, match="different settings"):
        _ = whole + fpemu.stats(x, "fp16")


def test_dask_blocks_give_the_same_counts():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(6)
    x = rng.lognormal(-14, 4, (300, 200))
    d = da.from_array(x, chunks=(70, 90))
    assert stats_dask(d, "fp16", scale=64.0) == fpemu.stats(x, "fp16", scale=64.0)


def test_stats_errors(tmp_path):
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        fpemu.stats([1.0], "fp16", scale=0)
    bad = tmp_path / "x.npy"
    bad.write_text("not numpy")
    with pytest.raises(ValueError, match="cannot read"):
        stats_chunked(bad, "fp16")


# -------------------------------------------------- reliability of stats
def test_stats_classes_follow_the_rounded_value_in_e8m0():
    # e8m0 has neither sign nor zero: -1, 0 and -0 become NaN, not "normal" or "zero"
    c = fpemu.stats([-1.0, 0.0, -0.0, 1.0, 1e-50, -1e40], "e8m0")
    assert np.isnan(fpemu.quantize([-1.0, 0.0], "e8m0")).all()
    assert c.counts == {"nan": 4, "inf": 0, "zero": 0, "flushed": 0, "subnormal": 0,
                        "normal": 2, "overflow": 0}
    assert c.zero_bin == 2 and c.total == 6


def test_chunked_stochastic_rounding_equals_one_call():
    # values exactly between 0 and fp16's smallest subnormal: each element's random
    # bits decide flushed or subnormal, so any reuse of bits across chunks shows
    x = np.full(5000, 2.0**-25)
    whole = stats(x, "fp16", rounding="sr", seed=3)
    assert 2000 < whole.counts["flushed"] < 3000
    assert stats_chunked(x, "fp16", rounding="sr", seed=3, chunk=64) == whole
    assert stats_chunked(x, "fp16", rounding="sr", seed=(3, 0), chunk=1000) == whole
    f = np.asfortranarray(x.reshape(50, 100))               # C-order indices, not memory order
    assert stats_chunked(f, "fp16", rounding="sr", seed=3, chunk=64) == whole


def test_chunked_fortran_file_is_read_in_its_own_order(tmp_path):
    import tracemalloc
    rng = np.random.default_rng(2)
    a = np.asfortranarray(rng.standard_normal((1000, 1000)) * 2.0**-20)   # 8 MB
    np.save(tmp_path / "f.npy", a)
    assert np.load(tmp_path / "f.npy", mmap_mode="r").flags.f_contiguous
    want = stats(a, "fp16")
    stats_chunked(tmp_path / "f.npy", "fp16", chunk=1 << 14)   # compile outside the measurement
    tracemalloc.start()
    got = stats_chunked(tmp_path / "f.npy", "fp16", chunk=1 << 14)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got == want
    assert peak < 4e6, f"{peak / 1e6:.1f} MB: the whole array was copied"


@pytest.mark.parametrize("rng_,msg", [((1,), "a pair"), ((0, 10**12), "lo < hi within"),
                                      ((5, 5), "lo < hi"), ((0.5, 3), "a pair of ints")])
def test_log2_range_is_checked(rng_, msg):
    with pytest.raises(ValueError, match=msg) as e:
        stats([1.0], "fp16", log2_range=rng_)
    assert "The default is (-160, 160)" in str(e.value)


def test_masked_elements_are_skipped_by_stats():
    x = np.ma.array([1e-9, 1.0, np.nan, 7e4], mask=[False, False, True, True])
    assert stats(x, "fp16") == stats([1e-9, 1.0], "fp16")
    assert stats_chunked(x, "fp16") == stats([1e-9, 1.0], "fp16")


def test_file_errors_never_suggest_unpickling(tmp_path):
    (tmp_path / "x.txt").write_text("1 2 3")
    (tmp_path / "e.npy").write_bytes(b"")
    np.save(tmp_path / "o.npy", np.array([None, 1]), allow_pickle=True)
    for name, msg in (("x.txt", "does not start with the .npy signature"),
                      ("e.npy", "it is empty"), ("o.npy", "never unpickles")):
        with pytest.raises(ValueError, match=msg) as e:
            stats_chunked(tmp_path / name, "fp16")
        assert "pickle=" not in str(e.value) and "numpy.save" in str(e.value)
    with pytest.raises(ValueError, match="not a regular file"):
        stats_chunked(tmp_path, "fp16")


def test_readme_names_are_modules_and_functions():
    """fpemu.explain and fpemu.stats are modules that call as their function."""
    assert fpemu.explain(0.1, "bf16").value == fpemu.explain.explain(0.1, "bf16").value
    assert fpemu.explain.values("e2m1")["value"][:2].tolist() == [0.0, 0.5]
    assert fpemu.stats([1e-9], "fp16") == fpemu.stats.stats([1e-9], "fp16")
    assert fpemu.stats.stats_chunked([1e-9], "fp16").counts["flushed"] == 1
