"""The fpemu command, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fpemu import cli


def test_formats_and_casts_print_both_tables(capsys):
    assert cli.main(["formats"]) == 0
    assert cli.main(["casts"]) == 0
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
                       text=True, check=False, timeout=300)
    assert r.returncode == 0 and "e8m0" in r.stdout


def test_explain_command(capsys):
    assert cli.main(["explain", "0.1", "--format", "bf16", "--rounding", "rtz"]) == 0
    out = capsys.readouterr().out
    assert "0x3DCC = 0 01111011 1001100" in out and "0.099609375" in out and "toward zero" in out


def test_table_command(capsys):
    assert cli.main(["table", "e4m3fn"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 18 and lines[9].split()[-2:] == ["448", "nan"]


def test_quantize_command(capsys):
    assert cli.main(["quantize", "--format", "e4m3fn", "500", "465", "--overflow", "nan"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["500", "nan", "0x7F"], ["465", "nan", "0x7F"]]
    assert cli.main(["quantize", "-f", "e4m3fn", "500", "465"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows == [["500", "448", "0x7E"], ["465", "448", "0x7E"]]


def test_stats_command(tmp_path, capsys):
    path = tmp_path / "g.npy"
    np.save(path, np.array([0.0, 1e-9, 1e-6, 1.0, 7e4], np.float32))
    assert cli.main(["stats", str(path), "--format", "fp16"]) == 0
    out = capsys.readouterr().out
    counts = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[1:8]}
    assert counts == {"nan": 0, "inf": 0, "zero": 1, "flushed": 1, "subnormal": 1,
                      "normal": 1, "overflow": 1}
    assert cli.main(["stats", str(path), "--format", "fp16", "--scale", "1024"]) == 0
    assert "flushed               0" in capsys.readouterr().out


@pytest.mark.parametrize("argv,words", [
    (["stats", "/no/such/file.npy", "-f", "fp16"], "no such file"),
    (["explain", "0.1", "--format", "bf17"], "unknown format 'bf17'"),
    (["table", "fp16"], "at most 8 bits"),
    (["quantize", "-f", "e2m1", "nan"], "has no NaN"),
])
def test_bad_arguments_fail_clearly(argv, words, capsys):
    assert cli.main(argv) == 2
    assert words in capsys.readouterr().err


def test_unreadable_file_and_bad_number(tmp_path):
    bad = tmp_path / "x.npy"
    bad.write_text("hello")
    r = subprocess.run([sys.executable, "-m", "fpemu.cli", "stats", str(bad), "-f", "fp16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = subprocess.run([sys.executable, "-m", "fpemu.cli", "explain", "zero", "-f", "fp16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "expected a number" in r.stderr


@pytest.mark.parametrize("cmd", ["explain", "table", "quantize", "stats", "formats"])
def test_every_command_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as ex:
        cli.main([cmd, "--help"])
    assert ex.value.code == 0
    assert "usage: fpemu " + cmd in capsys.readouterr().out


# ---------------------------------------------------------------- reliability
def _run(*argv, **kw):
    kw.setdefault("timeout", 300)
    return subprocess.run([sys.executable, "-m", "fpemu.cli", *argv], capture_output=True,
                          text=True, **kw)


def _codes(out):
    return [line.split()[-1] for line in out.splitlines()[2:]]


def test_decimal_text_is_rounded_once(capsys):
    assert cli.main(["quantize", "--format", "bf16", "1.00390625000000000001"]) == 0
    assert _codes(capsys.readouterr().out) == ["0x3F81"]
    assert cli.main(["quantize", "-f", "bf16", "--rounding", "rup", "1e-400"]) == 0
    assert _codes(capsys.readouterr().out) == ["0x0001"]              # smallest subnormal
    assert cli.main(["quantize", "-f", "bf16", "--rounding", "rtz", "1e400", "-1e400"]) == 0
    assert _codes(capsys.readouterr().out) == ["0x7F7F", "0xFF7F"]    # ±max, not inf
    assert cli.main(["explain", "1.00390625000000000001", "-f", "bf16"]) == 0
    assert "0x3F81" in capsys.readouterr().out


def test_negative_numbers_are_values_not_options(capsys):
    assert cli.main(["quantize", "-f", "bf16", "-3e-5", "-inf", "-nan", "-1"]) == 0
    out = capsys.readouterr().out
    assert _codes(out) == ["0xB7FC", "0xFF80", "0x7FC0", "0xBF80"]
    assert out.splitlines()[2].startswith("-3e-5 ")                  # shown as typed
    assert cli.main(["explain", "-3e-5", "-f", "fp16"]) == 0
    assert capsys.readouterr().out.startswith("-3e-5 in fp16")


def test_broken_pipe_is_quiet():
    r = subprocess.run(f"{sys.executable} -m fpemu.cli quantize -f bf16 $(seq 1 30000) | head -1",
                       shell=True, capture_output=True, text=True, executable="/bin/bash",
                       timeout=300)
    assert r.stdout.startswith("input") and r.stderr == ""


@pytest.mark.parametrize("make", ["devnull", "empty", "fifo", "directory"])
def test_stats_on_what_is_not_a_npy_file(make, tmp_path):
    path = {"devnull": "/dev/null", "empty": str(tmp_path / "e.npy"),
            "fifo": str(tmp_path / "f"), "directory": str(tmp_path)}[make]
    if make == "empty":
        open(path, "w").close()
    if make == "fifo":
        os.mkfifo(path)
    r = _run("stats", path, "-f", "fp16", timeout=60)                # a FIFO must not hang
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "numpy.save" in r.stderr


def test_stats_reads_bool_arrays(tmp_path, capsys):
    np.save(tmp_path / "b.npy", np.array([True, False, True]))
    assert cli.main(["stats", str(tmp_path / "b.npy"), "-f", "e4m3fn"]) == 0
    out = capsys.readouterr().out
    assert "3 values into e4m3fn" in out and "zero" in out


def test_ctrl_c_exits_130_quietly(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "_cmd_stats", interrupted)
    assert cli.main(["stats", "x.npy", "-f", "fp16"]) == 130
    assert capsys.readouterr().err == ""


def test_internal_errors_are_not_reported_as_user_errors(monkeypatch):
    """Only fpemu's own checks are user errors (exit 2); a bug keeps its traceback."""
    def bug(args):
        raise ValueError("an internal bug")
    monkeypatch.setattr(cli, "_cmd_formats", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        cli.main(["formats"])


def test_seed_and_scale_arguments_are_checked(capsys):
    for argv in (["quantize", "-f", "bf16", "1", "--rounding", "sr", "--seed", "-1"],
                 ["quantize", "-f", "bf16", "1", "--seed", "x"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert "expected an int >= 0" in capsys.readouterr().err


# The demo (the README's first command, reduced sizes) runs once, as the README
# writes it: tests/test_readme.py checks its report.


def test_run_overrides_parameters_and_rejects_unknown_ones(capsys):
    assert cli.main(["run", "accumulation", "--ks", "128,256", "--rows", "2",
                     "--cols", "2"]) == 0
    out = capsys.readouterr().out
    assert "ks" in out and "[128, 256]" in out and "At K = 256" in out
    assert cli.main(["run", "accumulation", "--kz", "1"]) == 2
    err = capsys.readouterr().err
    assert "has no parameter --kz; its parameters are --ks, --rows, --cols, --seed" in err
    assert cli.main(["run", "accumulation", "--rows", "two"]) == 2
    assert "--rows expects int (default 8), got 'two'" in capsys.readouterr().err
    assert cli.main(["run", "nothing"]) == 2
    assert "unknown experiment 'nothing'" in capsys.readouterr().err


def test_hist_on_npy_npz_and_pt_files(tmp_path, capsys):
    g = (np.arange(1, 2001) * 2.0**-40).astype(np.float32)
    np.save(tmp_path / "g.npy", g)
    out_png = tmp_path / "h.png"
    assert cli.main(["hist", str(tmp_path / "g.npy"), "--formats", "fp16,bf16", "--scale",
                     "1024", "-o", str(out_png), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "2000 values into fp16 (scale 1024" in text and out_png.stat().st_size > 1000
    np.savez(tmp_path / "g.npz", a=g[:1000], b=g[1000:])
    assert cli.main(["hist", str(tmp_path / "g.npz"), "--formats", "e5m2", "-o",
                     str(tmp_path / "z.svg"), "--no-progress"]) == 0
    assert "2000 values into e5m2" in capsys.readouterr().out
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.tensor(g).to(torch.bfloat16), "step": 3}, tmp_path / "g.pt")
    assert cli.main(["hist", str(tmp_path / "g.pt"), "--formats", "fp16", "-o",
                     str(tmp_path / "t.png"), "--no-progress"]) == 0
    assert "2000 values into fp16" in capsys.readouterr().out
    from safetensors.torch import save_file
    save_file({"a": torch.tensor(g[:500]).to(torch.bfloat16), "b": torch.tensor(g[500:]),
               "i": torch.arange(3)}, str(tmp_path / "g.safetensors"))
    assert cli.main(["hist", str(tmp_path / "g.safetensors"), "--formats", "fp16", "-o",
                     str(tmp_path / "s"), "--no-progress"]) == 0
    assert "2000 values into fp16" in capsys.readouterr().out     # the int tensor is skipped
    assert (tmp_path / "s.svg").exists() and (tmp_path / "s.pdf").exists()
    assert cli.main(["hist", str(tmp_path / "g.txt"), "-o", str(tmp_path / "x.png")]) == 2
    assert "unknown file type" in capsys.readouterr().err


def test_blocks_on_npz_pt_and_safetensors(tmp_path, capsys):
    """One tensor: the summary is its error table. Two: the SQNR combines the
    tensors' squared errors and powers, and a bf16 tensor reads exactly."""
    import json

    from fpemu import block
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((64, 96)).astype(np.float32)
    w2 = (rng.standard_normal((32, 64)) * 1e-3).astype(np.float32)
    np.savez(tmp_path / "m.npz", w1=w1, bias=np.ones(8, np.float32), idx=np.arange(9))
    assert cli.main(["blocks", str(tmp_path / "m.npz"), "--presets", "nvfp4,mxfp4",
                     "--json", str(tmp_path / "one.json")]) == 0
    out = capsys.readouterr().out
    assert "1 tensors, 6144 values" in out                      # bias (8 values) skipped
    doc = json.loads((tmp_path / "one.json").read_text())
    want = {r["preset"]: r for r in block.error_table(w1, ["nvfp4", "mxfp4"])}
    for r in doc["summary"]:                   # one tensor: its own row, the same numbers
        for k in ("sqnr_db", "mse", "clipped", "flushed", "bits"):
            assert r[k] == want[r["preset"]][k], k
    torch = pytest.importorskip("torch")
    w2b = torch.tensor(w2).to(torch.bfloat16)
    torch.save({"layer": {"weight": torch.tensor(w1), "other": w2b}}, tmp_path / "m.pt")
    assert cli.main(["blocks", str(tmp_path / "m.pt"), "--presets", "nvfp4",
                     "--per-tensor", "--json", str(tmp_path / "two.json")]) == 0
    out = capsys.readouterr().out
    assert "layer.weight (64, 96)" in out and "layer.other (32, 64)" in out
    doc = json.loads((tmp_path / "two.json").read_text())
    w2f = w2b.float().numpy()
    rows = [block.error_table(w, ["nvfp4"])[0] for w in (w1, w2f)]
    sq = 10 * np.log10((rows[0]["power"] + rows[1]["power"]) / (rows[0]["sse"] + rows[1]["sse"]))
    assert doc["summary"][0]["sqnr_db"] == sq
    nz = rows[0]["nonzero"] + rows[1]["nonzero"]
    assert doc["summary"][0]["flushed"] == (rows[0]["flushed_values"]
                                            + rows[1]["flushed_values"]) / nz
    from safetensors.torch import save_file
    save_file({"w": torch.tensor(w1)}, str(tmp_path / "m.safetensors"))
    assert cli.main(["blocks", str(tmp_path / "m.safetensors"), "--presets", "mxfp8",
                     "--match", "w"]) == 0
    assert "1 tensors, 6144 values" in capsys.readouterr().out
    assert cli.main(["blocks", str(tmp_path / "m.npz"), "--presets", "nvfp5"]) == 2
    assert "unknown preset 'nvfp5'" in capsys.readouterr().err
    assert cli.main(["blocks", str(tmp_path / "m.npz"), "--match", "zz"]) == 2
    assert "no floating-point tensor" in capsys.readouterr().err
    np.save(tmp_path / "d.npy", np.full((4, 64), 0.1))
    assert cli.main(["blocks", str(tmp_path / "d.npy")]) == 2
    assert "float32 cannot hold" in capsys.readouterr().err


def test_demo_without_its_extra_names_the_extra(tmp_path):
    # `pip install fpemu` brings NumPy and Numba alone: there `fpemu demo`
    # names the extra to install, without a traceback and before writing
    # anything. sys.modules[name] = None makes find_spec and import see the
    # package as absent, as in an environment without it.
    code = ("import sys\n"
            "sys.modules['matplotlib'] = None\n"
            "sys.modules['torch'] = None\n"
            "from fpemu.cli import main\n"
            f"sys.exit(main(['demo', '--quick', '--out', {str(tmp_path / 'report')!r}]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "the demo needs matplotlib and torch" in res.stderr
    assert "pip install 'fpemu[demo]'" in res.stderr and "make demo" in res.stderr
    assert not (tmp_path / "report").exists()
