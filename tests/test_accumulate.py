"""Accumulation models against exact rational references, the tensor-core
test vectors of Fasi et al. (2021), and MMA-Sim's bit-accurate results."""

from __future__ import annotations

import functools
import pathlib
from fractions import Fraction

import numpy as np
import pytest

import fpemu
from fpemu import accumulate as ac
from oracle import SPECS, TableOracle

DATA = pathlib.Path(__file__).with_name("data")


# --------------------------------------------- step-by-step rational models
def _r(oracle, q, mode="rne"):
    """Round one exact value (Fraction or float zero) with the table oracle."""
    return Fraction(float(oracle.value_of(oracle.round_exact([q], mode))[0]))


@functools.lru_cache(maxsize=None)
def _oracle(acc):
    return TableOracle(SPECS[acc])


def reference(model, a, b, acc, mode="rne"):
    """The model, step by step in exact rationals, rounding with the oracle."""
    o = _oracle(acc)
    prods = [Fraction(x) * Fraction(y) for x, y in zip(a, b)]
    if model == "exact":
        return _r(o, sum(prods, Fraction(0)), mode)
    if model == "fma":
        c = Fraction(0)
        for pr in prods:
            c = _r(o, pr + c, mode)
        return c
    terms = [_r(o, pr, mode) for pr in prods]
    if model == "sequential":
        c = Fraction(0)
        for t in terms:
            c = _r(o, c + t, mode)
        return c
    assert model == "pairwise"
    while len(terms) > 1:
        nxt = [_r(o, terms[2 * t] + terms[2 * t + 1], mode) for t in range(len(terms) // 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return _r(o, Fraction(0) + terms[0], mode)


@pytest.mark.parametrize("model", ["exact", "sequential", "pairwise", "fma"])
@pytest.mark.parametrize("acc,mode", [("fp16", "rne"), ("bf16", "rtz"), ("e5m2", "rup"),
                                      ("fp16", "rdn")])
def test_models_against_rational_reference(model, acc, mode):
    rng = np.random.default_rng([len(model), len(acc), len(mode)])
    for K in (1, 2, 3, 7, 16, 33):
        x = fpemu.quantize(rng.standard_normal((12, K)) * np.exp2(rng.integers(-6, 6, (12, K))),
                           "e4m3fn")
        y = fpemu.quantize(rng.standard_normal((12, K)), "e4m3fn")
        got = ac.dot(x, y, "e4m3fn", acc, model=model, rounding=mode)
        for r in range(12):
            want = reference(model, x[r].tolist(), y[r].tolist(), acc, mode)
            assert Fraction(float(got[r])) == want, (model, acc, mode, K, r)


def test_exact_model_rounds_once_over_a_huge_range():
    x = np.array([2.0**127, 2.0**-149, -(2.0**127), 2.0**-149, 2.0**-149])
    assert ac.sum(x, "fp32", model="exact").item() == 3 * 2.0**-149
    assert ac.sum(x, "fp32", model="sequential").item() == 2 * 2.0**-149
    # one rounding: 1 + 2**-24 + 2**-60 is just above a tie
    y = np.array([1.0, 2.0**-24, 2.0**-60])
    assert ac.sum(y, "fp32", model="exact").item() == 1 + 2**-23
    assert ac.sum(y, "fp32", model="sequential").item() == 1.0
    assert np.signbit(ac.sum([-0.0, -0.0], "fp32", model="exact"))
    assert np.signbit(ac.sum([-0.0, -0.0], "fp32", "fp16", model="sequential"))
    assert not np.signbit(ac.sum(np.zeros(0), "fp32", model="exact"))
    assert not np.signbit(ac.sum([1.0, -1.0], "fp32", model="exact"))
    assert np.signbit(ac.sum([1.0, -1.0], "fp32", model="exact", rounding="rdn"))


def test_native_fp32_loop_equals_emulated_sequential():
    rng = np.random.default_rng(4)
    a = fpemu.quantize(rng.standard_normal((20, 300)) * 1e3, "bf16")
    b = fpemu.quantize(rng.standard_normal((300, 9)), "bf16")
    fast = ac.matmul(a, b, "bf16")  # the float32 loop
    slow = ac.matmul(a, b, "bf16", model="blocked", block=10**6)  # emulated, one block
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))
    rows = ac.dot(a[:, None, :], b.T[None, :, :], "bf16")
    assert np.array_equal(fast.view(np.uint32), rows.view(np.uint32))


