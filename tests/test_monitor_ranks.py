"""fpemu.torch.monitor across the ranks of a torch.distributed job.

Real ``torchrun`` jobs (gloo, processes on this CPU, with timeouts): DDP and
FSDP2 (``fully_shard``) scripts under both launch styles, ``torchrun
--no-python fpemu monitor ... train.py`` and a monitor started inside the
script. The oracle of the merged counts is a run of the same model in this
one process, without torch.distributed, over each rank's batch (its counting
is checked against fpemu.stats by tests/test_monitor.py; what is checked here
is the merge: which counts add up across ranks and which are counted once).
The merge itself is also checked on hand-made records, without processes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu  # noqa: E402
import fpemu.torch  # noqa: E402
from fpemu.torch import _monitor as M  # noqa: E402
from torchrun_jobs import fpemu_cli as _fpemu_cli, torchrun as _torchrun  # noqa: E402

SCRIPT = '''
"""A DDP or FSDP2 training script as tutorials write it, run by torchrun (gloo, CPU)."""
import argparse, os, sys
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--fsdp", action="store_true")
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--inside", default=None, help="monitor inside the script; report folder")
ap.add_argument("--scaling", default="none")
ap.add_argument("--same-data", action="store_true")
ap.add_argument("--spike", type=float, default=0.0, help="an input value of rank 1's")
ap.add_argument("--die-rank", type=int, default=-1)
args = ap.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
if args.fsdp:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (world,))
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
else:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
mon = None
if args.inside:
    import fpemu.torch
    mon = fpemu.torch.monitor(model, opt, scaling=args.scaling.split(",")).start()
for step in range(args.steps):
    x, y = batch(0 if args.same_data else rank, step)
    if rank == args.die_rank:
        sys.exit(7)
    if rank == 1 and args.spike:
        x[0, 0] = args.spike
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
if mon is not None:
    mon.stop()
    print(f"rank {rank}: report {mon.report(args.inside)}", flush=True)
dist.destroy_process_group()
'''

BATCH = '''
import torch


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
'''


def _write(tmp_path):
    script = tmp_path / "train.py"
    # the script's batches come from the same text as this file's oracle
    script.write_text(BATCH + SCRIPT)
    return script


def _batch(rank, step):
    ns = {}
    exec(BATCH, ns)          # noqa: S102 - the batches the job's ranks draw
    return ns["batch"](rank, step)


def _single(rank_batches, steps, **settings):
    """The oracle: the same model and optimizer in this process, no process
    group, monitored over the batches of ``rank_batches`` (each step's: the
    mean of the ranks' gradients, as DDP and FSDP2 reduce them, is the one
    the optimizer takes; here every rank's batch is the same, so it is it)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mon = fpemu.torch.monitor(model, opt, **settings).start()
    for step in range(steps):
        x, y = _batch(rank_batches, step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    mon.stop()
    return mon


def _key(r):
    return (r["step"], r["module"], r["kind"], r["format"], r["scaling"])


_COUNT_FIELDS = ("numel", "nan", "inf", "zero", "flushed", "subnormal", "normal", "overflow",
                 "rounded_to_max")


def _counts(row):
    return {k: row[k] for k in _COUNT_FIELDS}


def _times(row, n):
    return {k: v * n for k, v in _counts(row).items()}


# ----------------------------------------------------------- real torchrun jobs
def test_fpemu_monitor_under_torchrun_merges_the_ddp_ranks_into_one_report(tmp_path):
    """``torchrun --no-python fpemu monitor``, 2 DDP ranks with different
    batches and a spike in rank 1's: one report, by rank 0; the job's counts
    at step 0 are the two ranks' single-process counts added (activations,
    their gradients, the local weight gradients) and one copy's for the
    replicated weights; the first overflow names rank 1."""
    script = _write(tmp_path)
    out = _torchrun(2, ["--no-python", *_fpemu_cli(), "monitor", "--out", "rep",
                        str(script), "--spike", "3e5"], tmp_path)
    assert out.count("report: ") == 1, out
    assert "rank 1 of 2: " in out and "counts merged into rank 0's report" in out, out
    assert "first overflow: step 0, rank 1 of 2: activation of 0:" in out, out
    rep = tmp_path / "rep"
    assert sorted(p.name for p in rep.iterdir() if p.is_dir()) == []     # no rank folders
    doc = json.loads((rep / "rows.json").read_text())
    assert doc["world"] == 2 and {r["rank"] for r in doc["rank_rows"]} == {0, 1}
    job = {_key(r): r for r in doc["rows"] if r["step"] == 0}

    def one(rank):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8))
        mon = fpemu.torch.monitor(model, kinds=("activation", "activation_grad", "weight",
                                                "weight_grad")).start()
        x, y = _batch(rank, 0)
        if rank == 1:
            x[0, 0] = 3e5
        ((model(x) - y) ** 2).mean().backward()
        mon.stop()
        return {_key(r): r for r in mon.rows()}
    ranks = [one(0), one(1)]
    assert set(ranks[0]) <= set(job)
    for key, r0 in ranks[0].items():
        r1 = ranks[1][key]
        if r0["kind"] == "weight":
            want = _counts(r0)                      # replicated: counted once
            assert _counts(r1) == want              # (the same weights on both ranks)
        else:
            want = {k: r0[k] + r1[k] for k in _COUNT_FIELDS}
        assert _counts(job[key]) == want, key
    html = (rep / "index.html").read_text()
    assert "(2 ranks)" in html and "<h2>Per rank</h2>" in html and "<th>rank 1</th>" in html


