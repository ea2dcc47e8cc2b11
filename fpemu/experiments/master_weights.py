"""Master weights: why an fp32 copy of the weights is kept (Micikevicius et al. §3.1).

Three views of one effect, an update smaller than half an ulp of the weight
is lost in the addition:

* the worked example: weight 256, update -0.009, 200 steps, in fp16 and with
  an fp32 master copy;
* the bf16 SGD stagnation table (p0 = 1, g = 1; lr 1e-4, 1e-3, 3e-3), run with
  fpemu's SGD, whose op sequence is torch's (``docs/pytorch-numerics.md``);
* a training run with pure bf16 and fp16 weights against fp32 master weights.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from ..quantize import ulp
from . import _base

NAME = "master_weights"
TITLE = "Master weights"
QUESTION = "Why keep an fp32 copy of the weights when the model runs in 16 bits?"


@dataclasses.dataclass(frozen=True)
class Config:
    weight: float = 256.0
    update: float = 0.009
    updates: int = 200
    lrs: tuple = (1e-4, 1e-3, 3e-3)
    table_steps: tuple = (1, 10, 100)
    train_steps: int = 300
    train_lr: float = 0.01
    width: int = 32
    batch: int = 128
    seed: int = 0


QUICK = dict(train_steps=20, width=8, batch=32)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(train_steps=2)


def setup(c):
    return (f"(a) w = {c.weight:g}, {c.updates} SGD steps of -{c.update:g} (lr 1, grad "
            f"{c.update:g}); (b) SGD on p0 = 1 with g = 1, lr in "
            f"{', '.join(f'{x:g}' for x in c.lrs)}; (c) a 2-layer MLP regression, SGD lr "
            f"{c.train_lr:g}, {c.train_steps} steps, weights in fp32, pure bf16, pure fp16, "
            "and bf16 / fp16 with fp32 master weights.")


def _sgd_steps(torch, p0, g, lr, steps, dtype, master, trajectory=False):
    """p after each of the given step counts (and the fp32 master); with trajectory,
    also p after every step from 0 to max(steps)."""
    p = torch.tensor([p0], dtype=dtype, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr, master_weights=master)
    out = [p.item()]
    for _ in range(max(steps)):
        p.grad = torch.tensor([g], dtype=dtype)
        opt.step()
        out.append(p.item())
    master_value = opt.param_groups[0]["params"][0].item() if master else None
    picked = [out[s] for s in steps]
    return (picked, master_value, out) if trajectory else (picked, master_value)


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    steps = (c.updates,)
    fp16_only, _ = _sgd_steps(torch, c.weight, c.update, 1.0, steps, torch.float16, False)
    fp16_model, fp16_master = _sgd_steps(torch, c.weight, c.update, 1.0, steps, torch.float16,
                                         True)
    table, paths = {}, {}
    for lr in c.lrs:
        pure, _, p_bf16 = _sgd_steps(torch, 1.0, 1.0, lr, c.table_steps, torch.bfloat16, False,
                                     trajectory=True)
        model, master = _sgd_steps(torch, 1.0, 1.0, lr, (max(c.table_steps),), torch.bfloat16,
                                   True)
        fp32, _, p_fp32 = _sgd_steps(torch, 1.0, 1.0, lr, c.table_steps, torch.float32, False,
                                     trajectory=True)
        table[f"{lr:g}"] = {"pure_bf16": pure, "fp32_master": master,
                            "bf16_of_master": model[0], "fp32": fp32}
        paths[f"{lr:g}"] = (p_bf16, p_fp32)
    curves, final = _training(torch, c)
    numbers = {
        "fp16_weight_after_updates": fp16_only[0],
        "fp32_master_after_updates": fp16_master,
        "fp16_model_copy_after_updates": fp16_model[0],
        "half_ulp_of_weight_fp16": float(_half_ulp(c.weight, "fp16")),
        "bf16_sgd_table": table,
        "final_loss": final,
    }
    worst = max(("bf16", "fp16"), key=lambda k: final[f"pure {k}"] / final["fp32"])
    conclusion = (
        f"In fp16, {c.weight:g} - {c.update:g} rounds back to {fp16_only[0]:g} every time (half "
        f"an ulp there is {numbers['half_ulp_of_weight_fp16']:g}), so {c.updates} updates "
        f"change nothing; an fp32 master copy reaches {fp16_master:.7g}. "
        f"Training with pure {worst} weights ends at loss {final[f'pure {worst}']:.4g} against "
        f"{final['fp32']:.4g} in fp32, and fp32 master weights bring it to "
        f"{final[f'{worst} + fp32 master']:.4g}.")
    data = {"curves": curves, "table": table, "paths": paths}
    return _base.finish(__name__, c, numbers, conclusion,
                        data, _plot, t0)


def _half_ulp(x, fmt):
    return ulp(x, fmt) / 2


def _training(torch, c):
    X, y = _base.regression_data(c.batch * 8, 8, 1, c.seed)
    runs = {"fp32": (torch.float32, False), "pure bf16": (torch.bfloat16, False),
            "bf16 + fp32 master": (torch.bfloat16, True), "pure fp16": (torch.float16, False),
            "fp16 + fp32 master": (torch.float16, True)}
    curves, final = {}, {}
    for label, (dtype, master) in runs.items():
        model = _base.mlp(torch, 8, c.width, 2, 1, seed=c.seed).to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=c.train_lr, master_weights=master)
        Xt, yt = torch.tensor(X).to(dtype), torch.tensor(y)
        losses = []
        for step in range(c.train_steps):
            i = (step * c.batch) % X.shape[0]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(Xt[i:i + c.batch]).float(),
                                                yt[i:i + c.batch])
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        curves[label] = losses
        final[label] = _base.final_loss(losses, c.train_steps)
    return curves, final


def _plot(r):
    fig, ax = fp.new_axes(figsize=(12, 6))
    fp.plot_training_curves(r.data["curves"], ax=ax, smooth=8, reference="fp32",
                            title="Pure 16-bit weights against fp32 master weights (SGD)")
    figs = {"training": fig}
    fig, ax = fp.new_axes(figsize=(12, 6))
    colors = ("#3f90da", "#e76300", "#832db6")
    for (lr, (bf, f32)), color in zip(r.data["paths"].items(), colors):
        steps = np.arange(len(bf))
        ax.step(steps, bf, where="post", color=color, label=f"pure bf16, lr {lr}")
        ax.plot(steps, f32, color=color, linestyle=(0, (4, 3)), linewidth=1.6,
                label=f"fp32, lr {lr}")
    frozen = [lr for lr, (bf, _) in r.data["paths"].items() if len(set(bf)) == 1]
    if frozen:
        ax.annotate(f"pure bf16 at lr {' and '.join(frozen)}: p never moves from 1.0",
                    (len(bf) * 0.45, 1.0), xytext=(0, -18), textcoords="offset points",
                    fontsize=12, ha="center")
    ax.set_xlabel("step")
    ax.set_ylabel("p (p0 = 1, g = 1)")
    ax.legend(loc="lower left", ncol=3, fontsize=11)
    ax.set_title("bf16 SGD: an update below half an ulp of p ($2^{-9}$ just below 1) is lost",
                 loc="left")
    figs["stagnation"] = fig
    return figs
