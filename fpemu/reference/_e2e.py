"""End-to-end scenarios: an MLP and small transformers trained for
:data:`E2E_STEPS` steps in fp32, bf16 autocast and fp16 autocast with a
GradScaler."""

from __future__ import annotations

import contextlib

import numpy as np

from ._registry import Trace, _register
from .compare import Tier


E2E_STEPS = 100
# a loss weight that puts the gradients (~1e-3 unweighted) where fp16 underflows
# (below 2^-24): without a large enough loss scale many fp16 gradients are zero;
# Adam's update barely depends on the gradients' scale (eps aside)
LOSS_WEIGHT = 2.0**-14


def _e2e_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    if cfg["model"] == "mlp":
        d_in, hidden, classes = 32, 64, 10
        X = rng.standard_normal((512, d_in)).astype(np.float32)
        proj = rng.standard_normal((d_in, classes))
        logits = 0.5 * rng.standard_normal((512, classes))
        for j in range(d_in):            # in index order: BLAS's order depends on the CPU
            logits = logits + X[:, j:j + 1].astype(np.float64) * proj[j]
        y = np.argmax(logits, 1)
        return {"X": X, "y": y.astype(np.int64),
                "w1": (rng.standard_normal((hidden, d_in)) / np.sqrt(d_in)).astype(np.float32),
                "b1": np.zeros(hidden, np.float32),
                "w2": (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(
                    np.float32),
                "b2": np.zeros(classes, np.float32)}
    # the SDPA transformer: one head of 64 (the head dim of the fused kernels'
    # fitted launches, docs/pytorch-numerics.md §11) over 16 tokens
    d, t, classes = (64, 16, 4) if cfg["model"] == "sdpa" else (32, 8, 4)
    X = rng.standard_normal((128, t, d)).astype(np.float32)
    y = (X[:, :, 0].mean(1) > 0).astype(np.int64) + 2 * (X[:, -1, 1] > 0).astype(np.int64)
    w = {}
    for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                        ("w1", (2 * d, d)), ("w2", (d, 2 * d)), ("wh", (classes, d))):
        w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    for name, n in (("ln1_w", d), ("ln2_w", d)):
        w[name] = np.ones(n, np.float32)
    for name, n in (("ln1_b", d), ("ln2_b", d), ("b1", 2 * d), ("b2", d), ("bh", classes)):
        w[name] = np.zeros(n, np.float32)
    return dict(w, X=X, y=y)


def _mlp_loss(env, P, xb, yb):
    F = env.T.nn.functional
    h = env.T.relu(F.linear(xb, P["w1"], P["b1"]))
    return F.cross_entropy(F.linear(h, P["w2"], P["b2"]), yb)


