"""fpemu.torch: the monitor on real torch models (CPU).

Every count the monitor records is checked against fpemu.stats on a tensor the
test captured itself, with torch's own hooks registered by the test (not the
monitor's), after the monitor's hooks in each step. The scalings are
recomputed here from their definitions (TransformerEngine's float32 scale,
OCP MX's power-of-two block scale).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu  # noqa: E402
import fpemu.torch as ft  # noqa: E402
from fpemu.errors import FpemuTypeError, FpemuValueError  # noqa: E402

FORMATS = ("fp16", "bf16", "e4m3fn", "e5m2")


def _policy(fmt):
    f = fpemu.format(fmt)
    return "inf" if f.has_inf else ("nan" if f.has_nan else None)


class Spike(torch.nn.Module):
    """Multiplies its input by ``factor`` at the steps in ``at`` (a planted fault)."""

    def __init__(self, factor=1e5, at=()):
        super().__init__()
        self.factor, self.at, self.step = factor, set(at), 0

    def forward(self, x):
        return x * self.factor if self.step in self.at else x * 1.0


def cnn(spike=None):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(4 * 3 * 3, 16), spike or Spike(), torch.nn.Tanh(),
        torch.nn.Linear(16, 5))


class Capture:
    """The test's own record of every tensor, by (step, module, kind)."""

    def __init__(self, model, opt):
        self.data, self.step = {}, 0
        self.names = {m: n for n, m in model.named_modules() if n and not list(m.children())}
        for m, n in self.names.items():
            m.register_forward_hook(self._fwd(n))
        self.model, self.opt = model, opt

    def _fwd(self, name):
        def hook(module, args, out):
            self.data[(self.step, name, "activation")] = out.detach().clone()
            if out.requires_grad:
                out.register_hook(lambda g: self.data.__setitem__(
                    (self.step, name, "activation_grad"), g.detach().clone()))
        return hook

    def after_backward(self):
        for n, p in self.model.named_parameters():
            self.data[(self.step, n, "weight")] = p.detach().clone()
            self.data[(self.step, n, "weight_grad")] = p.grad.detach().clone()

    def after_step(self):
        for n, p in self.model.named_parameters():
            for k in ("exp_avg", "exp_avg_sq"):
                self.data[(self.step, n, k)] = self.opt.state[p][k].detach().clone()
        self.step += 1


def train(model, steps=3, scaling="none", capture=True, scaler=None, batch=8, **kw):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cap = Capture(model, opt) if capture else None
    x = torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 5, (batch,), generator=torch.Generator().manual_seed(2))
    with ft.monitor(model, opt, formats=FORMATS, scaling=scaling, scaler=scaler, **kw) as mon:
        for step in range(steps):
            for m in model.modules():
                if isinstance(m, Spike):
                    m.step = step
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            if scaler is None:
                loss.backward()
                if cap:
                    cap.after_backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                if cap:
                    cap.after_backward()
                scaler.step(opt)
                scaler.update()
            if cap:
                cap.after_step()
    return mon, cap


def _name(record):
    # the monitor names a parameter "<module>.<param>"; torch's named_parameters() the same
    return record.module


def test_every_count_equals_fpemu_stats_on_the_captured_tensor():
    mon, cap = train(cnn())
    assert mon.records and {r.kind for r in mon.records} == set(ft.KINDS)
    checked = 0
    for r in mon.records:
        x = cap.data[(r.step, _name(r), r.kind)]
        want = fpemu.stats(x.numpy(), r.format, overflow=_policy(r.format))
        assert r.counts == want, (r.step, r.module, r.kind, r.format)
        assert r.numel == r.counted == x.numel()
        finite = x[torch.isfinite(x)].abs()
        assert r.amax == float(finite.max())
        checked += 1
    assert checked == len(mon.records) >= 3 * 4 * (8 + 8 + 6 * 4)


