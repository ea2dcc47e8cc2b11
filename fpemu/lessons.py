"""The interactive pieces of the lesson notebooks.

Each piece is an object that knows its own state and shows it in two ways:
as live ipywidgets controls in Jupyter, and as static HTML (or a figure) when
no one can click, as when ``make test`` or the documentation build executes
the notebooks. :func:`interactive` decides which: it is false when
ipywidgets is not installed or the environment variable ``FPEMU_STATIC`` is
set (the notebook tests and the docs build set it).

* :class:`BitToggle`: the bits of one code of any format; flipping a bit shows
  the value, its class, its neighbours and the interval of reals that round to
  it.
* :class:`CodeTable`: every code of a format of up to 8 bits as a 16 x 16 table
  (row = high nibble), coloured by class.
* :func:`interact`: a function of a few :class:`Choice` / :class:`Slider`
  controls, redrawn when they move; headless it runs once at the defaults.
* :func:`rounding_interval`: the reals that round to a value, with which ends
  are included (ties).

Everything shown comes from fpemu's kernels (:func:`fpemu.decode`,
:func:`fpemu.quantize`, :func:`fpemu.next_up`); this module only lays it out.

>>> from fpemu.lessons import BitToggle
>>> t = BitToggle("bf16", 1.0)
>>> t.bits
'0011111110000000'
>>> t.flip(15).value                       # the last mantissa bit: 1 + 2**-7
1.0078125
>>> t.interval()                           # an odd code: both ties go elsewhere
(1.00390625, 1.01171875, False, False)
"""

from __future__ import annotations

import dataclasses
import decimal
import html
import importlib.util
import math
import numbers
import os

import numpy as np

from .errors import FpemuTypeError, FpemuValueError
from .explain import table, table_text, values
from .formats import Format, format_names
from .numtext import FIELD_TINTS
from .numtext import cell as _cell
from .numtext import readable as _show
from .checks import as_format
from .quantize import classify, decode, encode, next_down, next_up, quantize, ulp

__all__ = ["interactive", "BitToggle", "CodeTable", "Choice", "Slider", "interact",
           "Interaction", "rounding_interval", "FIELD_COLORS", "CLASS_COLORS"]

#: Background colours of the sign, exponent and mantissa bits.
FIELD_COLORS = FIELD_TINTS
#: Background colours of the value classes in tables (the plotting module's
#: region colours, lightened so that the text on them stays readable).
CLASS_COLORS = {"zero": "#e3e7e6", "subnormal": "#ffe1a8", "normal": "#d7e7f6",
                "inf": "#f0b8ad", "nan": "#c9b3d9", "max": "#9cc3ea"}


