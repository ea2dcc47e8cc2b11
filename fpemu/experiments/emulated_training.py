"""A small GPT trained under emulated recipes: fp32, bf16, MXFP8 and NVFP4.

A nanoGPT-shaped model (token and position embeddings, pre-LayerNorm blocks of
causal self-attention and a GELU MLP, a tied output head: Radford et al.'s
GPT-2 layout as nanoGPT writes it) is trained with AdamW on the characters of
fpemu's own README, in real PyTorch on the CPU, once per recipe from the same
weights and batches. Under each recipe every ``nn.Linear`` runs its three
GEMMs through :func:`fpemu.torch.emulate`: ``bf16`` rounds operands and
outputs to bf16; ``mxfp8`` is TransformerEngine's MXFP8 (e4m3 in blocks of
32 with power-of-two scales rounded up); ``nvfp4`` is TransformerEngine's
NVFP4 recipe (e2m1 in blocks of 16 with e4m3 scales and an fp32 tensor
scale, 16x16 weight tiles, the random Hadamard transform on the weight
gradient's operands, 8-bit stochastic rounding of gradients). The loss
curves show what each format costs this model; the NVFP4 paper (NVIDIA,
arXiv 2509.25149) reports a gap of about 1% in validation loss at 12B
parameters with the same recipe.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

import fpemu
from .. import plotting as fp
from ..errors import FpemuValueError
from ..torch import emulate, require_torch
from . import _base

NAME = "emulated_training"
TITLE = "A GPT trained under emulated FP8 and FP4"
QUESTION = ("How far from fp32 does a small GPT's training loss end when every linear layer "
            "runs under bf16, MXFP8 or NVFP4?")

#: the recipes compared; None is plain fp32
RECIPES = ("fp32", "bf16", "mxfp8", "nvfp4")


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 300
    layers: int = 2
    width: int = 64
    heads: int = 4
    context: int = 32
    batch: int = 8
    lr: float = 3e-3
    recipes: tuple = RECIPES
    seed: int = 0


QUICK = dict(steps=12, layers=1, width=32)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict(steps=1)


def setup(c):
    return (f"GPT: {c.layers} blocks, width {c.width}, {c.heads} heads, context {c.context}; "
            f"AdamW (lr {c.lr:g}, weight decay 0.1), batch {c.batch}, {c.steps} steps on the "
            "characters of fpemu's README; the same weights and batches under each recipe "
            f"({', '.join(c.recipes)}), every nn.Linear emulated with fpemu.torch.emulate.")


def _text_ids():
    """The README's characters as ids (the package's own text, so the data ships
    with it), and the vocabulary size."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(here, "README.md")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    else:                                   # an installed package: its own docstrings
        text = (fpemu.__doc__ or "") + (__doc__ or "")
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    return np.array([index[ch] for ch in text], np.int64), len(chars)


