"""Range against precision: fp32, bf16 and fp16 on the same training task.

The same small network and data, trained with pure fp32, bf16 and fp16
parameters and arithmetic (no autocast, no master weights, no loss scale).
The loss carries a small weight, so the gradients are small. Two counts
say where each format loses: the share of weight gradients that are zero
although fp32's are not (range: underflow) and the share of nonzero
updates that leave the weight unchanged (precision: the update is below half
an ulp of the weight).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from . import _base

NAME = "range_precision"
TITLE = "Range versus precision"
QUESTION = "Where does fp16 lose (range) and where does bf16 lose (precision)?"


@dataclasses.dataclass(frozen=True)
class Config:
    width: int = 32
    depth: int = 3
    batch: int = 128
    steps: int = 300
    lr: float = 0.05
    loss_weight: float = 2.0**-14
    seed: int = 0


QUICK = dict(width=8, steps=20, batch=32)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=2)


def setup(c):
    return (f"MLP {c.depth} x {c.width} (tanh), regression, MSE x {_base.num(c.loss_weight)}, SGD "
            f"lr {c.lr:g} / {_base.num(c.loss_weight)} (the weighted loss's step equals the "
            f"unweighted one with lr {c.lr:g}), {c.steps} steps, batch "
            f"{c.batch}; parameters and arithmetic all in fp32, bf16 or fp16.")


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    X, y = _base.regression_data(c.batch * 8, 8, 4, c.seed)
    curves, stats_ = {}, {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16),
                     ("fp16", torch.float16)):
        model = _base.mlp(torch, 8, c.width, c.depth, 4, seed=c.seed).to(dt)
        opt = torch.optim.SGD(model.parameters(), lr=c.lr / c.loss_weight)
        Xt, yt = torch.tensor(X).to(dt), torch.tensor(y).to(dt)
        losses = []
        zero_g = total_g = lost = moved = 0
        for step in range(c.steps):
            i = (step * c.batch) % X.shape[0]
            opt.zero_grad()
            loss = ((model(Xt[i:i + c.batch]) - yt[i:i + c.batch]) ** 2).mean() \
                * c.loss_weight
            loss.backward()
            before = [p.detach().float().numpy().copy() for p in model.parameters()]
            grads = [p.grad.float().numpy().copy() for p in model.parameters()]
            opt.step()
            for b, g, p in zip(before, grads, model.parameters()):
                a = p.detach().float().numpy()
                total_g += g.size
                zero_g += int(np.sum(g == 0))
                lost += int(np.sum((g != 0) & (a == b)))
                moved += int(np.sum(g != 0))
            losses.append(float(loss.float().item()) / c.loss_weight)
        curves[name] = losses
        stats_[name] = {"final_loss": _base.final_loss(losses, c.steps),
                        "zero_gradients": zero_g / total_g,
                        "lost_updates": lost / max(moved, 1)}
    numbers = {k: v for k, v in stats_.items()}
    conclusion = (
        f"fp16 loses on range: {_base.pct(stats_['fp16']['zero_gradients'])} of its weight "
        f"gradients are zero (bf16: {_base.pct(stats_['bf16']['zero_gradients'])}); bf16 "
        f"loses on precision: {_base.pct(stats_['bf16']['lost_updates'])} of its nonzero "
        f"updates leave the weight unchanged (fp16: "
        f"{_base.pct(stats_['fp16']['lost_updates'])}). Final losses: fp32 "
        f"{stats_['fp32']['final_loss']:.4g}, bf16 {stats_['bf16']['final_loss']:.4g}, fp16 "
        f"{stats_['fp16']['final_loss']:.4g}.")
    return _base.finish(__name__, c, numbers, conclusion,
                        {"curves": curves, "stats": stats_}, _plot, t0)


def _plot(r):
    fig, axes = fp.new_axes(2, 1, figsize=(12, 12))
    fp.plot_training_curves(r.data["curves"], ax=axes[0], smooth=8, reference="fp32",
                            title="Same task, three formats")
    st = r.data["stats"]
    names = list(st)
    x = np.arange(len(names))
    for dx, key, region, label in ((-0.2, "zero_gradients", "flushed",
                                    "zero weight gradients (range)"),
                                   (0.2, "lost_updates", "subnormal",
                                    "lost updates (precision)")):
        bars = axes[1].bar(x + dx, [100 * st[n][key] for n in names], 0.4,
                           color=fp.REGION_COLORS[region], label=label)
        axes[1].bar_label(bars, fmt="%.1f%%", fontsize=11)
    axes[1].set_xticks(x, names)
    axes[1].set_ylabel("% of weights, all steps")
    axes[1].legend(loc="upper left")
    axes[1].set_title("Where each format loses", loc="left")
    return {"training": fig}
