"""Adam's epsilon in fp16 (docs/pytorch-numerics.md: the fp16 eps blow-up).

One Adam step (lr 1e-3, PyTorch's foreach op sequence) on pure fp16
parameters, one parameter per gradient value: every positive fp16 number
from 2^-14 to 2^-4, and 0. With eps = 1e-8, eps itself rounds to 0 in fp16,
and ``v = (1 - 0.999) g^2`` underflows for small |g|, so the denominator is 0:
the parameter becomes -inf (m / 0) or NaN (0 / 0). Then the same step with
eps = 1e-4, with ``fused=True``, with fp32 master weights, and in bf16.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import fpemu.autograd as torch
from .. import plotting as fp
from ..explain import values
from ..quantize import quantize
from . import _base

NAME = "adam_epsilon"
TITLE = "Adam's epsilon in fp16"
QUESTION = "Why does Adam with fp16 parameters and eps = 1e-8 produce -inf or NaN at step 1?"


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float = 1e-3
    eps: float = 1e-8
    big_eps: float = 1e-4
    g_lo: float = 2.0**-14       # gradients swept: every fp16 value in [g_lo, g_hi], and 0
    g_hi: float = 2.0**-4
    steps: int = 1


QUICK = dict(g_lo=2.0**-9, g_hi=2.0**-7)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict()


def setup(c):
    return (f"One Adam step (lr {c.lr:g}) per parameter, p0 = 1, gradient = each fp16 value "
            f"in [{_base.num(c.g_lo)}, {_base.num(c.g_hi)}] and 0; variants: fp16 eps "
            f"{c.eps:g}, fp16 eps {c.big_eps:g}, fp16 fused, fp16 with fp32 master weights, "
            "bf16, fp32.")


def _grads(c):
    v = values("fp16")["value"]
    g = v[(v >= c.g_lo) & (v <= c.g_hi)].astype(np.float32)
    return np.concatenate([[np.float32(0)], g])


def _step(torch, g, dtype, eps, lr, steps, fused=False, master=False):
    p = torch.ones(g.size, dtype=dtype, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr, eps=eps, fused=fused or None, master_weights=master)
    for _ in range(steps):
        p.grad = torch.tensor(g).to(dtype)
        opt.step()
    return p.detach().float().numpy().astype(np.float64)


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    g = _grads(c)
    variants = {
        f"fp16, eps {c.eps:g}": (torch.float16, c.eps, False, False),
        f"fp16, eps {c.big_eps:g}": (torch.float16, c.big_eps, False, False),
        f"fp16, eps {c.eps:g}, fused": (torch.float16, c.eps, True, False),
        f"fp16 + fp32 master, eps {c.eps:g}": (torch.float16, c.eps, False, True),
        f"bf16, eps {c.eps:g}": (torch.bfloat16, c.eps, False, False),
        f"fp32, eps {c.eps:g}": (torch.float32, c.eps, False, False),
    }
    rows, params = {}, {}
    for label, (dt, eps, fused, master) in variants.items():
        p = _step(torch, g, dt, eps, c.lr, c.steps, fused, master)
        params[label] = p
        step = np.abs(1.0 - p[1:])
        rows[label] = {
            "neg_inf": int(np.sum(p == -np.inf)), "nan": int(np.sum(np.isnan(p))),
            "finite": int(np.sum(np.isfinite(p))),
            "max_step_over_lr": float(np.nanmax(np.where(np.isfinite(step), step, np.nan))
                                      / c.lr) if np.isfinite(step).any() else float("nan"),
            "g0_result": float(p[0]),
        }
    base = params[f"fp16, eps {c.eps:g}"]
    blown = g[1:][np.isinf(base[1:])]
    numbers = {
        "eps_in_fp16": float(quantize(c.eps, "fp16")),
        "largest_g_giving_minus_inf": float(blown.max()) if blown.size else 0.0,
        "smallest_g_staying_finite": float(g[1:][np.isfinite(base[1:])].min())
        if np.isfinite(base[1:]).any() else float("nan"),
        "gradients_tested": int(g.size),
        "variants": rows,
    }
    first = f"fp16, eps {c.eps:g}"
    g0 = _base._show(rows[first]["g0_result"]).replace("nan", "NaN")
    conclusion = (
        f"In fp16, eps = {c.eps:g} rounds to {numbers['eps_in_fp16']:g} and v = 0.001 g^2 "
        f"underflows for |g| <= {numbers['largest_g_giving_minus_inf']:.5g}, so "
        f"{rows[first]['neg_inf']} of {g.size - 1} parameters become -inf and g = 0 gives "
        f"{g0}. eps = {c.big_eps:g} keeps all finite but steps up to "
        f"{rows[f'fp16, eps {c.big_eps:g}']['max_step_over_lr']:.3g} x lr, while fused Adam, "
        f"fp32 master weights and bf16 leave "
        f"{sum(rows[k]['nan'] + rows[k]['neg_inf'] for k in list(rows)[2:5])} non-finite.")
    data = {"g": g, "params": params}
    return _base.finish(__name__, c, numbers, conclusion,
                        data, _plot, t0)


#: where a step of exactly 0 is drawn on the log axis
NO_MOVE = 0.1


def _plot(r):
    fig, ax = fp.new_axes(figsize=(12, 6))
    g = r.data["g"][1:]
    lr = r.config.lr
    for label, p in r.data["params"].items():
        step = (1.0 - p[1:]) / lr
        ok = np.isfinite(step)
        # a parameter that did not move (step 0) is drawn on the "no move" line
        shown = np.where(step == 0, NO_MOVE, step)
        line, = ax.plot(g[ok], shown[ok], label=label, linewidth=1.8)
        if (~ok).any():
            ax.plot(g[~ok], np.full((~ok).sum(), 2e3), "|", color=line.get_color(),
                    markersize=14)
    ax.axhline(2e3, color="#bd1f01", linewidth=0.8)
    ax.text(g[0], 2.6e3, "non-finite parameter (-inf / NaN) marked on this line", fontsize=11,
            color="#bd1f01")
    ax.axhline(NO_MOVE, color="#4a4f55", linewidth=0.8)
    ax.text(g[0], NO_MOVE * 1.25, "parameter did not move (step 0) drawn on this line",
            fontsize=11, color="#4a4f55")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("gradient g (every fp16 value)")
    ax.set_ylabel("step size / lr after one step")
    ax.legend(loc="center right", fontsize=10)
    ax.set_title("One Adam step per parameter: where fp16 breaks", loc="left")
    return {"first_step": fig}
