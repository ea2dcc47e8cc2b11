"""Time fpemu.collectives against numpy summing the same arrays, in one run.

Issue 31's target, and issue 51's for every algorithm: emulating an
all-reduce of 256 ranks x 2**20 bf16 values takes at most 2x the time numpy
needs to sum the same float32 arrays. Inputs:
bf16 values (float32 arrays), one per rank; numpy's time is ``np.sum`` over
the rank axis of the ranks stacked in one (ranks, n) float32 array, and
fpemu's is ``collectives.all_reduce`` of that same array (its first axis is
the rank). Medians of ``--repeats`` runs; numpy and the gloo model at the
thread count given (numpy's sum uses one).

    python bench/bench_collectives.py [--ranks 256] [--size-log2 20] [--repeats 5]
"""

from __future__ import annotations

import argparse

import numba
import numpy as np

import fpemu
from bench_quantize import timed  # the median of repeats after a warm-up call
from fpemu import collectives


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--size-log2", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    P, n = args.ranks, 1 << args.size_log2
    rng = np.random.default_rng(0)
    X = fpemu.quantize(rng.standard_normal((P, n), dtype=np.float32), "bf16")
    t_np = timed(lambda: np.sum(X, axis=0), args.repeats)
    print(f"all-reduce of {P} ranks x 2^{args.size_log2} bf16 values "
          f"({numba.get_num_threads()} Numba threads)")
    print(f"  numpy np.sum(ranks, axis=0), float32   {t_np * 1e3:8.1f} ms")
    rows = []
    for algorithm in ("gloo", "ring", "tree", "nvls"):
        t = timed(lambda: collectives.all_reduce(X, "bf16", algorithm=algorithm), args.repeats)
        rows.append((algorithm, t))
        print(f"  fpemu all_reduce, algorithm={algorithm!r:8s} {t * 1e3:8.1f} ms   "
              f"{t / t_np:5.2f}x numpy")
    for algorithm, t in rows:       # issue 31 (gloo), issue 51 (the NCCL models)
        ok = t <= 2 * t_np
        print(f"target: {algorithm} all-reduce time / numpy sum time {t / t_np:5.2f}  "
              f"target <= 2.0  {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
