"""``torch.utils.data.dataloader``: :class:`DataLoader`, ``default_collate``
and ``get_worker_info``.

Batches are what torch's loader yields, in torch's order, with or without
workers. ``num_workers > 0`` runs the workers' code in this process, one
batch at a time, exactly as each worker process would run it:

* every iterator (every epoch, or once with ``persistent_workers``) draws a
  64-bit base seed from the loader's generator (torch's draw, also made
  with ``num_workers=0``);
* worker ``w`` has its own random state, seeded as torch seeds its
  processes: ``random.seed(base + w)``, ``torch.manual_seed(base + w)`` and
  ``numpy.random.seed`` with torch's ``_generate_state(base, w)`` (numpy's
  ``SeedSequence`` mixing of ``[w, base & 0xFFFFFFFF, base >> 32, 0]``);
  it calls ``worker_init_fn(w)`` first; ``get_worker_info()`` answers
  inside it;
* a map-style dataset's batch ``k`` is fetched by worker ``k % num_workers``
  (torch's round-robin, results in order); an iterable dataset is iterated
  by each worker on its own copy, the batches taken round-robin over the
  workers that still have data.

So random augmentations inside ``__getitem__`` draw the numbers they draw
under torch. No process is started: fpemu's numerics do not depend on
processes, and the loader stays deterministic. Results are always in
order (``in_order=False`` changes only timing in torch).
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import numbers
import random
import re

import numpy as np

from ..._core import Tensor, float64, tensor
from ..._state import State
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler, _int64_seed
from ..._rng import Generator
from ...ops.shape import stack


# ---------------------------------------------------------------- collation
def default_convert(data):
    """numpy arrays (not of strings or objects) to tensors, recursively;
    everything else unchanged (torch's ``default_convert``)."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if data.dtype.kind in "OSUV" else tensor(data)
    if isinstance(data, np.generic) and data.dtype.kind not in "OSUV":
        return tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return type(data)({k: default_convert(v) for k, v in data.items()}) \
            if not isinstance(data, dict) or type(data) is not dict else \
            {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, (list, tuple)):
        return type(data)(default_convert(d) for d in data)
    return data


_BAD_NP = re.compile(r"[SaUO]")


def default_collate(batch):
    """Stack tensors and arrays, turn numbers into tensors (int64, float64,
    bool), keep strings, recurse into tuples, named tuples, lists and dicts
    (torch's ``default_collate``)."""
    first = batch[0]
    if isinstance(first, Tensor):
        return stack(list(batch), 0)
    if isinstance(first, np.ndarray):
        if _BAD_NP.search(first.dtype.str):
            raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, "
                            f"numbers, dicts or lists; found {first.dtype}")
        return tensor(np.stack(batch))
    if isinstance(first, np.generic):
        return tensor(np.asarray(batch))
    if isinstance(first, bool):
        return tensor(batch)
    if isinstance(first, numbers.Integral):
        return tensor(batch)
    if isinstance(first, numbers.Real):
        return tensor(batch, dtype=float64)
    if isinstance(first, (str, bytes)):
        return list(batch)
    if isinstance(first, collections.abc.Mapping):
        return {k: default_collate([b[k] for b in batch]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(first, collections.abc.Sequence):
        sizes = {len(b) for b in batch}
        if len(sizes) != 1:
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(s)) for s in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(first)}")


# ------------------------------------------------------------------ workers
@dataclasses.dataclass
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: object


_current_worker = []


def get_worker_info():
    """Inside a DataLoader worker: its :class:`WorkerInfo`; elsewhere None."""
    return _current_worker[-1] if _current_worker else None


def _numpy_seed(base_seed, worker_id):
    """torch's ``_generate_state(base_seed, worker_id)``: numpy's SeedSequence
    mixing of ``[worker_id, low 32 bits, high 32 bits, 0]``, four words."""
    entropy = [worker_id, base_seed & 0xFFFFFFFF, base_seed >> 32, 0]
    return np.random.SeedSequence(entropy).generate_state(4, np.uint32)


