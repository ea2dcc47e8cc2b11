"""The ``fpemu`` command.

``fpemu demo [--out DIR]``         every experiment, written up as DIR/index.html (+ figures, JSON)
``fpemu run NAME [--param V ...]`` one experiment, with its parameters overridden
``fpemu hist FILE --formats F,..`` the underflow histogram of your own tensors
``fpemu formats``                  the table of all formats
``fpemu casts``                    a cast table of telling values into every format
``fpemu explain X --format F``     one value rounded, bit by bit, and why
``fpemu table F``                  all codes of an 8-bit format as a 16x16 grid
``fpemu quantize --format F X..``  values rounded into a format, with their codes
``fpemu stats FILE.npy --format F`` underflow / overflow counts and a log2 histogram
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
import traceback

import numpy as np

from . import experiments
from ._exact import parse_real, to_float64_odd
from .errors import FpemuError, FpemuValueError
from .experiments import ORDER
from .formats import FORMATS, format_names
from .formats import format as lookup
from .numtext import float32_text as _float32_text
from .plotting import new_axes, plot_underflow_histogram, save_figure
from .report import demo, write_report
from .rounding import Overflow, Rounding
from .tensorfiles import (
    check_input, check_output_dir, check_output_file, check_tensor_file, load_npy, named_tensors,
    value_chunks,
)
from .warmup import cache_dir, warmup

# The modules that need Numba (quantize, explain, stats, block) are imported
# inside the commands that use them, so that `fpemu record` runs where Numba is
# missing; fpemu.torch and fpemu.reference are imported by their commands only.

#: Values that show each format's edges (ties, overflow, underflow, specials).
TELLING_VALUES = (
    ("65519", 65519.0),
    ("65520", 65520.0),
    ("464", 464.0),
    ("465", 465.0),
    ("500", 500.0),
    ("0.1", 0.1),
    ("1e-8", 1e-8),
    ("1+2^-8+2^-30", 1 + 2.0**-8 + 2.0**-30),
    ("-0.0", -0.0),
    ("inf", float("inf")),
    ("nan", float("nan")),
)


def format_table() -> str:
    """One line per format: bits, layout, max, smallest normal and subnormal, eps."""
    head = ("format", "alias", "bits", "E", "M", "bias", "inf", "NaN", "overflow", "max",
            "min normal", "min subnormal", "eps")
    rows = [head]
    for f in FORMATS:
        rows.append((
            f.name, f.long_name or "", str(f.bits), str(f.exponent_bits), str(f.mantissa_bits),
            str(f.bias), "yes" if f.has_inf else "no", f.nan_encoding if f.has_nan else "no",
            f.default_overflow, f"{f.max:.6g}", f"{f.min_normal:.6g}",
            f"{f.min_subnormal:.6g}", f"{f.eps:.6g}",
        ))
    return _render(rows)


def cast_table(values=TELLING_VALUES) -> str:
    """Each telling value rounded (rne, default overflow) into every format."""
    from .quantize import quantize  # needs Numba
    rows = [("value",) + tuple(f.name for f in FORMATS)]
    for label, v in values:
        row = [label]
        for f in FORMATS:
            if v != v and not f.has_nan:
                row.append("error")  # NaN into a format without NaN raises
                continue
            row.append(_float32_text(float(quantize(np.float64(v), f))))
        rows.append(tuple(row))
    return _render(rows)


def _render(rows) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cmd_casts(args) -> int:
    from .quantize import encode, quantize  # needs Numba
    print("Casts (float64 input, round to nearest even, each format's default overflow;")
    print("'error' = NaN into a format without NaN)\n")
    print(cast_table())
    print("\nRead it: 65520 overflows fp16 to inf; e4m3fn saturates 500 to 448 (PyTorch 2.13);")
    print("e4m3fnuz turns it into NaN; 1+2^-8+2^-30 rounds once to bf16 1.0078125, not")
    print(f"through float32 to 1.0; 1e-8 is {_float32_text(float(quantize(1e-8, 'fp16')))} in "
          f"fp16 but {_float32_text(float(quantize(1e-8, 'bf16')))} in bf16.")
    code = int(encode(500.0, "e4m3fn"))
    print(f"encode(500, e4m3fn) = 0x{code:02X}.")
    return 0


#: What ``fpemu demo`` imports beyond NumPy and Numba: the ``demo`` extra
#: (the figures; the emulated GPT trains in PyTorch; tqdm's bar is optional).
DEMO_NEEDS = ("matplotlib", "torch")
#: The demo extra's size in a new virtual environment (measured with torch
#: 2.13.0+cpu; the dev extra of make test is about 2.5 GB: README).
DEMO_EXTRA_SIZE = "1.3 GB"


def _missing(modules):
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _cmd_demo(args) -> int:
    missing = _missing(DEMO_NEEDS)
    if missing:
        raise CliError(f"the demo needs {' and '.join(missing)}, which this environment lacks "
                       f"(fpemu itself needs only NumPy and Numba); install the demo extra: "
                       f"pip install 'fpemu[demo]' (matplotlib, tqdm and PyTorch: a virtual "
                       f"environment with them is about {DEMO_EXTRA_SIZE}), or from a "
                       f"checkout: make demo")
    check_output_dir(args.out, "report folder")
    kinds = ("svg", "png") + (("pdf",) if args.pdf else ())
    path, results, seconds = demo(args.out, quick=args.quick, progress=not args.no_progress,
                                  figure_formats=kinds)
    print()
    for r in results:
        print(f"{r.title}: {r.conclusion}\n")
    print(f"{len(results)} experiments in {seconds:.0f} s; report written to {path}")
    return 0


def _cmd_run(args) -> int:

    try:
        mod = experiments.module(args.name)
    except KeyError as err:
        raise CliError(err.args[0]) from None
    if args.out:
        check_output_dir(args.out, "report folder")
    fields = {f.name: f for f in dataclasses.fields(mod.Config)}
    defaults = mod.Config()
    overrides = dict(mod.QUICK) if args.quick else {}
    rest = list(args.params)
    while rest:
        flag = rest.pop(0).strip()
        if not flag.startswith("--"):
            raise CliError(f"expected --PARAM VALUE after the experiment name, got {flag!r}; "
                           f"the parameters of {args.name} are "
                           + ", ".join("--" + n.replace("_", "-") for n in fields))
        name = flag[2:].replace("-", "_")
        if name not in fields:
            raise CliError(f"{args.name} has no parameter {flag}; its parameters are "
                           + ", ".join("--" + n.replace("_", "-") for n in fields))
        if not rest:
            raise CliError(f"{flag} needs a value (default {getattr(defaults, name)!r})")
        overrides[name] = _parse_param(flag, rest.pop(0).strip(), getattr(defaults, name))
    try:
        r = mod.run(None, **overrides)
    except (TypeError, ValueError) as err:
        raise CliError(str(err)) from None
    except MemoryError:
        raise CliError(f"{args.name} with " + " ".join(
            f"--{k.replace('_', '-')} {v!r}" for k, v in overrides.items()
            if v != getattr(defaults, k)) + " needs more memory than this machine has; "
            "use smaller sizes (the defaults: " + ", ".join(
                f"--{k.replace('_', '-')} {getattr(defaults, k)!r}" for k in overrides)
            + ")") from None
    print(r.summary())
    print()
    print(r.conclusion)
    if args.out:
        path = write_report(args.out, [r], r.seconds, extra_figures=False)
        print(f"\nreport written to {path}")
    return 0


def _parse_param(flag, text, default):
    """A parameter value of the default's type; tuples are comma-separated.
    A number must be finite and keep its default's sign: a positive default
    (sizes, steps, rates) asks for a positive value, a zero default for one
    >= 0."""
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if isinstance(default, int):
            return _checked(flag, int(text), default)
        if isinstance(default, float):
            return _checked(flag, float(text), default)
        if isinstance(default, tuple):
            items = [t.strip() for t in text.split(",") if t.strip()]
            if not items:
                raise ValueError
            kind = type(default[0]) if default else str
            values = tuple(kind(t) if kind is not float else float(t) for t in items)
            if default and isinstance(default[0], (int, float)) and \
                    not isinstance(default[0], bool):
                ref = min(default)
                values = tuple(_checked(flag, v, ref) for v in values)
            return values
        return text
    except ValueError:
        kind = type(default).__name__ if not isinstance(default, tuple) else \
            f"comma-separated {type(default[0]).__name__}s" if default else "values"
        raise CliError(f"{flag} expects {kind} (default {default!r}), got {text!r}") from None


def _checked(flag, value, default):
    """``value`` if finite and of the default's sign, else a CliError."""
    if isinstance(value, float) and not math.isfinite(value):
        raise CliError(f"{flag} expects a finite number, got {value!r}")
    if default > 0 and not value > 0:
        raise CliError(f"{flag} expects a positive value (default {default!r}), got {value!r}")
    if default == 0 and value < 0:
        raise CliError(f"{flag} expects a value >= 0 (default {default!r}), got {value!r}")
    return value


