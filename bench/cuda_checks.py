"""Measure the CUDA numerics that fpemu's CUDA profile assumes, with plain torch.

Run on a machine with a CUDA GPU (needs only torch and numpy; fpemu is not
imported, so nothing here can agree with fpemu by sharing its code)::

    python bench/cuda_checks.py [--out report.md]

Each check compares what the GPU returns with candidate formulas computed
exactly on the host (``fractions.Fraction``, rounded once to float32), and
prints how many of N elements each candidate reproduces:

1. where nvcc contracts ``a*b + c`` into one fused multiply-add:
   ``add_(b, alpha=s)``, ``_foreach_add_(alpha=s)``, ``addcmul_`` with value 1
   and with another value, ``lerp`` with a scalar weight below and above 0.5;
2. ``div(tensor, python_scalar)``: a true division, or a multiply by the
   float32 reciprocal, or by the float64 one;
3. how often CUDA's float32 ``pow`` (the ``powf`` in fused Adam's bias
   corrections) differs from the correctly rounded power, for steps 1..10^5.

``--dump-fused FILE`` also runs the fused SGD / Adam / AdamW kernels for four
steps in configurations the replay scenarios do not reach (dampening,
nesterov, maximize, L2 weight decay, amsgrad, a GradScaler's grad_scale) and
saves parameters, gradients and states, for fitting formulas on the host.

The results are written down in docs/pytorch-numerics.md ("Checked on a GPU").
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from fractions import Fraction

import numpy as np
import torch

N = 4096


def round_f32(q):
    """The float32 nearest to the rational ``q`` (ties to even), as a Python float.
    Overflow returns inf; the checks below stay well inside the range."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    e = max(e, -126)                       # subnormal spacing below 2^-126
    ulp = Fraction(2) ** (e - 23)
    k, rem = divmod(q, ulp)
    k = int(k)
    if rem * 2 > ulp or (rem * 2 == ulp and k % 2):
        k += 1
    v = k * ulp
    if v > Fraction(float(np.finfo(np.float32).max)):
        return sign * math.inf
    return sign * float(v)


def F(x):
    return Fraction(float(x))


def r(q):
    return round_f32(q)