def test_counting_on_the_device_gives_the_hosts_counts(monkeypatch):
    """count_on="device" (what a GPU tensor takes by default: fpemu.torch.stats,
    only the counts come back) against count_on="host" (fpemu's kernels), on
    the same training run repeated, under every scaling; a planted spike and
    a GradScaler put values beyond the range and scales that are not 1. The
    device's torch code is forced onto this CPU (whose own tensors go to
    fpemu's kernels)."""
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", False)
    for scaling in ("none", "current", "delayed", "mx", "nvfp4", "loss_scale"):
        runs = []
        for where in ("host", "device"):
            kw = {}
            if scaling == "loss_scale":
                kw["scaler"] = torch.amp.GradScaler("cpu", init_scale=2.0**12)
            mon, _ = train(cnn(Spike(1e5, at={1})), steps=2, scaling=scaling, capture=False,
                           count_on=where, **kw)
            runs.append(mon.records)
        host, device = runs
        assert len(host) == len(device) > 0
        for a, b in zip(host, device):
            assert (a.step, a.module, a.kind, a.format) == (b.step, b.module, b.kind, b.format)
            what = (scaling, a.module, a.kind, a.format)
            assert a.counts == b.counts and a.amax == b.amax, what
    with pytest.raises(FpemuValueError, match="count_on must be 'auto', 'device' or 'host'"):
        ft.monitor(cnn(), count_on="gpu")


@pytest.mark.parametrize("cpu_kernels", [False, True], ids=["torch-code", "numba"])
def test_stats_on_the_device_equal_fpemu_stats_for_every_format_and_scale(cpu_kernels,
                                                                          monkeypatch):
    """fpemu.torch.stats against fpemu.stats: random float32 bit patterns,
    values over every binade, zeros of both signs, infinities, NaN; float32,
    float64 (not float32 values) and float16 tensors; scales that keep the
    product a float32 number and scales that do not (1/3, 2**-300: those
    elements are counted on the host). Both the device's torch code (forced
    onto this CPU) and the CPU's own route (fpemu.stats on the tensor's
    memory)."""
    from fpemu.torch import _quantize
    monkeypatch.setattr(_quantize, "CPU_KERNELS", cpu_kernels)
    rng = np.random.default_rng(0)
    u = rng.integers(0, 1 << 32, 1 << 13, dtype=np.uint64).astype(np.uint32).view(np.float32)
    g = (rng.standard_normal(1 << 12) * np.exp2(rng.integers(-150, 128, 1 << 12))).astype(
        np.float32)
    x32 = np.concatenate([u, g, np.float32([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38])])
    with np.errstate(over="ignore", invalid="ignore"):
        inputs = (x32, x32.astype(np.float64) * 1.0000001, x32.astype(np.float16))
    for name in fpemu.formats.FORMATS:
        for scale in (1.0, 2.0**-20, 2.0**40, 1.0 / 3, 2.0**-300):
            for x in inputs:
                want = fpemu.stats(x, name, scale=scale, overflow=_policy(name))
                got = ft.stats(torch.from_numpy(x), name, scale=scale, overflow=_policy(name))
                assert got == want, (name, scale, x.dtype)


def test_steps_and_every():
    mon, _ = train(cnn(), steps=5, every=2, capture=False)
    assert sorted({r.step for r in mon.records}) == [0, 2, 4]


def test_first_overflow_finds_the_planted_spike_and_its_chain():
    model = cnn(Spike(1e5, at={2}))
    mon, _ = train(model, steps=4, capture=False)
    first = mon.first_overflow()
    assert (first.step, first.module, first.kind) == (2, "5", "activation")
    assert set(first.formats) == {"fp16", "e4m3fn", "e5m2"} and not first.real
    assert first.chain == ["6", "7"]
    assert "step 2: activation of 5" in str(first) and "5 -> 6" not in str(first)
    assert "then flows (forward) through: 6 -> 7" in str(first)


def test_first_overflow_reports_a_real_nan():
    class Poison(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.step = 0

        def forward(self, x):
            return x * float("nan") if self.step == 1 else x

    model = cnn(Poison())
    for m in model.modules():
        if isinstance(m, Poison):
            poison = m
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 1, 8, 8)
    with ft.monitor(model, opt, formats=("bf16",)) as mon:
        for step in range(2):
            poison.step = step
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    first = mon.first_overflow()
    assert first.real and first.step == 1 and first.module == "5" and first.nonfinite == 4 * 16
    assert mon.first_overflow(scaling="none") is not None
    with pytest.raises(FpemuValueError, match="was not recorded"):
        mon.first_overflow(scaling="mx")


