"""Autocast in attention: what must stay in fp32.

The same attention (bf16 query, key and value; peaked scores, as in a
trained model) computed four ways with fpemu's ops, against a float64
reference computed from the same bf16 inputs:

* **fp32**: every step in fp32;
* **flash-style**: ``scaled_dot_product_attention``'s fused-kernel model:
  scores accumulate and stay in fp32, the softmax runs in fp32, P is rounded
  to bf16 before P @ V (``docs/pytorch-numerics.md`` §11);
* **scores in bf16**: eager attention under bf16 autocast: the matmul
  writes the scores in bf16, softmax runs in fp32 (autocast's fp32 list),
  P @ V in bf16;
* **softmax in bf16**: as the previous, but the softmax's exp, sum and
  division each round to bf16, as a kernel without fp32 opmath would.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from ..quantize import quantize
from . import _base

NAME = "attention"
TITLE = "Autocast in attention"
QUESTION = "Why does softmax run in fp32, and what does flash attention keep in fp32?"


@dataclasses.dataclass(frozen=True)
class Config:
    heads: int = 8
    length: int = 128
    dim: int = 64
    temperature: float = 3.0     # query scale: larger gives more peaked attention
    seed: int = 0


QUICK = dict(heads=2, length=16, dim=16)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict()


def setup(c):
    return (f"{c.heads} heads, sequence {c.length}, head dim {c.dim}; bf16 q, k, v with q "
            f"x {c.temperature:g} (peaked scores); loss = mean squared output against a "
            "fixed target; errors against float64 from the same bf16 inputs.")


def _inputs(c):
    rng = np.random.default_rng(c.seed)

    def draw(scale):
        # sums of uniforms, exact in float64: roughly normal, the same on every machine
        u = rng.integers(-2**12, 2**12, size=(4, c.heads, c.length, c.dim)).sum(axis=0)
        return quantize(u * (scale * 2.0**-12 * np.sqrt(3) / 2), "bf16").astype(np.float32)
    return draw(c.temperature), draw(1.0), draw(1.0), draw(0.5)


def _reference(q, k, v):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    return p, p @ v


def _variants(torch, q, k, v):
    F = torch.nn.functional
    bf = torch.bfloat16
    Q, K, V = (torch.tensor(a, dtype=bf) for a in (q, k, v))
    scale = 1.0 / float(np.sqrt(q.shape[-1]))
    out = {}
    # fp32 throughout
    Qf, Kf, Vf = Q.float(), K.float(), V.float()
    P = F.softmax((Qf @ Kf.transpose(-1, -2)) * scale, dim=-1)
    out["fp32"] = (P, P @ Vf)
    # flash-style: the fused kernel's model
    out_ = F.scaled_dot_product_attention(Q, K, V)
    Pf = F.softmax((Qf @ Kf.transpose(-1, -2)) * scale, dim=-1).to(bf)   # its P, for plots
    out["flash-style (scores fp32, P bf16)"] = (Pf, out_)
    # eager attention under bf16 autocast
    with torch.autocast("cuda", dtype=bf):
        S = (Q @ K.transpose(-1, -2)) * scale          # bf16 scores
        P = F.softmax(S, dim=-1)                       # fp32 (autocast's fp32 list)
        out_ = P @ V                                   # P cast to bf16, bf16 output
    out["scores in bf16, softmax fp32"] = (P, out_)
    # softmax computed in bf16
    S = (Q @ K.transpose(-1, -2)) * scale
    E = (S - S.amax(dim=-1, keepdim=True)).exp()
    P = E / E.sum(dim=-1, keepdim=True)
    out["softmax in bf16"] = (P, P @ V)
    return out


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    q, k, v, target = _inputs(c)
    p_ref, o_ref = _reference(q, k, v)
    loss_ref = float(np.mean((o_ref - target) ** 2))
    rows = {}
    ps = {}
    for label, (P, O) in _variants(torch, q, k, v).items():
        p = P.detach().float().numpy().astype(np.float64)
        o = O.detach().float().numpy().astype(np.float64)
        ps[label] = p
        loss = float(np.mean((o - target) ** 2))
        rows[label] = {
            "max_abs_error_P": float(np.max(np.abs(p - p_ref))),
            "max_row_sum_error": float(np.max(np.abs(p.sum(axis=-1) - 1.0))),
            "argmax_changed": float(np.mean(p.argmax(-1) != p_ref.argmax(-1))),
            "max_rel_error_output": float(np.max(np.abs(o - o_ref)) / np.max(np.abs(o_ref))),
            "loss_rel_error": abs(loss - loss_ref) / loss_ref,
        }
    numbers = {"variants": rows, "loss_reference": loss_ref,
               "max_P_reference": float(p_ref.max())}
    flash, scores, soft = (rows[k] for k in list(rows)[1:])
    conclusion = (
        f"Computed in bf16, the softmax's rows sum to 1 within only "
        f"{soft['max_row_sum_error']:.2g} and the loss is off by "
        f"{soft['loss_rel_error']:.2g} (relative), against {flash['loss_rel_error']:.2g} for "
        f"the flash-style kernel that keeps the scores and the softmax in fp32. Rounding the "
        f"scores to bf16 first changes the largest attention weight of "
        f"{_base.pct(scores['argmax_changed'])} of the rows and puts the weights off by up to "
        f"{scores['max_abs_error_P']:.2g}, "
        f"{scores['max_abs_error_P'] / max(flash['max_abs_error_P'], 1e-300):.2g} times the "
        f"flash-style error.")
    return _base.finish(__name__, c, numbers, conclusion,
                        {"rows": rows, "P": ps, "P_ref": p_ref}, _plot, t0)


def _plot(r):
    fig, axes = fp.new_axes(2, 1, figsize=(12, 13))
    rows = r.data["rows"]
    labels = list(rows)
    metrics = (("max_abs_error_P", "max |P - P64|"), ("max_row_sum_error", "max |row sum - 1|"),
               ("max_rel_error_output", "max output error (rel.)"),
               ("loss_rel_error", "loss error (rel.)"))
    x = np.arange(len(metrics))
    w = 0.8 / len(labels)
    colors = dict(zip(labels, ("#717581", "#3f90da", "#ffa90e", "#bd1f01")))
    for i, label in enumerate(labels):
        vals = [max(rows[label][m], 1e-12) for m, _ in metrics]
        axes[0].bar(x + (i - (len(labels) - 1) / 2) * w, vals, w, label=label,
                    color=colors[label])
    axes[0].set_xticks(x, [t for _, t in metrics], rotation=12)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("error against float64")
    axes[0].legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=11)
    axes[0].set_title("Errors of four ways to compute attention", loc="left", pad=58)
    # each attention weight's error against its size (head 0)
    p_ref = r.data["P_ref"][0].ravel()
    keep = p_ref > 1e-6
    for label in labels[1:]:
        err = np.abs(r.data["P"][label][0].ravel() - p_ref)[keep]
        axes[1].scatter(p_ref[keep], np.maximum(err, 1e-12), s=3, alpha=0.35, label=label,
                        color=colors[label], rasterized=True)
    x = np.array([1e-6, 1.0])
    axes[1].plot(x, x * 2.0**-9, color="black", linewidth=1.2,
                 label="half an ulp of bf16 (relative $2^{-9}$)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].set_ylim(bottom=1e-10)
    axes[1].set_xlabel("attention weight (float64)")
    axes[1].set_ylabel("|error|")
    axes[1].legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=11,
                   markerscale=4)
    axes[1].set_title("Each weight's error against its size (head 0)", loc="left", pad=58)
    return {"errors": fig}
