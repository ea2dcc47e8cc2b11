"""Everything fpemu wants from a GPU, in one prepared run: ``make gpu-check``.

A GPU is lent now and then, for minutes. This script spends them in
priority order, inside a time budget, and writes one results folder with a
markdown summary to commit::

    python bench/gpu_check.py [--out DIR] [--budget-seconds 480]
    python bench/gpu_check.py --host --small     # the dry run `make test` runs

Steps, in order (``--steps`` picks some):

1. ``env``: torch, CUDA, driver, GPU, SM count, numpy and fpemu versions;
2. ``traces``: the fidelity trace folder for this device and torch version
   (``fpemu record --device cuda`` into ``tests/reference``) when it is
   missing or lacks scenarios, packed as ``traces.tar.gz``; its replay
   (``fpemu parity``) is host work, counted only in the dry run;
3. ``gemm``: GEMM probes. bf16 and fp16 ``torch.matmul``, float32 with TF32,
   ``torch._scaled_mm`` (fast and slow accumulation, tensor-wise and row-wise
   scales, a bias, every output dtype), K from 16 to 8192 and the GEMM
   shapes of the end-to-end scenarios and of mmaemu's split-K table. The
   inputs come from a seed (numpy's generator, the cast done by torch on the
   CPU), so only their sha256 and the output bits are stored; then fpemu's
   candidate models are fitted to them (``fit_gemm``: tensor-core block
   width and alignment bits, split-K count, for TF32 the input rounding) and
   each case says which reproduce it bit for bit;
4. ``attention``: ``scaled_dot_product_attention`` with the flash and
   memory-efficient backends, bf16 and fp16, causal or not, forward and
   backward, small shapes (one with V the identity, whose output is P);
   output and gradient bits, compared with fpemu's model
   (``docs/pytorch-numerics.md`` §11): how many equal, the largest distance;
   the forward also against candidate online-softmax models (key-block size,
   P rounded or not: ``online_attention``);
5. ``sgemm``: float32 GEMMs with TF32 off (cuBLAS SGEMM): the end-to-end
   shapes as ``torch.mm`` and as ``F.linear`` with a bias (addmm), forward
   and backward as autograd issues them (transposed operands), and K from
   16 to 4096; fitted against fpemu.autograd under the CUDA profile of the
   recording's GPU and against fpemu.accumulate's float32 models
   (sequential, pairwise, fma, blocked, split-K; the bias added after the
   product or as the accumulator's start);
6. ``gemm16``: bf16 / fp16 GEMMs with 16-bit outputs: ``torch.mm``,
   ``F.linear`` with a bias (cuBLASLt's bias epilogue) and ``torch.bmm`` at
   the transformer's attention shapes, forward and backward; fitted against
   fpemu.autograd and against the GPU's tensor-core model, K split 1-8
   ways (the parts rounded to the dtype or not), one rounding to the dtype,
   the bias added before or after that rounding or as the accumulator's
   start;
7. ``reductions``: the summation trees of torch.sum / mean (over all
   elements, the last, first and a middle dimension; contiguous and
   transposed), the softmax and log_softmax backward and nll_loss, in
   float32, bf16 and fp16, at sizes that take each launch of ATen's
   Reduce.cuh and of the softmax kernels, revealed by FPRev
   (``bench/fprev.py``: units with +M at leaf i and -M at leaf j; one pair
   per output in the same launch), and random-input forward and backward
   of sum, mean, vector_norm, softmax, log_softmax, layer_norm, nll_loss and
   cross_entropy compared with fpemu.autograd;
8. ``e2e_ops``: the end-to-end scenarios' op streams (``fpemu record
   --ops``: every ATen op of steps 0 and 10 with its inputs and outputs),
   packed as ``e2e_ops.tar.gz``; at home, ``fpemu parity --first-difference
   SCENARIO`` names the first op fpemu does not reproduce (the dry run
   replays its one stream);
9. ``libm``: exp, log, tanh, erf, sigmoid, gelu and rsqrt on every bf16 and
   fp16 input and on about 200,000 float32 inputs (the 16-bit values, random
   ones, each binade's edges), compared with fpemu.autograd (and with the
   float64 value rounded once, for scale);
10. ``triton``: fpemu's Triton kernels' bit-exactness and speed, when
   fpemu has them;
11. ``casts``, ``cuda_checks``, ``torch_checks``: ``bench/cuda_casts.py``,
   ``bench/cuda_checks.py`` and ``bench/torch_cuda_checks.py`` when their
   committed data do not cover this GPU and torch version.

Resumable: ``state.json`` in the results folder records each step done;
a rerun skips them (``--redo STEP`` runs one again). A ``state.json`` this
script cannot read is refused, not overwritten: delete it or pass a fresh
``--out``. A step that does not fit in what is left of the budget is skipped
and said so; the GEMM probes stop case by case at the deadline and go on from
there next time. Every argument is checked before torch is imported or a
step runs, and a bad one is refused (exit 2).

The fit needs no GPU (and fpemu's Numba kernels compile from cold on a
fresh machine), so on a GPU the probes are only recorded (the reductions'
FPRev probes rebuild their trees as they go: which pairs a round probes
depends on the last round's outputs); ``--fit DIR`` then fits every probe
step the folder holds on the host and completes the summary
(``--fit-on-device`` fits there too).

``--host`` runs everything on the CPU with CPU torch standing in (no GPU
minute spent on a script that breaks); ``--small`` uses small sizes. On the
device machine (whose python3 has torch, numpy and numba), pack the folder
for the way back::

    PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out R; tar czf $OUT/gpu_check.tgz R

then, here: ``tar xzf gpu_check.tgz`` into ``bench/gpu_check/``, unpack
``traces.tar.gz`` and ``e2e_ops.tar.gz`` into ``tests/reference`` if they came, and
``python bench/gpu_check.py --fit bench/gpu_check/<gpu>-torch<version>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS = ("env", "traces", "gemm", "attention", "sgemm", "gemm16", "reductions", "e2e_ops",
         "libm", "triton", "casts", "cuda_checks", "torch_checks")
# rough cost of each step on an H100 (seconds): a step starts only if it fits
COST = {"env": 1, "traces": 150, "gemm": 60, "attention": 20, "sgemm": 10, "gemm16": 10,
        "reductions": 40, "e2e_ops": 30, "libm": 10, "triton": 120, "casts": 120, "cuda_checks": 30,
        "torch_checks": 120}
HOST_COST = {"env": 1, "traces": 20, "gemm": 20, "attention": 10, "sgemm": 10, "gemm16": 10,
             "reductions": 20, "e2e_ops": 10, "libm": 10, "triton": 60, "casts": 30,
             "cuda_checks": 60, "torch_checks": 1}
KS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
KS_SMALL = (16, 128, 1024)
# (M, K, N) of the end-to-end scenarios' GEMMs: the MLP's forward / dgrad /
# wgrad (batch 64, 32 -> 64 -> 10) and the transformer's (16 x 8 tokens, d 32)
E2E_SHAPES = ((64, 32, 64), (64, 64, 10), (64, 64, 32), (10, 64, 64), (128, 32, 32),
              (128, 32, 64), (128, 64, 32), (32, 128, 32), (64, 128, 32), (8, 32, 8))
# (M, N, K) that cuBLASLt splits on an H100 PCIe (mmaemu's table): 3, 3, 4 ways
SPLIT_SHAPES = ((16, 64, 8192), (64, 128, 8192), (16, 64, 12288))
# scenario groups that run on the CPU (gloo processes) on any machine
HOST_GROUPS = ("collectives", "ddp", "fsdp", "zero")
# what state.json records of a step
STATUSES = ("done", "partial", "failed", "skipped")
# the probe steps --fit fits, each recorded as <step>.json and <step>.npz
PROBE_STEPS = ("gemm", "attention", "sgemm", "gemm16", "reductions", "libm")


class BadFile(Exception):
    """A file of the results folder this script cannot use; the message says
    which, what is wrong with it and what to do."""


def _read_json(path, what, fix):
    try:
        with open(path) as fh:
            return json.load(fh)
    except OSError as err:
        raise BadFile(f"{path}: {what} cannot be read ({err.strerror or err}); {fix}") from None
    except ValueError as err:                   # JSONDecodeError, UnicodeDecodeError
        raise BadFile(f"{path}: {what} is not JSON ({err}); {fix}") from None


def load_state(path, fitting=False):
    """A results folder's state.json ({} when there is none): {step: {status,
    seconds, lines, ...}}, or BadFile saying what is wrong with it. A damaged
    state is refused rather than written over with a fresh one: a results
    folder is measurements, and whether a file this script did not write is
    to be thrown away is for whoever runs it to say."""
    fix = ("delete it (the fit does not need it)" if fitting else
           "delete it to start afresh (every step runs again), or pass a fresh --out")
    if not os.path.exists(path):
        return {}
    state = _read_json(path, "the resume state", fix)
    expected = ("expected the JSON object this script writes, {step: {\"status\": one of "
                f"{', '.join(STATUSES)}, \"seconds\": a number, \"lines\": a list}}}}")
    if not isinstance(state, dict):
        raise BadFile(f"{path}: {expected}, found a JSON {type(state).__name__}; {fix}")
    for name, st in state.items():
        if name not in STEPS:
            found = f"a step {name!r} (the steps are {', '.join(STEPS)})"
        elif not isinstance(st, dict):
            found = f"step {name!r}: {json.dumps(st)[:80]}"
        elif st.get("status") not in STATUSES:
            found = f"step {name!r} with the status {st.get('status')!r}"
        elif not isinstance(st.get("seconds", 0), (int, float)):
            found = f"step {name!r} with the seconds {st['seconds']!r}"
        elif not (isinstance(st.get("lines", []), list)
                  and all(isinstance(t, str) for t in st.get("lines", []))):
            found = f"step {name!r} with the lines {json.dumps(st['lines'])[:80]}"
        else:
            continue
        raise BadFile(f"{path}: {expected}, found {found}; {fix}")
    return state


def slug(text):
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


class Run:
    """The results folder, its state and the budget."""

    def __init__(self, args, torch):
        self.args, self.torch = args, torch
        self.device = "cpu" if args.host else "cuda"
        name = (torch.cuda.get_device_name(0) if self.device == "cuda"
                else f"cpu {platform.machine()}")
        self.tag = f"{slug(name)}-torch{torch.__version__.split('+')[0]}"
        if args.fit:                        # a recorded folder, fitted here
            self.tag = os.path.basename(os.path.normpath(args.fit))
        # a GPU's results are committed; a host dry run's are not (out/ is ignored)
        self.out = args.fit or args.out or os.path.join(
            ROOT, "out" if args.host else "bench", "gpu_check", self.tag)
        try:
            os.makedirs(self.out, exist_ok=True)
        except OSError as err:
            raise BadFile(f"{self.out}: the results folder cannot be made ({err}); pass --out "
                          "a folder this script can write in") from None
        self.state_path = os.path.join(self.out, "state.json")
        self.state = load_state(self.state_path, fitting=bool(args.fit))
        self.deadline = time.monotonic() + args.budget_seconds

    def release(self):
        """The torch version of the recording (env.json), for fpemu's profile."""
        version = self.env().get("torch") or self.torch.__version__
        return str(version).split("+")[0]

    def env(self):
        """env.json ({} when there is none)."""
        path = self.path("env.json")
        if not os.path.exists(path):
            return {}
        env = _read_json(path, "the recorded environment",
                         "delete it (the env step writes it again)")
        if not isinstance(env, dict):
            raise BadFile(f"{path}: expected a JSON object, found a JSON {type(env).__name__}; "
                          "delete it (the env step writes it again)")
        return env

    def left(self):
        return self.deadline - time.monotonic()

    def log(self, text):
        print(text, flush=True)

    def save(self):
        with open(self.state_path, "w") as fh:
            json.dump(self.state, fh, indent=1, sort_keys=True)

    def path(self, name):
        return os.path.join(self.out, name)

    def probes(self, name):
        """(npz path, its arrays recorded so far, json path, its metadata) of
        a probe step: what an earlier run recorded is kept and resumed."""
        path, meta_path = self.path(f"{name}.npz"), self.path(f"{name}.json")
        fix = ("bring the folder back from the GPU run again" if self.args.fit else
               f"delete {name}.npz and {name}.json to record the {name} probes again")
        try:
            done = dict(np.load(path)) if os.path.exists(path) else {}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise BadFile(f"{path}: the recorded {name} probes cannot be read "
                          f"({type(err).__name__}: {err}); {fix}") from None
        meta = {"cases": {}}
        if os.path.exists(meta_path):
            meta = _read_json(meta_path, f"the {name} probes' record", fix)
            if not (isinstance(meta, dict) and isinstance(meta.get("cases"), dict)):
                raise BadFile(f"{meta_path}: expected a JSON object with \"cases\", found "
                              f"{json.dumps(meta)[:80]}; {fix}")
        meta.setdefault("small", self.args.small)
        return path, done, meta_path, meta


