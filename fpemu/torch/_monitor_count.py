"""The monitor's counting: each captured tensor scaled as each scaling says
(:mod:`._monitor_scaling`), counted in each what-if format, on the device or
on the host, and recorded (:class:`~._monitor_records.Record`); a shard of a
DTensor (FSDP2) is scaled by its whole tensor's amax."""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np

from ..checks import as_format
from ._monitor_records import _GRAD_KINDS, Record, _policy
from ._monitor_scaling import mx_scaled, nvfp4_scaled, te_scale, te_scaled


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


class _Counting:
    """The counting half of :class:`~fpemu.torch.Monitor` (a mixin: the state
    is the monitor's, set by its ``__init__`` and ``start``)."""

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
        from ..stats import stats_many      # (local: needs Numba; importing fpemu.torch does not)
        torch = self._torch
        fmts = [as_format(n) for n in names]
        policies = [_policy(f) for f in fmts]
        on_device = self.count_on == "device" or (
            self.count_on == "auto" and src.device.type != "cpu")
        total = None
        for start in range(0, src.numel(), self.chunk):
            part = src[start:start + self.chunk]
            if on_device:                   # only the counts come back
                from ._stats import stats as device_stats   # (local: imports torch and Numba)
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
            s = te_scale(f.max, ref, self.margin)
            return te_scaled(torch, flat, s), float(s), 1.0
        if scaling == "nvfp4":      # (a shard's tensor scale is the whole tensor's)
            return nvfp4_scaled(torch, t, f, amax_raw if sharded else None), float("nan"), 1.0
        # MX: one power-of-two scale per block of the last dimension (rows never share one)
        return mx_scaled(torch, t, f, self.block), float("nan"), 1.0
