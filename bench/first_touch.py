"""What a freshly allocated output costs a loop that writes it, by write order.

A new numpy array of 4 MB or more is not backed by memory until it is first
written; numpy asks for transparent huge pages, so the first write into each
2 MB page takes a fault in which the kernel zeroes the page. This script
times one loop (out = 2 * x over 2**24 float32 values, Numba, 1 thread) into
fresh and into already-touched memory, with the blocks written in ascending
and in descending address order, beside ``x.copy()`` (which allocates too) and
a loop that only touches one value per 4 KB page. fpemu's element-wise
kernels write in descending order (``fpemu/_kernels/loops.py``, "Output order").

    python bench/first_touch.py [--size-log2 24] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

LANES = 16


# ascending and descending are written out twice on purpose: with the order
# as a run-time flag the loop ran 5-20 % slower, and it would no longer be
# the shape of fpemu's kernels
@numba.njit(cache=True)
def ascending(x, out):
    n = x.size
    nb = n // LANES
    for b in range(nb):
        i0 = b * LANES
        xs = x[i0:i0 + LANES]
        o = out[i0:i0 + LANES]
        for j in range(LANES):
            o[j] = xs[j] * np.float32(2.0)
    for i in range(nb * LANES, n):
        out[i] = x[i] * np.float32(2.0)


@numba.njit(cache=True)
def descending(x, out):
    n = x.size
    nb = n // LANES
    for b in range(nb):
        i0 = (nb - 1 - b) * LANES
        xs = x[i0:i0 + LANES]
        o = out[i0:i0 + LANES]
        for j in range(LANES):
            o[j] = xs[j] * np.float32(2.0)
    for i in range(nb * LANES, n):
        out[i] = x[i] * np.float32(2.0)


@numba.njit(cache=True)
def touch(x, out):
    for i in range(0, out.size, 1024):
        out[i] = np.float32(0.0)


def ms(fn, x, fresh, repeats):
    out = np.empty_like(x)
    fn(x, out)
    times = []
    for _ in range(repeats):
        if fresh:
            out = np.empty_like(x)
        t = time.perf_counter()
        fn(x, out)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-log2", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    numba.set_num_threads(1)
    x = np.random.default_rng(0).standard_normal(1 << args.size_log2).astype(np.float32)
    print(f"first touch: out = 2 * x, {x.size} float32 values ({x.nbytes >> 20} MB), "
          f"1 thread, median of {args.repeats}, ms")
    copy = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        y = x.copy()
        copy.append(time.perf_counter() - t)
        del y
    print(f"  {'x.copy() (allocates)':34s} {statistics.median(copy) * 1e3:7.2f}")
    print(f"  {'touch one value per 4 KB, fresh':34s} {ms(touch, x, True, args.repeats):7.2f}")
    for name, fn in (("ascending", ascending), ("descending", descending)):
        fresh, warm = ms(fn, x, True, args.repeats), ms(fn, x, False, args.repeats)
        print(f"  {name + ' loop, fresh / touched':34s} {fresh:7.2f} / {warm:5.2f}  "
              f"({fresh / warm:4.2f}x)")


if __name__ == "__main__":
    main()
