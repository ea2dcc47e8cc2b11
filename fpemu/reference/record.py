"""Record every scenario with real PyTorch: ``fpemu record``.

Needs only PyTorch and NumPy (fpemu's Numba side is never imported), so it
runs on a bare GPU machine. Writes one compressed ``<scenario>.npz`` per
scenario (inputs as ``in.<name>``, outputs as ``out.<name>``) and a
``meta.json`` into ``<out>/<device-name>-torch<version>/``.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import os
import platform
import re

import numpy as np

from ..errors import FpemuValueError
from ._env import Env
from .scenarios import SCENARIOS

META = "meta.json"


def _slug(text):
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def device_name(torch, device):
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu {platform.machine()}"


def trace_dir_name(torch, device):
    """``cpu-x86_64-torch2.13.0``, ``nvidia-h100-80gb-hbm3-torch2.11.0``."""
    return f"{_slug(device_name(torch, device))}-torch{torch.__version__.split('+')[0]}"


def select(patterns):
    """Scenario names matching any of the shell-style ``patterns`` (all if none)."""
    if not patterns:
        return list(SCENARIOS)
    names = [n for n in SCENARIOS if any(fnmatch.fnmatch(n, p) for p in patterns)]
    if not names:
        raise FpemuValueError(f"no scenario matches {', '.join(patterns)}; the scenarios are "
                              f"{', '.join(SCENARIOS)}")
    return names


def _torch_for(device):
    try:
        import torch  # optional dependency
    except ImportError:
        raise RuntimeError("fpemu record runs the scenarios with PyTorch, which is not "
                           "installed; pip install torch") from None
    if device not in ("cpu", "cuda"):
        raise FpemuValueError(f"--device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: this PyTorch sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA {torch.version.cuda}); record on "
                           "a GPU machine or pass --device cpu")
    return torch


def _read_meta(meta_path):
    if os.path.exists(meta_path):
        with open(meta_path) as fh:
            return json.load(fh)
    return {}


def _machine(torch, device):
    return {
        "torch_version": torch.__version__,
        "torch_release": torch.__version__.split("+")[0],
        "cuda_version": torch.version.cuda,
        "device": device,
        "device_name": device_name(torch, device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def record(device="cpu", out="tests/reference", only=None, log=print):
    """Run the scenarios with PyTorch on ``device``; return the trace folder."""
    torch = _torch_for(device)
    names = select(only)
    folder = os.path.join(out, trace_dir_name(torch, device))
    os.makedirs(folder, exist_ok=True)
    meta_path = os.path.join(folder, META)
    meta = _read_meta(meta_path)
    meta.update(_machine(torch, device))
    meta.setdefault("scenarios", {})
    env = Env(torch, device, "torch")
    failed = {}
    for name in names:
        sc = SCENARIOS[name]
        torch.manual_seed(0)
        try:
            inputs = sc.make_inputs(env, sc.config)
            trace = sc.run(env, sc.config, inputs)
            env.sync()
        except Exception as exc:            # record the rest; report this one at the end
            failed[name] = f"{type(exc).__name__}: {exc}"
            log(f"FAILED   {name:<32} {failed[name]}")
            continue
        arrays = trace.arrays()
        payload = {f"in.{k}": np.asarray(v) for k, v in inputs.items()}
        payload.update({f"out.{k}": v for k, v in arrays.items()})
        np.savez_compressed(os.path.join(folder, f"{name}.npz"), **payload)
        meta["scenarios"][name] = {
            "group": sc.group, "description": sc.description, "config": sc.config,
            "seed": sc.config.get("seed"), "arrays": trace.dtypes,
            "date": datetime.date.today().isoformat(),
        }
        log(f"recorded {name:<32} {len(arrays)} arrays")
    with open(meta_path, "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
    if failed:
        raise RuntimeError(
            f"{len(failed)} of {len(names)} scenarios raised in PyTorch and were not recorded "
            f"(the others are in {folder}): "
            + "; ".join(f"{k}: {v}" for k, v in failed.items())
            + ". A scenario must run in real PyTorch on this device: fix it in "
              "fpemu/reference/scenarios.py, then record it again with --only")
    return folder
