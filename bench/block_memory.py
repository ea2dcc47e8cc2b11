"""Peak memory of ``fpemu.block.quantize_blocks`` for every preset.

Each preset runs in a process of its own on 2**26 standard-normal float32
values (256 MiB, made without a float64 temporary), after a small warm-up
call. Two measures of what the call needs beyond its input: the peak of
tracemalloc (numpy reports its allocations to it, and fpemu's kernels write
into numpy arrays) and the growth of the process's peak resident size.

    python bench/block_memory.py [--log2n 26] [PRESET ...]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time


def measure(preset, log2n):
    import tracemalloc

    import numpy as np

    from fpemu import block
    x = np.random.default_rng(0).standard_normal((2**log2n // 1024, 1024), dtype=np.float32)
    block.quantize_blocks(x[:64], preset)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    t = time.perf_counter()
    q = block.quantize_blocks(x, preset)
    dt = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    del q
    print(f"{preset:14s} {peak / x.nbytes:6.2f}x {grown / x.nbytes:8.2f}x {dt:7.2f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*")
    ap.add_argument("--log2n", type=int, default=26)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        measure(args.one, args.log2n)
        return 0
    from fpemu import block
    print(f"2**{args.log2n} float32 values; peak beyond the input, as a multiple of it")
    print(f"{'preset':14s} {'traced':>7s} {'rss grew':>9s} {'time':>9s}")
    for preset in args.presets or list(block.PRESETS):
        subprocess.run([sys.executable, __file__, "--one", preset, "--log2n", str(args.log2n)],
                       check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
