"""Dropout and embedding in ``torch.nn.functional``."""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import FpemuRuntimeError, FpemuValueError
from .. import _special
from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, float64, int64, is_float
from .._state import State
from ..ops.inplace import apply_inplace


# ------------------------------------------------------------ dropout, embedding
def check_probability(p):
    """``p`` if a dropout probability (in [0, 1]), else torch's error."""
    if not 0.0 <= p <= 1.0:
        raise FpemuValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return p


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p and scale the rest by the float32
    1/(1-p); the mask comes from fpemu's seeded generator (not torch's numbers)."""
    check_probability(p)
    if not training or p == 0.0:
        return input
    if inplace:
        return apply_inplace(input, dropout, p, training)
    x = input
    dt = x.dtype
    om = np.float64 if dt is float64 else np.float32
    keep = ~State.generator.bernoulli(x.shape, p)
    scale = om(0.0) if p == 1.0 else om(1.0) / om(1.0 - p)
    res = _store(np.where(keep, x._data.astype(om) * scale, om(0)), dt)

    def backward(g):
        return (_store(np.where(keep, g.astype(om) * scale, om(0)), dt),)
    return _result(res, dt, (x,), backward, op="native_dropout")


def _feature_rank_rule(x, batched_ndim, name):
    """How many leading dims the channel mask spans (torch 2.13's
    ``dropout1d`` / ``dropout2d`` / ``dropout3d`` in ``torch/nn/functional.py``):
    dropout1d takes 2D or 3D input (an error otherwise); dropout2d and
    dropout3d warn on other ranks and go on; dropout2d always reads
    (N, C, ...) (a 3D input is (N, C, L), with a second warning; a 2D input
    gets one draw per element), dropout3d reads an input that is not 5D as
    one sample, one draw per entry of its first dim."""
    nd = x.ndim
    if name == "dropout1d":
        if nd not in (2, 3):
            raise RuntimeError(
                f"dropout1d: Expected 2D or 3D input, but received a {nd}D input. Note that "
                "dropout1d exists to provide channel-wise dropout on inputs with 1 spatial "
                "dimension, a channel dimension, and an optional batch dimension (i.e. 2D or "
                "3D inputs).")
        return 2 if nd == 3 else 1
    spatial = {"dropout2d": 2, "dropout3d": 3}[name]
    if nd not in (batched_ndim - 1, batched_ndim):
        warnings.warn(
            f"{name}: Received a {nd}-D input to {name}, which is deprecated and will result "
            "in an error in a future release. To retain the behavior and silence this "
            f"warning, please use dropout instead. Note that {name} exists to provide "
            f"channel-wise dropout on inputs with {spatial} spatial dimensions, a channel "
            "dimension, and an optional batch dimension (i.e. "
            f"{batched_ndim - 1}D or {batched_ndim}D inputs).", UserWarning, stacklevel=4)
    if name == "dropout2d":
        if nd == 3:
            warnings.warn(
                "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
                "dropout behavior is desired - input is interpreted as shape (N, C, L), where "
                "C is the channel dim. This behavior will change in a future release to "
                "interpret the input as one without a batch dimension, i.e. shape (C, H, W). "
                "To maintain the 1D channel-wise dropout behavior, please switch to using "
                "dropout1d instead.", UserWarning, stacklevel=4)
        if nd < 2:
            raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
        return 2
    return 2 if nd == batched_ndim else 1


def _feature_dropout(input, p, training, inplace, batched_ndim, name):
    """Zero whole channels: one draw per (sample, channel), the kept
    channels scaled by the float32 1/(1-p); ``batched_ndim`` is the input
    rank with a batch dim (3 for dropout1d, 4 for 2d, 5 for 3d); other
    ranks as torch takes them (:func:`_feature_rank_rule`)."""
    check_probability(p)
    x = input
    lead = _feature_rank_rule(x, batched_ndim, name)
    if not training or p == 0.0:
        return x
    if inplace:
        return apply_inplace(x, lambda v: _feature_dropout(v, p, True, False, batched_ndim,
                                                           name))
    mask_shape = tuple(x.shape[:lead]) + (1,) * (x.ndim - lead)
    dt = x.dtype
    om = np.float64 if dt is float64 else np.float32
    keep = ~State.generator.bernoulli(mask_shape, p)
    scale = om(0.0) if p == 1.0 else om(1.0) / om(1.0 - p)
    res = _store(np.where(keep, x._data.astype(om) * scale, om(0)), dt)

    def backward(g):
        return (_store(np.where(keep, g.astype(om) * scale, om(0)), dt),)
    return _result(res, dt, (x,), backward, op="feature_dropout")


def dropout1d(input, p=0.5, training=True, inplace=False):
    return _feature_dropout(input, p, training, inplace, 3, "dropout1d")


def dropout2d(input, p=0.5, training=True, inplace=False):
    return _feature_dropout(input, p, training, inplace, 4, "dropout2d")


def dropout3d(input, p=0.5, training=True, inplace=False):
    return _feature_dropout(input, p, training, inplace, 5, "dropout3d")


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """weight[input]; the backward adds rows in float64, rounded once; the
    row of ``padding_idx`` gets no gradient. ``max_norm`` first rescales, in
    place and outside the graph, each looked-up row whose ``norm_type``-norm
    exceeds it (torch's ``embedding_renorm_``: row * (max_norm / (norm +
    1e-7))); ``scale_grad_by_freq`` divides each row's gradient by how often
    its index occurs in the batch. A sparse gradient is not emulated."""
    if not isinstance(input, Tensor) or is_float(input.dtype):
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           "following scalar types: Long, Int; but got a float tensor instead")
    if sparse:
        raise FpemuValueError("embedding(sparse=True): sparse gradients are not emulated; use "
                              "sparse=False (the same values, a dense gradient)")
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise FpemuRuntimeError(f"'weight' must be 2-D, got a weight of shape "
                                f"{list(getattr(weight, 'shape', ()))}")
    idx = input._data.astype(np.int64)
    rows = weight.shape[0]
    if idx.size and (idx.min() < -rows or idx.max() >= rows):
        raise IndexError("index out of range in self")
    if padding_idx is not None and not -rows <= padding_idx < rows:
        raise FpemuValueError(f"Padding_idx must be within num_embeddings (got {padding_idx} "
                              f"for {rows} rows)")
    pad = None if padding_idx is None else (padding_idx % rows)
    if max_norm is not None:
        _embedding_renorm(weight, np.unique(idx % rows), float(max_norm), float(norm_type))
    res = weight._data[idx]
    flat = idx.reshape(-1) % rows

    def backward(g):
        G = np.zeros(weight.shape, np.float64)
        vals = g.reshape(-1, weight.shape[1]).astype(np.float64)
        if scale_grad_by_freq:
            counts = np.bincount(flat, minlength=rows)
            vals = vals / counts[flat][:, None]
        _special.add_rows_at(G, flat, vals)
        if pad is not None:
            G[pad] = 0.0
        return (None, _store(G, weight.dtype))
    return _result(res, weight.dtype, (input, weight), backward, op="embedding")


def _embedding_renorm(weight, rows, max_norm, norm_type):
    """torch's ``embedding_renorm_``: the rows' norms in float64 (torch
    takes them in the dtype and reads them as doubles), each row over the
    limit multiplied by the float32 scale, written into the weight."""
    W = weight._data
    sel = W[rows].astype(np.float64)
    norms = np.linalg.norm(sel, ord=norm_type, axis=1) if sel.size else np.zeros(0)
    over = norms > max_norm
    if not over.any():
        return
    om = np.float64 if weight.dtype is float64 else np.float32
    scale = (max_norm / (norms[over] + 1e-7)).astype(om)
    new = W.copy()
    new[rows[over]] = _store(W[rows[over]].astype(om) * scale[:, None], weight.dtype)
    weight._a = new


def one_hot(tensor, num_classes=-1):
    t = tensor._data.astype(np.int64)
    n = int(t.max()) + 1 if num_classes == -1 else num_classes
    return Tensor(np.eye(n, dtype=np.int64)[t], int64)


def pad(input, pad, mode="constant", value=None):
    """Pad the last dims: ``pad = (left, right, top, bottom, ...)``; modes
    "constant", "reflect", "replicate", "circular". A negative width crops
    (torch's: output element i of a dim reads input element i - left, taken
    by the mode's rule where that is outside the input). Exact; the gradient
    sums what each input element was copied to."""
    x = input
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise FpemuValueError("Padding length must be divisible by 2 and at most twice the "
                              "number of dimensions of the input")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if mode in ("reflect", "replicate"):
        # ATen's kernel of the mode and the number of padded dims: its autocast name
        kind = "reflection_pad" if mode == "reflect" else "replication_pad"
        (x,) = cast_inputs(f"{kind}{len(pad) // 2}d", x)
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    sources, valid = [], []
    for d, ((a, b), n) in enumerate(zip(widths, x.shape)):
        size = n + a + b
        if size < 0:
            raise FpemuRuntimeError(f"The input size {n}, plus negative padding {a} and {b} "
                                    f"resulted in a negative output size, which is invalid. "
                                    f"Check dimension {d} of your input.")
        # torch crops by the negative widths first, then pads what is left
        # (replicate: clamped indices of the input)
        lo = max(-a, 0)
        m = n - lo - max(-b, 0)
        src = np.arange(size) - max(a, 0)
        ok = (src >= 0) & (src < m)
        if mode == "replicate" and n:
            # the input's own edge elements, even where the crop leaves none
            src, ok, lo = np.clip(np.arange(size) - a, 0, n - 1), np.ones(size, bool), 0
        elif m > 0 and mode == "reflect":
            period = 2 * (m - 1)
            src = np.abs(src) % period if period else np.zeros(size, np.int64)
            src, ok = np.where(src >= m, period - src, src), np.ones(size, bool)
        elif m > 0 and mode == "circular":
            src, ok = src % m, np.ones(size, bool)
        sources.append(np.where(ok, src + lo, 0))
        valid.append(ok)
    fill = 0.0 if value is None else value
    if is_float(x.dtype):
        fill = np.float64(fill) if x.dtype is float64 else _store(np.float32(fill), x.dtype)
    grid = np.ix_(*sources) if x.ndim else ()
    if x._data.size == 0:
        res = np.zeros(tuple(len(v) for v in valid), x._data.dtype)
    else:
        res = np.array(x._data[grid], copy=True)
    mask = np.ones(res.shape, bool)
    for d, ok in enumerate(valid):
        shape = [1] * x.ndim
        shape[d] = ok.size
        mask = mask & ok.reshape(shape)
    if not mask.all():
        res = np.where(mask, res, np.asarray(fill, res.dtype))
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        G = np.zeros(x.shape, np.float64)
        full = tuple(np.broadcast_to(ix, res.shape) for ix in grid)
        np.add.at(G, tuple(ix[mask] for ix in full), g.astype(np.float64)[mask])
        return (_store(G, x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="constant_pad_nd")


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["dropout", "dropout1d", "dropout2d", "dropout3d", "embedding", "one_hot", "pad"]
