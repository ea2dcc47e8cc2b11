"""Scenarios of distributed training, each against real ``torch.distributed``
processes over gloo on this CPU (:mod:`fpemu.reference._gloo`): the
collectives, DistributedDataParallel, FSDP2 / FSDP1 and DeepSpeed ZeRO.

The replays use :mod:`fpemu.collectives` and :mod:`fpemu.autograd`, which
load Numba; recording needs only NumPy and PyTorch, so they are imported when
a replay runs (:func:`_replay_collectives`, :func:`_zero_train_run`).
"""

from __future__ import annotations

import numpy as np

from . import _gloo
from ._registry import Trace, _register
from .compare import Tier


def _replay_collectives():
    """:mod:`fpemu.collectives`, for the replays (local: it loads Numba)."""
    from .. import collectives
    return collectives


# Real torch.distributed collectives, gloo backend, `world` processes on this
# CPU (fpemu/reference/_gloo.py), against fpemu.collectives' gloo model. The
# inputs are exact values of the dtype (integer significands scaled by powers
# of two) with zeros of both signs, infinities, NaNs on some ranks and, in
# fp16, sums that overflow; the sizes reach every remainder of gloo's ring
# segments (the many-segment case, over 2 * world MiB, runs live in
# tests/test_collectives.py instead of being committed).
COLLECTIVE_OPS = ("all_reduce.sum", "all_reduce.max", "all_reduce.min", "reduce_scatter.sum",
                  "all_gather")
_WIRE = {"float32": ("fp32", 24), "bfloat16": ("bf16", 8), "float16": ("fp16", 11)}


def _collective_inputs(env, cfg):
    world = cfg["world"]
    fmt, p = _WIRE[cfg["dtype"]]
    rng = np.random.default_rng(cfg["seed"])
    out = {}
    for n in (1, 7, 100, 999, world * 250):
        m = rng.integers(-(2 ** p - 1), 2 ** p, size=(world, n))
        e = rng.integers(-10, 11, size=(world, n)) - p
        x = np.ldexp(m.astype(np.float64), e).astype(np.float32)
        if n >= 100:
            flat = x.reshape(-1)
            pos = rng.choice(flat.size, size=24, replace=False)
            flat[pos[:4]] = np.nan
            flat[pos[4:8]] = np.inf
            flat[pos[8:12]] = -np.inf
            flat[pos[12:16]] = -0.0
            flat[pos[16:20]] = 0.0
            if fmt == "fp16":
                flat[pos[20:24]] = 60000.0            # two of them in one sum overflow
            x[:, 0] = -0.0                          # -0 on every rank: the sum is -0
            x[0, 1], x[1:, 1] = -0.0, 0.0
            x[0, 2] = np.nan                         # on rank 0 only
        out[f"n{n}"] = x
    return out


def _collective_run(env, cfg, inputs):
    tr = Trace(env)
    world = cfg["world"]
    if env.backend == "torch":
        got = _gloo.run(inputs, cfg["dtype"], COLLECTIVE_OPS, world)
    else:
        collectives = _replay_collectives()
        fmt = _WIRE[cfg["dtype"]][0]
        got = {}
        for key, x in inputs.items():
            for name in COLLECTIVE_OPS:
                kind, _, op = name.partition(".")
                if kind == "reduce_scatter" and x.shape[1] % world:
                    continue
                fn = getattr(collectives, kind)
                got[f"{name}.{key}"] = fn(list(x), fmt, op) if op else fn(list(x), fmt)
    for key in sorted(got):
        tr.set(key, np.stack(got[key]), "float32")
    return tr


for _dt, _worlds in (("bfloat16", (2, 3, 4, 8)), ("float16", (3, 4)), ("float32", (4,))):
    for _w in _worlds:
        _register(f"collectives-gloo-{_dt}-w{_w}", "collectives", _collective_run,
                  dict(dtype=_dt, world=_w, seed=60 + _w), _collective_inputs,
                  description=f"gloo all_reduce / reduce_scatter_tensor / "
                              f"all_gather_into_tensor of {_dt} over {_w} processes")


