"""The losses of ``torch.nn.functional``, computed in float64 and rounded once
(the text of :mod:`fpemu.autograd.nn.functional`).

Under the CPU profile, for float32 and float64, the forward values follow
torch 2.13 CPU instead, bit for bit where the module says so: each loss's
elementwise formula step by step as ATen computes it (``Loss.cpp``,
``cpu/BinaryOpsKernel.cpp``'s huber / smooth_l1 / mse kernels, the Python
decompositions of ``torch/nn/functional.py``), every step rounded to the
dtype, then the reduction through fpemu's models of ``sum`` / ``mean``
(ATen's cascade sum). Steps that call ``at::exp`` / ``at::log`` run MKL's
VML on torch's side (``ATen/cpu/vml.h``), which fpemu does not reproduce:
there fpemu takes the correctly rounded value. Gradients are unchanged.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ...errors import FpemuRuntimeError, FpemuValueError
from .._autocast import cast_inputs
from .._common import f64, float_dt, grad_part
from .._core import _result, _store, bool_, float32, float64, is_float, no_grad, Tensor
from .. import _cpu_math
from .._cuda_reduce import cuda_nll_loss_2d
from .._profile import get_profile
from ..ops.elementwise import (
    add, clamp_min, div, exp, log, masked_fill, mul, neg, pow, rsub, sub, where,
)
from ..ops.reduce import any as _any, mean as _mean, sum as _sum
from ._activation import log_softmax
from ._conv import _im2col, _pair
from ..ops.creation import ones_like
from ..ops.einsum import einsum
from ..ops.linalg import scalar_type
from ..ops.shape import gather, masked_select


# -------------------------------------------------------------------- losses
def _reduction(reduction, size_average=None, reduce=None):
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "none" if not reduce else ("mean" if size_average else "sum")
    if reduction not in ("mean", "sum", "none"):
        raise FpemuValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _cpu_exact(dt):
    """The CPU profile on a float32 / float64 loss: torch CPU's steps."""
    return get_profile().device == "cpu" and dt in (float32, float64)


def _np(dt):
    return np.float32 if dt is float32 else np.float64


def _arr(x, dt, shape=None):
    """A tensor's (or a number's) values in the dtype, broadcast to ``shape``."""
    a = np.asarray(x._data if isinstance(x, Tensor) else x, _np(dt))
    return a if shape is None else np.broadcast_to(a, shape)


