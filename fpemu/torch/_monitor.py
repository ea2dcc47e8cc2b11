"""The monitor: hooks on a real torch model, exact counts per module, kind, format, step."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import warnings
from collections import deque

import numpy as np

from ..errors import FpemuTypeError, FpemuValueError
from ..checks import as_format
from ._import import torch_module

#: What is recorded, in the order a training step produces it.
KINDS = ("activation", "activation_grad", "weight", "weight_grad", "exp_avg", "exp_avg_sq")
#: How each tensor is scaled before it is classified (see Monitor).
SCALINGS = ("none", "loss_scale", "current", "delayed", "mx", "nvfp4")
DEFAULT_FORMATS = ("fp16", "bf16", "e4m3fn", "e5m2")
_GRAD_KINDS = ("activation_grad", "weight_grad")
_CHUNK = 1 << 22


@dataclasses.dataclass
class Record:
    """The counts of one tensor in one format under one scaling."""

    step: int
    seq: int                 # order of capture within the run
    module: str
    kind: str
    format: str
    scaling: str
    scale: float             # the factor applied (NaN for per-block MX scales)
    numel: int
    counted: int             # numel, or the sample size
    amax: float              # largest finite |value| of the tensor itself (unscaled)
    counts: object           # fpemu.stats.Counts
    sharded: bool = False    # a shard of a DTensor (FSDP2): the ranks' counts add up
    rank: int = 0            # the rank that counted it (0 without torch.distributed)
    ranks: dict = None       # merged records only: {rank: that rank's Record}

    @property
    def overflowed(self) -> int:
        """Values that leave the format's range: above its overflow threshold (rounded
        to inf, or to NaN where there is no inf). For the formats with neither (the MX
        element formats), every value above the largest one, as fpemu.stats counts."""
        to = self.counts.overflow_to
        if _policy(self.format) is None:
            return int(self.counts.counts["overflow"])
        return int(to["inf"] + to["nan"])

    def row(self) -> dict:
        c = self.counts
        out = {"step": self.step, "module": self.module, "kind": self.kind,
               "format": self.format, "scaling": self.scaling, "scale": self.scale,
               "numel": self.numel, "counted": self.counted,
               "sampled": self.counted < self.numel, "amax": self.amax}
        out.update({k: int(v) for k, v in c.counts.items()})
        out["overflow"] = self.overflowed
        out["rounded_to_max"] = int(c.counts["overflow"]) - self.overflowed
        total = c.total
        nonzero = total - c.counts["zero"] - c.counts["nan"] - c.counts["inf"]
        out["flushed_fraction"] = c.counts["flushed"] / nonzero if nonzero else 0.0
        out["overflow_fraction"] = self.overflowed / total if total else 0.0
        return out


@dataclasses.dataclass
class FirstOverflow:
    """Where a run first left a format's range (or produced a real inf / NaN)."""

    step: int
    module: str
    kind: str
    formats: list
    scaling: str
    overflowed: int          # values that overflow the format (0 for a real inf/NaN)
    nonfinite: int           # real inf / NaN values in the tensor itself
    amax: float
    chain: list              # the modules that ran after it in the same pass
    ranks: tuple = ()        # of a job's merged records: the ranks where it happened
    world: int = 1           # the job's ranks (1 without torch.distributed)

    @property
    def real(self) -> bool:
        """True when the tensor itself held inf or NaN (not only a what-if overflow)."""
        return self.nonfinite > 0

    def __str__(self):
        what = (f"{self.nonfinite} real inf/NaN value(s)" if self.real else
                f"{self.overflowed} value(s) beyond the range of {', '.join(self.formats)} "
                f"(amax {self.amax:.6g}, scaling {self.scaling})")
        where = f"step {self.step}"
        if self.world > 1:
            where += (f", rank {self.ranks[0]}" if len(self.ranks) == 1 else
                      f", ranks {', '.join(map(str, self.ranks))}") + f" of {self.world}"
        lines = [f"{where}: {self.kind} of {self.module}: {what}"]
        if self.chain:
            direction = "backward" if self.kind == "activation_grad" else "forward"
            lines.append(f"  then flows ({direction}) through: " + " -> ".join(self.chain))
        return "\n".join(lines)


def _float_tensors(output, torch, key=""):
    """(key, tensor) of every floating-point tensor in a module's output:
    a tensor, or tuples, lists and dicts of them (nested), keyed by their
    position or name ("0", "logits", "1.hidden")."""
    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            yield key or "0", output
        return
    if isinstance(output, dict):
        items = output.items()
    elif isinstance(output, (tuple, list)):
        items = enumerate(output)
    else:
        return
    for k, v in items:
        yield from _float_tensors(v, torch, f"{key}.{k}" if key else str(k))


def _policy(fmt):
    """The overflow policy the monitor counts with: one that tells a value beyond the
    range (inf, else NaN) from one that only rounds down to the largest value."""
    f = as_format(fmt)
    return "inf" if f.has_inf else ("nan" if f.has_nan else None)