# ======================================================================= DDP
# Real DistributedDataParallel, gloo, on this CPU (fpemu/reference/_gloo.py):
# an MLP, each rank its own batch, for three iterations (the first all-reduce
# runs one bucket in registration order, the later ones the rebuilt buckets).
# Inputs: each rank's local gradients (DDP's no_sync); outputs: the gradients
# DDP leaves, which fpemu.collectives.ddp_all_reduce computes from those inputs.
# Small bucket caps split these small models into several buckets.
DDP_CASES = {
    "ddp-gloo-fp32-w3": dict(dtype="float32", world=3, hook=None, bucket_cap_mb=0.01),
    "ddp-gloo-fp32-w2-cap25": dict(dtype="float32", world=2, hook=None, bucket_cap_mb=25),
    "ddp-gloo-bf16-w3": dict(dtype="bfloat16", world=3, hook=None, bucket_cap_mb=0.004),
    "ddp-gloo-fp32-w4-fp16-compress": dict(dtype="float32", world=4, hook="fp16_compress",
                                           bucket_cap_mb=0.01),
    # PowerSGD from the third iteration on: rank 1 (Gram-Schmidt) and rank 4 (QR); one
    # bucket, as torch's hook over gloo aborts with several (the buckets' collectives
    # interleave: "Received data size doesn't match expected size", torch 2.13)
    "ddp-gloo-fp32-w3-powersgd-r1": dict(dtype="float32", world=3, hook="powerSGD",
                                         bucket_cap_mb=25, iterations=5,
                                         powersgd=dict(matrix_approximation_rank=1,
                                                       start_powerSGD_iter=2)),
    "ddp-gloo-fp32-w4-powersgd-r4": dict(dtype="float32", world=4, hook="powerSGD",
                                         bucket_cap_mb=25, iterations=5,
                                         powersgd=dict(matrix_approximation_rank=4,
                                                       start_powerSGD_iter=2)),
}
_DDP_MODEL = dict(widths=[40, 64, 64, 8], batch=8, iterations=3, seed=70)


def _ddp_inputs(env, cfg):
    got = _gloo.run_ddp(cfg, cfg["world"])
    _DDP_RECORDED[cfg["name"]] = got
    return {k: np.stack(v) for k, v in got.items() if k.startswith("local.")}


#: the torch side of a DDP scenario, from the run that made its inputs
_DDP_RECORDED = {}


def _ddp_run(env, cfg, inputs):
    tr = Trace(env)
    n = sum(1 for k in inputs if k.startswith("local.0."))
    if env.backend == "torch":
        got = _DDP_RECORDED.pop(cfg["name"], None)
        if got is None:
            got = _gloo.run_ddp(cfg, cfg["world"])
        for key in sorted(got):
            if key.startswith("reduced."):
                tr.set(key, np.stack(got[key]), "float32")
        return tr
    collectives = _replay_collectives()
    fmt = {"float32": "fp32", "bfloat16": "bf16"}[cfg["dtype"]]
    state = collectives.PowerSGDState(**cfg["powersgd"]) if cfg["hook"] == "powerSGD" else None
    for it in range(cfg["iterations"]):
        grads = [[inputs[f"local.{it}.{i}"][r] for i in range(n)] for r in range(cfg["world"])]
        red = collectives.ddp_all_reduce(grads, fmt, "gloo", iteration=min(it, 1),
                                         hook=cfg["hook"], bucket_cap_mb=cfg["bucket_cap_mb"],
                                         state=state)
        for i in range(n):
            tr.set(f"reduced.{it}.{i}", np.stack([red[i]] * cfg["world"]), "float32")
    return tr


def _powersgd_tiers(cfg, profile):
    """PowerSGD's compressed iterations: within float32 rounding of torch's."""
    why = ("PowerSGD's products M·Q, Mᵀ·P and P·Qᵀ, its norms and its QR run in float32 in "
           "torch's MKL and LAPACK and in fpemu's NumPy, in different orders; on the recorded "
           "steps the reduced gradients agree to 1e-7 to 7e-7 normwise (max |Δ| 1.9e-8 for "
           "gradients up to 0.08), the error feedback carrying the differences from step to "
           "step. Bound: 1e-7 absolute (5x the largest seen). The iterations before "
           "start_powerSGD_iter and the gradients PowerSGD leaves uncompressed are bit-exact")
    n = 2 * (len(cfg["widths"]) - 1)
    return {f"reduced.{it}.{i}": Tier("abs", 1e-7, why)
            for it in range(cfg["powersgd"]["start_powerSGD_iter"], cfg["iterations"])
            for i in range(n)}


_MKL_GRADS = ("the local gradients come from PyTorch's matmuls (MKL), whose bits depend on the "
              "CPU and the thread count")
