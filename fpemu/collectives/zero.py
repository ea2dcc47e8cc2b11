"""DeepSpeed ZeRO's gradient reduction (stages 1-3) with its loss scaler."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from ..errors import FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError, FpemuValueError
from ..quantize import quantize
from ._grads import _div_, _in_the_name_of, _rank_grads, _unflatten
from .primitives import all_reduce


# --------------------------------------------------------------------- ZeRO
#: the DeepSpeed configuration keys zero_reduce reads or accepts, by section
ZERO_KEYS = {
    "": ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
         "bf16", "fp16", "zero_optimization", "communication_data_type",
         "gradient_predivide_factor", "zero_allow_untested_optimizer", "optimizer",
         "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown"),
    "bf16": ("enabled",),
    "fp16": ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "min_loss_scale", "consecutive_hysteresis"),
    "zero_optimization": ("stage", "reduce_bucket_size", "reduce_scatter", "overlap_comm",
                          "contiguous_gradients", "allgather_bucket_size",
                          "allgather_partitions"),
}


class DeepSpeedLossScaler:
    """DeepSpeed's dynamic fp16 loss scale (``DynamicLossScaler`` of
    ``deepspeed/runtime/fp16/loss_scaler.py``, 0.19.8), from the ``fp16``
    section of a DeepSpeed JSON (:meth:`from_config`): the scale starts at
    2**``initial_scale_power``; an overflow skips the step and, once
    ``hysteresis`` overflows have used up the hysteresis, halves the scale
    (not below ``min_loss_scale``; an overflow at the minimum is an error, as
    in DeepSpeed); ``loss_scale_window`` clean steps after the last overflow
    double it and refill the hysteresis (``consecutive_hysteresis`` refills
    it after every clean step instead). Unlike torch's ``GradScaler``, whose
    scale halves at every overflow, the hysteresis lets an isolated overflow
    pass at the same scale.

    ``tests/data/deepspeed_loss_scaler.json`` holds DeepSpeed's own scales
    for fixed overflow patterns (``scripts/make_deepspeed_scaler_vectors.py``)
    and the tests replay them here."""

    def __init__(self, init_scale=2.0 ** 16, scale_window=1000, min_scale=1.0, delayed_shift=2,
                 consecutive_hysteresis=False):
        self.cur_scale = float(init_scale)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.cur_hysteresis = int(delayed_shift)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.cur_iter = 0
        self.last_overflow_iter = -1

    @classmethod
    def from_config(cls, config):
        """The scaler of a DeepSpeed JSON's ``fp16`` section (dict, JSON text
        or path), with DeepSpeed's defaults."""
        cfg = zero_config(config, "DeepSpeedLossScaler.from_config")
        fp16 = cfg.get("fp16", {})
        if not fp16.get("enabled", False):
            raise FpemuValueError("DeepSpeedLossScaler.from_config(): the configuration's "
                                  "fp16.enabled is not true; DeepSpeed scales the loss for fp16 "
                                  "only")
        if fp16.get("loss_scale", 0) != 0:
            raise FpemuValueError(
                f"DeepSpeedLossScaler.from_config(): fp16.loss_scale is "
                f"{fp16['loss_scale']!r}, a static scale (DeepSpeed scales dynamically only "
                "with loss_scale 0, its default): multiply the loss by it yourself")
        return cls(2.0 ** fp16.get("initial_scale_power", 16), fp16.get("loss_scale_window", 1000),
                   fp16.get("min_loss_scale", 1), fp16.get("hysteresis", 2),
                   fp16.get("consecutive_hysteresis", False))

    def update_scale(self, overflow):
        """After a step: ``overflow`` says whether its gradients held an inf
        or a NaN (the step is then skipped)."""
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise FpemuRuntimeError(
                        f"DeepSpeedLossScaler: the loss scale is already at its minimum "
                        f"({self.min_scale:g}) and the gradients overflowed again; DeepSpeed "
                        "stops the run here ('Current loss scale already at minimum'). Lower "
                        "fp16.min_loss_scale, or find the overflow (fpemu.torch.monitor)")
                self.cur_scale = max(self.cur_scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= 2.0
        self.cur_iter += 1


def zero_config(config, fname="zero_config"):
    """A DeepSpeed configuration (a dict, JSON text or the path of a JSON
    file) as a dict, every key checked against the keys :func:`zero_reduce`
    reads or accepts (``ZERO_KEYS``); errors name ``fname``."""
    if isinstance(config, str):
        text, where = config, "the configuration text"
        if not text.lstrip().startswith("{"):
            if not os.path.isfile(config):
                raise FpemuValueError(f"{fname}(): config is a DeepSpeed configuration: a dict, "
                                      f"JSON text or the path of a JSON file; {config!r} is "
                                      "none of these (no such file)")
            with open(config) as fh:
                text = fh.read()
            where = config
        try:
            config = json.loads(text)
        except ValueError as err:
            raise FpemuValueError(f"{fname}(): {where} is not valid JSON ({err}); pass a "
                                  "DeepSpeed configuration as a dict, JSON text or a JSON "
                                  "file") from None
    if not isinstance(config, dict):
        raise FpemuTypeError(f"{fname}(): config must be a DeepSpeed configuration (a dict, a "
                             f"JSON string or a path), got {type(config).__name__}")
    for section, keys in ZERO_KEYS.items():
        block = config if not section else config.get(section, {})
        if not isinstance(block, dict):
            raise FpemuValueError(f"{fname}(): the {section!r} section must be an object, got "
                                  f"{block!r}")
        for key in block:
            if key not in keys:
                where = f"in {section!r}" if section else "at the top level"
                raise FpemuValueError(f"{fname}(): unknown DeepSpeed key {key!r} {where}; the "
                                      f"keys read or accepted there are {', '.join(keys)}")
    return config


def _ready_order(n, ready_order, fname):
    """The order ZeRO's gradients become ready: ``ready_order`` checked, by
    default the reverse of registration (a chain of layers)."""
    order = list(range(n))[::-1] if ready_order is None else list(ready_order)
    if sorted(order) != list(range(n)):
        raise FpemuValueError(f"{fname}(): ready_order must be an order of the parameters "
                              f"0 .. {n - 1} (each once), got {ready_order!r}")
    return order


def _zero3_reduce(ranks, shapes, world, model, wire, zero, ready_order, algorithm, params, fname):
    """ZeRO stage 3 (DeepSpeed 0.19.8, ``stage3.py`` and
    ``runtime/comm/coalesced_collectives.py``): gradients join a bucket in the
    order they become ready until the next would pass ``reduce_bucket_size``
    elements; each bucket, sorted back into registration order, is cast to
    the wire dtype and reduce-scattered by ``reduce_scatter_coalesced``: rank
    c's part of the buffer holds chunk c (ceil(numel / world) elements,
    padded) of every gradient in turn, the whole buffer is divided by the
    world size in the wire dtype and summed; each rank's partition is then
    copied into the parameter's gradient partition of the model's dtype
    (``partition_grads``), rounding an fp32 sum to bf16 (or fp16) once."""
    n = len(shapes)
    order = _ready_order(n, ready_order, fname)
    limit = int(zero.get("reduce_bucket_size", 500_000_000))
    buckets, cur, size = [], [], 0
    for i in order:
        k = int(np.prod(shapes[i]))
        if cur and size + k > limit:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += k
    if cur:
        buckets.append(cur)
    out = [None] * n
    for b in buckets:
        b = sorted(b)
        chunks = [math.ceil(int(np.prod(shapes[i])) / world) for i in b]
        rows = []
        for gs in ranks:
            parts = []
            for c in range(world):
                for i, k in zip(b, chunks):
                    piece = quantize(gs[i].reshape(-1)[c * k:(c + 1) * k], model)
                    parts.append(np.pad(piece, (0, k - piece.size)))
            rows.append(np.concatenate(parts))
        flat = quantize(np.stack(rows), wire)
        with np.errstate(over="ignore", invalid="ignore"):
            flat = _div_(flat, world, wire)
        red = all_reduce(flat, wire, "sum", algorithm, **params)[0].reshape(world, -1)
        at = 0
        for i, k in zip(b, chunks):
            numel = int(np.prod(shapes[i]))
            whole = np.concatenate([red[c, at:at + k] for c in range(world)])[:numel]
            out[i] = quantize(whole, model).reshape(shapes[i])
            at += k
    return out


@_in_the_name_of("zero_reduce")
def zero_reduce(grads, config, algorithm="gloo", *, ready_order=None, **params):
    """The gradients every rank holds after DeepSpeed ZeRO's reduction, from
    each rank's local gradients (``grads[rank][parameter]``, registration
    order), configured by the DeepSpeed JSON the user writes (a dict, a JSON
    string or a path; unknown keys are an error).

    Modelled and checked bit for bit against DeepSpeed 0.19.8 on gloo (CPU
    accelerator): ``bf16.enabled`` with ``zero_optimization.stage`` 1, 2 or 3.
    Stages 1 and 2: the bf16 gradients are laid out in one buffer (stage 1:
    registration order; stage 2: the order they became ready, default the
    reverse, in buckets of ``reduce_bucket_size`` elements), divided by the
    world size in bf16 (a float32 division rounded to bf16), summed by an
    all-reduce in ``communication_data_type`` (bf16 by default, or fp32) and
    cast back to bf16. Stage 3: DeepSpeed's coalesced reduce-scatter
    (:func:`_zero3_reduce`), the same division, sum and cast.

    ``fp16.enabled`` runs the same code with fp16 in place of bf16, as
    DeepSpeed does (its reduction takes the model's dtype), but is modelled
    only: DeepSpeed's CPU accelerator refuses fp16 ("Type fp16 is not
    supported on your device"), so no run was recorded. The gradients are
    the loss-scaled ones; an fp16 sum that overflows gives inf, which
    :class:`DeepSpeedLossScaler` then sees. In stages 1 and 3 a
    ``gradient_predivide_factor`` other than 1 is refused: not modelled
    (stage 2 refuses that factor as DeepSpeed itself does).
    Returns one float32 array (of bf16 or fp16 values) per parameter.
    """
    fname = "zero_reduce"
    cfg = zero_config(config, fname)
    zero = cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    fp16 = cfg.get("fp16", {}).get("enabled", False)
    if bf16 and fp16:
        raise FpemuValueError(f"{fname}(): bf16.enabled and fp16.enabled are both true; "
                              "DeepSpeed takes one of them")
    if not (bf16 or fp16):
        raise FpemuNotImplementedError(
            f"{fname}(): ZeRO's mixed precision is modelled (bf16.enabled or fp16.enabled); "
            "float32 ZeRO is not")
    model = "bf16" if bf16 else "fp16"
    if stage not in (1, 2, 3):
        raise FpemuValueError(f"{fname}(): zero_optimization.stage must be 1, 2 or 3 (ZeRO's "
                              f"stages; 0 is plain data parallelism: ddp_all_reduce), got "
                              f"{stage!r}")
    if stage == 3 and not zero.get("reduce_scatter", True):
        raise FpemuNotImplementedError(f"{fname}(): stage 3 with reduce_scatter false (its "
                                       "contiguous-buffer path) is not modelled")
    if cfg.get("gradient_predivide_factor", 1.0) != 1.0:
        if stage == 2 and zero.get("reduce_scatter", True):
            raise FpemuValueError(f"{fname}(): DeepSpeed refuses gradient_predivide_factor != "
                                  "1.0 with ZeRO stage 2's reduce-scatter (an assertion in "
                                  "stage_1_and_2.py); drop it, or set "
                                  "zero_optimization.reduce_scatter to false")
        raise FpemuNotImplementedError(f"{fname}(): gradient_predivide_factor other than 1.0 "
                                       f"is not modelled for stage {stage} (DeepSpeed's "
                                       "pre- and post-scaling there were not recorded)")
    comm = {None: model, "fp32": "fp32", "float32": "fp32"}
    if bf16:
        comm.update(bf16="bf16", bfp16="bf16")
    else:
        comm.update(fp16="fp16", float16="fp16")
    if cfg.get("communication_data_type") not in comm:
        raise FpemuValueError(f"{fname}(): communication_data_type must be {model} or fp32 for "
                              f"a {model} model, got {cfg.get('communication_data_type')!r}")
    wire = comm[cfg.get("communication_data_type")]
    world, ranks, shapes = _rank_grads(grads, fname, np.float32)
    n = len(shapes)
    if stage == 3:
        return _zero3_reduce(ranks, shapes, world, model, wire, zero, ready_order, algorithm,
                             params, fname)
    if stage == 1:
        order = list(range(n))
    else:
        order = _ready_order(n, ready_order, fname)
    limit = int(zero.get("reduce_bucket_size", 500_000_000))
    buckets, cur, size = [], [], 0
    for i in order:
        cur.append(i)
        size += int(np.prod(shapes[i]))
        if stage == 2 and size > limit:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    out = [None] * n
    for b in buckets:
        flat = np.stack([quantize(np.concatenate([gs[i].reshape(-1) for i in b]), model)
                         for gs in ranks])
        with np.errstate(over="ignore", invalid="ignore"):
            flat = _div_(flat, world, model)
        red = quantize(all_reduce(flat, wire, "sum", algorithm, **params)[0], model)
        _unflatten(red, b, shapes, out)
    return out
