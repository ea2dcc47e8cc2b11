"""Training programs written in plain PyTorch style (``tests/programs``), run
once under torch and once with only their import lines swapped for
fpemu.autograd (under the CPU profile, so that both compute as torch's CPU
build). The losses they record are compared."""

import io
import pathlib
import re

import numpy as np
import pytest

import torch  # noqa: F401  (installed by `make`, dev extras; the programs import it)

HERE = pathlib.Path(__file__).parent / "programs"
SWAPS = [(r"^import torch$", "import fpemu.autograd as torch"),
         (r"^import torch\.nn as nn$", "import fpemu.autograd.nn as nn"),
         (r"^from torch\.nn import functional as F$",
          "from fpemu.autograd.nn import functional as F"),
         (r"^from torch\.utils\.data import", "from fpemu.autograd.utils.data import")]


def swapped(source):
    """The program with only its import lines changed; every other line kept."""
    out = source
    for pat, new in SWAPS:
        out = re.sub(pat, new, out, flags=re.M)
    changed = [a for a, b in zip(source.splitlines(), out.splitlines()) if a != b]
    assert changed and all(line.startswith(("import ", "from ")) for line in changed)
    return out


def run(source, name):
    ns = {"__name__": "__main__", "__file__": name}
    exec(compile(source, name, "exec"), ns)
    return ns["LOSSES"]


# (program, rtol). Measured on an AVX-512 machine: largest relative differences
# 7e-8 (gpt), 1.8e-7 (cnn), 1e-7 (amp, bf16 autocast). They come from torch
# CPU's summation order and libm, which depend on its SIMD path (MKL, oneDNN),
# fed back through training; the tolerances leave room for other machines.
CASES = [("gpt.py", 1e-5), ("cnn.py", 1e-5), ("lstm.py", 1e-5), ("amp.py", 1e-4)]


@pytest.mark.parametrize("name,rtol", CASES)
def test_program_runs_unchanged_and_matches_torch(name, rtol):
    import fpemu.autograd as ft
    source = (HERE / name).read_text()
    theirs = run(source, name)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        ours = run(swapped(source), name)
    assert len(ours) == len(theirs) and len(ours) >= 10
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=1e-6)
    assert ours[-2] < ours[0] or name == "amp.py"        # they learn


def test_swapping_touches_only_imports():
    src = io.StringIO("import torch\nx = 'import torch'\nimport torch.nn as nn\n").getvalue()
    out = swapped(src)
    assert out.splitlines()[1] == "x = 'import torch'"
