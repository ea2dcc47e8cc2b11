"""The ``fpemu`` command.

``fpemu demo``                     the format table and a cast table of telling values
``fpemu formats``                  the table of all formats
``fpemu explain X --format F``     one value rounded, bit by bit, and why
``fpemu table F``                  all codes of an 8-bit format as a 16x16 grid
``fpemu quantize --format F X..``  values rounded into a format, with their codes
``fpemu stats FILE.npy --format F`` underflow / overflow counts and a log2 histogram
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .formats import FORMATS, format_names
from .rounding import Overflow, Rounding

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


def _num(v: float) -> str:
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "-0" if np.signbit(v) else "0"
    if v == int(v) and abs(v) < 1e7:
        return str(int(v))
    return str(np.float32(v))  # shortest digits that read back as this float32


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
    from .quantize import quantize
    rows = [("value",) + tuple(f.name for f in FORMATS)]
    for label, v in values:
        row = [label]
        for f in FORMATS:
            if v != v and not f.has_nan:
                row.append("error")  # NaN into a format without NaN raises
                continue
            row.append(_num(float(quantize(np.float64(v), f))))
        rows.append(tuple(row))
    return _render(rows)


def _render(rows) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cmd_demo(args) -> int:
    from .quantize import encode, quantize
    print("fpemu: every format\n")
    print(format_table())
    print("\nCasts (float64 input, round to nearest even, each format's default overflow;")
    print("'error' = NaN into a format without NaN)\n")
    print(cast_table())
    print("\nRead it: 65520 overflows fp16 to inf; e4m3fn saturates 500 to 448 (PyTorch 2.13);")
    print("e4m3fnuz turns it into NaN; 1+2^-8+2^-30 rounds once to bf16 1.0078125, not")
    print(f"through float32 to 1.0; 1e-8 is {_num(float(quantize(1e-8, 'fp16')))} in fp16 but "
          f"{_num(float(quantize(1e-8, 'bf16')))} in bf16.")
    code = int(encode(500.0, "e4m3fn"))
    print(f"encode(500, e4m3fn) = 0x{code:02X}.")
    return 0


def _cmd_formats(args) -> int:
    print(format_table())
    return 0


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number such as 0.1, -3e-5, inf or nan; got {text!r}") from None


def _cmd_explain(args) -> int:
    from .explain import explain
    print(explain(args.x, args.format, rounding=args.rounding, subnormals=not args.flush,
                  overflow=args.overflow, seed=args.seed))
    return 0


def _cmd_table(args) -> int:
    from .explain import table_text
    print(table_text(args.fmt))
    return 0


def _cmd_quantize(args) -> int:
    kw = dict(rounding=args.rounding, subnormals=not args.flush, overflow=args.overflow,
              seed=args.seed)
    from .quantize import encode, quantize
    x = np.array(args.values, np.float64)
    q = quantize(x, args.format, **kw)
    codes = encode(x, args.format, **kw)
    from .formats import format as lookup
    hexw = (lookup(args.format).bits + 3) // 4
    rows = [("input", "value", "code")]
    for xi, qi, ci in zip(x, q, codes):
        rows.append((_num(float(xi)) if abs(xi) >= 1e-4 or xi == 0 else repr(float(xi)),
                     _num(float(qi)), f"0x{int(ci):0{hexw}X}"))
    print(_render(rows))
    return 0


def _cmd_stats(args) -> int:
    from .stats import stats_chunked
    try:
        arr = np.load(args.file, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise CliError(f"cannot read {args.file}: no such file") from None
    except (OSError, ValueError) as err:
        raise CliError(f"cannot read {args.file} as a .npy array ({err}); save it with "
                       "numpy.save") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "fiu":
        raise CliError(f"{args.file} holds {getattr(arr, 'dtype', type(arr))}, not real "
                       "numbers")
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


def _rounding_args(p):
    p.add_argument("--rounding", default="rne", choices=[m.name.lower() for m in Rounding],
                   help="rounding mode (default rne)")
    p.add_argument("--overflow", default=None, choices=[o.name.lower() for o in Overflow],
                   help="overflow policy (default: the format's own)")
    p.add_argument("--flush", action="store_true",
                   help="flush subnormal results to zero")
    p.add_argument("--seed", type=int, default=None, help="seed for --rounding sr")


def _format_arg(p, flag=True):
    names = ", ".join(format_names())
    if flag:
        p.add_argument("--format", "-f", required=True, metavar="FORMAT",
                       help=f"target format: {names}")
    else:
        p.add_argument("fmt", metavar="FORMAT", help=f"an 8-bit or smaller format: {names}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fpemu", description="Bit-exact emulation of low-precision floating point."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="print the format table and a cast table of telling values")
    d.set_defaults(func=_cmd_demo)
    f = sub.add_parser("formats", help="print the table of all formats")
    f.set_defaults(func=_cmd_formats)
    e = sub.add_parser("explain", help="one value rounded into a format, bit by bit, and why",
                       description="Round one number into a format and explain the result.")
    e.add_argument("x", type=_number, metavar="X", help="the number, e.g. 0.1")
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
    q.add_argument("values", type=_number, nargs="+", metavar="X", help="numbers to round")
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
    y.set_defaults(func=_cmd_parity)
    return p


def _cmd_record(args) -> int:
    from .reference.record import record
    try:
        folder = record(args.device, args.out, args.only)
    except RuntimeError as err:
        raise CliError(str(err)) from None
    print(f"traces written to {folder}")
    return 0


def _cmd_parity(args) -> int:
    from .reference.parity import parity, trace_dirs
    dirs = args.dirs or trace_dirs()
    if not dirs:
        raise CliError("no trace folders given and none under tests/reference; record some "
                       "with `fpemu record --device cpu` or pass a folder")
    failed = 0
    for d in dirs:
        try:
            results = parity(d, args.only)
        except FileNotFoundError as err:
            raise CliError(str(err)) from None
        failed += sum(not r.ok for r in results)
        print()
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except (CliError, ValueError, TypeError) as err:
        print(f"fpemu {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