def _is_dtensor(t):
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def _shard_groups(t):
    """The process groups across which the DTensor ``t`` is sharded (one per
    mesh dimension with a ``Shard`` placement); ``None`` for any other tensor
    (a plain one, or a DTensor replicated on every rank)."""
    if not _is_dtensor(t):
        return None
    mesh = t.device_mesh
    groups = [mesh.get_group(dim) for dim, pl in enumerate(t.placements) if pl.is_shard()]
    return groups or None


def _local_amax(torch, flat):
    """The largest finite |value| of ``flat`` (0 when there is none)."""
    if flat.numel() == 0:
        return 0.0
    fin = torch.isfinite(flat)
    return float(torch.where(fin, flat.abs(), torch.zeros((), dtype=flat.dtype,
                                                          device=flat.device)).max())


def _global_amax(torch, local, groups):
    """The whole tensor's amax from one shard: the shard's, then a MAX all-reduce
    of that one float64 scalar across each sharding group (exact: a max)."""
    a = torch.tensor([_local_amax(torch, local.reshape(-1))], dtype=torch.float64,
                     device=local.device)
    for g in groups:
        torch.distributed.all_reduce(a, op=torch.distributed.ReduceOp.MAX, group=g)
    return float(a.item())


def _check_choice(name, value, allowed):
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values:
        raise FpemuValueError(f"monitor(): {name} is empty; pass one or more of "
                              f"{', '.join(allowed)}")
    for v in values:
        if v not in allowed:
            raise FpemuValueError(f"monitor(): unknown {name[:-1] if name.endswith('s') else name}"
                                  f" {v!r}; choose from {', '.join(allowed)}")
    return values