def _cmd_hist(args) -> int:
    check_tensor_file(args.file)
    if os.path.splitext(args.output)[1]:
        check_output_file(args.output, "figure file")
    else:
        check_output_file(args.output + ".png", "figure file")
    import matplotlib  # optional dependency
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional dependency, after use("Agg")

    from .stats import survey  # needs Numba
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        lookup(f)                       # an unknown name raises with the list of formats
    total, parts = value_chunks(args.file)
    bar = None
    if not args.no_progress:
        try:
            from tqdm import tqdm  # optional dependency
            bar = tqdm(total=total, unit="val", unit_scale=True, desc="counting",
                       disable=total is not None and total < (1 << 24))
        except ImportError:                # pragma: no cover - tqdm is in the plot extra
            bar = None
    scales = sorted({1.0, float(args.scale)})
    try:
        sv = survey(parts, formats, scales=scales,
                    progress=bar.update if bar is not None else None)
    except BaseException:
        if bar is not None:             # clear the bar's line: the error is one line
            bar.leave = False
            bar.close()
        raise
    if bar is not None:
        bar.close()
    if sv.total == 0:
        raise CliError(f"{args.file} holds no values to count")
    for f in formats:
        for s in scales:
            print(sv[f, s])
    fig, ax = new_axes(figsize=(12, 6 + 0.45 * len(formats)))
    plot_underflow_histogram(sv, formats, scale=args.scale, ax=ax, yscale=args.yscale,
                             title=f"{os.path.basename(args.file)}: {sv.total} values")
    base, ext = os.path.splitext(args.output)
    kind = ext.lstrip(".").lower()
    if kind in ("svg", "pdf", "png"):
        written = save_figure(fig, base, formats=(kind,))
    else:                                   # no known extension: all three next to the name
        written = save_figure(fig, args.output)
    plt.close(fig)
    print("figure written to " + ", ".join(written))
    return 0


