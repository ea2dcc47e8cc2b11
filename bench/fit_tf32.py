"""Fit a model of cuBLAS's TF32 GEMM on Hopper to the probes an H200 recorded.

``bench/gpu_check.py`` recorded 20 float32 ``torch.matmul`` probes with
``torch.backends.cuda.matmul.allow_tf32 = True`` on an NVIDIA H200 (torch
2.11.0+cu130), in ``bench/gpu_check/nvidia-h200-torch2.11.0`` (``gemm.json``,
``gemm.npz``: float32 output bit codes). Its candidate grid
(``gpu_check.gemm_candidates``) reproduces 6 of them. This script widens the
search and prints, per TF32 probe, how many outputs each candidate gets
bit for bit, and the best::

    python bench/fit_tf32.py [RUN_DIR] [--no-overall]

The candidates, all on the tensor-core algorithm of Fasi et al. (2021) and
Khattak and Mikaitis (2025) (:class:`fpemu.accumulate.TensorCore`: each step
of ``terms`` exact products plus the accumulator, every term truncated to
``F`` fraction bits below the largest exponent, the exact sum truncated to
fp32; the steps chained):

1. the **layout** of K: unsplit, or cut into ``S`` contiguous runs of
   ``tile``-wide k-tiles, each run accumulated from +0 and the runs' sums
   added in fp32 in order (:class:`fpemu.accumulate.SplitK`), for tiles of
   4 to 128 and S up to 64, under the base model (inputs rounded to tf32 to
   nearest even, 8 products a step, F = 25);
2. at the best layout, the **model**: the input rounding (to nearest even;
   ties away from zero, CUTLASS's ``round_half_ulp_truncate`` /
   ``cvt.rna.tf32.f32``; toward zero, which is also what a tensor core that
   ignores the low 13 bits of a float32 operand computes), 4 / 8 / 16
   products a step, F = 23..27, two ``e_zero``; a step whose sum is
   *rounded* to nearest even instead of truncated; 3xTF32 (each operand
   split into a tf32 ``big`` and a tf32 ``small`` part, the three products
   ``small*big``, ``big*small``, ``big*big`` in that order); float32
   without TF32; and today's CUDA profile model (tf32 inputs, fp32 adds in
   index order).

Then the summary: the TF32 probes reproduced before (today's grid) and
after (any candidate here), over the 150 probes too (today's grid refitted
on all of them, as ``python bench/gpu_check.py --fit RUN_DIR`` does, without
writing into RUN_DIR), and the call that reproduces each probe.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

RUN_DEFAULT = os.path.join(ROOT, "bench", "gpu_check", "nvidia-h200-torch2.11.0")
TILES = (32, 16, 8, 4, 64, 128)      # the first layout that fits is reported, in this order
MAX_SPLITS = 64
ROUNDINGS = ("rne", "rna", "rtz")
TERMS = (4, 8, 16)
FRACS = (23, 24, 25, 26, 27)
E_ZEROS = (-133, -127)
BASE = dict(rounding="rne", terms=8, frac=25, e_zero=-133)


def load(run):
    """(meta, bits, tf32 probe ids) of a recorded run folder."""
    for name in ("gemm.json", "gemm.npz"):
        if not os.path.isfile(os.path.join(run, name)):
            sys.exit(f"fit_tf32: {os.path.join(run, name)} is missing; pass the folder "
                     "bench/gpu_check.py recorded (it holds gemm.json and gemm.npz)")
    with open(os.path.join(run, "gemm.json")) as fh:
        meta = json.load(fh)
    bits = np.load(os.path.join(run, "gemm.npz"))
    ids = sorted((cid for cid, c in meta["cases"].items()
                  if c.get("dtype") == "tf32" and cid in bits.files),
                 key=lambda cid: (meta["cases"][cid]["K"], cid))
    if not ids:
        sys.exit(f"fit_tf32: {run} holds no recorded TF32 probe")
    return meta, {k: bits[k] for k in bits.files}, ids


def operands(torch, gpu_check, case):
    ins = gpu_check.gemm_inputs(torch, case)
    if gpu_check._digest(ins) != case["sha256"]:
        sys.exit(f"fit_tf32: {case['id']}: the inputs made from the seed differ from the "
                 "recorded ones (sha256); this numpy/torch does not rebuild them")
    return ins["a"].numpy().astype(np.float64), ins["b"].numpy().astype(np.float64)


def equal(y, bits):
    """How many outputs equal the recorded ones bit for bit (NaN = NaN)."""
    ours = np.asarray(y, np.float32).view(np.uint32)
    nan = np.isnan(ours.view(np.float32)) & np.isnan(bits.view(np.float32))
    return int(((ours == bits) | nan).sum())


def chunks(K, split):
    """The K ranges of a SplitK (the empty ones left out)."""
    return tuple((k0, k1) for k0, k1 in split.parts(K) if k1 > k0)


def layouts(K):
    """Every distinct (SplitK, its K ranges) of the grid, in report order."""
    from fpemu.accumulate import SplitK
    seen, out = set(), []
    for tile in TILES:
        tiles = -(-K // tile)
        for S in range(1, min(MAX_SPLITS, tiles) + 1):
            sk = SplitK(S, tile)
            parts = chunks(K, sk)
            if parts not in seen:
                seen.add(parts)
                out.append((sk, parts))
    return out


def split_name(sk):
    return "unsplit" if sk.splits == 1 else f"SplitK({sk.splits}, tile={sk.tile})"


def split_arg(sk):
    """The ``splitk=`` argument that makes ``sk``."""
    return "1" if sk.splits == 1 else f"SplitK({sk.splits}, tile={sk.tile})"


def tc_model(terms, frac, e_zero):
    from fpemu.accumulate import TensorCore
    return TensorCore(f"tc{terms}f{frac}z{-e_zero}", terms, frac, 23, e_zero)


def run_tc(A, B, rounding, terms, frac, e_zero, split):
    from fpemu import accumulate, quantize
    qa = quantize(A, "tf32", rounding=rounding)
    qb = quantize(B, "tf32", rounding=rounding)
    return accumulate.matmul(qa, qb, "tf32", "fp32", model=tc_model(terms, frac, e_zero),
                             splitk=split)


def rne_steps(A, B, parts, terms=8, frac=25):
    """The base model with each step's exact sum rounded to nearest even into
    fp32 instead of truncated (numpy, written out here: fpemu's kernel only
    truncates)."""
    from fpemu import quantize
    a, b = quantize(A, "tf32"), quantize(B, "tf32")

    def expo(x):
        with np.errstate(divide="ignore"):
            e = np.frexp(np.where(x == 0, 1.0, x))[1].astype(np.int64) - 1
        return np.maximum(e, -126)

    total = None
    for k0, k1 in parts:
        c = np.zeros((a.shape[0], b.shape[1]))
        for s0 in range(k0, k1, terms):
            s1 = min(s0 + terms, k1)
            P = a[:, s0:s1, None] * b[None, s0:s1, :]
            E = np.where(P == 0, -133, expo(a)[:, s0:s1, None] + expo(b)[None, s0:s1, :])
            emax = np.maximum(E.max(axis=1), np.where(c == 0, -133, expo(c)))
            q = np.exp2((emax - frac).astype(np.float64))
            s = (np.trunc(c / q) + np.trunc(P / q[:, None, :]).sum(axis=1)) * q
            c = s.astype(np.float32).astype(np.float64)       # round to nearest even
        part = c.astype(np.float32)
        total = part if total is None else total + part
    return total


def three_tf32(A, B, split):
    """3xTF32: big = tf32(x), small = tf32(x - big); small*big + big*small +
    big*big, each a GEMM of the base model, added in fp32 in that order."""
    from fpemu import accumulate, quantize
    model = tc_model(8, 25, -133)
    ab, bb = quantize(A, "tf32"), quantize(B, "tf32")
    as_, bs = quantize(A - ab, "tf32"), quantize(B - bb, "tf32")

    def mm(x, y):
        return accumulate.matmul(x, y, "tf32", "fp32", model=model, splitk=split)

    return (mm(as_, bb) + mm(ab, bs)) + mm(ab, bb)


def fit_probe(cid, A, B, bits):
    """Print the counts of every candidate for one probe; return (best name,
    best count, the call that reproduces it or None)."""
    from fpemu import accumulate, quantize
    K = A.shape[1]
    n = bits.size
    results = []                                  # (count, name)
    print(f"\n{cid}: {n} outputs")
    # 1. layouts under the base model
    lay = []
    for sk, parts in layouts(K):
        c = equal(run_tc(A, B, split=sk, **BASE), bits)
        lay.append((c, sk, parts))
    unsplit = lay[0][0]
    best_c, best_sk, best_parts = max(lay, key=lambda t: t[0])     # first best in report order
    fits = [t for t in lay if t[0] == n]
    widths = sorted({p[0][1] - p[0][0] for _, _, p in fits})
    print(f"  layout (base model: tf32 rne, 8 terms, F=25): unsplit {unsplit}/{n}; "
          f"{len(lay)} layouts tried, {len(fits)} exact"
          + (f" (first parts {', '.join(map(str, widths))} wide)" if fits else "")
          + f"; best {split_name(best_sk)}: {best_c}/{n}")
    # 2. models at the best layout
    print(f"  models at {split_name(best_sk)} (F = " + " ".join(map(str, FRACS)) + "):")
    for rnd in ROUNDINGS:
        for terms in TERMS:
            row = []
            for frac in FRACS:
                counts = [equal(run_tc(A, B, rnd, terms, frac, ez, best_sk), bits)
                          for ez in E_ZEROS]
                for ez, c in zip(E_ZEROS, counts):
                    results.append((c, f"tf32-{rnd} {terms} terms F={frac} e_zero={ez} "
                                       f"{split_name(best_sk)}"))
                row.append(str(counts[0]) + ("" if counts[0] == counts[1] else
                                             f"({counts[1]} at e_zero={E_ZEROS[1]})"))
            print(f"    tf32-{rnd:3s} {terms:2d} terms: " + " ".join(row))
    extra = [
        ("steps rounded to nearest (not truncated)", rne_steps(A, B, best_parts)),
        ("3xTF32", three_tf32(A, B, best_sk)),
        ("float32, no TF32, fp32 adds in index order",
         accumulate.matmul(A, B, "fp32", model="sequential")),
        ("today's CUDA profile: tf32 rne, fp32 adds in index order",
         accumulate.matmul(quantize(A, "tf32"), quantize(B, "tf32"), "tf32", "fp32",
                           model="sequential")),
    ]
    for name, y in extra:
        c = equal(y, bits)
        results.append((c, name))
        print(f"    {name}: {c}/{n}")
    base = f"tf32-rne 8 terms F=25 e_zero=-133 {split_name(best_sk)}"
    top = max(results, key=lambda t: (t[0], t[1] == base))       # a tie: the base model
    call = None
    if top[0] == n and best_c == n:
        call = ('accumulate.matmul(quantize(a, "tf32"), quantize(b, "tf32"), "tf32", "fp32", '
                f'model="h100-tf32", splitk={split_arg(best_sk)})')
        # the preset itself, through fpemu's public name
        y = accumulate.matmul(quantize(A, "tf32"), quantize(B, "tf32"), "tf32", "fp32",
                              model="h100-tf32", splitk=best_sk)
        if equal(y, bits) != n:
            call = None
    print(f"  best: {top[1]} ({top[0]}/{n})"
          + (f"\n  call: {call}" if call else ""))
    return top[1], top[0], call, best_sk


def today(torch, gpu_check, meta, bits, ids):
    """Today's grid (gpu_check.fit_gemm) on the probes ``ids``: the set
    reproduced bit for bit."""
    cases = [dict(meta["cases"][cid], id=cid) for cid in ids]
    with warnings.catch_warnings():          # _scaled_mm's "split not in the table" notes
        warnings.simplefilter("ignore")
        fits = gpu_check.fit_gemm(torch, cases, bits, meta,
                                  meta.get("device", "cuda") == "cpu", "2.11.0")
    return {cid for cid, v in fits.items() if v.get("exact")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="?", default=RUN_DEFAULT,
                    help="the folder bench/gpu_check.py recorded (default: the H200's)")
    ap.add_argument("--no-overall", action="store_true",
                    help="refit today's grid on the TF32 probes only, not on all of them")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.run):
        ap.error(f"{args.run!r} is not a folder; pass the folder bench/gpu_check.py recorded, "
                 "e.g. bench/gpu_check/nvidia-h200-torch2.11.0")
    import torch

    import gpu_check
    meta, bits, ids = load(args.run)
    t0 = time.monotonic()
    every = sorted(c for c in meta["cases"] if c in bits and "error" not in meta["cases"][c])
    before = today(torch, gpu_check, meta, bits, ids if args.no_overall else every)
    tf32_before = before & set(ids)
    after, calls = set(), {}
    for cid in ids:
        case = dict(meta["cases"][cid], id=cid)
        A, B = operands(torch, gpu_check, case)
        name, count, call, sk = fit_probe(cid, A, B, bits[cid])
        if count == bits[cid].size:
            after.add(cid)
        if call:
            calls[cid] = (call, sk)
    print("\nsummary")
    print(f"  TF32 probes reproduced bit for bit: {len(tf32_before)} of {len(ids)} with today's "
          f"grid (gpu_check.gemm_candidates) -> {len(after | tf32_before)} of {len(ids)}")
    if not args.no_overall:
        total = before | after
        print(f"  all probes: {len(before)} of {len(every)} -> {len(total)} of {len(every)}")
    print("  the call per probe (a, b: the float32 operands; M x K x N):")
    for cid in ids:
        sk = calls[cid][1] if cid in calls else None
        said = "none found" if sk is None else f'model="h100-tf32", splitk={split_arg(sk)}'
        print(f"    {cid}: {said}")
    missed = [cid for cid in ids if cid not in after]
    if missed:
        print("  not reproduced: " + ", ".join(missed))
    print(f"  ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
