"""The fpemu command, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fpemu import cli


def test_demo_prints_both_tables(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    for name in ("fp32", "tf32", "fp16", "bf16", "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz",
                 "e4m3", "e3m4", "e2m3", "e3m2", "e2m1", "e8m0"):
        assert f"\n{name} " in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    # value  fp32 tf32 fp16 bf16 e4m3fn e5m2 e4m3fnuz e5m2fnuz e4m3 e3m4 e2m3 e3m2 e2m1 e8m0
    assert rows["65520"][3] == "inf" and rows["65519"][3] == "65504"
    assert rows["500"][5] == "448" and rows["500"][7] == "nan"
    assert rows["465"][4] == "464" and rows["465"][5] == "448"
    assert rows["1+2^-8+2^-30"][4] == "1.0078125"
    assert rows["1e-8"][3] == "0"
    assert rows["nan"][11:14] == ["error"] * 3
    assert "0x7E" in out


def test_formats_table(capsys):
    assert cli.main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "float8_e4m3fn" in out and "448" in out and "57344" in out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: fpemu" in capsys.readouterr().err


def test_bad_command_exits_nonzero():
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code != 0


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "fpemu.cli", "formats"], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0 and "e8m0" in r.stdout
