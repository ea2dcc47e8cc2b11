"""Dynamic loss scaling: GradScaler's trajectory through overflow spikes.

A small network trains with fp16 autocast under ``GradScaler`` (PyTorch's
state machine, bit for bit: ``docs/autograd.md``). At a few chosen steps the
batch's targets are multiplied by a large factor, an outlier batch whose
scaled gradients overflow fp16. The scaler skips those steps and halves the
scale; after ``growth_interval`` clean steps it doubles it again.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from . import _base

NAME = "loss_scaling"
TITLE = "Dynamic loss scaling"
QUESTION = "What does GradScaler do when gradients overflow, and what does it cost?"


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 300
    init_scale: float = 2.0**16
    growth_interval: int = 25
    spikes: tuple = (60, 61, 62, 150, 220)   # steps whose batch is an outlier
    spike_factor: float = 2.0**14            # the outliers' targets are multiplied by this
    width: int = 32
    depth: int = 3
    batch: int = 128
    lr: float = 1e-3
    seed: int = 0


QUICK = dict(steps=30, spikes=(5, 6, 20), growth_interval=4, width=8, batch=32)


def setup(c):
    return (f"MLP ({c.depth} x {c.width}, tanh), fp16 autocast, Adam lr {c.lr:g}, batch "
            f"{c.batch}, {c.steps} steps; GradScaler(init_scale={c.init_scale:g}, "
            f"growth_interval={c.growth_interval}); targets x {c.spike_factor:g} at steps "
            f"{', '.join(map(str, c.spikes))}.")


def run(config=None, **overrides):
    import fpemu.autograd as torch
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    X, y = _base.regression_data(c.batch * 8, 16, 8, c.seed)
    model = _base.mlp(torch, 16, c.width, c.depth, 8, seed=c.seed)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    scaler = torch.amp.GradScaler(init_scale=c.init_scale, growth_interval=c.growth_interval)
    Xt = torch.tensor(X)
    scales, skipped, losses = [], [], []
    for step in range(c.steps):
        i = (step * c.batch) % X.shape[0]
        target = y[i:i + c.batch] * (c.spike_factor if step in c.spikes else 1.0)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out = model(Xt[i:i + c.batch])
        loss = torch.nn.functional.mse_loss(out.float(), torch.tensor(target.astype(np.float32)))
        used = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(used)
        skipped.append(scaler.get_scale() < used)   # a backoff happens exactly on inf / NaN
        losses.append(float(loss.item()))
    scales_a = np.array(scales)
    grew = int(np.sum(scales_a[1:] > scales_a[:-1]))
    sk = np.flatnonzero(skipped)
    numbers = {
        "steps": c.steps,
        "skipped_steps": int(sk.size),
        "skipped_at": [int(s) for s in sk],
        "spike_steps_skipped": int(sum(s in c.spikes for s in sk)),
        "other_steps_skipped": int(sum(s not in c.spikes for s in sk)),
        "growth_events": grew,
        "initial_scale": float(scales_a[0]),
        "final_scale": float(scaler.get_scale()),
        "min_scale": float(scales_a.min()),
        "max_scale": float(scales_a.max()),
    }
    conclusion = (
        f"Of {c.steps} steps, {sk.size} were skipped ({numbers['spike_steps_skipped']} at the "
        f"outlier batches, {numbers['other_steps_skipped']} elsewhere); each halved the scale, "
        f"and {grew} growths after {c.growth_interval} clean steps each took it back up, from "
        f"{_base.num(numbers['min_scale'])} to {_base.num(numbers['final_scale'])}. "
        f"A skipped step costs one batch; the weights never see an inf or a NaN.")
    data = {"scales": scales_a, "skipped": np.array(skipped), "losses": np.array(losses)}
    return _base.finish(__name__, c, numbers, conclusion,
                        data, _plot, t0)


def _plot(r):
    from .. import plotting as fp
    fig, axes = fp.new_axes(2, 1, figsize=(12, 8), sharex=True)
    steps = np.arange(r.data["scales"].size)
    fp.plot_loss_scale(steps, r.data["scales"], r.data["skipped"], ax=axes[0],
                       title="GradScaler's scale: halved on overflow, doubled after "
                             f"{r.config.growth_interval} clean steps")
    for s in r.config.spikes:
        axes[0].axvline(s, color="#94a4a2", linewidth=1, linestyle=":", zorder=0)
    fp.plot_training_curves({"loss (fp16 autocast + GradScaler)": r.data["losses"]},
                            ax=axes[1], title="Loss (outlier batches stand out)")
    return {"trajectory": fig}
