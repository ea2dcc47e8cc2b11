"""Underflow and overflow accounting, mergeable chunk by chunk.

:func:`stats` takes an array, a format, an optional scale factor (a loss
scale: values are multiplied by it in float64 before rounding, which is
exact for powers of two) and the rounding arguments of
:func:`fpemu.quantize`, and returns :class:`Counts`. Every element lands in
exactly one class:

``nan``
    NaN inputs, and finite inputs the format turns into NaN (e8m0, with
    neither sign nor zero, does so to negative values and to zero)
``inf``
    ±inf inputs
``zero``
    exact zeros (that the format keeps as zero)
``flushed``
    nonzero inputs whose rounded value is zero (underflow to zero, including
    flush-to-zero of subnormal results)
``subnormal``
    results that are subnormal
``normal``
    results that are normal (and in range)
``overflow``
    finite inputs whose scaled magnitude exceeds the largest finite value;
    ``overflow_to`` says what they became (inf, NaN or saturated to max)

plus the largest finite magnitude (``amax``, before scaling) and a histogram
of ``floor(log2 |x * scale|)`` for the finite nonzero values, with a separate
zero bin (a finite value that the scaling takes to ±inf counts in the last
bin, one it takes to zero in the first). One kernel does it all in a single
pass over the data, without per-element temporaries: the memory it takes
does not grow with the data. Masked elements of a ``numpy.ma`` array are
skipped. Counts add:
``stats(a) + stats(b) == stats(concat(a, b))``, so
:func:`stats_chunked` walks arrays larger than memory (memory-mapped
``.npy`` files) and :func:`stats_dask` reduces the blocks of a
``dask.array``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ._callable import make_callable
from .errors import FpemuValueError
from .formats import Format
from . import _kernels
from ._jit import run_kernel
from .checks import as_format, real_array
from .quantize import Cast
from .rounding import Overflow, parse_rounding

__all__ = ["Counts", "Survey", "stats", "stats_chunked", "stats_dask", "survey", "CLASSES"]

CLASSES = ("nan", "inf", "zero", "flushed", "subnormal", "normal", "overflow")
#: Default histogram range: floor(log2 |x|) from -160 to 159 (float32's
#: range with room); values outside fall into the first or last bin.
LOG2_RANGE = (-160, 160)


@dataclasses.dataclass(frozen=True)
class Counts:
    """Mergeable counts of one array (or of many chunks, added together)."""

    format: str
    scale: float
    rounding: str
    counts: dict
    overflow_to: dict
    amax: float
    log2_lo: int
    hist: np.ndarray
    zero_bin: int

    @property
    def total(self) -> int:
        return int(np.sum(list(self.counts.values())))

    @property
    def bins(self) -> np.ndarray:
        """The exponent of each histogram bin: bin k counts floor(log2|x*s|) == k."""
        return np.arange(self.log2_lo, self.log2_lo + self.hist.size)

    def fraction(self, cls: str) -> float:
        """Share of all elements in one class (0 for an empty count)."""
        if cls not in self.counts:
            raise FpemuValueError(f"unknown class {cls!r}; the classes are {', '.join(CLASSES)}")
        return self.counts[cls] / self.total if self.total else 0.0

    def __add__(self, other: "Counts") -> "Counts":
        if not isinstance(other, Counts):
            return NotImplemented
        if (self.format, self.scale, self.rounding, self.log2_lo, self.hist.size) != (
                other.format, other.scale, other.rounding, other.log2_lo, other.hist.size):
            raise FpemuValueError(
                "cannot add Counts of different settings: "
                f"({self.format}, scale {self.scale}, {self.rounding}) and "
                f"({other.format}, scale {other.scale}, {other.rounding}); compute both with "
                "the same format, scale, rounding and histogram range"
            )
        return dataclasses.replace(
            self,
            counts={k: self.counts[k] + other.counts[k] for k in self.counts},
            overflow_to={k: self.overflow_to[k] + other.overflow_to[k] for k in self.overflow_to},
            amax=max(self.amax, other.amax),
            hist=self.hist + other.hist,
            zero_bin=self.zero_bin + other.zero_bin,
        )

    def __radd__(self, other):
        if other == 0:  # so that sum([...]) works
            return self
        return NotImplemented

    def __eq__(self, other):
        if not isinstance(other, Counts):
            return NotImplemented
        return (self.format, self.scale, self.rounding, self.counts, self.overflow_to,
                self.log2_lo, self.zero_bin) == (
            other.format, other.scale, other.rounding, other.counts, other.overflow_to,
            other.log2_lo, other.zero_bin) and np.array_equal(self.hist, other.hist) and (
            self.amax == other.amax or (self.amax != self.amax and other.amax != other.amax))

    def __str__(self) -> str:
        lines = [f"{self.total} values into {self.format} (scale {self.scale:g}, "
                 f"rounding {self.rounding}); amax {self.amax:.6g}"]
        for k in CLASSES:
            n = self.counts[k]
            extra = ""
            if k == "overflow" and n:
                extra = "  (" + ", ".join(f"{v} to {t}" for t, v in self.overflow_to.items()
                                          if v) + ")"
            lines.append(f"  {k:<10} {n:>12}  {100 * self.fraction(k):8.4f} %{extra}")
        return "\n".join(lines)


def _empty(fmt: Format, scale, mode, lo, hi):
    return Counts(fmt.name, float(scale), mode, {k: 0 for k in CLASSES},
                  {"inf": 0, "nan": 0, "saturated": 0}, 0.0, lo, np.zeros(hi - lo, np.int64), 0)


def stats(x, fmt, *, scale=1.0, rounding="rne", subnormals=True, overflow=None, seed=None,
          log2_range=LOG2_RANGE) -> Counts:
    """Count what rounding ``x * scale`` into fmt does to each element.

    One pass, no per-element temporaries. float32 input with a power-of-two
    scale runs a kernel in 32-bit lanes, about five times the float64 one
    that other input and other scales take (``docs/performance.md``).

    Examples
    --------
    >>> import fpemu
    >>> c = fpemu.stats([0.0, 1e-9, 1e-6, 1.0, 7e4, float("nan")], "fp16")
    >>> c.counts
    {'nan': 1, 'inf': 0, 'zero': 1, 'flushed': 1, 'subnormal': 1, 'normal': 1, 'overflow': 1}
    >>> fpemu.stats([1e-9], "fp16", scale=1024).counts["subnormal"]   # loss scaling saves it
    1
    """
    cast = Cast.of(fmt, rounding, subnormals, overflow)
    fmt = cast.fmt
    mode = cast.rounding.name.lower()
    if isinstance(scale, (bool, np.bool_)) or not (
            isinstance(scale, (int, float, np.integer, np.floating)) and np.isfinite(scale)
            and scale > 0):
        raise FpemuValueError(f"stats(): scale must be a finite number > 0, got {scale!r}")
    lo, hi = _log2_range(log2_range)
    if isinstance(x, np.ma.MaskedArray):
        x = x.compressed()                                # masked elements are skipped
    flat, _ = real_array(x, "stats")
    res = _empty(fmt, scale, mode, lo, hi)
    if flat.size == 0:
        return res
    key, offset = cast.seed_key(seed)
    # one block per 2**16 elements (at most 64): each thread counts its blocks
    # into rows of its own, summed here; memory is O(blocks x bins)
    nblocks = int(min(64, max(1, flat.size >> 16)))
    counts = np.zeros((nblocks, _kernels.S_HIST + hi - lo + 1), np.int64)   # + a spare slot
    amaxes = np.zeros(nblocks, np.float64)
    s = _pow2_exponent(scale) if flat.dtype == np.float32 else None
    th = None if s is None else _fast_thresholds(cast, s)
    if th is not None:
        run_kernel(_kernels.stats32_fast, flat, s, _above_bits(float(fmt.max), s), th, int(lo),
                   counts, amaxes, inputs=1)
    elif s is not None:
        run_kernel(_kernels.stats32_kernel(int(cast.rounding), cast.kernel_flags), flat,
                   cast.params, key, offset, s, _above_bits(float(fmt.max), s),
                   bool(fmt.has_zero), bool(fmt.signed), int(lo), counts, amaxes, cast.flags,
                   inputs=1)
    else:
        run_kernel(_kernels.stats_kernel(int(cast.rounding), cast.kernel_flags), flat,
                   cast.params, key, offset, float(scale), float(fmt.max),
                   float(fmt.min_normal), bool(fmt.has_zero), bool(fmt.signed), int(lo),
                   counts, amaxes, cast.flags, inputs=1)
    c = counts.sum(axis=0)
    names = {"nan": _kernels.S_NAN, "inf": _kernels.S_INF, "zero": _kernels.S_ZERO,
             "flushed": _kernels.S_FLUSHED, "subnormal": _kernels.S_SUBNORMAL,
             "normal": _kernels.S_NORMAL, "overflow": _kernels.S_OVERFLOW}
    return dataclasses.replace(
        res, counts={k: int(c[v]) for k, v in names.items()},
        overflow_to={"inf": int(c[_kernels.S_TO_INF]), "nan": int(c[_kernels.S_TO_NAN]),
                     "saturated": int(c[_kernels.S_SATURATED])},
        amax=float(amaxes.max()), hist=c[_kernels.S_HIST:-1].copy(),
        zero_bin=int(c[_kernels.S_ZERO_BIN]))


def stats_many(x, fmts, *, scale=1.0, overflows=None) -> list:
    """``[stats(x, f, scale=scale, overflow=o) for f, o in zip(fmts, overflows)]``
    (to nearest even), in one pass over ``x`` for up to four formats at a time
    where ``x`` is float32, the scale a power of two and each format has the
    nearest-even fast path (fp16, bf16, the fp8 formats, ...): the histogram
    and the amax are computed once (``_kernels.stats32_fast4``); each count
    equals :func:`stats`'s."""
    fmts = list(fmts)
    overflows = [None] * len(fmts) if overflows is None else list(overflows)
    flat = np.asarray(x)
    s = _pow2_exponent(scale) if flat.dtype == np.float32 and flat.ndim == 1 else None
    casts = [Cast.of(f, "rne", True, o) for f, o in zip(fmts, overflows)]
    fast = [] if s is None else [i for i, c in enumerate(casts)
                                 if _fast_thresholds(c, s) is not None]
    out = [None] * len(fmts)
    lo, hi = LOG2_RANGE
    for g in range(0, len(fast), 4):
        group = fast[g:g + 4]
        if len(group) < 2 or flat.size == 0:
            continue
        pad = group + [group[0]] * (4 - len(group))
        th = np.array([_fast_thresholds(casts[i], s) for i in pad], np.int64)
        bigs = np.array([_above_bits(float(casts[i].fmt.max), s) for i in pad], np.int64)
        nblocks = int(min(64, max(1, flat.size >> 16)))
        counts = np.zeros((nblocks, 4, _kernels.S_HIST + hi - lo + 1), np.int64)
        amaxes = np.zeros(nblocks, np.float64)
        run_kernel(_kernels.stats32_fast4, flat, s, bigs, th, int(lo), counts, amaxes,
                   inputs=1)
        total = counts.sum(axis=0)
        for slot, i in enumerate(group):
            c = total[slot]
            res = _empty(casts[i].fmt, scale, "rne", lo, hi)
            out[i] = dataclasses.replace(
                res, counts={k: int(c[v]) for k, v in _NAMES.items()},
                overflow_to={"inf": int(c[_kernels.S_TO_INF]), "nan": int(c[_kernels.S_TO_NAN]),
                             "saturated": int(c[_kernels.S_SATURATED])},
                amax=float(amaxes.max()), hist=c[_kernels.S_HIST:-1].copy(),
                zero_bin=int(c[_kernels.S_ZERO_BIN]))
    return [r if r is not None else stats(x, f, scale=scale, overflow=o)
            for r, f, o in zip(out, fmts, overflows)]


