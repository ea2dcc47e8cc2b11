"""What the monitor records: a :class:`Record` per tensor, format and
scaling, :class:`FirstOverflow` (where a run first left a format's range),
and how the ranks' records of one job merge into the job's."""

from __future__ import annotations

import dataclasses

from ..checks import as_format

#: What is recorded, in the order a training step produces it.
KINDS = ("activation", "activation_grad", "weight", "weight_grad", "exp_avg", "exp_avg_sq")
_GRAD_KINDS = ("activation_grad", "weight_grad")


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


def _policy(fmt):
    """The overflow policy the monitor counts with: one that tells a value beyond the
    range (inf, else NaN) from one that only rounds down to the largest value."""
    f = as_format(fmt)
    return "inf" if f.has_inf else ("nan" if f.has_nan else None)


#: the kinds whose ranks hold different tensors (each rank's batch, its local gradients):
#: their counts add up across ranks; a weight or an optimizer moment does only when sharded
_PER_RANK_KINDS = ("activation", "activation_grad", "weight_grad")


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
