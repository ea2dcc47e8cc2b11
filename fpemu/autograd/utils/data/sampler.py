"""``torch.utils.data.sampler``: the index samplers, drawing from the
generators as torch's do (the same seed gives torch's order). Samplers
draw lazily: ``RandomSampler(..., replacement=True, num_samples=10**10)``
costs nothing until iterated, and then 32 indices at a time."""

from __future__ import annotations

import numbers

import numpy as np

from ..._rng import Generator
from ..._state import State


def _int64_seed(gen):
    """``torch.empty((), dtype=torch.int64).random_()``: a 64-bit draw modulo
    2**63 (ATen's uniform_int for int64)."""
    return int(gen.draws64(1)[0]) % (1 << 63)


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
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got "
                            f"replacement={replacement}")
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got "
                             f"num_samples={n}")

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
        if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or \
                num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got "
                             f"num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got "
                             f"replacement={replacement}")
        w = np.asarray(weights._data if hasattr(weights, "_data") else weights, np.float64)
        if w.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape "
                             f"{tuple(w.shape)}")
        self.weights, self.num_samples = w, int(num_samples)
        self.replacement, self.generator = replacement, generator

    def __iter__(self):
        from ...ops.creation import multinomial
        from ..._core import tensor
        rand = multinomial(tensor(self.weights), self.num_samples, self.replacement,
                           generator=self.generator)
        yield from rand.tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Groups the indices of ``sampler`` into lists of ``batch_size``."""

    def __init__(self, sampler, batch_size, drop_last):
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or \
                batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got "
                             f"drop_last={drop_last}")
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
