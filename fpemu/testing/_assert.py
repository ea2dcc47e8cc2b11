"""Compare a conversion with fpemu bit for bit, and say what went wrong.

:func:`assert_quantized_equal` rounds the inputs with :func:`fpemu.quantize`
and compares the results value for value: equal numbers, the same sign of
zero, NaN where fpemu gives NaN (a NaN's payload is not compared). On a
mismatch the message gives the number of mismatches by class, the rules
that would give what the conversion gave (round toward zero, ties away from
zero, saturation, a flushed subnormal, ...), the first few mismatches each
with its exact input, both codes and values, the rounding interval and a
one-line reproducer. :class:`Report` gathers the same over many calls (the
exhaustive sweeps).
"""

from __future__ import annotations

import dataclasses

import numpy as np

import fpemu
from ..errors import FpemuTypeError, FpemuValueError
from ..formats import FORMATS, Format
from ..formats import format as _lookup

__all__ = ["assert_quantized_equal", "Report", "compare"]

_NAMED = {f.name: f for f in FORMATS}

#: Other configurations tried on each mismatch: (label, changes to the
#: configuration under test). Their result equal to the conversion's names
#: the rule the conversion follows.
_ROUNDINGS = (
    ("rna", "ties away from zero instead of to even"),
    ("rtz", "round toward zero (truncation)"),
    ("rup", "round toward +inf"),
    ("rdn", "round toward -inf"),
    ("rto", "round to odd"),
    ("rne", "round to nearest, ties to even"),
)


def _to_numpy(a, what):
    """A NumPy array of ``a`` (a NumPy array or scalar, an ml_dtypes array, a
    torch tensor on any device, a Python number or list): narrow float types
    widened exactly to float32, integers kept."""
    mod = type(a).__module__
    if mod.startswith("torch"):
        import torch  # optional dependency
        t = a.detach()
        if t.is_sparse or t.layout != torch.strided:
            t = t.to_dense()
        t = t.cpu()
        if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
            t = t.float()                                  # bf16 and fp8: exact widening
        if t.dtype in (torch.uint16, torch.uint32):        # NumPy has them; torch's .numpy() not
            t = t.to(torch.int64)
        a = t.numpy()
    try:
        arr = np.asarray(a)
    except Exception as err:                               # pragma: no cover - exotic objects
        raise FpemuTypeError(f"fpemu.testing: {what} must be an array or a tensor, got "
                             f"{type(a).__name__}") from err
    if arr.dtype.kind == "c":
        raise FpemuTypeError(f"fpemu.testing: {what} must be real, got dtype {arr.dtype} "
                             "(a cast of a complex number has no rounding of its own to "
                             "check); pass the real and imaginary parts as two real arrays")
    if arr.dtype.kind == "V" or (arr.dtype.kind == "f" and arr.dtype.itemsize == 2
                                 and arr.dtype != np.float16) or arr.dtype.kind not in "fiub":
        try:                                               # ml_dtypes' bfloat16, float8_*
            arr = arr.astype(np.float32)
        except (TypeError, ValueError) as err:
            raise FpemuTypeError(f"fpemu.testing: {what} must hold real numbers, got dtype "
                                 f"{arr.dtype}") from err
    if arr.dtype.kind == "b":
        raise FpemuTypeError(f"fpemu.testing: {what} must hold numbers, got booleans")
    return arr


def _format(fmt):
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str):
        return _lookup(fmt)
    raise FpemuTypeError(f"fpemu.testing: fmt must be a format name (\"bf16\") or an "
                         f"fpemu.Format, got {type(fmt).__name__} {fmt!r}")


def _fmt_expr(f: Format) -> str:
    """Python text that gives the format back."""
    if _NAMED.get(f.name) == f:
        return repr(f.name)
    return (f"fpemu.Format.custom({f.exponent_bits}, {f.mantissa_bits}, bias={f.bias}, "
            f"nan_encoding={f.nan_encoding!r}, signed={f.signed}, "
            f"has_subnormals={f.has_subnormals})")