def test_a_monitor_inside_an_fsdp2_script_on_four_ranks_counts_whole_tensors(tmp_path):
    """``fpemu.torch.monitor`` inside a ``fully_shard`` script on 4 ranks,
    every rank on the same batches: each weight, weight gradient and Adam
    moment is counted on its shard and the shards add up to the whole
    tensor's counts of a single-process run, bit for bit, under no scaling,
    current scaling (the whole tensor's amax, all-reduced) and NVFP4 (its
    tensor scale from the whole amax; its 16-value blocks lie in the rows of
    a 2-D weight, which FSDP2 does not split); the activations are the sum
    of the 4 ranks' (4 times the single run's). One report, by rank 0."""
    script = _write(tmp_path)
    out = _torchrun(4, [str(script), "--fsdp", "--inside", "rep", "--same-data",
                        "--scaling", "none,current,nvfp4"], tmp_path)
    assert "rank 0: report rep/index.html" in out, out
    for k in (1, 2, 3):
        assert f"rank {k}: report None" in out, out
    doc = json.loads((tmp_path / "rep" / "rows.json").read_text())
    assert doc["world"] == 4
    job = {_key(r): r for r in doc["rows"]}
    single = {_key(r): r for r in _single(0, 2, scaling=("none", "current", "nvfp4")).rows()}
    assert set(job) == set(single)
    checked = 0
    for key, want in single.items():
        got = job[key]
        if want["kind"] in ("activation", "activation_grad"):
            assert _counts(got) == _times(want, 4), key
        elif want["scaling"] == "nvfp4" and want["module"].endswith(".bias"):
            continue        # a bias's 16-value blocks span shards: each rank's own blocks
        else:
            assert _counts(got) == _counts(want), key
            assert got["amax"] == want["amax"], key
            checked += 1
    # steps x kinds x parameters x formats x scalings, less the biases' NVFP4 rows
    assert checked == 2 * 4 * 4 * 4 * 3 - 2 * 4 * 2 * 4 * 1


def test_fpemu_monitor_under_torchrun_with_fsdp2_and_a_monitor_inside_ddp(tmp_path):
    """The other two pairings: the CLI on an FSDP2 script (2 ranks, the same
    batches: the sharded weights' job counts are the single run's) and a
    monitor inside a DDP script (2 ranks)."""
    script = _write(tmp_path)
    out = _torchrun(2, ["--no-python", *_fpemu_cli(), "monitor", "--out", "cli",
                        str(script), "--fsdp", "--same-data"], tmp_path)
    assert out.count("report: ") == 1 and "(2 ranks merged)" in out, out
    job = {_key(r): r for r in json.loads((tmp_path / "cli" / "rows.json").read_text())["rows"]}
    single = {_key(r): r for r in _single(0, 2).rows()}
    for key, want in single.items():
        n = 2 if want["kind"] in ("activation", "activation_grad") else 1
        assert _counts(job[key]) == _times(want, n), key
    out = _torchrun(2, [str(script), "--inside", "in"], tmp_path)
    assert "rank 0: report in/index.html" in out and "rank 1: report None" in out, out
    assert json.loads((tmp_path / "in" / "rows.json").read_text())["world"] == 2