def _cmd_blocks(args) -> int:
    from .block import PRESETS, TABLE_PRESETS, error_shares, error_table  # needs Numba
    check_tensor_file(args.file)
    if args.json:
        check_output_file(args.json, "JSON file")
    if args.min_size < 0:
        raise CliError(f"--min-size expects a count >= 0, got {args.min_size}")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets \
        else list(TABLE_PRESETS)
    for p in presets:
        if p not in PRESETS and p != "mxfp4-rceil":
            raise CliError(f"unknown preset {p!r}; choose from {', '.join(PRESETS)}, "
                           "mxfp4-rceil")
    keys = ("values", "blocks", "clipped_blocks", "nonzero", "flushed_values", "sse", "power")
    total = {p: None for p in presets}
    per_tensor = []
    for name, a in named_tensors(args.file):
        if args.match and args.match not in name:
            continue
        if a.ndim == 0 or a.size < args.min_size:
            continue
        a32 = a.astype(np.float32)
        if a.dtype == np.float64 and not np.array_equal(a32, a, equal_nan=True):
            raise CliError(f"{name} holds float64 values that float32 cannot hold; block "
                           "quantizers read float32 (or bfloat16) tensors: save it as float32")
        try:
            rows = error_table(a32, presets, axis=-1)
        except ValueError as err:
            raise CliError(f"{name} {a.shape}: {err}") from None
        per_tensor.append({"tensor": name, "shape": list(a.shape), "rows": rows})
        for r in rows:
            t = total[r["preset"]]
            total[r["preset"]] = dict(r) if t is None else {**t, **{k: t[k] + r[k]
                                                                    for k in keys}}
    if not per_tensor:
        raise CliError(f"{args.file}: no floating-point tensor of at least {args.min_size} "
                       "values" + (f" whose name contains {args.match!r}" if args.match else "")
                       + "; lower --min-size or change --match")
    summary = [{k: t[k] for k in ("preset", "elem", "scale", "block", "rule", "bits")}
               | {"mse": t["sse"] / t["values"]} | error_shares(t) for t in total.values()]
    n = total[presets[0]]["values"]
    print(f"{args.file}: {len(per_tensor)} tensors, {n} values, blocks along the last axis")
    print(f"{'preset':15s} {'elements':9s} {'scale':7s} {'block':>6s} {'bits':>6s} "
          f"{'SQNR dB':>8s} {'MSE':>10s} {'clipped':>8s} {'flushed':>8s}")
    for r in summary:
        print(f"{r['preset']:15s} {r['elem']:9s} {r['scale']:7s} {str(r['block']):>6s} "
              f"{r['bits']:6.3g} {r['sqnr_db']:8.2f} {r['mse']:10.3g} {r['clipped']:8.2%} "
              f"{r['flushed']:8.2%}")
    if args.per_tensor:
        for t in per_tensor:
            best = max(t["rows"], key=lambda r: r["sqnr_db"])
            worst = min(t["rows"], key=lambda r: r["sqnr_db"])
            print(f"  {t['tensor']} {tuple(t['shape'])}: best {best['preset']} "
                  f"{best['sqnr_db']:.2f} dB, worst {worst['preset']} {worst['sqnr_db']:.2f} dB")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"file": args.file, "summary": summary, "tensors": per_tensor}, fh,
                      indent=1, default=float)
        print(f"written to {args.json}")
    return 0