def test_current_and_delayed_scaling_follow_transformer_engine():
    mon, cap = train(cnn(), steps=3, scaling=("current", "delayed"), history=2, margin=1)
    hist = {}
    for r in mon.records:
        x = cap.data[(r.step, _name(r), r.kind)].to(torch.float32)
        f = fpemu.format(r.format)
        amax = np.float32(x.abs().max())
        if r.scaling == "current":
            ref = amax
        else:
            h = hist.setdefault((r.module, r.kind, r.format), [])
            ref = max(h[-2:]) if h else None
            h.append(amax)
        with np.errstate(over="ignore"):       # a tiny amax: the scale caps at FLT_MAX
            s = np.float32(1.0) if not ref else np.float32(np.float32(f.max) / ref / np.float32(2))
        s = min(s, np.finfo(np.float32).max)
        assert r.scale == float(s)
        y = x.numpy() * s                                  # float32 multiply, as the kernel
        assert r.counts == fpemu.stats(y, f, overflow=_policy(f)), (r.scaling, r.module)
    cur = [r for r in mon.records if r.scaling == "current"]
    assert all(r.overflowed == 0 for r in cur)             # amax * scale = max / 2 fits


def test_mx_scaling_uses_one_power_of_two_per_block_of_the_last_dimension():
    mon, cap = train(cnn(), steps=1, scaling="mx", block=4)
    for r in mon.records:
        x = cap.data[(r.step, _name(r), r.kind)].to(torch.float64).numpy()
        f = fpemu.format(r.format)
        emax = int(math.floor(math.log2(f.max)))
        last = x.shape[-1] if x.ndim else 1
        rows = x.reshape(-1, last)
        out = np.empty_like(rows)
        for i in range(0, last, 4):
            blk = rows[:, i:i + 4]
            amax = np.abs(blk).max(axis=1, keepdims=True)
            e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, 0)
            out[:, i:i + 4] = blk / 2.0 ** np.clip(e, -127, 127)
        assert math.isnan(r.scale)
        assert r.counts == fpemu.stats(out.ravel(), f, overflow=_policy(f)), r.module


def test_nvfp4_scaling_is_transformer_engines_rule_per_16_values():
    """TE's NVFP4 scales recomputed in numpy float32 (E4M3 rounding of the
    block scales by ml_dtypes), with the format's maximum for E2M1's 6."""
    ml = pytest.importorskip("ml_dtypes")
    f32 = np.float32
    big = f32(np.finfo(np.float32).max)
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    cap = Capture(model, opt)
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(2))
    with ft.monitor(model, opt, formats=("e2m1", "e4m3fn"), scaling="nvfp4") as mon:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        cap.after_backward()
        opt.step()
        cap.after_step()
    seen = 0
    for r in mon.records:
        t = cap.data[(r.step, _name(r), r.kind)].numpy().astype(np.float32)
        fmax = f32(fpemu.format(r.format).max)
        last = t.shape[-1] if t.ndim else 1
        rows = t.reshape(-1, last)
        rows = np.pad(rows, ((0, 0), (0, (-last) % 16)))
        blocks = rows.reshape(rows.shape[0], -1, 16)
        amax_t = f32(np.abs(t).max())
        with np.errstate(all="ignore"):
            S = min(f32(f32(448 * fmax) / amax_t), big)
        S = f32(1) if amax_t == 0 or S == 0 else S
        with np.errstate(all="ignore"):
            ds = np.minimum((np.abs(blocks).max(-1, keepdims=True) / fmax).astype(f32) * S, big)
            ds = np.minimum(ds, f32(448)).astype(ml.float8_e4m3fn).astype(f32)
            enc = np.minimum(f32(1) / (ds * f32(f32(1) / S)), big)
        out = (blocks * enc).reshape(rows.shape)[:, :last].ravel()
        f = fpemu.format(r.format)
        assert r.counts == fpemu.stats(out, f, overflow=_policy(f)), (r.module, r.kind)
        seen += 1
    assert seen == len(mon.records) > 40
    assert all(math.isnan(r.scale) for r in mon.records)        # a scale per block