def _cpu_reduced(per, red, dt, *inputs):
    """``apply_loss_reduction`` (Loss.cpp) on the elementwise loss ``per``:
    ``mean()`` / ``sum()`` of the loss tensor through fpemu's CPU models of
    ATen's reductions, the loss laid out in memory as ``TensorIterator``
    allocates the output of an elementwise op on the tensors ``inputs``
    (their strides' order: a transposed input gives a transposed loss, which
    the cascade sum walks in memory order)."""
    if red == "none":
        return per
    per = np.asarray(per, _np(dt))
    strides = [tuple(s // a._data.itemsize for s in
                     np.broadcast_to(a._data, per.shape).strides)
               for a in inputs if isinstance(a, Tensor) and per.ndim]
    if strides:
        perm = _cpu_math._iteration(per.shape, strides)[0]
        order = perm[::-1]                                 # slowest dim first
        laid = np.empty([per.shape[d] for d in order], per.dtype)
        per_view = laid.transpose(np.argsort(order))
        per_view[...] = per
        per = per_view
    t = Tensor(per, dt)
    with no_grad():
        return (_mean(t) if red == "mean" else _sum(t))._data


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100,
             reduce=None, reduction="mean"):
    """-w[t] * logp[n, t, ...] over the targets that are not ``ignore_index``;
    "mean" divides by the sum of their weights (torch's weighted mean). Input
    (N, C), (C,) or (N, C, d1, ...). Autocast: fp32."""
    reduction = _reduction(reduction, size_average, reduce)
    (logp,) = cast_inputs("nll_loss", input)
    if not isinstance(target, Tensor) or is_float(target.dtype):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{scalar_type(target.dtype)}" if isinstance(target, Tensor)
                           else "nll_loss(): target must be a Tensor of class indices")
    dt = float_dt(logp)
    L = logp._data
    t = target._data.astype(np.int64)
    if logp.ndim == 1:
        L, t = L[None, :], t.reshape(1)
    if L.ndim < 2:
        raise ValueError(f"Expected 1 or more dimensions (got {logp.ndim})")
    N, C = L.shape[0], L.shape[1]
    if t.shape[0] != N:
        raise ValueError(f"Expected input batch_size ({N}) to match target batch_size "
                         f"({t.shape[0]}).")
    if t.shape != (N,) + L.shape[2:]:
        raise RuntimeError(f"expected target of shape {[N] + list(L.shape[2:])}, got "
                           f"{list(t.shape)}")
    keep = t != ignore_index
    if np.any((t[keep] < 0) | (t[keep] >= C)):
        raise IndexError(f"Target {int(t[keep][(t[keep] < 0) | (t[keep] >= C)][0])} is out of "
                         f"bounds.")
    tc = np.where(keep, t, 0)
    Lm = np.moveaxis(L, 1, -1)                             # (N, d..., C)
    picked = np.take_along_axis(Lm, tc[..., None], axis=-1)[..., 0].astype(np.float64)
    W = np.ones(C) if weight is None else f64(weight)
    w = np.where(keep, W[tc], 0.0)
    cpu = get_profile().cpu and dt is not float64
    if cpu:
        return _nll_loss_cpu(logp, target, picked, w, keep, tc, Lm.shape, reduction, dt,
                             weight is not None)
    losses = -picked * w
    if (get_profile().device == "cuda" and dt is not float64 and logp.ndim == 2
            and reduction != "none" and N > 0):
        # Loss.cu nll_loss_forward_reduce_cuda_kernel_2d: 32 threads' float32
        # partial sums, added in order; the backward divides by the stored
        # total weight (a value of the dtype)
        out, tot = cuda_nll_loss_2d(picked, w, keep, reduction == "mean", dt,
                                    weight is not None)
        res = _store(np.asarray(out), dt)
        denom = float(_store(np.asarray(tot), dt)) if reduction == "mean" else 1.0
    elif reduction == "none":
        res, denom = _store(losses.reshape(target.shape), dt), None
    elif reduction == "sum":
        res, denom = _store(np.asarray(losses.sum()), dt), 1.0
    else:
        denom = w.sum()
        with np.errstate(all="ignore"):
            res = _store(np.asarray(losses.sum() / denom), dt)

    def backward(g):
        G = np.zeros(Lm.shape, np.float64)
        gv = g.astype(np.float64).reshape(losses.shape) if denom is None else \
            g.astype(np.float64) / denom
        with np.errstate(all="ignore"):
            vals = -w * gv
        np.put_along_axis(G, tc[..., None], vals[..., None], axis=-1)
        G = np.where(keep[..., None], G, 0.0)
        G = np.moveaxis(G, -1, 1).reshape(logp.shape)
        return (_store(G, dt),)
    return _result(res, dt, (logp,), backward, op="nll_loss")


def _nll_loss_cpu(logp, target, picked, w, keep, tc, lm_shape, reduction, dt, weighted):
    """nll_loss as ATen's CPU kernels (``LossNLL.cpp``, ``LossNLL2d.cpp``)
    compute it, every operation rounded to the dtype (bit for bit with torch
    2.13 CPU, float32 and 16-bit alike): ``-x * w`` per element; for "sum"
    and "mean" an eight-level cascade sum over the targets in index order
    (level j+1 takes level j's partial sum at every index whose low 4(j+1)
    bits are zero), the levels then added in order, "mean" divided by the
    rounded weight total (the target count without weights)."""
    def r(v):
        return _store(np.asarray(v, np.float32), dt).astype(np.float32)
    flat_keep = keep.reshape(-1)
    x = r(picked.reshape(-1))
    wv = r(w.reshape(-1))
    if reduction == "none":
        res = r(np.where(flat_keep, -x * wv if weighted else -x, 0.0)).reshape(target.shape)
        denom = None
    else:
        pos = np.flatnonzero(flat_keep)
        terms = r(x[pos] * wv[pos]) if weighted else x[pos]
        total_loss = _cascade_sum(pos, -terms, r, len(flat_keep), negate=True, x=terms)
        if weighted:
            total_w = _cascade_sum(pos, wv[pos], r, len(flat_keep))
        else:
            total_w = r(float(pos.size))
        denom = total_w
        with np.errstate(all="ignore"):
            res = r(total_loss / total_w) if reduction == "mean" else total_loss

    def backward(g):
        G = np.zeros(lm_shape, np.float32)
        with np.errstate(all="ignore"):
            if denom is None:                         # -w * grad_output, per element
                gv = r(-wv.reshape(keep.shape) * g.astype(np.float32).reshape(keep.shape))
            else:
                g0 = np.float32(g.reshape(-1)[0])
                grad = -(r(g0 / denom) if reduction == "mean" else g0)
                gv = r(wv * grad).reshape(keep.shape) if weighted else \
                    np.full(keep.shape, grad, np.float32)
        np.put_along_axis(G, tc[..., None], gv[..., None], axis=-1)
        G = np.where(keep[..., None], G, np.float32(0))
        return (_store(np.moveaxis(G, -1, 1).reshape(logp.shape), dt),)
    return _result(np.asarray(res), dt, (logp,), backward, op="nll_loss")


