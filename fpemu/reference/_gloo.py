"""Real collectives: ``world`` processes of torch.distributed with the gloo
backend on this CPU, for the collective scenarios of ``fpemu record`` and for
the live test. Needs only NumPy and PyTorch.

:func:`run` spawns the processes, feeds rank ``r`` its own arrays, runs each
requested collective and returns what every rank holds afterwards. Every
process group has a timeout, and the spawn is joined with one too: a peer
that dies or hangs makes the call raise, with the rank and its error.
"""

from __future__ import annotations

import datetime
import gc
import os
import socket
import tempfile

import numpy as np

#: seconds a process group waits for its peers, and the whole run for the processes
TIMEOUT = 120

#: the collectives :func:`run` knows: (name, torch op name or None)
COLLECTIVES = {
    "all_reduce.sum": ("all_reduce", "SUM"),
    "all_reduce.max": ("all_reduce", "MAX"),
    "all_reduce.min": ("all_reduce", "MIN"),
    "all_reduce.avg": ("all_reduce", "AVG"),
    "all_reduce.product": ("all_reduce", "PRODUCT"),
    "reduce_scatter.sum": ("reduce_scatter", "SUM"),
    "reduce_scatter.max": ("reduce_scatter", "MAX"),
    "reduce_scatter.min": ("reduce_scatter", "MIN"),
    "reduce_scatter.avg": ("reduce_scatter", "AVG"),
    "reduce_scatter.product": ("reduce_scatter", "PRODUCT"),
    "all_gather": ("all_gather", None),
}