def host(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def operands(gen, n=N):
    """Float32 operands over a few decades, both signs (no zeros, no overflow)."""
    mag = torch.exp2(torch.empty(n).uniform_(-8, 8, generator=gen))
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    return (mag * sign).float()


def score(name, got, candidates, lines):
    """Count, for each candidate formula, the elements whose bits it matches."""
    got = np.asarray(got, np.float32)
    parts = []
    for label, vals in candidates.items():
        want = np.asarray(vals, np.float32)
        hit = int(np.sum(got.view(np.uint32) == want.view(np.uint32)))
        parts.append(f"{label}: {hit}/{got.size}")
    line = f"- `{name}`: " + "; ".join(parts)
    lines.append(line)
    print(line, flush=True)


def check_contraction(dev, gen, lines):
    a, b, c = (operands(gen) for _ in range(3))
    s = 0.3                                    # a scalar with an inexact float32 value
    sf = F(np.float32(s))
    A, B, C = host(a), host(b), host(c)

    got = host(a.to(dev).clone().add_(b.to(dev), alpha=s))
    score("add_(b, alpha=0.3)", got, {
        "fma(alpha_f, b, a)": [r(sf * F(y) + F(x)) for x, y in zip(A, B)],
        "a + r(alpha_f*b)": [r(F(x) + F(r(sf * F(y)))) for x, y in zip(A, B)],
    }, lines)

    ta = [a.to(dev).clone()]
    torch._foreach_add_(ta, [b.to(dev)], alpha=s)
    score("_foreach_add_([a], [b], alpha=0.3)", host(ta[0]), {
        "fma(alpha_f, b, a)": [r(sf * F(y) + F(x)) for x, y in zip(A, B)],
        "a + r(alpha_f*b)": [r(F(x) + F(r(sf * F(y)))) for x, y in zip(A, B)],
    }, lines)

    got = host(a.to(dev).clone().addcmul_(b.to(dev), c.to(dev)))
    score("addcmul_(b, c) (value 1)", got, {
        "fma(b, c, a)": [r(F(y) * F(z) + F(x)) for x, y, z in zip(A, B, C)],
        "a + r(b*c)": [r(F(x) + F(r(F(y) * F(z)))) for x, y, z in zip(A, B, C)],
    }, lines)

    got = host(a.to(dev).clone().addcmul_(b.to(dev), c.to(dev), value=s))
    score("addcmul_(b, c, value=0.3)", got, {
        "fma(value_f, r(b*c), a)": [r(sf * F(r(F(y) * F(z))) + F(x))
                                    for x, y, z in zip(A, B, C)],
        "a + r(value_f*r(b*c))": [r(F(x) + F(r(sf * F(r(F(y) * F(z))))))
                                  for x, y, z in zip(A, B, C)],
        "fma(r(value_f*b), c, a)": [r(F(r(sf * F(y))) * F(z) + F(x))
                                    for x, y, z in zip(A, B, C)],
    }, lines)

    for w in (0.3, 0.7):
        wf = F(np.float32(w))
        got = host(torch.lerp(a.to(dev), b.to(dev), w))
        d = [F(r(F(y) - F(x))) for x, y in zip(A, B)]
        one_minus = F(r(1 - wf))
        score(f"lerp(a, b, {w})", got, {
            "|w|<0.5 ? fma(w, r(b-a), a) : fma(-r(b-a), r(1-w), b)":
                [r(wf * dd + F(x)) if w < 0.5 else r(-dd * one_minus + F(y))
                 for x, y, dd in zip(A, B, d)],
            "unfused (same branches)":
                [r(F(r(wf * dd)) + F(x)) if w < 0.5 else r(F(y) - F(r(dd * one_minus)))
                 for x, y, dd in zip(A, B, d)],
        }, lines)


def check_div(dev, gen, lines):
    """A tensor divided by a Python number: 3.0 and 7.0 are float32 values,
    0.1, 0.3 and sqrt(0.001) are not, which tells a reciprocal taken in double
    from the float32 reciprocal of the float32 number."""
    a = operands(gen)
    A = host(a)
    for s in (3.0, 7.0, 0.1, 0.3, 0.001 ** 0.5):
        got = host(a.to(dev) / s)
        sf = F(np.float32(s))
        score(f"div(a, {s:.9g})", got, {
            "r(a / r(s))": [r(F(x) / sf) for x in A],
            "r(a * r(1/r(s)))": [r(F(x) * F(r(1 / sf))) for x in A],
            "r(a * r(1/s)), 1/s in double": [r(F(x) * F(r(F(1.0 / s)))) for x in A],
        }, lines)


def check_powf(dev, lines, steps=100_000):
    t = torch.arange(1, steps + 1, dtype=torch.float32, device=dev)
    for beta in (0.9, 0.95, 0.98, 0.999):
        b32 = np.float32(beta)
        got = host(torch.pow(torch.tensor(b32, device=dev), t))
        p64 = float(b32) ** np.arange(1, steps + 1, dtype=np.float64)
        exact = p64.astype(np.float32)
        # float64 pow is within an ulp of double: rounding it to float32 can only
        # be wrong where it lies within a few double ulps of a float32 midpoint
        half = np.spacing(exact).astype(np.float64) / 2
        mid = np.minimum(np.abs(p64 - (exact + half)), np.abs(p64 - (exact - half)))
        near = mid <= 4 * np.spacing(p64)
        diff = (got.astype(np.float32).view(np.uint32).astype(np.int64)
                - exact.view(np.uint32).astype(np.int64))
        line = (f"- `pow(float32({beta}), t)`, t = 1..{steps}: {int(np.sum(diff != 0))} "
                f"differ from the correctly rounded power (max {int(np.max(np.abs(diff)))} ulp; "
                f"{int(np.sum(near))} near-midpoint cases unsure)")
        lines.append(line)
        print(line, flush=True)


FUSED_CONFIGS = {       # name: (optimizer, its arguments, dtype / size / loss scale)
    "sgd-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-4), {}),
    "sgd-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4), {}),
    "sgd-nomomentum": ("SGD", dict(lr=1e-2, weight_decay=1e-4), {}),
    "sgd-maximize": ("SGD", dict(lr=1e-2, momentum=0.9, maximize=True), {}),
    "sgd-scaled": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), dict(scale=3.0)),
    "adam-l2": ("Adam", dict(lr=1e-3, weight_decay=1e-2), {}),
    "adam-amsgrad": ("Adam", dict(lr=1e-3, amsgrad=True), {}),
    "adam-maximize": ("Adam", dict(lr=1e-3, maximize=True), {}),
    "adam-scaled": ("Adam", dict(lr=1e-3), dict(scale=3.0)),
    "adamw-gpt": ("AdamW", dict(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1), {}),
    # the lanes of the 4-element loads, the unaligned path, 16-bit parameters
    "sgd-scaled-nomom": ("SGD", dict(lr=1e-2, weight_decay=1e-4), dict(scale=3.0)),
    "sgd-scaled-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True,
                                        weight_decay=1e-4), dict(scale=3.0)),
    "sgd-scaled-bf16": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4),
                        dict(scale=3.0, dtype=torch.bfloat16)),
    "sgd-scaled-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4),
                       dict(scale=3.0, n=N - 1)),
    "sgd-maximize-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-4,
                                      maximize=True), {}),
    "sgd-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), dict(n=N - 1)),
    "adam-l2-odd": ("Adam", dict(lr=1e-3, weight_decay=1e-2), dict(n=N - 1)),
    "adam-l2-bf16": ("Adam", dict(lr=1e-3, weight_decay=1e-2), dict(dtype=torch.bfloat16)),
    "adam-l2-scaled": ("Adam", dict(lr=1e-3, weight_decay=1e-2), dict(scale=3.0)),
    "adam-l2-maximize": ("Adam", dict(lr=1e-3, weight_decay=1e-2, maximize=True), {}),
    "adam-odd": ("Adam", dict(lr=1e-3), dict(n=N - 1)),
}
FUSED_STEPS = 4


