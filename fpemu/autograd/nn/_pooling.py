"""Max and average pooling over 1, 2 or 3 spatial dims, and max unpooling.

Windows, output sizes and divisors follow ATen's CPU kernels
(``Pool.h``: ``pooling_output_shape``, ``pool2d_shape_check``;
``AvgPoolKernel.cpp``, ``MaxPoolKernel.cpp``):

* the output size is ``floor((n + 2p - d(k - 1) - 1) / s) + 1``, or with
  ``ceil_mode`` the ceiling, less one where the last window would start past
  the input and its left padding;
* max pooling takes the first largest element of each window, or the last
  NaN in it (torch's ``val > max || isnan(val)``); padding never wins, and a
  window of -inf only picks its first element inside the input. The indices
  ``return_indices`` gives count within each (N, C) plane of the input, in
  C order. The maximum is exact; the gradient goes to the picked element;
* average pooling sums each window in float64 and divides once, rounded
  once (torch sums in float32: tier 2). The divisor is ``divisor_override``,
  else with ``count_include_pad`` the window clipped to the padded input,
  else the elements inside the input; a window with none gives 0.
"""

from __future__ import annotations

import itertools

import numpy as np

from ...errors import FpemuRuntimeError
from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, int64, is_float
from .._common import float_dt
from .._dtypes import opmath
from .._profile import get_profile


def _tuple(v, nd, name):
    if isinstance(v, (tuple, list)):
        v = tuple(int(e) for e in v)
        if len(v) == 1:
            return v * nd
        if len(v) != nd:
            raise FpemuRuntimeError(f"{name} must either be a single int, or a tuple of {nd} "
                                    f"ints, got {v}")
        return v
    return (int(v),) * nd


