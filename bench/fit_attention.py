"""Fit the fused-attention kernels' arithmetic to the probes an H200 wrote.

    python bench/fit_attention.py [--run DIR] [--only SUBSTRING] [--quick]

reads ``attention.json`` / ``attention.npz`` of a gpu-check run (default: the
H200 run, torch 2.11.0+cu130), rebuilds every probe's inputs from its seed
(``bench/gpu_check.py``'s ``_attention_inputs``), runs each candidate model
of ``fpemu/autograd/_fused_attention.py`` and prints, per probe and output
(out, dq, dk, dv), how many elements are bit-exact, then the best candidate
per backend and output over all probes, and fpemu's own model (what
``F.scaled_dot_product_attention`` computes under ``Profile("cuda")``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402

try:
    from fpemu.autograd import _fused_attention as fa  # noqa: E402
except ImportError:                 # a checkout before the kernel model: --fpemu only
    fa = None

OUTS = ("out", "dq", "dk", "dv")
FMT = {"bfloat16": "bf16", "float16": "fp16"}


def load(run):
    with open(os.path.join(run, "attention.json")) as fh:
        meta = json.load(fh)
    bits = np.load(os.path.join(run, "attention.npz"))
    return meta, bits


def inputs(case):
    import torch
    ins = gpu_check._attention_inputs(torch, case)
    return {k: v.float().numpy().astype(np.float64) for k, v in ins.items()}


def run_model(case, ins, fwd, bwd, cfg):
    """{output: float32 array} of a candidate (per head)."""
    fmt = FMT[case["dtype"]]
    sc = 1.0 / np.sqrt(case["E"])
    res = {k: np.zeros(ins["q"].shape, np.float32) for k in OUTS}
    for b in range(case["B"]):
        for h in range(case["H"]):
            Q, K, V, dO = (ins[n][b, h] for n in ("q", "k", "v", "dout"))
            o32, lse = fwd(Q, K, V, sc, fmt, case["causal"], cfg)
            o = fa.rnd(o32, fmt)
            res["out"][b, h] = o
            if bwd is not None:
                dq, dk, dv = bwd(Q, K, V, o, dO, lse, sc, fmt, case["causal"], cfg)
                res["dq"][b, h], res["dk"][b, h], res["dv"][b, h] = dq, dk, dv
    return res


def equal(rec_bits, ours):
    mine = np.asarray(ours, np.float32).reshape(rec_bits.shape).view(np.uint32)
    return int((mine == rec_bits).sum())


def candidates(backend):
    if backend == "flash":
        base = fa.FlashConfig()
        yield "flash", fa.flash_forward, getattr(fa, "flash_backward", None), base
        yield "flash exp-fma", fa.flash_forward, getattr(fa, "flash_backward", None), \
            dataclasses.replace(base, exp_fma=True)
        yield "flash divide", fa.flash_forward, getattr(fa, "flash_backward", None), \
            dataclasses.replace(base, recip=False)
    else:
        base = fa.EfficientConfig()
        fwd, bwd = fa.efficient_forward, fa.efficient_backward
        yield "efficient", fwd, bwd, base
        yield "efficient dS with fp32 P", fwd, bwd, dataclasses.replace(base, ds_p16=False)
        yield "efficient dq ascending", fwd, bwd, dataclasses.replace(base, dq_order="ascending")
        yield "efficient dk/dv ascending", fwd, bwd, dataclasses.replace(base, dv_order="ascending")


def fpemu_sdpa(case, gpu="h200"):
    """{output: float32 array}: fpemu's ``F.scaled_dot_product_attention``
    and its backward under ``Profile("cuda", "2.11.0")`` with the probe's
    backend (``sdpa_kernel``)."""
    import torch
    import fpemu.autograd as ft
    F = ft.nn.functional
    ins = gpu_check._attention_inputs(torch, case)
    q, k, v = (ft.nn.from_torch(ins[n]).requires_grad_() for n in ("q", "k", "v"))
    backend = {"flash": F.SDPBackend.FLASH_ATTENTION,
               "efficient": F.SDPBackend.EFFICIENT_ATTENTION}[case["backend"]]
    kw = {"gpu": gpu} if "gpu" in ft.Profile.__dataclass_fields__ else {}
    with ft.use_profile(ft.Profile("cuda", "2.11.0", **kw)), F.sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
        o.backward(ft.nn.from_torch(ins["dout"]))
    return {"out": o.detach().float().numpy(), "dq": q.grad.float().numpy(),
            "dk": k.grad.float().numpy(), "dv": v.grad.float().numpy()}


def measure_fpemu(meta, bits, only=""):
    """Per probe and output, how many elements fpemu's own model gets
    bit-exact; then per backend and output the probes exact and elements."""
    totals = {}
    for cid, case in sorted(meta["cases"].items()):
        if only not in cid or "error" in case:
            continue
        t0 = time.perf_counter()
        res = fpemu_sdpa(case)
        dt = time.perf_counter() - t0
        line = []
        for k in OUTS:
            rec = bits[f"{cid}.{k}"]
            e = equal(rec, res[k])
            line.append(f"{k} {e}/{rec.size}")
            t = totals.setdefault((case["backend"], k), [0, 0, 0, 0])
            t[0] += e
            t[1] += rec.size
            t[2] += e == rec.size
            t[3] += 1
        print(f"{cid:40s} " + "  ".join(line) + f"  ({dt * 1000:.0f} ms)")
    print("\nfpemu's model, per backend and output (probes bit-exact, elements equal):")
    for (backend, k), (e, n, ex, np_) in sorted(totals.items()):
        print(f"  {backend:9s} {k:3s}: {ex:2d}/{np_} probes exact, {e}/{n} elements")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default=os.path.join(ROOT, "bench", "gpu_check",
                                                  "nvidia-h200-torch2.11.0"))
    ap.add_argument("--only", default="", help="only probes whose id contains this")
    ap.add_argument("--fpemu", action="store_true",
                    help="measure fpemu's own F.scaled_dot_product_attention (the model in "
                         "fpemu/autograd/nn/_attention.py) instead of the candidate grid")
    args = ap.parse_args(argv)
    meta, bits = load(args.run)
    if args.fpemu:
        measure_fpemu(meta, bits, args.only)
        return
    totals = {}
    for cid, case in sorted(meta["cases"].items()):
        if args.only not in cid or "error" in case:
            continue
        ins = inputs(case)
        print(f"{cid}:")
        for name, fwd, bwd, cfg in candidates(case["backend"]):
            t0 = time.perf_counter()
            res = run_model(case, ins, fwd, bwd, cfg)
            dt = time.perf_counter() - t0
            counts = {}
            for k in OUTS:
                if bwd is None and k != "out":
                    continue
                rec = bits[f"{cid}.{k}"]
                counts[k] = (equal(rec, res[k]), rec.size)
                t = totals.setdefault((case["backend"], name, k), [0, 0, 0, 0])
                t[0] += counts[k][0]
                t[1] += counts[k][1]
                t[2] += counts[k][0] == counts[k][1]
                t[3] += 1
            print(f"  {name:28s} " + "  ".join(f"{k} {e}/{n}" for k, (e, n) in counts.items())
                  + f"  ({dt * 1000:.0f} ms)")
    print("\nevery candidate over all probes (elements equal, probes exact):")
    for (backend, name, k), (e, n, ex, np_) in sorted(totals.items()):
        print(f"  {backend:9s} {k:3s}: {name:28s} {e}/{n} elements, {ex}/{np_} probes exact")
    print("\nbest candidate per backend and output:")
    best = {}
    for (backend, name, k), (e, n, ex, np_) in totals.items():
        key = (backend, k)
        if key not in best or e > best[key][1]:
            best[key] = (name, e, n, ex, np_)
    for (backend, k), (name, e, n, ex, np_) in sorted(best.items()):
        print(f"  {backend:9s} {k:3s}: {name:28s} {e}/{n} elements, {ex}/{np_} probes exact")


if __name__ == "__main__":
    main()