def _cascade_sum(pos, vals, r, n, negate=False, x=None):
    """ATen's CPU cascade sum (``cascade_sum_num_levels = 8``): the values at
    positions ``pos`` (of ``n``) accumulated as ``partial[0] -= x`` (or ``+=
    vals``), each step rounded by ``r``; after an element whose index has
    its low ``4 (j+1)`` bits zero, level j is added into level j+1."""
    levels = [np.float32(0)] * 8
    power = max(4, (int(n - 1).bit_length() if n > 1 else 0) // 8)
    mask = (1 << power) - 1
    # level 0 runs between propagation points: sequential rounded sums,
    # computed for all runs at once, column by column
    ends = np.flatnonzero((pos & mask) == 0)
    bounds = np.concatenate([[0], ends + 1, [pos.size]])
    starts, stops = bounds[:-1], bounds[1:]
    starts, stops = starts[stops > starts], stops[stops > starts]
    width = int((stops - starts).max()) if starts.size else 0
    acc = np.zeros(starts.size, np.float32)
    src = x if negate else vals
    for c in range(width):
        live = starts + c < stops
        idx = np.minimum(starts + c, pos.size - 1)
        step = r(acc - src[idx]) if negate else r(acc + src[idx])
        acc = np.where(live, step, acc)
    for k, (a, b) in enumerate(zip(starts, stops)):
        levels[0] = acc[k]
        last = int(pos[b - 1])
        for j in range(7):
            if last & (mask << (power * j)):
                break
            levels[j + 1] = r(levels[j + 1] + levels[j])
            levels[j] = np.float32(0)
    out = np.float32(0)
    for v in levels:
        out = r(out + v)
    return out


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                  reduce=None, reduction="mean", label_smoothing=0.0):
    """log_softmax over dim 1, then nll_loss (both fp32 under autocast), as
    torch decomposes it (``aten/src/ATen/native/LossNLL.cpp``); label
    smoothing and class-probability targets follow the same file's
    decompositions op by op, so every rounding is one of torch's."""
    reduction = _reduction(reduction, size_average, reduce)
    if not 0.0 <= label_smoothing <= 1.0:
        raise FpemuValueError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                              f"{label_smoothing}")
    (input,) = cast_inputs("cross_entropy_loss", input)
    cdim = 0 if input.ndim == 1 else 1
    logp = log_softmax(input, dim=cdim)
    if isinstance(target, Tensor) and tuple(target.shape) == tuple(input.shape):
        if not is_float(target.dtype):
            raise RuntimeError(f"Expected floating point type for target with class "
                               f"probabilities, got {scalar_type(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        return _soft_cross_entropy(logp, target, weight, reduction, label_smoothing, cdim)
    loss = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if not label_smoothing:
        return loss
    C = input.shape[cdim]
    if weight is not None:
        shape = [1] * logp.ndim
        shape[cdim] = weight.shape[0]
        smooth = neg(_sum(mul(logp, weight.view(*shape)), dim=cdim))
    else:
        smooth = neg(_sum(logp, dim=cdim))
    ignore = Tensor(target._data == ignore_index, bool_)
    smooth = masked_fill(smooth, ignore, 0.0)
    if reduction == "mean":
        keep = Tensor(~ignore._data, bool_)
        if weight is not None:
            count = _sum(gather(weight, 0, masked_select(target, keep).flatten()))
        else:
            count = _sum(keep)
        ret = div(_sum(smooth), count)
    elif reduction == "sum":
        ret = _sum(smooth)
    else:
        ret = smooth
    return add(mul(loss, 1 - label_smoothing), mul(ret, label_smoothing / C))


def _soft_cross_entropy(logp, target, weight, reduction, label_smoothing, cdim):
    """Class-probability targets: ``-(logp * target [* weight]).sum()``, the
    mean over the samples (``numel / C``), as torch's decomposition."""
    C = logp.shape[cdim]
    tgt = target
    if label_smoothing > 0:
        tgt = add(mul(target, 1 - label_smoothing), label_smoothing / C)
    prod = mul(logp, tgt)
    if weight is not None:
        if weight.ndim != 1 or weight.numel() != C:
            raise RuntimeError(f"cross_entropy: weight tensor should be defined either for "
                               f"all {C} classes or no classes but got weight tensor of "
                               f"shape: {list(weight.shape)}")
        shape = [1] * logp.ndim
        shape[cdim] = C
        prod = mul(prod, weight.view(*shape) if logp.ndim > 1 else weight)
    if reduction == "mean":
        return div(neg(_sum(prod)), logp.numel() // C)
    if reduction == "sum":
        return neg(_sum(prod))
    return neg(_sum(prod, dim=cdim))


def _pointwise_loss(name, input, target, reduction, fwd, bwd, cpu=None):
    input, target = cast_inputs(name, input, target)
    if isinstance(target, Tensor):
        try:
            np.broadcast_shapes(tuple(input.shape), tuple(target.shape))
        except ValueError:
            raise FpemuRuntimeError(f"{name}(): The size of tensor a ({list(input.shape)}) must "
                                    f"match the size of tensor b ({list(target.shape)}) at "
                                    f"non-singleton dimensions") from None
    dt = float_dt(input, target)
    X = f64(input)
    T = f64(target) if isinstance(target, Tensor) else np.float64(target)
    with np.errstate(all="ignore"):
        per = fwd(X - T)
    scale = None if reduction == "none" else per.size if reduction == "mean" else 1
    if cpu is not None and _cpu_exact(dt):
        shape = np.broadcast_shapes(X.shape, np.shape(T))
        with np.errstate(all="ignore"):
            res = np.asarray(_cpu_reduced(cpu(_arr(input, dt, shape), _arr(target, dt, shape)),
                                          reduction, dt, input, target))
    elif reduction == "none":
        res = _store(per, dt)
    else:
        with np.errstate(all="ignore"):
            res = _store(np.asarray(per.sum() / scale), dt)

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            gi = bwd(X - T) * (G if scale is None else G / scale)
        gi = np.broadcast_to(gi, np.broadcast_shapes(X.shape, np.shape(T)))
        return (grad_part(_store(gi, dt), input, dt),
                grad_part(_store(-gi, dt), target, dt) if isinstance(target, Tensor) else None)
    return _result(res, dt, (input, target), backward,
                   saved=tuple(t for t in (input, target) if isinstance(t, Tensor)), op=name)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean",
             weight=None):
    """mean((input - target)^2) in float64, rounded once; under the CPU
    profile ``mse_kernel`` (cpu/BinaryOpsKernel.cpp): ``d = a - b; d * d``
    in the dtype, then the reduction. Autocast: fp32."""
    return _pointwise_loss("mse_loss", input, target, _reduction(reduction, size_average,
                                                                 reduce),
                           lambda d: d * d, lambda d: 2 * d, cpu=_mse_cpu)


def _mse_cpu(a, b):
    d = a - b
    return d * d


def _l1_cpu(a, b):
    return np.abs(a - b)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """mean(|input - target|); under the CPU profile Loss.cpp's ``(input -
    target).abs()`` in the dtype, then the reduction."""
    return _pointwise_loss("l1_loss", input, target, _reduction(reduction, size_average,
                                                                reduce),
                           np.abs, np.sign, cpu=_l1_cpu)


def smooth_l1_loss(input, target, size_average=None, reduce=None,
                   reduction="mean", beta=1.0):
    """``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``;
    under the CPU profile ``smooth_l1_kernel`` (cpu/BinaryOpsKernel.cpp):
    ``z = |a - b|``, ``0.5 * z * z / beta`` or ``z - 0.5 * beta`` in the
    dtype (beta rounded to it; vector body and scalar tail agree), then the
    reduction."""
    if beta == 0:
        return l1_loss(input, target, reduction=reduction)

    def cpu(a, b):
        half, bt = a.dtype.type(0.5), a.dtype.type(beta)
        z = np.abs(a - b)
        return np.where(z < bt, half * z * z / bt, z - half * bt)
    return _pointwise_loss(
        "smooth_l1_loss", input, target, _reduction(reduction, size_average, reduce),
        lambda d: np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta),
        lambda d: np.where(np.abs(d) < beta, d / beta, np.sign(d)), cpu=cpu)


