"""Convolutions in ``torch.nn.functional``: im2col, then the emulated matmul."""

from __future__ import annotations

import itertools

import numpy as np

from ...errors import FpemuRuntimeError, FpemuValueError
from .._autocast import cast_inputs
from .._core import _result, _store, float64, is_float
from ..ops import linalg as _linalg
from ..ops.shape import squeeze, unsqueeze


# ------------------------------------------------------------- convolution
def _pair(v, n=2):
    """A size for each of ``n`` dims: one number (or a 1-tuple) for all."""
    if isinstance(v, (tuple, list)):
        return tuple(v) * n if len(v) == 1 else tuple(v)
    return (v,) * n


def _im2col(X, ks, ss, ds):
    """(N, C, *spatial) -> (N, *out, C * prod(ks)) patches of an already
    padded input, for kernel sizes ``ks``, strides ``ss``, dilations ``ds``."""
    N, C = X.shape[:2]
    sp = X.shape[2:]
    nd = len(sp)
    outs = tuple((n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(sp, ks, ss, ds))
    st = X.strides
    view = np.lib.stride_tricks.as_strided(
        X, (N, C) + tuple(ks) + outs,
        (st[0], st[1]) + tuple(st[2 + i] * ds[i] for i in range(nd)) +
        tuple(st[2 + i] * ss[i] for i in range(nd)), writeable=False)
    order = (0,) + tuple(range(2 + nd, 2 + 2 * nd)) + (1,) + tuple(range(2, 2 + nd))
    return view.transpose(order).reshape((N,) + outs + (C * int(np.prod(ks)),)), outs


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution as im2col and the emulated matmul (fp32 accumulation
    under the matmul model, the bias added to the accumulator, one rounding).
    Autocast: lower. Under the CUDA profile ``torch.backends.cudnn.allow_tf32``
    (on by default, as in torch) reads float32 operands as tf32."""
    x, w, b = cast_inputs("conv2d", input, weight, bias)
    return _convnd(x, w, b, stride, padding, dilation, groups, 2)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """3-D convolution, as :func:`conv2d` over three spatial dims. Autocast:
    lower."""
    x, w, b = cast_inputs("conv3d", input, weight, bias)
    return _convnd(x, w, b, stride, padding, dilation, groups, 3)


def _convnd(x, w, b, stride, padding, dilation, groups, nd):
    _conv_args(x, w, b, stride, padding, dilation, groups, nd)
    batched = x.ndim == nd + 2
    if not batched:
        x = unsqueeze(x, 0)
    N, C = x.shape[:2]
    sp = tuple(x.shape[2:])
    O, Cg = w.shape[:2]
    ks = tuple(w.shape[2:])
    if C != Cg * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(w.shape)}, expected "
                           f"input{list(x.shape)} to have {Cg * groups} channels, but got {C} "
                           f"channels instead")
    _linalg.same_mm_dtype(x.dtype, w.dtype)
    dt = x.dtype
    _linalg.check_mm_dtype(dt)
    ss, ds = _pair(stride, nd), _pair(dilation, nd)
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(v != 1 for v in ss):
                raise RuntimeError("padding='same' is not supported for strided convolutions")
            # torch: d (k - 1) in all, the extra one of an even total at the end
            tot = [d * (k - 1) for d, k in zip(ds, ks)]
            pads = tuple((t // 2, t - t // 2) for t in tot)
        else:
            raise FpemuValueError(f"Invalid padding string '{padding}'")
    else:
        pads = tuple((p, p) for p in _pair(padding, nd))
    for n, k, d, (p0, p1) in zip(sp, ks, ds, pads):
        if n + p0 + p1 < d * (k - 1) + 1:
            padded = " x ".join(str(n + a + c) for n, (a, c) in zip(sp, pads))
            kernel = " x ".join(str(d * (k - 1) + 1) for d, k in zip(ds, ks))
            raise RuntimeError(f"Calculated padded input size per channel: ({padded}). Kernel "
                               f"size: ({kernel}). Kernel size can't be greater than actual "
                               f"input size")
    om = np.float64 if dt is float64 else np.float32      # float64 stays float64
    tf32 = _linalg._tf32_inputs(dt, conv=True)
    Xp = np.pad(x._data.astype(om), ((0, 0), (0, 0)) + pads)
    cols, outs = _im2col(Xp, ks, ss, ds)
    K = Cg * int(np.prod(ks))
    Og = O // groups
    Wm = w._data.astype(om).reshape(O, K)
    parts, colsg = [], []
    for gi in range(groups):
        cg = cols.reshape((N,) + outs + (groups, K))[..., gi, :].reshape(-1, K)
        colsg.append(cg)
        parts.append(_linalg.mm_acc(cg, Wm[gi * Og:(gi + 1) * Og].T, dt, tf32, conv=True))
    acc = np.concatenate(parts, axis=1)
    if b is not None:
        acc = acc + b._data.astype(om)
    to_nc = (0, nd + 1) + tuple(range(1, nd + 1))          # (N, *out, O) -> (N, O, *out)
    res = np.ascontiguousarray(_store(acc.reshape((N,) + outs + (O,)).transpose(to_nc), dt))
    xn, wn = x.requires_grad, w.requires_grad

    def backward(g):
        to_nl = (0,) + tuple(range(2, nd + 2)) + (1,)
        G = np.ascontiguousarray(g.astype(om).transpose(to_nl)).reshape(-1, O)
        gx = gw = gb = None
        if wn:
            gparts = [_linalg.mm_acc(np.ascontiguousarray(G[:, gi * Og:(gi + 1) * Og].T),
                                     colsg[gi], dt, tf32, conv=True) for gi in range(groups)]
            gw = _store(np.concatenate(gparts, 0).reshape(w.shape), dt)
        if xn:
            dcols = np.concatenate(
                [_linalg.mm_acc(G[:, gi * Og:(gi + 1) * Og], Wm[gi * Og:(gi + 1) * Og], dt,
                                tf32, conv=True) for gi in range(groups)], axis=1)
            dcols = dcols.reshape((N,) + outs + (groups, Cg) + ks).astype(np.float64)
            dX = np.zeros(Xp.shape, np.float64)
            for pos in itertools.product(*(range(k) for k in ks)):
                win = tuple(slice(p * d, p * d + s * n, s)
                            for p, d, s, n in zip(pos, ds, ss, outs))
                part = dcols[(Ellipsis,) + pos].reshape((N,) + outs + (C,))
                dX[(slice(None), slice(None)) + win] += part.transpose(to_nc)
            gx = _store(dX[(slice(None), slice(None)) +
                           tuple(slice(p0, p0 + n) for (p0, _), n in zip(pads, sp))], dt)
        if b is not None and b.requires_grad:
            gb = _store(G.astype(np.float64).sum(axis=0), dt)
        return gx, gw, gb
    out = _result(res, dt, (x, w, b), backward, saved=(x, w), op="convolution")
    if not batched:
        out = squeeze(out, 0)
    return out


def _conv_args(x, w, b, stride, padding, dilation, groups, nd):
    """torch's checks of a convolution's arguments (ConvUtils.h), before any
    arithmetic: dtypes alike, positive stride, dilation and groups, no
    negative padding, a weight of the input's rank with at least ``groups``
    filters."""
    for t in (w, b):
        if t is not None and t.dtype is not x.dtype:
            raise FpemuRuntimeError(f"Input type ({x.dtype}) and weight or bias type "
                                    f"({t.dtype}) should be the same")
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f"convolution of {x.dtype} tensors is not supported: pass "
                                f"float tensors")
    for name, v, least in (("stride", stride, 1), ("dilation", dilation, 1)):
        if any(int(e) < least for e in np.atleast_1d(v)):
            raise FpemuRuntimeError("non-positive stride is not supported" if name == "stride"
                                    else "dilation should be greater than zero")
    if not isinstance(padding, str) and any(int(e) < 0 for e in np.atleast_1d(padding)):
        raise FpemuRuntimeError("negative padding is not supported")
    if groups <= 0:
        raise FpemuRuntimeError("non-positive groups is not supported")
    if x.ndim not in (w.ndim - 1, w.ndim):
        raise FpemuRuntimeError(f"Expected {w.ndim - 1}D (unbatched) or {w.ndim}D (batched) "
                                f"input to conv{nd}d, but got input of size: {list(x.shape)}")
    if w.ndim != nd + 2:
        raise FpemuRuntimeError(f"Expected {nd + 2}-dimensional weight for conv{nd}d, got a "
                                f"{w.ndim}-dimensional weight of size {list(w.shape)}")
    if w.shape[0] < groups:
        raise FpemuRuntimeError(f"Given groups={groups}, expected weight to be at least {groups} "
                                f"at dimension 0, but got weight of size {list(w.shape)} "
                                f"instead")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution: :func:`conv2d` over a height of one."""
    (x, w, b) = cast_inputs("conv1d", input, weight, bias)
    if x.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2D (unbatched) or 3D (batched) input to conv1d, but got "
                           f"input of size: {list(x.shape)}")
    pad = padding if isinstance(padding, str) else (0, _pair(padding, 1)[0])
    out = conv2d(unsqueeze(x, -2), unsqueeze(w, -2), b, (1, _pair(stride, 1)[0]), pad,
                 (1, _pair(dilation, 1)[0]), groups)
    return squeeze(out, -2)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,
                     output_padding=0, groups=1, dilation=1):
    """1-D transposed convolution: :func:`conv_transpose2d` over a height of one."""
    input, weight, bias = cast_inputs("conv_transpose1d", input, weight, bias)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2D (unbatched) or 3D (batched) input to "
                           f"conv_transpose1d, but got input of size: {list(input.shape)}")
    one = (lambda v: (1, _pair(v, 1)[0]))
    out = conv_transpose2d(unsqueeze(input, -2), unsqueeze(weight, -2), bias, one(stride),
                           (0, _pair(padding, 1)[0]), (0, _pair(output_padding, 1)[0]),
                           groups, one(dilation))
    return squeeze(out, -2)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,
                     output_padding=0, groups=1, dilation=1):
    """The transpose of :func:`conv2d` (its gradient with respect to the
    input): each input pixel times the kernel, scattered into the output.

    The products over input channels are the emulated matmul (fp32
    accumulation under the matmul model); the overlapping kernel taps are
    added in float64 with the bias and rounded once (tier 2, as cuDNN's
    order is unspecified). ``weight`` is ``(C_in, C_out / groups, kh, kw)``.
    Autocast: lower."""
    x, w, b = cast_inputs("conv_transpose2d", input, weight, bias)
    batched = x.ndim == 4
    if x.ndim not in (3, 4):
        raise RuntimeError(f"Expected 3D (unbatched) or 4D (batched) input to "
                           f"conv_transpose2d, but got input of size: {list(x.shape)}")
    if not batched:
        x = unsqueeze(x, 0)
    N, C, H, W = x.shape
    Cw, Og, kh, kw = w.shape
    if C != Cw:
        raise RuntimeError(f"Given transposed=1, weight of size {list(w.shape)}, expected "
                           f"input{list(x.shape)} to have {Cw} channels, but got {C} channels "
                           f"instead")
    if C % groups:
        raise RuntimeError("in_channels must be divisible by groups")
    _linalg.same_mm_dtype(x.dtype, w.dtype)
    dt = x.dtype
    _linalg.check_mm_dtype(dt)
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    oph, opw = _pair(output_padding)
    dh, dw = _pair(dilation)
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, "
                           f"but got output_padding_height: {oph} output_padding_width: {opw} "
                           f"stride_height: {sh} stride_width: {sw} dilation_height: {dh} "
                           f"dilation_width: {dw}")
    Hf = (H - 1) * sh + dh * (kh - 1) + 1 + oph          # before the padding is cut
    Wf = (W - 1) * sw + dw * (kw - 1) + 1 + opw
    Ho, Wo = Hf - 2 * ph, Wf - 2 * pw
    if Ho <= 0 or Wo <= 0:
        raise RuntimeError(f"Given input size per channel: ({H} x {W}). Calculated output "
                           f"size per channel: ({Ho} x {Wo}). Output size is too small")
    Cout = Og * groups
    Cg = C // groups
    tf32 = _linalg._tf32_inputs(dt, conv=True)
    om = np.float64 if dt is float64 else np.float32      # float64 stays float64
    Xm = np.ascontiguousarray(x._data.astype(om).transpose(0, 2, 3, 1)).reshape(-1, C)
    Wm = w._data.astype(om).reshape(C, Og * kh * kw)
    full = np.zeros((N, Cout, Hf, Wf), np.float64)
    for gi in range(groups):
        cols = _linalg.mm_acc(np.ascontiguousarray(Xm[:, gi * Cg:(gi + 1) * Cg]),
                              Wm[gi * Cg:(gi + 1) * Cg], dt, tf32, conv=True)
        cols = cols.reshape(N, H, W, Og, kh, kw).astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                full[:, gi * Og:(gi + 1) * Og, i * dh:i * dh + sh * H:sh,
                     j * dw:j * dw + sw * W:sw] += cols[..., i, j].transpose(0, 3, 1, 2)
    acc = full[:, :, ph:ph + Ho, pw:pw + Wo]
    if b is not None:
        acc = acc + b._data.astype(np.float64).reshape(1, Cout, 1, 1)
    res = np.ascontiguousarray(_store(acc, dt))
    xn, wn = x.requires_grad, w.requires_grad

    def backward(g):
        Gf = np.zeros((N, Cout, Hf, Wf), om)
        Gf[:, :, ph:ph + Ho, pw:pw + Wo] = g.astype(om)
        patches, (h2, w2) = _im2col(Gf, (kh, kw), (sh, sw), (dh, dw))    # (N, H, W, Cout*kh*kw)
        patches = patches[:, :H, :W].reshape(N * H * W, groups, Og * kh * kw)
        gx = gw = gb = None
        if xn:
            parts = [_linalg.mm_acc(np.ascontiguousarray(patches[:, gi]),
                                    np.ascontiguousarray(Wm[gi * Cg:(gi + 1) * Cg].T), dt,
                                    tf32, conv=True) for gi in range(groups)]
            gx = _store(np.concatenate(parts, 1).reshape(N, H, W, C).transpose(0, 3, 1, 2),
                        dt)
        if wn:
            parts = [_linalg.mm_acc(np.ascontiguousarray(Xm[:, gi * Cg:(gi + 1) * Cg].T),
                                    np.ascontiguousarray(patches[:, gi]), dt, tf32, conv=True)
                     for gi in range(groups)]
            gw = _store(np.concatenate(parts, 0).reshape(w.shape), dt)
        if b is not None and b.requires_grad:
            gb = _store(g.astype(np.float64).sum(axis=(0, 2, 3)), dt)
        return gx, gw, gb
    out = _result(res, dt, (x, w, b), backward, saved=(x, w), op="convolution")
    if not batched:
        out = squeeze(out, 0)
    return out


