"""Hypothesis strategies that land on every class and edge of a format.

Random normal data almost never hits a tie, a class boundary or a scale
edge, and those are where conversions go wrong. These strategies draw the
inputs a format's rules are about, by kind:

``zero``, ``subnormal``, ``normal``, ``max``, ``inf``, ``nan``
    values of each class (grid values of the format; every NaN pattern of
    the source type: quiet, signalling, negative, with a payload);
``midpoint``, ``near_midpoint``
    exactly halfway between two neighbouring values of the format, and one
    ulp of the source type either side of such a midpoint;
``overflow_threshold``, ``flush_threshold``
    just below, at and just above the value where rounding to nearest
    overflows (the largest value plus half its ulp) or where rounding up
    does (plus a whole ulp), and the value below which rounding to nearest
    flushes to zero (half the smallest subnormal, or half the smallest
    normal in a format without subnormals);
``power_of_two``
    every power of two from below the format's smallest value to above its
    largest.

Both signs where the format has them. A kind that the source type cannot
hold exactly (fp32's midpoints in float32, say) is left out of the default
kinds, and naming it raises. Custom formats (:meth:`fpemu.Format.custom`)
work like the named ones.

Each draw of :func:`values` is a 0-d NumPy array of the source dtype (so that
``torch.from_numpy(x)`` and NumPy casts take it, and ``float(x)`` gives the
number); :func:`arrays` draws whole arrays of such values. The profile
``"fpemu"`` (``settings.load_profile("fpemu")``, or pytest's
``--hypothesis-profile=fpemu``) turns off the deadline, which a first call
of a JIT-compiled kernel would miss, and runs 200 examples. For example,
torch's bf16 cast on every kind of input:

>>> from hypothesis import given
>>> from fpemu.testing import strategies, assert_quantized_equal
>>> import torch
>>> @given(strategies.values("bf16"))
... def test_torch_bf16(x):
...     assert_quantized_equal(torch.from_numpy(x).to(torch.bfloat16).float().numpy(), x, "bf16")
>>> test_torch_bf16()
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
except ImportError as err:                                  # pragma: no cover
    raise ImportError("fpemu.testing.strategies needs hypothesis: pip install hypothesis "
                      "(or pip install 'fpemu[dev]')") from err

from .. import block as _block
from ..errors import FpemuTypeError, FpemuValueError
from ..formats import FORMATS, Format
from ..formats import format as _lookup
from ._assert import _format

__all__ = ["KINDS", "BLOCK_KINDS", "values", "arrays", "edge_inputs", "formats", "kinds_of",
           "blocks"]

#: Every kind of input :func:`values` knows, in the order of the module text.
KINDS = ("zero", "subnormal", "normal", "max", "inf", "nan", "midpoint", "near_midpoint",
         "overflow_threshold", "flush_threshold", "power_of_two")

_DTYPES = {np.dtype(np.float16): np.uint16, np.dtype(np.float32): np.uint32,
           np.dtype(np.float64): np.uint64}

settings.register_profile(
    "fpemu", deadline=None, max_examples=200,
    suppress_health_check=(HealthCheck.too_slow,))


def _dtype(dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in _DTYPES:
        raise FpemuValueError(f"fpemu.testing.strategies: dtype must be one of float16, "
                              f"float32, float64 (the source type of the inputs), got "
                              f"{dtype!r}; pass dtype=np.float32")
    return dt


class _Source:
    """What a source dtype holds exactly: significand bits after the point,
    the exponent of its smallest subnormal, and of its largest binade."""

    def __init__(self, dt):
        fi = np.finfo(dt)
        self.dt, self.uint = dt, _DTYPES[dt]
        self.nmant, self.emin_sub, self.emax = fi.nmant, fi.minexp - fi.nmant, fi.maxexp - 1

    def holds(self, sig_bits, low_exp, high_exp):
        """Whether numbers of ``sig_bits`` significand bits after the point,
        whose last bit is ``2**low_exp`` and whose binade is at most
        ``high_exp``, are exact in the source type."""
        return sig_bits <= self.nmant and low_exp >= self.emin_sub and high_exp <= self.emax

    def bits(self, v):
        """The source type's bit pattern of the exact float64 ``v`` (an int)."""
        with np.errstate(over="ignore"):
            return int(np.array(v, dtype=self.dt).view(self.uint))

    def around(self, t):
        """The source values just below, at (where it holds it) and just
        above the exact float64 ``t`` > 0, as bit patterns."""
        with np.errstate(over="ignore"):
            c = np.array(t, dtype=self.dt)
        inf = np.array(np.inf, dtype=self.dt)
        if float(c) == t:
            pts = [np.nextafter(c, -inf), c, np.nextafter(c, inf)]
        elif float(c) < t:
            pts = [c, np.nextafter(c, inf)]
        else:
            pts = [np.nextafter(c, -inf), c]
        return sorted({int(np.array(p, dtype=self.dt).view(self.uint)) for p in pts})