def huber_loss(input, target, reduction="mean", delta=1.0):
    """``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``;
    under the CPU profile ``huber_kernel`` (cpu/BinaryOpsKernel.cpp): ``z =
    |a - b|``, ``0.5 * z * z`` or ``delta * (z - 0.5 * delta)`` in the dtype
    (delta rounded to it), then the reduction."""
    if delta <= 0:
        raise FpemuRuntimeError("huber_loss does not support non-positive values for delta.")

    def cpu(a, b):
        half, dl = a.dtype.type(0.5), a.dtype.type(delta)
        z = np.abs(a - b)
        return np.where(z < dl, half * z * z, dl * (z - half * dl))
    return _pointwise_loss(
        "huber_loss", input, target, _reduction(reduction),
        lambda d: np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta)),
        lambda d: np.where(np.abs(d) < delta, d, delta * np.sign(d)), cpu=cpu)


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6,
                      reduction="mean"):
    """The Gaussian negative log-likelihood, torch's sequence of ops: var
    (a number, the input's shape, or one dim short of it / broadcasting in
    one dim) clamped to ``eps`` outside the graph, then
    ``0.5 * (log(var) + (input - target) ** 2 / var)`` (+ 0.5 log 2 pi)."""
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = mul(ones_like(input), var)
    elif bool(_any(var < 0).item()):
        raise ValueError("var has negative entry/entries")
    if tuple(var.shape) != tuple(input.shape):
        if tuple(input.shape[:-1]) == tuple(var.shape):
            var = var.unsqueeze(-1)
        elif not (input.ndim == var.ndim and sum(
                b for a, b in zip(input.shape, var.shape) if a != b) == 1):
            raise ValueError("var is of incorrect size")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(reduction + " is not valid")
    var = var.clone()
    with no_grad():
        var.clamp_(min=eps)
    loss = mul(add(log(var), div(pow(sub(input, target), 2), var)), 0.5)
    if full:
        loss = add(loss, 0.5 * math.log(2 * math.pi))
    if reduction == "mean":
        return _mean(loss)
    if reduction == "sum":
        return _sum(loss)
    return loss