# ------------------------------------------------------------------ env
def nvidia_driver():
    """The NVIDIA driver's version as nvidia-smi reports it (or why not)."""
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as err:                                  # noqa: BLE001
        return f"unknown ({err})"


def step_env(run):
    torch = run.torch
    env = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "cuda": torch.version.cuda, "numpy": np.__version__,
           "python": platform.python_version(), "device": run.device, "host": run.args.host}
    try:
        import fpemu
        env["fpemu"] = fpemu.__version__
    except Exception as err:                                  # noqa: BLE001
        env["fpemu"] = f"not importable ({err})"
    if run.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, capability=list(torch.cuda.get_device_capability(0)),
                   sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        env["driver"] = nvidia_driver()
        env["cublaslt_workspace_env"] = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "(unset)")
    else:
        env.update(gpu=f"none: CPU torch stands in ({platform.processor() or platform.machine()})",
                   cpu_capability=torch.backends.cpu.get_cpu_capability())
    with open(run.path("env.json"), "w") as fh:
        json.dump(env, fh, indent=1, sort_keys=True)
    return {"status": "done", "lines": [f"{k}: {v}" for k, v in sorted(env.items())]}


# --------------------------------------------------------------- traces
def step_traces(run):
    from fpemu.reference import parity, record
    from fpemu.reference.scenarios import SCENARIOS
    root = run.args.traces_root
    folder = os.path.join(root, record.trace_dir_name(run.torch, run.device))
    have = set()
    if os.path.exists(os.path.join(folder, record.META)):
        have = set(parity.load_meta(folder)["scenarios"])
    wanted = list(SCENARIOS) if not run.args.small else [n for n in SCENARIOS
                                                         if n.startswith("casts-")]
    if run.device == "cuda":
        # the distributed scenarios run gloo processes on the CPU whatever the
        # machine: the CPU trace folder holds them (and torch's PowerSGD hook
        # calls torch.cuda.synchronize on CPU tensors when a GPU is visible)
        wanted = [n for n in wanted if SCENARIOS[n].group not in HOST_GROUPS]
    missing = [n for n in wanted if n not in have]
    lines = [f"trace folder {os.path.relpath(folder, ROOT)}: {len(have)} scenarios recorded, "
             f"{len(missing)} of the {len(wanted)} wanted missing"]
    raised = None
    if missing:
        t0 = time.monotonic()
        try:
            record.record(run.device, root, missing, log=lambda s: None)
        except RuntimeError as err:         # some raised in torch: the others are recorded
            raised = str(err).split("\n")[0][:400]
        lines.append(f"recorded in {time.monotonic() - t0:.0f} s"
                     + (f"; {raised}" if raised else ""))
        with tarfile.open(run.path("traces.tar.gz"), "w:gz") as tar:
            tar.add(folder, arcname=os.path.basename(folder))
        lines.append("packed as traces.tar.gz (unpack into tests/reference)")
    if run.device == "cuda":
        # the replay is host work (fpemu's kernels on recorded inputs): `make test`
        # and `fpemu parity` do it; a GPU minute is not spent compiling them cold
        lines.append("replay: on the host (`make test`, `fpemu parity`), not here")
        return {"status": "failed" if raised else "done", "lines": lines}
    t0 = time.monotonic()
    results = parity.parity(folder, wanted, log=lambda s: None)
    statuses = [c.status for r in results for c in r.comparisons]
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    failed = [r.name for r in results if not r.ok]
    lines.append(f"replayed {len(results)} scenarios in {time.monotonic() - t0:.0f} s: "
                 + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if failed:
        lines.append("failed: " + ", ".join(failed))
    return {"status": "failed" if raised else "done", "lines": lines, "counts": counts,
            "failed": failed}


# --------------------------------------------------------------- e2e ops
def step_e2e_ops(run):
    """The op streams of the end-to-end scenarios (``fpemu record --ops``:
    every ATen op of steps 0 and 10, inputs and outputs) into the trace
    folder's ``ops/``, packed as ``e2e_ops.tar.gz``; ``fpemu parity
    --first-difference SCENARIO`` then names, on the host, the first op whose
    output fpemu does not reproduce. The dry run replays its one stream."""
    from fpemu.reference import record
    from fpemu.reference.opstream import OPS_DIR, OpStream, first_difference, record_op_streams
    from fpemu.reference.scenarios import SCENARIOS
    root = run.args.traces_root
    folder = os.path.join(root, record.trace_dir_name(run.torch, run.device))
    names = [n for n, sc in SCENARIOS.items() if sc.group == "e2e"]
    steps = (0, 10)
    if run.args.small:
        names, steps = names[:1], (0,)
    ops = os.path.join(folder, OPS_DIR)

    def holds(name):            # a stream of fewer steps (a dry run's) is recorded again
        path = os.path.join(ops, f"{name}.npz")
        return os.path.exists(path) and set(steps) <= set(OpStream(path).index["steps"])
    missing = [n for n in names if not holds(n)]
    lines = [f"{len(names) - len(missing)} of {len(names)} op streams already in "
             f"{os.path.relpath(ops, ROOT)}"]
    raised = None
    if missing:
        t0 = time.monotonic()
        try:
            record_op_streams(run.device, root, missing, steps, log=lines.append)
        except RuntimeError as err:         # some raised in torch: the others are recorded
            raised = str(err)[:400]
            lines.append(raised)
        lines.append(f"recorded {len(missing)} in {time.monotonic() - t0:.0f} s")
    with tarfile.open(run.path("e2e_ops.tar.gz"), "w:gz") as tar:
        tar.add(ops, arcname=os.path.join(os.path.basename(folder), OPS_DIR))
    lines.append(f"packed as e2e_ops.tar.gz (unpack into {os.path.relpath(root, ROOT)})")
    if run.device != "cuda":            # host work: the replay (the GPU's is done at home)
        first = first_difference(folder, names[0], log=lambda text: None)
        lines.append(f"{names[0]}: first difference "
                     + (first.line().strip() if first else "none"))
    return {"status": "failed" if raised else "done", "lines": lines}


# ----------------------------------------------------------------- gemm
def gemm_cases(small, device):
    """Every probe as a dict: kind (matmul / scaled_mm), dtypes, shape,
    options, seed."""
    ks = KS_SMALL if small else KS
    cases = []
    for dt in ("bfloat16", "float16", "tf32"):
        for K in ks:
            cases.append(dict(kind="matmul", dtype=dt, M=16, K=K, N=16))
        for M, K, N in (E2E_SHAPES[:3] if small else E2E_SHAPES):
            cases.append(dict(kind="matmul", dtype=dt, M=M, K=K, N=N))
    outs = ("float32", "bfloat16", "float16", "float8_e4m3fn")
    for fast in (True, False):
        for K in ks:
            for out in (outs[:2] if small else outs):
                cases.append(dict(kind="scaled_mm", dtype="float8_e4m3fn", M=16, K=K, N=16,
                                  out=out, fast=fast, scales="tensor", bias=False))
        cases.append(dict(kind="scaled_mm", dtype="float8_e4m3fn", M=16, K=ks[-1], N=32,
                          out="bfloat16", fast=fast, scales="row", bias=False))
        cases.append(dict(kind="scaled_mm", dtype="float8_e4m3fn", M=16, K=ks[-1], N=32,
                          out="bfloat16", fast=fast, scales="tensor", bias=True))
        if not small:
            for M, N, K in SPLIT_SHAPES:
                cases.append(dict(kind="scaled_mm", dtype="float8_e4m3fn", M=M, K=K, N=N,
                                  out="bfloat16", fast=fast, scales="tensor", bias=False))
    for i, c in enumerate(cases):
        c["seed"] = 1000 + i
        c["id"] = (f"{c['kind']}-{c['dtype']}-{c['M']}x{c['K']}x{c['N']}"
                   + (f"-{c['out']}-{'fast' if c['fast'] else 'slow'}-{c['scales']}"
                      f"{'-bias' if c['bias'] else ''}" if c["kind"] == "scaled_mm" else ""))
    return cases


def gemm_inputs(torch, case):
    """The probe's operands, made on the CPU from its seed: float32 values
    cast by torch (``a`` (M, K), ``b`` (K, N); ``b`` column-major for
    _scaled_mm), and for _scaled_mm the scales and bias."""
    rng = np.random.default_rng(case["seed"])
    M, K, N = case["M"], case["K"], case["N"]
    # values over a few binades, with zeros: cancellation and alignment both matter
    a = rng.standard_normal((M, K)) * 2.0 ** rng.integers(-3, 4, (M, K))
    b = rng.standard_normal((K, N)) * 2.0 ** rng.integers(-3, 4, (K, N))
    a[rng.random((M, K)) < 0.02] = 0.0
    A = torch.from_numpy(a.astype(np.float32))
    B = torch.from_numpy(b.astype(np.float32))
    ins = {}
    if case["kind"] == "matmul":
        if case["dtype"] != "tf32":
            A, B = A.to(getattr(torch, case["dtype"])), B.to(getattr(torch, case["dtype"]))
        ins.update(a=A, b=B)
    else:
        dt = getattr(torch, case["dtype"])
        ins["a"] = (A * 4).to(dt)
        ins["b"] = (B.t().contiguous() * 4).to(dt).t()                 # column-major
        if case["scales"] == "tensor":
            ins["scale_a"] = torch.tensor(np.float32(0.375))
            ins["scale_b"] = torch.tensor(np.float32(1.25))
        else:
            ins["scale_a"] = torch.from_numpy(rng.uniform(0.25, 2, (M, 1)).astype(np.float32))
            ins["scale_b"] = torch.from_numpy(rng.uniform(0.25, 2, (1, N)).astype(np.float32))
        if case["bias"]:
            ins["bias"] = torch.from_numpy(rng.standard_normal(N).astype(np.float32)).to(
                getattr(torch, case["out"]))
    return ins


def _digest(ins):
    """sha256 of the probe's operands, name and raw bytes, in name order."""
    import torch
    h = hashlib.sha256()
    for k in sorted(ins):
        h.update(k.encode())
        h.update(ins[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _bits32(torch, t):
    """The float32 bit patterns of a result (exact: every output dtype
    widens exactly to float32)."""
    return t.detach().cpu().float().numpy().view(np.uint32).copy()


def run_gemm(torch, case, device):
    ins = gemm_inputs(torch, case)
    dev = {k: v.to(device) for k, v in ins.items()}
    out_used = case.get("out")
    if case["kind"] == "matmul":
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = case["dtype"] == "tf32"
        try:
            y = None
            if case["dtype"] != "tf32":
                # the float32 accumulator itself where torch can write it (mm's
                # out_dtype): a 16-bit output hides most of the K order
                try:
                    y = torch.mm(dev["a"], dev["b"], out_dtype=torch.float32)
                    out_used = "float32"
                except Exception:                             # noqa: BLE001
                    y = None
            if y is None:
                y = torch.matmul(dev["a"], dev["b"])
                out_used = "float32" if case["dtype"] == "tf32" else case["dtype"]
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    else:
        kw = {"bias": dev["bias"]} if "bias" in dev else {}
        if case["out"].startswith("float8"):
            kw["scale_result"] = torch.tensor(np.float32(0.5), device=device)
        y = torch._scaled_mm(dev["a"], dev["b"], dev["scale_a"], dev["scale_b"],
                             out_dtype=getattr(torch, case["out"]),
                             use_fast_accum=case["fast"], **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    return _digest(ins), _bits32(torch, y), out_used


def step_gemm(run):
    torch = run.torch
    path, done, meta_path, meta = run.probes("gemm")
    cases = gemm_cases(meta["small"], run.device)
    ran = 0
    for case in cases:
        if case["id"] in done or run.args.fit:
            continue
        if run.left() < 2:
            break
        try:
            digest, bits, out_used = run_gemm(torch, case, run.device)
        except Exception as err:                              # noqa: BLE001
            meta["cases"][case["id"]] = dict(case, error=f"{type(err).__name__}: {err}")
            continue
        done[case["id"]] = bits
        meta["cases"][case["id"]] = dict(case, sha256=digest, out=out_used)
        meta.setdefault("device", run.device)      # the fit's profile: cpu or cuda
        ran += 1
    np.savez_compressed(path, **done)
    complete = all(c["id"] in done or "error" in meta["cases"].get(c["id"], {}) for c in cases)
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    if not (run.args.host or run.args.fit_on_device):
        return {"status": "done" if complete else "partial",
                "lines": [f"{ran} probes run now, {len(done)} of {len(cases)} recorded; not "
                          f"fitted here: `python bench/gpu_check.py --fit {run.out}` on the host"]}
    fits = fit_gemm(torch, cases, done, meta, meta.get("device", run.device) == "cpu",
                    run.release(), gpu=_gpu_key(run.env()))
    meta["fits"] = fits
    meta["device"] = meta.get("device", run.device)
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    lines = [f"{ran} probes run now, {len(done)} of {len(cases)} recorded"
             + ("" if complete else " (budget: the rest next run)")]
    errors = [k for k, v in meta["cases"].items() if "error" in v]
    if errors:
        lines.append(f"{len(errors)} probes raised: " + "; ".join(
            f"{k}: {meta['cases'][k]['error'][:120]}" for k in errors[:4]))
    lines += summarize_fits(fits)
    return {"status": "done" if complete else "partial", "lines": lines}


def gemm_candidates(case, gpu="h100"):
    """(name, function of (A, B) float64 arrays -> float32 outputs) for a
    recorded probe (``case["out"]``: the output dtype torch wrote; ``gpu``:
    the recording GPU's profile, whose own product is one candidate)."""
    from fpemu import accumulate, quantize
    from fpemu.accumulate import TensorCore
    out = []
    if case["kind"] == "matmul":
        fmt = {"bfloat16": "bf16", "float16": "fp16", "tf32": "tf32"}[case["dtype"]]
        out_fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[case["out"]]
        models = [("sequential", "sequential"), ("exact", "exact"), ("pairwise", "pairwise")]
        for terms in (4, 8, 16, 32):
            for frac in (23, 24, 25, 26):
                name = f"tc{terms}f{frac}"
                models.append((name, TensorCore(name, terms, frac)))
        roundings = ("rne", "rtz", "rna") if fmt == "tf32" else ("rne",)
        for rnd in roundings:
            for mname, model in models:
                for S in (1, 2, 3, 4, 6, 8):
                    if S > 1 and (case["K"] <= 128 * (S - 1) or not mname.startswith("tc")):
                        continue

                    def f(A, B, model=model, S=S, rnd=rnd):
                        if fmt == "tf32":
                            A = quantize(A, "tf32", rounding=rnd).astype(np.float64)
                            B = quantize(B, "tf32", rounding=rnd).astype(np.float64)
                        return accumulate.matmul(A, B, fmt, "fp32", out_fmt, model=model,
                                                 splitk=S)
                    name = (f"{mname}" + (f" splitk={S}" if S > 1 else "")
                            + (f" tf32-{rnd}" if fmt == "tf32" else ""))
                    out.append((name, f))
        if fmt == "tf32":              # TF32 not used: float32 products, float32 sums
            out.append(("float32 sequential (no tf32)",
                        lambda A, B: accumulate.matmul(A, B, "fp32", model="sequential")))

        def profile_product(A, B):
            """The CUDA profile's own product (its GPU's tensor-core model and
            cuBLAS's recorded split), before the rounding to the output dtype."""
            import fpemu.autograd as ft
            from fpemu.autograd.ops.linalg import mm_acc
            dt = ft.float32 if fmt == "tf32" else getattr(ft, case["dtype"])
            with ft.use_profile(ft.Profile("cuda", gpu=gpu)):
                acc = mm_acc(np.asarray(A, np.float32), np.asarray(B, np.float32), dt,
                             tf32=fmt == "tf32")
            return acc if out_fmt == "fp32" else quantize(acc, out_fmt)
        out.append(("fpemu CUDA profile (its GPU's model and split)", profile_product))
    else:
        for split in ("auto", 1, 2, 3, 4, 6):
            out.append((f"fpemu _scaled_mm splitk={split}", ("scaled_mm", split)))
    return out


def _scaled_mm_fpemu(torch, case, ins, split, cpu, release):
    import fpemu.autograd as ft
    conv = {k: ft.nn.from_torch(v.contiguous() if k != "b" else v.t().contiguous())
            for k, v in ins.items()}
    conv["b"] = conv["b"].t()
    kw = {"bias": conv["bias"]} if "bias" in conv else {}
    if case["out"].startswith("float8"):
        kw["scale_result"] = ft.tensor(np.float32(0.5))
    with ft.use_profile(ft.Profile("cpu" if cpu else "cuda", release)):
        y = ft._scaled_mm(conv["a"], conv["b"], conv["scale_a"], conv["scale_b"],
                          out_dtype=getattr(ft, case["out"]), use_fast_accum=case["fast"],
                          splitk=split if not cpu else 1, **kw)
    return y.float().numpy()


def fit_gemm(torch, cases, done, meta, cpu, release=None, gpu="h100"):
    """Per recorded probe: the candidates that reproduce every output bit,
    else the closest one and how many outputs it misses (``release``: the
    torch version of the recording, for fpemu's profile; ``gpu``: the
    recording GPU's profile name)."""
    release = release or torch.__version__.split("+")[0]
    fits = {}
    for case in cases:
        bits = done.get(case["id"])
        if bits is None:
            continue
        ins = gemm_inputs(torch, case)
        if meta["cases"][case["id"]].get("sha256") != _digest(ins):
            fits[case["id"]] = {"error": "inputs regenerated here differ from the recorded ones"}
            continue
        exact, best = [], None
        A = ins["a"].float().numpy().astype(np.float64)
        B = ins["b"].float().numpy().astype(np.float64)
        for name, f in gemm_candidates(meta["cases"][case["id"]], gpu):
            try:
                if isinstance(f, tuple):
                    if cpu and f[1] not in ("auto", 1):
                        continue
                    y = _scaled_mm_fpemu(torch, case, ins, f[1], cpu, release)
                else:
                    y = f(A, B)
            except Exception as err:                          # noqa: BLE001
                fits.setdefault(case["id"], {}).setdefault("candidate_errors", []).append(
                    f"{name}: {type(err).__name__}: {err}"[:200])
                continue
            ours = np.asarray(y, np.float32).view(np.uint32)
            both_nan = np.isnan(ours.view(np.float32)) & np.isnan(bits.view(np.float32))
            miss = int(((ours != bits) & ~both_nan).sum())
            if miss == 0:
                exact.append(name)
            if best is None or miss < best[1]:
                best = (name, miss)
        entry = fits.setdefault(case["id"], {})
        entry.update(outputs=int(bits.size), exact=exact,
                     closest=None if best is None else {"model": best[0], "differ": best[1]})
    return fits


def summarize_fits(fits):
    lines = []
    n_exact = sum(bool(v.get("exact")) for v in fits.values())
    lines.append(f"{n_exact} of {len(fits)} probes reproduced bit for bit by some fpemu model")
    for cid, v in sorted(fits.items()):
        if "error" in v:
            lines.append(f"- {cid}: {v['error']}")
        elif v["exact"]:
            lines.append(f"- {cid}: exact with {', '.join(v['exact'][:4])}"
                         + (f" (+{len(v['exact']) - 4})" if len(v["exact"]) > 4 else ""))
        elif v.get("closest"):
            c = v["closest"]
            lines.append(f"- {cid}: none exact; closest {c['model']} ({c['differ']} of "
                         f"{v['outputs']} outputs differ)")
    return lines


# ------------------------------------------------------------ attention
def attention_cases(small):
    cases = []
    for dt in ("bfloat16", "float16"):
        for backend in ("flash", "efficient"):
            for L in ((16, 96) if small else (16, 128, 200)):
                for causal in (False, True):
                    cases.append(dict(dtype=dt, backend=backend, B=1, H=2, L=L, E=64,
                                      causal=causal))
        # V = the identity: the output is the normalised P itself, which says
        # whether P is rounded to the dtype before P @ V
        for backend in ("flash", "efficient"):
            cases.append(dict(dtype=dt, backend=backend, B=1, H=2, L=64, E=64, causal=False,
                              v_identity=True))
    for i, c in enumerate(cases):
        c["seed"] = 5000 + i
        c["id"] = (f"{c['backend']}-{c['dtype']}-L{c['L']}-E{c['E']}"
                   f"{'-causal' if c['causal'] else ''}"
                   f"{'-videntity' if c.get('v_identity') else ''}")
    return cases


def _attention_inputs(torch, case):
    rng = np.random.default_rng(case["seed"])
    shape = (case["B"], case["H"], case["L"], case["E"])
    dt = getattr(torch, case["dtype"])
    ins = {k: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dt)
           for k in ("q", "k", "v", "dout")}
    if case.get("v_identity"):
        ins["q"] = ins["q"] * 2                      # peaked rows: P spans many binades
        ins["v"] = torch.eye(case["L"], case["E"]).expand(shape).to(dt).contiguous()
    return ins


def run_attention(torch, case, device):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ins = _attention_inputs(torch, case)
    q, k, v = (ins[n].to(device).requires_grad_() for n in ("q", "k", "v"))
    backend = {"flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[case["backend"]]
    with sdpa_kernel([backend]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
        o.backward(ins["dout"].to(device))
    return {"out": _bits32(torch, o), "dq": _bits32(torch, q.grad), "dk": _bits32(torch, k.grad),
            "dv": _bits32(torch, v.grad)}


def fpemu_attention(torch, case, cpu, release):
    import fpemu.autograd as ft
    ins = _attention_inputs(torch, case)
    q, k, v = (ft.nn.from_torch(ins[n]).requires_grad_() for n in ("q", "k", "v"))
    F = ft.nn.functional
    backend = {"flash": F.SDPBackend.FLASH_ATTENTION,
               "efficient": F.SDPBackend.EFFICIENT_ATTENTION}[case["backend"]]
    with ft.use_profile(ft.Profile("cpu" if cpu else "cuda", release)), F.sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
        o.backward(ft.nn.from_torch(ins["dout"]))
    return {"out": o.detach().float().numpy(), "dq": q.grad.float().numpy(),
            "dk": k.grad.float().numpy(), "dv": v.grad.float().numpy()}


def _round_to(x, dtype):
    """float32 values rounded to the dtype (nearest even), back in float32."""
    from fpemu import quantize
    return quantize(np.asarray(x, np.float32), {"bfloat16": "bf16", "float16": "fp16"}[dtype])


def online_attention(Q, K, V, sc, dtype, block=None, round_p=True, causal=False):
    """A candidate model of a fused attention forward (numpy, per (batch,
    head)): scores rounded once to float32, the softmax online over key
    blocks of ``block`` (None: one block, the global row maximum), the
    running sum and the accumulator rescaled by exp(m_old - m_new) in
    float32, each block's P (with the running maximum) rounded to the dtype
    before P @ V when ``round_p``, and the result divided by the row sum and
    rounded once. Exponentials: float64's, rounded to float32."""
    Q, K, V = (np.asarray(t, np.float64) for t in (Q, K, V))
    *lead, L, E = Q.shape
    S = K.shape[-2]
    block = block or S
    f32 = np.float32
    with np.errstate(all="ignore"):
        Z = ((Q @ np.swapaxes(K, -1, -2)).astype(f32) * f32(sc)).astype(f32)
        if causal:
            Z = np.where(np.tril(np.ones((L, S), bool)), Z, f32(-np.inf))
        m = np.full(tuple(lead) + (L, 1), -np.inf, f32)
        lsum = np.zeros(tuple(lead) + (L, 1), f32)
        acc = np.zeros(tuple(lead) + (L, V.shape[-1]), f32)
        for j0 in range(0, S, block):
            Zb = Z[..., j0:j0 + block]
            m_new = np.maximum(m, Zb.max(axis=-1, keepdims=True))
            safe = np.where(np.isfinite(m_new), m_new, f32(0))
            alpha = np.exp((m - safe).astype(np.float64)).astype(f32)
            P = np.exp((Zb - safe).astype(f32).astype(np.float64)).astype(f32)
            lsum = (lsum * alpha + P.sum(axis=-1, keepdims=True, dtype=np.float64)).astype(f32)
            Pv = _round_to(P, dtype) if round_p else P
            pv = (Pv.astype(np.float64) @ V[..., j0:j0 + block, :]).astype(f32)
            acc = (acc * alpha + pv).astype(f32)
            m = m_new
        return _round_to((acc / lsum).astype(f32), dtype)


def attention_candidates(torch, case):
    """{name: float32 output} of the candidate forward models for a probe."""
    ins = _attention_inputs(torch, case)
    Q, K, V = (ins[n].float().numpy() for n in ("q", "k", "v"))
    sc = 1.0 / np.sqrt(case["E"])
    out = {}
    for block in (None, 32, 64, 128):
        if block is None or block < case["L"]:
            out[f"online block={block or 'all'} P rounded"] = online_attention(
                Q, K, V, sc, case["dtype"], block, True, case["causal"])
    # P kept in fp32: the block size no longer shows in a 16-bit output
    out["P in fp32"] = online_attention(Q, K, V, sc, case["dtype"], None, False, case["causal"])
    return out


def _ulps(a_bits, b_bits, dtype):
    """Distance in units of the output dtype's last place (both widened to
    float32 bit patterns of values of that dtype)."""
    shift = 16 if dtype == "bfloat16" else 0
    a = a_bits.view(np.float32)
    b = b_bits.view(np.float32)
    if dtype == "float16":
        a, b = a.astype(np.float16).view(np.uint16), b.astype(np.float16).view(np.uint16)
        ia, ib = a.astype(np.int64), b.astype(np.int64)
        sign = 0x8000
    else:
        ia = (a_bits >> shift).astype(np.int64)
        ib = (b_bits >> shift).astype(np.int64)
        sign = 0x8000 if shift else 0x80000000
    ia = np.where(ia & sign, -(ia & (sign - 1)), ia)
    ib = np.where(ib & sign, -(ib & (sign - 1)), ib)
    return np.abs(ia - ib)


def step_attention(run):
    torch = run.torch
    path, done, meta_path, meta = run.probes("attention")
    meta.setdefault("device", run.device)
    cases = attention_cases(meta["small"])
    for case in cases:
        entry = meta["cases"].get(case["id"])
        if run.args.fit or (entry is not None and ("error" in entry
                                                   or f"{case['id']}.out" in done)):
            continue
        if run.left() < 2:
            break
        try:
            res = run_attention(torch, case, run.device)
        except Exception as err:                              # noqa: BLE001
            meta["cases"][case["id"]] = dict(case, error=f"{type(err).__name__}: {err}"[:300])
            continue
        meta["cases"][case["id"]] = dict(case)
        done.update({f"{case['id']}.{k}": v for k, v in res.items()})
    np.savez_compressed(path, **done)
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    lines, compared = [], 0
    for case in cases:
        entry = meta["cases"].get(case["id"])
        if entry is None:
            continue
        if "error" in entry:
            lines.append(f"- {case['id']}: not run ({entry['error'][:100]})")
            continue
        if not (run.args.host or run.args.fit_on_device):
            continue
        ours = fpemu_attention(torch, case, meta["device"] == "cpu", run.release())
        cmp = {}
        for k in ("out", "dq", "dk", "dv"):
            rec = done[f"{case['id']}.{k}"]
            mine = np.asarray(ours[k], np.float32).reshape(rec.shape).view(np.uint32)
            d = _ulps(rec, mine, case["dtype"])
            r, m = rec.view(np.float32).astype(np.float64), mine.view(np.float32).astype(np.float64)
            scale = np.abs(r).max() or 1.0
            cmp[k] = {"equal": int((d == 0).sum()), "n": int(d.size), "max_ulps": int(d.max()),
                      "normwise": float(np.abs(r - m).max() / scale)}
        entry["fpemu"] = cmp
        lines.append(f"- {case['id']}: " + ", ".join(
            f"{k} {v['equal']}/{v['n']} equal (max {v['max_ulps']} ulps, {v['normwise']:.1e} "
            "of max|x|)" for k, v in cmp.items()))
        rec = done[f"{case['id']}.out"]
        fits = {}
        for name, y in attention_candidates(torch, case).items():
            d = _ulps(rec, np.asarray(y, np.float32).reshape(rec.shape).view(np.uint32),
                      case["dtype"])
            fits[name] = int((d == 0).sum())
        entry["forward_models"] = fits
        best = max(fits.items(), key=lambda kv: kv[1])
        lines.append(f"    forward models: best {best[0]} ({best[1]}/{rec.size} equal); "
                     + ", ".join(f"{k}: {v}" for k, v in fits.items() if k != best[0]))
        compared += 1
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    complete = all(c["id"] in meta["cases"] and ("error" in meta["cases"][c["id"]]
                                                 or f"{c['id']}.out" in done) for c in cases)
    head = (f"{compared} of {len(cases)} attention probes recorded and compared with fpemu's "
            "§11 model")
    return {"status": "done" if complete else "partial", "lines": [head] + lines}


# ------------------------------------------------ probe steps, in general
def _gpu_key(env):
    """The fpemu Profile's gpu= for a recording's GPU name (env.json)."""
    name = str(env.get("gpu", "")).upper()
    for key in ("H200", "H100", "A100"):
        if key in name:
            return key.lower()
    return "h100"


def _fit_context(run, meta):
    return {"cpu": meta.get("device", run.device) == "cpu", "release": run.release(),
            "gpu": _gpu_key(run.env()), "small": bool(meta.get("small"))}


def _profile(ctx):
    import fpemu.autograd as ft
    if ctx["cpu"]:
        return ft.Profile("cpu", ctx["release"])
    return ft.Profile("cuda", ctx["release"], gpu=ctx["gpu"])


def _compare(rec_bits, ours, dtype):
    """{equal, n, max_ulps} of fpemu's values against recorded float32 bits
    (distance in ulps of ``dtype``; NaN equals NaN)."""
    ours = np.ascontiguousarray(np.asarray(ours, np.float32)).reshape(rec_bits.shape)
    mine = ours.view(np.uint32)
    both_nan = np.isnan(ours) & np.isnan(rec_bits.view(np.float32))
    d = np.where(both_nan, 0, _ulps(rec_bits, mine, dtype))
    return {"equal": int((d == 0).sum()), "n": int(d.size), "max_ulps": int(d.max()) if d.size
            else 0}


def _probe_step(run, name, cases, record, fit, summarize):
    """A probe step: ``record(torch, case, device)`` -> (sha256 of the
    inputs, {array name: recorded array}, {extra metadata}) for each case not
    recorded yet, until the budget ends; then (on the host, or with
    --fit-on-device) ``fit(torch, entry, arrays, ctx)`` -> a dict per case,
    and ``summarize(fits, meta)`` -> the summary's lines."""
    torch = run.torch
    path, done, meta_path, meta = run.probes(name)
    meta.setdefault("device", run.device)
    ran = 0
    for case in cases:
        entry = meta["cases"].get(case["id"])
        if run.args.fit or (entry is not None and ("error" in entry or "recorded" in entry)):
            continue
        if run.left() < 2:
            break
        try:
            digest, arrays, extra = record(torch, case, run.device)
        except Exception as err:                              # noqa: BLE001
            meta["cases"][case["id"]] = dict(case, error=f"{type(err).__name__}: {err}"[:300])
            continue
        done.update({f"{case['id']}.{k}": v for k, v in arrays.items()})
        meta["cases"][case["id"]] = dict(case, sha256=digest, recorded=sorted(arrays), **extra)
        ran += 1
    np.savez_compressed(path, **done)
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    recorded = [c for c in cases if "recorded" in meta["cases"].get(c["id"], {})]
    errors = {c["id"]: meta["cases"][c["id"]]["error"] for c in cases
              if "error" in meta["cases"].get(c["id"], {})}
    complete = len(recorded) + len(errors) == len(cases)
    lines = [f"{ran} probes run now, {len(recorded)} of {len(cases)} recorded"
             + ("" if complete else " (budget: the rest next run)")]
    if errors:
        lines.append(f"{len(errors)} probes raised: " + "; ".join(
            f"{k}: {v[:120]}" for k, v in list(errors.items())[:4]))
    if not (run.args.host or run.args.fit_on_device):
        lines.append(f"not fitted here: `python bench/gpu_check.py --fit {run.out}` on the host")
        return {"status": "done" if complete else "partial", "lines": lines}
    ctx = _fit_context(run, meta)
    fits = {}
    for case in recorded:
        entry = meta["cases"][case["id"]]
        arrays = {k: done[f"{case['id']}.{k}"] for k in entry["recorded"]}
        try:
            with np.errstate(all="ignore"):
                fits[case["id"]] = fit(torch, entry, arrays, ctx)
        except Exception as err:                              # noqa: BLE001
            fits[case["id"]] = {"error": f"{type(err).__name__}: {err}"[:300]}
    meta["fits"] = fits
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    lines += summarize(fits, meta)
    return {"status": "done" if complete else "partial", "lines": lines}


def _operand(rng, shape, zeros=0.02):
    """float32 values over a few binades, with zeros (as gemm_inputs)."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)
    x[rng.random(shape) < zeros] = 0.0
    return x.astype(np.float32)


def _same_inputs(entry, ins):
    if entry.get("sha256") != _digest(ins):
        raise BadFile(f"{entry['id']}: the inputs regenerated here differ from the recorded "
                      "ones (sha256); the seed or the input recipe changed since the recording")


def _fp_cmp_lines(fits, keys=("fpemu",)):
    """'- id: out 64/64 equal (max 0 ulps), ...' for fpemu's comparisons."""
    lines = []
    for cid, v in sorted(fits.items()):
        if "error" in v:
            lines.append(f"- {cid}: {v['error']}")
            continue
        for key in keys:
            if key in v:
                lines.append(f"- {cid} {key}: " + ", ".join(
                    f"{k} {c['equal']}/{c['n']} (max {c['max_ulps']} ulps)"
                    for k, c in v[key].items()))
    return lines


def _candidate_lines(fits):
    """Per probe and product: the accumulation models reproducing it."""
    lines = []
    for cid, v in sorted(fits.items()):
        for prod, r in sorted(v.get("models", {}).items()):
            if r["exact"]:
                lines.append(f"- {cid} {prod}: exact with {', '.join(r['exact'][:4])}"
                             + (f" (+{len(r['exact']) - 4})" if len(r["exact"]) > 4 else ""))
            elif r.get("closest"):
                lines.append(f"- {cid} {prod}: none exact; closest {r['closest']['model']} "
                             f"({r['closest']['differ']} of {r['outputs']} differ)")
    return lines


def _fit_models(rec_bits, candidates):
    """{exact: [names], closest: {model, differ}, outputs} of candidate
    functions () -> float32 array against recorded float32 bits."""
    exact, best, errors = [], None, []
    for cname, f in candidates:
        try:
            y = np.ascontiguousarray(np.asarray(f(), np.float32)).reshape(rec_bits.shape)
        except Exception as err:                              # noqa: BLE001
            errors.append(f"{cname}: {type(err).__name__}: {err}"[:160])
            continue
        ours = y.view(np.uint32)
        both_nan = np.isnan(y) & np.isnan(rec_bits.view(np.float32))
        miss = int(((ours != rec_bits) & ~both_nan).sum())
        if miss == 0:
            exact.append(cname)
        if best is None or miss < best[1]:
            best = (cname, miss)
    out = {"exact": exact, "outputs": int(rec_bits.size),
           "closest": None if best is None else {"model": best[0], "differ": best[1]}}
    if errors:
        out["candidate_errors"] = errors[:6]
    return out


# ---------------------------------------------------------------- sgemm
def sgemm_cases(small):
    """float32 GEMMs with TF32 off (cuBLAS SGEMM): the end-to-end shapes as
    torch.mm and as F.linear with a bias (addmm), forward and backward as
    autograd issues them (transposed, non-contiguous operands), and K from
    16 to 4096 (16 x K x 16)."""
    cases = []
    for M, K, N in (E2E_SHAPES[:2] if small else E2E_SHAPES):
        cases.append(dict(op="mm", M=M, K=K, N=N))
        cases.append(dict(op="linear", M=M, K=K, N=N))
    for K in ((16, 256) if small else KS[:-1]):       # the forward only: K is its reduction
        cases.append(dict(op="mm", M=16, K=K, N=16, grad=False))
    out, seen = [], set()
    for i, c in enumerate(cases):
        c["id"] = f"{c['op']}-float32-{c['M']}x{c['K']}x{c['N']}"
        if c["id"] not in seen:
            seen.add(c["id"])
            out.append(dict(c, seed=7000 + i, dtype="float32"))
    return out


def _gemm_operands(torch, case):
    """CPU tensors of a GEMM probe (cast to its dtype by torch): mm: a (M, K),
    b (K, N); linear: x (M, K), w (N, K), bias (N,); bmm: a (B, M, K), b (B, K,
    N); and g, the output's gradient."""
    rng = np.random.default_rng(case["seed"])
    M, K, N = case["M"], case["K"], case["N"]
    dt = getattr(torch, case["dtype"])
    B = (case["B"],) if case["op"] == "bmm" else ()
    if case["op"] == "linear":
        shapes = {"x": (M, K), "w": (N, K), "bias": (N,), "g": (M, N)}
    else:
        shapes = {"a": B + (M, K), "b": B + (K, N), "g": B + (M, N)}
    return {k: torch.from_numpy(_operand(rng, s)).to(dt) for k, s in shapes.items()}


def _gemm_autograd(lib, case, ins, device=None):
    """Forward and backward of a GEMM probe in torch or fpemu.autograd
    (``lib``); {name: result}."""
    F = lib.nn.functional
    conv = ((lambda t: t.to(device)) if device is not None else lib.nn.from_torch)
    t = {k: conv(v) for k, v in ins.items()}
    grads = [k for k in t if k != "g"] if case.get("grad", True) else []
    for k in grads:
        t[k].requires_grad_()
    if case["op"] == "linear":
        y = F.linear(t["x"], t["w"], t["bias"])
    elif case["op"] == "bmm":
        y = lib.bmm(t["a"], t["b"])
    else:
        y = lib.mm(t["a"], t["b"])
    if grads:
        y.backward(t["g"])
    out = {"out": y.detach()}
    out.update({f"d{k}": t[k].grad for k in grads})
    return out


def run_sgemm(torch, case, device):
    ins = _gemm_operands(torch, case)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        res = _gemm_autograd(torch, case, ins, device)
        if device == "cuda":
            torch.cuda.synchronize()
        extra = {"allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                 "float32_matmul_precision": torch.get_float32_matmul_precision()}
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return _digest(ins), {k: _bits32(torch, v) for k, v in res.items()}, extra


def _products(case, ins):
    """(name, A, B, bias) of every GEMM a probe ran (float64 arrays of the
    operands' values; bmm: 3-D), as autograd issues them."""
    f = {k: v.float().numpy().astype(np.float64) for k, v in ins.items()}
    if case["op"] == "linear":
        x, w, g = f["x"], f["w"], f["g"]
        out = [("out", x, w.T, f["bias"]), ("dx", g, w, None), ("dw", g.T, x, None)]
    else:
        a, b, g = f["a"], f["b"], f["g"]
        tr = (lambda m: np.swapaxes(m, -1, -2))
        out = [("out", a, b, None), ("da", g, tr(b), None), ("db", tr(a), g, None)]
    return out if case.get("grad", True) else out[:1]


def _fp32_candidates(A, B, bias):
    """fpemu.accumulate's models of a float32 GEMM (A @ B): named functions."""
    from fpemu import accumulate
    K = A.shape[1]
    models = [("exact", {"model": "exact"}), ("sequential", {"model": "sequential"}),
              ("pairwise", {"model": "pairwise"}), ("fma", {"model": "fma"})]
    for inner in ("sequential", "fma"):
        for block in (4, 8, 16, 32, 64, 128, 256):
            if block < K:
                models.append((f"blocked {inner} {block}",
                               {"model": "blocked", "inner": inner, "block": block}))
    for S in (2, 3, 4, 6, 8):
        if K > 128 * (S - 1):
            for m in ("fma", "sequential"):
                models.append((f"{m} splitk={S}", {"model": m, "splitk": S}))
    out = []
    for mname, kw in models:
        def f(kw=kw):
            return accumulate.matmul(A, B, "fp32", **kw)
        if bias is None:
            out.append((mname, f))
            continue
        out.append((f"{mname}, + bias after",
                    lambda f=f: (f() + bias.astype(np.float32)).astype(np.float32)))
        if kw.get("splitk", 1) == 1:
            out.append((f"{mname}, from the bias",
                        lambda kw=kw: accumulate.matmul(A, B, "fp32", c=bias[None, :], **kw)))
    return out


def fit_sgemm(torch, entry, arrays, ctx):
    import fpemu.autograd as ft
    ins = _gemm_operands(torch, entry)
    _same_inputs(entry, ins)
    with ft.use_profile(_profile(ctx)):
        ours = _gemm_autograd(ft, entry, ins)
    res = {"fpemu": {k: _compare(arrays[k], ours[k].float().numpy(), "float32")
                     for k in sorted(arrays)}, "models": {}}
    if ctx["small"] and entry["id"] != "linear-float32-64x32x64":
        return res                  # the dry run: one probe's candidates are enough
    for prod, A, B, bias in _products(entry, ins):
        res["models"][prod] = _fit_models(arrays[prod], _fp32_candidates(A, B, bias))
    return res


def _sgemm_summary(fits, meta):
    n = len(fits)
    agree = sum(all(c["equal"] == c["n"] for c in v.get("fpemu", {}).values()) and "fpemu" in v
                for v in fits.values())
    lines = [f"fpemu.autograd (profile {'cpu' if meta['device'] == 'cpu' else 'cuda'}) "
             f"reproduces {agree} of {n} probes bit for bit (forward and every gradient)"]
    return lines + _fp_cmp_lines(fits) + _candidate_lines(fits)


def step_sgemm(run):
    return _probe_step(run, "sgemm", sgemm_cases(run.probes("sgemm")[3]["small"]), run_sgemm,
                       fit_sgemm, _sgemm_summary)


# --------------------------------------------------------------- gemm16
BMM_SHAPES = ((32, 8, 16, 8), (32, 8, 8, 16))     # (batch, M, K, N): Q @ K^T and P @ V


def gemm16_cases(small):
    """bf16 / fp16 GEMMs with 16-bit outputs: torch.mm (the end-to-end
    shapes, K from 16 to 4096), F.linear with a bias (addmm with a 1-D bias,
    what autocast's linear calls: cuBLASLt's bias epilogue) and torch.bmm at
    the transformer's attention shapes; forward and backward."""
    cases = []
    for dt in ("bfloat16", "float16"):
        for M, K, N in (E2E_SHAPES[:1] if small else E2E_SHAPES):
            cases.append(dict(op="mm", dtype=dt, M=M, K=K, N=N))
            cases.append(dict(op="linear", dtype=dt, M=M, K=K, N=N))
        for K in ((256,) if small else KS[:-1]):
            cases.append(dict(op="mm", dtype=dt, M=16, K=K, N=16, grad=False))
        for Bn, M, K, N in (BMM_SHAPES[:1] if small else BMM_SHAPES):
            cases.append(dict(op="bmm", dtype=dt, B=Bn, M=M, K=K, N=N))
    out, seen = [], set()
    for i, c in enumerate(cases):
        c["id"] = (f"{c['op']}-{c['dtype']}-" + (f"{c['B']}x" if c["op"] == "bmm" else "")
                   + f"{c['M']}x{c['K']}x{c['N']}")
        if c["id"] not in seen:
            seen.add(c["id"])
            out.append(dict(c, seed=8000 + i))
    return out


def run_gemm16(torch, case, device):
    ins = _gemm_operands(torch, case)
    res = _gemm_autograd(torch, case, ins, device)
    if device == "cuda":
        torch.cuda.synchronize()
    m = torch.backends.cuda.matmul
    extra = {"allow_bf16_reduced_precision_reduction": bool(
        m.allow_bf16_reduced_precision_reduction),
        "allow_fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
        "out_dtype": str(res["out"].dtype).replace("torch.", "")}
    return _digest(ins), {k: _bits32(torch, v) for k, v in res.items()}, extra


def _tc_candidates(A, B, bias, dt, gpu):
    """fpemu.accumulate's tensor-core model of the GPU (``gpu``'s, "h100" for
    Hopper), K split 1-8 ways, one rounding to the dtype; with a bias: added
    to the float32 accumulator before the rounding, after it, or as the
    accumulator's start. A, B: 2-D or batched (3-D)."""
    from fpemu import accumulate, quantize
    from fpemu.autograd._profile import GPUS
    fmt = {"bfloat16": "bf16", "float16": "fp16"}[dt]
    tc = GPUS[gpu].tensor_core
    K = A.shape[-1]

    def each(f):
        if A.ndim == 2:
            return f(A, B)
        return np.stack([f(a, b) for a, b in zip(A, B)])

    out = []
    for model in (tc, "sequential", "exact"):
        for S in (1, 2, 3, 4, 6, 8):
            if S > 1 and (model != tc or K <= 128 * (S - 1)):
                continue
            name = f"{model}" + (f" splitk={S}" if S > 1 else "")
            if bias is None:
                out.append((name, lambda m=model, S=S: each(
                    lambda a, b: accumulate.matmul(a, b, fmt, "fp32", fmt, model=m, splitk=S))))
                if S > 1:           # the parts rounded to the dtype (reduced-precision reduction)
                    def parts(a, b, m=model, S=S):
                        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
                        for lo, hi in accumulate.SplitK(S).parts(K):
                            if hi > lo:
                                p = accumulate.matmul(a[:, lo:hi], b[lo:hi], fmt, "fp32", fmt,
                                                      model=m)
                                acc = (acc + p).astype(np.float32)
                        return quantize(acc, fmt)
                    out.append((f"{name}, parts in the dtype", lambda p=parts: each(p)))
                continue
            bias32 = bias.astype(np.float32)

            def acc32(m=model, S=S):
                return accumulate.matmul(A, B, fmt, "fp32", "fp32", model=m, splitk=S)
            out.append((f"{name}, bias before the rounding",
                        lambda a=acc32: quantize((a() + bias32).astype(np.float32), fmt)))
            out.append((f"{name}, bias after the rounding", lambda a=acc32: quantize(
                (quantize(a(), fmt) + bias32).astype(np.float32), fmt)))
            if S == 1:
                out.append((f"{name}, from the bias", lambda m=model: accumulate.matmul(
                    A, B, fmt, "fp32", fmt, model=m, c=bias32[None, :])))
    return out


def fit_gemm16(torch, entry, arrays, ctx):
    import fpemu.autograd as ft
    ins = _gemm_operands(torch, entry)
    _same_inputs(entry, ins)
    with ft.use_profile(_profile(ctx)):
        ours = _gemm_autograd(ft, entry, ins)
    res = {"fpemu": {k: _compare(arrays[k], ours[k].float().numpy(), entry["dtype"])
                     for k in sorted(arrays)}, "models": {}}
    if ctx["small"] and entry["op"] != "linear":
        return res                  # the dry run: the linear probe's candidates are enough
    for prod, A, B, bias in _products(entry, ins):
        res["models"][prod] = _fit_models(arrays[prod],
                                          _tc_candidates(A, B, bias, entry["dtype"], ctx["gpu"]))
    return res


def step_gemm16(run):
    return _probe_step(run, "gemm16", gemm16_cases(run.probes("gemm16")[3]["small"]),
                       run_gemm16, fit_gemm16, _sgemm_summary)


# ----------------------------------------------------------- reductions
# FPRev probes (bench/fprev.py): (op, dtype, shape, dim, layout, leaves).
# The shapes take each launch of ATen's Reduce.cuh (setReduceConfig: the
# reduced dimension across a warp's lanes only, across warps too
# (block_y_reduce), across several blocks per output (global reduce), with
# vectorized loads past 128 contiguous inputs; the outputs across lanes when
# the reduced dimension is not the contiguous one) and of the softmax kernels
# (the persistent warp softmax up to 1024 elements, the block softmax past
# it), and the end-to-end scenarios' reductions (the MLP: batch 64, 32 -> 64
# -> 10; the transformer: 16 x 8 tokens x 32, 2 heads, 4 classes). Leaves:
# "all", or [first, stride, last]: the first ``first`` indices, every
# ``stride``-th one and the last ``last`` (zeros elsewhere).
FPREV_CASES = (
    ("sum", "float32", (10,), None, "contiguous", "all"),
    ("sum", "float32", (100,), None, "contiguous", "all"),
    ("sum", "float32", (1024,), None, "contiguous", "all"),
    ("sum", "float32", (4096,), None, "contiguous", "all"),
    ("sum", "float32", (65536,), None, "contiguous", [256, 256, 0]),
    ("sum", "float32", (1 << 20,), None, "contiguous", [256, 4096, 64]),
    ("sum", "float32", (64, 32), -1, "contiguous", "all"),
    ("sum", "float32", (64, 1024), -1, "contiguous", "all"),
    ("sum", "float32", (8, 8192), -1, "contiguous", [512, 16, 0]),
    ("sum", "float32", (2, 1 << 18), -1, "contiguous", [256, 1024, 64]),
    ("sum", "float32", (64, 10), 0, "contiguous", "all"),
    ("sum", "float32", (64, 64), 0, "contiguous", "all"),
    ("sum", "float32", (128, 32), 0, "contiguous", "all"),
    ("sum", "float32", (4096, 32), 0, "contiguous", [256, 16, 0]),
    ("sum", "float32", (1 << 16, 4), 0, "contiguous", [256, 256, 0]),
    ("sum", "float32", (16, 8, 32), 1, "contiguous", "all"),
    ("sum", "float32", (64, 32), -1, "transposed", "all"),
    ("sum", "float32", (64, 1024), -1, "transposed", "all"),
    ("mean", "float32", (64, 32), -1, "contiguous", "all"),
    ("mean", "float32", (16, 8, 32), 1, "contiguous", "all"),
    ("mean", "float32", (4096,), None, "contiguous", [256, 16, 0]),
    ("sum", "bfloat16", (4096,), None, "contiguous", [0, 16, 0]),
    ("sum", "bfloat16", (64, 1024), -1, "contiguous", [0, 4, 0]),
    ("sum", "bfloat16", (64, 10), 0, "contiguous", "all"),
    ("sum_f32", "bfloat16", (4096,), None, "contiguous", [256, 16, 0]),
    ("sum", "float16", (64, 1024), -1, "contiguous", "all"),
    ("sum", "float16", (65536,), None, "contiguous", [512, 128, 0]),
    ("sum_f32", "float16", (64, 1024), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (64, 10), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (256, 8), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (64, 32), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (64, 1024), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (16, 2048), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (8, 4096), -1, "contiguous", [1024, 4, 0]),
    ("log_softmax_bwd", "float32", (64, 10), -1, "contiguous", "all"),
    ("log_softmax_bwd", "float32", (16, 4), -1, "contiguous", "all"),
    ("log_softmax_bwd", "float32", (64, 1024), -1, "contiguous", "all"),
    ("log_softmax_bwd", "float32", (16, 2048), -1, "contiguous", "all"),
    ("softmax_bwd", "bfloat16", (256, 8), -1, "contiguous", "all"),
    ("softmax_bwd", "bfloat16", (64, 256), -1, "contiguous", "all"),
    ("nll_loss", "float32", (64, 10), None, "contiguous", "all"),
    ("nll_loss", "float32", (16, 4), None, "contiguous", "all"),
    ("nll_loss", "float32", (1024, 10), None, "contiguous", "all"),
    ("nll_loss", "bfloat16", (64, 10), None, "contiguous", "all"),
)
FPREV_CASES_SMALL = (
    ("sum", "float32", (100,), None, "contiguous", "all"),
    ("sum", "float32", (4096,), None, "contiguous", [64, 256, 8]),
    ("sum", "float32", (64, 32), -1, "contiguous", "all"),
    ("sum", "float32", (64, 10), 0, "contiguous", "all"),
    ("sum", "float32", (64, 32), -1, "transposed", "all"),
    ("mean", "float32", (16, 8, 32), 1, "contiguous", "all"),
    ("sum", "bfloat16", (64, 1024), -1, "contiguous", [0, 16, 0]),
    ("sum_f32", "float16", (64, 128), -1, "contiguous", "all"),
    ("softmax_bwd", "float32", (64, 10), -1, "contiguous", "all"),
    ("log_softmax_bwd", "float32", (16, 32), -1, "contiguous", "all"),
    ("nll_loss", "float32", (64, 10), None, "contiguous", "all"),
)
# random inputs, forward and backward, compared with fpemu: (op, dtype, shape, dim, layout)
VALUE_CASES = tuple(
    [(op, dt, s, d, "contiguous") for op in ("sum", "mean") for dt in ("float32", "bfloat16",
                                                                       "float16")
     for s, d in (((64, 32), -1), ((64, 1024), -1), ((8, 8192), -1), ((64, 10), 0),
                  ((4096, 32), 0), ((16, 8, 32), 1), ((1 << 16,), None))]
    + [("sum", "float32", (64, 1024), -1, "transposed"), ("sum", "float32", (1 << 20,), None,
                                                          "contiguous")]
    + [("vector_norm", "float32", s, d, "contiguous")
       for s, d in (((1 << 16,), None), ((64, 256), -1), ((64, 10), 0))]
    + [("vector_norm", "bfloat16", (1 << 14,), None, "contiguous")]
    + [(op, "float32", s, -1, "contiguous") for op in ("softmax", "log_softmax")
       for s in ((64, 10), (256, 8), (64, 1024), (16, 2048), (4, 4096))]
    + [(op, dt, s, -1, "contiguous") for op in ("softmax", "log_softmax")
       for dt in ("bfloat16", "float16") for s in ((64, 10), (256, 8), (4, 2048))]
    + [("layer_norm", "float32", s, -1, "contiguous") for s in ((128, 32), (16, 1024), (4, 4096))]
    + [("layer_norm", dt, (128, 32), -1, "contiguous") for dt in ("bfloat16", "float16")]
    + [(op, dt, s, None, "contiguous") for op in ("nll_loss", "cross_entropy")
       for dt in ("float32", "bfloat16", "float16") for s in ((64, 10), (16, 4))]
    + [("cross_entropy", "float32", (32, 1000), None, "contiguous")])
VALUE_CASES_SMALL = (
    ("sum", "float32", (64, 32), -1, "contiguous"), ("mean", "bfloat16", (16, 8, 32), 1,
                                                     "contiguous"),
    ("vector_norm", "float32", (64, 10), 0, "contiguous"),
    ("softmax", "float32", (64, 10), -1, "contiguous"),
    ("log_softmax", "float16", (256, 8), -1, "contiguous"),
    ("layer_norm", "bfloat16", (128, 32), -1, "contiguous"),
    ("cross_entropy", "float32", (16, 4), None, "contiguous"),
    ("nll_loss", "bfloat16", (64, 10), None, "contiguous"))
FPREV_MAX_PROBES = 40000        # per case: a tree this script cannot rebuild stops there


def reductions_cases(small):
    cases = []
    for op, dt, shape, dim, layout, lv in (FPREV_CASES_SMALL if small else FPREV_CASES):
        cases.append(dict(kind="fprev", op=op, dtype=dt, shape=list(shape), dim=dim,
                          layout=layout, leaves=lv))
    for op, dt, shape, dim, layout in (VALUE_CASES_SMALL if small else VALUE_CASES):
        cases.append(dict(kind="values", op=op, dtype=dt, shape=list(shape), dim=dim,
                          layout=layout))
    for i, c in enumerate(cases):
        lv = c.get("leaves", "all")
        c["seed"] = 9000 + i
        c["id"] = (f"{c['kind']}-{c['op']}-{c['dtype']}-{'x'.join(map(str, c['shape']))}"
                   f"-dim{'all' if c['dim'] is None else c['dim']}"
                   f"{'-t' if c['layout'] == 'transposed' else ''}"
                   f"{'' if lv == 'all' else '-leaves' + '.'.join(map(str, lv))}")
    return cases


class FPRevLayout:
    """Where a FPRev probe's values go: the fibers (one per output) of the
    reduced dimension as flat indices into the stored buffer, the probed
    leaves, the unit and the big value."""

    def __init__(self, case):
        self.case = case
        shape, dim, op = tuple(case["shape"]), case["dim"], case["op"]
        if case["layout"] == "transposed":
            if len(shape) != 2:
                raise ValueError(f"{case['id']}: a transposed layout needs a 2-D shape")
            self.store = shape[::-1]
            index = np.arange(int(np.prod(shape))).reshape(self.store).T
        else:
            self.store = shape
            index = np.arange(int(np.prod(shape))).reshape(shape)
        if op == "nll_loss":        # the fiber: (b, target[b]) over the batch
            N, C = shape
            self.target = np.arange(N) % C
            fibers = index[np.arange(N), self.target][None, :]
        elif dim is None:
            fibers = index.reshape(1, -1)
        else:
            fibers = np.moveaxis(index, dim, -1).reshape(-1, shape[dim])
        self.fibers = fibers
        self.R, self.n = fibers.shape
        lv = case["leaves"]
        if lv == "all":
            ids = list(range(self.n))
        else:
            first, stride, last = lv
            ids = sorted(set(range(min(first, self.n))) | set(range(0, self.n, stride))
                         | set(range(max(self.n - last, 0), self.n)))
        self.leaves = ids
        import fprev
        self.u, self.M = fprev.unit_and_big(case["dtype"], len(ids))
        if case["op"] in ("nll_loss",):
            self.sign = -1.0        # the loss is -x[b, target]: units of -u
        else:
            self.sign = 1.0

    def storage(self, batch):
        """The stored buffer's values (float32, flat) for probes ``batch``:
        [(fiber, i, j)]: units at every fiber's leaves, +M at i and -M at j of
        each probe's fiber."""
        buf = np.zeros(int(np.prod(self.store)), np.float32)
        buf[self.fibers[:, self.leaves].ravel()] = self.sign * self.u
        for r, i, j in batch:
            buf[self.fibers[r, i]] = self.sign * self.M
            buf[self.fibers[r, j]] = -self.sign * self.M
        return buf

    def decode_position(self, i, j):
        """A position of the fiber, not i or j, whose output says the count."""
        for k in (self.leaves[:3] + [0, 1, 2]):
            if k not in (i, j):
                return k
        raise ValueError("a fiber of fewer than three elements")

    def size_of(self, raw, i, j):
        """L(i, j) from a probe's raw outputs (float64 pair: the value read,
        and for softmax the forward output at the decode position)."""
        import fprev
        op, u, n = self.case["op"], self.u, len(self.leaves)
        v, aux = float(raw[0]), float(raw[1])
        if op in ("sum", "sum_f32"):
            s = v
        elif op == "mean":
            s = v * self.n
        elif op == "nll_loss":
            s = v * self.n
        else:
            k = self.decode_position(i, j)
            gk = u if k in self.leaves else 0.0
            if op == "softmax_bwd":             # gi_k = y_k (g_k - sum(g y)); all y equal
                s = (gk - v / aux) / aux if aux else math.nan
            else:                               # log_softmax: gi_k = g_k - exp(out_k) sum(g)
                s = (gk - v) / math.exp(aux)
        return fprev.count_from_sum(s, u, n)


def _fprev_runner(lib, lay, device=None):
    """run(batch) -> float64 array (len(batch), 2) of raw outputs, with torch
    (in place on the device) or fpemu.autograd (``lib``)."""
    case = lay.case
    dt = getattr(lib, case["dtype"])
    op, dim, shape = case["op"], case["dim"], tuple(case["shape"])
    is_torch = device is not None
    import torch            # the CPU tensors the inputs are made as; lib computes

    def tensor(buf):
        t = torch.from_numpy(buf)
        if is_torch:
            return t.to(device).to(dt)
        return lib.nn.from_torch(t.to(getattr(torch, case["dtype"])))

    def view(buf_t):
        X = buf_t.reshape(lay.store)
        return X.t() if case["layout"] == "transposed" else X

    if op in ("softmax_bwd", "log_softmax_bwd") and dim != -1:
        raise ValueError(f"{case['id']}: softmax probes reduce the last dimension (dim=-1)")
    if op in ("softmax_bwd", "log_softmax_bwd"):
        zeros = tensor(np.zeros(int(np.prod(lay.store)), np.float32))
        if is_torch:
            f = torch.softmax if op == "softmax_bwd" else torch.log_softmax
            Y = f(view(zeros), dim)
        else:
            fwd = lib.nn.functional.softmax if op == "softmax_bwd" else \
                lib.nn.functional.log_softmax
    target = None
    if op == "nll_loss":
        tt = torch.from_numpy(lay.target.astype(np.int64))
        target = tt.to(device) if is_torch else lib.nn.from_torch(tt)

    def launch(buf_t):
        """(a, b): per fiber the value read, and the forward output at the
        decode positions' fiber (softmax), as (R,) or (R, n) tensors."""
        X = view(buf_t)
        if op in ("sum", "mean", "sum_f32"):
            kw = {"dtype": lib.float32} if op == "sum_f32" else {}
            f = lib.sum if op != "mean" else lib.mean
            out = f(X, **kw) if dim is None else f(X, dim, **kw)
            return out.reshape(-1), None
        if op == "nll_loss":
            return lib.nn.functional.nll_loss(X, target).reshape(-1), None
        if is_torch:
            back = (torch._softmax_backward_data if op == "softmax_bwd"
                    else torch._log_softmax_backward_data)
            gi, Yf = back(X, Y, dim, dt), Y
        else:
            x0 = lib.nn.from_torch(torch.zeros(shape)).to(dt).requires_grad_()
            Yf = fwd(x0, dim)
            Yf.backward(X)
            gi = x0.grad
        return gi.reshape(lay.R, lay.n), Yf.detach().reshape(lay.R, lay.n)

    def pick(a, b, batch):
        rs = [r for r, _, _ in batch]
        if b is None:
            return a[rs], a[rs]
        ks = [lay.decode_position(i, j) for _, i, j in batch]
        return a[rs, ks], b[rs, ks]

    def run(batch):
        if is_torch:
            if not hasattr(run, "buf"):
                run.buf = tensor(lay.storage([]))
            buf_t = run.buf
            idx = [int(lay.fibers[r, i]) for r, i, _ in batch] + \
                  [int(lay.fibers[r, j]) for r, _, j in batch]
            it = torch.tensor(idx, device=device)
            vals = torch.tensor([lay.sign * lay.M] * len(batch) + [-lay.sign * lay.M] * len(batch),
                                device=device, dtype=dt)
            buf_t.index_put_((it,), vals)
            a, b = pick(*launch(buf_t), batch)
            buf_t.index_put_((it,), torch.full_like(vals, lay.sign * lay.u))
            return torch.stack([a.float(), b.float()], 1)
        a, b = launch(tensor(lay.storage(batch)))
        a = a.float().numpy()
        b = None if b is None else b.float().numpy()
        a, b = pick(a, b, batch)
        return np.stack([a, b], 1)
    return run


def _fprev_batches(lay, pairs):
    """The probes (i, j) dealt to the fibers: one per fiber a launch."""
    batches, cur = [], []
    for i, j in pairs:
        cur.append((len(cur), i, j))
        if len(cur) == lay.R:
            batches.append(cur)
            cur = []
    if cur:
        batches.append(cur)
    return batches


def _fprev_record(torch, case, device):
    """Reveal the case's tree on the device: the probes and their raw
    outputs, and the tree's description (or why none)."""
    import fprev
    lay = FPRevLayout(case)
    run = _fprev_runner(torch, lay, device)
    rec_pairs, rec_raw = [], []

    def probe(pairs):
        outs = [run(batch) for batch in _fprev_batches(lay, pairs)]
        raw = torch.cat(outs).cpu().numpy().astype(np.float32)
        rec_pairs.extend(pairs)             # all of the round's, kept if one does not decode
        rec_raw.extend(raw)
        return [lay.size_of(r, i, j) for (i, j), r in zip(pairs, raw)]
    extra = {"leaf_count": len(lay.leaves), "outputs": lay.R, "n": lay.n, "u": lay.u,
             "M": lay.M}
    try:
        tree, _ = fprev.reveal(probe, lay.leaves, max_probes=FPREV_MAX_PROBES)
        extra["tree_lines"] = fprev.describe(tree)
    except (fprev.Inconsistent, RuntimeError) as err:
        extra["tree_error"] = str(err)[:400]
    arrays = {"pairs": np.asarray(rec_pairs, np.int32).reshape(-1, 2),
              "raw": np.asarray(rec_raw, np.float32).reshape(-1, 2).view(np.uint32)}
    extra["probes"] = len(rec_pairs)
    return hashlib.sha256(json.dumps(case, sort_keys=True).encode()).hexdigest(), arrays, extra


def _value_inputs(torch, case):
    rng = np.random.default_rng(case["seed"])
    shape, op = tuple(case["shape"]), case["op"]
    dt = getattr(torch, case["dtype"])
    store = shape[::-1] if case["layout"] == "transposed" else shape
    ins = {"x": torch.from_numpy(_operand(rng, store, zeros=0.0)).to(dt)}
    out_shape = None
    if op in ("softmax", "log_softmax", "layer_norm"):
        out_shape = shape
    if op == "layer_norm":
        ins["w"] = torch.from_numpy(rng.uniform(0.5, 2, shape[-1]).astype(np.float32)).to(dt)
        ins["b"] = torch.from_numpy(rng.standard_normal(shape[-1]).astype(np.float32)).to(dt)
    if op in ("nll_loss", "cross_entropy"):
        ins["target"] = torch.from_numpy(rng.integers(0, shape[1], shape[0]).astype(np.int64))
        out_shape = ()
    if op in ("sum", "mean", "vector_norm"):
        d = case["dim"]
        out_shape = () if d is None else tuple(s for k, s in enumerate(shape)
                                               if k != d % len(shape))
    g = rng.standard_normal(out_shape).astype(np.float32)
    ins["g"] = torch.from_numpy(np.asarray(g)).to(dt)
    return ins


def _value_autograd(lib, case, ins, device=None):
    F = lib.nn.functional
    conv = ((lambda t: t.to(device)) if device is not None else lib.nn.from_torch)
    t = {k: conv(v) for k, v in ins.items()}
    leaves = [k for k in ("x", "w", "b") if k in t]
    for k in leaves:
        t[k].requires_grad_()
    x = t["x"].t() if case["layout"] == "transposed" else t["x"]
    op, d = case["op"], case["dim"]
    if op in ("sum", "mean"):
        f = lib.sum if op == "sum" else lib.mean
        y = f(x) if d is None else f(x, d)
    elif op == "vector_norm":
        y = lib.linalg.vector_norm(x) if d is None else lib.linalg.vector_norm(x, dim=d)
    elif op in ("softmax", "log_softmax"):
        y = getattr(F, op)(x, d)
    elif op == "layer_norm":
        y = F.layer_norm(x, (x.shape[-1],), t["w"], t["b"])
    else:
        y = getattr(F, op)(x, t["target"])
    y.backward(t["g"])
    out = {"out": y.detach()}
    out.update({f"d{k}": t[k].grad for k in leaves})
    return out


def _values_record(torch, case, device):
    ins = _value_inputs(torch, case)
    res = _value_autograd(torch, case, ins, device)
    if device == "cuda":
        torch.cuda.synchronize()
    return _digest(ins), {k: _bits32(torch, v) for k, v in res.items()}, {}


def run_reductions(torch, case, device):
    if case["kind"] == "fprev":
        return _fprev_record(torch, case, device)
    return _values_record(torch, case, device)


def fit_reductions(torch, entry, arrays, ctx):
    import fpemu.autograd as ft
    import fprev
    if entry["kind"] == "values":
        ins = _value_inputs(torch, entry)
        _same_inputs(entry, ins)
        with ft.use_profile(_profile(ctx)):
            ours = _value_autograd(ft, entry, ins)
        return {"fpemu": {k: _compare(arrays[k], ours[k].float().numpy(), entry["dtype"])
                          for k in sorted(arrays)}}
    lay = FPRevLayout(entry)
    pairs = [tuple(map(int, p)) for p in arrays["pairs"]]
    raw = arrays["raw"].view(np.float32)
    res = {"probes": len(pairs)}
    try:
        sizes = [lay.size_of(r, i, j) for (i, j), r in zip(pairs, raw)]
        known = dict(zip(pairs, sizes))

        def refuse(p):
            raise fprev.Inconsistent(f"the recorded probes do not settle the tree ({len(p)} "
                                     "more pairs wanted): the recording stopped early")
        tree, _ = fprev.reveal(refuse, lay.leaves, known=known)
        res["tree"] = fprev.describe(tree)
    except fprev.Inconsistent as err:
        res["tree_error"] = str(err)[:400]
        return res
    if ctx["small"] and len(pairs) > 400:
        return res                  # the dry run: fpemu on the smaller cases only
    run = _fprev_runner(ft, lay)
    same = 0
    with ft.use_profile(_profile(ctx)):
        for batch in _fprev_batches(lay, pairs):
            got = run(batch)
            for (_, i, j), r in zip(batch, got):
                try:
                    ok = lay.size_of(r, i, j) == known[(i, j)]
                except fprev.Inconsistent:
                    ok = False
                same += ok
    res["fpemu_same_size"] = same
    return res


def _reductions_summary(fits, meta):
    lines = []
    trees = {k: v for k, v in fits.items() if "probes" in v}
    ok = [k for k, v in trees.items() if "tree" in v]
    lines.append(f"FPRev: {len(ok)} of {len(trees)} summation trees rebuilt from "
                 f"{sum(v['probes'] for v in trees.values())} probes")
    for cid, v in sorted(trees.items()):
        if "tree" in v:
            head = (f"- {cid}: " + v["tree"][0] + (
                f"; fpemu gives the same subtree size on {v['fpemu_same_size']} of "
                f"{v['probes']} probes" if "fpemu_same_size" in v else ""))
            lines += [head] + [f"    {t.strip()}" for t in v["tree"][1:3]]
        else:
            lines.append(f"- {cid}: no tree ({v.get('tree_error', v.get('error', '?'))[:200]})")
    values = {k: v for k, v in fits.items() if "probes" not in v}
    agree = sum(all(c["equal"] == c["n"] for c in v.get("fpemu", {}).values()) and "fpemu" in v
                for v in values.values())
    lines.append(f"random inputs: fpemu.autograd reproduces {agree} of {len(values)} probes bit "
                 "for bit (forward and every gradient)")
    return lines + _fp_cmp_lines(values)


def step_reductions(run):
    return _probe_step(run, "reductions", reductions_cases(run.probes("reductions")[3]["small"]),
                       run_reductions, fit_reductions, _reductions_summary)


# ----------------------------------------------------------------- libm
LIBM_FUNCS = ("exp", "log", "tanh", "erf", "sigmoid", "gelu", "rsqrt")


def libm_cases(small):
    """Every function on every bf16 and fp16 input (65,536 each: float32
    opmath, one rounding to the dtype) and on float32 inputs (the 16-bit
    values widened, random ones and each binade's edges)."""
    cases = []
    for fn in (LIBM_FUNCS[:2] if small else LIBM_FUNCS):
        for dt in ("bfloat16", "float16", "float32"):
            cases.append(dict(fn=fn, dtype=dt, id=f"{fn}-{dt}", seed=11000))
    return cases


def libm_inputs(torch, case, small=False):
    """The probe's inputs as a CPU tensor of its dtype."""
    if case["dtype"] != "float32":
        codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.int16)
        t = torch.from_numpy(codes.copy()).view(getattr(torch, case["dtype"]))
        return t[:4096] if small else t
    rng = np.random.default_rng(case["seed"])
    parts = [np.arange(1 << 16, dtype=np.uint32) << 16,                        # bf16 values
             np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
             .astype(np.float32).view(np.uint32),                             # fp16 values
             rng.integers(0, 1 << 32, 1 << 15, dtype=np.uint64).astype(np.uint32),
             (rng.standard_normal(1 << 15) * 4).astype(np.float32).view(np.uint32)]
    edges = []
    for sign in (0, 1 << 31):
        for e in range(256):
            for m in (0, 1, 2, 1 << 22, (1 << 23) - 2, (1 << 23) - 1):
                edges.append(sign | (e << 23) | m)
    parts.append(np.array(edges, np.uint32))
    bits = np.concatenate(parts)
    if small:
        bits = bits[::64]
    return torch.from_numpy(bits.view(np.float32).copy())


def _libm_apply(lib, fn, x):
    if fn == "gelu":
        return lib.nn.functional.gelu(x)
    return getattr(lib, fn)(x)


def run_libm(torch, case, device):
    x = libm_inputs(torch, case, case.get("small", False))
    y = _libm_apply(torch, case["fn"], x.to(device))
    if device == "cuda":
        torch.cuda.synchronize()
    y = y.cpu()
    if case["dtype"] == "float32":
        out = y.numpy().view(np.uint32).copy()
    else:
        out = y.view(torch.int16).numpy().view(np.uint16).copy()
    return _digest({"x": x}), {"out": out}, {"inputs": int(x.numel())}


def fit_libm(torch, entry, arrays, ctx):
    import fpemu.autograd as ft
    x = libm_inputs(torch, entry, entry.get("small", False))
    _same_inputs(entry, {"x": x})
    with ft.use_profile(_profile(ctx)):
        y = _libm_apply(ft, entry["fn"], ft.nn.from_torch(x)).float().numpy()
    out = arrays["out"]
    if entry["dtype"] == "float32":
        rec = out
    elif entry["dtype"] == "bfloat16":
        rec = out.astype(np.uint32) << 16
    else:
        rec = out.view(np.float16).astype(np.float32).view(np.uint32)
    res = {"fpemu": {"out": _compare(rec, y, entry["dtype"])}}
    # the correctly rounded value (float64 of torch's CPU kernels, rounded once), for scale
    xd = x.double()
    ref = _libm_apply(torch, entry["fn"], xd).to(x.dtype).float().numpy()
    res["correctly_rounded"] = _compare(rec, ref, entry["dtype"])
    return res


def _libm_summary(fits, meta):
    lines = []
    for cid, v in sorted(fits.items()):
        if "error" in v:
            lines.append(f"- {cid}: {v['error']}")
            continue
        f, c = v["fpemu"]["out"], v["correctly_rounded"]
        lines.append(f"- {cid}: fpemu {f['equal']}/{f['n']} equal (max {f['max_ulps']} ulps); "
                     f"the float64 value rounded once: {c['equal']}/{c['n']} (max "
                     f"{c['max_ulps']} ulps)")
    return lines


def step_libm(run):
    small = run.probes("libm")[3]["small"]
    cases = [dict(c, small=small) for c in libm_cases(small)]
    return _probe_step(run, "libm", cases, run_libm, fit_libm, _libm_summary)


# --------------------------------------------------------------- triton
def step_triton(run):
    import importlib.util
    if importlib.util.find_spec("fpemu.torch._triton") is None:
        return {"status": "done", "lines": ["fpemu has no Triton kernels yet (the device-speed "
                                            "issue): nothing to check"]}
    cmd = [sys.executable, os.path.join(ROOT, "bench", "triton_check.py"), "--out", run.out]
    if run.args.small:           # the dry run: the interpreter's timings mean nothing, one each
        cmd += ["--small", "--repeats", "1"]
    return _subprocess_step(run, cmd, "triton")


# ------------------------------------------------------ existing scripts
def _have_data(pattern):
    data = os.path.join(ROOT, "tests", "data")
    return sorted(f for f in os.listdir(data) if re.fullmatch(pattern, f))


def _subprocess_step(run, cmd, name):
    t0 = time.monotonic()
    timeout = max(5, int(run.left()))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"status": "partial", "lines": [f"{' '.join(cmd[1:])}: stopped at the budget "
                                               f"after {timeout} s"]}
    with open(run.path(f"{name}.log"), "w") as fh:
        fh.write(p.stdout + p.stderr)
    status = "done" if p.returncode == 0 else "failed"
    tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
    shown = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:])
    return {"status": status,
            "lines": [f"`{shown}` exit {p.returncode} in {time.monotonic() - t0:.0f} s"]
            + [f"    {t}" for t in tail]}


def step_casts(run):
    torch = run.torch
    cuda = (torch.version.cuda or "none")
    if not run.args.host:
        gpu = slug(torch.cuda.get_device_name(0)).split("-")[1]
        if _have_data(rf"cuda_casts_{gpu}.*_cuda{re.escape(cuda)}\.json"):
            return {"status": "done", "lines": [f"committed data cover {gpu} with CUDA {cuda}: "
                                                "not run"]}
        cmd = [sys.executable, os.path.join(ROOT, "bench", "cuda_casts.py"),
               "--out", os.path.join(run.out, "casts"), "--sweep-seconds", "60"]
    else:
        cmd = [sys.executable, os.path.join(ROOT, "bench", "cuda_casts.py"), "--host",
               "--out", os.path.join(run.out, "casts"), "--sweep-seconds", "0",
               "--only", "torch bfloat16", "--device-sweep-stop", str(1 << 16)]
    return _subprocess_step(run, cmd, "casts")


def step_cuda_checks(run):
    torch = run.torch
    release = torch.__version__.split("+")[0]
    target = os.path.join(run.out, "cuda_checks.md")
    if not run.args.host:
        doc = open(os.path.join(ROOT, "docs", "pytorch-numerics.md")).read()
        gpu = torch.cuda.get_device_name(0).replace("NVIDIA ", "")
        if f"torch {release}" in doc and gpu in doc:
            return {"status": "done", "lines": [f"docs/pytorch-numerics.md §13 covers torch "
                                                f"{release} on this GPU: not run"]}
    cmd = [sys.executable, os.path.join(ROOT, "bench", "cuda_checks.py"), "--out", target,
           "--device", run.device]
    return _subprocess_step(run, cmd, "cuda_checks")


def step_torch_checks(run):
    if run.args.host:
        return {"status": "done", "lines": ["bench/torch_cuda_checks.py needs a CUDA device "
                                            "(its CPU half runs in tests/test_torch_quantize.py)"]}
    cmd = [sys.executable, os.path.join(ROOT, "bench", "torch_cuda_checks.py"),
           "--out", os.path.join(run.out, "torch_checks"), "--exhaustive-seconds", "60"]
    return _subprocess_step(run, cmd, "torch_checks")


STEP_FUNCS = {"env": step_env, "traces": step_traces, "gemm": step_gemm,
              "attention": step_attention, "sgemm": step_sgemm, "gemm16": step_gemm16,
              "reductions": step_reductions, "e2e_ops": step_e2e_ops, "libm": step_libm,
              "triton": step_triton,
              "casts": step_casts,
              "cuda_checks": step_cuda_checks, "torch_checks": step_torch_checks}


# ---------------------------------------------------------------- main
def write_summary(run):
    env = run.env()
    lines = [f"# gpu-check: {run.tag}", "",
             f"{env.get('gpu', '?')}; torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, "
             f"driver {env.get('driver', '-')}; {env.get('date', '')}"
             + (" (host dry run: CPU torch stands in)" if env.get("host") else ""), ""]
    for name in STEPS:
        st = run.state.get(name)
        if st is None:
            lines += [f"## {name}: not run", ""]
            continue
        lines += [f"## {name}: {st['status']} ({st.get('seconds', 0):.0f} s)", ""]
        lines += st.get("lines", []) + [""]
    with open(run.path("summary.md"), "w") as fh:
        fh.write("\n".join(lines))


def _budget(text):
    """--budget-seconds: a finite number of seconds, 0 or more (float()
    alone takes -5, nan and inf, and the run then went on)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds, 0 or more (0 skips every step), got "
            f"{text!r}; e.g. --budget-seconds 480, the default")
    return value


def _step_list(ap, option, text, empty_ok):
    """The steps named in a comma-separated --steps or --redo."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names and not empty_ok:
        ap.error(f"argument {option}: expected a comma-separated list of steps, got {text!r}; "
                 f"the steps are {', '.join(STEPS)} (leave {option} out to run them all)")
    unknown = [s for s in names if s not in STEPS]
    if unknown:
        ap.error(f"argument {option}: unknown step(s) {', '.join(unknown)} in {text!r}; "
                 f"the steps are {', '.join(STEPS)}")
    return names


def _writable_folder(ap, option, path):
    """Make the folder ``path`` if missing and check that a file can be
    written in it (os.access says yes to root where the filesystem says no)."""
    if path == "":
        ap.error(f"argument {option}: expected a folder, got ''; pass a folder's path "
                 "(it is made if missing)")
    if os.path.exists(path) and not os.path.isdir(path):
        ap.error(f"argument {option}: expected a folder, got {path!r}, which is a file; pass "
                 "a folder (it is made if missing)")
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        ap.error(f"argument {option}: expected a folder this script can write in, got {path!r}: "
                 f"{err.strerror or err}; pass a writable folder")


def _recorded_folder(ap, args):
    """--fit's folder: one a GPU run recorded probes in, fitted in place."""
    ignored = [f"{o} {v!r}" for o, v in (("--out", args.out), ("--steps", args.steps),
                                         ("--redo", args.redo)) if v is not None]
    if ignored:
        ap.error(f"argument --fit: fits the recorded probes of its folder in place, "
                 f"so {' and '.join(ignored)} would be ignored; drop "
                 f"{' and '.join(i.split()[0] for i in ignored)}")
    folder = args.fit
    what = ("the folder a GPU run of this script recorded (bench/gpu_check/<gpu>-torch<version>, "
            "unpacked from the run's tarball)")
    if not os.path.isdir(folder):
        ap.error(f"argument --fit: expected {what}, got {folder!r}, which "
                 + ("is not a folder" if os.path.exists(folder) else "does not exist"))
    if not any(os.path.isfile(os.path.join(folder, f"{step}.{ext}"))
               for step in PROBE_STEPS for ext in ("json", "npz")):
        ap.error(f"argument --fit: expected {what}, got {folder!r}, which holds no recorded "
                 "probes (no " + ", ".join(f"{s}.json" for s in PROBE_STEPS) + " or their .npz)")
    if not any(os.path.isfile(os.path.join(folder, f"{step}.json")) for step in PROBE_STEPS):
        ap.error(f"argument --fit: {folder!r} holds probe arrays but no record of them (no "
                 + ", ".join(f"{s}.json" for s in PROBE_STEPS) + "); bring the folder back "
                 "from the GPU run again")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        ap.error(f"argument --fit: expected a folder this script can write in (the fit writes "
                 f"its results there), got {folder!r}: {err.strerror or err}; copy it "
                 "somewhere writable")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results folder, made if missing (default "
                    "bench/gpu_check/<device>-torch<v>; with --host out/gpu_check/...)")
    ap.add_argument("--budget-seconds", type=_budget, default=480.0,
                    help="seconds to spend, 0 or more (default 480)")
    ap.add_argument("--host", action="store_true", help="run on the CPU, CPU torch standing in")
    ap.add_argument("--small", action="store_true", help="small sizes (the dry run)")
    ap.add_argument("--steps", help="comma-separated steps to run, always in the order "
                    f"{', '.join(STEPS)} (default: all)")
    ap.add_argument("--redo", help="comma-separated steps of --steps to run again though done")
    ap.add_argument("--traces-root", default=os.path.join(ROOT, "tests", "reference"),
                    help="the trace folders' folder, for the traces step (default "
                    "tests/reference)")
    ap.add_argument("--fit-on-device", action="store_true",
                    help="fit fpemu's models on the GPU machine too (default: record there, "
                         "fit on the host with --fit: the fit needs no GPU)")
    ap.add_argument("--fit", metavar="DIR",
                    help="on the host: fit fpemu's models to every probe step "
                         "recorded in DIR (no recording; --out, --steps and --redo do not apply)")
    args = ap.parse_args(argv)
    # every argument is checked here, before torch is imported and anything is
    # written: a bad one is refused in argparse's way (usage, the message, exit 2)
    if args.fit is not None:
        _recorded_folder(ap, args)
        # the probe steps the folder holds a record of, fitted again
        held = ",".join(s for s in PROBE_STEPS
                        if os.path.isfile(os.path.join(args.fit, f"{s}.json")))
        args.host, args.redo, args.steps = True, held, held
    steps = _step_list(ap, "--steps", ",".join(STEPS) if args.steps is None else args.steps,
                       empty_ok=False)
    redo = _step_list(ap, "--redo", args.redo or "", empty_ok=True)
    if set(redo) - set(steps):
        ap.error(f"argument --redo: {', '.join(repr(s) for s in redo if s not in steps)} not "
                 f"in --steps {','.join(steps)!r}, so not run; add it to --steps or leave "
                 "--steps out")
    args.redo = ",".join(redo)
    if args.out is not None:
        _writable_folder(ap, "--out", args.out)
    if "traces" in steps and args.fit is None:
        _writable_folder(ap, "--traces-root", args.traces_root)
    try:
        if args.out is not None or args.fit is not None:
            load_state(os.path.join(args.fit or args.out, "state.json"), bool(args.fit))
        return _run(args, steps)
    except BadFile as err:
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        return 1


def _run(args, steps):
    import torch
    if not args.host and not torch.cuda.is_available():
        sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device; run on a GPU "
                 "machine, or pass --host for the dry run on the CPU")
    run = Run(args, torch)
    cost = HOST_COST if args.host else COST
    run.log(f"gpu-check {run.tag}: results in {run.out}, budget {args.budget_seconds:.0f} s")
    for name in STEPS:
        if name not in steps:
            continue
        prev = run.state.get(name)
        if prev and prev["status"] == "done" and name not in args.redo.split(","):
            run.log(f"{name}: done in an earlier run (--redo {name} runs it again)")
            continue
        if run.left() < cost[name] * (0.2 if args.small else 1):
            run.state[name] = {"status": "skipped", "seconds": 0,
                               "lines": [f"not started: {run.left():.0f} s of the budget left, "
                                         f"the step takes about {cost[name]} s"]}
            run.log(f"{name}: skipped (budget)")
            run.save()
            continue
        t0 = time.monotonic()
        try:
            res = STEP_FUNCS[name](run)
        except BadFile as err:              # a damaged record: its message is enough
            res = {"status": "failed", "lines": [str(err)]}
        except Exception as err:                              # noqa: BLE001
            res = {"status": "failed", "lines": [f"{type(err).__name__}: {err}"]
                   + traceback.format_exc().strip().splitlines()[-6:]}
        res["seconds"] = time.monotonic() - t0
        run.state[name] = res
        run.save()
        write_summary(run)
        run.log(f"{name}: {res['status']} in {res['seconds']:.1f} s")
        for line in res.get("lines", [])[:12]:
            run.log(f"    {line}")
    write_summary(run)
    failed = [n for n in steps if run.state.get(n, {}).get("status") == "failed"]
    run.log(f"summary: {run.path('summary.md')}" + (f"; failed: {', '.join(failed)}"
                                                    if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