_NAMES = {"nan": _kernels.S_NAN, "inf": _kernels.S_INF, "zero": _kernels.S_ZERO,
          "flushed": _kernels.S_FLUSHED, "subnormal": _kernels.S_SUBNORMAL,
          "normal": _kernels.S_NORMAL, "overflow": _kernels.S_OVERFLOW}


#: the exponents s of a power-of-two scale 2**s that keep x * 2**s of every
#: finite nonzero float32 x (2**-149 <= |x| < 2**128) a float64 normal, so
#: that the float32 kernel's exponent arithmetic is the float64 product
_POW2_SCALES = (-1022 + 149, 1023 - 128)


def _pow2_exponent(scale):
    """s where ``scale`` is 2**s inside :data:`_POW2_SCALES`, else None (the
    float32 stats kernel adds s to the exponent; other scales multiply in
    float64)."""
    m, ex = math.frexp(float(scale))
    s = ex - 1
    return s if m == 0.5 and _POW2_SCALES[0] <= s <= _POW2_SCALES[1] else None


def _above_bits(fmax, s):
    """The bits of the largest float32 at or below ``fmax / 2**s``: a
    float32 x has ``|x| * 2**s > fmax`` exactly when the bits of ``|x|`` are
    above these (non-negative floats order as their bits)."""
    return _float32_bits_near(np.ldexp(np.float64(fmax), -s), at_or_above=False)