def test_gradscaler_gradients_are_unscaled_and_loss_scale_reads_the_scaler():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    mon, cap = train(cnn(), steps=2, scaling=("none", "loss_scale"), scaler=scaler)
    seen = 0
    for r in mon.records:
        if r.kind != "weight_grad":
            continue
        g = cap.data[(r.step, _name(r), r.kind)].numpy()     # .grad as backward left it: scaled
        S = 2.0**12
        want = fpemu.stats(g, r.format, scale=(1 / S if r.scaling == "none" else 1.0),
                           overflow=_policy(r.format))
        assert r.counts == want and r.scale == (1.0 if r.scaling == "none" else S)
        seen += 1
    assert seen == 2 * 2 * 4 * 6               # steps x scalings x formats x parameters
    with pytest.raises(FpemuValueError, match="needs the scale: pass scaler="):
        ft.monitor(cnn(), scaling="loss_scale")


def test_sample_counts_a_seeded_uniform_sample():
    mon, cap = train(cnn(), steps=1, sample=50, capture=True, seed=7)
    big = [r for r in mon.records if r.numel > 50]
    assert big and all(r.counted == 50 and r.row()["sampled"] for r in big)
    for r in big:
        x = cap.data[(r.step, _name(r), r.kind)].reshape(-1).numpy()
        rng = np.random.default_rng([7, r.step, r.seq])    # the documented seeding
        idx = np.sort(rng.choice(x.size, 50, replace=False))
        assert r.counts == fpemu.stats(x[idx], r.format, overflow=_policy(r.format))


def test_a_small_transformer_trains_under_the_monitor():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 16),
                                torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                torch.nn.Linear(16, 11))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 11, (4, 7), generator=torch.Generator().manual_seed(3))
    captured = {}
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda mod, a, out, n=n: captured.__setitem__(
                n, out.detach().clone()))
    with ft.monitor(model, opt, formats=("bf16", "e4m3fn")) as mon:
        for _ in range(3):
            opt.zero_grad()
            logits = model(tokens)
            torch.nn.functional.cross_entropy(logits.reshape(-1, 11), tokens.reshape(-1)).backward()
            opt.step()
    last = max(r.step for r in mon.records)
    assert last == 2
    # (attention's out_proj is a Linear whose weight MHA uses directly: it never runs)
    assert sorted(captured) == ["1.layers.0.linear1", "1.layers.0.linear2",
                                "1.layers.1.linear1", "1.layers.1.linear2", "2"]
    for n in captured:
        r = next(r for r in mon.records if r.step == last and r.module == n
                 and r.kind == "activation" and r.format == "e4m3fn")
        assert r.counts == fpemu.stats(captured[n].numpy(), "e4m3fn", overflow="nan")
    attn = {r.module for r in mon.records if "self_attn" in r.module and r.kind == "weight"}
    assert "1.layers.0.self_attn.in_proj_weight" in attn     # a module with children and params


def test_table_json_and_report(tmp_path):
    mon, _ = train(cnn(Spike(1e5, at={1})), steps=3, capture=False)
    rows = mon.table()
    try:
        import pandas
    except ImportError:                   # without pandas, table() is the list of rows
        assert isinstance(rows, list)
    else:
        assert isinstance(rows, pandas.DataFrame) and len(rows) == len(mon.rows())
        assert list(rows.columns) == list(mon.rows()[0])
        rows = rows.to_dict("records")
    assert rows[0]["kind"] == "activation" and rows == mon.rows()
    assert set(rows[0]) >= {"step", "module", "kind", "format", "scaling", "flushed",
                            "overflow", "rounded_to_max", "flushed_fraction", "amax"}
    doc = json.loads(mon.to_json(tmp_path / "rows.json").read_text())
    assert len(doc["rows"]) == len(rows) and doc["formats"] == list(FORMATS)
    page = (tmp_path / "rep" / "index.html").read_text() if mon.report(tmp_path / "rep") \
        else ""
    assert "Verdict per format" in page and "step 1: activation of 5" in page
    for stem in ("layers-fp16", "layers-e4m3fn", "heatmap", "amax"):
        assert (tmp_path / "rep" / f"{stem}.png").stat().st_size > 10_000
        assert f'src="{stem}.png"' in page


