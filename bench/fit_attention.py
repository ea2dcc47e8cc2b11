"""Fit the fused-attention kernels' arithmetic to the probes an H200 wrote.

    python bench/fit_attention.py [--run DIR] [--only SUBSTRING] [--fpemu | --exp-check]

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


def exp_check(meta, bits, only=""):
    """How many of the remaining differences one ulp of the GPU's inexact
    functions explains.

    Forward (flash, one key block: L <= 128): for each row with a differing
    output, whether moving one probability by one float32 ulp (an exp2f
    result off by one ulp) across a bf16 / fp16 rounding boundary makes the
    whole row equal. Backward (both backends): with the recorded output in
    D = rowsum(dO * O) (so that no forward difference enters), the rows of dq
    that differ, and how many become equal when the row's log-sum-exp moves
    by at most 3 ulps (what __logf / logf / expf being inexact amounts to)."""
    f32 = np.float32
    fwd_rows = fwd_fixed = 0
    bwd_rows = bwd_fixed = 0
    for cid, case in sorted(meta["cases"].items()):
        if only not in cid:
            continue
        ins = inputs(case)
        fmt = FMT[case["dtype"]]
        sc = 1.0 / np.sqrt(case["E"])
        flash = case["backend"] == "flash"
        fwd = fa.flash_forward if flash else fa.efficient_forward
        bwd = fa.flash_backward if flash else fa.efficient_backward
        rec_o = bits[f"{cid}.out"].view(np.float32)
        rec_q = bits[f"{cid}.dq"].view(np.float32)
        for h in range(case["H"]):
            Q, K, V, dO = (ins[n][0, h] for n in ("q", "k", "v", "dout"))
            o32, lse = fwd(Q, K, V, sc, fmt, case["causal"])
            o = fa.rnd(o32, fmt)
            if flash and case["L"] <= 128:
                c = f32(np.float64(f32(sc)) * np.log2(np.e))
                s = fa.tc_mm(Q, K.T, fmt, "h100")
                if case["causal"]:
                    s = np.where(np.tril(np.ones(s.shape, bool)), s, f32(-np.inf)).astype(f32)
                ms = (s.max(1, keepdims=True) * c).astype(f32)
                p = fa.exp2f(((s * c).astype(f32) - ms).astype(f32))
                for i in np.unique(np.nonzero(o != rec_o[0, h])[0]):
                    fwd_rows += 1
                    fwd_fixed += _one_ulp_fixes(p[i], V, fmt, rec_o[0, h, i])
            base = None
            ok = None
            for d in range(-3, 4):
                l2 = (lse.view(np.int32) + np.int32(d)).view(np.float32)
                dq = bwd(Q, K, V, rec_o[0, h], dO, l2, sc, fmt, case["causal"])[0]
                row_ok = (dq == rec_q[0, h]).all(1)
                base = row_ok if d == 0 else base
                ok = row_ok if ok is None else ok | row_ok
            bwd_rows += int((~base).sum())
            bwd_fixed += int((ok & ~base).sum())
    print(f"forward (flash, one key block): {fwd_fixed} of {fwd_rows} differing rows become "
          "equal when one probability moves by one ulp")
    print(f"backward dq (recorded O): {bwd_fixed} of {bwd_rows} differing rows become equal "
          "when the row's log-sum-exp moves by at most 3 ulps")


def _one_ulp_fixes(p, V, fmt, rec_row):
    f32 = np.float32
    L = p.size
    up = np.nextafter(p, f32(np.inf))
    dn = np.nextafter(p, f32(-np.inf))
    pr = fa.rnd(p, fmt)
    cols = fa._thread_columns(128)
    for j in np.nonzero((fa.rnd(up, fmt) != pr) | (fa.rnd(dn, fmt) != pr))[0]:
        for alt in (up[j], dn[j]):
            q = np.zeros(128, f32)
            q[:L] = p
            q[j] = alt
            ts = np.zeros(4, f32)
            for jj in range(cols.shape[1]):
                ts = (ts + q[cols[:, jj]]).astype(f32)
            tot = f32(f32(ts[0] + ts[2]) + f32(ts[1] + ts[3]))
            acc = fa.tc_mm(fa.rnd(q[None, :L], fmt), V, fmt, "h100")
            row = fa.rnd((acc * f32(f32(1) / tot)).astype(f32), fmt)[0]
            if (row == rec_row).all():
                return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default=os.path.join(ROOT, "bench", "gpu_check",
                                                  "nvidia-h200-torch2.11.0"))
    ap.add_argument("--only", default="", help="only probes whose id contains this")
    ap.add_argument("--fpemu", action="store_true",
                    help="measure fpemu's own F.scaled_dot_product_attention (the model in "
                         "fpemu/autograd/nn/_attention.py) instead of the candidate grid")
    ap.add_argument("--exp-check", action="store_true",
                    help="count the differences that one ulp of exp2f / __logf explains")
    args = ap.parse_args(argv)
    meta, bits = load(args.run)
    if args.exp_check:
        exp_check(meta, bits, args.only)
        return
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