def _float32_bits_near(t, at_or_above):
    """The bits of the largest float32 at or below ``t`` (a float64 that
    holds the threshold exactly), or of the smallest at or above it; clamped
    to 0 .. the bits of +inf."""
    with np.errstate(over="ignore", under="ignore"):
        f = np.float32(t)
    if at_or_above and float(f) < t:
        f = np.nextafter(f, np.float32(np.inf))
    elif not at_or_above and float(f) > t:
        f = np.nextafter(f, np.float32(-np.inf))
    return int(f.view(np.uint32))


def _fast_thresholds(cast, s):
    """The thresholds of ``_kernels.stats32_fast`` for ``cast`` and the
    scale 2**s, or None where the cast has no nearest-even fast path: the
    bits of the largest float32 x with |x| * 2**s at most half the subnormal
    step (it rounds to zero, ties to even), of the smallest at or above
    2**emin less half a step (it rounds up to the smallest normal), and of
    the smallest whose overflow is not rounded back to the largest value
    (at or above the halfway point for IEEE-style formats, whose largest
    value is odd; above it for e4m3fn's even 448), then the count slot of
    where such an overflow goes. Each threshold divided by 2**s is a
    float64 exactly for every s that the float32 kernel takes."""
    if cast.fast is None:
        return None
    fmt = cast.fmt
    m = fmt.mantissa_bits
    step = 2.0 ** (fmt.emin - m)
    halfway = fmt.max + 2.0 ** (fmt.emax - m - 1)
    ieee = fmt.nan_encoding == "ieee"
    ovf = _float32_bits_near(np.ldexp(halfway, -s), at_or_above=ieee)
    if not ieee and ovf < 0x7F800000:
        ovf += 1                                             # strictly above: the tie stays
    dest = {Overflow.INF: _kernels.S_TO_INF, Overflow.SATURATE: _kernels.S_SATURATED,
            Overflow.NAN: _kernels.S_TO_NAN}[cast.overflow]
    return (_float32_bits_near(np.ldexp(step / 2, -s), at_or_above=False),
            _float32_bits_near(np.ldexp(2.0 ** fmt.emin - step / 2, -s), at_or_above=True),
            ovf, dest)