def _cmd_formats(args) -> int:
    print(format_table())
    return 0


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


def _number(text: str) -> float:
    """A plain float option (--scale)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 0.1, -3e-5, inf or nan; got {text.strip()!r}") from None


def _exact_number(text: str) -> str:
    """A number to round, checked and kept as text: it is read exactly later."""
    try:
        parse_real(text)
        return text.strip()
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).replace(repr(text), repr(text.strip()))) \
            from None


def _protect_negative_numbers(argv):
    """argparse takes ``-3e-5``, ``-inf`` and ``-nan`` for options; a leading
    space makes them positional values (the number parsers strip it)."""
    out = []
    for a in argv:
        if a.startswith("-") and not a.startswith("--") and len(a) > 1:
            try:
                float(a)
            except ValueError:
                pass
            else:
                a = " " + a
        out.append(a)
    return out


def _cmd_explain(args) -> int:
    from .explain import explain  # needs Numba
    print(explain(args.x, args.format, rounding=args.rounding, subnormals=not args.flush,
                  overflow=args.overflow, seed=args.seed))
    return 0


def _cmd_table(args) -> int:
    from .explain import table_text  # needs Numba
    print(table_text(args.fmt))
    return 0


def _cmd_quantize(args) -> int:
    kw = dict(rounding=args.rounding, subnormals=not args.flush, overflow=args.overflow,
              seed=args.seed)
    from .quantize import encode, quantize  # needs Numba
    # each decimal input rounded to odd in float64: one correct rounding into the format
    x = np.array([to_float64_odd(parse_real(v)) for v in args.values], np.float64)
    q = quantize(x, args.format, **kw)
    codes = encode(x, args.format, **kw)
    hexw = (lookup(args.format).bits + 3) // 4
    rows = [("input", "value", "code")]
    for text, qi, ci in zip(args.values, q, codes):
        rows.append((text, _float32_text(float(qi)), f"0x{int(ci):0{hexw}X}"))
    print(_render(rows))
    return 0


def _cmd_stats(args) -> int:
    from .stats import stats_chunked  # needs Numba
    arr = load_npy(args.file)
    if arr.dtype.kind not in "fiub":
        raise CliError(f"{args.file} holds {arr.dtype} values, not real numbers; save a "
                       "float, integer or bool array")
    c = stats_chunked(arr, args.format, scale=args.scale, rounding=args.rounding,
                      subnormals=not args.flush, overflow=args.overflow, seed=args.seed)
    print(c)
    nz = np.flatnonzero(c.hist)
    if nz.size:
        print(f"\nlog2 |x * scale| histogram ({c.zero_bin} zeros not shown):")
        top = c.hist.max()
        for k in range(nz[0], nz[-1] + 1):
            n = int(c.hist[k])
            print(f"  2^{c.bins[k]:<5} {n:>12}  " + "#" * int(round(40 * n / top)))
    return 0


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0; got {text.strip()!r}")
    return v


def _rounding_args(p):
    p.add_argument("--rounding", default="rne", choices=[m.name.lower() for m in Rounding],
                   help="rounding mode (default rne)")
    p.add_argument("--overflow", default=None, choices=[o.name.lower() for o in Overflow],
                   help="overflow policy (default: the format's own)")
    p.add_argument("--flush", action="store_true",
                   help="flush subnormal results to zero")
    p.add_argument("--seed", type=_seed, default=None, help="seed for --rounding sr (an int >= 0)")


def _format_arg(p, flag=True):
    names = ", ".join(format_names())
    if flag:
        p.add_argument("--format", "-f", required=True, metavar="FORMAT",
                       help=f"target format: {names}")
    else:
        p.add_argument("fmt", metavar="FORMAT", help=f"an 8-bit or smaller format: {names}")


def _script_args(p):
    p.add_argument("script", metavar="SCRIPT", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's own arguments")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fpemu", description="Bit-exact emulation of low-precision floating point."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="run every experiment and write the report (HTML, "
                                    "figures, JSON)",
                       description="Run every lesson experiment on its defaults (under 3 "
                                   "minutes on two cores) and write OUT/index.html, the figures "
                                   "as SVG and PNG (--pdf: also PDF) and OUT/results.json.")
    d.add_argument("--out", default="out", metavar="DIR", help="output folder (default out)")
    d.add_argument("--quick", action="store_true",
                   help="reduced sizes (seconds; for tests), not the lesson's settings")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.add_argument("--pdf", action="store_true", help="also write every figure as PDF")
    d.set_defaults(func=_cmd_demo)
    rn = sub.add_parser("run", help="run one experiment, with parameters overridden",
                        description="Run one experiment and print its numbers and "
                                    "conclusion. Experiments: " + ", ".join(ORDER) + ". "
                                    "Override any config field: --steps 100 --lr 1e-3; "
                                    "tuples comma-separated: --scales 1,8,1024.")
    rn.add_argument("name", metavar="NAME", help="the experiment: " + ", ".join(ORDER))
    rn.add_argument("--out", default=None, metavar="DIR",
                    help="also write a one-section report with its figures here")
    rn.add_argument("--quick", action="store_true", help="start from the reduced sizes")
    rn.add_argument("params", nargs=argparse.REMAINDER, metavar="--PARAM VALUE",
                    help="config overrides")
    rn.set_defaults(func=_cmd_run)
    h = sub.add_parser("hist", help="underflow histogram of your own tensors (.npy, .npz, "
                                    ".pt, .safetensors)",
                       description="Count, in every format, what your tensors would "
                                   "become (exactly, chunk by chunk: a file larger than "
                                   "memory works), print the counts and draw the underflow "
                                   "histogram.")
    h.add_argument("file", metavar="FILE",
                   help=".npy / .npz, or .pt / .safetensors when torch / safetensors are "
                        "installed")
    h.add_argument("--formats", default="fp16,bf16,e4m3fn,e5m2", metavar="F1,F2",
                   help="comma-separated formats (default fp16,bf16,e4m3fn,e5m2)")
    h.add_argument("--scale", type=_number, default=1.0,
                   help="a loss scale to overlay (default 1: none)")
    h.add_argument("--yscale", choices=("linear", "log"), default="linear")
    h.add_argument("-o", "--output", default="hist.png", metavar="FIG",
                   help="figure file: .png, .svg or .pdf (no extension: all three)")
    h.add_argument("--no-progress", action="store_true", help="no progress bar")
    h.set_defaults(func=_cmd_hist)
    b = sub.add_parser("blocks", help="your tensors in every block format (MXFP8/6/4, "
                                      "NVFP4): SQNR, clipped blocks",
                       description="Quantize every floating-point tensor of a file (blocks "
                                   "along its last axis: a Linear weight's input features) "
                                   "under each block-format preset of fpemu.block and print "
                                   "the combined error: bits per value, SQNR, MSE, the share "
                                   "of blocks clipped and of nonzero values flushed.")
    b.add_argument("file", metavar="FILE", help=".npy / .npz, or .pt / .safetensors (torch)")
    b.add_argument("--presets", default=None, metavar="P1,P2",
                   help="comma-separated presets (default: the MX and NVFP4 presets)")
    b.add_argument("--match", default=None, metavar="TEXT",
                   help="only tensors whose name contains TEXT (e.g. weight)")
    b.add_argument("--min-size", type=int, default=256, metavar="N",
                   help="skip tensors of fewer values (biases, norms; default 256)")
    b.add_argument("--per-tensor", action="store_true", help="also a line per tensor")
    b.add_argument("--json", default=None, metavar="FILE", help="write every row as JSON")
    b.set_defaults(func=_cmd_blocks)
    cs = sub.add_parser("casts", help="a cast table of telling values into every format")
    cs.set_defaults(func=_cmd_casts)
    f = sub.add_parser("formats", help="print the table of all formats")
    f.set_defaults(func=_cmd_formats)
    e = sub.add_parser("explain", help="one value rounded into a format, bit by bit, and why",
                       description="Round one number into a format and explain the result.")
    e.add_argument("x", type=_exact_number, metavar="X",
                   help="the number, read exactly, e.g. 0.1, -3e-5, 1e-400, -inf")
    _format_arg(e)
    _rounding_args(e)
    e.set_defaults(func=_cmd_explain)
    t = sub.add_parser("table", help="all codes of an 8-bit format as a 16x16 grid",
                       description="Print the value of every code (row = high nibble).")
    _format_arg(t, flag=False)
    t.set_defaults(func=_cmd_table)
    q = sub.add_parser("quantize", help="round numbers into a format and show their codes",
                       description="Round numbers into a format; print values and codes.")
    _format_arg(q)
    q.add_argument("values", type=_exact_number, nargs="+", metavar="X",
                   help="numbers to round, read exactly from their decimal text (negative "
                        "numbers such as -3e-5 and -inf are fine)")
    _rounding_args(q)
    q.set_defaults(func=_cmd_quantize)
    s = sub.add_parser("stats", help="underflow / overflow counts of a .npy array",
                       description="Count zeros, flushed, subnormal, normal and overflowing "
                                   "values of a .npy array rounded into a format (read in "
                                   "chunks, memory-mapped), with a log2 histogram.")
    s.add_argument("file", metavar="FILE.npy", help="a numpy .npy file")
    _format_arg(s)
    s.add_argument("--scale", type=_number, default=1.0,
                   help="multiply by this first (a loss scale), default 1")
    _rounding_args(s)
    s.set_defaults(func=_cmd_stats)
    mo = sub.add_parser("monitor", help="run a PyTorch training script and report, layer by "
                                        "layer, what each format would do to it",
                        description="Run SCRIPT (with its ARGS) under fpemu.torch.monitor and "
                                    "write an HTML report: per-layer underflow histograms, the "
                                    "flushed share per layer and step, the amax history, the "
                                    "first overflow and a verdict per format. The model is the "
                                    "one the script passes to fpemu.torch.watch(model), or else "
                                    "the module that owns the parameters of the first optimizer "
                                    "the script creates.")
    mo.add_argument("--out", default="fpemu-monitor", metavar="DIR",
                    help="report folder (default fpemu-monitor)")
    mo.add_argument("--formats", default="fp16,bf16,e4m3fn,e5m2", metavar="F1,F2",
                    help="comma-separated what-if formats (default fp16,bf16,e4m3fn,e5m2)")
    mo.add_argument("--scaling", default="none", metavar="S1,S2",
                    help="comma-separated: none, loss_scale, current, delayed, mx, nvfp4 "
                         "(default none)")
    mo.add_argument("--every", type=int, default=1, help="count every N-th step (default 1)")
    mo.add_argument("--sample", type=int, default=None,
                    help="count a seeded sample of N elements of each larger tensor")
    mo.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    _script_args(mo)
    mo.set_defaults(func=_cmd_monitor)
    em = sub.add_parser("emulate", help="run a PyTorch training script with every nn.Linear "
                                        "under an emulated low-precision recipe",
                        description="Run SCRIPT (with its ARGS) unchanged, with every nn.Linear "
                                    "of its model running fprop, dgrad and wgrad GEMMs under "
                                    "RECIPE (fpemu.torch.emulate): operands quantized on the "
                                    "model's device as TransformerEngine quantizes them, bit for "
                                    "bit fpemu.autograd.fp8's recipes. The model is the module "
                                    "that owns the parameters of the first optimizer the script "
                                    "creates.")
    em.add_argument("--recipe", default="nvfp4", metavar="NAME",
                    help="delayed, current, fp8-block, mxfp8, nvfp4, bf16 or fp16 "
                         "(default nvfp4)")
    em.add_argument("--accumulation", default=None, metavar="MODEL",
                    help="run the GEMMs on the host under this fpemu.accumulate model "
                         "(h100-fp8, b200-mxf8f6f4, b200-mxf4nvf4, ...; slow)")
    _script_args(em)
    em.set_defaults(func=_cmd_emulate)
    r = sub.add_parser("record", help="run the fidelity scenarios with PyTorch and save traces",
                       description="Run every fidelity scenario with real PyTorch and write "
                                   "<out>/<device>-torch<version>/: one .npz per scenario and "
                                   "meta.json. Needs PyTorch and NumPy only.")
    r.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where PyTorch runs (default cpu)")
    r.add_argument("--out", default="tests/reference", metavar="DIR",
                   help="parent folder of the trace folder (default tests/reference)")
    r.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="only the scenarios matching these shell patterns, e.g. 'optim-*'")
    r.add_argument("--ops", action="store_true",
                   help="record, instead of the traces, every ATen op of chosen training "
                        "steps of the end-to-end scenarios (inputs and outputs) into "
                        "<trace folder>/ops/, for `fpemu parity --first-difference`")
    r.add_argument("--steps", metavar="N,M",
                   help="with --ops: the steps to record (default 0,10)")
    r.set_defaults(func=_cmd_record)
    y = sub.add_parser("parity", help="replay recorded traces in fpemu and compare bit for bit",
                       description="Replay every scenario of each trace folder in fpemu under "
                                   "the recorded torch version's profile; print per array "
                                   "bit-exact / within tolerance / failed. Exit status 1 if "
                                   "anything failed.")
    y.add_argument("dirs", nargs="*", metavar="DIR",
                   help="trace folders (default: every folder under tests/reference)")
    y.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="only the scenarios matching these shell patterns")
    y.add_argument("--first-difference", metavar="SCENARIO",
                   help="replay the scenario's recorded op stream (fpemu record --ops) op by "
                        "op on the recorded inputs and name the first op whose output differs "
                        "(its inputs' shapes and dtypes, how many elements, by how many ulps)")
    y.add_argument("--step", type=int, metavar="N",
                   help="with --first-difference: only this recorded step")
    y.add_argument("--all", action="store_true",
                   help="with --first-difference: print every replayed op, not only the first "
                        "that differs")
    y.set_defaults(func=_cmd_parity)
    w = sub.add_parser("warmup", help="compile the common kernels into Numba's cache ahead of "
                                      "use (make venv runs it)",
                       description="Run fpemu's common set once (quantize, encode and decode "
                                   "in every rounding mode for each family of formats, stats, "
                                   "the README's MLP training step in bf16 and fp16) so that "
                                   "later processes load those kernels from Numba's on-disk "
                                   "cache instead of compiling them, in one process per "
                                   "core. About two and a half minutes on two cores with an "
                                   "empty cache, a few seconds with a full one.")
    w.add_argument("--verbose", "-v", action="store_true", help="print each item and its time")
    w.add_argument("--processes", "-j", type=int, metavar="N",
                   help="compile in N processes at once (default: one per core; 1: in this "
                        "process)")
    w.set_defaults(func=_cmd_warmup)
    return p


def _cmd_warmup(args) -> int:
    def show(label, seconds):
        print(f"  {seconds:6.2f} s  {label}", flush=True)
    if args.processes is not None and args.processes < 1:
        raise CliError(f"fpemu warmup: --processes must be 1 or more, got {args.processes}")
    t = time.perf_counter()
    items = warmup(show if args.verbose else None, processes=args.processes)
    print(f"fpemu warmup: {len(items)} items in {time.perf_counter() - t:.1f} s; "
          f"kernels cached in {cache_dir()}")
    return 0


def _no_launcher(script, command):
    """``fpemu CMD torchrun ...``: the launcher goes first, fpemu after it."""
    if os.path.basename(script) in ("torchrun", "torch.distributed.run", "accelerate",
                                    "deepspeed", "mpirun", "srun"):
        raise CliError(f"fpemu {command} runs one Python script in this process, not the "
                       f"launcher {script!r}; put the launcher first: torchrun "
                       f"--nproc_per_node N --no-python fpemu {command} ... train.py")


def _cmd_monitor(args) -> int:
    _no_launcher(args.script, "monitor")
    check_input(args.script, "script")
    check_output_dir(args.out, "report folder")
    if args.every < 1:
        raise CliError(f"--every expects a step count >= 1, got {args.every}")
    if args.sample is not None and args.sample < 1:
        raise CliError(f"--sample expects a count >= 1, got {args.sample}")
    from .torch import run_script  # this command only
    mon = run_script(args.script, args.args, out=args.out, reraise=False,
                     formats=[f for f in args.formats.split(",") if f],
                     scaling=tuple(x for x in args.scaling.split(",") if x), every=args.every,
                     sample=args.sample, seed=args.seed)
    if mon is None:
        raise CliError(f"{args.script} created no optimizer and called no "
                       "fpemu.torch.watch(model): there was no model to watch")
    if mon.report_path is None:          # a rank > 0 of a torch.distributed job
        print(f"rank {mon.rank} of {mon.world}: {len(mon.local_records)} counts merged into "
              "rank 0's report")
    else:
        first = mon.first_overflow()
        ranks = f" ({mon.world} ranks merged)" if mon.world > 1 else ""
        print(f"{len({r.step for r in mon.records})} steps recorded, {len(mon.records)} "
              f"counts{ranks}")
        print("first overflow: " + (str(first) if first else "none (no value left any format's "
                                    "range, no inf or NaN)"))
        print(f"report: {mon.report_path}")
    if mon.script_error is not None:
        return _script_raised("monitor", args.script, mon.script_error,
                              "; the report covers the steps before it")
    return _script_status("monitor", mon.script_exit)


def _cmd_emulate(args) -> int:
    _no_launcher(args.script, "emulate")
    check_input(args.script, "script")
    from .torch import RECIPES, run_emulated_script as run_script  # this command only
    if args.recipe.lower() not in RECIPES:
        raise CliError(f"--recipe expects one of {', '.join(RECIPES)}, got {args.recipe!r}")
    emu, err, code = run_script(args.script, args.args, args.recipe,
                                accumulation=args.accumulation, reraise=False)
    before = " before it created an optimizer (nothing was emulated)"
    if emu is None and err is not None:     # the script failed first: its error, as python's
        return _script_raised("emulate", args.script, err, before)
    if emu is None and code not in (None, 0):
        return _script_status("emulate", code, before)
    if emu is None:
        raise CliError(f"{args.script} created no optimizer: there was no model to emulate "
                       "(fpemu emulate finds the module that owns the first optimizer's "
                       "parameters)")
    print(f"fpemu emulate: {len(emu.layers)} nn.Linear layers ran under "
          f"{type(emu.recipe).__name__}", file=sys.stderr)
    if err is not None:
        return _script_raised("emulate", args.script, err)
    return _script_status("emulate", code)


def _steps(text):
    try:
        steps = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        steps = []
    if not steps or min(steps) < 0:
        raise CliError(f"--steps must be step numbers separated by commas, such as 0,10; got "
                       f"{text!r}")
    return steps


def _cmd_record(args) -> int:
    from .reference.record import record  # this command only
    check_output_dir(args.out, "trace folder")
    if args.steps is not None and not args.ops:
        raise CliError("--steps goes with --ops (the steps whose op streams are recorded)")
    steps = _steps(args.steps or "0,10")
    try:
        if args.ops:
            from .reference.opstream import record_op_streams  # this command only
            folder = record_op_streams(args.device, args.out, args.only, steps)
            print(f"op streams written to {folder}/ops")
            return 0
        folder = record(args.device, args.out, args.only)
    except RuntimeError as err:
        raise CliError(str(err)) from None
    print(f"traces written to {folder}")
    return 0


def _cmd_first_difference(args) -> int:
    from .reference.opstream import OPS_DIR, first_difference  # this command only
    from .reference.parity import TraceFolderError, trace_dirs  # this command only
    from .reference.scenarios import SCENARIOS  # this command only
    name = args.first_difference
    stepped = [n for n, s in SCENARIOS.items() if s.group == "e2e"]
    if name not in stepped:
        what = "a scenario without training steps" if name in SCENARIOS else "no scenario"
        raise CliError(f"--first-difference: {name!r} is {what}; op streams are recorded for "
                       f"the end-to-end ones: {', '.join(stepped)}")
    dirs = args.dirs or [d for d in trace_dirs()
                         if os.path.exists(os.path.join(d, OPS_DIR, f"{name}.npz"))]
    if not dirs:
        raise CliError(f"no trace folder under tests/reference holds an op stream of {name}; "
                       f"record one with `fpemu record --ops --only {name}` (a GPU's with "
                       "`make gpu-check`) or pass a folder")
    differs = 0
    for d in dirs:
        try:
            first = first_difference(d, name, args.step, show_all=args.all)
        except (FileNotFoundError, TraceFolderError, FpemuValueError) as err:
            raise CliError(str(err)) from None
        differs += first is not None
        print()
    return 1 if differs else 0


def _cmd_parity(args) -> int:
    from .reference.parity import TraceFolderError, parity, trace_dirs  # this command only
    if args.first_difference:
        if args.only:
            raise CliError("--first-difference replays one scenario: drop --only")
        return _cmd_first_difference(args)
    if args.step is not None or args.all:
        raise CliError("--step and --all go with --first-difference SCENARIO")
    dirs = args.dirs or trace_dirs()
    if not dirs:
        raise CliError("no trace folders given and none under tests/reference; record some "
                       "with `fpemu record --device cpu` or pass a folder")
    failed = 0
    for d in dirs:
        try:
            results = parity(d, args.only)
        except (FileNotFoundError, TraceFolderError) as err:
            raise CliError(str(err)) from None
        failed += sum(not r.ok for r in results)
        print()
    return 1 if failed else 0


def _script_raised(command, script, err, note=""):
    """Status 1, after the traceback of the error the user's script raised
    and a line that names it (``note`` ends the line)."""
    _print_script_traceback(err, script)
    print(f"fpemu {command}: the script raised {type(err).__name__}: {err}{note}",
          file=sys.stderr)
    return 1


def _script_status(command, code, note=""):
    """The status of a script that called ``sys.exit(code)``, as Python's: 0
    for None or 0, an int as it is, else 1 after printing ``code``; a line on
    stderr says which (``note`` ends it)."""
    if code in (None, 0):
        return 0
    what = f"with status {code}" if isinstance(code, int) else f": {code}"
    print(f"fpemu {command}: the script exited {what}{note}", file=sys.stderr)
    return code if isinstance(code, int) else 1


def _print_script_traceback(err, script):
    """The traceback of an error a user's script raised, from the script's own
    frames on (as ``python script.py`` shows it), not fpemu's."""
    tb, want = err.__traceback__, os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != want:
        tb = tb.tb_next
    text = traceback.format_exception(type(err), err, tb or err.__traceback__)
    print("".join(text), file=sys.stderr, end="")


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(_protect_negative_numbers(argv))
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        try:
            status = args.func(args)
            sys.stdout.flush()
            return status
        except (CliError, FpemuError) as err:
            # only what fpemu's own checks raise is a user error; anything else is a bug
            # and keeps its traceback
            print(f"fpemu {args.command}: error: {err}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        return 130                     # 128 + SIGINT, quietly, as shell tools do
    except BrokenPipeError:
        # the reader went away (fpemu ... | head): stop quietly; point stdout at
        # /dev/null so Python's exit flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141                     # 128 + SIGPIPE, as for a process the pipe killed


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
