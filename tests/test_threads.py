"""fpemu in forked children and from many Python threads.

Each check runs in a fresh interpreter: Numba picks its threading layer once
per process, at the first parallel launch, and the bugs showed only there.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

FORK = """
import multiprocessing as mp, numpy as np, fpemu
x = np.random.default_rng(0).standard_normal(100_000)
want = fpemu.encode(x, "bf16")          # the parent launches a parallel kernel first
def child(q):
    q.put(bool((fpemu.encode(x, "bf16") == want).all()))
ctx = mp.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,))
p.start(); p.join(120)
assert p.exitcode == 0, f"forked child died: exit code {p.exitcode}"
assert q.get(timeout=5)
def f(i):
    return int(fpemu.encode(x * i, "fp16").astype(np.int64).sum())
with ctx.Pool(2) as pool:
    got = pool.map(f, range(4))
assert got == [f(i) for i in range(4)], got
print("fork ok")
"""

THREADS = """
import threading, numpy as np, fpemu, numba
x = np.random.default_rng(0).standard_normal(1 << 18)
want = fpemu.encode(x, "bf16")
bad = []
def work():
    for _ in range(10):
        if not (fpemu.encode(x, "bf16") == want).all():
            bad.append(1)
ts = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not bad
print("threads ok", numba.threading_layer())
"""


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=e)


@pytest.mark.skipif(sys.platform == "win32", reason="fork exists on POSIX only")
def test_fork_after_a_call():
    r = _run(FORK)
    assert r.returncode == 0 and "fork ok" in r.stdout, r.stdout + r.stderr
    assert "fork() called from a process already using GNU OpenMP" not in r.stderr


@pytest.mark.parametrize("layer", [None, "workqueue"])
def test_calls_from_eight_threads(layer):
    env = {} if layer is None else {"NUMBA_THREADING_LAYER": layer}
    r = _run(THREADS, **env)
    assert r.returncode == 0 and "threads ok" in r.stdout, r.stdout + r.stderr
    if layer:
        assert r.stdout.split()[-1] == layer