#: floor(log2 |x|) of a finite nonzero float64 is in -1074 .. 1023
_LOG2_LIMITS = (-1100, 1100)


def _log2_range(log2_range):
    """(lo, hi) ints with lo < hi inside _LOG2_LIMITS, or a ValueError saying so."""
    bad = None
    if not isinstance(log2_range, (tuple, list)) or len(log2_range) != 2:
        bad = "a pair"
    elif not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                 for v in log2_range):
        bad = "a pair of ints"
    else:
        lo, hi = (int(v) for v in log2_range)
        if not (_LOG2_LIMITS[0] <= lo < hi <= _LOG2_LIMITS[1]):
            bad = f"lo < hi within {_LOG2_LIMITS[0]} .. {_LOG2_LIMITS[1]}"
    if bad:
        raise FpemuValueError(
            f"stats(): log2_range must be (lo, hi), {bad}: the histogram counts "
            f"floor(log2 |x * scale|) in lo .. hi - 1 (float64 needs no more than -1074 .. "
            f"1024); got {log2_range!r}. The default is {LOG2_RANGE}"
        )
    return lo, hi


def stats_chunked(x, fmt, *, chunk=1 << 22, **kwargs) -> Counts:
    """:func:`stats` over a large array in chunks of ``chunk`` elements.

    ``x`` may be a path to a ``.npy`` file (opened memory-mapped, so it may
    be larger than memory) or any array; only about one chunk is in memory at
    a time. Chunks follow the array's memory order (a Fortran-order file is
    read column block by column block, never copied whole). The result equals
    ``stats(x, fmt, **kwargs)``; with ``rounding="sr"`` each element draws the
    random bits of its C-order index, as in one whole-array call.
    """
    if isinstance(x, (str, bytes)) or hasattr(x, "__fspath__"):
        from .tensorfiles import load_npy  # for a path only: not loaded by import fpemu
        x = load_npy(x, "stats_chunked")
    if isinstance(chunk, bool) or not (isinstance(chunk, (int, np.integer)) and chunk >= 1):
        raise FpemuValueError(f"stats_chunked(): chunk must be an int >= 1, got {chunk!r}")
    if isinstance(x, np.ma.MaskedArray):
        return stats(x, fmt, **kwargs)
    if not isinstance(x, np.ndarray):
        x, _ = real_array(x, "stats_chunked")
    sr = parse_rounding(kwargs.get("rounding", "rne")).name == "SR"
    seed, offset = kwargs.pop("seed", None), 0
    if isinstance(seed, tuple) and len(seed) == 2:
        seed, offset = seed
    total = None
    for start, part in _chunks(x, int(chunk), ordered=sr):
        kw = dict(kwargs, seed=(seed, offset + start) if sr else seed)
        part = stats(np.asarray(part), fmt, **kw)
        total = part if total is None else total + part
    return total if total is not None else stats(x.reshape(-1)[:0], fmt, seed=seed, **kwargs)


