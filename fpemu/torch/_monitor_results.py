"""The monitor's results: the ranks' records merged into the job's
(:meth:`gather`), and what is read from them (rows, a table, JSON, the first
overflow, the HTML report)."""

from __future__ import annotations

import datetime
import json
import math
import os
import warnings

from ..errors import FpemuValueError
from ..tensorfiles import check_output_dir
from ._import import torch_module
from ._monitor_records import FirstOverflow, _merge_ranks
from ._report import write_report


class _Results:
    """Merging and reading the records of :class:`~fpemu.torch.Monitor` (a
    mixin: the state is the monitor's)."""

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
            import pandas as pd     # (local: an optional dependency)
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
        check_output_dir(out_dir, "report folder")
        try:
            self.gather()
        except Exception as err:     # gloo's errors have several types
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


def _torchrun_world():
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1
