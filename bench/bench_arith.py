"""Time fpemu's arithmetic and accumulation models against native peers.

Elementwise add and fma on 2**22 values (a, b, c drawn as bf16 / fp16 values
stored in float32) against numpy's float32 / float16 arithmetic and
ml_dtypes' bfloat16 arithmetic, which computes each bf16 operation in float32
and rounds. 512x512x512 matmul with bf16 inputs under the sequential fp32
model and the h100 tensor-core model against numpy's float32 ``@``. Median of
``--repeats`` runs, all in this process; ratios are fpemu / peer (for
matmul: how many times slower fpemu is).

    python bench/bench_arith.py [--size-log2 22] [--repeats 7]
"""

from __future__ import annotations

import argparse

import numba
import numpy as np

import fpemu
from bench_quantize import timed  # the same timing rule as the quantize bench
from fpemu import accumulate


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-log2", type=int, default=22)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = 1 << args.size_log2
    rng = np.random.default_rng(0)
    raw = [rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n)) for _ in range(3)]
    lines = []
    threads = numba.config.NUMBA_NUM_THREADS
    print(f"elementwise, {n} values, M/s (fpemu at {threads} numba threads)")
    rows = []
    for fmt in ("bf16", "fp16"):
        a, b, c = (fpemu.quantize(r, fmt) for r in raw)
        t_add = timed(lambda: fpemu.add(a, b, fmt), args.repeats)
        t_fma = timed(lambda: fpemu.fma(a, b, c, fmt), args.repeats)
        rows.append((f"fpemu add {fmt}", n / t_add / 1e6, None))
        rows.append((f"fpemu fma {fmt}", n / t_fma / 1e6, None))
        if fmt == "fp16":
            a16, b16, c16 = (x.astype(np.float16) for x in (a, b, c))
            t = timed(lambda: a16 + b16, args.repeats)
            rows.append(("numpy float16 add", n / t / 1e6, t_add / t))
            with np.errstate(over="ignore"):
                t = timed(lambda: a16 * b16 + c16, args.repeats)
            rows.append(("numpy float16 mul+add (unfused)", n / t / 1e6, t_fma / t))
        else:
            try:
                import ml_dtypes
                ab, bb, cb = (x.astype(ml_dtypes.bfloat16) for x in (a, b, c))
                t = timed(lambda: ab + bb, args.repeats)
                rows.append(("ml_dtypes bfloat16 add", n / t / 1e6, t_add / t))
                t = timed(lambda: ab * bb + cb, args.repeats)
                rows.append(("ml_dtypes bfloat16 mul+add (unfused)", n / t / 1e6, t_fma / t))
            except ImportError as e:
                lines.append(f"ml_dtypes not installed ({e})")
    f32 = [x.astype(np.float32) for x in raw]
    t = timed(lambda: f32[0] + f32[1], args.repeats)
    rows.append(("numpy float32 add", n / t / 1e6, None))
    t_add32 = timed(lambda: fpemu.add(f32[0], f32[1], "fp32"), args.repeats)
    rows.append(("fpemu add fp32", n / t_add32 / 1e6, t_add32 / t))
    for name, rate, ratio in rows:
        extra = "" if ratio is None else f"   fpemu is {1 / ratio:6.2f}x its speed"
        print(f"  {name:<40} {rate:9.1f}{extra}")

    print("\nmatmul 512x512x512, bf16 inputs, ms")
    a = fpemu.quantize(rng.standard_normal((512, 512)), "bf16")
    b = fpemu.quantize(rng.standard_normal((512, 512)), "bf16")
    t_np = timed(lambda: a @ b, args.repeats)
    print(f"  {'numpy float32 @':<40} {1e3 * t_np:9.2f}")
    for model in ("sequential", "h100", "pairwise", "exact"):
        t = timed(lambda: accumulate.matmul(a, b, "bf16", model=model), max(3, args.repeats // 2))
        print(f"  {'fpemu ' + model + ' (fp32 acc)':<40} {1e3 * t:9.2f}   {t / t_np:7.1f}x numpy")
    for line in lines:
        print(line)


if __name__ == "__main__":
    main()