def poisson_nll_loss(input, target, log_input=True, full=False,
                     size_average=None, eps=1e-8, reduce=None, reduction="mean"):
    """Poisson negative log-likelihood, ATen's steps: ``exp(input) - target *
    input`` (or ``input - target * log(input + eps)``), plus Stirling's
    ``target log target - target + 0.5 log(2 pi target)`` where target > 1
    when ``full``; then the reduction."""
    red = _reduction(reduction, size_average, reduce)
    if red not in ("none", "mean", "sum"):
        raise ValueError(f"{red} is not a valid value for reduction")
    input, target = cast_inputs("poisson_nll_loss", input, target)
    if log_input:
        loss = sub(exp(input), mul(target, input))
    else:
        loss = sub(input, mul(target, log(add(input, eps))))
    if full:
        stirling = add(sub(mul(target, log(target)), target),
                       mul(log(mul(target, 2 * math.pi)), 0.5))
        loss = add(loss, masked_fill(stirling, target <= 1, 0.0))
    if red == "mean":
        return _mean(loss)
    return _sum(loss) if red == "sum" else loss


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                        reduction="mean"):
    """``max(0, -target * (input1 - input2) + margin)``, then the reduction."""
    red = _reduction(reduction, size_average, reduce)
    input1, input2, target = cast_inputs("margin_ranking_loss", input1, input2, target)
    if input1.ndim != input2.ndim or input1.ndim != target.ndim:
        raise FpemuRuntimeError(f"margin_ranking_loss : All input tensors should have same "
                                f"dimension but got sizes: input1: {list(input1.shape)}, "
                                f"input2: {list(input2.shape)}, target: {list(target.shape)} ")
    loss = clamp_min(add(mul(neg(target), sub(input1, input2)), margin), 0)
    if red == "mean":
        return _mean(loss)
    return _sum(loss) if red == "sum" else loss


def hinge_embedding_loss(input, target, margin=1.0, size_average=None,
                         reduce=None, reduction="mean"):
    """ATen's: ``max(0, margin - input)`` where target is not 1, plus input
    where target is not -1, then the reduction."""
    red = _reduction(reduction, size_average, reduce)
    input, target = cast_inputs("hinge_embedding_loss", input, target)
    zeros = input * 0.0
    margin_part = where(target != 1, clamp_min(rsub(input, margin), 0), zeros)
    self_part = where(target != -1, input, zeros)
    loss = add(margin_part, self_part)
    if red == "mean":
        return _mean(loss)
    return _sum(loss) if red == "sum" else loss


