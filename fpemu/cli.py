"""The ``fpemu`` command.

``fpemu demo``     the format table and a cast table of telling values
``fpemu formats``  the format table only
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .formats import FORMATS
from .quantize import encode, quantize

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fpemu", description="Bit-exact emulation of low-precision floating point."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="print the format table and a cast table of telling values")
    d.set_defaults(func=_cmd_demo)
    f = sub.add_parser("formats", help="print the table of all formats")
    f.set_defaults(func=_cmd_formats)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