class Monitor:
    """Counts what each what-if format does to a torch model's tensors, step by step.

    Parameters
    ----------
    model : torch.nn.Module
        The model; every leaf module and every module with parameters of its
        own is watched.
    optimizer : torch.optim.Optimizer, optional
        Its state (Adam's ``exp_avg`` and ``exp_avg_sq``) is counted after
        each step.
    formats : sequence of str
        The what-if formats.
    scaling : str or sequence of str
        ``"none"`` (the values as they are); ``"loss_scale"`` (gradients
        times the scaler's scale, or ``loss_scale``); ``"current"`` (per tensor,
        ``max / amax / 2**margin`` in float32, TransformerEngine's current
        scaling); ``"delayed"`` (the same from the largest amax of the last
        ``history`` steps, TransformerEngine's delayed scaling, scale 1 at the
        first step); ``"mx"`` (one power-of-two E8M0 scale per ``block``
        values along the last dimension, OCP MX's rule
        ``2**(floor(log2 amax) - emax)``); ``"nvfp4"`` (TransformerEngine's
        NVFP4 rule with the format's maximum in place of E2M1's 6: an fp32
        tensor scale ``448 * max / amax``, then an E4M3 scale per 16 values
        of the last dimension; for ``e2m1`` this is NVFP4 as
        :mod:`fpemu.block` computes it, before the clamp to ±6; infinities
        and NaNs set no scale).
    every : int
        Count every ``every``-th step.
    sample : int, optional
        Count a seeded uniform sample of this many elements of each larger
        tensor (the rows say so); exact counts of the sample.
    scaler : torch.amp.GradScaler, optional
        Gradients captured during a scaled backward pass are unscaled by its
        scale (exact: a power of two) and ``"loss_scale"`` reads it.
    kinds : sequence of str
        A subset of :data:`KINDS`.
    count_on : str
        Where the counting runs: ``"auto"`` (the default: on the tensor's
        device for GPU tensors, with :func:`fpemu.torch.stats`, so that only
        the count vectors come back; on the host, with fpemu's kernels, for
        CPU tensors, where those are faster), ``"device"`` or ``"host"``.
        The counts are the same either way.

    A step is one training iteration: it ends when the next forward pass of
    ``model`` starts after a backward pass. Use it as a context manager
    (:func:`monitor`), or call :meth:`start` and :meth:`stop`.

    Under ``torch.distributed`` each rank counts its own tensors (a DDP
    model is watched through its ``module``; a DTensor parameter, gradient
    or optimizer moment of FSDP2 as its local shard) and :meth:`gather` /
    :meth:`report` merge the ranks' counts on rank 0. The only collective
    within the steps is for a sharded tensor under a scaling that needs its
    amax (``current``, ``delayed``, ``nvfp4``) or a sample: one MAX
    all-reduce of a scalar per tensor and recorded step, so that the shard
    is scaled by the whole tensor's amax.
    """

    def __init__(self, model, optimizer=None, formats=DEFAULT_FORMATS, scaling="none", every=1,
                 sample=None, seed=0, scaler=None, loss_scale=None, margin=0, history=16,
                 block=32, kinds=KINDS, chunk=_CHUNK, count_on="auto"):
        torch = torch_module()
        if not isinstance(model, torch.nn.Module):
            raise FpemuTypeError(f"monitor(): model must be a torch.nn.Module, got "
                                 f"{type(model).__name__}; pass the model you train")
        ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
        if ddp is not None and isinstance(model, ddp):
            model = model.module    # DDP's wrapper: the layers (and their names) are its module's
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise FpemuTypeError(f"monitor(): optimizer must be a torch.optim.Optimizer, got "
                                 f"{type(optimizer).__name__}")
        if isinstance(formats, str):
            formats = (formats,)
        self.formats = tuple(as_format(f).name for f in formats)
        if not self.formats:
            raise FpemuValueError("monitor(): formats is empty; pass e.g. ('fp16', 'bf16')")
        self.scalings = _check_choice("scaling", scaling, SCALINGS)
        self.kinds = _check_choice("kinds", kinds, KINDS)
        for name, v, lo in (("every", every, 1), ("history", history, 1), ("block", block, 1),
                            ("chunk", chunk, 1), ("margin", margin, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise FpemuValueError(f"monitor(): {name} must be an int >= {lo}, got {v!r}")
        if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)
                                   or sample < 1):
            raise FpemuValueError(f"monitor(): sample must be None or an int >= 1, got "
                                  f"{sample!r}")
        if "loss_scale" in self.scalings and scaler is None and loss_scale is None:
            raise FpemuValueError("monitor(): scaling='loss_scale' needs the scale: pass "
                                  "scaler=your GradScaler or loss_scale=2.0**16")
        if loss_scale is not None and not (isinstance(loss_scale, (int, float))
                                           and loss_scale > 0 and math.isfinite(loss_scale)):
            raise FpemuValueError(f"monitor(): loss_scale must be a finite number > 0, got "
                                  f"{loss_scale!r}")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.every, self.sample, self.seed = every, sample, seed
        self.loss_scale, self.margin, self.history, self.block = loss_scale, margin, history, block
        self.chunk = chunk
        if count_on not in ("auto", "device", "host"):
            raise FpemuValueError(f"monitor(): count_on must be 'auto', 'device' or 'host', "
                                  f"got {count_on!r}")
        self.count_on = count_on
        self.records = []          # this rank's; after gather() on rank 0, the whole job's
        self._own = self.records
        self.rank, self.world = 0, 1
        self.rank_records = None   # after gather() on rank 0: {rank: that rank's records}
        self.step = 0
        self._seq = 0
        self._saw_backward = False
        self._handles = []
        self._trace = {}                     # step -> [(phase, module)] in execution order
        self._amax_hist = {}                 # (module, kind, format) -> deque of amaxes
        self._names = {}
        self._owner = {}
        self._running = False
        self._warned_meta = False
        self.script_error = None
        self.script_exit = None
        self.report_path = None     # where run_script's report went (None on ranks > 0)

    # -- hooks -------------------------------------------------------------------------
    def start(self):
        if self._running:
            return self
        torch = torch_module()
        root = type(self.model).__name__
        watched = []
        for name, m in self.model.named_modules():
            own = list(m.named_parameters(recurse=False))
            if own or not any(True for _ in m.children()):
                watched.append((name or root, m))
            for pname, p in own:
                self._owner[id(p)] = (name or root, pname)
        self._names = {id(m): n for n, m in watched}
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre))
        for name, m in watched:
            self._handles.append(m.register_forward_hook(self._forward_hook(name)))
        for p in self.model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._param_hook))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_post_hook(self._after_step))
        self._torch = torch
        self._running = True
        return self

    def stop(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._running = False
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def _on(self):
        return self.step % self.every == 0

    def _root_pre(self, module, args):
        if self._saw_backward:
            self.step += 1
            self._saw_backward = False

    def _forward_hook(self, name):
        def hook(module, args, output):
            if not self._on():
                return
            tensors = list(_float_tensors(output, self._torch))
            for key, t in tensors:
                label = name if len(tensors) == 1 else f"{name}[{key}]"
                self._trace.setdefault(self.step, []).append(("forward", label))
                if "activation" in self.kinds:
                    self._record("activation", label, t)
                if t.requires_grad and "activation_grad" in self.kinds:
                    t.register_hook(self._grad_hook(label))
        return hook

    def _grad_hook(self, label):
        def hook(grad):
            self._saw_backward = True
            if self._on():
                self._trace.setdefault(self.step, []).append(("backward", label))
                self._record("activation_grad", label, grad, unscale=True)
        return hook

    def _param_hook(self, p):
        self._saw_backward = True
        if not self._on():
            return
        module, pname = self._owner.get(id(p), ("?", "?"))
        label = f"{module}.{pname}"
        if "weight" in self.kinds:
            self._record("weight", label, p)
        if "weight_grad" in self.kinds and p.grad is not None:
            self._record("weight_grad", label, p.grad, unscale=True)

    def _after_step(self, optimizer, args, kwargs):
        if not self._on():
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                module, pname = self._owner.get(id(p), ("?", "?"))
                for kind in ("exp_avg", "exp_avg_sq"):
                    t = st.get(kind)
                    if kind in self.kinds and isinstance(t, self._torch.Tensor):
                        self._record(kind, f"{module}.{pname}", t)

    # -- counting ----------------------------------------------------------------------
    def _live_scale(self):
        if self.scaler is None or not self.scaler.is_enabled():
            return 1.0
        return float(self.scaler.get_scale())

    def _record(self, kind, label, tensor, unscale=False):
        torch = self._torch
        t = tensor.detach()
        shard_groups = _shard_groups(t)
        sharded = shard_groups is not None
        if sharded or _is_dtensor(t):
            t = t.to_local()        # this rank's shard (FSDP2), or its replica
        if not t.is_floating_point() or self._on_meta_warned(t, label):
            return
        needs_amax = self.sample is not None or any(sc not in ("none", "loss_scale")
                                                    for sc in self.scalings)
        amax_raw = None
        if sharded and needs_amax:
            # the scalings follow the whole tensor's amax: every rank holding a shard takes
            # part in one all-reduce of a scalar (as TransformerEngine's FSDP integration
            # does), an empty shard too
            amax_raw = _global_amax(torch, t, shard_groups)
        if t.numel() == 0:
            return
        seq = self._seq
        self._seq += 1
        live = self._live_scale() if unscale else 1.0
        flat = t.reshape(-1)
        if needs_amax and amax_raw is None:
            # the scale needs the amax before the counting, and a sample's amax is not the
            # tensor's; otherwise the counts give it (stats' amax is before its factor)
            amax_raw = _local_amax(torch, flat)
        idx = None
        if self.sample is not None and flat.numel() > self.sample:
            rng = np.random.default_rng([self.seed, self.step, seq])
            pick = np.sort(rng.choice(flat.numel(), self.sample, replace=False))
            idx = torch.from_numpy(pick).to(flat.device)
        counted = flat.numel() if idx is None else int(idx.numel())
        for scaling in self.scalings:
            shared = scaling in ("none", "loss_scale")     # the same values for every format
            counted_all = {}
            for fname in self.formats:
                f = as_format(fname)
                src, scale, factor = self._scaled(scaling, kind, label, f, t, flat, amax_raw,
                                                  live, sharded)
                if fname in counted_all:
                    c = counted_all[fname]
                else:
                    if idx is not None:
                        src = src[idx]
                    names = self.formats if shared else (fname,)
                    found = self._count(src, names, factor)
                    if shared:
                        counted_all = found
                    c = found[fname]
                if amax_raw is None:
                    amax_raw = c.amax
                self._own.append(Record(self.step, seq, label, kind, fname, scaling, scale,
                                        flat.numel(), counted, amax_raw / live, c, sharded,
                                        self._dist_rank()))

    def _count(self, src, names, factor):
        """{format name: Counts} of ``src * factor`` in each of ``names``, chunk
        by chunk: on the tensor's device (only the counts come back) or on the
        host, where the formats share one pass over each chunk
        (:func:`fpemu.stats.stats_many`)."""
        from ..stats import stats_many
        torch = self._torch
        fmts = [as_format(n) for n in names]
        policies = [_policy(f) for f in fmts]
        on_device = self.count_on == "device" or (
            self.count_on == "auto" and src.device.type != "cpu")
        total = None
        for start in range(0, src.numel(), self.chunk):
            part = src[start:start + self.chunk]
            if on_device:                   # only the counts come back
                from ._stats import stats as device_stats
                got = [device_stats(part, f, scale=factor, overflow=o)
                       for f, o in zip(fmts, policies)]
            else:
                # float64 stays float64 (MX's scaled values are float64); the rest
                # widens exactly to float32
                host = part.to("cpu", torch.float64 if part.dtype == torch.float64
                               else torch.float32)
                got = stats_many(host.numpy(), fmts, scale=factor, overflows=policies)
            total = got if total is None else [a + b for a, b in zip(total, got)]
        return dict(zip(names, total))

    def _on_meta_warned(self, t, label):
        """True for a meta tensor (a shape without values: nothing to count), warned once."""
        if t.device.type != "meta":
            return False
        if not self._warned_meta:
            warnings.warn(f"fpemu.torch.monitor: {label} is on the meta device (shapes "
                          f"without values); its tensors are not counted. Move the model "
                          f"to a real device (model.to_empty(device=...)) to count them.",
                          stacklevel=3)
            self._warned_meta = True
        return True

    def _dist_rank(self):
        d = self._torch.distributed
        return d.get_rank() if d.is_available() and d.is_initialized() else 0

    def _scaled(self, scaling, kind, label, f, t, flat, amax_raw, live, sharded=False):
        """(values to classify, the scale to report, the factor stats() applies)."""
        torch = self._torch
        grad = kind in _GRAD_KINDS
        if scaling == "none" or (scaling == "loss_scale" and not grad):
            return flat, 1.0, 1.0 / live
        if scaling == "loss_scale":
            s = self._live_scale() if self.scaler is not None else float(self.loss_scale)
            return flat, s, s / live
        if scaling in ("current", "delayed"):
            if scaling == "current":
                ref = amax_raw
            else:
                hist = self._amax_hist.setdefault((label, kind, f.name),
                                                  deque(maxlen=self.history))
                ref = max(hist) if hist else None
                hist.append(amax_raw)
            # TransformerEngine: scale = (max / amax) / 2**margin in float32, 1 when amax is
            # 0 (nothing recorded yet), at most FLT_MAX when amax is tiny
            with np.errstate(over="ignore"):
                s = np.float32(1.0) if not ref else np.float32(
                    np.float32(f.max) / np.float32(ref) / np.float32(2.0 ** self.margin))
            s = min(s, np.finfo(np.float32).max)
            # the cast kernel's float32 multiply, then the classification
            y = flat.to(torch.float32) * torch.tensor(float(s), dtype=torch.float32,
                                                      device=flat.device)
            return y, float(s), 1.0
        if scaling == "nvfp4":      # (a shard's tensor scale is the whole tensor's)
            return self._nvfp4(t, f, amax_raw if sharded else None), float("nan"), 1.0
        # MX: one power-of-two scale per block of the last dimension (rows never share one)
        x = t.to(torch.float64)
        last = x.shape[-1] if x.dim() else 1
        rows = x.reshape(-1, last)
        pad = (-last) % self.block
        if pad:
            rows = torch.nn.functional.pad(rows, (0, pad))
        blocks = rows.reshape(rows.shape[0], -1, self.block)
        bmax = torch.where(torch.isfinite(blocks), blocks.abs(),
                           torch.zeros((), dtype=blocks.dtype, device=blocks.device))
        bmax = bmax.amax(dim=-1, keepdim=True)
        _, e = torch.frexp(bmax)                       # bmax = m * 2**e, m in [0.5, 1)
        emax = math.floor(math.log2(f.max))
        expo = torch.where(bmax > 0, e - 1 - emax, torch.zeros_like(e)).clamp(-127, 127)
        y = (blocks / torch.ldexp(torch.ones_like(bmax), expo)).reshape(rows.shape)
        y = y[:, :last].reshape(-1)
        return y, float("nan"), 1.0

    def _nvfp4(self, t, f, amax=None):
        """x times TransformerEngine's NVFP4 element encode scale, in float32
        (see :mod:`fpemu.block`, rule ``"nvfp4"``), with ``f.max`` for 6; the
        tensor scale from ``amax`` where given (a shard's: the whole tensor's)."""
        from ..block.rules import nvfp4_tensor_scale
        torch = self._torch
        f32 = np.float32
        x = t.to(torch.float32)
        last = x.shape[-1] if x.dim() else 1
        rows = x.reshape(-1, last)
        pad = (-last) % 16
        if pad:
            rows = torch.nn.functional.pad(rows, (0, pad))
        blocks = rows.reshape(rows.shape[0], -1, 16)
        finite = torch.where(torch.isfinite(blocks), blocks.abs(),
                             torch.zeros((), dtype=blocks.dtype, device=blocks.device))
        bmax = finite.amax(dim=-1, keepdim=True)
        if amax is not None:
            amax_t = f32(amax)
        else:
            amax_t = f32(finite.max().item()) if finite.numel() else f32(0)
        S, Sdec = nvfp4_tensor_scale(amax_t, 448.0, f.max)
        flt_max = torch.tensor(float(np.finfo(np.float32).max), device=x.device)
        # TE's current rule: amax times fp32(S * fp32(1 / 6)) (fpemu.block, "nvfp4")
        mult = f32(S * (f32(1.0) / f32(f.max)))
        ds = bmax * torch.tensor(float(mult), dtype=torch.float32, device=x.device)
        ds = torch.clamp(torch.minimum(ds, flt_max), max=448.0)
        ds = ds.to(torch.float8_e4m3fn).to(torch.float32)
        enc = torch.minimum(1.0 / (ds * torch.tensor(float(Sdec), device=x.device)), flt_max)
        y = (blocks * enc).reshape(rows.shape)[:, :last].reshape(-1)
        return y

    # -- many processes ----------------------------------------------------------------
    @property
    def local_records(self) -> list:
        """This rank's own records (the same as :attr:`records` in one process)."""
        return self._own

    def gather(self, timeout=None):
        """Combine every rank's counts into the whole job's, on rank 0.

        Under ``torch.distributed`` (any backend, ``torchrun`` or spawned
        processes) each rank counts its own tensors; this is the one
        collective the monitor makes beyond sharded tensors' amax (see the
        class text), and every rank must call it, at the same point (as
        :meth:`report` does). Only the small count vectors travel (pickled,
        over a gloo group made for it, whatever the job's backend). On rank 0
        :attr:`records` become the job's, one per tensor: the ranks' counts
        added up for activations, their gradients, weight gradients (each
        rank's local one under DDP) and any shard of a DTensor (FSDP2), a
        replicated tensor's (a DDP weight, Adam's moments) counted once, from
        rank 0; :attr:`rank_records` keeps each rank's own. Without a process
        group of two or more ranks it does nothing; once the group is
        destroyed, the last merge stays. ``timeout`` (seconds; default
        ``FPEMU_MERGE_TIMEOUT`` or 600) bounds the wait for slower ranks.
        Returns ``self``.
        """
        import datetime
        torch = torch_module()
        d = torch.distributed
        if not (d.is_available() and d.is_initialized()) or d.get_world_size() < 2:
            return self
        rank, world = d.get_rank(), d.get_world_size()
        secs = float(timeout if timeout is not None
                     else os.environ.get("FPEMU_MERGE_TIMEOUT", 600))
        group = d.new_group(backend="gloo", timeout=datetime.timedelta(seconds=secs))
        got = [None] * world if rank == 0 else None
        try:
            d.gather_object((rank, self._own), got, dst=0, group=group)
        finally:
            d.destroy_process_group(group)
        self.rank, self.world = rank, world
        if rank == 0:
            self.rank_records = {r: recs for r, recs in got}
            self.records = _merge_ranks(self.rank_records)
        return self

    # -- results -----------------------------------------------------------------------
    def rows(self) -> list:
        """One dict per (step, module, kind, format, scaling), in capture order."""
        return [r.row() for r in self.records]

    def table(self):
        """:meth:`rows` as a pandas DataFrame when pandas is installed, else the list."""
        rows = self.rows()
        try:
            import pandas as pd
        except ImportError:
            return rows
        return pd.DataFrame(rows)

    def to_json(self, path):
        """Write :meth:`rows` (and the settings) as JSON; returns the path."""
        def clean(v):
            if isinstance(v, float) and not math.isfinite(v):
                return str(v)
            return v
        doc = {"formats": list(self.formats), "scalings": list(self.scalings),
               "every": self.every, "sample": self.sample, "seed": self.seed,
               "rows": [{k: clean(v) for k, v in r.items()} for r in self.rows()]}
        if self.rank_records is not None:       # the job's rows, then each rank's own
            doc["world"] = self.world
            doc["rank_rows"] = [{"rank": rank, **{k: clean(v) for k, v in rec.row().items()}}
                                for rank, recs in sorted(self.rank_records.items())
                                for rec in recs]
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
        return path

    def first_overflow(self, scaling=None):
        """The first tensor, in the order the run produced them, that overflows a
        format under ``scaling`` (the first scaling by default) or holds a real inf
        or NaN; ``None`` if there is none."""
        scaling = scaling or self.scalings[0]
        if scaling not in self.scalings:
            raise FpemuValueError(f"first_overflow(): scaling {scaling!r} was not recorded; "
                                  f"this monitor recorded {', '.join(self.scalings)}")
        hits = {}
        for r in self.records:
            if r.scaling != scaling:
                continue
            nonfinite = r.counts.counts["nan"] + r.counts.counts["inf"]
            over = r.overflowed
            if nonfinite or over:
                hit = hits.setdefault((r.step, r.seq), {"r": r, "formats": [], "over": 0,
                                                        "nf": nonfinite, "ranks": set()})
                if over:
                    hit["formats"].append(r.format)
                    hit["over"] = max(hit["over"], over)
                for rank, own in (r.ranks or {}).items():
                    if own.overflowed or own.counts.counts["nan"] + own.counts.counts["inf"]:
                        hit["ranks"].add(rank)
        if not hits:
            return None
        first = hits[min(hits)]
        r = first["r"]
        return FirstOverflow(r.step, r.module, r.kind, first["formats"], scaling, first["over"],
                             first["nf"], r.amax, self._chain(r), tuple(sorted(first["ranks"])),
                             self.world if self.rank_records is not None else 1)

    def _chain(self, r):
        phase = {"activation": "forward", "activation_grad": "backward"}.get(r.kind)
        if phase is None:
            return []
        order = [m for p, m in self._trace.get(r.step, []) if p == phase]
        if r.module not in order:
            return []
        after = order[order.index(r.module) + 1:]
        seen, out = set(), []
        for m in after:
            if m not in seen:
                seen.add(m)
                out.append(m)
        return out

    def report(self, out_dir, **kwargs):
        """Write the HTML report (figures, verdicts) into ``out_dir``; returns the path
        of ``index.html``. See :func:`fpemu.torch._report.write_report`.

        Under ``torch.distributed`` every rank calls it: the counts are merged
        (:meth:`gather`) and rank 0 writes the job's one report; the other
        ranks write nothing and return ``None``. Should the merge fail (a rank
        that died, or a timeout), each rank writes its own counts into
        ``out_dir/rank<N>`` with a warning."""
        from ..tensorfiles import check_output_dir
        from ._report import write_report
        check_output_dir(out_dir, "report folder")
        try:
            self.gather()
        except Exception as err:     # noqa: BLE001 - gloo's errors have several types
            rank = self._dist_rank()
            out_dir = os.path.join(out_dir, f"rank{rank}")
            self.records, self.rank_records, self.world = self._own, None, 1
            warnings.warn(f"fpemu.torch.monitor: rank {rank} could not merge its counts with "
                          f"the other ranks' ({type(err).__name__}: {err}); writing this "
                          f"rank's own report to {out_dir}", stacklevel=2)
        else:
            if self.world > 1 and self.rank != 0:
                return None
            if self.world == 1 and _torchrun_world() > 1:
                # torchrun's processes with no process group: one report per rank
                out_dir = os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}")
        try:
            return write_report(self, out_dir, **kwargs)
        except OSError as err:          # a full disk, a folder removed meanwhile
            raise FpemuValueError(f"cannot write the report into {out_dir}: "
                                  f"{(err.strerror or str(err)).lower()}") from None