def test_verdicts():
    from fpemu.torch._report import verdict
    mon, _ = train(cnn(Spike(1e5, at={1})), steps=3, capture=False)
    assert verdict(mon, "bf16")[0] == "yes, as it is"
    assert verdict(mon, "fp16")[0] == "no: forward overflow"
    mon, _ = train(cnn(), steps=2, capture=False)
    short, detail = verdict(mon, "e5m2")
    assert short.startswith("yes, with a loss scale of 2^") or short == "no single loss scale"
    assert verdict(mon, "fp16", scaling="mx")[0] == "not recorded"


def test_bad_arguments_are_named():
    with pytest.raises(FpemuTypeError, match="model must be a torch.nn.Module, got list"):
        ft.monitor([])
    with pytest.raises(FpemuValueError, match="unknown scaling 'per-tensor'; choose from"):
        ft.monitor(cnn(), scaling="per-tensor")
    with pytest.raises(FpemuValueError, match="unknown kind 'grads'"):
        ft.monitor(cnn(), kinds=("grads",))
    with pytest.raises(FpemuValueError, match="every must be an int >= 1, got 0"):
        ft.monitor(cnn(), every=0)
    with pytest.raises(FpemuValueError, match="sample must be None or an int >= 1"):
        ft.monitor(cnn(), sample=0.5)


SCRIPT = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
{watch}
opt = torch.optim.Adam(model.parameters(), lr=float(sys.argv[1]))
x = torch.randn(16, 6)
for step in range(3):
    opt.zero_grad()
    out = model(x) * (1e6 if step == 2 else 1.0)
    out.square().mean().backward()
    opt.step()
"""


@pytest.mark.parametrize("watch", ["", "import fpemu.torch; fpemu.torch.watch(model)"])
def test_cli_runs_a_script_under_the_monitor(tmp_path, watch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(watch=watch)))
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", "--out", str(out),
                           "--formats", "fp16,bf16", str(script), "0.01"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (out / "index.html").exists() and (out / "rows.json").exists()
    assert "first overflow" in proc.stdout.lower()
    rows = json.loads((out / "rows.json").read_text())["rows"]
    assert {r["step"] for r in rows} == {0, 1, 2}
    if not watch:      # found through the optimizer: its state is counted too
        assert "exp_avg" in {r["kind"] for r in rows}


def test_cli_reports_a_script_that_dies_of_a_nan(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            opt.zero_grad()
            loss = model(torch.ones(2, 3) * (float("nan") if step == 1 else 1.0)).sum()
            assert loss == loss, "loss is NaN"
            loss.backward()
            opt.step()
    """))
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", "--out", str(out),
                           "--formats", "fp16", str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "AssertionError: loss is NaN" in proc.stderr
    assert "step 1: activation of 0: 6 real inf/NaN" in proc.stdout
    assert (out / "index.html").exists()


def test_cli_names_a_missing_script(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", str(tmp_path / "no.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cannot read the script" in proc.stderr and \
        "no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_the_report_of_a_deep_model_with_long_layer_names_draws_every_figure(tmp_path):
    """A Llama's 160 layers named like "model.layers.22.self_attn.q_proj", one
    recorded step: matplotlib collapsed the heatmap's axes ("constrained_layout
    not applied"), a warning, which this suite turns into an error."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.ModuleDict({n: torch.nn.Linear(8, 8) for n in
                                                  ("q_proj", "k_proj", "v_proj", "o_proj")})
            self.mlp = torch.nn.ModuleDict({n: torch.nn.Linear(8, 8) for n in
                                            ("gate_proj", "up_proj", "down_proj")})

        def forward(self, x):
            for m in list(self.self_attn.values()) + list(self.mlp.values()):
                x = m(x)
            return x

    class Llamaish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList(Block() for _ in range(23))

        def forward(self, x):
            for b in self.model.layers:
                x = b(x)
            return x

    torch.manual_seed(0)
    model = Llamaish()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with ft.monitor(model, opt, formats=("bf16",)) as mon:
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    assert len({r.module for r in mon.records if r.kind == "activation"}) == 161
    mon.report(tmp_path / "rep")
    assert (tmp_path / "rep" / "heatmap.png").stat().st_size > 10_000