def test_infinities_and_nan_propagate():
    inf = np.inf
    assert ac.sum([1.0, inf], "fp16", model="h100").item() == inf
    assert np.isnan(ac.sum([inf, -inf], "fp16", model="exact").item())
    assert np.isnan(ac.sum([2.0**20, 1.0, -(2.0**20)], "fp32", "fp16").item())  # fp16 overflow
    assert ac.sum([2.0**20, 1.0, -(2.0**20)], "fp32", "fp16", model="exact").item() == 1.0


# ------------------------------- Fasi, Higham, Mikaitis, Pranesh (2021)
def _tc(bs, c, model, a=None):
    a = np.ones(len(bs)) if a is None else np.asarray(a, float)
    return ac.dot(a, np.asarray(bs, float), "fp16", model=model, c=c).item()


def test_fasi_et_al_volta_vectors():
    """The checks of tc_test_numerics-V100.cu (north-numerical-computing/
    tensor-cores-numerical-behavior) with the outcomes the paper reports for
    V100, reproduced by the v100 preset."""
    u = 2.0**-24
    b1 = 1 - 2.0**-11
    assert _tc([b1], 0.0, "v100", [b1]) == 1 - 2.0**-10 + 2.0**-22  # products exact
    assert _tc([b1] * 4, 0.0, "v100", [b1] * 4) == 4 * (1 - 2.0**-10 + 2.0**-22)
    assert _tc([u] * 4, 1.0, "v100") == 1.0                           # binary32 accumulation
    for j in range(4):                                                # aligned to the largest
        bs = [u] * 4
        bs[j] = 1.0
        assert _tc(bs, u, "v100") == 1.0
    assert _tc([2.0, 2.0**-23 + u, 0, 0], 0.0, "v100") == 2.0         # truncation, positive
    assert _tc([-2.0, -(2.0**-23) - u, 0, 0], 0.0, "v100") == -2.0    # and negative
    assert _tc([1.0], -(1 - u), "v100") == 2.0**-23                   # no extra alignment bits
    assert _tc([u] * 4, 1 - u, "v100") == 1 + 2.0**-23                # normalisation after sum
    carry = 1 + 2.0**-22 + 2.0**-23
    for j in range(4):                                                # carry-out bits
        bs = [1.0] * 4
        bs[j] = 2.0**-23
        assert _tc(bs, carry, "v100") == 4 + 2.0**-21
    assert _tc([1.0, 1.5, 1.75, 1.875], 1.875, "v100") == 8.0
    assert _tc([1.0] * 4, carry, "v100") == 5.0                       # truncated normalisation
    assert _tc([-1.0] * 4, -carry, "v100") == -5.0
    partial = _tc([u] * 4, 1 - u, "v100")                             # not monotonic
    assert _tc([u] * 4, 1.0, "v100") < partial


def test_extra_alignment_bits_of_later_generations():
    u = 2.0**-24
    assert _tc([1.0], -(1 - u), "v100") == 2.0**-23   # 0 extra bits
    assert _tc([1.0], -(1 - u), "a100") == u          # 1 extra bit: exact
    assert _tc([1.0], -(1 - u), "h100") == u
    # 1 + 2**-24 - 1 and 1 + 2**-25 - 1: which alignment bits survive
    for model, kept in (("v100", 0.0), ("a100", 2.0**-24), ("h100", 2.0**-24)):
        assert _tc([1.0, 2.0**-12], -1.0, model, [1.0, 2.0**-12]) == kept, model
    for model, kept in (("v100", 0.0), ("a100", 0.0), ("h100", 2.0**-25)):
        assert _tc([1.0, 2.0**-12], -1.0, model, [1.0, 2.0**-13]) == kept, model