def _same(a, e):
    """Element-wise: the same number with the same sign (zeros included), or
    both NaN. Float64 holds both exactly."""
    with np.errstate(invalid="ignore"):                   # (a signalling NaN's widening)
        a, e = a.astype(np.float64), e.astype(np.float64)
    an, en = np.isnan(a), np.isnan(e)
    return np.where(en, an, ~an & (a == e) & (np.signbit(a) == np.signbit(e)))


def _hex(v, dtype):
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    return f"0x{int(np.asarray(v, dtype).view(u)):0{2 * np.dtype(dtype).itemsize}X}"


def _show(v):
    v = float(v)
    if v != v:
        return "nan"
    if v == 0:
        return "-0.0" if np.signbit(v) else "0.0"
    return repr(v)


@dataclasses.dataclass
class _Config:
    fmt: Format
    rounding: str
    subnormals: bool
    overflow: str | None
    seed: object

    def quantize(self, x, **changes):
        kw = dict(rounding=self.rounding, subnormals=self.subnormals, overflow=self.overflow,
                  seed=self.seed)
        kw.update(changes)
        if kw["rounding"] != "sr":
            kw["seed"] = None
        return fpemu.quantize(x, self.fmt, **kw)

    def call_text(self):
        return (f"fpemu.quantize(x, {_fmt_expr(self.fmt)}, rounding={self.rounding!r}, "
                f"overflow={self._overflow()!r}, subnormals={self.subnormals})")

    def _overflow(self):
        return self.overflow or self.fmt.default_overflow


def _rules(cfg: _Config, x, actual, expected):
    """[(label, mask over the elements)]: which other rule gives each actual
    value. x, actual, expected: the mismatching elements only."""
    f = cfg.fmt
    out = []
    with np.errstate(all="ignore"):
        # an unsigned format (e8m0): a conversion may round a negative input's magnitude
        neg = (np.signbit(x) & ~np.isnan(x)) if not f.signed else np.zeros(x.shape, bool)
        if neg.any():
            best = None                        # the rounding of the magnitude that fits best
            for mode in (cfg.rounding,) + tuple(m for m, _ in _ROUNDINGS if m != cfg.rounding):
                on_mag = neg & _same(actual, cfg.quantize(np.abs(x), rounding=mode))
                if best is None or on_mag.sum() > best[1].sum():
                    best = (mode, on_mag)
            how = "same rounding" if best[0] == cfg.rounding else dict(_ROUNDINGS)[best[0]]
            out.append((f"the sign dropped: a negative input rounded as its magnitude ({how})",
                        best[1]))
        for mode, label in _ROUNDINGS:
            if mode != cfg.rounding:
                out.append((label, _same(actual, cfg.quantize(x, rounding=mode))))
        if not f.has_zero:
            least = f.min_subnormal if f.has_subnormals else f.min_normal
            out.append((f"zero into the smallest value ({f.name} has no zero)",
                        (x == 0) & (actual.astype(np.float64) == least)))
        ov = cfg._overflow()
        for pol in ("saturate", "inf", "nan"):
            if pol == ov or (pol == "inf" and not f.has_inf) or (pol == "nan" and not f.has_nan):
                continue
            label = {"saturate": ("saturation where the format has inf" if f.has_inf else
                                  "saturation instead of NaN on overflow"),
                     "inf": "no saturation: overflow to inf",
                     "nan": "no saturation: overflow to NaN"}[pol]
            out.append((label, _same(actual, cfg.quantize(x, overflow=pol))))
        if f.has_subnormals and cfg.subnormals:
            out.append(("flushed subnormal (subnormal results become zero)",
                        _same(actual, cfg.quantize(x, subnormals=False))))
        xf = x.astype(np.float64)
        a64, e64 = actual.astype(np.float64), expected.astype(np.float64)
        out.append(("NaN turned into inf", np.isnan(xf) & np.isinf(a64)))
        out.append(("NaN turned into a number", np.isnan(xf) & np.isfinite(a64)))
        fin = np.isfinite(e64) & (e64 != 0)
        out.append(("off-by-one exponent (the result is twice fpemu's: an exponent bias "
                    "one too small?)", fin & (a64 == 2 * e64)))
        out.append(("off-by-one exponent (the result is half fpemu's: an exponent bias "
                    "one too large?)", fin & (a64 == e64 / 2)))
        out.append(("the sign flipped", ~np.isnan(e64) & (a64 == -e64) & (e64 != 0)))
        out.append(("the sign of zero lost", (e64 == 0) & (a64 == 0)
                    & (np.signbit(a64) != np.signbit(e64))))
        out.append(("not rounded: the input passed through", _same(actual, x)))
        for mid in ("fp32", "tf32", "bf16", "fp16"):
            m = _lookup(mid)
            if m.mantissa_bits <= f.mantissa_bits or (mid == "fp32" and x.dtype != np.float64):
                continue                      # (float32 inputs are fp32 values already)
            twice = cfg.quantize(fpemu.quantize(x, m))
            out.append((f"double rounding: through {mid} first", _same(actual, twice)))
    return out


