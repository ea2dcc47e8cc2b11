"""``make gpu-check``'s script (bench/gpu_check.py) runs before a GPU minute
is spent: its dry run on the CPU (CPU torch standing in, small sizes), its
resumption, its budget, and the fitting of fpemu's GEMM models to recorded
output bits, on bits whose model is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "gpu_check.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402

import torch  # noqa: E402  (installed by `make`, the dev extras)


def _run(out, *extra, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, "--host", "--small", "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    p = _run(out, "--steps", "env,traces,gemm,attention,sgemm,gemm16,reductions,e2e_ops,libm,"
             "triton,cuda_checks,torch_checks")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, p


def test_the_dry_run_runs_every_step_and_writes_the_summary(dry_run):
    out, p = dry_run
    state = json.loads((out / "state.json").read_text())
    steps = ["env", "traces", "gemm", "attention", "sgemm", "gemm16", "reductions", "e2e_ops",
             "libm", "triton", "cuda_checks", "torch_checks"]
    assert {k: v["status"] for k, v in state.items()} == {s: "done" for s in steps}
    summary = (out / "summary.md").read_text()
    for s in steps:
        assert f"## {s}: done" in summary
    assert "## casts: not run" in summary
    assert "host dry run" in summary
    env = json.loads((out / "env.json").read_text())
    assert env["torch"] == torch.__version__ and env["host"] is True
    # traces: the CPU folder's casts scenarios replayed, none failed
    assert state["traces"]["failed"] == [] and state["traces"]["counts"]["bit-exact"] > 0


def test_the_op_streams_are_packed_and_replayed(dry_run):
    """e2e_ops packs the trace folder's op streams for the way back and, on
    the host, names the first op that differs (the CPU's: MKL's addmm)."""
    out, p = dry_run
    state = json.loads((out / "state.json").read_text())
    lines = state["e2e_ops"]["lines"]
    assert any("packed as e2e_ops.tar.gz" in line for line in lines)
    assert any(line.startswith("e2e-mlp-fp32: first difference #0") and "aten.addmm" in line
               for line in lines), lines
    import tarfile
    with tarfile.open(out / "e2e_ops.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("ops/e2e-mlp-fp32.npz") for n in names)


def test_the_gemm_probes_are_recorded_and_fitted(dry_run):
    out, _ = dry_run
    meta = json.loads((out / "gemm.json").read_text())
    bits = np.load(out / "gemm.npz")
    cases = gpu_check.gemm_cases(small=True, device="cpu")
    assert {c["id"] for c in cases} == set(meta["cases"]) == set(bits.files)
    kinds = {(c["kind"], c["dtype"]) for c in cases}
    assert kinds == {("matmul", "bfloat16"), ("matmul", "float16"), ("matmul", "tf32"),
                     ("scaled_mm", "float8_e4m3fn")}
    for c in cases:
        m = meta["cases"][c["id"]]
        assert "error" not in m, m
        assert bits[c["id"]].size == c["M"] * c["N"]
        fit = meta["fits"][c["id"]]
        assert "error" not in fit and fit["closest"] is not None, fit   # inputs regenerated
    # the output dtype torch wrote is recorded: float32 for TF32, and for 16-bit
    # inputs float32 where mm's out_dtype runs (CUDA), else the input dtype
    for c in cases:
        want = {"tf32": {"float32"}, "bfloat16": {"float32", "bfloat16"},
                "float16": {"float32", "float16"}}.get(c["dtype"], {c.get("out")})
        assert meta["cases"][c["id"]]["out"] in want


NEW_STEPS = {"sgemm": gpu_check.sgemm_cases, "gemm16": gpu_check.gemm16_cases,
             "reductions": gpu_check.reductions_cases, "libm": gpu_check.libm_cases}


@pytest.mark.parametrize("step", sorted(NEW_STEPS))
def test_the_new_probe_steps_are_recorded_and_fitted(dry_run, step):
    """Every probe of sgemm, gemm16, reductions and libm ran on CPU torch, its
    arrays are in <step>.npz, and its fit compared fpemu with them."""
    out, _ = dry_run
    meta = json.loads((out / f"{step}.json").read_text())
    arrays = np.load(out / f"{step}.npz")
    cases = NEW_STEPS[step](small=True)
    assert {c["id"] for c in cases} == set(meta["cases"]) == set(meta["fits"])
    for c in cases:
        m, fit = meta["cases"][c["id"]], meta["fits"][c["id"]]
        assert "error" not in m and "error" not in fit, (m, fit)
        assert m["recorded"] and all(f"{c['id']}.{k}" in arrays.files for k in m["recorded"])
        if "fpemu" in fit:
            for k, v in fit["fpemu"].items():
                assert v["n"] == arrays[f"{c['id']}.{k}"].size and 0 <= v["equal"] <= v["n"]
    summary = (out / "summary.md").read_text()
    assert f"## {step}: done" in summary


def test_the_reduction_trees_are_rebuilt_on_the_host_as_on_the_device(dry_run):
    """Every FPRev probe's raw outputs decode to subtree sizes that make one
    tree (a wrong decoding of a sum, a mean, a softmax or log_softmax backward
    or nll_loss makes sizes that fit none), the same tree the recording
    rebuilt as it went, and fpemu was run on the recorded probes."""
    out, _ = dry_run
    meta = json.loads((out / "reductions.json").read_text())
    fprev_cases = [v for v in meta["cases"].values() if v["kind"] == "fprev"]
    assert {v["op"] for v in fprev_cases} == {"sum", "mean", "sum_f32", "softmax_bwd",
                                              "log_softmax_bwd", "nll_loss"}
    for v in fprev_cases:
        fit = meta["fits"][v["id"]]
        assert "tree_error" not in v and "tree_error" not in fit, (v, fit)
        assert fit["tree"] == v["tree_lines"]
        assert fit["tree"][0].startswith(f"{v['leaf_count']} leaves")
        assert fit["probes"] == v["probes"] >= v["leaf_count"] - 1
        assert 0 <= fit.get("fpemu_same_size", 0) <= fit["probes"]
    assert any("fpemu_same_size" in meta["fits"][v["id"]] for v in fprev_cases)


def test_the_fprev_layout_puts_each_probe_in_its_fiber():
    """A probe's +M and -M land at leaves i and j of its own output's fiber
    (the reduced dimension of that output; transposed storage included), the
    units at every fiber's probed leaves, zeros elsewhere."""
    case = dict(kind="fprev", op="sum", dtype="float32", shape=[6, 5], dim=0,
                layout="transposed", leaves=[0, 2, 0], id="t")
    lay = gpu_check.FPRevLayout(case)
    assert (lay.R, lay.n, lay.leaves) == (5, 6, [0, 2, 4])
    X = lay.storage([(3, 0, 4)]).reshape(5, 6).T          # logical (6, 5), stored transposed
    want = np.zeros((6, 5), np.float32)
    want[[0, 2, 4], :] = 1.0
    want[0, 3], want[4, 3] = lay.M, -lay.M
    assert np.array_equal(X, want)
    assert lay.M == 2.0 ** 27 and lay.u == 1.0                 # 3 leaves: M = 2^(25 + 2)
    with pytest.raises(Exception, match="not a whole number"):
        lay.size_of(np.array([1.5, 0.0]), 0, 2)