def _worker(rank, world, init_file, dtypes, arrays, which, out_dir, timeout, die_rank, threads):
    import torch  # optional dependency
    import torch.distributed as dist  # optional dependency
    if threads is not None:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    if rank == die_rank:
        os._exit(3)                 # a peer that dies after joining (tests of that path)
    try:
        res = {}
        for key, x in arrays.items():
            dtype = getattr(torch, dtypes[key])
            for name in which[key]:
                kind, op = COLLECTIVES[name]
                # a copy: a float32 tensor would share the input's memory, and the
                # collective writes into it
                t = _tensor(torch, x[rank], dtype)
                if kind == "all_reduce":
                    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                    got = t
                elif kind == "reduce_scatter":
                    if t.shape[0] % world:
                        continue
                    got = torch.empty((t.shape[0] // world,) + tuple(t.shape[1:]), dtype=dtype)
                    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
                    rs(got, t, op=getattr(dist.ReduceOp, op))
                else:
                    got = torch.empty((t.shape[0] * world,) + tuple(t.shape[1:]), dtype=dtype)
                    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
                    ag(got, t)
                res[f"{name}.{key}"] = _float32(torch, got)
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
    finally:
        dist.destroy_process_group()


def _tensor(torch, x, dtype):
    """Rank ``x`` as a tensor of ``dtype``: float16 and bfloat16 arrays (numpy's
    float16, ml_dtypes' bfloat16) bit for bit, from their codes (NaN payloads
    included: torch's float32 -> bfloat16 cast writes every NaN as 0xffff on
    an AVX-512 CPU), others through torch's cast."""
    x = np.array(x)
    if x.dtype.itemsize == 2 and x.dtype.name == str(dtype).rpartition(".")[2]:
        return torch.from_numpy(x.view(np.int16)).view(dtype).clone()
    return torch.from_numpy(x).to(dtype).clone()


def _float32(torch, t):
    """``t`` widened to float32 exactly, NaN bits included (torch's own
    ``half -> float`` writes a NaN as 0x7fffffff outside its vector loops):
    fp16 and bf16 by integer operations on their codes (fp16: payload << 13;
    bf16: the code in the top 16 bits), the others by ``float()``."""
    if t.dtype == torch.bfloat16:
        h = t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
        return (h << 16).view(np.float32)
    if t.dtype != torch.float16:
        return t.float().numpy().copy()
    h = t.view(torch.int16).numpy().view(np.uint16)
    wide = h.view(np.float16).astype(np.float32)         # finite values: exact
    h = h.astype(np.uint32)
    special = (h & 0x7C00) == 0x7C00
    wide.view(np.uint32)[special] = (((h & 0x8000) << 16) | 0x7F800000
                                     | ((h & 0x3FF) << 13))[special]
    return wide


def _join(ctx, world, what):
    """``ctx.join`` for a second; a rank that died or raised ends the run at
    once (torch stops the others), with the rank named."""
    import torch.multiprocessing as mp  # optional dependency
    try:
        return ctx.join(timeout=1)
    except mp.ProcessExitedException as err:
        raise RuntimeError(f"rank {err.error_index} of the {world} {what} processes exited "
                           f"with code {err.exit_code} before it finished (the others were "
                           "stopped)") from err
    except mp.ProcessRaisedException as err:
        raise RuntimeError(f"rank {err.error_index} of the {world} {what} processes raised:"
                           f"\n{err}") from err


def _spawn(worker, world, make_args, timeout, what):
    """Start ``world`` processes of ``worker(rank, *make_args(tmp))`` (spawned,
    each writing ``rank<r>.npz`` into the temporary folder ``tmp``), wait for
    them at most ``timeout`` seconds and return ``{key: [per rank]}``. A
    process that fails or exits makes ``join`` raise, and torch then ends the
    others; past the deadline every live process is terminated and joined,
    and the call raises: no child is left behind."""
    import torch.multiprocessing as mp  # optional dependency
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(worker, args=make_args(tmp), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
        while not _join(ctx, world, what):
            if datetime.datetime.now() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                for p in ctx.processes:
                    p.join(10)
                raise TimeoutError(f"the {world} {what} processes did not finish within "
                                   f"{timeout} s")
        results = [dict(np.load(os.path.join(tmp, f"rank{r}.npz"))) for r in range(world)]
    # a key of a subgroup's run is in its ranks' files only (rank 0 is in every one)
    return {k: [results[r][k] for r in range(world) if k in results[r]] for k in results[0]}


def run(arrays, dtype_name, which, world, timeout=TIMEOUT, die_rank=None, threads=None):
    """``{f"{collective}.{key}": [rank 0's result, rank 1's, ...]}`` for each
    input ``arrays[key]`` (an array whose first axis is the rank) and each
    collective in ``which`` (names of :data:`COLLECTIVES`), run by ``world``
    gloo processes on tensors of torch dtype ``dtype_name``. ``dtype_name``
    and ``which`` may instead be dicts keyed like ``arrays``: each input in
    a dtype and through collectives of its own, all in one start of the
    processes (which takes seconds). ``die_rank``: that rank exits right
    after joining the group (to test that the others fail instead of
    hanging). ``threads``: each process calls ``torch.set_num_threads(threads)``
    first (else torch's default, one thread per core): the threads of
    ATen's kernels, which split an ``avg``'s division."""
    for key, x in arrays.items():
        if len(x) != world:
            raise ValueError(f"input {key!r} has {len(x)} ranks, the world has {world}")
    dtypes = dtype_name if isinstance(dtype_name, dict) else dict.fromkeys(arrays, dtype_name)
    which = which if isinstance(which, dict) else {key: list(which) for key in arrays}
    for what, given in (("dtype_name", dtypes), ("which", which)):
        if set(given) != set(arrays):
            raise ValueError(f"{what} names inputs {sorted(given)}; the inputs are "
                             f"{sorted(arrays)}: give one entry for each")
    unknown = sorted({w for names in which.values() for w in names if w not in COLLECTIVES})
    if unknown:
        raise ValueError(f"unknown collectives {unknown}; known: {', '.join(COLLECTIVES)}")

    def args(tmp):
        return (world, os.path.join(tmp, "rendezvous"), dtypes, arrays, which, tmp, timeout,
                die_rank, threads)
    return _spawn(_worker, world, args, timeout, "gloo")


# ---------------------------------------------------------------------- DDP
def _ddp_train(torch, cfg, rank, group=None):
    """This rank's local (``no_sync``) and reduced gradients of DDP over the
    process group ``group`` (None: the default one), ``{"local.<it>.<param>":
    ..., "reduced...": ...}``."""
    dtype = getattr(torch, cfg["dtype"])
    model = _mlp(torch, cfg).to(dtype)
    if cfg.get("emulate"):                       # every Linear under an fpemu recipe
        from fpemu.torch import emulate  # imports torch
        emulate(model, cfg["emulate"])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_cap_mb"],
                                                    process_group=group)
    if cfg["hook"] == "powerSGD":
        from torch.distributed.algorithms.ddp_comm_hooks import (  # optional dependency
            powerSGD_hook as psgd,
        )
        ddp.register_comm_hook(psgd.PowerSGDState(group, **cfg["powersgd"]),
                               psgd.powerSGD_hook)
    elif cfg["hook"]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # optional dependency
        ddp.register_comm_hook(group, getattr(default_hooks, cfg["hook"] + "_hook"))
    res = {}
    for it in range(cfg["iterations"]):
        x, y = (t.to(dtype) for t in _batch(torch, cfg, it, rank))
        for sync in (False, True):               # local gradients, then DDP's
            ddp.zero_grad(set_to_none=True)
            if sync:
                ((ddp(x) - y) ** 2).mean().backward()
            else:
                with ddp.no_sync():
                    ((ddp(x) - y) ** 2).mean().backward()
            kind = "reduced" if sync else "local"
            for i, p in enumerate(model.parameters()):
                res[f"{kind}.{it}.{i}"] = p.grad.float().numpy().copy()
    ddp = model = p = None       # noqa: F841 (released, see _release)
    _release()
    return res


def _ddp_worker(rank, world, init_file, cfg, out_dir, timeout, worlds=None):
    import torch  # optional dependency
    import torch.distributed as dist  # optional dependency
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    try:
        if worlds is None:
            res = _ddp_train(torch, cfg, rank)
        else:                    # one DDP per world size, on the group of ranks 0 .. w - 1
            res = {}
            for w in worlds:
                # every rank takes part in this call; the group keeps the timeout
                group = dist.new_group(list(range(w)),
                                       timeout=datetime.timedelta(seconds=timeout))
                if rank < w:
                    res.update({f"w{w}.{k}": v for k, v in _ddp_train(torch, cfg, rank,
                                                                      group).items()})
                dist.barrier()
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
    finally:
        dist.destroy_process_group()


def run_ddp(cfg, world, timeout=TIMEOUT):
    """``world`` gloo processes training ``cfg["widths"]`` (an MLP of Linear and
    ReLU, dtype ``cfg["dtype"]``, seed ``cfg["seed"]``) under
    DistributedDataParallel (``bucket_cap_mb``, comm ``hook`` of
    ``default_hooks``, ``"powerSGD"`` with ``cfg["powersgd"]`` the arguments
    of its state, or None) for ``cfg["iterations"]`` steps of a batch of
    its own: per rank, each iteration's local gradients (``no_sync``) and
    DDP's reduced ones, ``{"local.<it>.<param>": [per rank], "reduced...": ...}``."""
    return _spawn(_ddp_worker, world,
                  lambda tmp: (world, os.path.join(tmp, "rendezvous"), cfg, tmp, timeout),
                  timeout, "DDP")


def run_ddp_worlds(cfg, worlds, timeout=TIMEOUT):
    """:func:`run_ddp` for several world sizes in one start of the processes
    (importing torch takes seconds each): ``max(worlds)`` gloo processes,
    and for each ``w`` in ``worlds`` one DDP on the process group of ranks
    ``0 .. w - 1`` (``new_group``), from the same seed and batches.
    ``{"w<w>.local.<it>.<param>": [w ranks], "w<w>.reduced...": ...}``."""
    worlds = [int(w) for w in worlds]
    if not worlds or min(worlds) < 1:
        raise ValueError(f"worlds must be world sizes >= 1, got {worlds}")
    world = max(worlds)
    return _spawn(_ddp_worker, world,
                  lambda tmp: (world, os.path.join(tmp, "rendezvous"), cfg, tmp, timeout,
                               worlds),
                  timeout, "DDP")


# --------------------------------------------------------------------- FSDP2
def _fsdp_worker(rank, world, init_file, cfg, out_dir, timeout):
    import torch  # optional dependency
    import torch.distributed as dist  # optional dependency
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout))
    try:
        param_dtype = getattr(torch, cfg["param_dtype"])
        reduce_dtype = getattr(torch, cfg["reduce_dtype"])
        model = _mlp(torch, cfg)
        if cfg.get("emulate"):                       # every Linear under an fpemu recipe
            from fpemu.torch import emulate  # imports torch
            emulate(model, cfg["emulate"])
        x, y = _batch(torch, cfg, 0, rank)
        if cfg.get("flavor", "fsdp2") == "fsdp1":
            from torch.distributed.fsdp import (  # optional dependency
                FullyShardedDataParallel, MixedPrecision,
            )
            fsdp = FullyShardedDataParallel(
                model, mixed_precision=MixedPrecision(param_dtype=param_dtype,
                                                      reduce_dtype=reduce_dtype),
                device_id=torch.device("cpu"), use_orig_params=True)
            ((fsdp(x).float() - y) ** 2).mean().backward()
            with FullyShardedDataParallel.summon_full_params(fsdp, with_grads=True):
                res = {f"reduced.{i}": p.grad.float().numpy().copy()
                       for i, p in enumerate(fsdp.parameters())}
        else:
            from torch.distributed.device_mesh import init_device_mesh  # optional dependency
            from torch.distributed.fsdp import (  # optional dependency
                MixedPrecisionPolicy, fully_shard,
            )
            mesh = init_device_mesh("cpu", (world,))
            policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            ((model(x).float() - y) ** 2).mean().backward()
            res = {f"reduced.{i}": p.grad.full_tensor().float().numpy().copy()
                   for i, p in enumerate(model.parameters())}
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
        fsdp = model = None         # noqa: F841 (released, see _release)
        _release()
    finally:
        dist.destroy_process_group()