def _classes(f: Format, x, expected):
    """The class of each element: of the input where it says more (NaN, inf,
    overflow, underflow), else of fpemu's result."""
    xf, e = x.astype(np.float64), np.abs(expected.astype(np.float64))
    ax = np.abs(xf)
    cls = np.full(x.shape, "normal", dtype=object)
    cls[e == f.max] = "max"
    cls[(e < f.min_normal) & (e > 0)] = "subnormal"
    cls[(e == 0) & (ax > 0)] = "underflow"
    cls[ax == 0] = "zero"
    if not f.signed:
        cls[xf < 0] = "negative"
    cls[np.isfinite(xf) & (ax > f.max)] = "overflow"
    cls[np.isinf(xf)] = "inf"
    cls[np.isnan(xf)] = "nan"
    return cls


@dataclasses.dataclass
class _Example:
    index: tuple
    x: object
    expected: object
    actual: object
    cls: str
    rules: list


class Report:
    """Mismatches gathered over one or more comparisons: how many values
    were compared, mismatches by class, how many each rule explains, and the
    first examples. ``message()`` is the text :func:`assert_quantized_equal`
    raises."""

    def __init__(self, cfg: _Config, shown=5, skip_nan=False):
        self.cfg, self.shown = cfg, shown
        # a format without NaN has no rule for a NaN input: a sweep over every input
        # skips those (and counts them), an assertion on given inputs refuses them
        self.skip_nan = skip_nan and not cfg.fmt.has_nan
        self.skipped_nan = 0
        self.compared = 0
        self.mismatches = 0
        self.by_class = {}
        self.by_rule = {}
        self.examples = []

    def add(self, actual, x, offset=0):
        """Compare ``actual`` with fpemu's rounding of ``x`` (same shapes);
        ``offset``: the flat index of x's first element in the whole sweep."""
        with np.errstate(all="ignore"):        # signalling NaNs widen with a warning
            self._add(actual, x, offset)

    def _add(self, actual, x, offset):
        if self.skip_nan:
            nan = np.isnan(x)
            if nan.any():
                self.skipped_nan += int(nan.sum())
                f = self.cfg.fmt                        # a value of the format: stays itself
                keep = 0.0 if f.has_zero else np.float32(f.max)
                x, actual = np.where(nan, keep, x).astype(x.dtype), np.where(nan, keep, actual)
                self.compared -= int(nan.sum())
        expected = self.cfg.quantize(x)
        ok = _same(actual, expected)
        self.compared += x.size
        if ok.all():
            return
        bad = np.flatnonzero(~ok.reshape(-1))
        xs, acts, exps = (a.reshape(-1)[bad] for a in (x, actual, expected))
        self.mismatches += bad.size
        cls = _classes(self.cfg.fmt, xs, exps)
        for c in np.unique(cls):
            self.by_class[c] = self.by_class.get(c, 0) + int((cls == c).sum())
        rules = _rules(self.cfg, xs, acts, exps)
        for label, mask in rules:
            n = int(mask.sum())
            if n:
                self.by_rule[label] = self.by_rule.get(label, 0) + n
        for k in range(min(bad.size, self.shown - len(self.examples))):
            index = (np.unravel_index(bad[k], x.shape) if offset == 0 and x.ndim > 1
                     else (offset + int(bad[k]),))
            self.examples.append(_Example(tuple(int(i) for i in index), xs[k], exps[k],
                                          acts[k], str(cls[k]),
                                          [label for label, mask in rules if mask[k]]))

    def message(self):
        with np.errstate(all="ignore"):
            return self._message()

    def _message(self):
        cfg = self.cfg
        lines = [f"fpemu.testing: {self.mismatches} of {self.compared} values differ from "
                 f"{cfg.call_text()}"]
        if self.skipped_nan:
            lines.append(f"({self.skipped_nan} NaN inputs not compared: {cfg.fmt.name} has no "
                         "NaN, so no rule says what they become)")
        lines.append("mismatches by class: " + ", ".join(
            f"{c} {n}" for c, n in sorted(self.by_class.items(), key=lambda t: -t[1])))
        if self.by_rule:
            ranked = sorted(self.by_rule.items(), key=lambda t: -t[1])
            lines.append("the conversion follows: " + "; ".join(
                f"{label} ({n} of {self.mismatches})" for label, n in ranked))
        else:
            lines.append("the conversion follows none of the rules fpemu tried (other "
                         "rounding modes, overflow policies, flushing, NaN handling, an "
                         "exponent off by one, double rounding)")
        lines.append(f"first {len(self.examples)}:")
        for ex in self.examples:
            lines += self._example(ex)
        return "\n".join(lines)

    def _example(self, ex):
        f, cfg = self.cfg.fmt, self.cfg
        xd = np.asarray(ex.x).dtype
        where = ",".join(map(str, ex.index))
        out = [f"  [{where}] x = {_show(ex.x)} ({xd.name} {_hex(ex.x, xd)}), class {ex.cls}"]
        e_code = int(fpemu.encode(np.asarray(ex.x), f, rounding=cfg.rounding,
                                  subnormals=cfg.subnormals, overflow=cfg.overflow,
                                  seed=cfg.seed if cfg.rounding == "sr" else None))
        w = (f.bits + 3) // 4
        a = float(ex.actual)
        a_code = f"not a value of {f.name}"
        if _is_value(a, f):
            a_code = f"code 0x{int(fpemu.encode(np.float64(a), f, overflow=_keep(f))):0{w}X}"
        out.append(f"      expected {_show(ex.expected)} (code 0x{e_code:0{w}X}), actual "
                   f"{_show(a)} ({a_code})")
        if np.isfinite(float(ex.x)):
            try:
                e = fpemu.explain(np.asarray(ex.x).reshape(()).item() if xd == np.float64
                                  else np.asarray(ex.x, xd).reshape(())[()], f,
                                  rounding=cfg.rounding, subnormals=cfg.subnormals,
                                  overflow=cfg.overflow,
                                  seed=cfg.seed if cfg.rounding == "sr" else None)
                mid = ((e.below + e.above) / 2 if e.below != e.above
                       and np.isfinite(e.below) and np.isfinite(e.above) else None)
                out.append(f"      rounding interval [{_show(e.below)}, {_show(e.above)}]"
                           + (f", midpoint {_show(mid)}" if mid is not None else ""))
            except (FpemuValueError, FpemuTypeError):
                pass
        if ex.rules:
            out.append("      the actual value follows: " + "; ".join(ex.rules))
        u = {2: "uint16", 4: "uint32", 8: "uint64"}[xd.itemsize]
        kw = "" if cfg.rounding == "rne" else f", rounding={cfg.rounding!r}"
        kw += "" if cfg.overflow is None else f", overflow={cfg.overflow!r}"
        kw += "" if cfg.subnormals else ", subnormals=False"
        out.append(f"      reproduce: python -c \"import numpy as np, fpemu; print(fpemu.explain("
                   f"np.{u}({_hex(ex.x, xd)}).view(np.{xd.name}), {_fmt_expr(f)}{kw}))\"")
        return out