def test_zero_terms_align_the_block_where_a_model_says_so():
    """A zero product counts with the model's ``e_zero`` in the block's
    largest exponent. The presets' e_zero (-131..-133) lies below fp32's
    emin and never sets the alignment; a model with e_zero = 0 aligns
    2**-10 to 2**0 with 3 fraction bits and truncates it to 0 (worked by
    hand from the TensorCore definition)."""
    low = ac.TensorCore("zeros-low", 4, 3, 23, -133)
    high = ac.TensorCore("zeros-high", 4, 3, 23, 0)
    x, c = [2.0**-10, 0.0, 0.0, 0.0], 2.0**-12      # c is no zero: only the terms are
    assert ac.dot([1.0] * 4, x, "fp16", model=low, c=c).item() == 2.0**-10 + 2.0**-12
    assert ac.dot([1.0] * 4, x, "fp16", model=high, c=c).item() == 0.0
    assert ac.dot([1.0] * 4, [2.0**-10, 1.0, 0.0, 0.0], "fp16", model=high, c=c).item() == 1.0
    for bad in (-999, 1100, 1.5, True):
        with pytest.raises(ValueError, match="e_zero .* must be an int in -300..127"):
            ac.TensorCore("bad", 4, 3, 23, bad)
    a = np.ones((2, 4))
    b = np.array(x)[:, None] * np.ones((1, 3))
    cm = np.full((2, 3), c)
    assert (ac.matmul(a, b, "fp16", model=high, c=cm) == 0).all()
    assert (ac.matmul(a, b, "fp16", model=low, c=cm) == 2.0**-10 + 2.0**-12).all()


# --------------------------------------------------------------- MMA-Sim
MMASIM = {"v100": ("fp16", "v100"), "a100": ("bf16", "a100"), "h100": ("bf16", "h100"),
          "h100-fp16": ("fp16", "h100"), "h100-fp8": ("e4m3fn", "h100-fp8"),
          "h100-fp8-e5m2": ("e5m2", "h100-fp8"), "b200-fp8": ("e4m3fn", "b200-fp8")}


@pytest.mark.parametrize("case", sorted(MMASIM))
def test_tensor_core_presets_match_mmasim_bit_for_bit(case):
    """200 dot products of length 96 (several chained blocks) per case,
    computed by MMA-Sim 2.1.1 (scripts/make_mmasim_vectors.py)."""
    d = np.load(DATA / "mmasim_vectors.npz")
    fmt, model = MMASIM[case]
    got = ac.dot(d[f"{case}/a"], d[f"{case}/b"], fmt, model=model, c=d[f"{case}/c"])
    want = d[f"{case}/d"]
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{int(bad.sum())} differ, first {got[bad][:3]} vs {want[bad][:3]}"


@pytest.mark.parametrize("case", sorted(MMASIM))
def test_tensor_core_matmul_matches_mmasim_row_by_row(case):
    """The same MMA-Sim products through ``matmul`` (the whole-matrix kernel,
    which takes each element's exponent itself), one (1, 96) @ (96, 1)
    product per vector with its accumulator ``c``."""
    d = np.load(DATA / "mmasim_vectors.npz")
    fmt, model = MMASIM[case]
    a, b, c, want = (d[f"{case}/{k}"] for k in "abcd")
    got = np.array([ac.matmul(a[i:i + 1], b[i][:, None], fmt, model=model,
                              c=np.reshape(c[i], (1, 1)))[0, 0] for i in range(len(a))],
                   np.float32)
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{int(bad.sum())} differ, first {got[bad][:3]} vs {want[bad][:3]}"


@pytest.mark.parametrize("model,fmt,block", [("h100", "bf16", 0), ("h100", "fp16", 0),
                                             ("h100-fp8", "e4m3fn", 0), ("v100", "fp16", 5),
                                             ("h100", "bf16", 32)])
