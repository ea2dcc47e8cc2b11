"""Compile fpemu's common kernels ahead of use, into Numba's on-disk cache.

Every kernel is compiled on its first call and then loaded from the cache
(``docs/performance.md``). With an empty cache a new user pays the compiler
in their first cells: about half a second for each (operation, format
family, rounding mode), once for small arrays and once more for large ones,
and about 3 s for the first training step of the README's MLP
(``bench/bench_startup.py``). :func:`warmup` runs the common set once so
that those calls load instead:

* ``quantize`` and ``encode`` in every rounding mode, for one format of each
  family that has kernels of its own (IEEE-style with inf: bf16, fp16, e5m2
  and the like; saturating or NaN-only: e4m3fn and the MX element formats;
  fnuz; e8m0) and each width of codes, on a small and a large float32 array
  and a small float64 one (Python numbers: ``explain``, the lessons' plots);
* the same for fp32 and e2m1, which share those families' generic kernels
  but not bf16's and e4m3fn's fast paths (every mode but SR);
* ``decode``;
* ``fpemu.stats`` of those formats, on float32 (its 32-bit kernel) and on
  float64 input, and ``stats_many`` of the monitor's four default formats;
* ``fpemu.arith`` in fp16, bf16 and e4m3fn; flush-to-zero casts; stats of
  e2m1 (what the lessons' first cells call besides);
* the CUDA profile's reduction orders (``fpemu.autograd._cuda_reduce``): sums
  and norms of float32 and float64 values, softmax, nll_loss, layer_norm;
* the CPU profile's models of ATen's CPU kernels (``fpemu.autograd._cpu_*``):
  sums, norms, var, cdist, activations, softmax, normalization, pooling,
  interpolation, factories;
* the README's MLP training step and a small MLP's first step (a first
  training script's), in bf16 and in fp16 autocast with a GradScaler, AdamW
  and gradient clipping;
* the demo's experiments (``fpemu.experiments``), each at the sizes of its
  full run with the fewest steps (its ``WARM`` settings) and at its
  ``QUICK`` sizes: ``make demo`` right after the set-up then compiles
  nothing (the one that trains a PyTorch model only where torch is
  installed).

``make venv`` (and so ``make demo`` and ``make test``) runs it as ``fpemu
warmup``. Other formats, modes or operations still compile on first use.
The cache is Numba's: ``__pycache__`` beside the sources, or
``NUMBA_CACHE_DIR``; it holds code for this CPU only.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import numpy as np

import fpemu

from .experiments import ORDER, module

#: one format of each set of kernel flags that the named formats use
FAMILIES = ("bf16", "e4m3fn", "e4m3fnuz", "e8m0")
#: formats of bf16's family with codes of another width (encode's output
#: dtype is part of the kernel's signature): fp32 (uint32), e5m2 (uint8)
CODE_WIDTHS = ("fp32", "e5m2")
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")
#: a small array runs a kernel's serial loop, a large one its parallel loop
#: (``fpemu._jit.SERIAL_BELOW``)
SMALL, LARGE = 64, (1 << 17) + 1


def _inputs(n):
    x = np.geomspace(1e-12, 1e12, n).astype(np.float32)
    x[1::2] *= -1
    return x


def _mlp_step(dtype_name, small=False):
    """The README's MLP step (784-512-10, a batch of 256: the kernels' parallel
    loops), or with ``small`` a first training script's MLP (20-64-3, a batch
    of 32: their serial loops), under autocast with a GradScaler and AdamW."""
    import fpemu.autograd as torch      # (needs Numba; only the items that train load it)
    torch.manual_seed(0)
    n_in, hidden, n_out, batch = (20, 64, 3, 32) if small else (784, 512, 10, 256)
    model = torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, n_out))
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    xb, yb = torch.randn(batch, n_in), torch.randint(0, n_out, (batch,))
    opt.zero_grad()
    with torch.autocast(device_type="cuda", dtype=getattr(torch, dtype_name)):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    return loss.item()


def _arith(n, fmt):
    x = fpemu.quantize(_inputs(n), fmt)             # arithmetic takes the format's values
    y = x[::-1].copy()
    fpemu.sub(x, y, fmt)
    fpemu.fma(x, y, x, fmt)


def _experiment(name):
    """One demo experiment at the sizes of its full run (its ``WARM`` steps)
    and at its ``QUICK`` sizes (``fpemu demo --quick``, the tests)."""
    mod = module(name)
    mod.run(None, **mod.WARM)
    mod.run(None, **mod.QUICK)


def _blocks(preset):
    """A preset's block quantization at both sizes, along both axes."""
    from . import block
    for n in (SMALL, LARGE):
        x = _inputs(n)[:n // 64 * 64].reshape(-1, 64)
        for axis in (-1, 0):
            block.quantize_blocks(x, preset, axis=axis)
        block.quantize_blocks(x, preset, rounding="sr", seed=0)


def _cuda_reductions(n):
    """The CUDA profile's reductions in ATen's order (sum, the 2-norm,
    softmax and log_softmax, cross_entropy, layer_norm), forward and
    backward, in float32 and float64."""
    import fpemu.autograd as torch      # (needs Numba; only the items that train load it)
    F = torch.nn.functional
    x = _inputs(n)
    with torch.use_profile(torch.Profile("cuda")):
        for dt in (torch.float32, torch.float64):
            t = torch.tensor(x).to(dt)
            torch.sum(t), torch.linalg.vector_norm(t)
            torch.sum(t[: n // 8 * 8].reshape(-1, 8), 0)
        rows = torch.tensor(x[: n // 64 * 64].reshape(-1, 64) * 1e-10, requires_grad=True)
        w, b = torch.ones(64, requires_grad=True), torch.zeros(64, requires_grad=True)
        target = torch.zeros(rows.shape[0], dtype=torch.int64)
        loss = (F.softmax(rows, -1).sum() + F.cross_entropy(rows, target)
                + F.layer_norm(rows, (64,), w, b).sum())
        loss.backward()


def _cpu_kernels(n):
    """The CPU profile's models of ATen's CPU kernels (``fpemu.autograd._cpu_*``):
    sums, means, norms, var, cdist, the activations' SLEEF math, softmax,
    layer and group norm, pooling, interpolation and the factories, in
    float32 and float64 (and a bfloat16 sum)."""
    import fpemu.autograd as torch      # (needs Numba; only the items that train load it)
    F = torch.nn.functional
    x = _inputs(n)[: n // 64 * 64] * 1e-10
    with torch.use_profile(torch.Profile("cpu")):
        for dt in (torch.float32, torch.float64):
            t = torch.tensor(x).to(dt)
            m = t.reshape(-1, 64)
            torch.sum(t), torch.mean(m, 0), torch.nansum(m, 1), torch.var(t), torch.std(m, 1)
            torch.var_mean(m, 1), torch.linalg.vector_norm(t), torch.norm(m, 1, 0)
            torch.norm(m, 3, 1), torch.cdist(m[:4], m[4:8])
            F.gelu(m), F.glu(m), F.silu(m), F.softmax(m, -1), F.log_softmax(m, 0)
            F.layer_norm(m, (64,)), F.group_norm(m.reshape(-1, 4, 16), 2)
            img = m.reshape(-1, 1, 8, 8)
            F.avg_pool2d(img, 2), F.adaptive_avg_pool2d(img, 3)
            F.interpolate(img, scale_factor=2, mode="bilinear")
            torch.linspace(0, 1, 50, dtype=dt), torch.arange(0, 5, 0.1, dtype=dt)
        torch.sum(torch.tensor(x).to(torch.bfloat16))


#: the experiments that train a real PyTorch model (the demo extra's torch)
_NEEDS_TORCH = ("emulated_training",)


def workload():
    """The common set, as (label, function) pairs."""
    from .stats import stats_many       # (needs Numba, which `import fpemu` does not)
    jobs = []
    small64 = _inputs(SMALL).astype(np.float64)         # Python floats and lists
    for fmt in FAMILIES + CODE_WIDTHS:
        quantize = fmt in FAMILIES                      # values: one kernel per family
        for x in (_inputs(SMALL), _inputs(LARGE), small64):
            for mode in MODES:
                label = f"{'quantize/' if quantize else ''}encode {fmt} {mode} " \
                        f"{x.dtype} n={x.size}"
                jobs.append((label, lambda x=x, f=fmt, m=mode, q=quantize: (
                    fpemu.encode(x, f, rounding=m, seed=0),
                    q and fpemu.quantize(x, f, rounding=m, seed=0))))
    for fmt in FAMILIES:
        for n in (SMALL, LARGE):
            x = _inputs(n)
            jobs.append((f"decode {fmt} n={n}",
                         lambda x=x, f=fmt: fpemu.decode(fpemu.encode(x, f), f)))
            jobs.append((f"stats {fmt} n={n}", lambda x=x, f=fmt: fpemu.stats(x, f)))
        # float64 input (numpy's default) and a scale that is no power of two
        # take the float64 kernel
        jobs.append((f"stats {fmt} float64", lambda f=fmt: fpemu.stats(small64, f)))
    # the monitor's one pass over several formats (fpemu.torch.monitor's default four)
    monitor_formats = ("fp16", "bf16", "e4m3fn", "e5m2")
    jobs.append(("stats_many " + ",".join(monitor_formats), lambda: stats_many(
        _inputs(LARGE), monitor_formats, overflows=("inf", "inf", "nan", "inf"))))
    # the IEEE fast path of quantize rne, and formats that share bf16's kernels
    for fmt in ("fp16", "e5m2"):
        for n in (SMALL, LARGE):
            jobs.append((f"quantize {fmt} rne n={n}",
                         lambda x=_inputs(n), f=fmt: fpemu.quantize(x, f)))
    # bf16 has float32's exponent range and takes the integer-only twins of
    # the fast paths; fp16's 16-bit codes come from the narrow formats' own
    for n in (SMALL, LARGE):
        for mode in MODES[:-1]:
            jobs.append((f"encode fp16 {mode} n={n}",
                         lambda x=_inputs(n), m=mode: fpemu.encode(x, "fp16", rounding=m)))
    # in every mode but SR, bf16 and e4m3fn take the fast paths; formats of
    # their families that cannot (fp32: 23 mantissa bits; the MX element
    # formats: no NaN) take the generic 32-bit kernels, compiled here
    for fmt in ("fp32", "e2m1"):
        for n in (SMALL, LARGE):
            for mode in MODES[:-1]:
                jobs.append((f"quantize/encode {fmt} {mode} n={n}",
                             lambda x=_inputs(n), f=fmt, m=mode: (
                                 fpemu.quantize(x, f, rounding=m),
                                 fpemu.encode(x, f, rounding=m))))
    # what the lessons' first cells run besides: fpemu.arith (one kernel per
    # mode and family: lesson 05's fp16 updates), flush-to-zero casts (lesson
    # 09's and 13's), stats of the MX element formats (lesson 12's monitor)
    for fmt in ("fp16", "bf16", "e4m3fn"):
        for n in (SMALL, LARGE):
            jobs.append((f"arith {fmt} n={n}", lambda n=n, f=fmt: _arith(n, f)))
        for x in (_inputs(SMALL), _inputs(LARGE), small64):
            jobs.append((f"quantize/encode {fmt} subnormals=False {x.dtype} n={x.size}",
                         lambda x=x, f=fmt: (fpemu.quantize(x, f, subnormals=False),
                                             fpemu.encode(x, f, subnormals=False))))
    for n in (SMALL, LARGE):
        jobs.append((f"stats e2m1 n={n}", lambda x=_inputs(n): fpemu.stats(x, "e2m1")))
    # the fused block kernels (fpemu.block.fused) of every preset, blocks along
    # the last axis and read where they lie (a transposed operand's), nearest
    # and stochastic
    from . import block
    for name in sorted(block.PRESETS):
        jobs.append((f"quantize_blocks {name}", lambda p=name: _blocks(p)))
    # the CUDA profile's reduction orders (fpemu.autograd._cuda_reduce): sums
    # and norms of float32 and float64 values, softmax forward and backward,
    # nll_loss's 32 threads, layer_norm's Welford rows
    for n in (SMALL, LARGE):
        jobs.append((f"cuda-order reductions n={n}", lambda n=n: _cuda_reductions(n)))
    # the CPU profile's kernels in ATen's CPU order (fpemu.autograd._cpu_*)
    jobs.append(("cpu-profile kernels", lambda: _cpu_kernels(4096)))
    for dtype in ("bfloat16", "float16"):
        jobs.append((f"README MLP step, {dtype} autocast", lambda d=dtype: _mlp_step(d)))
        jobs.append((f"small MLP step, {dtype} autocast",
                     lambda d=dtype: _mlp_step(d, small=True)))
    # the demo's experiments (make demo right after the set-up): collectives,
    # block formats, the fp8 recipes and the rest, at the full run's sizes
    has_torch = importlib.util.find_spec("torch") is not None
    for name in ORDER:
        if name in _NEEDS_TORCH and not has_torch:
            continue
        jobs.append((f"demo experiment {name}", lambda n=name: _experiment(n)))
    return jobs


def cache_dir():
    """Where Numba keeps fpemu's compiled kernels."""
    import numba                        # (fpemu and its command line import without Numba)
    return numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "__pycache__")


def default_processes():
    """How many processes :func:`warmup` compiles in: the cores this process
    may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                       # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _run_items(items, progress):
    times = []
    for label, fn in items:
        t = time.perf_counter()
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        dt = time.perf_counter() - t
        times.append((label, dt))
        if progress is not None:
            progress(label, dt)
    return times


def _part(index, count):
    """Run every count-th item of the workload from ``index`` on, printing
    each item's time and label as it finishes (a child of :func:`warmup`)."""
    def report(label, seconds):
        print(f"{seconds!r}\t{label}", flush=True)
    _run_items(workload()[index::count], report)


def warmup(progress=None, processes=None):
    """Run the common set (:func:`workload`); returns [(label, seconds)].
    ``progress``: called with each label and its time as it finishes.

    ``processes``: how many processes compile at once (default: one per
    core, :func:`default_processes`). The Numba compiler holds a global lock,
    so one process compiles one kernel at a time; with two or more the
    workload is dealt out among child processes, which fill the one on-disk
    cache (fpemu's kernels write it under a lock: ``fpemu._jit``). With
    ``processes=1`` the set runs in this process, which then also has every
    kernel loaded."""
    processes = default_processes() if processes is None else processes
    if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
        raise ValueError(f"warmup: processes must be a positive int, got {processes!r}; "
                         f"pass 1 to run in this process")
    if processes == 1:
        return _run_items(workload(), progress)
    lock = threading.Lock()
    times = []
    # stderr to files: a child's warnings must not fill a pipe nobody reads yet
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(processes)]
    children = [subprocess.Popen(
        [sys.executable, "-c", f"from fpemu.warmup import _part; _part({i}, {processes})"],
        stdout=subprocess.PIPE, stderr=logs[i], text=True)
        for i in range(processes)]

    def read(child):
        with child.stdout:
            for line in child.stdout:
                seconds, label = line.rstrip("\n").split("\t", 1)
                with lock:
                    times.append((label, float(seconds)))
                    if progress is not None:
                        progress(label, float(seconds))
    readers = [threading.Thread(target=read, args=(c,), daemon=True) for c in children]
    try:
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        statuses = [c.wait() for c in children]
    finally:                                     # interrupted: leave no child behind
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
    errors = []
    for log in logs:
        with log:
            log.seek(0)
            errors.append(log.read())
    failed = [(i, rc) for i, rc in enumerate(statuses) if rc != 0]
    if failed:
        i, rc = failed[0]
        raise RuntimeError(f"fpemu warmup: process {i + 1} of {processes} exited with status "
                           f"{rc}:\n{errors[i][-4000:]}\nrun `fpemu warmup --processes 1 -v` "
                           f"to see the failing item in one process")
    order = {label: k for k, (label, _) in enumerate(workload())}
    return sorted(times, key=lambda t: order[t[0]])