def _keep(f: Format):
    """An overflow policy that keeps every value of ``f`` (inf and NaN too)."""
    return "inf" if f.has_inf else ("nan" if f.has_nan else "saturate")


def _is_value(a: float, f: Format) -> bool:
    """Whether the number ``a`` is a value of ``f`` (NaN and inf where it has them)."""
    if a != a:
        return f.has_nan
    if a in (np.inf, -np.inf):
        return f.has_inf and (a > 0 or f.signed)
    if (a < 0 or (a == 0 and np.signbit(a))) and not f.signed:
        return False
    if a == 0 and not f.has_zero:
        return False
    with np.errstate(all="ignore"):
        q = fpemu.quantize(np.float64(a), f, rounding="rtz", overflow=_keep(f))
    return bool(q == a and np.signbit(q) == np.signbit(a))


def _config(fmt, rounding, subnormals, overflow, seed):
    f = _format(fmt)
    fpemu.quantize(np.zeros(1, np.float32), f, rounding=rounding, subnormals=subnormals,
                   overflow=overflow, seed=seed)               # the arguments' own checks
    return _Config(f, rounding, subnormals, overflow, seed)


def compare(actual, x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None,
            shown=5):
    """The :class:`Report` of ``actual`` against fpemu's rounding of ``x``
    (the arguments of :func:`assert_quantized_equal`); never raises for a
    mismatch."""
    cfg = _config(fmt, rounding, subnormals, overflow, seed)
    x = _to_numpy(x, "x")
    if x.dtype.kind != "f":
        raise FpemuTypeError(f"fpemu.testing: x must hold floating-point inputs, got dtype "
                             f"{x.dtype}; pass the array the conversion was given")
    a = _to_numpy(actual, "actual")
    if a.shape != x.shape:
        raise FpemuValueError(f"fpemu.testing: actual has shape {a.shape} and x {x.shape}; "
                              "pass the conversion's result for every input, in x's shape")
    if a.dtype.kind in "iu":                                   # codes: their values
        try:
            a = fpemu.decode(a.astype(cfg.fmt.code_dtype), cfg.fmt)
        except FpemuValueError as err:
            raise FpemuValueError(f"fpemu.testing: actual holds integers, read as codes of "
                                  f"{cfg.fmt.name}, and {err}") from None
    report = Report(cfg, shown)
    report.add(a, x)
    return report