def test_tensor_core_bmm_is_each_product_bit_for_bit(model, fmt, block):
    """``Plan.bmm`` (a batch in one kernel call) against each product as
    row-by-row dot products (``Plan.dot_rows``, the path ``dot`` takes, which
    MMA-Sim's vectors check above): values over 40 binades with zeros of
    both signs and the format's subnormals, odd shapes, blocked promotion,
    an empty K, and inf / NaN operands (run product by product)."""
    kw = dict(model="blocked", inner=model, block=block) if block else dict(model=model)
    plan = ac.Plan.of(fmt, "fp32", "fp32", **kw)
    f = fpemu.formats.format(fmt)
    rng = np.random.default_rng(7)
    for nb, M, K, N in [(5, 7, 33, 9), (3, 1, 1, 1), (2, 4, 0, 3), (6, 16, 70, 16)]:
        def draw(shape):
            v = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 10, shape))
            v[rng.random(shape) < 0.1] = 0.0
            v[rng.random(shape) < 0.05] = -0.0
            v[rng.random(shape) < 0.05] = f.min_subnormal * rng.integers(1, 4)
            return fpemu.quantize(v, fmt, overflow="saturate").astype(np.float32)
        A, B = draw((nb, M, K)), draw((nb, K, N))
        specials = (A.copy(), B.copy())
        if K and nb > 2:
            specials[0][1, 0, 0], specials[1][2, 0, -1] = np.inf, np.nan
        for A, B in ((A, B), specials):
            got = plan.bmm(A, B)
            assert got.shape == (nb, M, N) and got.dtype == np.float32
            if K == 0:
                assert (got.view(np.uint32) == 0).all()        # an empty sum is +0
                continue
            for n in range(nb):
                Ar = np.repeat(A[n].astype(np.float64), N, axis=0)
                Br = np.tile(B[n].T.astype(np.float64), (M, 1))
                want = np.asarray(plan.dot_rows(Ar, Br), np.float32).reshape(M, N)
                assert np.array_equal(got[n].view(np.uint32), want.view(np.uint32)), \
                    (nb, M, K, N, n, np.isfinite(A).all() and np.isfinite(B).all())


def test_plan_matmul_from_c_is_matmul_from_c():
    """``Plan.matmul(a, b, c)`` (operands not checked again) gives the bits of
    :func:`matmul` with the same ``c``, broadcast or whole, zeros of both
    signs among it; a split K refuses ``c`` as ``matmul`` does."""
    rng = np.random.default_rng(3)
    A = fpemu.quantize(rng.standard_normal((5, 40)), "bf16").astype(np.float32)
    B = fpemu.quantize(rng.standard_normal((40, 6)), "bf16").astype(np.float32)
    for model in ("h100", "sequential", "pairwise"):
        plan = ac.Plan.of("bf16", "fp32", "fp32", model=model)
        for c in (np.float32(-0.0), (rng.standard_normal((5, 6)) * 8).astype(np.float32),
                  np.array([0.0, -0.0, 1.5, -2.0, 1e-40, 3.0], np.float32)):
            got = np.asarray(plan.matmul(A, B, c), np.float32)
            want = np.asarray(ac.matmul(A, B, "bf16", "fp32", "fp32", model=model, c=c),
                              np.float32)
            assert got.shape == (5, 6) and np.array_equal(got.view(np.uint32),
                                                          want.view(np.uint32)), (model, c)
    split = ac.Plan.of("bf16", "fp32", "fp32", model="sequential", splitk=2)
    with pytest.raises(ValueError, match=r"Plan.matmul\(\): c with splitk=2"):
        split.matmul(np.zeros((1, 256)), np.zeros((256, 1)), np.zeros((1, 1)))


# ---------------------------------------------------------- DeepSeek-V3
def test_deepseek_v3_promotion_every_128_elements():
    """An fp8 GEMM with K = 4096 on Hopper's 13-fraction-bit accumulation
    loses percents; promoting the partial sums into fp32 every N_C = 128
    elements (DeepSeek-V3 §3.3.2) brings the error down by two orders."""
    rng = np.random.default_rng(0)
    x = rng.random((32, 4096))
    w = rng.random((4096, 32))
    a = fpemu.quantize(x * 448, "e4m3fn")
    b = fpemu.quantize(w * 448, "e4m3fn")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    hopper = ac.matmul(a, b, "e4m3fn", model="h100-fp8")
    promoted = ac.matmul(a, b, "e4m3fn", model="blocked", block=128, inner="h100-fp8")
    err_h = np.abs(hopper - ref).max() / np.abs(ref).max()
    err_p = np.abs(promoted - ref).max() / np.abs(ref).max()
    assert 0.01 < err_h < 0.15
    assert err_p < err_h / 50
    assert np.all(hopper <= ref)  # truncation only ever loses magnitude here


