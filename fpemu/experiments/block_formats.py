"""Block-scaled formats: a trained weight under MX and NVFP4, and NVFP4 training.

The tiny transformer of :mod:`fpemu.experiments.fp8_training` is trained in
fp32; one of its weight tensors (``ff1`` by default) is then quantized under
every block-format preset of :mod:`fpemu.block` (MXFP8, MXFP6, MXFP4 with the
OCP and the round-up scale, NVFP4 as TransformerEngine and torchao compute it,
16 x 16 tiles, Four Over Six), with the error of each. Finally the same model
is trained from scratch with every ``nn.Linear`` under ``MXFP8BlockScaling``
and ``NVFP4BlockScaling`` (TransformerEngine's recipes as fpemu models them,
on Blackwell's block-scaled tensor-core models), against bf16 autocast, and
once more with NVFP4 but the output head kept in high precision.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import block
from .. import plotting as fp
from ..autograd import fp8
from ..errors import FpemuValueError
from . import _base
from .fp8_training import _Block

NAME = "block_formats"
TITLE = "Block-scaled formats: MXFP8, MXFP6, MXFP4 and NVFP4"
QUESTION = ("How much of a trained weight survives each 8-, 6- and 4-bit block format, "
            "and does a small model still train with NVFP4 GEMMs?")


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 16
    seq: int = 16
    dim: int = 64
    batch: int = 16
    steps: int = 40
    lr: float = 3e-3
    weight: str = "ff1"          # the Linear whose trained weight is tabulated
    seed: int = 0


QUICK = dict(steps=4, dim=16, batch=4, seq=8)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=1)

_WEIGHTS = ("q", "k", "v", "o", "ff1", "ff2", "head")


def setup(c):
    return (f"1-block transformer (d = {c.dim}, vocab {c.vocab}, sequence {c.seq}), copy-the-"
            f"previous-token task, Adam lr {c.lr:g}, batch {c.batch}, {c.steps} steps in fp32; "
            f"then the trained {c.weight}.weight under every block preset of fpemu.block; then "
            "training with bf16 autocast, MXFP8BlockScaling, NVFP4BlockScaling and "
            "NVFP4BlockScaling with the head kept in high precision.")


def _check(c):
    if c.weight not in _WEIGHTS:
        raise FpemuValueError(f"block_formats: weight must be one of {', '.join(_WEIGHTS)}, "
                              f"got {c.weight!r}")
    if (c.batch * c.seq) % 16 or c.dim % 16:
        raise FpemuValueError(
            f"block_formats: NVFP4's Hadamard transform needs batch * seq and dim to be "
            f"multiples of 16; got batch {c.batch} * seq {c.seq} = {c.batch * c.seq} and dim "
            f"{c.dim}: change them")


def _train(c, recipe_factory, data):
    net = _Block(torch, c)
    opt = torch.optim.Adam(net.model.parameters(), lr=c.lr)
    recipe = recipe_factory(net) if recipe_factory is not None else None
    losses = []
    for step in range(c.steps):
        tokens = torch.tensor(data[step])
        target = torch.tensor(np.concatenate([data[step][:, :1], data[step][:, :-1]], 1))
        opt.zero_grad()
        if recipe == "fp32":
            logits = net(tokens)
        elif recipe is None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = net(tokens)
        else:
            with fp8.fp8_autocast(fp8_recipe=recipe):
                logits = net(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, c.vocab),
                                                 target.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return net, losses


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    _check(c)
    rng = np.random.default_rng(c.seed)
    data = rng.integers(0, c.vocab, size=(c.steps, c.batch, c.seq))
    net, fp32_losses = _train(c, lambda net: "fp32", data)
    W = net.model[c.weight].weight.detach().numpy().astype(np.float32)
    rows = block.error_table(W)
    recipes = {
        "bf16 (no fp4/fp8)": None,
        "MXFP8BlockScaling": lambda net: fp8.MXFP8BlockScaling(),
        "NVFP4BlockScaling": lambda net: fp8.NVFP4BlockScaling(seed=c.seed),
        "NVFP4, head in bf16": lambda net: fp8.NVFP4BlockScaling(
            seed=c.seed, high_precision_modules=(net.model["head"],)),
    }
    curves = {"fp32": fp32_losses}
    for label, factory in recipes.items():
        curves[label] = _train(c, factory, data)[1]
    final = {k: _base.final_loss(v, c.steps) for k, v in curves.items()}
    by = {r["preset"]: r for r in rows}
    numbers = {
        "weight_shape": list(W.shape),
        "sqnr_db": {r["preset"]: round(r["sqnr_db"], 2) for r in rows},
        "clipped_blocks": {r["preset"]: round(r["clipped"], 4) for r in rows},
        "final_loss": final,
    }
    best4 = max((r for r in rows if r["elem"] == "e2m1"), key=lambda r: r["sqnr_db"])
    conclusion = (
        f"On the trained {c.weight}.weight ({W.shape[0]} x {W.shape[1]}), MXFP8 keeps "
        f"{by['mxfp8']['sqnr_db']:.1f} dB of signal over noise, MXFP4 "
        f"{by['mxfp4']['sqnr_db']:.1f} dB (OCP's floor scale clips "
        f"{_base.pct(by['mxfp4']['clipped'])} of its blocks) and NVFP4 "
        f"{by['nvfp4']['sqnr_db']:.1f} dB; the best 4-bit preset is {best4['preset']} "
        f"({best4['sqnr_db']:.1f} dB). Trained with NVFP4 GEMMs the model ends at loss "
        f"{final['NVFP4BlockScaling']:.4g} against {final['bf16 (no fp4/fp8)']:.4g} in bf16 "
        f"and {final['MXFP8BlockScaling']:.4g} with MXFP8.")
    data_out = {"rows": rows, "curves": curves}
    return _base.finish(__name__, c, numbers, conclusion, data_out, _plot, t0)


def _plot(r):
    fig, axes = fp.new_axes(2, 1, figsize=(12, 12))
    rows = r.data["rows"]
    ax = axes[0]
    names = [f"{x['preset']}  ({x['bits']:.3g} bits)" for x in rows]
    vals = [x["sqnr_db"] for x in rows]
    colours = ["#3f90da" if x["elem"] in ("e4m3fn", "e5m2") else
               "#a96b59" if x["elem"] in ("e2m3", "e3m2") else "#bd1f01" for x in rows]
    y = np.arange(len(rows))[::-1]
    ax.barh(y, vals, color=colours)
    for yi, x in zip(y, rows):
        label = f"{x['sqnr_db']:.1f} dB"
        if x["clipped"] > 0:
            label += f", {_base.pct(x['clipped'])} of blocks clipped"
        ax.text(x["sqnr_db"] + 0.3, yi, label, va="center", fontsize=11)
    ax.set_yticks(y)
    ax.set_yticklabels(names)
    ax.set_xlabel("SQNR (dB): signal power over quantization noise")
    ax.set_xlim(0, max(vals) * 1.35)
    ax.set_title(f"The trained {r.config.weight}.weight in each block format\n"
                 f"(blue: 8-bit, brown: 6-bit, red: 4-bit elements)", loc="left")
    fp.plot_training_curves(r.data["curves"], ax=axes[1], reference="fp32",
                            title="Training with every Linear in MXFP8 or NVFP4")
    return {"block_formats": fig}
