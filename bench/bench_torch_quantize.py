"""Time fpemu.torch's quantizers (torch integer operations) against torch's own casts.

Issue 32's target: ``fpemu.torch.quantize`` to bf16 at least 0.5x the speed
of torch's ``.to(torch.bfloat16)`` on the same tensor (CPU, 2 threads). Also
timed: writing into ``out=``, the generic path (e4m3fn, fp16), codes,
stochastic rounding, and fpemu's Numba kernels on the same array for scale;
and what a new float32 result costs torch itself (``.to(bfloat16).float()``,
the same values in torch, and a bare ``.clone()``): quantize returns float32,
twice the bytes of ``.to(bfloat16)``'s result, and on the CPU the first
write of fresh memory (its page faults) costs as much as the arithmetic.
2**24 float32 values (normal, σ = 1), medians of ``--repeats`` runs after a
warm-up, 1 and 2 threads. The CUDA figures come from
``bench/torch_cuda_checks.py`` on a GPU.

Issue 50's target (second table): on a CPU tensor, ``fpemu.torch.quantize``
and ``encode`` within 1.2x the time of ``fpemu.quantize`` / ``encode`` on
the same memory (``t.numpy()``), every format and mode, 2 threads: the
tensor's own memory goes through the same Numba kernels (``--target-log2``
elements, default 2**22).

    python bench/bench_torch_quantize.py [--size-log2 24] [--repeats 5] [--target-log2 22]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import torch

import fpemu
import fpemu.torch
from bench_quantize import timed  # the median of repeats after a warm-up call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-log2", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--target-log2", type=int, default=22)
    args = ap.parse_args(argv)
    x = torch.randn(1 << args.size_log2, generator=torch.Generator().manual_seed(0))
    xn = x.numpy()
    out = torch.empty_like(x)
    cases = {
        "torch .to(bfloat16)": lambda: x.to(torch.bfloat16),
        "torch .to(float16)": lambda: x.to(torch.float16),
        "torch .to(float8_e4m3fn)": lambda: x.to(torch.float8_e4m3fn),
        "torch .to(bfloat16).float()": lambda: x.to(torch.bfloat16).float(),
        "torch .clone()": lambda: x.clone(),
        "fpemu.torch.quantize bf16": lambda: fpemu.torch.quantize(x, "bf16"),
        "fpemu.torch.quantize bf16 out=": lambda: fpemu.torch.quantize(x, "bf16", out=out),
        "fpemu.torch.quantize fp16": lambda: fpemu.torch.quantize(x, "fp16"),
        "fpemu.torch.quantize e4m3fn": lambda: fpemu.torch.quantize(x, "e4m3fn"),
        "fpemu.torch.encode e4m3fn": lambda: fpemu.torch.encode(x, "e4m3fn"),
        "fpemu.torch.quantize bf16 sr": lambda: fpemu.torch.quantize(x, "bf16", rounding="sr",
                                                                     seed=1),
        "fpemu.quantize bf16 (Numba)": lambda: fpemu.quantize(xn, "bf16"),
        "fpemu.quantize e4m3fn (Numba)": lambda: fpemu.quantize(xn, "e4m3fn"),
    }
    print(f"fpemu.torch quantizers, 2**{args.size_log2} float32 on the CPU, torch "
          f"{torch.__version__}, ATen {torch.backends.cpu.get_cpu_capability()}; "
          "ms (median), speed relative to torch's .to(bfloat16) at the same thread count")
    print(f"{'':34}{'1 thread':>18}{'2 threads':>18}")
    res = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
        for name, fn in cases.items():
            res[name, threads] = timed(fn, args.repeats)
    for name in cases:
        cells = "".join(
            f"{res[name, k] * 1e3:9.1f} ({res['torch .to(bfloat16)', k] / res[name, k]:4.2f}x)"
            for k in (1, 2))
        print(f"{name:34}{cells}")
    ratio = res["torch .to(bfloat16)", 2] / res["fpemu.torch.quantize bf16", 2]
    ratio_out = res["torch .to(bfloat16)", 2] / res["fpemu.torch.quantize bf16 out=", 2]
    print(f"target: quantize to bf16 >= 0.5x the speed of .to(torch.bfloat16), 2 threads: "
          f"{ratio:.2f}x allocating, {ratio_out:.2f}x into out= "
          f"({'met' if ratio >= 0.5 else 'not met'} allocating)")
    # what a new float32 result (twice .to(bfloat16)'s bytes) costs torch itself
    base = res["torch .to(bfloat16)", 2]
    print(f"torch's own float32 results, 2 threads: .to(bfloat16).float() "
          f"{base / res['torch .to(bfloat16).float()', 2]:.2f}x, a bare .clone() "
          f"{base / res['torch .clone()', 2]:.2f}x")
    same_memory(args.target_log2, args.repeats)


TARGET_FORMATS = ("bf16", "fp16", "tf32", "e4m3fn", "e5m2", "e3m2", "e2m1", "e8m0")
TARGET_MODES = ({}, {"rounding": "rtz"}, {"rounding": "rup"},
                {"rounding": "sr", "seed": 1}, {"rounding": "sr", "seed": 1, "rng": "philox"})


def interleaved(a, b, repeats):
    """Medians of ``a`` and ``b`` timed in turns (after a warm-up of each), so
    that both meet the same state of a shared machine."""
    a(), b()
    ta, tb = [], []
    for _ in range(max(repeats, 5)):
        for fn, times in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def same_memory(size_log2, repeats):
    """Issue 50's CPU target: fpemu.torch on a CPU tensor against fpemu on the
    same memory, every format and mode, 2 threads; the ratio of times."""
    torch.set_num_threads(2)
    numba.set_num_threads(2)
    x = torch.randn(1 << size_log2, generator=torch.Generator().manual_seed(1)) * 50
    xn = x.numpy()
    print(f"\nfpemu.torch on a CPU tensor vs fpemu on the same memory (t.numpy()), 2**{size_log2} "
          "float32, 2 threads: ms (median), ratio (target <= 1.2)")
    print(f"{'format':8}{'mode':14}{'fpemu':>9}{'torch':>9}{'ratio':>7}"
          f"{'fpemu enc':>11}{'torch enc':>11}{'ratio':>7}")
    worst = 0.0
    for name in TARGET_FORMATS:
        for kw in TARGET_MODES:
            host, dev = interleaved(lambda: fpemu.quantize(xn, name, **kw),
                                    lambda: fpemu.torch.quantize(x, name, **kw), repeats)
            host_e, dev_e = interleaved(lambda: fpemu.encode(xn, name, **kw),
                                        lambda: fpemu.torch.encode(x, name, **kw), repeats)
            mode = kw.get("rounding", "rne") + ("/philox" if "rng" in kw else "")
            worst = max(worst, dev / host, dev_e / host_e)
            print(f"{name:8}{mode:14}{host * 1e3:9.2f}{dev * 1e3:9.2f}{dev / host:7.2f}"
                  f"{host_e * 1e3:11.2f}{dev_e * 1e3:11.2f}{dev_e / host_e:7.2f}")
    print(f"target: every ratio <= 1.2; the largest: {worst:.2f} "
          f"({'met' if worst <= 1.2 else 'not met'})")


if __name__ == "__main__":
    main()
