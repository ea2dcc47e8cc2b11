"""Split-K: cuBLASLt's choice (``fpemu.cublaslt``) and the split GEMM
(``accumulate``'s and ``_scaled_mm``'s ``splitk=``) against mmaemu 0.1.0,
whose H100 PCIe table and split layout were recorded and replayed on that
GPU by its authors (cuBLASLt 12.8.3.14). The oracle is mmaemu's own
resolution (``mmaemu.platform.resolve_splitk``) and its own GEMM
(``mmaemu.scaled_mm`` / ``mmaemu.accumulate``); fpemu reads only the
exported decisions (``fpemu/data``), none of mmaemu's code."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

import fpemu
import fpemu.autograd as ft
from fpemu import accumulate, cublaslt
from fpemu.accumulate import SplitK
from fpemu.errors import FpemuTypeError, FpemuValueError

import torch  # installed by `make` (the dev extras), as mmaemu, the oracle
import mmaemu
from mmaemu.errors import SplitKUnknownError
from mmaemu.platform import resolve_splitk

TABLE = pathlib.Path(mmaemu.__file__).parent / "platform" / "data" / "heur_h100pcie_lt12.8.3.14.npz"
FMT = ("e4m3", "e5m2")
OUT = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
PROFILES = {1 << 20: "hopper", 32 << 20: "hopper-te", 0: "hopper-ws0"}


def _mmaemu_decision(M, N, K, fa, fb, out, fast, workspace):
    """(splits, scheme) from mmaemu, or None where it cannot tell."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # its notes on unverified combinations
        try:
            d = resolve_splitk(M, N, K, a_dtype=fa, b_dtype=fb, out_dtype=out, use_fast_accum=fast,
                               profile=PROFILES[workspace])
        except SplitKUnknownError:
            return None
    return d.S, d.scheme


def _fpemu_decision(M, N, K, fa, fb, out, fast, workspace):
    d = cublaslt.splitk_decision(M, N, K, fa, fb, out, fast=fast, workspace=workspace)
    return d


@pytest.fixture(scope="module")
def table():
    z = np.load(TABLE)
    return {k: z[k] for k in z.files}


@pytest.mark.parametrize("workspace", [1 << 20, 32 << 20])
def test_the_decisions_are_mmaemus_on_its_table(table, workspace):
    """Every split row of the workspace, 1,500 of its unsplit rows."""
    c = table
    ws = list(np.unique(c["ws"]))            # the table's codes: 0, 1 MiB, 4 MiB, 32 MiB
    code = {0: 0, 1 << 20: 1, 4 << 20: 2, 32 << 20: 3}[workspace]
    assert len(ws) == 4
    rows = c["ws"] == code
    split = np.flatnonzero(rows & (c["splitK"] > 1))
    unsplit = np.flatnonzero(rows & (c["splitK"] == 1))
    rng = np.random.default_rng(workspace % 1000)
    picked = np.concatenate([split, rng.choice(unsplit, 1500, replace=False)])
    assert len(split) > 8000
    seen = set()
    for i in picked:
        args = (int(c["M"][i]), int(c["N"][i]), int(c["K"][i]), FMT[c["fa"][i]], FMT[c["fb"][i]],
                OUT[c["out"][i]], bool(c["fast"][i]), workspace)
        ref = _mmaemu_decision(*args)
        ours = _fpemu_decision(*args)
        assert ref is not None and ref[1] in ("none", "contiguous")
        assert (ours.splits, ours.source) == (ref[0], "table"), args
        seen.add(ours.splits)
    assert seen == {1, 2, 3, 4, 5, 6}


