"""docs/contributing.md kept true.

Its "To add ..." lists are checked by making two of the additions they
describe in a copy of the repository, editing only the files the page
names, and running the tests that then cover them: a number format
(``e4m3b11fnuz``, ml_dtypes' ``float8_e4m3b11fnuz``) and a block scale rule
(``"nearest-scale"``, one level, its scale rounded to nearest, with a
preset). The lists the code cannot derive are checked against the code:
every named format has the test oracle's ``Spec``, and every op of torch's
namespace that an ops module defines is in that module's ``__all__``.

The copies keep Numba's cache (``__pycache__`` is copied with the sources'
times, so the kernels compiled here load there) and run only the tests of
the addition.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys

import pytest

import fpemu
from oracle import SPECS

try:
    import torch
except ImportError:           # the device halves of the checks are skipped
    torch = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "contributing.md")

#: What a copy holds: the package and the tests the additions run.
COPIED = ("fpemu", "setup.cfg", "conftest.py", "tests/conftest.py", "tests/oracle.py",
          "tests/block_data.py", "tests/test_formats.py", "tests/test_quantize.py",
          "tests/test_block_rules.py", "tests/test_torch_blocks.py",
          "tests/test_bad_input_surfaces.py")


def _section(title):
    """The text of the page's section ``## <title>``."""
    with open(PAGE) as fh:
        page = fh.read()
    parts = re.split(r"^## ", page, flags=re.M)
    found = [p for p in parts if p.startswith(title + "\n")]
    assert len(found) == 1, f"docs/contributing.md has no section '## {title}'"
    return found[0]


def _named_files(title):
    """The repository paths the section names (in backquotes)."""
    return set(re.findall(r"`((?:fpemu|tests|docs)/[^`\s]+\.(?:py|md))`", _section(title)))


def _copy(tmp_path):
    """A copy of what the additions need, file times kept (Numba's cache
    checks them)."""
    dst = tmp_path / "repo"
    for rel in COPIED:
        src = os.path.join(ROOT, rel)
        os.makedirs(os.path.dirname(dst / rel), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst / rel)
        else:
            shutil.copy2(src, dst / rel)
    return dst


def _edit(repo, rel, anchor, text, *, before=False, edited):
    """Put ``text`` after (or before) the one ``anchor`` of file ``rel``."""
    path = repo / rel
    src = path.read_text()
    assert src.count(anchor) == 1, (
        f"{rel} no longer holds {anchor!r} once: the addition tests/test_contributing.py "
        "makes as docs/contributing.md describes it needs updating with the code")
    new = text + anchor if before else anchor + text
    path.write_text(src.replace(anchor, new))
    edited.add(rel)


def _run(repo, *args, timeout=300):
    """Run ``python args`` in the copy, on the copy's fpemu; its output if it
    fails."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_CORE_")) and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout


def _pytest(repo, *args):
    return _run(repo, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                *args)


# ------------------------------------------------------------------ the page
@pytest.mark.parametrize("title", ["To add a number format",
                                   "To add a torch op to fpemu.autograd, with its autocast rule",
                                   "To add a block scale rule",
                                   "To add an fp8 / fp4 training recipe",
                                   "To add a collective algorithm"])
def test_every_file_the_page_names_exists(title):
    missing = [p for p in sorted(_named_files(title)) if not glob.glob(os.path.join(ROOT, p))]
    assert not missing, f"docs/contributing.md, '{title}', names files that do not exist: " \
                        f"{missing}"


def test_every_named_format_has_the_oracles_spec():
    """The test oracle describes each format of fpemu.formats.FORMATS
    independently (tests/oracle.py ``SPECS``); the defining fields agree."""
    missing = [f.name for f in fpemu.formats.FORMATS if f.name not in SPECS]
    assert not missing, (f"add a Spec line for {missing} to SPECS in tests/oracle.py, from the "
                         "format's specification")
    for f in fpemu.formats.FORMATS:
        s = SPECS[f.name]
        assert (s.E, s.M, s.bias, s.layout, s.signed, s.zero) == (
            f.exponent_bits, f.mantissa_bits, f.bias, f.nan_encoding, f.signed,
            f.has_subnormals), f.name


def test_every_op_of_torchs_namespace_is_in_its_modules_all():
    """A function an ops module defines under a name of torch's namespace
    is an op: fpemu.autograd has it only through the module's ``__all__``."""
    if torch is None:
        pytest.skip("torch's namespace is what names an op")
    ops = importlib.import_module("fpemu.autograd.ops")
    with open(ops.__file__) as fh:
        gathered = re.findall(r"^from \.(\w+) import \*", fh.read(), re.M)
    assert "elementwise" in gathered, "fpemu/autograd/ops/__init__.py gathers no __all__"
    left_out = []
    for name in gathered:
        mod = importlib.import_module(f"fpemu.autograd.ops.{name}")
        left_out += [f"{name}.{n}" for n, v in vars(mod).items()
                     if inspect.isfunction(v) and v.__module__ == mod.__name__
                     and not n.startswith("_") and hasattr(torch, n) and n not in mod.__all__]
        for n in mod.__all__:
            assert getattr(ops, n) is getattr(mod, n), f"ops.{n} is not {name}.{n}"
    assert not left_out, (f"add {left_out} to the __all__ of its module in "
                          "fpemu/autograd/ops/ (fpemu.autograd gathers the ops from there)")


