"""``torch.distributed``: fpemu emulates one device in one process. The names
exist so that programs which only *test* for a distributed run work; starting
one raises. :class:`EmulatedDDP`, :class:`EmulatedFSDP` and
:class:`EmulatedZeRO` emulate N data-parallel ranks in this one process
instead (DistributedDataParallel's gradient all-reduce, FSDP's mixed-precision
reduce-scatter, DeepSpeed ZeRO's reduction and loss scale:
:mod:`fpemu.collectives`)."""

import copy

import numpy as np

from .. import collectives
from ..collectives import DDP_HOOKS, PowerSGDState
from ..errors import FpemuNotImplementedError, FpemuRuntimeError, FpemuValueError
from ._core import no_grad, tensor


def is_available():
    return False


def is_initialized():
    return False


def get_rank():
    return 0


def get_world_size():
    return 1


def init_process_group(*args, **kwargs):
    raise FpemuNotImplementedError("fpemu emulates a single device in one process; "
                                   "distributed training (init_process_group) is not emulated. "
                                   "Run the program without torchrun / RANK set, or emulate N "
                                   "data-parallel ranks with "
                                   "fpemu.autograd.distributed.EmulatedDDP(model, world_size=N).")


def destroy_process_group(*args, **kwargs):
    return None


def barrier(*args, **kwargs):
    return None


def all_reduce(tensor, *args, **kwargs):
    return tensor


_FORMATS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _world_and_params(who, module, world_size):
    """``world_size`` checked, and the module's trainable parameters, which
    must share one dtype."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise FpemuValueError(f"{who}: world_size must be an int >= 2, got {world_size!r}")
    params = [p for p in module.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise FpemuValueError(f"{who}: the parameters must share one dtype (DDP and FSDP "
                              f"bucket each dtype apart; not emulated), got "
                              f"{sorted(str(d) for d in dtypes)}")
    return params


def _format_of(dtype):
    """fpemu's name of a float32 / bfloat16 / float16 dtype, else None."""
    return _FORMATS.get(str(dtype).replace("torch.", ""))


def _local_gradients(who, world_size, forward, params, loss_fn, batches):
    """Each rank's loss on its batch and its local gradients of ``params``
    (float32 arrays), one rank after the other on the same module."""
    if len(batches) != world_size:
        raise FpemuValueError(f"{who}.backward(): one batch per rank: the world has "
                              f"{world_size} ranks, got {len(batches)} batches")
    local, losses = [], []
    for batch in batches:
        for p in params:
            p.grad = None
        loss = loss_fn(forward, *(batch if isinstance(batch, tuple) else (batch,)))
        loss.backward()
        losses.append(float(loss.item()))
        local.append([p.grad.detach().float().numpy().copy() for p in params])
    return local, losses


def _set_grads(params, grads):
    for p, g in zip(params, grads):
        p.grad = tensor(g).to(p.dtype)


class EmulatedDDP:
    """DistributedDataParallel over ``world_size`` ranks, emulated in this process.

    Every rank holds the same parameters (DDP keeps them equal), so one module
    serves them all: :meth:`backward` runs each rank's forward and backward on
    its own batch in turn, keeps each rank's local gradients, and then leaves
    in the parameters' ``.grad`` what every rank would hold after DDP's
    all-reduce (:func:`fpemu.collectives.ddp_all_reduce`: DDP's buckets, its
    1/world product or a compression hook, and the collective ``algorithm``
    with its parameters). The optimizer then steps as usual.

    Example::

        ddp = EmulatedDDP(model, world_size=4)
        losses = ddp.backward(lambda m, x, y: F.cross_entropy(m(x), y), batches)
        opt.step()

    ``batches`` holds one batch per rank: a tuple of ``loss_fn``'s arguments
    after the module. The first call is DDP's first all-reducing backward (one
    bucket, registration order), later ones use the rebuilt buckets in
    ``ready_order`` (default: the reverse of registration, the order of a
    chain of layers). ``hook`` is one of DDP's communication hooks
    (``fp16_compress``, ``bf16_compress``, ``powerSGD`` with ``state=`` a
    :class:`fpemu.collectives.PowerSGDState`, by default one with torch's
    defaults).
    """

    def __init__(self, module, world_size, *, algorithm="gloo", hook=None, bucket_cap_mb=None,
                 ready_order=None, state=None, **collective_params):
        params = _world_and_params("EmulatedDDP", module, world_size)
        if hook not in DDP_HOOKS:
            raise FpemuValueError(f"EmulatedDDP: unknown hook {hook!r}; the hooks are "
                                  f"{', '.join(map(repr, DDP_HOOKS))}")
        self.module = module
        self.world_size = world_size
        self.algorithm = algorithm
        self.hook = hook
        #: the hook's state: hook="powerSGD" takes a PowerSGDState (default: torch's defaults)
        self.state = (state if state is not None else PowerSGDState()) \
            if hook == "powerSGD" else state
        self.bucket_cap_mb = bucket_cap_mb
        self.ready_order = ready_order
        self.collective_params = collective_params
        self.iteration = 0
        self.params = params
        self.fmt = _format_of(params[0].dtype)
        if self.fmt is None:
            raise FpemuValueError(f"EmulatedDDP: DDP's gradients here are float32, bfloat16 "
                                  f"or float16, got {params[0].dtype}")

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss_fn, batches):
        """Each rank's loss on its batch (floats); the parameters' ``.grad``
        become what every rank holds after DDP's all-reduce."""
        local, losses = _local_gradients("EmulatedDDP", self.world_size, self.module,
                                         self.params, loss_fn, batches)
        _set_grads(self.params, collectives.ddp_all_reduce(
            local, self.fmt, self.algorithm, iteration=min(self.iteration, 1), hook=self.hook,
            ready_order=self.ready_order, bucket_cap_mb=self.bucket_cap_mb, state=self.state,
            **self.collective_params))
        self.iteration += 1
        return losses