for _name, _cfg in DDP_CASES.items():
    _psgd = _cfg["hook"] == "powerSGD"
    _register(_name, "ddp", _ddp_run, dict(_DDP_MODEL, name=_name, **_cfg), _ddp_inputs,
              tiers=_powersgd_tiers if _psgd else None,
              description=f"DistributedDataParallel over {_cfg['world']} gloo processes, "
                          f"{_cfg['dtype']}, hook {_cfg['hook']}, bucket_cap_mb "
                          f"{_cfg['bucket_cap_mb']}"
                          + (f", PowerSGD {_cfg['powersgd']}" if _psgd else ""),
              host_dependent=dict({"in.*": _MKL_GRADS}, **(
                  {"out.*": "PowerSGD's products run in MKL in torch"} if _psgd else {})))


# ===================================================================== FSDP
# Real FSDP2 (fully_shard with a MixedPrecisionPolicy) and FSDP1
# (FullyShardedDataParallel with MixedPrecision), gloo, on this CPU: one
# backward of an MLP whose first dimensions do not divide by the world (padded
# shards). Inputs: each rank's unsharded local gradients, computed in the
# recording process as FSDP2 computes them (parameters and inputs cast to
# param_dtype); outputs: the reduced gradients FSDP2 leaves, gathered whole.
FSDP_CASES = {
    "fsdp2-gloo-bf16-reduce-fp32-w3": dict(param_dtype="bfloat16", reduce_dtype="float32",
                                           world=3),
    "fsdp2-gloo-bf16-reduce-bf16-w3": dict(param_dtype="bfloat16", reduce_dtype="bfloat16",
                                           world=3),
    "fsdp2-gloo-bf16-reduce-fp16-w4": dict(param_dtype="bfloat16", reduce_dtype="float16",
                                           world=4),
    "fsdp1-gloo-bf16-reduce-fp32-w3": dict(param_dtype="bfloat16", reduce_dtype="float32",
                                           world=3, flavor="fsdp1"),
    "fsdp1-gloo-bf16-reduce-bf16-w4": dict(param_dtype="bfloat16", reduce_dtype="bfloat16",
                                           world=4, flavor="fsdp1"),
}
_FSDP_MODEL = dict(widths=[40, 64, 64, 8], batch=8, seed=80)


def _local_inputs(cfg, dtype_name):
    """The ranks' local gradients as inputs, ``local.<param>``: rank x shape."""
    local = _gloo.local_grads(cfg, cfg["world"], dtype_name)
    return {f"local.{i}": np.stack([local[r][i] for r in range(cfg["world"])])
            for i in range(len(local[0]))}


def _one_step_run(env, cfg, inputs, run_torch, reduce):
    """One backward's reduced gradients: recorded from ``run_torch(cfg)`` (the
    real processes), replayed with ``reduce(grads)`` from the local ones."""
    tr = Trace(env)
    if env.backend == "torch":
        got = run_torch(cfg)
        for key in sorted(got):
            tr.set(key, np.stack(got[key]), "float32")
        return tr
    n = len(inputs)
    red = reduce([[inputs[f"local.{i}"][r] for i in range(n)] for r in range(cfg["world"])])
    for i in range(n):
        tr.set(f"reduced.{i}", np.stack([red[i]] * cfg["world"]), "float32")
    return tr


def _fsdp_inputs(env, cfg):
    return _local_inputs(cfg, cfg["param_dtype"])


def _fsdp_run(env, cfg, inputs):
    collectives = _replay_collectives()
    fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[cfg["reduce_dtype"]]
    reduce = (collectives.fsdp1_reduce_scatter if cfg.get("flavor") == "fsdp1"
              else collectives.fsdp_reduce_scatter)
    return _one_step_run(env, cfg, inputs, lambda c: _gloo.run_fsdp(c, c["world"]),
                         lambda grads: reduce(grads, fmt, "gloo"))


for _name, _cfg in FSDP_CASES.items():
    _register(_name, "fsdp", _fsdp_run, dict(_FSDP_MODEL, **_cfg), _fsdp_inputs,
              description=f"{_cfg.get('flavor', 'fsdp2').upper()} over {_cfg['world']} gloo "
                          f"processes, param_dtype {_cfg['param_dtype']}, reduce_dtype "
                          f"{_cfg['reduce_dtype']}",
              host_dependent={"in.*": "the local gradients come from PyTorch's bf16 matmuls "
                                      "(oneDNN / MKL), whose bits depend on the CPU"})


# ====================================================================== ZeRO
# Real DeepSpeed ZeRO (0.19.8, its CPU accelerator, gloo) on this CPU: one
# backward of the MLP of the FSDP cases in bf16. Recording needs DeepSpeed
# (pip install deepspeed==0.19.8); the replay does not. Inputs: the ranks'
# local bf16 gradients, computed in the recording process; outputs: the
# gradients ZeRO leaves, gathered whole.
_ZERO_BASE = {"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
              "zero_allow_untested_optimizer": True}