def test_the_decisions_off_the_table():
    """Above the sweep's bound mmaemu infers S = 1, as fpemu; where mmaemu
    cannot tell, fpemu assumes 1 and says the shape is unrecorded; without a
    workspace nothing splits."""
    rng = np.random.default_rng(5)
    sources = {"envelope": 0, "unrecorded": 0}
    for _ in range(1500):
        M = int(rng.integers(1, 20000))
        N = int(rng.choice([16, 48, 80, 4000, 6016, 11000, 24576]))
        K = int(rng.choice([64, 1000, 3000, 4100, 7000, 9000, 30000, 100000]))
        fa, fb = [("e4m3", "e4m3"), ("e4m3", "e5m2"), ("e5m2", "e4m3")][rng.integers(3)]
        out = OUT[rng.integers(4)]
        fast = bool(rng.integers(2))
        for workspace in (1 << 20, 32 << 20):
            ref = _mmaemu_decision(M, N, K, fa, fb, out, fast, workspace)
            ours = _fpemu_decision(M, N, K, fa, fb, out, fast, workspace)
            if ref is None:
                assert (ours.splits, ours.source) == (1, "unrecorded"), (M, N, K)
                assert "may split" in ours.note
            else:
                assert ours.splits == ref[0], (M, N, K)
                assert ours.source in ("table", "envelope")
            sources[ours.source] = sources.get(ours.source, 0) + 1
        assert _mmaemu_decision(M, N, K, fa, fb, out, fast, 0) == (1, "none")
        assert cublaslt.splitk_decision(M, N, K, fa, fb, out, fast=fast, workspace=0).source \
            == "workspace0"
    assert sources["envelope"] > 200 and sources["unrecorded"] > 200


def test_the_decision_refuses_what_it_does_not_know():
    d = cublaslt.splitk_decision(64, 128, 8192, "e4m3fn", "e4m3fn", "float8_e5m2")
    assert (d.splits, d.source) == (1, "unrecorded") and "NOT_SUPPORTED" in d.note
    assert cublaslt.splitk_decision(0, 16, 8192).splits == 1
    assert cublaslt.splitk_decision(16, 64, 8192, torch.float8_e4m3fn, torch.float8_e4m3fn,
                                    torch.float32).splits == 3           # torch dtypes too
    for kwargs, msg in [
        (dict(workspace=4 << 20), r"workspace must be one of \(0, 1048576, 33554432\)"),
        (dict(a_dtype="bf16"), "a_dtype must be one of"),
        (dict(out_dtype="int8"), "out_dtype must be one of"),
    ]:
        with pytest.raises(FpemuValueError, match=msg):
            cublaslt.splitk_decision(16, 64, 8192, **kwargs)
    with pytest.raises(TypeError, match="K must be an int >= 0, got 8192.0"):
        cublaslt.splitk_decision(16, 64, 8192.0)
    # fast is use_fast_accum, a bool; a size is a tensor size (int64)
    for fast in ("yes", None, 1):
        with pytest.raises(FpemuTypeError, match=rf"fast must be a bool .*got .*{fast!r}"):
            cublaslt.splitk_decision(16, 64, 8192, fast=fast)
    with pytest.raises(FpemuValueError, match=r"M must be an int in \[0, 2\*\*63 - 1\]"):
        cublaslt.splitk_decision(2 ** 70, 64, 8192)


def test_auto_split_warns_where_the_table_lacks_the_shape():
    # K over one k-tile and no recorded decision: the GPU may split it (an H200
    # split 16x16x8192 three ways, tests/test_gpu_probes.py); fpemu runs one
    # chain and says so. A recorded shape, or K within one k-tile, is quiet.
    s = ft.tensor(1.0)
    for (M, K, N), loud in (((16, 8192, 16), True), ((16, 176, 32), True),
                            ((16, 8192, 64), False), ((16, 128, 32), False)):
        a = ft.ones(M, K).to(ft.float8_e4m3fn)
        b = ft.ones(N, K).to(ft.float8_e4m3fn).t()
        with ft.use_profile(ft.Profile("cuda", "2.13.0")), warnings.catch_warnings(
                record=True) as seen:
            warnings.simplefilter("always")
            ft._scaled_mm(a, b, s, s, out_dtype=ft.float32, use_fast_accum=True)
            ft._scaled_mm(a, b, s, s, out_dtype=ft.float32, use_fast_accum=True, splitk=1)
        kinds = [type(w.message) for w in seen]
        assert kinds == [cublaslt.UnrecordedSplitWarning] * loud, (M, K, N, seen)
        if loud:
            text = str(seen[0].message)
            assert f"{M}x{N}x{K}" in text and "ran as one chain" in text and "splitk=" in text


