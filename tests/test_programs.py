"""Training programs written in plain PyTorch style (``tests/programs``), run
once under torch and once with only their import lines swapped for
fpemu.autograd (under the CPU profile, so that both compute as torch's CPU
build). The losses they record are compared."""

import io
import pathlib
import re
import sys
import types
import warnings

import numpy as np
import pytest

import torch  # noqa: F401  (installed by `make`, dev extras; the programs import it)

HERE = pathlib.Path(__file__).parent / "programs"


def _swap_line(line):
    """One import line of a program with ``torch`` replaced by
    ``fpemu.autograd``: ``import torch`` -> ``import fpemu.autograd as torch``,
    ``import torch.nn as nn`` -> ``import fpemu.autograd.nn as nn``, ``from
    torch.x import y`` -> ``from fpemu.autograd.x import y``."""
    m = re.match(r"^(\s*)import torch((?:\.\w+)*)(?: as (\w+))?\s*$", line)
    if m:
        indent, sub, alias = m.groups()
        if not sub:
            return f"{indent}import fpemu.autograd as {alias or 'torch'}"
        if alias is None:
            raise ValueError(f"'import torch{sub}' binds the name torch; write "
                             f"'import torch{sub} as ...' in the test programs")
        return f"{indent}import fpemu.autograd{sub} as {alias}"
    m = re.match(r"^(\s*)from torch((?:\.\w+)*) import (.+)$", line)
    if m:
        indent, sub, names = m.groups()
        return f"{indent}from fpemu.autograd{sub} import {names}"
    return line


def swapped(source):
    """The program with only its import lines changed; every other line kept."""
    lines = source.splitlines()
    out = [_swap_line(line) for line in lines]
    changed = [a for a, b in zip(lines, out) if a != b]
    assert changed and all(line.lstrip().startswith(("import ", "from ")) for line in changed)
    return "\n".join(out) + "\n"


def run(source, name):
    """Run the program as ``__main__`` (a real module, so that pickle finds
    the classes it defines, as for ``python program.py``)."""
    main = types.ModuleType("__main__")
    main.__file__ = name
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:
        exec(compile(source, name, "exec"), main.__dict__)
    finally:
        sys.modules["__main__"] = saved
    return main.LOSSES


# (program, rtol, learns). Measured on an AVX-512 machine, the largest
# relative differences: 7e-8 (gpt), 1.8e-7 (cnn), 1e-7 (amp, bf16 autocast),
# 9e-8 (vae), 1.1e-7 (dcgan), 1.1e-7 (gru_packed), 1.6e-7 (checkpointed),
# 1.4e-7 (shared_params), 9.9e-8 (save_whole_model), 9.9e-8 (loader_workers),
# 1.9e-15 (lbfgs_sequence, float64). They come from torch CPU's summation
# order and libm, which depend on its SIMD path (MKL, oneDNN), fed back
# through training; the tolerances leave room for other machines. ``learns``:
# the program's first recorded loss is above its second-to-last (the
# programs that record other numbers between the losses say False).
CASES = [("gpt.py", 1e-5, True), ("cnn.py", 1e-5, True), ("lstm.py", 1e-5, True),
         ("amp.py", 1e-4, False), ("vae.py", 1e-5, True), ("dcgan.py", 1e-5, False),
         ("gru_packed.py", 1e-5, False), ("lbfgs_sequence.py", 1e-10, True),
         ("checkpointed.py", 1e-5, False), ("shared_params.py", 1e-5, False),
         ("save_whole_model.py", 1e-5, True), ("loader_workers.py", 1e-5, False)]


@pytest.mark.parametrize("name,rtol,learns", CASES)
def test_program_runs_unchanged_and_matches_torch(name, rtol, learns):
    import fpemu.autograd as ft
    source = (HERE / name).read_text()
    with warnings.catch_warnings():
        # torch on this CPU has no accelerator to pin memory for (fpemu
        # emulates one, so its run does not warn)
        warnings.filterwarnings("ignore", "'pin_memory' argument is set as true but no "
                                          "accelerator", UserWarning)
        theirs = run(source, name)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        ours = run(swapped(source), name)
    assert len(ours) == len(theirs) and len(ours) >= 10
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=1e-6)
    if learns:
        assert ours[-2] < ours[0]


def test_every_program_is_tested():
    assert sorted(p.name for p in HERE.glob("*.py")) == sorted(c[0] for c in CASES)


def test_swapping_touches_only_imports():
    src = io.StringIO("import torch\nx = 'import torch'\nimport torch.nn as nn\n"
                      "from torch.utils.data import DataLoader\n").getvalue()
    out = swapped(src).splitlines()
    assert out == ["import fpemu.autograd as torch", "x = 'import torch'",
                   "import fpemu.autograd.nn as nn",
                   "from fpemu.autograd.utils.data import DataLoader"]