def test_the_libm_probes_cover_every_16_bit_input():
    case = dict(fn="exp", dtype="bfloat16", id="exp-bfloat16", seed=11000)
    x = gpu_check.libm_inputs(torch, case)
    codes = x.view(torch.int16).numpy().view(np.uint16)
    assert x.dtype == torch.bfloat16 and np.array_equal(np.sort(codes), np.arange(1 << 16))
    x = gpu_check.libm_inputs(torch, dict(case, dtype="float32", id="exp-float32"))
    bits = x.numpy().view(np.uint32)
    assert x.numel() == 2 * (1 << 16) + 2 * (1 << 15) + 2 * 256 * 6
    for e in (0, 1, 127, 254, 255):                     # each binade's first and last codes
        assert {e << 23, (e << 23) | 0x7FFFFF, (1 << 31) | (e << 23)} <= set(bits.tolist())


def test_the_sgemm_and_gemm16_fits_name_the_planted_model():
    """Bits planted from one accumulation model are attributed to it: an FMA
    chain with K split two ways (float32), and the tensor core with the bias
    added after the rounding to bf16."""
    from fpemu import accumulate, quantize
    ctx = {"cpu": False, "release": "2.11.0", "gpu": "h200", "small": False}
    case = dict(op="mm", dtype="float32", M=8, K=512, N=8, seed=5, id="planted")
    ins = gpu_check._gemm_operands(torch, case)
    entry = dict(case, sha256=gpu_check._digest(ins))
    prods = {p: (A, B) for p, A, B, _ in gpu_check._products(case, ins)}
    arrays = {p: accumulate.matmul(A, B, "fp32", model="sequential").view(np.uint32)
              for p, (A, B) in prods.items()}
    A, B = prods["out"]
    arrays["out"] = accumulate.matmul(A, B, "fp32", model="fma", splitk=2).view(np.uint32)
    fit = gpu_check.fit_sgemm(torch, entry, arrays, ctx)
    assert "fma splitk=2" in fit["models"]["out"]["exact"]
    assert "fma" not in fit["models"]["out"]["exact"]
    assert "sequential" in fit["models"]["da"]["exact"]

    case = dict(op="linear", dtype="bfloat16", M=8, K=64, N=8, seed=6, id="planted16")
    ins = gpu_check._gemm_operands(torch, case)
    entry = dict(case, sha256=gpu_check._digest(ins))
    arrays = {}
    for p, A, B, bias in gpu_check._products(case, ins):
        y = accumulate.matmul(A, B, "bf16", "fp32", "bf16", model="h100")
        if bias is not None:
            acc = accumulate.matmul(A, B, "bf16", "fp32", "fp32", model="h100")
            y = quantize((quantize(acc, "bf16") + bias.astype(np.float32)).astype(np.float32),
                         "bf16")
        arrays[p] = np.asarray(y, np.float32).view(np.uint32)
    fit = gpu_check.fit_gemm16(torch, entry, arrays, ctx)
    assert "h100, bias after the rounding" in fit["models"]["out"]["exact"]
    assert "h100, bias before the rounding" not in fit["models"]["out"]["exact"]
    assert "h100" in fit["models"]["dx"]["exact"]
    entry["sha256"] = "0" * 64                           # inputs that changed are refused
    with pytest.raises(gpu_check.BadFile, match="differ from the recorded"):
        gpu_check.fit_gemm16(torch, entry, arrays, ctx)


