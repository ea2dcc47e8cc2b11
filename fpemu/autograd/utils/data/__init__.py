"""``torch.utils.data``: ``Dataset``, ``TensorDataset``, ``DataLoader`` (in
the main process: batching, shuffling from the default generator as torch's
``RandomSampler`` draws it, ``drop_last``, collation of tensors, numbers,
tuples and dicts)."""

from __future__ import annotations

import collections.abc
import numbers

import numpy as np

from ..._core import Tensor, tensor
from ..._state import State


class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class TensorDataset(Dataset):
    """Samples are ``tuple(t[i] for t in tensors)``."""

    def __init__(self, *tensors):
        if any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class ConcatDataset(Dataset):
    def __init__(self, datasets):
        self.datasets = list(datasets)
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]))

    def __len__(self):
        return int(self.cumulative_sizes[-1]) if self.cumulative_sizes else 0

    def __getitem__(self, idx):
        if idx < 0:
            idx += len(self)
        k = int(np.searchsorted(self.cumulative_sizes, idx, side="right"))
        start = 0 if k == 0 else int(self.cumulative_sizes[k - 1])
        return self.datasets[k][idx - start]


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, idx):
        return self.dataset[self.indices[idx]]

    def __len__(self):
        return len(self.indices)


class SequentialSampler:
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler:
    """A permutation per epoch. torch seeds it with one int64 from the default
    generator and permutes with that seed; fpemu draws the seed the same way
    and permutes with ``randperm`` of a generator seeded with it."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement = data_source, replacement
        self._num_samples, self.generator = num_samples, generator

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        from ..._rng import Generator
        n = len(self.data_source)
        gen = self.generator
        if gen is None:
            seed = int(State.generator.draws64(1)[0].astype(np.int64))
            gen = Generator().manual_seed(seed)
        if self.replacement:
            return iter(gen.randint(0, n, self.num_samples).tolist())
        return iter(gen.randperm(n).tolist()[:self.num_samples])

    def __len__(self):
        return self.num_samples


class BatchSampler:
    def __init__(self, sampler, batch_size, drop_last):
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def default_collate(batch):
    """Stack tensors, turn numbers into tensors, recurse into tuples, lists
    and dicts (torch's default_collate)."""
    first = batch[0]
    if isinstance(first, Tensor):
        from ...ops.shape import stack
        return stack(list(batch), 0)
    if isinstance(first, np.ndarray):
        return tensor(np.stack(batch))
    if isinstance(first, bool):
        return tensor(batch)
    if isinstance(first, numbers.Integral):
        return tensor(batch)
    if isinstance(first, numbers.Real):
        from ..._core import float64
        return tensor(batch, dtype=float64)
    if isinstance(first, str):
        return list(batch)
    if isinstance(first, collections.abc.Mapping):
        return {k: default_collate([b[k] for b in batch]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(first, collections.abc.Sequence):
        return [default_collate(list(s)) for s in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, "
                    f"dicts or lists; found {type(first)}")


class DataLoader:
    """Batches of a dataset, in the main process (``num_workers`` must be 0:
    fpemu's loader does not fork)."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False,
                 timeout=0, worker_init_fn=None, generator=None, prefetch_factor=None,
                 persistent_workers=False, **kwargs):
        if num_workers:
            raise ValueError(f"DataLoader(num_workers={num_workers}): fpemu loads in the "
                             f"main process; pass num_workers=0")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        if sampler is None:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        self.sampler = sampler
        if batch_sampler is None and batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn or (default_collate if batch_size is not None
                                         else (lambda x: x))
        self.generator = generator

    def __iter__(self):
        # torch's loader iterator draws a 64-bit base seed (for its workers) first
        (State.generator if self.generator is None else self.generator).draws64(1)
        if self.batch_sampler is None:
            for i in self.sampler:
                yield self.collate_fn(self.dataset[i])
            return
        for idx in self.batch_sampler:
            yield self.collate_fn([self.dataset[i] for i in idx])

    def __len__(self):
        if self.batch_sampler is None:
            return len(self.sampler)
        return len(self.batch_sampler)


def random_split(dataset, lengths, generator=None):
    n = len(dataset)
    if all(isinstance(x, float) for x in lengths) and abs(sum(lengths) - 1) < 1e-9:
        sizes = [int(np.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    gen = State.generator if generator is None else generator
    perm = gen.randperm(n).tolist()
    out, start = [], 0
    for length in lengths:
        out.append(Subset(dataset, perm[start:start + length]))
        start += length
    return out
