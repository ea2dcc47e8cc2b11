"""Numba's on-disk cache: a second process loads every kernel it uses.

The first process compiles a workload that reaches every family of kernels
(quantize / encode from float32 and float64 in several modes and policies,
decode, the fast paths, elementwise arithmetic, each accumulation model,
the tensor-core matmul, and one autograd training step) into an empty cache
directory. A second process runs the same workload: it must compile nothing
(Numba's ``numba:compile`` event fires only when a function is compiled, not
when it is loaded from the cache) and must leave the cache directory exactly
as it found it (no new entries: the cache does not grow from run to run).

A kernel whose closure holds a Numba dispatcher breaks both: the pickle of a
dispatcher differs in every process, Numba keys closures by that pickle, so
each process compiled the kernel again and appended another cache entry.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

WORKLOAD = textwrap.dedent("""
    import json, sys, time
    import numba.core.event as ev
    compiled = ev.install_recorder("numba:compile")
    start = time.perf_counter()
    with compiled as rec:
        import numpy as np
        import fpemu
        from fpemu import accumulate
        x = np.linspace(-300.0, 300.0, 999, dtype=np.float32)
        for fmt in ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1", "e8m0"):
            for rounding in ("rne", "rtz", "sr"):
                fpemu.quantize(np.abs(x) + 1 if fmt == "e8m0" else x, fmt,
                               rounding=rounding, seed=1)
                fpemu.encode(x.astype(np.float64) if fmt != "e8m0" else np.abs(x) + 1,
                             fmt, rounding=rounding, seed=1)
        codes = fpemu.encode(x, "e4m3fn")
        fpemu.decode(codes, "e4m3fn")
        fpemu.quantize(x, "fp16", overflow="saturate", subnormals=False)
        xb16 = fpemu.quantize(x, "bf16")
        fpemu.add(xb16, xb16, "bf16")
        fpemu.fma(x, x, x, "fp32")
        a = fpemu.quantize(np.linspace(-1, 1, 48).reshape(6, 8), "bf16")
        b = a.T.copy()
        for model in ("exact", "sequential", "pairwise", "blocked", "fma", "h100"):
            accumulate.matmul(a, b, "bf16", model=model, block=4)
        accumulate.dot(a[0], a[1], "bf16")
        from fpemu.autograd import nn, optim
        import fpemu.autograd as torch
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = optim.Adam(net.parameters(), lr=1e-3)
        xb = torch.randn(32, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(xb).float().pow(2).mean()
        loss.backward()
        opt.step()
    names = sorted({e.data["dispatcher"].py_func.__qualname__
                    for _, e in rec.buffer if e.is_start})
    json.dump({"compiled": names, "seconds": time.perf_counter() - start}, sys.stdout)
""")


def _run(cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONHASHSEED="random")
    res = subprocess.run([sys.executable, "-c", WORKLOAD], env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout)


def _snapshot(cache):
    files = {}
    for root, _, names in os.walk(cache):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, cache)] = hashlib.sha256(f.read()).hexdigest()
    return files


def test_a_second_process_loads_every_kernel_from_the_cache(tmp_path):
    first = _run(tmp_path)
    assert first["compiled"], "the first process must compile into the empty cache"
    before = _snapshot(tmp_path)
    assert any(name.endswith(".nbc") for name in before)
    second = _run(tmp_path)
    assert second["compiled"] == [], (
        f"compiled again in a second process (cache miss): {second['compiled']}")
    after = _snapshot(tmp_path)
    assert sorted(set(after) - set(before)) == [], "the cache grew"
    assert after == before, "cache entries were rewritten"


def test_read_only_and_writeable_inputs_share_one_compiled_kernel():
    """run_kernel passes input arrays as read-only views: a read-only input
    (a broadcast, np.frombuffer, a frozen array) does not compile a kernel
    again for itself."""
    import numpy as np

    import fpemu
    from fpemu import _accum_kernels, _jit
    from fpemu.accumulate import bmm_fp32_sequential
    from fpemu.quantize import Cast

    x = np.linspace(-3.0, 3.0, 5000, dtype=np.float32)        # small: the serial twin
    frozen = x.copy()
    frozen.flags.writeable = False
    twin = _jit._serial_twin(Cast.of("e4m3fn", "rtz").kernel("quantize", np.float32))
    want = fpemu.quantize(x, "e4m3fn", rounding="rtz")
    n = len(twin.signatures)
    got = fpemu.quantize(frozen, "e4m3fn", rounding="rtz")
    assert len(twin.signatures) == n, twin.signatures
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))

    A = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    B = np.arange(16, dtype=np.float32).reshape(2, 4, 2)
    bmm = _jit._serial_twin(_accum_kernels.bmm_sequential)
    want = bmm_fp32_sequential(A, B)
    n = len(bmm.signatures)
    B.flags.writeable = False
    got = bmm_fp32_sequential(A, B)
    A.flags.writeable = False
    got2 = bmm_fp32_sequential(A, B)
    assert len(bmm.signatures) == n, bmm.signatures
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got2, want)


AFTER_WARMUP = textwrap.dedent("""
    import json, sys
    import numba.core.event as ev
    from numba.core import caching
    from fpemu.warmup import _mlp_step, warmup
    warmup(processes=1)
    loaded = []
    load = caching.Cache.load_overload

    def recording_load(self, sig, target_context):
        cres = load(self, sig, target_context)
        if cres is not None:
            loaded.append(self._name.split(" at ")[0])
        return cres
    caching.Cache.load_overload = recording_load
    with ev.install_recorder("numba:compile") as rec:
        import numpy as np
        import fpemu
        _mlp_step("bfloat16")
        fpemu.explain(0.1, "e4m3fn")
        x = np.linspace(-300.0, 300.0, 200_000, dtype=np.float32)
        for fmt in ("fp16", "e2m1", "e5m2fnuz"):
            for rounding in ("rne", "rdn", "sr"):
                fpemu.quantize(x, fmt, rounding=rounding, seed=1)
                fpemu.encode(x[:100], fmt, rounding=rounding, seed=1)
                fpemu.encode(x[:100].astype(np.float64), fmt, rounding=rounding, seed=1)
        fpemu.stats(x, "e4m3fn")
        # a first training script's small MLP (issue: 2.0 s for its first fp16
        # step after the warm-up, compiling its small arrays' serial loops)
        import fpemu.autograd as torch
        torch.manual_seed(3)
        X, Y = torch.randn(48, 10), torch.randint(0, 4, (48,))
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")
        for step in range(3):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = torch.nn.functional.cross_entropy(model(X[step * 16:][:16]),
                                                         Y[step * 16:][:16])
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            loss.item()
        # what the demo runs (its collectives, block formats) at other sizes
        from fpemu import collectives
        from fpemu.block import quantize_blocks
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal(3000).astype(np.float32) for _ in range(8)]
        for alg in ("gloo", "ring", "tree", "nvls"):
            collectives.all_reduce(xs, "bf16", algorithm=alg)
        w = rng.standard_normal((96, 64)).astype(np.float32)
        for preset in ("mxfp8", "mxfp4", "nvfp4"):
            quantize_blocks(w, preset)
        # lessons' first cells: fp16 arithmetic (05), flush-to-zero (09, 13),
        # a monitor's e2m1 counts (12)
        w16 = fpemu.quantize(256.0, "fp16")
        fpemu.sub(w16, fpemu.quantize(0.009, "fp16"), "fp16")
        fpemu.quantize([5e-5, 1e-6, 1e-7, 4e-8, 2.9e-8], "fp16", subnormals=False)
        fpemu.stats(rng.standard_normal(1000).astype(np.float32), "e2m1", scale=64.0)
        # the demo's experiments at its quick sizes (make demo runs the full
        # ones, which the warm-up runs with fewer steps)
        from fpemu.report import run_all
        run_all(quick=True, progress=False)
    names = sorted({e.data["dispatcher"].py_func.__qualname__
                    for _, e in rec.buffer if e.is_start} | set(loaded))
    json.dump(names, sys.stdout)