def test_the_fit_names_the_model_that_made_the_bits():
    """Bits planted from a known model (the H100 tensor core, K split in two;
    TF32 read by truncation) are attributed to that model and not to others."""
    from fpemu import accumulate, quantize
    case = dict(kind="matmul", dtype="bfloat16", M=16, K=1024, N=16, seed=7, id="planted")
    ins = gpu_check.gemm_inputs(torch, case)
    A = ins["a"].float().numpy().astype(np.float64)
    B = ins["b"].float().numpy().astype(np.float64)
    tc = accumulate.TensorCore("h100-like", 16, 25)
    y = accumulate.matmul(A, B, "bf16", "fp32", model=tc, splitk=2)
    meta = {"cases": {"planted": dict(case, sha256=gpu_check._digest(ins), out="float32")}}
    fits = gpu_check.fit_gemm(torch, [case], {"planted": y.view(np.uint32)}, meta, cpu=False)
    assert "tc16f25 splitk=2" in fits["planted"]["exact"]
    assert "tc16f25" not in fits["planted"]["exact"]          # the unsplit chain differs
    assert "sequential" not in fits["planted"]["exact"]

    case = dict(kind="matmul", dtype="tf32", M=16, K=512, N=16, seed=8, id="tf32")
    ins = gpu_check.gemm_inputs(torch, case)
    A = quantize(ins["a"].numpy(), "tf32", rounding="rtz").astype(np.float64)
    B = quantize(ins["b"].numpy(), "tf32", rounding="rtz").astype(np.float64)
    y = accumulate.matmul(A, B, "tf32", "fp32", model=accumulate.TensorCore("x", 8, 24))
    meta = {"cases": {"tf32": dict(case, sha256=gpu_check._digest(ins), out="float32")}}
    fits = gpu_check.fit_gemm(torch, [case], {"tf32": y.view(np.uint32)}, meta, cpu=False)
    assert "tc8f24 tf32-rtz" in fits["tf32"]["exact"]
    assert not [m for m in fits["tf32"]["exact"] if m.endswith("tf32-rne")]
    # regenerated inputs that differ from the recorded digest are refused
    meta["cases"]["tf32"]["sha256"] = "0" * 64
    fits = gpu_check.fit_gemm(torch, [case], {"tf32": y.view(np.uint32)}, meta, cpu=False)
    assert "differ from the recorded" in fits["tf32"]["error"]


