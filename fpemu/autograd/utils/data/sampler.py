"""``torch.utils.data.sampler``: the index samplers, drawing from the
generators as torch's do (the same seed gives torch's order). Samplers
draw lazily: ``RandomSampler(..., replacement=True, num_samples=10**10)``
costs nothing until iterated, and then 32 indices at a time."""

from __future__ import annotations

import numbers

import numpy as np

from ..._rng import Generator
from ..._state import State
from ..._core import tensor
from ...ops.creation import multinomial


def _int64_seed(gen):
    """``torch.empty((), dtype=torch.int64).random_()``: a 64-bit draw modulo
    2**63 (ATen's uniform_int for int64)."""
    return int(gen.draws64(1)[0]) % (1 << 63)


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value}")


def _check_bool(name, value, error=ValueError):
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value}")


class Sampler:
    """Base class: ``__iter__`` yields indices (``__len__`` optional)."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError("Subclasses of Sampler should implement __iter__.")


class SequentialSampler(Sampler):
    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh permutation per pass (or draws with replacement). Without a
    generator, each pass seeds a new one with a 64-bit draw of the default
    generator, as torch's does."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source, self.replacement = data_source, replacement
        self._num_samples, self.generator = num_samples, generator
        _check_bool("replacement", replacement, TypeError)     # torch's classes, as torch
        _check_positive("num_samples", self.num_samples)

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        gen = self.generator
        if gen is None:
            gen = Generator().manual_seed(_int64_seed(State.generator))
        total = int(self.num_samples)
        if self.replacement:
            for _ in range(total // 32):
                yield from gen.randint(0, n, 32).tolist()
            yield from gen.randint(0, n, total % 32).tolist()
        else:
            for _ in range(total // n):
                yield from gen.randperm(n).tolist()
            yield from gen.randperm(n).tolist()[:total % n]

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order (``randperm`` of the generator, the
    default one if None)."""

    def __init__(self, indices, generator=None):
        self.indices, self.generator = indices, generator

    def __iter__(self):
        gen = State.generator if self.generator is None else self.generator
        for i in gen.randperm(len(self.indices)).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """Indices drawn with the given (unnormalised) weights. The law is
    torch's; the draws are fpemu's ``multinomial`` (not torch's exact
    numbers, ``docs/autograd.md``)."""

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        _check_positive("num_samples", num_samples)
        _check_bool("replacement", replacement)
        w = np.asarray(weights._data if hasattr(weights, "_data") else weights, np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape "
                             f"{tuple(w.shape)}")
        self.weights, self.num_samples = w, int(num_samples)
        self.replacement, self.generator = replacement, generator

    def __iter__(self):
        rand = multinomial(tensor(self.weights), self.num_samples, self.replacement,
                           generator=self.generator)
        yield from rand.tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Groups the indices of ``sampler`` into lists of ``batch_size``."""

    def __init__(self, sampler, batch_size, drop_last):
        _check_positive("batch_size", batch_size)
        _check_bool("drop_last", drop_last)
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