def dump_fused(dev, path):
    """Run each fused configuration for FUSED_STEPS steps; save p0, the
    gradients (as the kernel saw them: scaled where a GradScaler is used),
    and p and every state after each step, all widened to float32."""
    gen = torch.Generator().manual_seed(1)
    out = {}
    for name, (cls, kw, extra) in FUSED_CONFIGS.items():
        n, dtype, scale = extra.get("n", N), extra.get("dtype", torch.float32), extra.get("scale")
        p0 = (operands(gen, n) * 0.1).to(dtype)
        grads = torch.stack([operands(gen, n) * 1e-3 for _ in range(FUSED_STEPS)])
        p = p0.clone().to(dev).requires_grad_(True)
        opt = getattr(torch.optim, cls)([p], fused=True, **kw)
        scaler = None
        if scale is not None:
            scaler = torch.amp.GradScaler(dev.type, init_scale=scale)
            scaler.scale(torch.ones((), device=dev))
            grads = grads * scale                     # what backward of a scaled loss gives
        grads = grads.to(dtype)
        out[f"{name}/p0"] = p0.float().numpy()
        out[f"{name}/grads"] = grads.float().numpy()
        for k in range(FUSED_STEPS):
            p.grad = grads[k].to(dev).clone()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            out.setdefault(f"{name}/p", []).append(p.detach().float().cpu().numpy().copy())
            for s, v in opt.state[p].items():
                if s != "step":
                    out.setdefault(f"{name}/{s}", []).append(v.float().cpu().numpy().copy())
        print(f"fused {name}: {FUSED_STEPS} steps, states "
              f"{sorted(k for k in opt.state[p] if k != 'step')}", flush=True)
    np.savez_compressed(path, **{k: np.asarray(v) for k, v in out.items()})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="also write the report (markdown) here")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dump-fused", metavar="FILE",
                    help="also save fused-optimizer runs in more configurations (.npz)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch; run on a GPU machine or pass --device cpu")
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else f"cpu {platform.machine()}"
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, {name}, N = {N}", ""]
    print(lines[0], flush=True)
    gen = torch.Generator().manual_seed(0)
    check_contraction(dev, gen, lines)
    check_div(dev, gen, lines)
    check_powf(dev, lines)
    if args.dump_fused:
        dump_fused(dev, args.dump_fused)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
