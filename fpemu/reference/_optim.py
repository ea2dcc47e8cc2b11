"""Scenarios of the optimizers: recorded gradient streams replayed through
Adam, AdamW and SGD (foreach, single-tensor, fused) on float32, master-weight,
bf16 and fp16 parameters, and the fused optimizers' other options."""

from __future__ import annotations

import numpy as np

from ._registry import Trace, _register
from .compare import Tier


REPLAY_STEPS = 200
REAL_COLUMNS = 40


def _synthetic_columns(steps, rng):
    """Edge-case gradient streams, one per column."""
    t = np.arange(steps)
    alt = np.where(t % 2 == 0, 1.0, -1.0)
    cols = [
        np.zeros(steps),                                       # always zero
        np.full(steps, 2.0**-24),                              # fp16 smallest subnormal
        np.full(steps, 2.0**-25),                              # rounds to 0 in fp16
        np.full(steps, 3 * 2.0**-26) * alt,
        np.full(steps, 5.4588e-3),                             # fp16 Adam eps cliff (E5a)
        np.full(steps, 5.47e-3),
        np.full(steps, 1e-8),
        np.full(steps, 2.0**-133),                             # bf16 smallest subnormal
        np.full(steps, 1e-40) * alt,                           # float32 subnormal
        np.full(steps, 7e4),                                   # overflows fp16
        np.full(steps, 3e38) * alt,                            # near FLT_MAX
        np.where(t % 50 == 49, 1e5, 1e-3),                     # rare spikes
        1e-3 * alt,
        np.full(steps, 1.0),
        np.ldexp(2.0 - (t % 7) / 7, -(t // 7)),                # decays into underflow
        np.where(t < steps // 2, 1e-2, 0.0),                   # stops
    ]
    return np.stack(cols, axis=1)


def _real_grads(env, steps, n, seed):
    """Gradients of a small MLP trained with SGD on a toy problem, in real
    PyTorch (the record-time backend): the first layer's weight gradient,
    ``n`` of its entries per step."""
    T = env.T
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((256, 8)).astype(np.float32)
    y = (X[:, :4].sum(1) > 0).astype(np.int64) + 2 * (X[:, 4] > 0).astype(np.int64)
    w1 = env.tensor((rng.standard_normal((16, 8)) / np.sqrt(8)).astype(np.float32),
                    requires_grad=True)
    b1 = env.tensor(np.zeros(16, np.float32), requires_grad=True)
    w2 = env.tensor((rng.standard_normal((4, 16)) / 4).astype(np.float32), requires_grad=True)
    opt = T.optim.SGD([w1, b1, w2], lr=0.1)
    out = []
    for k in range(steps):
        idx = rng.choice(256, 32, replace=False)
        xb, yb = env.tensor(X[idx]), env.tensor(y[idx])
        loss = T.nn.functional.cross_entropy(
            T.nn.functional.linear(T.relu(T.nn.functional.linear(xb, w1, b1)), w2), yb)
        opt.zero_grad()
        loss.backward()
        out.append(env.array(w1.grad).reshape(-1)[:n])
        opt.step()
    return np.stack(out).astype(np.float32)


def _replay_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    real = _real_grads(env, REPLAY_STEPS, REAL_COLUMNS, cfg["seed"])
    g = np.concatenate([real, _synthetic_columns(REPLAY_STEPS, rng)], axis=1)
    p0 = np.concatenate([rng.standard_normal(REAL_COLUMNS) * 0.1,
                         rng.choice([1.0, -1.0, 0.5, 1e-3, 0.0], g.shape[1] - REAL_COLUMNS)])
    return {"grads": g.astype(np.float32), "p0": p0.astype(np.float32)}


_REPLAY_HOST = {
    "in.grads": "the first 40 columns are gradients of an MLP trained with real PyTorch: "
                "its matmuls run in MKL / oneDNN, whose kernels and sum order depend on the "
                "CPU's instruction set and thread count",
    "out.*": "computed from in.grads (and, for 16-bit parameters on the CPU, by ATen kernels "
             "whose vector body / scalar tail split depends on the CPU's vector width)",
}

OPTIMIZERS = {
    "adam": ("Adam", dict(lr=1e-3)),
    "adamw": ("AdamW", dict(lr=1e-3, weight_decay=1e-2)),
    "sgd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4)),
}
IMPLS = {"foreach": dict(foreach=True), "single": dict(foreach=False), "fused": dict(fused=True)}
PARAMS = ("fp32", "master", "bf16", "fp16")


def _replay_run(env, cfg, inputs):
    """Feed recorded gradients to an optimizer for every step; record the
    parameter and the optimizer state after each. ``master``: a float32 master
    copy stepped by the optimizer, the bfloat16 model parameter recast from it
    after every step, the bfloat16 gradient widened into the master's .grad."""
    T = env.T
    tr = Trace(env)
    cls, kw = OPTIMIZERS[cfg["optimizer"]]
    kw = dict(kw, **IMPLS[cfg["impl"]])
    mode = cfg["params"]
    D = {"fp32": "float32", "master": "float32", "bf16": "bfloat16", "fp16": "float16"}[mode]
    p = env.tensor(inputs["p0"], dtype=D, requires_grad=True)
    model = p.detach().to(env.dtype("bfloat16")) if mode == "master" else None
    opt = getattr(T.optim, cls)([p], **kw)
    state_names = ("momentum_buffer",) if cls == "SGD" else ("exp_avg", "exp_avg_sq")
    for g in inputs["grads"]:
        if mode == "master":
            p.grad = env.tensor(g, dtype="bfloat16").float()
        else:
            p.grad = env.tensor(g, dtype=D)
        opt.step()
        tr.add("p", p)
        st = opt.state[p]
        for s in state_names:
            tr.add(s, st[s])
        if mode == "master":
            model = p.detach().to(env.dtype("bfloat16"))
            tr.add("model", model)
    return tr


def _replay_tiers(cfg, profile):
    impl, opt, params = cfg["impl"], cfg["optimizer"], cfg["params"]
    fp32_state = params in ("fp32", "master")
    if profile.cpu:
        if impl == "fused" and opt == "sgd" and not fp32_state:
            r = ("torch 2.13's CPU fused SGD kernel (FusedSGDKernel.cpp) is broken for 16-bit "
                 "parameters: its vector body never stores the parameter and loads the "
                 "momentum buffer as float32; fpemu computes what the scalar tail does")
            return {"*": Tier("none", 0, r)}
        if impl != "fused" and opt != "sgd" and fp32_state:
            r = ("CPU torch's float32 sqrt is MKL VML, not correctly rounded, and MKL's "
                 "code for it depends on the CPU (docs/pytorch-numerics.md §7.1; every "
                 "recorded p is fpemu's step with the sqrt at most an ulp off); fpemu "
                 "computes the IEEE sqrt. One sqrt ulp moves an update by "
                 "≤ lr·2^-23 and p does not feed back into m, v, so after 200 steps "
                 "|Δp| ≤ 200·lr·2^-22 ≈ 5e-8, plus one rounding of |p| ≤ 1 (≤ 1.2e-7)")
            return {"p": Tier("abs", 2.5e-7, r), "model": Tier("ulps", 1, r)}
        return {}
    # CUDA: every optimizer is bit-exact, fused ones included (CUDA's powf in
    # fused Adam's bias corrections is emulated bit for bit, fused SGD's float32
    # contractions were measured: torch 2.11 on an H200)
    return {}


for _o in OPTIMIZERS:
    for _i in IMPLS:
        for _p in PARAMS:
            _register(f"optim-{_o}-{_i}-{_p}", "optim", _replay_run,
                      dict(optimizer=_o, impl=_i, params=_p, seed=30), _replay_inputs,
                      _replay_tiers, description=f"{OPTIMIZERS[_o][0]} ({_i}) replayed on "
                                                 f"{_p} parameters for {REPLAY_STEPS} steps",
                      host_dependent=_REPLAY_HOST)


# ============================================ fused optimizers, other options
# What the 200-step replays do not reach: dampening, nesterov, maximize, L2
# weight decay, amsgrad, a GradScaler's grad_scale, 16-bit parameters with
# those, and a size that is not a multiple of 4 (CUDA's fused kernels load 4
# elements at a time and nvcc contracts the lanes differently).
FUSED_N = 1024
FUSED_STEPS = 4
FUSED_CONFIGS = {   # name: (optimizer, arguments, parameter dtype, size, loss scale)
    "sgd-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-4),
                 "float32", FUSED_N, None),
    "sgd-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
                     "float32", FUSED_N, None),
    "sgd-nomomentum": ("SGD", dict(lr=1e-2, weight_decay=1e-4), "float32", FUSED_N, None),
    "sgd-maximize": ("SGD", dict(lr=1e-2, momentum=0.9, maximize=True), "float32", FUSED_N,
                     None),
    "sgd-maximize-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1,
                                      weight_decay=1e-4, maximize=True),
                          "float32", FUSED_N, None),
    "sgd-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                FUSED_N - 1, None),
    "sgd-scaled": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                   FUSED_N, 3.0),
    "sgd-scaled-nomom": ("SGD", dict(lr=1e-2, weight_decay=1e-4), "float32", FUSED_N, 3.0),
    "sgd-scaled-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True,
                                        weight_decay=1e-4), "float32", FUSED_N, 3.0),
    "sgd-scaled-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                       FUSED_N - 1, 3.0),
    "sgd-scaled-fp16": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float16",
                        FUSED_N, 3.0),
    "sgd-nowd": ("SGD", dict(lr=1e-2, momentum=0.9), "float32", FUSED_N, None),
    "sgd-nowd-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1), "float32", FUSED_N,
                      None),
    "adam-l2": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N, None),
    "adam-l2-odd": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N - 1, None),
    "adam-l2-bf16": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "bfloat16", FUSED_N, None),
    "adam-l2-scaled": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N, 3.0),
    "adam-l2-maximize": ("Adam", dict(lr=1e-3, weight_decay=1e-2, maximize=True), "float32",
                         FUSED_N, None),
    "adam-l2-maximize-odd": ("Adam", dict(lr=1e-3, weight_decay=1e-2, maximize=True),
                             "float32", FUSED_N - 1, None),
    "adam-amsgrad": ("Adam", dict(lr=1e-3, amsgrad=True), "float32", FUSED_N, None),
    "adam-maximize": ("Adam", dict(lr=1e-3, maximize=True), "float32", FUSED_N, None),
    "adam-scaled": ("Adam", dict(lr=1e-3), "float32", FUSED_N, 3.0),
    "adam-odd": ("Adam", dict(lr=1e-3), "float32", FUSED_N - 1, None),
    "adamw-gpt": ("AdamW", dict(lr=3e-4, betas=[0.9, 0.95], weight_decay=0.1), "float32",
                  FUSED_N, None),
}