def _chunks(x: np.ndarray, chunk: int, ordered: bool):
    """(C-order flat index of the first element, block) pairs covering x.

    A C-contiguous array is cut into runs of ``chunk`` elements. Otherwise,
    if the order does not matter, a Fortran-order array is read through its
    transpose (C-contiguous, the same memory); else blocks of leading-axis
    rows, each a C-order run, at least one row long.
    """
    if x.ndim <= 1 or x.flags.c_contiguous:
        flat = x.reshape(-1)
        for start in range(0, flat.size, chunk):
            yield start, flat[start:start + chunk]
        return
    if not ordered and x.flags.f_contiguous:
        yield from _chunks(x.T, chunk, ordered)
        return
    row = int(np.prod(x.shape[1:]))
    rows = max(1, chunk // max(row, 1))
    for i in range(0, x.shape[0], rows):
        yield i * row, np.ascontiguousarray(x[i:i + rows]).reshape(-1)


def stats_dask(x, fmt, **kwargs) -> Counts:
    """:func:`stats` of a ``dask.array``: one count per block, summed.

    The blocks are computed by dask's scheduler (threads, processes or a
    ``dask.distributed`` cluster); only the small Counts travel back.
    """
    try:
        import dask  # optional dependency
    except ImportError as err:  # pragma: no cover - dask is a test dependency
        raise ImportError("stats_dask() needs dask: pip install 'dask[array]'") from err
    parts = [dask.delayed(stats)(block, fmt, **kwargs) for block in x.to_delayed().ravel()]
    return dask.delayed(sum)(parts).compute()


@dataclasses.dataclass(frozen=True)
class Survey:
    """Counts of one data set in several formats and scales (see :func:`survey`).

    ``counts[(format_name, scale)]`` is the :class:`Counts` of rounding
    ``x * scale`` into that format; ``survey[fmt, scale]`` reads it too.
    """

    formats: tuple
    scales: tuple
    counts: dict

    def __getitem__(self, key) -> Counts:
        fmt, scale = key
        name = fmt if isinstance(fmt, str) else as_format(fmt).name
        try:
            return self.counts[(as_format(name).name, float(scale))]
        except KeyError:
            raise FpemuValueError(
                f"this survey has no counts for ({name}, scale {scale:g}); it holds the "
                f"formats {', '.join(self.formats)} and the scales "
                f"{', '.join(f'{s:g}' for s in self.scales)}") from None

    @property
    def total(self) -> int:
        return next(iter(self.counts.values())).total

    def hist(self, scale=1.0):
        """(bins, counts, zeros) of ``floor(log2 |x * scale|)``, the same for every format."""
        c = self[self.formats[0], scale]
        return c.bins, c.hist, c.zero_bin


def survey(source, formats, *, scales=(1.0,), chunk=1 << 22, progress=None,
           **kwargs) -> Survey:
    """Counts of ``source`` in every format and scale, in one pass over the data.

    ``source`` is an array (memory-mapped ones are read chunk by chunk), a path
    to a ``.npy`` file, or an iterable of arrays (the tensors of a checkpoint,
    the chunks of a file), which is read once. ``progress`` is called with the
    number of elements of each chunk as it is counted (a progress bar's
    ``update``). Other keywords go to :func:`stats`.

    >>> import fpemu
    >>> s = fpemu.stats.survey([1e-9, 1e-6, 1.0], ["fp16", "bf16"], scales=(1, 1024))
    >>> s["fp16", 1].counts["flushed"], s["fp16", 1024].counts["flushed"]
    (1, 0)
    """
    single = isinstance(formats, (str, Format))
    fmts = tuple(as_format(f) for f in ([formats] if single else formats))
    if not fmts:
        raise FpemuValueError("survey(): formats is empty; pass at least one, e.g. ['fp16']")
    scale_list = tuple(float(s) for s in scales)
    if not scale_list:
        raise FpemuValueError("survey(): scales is empty; pass at least one, e.g. (1.0,)")
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        from .tensorfiles import load_npy  # for a path only: not loaded by import fpemu
        parts = [load_npy(source, "survey")]
    elif isinstance(source, (np.ndarray, list, tuple)) and not (
            isinstance(source, (list, tuple)) and source
            and all(isinstance(a, np.ndarray) for a in source)):
        parts = [source]
    else:
        parts = source
    # stochastic rounding: each element draws the bits of its index in the whole
    # (concatenated, C-order) data, as in one call; the chunking does not matter
    sr = parse_rounding(kwargs.get("rounding", "rne")).name == "SR"
    seed, offset = kwargs.pop("seed", None), 0
    if isinstance(seed, tuple) and len(seed) == 2:
        seed, offset = seed
    totals = {}
    for part in parts:
        if not isinstance(part, np.ndarray) or isinstance(part, np.ma.MaskedArray):
            part = part if isinstance(part, np.ma.MaskedArray) else np.asarray(part)
            pieces = [(0, part)]
        else:
            pieces = _chunks(part, int(chunk), ordered=sr)
        for start, piece in pieces:
            n = 0
            kw = dict(kwargs, seed=(seed, offset + start) if sr else seed)
            for f in fmts:
                for s in scale_list:
                    c = stats(piece, f, scale=s, **kw)
                    key = (f.name, s)
                    totals[key] = c if key not in totals else totals[key] + c
                    n = c.total
            if progress is not None:
                progress(n)
        offset += int(np.size(part))
    if not totals:
        for f in fmts:
            for s in scale_list:
                totals[(f.name, s)] = stats(np.zeros(0, np.float32), f, scale=s, seed=seed,
                                            **kwargs)
    return Survey(tuple(f.name for f in fmts), scale_list, totals)


make_callable(__name__)   # fpemu.stats(x, fmt) is stats(x, fmt); see fpemu._callable
