"""Gradient underflow and loss scaling (Micikevicius et al. 2018, §3.2).

A deep, narrow tanh network with small initial weights is trained in fp32 with
Adam on a regression task whose loss carries a small weight (2^-6, as an
auxiliary loss or a loss normalised over many elements does); its gradients
are small and shrink layer by layer, as the SSD gradients of the paper's
Figure 3 did. Adam's step does not depend on the gradients' scale, so fp32
trains as it would unweighted. Every activation and weight
gradient of the last training steps is counted, exactly, in fp16, bf16, e5m2
and e4m3fn, unscaled and with loss scales 8, 1024 and 32768. Then the same
network is trained with fp16 autocast, without loss scaling and with
GradScaler's dynamic scaling, next to the fp32 run.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from ..stats import survey
from . import _base

NAME = "underflow"
TITLE = "Gradient underflow and loss scaling"
QUESTION = ("Which gradients would fp16, bf16 and the fp8 formats flush to zero, and does a "
            "loss scale rescue training in fp16?")


@dataclasses.dataclass(frozen=True)
class Config:
    depth: int = 8               # hidden layers
    width: int = 32
    gain: float = 0.6            # initial weights x gain: gradients shrink with depth
    loss_weight: float = 2.0**-6
    outputs: int = 64
    batch: int = 256
    steps: int = 200
    lr: float = 1e-3             # Adam
    record_steps: int = 5        # the last steps whose gradients are counted
    formats: tuple = ("fp16", "bf16", "e5m2", "e4m3fn")
    scales: tuple = (1.0, 8.0, 1024.0, 32768.0)
    seed: int = 0


QUICK = dict(depth=6, width=16, outputs=16, steps=12, batch=64, record_steps=2)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=5)


def setup(c):
    return (f"{c.depth} tanh layers of width {c.width}, weights x {c.gain:g} at init, "
            f"{c.outputs} regression outputs, MSE x {_base.num(c.loss_weight)}, batch "
            f"{c.batch}, Adam lr {c.lr:g} for {c.steps} steps (fp32); gradients of the "
            f"last {c.record_steps} steps counted in {', '.join(c.formats)} at scales "
            f"{', '.join(f'{s:g}' for s in c.scales)}. Then fp16 autocast without scaling "
            "and with GradScaler (init 2^16, growth every 50 steps).")


def _train(torch, c, X, y, mode, collect=False):
    """mode: 'fp32', 'fp16' (autocast, no scaling) or 'fp16+scaler'. With collect, the
    activation and weight gradients of each Linear over the last record_steps steps."""
    model = _base.mlp(torch, X.shape[1], c.width, c.depth, y.shape[1], gain=c.gain,
                      seed=c.seed)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    scaler = torch.amp.GradScaler(growth_interval=50) if mode == "fp16+scaler" else None
    linears = [(n, m) for n, m in model.named_modules() if type(m).__name__ == "Linear"]
    act, wgt = {n: [] for n, _ in linears}, {n: [] for n, _ in linears}
    record = [False]

    def hook_for(name):
        def hook(module, inputs, output):
            if record[0]:
                output.register_hook(lambda g: act[name].append(g.numpy().copy()))
        return hook
    handles = [m.register_forward_hook(hook_for(n)) for n, m in linears] if collect else []
    Xt, yt = torch.tensor(X), torch.tensor(y)
    losses, scales = [], []
    n = X.shape[0]
    for step in range(c.steps):
        record[0] = collect and step >= c.steps - c.record_steps
        i = (step * c.batch) % n
        xb, yb = Xt[i:i + c.batch], yt[i:i + c.batch]
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=mode != "fp32"):
            out = model(xb)
        loss = torch.nn.functional.mse_loss(out.float(), yb) * c.loss_weight
        if scaler is None:
            loss.backward()
            if record[0]:
                for name, m in linears:
                    wgt[name].append(m.weight.grad.numpy().copy())
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        losses.append(float(loss.item()) / c.loss_weight)
    for h in handles:
        h.remove()
    if not collect:
        return losses, None, scales
    label = {n: f"Linear {i + 1}" for i, (n, _) in enumerate(linears)}
    grads = ({label[k]: np.stack(v) for k, v in act.items()},
             {label[k]: np.stack(v) for k, v in wgt.items()})
    return losses, grads, scales


def run(config=None, **overrides):
    """Train, count the gradients of the last steps in every format and scale."""
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    X, y = _base.regression_data(c.batch * 8, 16, c.outputs, c.seed)
    losses32, (grads_act, grads_w), _ = _train(torch, c, X, y, "fp32", collect=True)
    sv_act = survey(np.concatenate([g.ravel() for g in grads_act.values()]), c.formats,
                    scales=c.scales)
    sv_w = survey(np.concatenate([g.ravel() for g in grads_w.values()]), c.formats,
                  scales=c.scales)
    losses16, _, _ = _train(torch, c, X, y, "fp16")
    losses_sc, _, scale_traj = _train(torch, c, X, y, "fp16+scaler")
    table = {}
    for f in c.formats:
        for s in c.scales:
            a = sv_act[f, s]
            table[f"{f} x{s:g}"] = {"flushed": a.fraction("flushed"),
                                    "subnormal": a.fraction("subnormal"),
                                    "overflow": a.fraction("overflow"),
                                    "zero": a.fraction("zero")}
    final = {k: _base.final_loss(v, c.steps) for k, v in
             (("fp32", losses32), ("fp16", losses16), ("fp16+scaler", losses_sc))}
    numbers = {
        "activation_grads_counted": sv_act.total,
        "weight_grads_counted": sv_w.total,
        "fp16_flushed_activation_grads": sv_act["fp16", 1].fraction("flushed"),
        "fp16_flushed_activation_grads_x8": sv_act["fp16", 8].fraction("flushed"),
        "fp16_flushed_activation_grads_x1024": sv_act["fp16", 1024].fraction("flushed"),
        "fp16_flushed_activation_grads_x32768": sv_act["fp16", 32768].fraction("flushed"),
        "bf16_flushed_activation_grads": sv_act["bf16", 1].fraction("flushed"),
        "e5m2_flushed_activation_grads": sv_act["e5m2", 1].fraction("flushed"),
        "e4m3fn_flushed_activation_grads": sv_act["e4m3fn", 1].fraction("flushed"),
        "fp16_flushed_weight_grads": sv_w["fp16", 1].fraction("flushed"),
        "fp16_overflow_activation_grads_x32768": sv_act["fp16", 32768].fraction("overflow"),
        "final_loss_fp32": final["fp32"],
        "final_loss_fp16_no_scaling": final["fp16"],
        "final_loss_fp16_dynamic_scaling": final["fp16+scaler"],
        "final_loss_scale": scale_traj[-1] if scale_traj else None,
        "table": table,
    }
    gap16 = final["fp16"] - final["fp32"]
    gapsc = final["fp16+scaler"] - final["fp32"]
    conclusion = (
        f"In fp16, {_base.pct(numbers['fp16_flushed_activation_grads'])} of the activation "
        f"gradients flush to zero (bf16: {_base.pct(numbers['bf16_flushed_activation_grads'])}"
        f", e5m2: {_base.pct(numbers['e5m2_flushed_activation_grads'])}); a loss scale of 8 "
        f"leaves {_base.pct(numbers['fp16_flushed_activation_grads_x8'])} and 32768 leaves "
        f"{_base.pct(numbers['fp16_flushed_activation_grads_x32768'])}. "
        f"Trained with fp16 autocast and no scaling the loss ends at {final['fp16']:.4g} "
        f"({_base.rel(gap16 / final['fp32'])} from fp32's {final['fp32']:.4g}); with dynamic "
        f"loss scaling it ends at {final['fp16+scaler']:.4g} "
        f"({_base.rel(gapsc / final['fp32'])}).")
    data = {"act": grads_act, "weight": grads_w, "survey_act": sv_act,
            "losses": {"fp32": losses32, "fp16, no scaling": losses16,
                       "fp16, dynamic loss scaling": losses_sc},
            "scales": scale_traj}
    return _base.finish(__name__, c, numbers, conclusion,
                        data, _plot, t0)


def _plot(r):
    c = r.config
    figs = {}
    for yscale in ("linear", "log"):
        fig, ax = fp.new_axes(figsize=(13, 7.4))
        fp.plot_underflow_histogram(r.data["survey_act"], c.formats, scale=1024, ax=ax,
                                    yscale=yscale,
                                    title=f"Activation gradients of all layers, {yscale} y")
        figs["histogram" if yscale == "linear" else "histogram_log"] = fig
    fig, ax = fp.new_axes(figsize=(12, 1.6 + 0.55 * len(r.data["act"])))
    fp.plot_layer_histograms(r.data["act"], "fp16", ax=ax,
                             title="Activation gradients per layer, against fp16")
    figs["layers"] = fig
    fig, axes = fp.new_axes(2, 1, figsize=(12, 12))
    fp.plot_training_curves(r.data["losses"], ax=axes[0], title="Training loss (MSE)",
                            logy=False, smooth=8, reference="fp32")
    if r.data["scales"]:
        fp.plot_loss_scale(np.arange(len(r.data["scales"])), r.data["scales"], ax=axes[1],
                           title="GradScaler's scale in the scaled run")
    figs["training"] = fig
    return figs
