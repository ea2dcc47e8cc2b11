"""``torch.nn.utils.rnn``: packed sequences for the recurrent layers.

A :class:`PackedSequence` holds the steps of a batch of sequences of
different lengths, longest first: ``data`` is step 0 of every sequence, then
step 1 of those still running, and so on; ``batch_sizes[t]`` counts the
sequences running at step t. Packing and unpacking are indexing (exact and
differentiable); the recurrent layers run on the packed rows as ATen's packed
layers do (``nn/modules/rnn.py``).
"""

from __future__ import annotations

import collections

import numpy as np

from ..._core import Tensor, int64, is_float, tensor
from ...ops.creation import full
from ...ops.shape import cat, stack


class PackedSequence(collections.namedtuple(
        "PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """``(data, batch_sizes, sorted_indices, unsorted_indices)``; build one with
    :func:`pack_padded_sequence` or :func:`pack_sequence`."""

    def __new__(cls, data, batch_sizes=None, sorted_indices=None, unsorted_indices=None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _invert_permutation(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args, **kwargs):
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else type(self)(data, self.batch_sizes,
                                                         self.sorted_indices,
                                                         self.unsorted_indices)

    def cuda(self, *args, **kwargs):
        return self

    def cpu(self, *args, **kwargs):
        return self

    def float(self):
        return self.to(dtype="float32")

    def half(self):
        return self.to(dtype="float16")

    def bfloat16(self):
        return self.to(dtype="bfloat16")

    @property
    def is_cuda(self):
        return self.data.is_cuda

    def is_pinned(self):
        return False


def _invert_permutation(perm):
    if perm is None:
        return None
    p = np.asarray(perm._data if isinstance(perm, Tensor) else perm, np.int64)
    inv = np.empty_like(p)
    inv[p] = np.arange(p.size, dtype=np.int64)
    return tensor(inv, dtype=int64)


def _lengths(lengths):
    if isinstance(lengths, Tensor):
        if is_float(lengths.dtype):
            raise TypeError(f"pack_padded_sequence: lengths must be integers (a list or an "
                            f"int64 CPU tensor), got a tensor of dtype {lengths.dtype}")
        arr = lengths._data
    else:
        arr = np.asarray(list(lengths))
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"pack_padded_sequence: lengths must be integers, got "
                            f"{list(lengths)!r}")
    return np.asarray(arr, np.int64).reshape(-1)


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """Pack a padded batch ``(T, B, *)`` (``(B, T, *)`` with ``batch_first``)
    of sequences of the given lengths. With ``enforce_sorted=False`` the
    batch is sorted by length first (a stable descending sort, as torch's CPU
    sort) and the permutation is kept for unpacking."""
    L = _lengths(lengths)
    if input.ndim < 2:
        raise ValueError(f"pack_padded_sequence: expected an input of 2 or more dimensions "
                         f"(T, B, *), got shape {list(input.shape)}")
    bdim = 0 if batch_first else 1
    if L.size != input.shape[bdim]:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{L.size} (batch_size={input.shape[bdim]})")
    if enforce_sorted:
        if np.any(L[1:] > L[:-1]):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when "
                               "`enforce_sorted` is True. You can pass `enforce_sorted=False` "
                               "to pack_padded_sequence and/or pack_sequence to sidestep this "
                               "requirement if you do not need ONNX exportability.")
        sorted_indices = None
    else:
        order = np.argsort(-L, kind="stable")
        L = L[order]
        sorted_indices = tensor(order.astype(np.int64), dtype=int64)
        input = input.index_select(bdim, sorted_indices)
    if L.size and L.min() <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    x = input.transpose(0, 1) if batch_first else input
    if L.size and L[0] > x.shape[0]:
        raise RuntimeError(f"pack_padded_sequence: a length of {int(L[0])} is longer than "
                           f"the padded sequence ({x.shape[0]} steps)")
    T = int(L[0]) if L.size else 0
    sizes = np.array([(L > t).sum() for t in range(T)], np.int64)
    steps = [x[t, :int(sizes[t])] for t in range(T)]
    data = cat(steps, 0) if steps else x.reshape((0,) + tuple(x.shape[2:]))
    return PackedSequence(data, tensor(sizes, dtype=int64), sorted_indices, None)


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """Unpack to a padded batch and the lengths (in the original order)."""
    data, sizes = sequence.data, sequence.batch_sizes._data.astype(np.int64)
    T = sizes.size
    B = int(sizes[0]) if T else 0
    if total_length is not None:
        if total_length < T:
            raise ValueError(f"Expected total_length to be at least the length of the longest "
                             f"sequence in input, but got total_length={total_length} and max "
                             f"sequence length being {T}")
        T_out = int(total_length)
    else:
        T_out = T
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    feat = tuple(data.shape[1:])
    rows = []
    for t in range(T_out):
        if t < T:
            step = data[int(offsets[t]):int(offsets[t + 1])]
            missing = B - int(sizes[t])
            if missing:
                pad = full((missing,) + feat, padding_value, dtype=data.dtype)
                step = cat([step, pad], 0)
        else:
            step = full((B,) + feat, padding_value, dtype=data.dtype)
        rows.append(step)
    padded = stack(rows, 0) if rows else full((0, B) + feat, padding_value, dtype=data.dtype)
    lengths = np.array([(sizes > b).sum() for b in range(B)], np.int64)
    if sequence.unsorted_indices is not None:
        padded = padded.index_select(1, sequence.unsorted_indices)
        lengths = lengths[sequence.unsorted_indices._data.astype(np.int64)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, tensor(lengths, dtype=int64)


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack tensors of different first-dim lengths into ``(T, B, *)``
    (``(B, T, *)`` with ``batch_first``), padded with ``padding_value``."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    seqs = list(sequences)
    if not seqs:
        raise RuntimeError("received an empty list of sequences")
    T = max(s.shape[0] for s in seqs)
    padded = []
    for s in seqs:
        missing = T - s.shape[0]
        if missing:
            pad = full((missing,) + tuple(s.shape[1:]), padding_value, dtype=s.dtype)
            s = cat([s, pad] if padding_side == "right" else [pad, s], 0)
        padded.append(s)
    return stack(padded, 0 if batch_first else 1)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """The list of unpadded sequences of a padded batch."""
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    return [x[i, :int(n)] for i, n in enumerate(_lengths(lengths))]


def pack_sequence(sequences, enforce_sorted=True):
    """Pack a list of tensors of different lengths (longest first unless
    ``enforce_sorted=False``)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences):
    """The list of sequences of a packed batch, in their original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