#: the kinds whose ranks hold different tensors (each rank's batch, its local gradients):
#: their counts add up across ranks; a weight or an optimizer moment does only when sharded
_PER_RANK_KINDS = ("activation", "activation_grad", "weight_grad")


def _torchrun_world():
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def _merge_ranks(rank_records):
    """One Record per tensor of the job from each rank's records (see
    :meth:`Monitor.gather`); a module that runs twice in a step keeps its two
    records apart (the n-th of a rank goes with the n-th of the others)."""
    parts, order = {}, []
    for rank in sorted(rank_records):
        seen = {}
        for r in rank_records[rank]:
            base = (r.step, r.module, r.kind, r.format, r.scaling)
            n = seen[base] = seen.get(base, -1) + 1
            key = base + (n,)
            if key not in parts:
                parts[key] = {}
                order.append(key)
            parts[key][rank] = r
    merged = []
    for key in order:
        by_rank = parts[key]
        first = by_rank[min(by_rank)]
        add = first.sharded or first.kind in _PER_RANK_KINDS
        recs = list(by_rank.values()) if add else [first]
        counts = recs[0].counts
        for r in recs[1:]:
            counts = counts + r.counts
        scales = {r.scale for r in by_rank.values() if r.scale == r.scale}
        scale = scales.pop() if len(scales) == 1 and all(
            r.scale == r.scale for r in by_rank.values()) else float("nan")
        amaxes = [r.amax for r in by_rank.values() if r.amax == r.amax]
        merged.append(Record(first.step, first.seq, first.module, first.kind, first.format,
                             first.scaling, scale, sum(r.numel for r in recs),
                             sum(r.counted for r in recs), max(amaxes, default=float("nan")),
                             counts, first.sharded, None, by_rank))
    merged.sort(key=lambda r: (r.step, r.seq))
    return merged