def test_model_errors():
    with pytest.raises(ValueError, match="unknown accumulation model 'kahan'.*exact, sequential"):
        ac.sum([1.0], "fp16", model="kahan")
    with pytest.raises(ValueError, match="accumulate in fp32"):
        ac.sum([1.0], "fp16", "fp16", model="h100")
    with pytest.raises(ValueError, match="at most 12 significant bits"):
        ac.sum([1.0], "fp32", model="h100")
    with pytest.raises(ValueError, match="a holds 1 value.*not bfloat16.*quantize"):
        ac.dot([0.1], [1.0], "bf16")
    with pytest.raises(ValueError, match=r"shapes \(M, K\) and \(K, N\)"):
        ac.matmul(np.ones((2, 3)), np.ones((2, 3)), "fp16")
    with pytest.raises(ValueError, match="block must be an int >= 1"):
        ac.sum([1.0], "fp16", model="blocked", block=0)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        ac.sum(np.ones((2, 2)), "fp16", axis=3)


@pytest.mark.parametrize("model", ["v100", "h100", "h100-fp8", "b200-fp8"])
def test_matrix_kernel_equals_dot_by_dot(model):
    """matmul's column-vectorised tensor-core kernel against the per-dot one
    (which the MMA-Sim vectors check), also with promotion every 64."""
    rng = np.random.default_rng(len(model))
    fmt = "e4m3fn" if "fp8" in model else "fp16"
    a = fpemu.quantize(rng.standard_normal((9, 200)) * np.exp2(rng.integers(-3, 3, (9, 200))), fmt)
    b = fpemu.quantize(rng.standard_normal((200, 7)), fmt)
    a[0, :50] = 0
    for kw in ({}, {"model": "blocked", "block": 64, "inner": model}):
        kw = {"model": model, **kw}
        whole = ac.matmul(a, b, fmt, **kw)
        rows = ac.dot(a[:, None, :], b.T[None, :, :], fmt, **kw)
        assert np.array_equal(whole.view(np.uint32), rows.view(np.uint32)), kw


# ------------------------------------------------- block-scaled tensor cores
MMASIM_BLOCK = {
    "mxf8f6f4-e4m3-e4m3": ("e4m3fn", "e4m3fn", "e8m0", 32),
    "mxf8f6f4-e5m2-e4m3": ("e5m2", "e4m3fn", "e8m0", 32),
    "mxf8f6f4-e2m3-e3m2": ("e2m3", "e3m2", "e8m0", 32),
    "mxf8f6f4-e2m1-e2m1": ("e2m1", "e2m1", "e8m0", 32),
    "mxf4nvf4-ue4m3-16": ("e2m1", "e2m1", "e4m3fn", 16),
    "mxf4nvf4-ue8m0-16": ("e2m1", "e2m1", "e8m0", 16),
    "mxf4nvf4-ue8m0-32": ("e2m1", "e2m1", "e8m0", 32),
}