def test_a_rerun_resumes_and_the_budget_is_kept(dry_run, tmp_path):
    out, _ = dry_run
    p = _run(out, "--steps", "env,gemm")
    assert p.returncode == 0
    assert "env: done in an earlier run" in p.stdout and "gemm: done in an earlier run" in p.stdout
    p = _run(out, "--steps", "env", "--redo", "env")
    assert "env: done in" in p.stdout and "earlier run" not in p.stdout
    # no budget: every step is skipped and says why
    p = _run(tmp_path, "--budget-seconds", "0", "--steps", "traces,gemm")
    assert p.returncode == 0, p.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    assert {v["status"] for v in state.values()} == {"skipped"}
    assert "of the budget left" in (tmp_path / "summary.md").read_text()
    p = _run(tmp_path, "--steps", "gemm,warp")
    assert p.returncode == 2 and "unknown step(s) warp" in p.stderr


def test_the_attention_probes_compare_with_fpemu(dry_run):
    out, _ = dry_run
    meta = json.loads((out / "attention.json").read_text())
    cases = meta["cases"]
    assert set(cases) == {c["id"] for c in gpu_check.attention_cases(small=True)}
    assert any(v.get("v_identity") for v in cases.values())
    # CPU torch has a flash kernel; without AVX-512 it refuses bf16 blocks of 64 keys and
    # more ("pack_vnni2 is only supported when avx512 is supported"): those are recorded
    # as not run, with torch's reason, and the rest compared
    flash = [v for v in cases.values() if v["backend"] == "flash"]
    ran = [v for v in flash if "error" not in v]
    assert all("avx512" in v["error"] for v in flash if "error" in v)
    assert len(ran) >= 4 and all("fpemu" in v for v in ran)
    for v in ran:
        for k in ("out", "dq", "dk", "dv"):
            r = v["fpemu"][k]
            assert r["n"] == v["B"] * v["H"] * v["L"] * v["E"] and 0 <= r["equal"] <= r["n"]
    assert all(v["forward_models"] for v in ran)
    # CPU torch has no memory-efficient kernel: recorded as not run, with the reason
    eff = [v for v in cases.values() if v["backend"] == "efficient"]
    assert eff and all("No viable backend" in v["error"] for v in eff)


