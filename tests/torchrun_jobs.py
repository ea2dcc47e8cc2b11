"""Real ``torchrun`` jobs for the tests: gloo processes on this CPU, with a
timeout, in their own process group (killed whole on a timeout), and a
failed job reported with the rank torchrun names as its root cause."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

#: seconds a torchrun job may take here (start-up of 4 processes included)
TIMEOUT = 240


def fpemu_cli():
    """``torchrun --no-python fpemu ...`` as the docs write it, with the
    console script beside this Python (make's virtual environment has it)."""
    exe = Path(sys.executable).parent / "fpemu"
    assert exe.exists(), (f"no fpemu console script beside {sys.executable}; install the "
                          "package (make venv, or pip install -e .)")
    return [str(exe)]


def torchrun(nproc, cmd, cwd, env=None, timeout=TIMEOUT):
    """Run ``torchrun --standalone --nproc_per_node nproc CMD`` in its own
    process group; returns its stdout. A rank that fails (or the timeout)
    fails the test with the rank named and the job's output."""
    full = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *cmd]
    envs = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(full, cwd=cwd, env=envs, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun of {nproc} ranks did not finish in {timeout} s:\n"
                             f"{out[-3000:]}\n{err[-3000:]}") from None
    if proc.returncode != 0:
        root = root_cause(err)
        who = (f"rank {root[0]} failed first (exit code {root[1]})" if root
               else "a rank failed (torchrun named none)")
        raise RuntimeError(f"torchrun of {nproc} ranks failed (exit {proc.returncode}): "
                           f"{who}\n{out[-3000:]}\n{err[-4000:]}")
    return out


def root_cause(err):
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)"."""
    m = re.search(r"Root Cause.*?^\s*rank\s*:\s*(\d+).*?^\s*exitcode\s*:\s*(-?\d+)", err,
                  flags=re.M | re.S)
    return (int(m.group(1)), int(m.group(2))) if m else None