def assert_quantized_equal(actual, x, fmt, *, rounding="rne", subnormals=True, overflow=None,
                           seed=None, shown=5):
    """Assert that ``actual`` is ``x`` rounded to ``fmt`` as fpemu rounds it.

    Parameters
    ----------
    actual : array or tensor
        The conversion's result: values (any float type: float32, float64,
        torch's bfloat16 or float8 tensors on any device, ml_dtypes arrays),
        or codes (an integer array: the format's bit patterns). Values are
        compared as numbers with their sign (-0 is not 0), NaN against NaN
        (payloads are not compared).
    x : array or tensor
        The inputs the conversion was given (float16, float32 or float64).
    fmt, rounding, subnormals, overflow, seed
        As in :func:`fpemu.quantize`.
    shown : int
        How many mismatches the message details.

    Raises
    ------
    AssertionError
        With mismatches by class, the rules the conversion follows instead,
        and the first mismatches with their inputs, codes, rounding
        intervals and reproducers.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu.testing import assert_quantized_equal
    >>> x = np.array([1.0, 1 + 2**-8, 3.4e38], np.float32)
    >>> assert_quantized_equal(np.array([1.0, 1.0, np.inf], np.float32), x, "bf16")
    >>> saturating = np.array([1.0, 1.0, 3.3895313892515355e38], np.float32)
    >>> assert_quantized_equal(saturating, x, "bf16")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: fpemu.testing: 1 of 3 values differ from fpemu.quantize(x, 'bf16', ...)
    mismatches by class: overflow 1
    the conversion follows: ...saturation where the format has inf (1 of 1)
    ...
    """
    report = compare(actual, x, fmt, rounding=rounding, subnormals=subnormals,
                     overflow=overflow, seed=seed, shown=shown)
    if report.mismatches:
        raise AssertionError(report.message())