def test_every_function_of_torch_nn_functional_is_in_its_modules_all():
    """A function an ``nn/_*.py`` family module defines under a name of
    ``torch.nn.functional`` is gathered by ``nn/functional.py`` only through
    the module's ``__all__``."""
    if torch is None:
        pytest.skip("torch.nn.functional's namespace is what names a function")
    F = importlib.import_module("fpemu.autograd.nn.functional")
    with open(F.__file__) as fh:
        gathered = re.findall(r"^from \.(_\w+) import \*", fh.read(), re.M)
    assert "_activation" in gathered, "fpemu/autograd/nn/functional.py gathers no __all__"
    left_out = []
    for name in gathered:
        mod = importlib.import_module(f"fpemu.autograd.nn.{name}")
        left_out += [f"{name}.{n}" for n, v in vars(mod).items()
                     if inspect.isfunction(v) and v.__module__ == mod.__name__
                     and not n.startswith("_") and hasattr(torch.nn.functional, n)
                     and n not in mod.__all__]
        for n in mod.__all__:
            assert getattr(F, n) is getattr(mod, n), f"functional.{n} is not {name}.{n}"
    assert not left_out, (f"add {left_out} to the __all__ of its module in "
                          "fpemu/autograd/nn/ (nn/functional.py gathers them from there)")


# -------------------------------------------------------------- a new format
FORMAT_LINE = '''e4m3b11fnuz = Format("e4m3b11fnuz", 4, 3, bias=11, nan_encoding="fnuz",
                     long_name="float8_e4m3b11fnuz")
'''

FORMAT_CHECK = """
import sys
import ml_dtypes
import numpy as np
import fpemu
assert fpemu.__file__.startswith(sys.argv[1]), fpemu.__file__
f = fpemu.format("float8_e4m3b11fnuz")
assert f in fpemu.FORMATS and f.name == "e4m3b11fnuz"
codes = np.arange(256, dtype=np.uint8)
want = codes.view(ml_dtypes.float8_e4m3b11fnuz).astype(np.float64)
got = fpemu.decode(codes, f).astype(np.float64)
assert np.array_equal(got, want, equal_nan=True)
x = np.linspace(-40, 40, 20001)
q = fpemu.quantize(x, f).astype(np.float64)
ref = x.astype(ml_dtypes.float8_e4m3b11fnuz).astype(np.float64)
assert np.array_equal(q, ref, equal_nan=True) and np.isnan(q).any()   # overflow: NaN
"""


def test_a_new_format_is_the_files_the_page_lists(tmp_path):
    """A format added as the page says (its line in FORMATS, its published
    numbers, its oracle Spec) decodes and rounds as ml_dtypes does, and its
    tests (published constants, every code, the table oracle under RNE)
    pass."""
    repo, edited = _copy(tmp_path), set()
    _edit(repo, "fpemu/formats.py", "\n#: The named formats", "\n" + FORMAT_LINE, before=True,
          edited=edited)
    path = repo / "fpemu" / "formats.py"
    src = path.read_text()
    tup = re.search(r"^FORMATS = \(([^)]*)\)", src, re.M)
    assert tup, "fpemu/formats.py: no 'FORMATS = (...)' tuple; update tests/test_contributing.py"
    path.write_text(src[:tup.end(1)] + ", e4m3b11fnuz" + src[tup.end(1):])
    _edit(repo, "tests/test_formats.py", "PUBLISHED = {\n",
          '    "e4m3b11fnuz": (8, 30.0, 2.0**-10, 2.0**-13, 0.125),   # ml_dtypes\n',
          edited=edited)
    _edit(repo, "tests/oracle.py", "SPECS = _Specs({\n",
          '    "e4m3b11fnuz": Spec("e4m3b11fnuz", 4, 3, 11, "fnuz", '
          'default_overflow="nan"),\n', edited=edited)
    assert edited <= _named_files("To add a number format"), (
        f"docs/contributing.md's list for a format lacks "
        f"{sorted(edited - _named_files('To add a number format'))}")
    _run(repo, "-c", FORMAT_CHECK, str(repo))
    out = _pytest(repo, "tests/test_formats.py", "tests/test_quantize.py", "-k",
                  "e4m3b11fnuz and (published or every_code or rne-True)")
    assert re.search(r"\b([2-9]|\d\d+) passed", out), out