def _out_size(n, k, p, s, d, ceil_mode):
    """ATen's ``pooling_output_shape``."""
    num = n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _geometry(fname, x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    """Kernel, stride, padding, dilation per dim and the output sizes, after
    torch's checks (each a RuntimeError, as torch's)."""
    ks = _tuple(kernel_size, nd, "kernel_size")
    empty_stride = stride is None or (isinstance(stride, (tuple, list)) and not len(stride))
    ss = ks if empty_stride else _tuple(stride, nd, "stride")
    ps = _tuple(padding, nd, "padding")
    ds = _tuple(dilation, nd, "dilation")
    if min(ks) <= 0:
        raise FpemuRuntimeError(f"{fname}: kernel_size must be greater than zero, but got {ks}")
    if min(ss) <= 0:
        raise FpemuRuntimeError(f"{fname}: stride must be greater than zero, but got {ss}")
    if min(ds) <= 0:
        raise FpemuRuntimeError(f"{fname}: dilation must be greater than zero, but got {ds}")
    if min(ps) < 0:
        raise FpemuRuntimeError(f"{fname}: pad must be non-negative, but got {ps}")
    if any(2 * p > d * (k - 1) + 1 for p, k, d in zip(ps, ks, ds)):
        raise FpemuRuntimeError(f"{fname}: pad should be at most half of effective kernel "
                                f"size, but got pad={ps}, kernel_size={ks} and dilation={ds}")
    if x.ndim not in (nd + 1, nd + 2) or 0 in (x.shape[1:] if x.ndim == nd + 2 else x.shape):
        raise FpemuRuntimeError(
            f"{fname}: Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with optional 0 "
            f"dim batch size for input (and non-batch dimensions of positive length), but got: "
            f"{list(x.shape)}")
    spatial = tuple(x.shape[-nd:])
    outs = tuple(_out_size(n, k, p, s, d, ceil_mode)
                 for n, k, p, s, d in zip(spatial, ks, ps, ss, ds))
    if min(outs) < 1:
        raise FpemuRuntimeError(f"{fname}: Given input size: {list(x.shape)}. Calculated "
                                f"output size: {list(outs)}. Output size is too small "
                                f"(Invalid computed output size: {min(outs)})")
    return ks, ss, ps, ds, spatial, outs


def _windows(A, nd, ks, ss, ps, ds, outs, fill):
    """(..., *outs, *ks) windows of ``A`` (..., *spatial) padded with ``fill``
    on both sides and, for ``ceil_mode``'s last windows, at the end."""
    spatial = A.shape[-nd:]
    pads = [(0, 0)] * (A.ndim - nd) + [
        (p, max(p, (o - 1) * s + d * (k - 1) + 1 - n - p))
        for n, k, p, s, d, o in zip(spatial, ks, ps, ss, ds, outs)]
    Ap = np.ascontiguousarray(np.pad(A, pads, constant_values=fill))
    st = Ap.strides
    lead = Ap.shape[:-nd]
    return np.lib.stride_tricks.as_strided(
        Ap, lead + tuple(outs) + tuple(ks),
        st[:-nd] + tuple(st[-nd + i] * ss[i] for i in range(nd)) +
        tuple(st[-nd + i] * ds[i] for i in range(nd)), writeable=False)


def _channels_last(a):
    """Whether torch's ``suggest_memory_format`` calls an array of these
    strides channels-last (c10's ``is_channels_last_strides_2d`` / ``_3d``:
    the strides ascend over C, then the spatial dims from the last, then N,
    with torch's tie rules for size-1 dims)."""
    if a.ndim not in (4, 5):
        return False
    sizes = a.shape
    strides = [st // a.itemsize for st in a.strides]
    if strides[1] == 0:
        return False
    order = (1, 3, 2, 0) if a.ndim == 4 else (1, 4, 3, 2, 0)
    lo = 0
    for d in order:
        if sizes[d] == 0 or strides[d] < lo:
            return False
        if d == 0 and lo == strides[1]:
            return False
        lo = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


def _batched(x, nd):
    """x as (N, C, *spatial) data and whether it had a batch dim."""
    batched = x.ndim == nd + 2
    A = x._data if batched else x._data[None]
    return A, batched


def max_pool(fname, input, nd, kernel_size, stride, padding, dilation,
             ceil_mode, return_indices):
    (x,) = cast_inputs(fname, input)        # AutocastCPU: max_pool3d runs in float32
    ks, ss, ps, ds, spatial, outs = _geometry(fname, x, nd, kernel_size, stride, padding,
                                              dilation, ceil_mode)
    A, batched = _batched(x, nd)
    K = int(np.prod(ks))
    flat = np.arange(int(np.prod(spatial)), dtype=np.int64).reshape(spatial)
    where = _windows(flat, nd, ks, ss, ps, ds, outs, -1).reshape(tuple(outs) + (K,))
    real = where >= 0
    W = _windows(A, nd, ks, ss, ps, ds, outs, 0).reshape(A.shape[:2] + tuple(outs) + (K,))
    if is_float(x.dtype):
        with np.errstate(invalid="ignore"):
            m = np.max(np.where(real, W, -np.inf), axis=-1, keepdims=True)
        pick = np.argmax(real & (W == m), axis=-1)
        nan = np.isnan(W) & real
        if nan.any():                                   # the last NaN of the window
            last = K - 1 - np.argmax(nan[..., ::-1], axis=-1)
            pick = np.where(nan.any(-1), last, pick)
    else:
        lo = np.iinfo(A.dtype).min if A.dtype.kind in "iu" else False
        m = np.max(np.where(real, W, lo), axis=-1, keepdims=True)
        pick = np.argmax(real & (W == m), axis=-1)
    res = np.take_along_axis(W, pick[..., None], -1)[..., 0]
    idx = np.take_along_axis(np.broadcast_to(where, W.shape), pick[..., None], -1)[..., 0]
    if not batched:
        res, idx = res[0], idx[0]
    res = np.ascontiguousarray(res.astype(x._data.dtype))
    indices = Tensor(np.ascontiguousarray(idx), int64)
    if not is_float(x.dtype):
        out = Tensor(res, x.dtype)
        return (out, indices) if return_indices else out
    plane = int(np.prod(spatial))

    def backward(g):
        G = g.astype(np.float64).reshape(-1, int(np.prod(outs)))
        I = indices._data.reshape(G.shape)                  # noqa: E741
        gx = np.zeros((G.shape[0], plane))
        np.add.at(gx, (np.arange(G.shape[0])[:, None], I), G)
        return (_store(gx.reshape(x.shape), x.dtype),)
    out = _result(res, x.dtype, (x,), backward, saved=(x,),
                  op=f"max_pool{nd}d_with_indices")
    return (out, indices) if return_indices else out


def max_pool_backward(grad_output, input, indices, nd):
    """ATen's ``max_pool{nd}d_with_indices_backward`` as an op of its own:
    ``grad_output`` added at ``indices`` within each (N, C) plane of a zero
    tensor of the input's shape (float64, rounded once). Differentiable: its
    gradient with respect to ``grad_output`` gathers at the indices, with
    respect to the input it is zero (torch's double backward)."""
    x, g = input, grad_output
    if tuple(indices.shape) != tuple(g.shape):
        raise FpemuRuntimeError(f"max_pool{nd}d backward: indices {list(indices.shape)} and "
                                f"grad_output {list(g.shape)} must have the same shape")
    plane = int(np.prod(x.shape[-nd:]))
    rows = int(np.prod(x.shape[:-nd]))
    G = g._data.astype(np.float64).reshape(rows, -1)
    I = indices._data.reshape(G.shape)                      # noqa: E741
    out = np.zeros((rows, plane))
    np.add.at(out, (np.arange(rows)[:, None], I), G)
    dt = g.dtype

    def backward(gg):
        back = np.take_along_axis(gg.reshape(rows, plane), I, -1)
        return back.reshape(g.shape), np.zeros(x.shape, gg.dtype), None
    return _result(_store(out.reshape(x.shape), dt), dt, (g, x, indices), backward,
                   op=f"max_pool{nd}d_with_indices_backward")


def avg_pool(fname, input, nd, kernel_size, stride, padding, ceil_mode,
             count_include_pad, divisor_override):
    (x,) = cast_inputs(fname, input)        # AutocastCPU: avg_pool3d runs in float32
    if divisor_override is not None and divisor_override == 0:
        raise FpemuRuntimeError(f"{fname}: divisor must be not zero")
    ks, ss, ps, ds, spatial, outs = _geometry(fname, x, nd, kernel_size, stride, padding, 1,
                                              ceil_mode)
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f'"{fname}" not implemented for \'{x.dtype}\': pool a float '
                                f'tensor')
    A, batched = _batched(x, nd)
    cpu = get_profile().device == "cpu"
    acc = opmath(x.dtype) if cpu else np.float64
    W = _windows(A.astype(acc), nd, ks, ss, ps, ds, outs, 0.0)
    W = W.reshape(A.shape[:2] + tuple(outs) + (int(np.prod(ks)),))
    if cpu:
        # AvgPoolKernel.cpp (cpu_avg_pool, cpu_avg_pool_channels_last): the
        # window's elements added one at a time from +0 in opmath (float32
        # for float32 / 16-bit, double for double), depth, row, column in
        # order; the padding's zeros leave a sum that never is -0 unchanged
        sums = np.zeros(W.shape[:-1], acc)
        for k in range(W.shape[-1]):
            sums = sums + W[..., k]
    else:
        sums = W.sum(-1)
    # per dim: the window clipped to the padded input, and to the input
    padded, inside = [], []
    for n, k, p, s, o in zip(spatial, ks, ps, ss, outs):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        padded.append(end - start)
        inside.append(np.minimum(end, n) - np.maximum(start, 0))
    count = np.ones(outs)
    full = np.ones(outs)
    for i in range(nd):
        shape = [1] * nd
        shape[i] = outs[i]
        count = count * np.maximum(inside[i], 0).reshape(shape)
        full = full * padded[i].reshape(shape)
    if divisor_override:
        div = np.full(outs, float(divisor_override))
    elif count_include_pad:
        div = full
    else:
        div = count
    with np.errstate(all="ignore"):
        if cpu:
            # one division by the integer divisor converted to opmath; the
            # contiguous kernel adds the quotient to a zeroed output (-0
            # becomes +0), the channels-last one stores it
            q = sums / np.where(count > 0, div, 1.0).astype(acc)
            if not _channels_last(x._data if nd > 1 else x._data[..., None, :]):
                q = q + acc(0)
            vals = np.where(count > 0, q, acc(0))
        else:
            vals = np.where(count > 0, sums / np.where(count > 0, div, 1.0), 0.0)
    dt = float_dt(x)
    res = _store(vals if batched else vals[0], dt)
    share_div = np.where(count > 0, div, np.inf)

    def backward(g):
        G = g.astype(np.float64).reshape(A.shape[:2] + tuple(outs)) / share_div
        pads = [(0, 0), (0, 0)] + [
            (p, max(p, (o - 1) * s + k - n - p)) for n, k, p, s, o in
            zip(spatial, ks, ps, ss, outs)]
        Gp = np.zeros(tuple(n + a + b for n, (a, b) in zip(A.shape, pads)))
        for pos in itertools.product(*(range(k) for k in ks)):
            win = tuple(slice(q, q + s * o, s) for q, s, o in zip(pos, ss, outs))
            Gp[(slice(None), slice(None)) + win] += G
        crop = tuple(slice(a, a + n) for (a, _), n in zip(pads[2:], spatial))
        gx = Gp[(slice(None), slice(None)) + crop]
        return (_store(gx.reshape(x.shape), dt),)
    return _result(np.ascontiguousarray(res), dt, (x,), backward, op=f"avg_pool{nd}d")


def max_unpool(fname, input, indices, nd, kernel_size, stride, padding,
               output_size):
    """The inverse of a max pooling: each value written at its index within
    its (N, C) plane of a zero output (torch's max_unpool)."""
    (x,) = cast_inputs(fname, input)        # AutocastCPU: max_unpool2d / 3d in float32
    if not isinstance(indices, Tensor) or indices.dtype is not int64:
        raise FpemuRuntimeError(f"{fname}: elements in indices should be type int64 but got: "
                                f"{getattr(indices, 'dtype', type(indices).__name__)}")
    if tuple(indices.shape) != tuple(x.shape):
        raise FpemuRuntimeError(f"{fname}: Expected shape of indices to be same as that of the "
                                f"input tensor ({list(x.shape)}) but got indices tensor with "
                                f"shape: {list(indices.shape)}")
    if x.ndim not in (nd + 1, nd + 2):
        raise FpemuRuntimeError(f"{fname}: Input to max_unpooling{nd}d should be a "
                                f"{nd + 1}d or {nd + 2}d Tensor, but got a tensor with "
                                f"{x.ndim} dimensions.")
    ks = _tuple(kernel_size, nd, "kernel_size")
    empty_stride = stride is None or (isinstance(stride, (tuple, list)) and not len(stride))
    ss = ks if empty_stride else _tuple(stride, nd, "stride")
    ps = _tuple(padding, nd, "padding")
    spatial = tuple(x.shape[-nd:])
    default = tuple((n - 1) * s - 2 * p + k for n, k, s, p in zip(spatial, ks, ss, ps))
    if output_size is None:
        outs = default
    else:
        outs = tuple(int(v) for v in output_size)[-nd:]
        if len(outs) != nd:
            raise FpemuRuntimeError(f"{fname}: output_size should have {nd} or {nd + 2} "
                                    f"elements, got {list(output_size)}")
        for o, dflt, s in zip(outs, default, ss):
            if not dflt - s < o < dflt + s:
                raise FpemuRuntimeError(f"{fname}: invalid output_size {list(output_size)} "
                                        f"(dim size must be between {dflt - s} and "
                                        f"{dflt + s}, exclusive)")
    plane = int(np.prod(outs))
    lead = tuple(x.shape[:-nd])
    V = x._data.reshape(-1, int(np.prod(spatial)))
    I = indices._data.reshape(V.shape)                      # noqa: E741
    bad = (I < 0) | (I >= plane)
    if bad.any():
        raise FpemuRuntimeError(f"{fname}: Found an invalid max index: {int(I[bad][0])} "
                                f"(output volumes are of size {'x'.join(map(str, outs))})")
    out = np.zeros((V.shape[0], plane), x._data.dtype)
    rows = np.broadcast_to(np.arange(V.shape[0])[:, None], I.shape)
    out[rows.reshape(-1), I.reshape(-1)] = V.reshape(-1)    # the last write wins, as torch's
    res = out.reshape(lead + outs)
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)

    def backward(g):
        G = g.reshape(-1, plane)
        return (np.take_along_axis(G, I, -1).reshape(x.shape), None)
    return _result(res, x.dtype, (x, indices), backward, op=f"max_unpool{nd}d")