def _transformer_loss(env, P, xb, yb):
    T, F = env.T, env.T.nn.functional
    B, L, d = xb.shape
    heads, hd = 2, d // 2
    h = F.layer_norm(xb, (d,), P["ln1_w"], P["ln1_b"])

    def split(z):
        return z.reshape(B, L, heads, hd).transpose(1, 2)
    q, k, v = (split(F.linear(h, P[n])) for n in ("wq", "wk", "wv"))
    att = T.softmax((q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, L, d)
    x = xb + F.linear(y, P["wo"])
    h2 = F.layer_norm(x, (d,), P["ln2_w"], P["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h2, P["w1"], P["b1"])), P["w2"], P["b2"])
    return F.cross_entropy(F.linear(x.mean(1), P["wh"], P["bh"]), yb)


def _flash_only(env):
    """Attention restricted to the flash kernel where the device has it (CUDA,
    16-bit inputs); the CPU runs what torch picks for these shapes (its own
    flash kernel)."""
    if env.device != "cuda":
        return contextlib.nullcontext()
    if env.backend == "torch":
        from torch.nn.attention import SDPBackend, sdpa_kernel    # (local: torch is optional)
    else:
        SDPBackend, sdpa_kernel = env.T.nn.functional.SDPBackend, env.T.nn.functional.sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _sdpa_loss(env, P, xb, yb):
    """The transformer block of :func:`_transformer_loss` with one head of 64
    and its attention through ``scaled_dot_product_attention`` (flash)."""
    F = env.T.nn.functional
    B, L, d = xb.shape
    h = F.layer_norm(xb, (d,), P["ln1_w"], P["ln1_b"])
    q, k, v = (F.linear(h, P[n]).reshape(B, 1, L, d) for n in ("wq", "wk", "wv"))
    with _flash_only(env):
        y = F.scaled_dot_product_attention(q, k, v).reshape(B, L, d)
    x = xb + F.linear(y, P["wo"])
    h2 = F.layer_norm(x, (d,), P["ln2_w"], P["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h2, P["w1"], P["b1"])), P["w2"], P["b2"])
    return F.cross_entropy(F.linear(x.mean(1), P["wh"], P["bh"]), yb)


def _e2e_run(env, cfg, inputs):
    """Train for E2E_STEPS steps with AdamW (foreach): fp32, bf16 autocast, or
    fp16 autocast with a GradScaler; record the loss, the loss scale and the
    fraction of gradient entries that are exactly zero (after backward, before
    unscaling)."""
    T = env.T
    tr = Trace(env)
    P = {k: env.tensor(v, requires_grad=True) for k, v in inputs.items() if k not in ("X", "y")}
    opt = T.optim.AdamW(list(P.values()), lr=3e-3, foreach=True)
    mode = cfg["precision"]
    # the scale starts at 1 so that fp16 gradients underflow at first and the
    # zero fraction falls as the scale grows (x2 every 10 clean steps)
    scaler = (T.amp.GradScaler(env.device, init_scale=1.0, growth_interval=10)
              if mode == "fp16" else None)
    loss_fn = {"mlp": _mlp_loss, "transformer": _transformer_loss,
               "sdpa": _sdpa_loss}[cfg["model"]]
    X, y = inputs["X"], inputs["y"]
    batch = 64 if cfg["model"] == "mlp" else 16
    for step in range(E2E_STEPS):
        lo = (step * batch) % len(X)
        xb, yb = env.tensor(X[lo:lo + batch]), env.tensor(y[lo:lo + batch])
        with env.step(step):                 # (fpemu record --ops records chosen steps)
            opt.zero_grad()
            if mode == "fp32":
                loss = loss_fn(env, P, xb, yb)
            else:
                with T.autocast(device_type=env.device, dtype=env.dtype(
                        "bfloat16" if mode == "bf16" else "float16")):
                    loss = loss_fn(env, P, xb, yb)
            weighted = loss * LOSS_WEIGHT
            (scaler.scale(weighted) if scaler else weighted).backward()
            grads = [env.array(p.grad) for p in P.values()]
            tr.add("zero_grad_fraction", np.float64(
                sum(int((g == 0).sum()) for g in grads) / sum(g.size for g in grads)))
            tr.add("loss", loss.float())
            if scaler:
                scaler.step(opt)
                scaler.update()
                tr.add("scale", np.float32(scaler.get_scale()))
            else:
                opt.step()
    return tr


def _e2e_tiers(cfg, profile):
    why = ("matmuls accumulate in cuBLAS / MKL order (fpemu: the GPU's tensor-core model for "
           "bf16 / fp16 on CUDA, fp32 adds in index order otherwise), "
           "reductions have their own order, and exp / log / tanh / erf come from the "
           "device's library (docs/pytorch-numerics.md §6 E10-E12); the differences feed back "
           "through 100 steps of training")
    # bounds: about 4x the largest deviation measured against torch 2.13 CPU over
    # the 100 steps (absolute loss difference, MLP / transformer: fp32 2.4e-7 /
    # 2.4e-7, bf16 6.5e-4 / 2.5e-3, fp16 8.5e-5 / 4.9e-3; zero fraction 2.5e-3).
    # Absolute, because the losses fall to 0.01 where relative errors balloon.
    loss_bound = {"fp32": 1e-6, "bf16": 1e-2, "fp16": 2e-2}[cfg["precision"]]
    return {"loss": Tier("abs", loss_bound, why),
            "zero_grad_fraction": Tier("abs", 0.01, why),
            "scale": Tier("rel", 1.0, why + "; the loss scale halves on an overflow that one "
                                            "ulp can decide, so one factor of 2 is allowed")}


for _m in ("mlp", "transformer"):
    for _prec in ("fp32", "bf16", "fp16"):
        _register(f"e2e-{_m}-{_prec}", "e2e", _e2e_run,
                  dict(model=_m, precision=_prec, seed=50), _e2e_inputs,
                  _e2e_tiers, description=f"{_m} trained {E2E_STEPS} steps, {_prec}",
                  host_dependent={"out.*": "training runs PyTorch's matmuls (MKL / oneDNN), "
                                           "reductions and exp / log / tanh / erf, whose bits "
                                           "depend on the CPU and the thread count"})
# the transformer with its attention in scaled_dot_product_attention: flash on
# the GPU, in bf16 (the flash kernel takes no float32; an fp16 run with a loss
# scale starting at 1 sits at fp16's underflow, where its zero fraction moved by
# 0.06 against torch's CPU: a judge of chaos, not of the attention kernel)
for _prec in ("bf16",):
    _register(f"e2e-sdpa-{_prec}", "e2e", _e2e_run,
              dict(model="sdpa", precision=_prec, seed=51), _e2e_inputs, _e2e_tiers,
              description=f"SDPA transformer (flash attention on CUDA) trained {E2E_STEPS} "
                          f"steps, {_prec}",
              host_dependent={"out.*": "training runs PyTorch's matmuls (MKL / oneDNN), "
                                       "reductions, its CPU attention kernel and exp / log / "
                                       "erf, whose bits depend on the CPU and the thread "
                                       "count"})