def bilinear(input1, input2, weight, bias=None):
    """``y_o = x1^T W_o x2 + b_o`` over the last dims: torch's _trilinear is
    an einsum of the three operands, here the same products (``einsum``),
    fp32 accumulation under the matmul model."""
    input1, input2, weight, bias = cast_inputs("bilinear", input1, input2, weight, bias)
    if input1.ndim != input2.ndim:
        raise FpemuRuntimeError(f"bilinear(): input dimensions do not match: got "
                                f"{input1.ndim} and {input2.ndim}")
    if weight.ndim != 3:
        raise FpemuRuntimeError(f"bilinear(): weight must be three-dimensional, got "
                                f"{weight.ndim}")
    if input1.shape[-1] != weight.shape[1] or input2.shape[-1] != weight.shape[2]:
        raise FpemuRuntimeError(f"bilinear(): input sizes do not match the weight: "
                                f"{input1.shape[-1]} vs {weight.shape[1]}, {input2.shape[-1]} "
                                f"vs {weight.shape[2]}")
    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else add(out, bias)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: the (C * kh * kw, L) sliding blocks of a (N, C, H, W) or
    (C, H, W) input, as torch's ``Unfold``; exact (it only copies), the
    gradient sums the blocks back (:func:`fold`)."""
    x = input
    if x.ndim not in (3, 4):
        raise FpemuRuntimeError(f"Input Error: Only 3D or 4D input Tensors are supported (got "
                                f"{x.ndim}D)")
    ks, ds, ps, ss = (_pair(v) for v in (kernel_size, dilation, padding, stride))
    _fold_args(ks, ds, ps, ss)
    batched = x.ndim == 4
    X = x._data if batched else x._data[None]
    N, C, H, W = X.shape
    outs = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, p, s, d in
            zip((H, W), ks, ps, ss, ds)]
    if min(outs) < 1:
        raise FpemuRuntimeError(f"Given input with spatial size ({H}, {W}), kernel_size={ks}, "
                                f"dilation={ds}, padding={ps}, calculated shape of the array of "
                                f"sliding blocks as ({outs[0]}, {outs[1]}), but its components "
                                f"must be at least one.")
    Xp = np.pad(X, ((0, 0), (0, 0), (ps[0], ps[0]), (ps[1], ps[1])))
    cols, outs = _im2col(Xp, ks, ss, ds)               # (N, Ho, Wo, C*kh*kw)
    L = outs[0] * outs[1]
    res = np.ascontiguousarray(cols.reshape(N, L, C * ks[0] * ks[1]).transpose(0, 2, 1))
    if not batched:
        res = res[0]
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        G = g if batched else g[None]
        gx = _col2im(G.astype(np.float64), (H, W), ks, ds, ps, ss)
        return (_store(gx if batched else gx[0], x.dtype),)
    return _result(res, x.dtype, (x,), backward, op="im2col")


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """col2im, the adjoint of :func:`unfold`: the (C * kh * kw, L) blocks
    summed into a (N, C, *output_size) tensor, in float64, rounded once."""
    x = input
    if x.ndim not in (2, 3):
        raise FpemuRuntimeError(f"Input Error: Only unbatched (2D) or batched (3D) input "
                                f"Tensors are supported (got {x.ndim}D)")
    osz, ks, ds, ps, ss = (_pair(v) for v in (output_size, kernel_size, dilation, padding,
                                              stride))
    _fold_args(ks, ds, ps, ss)
    batched = x.ndim == 3
    X = x._data if batched else x._data[None]
    N, CK, L = X.shape
    K = ks[0] * ks[1]
    if CK % K:
        raise FpemuRuntimeError(f"Expected size of input's dimension 1 to be divisible by the "
                                f"product of kernel_size, but got input.size(1)={CK} and "
                                f"kernel_size={ks}")
    blocks = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, p, s, d in
              zip(osz, ks, ps, ss, ds)]
    if min(blocks) < 1 or blocks[0] * blocks[1] != L:
        raise FpemuRuntimeError(f"Given output_size={osz}, kernel_size={ks}, dilation={ds}, "
                                f"padding={ps}, stride={ss}, expected size of input's dimension "
                                f"2 to match the calculated number of sliding blocks "
                                f"{blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, but got "
                                f"input.size(2)={L}.")
    dt = float_dt(x)
    res = _store(_col2im(X.astype(np.float64), osz, ks, ds, ps, ss), dt)
    if not batched:
        res = res[0]

    def backward(g):
        G = g if batched else g[None]
        Gp = np.pad(G, ((0, 0), (0, 0), (ps[0], ps[0]), (ps[1], ps[1])))
        cols, outs = _im2col(Gp, ks, ss, ds)
        back = np.ascontiguousarray(cols.reshape(N, L, CK).transpose(0, 2, 1))
        return (back if batched else back[0],)
    return _result(res, dt, (x,), backward, op="col2im")


def _fold_args(ks, ds, ps, ss):
    for name, v, least in (("kernel size", ks, 1), ("dilation", ds, 1), ("padding", ps, 0),
                           ("stride", ss, 1)):
        if len(v) != 2 or min(v) < least:
            need = "greater than zero" if least else "non-negative"
            raise FpemuRuntimeError(f"{name} should be {need}, but got {v}")


def _col2im(G, size, ks, ds, ps, ss):
    """(N, C*kh*kw, L) blocks summed into (N, C, H, W), in float64."""
    N = G.shape[0]
    H, W = size
    kh, kw = ks
    outs = [(n + 2 * p - d * (k - 1) - 1) // s + 1 for n, k, p, s, d in
            zip(size, ks, ps, ss, ds)]
    C = G.shape[1] // (kh * kw)
    B = G.reshape(N, C, kh, kw, outs[0], outs[1])
    out = np.zeros((N, C, H + 2 * ps[0], W + 2 * ps[1]))
    for i in range(kh):
        for j in range(kw):
            hs, ws = i * ds[0], j * ds[1]
            out[:, :, hs:hs + ss[0] * outs[0]:ss[0], ws:ws + ss[1] * outs[1]:ss[1]] += \
                B[:, :, i, j]
    return out[:, :, ps[0]:ps[0] + H, ps[1]:ps[1] + W]


def _same_size_target(input, target, what):
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size (torch.Size({list(target.shape)})) that is "
                         f"different to the input size (torch.Size({list(input.shape)})) "
                         f"is deprecated. Please ensure they have the same size.")


def _reduce_loss(per, red):
    """The reduced loss in float64 and its scale for the backward."""
    if red == "none":
        return per, None
    scale = per.size if red == "mean" else 1
    with np.errstate(all="ignore"):
        return np.asarray(per.sum() / scale), scale


def _loss_grad(g, scale):
    """The upstream gradient of a loss in float64, divided by its reduction's
    scale (:func:`_reduce_loss`)."""
    G = g.astype(np.float64)
    return G if scale is None else G / scale


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,
                                     reduce=None, reduction="mean", pos_weight=None):
    """``w * ((1 - t) * x + (1 + (pw - 1) * t) * log1p(exp(-x)))`` in the
    stable form torch uses (``max(-x, 0)`` taken out), in float64, rounded
    once. ``weight`` broadcasts against the loss, ``pos_weight`` against
    the classes (last dim). Autocast: fp32."""
    red = _reduction(reduction, size_average, reduce)
    _same_size_target(input, target, "binary_cross_entropy_with_logits")
    input, target, weight, pos_weight = cast_inputs(
        "binary_cross_entropy_with_logits", input, target, weight, pos_weight)
    dt = float_dt(input, target)
    X, T = f64(input), f64(target)
    W = f64(weight) if weight is not None else 1.0
    with np.errstate(all="ignore"):
        softplus_neg = np.log1p(np.exp(-np.abs(X))) + np.maximum(-X, 0)   # log(1 + e^-x)
        if pos_weight is None:
            per = (1 - T) * X + softplus_neg
            lw = 1.0
        else:
            lw = 1 + (f64(pos_weight) - 1) * T
            per = (1 - T) * X + lw * softplus_neg
        per = per * W
    loss, scale = _reduce_loss(per, red)
    if _cpu_exact(dt):
        with np.errstate(all="ignore"):
            res = np.asarray(_cpu_reduced(
                _bce_logits_cpu(input, target, weight, pos_weight, dt), red, dt, input))
    else:
        res = _store(loss, dt)

    def backward(g):
        Gs = _loss_grad(g, scale)
        with np.errstate(all="ignore"):
            sig = 1 / (1 + np.exp(-X))
            if pos_weight is None:
                gi = (sig - T) * W * Gs
                gt = -X * W * Gs
            else:
                PW = f64(pos_weight)
                gi = (lw * sig - PW * T) * W * Gs
                gt = (-X + (PW - 1) * softplus_neg) * W * Gs
        return (_store(np.broadcast_to(gi, X.shape), dt),
                _store(np.broadcast_to(gt, X.shape), dt) if target.requires_grad else None,
                None, None)
    return _result(res, dt, (input, target, weight, pos_weight), backward,
                   saved=(input, target), op="binary_cross_entropy_with_logits")


def _bce_logits_cpu(input, target, weight, pos_weight, dt):
    """Loss.cpp's ``binary_cross_entropy_with_logits``, op by op in the
    dtype: ``log_sigmoid(x)`` (:func:`.._cpu_math.log_sigmoid`), times
    ``(pos_weight - 1) * t + 1`` if given, then ``(1 - t) * x`` minus it,
    times ``weight`` if given."""
    one = _np(dt)(1)
    x, t = _arr(input, dt), _arr(target, dt)
    ls = _cpu_math.log_sigmoid(np.ascontiguousarray(x))
    if pos_weight is not None:
        ls = ls * ((_arr(pos_weight, dt) - one) * t + one)
    loss = (one - t) * x - ls
    return loss * _arr(weight, dt) if weight is not None else loss


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """``-w * (t * max(log x, -100) + (1 - t) * max(log(1 - x), -100))``, as
    torch's kernel clamps the logs; inputs must lie in [0, 1]. In float64,
    rounded once. Under CUDA autocast it raises, as torch does."""
    red = _reduction(reduction, size_average, reduce)
    _same_size_target(input, target, "binary_cross_entropy")
    input, target = cast_inputs("binary_cross_entropy", input, target)
    dt = float_dt(input, target)
    X, T = f64(input), f64(target)
    if np.any((X < 0) | (X > 1)):
        raise RuntimeError("all elements of input should be between 0 and 1")
    W = 1.0
    if weight is not None:
        W = f64(weight)
        if np.broadcast_shapes(W.shape, X.shape) != X.shape:
            raise ValueError(f"binary_cross_entropy: weight of shape {list(weight.shape)} does "
                             f"not broadcast to the input's shape {list(input.shape)}")
    with np.errstate(all="ignore"):
        log_x = np.maximum(np.log(X), -100.0)
        log_1mx = np.maximum(np.log1p(-X), -100.0)
        per = ((T - 1) * log_1mx - T * log_x) * W
    loss, scale = _reduce_loss(per, red)
    if _cpu_exact(dt):
        # binary_cross_entropy_out_cpu: the scalar kernel, then loss.mul_(weight)
        with np.errstate(all="ignore"):
            per_dt = _cpu_math.binary_cross_entropy(_arr(input, dt), _arr(target, dt))
            if weight is not None:
                per_dt = per_dt * _arr(weight, dt, per_dt.shape)
            res = np.asarray(_cpu_reduced(per_dt, red, dt, input, target))
    else:
        res = _store(loss, dt)

    def backward(g):
        Gs = _loss_grad(g, scale)
        with np.errstate(all="ignore"):
            gi = (X - T) / np.maximum((1 - X) * X, 1e-12) * W * Gs
            gt = (log_1mx - log_x) * W * Gs
        return (_store(np.broadcast_to(gi, X.shape), dt),
                _store(np.broadcast_to(gt, X.shape), dt) if target.requires_grad else None)
    return _result(res, dt, (input, target), backward, saved=(input, target),
                   op="binary_cross_entropy")


def kl_div(input, target, size_average=None, reduce=None, reduction="mean",
           log_target=False):
    """``t * (log t - x)`` (or ``exp(t) * (t - x)`` with ``log_target``),
    zero where t = 0; "batchmean" divides the sum by the batch size.
    Autocast: fp32."""
    if reduction == "batchmean":
        red = "sum"
    else:
        red = _reduction(reduction, size_average, reduce)
        if red == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size "
                          "and the support size.'batchmean' divides only by the batch size, "
                          "and aligns with the KL div math definition.'mean' will be changed "
                          "to behave the same as 'batchmean' in the next major release.",
                          stacklevel=2)
    input, target = cast_inputs("kl_div", input, target)
    dt = float_dt(input, target)
    X, T = f64(input), f64(target)
    with np.errstate(all="ignore"):
        if log_target:
            per = np.exp(T) * (T - X)
        else:
            per = np.where(T > 0, T * (np.log(T) - X), 0.0)
    loss, scale = _reduce_loss(per, red)
    if reduction == "batchmean" and input.ndim:
        loss, scale = loss / input.shape[0], input.shape[0]
    if _cpu_exact(dt):
        res = _kl_div_cpu(input, target, red, reduction, log_target, dt)
    else:
        res = _store(loss, dt)

    def backward(g):
        Gs = _loss_grad(g, scale)
        with np.errstate(all="ignore"):
            gi = -(np.exp(T) if log_target else T) * Gs
            # d/dt of t (log t - x) is log t - x + 1; of exp(t) (t - x), exp(t) (t - x + 1)
            gt = (np.exp(T) * (T - X + 1) if log_target
                  else np.where(T > 0, np.log(T) - X + 1, 0.0)) * Gs
        return (_store(np.broadcast_to(gi, X.shape), dt),
                _store(np.broadcast_to(gt, T.shape), dt))
    return _result(res, dt, (input, target), backward, saved=(target,), op="kl_div")


def _kl_div_cpu(input, target, red, reduction, log_target, dt):
    """Loss.cpp's ``kl_div`` in the dtype: ``xlogy(t, t) - t * x``
    (:func:`.._cpu_math.xlogy`, glibc's log), or with ``log_target``
    ``exp(t) * (t - x)`` (torch's exp is MKL's vsExp / vdExp: here the
    correctly rounded exp); then the reduction, and "batchmean"'s division
    of the sum by the batch size (a float scalar of the dtype)."""
    f = _np(dt)
    x, t = np.broadcast_arrays(_arr(input, dt), _arr(target, dt))
    with np.errstate(all="ignore"):
        if log_target:
            per = np.exp(t.astype(np.float64)).astype(f) * (t - x)
        else:
            per = _cpu_math.xlogy(t, t) - t * x
        res = np.asarray(_cpu_reduced(per, red, dt, target, input))
        if reduction == "batchmean" and input.ndim:
            res = np.asarray(res / f(input.shape[0]))
    return res


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["bilinear", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
           "fold", "gaussian_nll_loss", "hinge_embedding_loss", "huber_loss", "kl_div",
           "l1_loss", "margin_ranking_loss", "mse_loss", "nll_loss", "poisson_nll_loss",
           "smooth_l1_loss", "unfold"]
