"""Dynamic loss scaling: GradScaler's trajectory through overflow spikes.

A small network trains with fp16 autocast under ``GradScaler`` (PyTorch's
state machine, bit for bit: ``docs/autograd.md``). At a few chosen steps the
batch's targets are multiplied by a large factor, an outlier batch whose
scaled gradients overflow fp16. The scaler skips those steps and halves the
scale; after ``growth_interval`` clean steps it doubles it again.

``scaler`` runs the same loop under another framework's scaler, with the
same initial scale and growth interval: ``"deepspeed"``
(:class:`fpemu.collectives.DeepSpeedLossScaler`, hysteresis 2, minimum 1),
``"megatron"`` (:class:`fpemu.loss_scaling.MegatronGradScaler`, hysteresis
2, minimum 1) or ``"apex"`` (:class:`fpemu.loss_scaling.ApexLossScaler`,
maximum 2**24). These scale the loss, check the float32 gradients for inf
and NaN, and skip the step or unscale them (times the float32 reciprocal of
the scale, exact for these powers of two) before Adam steps, as their
frameworks do.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from ..collectives import DeepSpeedLossScaler
from ..errors import FpemuValueError
from ..loss_scaling import ApexLossScaler, MegatronGradScaler
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
    scaler: str = "torch"                    # torch, deepspeed, megatron or apex


#: the scalers ``scaler`` names, and the framework each is from
SCALERS = {"torch": "PyTorch GradScaler", "deepspeed": "DeepSpeed DynamicLossScaler",
           "megatron": "Megatron-core DynamicGradScaler", "apex": "APEX amp LossScaler"}


QUICK = dict(steps=30, spikes=(5, 6, 20), growth_interval=4, width=8, batch=32)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=4, spikes=(1, 2), growth_interval=2)


def setup(c):
    return (f"MLP ({c.depth} x {c.width}, tanh), fp16 autocast, Adam lr {c.lr:g}, batch "
            f"{c.batch}, {c.steps} steps; {SCALERS.get(c.scaler, c.scaler)} (initial scale "
            f"{c.init_scale:g}, growth interval {c.growth_interval}); targets x "
            f"{c.spike_factor:g} at steps {', '.join(map(str, c.spikes))}.")


class _Framework:
    """A framework's scaler driven by hand: scale the loss, check the float32
    gradients, skip or unscale, update."""

    def __init__(self, torch, kind, c):
        self.torch = torch
        if kind == "deepspeed":
            self.s = DeepSpeedLossScaler(init_scale=c.init_scale, scale_window=c.growth_interval,
                                         min_scale=1.0, delayed_shift=2)
        elif kind == "megatron":
            self.s = MegatronGradScaler(initial_scale=c.init_scale, min_scale=1.0,
                                        growth_interval=c.growth_interval, hysteresis=2)
        else:
            self.s = ApexLossScaler(init_scale=c.init_scale, scale_window=c.growth_interval)

    def get_scale(self):
        return float(self.s.cur_scale if hasattr(self.s, "cur_scale") else self.s.scale)

    def scale(self, loss):
        return loss * self.get_scale()

    def step(self, opt):
        """Skip the step on an inf or NaN gradient (returns True), else
        unscale the gradients and step; the scaler updates either way."""
        torch = self.torch
        used = self.get_scale()
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        found_inf = any(not bool(torch.isfinite(gr).all()) for gr in grads)
        if hasattr(self.s, "update_scale"):
            self.s.update_scale(found_inf)              # DeepSpeed: skips every overflow
            skip = found_inf
        else:
            skip = self.s.update(found_inf)
        if skip:
            return True
        inv = float(np.float32(1.0) / np.float32(used))
        with torch.no_grad():
            for gr in grads:
                gr.mul_(inv)
        opt.step()
        return False


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    X, y = _base.regression_data(c.batch * 8, 16, 8, c.seed)
    model = _base.mlp(torch, 16, c.width, c.depth, 8, seed=c.seed)
    if c.scaler not in SCALERS:
        raise FpemuValueError(f"loss_scaling: scaler must be one of {', '.join(SCALERS)}, got "
                              f"{c.scaler!r}")
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    if c.scaler == "torch":
        scaler = torch.amp.GradScaler(init_scale=c.init_scale, growth_interval=c.growth_interval)
    else:
        scaler = _Framework(torch, c.scaler, c)
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
        if c.scaler == "torch":
            scaler.step(opt)
            scaler.update()
            skip = scaler.get_scale() < used        # a backoff happens exactly on inf / NaN
        else:
            skip = scaler.step(opt)
        scales.append(used)
        skipped.append(skip)
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
        "final_loss": float(np.mean(losses[-10:])),    # (the last 10 steps' mean)
    }
    if c.scaler == "torch":
        conclusion = (
            f"Of {c.steps} steps, {sk.size} were skipped ({numbers['spike_steps_skipped']} at "
            f"the outlier batches, {numbers['other_steps_skipped']} elsewhere); each halved the "
            f"scale, and {grew} growths after {c.growth_interval} clean steps each took it back "
            f"up, from {_base.num(numbers['min_scale'])} to "
            f"{_base.num(numbers['final_scale'])}. A skipped step costs one batch; the weights "
            f"never see an inf or a NaN.")
    else:
        conclusion = (
            f"{SCALERS[c.scaler]}: of {c.steps} steps, {sk.size} were skipped "
            f"({numbers['spike_steps_skipped']} at the outlier batches); the scale ranged from "
            f"{_base.num(numbers['min_scale'])} to {_base.num(numbers['max_scale'])} and ended "
            f"at {_base.num(numbers['final_scale'])}.")
    data = {"scales": scales_a, "skipped": np.array(skipped), "losses": np.array(losses)}
    return _base.finish(__name__, c, numbers, conclusion,
                        data, _plot, t0)


def _plot(r):
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
