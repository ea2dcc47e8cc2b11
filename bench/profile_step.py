"""Where a tiny training step's time goes: fpemu.autograd against torch, per op.

The tiny nanoGPT of ``bench_autograd.py`` (2 layers of 64, 8 x 32 tokens,
bf16 autocast, AdamW, GradScaler) runs ``--steps`` steps under cProfile, and
each function's own time (cProfile's tottime) is put in one of four parts:
the Numba kernels (fpemu's ``_*kernels.py``), NumPy (its C functions and its
Python wrappers), fpemu's Python (dispatch, autocast, the graph, storage
rounding, the optimizer; a frame's own time includes the NumPy arithmetic it
writes with operators, ``a * b``, which cProfile does not see as calls) and
the rest. The same step in torch fp32 is timed
without a profiler, and its ops are counted with ``torch.profiler`` (the
``aten::`` calls at the top of the dispatcher). Printed: ms per step of each
part, the ops per step of each library, and the cost per op (fpemu's Python
time over its ops; torch's whole step over its ops), the anchor of issue 51.
cProfile slows Python frames down (about 1.5x here), so the parts are
shares of a profiled step, scaled to the unprofiled step time.

    python bench/profile_step.py [--steps 20]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

import numpy as np

import bench_autograd as B


def _part(filename, name):
    base = os.path.basename(filename)
    if "fpemu" in filename.split(os.sep) and base.startswith("_") and "kernels" in base:
        return "Numba kernels"
    if filename == "~" or "numpy" in filename.split(os.sep):
        return "NumPy" if (filename != "~" or "numpy" in name or "ndarray" in name
                           or "method" in name) else "other"
    if "fpemu" in filename.split(os.sep):
        return "fpemu Python"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch
    import fpemu.autograd as ft
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    xs, ys = rng.integers(0, 65, (8, 32)), rng.integers(0, 65, 256)

    def build(lib):
        return B.gpt(lib, n_layer=2, n_embd=64, block_size=32)

    ft.manual_seed(0)
    ours = B.make_step(ft, build(ft), ft.tensor(xs), ft.tensor(ys), True)
    theirs = B.make_step(torch, build(torch), torch.tensor(xs), torch.tensor(ys), False)
    for _ in range(3):
        ours()
        theirs()
    t_ours = B.timed(ours, args.steps)
    t_theirs = B.timed(theirs, args.steps)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        theirs()
    # torch's ops: aten calls not made by another aten call (the backward's
    # run under the autograd engine's evaluate_function events)
    ops_theirs = sum(1 for e in prof.events() if e.name.startswith("aten::") and (
        e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        ours()
    pr.disable()
    parts, results = {}, 0
    for (filename, _, name), row in pstats.Stats(pr).stats.items():
        key = _part(filename, name)
        parts[key] = parts.get(key, 0.0) + row[2]
        if name == "_result" and filename.endswith(os.path.join("autograd", "_core.py")):
            results = row[1]            # fpemu's ops: the tensors its ops return
    ops_ours = results // args.steps
    total = sum(parts.values())
    print(f"tiny nanoGPT step (2x64, 8x32 tokens): torch fp32 {t_theirs * 1e3:.2f} ms, "
          f"fpemu bf16 autocast {t_ours * 1e3:.2f} ms ({t_ours / t_theirs:.2f}x)")
    print(f"  ops per step: fpemu {ops_ours} (tensors its ops return), torch "
          f"{ops_theirs} (aten calls not inside another)")
    print("  fpemu's step by part (shares of a profiled step, scaled to the step time):")
    for key in ("Numba kernels", "NumPy", "fpemu Python", "other"):
        share = parts.get(key, 0.0) / total
        print(f"    {key:14s} {share * t_ours * 1e3:7.2f} ms  {share:6.1%}")
    py = parts.get("fpemu Python", 0.0) / total * t_ours
    print(f"  per op: fpemu's Python {py / ops_ours * 1e6:6.1f} us; torch's whole step "
          f"{t_theirs / max(ops_theirs, 1) * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
