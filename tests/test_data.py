"""``fpemu.autograd.utils.data`` against torch's own DataLoader (with real
worker processes): the same batches, in the same order, with the same
random numbers drawn inside the workers."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

import fpemu.autograd as ft
from fpemu.autograd.utils import data as fdata

import torch  # installed by `make` (the dev extras): the reference loader
from torch.utils import data as tdata


def _random_dataset(lib, data_mod):
    class Draws(data_mod.Dataset):
        """Each sample: the index, the worker, its seed and one number from
        each generator a worker has (torch, numpy, random)."""

        def __len__(self):
            return 11

        def __getitem__(self, i):
            info = data_mod.get_worker_info()
            return (i, -1 if info is None else info.id, 0 if info is None else info.seed,
                    float(lib.rand(1)[0]), float(np.random.rand()), random.random())
    return Draws()


def _epochs(lib, data_mod, epochs=2, **kwargs):
    if kwargs.get("num_workers"):
        kwargs.setdefault("timeout", 120)        # a hung worker fails, never hangs the run
    loader = data_mod.DataLoader(_random_dataset(lib, data_mod), batch_size=3, shuffle=True,
                                 generator=lib.Generator().manual_seed(5), **kwargs)
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append([np.asarray(b.tolist() if hasattr(b, "tolist") else b, np.float64)
                        for b in batch])
    return out


# torch warns when a loader asks for more workers than the machine has cores
# (CI's has 2); fpemu starts no process and does not warn.
MANY_WORKERS = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@MANY_WORKERS
@pytest.mark.parametrize("kwargs", [dict(num_workers=0), dict(num_workers=2),
                                    dict(num_workers=3, persistent_workers=True),
                                    dict(num_workers=2, worker_init_fn="seed")],
                         ids=["main", "2-workers", "persistent", "init-fn"])
def test_batches_and_worker_random_numbers_are_torchs(kwargs):
    kwargs = dict(kwargs)
    results = []
    for lib, data_mod in ((torch, tdata), (ft, fdata)):
        if kwargs.get("worker_init_fn") is not None:
            def init(worker_id, lib=lib):
                np.random.seed(lib.initial_seed() % 2 ** 32 + 17 * worker_id)
                random.seed(worker_id)
            kwargs["worker_init_fn"] = init
        lib.manual_seed(3)
        np.random.seed(1)
        random.seed(2)
        batches = _epochs(lib, data_mod, **kwargs)
        after = (float(lib.rand(1)[0]), np.random.rand(), random.random())
        results.append((batches, after))
    (tb, t_after), (fb, f_after) = results
    assert len(tb) == len(fb) == 8
    for a, b in zip(tb, fb):
        for col_t, col_f in zip(a, b):
            np.testing.assert_array_equal(col_f, col_t)
    assert t_after == f_after          # the main process's generators are untouched


def test_numpy_seed_of_a_worker_is_torchs():
    from torch.utils.data._utils.worker import _generate_state
    from fpemu.autograd.utils.data.dataloader import _numpy_seed
    for base in (0, 1, 2 ** 32 - 1, 2 ** 32, 123456789012345, 2 ** 63 - 1):
        for w in (0, 1, 7):
            assert list(_numpy_seed(base, w)) == list(_generate_state(base, w))


def _shards(data_mod, get_info):
    class Shards(data_mod.IterableDataset):
        """Worker w yields 2*w + 1 items (its own shard), tagged."""

        def __iter__(self):
            info = get_info()
            w = 0 if info is None else info.id
            return iter([(w, k) for k in range(2 * w + 1)])
    return Shards()


@MANY_WORKERS
@pytest.mark.parametrize("workers,batch", [(0, 2), (2, 2), (3, 1), (3, None)])
def test_iterable_datasets_round_robin_over_live_workers(workers, batch):
    got = []
    for data_mod in (tdata, fdata):
        loader = data_mod.DataLoader(_shards(data_mod, data_mod.get_worker_info),
                                     batch_size=batch, num_workers=workers)
        got.append([[list(map(int, x)) for x in (b if batch is None else zip(*b))]
                    if batch else [int(v) for v in b] for b in loader])
    assert got[1] == got[0]


def test_random_sampler_is_lazy_and_torchs():
    torch.manual_seed(8)
    ft.manual_seed(8)
    huge_t = tdata.RandomSampler(range(10), replacement=True, num_samples=int(1e10))
    huge_f = fdata.RandomSampler(range(10), replacement=True, num_samples=int(1e10))
    assert len(huge_f) == 10 ** 10
    assert list(itertools.islice(huge_f, 70)) == list(itertools.islice(huge_t, 70))
    for n in (7, 23):                          # several permutations, then a part of one
        gt, gf = torch.Generator().manual_seed(n), ft.Generator().manual_seed(n)
        assert list(fdata.RandomSampler(range(5), num_samples=n, generator=gf)) == \
            list(tdata.RandomSampler(range(5), num_samples=n, generator=gt))
    for lib, mod in ((torch, tdata), (ft, fdata)):
        lib.manual_seed(1)
    assert list(fdata.SubsetRandomSampler([10, 20, 30, 40])) == \
        list(tdata.SubsetRandomSampler([10, 20, 30, 40]))


def test_loader_arguments_refused_as_torch():
    ds = fdata.TensorDataset(ft.arange(4))
    cases = [
        (dict(num_workers=-1), ValueError, "num_workers option should be non-negative"),
        (dict(prefetch_factor=2), ValueError, "prefetch_factor option could only be specified"),
        (dict(persistent_workers=True), ValueError, "persistent_workers option needs"),
        (dict(timeout=-1), ValueError, "timeout option should be non-negative"),
        (dict(sampler=[0, 1], shuffle=True), ValueError, "mutually exclusive with shuffle"),
        (dict(batch_size=None, drop_last=True), ValueError, "disables auto-batching"),
        (dict(batch_sampler=[[0]], batch_size=2), ValueError, "batch_sampler option is "),
        (dict(num_workers=1.5), TypeError, "num_workers option should be an int"),
    ]
    for kwargs, err, msg in cases:
        with pytest.raises(err, match=msg):
            fdata.DataLoader(ds, **kwargs)
        if err is ValueError:
            with pytest.raises(err, match=msg):
                tdata.DataLoader(tdata.TensorDataset(torch.arange(4)), **kwargs)
    it = _shards(fdata, fdata.get_worker_info)
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        fdata.DataLoader(it, shuffle=True)
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        fdata.RandomSampler(range(3), num_samples=0)
    assert fdata.get_worker_info() is None


def test_module_layout_is_torchs():
    import fpemu.autograd.utils.data.dataloader as fdl
    import fpemu.autograd.utils.data.sampler as fsm
    assert fdl.DataLoader is fdata.DataLoader and fdl.default_collate is fdata.default_collate
    assert fsm.RandomSampler is fdata.RandomSampler
    out = fdl.default_collate([{"x": np.float32(1), "y": (1, "a")},
                               {"x": np.float32(2), "y": (2, "b")}])
    assert out["x"].tolist() == [1.0, 2.0] and out["y"][0].tolist() == [1, 2] and \
        out["y"][1] == ["a", "b"]