""")


def test_warmup_covers_the_common_set():
    """After ``fpemu.warmup.warmup()`` (``fpemu warmup``, which make venv runs)
    a process needs no further kernel, compiled or loaded from the cache, for
    the README's MLP step, explain() of a Python float, quantize / encode of
    other formats of the warmed families, small and large, in several modes,
    a small MLP's fp16 AMP steps, the demo's collectives and block formats at
    other sizes, the lessons' first calls and the quick demo. Runs with the
    suite's own cache (fast once make venv warmed it)."""
    res = subprocess.run([sys.executable, "-c", AFTER_WARMUP], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [], (
        f"not covered by the warm-up: {res.stdout}")


def test_warmup_command_reports_where_the_kernels_are():
    """Two child processes (the default on a 2-core machine, asked for here
    so that it holds on any): every item reported, in the workload's order.
    The command runs in a session of its own, killed whole on a timeout."""
    import signal
    p = subprocess.Popen([sys.executable, "-m", "fpemu.cli", "warmup", "--processes", "2", "-v"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=900)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 0, err[-4000:]
    from fpemu.warmup import cache_dir, workload
    assert f"fpemu warmup: {len(workload())} items in " in out
    assert cache_dir() in out
    reported = [line.split(" s  ", 1)[1] for line in out.splitlines() if " s  " in line]
    assert sorted(reported) == sorted(label for label, _ in workload())


def test_warmup_refuses_no_processes(capsys):
    import pytest
    from fpemu.cli import main
    from fpemu.warmup import warmup
    with pytest.raises(ValueError, match="processes must be a positive int, got 0; pass 1"):
        warmup(processes=0)
    assert main(["warmup", "--processes", "0"]) == 2
    assert "--processes must be 1 or more, got 0" in capsys.readouterr().err


SAVER = textwrap.dedent("""
    import os, sys, time
    from numba.core.caching import IndexDataCacheFile
    from fpemu._jit import _LockedCacheFile
    cache, name, start, locked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    cls = _LockedCacheFile if locked else IndexDataCacheFile
    f = cls(cache_path=cache, filename_base="kernel", source_stamp=("stamp", 1))
    while not os.path.exists(start):
        time.sleep(0.001)
    for i in range(120):
        f.save((name, i), f"machine code of {name} {i}")
""")


def test_two_processes_saving_signatures_of_one_kernel_lose_nothing(tmp_path):
    """Two processes save 120 signatures each of one kernel into one cache at
    the same time (as two pytest workers or two torchrun ranks compiling the
    same kernel do). Numba's own cache file picks a data file by reading the
    index without a lock: entries go missing and an index entry can name the
    other process's data. Under fpemu's lock every signature loads its own."""
    start = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), name, str(start), "1"])
             for name in ("a", "b")]
    try:
        start.touch()
        assert [p.wait(timeout=300) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    from numba.core.caching import IndexDataCacheFile
    reader = IndexDataCacheFile(cache_path=str(tmp_path), filename_base="kernel",
                                source_stamp=("stamp", 1))
    wrong = {(name, i): reader.load((name, i)) for name in "ab" for i in range(120)
             if reader.load((name, i)) != f"machine code of {name} {i}"}
    assert wrong == {}, f"{len(wrong)} of 240 signatures lost or wrong, e.g. " \
                        f"{sorted(wrong.items())[:3]}"


def test_every_fpemu_kernel_saves_under_the_lock():
    """fpemu's jit swaps the lock into each dispatcher's cache file; if
    Numba renames the attributes it reaches, the swap would silently do
    nothing: every dispatcher fpemu made must carry the locked file."""
    import fpemu.autograd  # noqa: F401  (its kernels too)
    from fpemu._jit import MADE, _LockedCacheFile
    # the dispatchers fpemu's jit made (Numba's own, such as those it makes for
    # an @overload's implementation when it compiles one, carry no cache file)
    kernels = list(MADE)
    assert len(kernels) > 20
    unlocked = [d.py_func.__qualname__ for d in kernels
                if type(d._cache._cache_file) is not _LockedCacheFile]
    assert unlocked == []
