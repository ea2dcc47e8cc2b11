"""Stochastic rounding: bf16 weights updated with RNE, with SR, and with fp32 masters.

A linear regression trained with plain SGD and a small learning rate. The
gradient is computed in fp32 from the bf16 weights; the update ``w - lr g``
is computed exactly (in float64) and rounded once to bf16 with round to
nearest even, or stochastically (``fpemu.quantize(..., rounding="sr")``,
reproducible from the seed), or kept in an fp32 master copy. With RNE most
updates are below half an ulp and are lost; SR keeps them on average.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import plotting as fp
from ..quantize import quantize
from . import _base

NAME = "stochastic_rounding"
TITLE = "Stochastic rounding"
QUESTION = ("Can bf16 weights train without an fp32 master copy if the update is rounded "
            "stochastically?")


@dataclasses.dataclass(frozen=True)
class Config:
    features: int = 64
    samples: int = 1024
    steps: int = 400
    lr: float = 2e-3
    seed: int = 0


QUICK = dict(steps=30, samples=128, features=16)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=2)


def setup(c):
    return (f"Linear regression, {c.features} weights, {c.samples} samples, full-batch SGD "
            f"lr {c.lr:g}, {c.steps} steps; weights in bf16 (RNE or SR update), bf16 with "
            "fp32 master weights, and fp32.")


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    rng = np.random.default_rng(c.seed)
    X = (rng.integers(-2**12, 2**12, size=(c.samples, c.features)) * 2.0**-12)
    w_true = rng.integers(-2**8, 2**8, size=c.features) * 2.0**-8 + 1.0
    y = X @ w_true
    w0 = np.ones(c.features)

    def grad(w):
        r = X @ w - y                               # float64: the gradient is not the subject
        return (X.T @ r) * (2.0 / c.samples), float(np.mean(r * r))

    runs = {}
    lost = {}
    for mode in ("fp32", "bf16 rne", "bf16 sr", "bf16 + fp32 master"):
        w = quantize(w0, "bf16").astype(np.float64)
        master = w.copy()
        losses, n_lost, n_upd = [], 0, 0
        for step in range(c.steps):
            g, loss = grad(w)
            losses.append(loss)
            g = quantize(g, "fp32").astype(np.float64)
            if mode == "fp32":
                w = quantize(w - c.lr * g, "fp32").astype(np.float64)
            elif mode == "bf16 + fp32 master":
                master = quantize(master - c.lr * g, "fp32").astype(np.float64)
                w = quantize(master, "bf16").astype(np.float64)
            else:
                new = quantize(w - c.lr * g, "bf16",
                               rounding="sr" if mode == "bf16 sr" else "rne",
                               seed=(c.seed, step * c.features) if mode == "bf16 sr" else None)
                new = new.astype(np.float64)
                n_lost += int(np.sum((new == w) & (g != 0)))
                n_upd += int(np.sum(g != 0))
                w = new
        runs[mode] = np.array(losses)
        if mode.startswith("bf16 r") or mode == "bf16 sr":
            lost[mode] = n_lost / max(n_upd, 1)
    final = {k: _base.final_loss(v, c.steps) for k, v in runs.items()}
    numbers = {"final_loss": final, "updates_lost_rne": lost["bf16 rne"],
               "updates_lost_sr": lost["bf16 sr"], "initial_loss": float(runs["fp32"][0])}
    conclusion = (
        f"With round to nearest, {_base.pct(lost['bf16 rne'])} of the bf16 weight updates are "
        f"lost and the loss stops at {final['bf16 rne']:.4g}; stochastic rounding also "
        f"rounds {_base.pct(lost['bf16 sr'])} of them back to the old weight, but keeps each "
        f"update in expectation, reaching {final['bf16 sr']:.4g}. fp32 master weights reach "
        f"{final['bf16 + fp32 master']:.4g} and fp32 {final['fp32']:.4g}.")
    return _base.finish(__name__, c, numbers, conclusion,
                        {"losses": runs}, _plot, t0)


def _plot(r):
    fig, ax = fp.new_axes(figsize=(12, 6))
    fp.plot_training_curves(r.data["losses"], ax=ax, reference="fp32", ylabel="MSE",
                            title="bf16 weights: round to nearest stalls, stochastic rounding "
                                  "follows fp32")
    return {"training": fig}