def _at_least_3d(x, op):
    """``x``'s shape, if ``x`` has at least 3 dimensions (pixel_shuffle's
    (*, C, H, W)), else torch's error."""
    if x.ndim < 3:
        raise RuntimeError(f"{op} expects input to have at least 3 dimensions, but got input "
                           f"with {x.ndim} dimension(s)")
    return x.shape


def pixel_shuffle(input, upscale_factor):
    """(*, C r^2, H, W) -> (*, C, H r, W r): a reshape and a permute (exact)."""
    r = int(upscale_factor)
    x = input
    *lead, c, h, w = _at_least_3d(x, "pixel_shuffle")
    if r <= 0 or c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)={c}"
                           f" is not divisible by {r * r}")
    n = len(lead)
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    y = y.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input, downscale_factor):
    """(*, C, H r, W r) -> (*, C r^2, H, W), the inverse of pixel_shuffle."""
    r = int(downscale_factor)
    x = input
    *lead, c, h, w = _at_least_3d(x, "pixel_unshuffle")
    if r <= 0 or h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle expects height and width to be divisible by "
                           f"downscale_factor, but got {h} x {w} and {r}")
    n = len(lead)
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    y = y.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return y.reshape(*lead, c * r * r, h // r, w // r)


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "pixel_shuffle",
           "pixel_unshuffle"]
