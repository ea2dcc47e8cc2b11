"""Scenarios of loss scaling: GradScaler's state machine driven by injected
inf / NaN gradients, and ``unscale_`` of fp16 and bf16 gradients."""

from __future__ import annotations

import numpy as np

from ._registry import Trace, _register


SCALER_CASES = {
    "pattern": dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=3, pattern="ok ok ok inf ok nan ok ok ok ok ok ok ok"),
    "flt-max-guard": dict(init_scale=2.0**127, growth_factor=2.0, backoff_factor=0.5,
                          growth_interval=1, pattern="ok ok ok ok ok inf ok ok"),
    "backoff-to-zero": dict(init_scale=2.0**-140, growth_factor=2.0, backoff_factor=0.5,
                            growth_interval=2000, pattern=" ".join(["inf"] * 12 + ["ok"] * 3)),
    "growth-1.001": dict(init_scale=1000.0, growth_factor=1.001, backoff_factor=0.5,
                         growth_interval=1, pattern=" ".join(["ok"] * 20 + ["-inf"] + ["ok"] * 5)),
    "odd-factors": dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3,
                        growth_interval=2, pattern="random", steps=40),
}


def _scaler_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    pattern = cfg["pattern"].split()
    if pattern == ["random"]:
        pattern = list(rng.choice(["ok", "ok", "ok", "inf", "nan", "-inf"], cfg["steps"]))
    code = {"ok": 0, "inf": 1, "-inf": 2, "nan": 3}
    return {"pattern": np.array([code[p] for p in pattern], np.int64),
            "grad": rng.standard_normal((len(pattern), 6)).astype(np.float32),
            "p0": rng.standard_normal(6).astype(np.float32)}


def _scaler_run(env, cfg, inputs):
    T = env.T
    tr = Trace(env)
    p = env.tensor(inputs["p0"], requires_grad=True)
    opt = T.optim.SGD([p], lr=0.25, foreach=True)
    scaler = T.amp.GradScaler(env.device, init_scale=cfg["init_scale"],
                              growth_factor=cfg["growth_factor"],
                              backoff_factor=cfg["backoff_factor"],
                              growth_interval=cfg["growth_interval"])
    bad = {1: np.inf, 2: -np.inf, 3: np.nan}
    for k, kind in enumerate(inputs["pattern"]):
        tr.add("scaled_one", scaler.scale(env.tensor(np.float32(1.0))))
        g = inputs["grad"][k] * np.float32(scaler.get_scale())        # the scaled backward
        if kind:
            g[k % g.size] = bad[int(kind)]
        p.grad = env.tensor(g.astype(np.float32))
        scaler.step(opt)
        scaler.update()
        tr.add("grad", p.grad)
        tr.add("p", p)
        tr.add("scale", np.float32(scaler.get_scale()))
        tr.add("tracker", np.int64(scaler._get_growth_tracker()))
    return tr


for _case, _cfg in SCALER_CASES.items():
    _register(f"scaler-{_case}", "scaler", _scaler_run, dict(_cfg, seed=10), _scaler_inputs,
              description="GradScaler state machine driven by injected inf/NaN gradients")


# =================================================================== unscale
UNSCALE_SCALES = (1.0, 65536.0, 2.0**24, 1000.0, 3.0)


def _unscale_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    e3 = np.array([1e-8, 3e-8, 1e-7, 1e-5, 7e4], np.float32)
    mags = np.ldexp(1.0 + rng.random(251), rng.integers(-34, 17, 251))  # 6e-11 .. 1.3e5, no libm
    signs = rng.choice([-1.0, 1.0], 251)
    g = np.concatenate([e3, [0.0, -0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 65504, 65520],
                        signs * mags]).astype(np.float32)
    return {"g": g}


def _unscale_run(env, cfg, inputs):
    """fp16 gradients of an fp32 parameter (the autocast case), scaled by the
    loss scale, widened to the float32 .grad, then unscaled; bfloat16
    gradients of a bfloat16 parameter unscaled in place, through a second
    optimizer. CUDA's unscale kernel has no bfloat16: there the second
    ``unscale_`` raises, ``bf16_unscale_raises`` records it and the bfloat16
    parameter is left alone."""
    T = env.T
    tr = Trace(env)
    s = cfg["scale"]
    g = env.tensor(inputs["g"])
    tr.set("fp16_unscaled", g.to(env.dtype("float16")))         # underflow without a scale
    g16 = (g * s).to(env.dtype("float16"))
    tr.set("fp16_scaled", g16)
    p = env.tensor(np.zeros(g.shape, np.float32), requires_grad=True)
    pb = env.tensor(np.zeros(g.shape, np.float32), dtype="bfloat16", requires_grad=True)
    opt = T.optim.SGD([p], lr=1.0, foreach=True)
    opt_b = T.optim.SGD([pb], lr=1.0, foreach=True)
    scaler = T.amp.GradScaler(env.device, init_scale=s)
    scaler.scale(env.tensor(np.float32(1.0)))
    p.grad = g16.float()
    pb.grad = (g * s).to(env.dtype("bfloat16"))
    scaler.unscale_(opt)
    tr.set("grad_fp32", p.grad)
    try:
        scaler.unscale_(opt_b)
        raised = False
    except NotImplementedError:
        raised = True
    tr.set("bf16_unscale_raises", np.int64(raised))
    if not raised:
        tr.set("grad_bf16", pb.grad)
    scaler.step(opt)
    if not raised:
        scaler.step(opt_b)
    scaler.update()
    tr.set("p_fp32", p)
    if not raised:
        tr.set("p_bf16", pb)
    tr.set("scale_after", np.float32(scaler.get_scale()))
    return tr


for _s in UNSCALE_SCALES:
    _register(f"unscale-{_s:g}", "unscale", _unscale_run, dict(scale=_s, seed=20),
              _unscale_inputs, description="loss scaling of fp16 / bf16 gradients, unscale_, "
                                           "skip on overflow")