def monitor(model, optimizer=None, **kwargs) -> Monitor:
    """A :class:`Monitor` for ``with`` blocks: ``with monitor(model, opt) as mon: ...``."""
    return Monitor(model, optimizer, **kwargs)


# -- the CLI's way in: watch(), and the first optimizer of a script ----------------------

_PENDING = {}      # the settings of `fpemu monitor`, while a script runs under it
_ACTIVE = []


def watch(model, optimizer=None, **kwargs) -> Monitor:
    """Start monitoring ``model`` now and return the monitor.

    Under ``fpemu monitor SCRIPT.py`` this is how a script names its model
    (the command's settings apply, and its report is written when the script
    ends); elsewhere it starts a :class:`Monitor` with ``kwargs`` that runs
    until its ``stop()``.
    """
    settings = {**_PENDING.get("settings", {}), **kwargs}
    mon = Monitor(model, optimizer, **settings).start()
    _ACTIVE.append(mon)
    return mon


def _find_root_module(optimizer):
    """The module that owns the optimizer's parameters: of the live modules holding
    its first parameter, the one with the most parameters."""
    import gc
    torch = torch_module()
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    if first is None:
        return None
    best, size = None, -1
    with warnings.catch_warnings():   # isinstance on lazy modules can warn (deprecations)
        warnings.simplefilter("ignore")
        modules = []
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.nn.Module):
                    modules.append(obj)
            except ReferenceError:    # pragma: no cover - a dead weak proxy
                continue
    for obj in modules:
        params = list(obj.parameters())
        if any(p is first for p in params) and len(params) > size:
            best, size = obj, len(params)
    return best