class _Worker:
    """One emulated worker process: its dataset copy, its random states and,
    for an iterable dataset, its iterator."""

    def __init__(self, loader, worker_id, base_seed):
        self.id = worker_id
        seed = base_seed + worker_id
        iterable = isinstance(loader.dataset, IterableDataset)
        self.dataset = copy.deepcopy(loader.dataset) if iterable else loader.dataset
        self.info = WorkerInfo(worker_id, loader.num_workers, seed, self.dataset)
        self.torch_state = Generator().manual_seed(seed).get_state()
        saved_py = random.getstate()
        random.seed(seed)
        self.py_state = random.getstate()
        random.setstate(saved_py)
        saved_np = np.random.get_state()
        np.random.seed(_numpy_seed(base_seed, worker_id))
        self.np_state = np.random.get_state()
        np.random.set_state(saved_np)
        self.loader = loader
        self.iterator = None
        if loader.worker_init_fn is not None:
            self.run(loader.worker_init_fn, worker_id)

    def run(self, fn, *args):
        """``fn(*args)`` with this worker's random states and worker info."""
        main = (State.generator.get_state(), random.getstate(), np.random.get_state())
        State.generator.set_state(self.torch_state)
        random.setstate(self.py_state)
        np.random.set_state(self.np_state)
        _current_worker.append(self.info)
        try:
            return fn(*args)
        finally:
            _current_worker.pop()
            self.torch_state = State.generator.get_state()
            self.py_state = random.getstate()
            self.np_state = np.random.get_state()
            State.generator.set_state(main[0])
            random.setstate(main[1])
            np.random.set_state(main[2])

    def start_epoch(self):
        if isinstance(self.dataset, IterableDataset):
            self.iterator = self.run(iter, self.dataset)

    def next_batch(self):
        """The next batch of an iterable dataset, or StopIteration."""
        return self.run(_fetch_iterable, self.loader, self.iterator)


def _fetch_iterable(loader, it):
    if loader.batch_size is None:
        return loader.collate_fn(next(it))
    batch = []
    for item in it:
        batch.append(item)
        if len(batch) == loader.batch_size:
            break
    if not batch or (loader.drop_last and len(batch) < loader.batch_size):
        raise StopIteration
    return loader.collate_fn(batch)


class DataLoader:
    """Batches of a dataset, as torch's DataLoader yields them (module
    docstring: workers are emulated in this process)."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, multiprocessing_context=None, generator=None,
                 *, prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True):
        if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral):
            raise TypeError(f"num_workers option should be an int, got "
                            f"{type(num_workers).__name__}")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in "
                             "multiprocessing.let num_workers > 0 to enable multiprocessing, "
                             "otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            if shuffle not in (None, False):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")
        self.dataset, self.num_workers = dataset, num_workers
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.timeout = timeout
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.in_order, self.generator = in_order, generator
        self.batch_size, self.drop_last = batch_size, drop_last
        if sampler is None and not iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        self.sampler = sampler
        if batch_size is not None and batch_sampler is None and not iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = default_collate if (batch_size is not None or
                                             batch_sampler is not None) else default_convert
        self.collate_fn = collate_fn
        self._workers = None

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    def _base_seed(self):
        return _int64_seed(State.generator if self.generator is None else self.generator)

    def _start_workers(self):
        base = self._base_seed()
        return [_Worker(self, w, base) for w in range(self.num_workers)]

    def __iter__(self):
        if self.num_workers == 0:
            self._base_seed()                 # torch draws it for workers it does not start
            return self._single_process()
        if self.persistent_workers:
            if self._workers is None:
                self._workers = self._start_workers()
            workers = self._workers
        else:
            workers = self._start_workers()
        return self._with_workers(workers)

    def _fetch(self, index):
        if self._auto_collation:
            return self.collate_fn([self.dataset[i] for i in index])
        return self.collate_fn(self.dataset[index])

    def _single_process(self):
        if isinstance(self.dataset, IterableDataset):
            it = iter(self.dataset)
            while True:
                try:
                    yield _fetch_iterable(self, it)
                except StopIteration:
                    return
        indices = self.batch_sampler if self._auto_collation else self.sampler
        for index in indices:
            yield self._fetch(index)

    def _with_workers(self, workers):
        for w in workers:
            w.start_epoch()
        if isinstance(self.dataset, IterableDataset):
            # torch sends each batch request to the next worker in a cycle
            # that skips the workers whose copy of the stream has ended
            active = [True] * len(workers)
            k = 0
            while any(active):
                w = k % len(workers)
                k += 1
                if not active[w]:
                    continue
                try:
                    batch = workers[w].next_batch()
                except StopIteration:
                    active[w] = False
                    continue
                yield batch
            return
        indices = self.batch_sampler if self._auto_collation else self.sampler
        for k, index in enumerate(indices):
            yield workers[k % len(workers)].run(self._fetch, index)

    def __len__(self):
        if isinstance(self.dataset, IterableDataset):
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)
