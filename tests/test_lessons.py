"""The lesson widgets (fpemu.lessons) and the notebooks' hygiene.

The rounding intervals and the bit toggle are checked against the table
oracle of tests/oracle.py, which rebuilds every value of a format from its
defining numbers and shares no code with fpemu. The ipywidgets forms are
driven as a browser would drive them (setting a button's value, clicking),
without a browser.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import fpemu
from fpemu import lessons
from fpemu.errors import FpemuTypeError, FpemuValueError

from oracle import SPECS, TableOracle

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
SMALL = ("e2m1", "e3m2", "e2m3", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3", "e3m4")


def _oracle_intervals(name):
    """{value: (lo, hi, lo_in, hi_in)} for every non-negative finite value."""
    o = TableOracle(SPECS[name])
    vals, codes = o.values, o.codes
    saturate = SPECS[name].default_overflow == "saturate"
    out = {}
    for i, (v, c) in enumerate(zip(vals, codes)):
        even = int(c) % 2 == 0
        lo = 0.0 if v == 0 else (vals[i - 1] + v) / 2
        if i + 1 < vals.size:
            hi, hi_in = (v + vals[i + 1]) / 2, even
        elif saturate:
            hi, hi_in = math.inf, True
        else:
            hi, hi_in = (v + o.ext_values[-1]) / 2, even
        out[float(v)] = (float(lo), float(hi), True if v == 0 else even, hi_in)
    return out


@pytest.mark.parametrize("name", SMALL)
def test_rounding_interval_matches_the_table_oracle(name):
    expected = _oracle_intervals(name)
    for v, iv in expected.items():
        assert lessons.rounding_interval(v, name) == iv, (name, v)
        if SPECS[name].signed and v != 0:
            lo, hi, lo_in, hi_in = iv
            assert lessons.rounding_interval(-v, name) == (-hi, -lo, hi_in, lo_in)


@pytest.mark.parametrize("name", ("e4m3fn", "e5m2", "e2m1"))
def test_rounding_interval_is_what_quantize_does(name):
    # Every end is a midpoint; just inside an interval rounds to its value, just
    # outside does not (checked with the oracle's rounding, not fpemu's).
    o = TableOracle(SPECS[name])
    for v in o.values[1:]:
        lo, hi, lo_in, hi_in = lessons.rounding_interval(float(v), name)
        inside = [lo * (1 + 1e-9), hi * (1 - 1e-9) if math.isfinite(hi) else v * 4]
        outside = [lo * (1 - 1e-9)] + ([hi * (1 + 1e-9)] if math.isfinite(hi) else [])
        want = int(o.round([float(v)])[0])
        assert (o.round(inside) == want).all()
        assert (o.round(outside) != want).all()
        assert (int(o.round([lo])[0]) == want) == lo_in
        if math.isfinite(hi):
            assert (int(o.round([hi])[0]) == want) == hi_in


def test_rounding_interval_of_zero_inf_and_nan():
    assert lessons.rounding_interval(0.0, "fp16") == (0.0, 2.0**-25, True, True)
    assert lessons.rounding_interval(-0.0, "fp16") == (-2.0**-25, -0.0, True, True)
    assert lessons.rounding_interval(math.inf, "fp16") == (65520.0, math.inf, True, True)
    assert lessons.rounding_interval(math.nan, "fp16") is None
    with pytest.raises(FpemuValueError, match="not a value of bf16; pass a value"):
        lessons.rounding_interval(0.1, "bf16")


def test_bit_toggle_walks_every_code_of_e5m2():
    o = TableOracle(SPECS["e5m2"])
    table = dict(zip(o.codes.tolist(), o.values.tolist()))
    for code in range(256):
        t = lessons.BitToggle("e5m2", code=code)
        mag = code & 0x7F
        if mag in table:
            assert t.value == (-1) ** (code >> 7) * table[mag]
            assert math.copysign(1, t.value) == (-1) ** (code >> 7)
        for bit in range(8):
            assert t.flip(bit).code == code ^ (1 << (7 - bit))
            t.flip(bit)
        assert t.code == code


def test_bit_toggle_info_against_the_oracle():
    o = TableOracle(SPECS["fp16"])
    vals = o.values
    for i in (1, 500, 1023, 1024, 15360, 31743):        # subnormals, 2^-14, 1.0, the max
        t = lessons.BitToggle("fp16", code=int(o.codes[i]))
        info = t.info()
        assert info["value"] == vals[i]
        assert info["below"] == vals[i - 1]
        assert info["above"] == (vals[i + 1] if i + 1 < vals.size else math.inf)
        assert info["cls"] == ("subnormal" if vals[i] < 2.0**-14 else "normal")
        assert info["interval"] == lessons.rounding_interval(vals[i], "fp16")
    t = lessons.BitToggle("fp16", 1.0)
    assert t.info()["meaning"] == "1.0000000000 x 2^0"
    assert t.step(3).value == 1 + 3 * 2**-10 and t.step(-4).value == 1 - 2**-11
    assert lessons.BitToggle("e4m3fn", code=0x7F).cls == "nan"
    assert lessons.BitToggle("e5m2", code=0x7C).cls == "inf"
    assert lessons.BitToggle("fp16", -0.0).bits == "1000000000000000"


def test_bit_toggle_rejects_bad_input():
    with pytest.raises(FpemuValueError, match=r"bit index must be 0 \.\. 7 .*got 8"):
        lessons.BitToggle("e4m3fn").flip(8)
    with pytest.raises(FpemuValueError, match="does not fit e2m1's 4 bits"):
        lessons.BitToggle("e2m1", code=16)
    with pytest.raises(FpemuTypeError, match="code must be an int"):
        lessons.BitToggle("e2m1", code=1.5)


def test_bit_toggle_displays_text_and_html():
    t = lessons.BitToggle("bf16", 0.1)
    text = t.text()
    assert "0x3DCD" in text and "0 01111011 1001101" in text and "0.10009765625" in text
    html = t._repr_html_()
    assert html.count("<td") == 16 and "0.10009765625" in html


def test_bit_toggle_widget_follows_clicks():
    pytest.importorskip("ipywidgets")
    t = lessons.BitToggle("fp16", 1.0)
    t.widget()
    w = t._widget
    assert len(w.buttons) == 16 and [b.value for b in w.buttons] == [c == "1" for c in t.bits]
    w.buttons[6].value = True                      # the top mantissa bit: 1.5
    assert t.value == 1.5 and "1.5" in w.out.value
    w.up.click()
    assert t.value == 1.5 + 2**-10 and w.buttons[15].value
    w.entry.value = "0.1"
    assert t.code == int(fpemu.encode(0.1, "fp16"))
    w.entry.value = "one"
    assert "is not a number" in w.out.value and t.code == int(fpemu.encode(0.1, "fp16"))
    w.menu.value = "e4m3fn"
    assert t.fmt.name == "e4m3fn" and len(w.buttons) == 8 and t.value == 0.1015625


def test_code_table_counts_and_html():
    t = lessons.CodeTable("e4m3fn")
    assert t.counts() == {"nan": 2, "normal": 238, "subnormal": 14, "zero": 2}
    html = t._repr_html_()
    assert html.count("<td") == 256 and html.count("background:#9cc3ea") >= 2   # +-448
    o = TableOracle(SPECS["e4m3fn"])
    assert np.array_equal(t.values[:8].ravel()[:127], o.values[:127])
    with pytest.raises(FpemuValueError, match="at most 8 bits"):
        lessons.CodeTable("fp16")


def test_interact_runs_once_headless(monkeypatch):
    monkeypatch.setenv("FPEMU_STATIC", "1")
    calls = []
    r = lessons.interact(lambda fmt, k: calls.append((fmt, k)) or f"{fmt}:{k}",
                         fmt=lessons.Choice(["fp16", "bf16"]), k=lessons.Slider(0, 10, 3))
    assert calls == [("fp16", 3)] and r.result == "fp16:3"
    assert r.values == {"fmt": "fp16", "k": 3}


def test_interact_live_redraws_on_change(monkeypatch):
    pytest.importorskip("ipywidgets")
    monkeypatch.setenv("FPEMU_STATIC", "0")
    shown = []
    monkeypatch.setattr(lessons, "_display", shown.append)
    calls = []
    r = lessons.interact(lambda fmt, k, fixed: calls.append((fmt, k, fixed)),
                         fmt=lessons.Choice(["fp16", "bf16"], value="bf16"),
                         k=lessons.Slider(-4, 4, 1.0, log=True), fixed=7)
    assert calls == [("bf16", 1.0, 7)] and r.values["fmt"] == "bf16"
    box = shown[0]
    menu = box.children[0].children[0]
    menu.value = "fp16"
    assert calls[-1] == ("fp16", 1.0, 7)


def test_controls_reject_bad_input():
    with pytest.raises(FpemuValueError, match="not one of the options"):
        lessons.Choice(["a", "b"], value="c")
    with pytest.raises(FpemuValueError, match="outside"):
        lessons.Slider(0, 1, 2)
    with pytest.raises(FpemuValueError, match="exponents"):
        lessons.Slider(-3, 3, 100, log=True)
    with pytest.raises(FpemuTypeError, match=r"wrap options in Choice\(\['a', 'b'\]\)"):
        lessons.interact(lambda x: x, x=["a", "b"])


def test_the_lessons_in_order():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01-anatomy-of-a-float", "02-rounding", "03-range-underflow-overflow",
                     "04-loss-scaling", "05-master-weights", "06-adam-epsilon",
                     "07-autocast-and-attention", "08-fp8-training", "09-claims-checked",
                     "10-fp4-blocks", "11-many-ranks", "12-your-model-in-fp8-and-fp4",
                     "13-test-your-kernel", "14-what-the-gpu-computes"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), \
        f"{path.name} has outputs: clear them before committing"
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# ") and ("**The question.**" in first or "verdict" in first)
    assert "Predict" in first or "decide what you believe" in first
    last = "".join(code[-1]["source"])
    assert "assert" in last, f"{path.name} must end by asserting its key numbers"
    text = "".join("".join(c["source"]) for c in code)
    assert "lessons.interact(" in text or "lessons.BitToggle(" in text, \
        f"{path.name} has no interactive widget (fpemu.lessons)"
    for banned in ("urllib", "requests", "http://", "https://", "wget"):
        assert banned not in text, f"{path.name} must not use the network ({banned})"