@pytest.mark.parametrize("case", sorted(MMASIM_BLOCK))
def test_block_scaled_presets_match_mmasim_bit_for_bit(case):
    """Blackwell's kind::mxf8f6f4 and kind::mxf4nvf4 against MMA-Sim 2.1.1
    (scripts/make_mmasim_block_vectors.py): 10,500 mxf8f6f4 and 20,000
    mxf4nvf4 instructions over the cases, chained five per dot product,
    with E8M0 scales over their whole range (results overflow to inf and
    fall into fp32's subnormals), UE4M3 scales with subnormals and zeros,
    and accumulators that cancel the sum."""
    d = np.load(DATA / "mmasim_block_vectors.npz")
    ea, eb, sf, blk = MMASIM_BLOCK[case]
    a, b, sa, sb, c, want = (d[f"{case}/{k}"] for k in ("a", "b", "sa", "sb", "c", "d"))
    model = "b200-" + case.split("-")[0]
    got = np.array([ac.scaled_matmul(a[i:i + 1], sa[i:i + 1], b[i][:, None], sb[i][:, None],
                                     ea, eb, sf, block=blk, model=model, c=c[i])[0, 0]
                    for i in range(len(a))], np.float32)
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{int(bad.sum())} differ, first {got[bad][:3]} vs {want[bad][:3]}"
    # the same vectors as one GEMM: vector i's a as row i, its b as column i and
    # its c on the diagonal, which holds the answers (the kernels run a row's
    # columns side by side: overflows, NaN scales and cancellations among them)
    for lo in range(0, len(a), 500):
        hi = min(len(a), lo + 500)
        y = ac.scaled_matmul(a[lo:hi], sa[lo:hi], b[lo:hi].T.copy(), sb[lo:hi].T.copy(), ea,
                             eb, sf, block=blk, model=model, c=np.diag(c[lo:hi]))
        diag = np.ascontiguousarray(np.diagonal(y))
        bad = diag.view(np.uint32) != want[lo:hi].view(np.uint32)
        assert not bad.any(), (lo, int(bad.sum()))