def _check_script(path, command):
    if not os.path.isfile(path):
        raise FpemuValueError(f"fpemu {command}: no script {path!r}; pass the path of a "
                              "Python training script")


#: The globals of the last script ``run_hooked`` ran, kept until the next one
#: or the end of the process, as ``python script.py`` keeps a script's objects
#: until the interpreter exits. Freeing them as soon as the script returns
#: deadlocks torch (2.13) at times: a DDP model's ``Reducer`` destroys its gloo
#: process group holding the GIL and joins the group's worker threads, while
#: one of them waits for the GIL to free the last all-reduce's work (its
#: thread-local state holds a Python object since torch stashes a context
#: there in every backward). At interpreter exit a thread waiting for the GIL
#: ends instead, so the same objects are freed there without a hang.
_SCRIPT_GLOBALS: list = []


def run_hooked(path, argv, attach, attached):
    """Run the script ``path`` as ``__main__`` with ``sys.argv = [path,
    *argv]``; while ``attached()`` is false, the first optimizer the script
    creates gives the module that owns its parameters to ``attach(model,
    optimizer)`` (``fpemu monitor`` and ``fpemu emulate``). Returns ``(the
    script's exception or None, its sys.exit code or None)``; ``sys.argv``
    and ``torch.optim.Optimizer.__init__`` are restored whatever happens."""
    import runpy
    torch = torch_module()
    real_init = torch.optim.Optimizer.__init__

    def init(opt, *a, **k):
        real_init(opt, *a, **k)
        if not attached() and not getattr(init, "busy", False):
            init.busy = True
            try:
                model = _find_root_module(opt)
                if model is not None:
                    attach(model, opt)
            finally:
                init.busy = False

    torch.optim.Optimizer.__init__ = init
    old_argv = sys.argv
    sys.argv = [path, *argv]
    error = exit_code = None
    _SCRIPT_GLOBALS.clear()         # the previous script's objects go now, not with this one's
    try:
        _SCRIPT_GLOBALS.append(runpy.run_path(path, run_name="__main__"))
    except SystemExit as ex:
        exit_code = ex.code
        _keep_script_globals(ex.__traceback__, path)
    except Exception as err:
        error = err
        _keep_script_globals(err.__traceback__, path)
    finally:
        sys.argv = old_argv
        torch.optim.Optimizer.__init__ = real_init
    return error, exit_code


