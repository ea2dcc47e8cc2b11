"""Gradients across ranks: what a bf16 all-reduce loses, by algorithm and world size.

Data-parallel training sums every gradient over all ranks, in the dtype on
the wire, one rounding per hop (``fpemu.collectives``). Here each rank holds a
bf16 gradient (a shared signal plus per-rank noise, made from integers) and
the world grows from 2 to 1,024 ranks. For each algorithm the error of the
summed gradient is measured against the exact sum, in units of bf16's ulp at
that sum (rounding the exact sum once gives at most 0.5): NCCL's ring (one
channel), NCCL's tree (8 ranks per node), NVLS (the switch adds in float32),
gloo's ring, and the ring in fp32 (``reduce_dtype=float32``).

Then two hazards of low-precision communication: fp16 sums of large
(loss-scaled) gradients overflow unless each rank divides first (NCCL's
``avg`` pre-multiplies by 1/N), and an e4m3 all-reduce of small gradients
flushes most of them to zero unless all ranks share a scale taken from the
global amax (a max all-reduce first, as MS-AMP does).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from .. import collectives
from .. import plotting as fp
from ..quantize import quantize
from . import _base

NAME = "collectives"
TITLE = "Gradients across ranks"
QUESTION = ("How many bits does a bf16 gradient all-reduce lose over 1,024 ranks, and do a "
            "tree or an fp32 reduction fix it?")

#: the algorithms compared, with their fpemu.collectives call
ALGORITHMS = {"NCCL ring": ("bf16", "ring"), "NCCL tree": ("bf16", "tree"),
              "NVLS (fp32 in the switch)": ("bf16", "nvls"), "gloo ring": ("bf16", "gloo"),
              "fp32 reduce (ring), then bf16": ("fp32", "ring")}


@dataclasses.dataclass(frozen=True)
class Config:
    elements: int = 4096
    max_world_log2: int = 10
    seed: int = 0


QUICK = dict(elements=256, max_world_log2=6)
#: the full run's sizes with the fewest steps (``fpemu warmup``)
WARM = dict()


def setup(c):
    return (f"{c.elements} gradient elements per rank (bf16: a shared signal plus per-rank "
            f"noise, about 1e-3), worlds of 2 to {2 ** c.max_world_log2} ranks; errors "
            "against the exact sum, in bf16 ulps of the sum. fp16: positive loss-scaled "
            "gradients from 2^3 to 2^12; e4m3: the bf16 gradients with and without a shared "
            "scale.")


def _gradients(rng, world, n):
    """bf16 values: signal (shared) plus noise (per rank), integers times 2**-20."""
    signal = rng.integers(-2 ** 9, 2 ** 9, size=n)
    noise = sum(rng.integers(-2 ** 10, 2 ** 10, size=(world, n)) for _ in range(4))
    return quantize(np.ldexp((signal[None, :] + noise).astype(np.float64), -20), "bf16")


def _ulp_error(got, exact):
    """Median |got - exact| in bf16 ulps at the exact value (nonzero sums; the
    median, because a sum that nearly cancels makes its few elements' errors
    huge in ulps of the small result)."""
    keep = exact != 0
    ex = exact[keep]
    e = np.floor(np.log2(np.abs(quantize(ex, "bf16").astype(np.float64))))
    ulp = np.ldexp(1.0, (e - 7).astype(np.int64))
    return float(np.median(np.abs(got[keep].astype(np.float64) - ex) / ulp))


def run(config=None, **overrides):
    t0 = time.perf_counter()
    c = _base.make_config(Config, config, **overrides)
    rng = np.random.default_rng(c.seed)
    worlds = [2 ** k for k in range(1, c.max_world_log2 + 1)]
    pool = _gradients(rng, worlds[-1], c.elements)
    errors = {name: [] for name in ALGORITHMS}
    errors["exact, rounded once"] = []
    fp32_exact = True
    for w in worlds:
        X = pool[:w]
        exact = X.astype(np.float64).sum(axis=0)       # exact: every partial sum fits float64
        for name, (fmt, algorithm) in ALGORITHMS.items():
            kw = {"gpus_per_node": min(8, w)} if algorithm == "tree" else {}
            got = collectives.all_reduce(X, fmt, "sum", algorithm, **kw)[0]
            if fmt == "fp32":
                fp32_exact &= bool(np.all(got.astype(np.float64) == exact))
                got = quantize(got, "bf16")
            errors[name].append(_ulp_error(got, exact))
        errors["exact, rounded once"].append(
            _ulp_error(collectives.all_reduce(X, "bf16", "sum", "exact")[0], exact))

    # fp16: large gradients, summed as they are or pre-divided by the world size
    e = rng.integers(3, 12, size=c.elements)            # each element's binade, 2^3 .. 2^11
    big = quantize(np.ldexp(rng.integers(2 ** 9, 2 ** 10, size=(worlds[-1], c.elements))
                            .astype(np.float64), e[None, :] - 9), "fp16")
    overflow = {"fp16 sum": [], "fp16 avg (pre-divided)": []}
    for w in worlds:
        s = collectives.all_reduce(big[:w], "fp16", "sum", "ring")[0]
        a = collectives.all_reduce(big[:w], "fp16", "avg", "ring")[0]
        overflow["fp16 sum"].append(float(np.mean(np.isinf(s))))
        overflow["fp16 avg (pre-divided)"].append(float(np.mean(np.isinf(a))))

    # e4m3 communication of the largest world's gradients (summed exactly: the
    # casts are the subject), without a scale and with FP8-LM's shared scale
    X = pool
    exact = X.astype(np.float64).sum(axis=0)
    fp8 = {}
    scale = 1.0
    for label, scaling in (("e4m3, no scale", "none"), ("e4m3, shared scale", "shared")):
        got, s = collectives.fp8_all_reduce(X, "e4m3fn", "exact", scaling=scaling,
                                            power_of_two=True)
        q = quantize(X.astype(np.float64) * s, "e4m3fn", overflow="saturate")
        fp8[label] = {"zero_fraction": float(np.mean((q == 0) & (X != 0))),
                      "rel_rms_error": float(np.sqrt(np.mean((got[0] - exact) ** 2))
                                             / np.sqrt(np.mean(exact ** 2)))}
        scale = s if scaling == "shared" else scale
    top = worlds[-1]
    ring_top = errors["NCCL ring"][-1]
    numbers = {
        "worlds": worlds, "median_ulp_error": errors,
        "fp16_overflow_fraction": overflow, "fp8": fp8, "fp8_shared_scale": scale,
        "bits_lost_ring_at_max_world": float(np.log2(max(ring_top, 0.5) / 0.5)),
        "claim_bf16_communication_harmless": bool(ring_top <= 1.0),
        "fp32_reduce_exact_at_every_world": fp32_exact,
        "claim_fp32_reduce_more_stable": bool(
            errors["fp32 reduce (ring), then bf16"][-1] <= errors["exact, rounded once"][-1]
            and ring_top > 1.0),
    }
    tree_top = errors["NCCL tree"][-1]
    first_overflow = next((w for w, f in zip(worlds, overflow["fp16 sum"]) if f > 0), None)
    conclusion = (
        f"Over {top} ranks NCCL's bf16 ring is off by a median {ring_top:.3g} bf16 ulps "
        f"(rounding the exact sum once: {errors['exact, rounded once'][-1]:.2f}), so the claim "
        "that bf16 communication costs nothing is "
        f"{'true' if numbers['claim_bf16_communication_harmless'] else 'false'} at this size: "
        f"about {numbers['bits_lost_ring_at_max_world']:.1f} of bf16's 8 bits are lost; the "
        f"tree's shorter chains give {tree_top:.3g} ulps, NVLS's float32 accumulation "
        f"{errors['NVLS (fp32 in the switch)'][-1]:.2f}, and an fp32 reduction rounded to "
        f"bf16 at the end {errors['fp32 reduce (ring), then bf16'][-1]:.2f} (its fp32 sums "
        f"{'were exact' if fp32_exact else 'rounded'}), which makes \"fp32 reduce_dtype is "
        f"more stable\" {'true' if numbers['claim_fp32_reduce_more_stable'] else 'not shown'}. "
        + (f"fp16 sums of loss-scaled gradients (2^3 to 2^12) start to overflow at "
           f"{first_overflow} ranks ({_base.pct(overflow['fp16 sum'][-1])} of the elements at "
           f"{top}), while dividing first, as NCCL's avg does, "
           + ("never overflows; " if not any(overflow["fp16 avg (pre-divided)"])
              else "overflows too; ")
           if first_overflow else "fp16 sums did not overflow at these sizes; ")
        + f"an e4m3 all-reduce without a scale flushes "
          f"{_base.pct(fp8['e4m3, no scale']['zero_fraction'])} of the gradients to zero, a "
          f"shared scale {_base.pct(fp8['e4m3, shared scale']['zero_fraction'])}.")
    return _base.finish(__name__, c, numbers, conclusion,
                        {"worlds": worlds, "errors": errors, "overflow": overflow}, _plot, t0)


def _plot(r):
    worlds = r.data["worlds"]
    fig, ax = fp.new_axes(figsize=(12, 6.5))
    styles = ("o-", "s-", "^--", "D-", "v:", "x--")
    for (label, ys), style in zip(r.data["errors"].items(), styles):
        ax.plot(worlds, ys, style, label=label, markersize=8)
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ranks (world size)")
    ax.set_ylabel("median error of the sum (bf16 ulps)")
    ax.set_title("bf16 all-reduce: the ring's error grows with the world size", loc="left")
    ax.legend(loc="upper left", fontsize=12)
    fig2, ax2 = fp.new_axes(figsize=(12, 5.5))
    fp.plot_lines(worlds, {k: [100 * v for v in vals] for k, vals in r.data["overflow"].items()},
                  ax=ax2, xlabel="ranks (world size)", ylabel="elements overflowed to inf (%)",
                  logx=True, title="fp16 all-reduce of large gradients: divide first")
    return {"reduction-error": fig, "fp16-overflow": fig2}