def _model(torch, vocab, c):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(c.width), nn.LayerNorm(c.width)
            self.qkv = nn.Linear(c.width, 3 * c.width)
            self.proj = nn.Linear(c.width, c.width)
            self.fc = nn.Linear(c.width, 4 * c.width)
            self.out = nn.Linear(4 * c.width, c.width)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            heads = [t.view(B, T, c.heads, C // c.heads).transpose(1, 2) for t in (q, k, v)]
            y = nn.functional.scaled_dot_product_attention(*heads, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, c.width)
            self.pos = nn.Embedding(c.context, c.width)
            self.blocks = nn.ModuleList(Block() for _ in range(c.layers))
            self.ln = nn.LayerNorm(c.width)
            self.head = nn.Linear(c.width, vocab, bias=False)
            self.head.weight = self.tok.weight              # tied, as GPT-2 and nanoGPT
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln(x))

    return GPT()


def _train(torch, c, ids, vocab, recipe, state0):
    torch.manual_seed(c.seed)
    model = _model(torch, vocab, c)
    model.load_state_dict(state0)
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.1)
    rng = np.random.default_rng(c.seed + 1)
    emu = None if recipe == "fp32" else emulate(model, recipe)
    losses = []
    try:
        for _ in range(c.steps):
            start = rng.integers(0, len(ids) - c.context - 1, c.batch)
            rows = np.stack([ids[s:s + c.context + 1] for s in start])
            x, y = torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if emu is not None:
            emu.stop()
    return losses


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    unknown = [r for r in c.recipes if r not in RECIPES]
    if unknown or (c.batch * c.context) % 16 or c.width % c.heads:
        raise FpemuValueError(
            f"emulated_training: recipes must be among {', '.join(RECIPES)} (got "
            f"{', '.join(unknown) or 'those'}), batch x context a multiple of 16 (NVFP4's "
            f"Hadamard transform; got {c.batch * c.context}) and width a multiple of heads "
            f"(got {c.width} and {c.heads})")
    torch = require_torch()
    threads = torch.get_num_threads()
    ids, vocab = _text_ids()
    torch.manual_seed(c.seed)
    state0 = {k: v.clone() for k, v in _model(torch, vocab, c).state_dict().items()}
    curves, seconds = {}, {}
    for recipe in c.recipes:
        t = time.perf_counter()
        curves[recipe] = _train(torch, c, ids, vocab, recipe, state0)
        seconds[recipe] = time.perf_counter() - t
    final = {r: _base.final_loss(v, c.steps) for r, v in curves.items()}
    base = final.get("fp32")
    gap = {r: (final[r] - base) / base for r in final if r != "fp32"} if base else {}
    finite = {r: bool(np.all(np.isfinite(v))) for r, v in curves.items()}
    numbers = {
        "initial_loss": float(curves[c.recipes[0]][0]),
        "final_loss": final,
        "relative_gap_to_fp32": gap,
        "all_finite": finite,
        "seconds_per_step": {r: s / c.steps for r, s in seconds.items()},
        "torch_threads": threads,
    }
    if "mxfp8" in gap and "nvfp4" in gap:
        numbers["claim_nvfp4_gap_larger_than_mxfp8"] = bool(gap["nvfp4"] > gap["mxfp8"])
    numbers["all_recipes_trained"] = bool(all(finite.values()) and all(
        final[r] < numbers["initial_loss"] for r in final))
    words = ", ".join(f"{r} {final[r]:.3f}" for r in c.recipes)
    gaps = ", ".join(f"{r} {100 * g:+.1f}%" for r, g in gap.items())
    conclusion = (
        f"After {c.steps} steps the loss (mean of the last tenth) is {words}, from "
        f"{numbers['initial_loss']:.3f} at the start. "
        + (f"Against fp32 that is {gaps}: " if gaps else "")
        + ("each recipe trains this model, and the 4-bit elements cost more than the 8-bit "
           "ones" if numbers.get("claim_nvfp4_gap_larger_than_mxfp8") else
           "each recipe trains this model; at this size and length the 4-bit elements do "
           "not yet cost more than the 8-bit ones")
        + (f" (one run each: bf16, which only rounds, ends {100 * abs(gap['bf16']):.1f}% "
           "from fp32, the size of one run's noise)" if "bf16" in gap else "")
        + f". An emulated step took {numbers['seconds_per_step'].get('nvfp4', 0):.3f} s "
        f"under NVFP4 and {numbers['seconds_per_step'].get('fp32', 0):.3f} s in fp32 "
        f"({threads} threads).")
    return _base.finish(__name__, c, numbers, conclusion, {"curves": curves}, _plot, t0)


def _smooth(v, k):
    if len(v) < 2 * k:
        return np.asarray(v)
    kernel = np.ones(k) / k
    return np.convolve(v, kernel, mode="valid")


def _plot(r):
    curves = r.data["curves"]
    k = max(1, len(next(iter(curves.values()))) // 30)
    fig, ax = fp.new_axes(figsize=(12, 6.5))
    styles = {"fp32": "-", "bf16": "--", "mxfp8": "-.", "nvfp4": ":"}
    for name, v in curves.items():
        s = _smooth(v, k)
        ax.plot(np.arange(len(s)) + (len(v) - len(s)), s, styles.get(name, "-"), label=name,
                linewidth=2.5)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (moving mean of {k})")
    ax.set_title("A small GPT under emulated recipes: the loss curves", loc="left")
    ax.legend(loc="upper right", fontsize=13)
    return {"loss-curves": fig}
