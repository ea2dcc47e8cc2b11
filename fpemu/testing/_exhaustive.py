"""A conversion over every input of a source type (:func:`exhaustive`)."""

from __future__ import annotations

import sys
import time

import numpy as np

import fpemu
from ..errors import FpemuValueError
from ._assert import Report, _config, _to_numpy

__all__ = ["exhaustive", "SOURCES"]

#: The sources :func:`exhaustive` sweeps: how many inputs each has.
SOURCES = {"bf16": 1 << 16, "fp16": 1 << 16, "e4m3fn": 256, "e5m2": 256, "fp8": 512,
           "float32": 1 << 32}


def _inputs(source, start, stop):
    """The source's inputs ``start:stop`` (by bit pattern), as float32."""
    if source == "float32":
        return np.arange(start, stop, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if source == "bf16":
        every = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)
    elif source == "fp16":
        every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    else:
        names = ("e4m3fn", "e5m2") if source == "fp8" else (source,)
        every = np.concatenate([fpemu.decode(np.arange(256, dtype=np.uint8), n)
                                for n in names]).astype(np.float32)
    return every[start:stop]


class _Progress:
    """A progress bar (tqdm where installed, else lines on stderr) with the
    time left."""

    def __init__(self, total, what, on):
        self.total, self.done, self.t0, self.on = total, 0, time.perf_counter(), on
        self.bar = None
        if on:
            try:
                from tqdm.auto import tqdm  # optional dependency
                self.bar = tqdm(total=total, unit="value", unit_scale=True, desc=what)
            except ImportError:
                self.what = what

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.on:
            spent = time.perf_counter() - self.t0
            left = spent / self.done * (self.total - self.done)
            print(f"{self.what}: {self.done:,} of {self.total:,} inputs, {spent:.0f} s, about "
                  f"{left:.0f} s left", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def exhaustive(fn, fmt, source="bf16", *, rounding="rne", subnormals=True, overflow=None,
               chunk=1 << 24, start=0, stop=None, progress=None, shown=5):
    """Run a conversion over every input of ``source`` and compare it with
    fpemu, as :func:`fpemu.testing.assert_quantized_equal` does.

    Parameters
    ----------
    fn : callable
        ``fn(x)`` takes a 1-D float32 NumPy array (every value of the source
        is a float32) and returns the conversion's results for it: values
        or codes, NumPy or torch (see :func:`assert_quantized_equal`).
    fmt, rounding, subnormals, overflow
        The rounding the conversion should do (as in :func:`fpemu.quantize`).
    source : str
        ``"bf16"`` or ``"fp16"`` (all 65,536 bit patterns), ``"e4m3fn"``,
        ``"e5m2"``, ``"fp8"`` (both: 512), or ``"float32"`` (all 2**32, in
        chunks of ``chunk``).
    start, stop : int
        Sweep only the inputs ``start:stop`` (by bit pattern): a slice of
        the float32 sweep, say.
    progress : bool, optional
        Show a progress bar with the time left (tqdm where installed, else
        lines on stderr); by default for sweeps of more than one chunk.

    Returns
    -------
    Report
        What was compared (``compared``); there were no mismatches. A
        format without NaN (e2m1, say) has no rule for a NaN input: the
        sweep does not compare those and counts them (``skipped_nan``).

    Raises
    ------
    AssertionError
        After the whole sweep, with the mismatches by class, the rules the
        conversion follows instead, and the first mismatches.
    """
    if source not in SOURCES:
        raise FpemuValueError(f"fpemu.testing.exhaustive: source must be one of "
                              f"{', '.join(map(repr, SOURCES))}, got {source!r}")
    if not callable(fn):
        raise FpemuValueError(f"fpemu.testing.exhaustive: fn must be the conversion to test "
                              f"(a callable taking a float32 array), got {type(fn).__name__}")
    total = SOURCES[source]
    stop = total if stop is None else stop
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop <= total):
        raise FpemuValueError(f"fpemu.testing.exhaustive: start and stop must be ints with "
                              f"0 <= start <= stop <= {total:,} for {source!r}, got {start!r} "
                              f"and {stop!r}")
    if not (isinstance(chunk, int) and chunk >= 1):
        raise FpemuValueError(f"fpemu.testing.exhaustive: chunk must be a positive int, "
                              f"got {chunk!r}")
    report = Report(_config(fmt, rounding, subnormals, overflow, None), shown, skip_nan=True)
    on = (stop - start) > chunk if progress is None else bool(progress)
    bar = _Progress(stop - start, f"{source} -> {report.cfg.fmt.name}", on)
    try:
        for s in range(start, stop, chunk):
            x = _inputs(source, s, min(s + chunk, stop))
            got = _to_numpy(fn(x.copy()), "fn(x)")       # a copy: fn may write into it
            if got.shape != x.shape:
                raise FpemuValueError(f"fpemu.testing.exhaustive: fn returned shape "
                                      f"{got.shape} for {x.shape[0]} inputs; return one "
                                      "result per input")
            if got.dtype.kind in "iu":
                got = fpemu.decode(got.astype(report.cfg.fmt.code_dtype), report.cfg.fmt)
            report.add(got, x, offset=s)
            bar.update(x.size)
    finally:
        bar.close()
    if report.mismatches:
        raise AssertionError(report.message())
    return report