def _fused_inputs(env, cfg):
    """p0 and the gradients: random signs and significands in [1, 2) times
    powers of two (p0 2^-12 .. 2^-3, gradients 2^-18 .. 2^-9), float32; the
    gradients multiplied by the loss scale where there is one, as a scaled
    backward gives them."""
    rng = np.random.default_rng(cfg["seed"])
    n = cfg["n"]

    def draw(lo, hi, shape):
        sig = 1 + rng.integers(0, 2**23, shape) / 2**23
        return (rng.choice([-1.0, 1.0], shape) * np.ldexp(sig, rng.integers(lo, hi, shape)))

    p0 = draw(-12, -2, n).astype(np.float32)
    grads = draw(-18, -8, (FUSED_STEPS, n)).astype(np.float32)
    if cfg["scale"] is not None:
        grads = (grads * np.float32(cfg["scale"])).astype(np.float32)
    return {"p0": p0, "grads": grads}


def _fused_run(env, cfg, inputs):
    """The fused optimizer for FUSED_STEPS steps (through a GradScaler where
    there is a loss scale); p and every state after each step."""
    T = env.T
    tr = Trace(env)
    cls, kw = cfg["optimizer"], dict(cfg["kwargs"])
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    D = cfg["dtype"]
    p = env.tensor(inputs["p0"], dtype=D, requires_grad=True)
    opt = getattr(T.optim, cls)([p], fused=True, **kw)
    scaler = None
    if cfg["scale"] is not None:
        scaler = T.amp.GradScaler(env.device, init_scale=cfg["scale"])
        scaler.scale(env.tensor(np.float32(1.0)))
    for g in inputs["grads"]:
        p.grad = env.tensor(g, dtype=D)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        tr.add("p", p)
        for name in sorted(k for k in opt.state[p] if k != "step"):
            tr.add(name, opt.state[p][name])
    return tr


def _fused_tiers(cfg, profile):
    if profile.cpu and cfg["optimizer"] == "SGD" and cfg["dtype"] != "float32":
        r = ("torch 2.13's CPU fused SGD kernel (FusedSGDKernel.cpp) is broken for 16-bit "
             "parameters: its vector body never stores the parameter and loads the "
             "momentum buffer as float32; fpemu computes what the scalar tail does")
        return {"*": Tier("none", 0, r)}
    return {}


for _name, (_cls, _kw, _dt, _n, _scale) in FUSED_CONFIGS.items():
    _register(f"fused-{_name}", "fused", _fused_run,
              dict(optimizer=_cls, kwargs=_kw, dtype=_dt, n=_n, scale=_scale, seed=60),
              _fused_inputs, _fused_tiers,
              description=f"fused {_cls} {_kw}, {_dt}, {_n} elements"
                          + (f", GradScaler({_scale})" if _scale else "")
                          + f", {FUSED_STEPS} steps")