class EmulatedFSDP:
    """FSDP2 (``fully_shard`` with ``MixedPrecisionPolicy(param_dtype,
    reduce_dtype)``) over ``world_size`` ranks, emulated in this process.

    ``module`` holds the full-precision parameters (FSDP2's sharded ones,
    here unsharded: every rank updates its shard with the same numbers).
    :meth:`backward` casts them to ``param_dtype`` (the all-gather moves
    copies), runs each rank's forward (its floating inputs cast to
    ``param_dtype``, as ``cast_forward_inputs`` does) and backward on its own
    batch, then leaves in the parameters' ``.grad`` what FSDP2's
    reduce-scatter gives (:func:`fpemu.collectives.fsdp_reduce_scatter`:
    ``reduce_dtype``, its layout of padded shards, its division). The
    optimizer then steps on the full-precision parameters. ``flavor="fsdp1"``
    emulates FSDP1's ``FullyShardedDataParallel`` with ``MixedPrecision``
    instead (one flat parameter, its pre- and post-divide factors:
    :func:`fpemu.collectives.fsdp1_reduce_scatter`).
    """

    def __init__(self, module, world_size, *, param_dtype=None, reduce_dtype=None,
                 algorithm="gloo", flavor="fsdp2", **collective_params):
        self.params = _world_and_params("EmulatedFSDP", module, world_size)
        if flavor not in ("fsdp2", "fsdp1"):
            raise FpemuValueError(f"EmulatedFSDP: flavor must be 'fsdp2' (fully_shard) or "
                                  f"'fsdp1' (FullyShardedDataParallel), got {flavor!r}")
        self.flavor = flavor
        self.module = module
        self.world_size = world_size
        self.orig_dtype = self.params[0].dtype
        self.param_dtype = param_dtype or self.orig_dtype
        self.reduce_dtype = reduce_dtype or self.param_dtype
        fmts = [_format_of(d) for d in (self.orig_dtype, self.param_dtype, self.reduce_dtype)]
        if None in fmts:
            raise FpemuValueError(f"EmulatedFSDP: the dtypes must be float32, bfloat16 or "
                                  f"float16, got parameters {self.orig_dtype}, param_dtype "
                                  f"{self.param_dtype}, reduce_dtype {self.reduce_dtype}")
        self.orig_fmt, _, self.reduce_fmt = fmts
        self.algorithm = algorithm
        self.collective_params = collective_params

    def backward(self, loss_fn, batches):
        """Each rank's loss on its batch (floats); the parameters' ``.grad``
        become FSDP2's reduced gradients (the full-precision dtype)."""

        compute = copy.deepcopy(self.module).to(self.param_dtype)
        cparams = [p for p in compute.parameters() if p.requires_grad]
        dtype = self.param_dtype

        def forward(*args, **kwargs):
            cast = [a.to(dtype) if hasattr(a, "is_floating_point") and a.is_floating_point()
                    else a for a in args]
            return compute(*cast, **kwargs)

        local, losses = _local_gradients("EmulatedFSDP", self.world_size, forward, cparams,
                                         loss_fn, batches)
        reduce = (collectives.fsdp1_reduce_scatter if self.flavor == "fsdp1"
                  else collectives.fsdp_reduce_scatter)
        _set_grads(self.params, reduce(local, self.reduce_fmt, self.algorithm,
                                       orig_fmt=self.orig_fmt, **self.collective_params))
        return losses


