"""Searching and counting: ``searchsorted``, ``bucketize``, ``unique``,
``unique_consecutive``, ``histc`` and ``histogram``.

They compare and count, so their results are exact (indices, counts, the
values themselves); none has a gradient, as in torch. NaN sorts after every
number, as in torch's sort, and each NaN is its own value for ``unique``.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["bucketize", "histc", "histogram", "searchsorted", "unique", "unique_consecutive"]

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError
from .._core import Tensor, _store, float64, int32, int64, is_float
from .._common import wrap_dim
from .inplace import write_out


def _tensor(name, what, x):
    if not isinstance(x, Tensor):
        raise FpemuTypeError(f"{name}(): argument '{what}' must be Tensor, not "
                             f"{type(x).__name__}")


def searchsorted(sorted_sequence, input, *, out_int32=False, right=False,
                 side=None, sorter=None, out=None):
    """For each value, the index where it would go in its row of the sorted
    sequence (the first such index, or the last with ``right`` / side="right")."""
    seq = sorted_sequence
    _tensor("searchsorted", "sorted_sequence", seq)
    scalar = not isinstance(input, Tensor)
    vals = np.asarray(input) if scalar else input._data
    if side is not None:
        if side not in ("left", "right"):
            raise FpemuRuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' "
                                    f"but got {side}")
        if right and side == "left":
            raise FpemuRuntimeError("torch.searchsorted(): side and right can't be set to "
                                    "opposites, got side of left while right was True")
        right = side == "right"
    if seq.ndim == 0:
        raise FpemuRuntimeError("torch.searchsorted(): boundaries tensor should have positive "
                                "dimension, but got 0 dimension")
    S = seq._data
    if sorter is not None:
        if not isinstance(sorter, Tensor) or sorter.dtype is not int64:
            raise FpemuRuntimeError("torch.searchsorted(): sorter must be a tensor of long dtype")
        if tuple(sorter.shape) != tuple(seq.shape):
            raise FpemuRuntimeError(f"torch.searchsorted(): boundary and sorter must have the "
                                    f"same size, but got boundary tensor {list(seq.shape)}and "
                                    f"got sorter tensor {list(sorter.shape)}")
        idx = sorter._data
        if idx.size and (idx.min() < 0 or idx.max() >= S.shape[-1]):
            raise FpemuRuntimeError("torch.searchsorted(): sorter index out of range")
        S = np.take_along_axis(S, idx, -1)
    if seq.ndim > 1:
        if scalar:
            raise FpemuRuntimeError("torch.searchsorted(): input value can be a scalar only "
                                    "when boundaries tensor dimension is 1, but we got "
                                    f"boundaries tensor dim({seq.ndim}) and input value's "
                                    f"dim(0) numel(1)")
        if vals.ndim != seq.ndim or vals.shape[:-1] != S.shape[:-1]:
            raise FpemuRuntimeError(
                f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first "
                f"N-1 dimensions of boundaries tensor and input value tensor must match, but we "
                f"got boundaries tensor {list(seq.shape)} and input value tensor "
                f"{list(vals.shape)}")
    if not scalar and seq.dtype is not input.dtype:
        raise FpemuRuntimeError(f"torch.searchsorted(): boundaries tensor ({seq.dtype}) and "
                                f"input value tensor ({input.dtype}) should have the same "
                                f"dtype: cast one to the other's")
    if np.size(vals) == 0:
        res = np.zeros(np.shape(vals), np.int64)
    elif seq.ndim == 1:
        res = _bisect(S.reshape(1, -1), np.asarray(vals).reshape(1, -1), right).reshape(
            np.shape(vals))
    else:
        K = S.reshape(int(np.prod(S.shape[:-1])), S.shape[-1])
        res = _bisect(K, vals.reshape(K.shape[0], -1), right).reshape(vals.shape)
    dt = int32 if out_int32 else int64
    if out is not None and getattr(out, "dtype", None) is not dt:
        raise FpemuRuntimeError(f"torch.searchsorted(): output tensor's dtype is wrong, it can "
                                f"only be Int(int32) or Long(int64) depending on whether "
                                f"out_int32 flag is True, but we got output tensor's dtype "
                                f"{getattr(out, 'dtype', None)} and out_int32 flag is "
                                f"{out_int32}")
    t = Tensor(np.asarray(res).astype(dt.np_dtype), dt)
    return write_out(out, t, "searchsorted")


def _bisect(K, V, right):
    """ATen's binary search (Bucketization.cpp, ``cus_lower_bound`` /
    ``cus_upper_bound``), every value of row r of ``V`` searched in row r of
    ``K`` at once: ``start = mid + 1`` while ``!(mid_val >= val)`` (left) or
    ``!(mid_val > val)`` (right). With NaN in the sequence or the values the
    negated comparisons decide as torch's do (``[1, nan]`` searched for 2 gives
    2), which a search that sorts NaN last (numpy's) does not."""
    n = K.shape[-1]
    start = np.zeros(V.shape, np.int64)
    end = np.full(V.shape, n, np.int64)
    rows = np.arange(K.shape[0])[:, None]
    with np.errstate(invalid="ignore"):
        while True:
            live = start < end
            if not live.any():
                return start
            mid = start + ((end - start) >> 1)
            mid_val = K[rows, np.minimum(mid, n - 1)]
            go = ~(mid_val > V) if right else ~(mid_val >= V)
            start = np.where(live & go, mid + 1, start)
            end = np.where(live & ~go, mid, end)


def bucketize(input, boundaries, *, out_int32=False, right=False, out=None):
    """The bucket of each value among 1-d ``boundaries``: searchsorted of the
    values in the boundaries."""
    _tensor("bucketize", "boundaries", boundaries)
    if boundaries.ndim != 1:
        raise FpemuRuntimeError(f"boundaries tensor must be 1 dimension, but got dim("
                                f"{boundaries.ndim})")
    return searchsorted(boundaries, input, out_int32=out_int32, right=right, out=out)


def _unique_rows(X):
    """The sorted unique values of a 1-d array (each NaN its own value, after
    the numbers), the inverse indices and the counts."""
    order = np.argsort(X, kind="stable")
    s = X[order]
    if s.size:
        new = np.r_[True, (s[1:] != s[:-1])]
    else:
        new = np.zeros(0, bool)
    if s.dtype.kind == "f":
        new = new | np.isnan(s)
    starts = np.flatnonzero(new)
    vals = s[starts]
    counts = np.diff(np.r_[starts, s.size])
    group = np.cumsum(new) - 1
    inverse = np.empty(X.size, np.int64)
    inverse[order] = group
    return vals, inverse, counts


def unique(input, sorted=True, return_inverse=False, return_counts=False,
           dim=None):
    """The distinct values (sorted; torch's CPU kernel sorts whatever
    ``sorted`` says), and optionally each element's index among them and the
    count of each. With ``dim``, the distinct slices along it."""
    x = input
    _tensor("unique", "input", x)
    if dim is not None:
        return _unique_dim(x, dim, return_inverse, return_counts, consecutive=False)
    vals, inverse, counts = _unique_rows(x._data.reshape(-1))
    return _unique_result(x, vals, inverse.reshape(x.shape), counts, return_inverse,
                          return_counts)


def unique_consecutive(input, return_inverse=False, return_counts=False,
                       dim=None):
    """Each run of equal consecutive values (or slices along ``dim``) once."""
    x = input
    _tensor("unique_consecutive", "input", x)
    if dim is not None:
        return _unique_dim(x, dim, return_inverse, return_counts, consecutive=True)
    X = x._data.reshape(-1)
    new = np.r_[True, X[1:] != X[:-1]] if X.size else np.zeros(0, bool)
    starts = np.flatnonzero(new)
    vals = X[starts]
    counts = np.diff(np.r_[starts, X.size])
    inverse = (np.cumsum(new) - 1).reshape(x.shape)
    return _unique_result(x, vals, inverse, counts, return_inverse, return_counts)


def _unique_result(x, vals, inverse, counts, return_inverse, return_counts):
    out = [Tensor(np.ascontiguousarray(vals).astype(x._data.dtype), x.dtype)]
    if return_inverse:
        out.append(Tensor(np.asarray(inverse, np.int64), int64))
    if return_counts:
        out.append(Tensor(np.asarray(counts, np.int64), int64))
    return out[0] if len(out) == 1 else tuple(out)


def _row_less(rows):
    """The comparator of ATen's ``_unique_dim_cpu_template``: row a before row
    b when, at the first position where ``a < b`` or ``a > b`` holds, it is
    ``<``. A NaN compares neither way, so its position is passed over."""
    def less(a, b):
        ra, rb = rows[a], rows[b]
        lt, gt = ra < rb, ra > rb
        decided = np.flatnonzero(lt | gt)
        return bool(decided.size) and bool(lt[decided[0]])
    return less


_THRESHOLD = 16     # libstdc++'s _S_threshold


def _std_sort(n, less):
    """The permutation that libstdc++'s ``std::sort`` (introsort: median of
    three, unguarded partition, heap sort past depth 2 log2 n, a final
    insertion sort) leaves when sorting 0..n-1 with ``less``. ATen sorts the
    slices of ``unique(dim=...)`` with it; with NaN its comparator is no strict
    weak order, and the order (so which rows come first, and which of equal
    rows is kept) is this algorithm's, not any stable sort's. The scans stop at
    the ends of the array where C++'s unguarded ones would not need to."""
    a = list(range(n))

    def cmp(i, j):
        return less(a[i], a[j])

    def sift_down(first, hole, length, value):          # std::__adjust_heap
        top = hole
        child = hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if less(a[first + child], a[first + child - 1]):
                child -= 1
            a[first + hole] = a[first + child]
            hole = child
        if (length & 1) == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            a[first + hole] = a[first + child - 1]
            hole = child - 1
        parent = (hole - 1) // 2                          # std::__push_heap
        while hole > top and less(a[first + parent], value):
            a[first + hole] = a[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        a[first + hole] = value

    def heap_sort(first, last):                          # std::__partial_sort(f, l, l)
        length = last - first
        for parent in range((length - 2) // 2, -1, -1):  # std::__make_heap
            sift_down(first, parent, length, a[first + parent])
        while last - first > 1:                          # std::__sort_heap
            last -= 1
            value = a[last]
            a[last] = a[first]
            sift_down(first, 0, last - first, value)

    def median_to_first(result, x, y, z):
        if cmp(x, y):
            pick = y if cmp(y, z) else (z if cmp(x, z) else x)
        elif cmp(x, z):
            pick = x
        elif cmp(y, z):
            pick = z
        else:
            pick = y
        a[result], a[pick] = a[pick], a[result]

    def partition(first, last, pivot):
        while True:
            while first < last and cmp(first, pivot):
                first += 1
            last -= 1
            while last > pivot and cmp(pivot, last):
                last -= 1
            if not first < last:
                return first
            a[first], a[last] = a[last], a[first]
            first += 1

    def introsort(first, last, depth):
        while last - first > _THRESHOLD:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            mid = first + (last - first) // 2
            median_to_first(first, first + 1, mid, last - 1)
            cut = partition(first + 1, last, first)
            introsort(cut, last, depth)
            last = cut

    def linear_insert(i, lo):                            # __unguarded_linear_insert
        value = a[i]
        while i > lo and less(value, a[i - 1]):
            a[i] = a[i - 1]
            i -= 1
        a[i] = value

    def insertion_sort(first, last):
        for i in range(first + 1, last):
            if less(a[i], a[first]):
                value = a[i]
                a[first + 1:i + 1] = a[first:i]
                a[first] = value
            else:
                linear_insert(i, first)

    if n > 1:
        introsort(0, n, 2 * (n.bit_length() - 1))
        if n > _THRESHOLD:
            insertion_sort(0, _THRESHOLD)
            for i in range(_THRESHOLD, n):
                linear_insert(i, 0)
        else:
            insertion_sort(0, n)
    return np.asarray(a, np.int64)


def _unique_dim(x, dim, return_inverse, return_counts, consecutive):
    d = wrap_dim(dim, x.ndim)
    if x.ndim and x.shape[d] == 0:              # no slices: the input as it is
        return _unique_result(x, x._data, np.zeros(0, np.int64), np.zeros(0, np.int64),
                              return_inverse, return_counts)
    if x.numel() == 0:
        raise FpemuRuntimeError("There are 0 sized dimensions, and they aren't selected, so "
                                "unique cannot be applied")
    M = np.moveaxis(x._data if x.ndim else x._data.reshape(1), d, 0)
    rows = M.reshape(M.shape[0], -1)
    n = rows.shape[0]
    if consecutive:
        new = np.r_[True, np.any(rows[1:] != rows[:-1], axis=1)] if n else np.zeros(0, bool)
        starts = np.flatnonzero(new)
        group = np.cumsum(new) - 1
        picked = starts
    else:
        if rows.dtype.kind == "f" and (np.isnan(rows).any() or np.signbit(rows[rows == 0]).any()):
            # the order decides which rows come first (a NaN) or which of two
            # equal rows is kept (-0 or +0): sort as ATen does
            order = _std_sort(n, _row_less(rows))
        else:
            # lexicographic order of the slices (first element most significant)
            order = np.lexsort(rows.T[::-1]) if rows.shape[1] else np.arange(n)
        s = rows[order]
        with np.errstate(invalid="ignore"):     # at::equal: NaN equals nothing
            new = np.r_[True, np.any(s[1:] != s[:-1], axis=1)] if n else np.zeros(0, bool)
        starts = np.flatnonzero(new)
        g = np.cumsum(new) - 1
        group = np.empty(n, np.int64)
        group[order] = g
        picked = order[starts]
    counts = np.diff(np.r_[starts, n])
    vals = np.moveaxis(M[picked], 0, d)
    return _unique_result(x, vals, group, counts, return_inverse, return_counts)


def histc(input, bins=100, min=0, max=0, *, out=None):
    """Counts of the elements in ``bins`` equal-width bins between ``min`` and
    ``max`` (the data's own range when both are 0), as a float tensor of the
    input's dtype; elements outside are ignored, ``max`` falls in the last bin."""
    x = input
    _tensor("histc", "input", x)
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f'"histogram_cpu" not implemented for \'{x.dtype}\': pass a '
                                f'float tensor')
    if bins <= 0:
        raise FpemuRuntimeError(f"torch.histc(): bins must be > 0, but got {bins} for "
                                f"dimension 0")
    om = np.float64 if x.dtype is float64 else np.float32
    X = x._data.astype(om).reshape(-1)
    lo, hi = om(min), om(max)
    if lo == hi and X.size:
        lo, hi = om(X.min()), om(X.max())
    if lo == hi:
        lo, hi = lo - om(1), hi + om(1)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise FpemuRuntimeError(f"torch.histc(): range of [{lo}, {hi}] is not finite")
    if lo > hi:
        raise FpemuRuntimeError("torch.histc(): max must be larger than min")
    counts = _bin_counts(X, lo, hi, bins, om)
    t = Tensor(counts.astype(x._data.dtype), x.dtype)
    return write_out(out, t, "histc")


def _bin_counts(X, lo, hi, bins, om, weights=None):
    """torch's bin of each element: ``(x - lo) * bins / (hi - lo)`` truncated
    (in the input's precision), the top edge into the last bin."""
    keep = (X >= lo) & (X <= hi)
    V = X[keep]
    with np.errstate(all="ignore"):
        pos = ((V - lo) * om(bins) / (hi - lo)).astype(np.int64)
    pos = np.minimum(pos, bins - 1)
    w = None if weights is None else weights[keep].astype(np.float64)
    return np.bincount(pos, weights=w, minlength=bins)[:bins]


def histogram(input, bins=100, *, range=None, weight=None, density=False,
              out=None):
    """``(hist, bin_edges)``: counts (or sums of ``weight``) in ``bins``
    equal-width bins over ``range`` (the data's range by default), or in the
    bins between the given edges (a 1-d tensor); with ``density`` each count
    divided by the total and the bin width."""
    x = input
    _tensor("histogram", "input", x)
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f"torch.histogram: input tensor and bins tensors should have "
                                f"the same dtype, but got input {x.dtype}: pass a float tensor")
    om = np.float64 if x.dtype is float64 else np.float32
    X = x._data.astype(om).reshape(-1)
    W = None
    if weight is not None:
        if tuple(weight.shape) != tuple(x.shape):
            raise FpemuRuntimeError(f"torch.histogram: if weight tensor is provided it should "
                                    f"have the same shape as the input tensor excluding its "
                                    f"innermost dimension, but got input with shape "
                                    f"{list(x.shape)} and weight with shape "
                                    f"{list(weight.shape)}")
        W = weight._data.reshape(-1)
    if isinstance(bins, Tensor):
        edges = bins._data.astype(om)
        if bins.ndim != 1 or edges.size < 1:
            raise FpemuRuntimeError("torch.histogram(): bins tensor should have one dimension "
                                    "and at least 1 element")
        if np.any(np.diff(edges) < 0):
            raise FpemuRuntimeError("torch.histogram(): bin edges must be monotonically "
                                    "increasing")
        hist = _edge_counts(X, edges, W)
    else:
        if bins <= 0:
            raise FpemuRuntimeError(f"torch.histogram(): bins must be > 0, but got {bins} for "
                                    f"dimension 0")
        if range is not None:
            lo, hi = om(range[0]), om(range[1])
            if lo > hi:
                raise FpemuRuntimeError(f"torch.histogram(): min should not exceed max, but "
                                        f"got min {lo} max {hi}")
        elif X.size:
            lo, hi = om(X.min()), om(X.max())
        else:
            lo, hi = om(0), om(1)                   # torch's range for no data
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise FpemuRuntimeError(f"torch.histogram(): range of [{lo}, {hi}] is not finite")
        if lo == hi:
            lo, hi = lo - om(0.5), hi + om(0.5)
        edges = _linspace(lo, hi, bins + 1, om)
        hist = _edge_counts(X, edges, W)
    dt = x.dtype
    hist = hist.astype(om) if dt is float64 else _store(hist, dt).astype(om)
    if density:
        # torch: hist /= hist.sum(), then /= each bin's width, in the dtype
        with np.errstate(all="ignore"):
            hist = _store(hist / om(hist.astype(np.float64).sum()), dt).astype(om)
            hist = _store(hist / np.diff(edges), dt)
    return (Tensor(np.asarray(hist).astype(x._data.dtype), dt),
            Tensor(edges.astype(x._data.dtype), dt))


def _linspace(lo, hi, n, om):
    """torch's linspace kernel in ``om``: ``lo + step * i`` for the first
    half, ``hi - step * (n - 1 - i)`` for the second."""
    if n == 1:
        return np.array([lo], om)
    step = (hi - lo) / om(n - 1)
    i = np.arange(n).astype(om)
    with np.errstate(all="ignore"):
        return np.where(np.arange(n) < n // 2, lo + step * i, hi - step * (om(n - 1) - i))


def _edge_counts(X, edges, W):
    """Counts per bin [e_i, e_{i+1}) (the last bin closed), by bisection on
    the edges: each element's bin is decided by comparisons alone."""
    nb = edges.size - 1
    if nb <= 0:
        return np.zeros(0)
    keep = (X >= edges[0]) & (X <= edges[-1])
    V = X[keep]
    pos = np.searchsorted(edges, V, side="right") - 1
    pos = np.minimum(pos, nb - 1)
    if W is None:
        return np.bincount(pos, minlength=nb)[:nb].astype(np.float64)
    # torch's CPU loop adds each weight to its bin in element order, in the
    # weights' precision
    hist = np.zeros(nb, W.dtype)
    np.add.at(hist, pos, W[keep])
    return hist.astype(np.float64)
