"""Every code line of the README runs as written.

The python blocks run in order in one namespace (as a reader pastes them into
one session), in a scratch folder; then every ``fpemu ...`` line of the sh
blocks runs as a shell command and must exit 0: in the scratch folder, or at
the repository root for a block about ``tests/reference`` (the committed
traces). The ``make`` lines are the set-up commands that run this suite, so
they are the one thing not run here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
ROOT = README.parent
SHELL = [line.strip() for lang, code in BLOCKS if lang == "sh" for line in code.splitlines()
         if line.strip()]
AT_ROOT = {line.strip() for lang, code in BLOCKS if lang == "sh" and "tests/reference" in code
           for line in code.splitlines()}


def test_the_readme_has_code():
    assert len(PYTHON) >= 4 and any(line.startswith("fpemu ") for line in SHELL)
    assert {line.split()[0] for line in SHELL} <= {"fpemu", "make"}, SHELL


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


def _run_python_blocks(folder):
    """The python blocks in order, in one namespace, in ``folder`` (they
    write files that the command lines read: grads.npy, weight.npy)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        namespace = {"__name__": "readme"}
        for i, code in enumerate(PYTHON):
            exec(compile(code, f"README.md python block {i + 1}", "exec"), namespace)
    finally:
        os.chdir(here)


def test_python_blocks_run(scratch, capsys):
    _run_python_blocks(scratch)
    out = capsys.readouterr().out
    assert "0.1 in bf16" in out and "1e-400 in bf16" in out
    assert (scratch / "grads.npy").exists()


@pytest.mark.parametrize("line", [s for s in SHELL if s.startswith("fpemu ")])
def test_command_lines_run(line, scratch, capsys):
    if not (scratch / "weight.npy").exists():     # the python blocks ran elsewhere, or not yet
        _run_python_blocks(scratch)
        capsys.readouterr()
    if line.startswith("fpemu parity traces"):
        traces = scratch / "traces"
        if not traces.exists():                                  # made by the record line
            test_command_lines_run(next(s for s in SHELL if s.startswith("fpemu record")),
                                   scratch)
    cmd = f"{sys.executable} -m fpemu.cli" + line[len("fpemu"):]
    cwd = ROOT if line in AT_ROOT else scratch
    r = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True,
                       executable="/bin/bash", env=dict(os.environ), timeout=600)
    assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    assert r.stdout.strip(), line
    if line.startswith("fpemu demo "):
        _check_demo_report(scratch / line.split("--out ")[1].split()[0], r.stdout)


def _check_demo_report(folder, out):
    """The demo wrote every experiment into one page, with its figures."""
    import html
    import json

    from fpemu.experiments import ORDER
    assert f"{len(ORDER)} experiments in" in out and "index.html" in out
    page = (folder / "index.html").read_text()
    res = json.loads((folder / "results.json").read_text())
    assert [e["name"] for e in res["experiments"]] == list(ORDER)
    for e in res["experiments"]:
        assert f'<section id="{e["name"]}">' in page
        assert e["conclusion"] in html.unescape(page)
        for stem in e["figures"]:
            for ext in ("svg", "png"):
                assert (folder / "figures" / f"{stem}.{ext}").stat().st_size > 1000
            assert f'src="figures/{stem}.png"' in page
    assert res["experiments"][3]["numbers"]["eps_in_fp16"] == 0.0
