"""make test's scheduling (the root conftest.py): the files it sends whole to
one pytest-xdist worker exist, and only their tests travel together."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _root_conftest():
    spec = importlib.util.spec_from_file_location("fpemu_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_whole_files_exist_and_only_their_tests_travel_together():
    conf = _root_conftest()
    assert conf.WHOLE_FILES
    for path in conf.WHOLE_FILES:
        assert (ROOT / path).is_file(), f"conftest.WHOLE_FILES names {path}, which is not a file"
    assert conf.scope_of("tests/test_arith.py::test_sqrt[e4m3fn]") == "tests/test_arith.py"
    assert conf.scope_of("tests/test_arith.py::Cls::test_x") == "tests/test_arith.py"
    lone = "tests/test_formats.py::test_table[bf16]"
    assert conf.scope_of(lone) == lone
    nb = "notebooks/12-your-model-in-fp8-and-fp4.ipynb::12-your-model-in-fp8-and-fp4.ipynb"
    assert conf.scope_of(nb) == nb


def test_plain_pytest_without_xdist_runs_a_file():
    # The scheduler hook is pytest-xdist's: without the plugin, pytest must not
    # stop at start-up on an unknown hook (INTERNALERROR), as it did before the
    # hook was marked optional. `-p no:xdist` stands for an environment without it.
    import subprocess
    import sys
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--no-header",
         "tests/test_schedule.py", "-k", "whole_files_exist"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "INTERNALERROR" not in out, out
    assert proc.returncode == 0, out
    assert "1 passed" in out, out