def _keep_script_globals(tb, path):
    """Keep the globals of the script's module frame in a traceback (a script
    that ended by ``sys.exit`` or an exception), as ``_SCRIPT_GLOBALS``."""
    want = os.path.abspath(path)
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "<module>" and os.path.abspath(code.co_filename) == want:
            _SCRIPT_GLOBALS.append(tb.tb_frame.f_globals)
            return
        tb = tb.tb_next


def run_script(path, argv=(), out="fpemu-monitor", reraise=True, **settings):
    """Run a training script under the monitor and write the report to ``out``.

    The model is the one the script passes to :func:`watch`, or else the module
    that owns the parameters of the first optimizer the script creates (that
    optimizer's state is counted too). Returns the :class:`Monitor` (``None`` if
    the script created neither).
    """
    torch = torch_module()
    _check_script(path, "monitor")
    Monitor(torch.nn.Linear(1, 1), **settings)           # check the settings before running
    from ..tensorfiles import check_output_dir
    check_output_dir(out, "report folder")               # and where the report goes
    _PENDING["settings"] = dict(settings)
    _ACTIVE.clear()
    dist = torch.distributed
    real_destroy = dist.destroy_process_group if dist.is_available() else None

    def destroy(group=None, *args, **kwargs):
        # a torchrun script's last line: merge the ranks' counts while the group lives
        if group is None:
            for m in _ACTIVE:
                try:
                    m.gather()
                except Exception as err:    # noqa: BLE001 - reported by report() below
                    warnings.warn(f"fpemu monitor: the ranks' counts could not be merged "
                                  f"({type(err).__name__}: {err})", stacklevel=2)
        return real_destroy(group, *args, **kwargs)

    if real_destroy is not None:
        dist.destroy_process_group = destroy
    try:
        # sys.exit(n), or a run that dies (of a NaN, say): the report is written all the same
        error, exit_code = run_hooked(path, argv, watch, lambda: bool(_ACTIVE))
    finally:
        if real_destroy is not None:
            dist.destroy_process_group = real_destroy
        _PENDING.clear()
        for mon in _ACTIVE:
            mon.stop()
    mon = _ACTIVE[0] if _ACTIVE else None
    if mon is not None:
        mon.script_error = error
        mon.script_exit = exit_code
        # every rank calls it: rank 0 writes the job's report, the others None
        mon.report_path = mon.report(out)
    if error is not None and (reraise or mon is None):
        raise error
    return mon