# ---------------------------------------------------------- a new block rule
RULE_FUNCTION = '''def _nearest_scale_rule(job):
    """One level, no tensor scale: the block scale fp32(a / elem_max) rounded
    to nearest even in the scale format (capped at its maximum); elements
    fp32(x / scale), clamped; an all-zero block gets scale 0 and zeros."""
    xp = job.xp
    with xp.errstate():
        d = xp.minimum(job.amax_b / xp.const(job.elem.max, job.amax_b),
                       xp.f32(job.scale_fmt.max))
        dsq = job.ops.cast(d, job.scale_fmt)
    return _fp4_result(job, dsq, dsq, _clipped(job, dsq, divide=True), divide=True)


'''

RULE_TEXT = '''``"nearest-scale"`` (an example: the contributing page's)
    one level, no tensor scale: the block scale is ``fp32(a / elem_max)``
    rounded to the nearest scale value (ties to even, capped at the largest),
    elements ``fp32(x / scale)`` rounded to nearest even; an all-zero block
    gets scale 0 and zero elements.

'''

RULE_TEST = '''

def test_the_nearest_scale_rule_against_value_tables():
    """The scale: the e4m3fn value nearest fp32(amax / 6) (a tie to the even
    code); the elements: fp32(x / scale) to the nearest e2m1 value (a tie
    to the even code), clamped to 6."""
    e4m3 = [(c, (c & 7) / 8 * 2.0 ** -6 if c < 8 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7))
            for c in range(0x7F)]
    e2m1 = list(enumerate(E2M1_VALUES[:8]))

    def nearest(table, v):
        return min(table, key=lambda cv: (abs(cv[1] - v), cv[0] % 2))[1]

    x = spread((6, 64), 7, -12, 12)
    x[0, :16] = 0.0
    q = block.quantize_blocks(x, "nvfp4-nearest-scale")
    for r in range(6):
        for b in range(4):
            blk = x[r, 16 * b:16 * b + 16]
            d = float(np.float32(np.abs(blk).max()) / np.float32(6))
            s = nearest(e4m3, min(d, 448.0))
            assert q.scale_values[r, b] == s
            for i, v in enumerate(blk):
                t = abs(float(np.float32(v) / np.float32(s))) if s else 0.0
                want = nearest(e2m1, min(t, 6.0)) * s
                assert q.values[r, 16 * b + i] == (-want if v < 0 else want)
'''


def test_a_new_block_rule_is_the_files_the_page_lists(tmp_path):
    """A scale rule added as the page says (its function and SCALE_RULES
    entry, its text, a preset, a test against value tables) passes its
    test, and runs on the device driver as on the host: the device tests
    over every rule and every preset, and the bad-input tests over every
    preset, take it up (where torch is installed)."""
    repo, edited = _copy(tmp_path), set()
    _edit(repo, "fpemu/block/rules.py", "#: Every block scale rule by name", RULE_FUNCTION,
          before=True, edited=edited)
    _edit(repo, "fpemu/block/rules.py", "\n)}\nMX_RULES = ",
          '\n    ScaleRule("nearest-scale", "fp4", _nearest_scale_rule),', before=True,
          edited=edited)
    _edit(repo, "fpemu/block/__init__.py", 'fp32 scales (``scale_fmt="fp32"``', RULE_TEXT,
          before=True, edited=edited)
    _edit(repo, "fpemu/block/spec.py", "PRESETS = {p.name: p for p in (\n",
          '    BlockSpec("nvfp4-nearest-scale", "e2m1", "e4m3fn", 16, "nearest-scale",\n'
          '              "NVFP4 elements, one level, scales rounded to nearest"),\n',
          edited=edited)
    path = repo / "tests" / "test_block_rules.py"
    path.write_text(path.read_text() + RULE_TEST)
    edited.add("tests/test_block_rules.py")
    assert edited <= _named_files("To add a block scale rule"), (
        f"docs/contributing.md's list for a block scale rule lacks "
        f"{sorted(edited - _named_files('To add a block scale rule'))}")
    out = _pytest(repo, "tests/test_block_rules.py", "tests/test_torch_blocks.py",
                  "tests/test_bad_input_surfaces.py", "-k",
                  "nearest_scale_rule or nearest-scale or rule_table")
    ran = int(re.search(r"(\d+) passed", out).group(1))
    assert ran >= (2 if torch is None else 8), out      # with torch: the device, both paths
