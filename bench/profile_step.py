"""Where a training step's time goes: fpemu.autograd against torch, per op.

One model of ``bench_autograd.py`` (``--case``; by default the tiny nanoGPT,
2 layers of 64, 8 x 32 tokens; bf16 autocast, AdamW, GradScaler) runs
``--steps`` steps under cProfile, and
each function's own time (cProfile's tottime) is put in one of four parts:
the Numba kernels (fpemu's ``_*kernels.py``), NumPy (its C functions and its
Python wrappers), fpemu's Python (dispatch, autocast, the graph, storage
rounding, the optimizer; a frame's own time includes the NumPy arithmetic it
writes with operators, ``a * b``, which cProfile does not see as calls) and
the rest. The same step in torch fp32 is timed
without a profiler, and its ops are counted with ``torch.profiler`` (the
``aten::`` calls at the top of the dispatcher). Printed: ms per step of each
part, the ops per step of each library, and the cost per op (fpemu's Python
time over its ops; torch's whole step over its ops), the anchor of issue 51,
and the step without fpemu's Python: no capture or replay of the step's
kernels could run it faster than that (the Python part also holds the
operator arithmetic that a replay would still do, so the bound is
optimistic). cProfile slows Python frames down (about 1.5x here), so the
parts are shares of a profiled step, scaled to the unprofiled step time.
``--matmul-model`` as in ``bench_autograd.py`` (``sequential``: the float32
products of the engine before issue 67, to see the engine's own cost).

    python bench/profile_step.py [--steps 20] [--case MLP] [--matmul-model sequential]
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
    ap.add_argument("--case", default="tiny nanoGPT",
                    help="the bench_autograd.py model whose name contains this text")
    ap.add_argument("--matmul-model", default="auto",
                    help="fpemu's matmul model (set_matmul_model): auto or sequential")
    args = ap.parse_args()
    import torch
    import fpemu.autograd as ft
    ft.set_matmul_model(args.matmul_model)
    torch.set_num_threads(2)
    models = B.cases(np.random.default_rng(0))
    named = [name for name in models if args.case.lower() in name.lower()]
    if len(named) != 1:
        raise SystemExit(f"--case {args.case!r} names {len(named)} of the bench's models; "
                         f"pass text found in exactly one of: {'; '.join(models)}")
    case = named[0]
    ours, theirs = B.step_pair(ft, torch, case, *models[case])
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
    print(f"{case} step, matmul model {args.matmul_model}: torch fp32 "
          f"{t_theirs * 1e3:.2f} ms, fpemu bf16 autocast {t_ours * 1e3:.2f} ms "
          f"({t_ours / t_theirs:.2f}x)")
    print(f"  ops per step: fpemu {ops_ours} (tensors its ops return), torch "
          f"{ops_theirs} (aten calls not inside another)")
    print("  fpemu's step by part (shares of a profiled step, scaled to the step time):")
    for key in ("Numba kernels", "NumPy", "fpemu Python", "other"):
        share = parts.get(key, 0.0) / total
        print(f"    {key:14s} {share * t_ours * 1e3:7.2f} ms  {share:6.1%}")
    py = parts.get("fpemu Python", 0.0) / total * t_ours
    print(f"  per op: fpemu's Python {py / ops_ours * 1e6:6.1f} us; torch's whole step "
          f"{t_theirs / max(ops_theirs, 1) * 1e6:6.1f} us")
    rest = t_ours - py
    print(f"  without any of fpemu's Python (no capture and replay can beat it): "
          f"{rest * 1e3:.2f} ms, {rest / t_theirs:.2f}x torch")


if __name__ == "__main__":
    main()