def _release():
    """Free what still holds the process group (a DDP reducer, FSDP's hooks,
    the parameters they hang on) before ``destroy_process_group``: left to
    the interpreter's end, the group's threads are torn down in whatever
    order finalization takes."""
    gc.collect()


def _mlp(torch, cfg):
    """The float32 MLP of a DDP / FSDP case: Linear and ReLU, seeded."""
    torch.manual_seed(cfg["seed"])
    widths = cfg["widths"]
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _batch(torch, cfg, it, rank):
    g = torch.Generator().manual_seed(1000 * it + rank)
    return (torch.randn(cfg["batch"], cfg["widths"][0], generator=g),
            torch.randn(cfg["batch"], cfg["widths"][-1], generator=g))


def local_grads(cfg, world, dtype_name):
    """Each rank's local gradients of ``cfg``'s MLP, computed in this process
    as FSDP (``param_dtype``) and DeepSpeed's bf16 mode compute them: the model
    and the inputs cast to ``dtype_name``, the loss in float32.
    ``[rank][parameter]``, float32 values."""
    import torch  # optional dependency
    dtype = getattr(torch, dtype_name)
    model = _mlp(torch, cfg).to(dtype)
    out = []
    for rank in range(world):
        model.zero_grad(set_to_none=True)
        x, y = _batch(torch, cfg, 0, rank)
        ((model(x.to(dtype)).float() - y) ** 2).mean().backward()
        out.append([p.grad.float().numpy().copy() for p in model.parameters()])
    return out


