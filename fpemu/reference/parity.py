"""Replay recorded scenarios in fpemu and compare: ``fpemu parity``.

Each trace folder says which torch version and device recorded it; the replay
runs under the matching :class:`fpemu.autograd.Profile` (CUDA or CPU formulas,
the e4m3fn overflow rule of that version) and compares every recorded array
with its tier.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import warnings
import zipfile

import numpy as np

from ._env import Env
from .compare import BIT_EXACT, FAILED, NOT_COMPARED, WITHIN, Comparison, Tier, compare
from .record import META, select
from .scenarios import SCENARIOS


@dataclasses.dataclass
class ScenarioResult:
    name: str
    comparisons: list

    @property
    def ok(self):
        return all(c.status != FAILED for c in self.comparisons)


def trace_dirs(root="tests/reference"):
    """Every folder under ``root`` holding a recorded ``meta.json``."""
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, "*", META)))


def load_meta(folder):
    path = os.path.join(folder, META)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{folder} has no {META}: not a trace folder written by "
                                f"`fpemu record`")
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (ValueError, UnicodeDecodeError) as err:
        raise TraceFolderError(f"{path} is not the JSON `fpemu record` writes ({err}); record "
                               "the folder again") from None
    missing = [k for k in ("scenarios", "device", "torch_release") if k not in
               (meta if isinstance(meta, dict) else {})]
    if missing:
        raise TraceFolderError(f"{path} lacks {', '.join(missing)}: not the metadata `fpemu "
                               "record` writes; record the folder again")
    return meta


class TraceFolderError(ValueError):
    """A trace folder that is damaged: its metadata or a recorded file."""


def _load_arrays(folder, name):
    """A scenario's recorded arrays, or TraceFolderError naming the file."""
    path = os.path.join(folder, f"{name}.npz")
    try:
        # the file opened here, so that it is closed when np.load fails on it
        with open(path, "rb") as fh, np.load(fh) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise TraceFolderError(f"{path} is missing: meta.json lists the scenario {name!r}; "
                               "record it again (`fpemu record --only ...`)") from None
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise TraceFolderError(f"{path} is damaged ({type(err).__name__}: {err}); record it "
                               f"again (`fpemu record --only {name}`)") from None


#: recorded device names (lower case, as torch.cuda.get_device_name gives
#: them) -> fpemu.autograd's GPU, the first match winning
_GPU_NAMES = (("h100 pcie", "h100-pcie"), ("h100", "h100"), ("h200", "h200"),
              ("gh200", "h200"), ("a100", "a100"), ("a800", "a100"))


class UnknownGpuWarning(UserWarning):
    """A trace recorded on a GPU fpemu has no profile for: it is replayed
    under the default GPU's (Hopper's) models and SM count."""


def gpu_of(device_name):
    """The GPU (a name of ``fpemu.autograd.Profile``'s ``gpu``) of a recorded
    device: "NVIDIA H200" -> "h200", "NVIDIA H100 PCIe" -> "h100-pcie"; a
    CPU's name gives the default; another GPU's the default with an
    :class:`UnknownGpuWarning`."""
    from ..autograd import Profile  # needs Numba; recording runs without it
    default = Profile("cuda").gpu
    text = str(device_name or "").lower()
    for key, gpu in _GPU_NAMES:
        if key in text:
            return gpu
    if text and not text.startswith("cpu"):
        warnings.warn(f"{device_name!r} is none of the GPUs fpemu has a profile for "
                      f"({', '.join(sorted({g for _, g in _GPU_NAMES}))}): replayed under "
                      f"{default}'s models and SM count", UnknownGpuWarning, stacklevel=2)
    return default


def profile_of(meta):
    from ..autograd import Profile  # needs Numba; recording runs without it
    return Profile(meta["device"], meta["torch_release"],
                   cpu_capability=meta.get("cpu_capability", "AVX512"),
                   cpu_threads=int(meta.get("cpu_threads", 1)),
                   gpu=gpu_of(meta.get("device_name")))


def replay(folder, name, meta=None):
    """Replay one recorded scenario; returns a :class:`ScenarioResult`."""
    from .. import autograd  # needs Numba; recording runs without it
    meta = load_meta(folder) if meta is None else meta
    info = meta["scenarios"].get(name)
    if name not in SCENARIOS:
        return ScenarioResult(name, [Comparison("(scenario)", "-", Tier(), FAILED, 0, 0, 0, 0,
                                                "recorded, but fpemu has no such scenario")])
    sc = SCENARIOS[name]
    data = _load_arrays(folder, name)
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
    recorded = {k[4:]: v for k, v in data.items() if k.startswith("out.")}
    profile = profile_of(meta)
    env = Env(autograd, meta["device"], "fpemu")
    config = info["config"] if info else sc.config
    with autograd.use_profile(profile):
        arrays = sc.run(env, config, inputs)
    got = arrays.arrays()
    dtypes = info["arrays"] if info else arrays.dtypes
    out = []
    for key, rec in recorded.items():
        tier = sc.tier_of(key, profile)
        if key not in got:
            out.append(Comparison(key, dtypes.get(key, "?"), tier, FAILED, rec.size, rec.size,
                                  np.inf, np.inf, "not produced by the replay"))
            continue
        out.append(compare(key, got[key], rec, dtypes[key], tier))
    return ScenarioResult(name, out)


def parity(folder, only=None, log=print):
    """Replay every scenario recorded in ``folder``; print a table; return the
    list of :class:`ScenarioResult`."""
    meta = load_meta(folder)
    recorded = sorted(meta["scenarios"])
    names = [n for n in recorded if n in set(select(only))] if only else recorded
    log(f"{folder}: torch {meta['torch_version']}, CUDA {meta['cuda_version']}, "
        f"{meta['device_name']}, recorded {meta['date']}; profile {profile_of(meta).name}")
    results = []
    for name in names:
        r = replay(folder, name, meta)
        results.append(r)
        log(f"  {name}")
        for c in r.comparisons:
            log(f"    {c.line()}")
            if c.tier.kind != "exact" and c.n_diff:
                log(f"      tolerance: {c.tier.reason}")
    n_fail = sum(not r.ok for r in results)
    statuses = [c.status for r in results for c in r.comparisons]
    log(f"{len(results)} scenarios, {len(statuses)} arrays: "
        + ", ".join(f"{statuses.count(s)} {s}" for s in (BIT_EXACT, WITHIN, NOT_COMPARED, FAILED))
        + f"; {n_fail} scenarios failed")
    return results
