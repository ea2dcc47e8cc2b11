"""Lecture figures: underflow histograms, number lines, bit layouts, training curves.

Every ``plot_*`` function takes ``ax=None`` (a new figure in the lecture style
when omitted), draws, and returns the Axes; none calls ``plt.show()``. The
numbers come from fpemu (:func:`fpemu.stats`, :func:`fpemu.stats.survey`,
:func:`fpemu.decode`); this module only draws them. :func:`save_figure`
writes SVG, PDF and PNG with deterministic metadata, so the same figure gives
the same bytes.

The region colours are fixed across every figure: grey for values flushed to
zero, orange for subnormals, blue for normal numbers, red for overflow. They
come from Petroff's colour-blind-safe sequence (arXiv:2107.02270), which the
style sheet ``fpemu/styles/lecture.mplstyle`` also uses for lines.

>>> import numpy as np, fpemu.plotting as fp
>>> g = np.random.default_rng(0).lognormal(-14, 3, 10_000) * 2.0**-4
>>> ax = fp.plot_underflow_histogram(g, ["fp16", "bf16"], scale=1024)
>>> ax.get_xlabel()
'|value| (log2 bins; zeros in their own bin)'
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping

import numpy as np

from .errors import FpemuValueError
from .formats import Format
from .checks import as_format
from .numtext import FIELD_COLORS

# matplotlib is imported when a figure is drawn, and the plots that compute
# their numbers import fpemu.stats, fpemu.quantize or fpemu.explain (Numba's)
# when called: this module imports without either (the CLI loads it).

__all__ = [
    "STYLE", "REGION_COLORS", "lecture_style", "new_axes", "save_figure", "format_regions",
    "plot_underflow_histogram", "plot_layer_histograms", "plot_number_line",
    "plot_bit_layout", "plot_rounding", "plot_heatmap", "plot_loss_scale",
    "plot_training_curves", "plot_lines", "plot_stacked_fractions",
]

#: The lecture style sheet shipped with fpemu.
STYLE = os.path.join(os.path.dirname(__file__), "styles", "lecture.mplstyle")

#: One colour per class of :func:`fpemu.stats`, the same in every figure.
REGION_COLORS = {
    "flushed": "#94a4a2",    # grey: became zero
    "subnormal": "#ffa90e",  # orange: kept, with fewer significant bits
    "normal": "#3f90da",     # blue: full precision
    "overflow": "#bd1f01",   # red: inf, NaN or saturated
}
#: Darker shades of the region colours, readable as text on white.
_TEXT_COLORS = {"flushed": "#4a4f55", "subnormal": "#b35a00", "normal": "#1f5fa0",
                "overflow": "#bd1f01"}


def _plt():
    try:
        import matplotlib  # optional dependency
        import matplotlib.pyplot as plt  # optional dependency
    except ImportError as err:   # pragma: no cover - matplotlib is in the plot extra
        raise ImportError("fpemu's figures need matplotlib: pip install 'fpemu[plot]' "
                          "(or pip install matplotlib)") from err
    return matplotlib, plt


@contextlib.contextmanager
def lecture_style():
    """A context in which new figures use the lecture style sheet."""
    matplotlib, plt = _plt()
    on = matplotlib.is_interactive()
    try:
        with plt.style.context(STYLE):
            try:
                yield
            finally:
                on = matplotlib.is_interactive()
    finally:
        # A style context restores every rcParam on exit, "interactive" included. The
        # backend is chosen at the first figure, and Jupyter's inline backend turns
        # interactive mode on then; restoring it would stop every later figure from
        # showing at the end of its cell. Keep what the backend set.
        matplotlib.interactive(on)


def new_axes(nrows=1, ncols=1, figsize=None, **kwargs):
    """A new figure in the lecture style: (fig, axes) as ``plt.subplots``."""
    _, plt = _plt()
    with lecture_style():
        return plt.subplots(nrows, ncols, figsize=figsize, **kwargs)


def _axes(ax, figsize=None):
    if ax is not None:
        return ax
    return new_axes(figsize=figsize)[1]


def save_figure(fig, path, formats=("svg", "pdf", "png"), dpi=200):
    """Write ``fig`` as SVG, PDF and PNG (by default) with deterministic metadata.

    ``path`` is the file name with or without an extension; one file per
    format is written next to it. Text stays text in SVG, fonts are TrueType
    in PDF, and no date, software version or random id is embedded, so the
    same figure gives the same bytes. Returns the paths written.
    """
    matplotlib, _ = _plt()
    base, ext = os.path.splitext(os.fspath(path))
    if ext.lstrip(".").lower() not in ("", "svg", "pdf", "png"):
        base = os.fspath(path)
    folder = os.path.dirname(base)
    if folder:
        os.makedirs(folder, exist_ok=True)
    metadata = {
        "svg": {"Date": None, "Creator": None},
        "pdf": {"Creator": None, "Producer": None, "CreationDate": None, "ModDate": None},
        "png": {"Software": None},
    }
    written = []
    rc = {"svg.fonttype": "none", "svg.hashsalt": "fpemu", "pdf.fonttype": 42}
    with matplotlib.rc_context(rc):
        for f in formats:
            if f not in metadata:
                raise FpemuValueError(f"save_figure(): unknown format {f!r}; choose from "
                                      "'svg', 'pdf', 'png'")
            out = f"{base}.{f}"
            fig.savefig(out, format=f, dpi=dpi, metadata=metadata[f], bbox_inches="tight")
            written.append(out)
    return written


# -- format regions ---------------------------------------------------------------------

def format_regions(fmt, rounding="rne"):
    """Where a format's classes lie on the ``log2 |x|`` axis, for round to nearest.

    Returns ``{"flushed": (-inf, a), "subnormal": (a, b), "normal": (b, c),
    "overflow": (c, inf)}`` in log2 units: below ``a = log2(min_subnormal) - 1``
    (half the smallest subnormal) a value rounds to zero, below
    ``b = log2(min_normal)`` it is subnormal, above ``c = log2(max)`` it
    overflows. A format without subnormals has an empty subnormal band.
    """
    f = as_format(fmt)
    if rounding != "rne":
        raise FpemuValueError("format_regions(): only rounding='rne' bands are drawn; the "
                              f"counts of other modes come from fpemu.stats (got {rounding!r})")
    b = math.log2(f.min_normal)
    a = math.log2(f.min_subnormal) - 1 if f.has_subnormals else b
    c = math.log2(f.max)
    return {"flushed": (-math.inf, a), "subnormal": (a, b), "normal": (b, c),
            "overflow": (c, math.inf)}


def _fmt_name(fmt):
    return fmt if isinstance(fmt, str) and not isinstance(fmt, Format) else as_format(fmt).name


def _pct(x):
    if x == 0:
        return "0%"
    if x < 0.001:
        return "<0.1%"
    return f"{100 * x:.1f}%" if x < 0.995 or x == 1 else f"{100 * x:.2f}%"


def _log2_ticks(ax, lo, hi, zero_x=None, axis="x"):
    span = hi - lo
    step = next(s for s in (1, 2, 4, 5, 8, 10, 16, 20, 32, 50, 64) if span / s <= 10)
    first = int(math.ceil(lo / step) * step)
    ticks = list(range(first, int(hi) + 1, step))
    labels = [f"$2^{{{t}}}$" for t in ticks]
    if zero_x is not None:
        ticks = [zero_x] + ticks
        labels = ["0"] + labels
    (ax.set_xticks if axis == "x" else ax.set_yticks)(ticks, labels)


def _survey_for(values, formats, scales):
    from .stats import Survey, survey  # needs Numba
    if isinstance(values, Survey):
        missing = [(f, s) for f in formats for s in scales
                   if (as_format(f).name, float(s)) not in values.counts]
        if missing:
            raise FpemuValueError(
                f"the survey passed has no counts for {missing}; compute it with "
                f"fpemu.stats.survey(x, {list(formats)}, scales={sorted(set(scales))})")
        return values
    return survey(values, formats, scales=tuple(sorted(set(float(s) for s in scales))))


def plot_underflow_histogram(values, formats=("fp16",), scale=1.0, ax=None, yscale="linear",
                             annotate=True, title=None, density=True):
    """The underflow histogram: where the magnitudes lie against each format's range.

    Bars count ``floor(log2 |x|)`` for the nonzero values, with a separate
    bin at the left for exact zeros (the convention of NVIDIA's
    mixed-precision guide). Under the histogram one strip per format shows
    its flushed (grey), subnormal (orange), normal (blue) and overflow (red)
    ranges; with one format the same bands also shade the histogram. Each
    strip is annotated with the share of values the format flushes, makes
    subnormal and overflows, counted exactly by :func:`fpemu.stats`. With
    ``scale=S`` (a loss scale) the histogram of ``x * S`` is drawn over the
    unscaled one as an outline, and the annotations give both.

    Parameters
    ----------
    values : array-like, path to a .npy file, or a :class:`fpemu.stats.Survey`
        The data (for example a model's gradients), or counts made by
        :func:`fpemu.stats.survey` with scales 1 and ``scale``.
    formats : str or sequence of str
        Formats to compare, e.g. ``["fp16", "bf16", "e5m2", "e4m3fn"]``.
    scale : float
        A loss scale to overlay; 1 draws the data alone.
    yscale : {"linear", "log"}
        The two variants of the guide's figure.
    density : bool
        Percent of all values on the y axis (True) or raw counts.
    """
    if isinstance(formats, (str, Format)):
        formats = [formats]
    names = [_fmt_name(f) for f in formats]
    if yscale not in ("linear", "log"):
        raise FpemuValueError(f"plot_underflow_histogram(): yscale must be 'linear' or 'log', "
                              f"got {yscale!r}")
    scales = [1.0] if scale == 1 else [1.0, float(scale)]
    sv = _survey_for(values, names, scales)
    ax = _axes(ax, figsize=(12, 5.6 + 0.45 * len(names)))
    total = sv.total
    norm = 100.0 / total if density and total else 1.0
    bins, hist, zeros = sv.hist(1.0)
    nz = np.flatnonzero(hist)
    if scale != 1:
        _, hist_s, _ = sv.hist(scale)
        nz = np.union1d(nz, np.flatnonzero(hist_s))
    data_lo = int(bins[nz[0]]) if nz.size else -24
    data_hi = int(bins[nz[-1]]) + 1 if nz.size else 16
    bounds = []
    for n in names:
        for lo, hi in format_regions(n).values():
            bounds += [b for b in (lo, hi) if math.isfinite(b)]
    near = [b for b in bounds if data_lo - 14 <= b <= data_hi + 14]
    lo = math.floor(min([data_lo] + near)) - 2
    hi = math.ceil(max([data_hi] + near)) + 2
    zero_x = lo - 3
    sel = (bins >= lo) & (bins < hi)
    ax.bar(bins[sel], hist[sel] * norm, width=1.0, align="edge", color="#717581",
           alpha=0.55 if scale != 1 else 0.85, edgecolor="white", linewidth=0.4,
           label="values" if scale == 1 else "values, unscaled", zorder=2)
    ax.bar([zero_x], [zeros * norm], width=1.6, align="edge", color="#3a3a3a",
           label=f"exact zeros ({_pct(zeros / total if total else 0.0)})", zorder=2)
    if scale != 1:
        on = np.flatnonzero(hist_s[sel])
        keep = slice(max(on[0] - 1, 0), on[-1] + 2) if on.size else slice(0, 0)
        sb, sh = bins[sel][keep], hist_s[sel][keep]
        ax.stairs(sh * norm, np.append(sb, sb[-1] + 1 if sb.size else []), color="#bd1f01",
                  linewidth=2.2, label=f"values × {scale:g} (loss scale)", zorder=3)
    ax.axvline(zero_x + 2.2, color="#3a3a3a", linewidth=0.8, linestyle=(0, (2, 3)))
    if len(names) == 1:
        for region, (a, b) in format_regions(names[0]).items():
            a, b = max(a, zero_x + 2.2), min(b, hi)
            if b > a:
                ax.axvspan(a, b, color=REGION_COLORS[region], alpha=0.13, linewidth=0, zorder=0)
    ax.set_xlim(zero_x - 0.6, hi)
    ax.set_yscale(yscale)
    if yscale == "log":
        ax.set_ylim(bottom=0.5 * norm if density else 0.5)
    _log2_ticks(ax, lo, hi, zero_x=zero_x + 0.8)
    ax.set_xlabel("|value| (log2 bins; zeros in their own bin)")
    ax.set_ylabel("% of values" if density else "count")
    ax.grid(axis="x", visible=False)
    # one strip per format under the histogram, annotated with exact shares
    strip = ax.inset_axes([0.0, -0.2 - 0.085 * len(names), 1.0, 0.075 * len(names)],
                          sharex=ax)
    strip.set_ylim(0, len(names))
    strip.set_yticks([len(names) - i - 0.5 for i in range(len(names))], names)
    strip.tick_params(axis="x", labelbottom=False, length=0)
    strip.tick_params(axis="y", length=0)
    strip.grid(False)
    for side in ("top", "right", "bottom", "left"):
        strip.spines[side].set_visible(False)
    ax.fpemu_strip = strip
    ax.fpemu_annotations = []
    cols = ("flushed", "subnormal", "overflow")
    colx = (8, 118, 228) if scale != 1 else (8, 68, 148)     # points right of the strip
    for i, n in enumerate(names):
        y = len(names) - i - 1
        for region, (a, b) in format_regions(n).items():
            a, b = max(a, zero_x + 2.2), min(b, hi)
            if b > a:
                strip.broken_barh([(a, b - a)], (y + 0.12, 0.76), color=REGION_COLORS[region],
                                  label=region if i == 0 else None)
        if not annotate:
            continue
        for k, x in zip(cols, colx):
            text = _pct(sv[n, 1.0].fraction(k))
            if scale != 1:
                text += " → " + _pct(sv[n, scale].fraction(k))
            ax.fpemu_annotations.append(strip.annotate(
                text, (1.0, (y + 0.5) / len(names)), xycoords="axes fraction",
                xytext=(x, 0), textcoords="offset points", va="center", ha="left",
                fontsize=11, color=_TEXT_COLORS[k]))
    if annotate:
        for k, x in zip(cols, colx):
            strip.annotate(k, (1.0, 1.0), xycoords="axes fraction", xytext=(x, 2),
                           textcoords="offset points", va="bottom", ha="left", fontsize=10,
                           fontweight="bold", color=_TEXT_COLORS[k])
        if scale != 1:
            strip.annotate(f"unscaled → × {scale:g}", (1.0, 1.0), xycoords="axes fraction",
                           xytext=(colx[0], 16), textcoords="offset points", va="bottom",
                           ha="left", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    h2, l2 = strip.get_legend_handles_labels()
    ax.legend(handles + h2, labels + l2, loc="lower left", bbox_to_anchor=(0.0, 1.0),
              ncol=4, fontsize=11)
    if title is None:
        title = "Where the values fall in " + ", ".join(names)
    ax.set_title(title, loc="left", pad=58)
    return ax


def plot_layer_histograms(layers, fmt="fp16", scale=1.0, ax=None, title=None):
    """The per-layer underflow histogram: one row per layer, the format's ranges as bands.

    ``layers`` maps a layer name to its values (an array) or to their
    :class:`fpemu.stats.Counts` in ``fmt`` at ``scale``. Each row draws the
    layer's log2-magnitude histogram, scaled to the row's height; the
    format's flushed, subnormal, normal and overflow ranges run as vertical
    bands through every row, and the right margin gives each layer's exact
    flushed / subnormal / overflow shares.
    """
    from .stats import Counts, stats  # needs Numba
    if not isinstance(layers, Mapping) or not layers:
        raise FpemuValueError("plot_layer_histograms(): layers must be a non-empty mapping "
                              "{layer name: values}")
    name = _fmt_name(fmt)
    counts = {}
    for k, v in layers.items():
        counts[k] = v if isinstance(v, Counts) else stats(v, name, scale=scale)
    ax = _axes(ax, figsize=(11, 1.0 + 0.55 * len(counts)))
    lo_all, hi_all = [], []
    for c in counts.values():
        nz = np.flatnonzero(c.hist)
        if nz.size:
            lo_all.append(int(c.bins[nz[0]]))
            hi_all.append(int(c.bins[nz[-1]]) + 1)
    lo = min(lo_all, default=-30)
    hi = max(hi_all, default=16)
    reg = format_regions(name)
    near = [b for r in reg.values() for b in r if math.isfinite(b) and lo - 12 <= b <= hi + 12]
    lo, hi = math.floor(min([lo] + near)) - 1, math.ceil(max([hi] + near)) + 1
    for region, (a, b) in reg.items():
        a, b = max(a, lo), min(b, hi)
        if b > a:
            ax.axvspan(a, b, color=REGION_COLORS[region], alpha=0.18, linewidth=0, zorder=0,
                       label=region)
    n = len(counts)
    ax.fpemu_annotations = []
    for i, (k, c) in enumerate(counts.items()):
        base = n - 1 - i
        top = c.hist.max() if c.hist.size else 0
        sel = (c.bins >= lo) & (c.bins < hi)
        if top:
            h = c.hist[sel] / top * 0.85
            edges = np.append(c.bins[sel], c.bins[sel][-1] + 1)
            ax.stairs(h + base, edges, baseline=base, fill=True, color="#3a3a3a", alpha=0.75,
                      zorder=2)
        ax.fpemu_annotations.append(ax.text(
            1.01, (base + 0.4) / n, f"{_pct(c.fraction('flushed'))} flushed, "
            f"{_pct(c.fraction('subnormal'))} sub, {_pct(c.fraction('overflow'))} over",
            transform=ax.transAxes, va="center", ha="left", fontsize=11))
    ax.set_ylim(0, n)
    ax.set_yticks([n - 1 - i + 0.35 for i in range(n)], list(counts))
    ax.set_xlim(lo, hi)
    _log2_ticks(ax, lo, hi)
    ax.grid(False)
    ax.set_xlabel("|value| (log2 bins)" + (f", after × {scale:g}" if scale != 1 else ""))
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4, fontsize=11)
    suffix = f" (× {scale:g})" if scale != 1 else ""
    ax.set_title(title or f"Per layer, against {name}{suffix}", loc="left", pad=34)
    return ax


def plot_number_line(formats=("e4m3fn", "e5m2", "fp16", "bf16"), lo=2.0**-18, hi=2.0**17,
                     ax=None, xscale="log"):
    """Where each format's positive values lie: one row of ticks per format.

    Every positive finite value in ``[lo, hi]`` (from :func:`fpemu.decode` of
    every code) is a tick; subnormals are orange and normal values blue, and
    the largest value is marked. On a log axis the normal values of a binade
    are evenly spread, so the row shows precision (density) and range
    (extent) at once.
    """
    from .explain import values as all_values  # needs Numba
    if isinstance(formats, (str, Format)):
        formats = [formats]
    names = [_fmt_name(f) for f in formats]
    ax = _axes(ax, figsize=(11, 1.2 + 0.8 * len(names)))
    for i, n in enumerate(names):
        f = as_format(n)
        if f.bits > 16:
            raise FpemuValueError(f"plot_number_line(): {n} has {f.bits} bits; number lines "
                                  "enumerate every code, so pass formats of up to 16 bits")
        v = np.asarray(all_values(n)["value"], dtype=np.float64)
        v = v[np.isfinite(v) & (v > 0)]
        y = len(names) - 1 - i
        dense = int(((v >= lo) & (v <= hi)).sum()) > 300
        for region, sel in (("subnormal", v < f.min_normal), ("normal", v >= f.min_normal)):
            w = v[sel & (v >= lo) & (v <= hi)]
            if not w.size:
                continue
            if dense:     # too many ticks to tell apart: a band, with its density written in
                ax.fill_between([w[0], w[-1]], y - 0.32, y + 0.32, color=REGION_COLORS[region],
                                alpha=0.85, linewidth=0, label=region if i == 0 else None)
                if region == "normal":
                    mid = math.sqrt(w[0] * w[-1]) if xscale == "log" else (w[0] + w[-1]) / 2
                    ax.text(mid, y, f"{2 ** f.mantissa_bits} values per binade",
                            ha="center", va="center", color="white", fontsize=12,
                            fontweight="bold")
            else:
                ax.vlines(w, y - 0.32, y + 0.32, color=REGION_COLORS[region], linewidth=1.1,
                          label=region if i == 0 else None)
        if lo <= f.max <= hi:
            ax.plot([f.max], [y + 0.42], marker="v", color=REGION_COLORS["overflow"],
                    label="largest value" if i == 0 else None, linestyle="none")
        count = int(((v >= lo) & (v <= hi)).sum())
        ax.text(1.01, (y + 0.5) / len(names), f"{count} shown", transform=ax.transAxes,
                va="center", fontsize=11)
    ax.set_xscale(xscale, base=2) if xscale == "log" else ax.set_xscale(xscale)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set_yticks(range(len(names) - 1, -1, -1), names)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("positive values (log2 axis)" if xscale == "log" else "positive values")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, fontsize=11)
    ax.set_title("Where each format's values lie", loc="left", pad=30)
    return ax


def plot_bit_layout(formats=("fp32", "tf32", "bf16", "fp16", "e5m2", "e4m3fn", "e2m1"),
                    value=None, ax=None):
    """The bit fields of each format: sign, exponent, mantissa, drawn to scale.

    With ``value`` each box shows the bit of that value's code in the format
    (after rounding to nearest even), and the row ends with the stored value.
    """
    from .quantize import encode, quantize  # needs Numba
    if isinstance(formats, (str, Format)):
        formats = [formats]
    fmts = [as_format(f) for f in formats]
    width = max(f.bits for f in fmts)
    ax = _axes(ax, figsize=(min(3 + 0.42 * width, 16), 0.9 + 0.75 * len(fmts)))
    for i, f in enumerate(fmts):
        y = len(fmts) - 1 - i
        fields = ((["sign"] if f.signed else []) + ["exponent"] * f.exponent_bits
                  + ["mantissa"] * f.mantissa_bits)
        code = None
        if value is not None:
            code = int(encode(float(value), f))
        for j, kind in enumerate(fields):
            ax.add_patch(_rect(j, y - 0.35, FIELD_COLORS[kind], label=kind if i == 0 and (
                j == 0 or fields[j - 1] != kind) else None))
            if code is not None:
                bit = (code >> (f.bits - 1 - j)) & 1
                ax.text(j + 0.5, y, str(bit), ha="center", va="center", fontsize=11,
                        color="white" if kind != "mantissa" else "black")
        label = f"{f.name}: 1+{f.exponent_bits}+{f.mantissa_bits}" if f.signed else \
            f"{f.name}: {f.exponent_bits}+{f.mantissa_bits}"
        if code is not None:
            label += f"  = {float(quantize(float(value), f)):.10g}"
        ax.text(f.bits + 0.4, y, label, va="center", fontsize=12)
    ax.set_xlim(-0.2, width + 9)
    ax.set_ylim(-0.7, len(fmts) - 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, fontsize=11)
    title = "Bit layouts" if value is None else f"Bit layouts of {value!r}"
    ax.set_title(title, loc="left", pad=28)
    return ax


_MODE_LABELS = {"rne": "nearest, ties to even", "rna": "nearest, ties away",
                "rtz": "toward zero", "rup": "toward +inf", "rdn": "toward -inf",
                "rto": "to odd"}


def plot_rounding(x, fmt="bf16", modes=("rne", "rna", "rtz", "rup", "rdn", "rto"),
                  neighbours=2, ax=None):
    """Where one number lands in each rounding mode, on a zoomed number line.

    The top row shows the format's values around ``x`` (``neighbours`` on each
    side of the two that bracket it) with the interval of reals that rounds to
    each under round-to-nearest-even shaded in alternating tones; a triangle at
    each midpoint points to the value that takes the tie (the one with the
    even code). Below, one row per mode: an arrow from ``x`` to what
    :func:`fpemu.quantize` returns in that mode. ``x`` may be any float; values
    are read exactly, and the axis is linear in the format's units.
    """
    from .lessons import rounding_interval  # needs Numba
    from .quantize import next_down, next_up, quantize  # needs Numba
    f = as_format(fmt)
    x = float(x)
    if not math.isfinite(x):
        raise FpemuValueError(f"plot_rounding(): x must be finite, got {x!r}")
    lo = float(quantize(x, f, rounding="rdn", overflow="saturate"))
    hi = float(quantize(x, f, rounding="rup", overflow="saturate"))
    vals = [lo] if lo == hi else [lo, hi]
    for _ in range(neighbours):
        d, u = float(next_down(vals[0], f)), float(next_up(vals[-1], f))
        if math.isfinite(d):
            vals.insert(0, d)
        if math.isfinite(u):
            vals.append(u)
    vals = np.array(vals)
    span = vals[-1] - vals[0]
    ax = _axes(ax, figsize=(11, 1.6 + 0.45 * len(modes)))
    top = len(modes) + 0.6
    tones = ("#d7e7f6", "#9cc3ea")
    for i, v in enumerate(vals):
        iv = rounding_interval(v, f)
        a, b = max(iv[0], vals[0] - span * 0.08), min(iv[1], vals[-1] + span * 0.08)
        ax.fill_between([a, b], top - 0.3, top + 0.3, color=tones[i % 2], linewidth=0)
        end = iv[1]                   # the tie above v points to the value that takes it
        if vals[0] - span * 0.08 < end < vals[-1] + span * 0.08:
            ax.plot([end], [top - 0.42], marker="<" if iv[3] else ">", markersize=8,
                    color="#1f5fa0", linestyle="none", zorder=4)
        ax.vlines(v, top - 0.3, top + 0.3, color="#1f5fa0", linewidth=2)
        ax.text(v, top + 0.42 + 0.42 * (i % 2), f"{v:.10g}", ha="center", va="bottom",
                fontsize=10)
    ax.axvline(x, color="#bd1f01", linewidth=1.2, linestyle=(0, (4, 3)), zorder=1)
    ax.text(x, -0.8, f" x = {x:.12g}", ha="left", va="center", color="#bd1f01", fontsize=11)
    for r, m in enumerate(modes):
        y = len(modes) - 1 - r
        q = float(quantize(x, f, rounding=m, overflow="saturate"))
        if q != x:
            ax.annotate("", xy=(q, y), xytext=(x, y),
                        arrowprops=dict(arrowstyle="->", color="#3f90da", lw=2))
        ax.plot([q], [y], "o", color="#3f90da", markersize=7)
        ax.text(vals[-1] + span * 0.1, y, f"{q:.10g}", va="center", fontsize=11)
    ax.set_yticks([top] + list(range(len(modes) - 1, -1, -1)),
                  [f"{f.name} values"] + [f"{m}: {_MODE_LABELS.get(m, m)}" for m in modes])
    ax.set_ylim(-1.2, top + 1.4)
    ax.set_xlim(vals[0] - span * 0.08, vals[-1] + span * 0.08)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("shaded: the reals that round to each value (nearest even); "
                  "each triangle points to the value that takes the tie there", fontsize=11)
    ax.set_title(f"Rounding {x:.12g} into {f.name}", loc="left")
    return ax


def _rect(x, y, color, label=None):
    from matplotlib.patches import Rectangle  # optional dependency
    return Rectangle((x + 0.04, y), 0.92, 0.7, facecolor=color, edgecolor="white", label=label)


def plot_loss_scale(steps, scales, skipped=None, ax=None, title=None):
    """A loss-scale trajectory: the scale per step (log2 axis), skipped steps marked."""
    steps = np.asarray(steps)
    scales = np.asarray(scales, dtype=np.float64)
    ax = _axes(ax)
    ax.step(steps, scales, where="post", color="#3f90da", label="loss scale")
    if skipped is not None:
        skipped = np.asarray(skipped, dtype=bool)
        if skipped.any():
            ax.plot(steps[skipped], scales[skipped], "x", color="#bd1f01", markersize=9,
                    markeredgewidth=2.2, label=f"skipped step ({int(skipped.sum())})")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.legend(loc="best")
    ax.set_title(title or "Dynamic loss scale", loc="left")
    return ax


def plot_training_curves(curves, ax=None, ylabel="loss", logy=True, title=None, xlabel="step",
                         smooth=1, reference=None):
    """Training curves, one per label; a run that turns inf / NaN ends with a red cross.

    ``curves`` maps a label to a sequence of values (or to ``(steps, values)``).
    ``smooth=k`` draws the running mean over k steps (one pass over a cycled
    data set removes the batch-to-batch zigzag). ``reference`` names the curve
    drawn dashed on top (fp32), so that a run that matches it stays visible.
    """
    ax = _axes(ax)
    for label, c in curves.items():
        if isinstance(c, tuple) and len(c) == 2:
            steps, vals = np.asarray(c[0]), np.asarray(c[1], dtype=np.float64)
        else:
            vals = np.asarray(c, dtype=np.float64)
            steps = np.arange(vals.size)
        bad = ~np.isfinite(vals)
        first = int(np.argmax(bad)) if bad.any() else vals.size
        shown_s, shown = steps[:first], vals[:first]
        if smooth > 1 and shown.size >= smooth:
            shown = np.convolve(shown, np.ones(smooth) / smooth, mode="valid")
            shown_s = shown_s[smooth - 1:]
        style = dict(color="black", linestyle=(0, (4, 3)), linewidth=1.8, zorder=4) \
            if label == reference else {}
        ax.plot(shown_s, shown, label=label, **style)
        if bad.any():
            y = shown[-1] if shown.size else 1.0
            ax.plot([steps[first]], [y], "X", color="#bd1f01", markersize=12, zorder=5)
            ax.annotate(f"{'NaN' if np.isnan(vals[first]) else 'inf'} at step {steps[first]}",
                        (steps[first], y), textcoords="offset points", xytext=(6, 8),
                        color="#bd1f01", fontsize=11)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel + (f" (mean of {smooth} steps)" if smooth > 1 else ""))
    ax.legend(loc="best")
    if title:
        ax.set_title(title, loc="left")
    return ax


def plot_lines(x, series, ax=None, xlabel="", ylabel="", logx=False, logy=False, title=None,
               markers=True):
    """Several y series over one x: ``series`` maps a label to values."""
    ax = _axes(ax)
    for label, y in series.items():
        ax.plot(x, y, marker="o" if markers else None, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(loc="best")
    if title:
        ax.set_title(title, loc="left")
    return ax


def plot_heatmap(values, rows, cols, ax=None, title=None, xlabel="step", cbar_label="",
                 vmin=0.0, vmax=1.0, cmap="Greys", percent=True):
    """A matrix as a heat map: ``values[i, j]`` for row label ``rows[i]`` and column
    ``cols[j]`` (NaN cells, not recorded, are left blank and hatched).

    With ``percent`` the colour bar reads in percent. Used for the share of each
    layer's values flushed to zero at each step.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.shape != (len(rows), len(cols)):
        raise FpemuValueError(f"plot_heatmap(): values has shape {v.shape}, expected "
                              f"({len(rows)}, {len(cols)}) = (rows, cols)")
    ax = _axes(ax, figsize=(min(3 + 0.35 * len(cols), 16), 1.2 + 0.38 * len(rows)))
    shown = np.ma.masked_invalid(v * (100 if percent else 1))
    im = ax.imshow(shown, aspect="auto", cmap=cmap, interpolation="nearest",
                   vmin=vmin * (100 if percent else 1), vmax=vmax * (100 if percent else 1))
    ax.set_facecolor("#f3f3f3")
    ax.set_yticks(range(len(rows)), rows)
    step = max(1, len(cols) // 12)
    ax.set_xticks(range(0, len(cols), step), [str(c) for c in cols][::step])
    ax.grid(False)
    ax.set_xlabel(xlabel)
    bar = ax.figure.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label(cbar_label + (" (%)" if percent else ""))
    if title:
        ax.set_title(title, loc="left")
    return ax


def plot_stacked_fractions(rows, ax=None, title=None,
                           classes=("flushed", "subnormal", "normal", "overflow")):
    """Horizontal stacked bars: per row label, the share of each class.

    ``rows`` maps a label to :class:`fpemu.stats.Counts` (zeros are left
    out: the bars show what happens to the nonzero values).
    """
    ax = _axes(ax, figsize=(11, 1.2 + 0.42 * len(rows)))
    labels = list(rows)
    n = len(labels)
    ax.fpemu_annotations = []
    for i, label in enumerate(labels):
        c = rows[label]
        nonzero = sum(c.counts[k] for k in classes)
        left = 0.0
        y = n - 1 - i
        for k in classes:
            share = c.counts[k] / nonzero if nonzero else 0.0
            ax.barh(y, 100 * share, left=100 * left, color=REGION_COLORS[k], height=0.72,
                    label=k if i == 0 else None, edgecolor="white", linewidth=0.5)
            if share >= 0.06:
                ax.fpemu_annotations.append(ax.text(
                    100 * (left + share / 2), y, f"{100 * share:.0f}%", ha="center",
                    va="center", fontsize=10, color="white" if k != "subnormal" else "black"))
            left += share
    ax.set_yticks(range(n - 1, -1, -1), labels)
    ax.set_xlim(0, 100)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("% of nonzero values")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=4, fontsize=11)
    if title:
        ax.set_title(title, loc="left", pad=30)
    return ax