def test_scaled_matmul_gemm_and_exact_model():
    """The GEMM form equals its rows' dot products; the instruction models
    stay within their truncation of the exact sum (checked in rationals);
    ``exact`` is the exact sum rounded once."""
    from fpemu import block
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    w = rng.standard_normal((96, 5)).astype(np.float32)
    qa = block.quantize_blocks(x, "nvfp4")
    qb = block.quantize_blocks(w, "nvfp4", axis=0)
    y = ac.scaled_matmul(*qa, *qb, "e2m1", scale_fmt="e4m3fn", block=16)
    rows = np.array([[ac.scaled_matmul(qa.codes[i:i + 1], qa.scales[i:i + 1],
                                       qb.codes[:, j:j + 1], qb.scales[:, j:j + 1], "e2m1",
                                       scale_fmt="e4m3fn", block=16)[0, 0]
                      for j in range(5)] for i in range(6)], np.float32)
    np.testing.assert_array_equal(y.view(np.uint32), rows.view(np.uint32))
    ref = (qa.codes.astype(int), qa.scales.astype(int), qb.codes.astype(int),
           qb.scales.astype(int))
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]

    def e4m3(code):
        e, m = code >> 3, code & 7
        return Fraction(m, 8) * Fraction(1, 64) if e == 0 else \
            Fraction(8 + m, 8) * Fraction(2) ** (e - 7)
    exact = np.empty((6, 5), object)
    for i in range(6):
        for j in range(5):
            exact[i, j] = sum((Fraction(e2m1[ref[0][i, k]]) * e4m3(ref[1][i, k // 16])
                               * Fraction(e2m1[ref[2][k, j]]) * e4m3(ref[3][k // 16, j])
                               for k in range(96)), Fraction(0))
    ex = ac.scaled_matmul(*qa, *qb, "e2m1", scale_fmt="e4m3fn", block=16, model="exact")
    np.testing.assert_array_equal(ex, np.array([[float(v) for v in r] for r in exact],
                                               np.float32))
    for i in range(6):
        for j in range(5):
            e = exact[i, j]
            assert abs(Fraction(float(y[i, j])) - e) <= abs(e) * Fraction(1, 2**21)
    t = np.float32(0.37)
    np.testing.assert_array_equal(
        ac.scaled_matmul(*qa, *qb, "e2m1", scale_fmt="e4m3fn", block=16, alpha=t),
        (y * t).astype(np.float32))


def test_scaled_matmul_nan_scale_and_errors():
    a = np.full((1, 32), 0x38, np.uint8)                       # e4m3fn 1.0
    s = np.array([[0xFF]], np.uint8)                           # the E8M0 NaN
    one = np.array([[127]], np.uint8)
    y = ac.scaled_matmul(a, s, a.T.copy(), one, "e4m3fn")
    assert y.view(np.uint32)[0, 0] == 0x7FFFFFFF
    assert ac.scaled_matmul(a, one, a.T.copy(), one, "e4m3fn")[0, 0] == 32.0
    with pytest.raises(ValueError, match="takes block=32 with e8m0"):
        ac.scaled_matmul(a, np.array([[127, 127]], np.uint8), a.T.copy(),
                         np.array([[127], [127]], np.uint8), "e4m3fn", block=16)
    with pytest.raises(ValueError, match="takes elements in e2m1"):
        ac.scaled_matmul(a, one, a.T.copy(), one, "e4m3fn", model="b200-mxf4nvf4")
    with pytest.raises(ValueError, match="shapes do not agree"):
        ac.scaled_matmul(a, one, a.copy(), one, "e4m3fn")
    with pytest.raises(ValueError, match="integer codes"):
        ac.scaled_matmul(a.astype(np.float32), one, a.T.copy(), one, "e4m3fn")


def test_batched_fp32_sequential_matmul_is_matmul_of_each_batch_element():
    rng = np.random.default_rng(12)
    for K in (0, 1, 70):
        A = (rng.standard_normal((3, 5, K)) * 1e3).astype(np.float32)
        B = (rng.standard_normal((3, K, 6)) * 1e-3).astype(np.float32)
        got = ac.bmm_fp32_sequential(A, B)
        want = np.stack([ac.matmul(A[i], B[i], "fp32") for i in range(3)])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.signbit(ac.bmm_fp32_sequential(np.zeros((1, 1, 0), np.float32),
                                             np.zeros((1, 0, 1), np.float32))).sum() == 0


@pytest.mark.parametrize("M,K,N", [(4, 8, 16), (7, 9, 5), (6, 3, 33), (9, 14, 1),
                                   (130, 67, 70)])
def test_batched_fp32_sequential_matmul_on_every_remainder_and_special_value(M, K, N):
    """The batched kernel adds four terms per pass over blocks of four rows and
    one at a time for the rest (_accum_kernels.py): every split of M and K
    (M % 4, K % 4 from 0 to 3), both loops (130 x 67 runs the parallel one),
    and values that overflow, underflow, cancel to -0 or +0 and make NaNs must
    give the bits of the single-matrix kernel, term by term in index order."""
    rng = np.random.default_rng(M * 1000 + K)
    A = (rng.standard_normal((2, M, K)) * 2.0 ** rng.integers(-70, 70, (2, M, K)))
    B = (rng.standard_normal((2, K, N)) * 2.0 ** rng.integers(-70, 70, (2, K, N)))
    A, B = A.astype(np.float32), B.astype(np.float32)
    special = np.array([np.inf, -np.inf, -0.0, 0.0, 3e38, 1e-45, -1e-40], np.float32)
    A.reshape(-1)[::11] = np.resize(special, A.reshape(-1)[::11].size)
    B.reshape(-1)[5::13] = np.resize(special[::-1], B.reshape(-1)[5::13].size)
    A[0, 0, :], B[0, :, 0] = -0.0, 1.0                 # -0 products: a sum of -0
    A[1, -1, 0], B[1, 0, -1] = np.inf, 0.0             # inf * 0: a NaN
    got = ac.bmm_fp32_sequential(A, B)
    with np.errstate(all="ignore"):
        want = np.stack([ac.matmul(A[i], B[i], "fp32") for i in range(2)])
    nan = np.isnan(want)
    assert nan[1, -1, -1] and np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    assert got.view(np.uint32)[0, 0, 0] == 0x80000000
    # A given as the transposed view of its transpose's storage (the weight
    # gradient's g.T @ x) is read in place, with the same bits
    view = np.ascontiguousarray(A.swapaxes(1, 2)).swapaxes(1, 2)
    assert not view.flags.c_contiguous or min(M, K) == 1
    got_t = ac.bmm_fp32_sequential(view, B)
    assert np.array_equal(np.isnan(got_t), nan)
    np.testing.assert_array_equal(got_t.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
