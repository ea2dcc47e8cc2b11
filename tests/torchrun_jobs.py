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
    """Run ``torchrun --standalone --nproc_per_node nproc CMD``; returns its
    stdout. A rank that fails (or the timeout) fails the test with the rank
    named and the job's output. The output goes to files, not pipes, and
    every process of the job (torchrun starts each rank in a session of its
    own) is found by a marker in its environment and killed when the job
    ends, so that no rank outlives its test or keeps it waiting."""
    import tempfile
    import time
    import uuid
    full = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *cmd]
    marker = uuid.uuid4().hex
    envs = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "FPEMU_TEST_JOB": marker, **(env or {})}
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen(full, cwd=cwd, env=envs, stdout=out_f, stderr=err_f,
                                text=True, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            left = _kill_job(marker)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            time.sleep(0.1)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if timed_out:
        raise AssertionError(f"torchrun of {nproc} ranks did not finish in {timeout} s "
                             f"({left} process(es) of the job still running, killed):\n"
                             f"{out[-3000:]}\n{err[-3000:]}")
    if proc.returncode != 0:
        root = root_cause(err)
        who = (f"rank {root[0]} failed first (exit code {root[1]})" if root
               else "a rank failed (torchrun named none)")
        raise RuntimeError(f"torchrun of {nproc} ranks failed (exit {proc.returncode}): "
                           f"{who}\n{out[-3000:]}\n{err[-4000:]}")
    return out


def _kill_job(marker):
    """SIGKILL every process whose environment holds FPEMU_TEST_JOB=marker;
    returns how many there were."""
    needle = f"FPEMU_TEST_JOB={marker}".encode()
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            os.kill(int(pid), signal.SIGKILL)
            n += 1
        except OSError:
            continue
    return n


def root_cause(err):
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)"."""
    m = re.search(r"Root Cause.*?^\s*rank\s*:\s*(\d+).*?^\s*exitcode\s*:\s*(-?\d+)", err,
                  flags=re.M | re.S)
    return (int(m.group(1)), int(m.group(2))) if m else None