def test_fit_refits_a_recorded_folder_without_recording(dry_run, tmp_path):
    import shutil
    out, _ = dry_run
    folder = tmp_path / "recorded"
    shutil.copytree(out, folder)
    for step in ("gemm", "reductions"):
        meta = json.loads((folder / f"{step}.json").read_text())
        meta.pop("fits")
        (folder / f"{step}.json").write_text(json.dumps(meta))
    before = dict(np.load(folder / "gemm.npz"))
    p = subprocess.run([sys.executable, SCRIPT, "--fit", str(folder)], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for step in ("gemm", "reductions"):
        meta = json.loads((folder / f"{step}.json").read_text())
        assert set(meta["fits"]) == set(meta["cases"])
    after = dict(np.load(folder / "gemm.npz"))          # nothing recorded again
    assert after.keys() == before.keys()
    assert all(np.array_equal(after[k], before[k]) for k in before)
    summary = (folder / "summary.md").read_text()
    assert "## gemm: done" in summary and "host dry run" in summary.splitlines()[2]
    assert "## reductions: done" in summary and "summation trees rebuilt" in summary


def test_the_attention_fit_names_the_block_and_the_rounding_of_p():
    """Outputs planted from one online-softmax model (key blocks of 32, each
    block's P rounded with the running maximum) are reproduced by that
    candidate alone."""
    case = dict(dtype="bfloat16", backend="flash", B=1, H=2, L=96, E=64, causal=False,
                seed=3, id="planted")
    cands = gpu_check.attention_candidates(torch, case)
    planted = cands["online block=32 P rounded"]
    equal = {k: int((np.asarray(v, np.float32) == planted).sum()) for k, v in cands.items()}
    assert equal["online block=32 P rounded"] == planted.size
    assert all(n < planted.size for k, n in equal.items() if k != "online block=32 P rounded")
    # with V the identity the output is P / l: rounding P first is visible
    case = dict(case, L=64, v_identity=True, id="identity")
    cands = gpu_check.attention_candidates(torch, case)
    a, b = cands["online block=all P rounded"], cands["P in fp32"]
    assert (a != b).sum() > 100


# ------------------------------------------------------------ bad inputs
# Each is refused in the argument checking, before torch is imported or any
# step runs: a non-zero exit, the argument and the value given named, no
# Python traceback, and within a few seconds.
def _refused(*args, status=2):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    seconds = time.monotonic() - t0
    assert p.returncode == status, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    assert p.stdout == "", p.stdout[-2000:]                  # no step started
    assert seconds < 5, f"refused after {seconds:.1f} s: after the heavy imports?"
    return p.stderr


@pytest.mark.parametrize("value", ["-5", "nan", "inf", "-inf", "1e999", "soon", ""])
def test_a_bad_budget_is_refused(tmp_path, value):
    err = _refused("--host", "--small", "--out", str(tmp_path), "--steps", "env",
                   f"--budget-seconds={value}")
    assert "argument --budget-seconds" in err and repr(value) in err
    assert "finite number of seconds, 0 or more" in err
    assert not os.path.exists(tmp_path / "summary.md")


@pytest.mark.parametrize("option, value", [("--steps", ""), ("--steps", ","),
                                           ("--steps", "env,warp"), ("--redo", "warp")])
def test_an_empty_or_unknown_step_list_is_refused(tmp_path, option, value):
    err = _refused("--host", "--small", "--out", str(tmp_path), option, value)
    assert f"argument {option}" in err and repr(value) in err
    assert "the steps are env, traces, gemm" in err
    assert not os.path.exists(tmp_path / "summary.md")


def test_a_step_to_redo_that_is_not_run_is_refused(tmp_path):
    err = _refused("--host", "--small", "--out", str(tmp_path), "--steps", "env",
                   "--redo", "gemm")
    assert "argument --redo" in err and "'gemm'" in err and "--steps" in err
    assert not os.path.exists(tmp_path / "summary.md")


def test_an_out_that_names_a_file_is_refused(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("not a folder")
    err = _refused("--host", "--small", "--out", str(path), "--steps", "env")
    assert "argument --out" in err and repr(str(path)) in err and "is a file" in err
    err = _refused("--host", "--small", "--out", str(path / "sub"), "--steps", "env")
    assert "argument --out" in err and repr(str(path / "sub")) in err
    assert path.read_text() == "not a folder"


# Folders the kernel refuses to anyone, root included (make test runs as root
# in CI, where a chmod'd folder would not refuse anything); fpemu targets Linux.
UNWRITABLE = {"procfs": "/proc/fpemu-gpu-check", "sysfs": "/sys/kernel/fpemu-gpu-check"}


@pytest.mark.parametrize("kind", sorted(UNWRITABLE))
def test_an_out_that_cannot_be_written_is_refused(kind):
    path = UNWRITABLE[kind]
    assert os.path.isdir(os.path.dirname(path)), f"no {kind} at {os.path.dirname(path)}"
    err = _refused("--host", "--small", "--out", path, "--steps", "env")
    assert "argument --out" in err and repr(path) in err and "writ" in err
    assert not os.path.exists(path)


def test_an_empty_out_or_fit_is_refused(tmp_path):
    err = _refused("--host", "--small", "--out", "", "--steps", "env")
    assert "argument --out" in err and "''" in err
    err = _refused("--fit", "")
    assert "argument --fit" in err and "''" in err


def test_a_traces_root_that_names_a_file_is_refused(tmp_path):
    path = tmp_path / "reference"
    path.write_text("not a folder")
    err = _refused("--host", "--small", "--out", str(tmp_path / "out"), "--steps", "traces",
                   "--traces-root", str(path))
    assert "argument --traces-root" in err and repr(str(path)) in err


@pytest.mark.parametrize("content, problem", [
    ('{"env": {"status": "done"', "is not JSON"),
    ("[]", "found a JSON list"),
    ('{"env": 3}', "'env'"),
    ('{"env": {"lines": []}}', "'env'"),
    ('{"env": {"status": "finished"}}', "'finished'"),
    ('{"warp": {"status": "done"}}', "'warp'"),
    ('{"env": {"status": "done", "lines": "x"}}', "'env'"),
])
def test_a_damaged_state_is_refused_and_left_as_it_is(tmp_path, content, problem):
    state = tmp_path / "state.json"
    state.write_text(content)
    err = _refused("--host", "--small", "--out", str(tmp_path), "--steps", "env", status=1)
    assert str(state) in err and problem in err
    assert "delete it" in err and "fresh --out" in err
    assert state.read_text() == content
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_a_state_that_cannot_be_read_is_refused(tmp_path):
    (tmp_path / "state.json").mkdir()
    err = _refused("--host", "--small", "--out", str(tmp_path), "--steps", "env", status=1)
    assert str(tmp_path / "state.json") in err and "cannot be read" in err and "delete it" in err
    assert sorted(os.listdir(tmp_path)) == ["state.json"]


def test_a_damaged_probe_record_fails_its_step_with_the_file_named(tmp_path):
    """Found in the step (torch imported by then): the step fails with the
    file, what is wrong and the fix, and no traceback; the file is kept."""
    (tmp_path / "gemm.json").write_text('{"cases": ')
    p = subprocess.run([sys.executable, SCRIPT, "--host", "--small", "--out", str(tmp_path),
                        "--steps", "gemm"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stdout + p.stderr and 'File "' not in p.stdout + p.stderr
    assert f"{tmp_path / 'gemm.json'}: the gemm probes' record is not JSON" in p.stdout
    assert "delete gemm.npz and gemm.json" in p.stdout
    assert "## gemm: failed" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "gemm.json").read_text() == '{"cases": '


@pytest.mark.parametrize("kind", ["missing", "empty", "a file", "no probes"])
def test_fit_on_a_folder_without_probes_is_refused_and_writes_nothing(tmp_path, kind):
    folder = tmp_path / "nvidia-x-torch2.0"
    if kind == "a file":
        folder.write_text("not a folder")
    elif kind != "missing":
        folder.mkdir()
        if kind == "no probes":
            (folder / "env.json").write_text("{}")
    before = sorted(os.listdir(folder)) if folder.is_dir() else None
    err = _refused("--fit", str(folder))
    assert "argument --fit" in err and repr(str(folder)) in err
    assert "gemm.json" in err or kind in ("missing", "a file")
    assert (sorted(os.listdir(folder)) if folder.is_dir() else None) == before
    assert not os.path.exists(folder / "summary.md")
    assert kind != "missing" or not os.path.exists(folder)


@pytest.mark.parametrize("extra", [("--out", "elsewhere"), ("--steps", "gemm"),
                                   ("--redo", "gemm")])
def test_fit_with_an_option_it_would_ignore_is_refused(tmp_path, extra):
    err = _refused("--fit", str(tmp_path), *extra)
    assert "argument --fit" in err and extra[0] in err and repr(extra[1]) in err
    assert os.listdir(tmp_path) == []
