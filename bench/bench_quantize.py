"""Time fpemu's quantize / encode against its peers, in one run, and print ratios.

Input: 2**24 float32 values spanning all magnitudes (2**-140 .. 2**127, both
signs) with some zeros, infinities and NaNs. Each figure is the median of at
least 7 repeats, in million elements per second (M/s). Ratios are fpemu / peer
at the same thread count (peers without threads: against fpemu at 1 thread).
The slow pure-Python emulators (gfloat, pychop) run on a 2**16-element slice.

Then: thread scaling, the per-call time of small arrays, fpemu.stats, and
the speed targets (allocating quantize against ``x.copy()``, encode against
torch, every mode against rne, stats against quantize), printed once as
measured and once more in a child process with AVX-512 masked
(``bench/isa.py``) where the CPU has it.

    python bench/bench_quantize.py [--size-log2 24] [--repeats 7] [--targets-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numba
import numpy as np

import fpemu

FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2")
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")
#: torch's dtype of each format (attribute names of the torch module)
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "e4m3fn": "float8_e4m3fn",
                "e5m2": "float8_e5m2"}


def timed(fn, repeats):
    fn()  # warm-up (and JIT compile)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-140, 127, n))).astype(np.float32)
    k = n // 1000
    x[:k] = 0.0
    x[k:2 * k] = np.inf
    x[2 * k:3 * k] = np.nan
    rng.shuffle(x)
    return x


def peers(x, repeats):
    """{(peer, fmt, threads): M/s} for every peer that is installed."""
    n = x.size
    res, notes = {}, []
    try:
        import ml_dtypes

        types = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16,
                 "e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
        for f, t in types.items():
            with np.errstate(all="ignore"):
                res[("ml_dtypes", f, 1)] = n / timed(lambda t=t: x.astype(t), repeats) / 1e6
    except ImportError as e:
        notes.append(f"ml_dtypes not installed ({e})")
    with np.errstate(all="ignore"):
        res[("numpy", "fp16", 1)] = n / timed(lambda: x.astype(np.float16), repeats) / 1e6
    out = np.empty_like(x)
    res[("copyto", "-", 1)] = n / timed(lambda: np.copyto(out, x), repeats) / 1e6
    try:
        import torch

        tx = torch.from_numpy(x)
        tt = {f: getattr(torch, name) for f, name in TORCH_DTYPES.items()}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for f, t in tt.items():
                res[("torch", f, threads)] = n / timed(lambda t=t: tx.to(t), repeats) / 1e6
        notes.append(f"torch {torch.__version__}")
    except ImportError as e:
        notes.append(f"torch not installed ({e})")
    small = x[: 1 << 16].astype(np.float64)
    try:
        import gfloat
        import gfloat.formats as gf

        fis = {"bf16": gf.format_info_bfloat16, "fp16": gf.format_info_binary16,
               "e4m3fn": gf.format_info_ocp_e4m3, "e5m2": gf.format_info_ocp_e5m2}
        for f, fi in fis.items():
            t = timed(lambda fi=fi: gfloat.round_ndarray(fi, small, sat=True), max(3, repeats // 2))
            res[("gfloat", f, 1)] = small.size / t / 1e6
    except ImportError as e:
        notes.append(f"gfloat not installed ({e})")
    try:
        import pychop

        bits = {"bf16": (8, 7), "fp16": (5, 10), "e4m3fn": (4, 3), "e5m2": (5, 2)}
        for f, (e, m) in bits.items():
            ch = pychop.Chop(exp_bits=e, sig_bits=m, rmode=1)
            t = timed(lambda ch=ch: ch(small), max(3, repeats // 2))
            res[("pychop", f, 1)] = small.size / t / 1e6
    except ImportError as e:
        notes.append(f"pychop not installed ({e})")
    return res, notes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-log2", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--targets-only", action="store_true",
                    help="only the targets table (the AVX-512-masked child runs this)")
    args = ap.parse_args(argv)
    x = data(1 << args.size_log2)
    n = x.size
    if args.targets_only:
        return targets(x, args.repeats)
    print(f"{n} float32 values, median of {args.repeats} repeats, M elements/s; "
          f"{numba.config.NUMBA_NUM_THREADS} cores")
    peer, notes = peers(x, args.repeats)
    for note in notes:
        print("  peer:", note)

    ours = {}
    out_f = np.empty_like(x)
    before = numba.get_num_threads()
    for threads in (1, 2):
        if threads > numba.config.NUMBA_NUM_THREADS:
            continue
        numba.set_num_threads(threads)
        for f in FORMATS:
            out_c = np.empty(n, fpemu.format(f).code_dtype)
            for mode in MODES:
                ours[("quantize", f, mode, threads)] = n / timed(
                    lambda: fpemu.quantize(x, f, rounding=mode, seed=1, out=out_f),
                    args.repeats) / 1e6
                ours[("encode", f, mode, threads)] = n / timed(
                    lambda: fpemu.encode(x, f, rounding=mode, seed=1, out=out_c),
                    args.repeats) / 1e6
    # the int64 kernels (float64 input: what float32 input ran before the
    # 32-bit kernels), 1 thread, rne and rtz
    numba.set_num_threads(1)
    x64 = x.astype(np.float64)
    for f in FORMATS:
        out_c = np.empty(n, fpemu.format(f).code_dtype)
        for mode in ("rne", "rtz"):
            ours[("int64 encode", f, mode, 1)] = n / timed(
                lambda: fpemu.encode(x64, f, rounding=mode, out=out_c), args.repeats) / 1e6
            ours[("int64 quantize", f, mode, 1)] = n / timed(
                lambda: fpemu.quantize(x64, f, rounding=mode, out=out_f), args.repeats) / 1e6
    numba.set_num_threads(before)

    def ratio(a, b):
        return f"{a / b:8.2f}" if b else "       -"

    print()
    print("peers (M/s): " + ", ".join(f"{k[0]} {k[1]} {k[2]}T {v:.1f}" for k, v in
                                      sorted(peer.items())))
    copy = peer[("copyto", "-", 1)]
    head = (f"{'op':8s} {'format':7s} {'mode':4s} {'1T M/s':>8s} {'2T M/s':>8s} "
            f"{'/torch1T':>8s} {'/torch2T':>8s} {'/mldt':>8s} {'/copyto':>8s} "
            f"{'/gfloat':>8s} {'/pychop':>8s} {'/rne':>8s}")
    print(head)
    print("-" * len(head))
    for op in ("encode", "quantize"):
        for f in FORMATS:
            for mode in MODES:
                one = ours.get((op, f, mode, 1), 0.0)
                two = ours.get((op, f, mode, 2), 0.0)
                print(f"{op:8s} {f:7s} {mode:4s} {one:8.1f} {two:8.1f} "
                      f"{ratio(one, peer.get(('torch', f, 1), 0))} "
                      f"{ratio(two, peer.get(('torch', f, 2), 0))} "
                      f"{ratio(one, peer.get(('ml_dtypes', f, 1), 0))} "
                      f"{ratio(one, copy)} "
                      f"{ratio(one, peer.get(('gfloat', f, 1), 0))} "
                      f"{ratio(one, peer.get(('pychop', f, 1), 0))} "
                      f"{ratio(one, ours.get((op, f, 'rne', 1), 0))}")

    print()
    print("32-bit kernels (float32 input) against the int64 kernels (the same values as "
          "float64), 1 thread, M/s")
    for op in ("encode", "quantize"):
        for f in FORMATS:
            for mode in ("rne", "rtz"):
                new, old = ours[(op, f, mode, 1)], ours[("int64 " + op, f, mode, 1)]
                print(f"  {op:8s} {f:7s} {mode:4s} {new:8.1f} {old:8.1f} {new / old:6.2f}x")
    print()
    print("threads: 2T / 1T throughput on 2**20 elements or more (target >= 1.7)")
    for op in ("encode", "quantize"):
        for f in FORMATS:
            one, two = ours.get((op, f, "rne", 1), 0.0), ours.get((op, f, "rne", 2), 0.0)
            if one and two:
                print(f"  {op:8s} {f:7s} rne {two / one:5.2f}")
    overhead(x)
    stats_table(x, ours, copy, args.repeats)
    targets(x, args.repeats)
    masked_targets(args)


def overhead(x):
    """Per-call time of small arrays at 1 thread and at every thread, in us:
    small arrays run the serial twin, so more threads must not cost more."""
    print()
    print("per-call time, us (small arrays: the serial twin; target: all threads <= 1 thread)")
    print(f"  {'elements':>8s} {'quantize 1T':>12s} {'quantize nT':>12s} {'encode 1T':>10s} "
          f"{'encode nT':>10s}")
    before = numba.get_num_threads()
    for n in (1, 16, 256, 4096):
        row = []
        for op in (fpemu.quantize, fpemu.encode):
            for threads in (1, numba.config.NUMBA_NUM_THREADS):
                numba.set_num_threads(threads)
                part = x[:n]
                row.append(timed(lambda: [op(part, "e4m3fn") for _ in range(100)], 7) / 100 * 1e6)
        print(f"  {n:8d} {row[0]:12.1f} {row[1]:12.1f} {row[2]:10.1f} {row[3]:10.1f}")
    numba.set_num_threads(before)


def stats_table(x, ours, copy, repeats):
    """fpemu.stats: one fused pass per (format, scale); throughput against
    quantize's, and the memory it takes on top of the input."""
    import tracemalloc

    print()
    print("stats (target: >= 0.5x quantize rne, <= 16 bytes/element extra)")
    before = numba.get_num_threads()
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        for f in FORMATS:
            rate = x.size / timed(lambda: fpemu.stats(x, f, scale=1024.0), repeats) / 1e6
            q = ours.get(("quantize", f, "rne", threads), 0.0)
            print(f"  {threads}T {f:7s} {rate:8.1f} M/s  {rate / q if q else 0:5.2f}x quantize  "
                  f"{rate / copy:5.2f}x copyto")
    numba.set_num_threads(before)
    tracemalloc.start()
    fpemu.stats(x, "fp16")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"  memory: {peak / x.size:.3f} bytes per element (Python heap peak)")