# -------------------------------------------------------------- the split GEMM
def _operands(rng, M, N, K, fa, fb):
    """fp8 codes over the whole range (normals, subnormals, signed zeros), as
    torch tensors (a (M, K), b (N, K)) and fpemu's float32 values."""
    out = []
    for shape, fmt in (((M, K), fa), ((N, K), fb)):
        x = rng.standard_normal(shape) * 2.0 ** rng.integers(-14, 6, shape)
        x[rng.random(shape) < 0.05] = 0.0
        x[rng.random(shape) < 0.03] = -0.0
        q = fpemu.quantize(x.astype(np.float32), fmt)
        out += [q, torch.tensor(q).to(TORCH_FP8[fmt])]
    return out


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
def test_explicit_splits_are_mmaemus(fast):
    """Ragged K (a last k-tile shorter than 128) and splits left empty
    included: the layout of mmaemu's Hopper preset."""
    rng = np.random.default_rng(11 + fast)
    cases = [(2, 256), (2, 1000), (3, 1000), (4, 256), (5, 1536), (6, 700), (3, 130), (2, 64)]
    for S, K in cases:
        qa, ta, qb, tb = _operands(rng, 8, 24, K, "e4m3fn", "e5m2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = mmaemu.accumulate(ta, tb, use_fast_accum=fast, splitk=(S, "contiguous"),
                                    profile="hopper").numpy()
        if fast:
            ours = accumulate.matmul(qa, qb.T, ("e4m3fn", "e5m2"), model="h100-fp8", splitk=S)
        else:
            ours = accumulate.matmul(qa, qb.T, ("e4m3fn", "e5m2"), model="blocked", block=128,
                                     inner="h100-fp8", splitk=(S, "contiguous"))
        np.testing.assert_array_equal(_bits(ours), _bits(ref), err_msg=f"S={S} K={K}")
        if S > 1 and K > 128:
            one = accumulate.matmul(qa, qb.T, ("e4m3fn", "e5m2"), model="h100-fp8")
            assert (_bits(one) != _bits(ours)).any(), "a split that changes nothing tests nothing"


# the table's shapes that split (64x128x8192 and 16x64x8192: S = 3 for every
# setting; 16x64x12288: S = 4; 16x64x16384: S = 6), and two that do not
SCALED = [(64, 128, 8192, "bfloat16", True), (16, 64, 8192, "float32", False),
          (16, 64, 12288, "float16", True), (16, 64, 16384, "float32", True),
          (16, 64, 16384, "float8_e4m3fn", False), (64, 256, 1024, "bfloat16", True)]