class EmulatedZeRO:
    """DeepSpeed ZeRO (stages 1, 2 and 3; ``bf16`` or ``fp16`` with its
    dynamic loss scale) over ``world_size`` ranks, emulated in this process,
    configured by the DeepSpeed JSON the user writes.

    ``module`` holds the float32 master weights (DeepSpeed's fp32 partitions,
    here unsharded: every rank updates its partition with the same numbers).
    As DeepSpeed starts them from the module cast to bf16 / fp16, they are
    rounded to that dtype once, here. :meth:`backward` runs each rank's
    forward and backward on its own batch with the weights cast to that
    dtype (the fp16 loss multiplied by the current loss scale) and reduces
    the gradients as ZeRO does (:func:`fpemu.collectives.zero_reduce`).
    :meth:`step` then does what ``engine.step()`` does with them: with fp16,
    an inf or NaN in any reduced gradient skips the step and tells the loss
    scale (:class:`fpemu.collectives.DeepSpeedLossScaler`); otherwise the
    gradients, as float32, are multiplied by 1 / (loss scale, times the
    clipping factor where ``gradient_clipping`` asks for one) and the
    optimizer (built on ``module.parameters()``) steps the masters::

        zero = EmulatedZeRO(model, 8, {"fp16": {"enabled": True},
                                       "zero_optimization": {"stage": 2}})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for batches in data:
            zero.backward(loss_fn, batches)     # one batch per rank
            zero.step(opt)                      # False where the step was skipped

    The reduction is DeepSpeed's bit for bit (bf16, recorded; fp16 modelled).
    The clipping norm is computed here in float64 over all gradients and
    rounded to float32, not in DeepSpeed's order of partial norms."""

    def __init__(self, module, world_size, config, *, algorithm="gloo", ready_order=None,
                 **collective_params):
        self.params = _world_and_params("EmulatedZeRO", module, world_size)
        if _format_of(self.params[0].dtype) != "fp32":
            raise FpemuValueError(f"EmulatedZeRO: the module holds the float32 master weights; "
                                  f"got {self.params[0].dtype} parameters (call module.float() "
                                  "first; the bf16 / fp16 copies are made from it)")
        self.config = collectives.zero_config(config, "EmulatedZeRO")
        bf16 = self.config.get("bf16", {}).get("enabled", False)
        fp16 = self.config.get("fp16", {}).get("enabled", False)
        if bf16 == fp16:
            raise FpemuValueError("EmulatedZeRO: the configuration must enable exactly one of "
                                  "bf16 and fp16 (\"bf16\": {\"enabled\": true}); got "
                                  f"bf16.enabled={bf16}, fp16.enabled={fp16}")
        from . import bfloat16, float16     # (local: names of the package's own __init__)
        self.dtype = bfloat16 if bf16 else float16
        self.scaler = collectives.DeepSpeedLossScaler.from_config(self.config) if fp16 else None
        self.clip = float(self.config.get("gradient_clipping", 0.0))
        self.module = module
        self.world_size = world_size
        self.algorithm = algorithm
        self.ready_order = ready_order
        self.collective_params = collective_params
        self._reduced = None
        with no_grad():
            for p in self.params:
                p.copy_(p.to(self.dtype).float())

    @property
    def loss_scale(self):
        """The current loss scale (1 for bf16)."""
        return 1.0 if self.scaler is None else self.scaler.cur_scale

    def backward(self, loss_fn, batches):
        """Each rank's loss on its batch (floats, unscaled); the reduced
        gradients wait for :meth:`step`."""

        compute = copy.deepcopy(self.module).to(self.dtype)
        cparams = [p for p in compute.parameters() if p.requires_grad]
        scale = self.loss_scale

        def scaled(m, *args):
            loss = loss_fn(m, *args)
            return loss if scale == 1.0 else loss * scale

        local, losses = _local_gradients("EmulatedZeRO", self.world_size, compute, cparams,
                                         scaled, batches)
        self._reduced = collectives.zero_reduce(local, self.config, self.algorithm,
                                                ready_order=self.ready_order,
                                                **self.collective_params)
        return [v / scale for v in losses]

    def step(self, optimizer):
        """``engine.step()``: True where the optimizer stepped, False where an
        fp16 overflow skipped the step."""

        if self._reduced is None:
            raise FpemuRuntimeError("EmulatedZeRO.step(): no gradients; call backward() first "
                                    "(one backward, then one step)")
        grads, self._reduced = self._reduced, None
        for p in self.params:
            p.grad = None
        overflow = not all(np.isfinite(g).all() for g in grads)
        if self.scaler is not None and overflow:
            self.scaler.update_scale(True)
            return False
        combined = self.loss_scale
        if self.clip > 0:
            norm = np.float32(np.sqrt(sum(np.sum(np.float64(g) ** 2) for g in grads)))
            factor = ((float(norm) / combined) + 1e-6) / self.clip
            if factor > 1:
                combined = factor * combined
        inv = np.float32(1.0 / combined)
        _set_grads(self.params, [g if combined == 1.0 else (g * inv).astype(np.float32)
                                 for g in grads])
        optimizer.step()
        if self.scaler is not None:
            self.scaler.update_scale(False)
        return True


from ._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr("fpemu.autograd.distributed (torch.distributed)")