class _Grid:
    """A format's values as exact float64 numbers, by index: subnormal
    ``m * 2**(emin - M)``, normal ``(2**M + m) * 2**(e - M)``."""

    def __init__(self, f: Format):
        self.f, self.M, self.emin, self.emax = f, f.mantissa_bits, f.emin, f.emax
        self.top = f.max_code & ((1 << self.M) - 1)          # the largest's mantissa field
        self.n_normal = (self.emax - self.emin) * (1 << self.M) + self.top + 1
        self.n_sub = (1 << self.M) - 1 if f.has_subnormals else 0

    def normal(self, i):
        e, m = self.emin + (i >> self.M), i & ((1 << self.M) - 1)
        return float(((1 << self.M) + m) * Fraction(2) ** (e - self.M)), e

    def sub(self, m):
        return float(m * Fraction(2) ** (self.emin - self.M))


def _kind_tables(f: Format, src: _Source):
    """{kind: (n, pick)} for the kinds the source type holds exactly: the
    kind's ``n`` positive values (or NaNs), ``pick(i)`` the bit pattern of
    value ``i`` (0 <= i < n)."""
    g, M = _Grid(f), f.mantissa_bits
    out = {}

    def table(pats):
        pats = list(pats)
        return len(pats), pats.__getitem__

    if f.has_zero:
        out["zero"] = table([src.bits(0.0)])
    if g.n_sub and src.holds(M, f.emin - M, f.emin):
        out["subnormal"] = (g.n_sub, lambda i: src.bits(g.sub(i + 1)))
    if src.holds(M, f.emin - M, f.emax):
        out["normal"] = (g.n_normal, lambda i: src.bits(g.normal(i)[0]))
        out["max"] = table([src.bits(f.max)])
    out["inf"] = table([src.bits(np.inf)])
    if f.has_nan:
        w = 8 * src.dt.itemsize
        q = 1 << (src.nmant - 1)                                 # the quiet bit
        exp = ((1 << (w - 1 - src.nmant)) - 1) << src.nmant      # all-ones exponent field
        out["nan"] = table([exp | q, exp | q | 1, exp | 1, exp | ((1 << src.nmant) - 1)])
    if src.holds(M + 1, f.emin - M - 1, f.emax):          # the lowest midpoint's last bit
        def midpoint(i):
            if i < g.n_sub:                                 # between subnormals i and i + 1
                return g.sub(i) + float(Fraction(2) ** (f.emin - M - 1))
            v, e = g.normal(i - g.n_sub)
            return v + float(Fraction(2) ** (e - M - 1))
        first = 1 if g.n_sub else 0                        # (0, smallest): the flush threshold
        n_mid = g.n_sub + g.n_normal - 1 - first           # every value below the largest
        out["midpoint"] = (n_mid, lambda i: src.bits(midpoint(first + i)))

        def near(i):
            m = np.array(midpoint(first + i // 2), src.dt)
            return src.bits(float(np.nextafter(m, np.array((i % 2 * 2 - 1) * np.inf, src.dt))))
        out["near_midpoint"] = (2 * n_mid, near)
    ulp_max = float(Fraction(2) ** (f.emax - M))
    out["overflow_threshold"] = table(sorted(set(src.around(f.max + ulp_max / 2)
                                                 + src.around(f.max + ulp_max))))
    if f.has_zero:
        out["flush_threshold"] = table(src.around(f.min_subnormal / 2))
    klo = max(f.emin - M - 2 if f.has_subnormals else f.emin - 2, src.emin_sub)
    khi = min(f.emax + 2, src.emax)
    out["power_of_two"] = (khi - klo + 1, lambda i: src.bits(float(Fraction(2) ** (klo + i))))
    return out


def _tables(fmt, kinds, dtype):
    """The kind tables asked for, the source, and the sign bit (0 for an
    unsigned format)."""
    f, dt = _format(fmt), _dtype(dtype)
    src = _Source(dt)
    have = _kind_tables(f, src)
    if kinds is None:
        kinds = tuple(k for k in KINDS if k in have)
    else:
        if isinstance(kinds, str):
            kinds = (kinds,)
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise FpemuValueError(f"fpemu.testing.strategies: unknown kinds {unknown}; the "
                                  f"kinds are {', '.join(KINDS)}")
        missing = [k for k in kinds if k not in have]
        if missing:
            raise FpemuValueError(
                f"fpemu.testing.strategies: {f.name} from {dt.name} has no input of kind "
                f"{', '.join(missing)} (the format lacks the class, or {dt.name} cannot hold "
                f"those values exactly); its kinds here: {', '.join(k for k in KINDS if k in have)}"
                f". Leave kinds= out, or pass a wider dtype=")
        if not kinds:
            raise FpemuValueError("fpemu.testing.strategies: kinds= names no kind; leave it "
                                  "out for every kind")
    sign = (1 << (8 * dt.itemsize - 1)) if f.signed else 0
    return [have[k] for k in kinds], src, sign


def _bit_patterns(fmt, kinds, dtype):
    tables, src, sign = _tables(fmt, kinds, dtype)

    def pick(t):
        # the kind, then a value of it from a wide draw: one flat draw per example (fast),
        # and a kind of a few values still gets its share (hypothesis repeats no draw)
        n, fn = tables[t[0]]
        return fn(t[1] % n) | (sign if t[2] else 0)

    return st.tuples(st.integers(0, len(tables) - 1), st.integers(0, (1 << 31) - 1),
                     st.booleans() if sign else st.just(False)).map(pick), src


def values(fmt, kinds=None, dtype=np.float32):
    """Inputs of ``fmt``'s kinds (module text): 0-d arrays of ``dtype``.

    Parameters
    ----------
    fmt : str or fpemu.Format
        The format the inputs are for (custom formats too).
    kinds : sequence of str, optional
        Some of :data:`KINDS`; by default every kind the format has and the
        source type holds exactly.
    dtype : numpy float dtype
        The source type: float32 (default), float64 or float16.
    """
    pats, src = _bit_patterns(fmt, kinds, dtype)
    return pats.map(lambda b: np.array(b, dtype=src.uint).view(src.dt))


def arrays(fmt, shape, kinds=None, dtype=np.float32):
    """Arrays of ``shape`` (an int or a tuple) whose every element is drawn
    as by :func:`values`."""
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise FpemuTypeError(f"fpemu.testing.strategies.arrays: shape must be an int or a "
                             f"tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in shape):
        raise FpemuValueError(f"fpemu.testing.strategies.arrays: shape {shape} has a "
                              "negative length")
    pats, src = _bit_patterns(fmt, kinds, dtype)
    n = int(np.prod(shape))
    return st.lists(pats, min_size=n, max_size=n).map(
        lambda b: np.array(b, dtype=src.uint).view(src.dt).reshape(shape))


def edge_inputs(fmt, kinds=None, dtype=np.float32, per_kind=65536):
    """Every input of ``fmt``'s kinds (module text) as one 1-D array of
    ``dtype``, both signs, kind after kind: not a strategy, but the same
    inputs for a kernel that is best run on a whole tensor at once (a GPU
    kernel, where a launch per hypothesis example is slow).

    Parameters
    ----------
    fmt, kinds, dtype
        As for :func:`values`.
    per_kind : int or None
        At most this many values of a kind (per sign), evenly spaced through
        it with its first and last; ``None`` for all of them. Only kinds of
        wide formats have more than the default 65,536 (fp32's normal
        values, or tf32's from float32).

    Examples
    --------
    >>> x = edge_inputs("e4m3fn", kinds=("max", "overflow_threshold"))
    >>> x.tolist()  # doctest: +NORMALIZE_WHITESPACE
    [448.0, -448.0, 463.9999694824219, 464.0, 464.0000305175781, 479.9999694824219, 480.0,
     480.0000305175781, -463.9999694824219, -464.0, -464.0000305175781, -479.9999694824219,
     -480.0, -480.0000305175781]
    """
    if per_kind is not None and not (isinstance(per_kind, (int, np.integer)) and per_kind >= 2):
        raise FpemuValueError(f"fpemu.testing.strategies.edge_inputs: per_kind must be an int "
                              f">= 2 (or None for every value), got {per_kind!r}")
    tables, src, sign = _tables(fmt, kinds, dtype)
    out = []
    for n, fn in tables:
        if per_kind is None or n <= per_kind:
            idx = range(n)
        else:
            idx = np.unique(np.linspace(0, n - 1, int(per_kind)).round().astype(np.int64))
        pats = np.array([fn(int(i)) for i in idx], dtype=src.uint)
        out.append(pats)
        if sign:
            out.append(pats | src.uint(sign))
    return np.concatenate(out).view(src.dt)


def _custom():
    """Custom formats: 2..8 exponent bits, 0..7 mantissa bits, every NaN
    encoding, a shifted bias, with and without subnormals."""
    def build(t):
        E, M, shift, nan, subnormals = t
        try:
            return Format.custom(E, M, bias=2 ** (E - 1) - 1 + shift, nan_encoding=nan,
                                 has_subnormals=subnormals)
        except (FpemuValueError, FpemuTypeError):
            return None
    return st.tuples(st.integers(2, 8), st.integers(0, 7), st.integers(-3, 3),
                     st.sampled_from(("ieee", "fn", "fnuz", "none")), st.booleans()).map(
        build).filter(lambda f: f is not None)


def formats(custom=True):
    """Formats: every named one (:data:`fpemu.formats.FORMATS`) and, with
    ``custom``, custom formats (:meth:`fpemu.Format.custom`)."""
    named = st.sampled_from(FORMATS)
    return st.one_of(named, _custom()) if custom else named


def kinds_of(fmt, dtype=np.float32):
    """The kinds :func:`values` draws for ``fmt`` from ``dtype`` by default."""
    have = _kind_tables(_format(fmt), _Source(_dtype(dtype)))
    return tuple(k for k in KINDS if k in have)


# ------------------------------------------------------------------ blocks
#: The kinds of block :func:`blocks` draws (per block), and of tensor
#: (``tiny_tensor_amax``: every value of the tensor tiny; ``tail``: the last
#: block shorter than the others).
BLOCK_KINDS = ("random", "pow2_amax", "pow2_amax_ulp", "scale_min", "scale_subnormal_edge",
               "scale_max", "zero", "nan", "inf", "tiny_tensor_amax", "tail")


def _scale_targets(spec):
    """{kind: (scale values)} that a block's scale should land on, for the
    preset's scale format: e4m3 (NVFP4): its smallest subnormal, the top of
    its subnormals and its smallest normal, its largest; e8m0 (MX): 2**-127
    and 2**127; fp32: none of its own (the tensor reaches float32's ends)."""
    name = _lookup(spec.scale_fmt).name
    if name == "e4m3fn":
        return {"scale_min": (2.0**-9,), "scale_subnormal_edge": (7 * 2.0**-9, 2.0**-6),
                "scale_max": (448.0,)}
    if name == "e8m0":
        return {"scale_min": (2.0**-127,), "scale_max": (2.0**127,)}
    return {}


def blocks(preset, n_blocks=4, kinds=None, rows=(1, 2)):
    """float32 arrays for a block preset of :data:`fpemu.block.PRESETS` (or an
    :class:`fpemu.block.BlockSpec` of one's own, custom formats too), whose
    blocks are drawn by kind (:data:`BLOCK_KINDS`): random values; the block
    amax exactly a power of two (or the element format's largest times a
    power of two), or one float32 ulp above it; amaxes whose
    block scale lands at the scale format's smallest value, the edge of its
    subnormals, or its largest (for NVFP4 against the tensor amax the array
    holds, as TransformerEngine's two-level scale does); all-zero blocks;
    a NaN or an infinity in a block; and, for the whole tensor, a tiny
    amax (every value below 2**-100) or a tail shorter than a block.

    1-D presets: shape (rows, n_blocks * block [+ tail]), blocks along the
    last axis; 2-D presets (tiles): (rows * tile rows, n_blocks * tile
    columns [+ tail]). ``rows``: the range of the first number.
    """
    if isinstance(preset, _block.BlockSpec):
        spec = preset
    elif isinstance(preset, str) and preset in _block.PRESETS:
        spec = _block.PRESETS[preset]
    else:
        raise FpemuValueError(f"fpemu.testing.strategies.blocks: preset must be a name of "
                              f"fpemu.block.PRESETS ({', '.join(_block.PRESETS)}) or an "
                              f"fpemu.block.BlockSpec, got {preset!r}")
    preset = spec.name
    targets = _scale_targets(spec)
    two_level = _lookup(spec.scale_fmt).name == "e4m3fn"
    have = [k for k in BLOCK_KINDS if not k.startswith("scale_") or k in targets]
    if kinds is None:
        kinds = tuple(have)
    else:
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        bad = [k for k in kinds if k not in have]
        if bad:
            raise FpemuValueError(f"fpemu.testing.strategies.blocks: {preset} has no kind "
                                  f"{', '.join(map(repr, bad))}; its kinds: {', '.join(have)}")
    per_block = [k for k in kinds if k not in ("tiny_tensor_amax", "tail")] or ["random"]
    if not (isinstance(n_blocks, int) and n_blocks >= 1):
        raise FpemuValueError(f"fpemu.testing.strategies.blocks: n_blocks must be an int >= 1, "
                              f"got {n_blocks!r}")
    elem = _lookup(spec.elem)
    ty, tx = spec.block if isinstance(spec.block, tuple) else (1, spec.block)

    # the strategies an example draws from, built once (building one costs more than
    # drawing from it)
    rows_s, tail_s = st.integers(*rows), st.integers(0, tx - 1)
    seed_s, top_s, tiny_s = st.integers(0, 2**32 - 1), st.integers(-20, 20), st.integers(100, 125)
    kind_s = st.sampled_from(per_block)
    kinds_s = {}

    @st.composite
    def draw(d):
        # hypothesis draws the shape, the tensor amax and each block's kind (they shrink
        # toward one row, no tail, random blocks); the values come from a generator seeded
        # by one more draw, which keeps an example to a few draws (fast)
        nr = d(rows_s)
        tail = d(tail_s) if "tail" in kinds and tx > 1 else 0
        shape = (nr * ty, n_blocks * tx + tail)
        rng = np.random.default_rng(d(seed_s))
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 1, shape))
        x = np.clip(x, -1, 1)                      # random values, a few binades, |x| <= 1
        cols = [(c * tx, min((c + 1) * tx, shape[1])) for c in range(n_blocks + (tail > 0))]
        tiles = [(r, c) for r in range(nr) for c in range(len(cols))]
        n = len(tiles)
        if n not in kinds_s:
            kinds_s[n] = st.lists(kind_s, min_size=n, max_size=n)
        picked = d(kinds_s[n])
        top = 2.0 ** d(top_s)                                 # the tensor amax
        x[0, 0] = top                                         # held by the first element
        for (r, c), kind in zip(tiles, picked):
            if (r, c) == (0, 0) or kind == "random":
                continue                                      # (the first holds the amax)
            blk = x[r * ty:(r + 1) * ty, cols[c][0]:cols[c][1]]
            pos = (int(rng.integers(blk.shape[0])), int(rng.integers(blk.shape[1])))
            sign = float(rng.choice((-1.0, 1.0)))
            if kind == "zero":
                blk[...] = 0.0 * np.sign(blk)                  # (with negative zeros)
            elif kind in ("pow2_amax", "pow2_amax_ulp"):
                # a power of two, or the element format's largest times one: the
                # edges of the floor and of the rounded-up (rceil) scale rules
                a = min(2.0 ** int(rng.integers(-30, 21)) * float(rng.choice((1.0, elem.max))),
                        top)
                blk *= a / max(np.abs(blk).max(), 2.0**-60) / 2
                v = np.float32(a)
                if kind == "pow2_amax_ulp":
                    v = np.nextafter(v, np.float32(np.inf))
                    if v > top:
                        continue
                blk[pos] = float(v) * sign
            elif kind in ("nan", "inf"):
                blk[pos] = np.nan if kind == "nan" else np.inf * sign
            elif kind in targets:
                s = float(rng.choice(targets[kind]))
                if two_level:                                  # amax_b = s * T / 448 (TE)
                    a = s * top / 448.0
                else:                                          # e8m0: amax = s * elem max
                    a = min(s * float(elem.max), float(np.finfo(np.float32).max))
                    a = max(a, 2.0**-149)
                blk *= 0.5 * a / max(np.abs(blk).max(), 2.0**-60)
                blk[pos] = float(np.float32(a)) * sign
        if "tiny_tensor_amax" in kinds and d(tiny_s) < 113:     # about half the arrays
            x = x * 2.0 ** -(d(tiny_s) + np.log2(top))
        with np.errstate(over="ignore"):
            return x.astype(np.float32)

    return draw()