ZERO_CASES = {
    "zero-gloo-stage1-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 1})),
    "zero-gloo-stage2-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 2})),
    "zero-gloo-stage2-bf16-comm-fp32-w4": dict(world=4, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 2}, communication_data_type="fp32")),
    "zero-gloo-stage3-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 3})),
    # three buckets: [b3, w3, b2], [w2], [b1, w1] in the order the gradients become ready
    "zero-gloo-stage3-bf16-buckets-w3": dict(world=3, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3, "reduce_bucket_size": 3000})),
    "zero-gloo-stage3-bf16-comm-fp32-w4": dict(world=4, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3}, communication_data_type="fp32")),
}


def _zero_inputs(env, cfg):
    return _local_inputs(cfg, "bfloat16")


def _zero_run(env, cfg, inputs):
    collectives = _replay_collectives()
    return _one_step_run(env, cfg, inputs, lambda c: _gloo.run_zero(c, c["world"]),
                         lambda grads: collectives.zero_reduce(grads, cfg["ds_config"], "gloo"))


# DeepSpeed ZeRO training steps (torch's SGD on the fp32 masters), replayed by
# fpemu.autograd's EmulatedZeRO from the initial weights and the batches: the
# ranks' local bf16 gradients are fpemu's own here, not recorded.
ZERO_TRAIN_CASES = {
    "zero-train-stage2-bf16-w3": dict(world=3, steps=3, lr=0.5, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 2})),
    "zero-train-stage3-bf16-w3": dict(world=3, steps=3, lr=0.5, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3})),
}


def _zero_train_inputs(env, cfg):
    """The MLP's initial float32 weights (``w.<param>``) and every step's
    batches (``x.<step>``, ``y.<step>``: rank x batch), made with torch as the
    recording processes make them."""
    import torch        # (local: recording's optional dependency)
    out = {f"w.{i}": p.detach().numpy().copy()
           for i, p in enumerate(_gloo._mlp(torch, cfg).parameters())}
    for it in range(cfg["steps"]):
        xs, ys = zip(*(_gloo._batch(torch, cfg, it, r) for r in range(cfg["world"])))
        out[f"x.{it}"] = np.stack([x.numpy() for x in xs])
        out[f"y.{it}"] = np.stack([y.numpy() for y in ys])
    return out


def _zero_train_run(env, cfg, inputs):
    tr = Trace(env)
    if env.backend == "torch":
        got = _gloo.run_zero_training(cfg, cfg["world"])
        for key in sorted(got):
            tr.set(key, np.stack(got[key]), "float32")
        return tr
    from ..autograd.distributed import EmulatedZeRO     # (local: fpemu.autograd loads Numba)
    T = env.T
    widths, layers = cfg["widths"], []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [T.nn.Linear(a, b), T.nn.ReLU()]
    model = T.nn.Sequential(*layers[:-1])
    with T.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(T.tensor(inputs[f"w.{i}"]))
    zero = EmulatedZeRO(model, cfg["world"], cfg["ds_config"])
    opt = T.optim.SGD(model.parameters(), lr=cfg["lr"])
    for it in range(cfg["steps"]):
        batches = [(T.tensor(inputs[f"x.{it}"][r]), T.tensor(inputs[f"y.{it}"][r]))
                   for r in range(cfg["world"])]
        zero.backward(lambda m, x, y: ((m(x.to(T.bfloat16)).float() - y) ** 2).mean(), batches)
        zero.step(opt)
        for i, p in enumerate(model.parameters()):
            tr.set(f"master.{it}.{i}", np.stack([p.detach().numpy()] * cfg["world"]),
                   "float32")
    return tr


for _name, _cfg in ZERO_TRAIN_CASES.items():
    _register(_name, "zero", _zero_train_run, dict(_FSDP_MODEL, **_cfg), _zero_train_inputs,
              description=f"DeepSpeed ZeRO training, {_cfg['steps']} SGD steps over "
                          f"{_cfg['world']} gloo processes: {_cfg['ds_config']}")


for _name, _cfg in ZERO_CASES.items():
    _register(_name, "zero", _zero_run, dict(_FSDP_MODEL, **_cfg), _zero_inputs,
              description=f"DeepSpeed ZeRO over {_cfg['world']} gloo processes: "
                          f"{_cfg['ds_config']}",
              host_dependent={"in.*": "the local gradients come from PyTorch's bf16 matmuls "
                                      "(oneDNN / MKL), whose bits depend on the CPU"})