def run_fsdp(cfg, world, timeout=TIMEOUT):
    """``world`` gloo processes running one FSDP2 (``fully_shard``) backward
    of ``cfg``'s MLP under ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
    (FSDP1's ``FullyShardedDataParallel`` with ``MixedPrecision`` where
    ``cfg["flavor"]`` is "fsdp1"), each on a batch of its own:
    ``{"reduced.<param>": [per rank]}``, the gradients gathered whole."""
    return _spawn(_fsdp_worker, world,
                  lambda tmp: (world, os.path.join(tmp, "rendezvous"), cfg, tmp, timeout),
                  timeout, "FSDP")


# ---------------------------------------------------------------------- ZeRO
def _deepspeed(rank, world, port, timeout):
    """DeepSpeed's CPU accelerator and a gloo group of ``world`` ranks, this
    process being ``rank``: (deepspeed, torch)."""
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_SIZE=str(world))
    import deepspeed  # optional dependency
    import torch  # optional dependency
    deepspeed.init_distributed(dist_backend="gloo",
                               timeout=datetime.timedelta(seconds=timeout))
    return deepspeed, torch


def _free_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _zero_worker(rank, world, port, cfg, out_dir, timeout):
    deepspeed, torch = _deepspeed(rank, world, port, timeout)
    model = _mlp(torch, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg["ds_config"])
    x, y = _batch(torch, cfg, 0, rank)
    engine.backward(((engine(x.to(torch.bfloat16)).float() - y) ** 2).mean())
    from deepspeed.utils import safe_get_full_grad  # optional dependency
    res = {f"reduced.{i}": safe_get_full_grad(p).float().numpy().copy()
           for i, p in enumerate(engine.module.parameters())}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)


def _zero_train_worker(rank, world, port, cfg, out_dir, timeout):
    deepspeed, torch = _deepspeed(rank, world, port, timeout)
    model = _mlp(torch, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg["ds_config"])
    from deepspeed.utils import safe_get_full_fp32_param  # optional dependency
    res = {}
    for it in range(cfg["steps"]):
        x, y = _batch(torch, cfg, it, rank)
        engine.backward(((engine(x.to(torch.bfloat16)).float() - y) ** 2).mean())
        engine.step()
        for i, p in enumerate(engine.module.parameters()):
            res[f"master.{it}.{i}"] = safe_get_full_fp32_param(p).float().numpy().copy()
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)


def run_zero_training(cfg, world, timeout=TIMEOUT):
    """``world`` processes training ``cfg``'s MLP (bf16) with DeepSpeed ZeRO
    under ``cfg["ds_config"]`` and torch's SGD (``cfg["lr"]``) for
    ``cfg["steps"]`` steps, a batch of its own per rank and step
    (:func:`_batch`): ``{"master.<step>.<param>": [per rank]}``, the fp32
    master weights after each step, gathered whole. Needs DeepSpeed."""
    port = _free_port()
    return _spawn(_zero_train_worker, world, lambda tmp: (world, port, cfg, tmp, timeout),
                  timeout, "DeepSpeed")


def run_zero(cfg, world, timeout=TIMEOUT):
    """``world`` processes running one DeepSpeed backward (DeepSpeed's CPU
    accelerator, gloo) of ``cfg``'s MLP under ``cfg["ds_config"]``, each on a
    batch of its own: ``{"reduced.<param>": [per rank]}``, the reduced
    gradients gathered whole (``safe_get_full_grad``). Needs DeepSpeed."""
    port = _free_port()
    return _spawn(_zero_worker, world, lambda tmp: (world, port, cfg, tmp, timeout), timeout,
                  "DeepSpeed")
