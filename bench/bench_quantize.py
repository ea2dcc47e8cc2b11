"""Time fpemu's quantize / encode against its peers, in one run, and print ratios.

Input: 2**24 float32 values spanning all magnitudes (2**-140 .. 2**127, both
signs) with some zeros, infinities and NaNs. Each figure is the median of at
least 7 repeats, in million elements per second (M/s). Ratios are fpemu / peer
at the same thread count (peers without threads: against fpemu at 1 thread).
The slow pure-Python emulators (gfloat, pychop) run on a 2**16-element slice.

Then: thread scaling, the per-call time of small arrays, and fpemu.stats.

    python bench/bench_quantize.py [--size-log2 24] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

import fpemu

FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2")
MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")


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
        tt = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3fn": torch.float8_e4m3fn,
              "e5m2": torch.float8_e5m2}
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
    args = ap.parse_args(argv)
    x = data(1 << args.size_log2)
    n = x.size
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


if __name__ == "__main__":
    main()