def paired(fn, base, repeats):
    """median over ``repeats`` rounds of time(base) / time(fn), each round
    timing the two back to back (the machine's drift cancels)."""
    fn()
    base()
    ratios = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = base()
        t1 = time.perf_counter()
        del r
        t2 = time.perf_counter()
        r = fn()
        t3 = time.perf_counter()
        del r
        ratios.append((t1 - t0) / (t3 - t2))
    return statistics.median(ratios)


def _isa():
    feats = (numba.config.CPU_FEATURES or "") or ""
    if numba.config.CPU_NAME and "-avx512f" in feats:
        return "AVX-512 masked (AVX2)"
    from llvmlite import binding
    return "AVX-512" if "+avx512f" in binding.get_host_cpu_features().flatten() else "AVX2"


def targets(x, repeats):
    """The speed targets, each as the ratio it is set on, measured here."""
    print()
    print(f"targets, {_isa()} (ratios > 1: fpemu faster; medians of 1-thread runs unless 2T)")
    rows = []
    before = numba.get_num_threads()
    for threads in (1, 2):
        if threads > numba.config.NUMBA_NUM_THREADS:
            continue
        numba.set_num_threads(threads)
        for f in FORMATS:
            r = paired(lambda: fpemu.quantize(x, f), lambda: x.copy(), repeats)
            rows.append((f"quantize(x, {f}) allocating / x.copy(), {threads}T", r, ">= 0.6",
                         r >= 0.6))
    numba.set_num_threads(1)
    try:
        import torch
        torch.set_num_threads(1)
        tx = torch.from_numpy(x)
        tt = {f: getattr(torch, name) for f, name in TORCH_DTYPES.items()}
        for f in FORMATS:
            # each timed in a run of its own calls: alternating them would hand
            # glibc's reused heap chunk (outputs under 32 MB) to one side only
            theirs = timed(lambda: tx.to(tt[f]), repeats)
            r = theirs / timed(lambda: fpemu.encode(x, f), repeats)
            rows.append((f"encode {f} / torch .to(), 1T", r, ">= 1.0", r >= 1.0))
    except ImportError:
        print("  torch not installed: no encode / torch rows")
    # issue 51: every deterministic mode within 1.3x rne's time; stochastic
    # rounding's own target is against the device (issue 50), printed here
    # as measured
    for op in ("encode", "quantize"):
        fn = getattr(fpemu, op)
        for f in FORMATS:
            worst, worst_mode = 1e9, ""
            for mode in MODES[1:-1]:
                r = paired(lambda: fn(x, f, rounding=mode), lambda: fn(x, f), repeats)
                if r < worst:
                    worst, worst_mode = r, mode
            t = 1 / worst
            rows.append((f"{op} {f}: slowest mode but sr ({worst_mode}) time / rne time, 1T",
                         t, "<= 1.3", t <= 1.3))
    sr_rows = []
    for op in ("encode", "quantize"):
        fn = getattr(fpemu, op)
        for f in FORMATS:
            r = paired(lambda: fn(x, f, rounding="sr", seed=1), lambda: fn(x, f), repeats)
            sr_rows.append(f"{op} {f}: sr time / rne time, 1T {1 / r:6.2f}")
    for f in FORMATS:
        r = paired(lambda: fpemu.stats(x, f, scale=1024.0), lambda: fpemu.quantize(x, f),
                   repeats)
        rows.append((f"stats {f} / quantize rne throughput, 1T", r, ">= 0.5", r >= 0.5))
    numba.set_num_threads(before)
    width = max(len(r[0]) for r in rows)
    for name, r, target, ok in rows:
        print(f"  {name:{width}s} {r:6.2f}  target {target:7s} {'met' if ok else 'MISSED'}")
    met = sum(r[3] for r in rows)
    print(f"  {met} of {len(rows)} targets met")
    print("  (no target here: " + "; ".join(sr_rows) + ")")


def masked_targets(args):
    """The targets table once more with AVX-512 masked (bench/isa.py), in a
    child process: Numba, numpy and torch read the variables at import."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import isa
    if not isa.has_avx512():
        return
    cmd = [sys.executable, os.path.abspath(__file__), "--targets-only",
           "--size-log2", str(args.size_log2), "--repeats", str(args.repeats)]
    try:
        subprocess.run(cmd, env=isa.avx2_env(), timeout=1800, check=False)
    except subprocess.TimeoutExpired:
        print("  the AVX-512-masked run took over 30 minutes and was stopped")


if __name__ == "__main__":
    main()