def test_a_rank_that_dies_is_named(tmp_path):
    script = _write(tmp_path)
    with pytest.raises(RuntimeError, match=r"torchrun of 2 ranks failed \(exit 1\): rank 1 "
                                           r"failed first \(exit code 7\)"):
        _torchrun(2, [str(script), "--die-rank", "1", "--inside", "rep"], tmp_path)


# ------------------------------------------------------------- without processes
def _rec(step, module, kind, rank, counts, sharded=False, fmt="fp16", amax=1.0, seq=0):
    return M.Record(step, seq, module, kind, fmt, "none", 1.0, 4, 4, amax, counts, sharded,
                    rank)


def _c(values, fmt="fp16"):
    return fpemu.stats(np.asarray(values, np.float32), fmt, overflow="inf")


def test_merge_adds_per_rank_tensors_and_shards_and_counts_replicas_once():
    a, b = _c([1, 2, 1e-9, 7e4]), _c([3, 0, 1e-6, 1])
    ranks = {
        0: [_rec(0, "fc", "activation", 0, a, seq=0), _rec(0, "fc", "activation", 0, b, seq=1),
            _rec(0, "fc.weight", "weight", 0, a, seq=2),
            _rec(0, "fc.weight", "exp_avg", 0, a, sharded=True, seq=3)],
        1: [_rec(0, "fc", "activation", 1, b, seq=0), _rec(0, "fc", "activation", 1, b, seq=1),
            _rec(0, "fc.weight", "weight", 1, b, amax=5.0, seq=2),
            _rec(0, "fc.weight", "exp_avg", 1, b, sharded=True, seq=3)],
    }
    got = M._merge_ranks(ranks)
    assert [(r.module, r.kind) for r in got] == [("fc", "activation")] * 2 + [
        ("fc.weight", "weight"), ("fc.weight", "exp_avg")]
    # a module that ran twice in the step: the n-th record goes with the n-th
    assert got[0].counts == a + b and got[1].counts == b + b and got[0].numel == 8
    assert got[2].counts == a and got[2].numel == 4 and got[2].amax == 5.0
    assert got[3].counts == a + b and got[3].sharded
    assert set(got[2].ranks) == {0, 1} and got[2].ranks[1].counts == b
    # a rank that recorded a tensor the others did not: merged from the ranks that did
    ranks[1].append(_rec(1, "fc", "activation", 1, a, seq=4))
    last = M._merge_ranks(ranks)[-1]
    assert (last.step, last.counts, set(last.ranks)) == (1, a, {1})


def test_first_overflow_of_merged_records_names_the_ranks():
    a, over = _c([1, 2, 3, 4]), _c([1, 2, 3, 1e5])
    ranks = {r: [_rec(0, "fc", "activation", r, over if r in (1, 3) else a, seq=0),
                 _rec(0, "out", "activation", r, over, seq=1)] for r in range(4)}
    mon = fpemu.torch.monitor(torch.nn.Linear(2, 2), formats=("fp16",))
    mon.rank_records, mon.world = ranks, 4
    mon.records = M._merge_ranks(ranks)
    first = mon.first_overflow()
    assert (first.module, first.ranks, first.world, first.overflowed) == ("fc", (1, 3), 4, 2)
    assert str(first).startswith("step 0, ranks 1, 3 of 4: activation of fc: 2 value(s)")
    from fpemu.torch._report import _rank_table
    html = "".join(_rank_table(mon, "none"))
    assert "<td>fc</td><td>activation</td><td><code>fp16</code></td>" in html
    assert "<td>0.00% / 1</td>" in html and "<td>out</td>" not in html   # equal on all ranks


def test_torchrun_without_a_process_group_writes_one_report_per_rank(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 4)
    with fpemu.torch.monitor(model, formats=("fp16",)) as mon:
        model(torch.randn(2, 4)).sum().backward()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    path = mon.report(str(tmp_path / "rep"))
    assert path == str(tmp_path / "rep" / "rank1" / "index.html") and os.path.exists(path)


def test_the_cli_puts_the_launcher_first(capsys):
    from fpemu import cli
    assert cli.main(["monitor", "--out", "rep", "torchrun", "--nproc_per_node", "2",
                     "train.py"]) == 2
    err = capsys.readouterr().err
    assert "not the launcher 'torchrun'" in err
    assert "torchrun --nproc_per_node N --no-python fpemu monitor ... train.py" in err