@pytest.mark.parametrize("M,N,K,out,fast", SCALED)
def test_scaled_mm_auto_is_mmaemus_auto(M, N, K, out, fast):
    rng = np.random.default_rng(M * N + K)
    fa, fb = ("e4m3fn", "e4m3fn") if out != "float32" else ("e5m2", "e4m3fn")
    qa, ta, qb, tb = _operands(rng, M, N, K, fa, fb)
    sa, sb = np.float32(0.75), np.float32(2.0**-3)
    kw = {}
    if out.startswith("float8"):
        # torch's CUDA _scaled_mm ignores scale_result (tests/test_gpu_probes.py);
        # mmaemu, a model of cuBLASLt, would apply it, so only fpemu gets it
        kw = {"scale_result": ft.tensor(np.float32(0.5))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = mmaemu.scaled_mm(ta, tb.t(), torch.tensor(sa), torch.tensor(sb),
                               out_dtype=getattr(torch, out), use_fast_accum=fast,
                               splitk="auto", profile="hopper")
    ours = ft._scaled_mm(ft.nn.from_torch(ta), ft.nn.from_torch(tb).t(), ft.tensor(sa),
                         ft.tensor(sb), out_dtype=getattr(ft, out), use_fast_accum=fast, **kw)
    np.testing.assert_array_equal(_bits(ours.float().numpy()), _bits(ref.float().numpy()))
    d = cublaslt.splitk_decision(M, N, K, fa, fb, out, fast=fast)
    unsplit = ft._scaled_mm(ft.nn.from_torch(ta), ft.nn.from_torch(tb).t(), ft.tensor(sa),
                            ft.tensor(sb), out_dtype=getattr(ft, out), use_fast_accum=fast,
                            splitk=1, **kw)
    differ = int((_bits(unsplit.float().numpy()) != _bits(ours.float().numpy())).sum())
    if d.splits > 1 and not out.startswith("float8"):    # fp8 outputs may hide the split
        assert differ > 0
    elif d.splits == 1:
        assert differ == 0


def test_split_sums_add_in_fp32_from_plus_zero():
    # each split's sum alone, then the parts added: 1 + 2**-24 + 2**-24 is 1
    # in one chain (each addition a tie to even) and 1 + 2**-23 split in two
    a = np.zeros((1, 256))
    a[0, 0], a[0, 128:130] = 1.0, 2.0**-24
    ones = np.ones((256, 1))
    for model in ("sequential", "exact", "pairwise"):
        assert accumulate.matmul(a, ones, "fp32", model=model, splitk=1).item() in (1.0, 1 + 2**-23)
        assert accumulate.matmul(a, ones, "fp32", model=model, splitk=2).item() == 1 + 2**-23
    # every part of negative zeros is +0 (each split starts from +0), an unsplit
    # sequential sum of -0 products keeps -0
    z = np.full((1, 256), -0.0)
    assert np.signbit(accumulate.matmul(z, ones, "fp32").item())
    assert not np.signbit(accumulate.matmul(z, ones, "fp32", splitk=2).item())
    # dot and sum take the split too
    assert accumulate.dot(a[0], ones[:, 0], "fp32", splitk=2).item() == 1 + 2**-23
    assert accumulate.sum(a[0], "fp32", splitk=2).item() == 1 + 2**-23
    # inf and NaN as IEEE: inf in one part, -inf in another give NaN
    b = np.zeros((1, 256))
    b[0, 0], b[0, 200] = np.inf, -np.inf
    assert np.isnan(accumulate.matmul(b, ones, "fp32", splitk=2).item())
    b[0, 200] = np.inf
    assert accumulate.matmul(b, ones, "fp32", splitk=2).item() == np.inf


def test_splitk_refuses_bad_input():
    a, b = np.ones((2, 256)), np.ones((256, 3))
    for bad in (0, -2, 2.0, True, "auto", (2, "serial")):
        with pytest.raises(FpemuValueError, match="splitk must be an int >= 1"):
            accumulate.matmul(a, b, "fp32", splitk=bad)
    with pytest.raises(FpemuValueError, match="adds its partial sums in fp32"):
        accumulate.matmul(a, b, "fp16", "fp16", splitk=2)
    with pytest.raises(FpemuValueError, match="stochastic rounding with a split K"):
        accumulate.matmul(a, b, "fp32", rounding="sr", seed=1, splitk=2)
    with pytest.raises(FpemuValueError, match="pass c=None and add c to the result"):
        accumulate.matmul(a, b, "fp32", c=1.0, splitk=2)
    with pytest.raises(FpemuValueError, match="tile must be an int >= 1"):
        SplitK(2, tile=0)
    # more splits than K has elements cannot be meant (10**8 on K = 300 grew
    # memory without bound: a list of 10**8 parts, a loop over them)
    for huge in (10 ** 8, 2 ** 70, 301):
        with pytest.raises(FpemuValueError, match=r"splitk=\d+ splits K = 300 into more parts "
                                                  r"than K has elements; the limit is max\(K, "
                                                  r"1\) = 300"):
            accumulate.matmul(np.ones((2, 300)), np.ones((300, 3)), "fp32", splitk=huge)
    assert accumulate.matmul(np.ones((2, 300)), np.ones((300, 3)), "fp32",
                             splitk=300)[0, 0] == 300.0
    for bad, err in ((-1, FpemuValueError), (1.5, FpemuTypeError), (True, FpemuTypeError)):
        with pytest.raises(err, match=r"SplitK.parts\(\): K must be an int >= 0"):
            SplitK(3).parts(bad)
    assert SplitK.of((3, "contiguous")) == SplitK(3) == SplitK.of(np.int64(3))
    assert accumulate.matmul(a, b, "fp32", c=1.0, splitk=1)[0, 0] == 257.0
    qa = ft.ones(16, 32).to(ft.float8_e4m3fn)
    s = ft.tensor(1.0)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        with pytest.raises(ValueError, match="torch's CPU kernel does not split K"):
            ft._scaled_mm(qa, qa.t(), s, s, splitk=2)
        assert ft._scaled_mm(qa, qa.t(), s, s, out_dtype=ft.float32, splitk=1)[0, 0].item() == 32