def interactive() -> bool:
    """Whether lesson pieces show live widgets (True) or static output.

    False when ipywidgets is missing or ``FPEMU_STATIC`` is set to anything
    but ``""`` or ``"0"``.
    """
    if os.environ.get("FPEMU_STATIC", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("ipywidgets") is not None


def _display(obj):
    from IPython.display import display  # optional dependency
    display(obj)


def rounding_interval(value, fmt, *, overflow=None):
    """The reals that round to ``value`` in ``fmt`` under round-to-nearest-even.

    Returns ``(lo, hi, lo_included, hi_included)``: the ends are the midpoints
    to the neighbouring values, and a tie (a real exactly at a midpoint) goes
    to the neighbour with the even code, so an end is included when
    ``value``'s code is the even one. The largest finite value reaches up to
    the overflow threshold (``inf`` when the policy saturates); infinity's
    interval starts there. ``+0`` owns ``[0, min_subnormal / 2]`` and ``-0``
    the mirror image. Returns ``None`` for NaN.

    The inclusion of each end is not derived from the rule but measured: the
    midpoint is rounded with :func:`fpemu.quantize` (exact in float64 for
    every format of fpemu), so the interval is what the kernels do.

    Examples
    --------
    >>> rounding_interval(256.0, "fp16")              # spacing 0.125 below, 0.25 above
    (255.9375, 256.125, True, True)
    >>> rounding_interval(65504.0, "fp16")            # 65520 and above overflow to inf
    (65488.0, 65520.0, False, False)
    >>> rounding_interval(448.0, "e4m3fn")            # e4m3fn saturates by default
    (432.0, inf, True, True)
    """
    fmt = as_format(fmt)
    v = float(quantize(float(value), fmt, overflow=overflow))
    if v != float(value) and not (v != v and float(value) != float(value)):
        raise FpemuValueError(f"rounding_interval(): {value!r} is not a value of {fmt.name}; "
                              f"pass a value of the format, e.g. {_show(v)}")
    if v != v:
        return None
    neg = math.copysign(1.0, v) < 0
    if neg:
        lo, hi, lo_in, hi_in = _positive_interval(-v, fmt, overflow, signed_zero=True)
        return -hi, -lo, hi_in, lo_in
    return _positive_interval(v, fmt, overflow, signed_zero=False)


def _rounds_to(x, v, fmt, overflow):
    q = float(quantize(x, fmt, overflow=overflow))
    return q == v and math.copysign(1.0, q) == math.copysign(1.0, v)


def _positive_interval(v, fmt: Format, overflow, signed_zero):
    if v == 0:
        hi = fmt.min_subnormal / 2 if fmt.has_subnormals else fmt.min_normal / 2
        return 0.0, hi, True, _rounds_to(hi, 0.0, fmt, overflow)
    top = fmt.max + float(ulp(fmt.max, fmt)) / 2          # the overflow threshold
    if math.isinf(v):
        return top, math.inf, _rounds_to(top, v, fmt, overflow), True
    if v == fmt.max:
        if _rounds_to(top * 4, v, fmt, overflow):           # saturating: all above is max
            hi, hi_in = math.inf, True
        else:
            hi, hi_in = top, _rounds_to(top, v, fmt, overflow)
    else:
        up = float(next_up(v, fmt))
        hi = (v + up) / 2
        hi_in = _rounds_to(hi, v, fmt, overflow)
    down = float(next_down(v, fmt))
    if down != down or down >= v or down == -math.inf:     # the smallest value of e8m0:
        return 0.0, hi, False, hi_in                        # all above 0 rounds up to it
    lo = (down + v) / 2              # from the smallest positive value down, halfway to 0
    return lo, hi, _rounds_to(lo, v, fmt, overflow), hi_in


def _fields(fmt: Format):
    return (["sign"] if fmt.signed else []) + ["exponent"] * fmt.exponent_bits \
        + ["mantissa"] * fmt.mantissa_bits


def _exact(value, where):
    """A starting value as encode reads it exactly: text becomes a Decimal."""
    if isinstance(value, str):
        try:
            return decimal.Decimal(value.strip().replace("_", ""))
        except decimal.InvalidOperation:
            raise FpemuValueError(f"{where}: {value!r} is not a number; type a decimal such "
                                  "as 0.1, 1e-5, -0 or inf") from None
    return value


class BitToggle:
    """One code of a format, bit by bit: flip bits and see what they mean.

    Parameters
    ----------
    fmt : str or Format
        Any fpemu format (``"fp32"``, ``"bf16"``, ``"e4m3fn"``, a custom one).
    value : float, optional
        The starting value, rounded to nearest even into the format (1.0):
        any real number, or text read exactly as a decimal
        (``"1.00390625000000000001"`` rounds to bf16's 1.0078125, not to
        the 1.0 its nearest float64 would give).
    code : int, optional
        The starting code instead of a value.

    Bits are numbered from the left: bit 0 is the sign (or the top exponent
    bit of an unsigned format). :meth:`info` returns everything the display
    shows; in Jupyter the object displays as a row of toggle buttons, a value
    box, next-up / next-down buttons and a format menu.

    Examples
    --------
    >>> t = BitToggle("e4m3fn", code=0x7E)
    >>> t.value, t.cls
    (448.0, 'normal')
    >>> t.flip(7).cls                            # 0x7F: e4m3fn's only NaN (per sign)
    'nan'
    >>> BitToggle("fp16", 1e-7).info()["cls"]
    'subnormal'
    """

    def __init__(self, fmt="bf16", value=1.0, *, code=None):
        self.fmt = as_format(fmt)
        if code is None:
            self.code = int(encode(_exact(value, "BitToggle"), self.fmt))
        else:
            self.code = self._check_code(code)
        self._widget = None

    def _check_code(self, code):
        if isinstance(code, bool) or not isinstance(code, (int, np.integer)):
            raise FpemuTypeError(f"BitToggle: code must be an int, got {code!r}")
        code = int(code)
        if not 0 <= code < 2 ** self.fmt.bits:
            raise FpemuValueError(f"BitToggle: code {code:#x} does not fit {self.fmt.name}'s "
                                  f"{self.fmt.bits} bits; pass 0 .. {2 ** self.fmt.bits - 1:#x}")
        return code

    # -- state -------------------------------------------------------------
    @property
    def bits(self) -> str:
        return format(self.code, f"0{self.fmt.bits}b")

    @property
    def value(self) -> float:
        return float(decode(np.array([self.code], dtype=self.fmt.code_dtype), self.fmt)[0])

    @property
    def cls(self) -> str:
        v = self.value
        if v != v:
            return "nan"
        return str(classify(v, self.fmt))

    def flip(self, i):
        """Flip bit ``i`` (0 = leftmost) and return self."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) \
                or not 0 <= i < self.fmt.bits:
            raise FpemuValueError(f"BitToggle.flip(): bit index must be 0 .. {self.fmt.bits - 1}"
                                  f" (0 = leftmost) for {self.fmt.name}, got {i!r}")
        self.code ^= 1 << (self.fmt.bits - 1 - int(i))
        self._refresh()
        return self

    def set_code(self, code):
        """Show ``code`` and return self."""
        self.code = self._check_code(code)
        self._refresh()
        return self

    def set_value(self, x, rounding="rne"):
        """Round ``x`` (a real number, or text read exactly as a decimal) into
        the format (``rounding``) and show its code."""
        self.code = int(encode(_exact(x, "BitToggle.set_value"), self.fmt, rounding=rounding))
        self._refresh()
        return self

    def step(self, n=1):
        """Move to the ``n``-th next value up (n > 0) or down (n < 0)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise FpemuTypeError(f"BitToggle.step(): n counts values and must be an int "
                                 f"(1: the next value up, -1: down), got {n!r}")
        v = self.value
        for _ in range(abs(int(n))):
            v = float(next_up(v, self.fmt) if n > 0 else next_down(v, self.fmt))
        if v == v:
            self.code = int(encode(v, self.fmt))
        self._refresh()
        return self

    def set_format(self, fmt):
        """Switch format, keeping the value (rounded to nearest even)."""
        v = self.value
        new = as_format(fmt)
        if v != v and not new.has_nan:
            raise FpemuValueError(f"BitToggle.set_format(): the toggle shows NaN and {new.name} "
                                  f"has no NaN; set a value first (e.g. .set_value(1.0))")
        self.fmt = new
        self.code = int(encode(v, self.fmt)) if v == v else int(self.fmt.nan_code)
        if self._widget is not None:
            self._widget.rebuild()
        return self

    def info(self) -> dict:
        """The code, bits, fields, value, class, neighbours and rounding interval."""
        f, v = self.fmt, self.value
        fields = _fields(f)
        e_bits = "".join(b for b, k in zip(self.bits, fields) if k == "exponent")
        m_bits = "".join(b for b, k in zip(self.bits, fields) if k == "mantissa")
        field = int(e_bits, 2) if e_bits else 0
        out = {"format": f.name, "code": self.code, "hex": f"0x{self.code:0{(f.bits + 3) // 4}X}",
               "bits": self.bits, "exponent_field": field, "mantissa_field": m_bits,
               "value": v, "cls": self.cls}
        if v == v and not math.isinf(v):
            if f.has_zero and field == 0:
                out["meaning"] = (f"subnormal: 0.{m_bits or '0'} x 2^{1 - f.bias}"
                                  if v != 0 else "zero")
            else:
                out["meaning"] = f"1.{m_bits or '0'} x 2^{field - f.bias}"
            out["below"] = float(next_down(v, f))
            out["above"] = float(next_up(v, f))
            out["spacing"] = float(ulp(v, f))
        out["interval"] = rounding_interval(v, f) if v == v else None
        return out

    def interval(self):
        """:func:`rounding_interval` of the current value."""
        return rounding_interval(self.value, self.fmt)

    # -- display -----------------------------------------------------------
    def _details(self, i) -> list:
        """The lines below the value, as plain text (both displays use them)."""
        lines = []
        if "meaning" in i:
            lines.append(f"= {i['meaning']}")
            lines.append(f"neighbours {_show(i['below'])} < {_show(i['value'])} < "
                         f"{_show(i['above'])} (spacing {_show(i['spacing'])})")
        if i["interval"] is not None:
            lines.append("reals that round here (nearest even): "
                         + _interval_text(i["interval"]))
        return lines

    def text(self) -> str:
        """The display as plain text."""
        i = self.info()
        return "\n".join([f"{i['format']}  code {i['hex']}  bits {self._spaced()}",
                          f"value {_show(i['value'])}  ({i['cls']})"] + self._details(i))

    def _spaced(self):
        fields, out, prev = _fields(self.fmt), [], None
        for b, k in zip(self.bits, fields):
            if prev is not None and k != prev:
                out.append(" ")
            out.append(b)
            prev = k
        return "".join(out)

    def __repr__(self):
        return f"BitToggle({self.fmt.name!r}, code={self.code:#x})  # {_show(self.value)}"

    def _repr_html_(self) -> str:
        i = self.info()
        cells = "".join(
            f'<td style="background:{FIELD_COLORS[k]};width:1.6em;text-align:center;'
            f'font-family:monospace;border:1px solid #fff">{b}</td>'
            for b, k in zip(self.bits, _fields(self.fmt)))
        rows = [f"<b>{html.escape(i['format'])}</b> &nbsp; code <code>{i['hex']}</code>",
                f'<table style="border-collapse:collapse;margin:4px 0"><tr>{cells}</tr></table>',
                f"value <b>{_show(i['value'])}</b> &nbsp; class <i>{i['cls']}</i>"]
        rows += [html.escape(line) for line in self._details(i)]
        return '<div class="fpemu-bits">' + "<br>".join(rows) + "</div>"

    def widget(self):
        """The ipywidgets controls (built once, kept in sync with the state)."""
        if self._widget is None:
            self._widget = _BitToggleWidget(self)
        return self._widget.box

    def _refresh(self):
        if self._widget is not None:
            self._widget.sync()

    def _ipython_display_(self):
        _display(self.widget() if interactive() else _HTML(self._repr_html_()))


def _interval_text(iv):
    lo, hi, lo_in, hi_in = iv
    return f"{'[' if lo_in else '('}{_show(lo)}, {_show(hi)}{']' if hi_in else ')'}"


class _HTML:
    def __init__(self, text):
        self.text = text

    def _repr_html_(self):
        return self.text


class _BitToggleWidget:
    """The ipywidgets form of a :class:`BitToggle`; every change goes through it."""

    def __init__(self, toggle: BitToggle):
        import ipywidgets as w  # optional dependency
        self.t = toggle
        self.w = w
        self.menu = w.Dropdown(options=list(format_names()), value=toggle.fmt.name
                               if toggle.fmt.name in format_names() else None,
                               description="format")
        self.entry = w.Text(description="value", continuous_update=False,
                            placeholder="a number, rounded to nearest even")
        self.down = w.Button(description="next down", layout=w.Layout(width="8em"))
        self.up = w.Button(description="next up", layout=w.Layout(width="8em"))
        self.out = w.HTML()
        self.buttons = []
        self.row = w.HBox()
        self.box = w.VBox([w.HBox([self.menu, self.entry]), self.row,
                           w.HBox([self.down, self.up]), self.out])
        self.menu.observe(self._on_format, names="value")
        self.entry.observe(self._on_entry, names="value")
        self.down.on_click(lambda _: self.t.step(-1))
        self.up.on_click(lambda _: self.t.step(1))
        self._build_buttons()
        self.sync()

    def _build_buttons(self):
        w = self.w
        self.buttons = []
        for i, kind in enumerate(_fields(self.t.fmt)):
            b = w.ToggleButton(description="0", layout=w.Layout(width="2.4em"),
                               tooltip=f"{kind} bit")
            b.style.button_color = FIELD_COLORS[kind]
            b.observe(self._on_bit(i), names="value")
            self.buttons.append(b)
        self.row.children = self.buttons

    def _on_bit(self, i):
        def handler(change):
            if self._syncing:
                return
            want = int(change["new"])
            if int(self.t.bits[i]) != want:
                self.t.flip(i)
        return handler

    _syncing = False

    def _on_format(self, change):
        if change["new"] is not None and not self._syncing:
            try:
                self.t.set_format(change["new"])
            except ValueError as e:             # NaN into a format without one
                self.sync()
                self.out.value = html.escape(str(e))

    def rebuild(self):
        """The format changed: one toggle per bit of the new one."""
        self._build_buttons()
        self.sync()

    def _on_entry(self, change):
        text = change["new"].strip()
        if not text:
            return
        try:
            self.t.set_value(text)
        except ValueError:
            self.out.value = (f"<b>{html.escape(text)!s}</b> is not a number; type a decimal "
                              "such as 0.1, 1e-5 or inf")

    def sync(self):
        self._syncing = True
        try:
            if self.t.fmt.name in format_names():
                self.menu.value = self.t.fmt.name
            for b, bit in zip(self.buttons, self.t.bits):
                b.value = bit == "1"
                b.description = bit
        finally:
            self._syncing = False
        self.out.value = self.t._repr_html_()


class CodeTable:
    """Every code of a format of at most 8 bits as a 16-column table.

    Entry (row r, column c) is code ``16 r + c``: the row is the high nibble,
    the column the low nibble. Cells are coloured by class (zero, subnormal,
    normal, the largest finite value, inf, NaN).

    Examples
    --------
    >>> t = CodeTable("e5m2")
    >>> t.values.shape, t.value(0x7B), t.cls(0x7C), t.cls(0x7D)
    ((16, 16), 57344.0, 'inf', 'nan')
    >>> print(str(t).splitlines()[2])                # doctest: +NORMALIZE_WHITESPACE
    0. 0 1.526e-05 3.052e-05 4.578e-05 6.104e-05 7.629e-05 9.155e-05 0.0001068
       0.0001221 0.0001526 0.0001831 0.0002136 0.0002441 0.0003052 0.0003662 0.0004272
    """

    def __init__(self, fmt):
        self.fmt = as_format(fmt)
        self.values = table(self.fmt)
        self._cls = values(self.fmt)["cls"].reshape(self.values.shape)

    def _code(self, code):
        n = self.values.size
        if isinstance(code, bool) or not isinstance(code, (int, np.integer)) \
                or not 0 <= code < n:
            raise FpemuValueError(f"CodeTable: a code of {self.fmt.name} is an int in 0 .. "
                                  f"{n - 1} ({n - 1:#x}), got {code!r}")
        return int(code)

    def value(self, code) -> float:
        return float(self.values.flat[self._code(code)])

    def cls(self, code) -> str:
        return str(self._cls.flat[self._code(code)])

    def counts(self) -> dict:
        """How many codes of each class (the largest value counts as normal)."""
        names, n = np.unique(self._cls, return_counts=True)
        return {str(k): int(c) for k, c in zip(names, n)}

    def _kind(self, code):
        c = self.cls(code)
        v = self.value(code)
        return "max" if c == "normal" and abs(v) == self.fmt.max else c

    def __str__(self):
        return table_text(self.fmt)

    def _repr_html_(self):
        rows, cols = self.values.shape
        head = "".join(f'<th style="padding:1px 3px;font-size:80%">.{c:X}</th>'
                       for c in range(cols))
        body = []
        for r in range(rows):
            tds = []
            for c in range(cols):
                code = r * cols + c
                v, kind = self.value(code), self._kind(code)
                tds.append(f'<td title="code 0x{code:02X}: {kind}" style="background:'
                           f'{CLASS_COLORS[kind]};padding:1px 3px;text-align:right;'
                           f'font-family:monospace;font-size:72%">{_cell(v, 3, "NaN")}</td>')
            body.append(f'<tr><th style="padding:1px 3px;font-size:80%">{r:X}.</th>'
                        f'{"".join(tds)}</tr>')
        legend = " ".join(f'<span style="background:{CLASS_COLORS[k]};padding:1px 6px">{k}'
                          f'</span>' for k in ("zero", "subnormal", "normal", "max", "inf", "nan")
                          if any(self._kind(i) == k for i in range(self.values.size)))
        return (f'<div class="fpemu-codes"><b>{html.escape(self.fmt.name)}</b>: every code '
                f'(row = high nibble, column = low nibble) &nbsp; {legend}'
                f'<div style="overflow-x:auto"><table style="border-collapse:collapse">'
                f'<tr><th></th>{head}</tr>{"".join(body)}</table></div></div>')


# -- interact: controls that work live or once ------------------------------

@dataclasses.dataclass
class Choice:
    """A menu of ``options``; ``value`` is the default (the first option)."""

    options: tuple
    value: object = None
    description: str = ""

    def __post_init__(self):
        self.options = tuple(self.options)
        if not self.options:
            raise FpemuValueError("Choice: options must not be empty; pass e.g. "
                                  "Choice(['fp16', 'bf16'])")
        if self.value is None:
            self.value = self.options[0]
        elif self.value not in self.options:
            raise FpemuValueError(f"Choice: value {self.value!r} is not one of the options "
                                  f"{self.options!r}")

    def widget(self, name):
        import ipywidgets as w  # optional dependency
        return w.Dropdown(options=list(self.options), value=self.value,
                          description=self.description or name)


@dataclasses.dataclass
class Slider:
    """A number from ``min`` to ``max``; ``log=True`` moves in powers of ``base``
    (``min``, ``max`` and ``step`` are then exponents)."""

    min: float
    max: float
    value: float
    step: float = None
    log: bool = False
    base: float = 2.0
    description: str = ""

    def __post_init__(self):
        for name in ("min", "max", "value", "step", "base"):
            v = getattr(self, name)
            if v is None and name == "step":
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise FpemuTypeError(f"Slider: {name} must be a finite real number, got {v!r}")
        if self.step is not None and self.step <= 0:
            raise FpemuValueError(f"Slider: step must be > 0, got {self.step!r}")
        if self.log and not self.base > 1:
            raise FpemuValueError(f"Slider: a log slider's base must be > 1, got {self.base!r}")
        if not self.min <= self.max:
            raise FpemuValueError(f"Slider: min {self.min!r} must not exceed max {self.max!r}")
        lo, hi = (self.base ** self.min, self.base ** self.max) if self.log else \
            (self.min, self.max)
        if not lo <= self.value <= hi:
            raise FpemuValueError(f"Slider: value {self.value!r} is outside [{lo!r}, {hi!r}]"
                                  + ("; with log=True, min and max are exponents"
                                     if self.log else ""))

    def widget(self, name):
        import ipywidgets as w  # optional dependency
        desc = self.description or name
        if self.log:
            return w.FloatLogSlider(value=self.value, base=self.base, min=self.min,
                                    max=self.max, step=self.step or 1, description=desc)
        if all(float(v).is_integer() for v in (self.min, self.max, self.value)) and \
                (self.step is None or float(self.step).is_integer()):
            return w.IntSlider(value=int(self.value), min=int(self.min), max=int(self.max),
                               step=int(self.step or 1), description=desc)
        return w.FloatSlider(value=self.value, min=self.min, max=self.max,
                             step=self.step or (self.max - self.min) / 100, description=desc)


def interact(fn, **controls):
    """Call ``fn(**values)`` now and, in Jupyter, again whenever a control moves.

    ``controls`` maps ``fn``'s keyword arguments to :class:`Choice` or
    :class:`Slider` (or plain values, passed through unchanged). ``fn`` may
    return a matplotlib Figure, an object Jupyter can display, a string (shown
    as text) or ``None`` (it displayed what it wanted). Headless (see
    :func:`interactive`), ``fn`` runs once with the defaults and its result is
    displayed like any cell output: the static figure of the lesson.

    Returns an :class:`Interaction` whose ``result`` is what ``fn`` returned
    for the defaults (it displays nothing itself, so a cell may end with it).
    """
    for k, c in controls.items():
        if isinstance(c, (list, tuple)):
            raise FpemuTypeError(f"interact(): control {k!r} is a {type(c).__name__}; wrap "
                                 f"options in Choice({list(c)!r}) or a range in Slider(...)")
    defaults = {k: c.value if isinstance(c, (Choice, Slider)) else c
                for k, c in controls.items()}
    if not interactive():
        result = fn(**defaults)
        _show_result(result)
        return Interaction(result, defaults)
    import ipywidgets as w  # optional dependency
    live = {k: c.widget(k) for k, c in controls.items() if isinstance(c, (Choice, Slider))}
    fixed = {k: c for k, c in controls.items() if k not in live}
    first = {}

    def redraw(**values):
        result = fn(**values, **fixed)
        first.setdefault("result", result)
        _show_result(result)

    out = w.interactive_output(redraw, live)
    _display(w.VBox([w.HBox(list(live.values())), out]))
    return Interaction(first.get("result"), defaults)


@dataclasses.dataclass
class Interaction:
    """What :func:`interact` returns: the defaults' result, without a display."""

    result: object
    values: dict

    def _ipython_display_(self):
        pass


def _show_result(result):
    if result is None:
        return
    try:
        from matplotlib.figure import Figure  # optional dependency
    except ImportError:                       # pragma: no cover - matplotlib is in the extra
        Figure = ()
    if isinstance(result, Figure):
        import matplotlib.pyplot as plt  # optional dependency
        _display(result)
        plt.close(result)
    elif isinstance(result, str):
        print(result)
    else:
        _display(result)
