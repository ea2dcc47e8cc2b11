"""``interpolate`` (and the deprecated ``upsample*``) and the adaptive average
poolings (``adaptive_avg_pool1d/2d/3d``: area resampling).

Each mode is a separable linear map: along every spatial dim, output ``o``
takes a few input positions with weights (one for nearest, two for linear,
four for bicubic, the window of an adaptive average for area). fpemu computes
the positions and weights as ATen's CPU kernels do (``UpSample.h``), in the
arithmetic that decides them:

* nearest: ``min(floor(o * scale), n - 1)`` with ``scale`` a float32 (the
  input size over the output size, or ``1 / scale_factor``), and, in 2-d
  only, ATen's exact shortcuts for ``out == in`` and ``out == 2 in`` (with a
  scale_factor, 1-d and 3-d ones pick by the formula: measured on torch
  2.13); nearest-exact
  ``min(floor((o + 0.5) * scale), n - 1)``;
* linear / bilinear / trilinear / bicubic: the source coordinate
  ``scale * (o + 0.5) - 0.5`` (``scale * o`` with ``align_corners``) and the
  weights in opmath (float32; float64 for float64 tensors), bicubic's with
  Keys' kernel at ``A = -0.75``.

Under the CUDA profile the weighted sums are taken in float64 and rounded
once (the linear modes are tier 2, within a few ulps; nearest only selects
and is exact). Under a CPU profile (AVX2 or AVX512, float32 and float64)
the forward is ATen's CPU kernels' own arithmetic, bit for bit: the kernel
torch picks for the shape and layout (the generic separable one, or the
channels-last one with its vector width), its fused multiply-adds and
order, and the nearest kernels' index formulas (``_cpu_resample.py``). The
adaptive average poolings likewise sum each window in order and divide as
ATen's kernels do, and an output of one element per plane is ``mean``, as
in ATen. The gradient is the transposed map, in float64 and rounded once
under both profiles. Autocast: fp32 (torch's ``upsample_*`` ops).
"""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import FpemuNotImplementedError, FpemuRuntimeError, FpemuValueError
from .._autocast import cast_inputs
from .._core import _result, _store, float32, float64
from .._common import f64, float_dt
from .._profile import get_profile
from ..ops.creation import zeros
from . import _cpu_resample, _pooling

_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")
_LINEAR_DIMS = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
_A = -0.75          # the bicubic kernel's parameter (torch's, as OpenCV's)


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def interpolate(input, size=None, scale_factor=None, mode="nearest",
                align_corners=None, recompute_scale_factor=None, antialias=False):
    """torch.nn.functional.interpolate: every mode but the antialiased ones
    (and lanczos, which needs antialias)."""
    if mode not in _MODES + ("lanczos",):
        raise FpemuNotImplementedError(
            f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
            f"the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
            f"nearest-exact (got {mode})")
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating "
                             "modes: linear | bilinear | bicubic | trilinear")
    elif align_corners is None:
        align_corners = False
    dim = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        scales = None
        out_size = _per_dim(input, size, dim, "output size", "size", "(o1, o2, ...,oK)")
        if not all(_is_int(v) for v in out_size):
            raise TypeError(f"expected size to be one of int or Tuple[int] or Tuple[int, int] "
                            f"or Tuple[int, int, int], but got size with types "
                            f"{[type(v) for v in out_size]}")
        out_size = [int(v) for v in out_size]
    elif scale_factor is not None:
        out_size = None
        scales = [float(v) for v in _per_dim(input, scale_factor, dim, "scale_factor of shape",
                                             "scale_factor", "(s1, s2, ...,sK)")]
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and out_size is None:
        recompute_scale_factor = True
    if recompute_scale_factor:
        out_size = [int(input.shape[i + 2] * scales[i]) for i in range(dim)]
        scales = None
    if antialias and not (mode in ("bilinear", "bicubic", "lanczos") and input.ndim == 4):
        raise ValueError("Anti-alias option is restricted to bilinear, bicubic, and lanczos "
                         "modes and requires a 4-D tensor as input")
    if antialias or mode == "lanczos":
        if mode == "lanczos" and align_corners:
            raise ValueError("Lanczos mode does not support align_corners=True")
        if mode == "lanczos" and not antialias:
            raise ValueError("Lanczos mode requires antialias=True")
        raise FpemuNotImplementedError(
            f"interpolate(mode={mode!r}, antialias=True) is not emulated (its kernel widens "
            f"the filter to the scale): resize without antialias, or compute it with torch "
            f"and pass the result in")
    if input.ndim not in (3, 4, 5):
        raise FpemuNotImplementedError(
            f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) for "
            f"the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
            f"nearest-exact (got {mode})")
    want = _LINEAR_DIMS.get(mode)
    if want is not None and want != dim:
        raise FpemuNotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs "
                                       f"{want + 2}D input")
    if mode == "area":
        pool = {1: adaptive_avg_pool1d, 2: adaptive_avg_pool2d, 3: adaptive_avg_pool3d}[dim]
        return pool(input, out_size)
    return _upsample(input, out_size, scales, mode, align_corners)


def _per_dim(x, value, dim, shown, name, form):
    """One value per spatial dim: a sequence of exactly ``dim`` (torch's
    ValueError otherwise) or one value for all."""
    if not isinstance(value, (list, tuple)):
        return [value] * dim
    if len(value) != dim:
        what = "output" if name == "size" else "scale_factor"
        raise ValueError(f"Input and {what} must have the same number of spatial dimensions, "
                         f"but got input with spatial dimensions of {list(x.shape[2:])} and "
                         f"{shown} {value}. Please provide input tensor in (N, C, d1, d2, "
                         f"...,dK) format and {name} in {form} format.")
    return list(value)


def _output_size(x, out_size, scales, name):
    """ATen's ``compute_output_size``: the given size, or ``floor(n * s)``."""
    if out_size is None:
        out_size = [int(n * s) for n, s in zip(x.shape[2:], scales)]
    if any(o <= 0 for o in out_size) or any(n <= 0 for n in x.shape[2:]):
        raise FpemuRuntimeError(f"{name}(): Input and output sizes should be greater than 0, "
                                f"but got input ({', '.join(map(str, x.shape[2:]))}) and "
                                f"output ({', '.join(map(str, out_size))})")
    return [int(o) for o in out_size]


def _scales_value(scale, n_in, n_out, om):
    """ATen's ``compute_scales_value``: 1 / scale_factor when one was given,
    else in / out, in ``om``."""
    if scale is not None and scale > 0:
        return om(1.0 / scale)
    return om(n_in) / om(n_out)


def _nearest(n_in, n_out, scale, exact, shortcuts):
    idx = np.arange(n_out)
    if shortcuts and n_out == n_in:
        return idx[None], np.ones((1, n_out))
    if shortcuts and n_out == 2 * n_in:
        return (idx >> 1)[None], np.ones((1, n_out))
    s = _scales_value(scale, n_in, n_out, np.float32)
    o = idx.astype(np.float32)
    src = (o + np.float32(0.5)) * s if exact else o * s
    return np.minimum(np.floor(src).astype(np.int64), n_in - 1)[None], np.ones((1, n_out))


def _source(n_in, n_out, scale, align_corners, cubic, om):
    """ATen's ``area_pixel_compute_source_index`` for every output index."""
    o = np.arange(n_out).astype(om)
    if align_corners:
        s = om(n_in - 1) / om(n_out - 1) if n_out > 1 else om(0)
        return s * o
    s = _scales_value(scale, n_in, n_out, om)
    src = s * (o + om(0.5)) - om(0.5)
    return src if cubic else np.where(src < 0, om(0), src)


def _guard(src, n_in, om):
    """ATen's ``guard_index_and_lambda``: the index below and the fraction."""
    idx = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.minimum(np.maximum(src - idx.astype(om), om(0)), om(1))
    return idx, lam


def _linear(n_in, n_out, scale, align_corners, om):
    idx, lam = _guard(_source(n_in, n_out, scale, align_corners, False, om), n_in, om)
    idx1 = idx + (idx < n_in - 1)
    return np.stack([idx, idx1]), np.stack([om(1) - lam, lam]).astype(np.float64)


def _cubic(n_in, n_out, scale, align_corners, om):
    idx, t = _guard(_source(n_in, n_out, scale, align_corners, True, om), n_in, om)
    A = om(_A)

    def conv1(x):       # |x| <= 1
        return ((A + om(2)) * x - (A + om(3))) * x * x + om(1)

    def conv2(x):       # 1 < |x| < 2
        return ((A * x - om(5) * A) * x + om(8) * A) * x - om(4) * A
    t2 = om(1) - t
    w = np.stack([conv2(t + om(1)), conv1(t), conv1(t2), conv2(t2 + om(1))])
    taps = np.stack([np.clip(idx - 1 + j, 0, n_in - 1) for j in range(4)])
    return taps, w.astype(np.float64)


def _matrix(taps, w, n_in):
    """(out, in) float64 matrix of the taps and weights (taps that clamp to
    the same input add up, as the kernels' sums do)."""
    M = np.zeros((taps.shape[1], n_in))
    rows = np.broadcast_to(np.arange(taps.shape[1]), taps.shape)
    np.add.at(M, (rows.reshape(-1), taps.reshape(-1)), w.reshape(-1))
    return M


def _apply(X, mats):
    """X (N, C, *spatial) with each spatial dim mapped by its (out, in) matrix."""
    for k, M in enumerate(mats):
        X = np.moveaxis(np.tensordot(X, M, axes=([2 + k], [1])), -1, 2 + k)
    return X


def _maps(x, out_size, scales, mode, align_corners):
    om = np.float64 if x.dtype is float64 else np.float32
    mats = []
    for k, (n_in, n_out) in enumerate(zip(x.shape[2:], out_size)):
        s = None if scales is None else scales[k]
        if mode in ("nearest", "nearest-exact"):
            # torch 2.13's 2-d nearest kernel (only it: measured) takes
            # ``out == in`` and ``out == 2 in`` exactly even where a given
            # scale_factor's reciprocal would pick other inputs
            shortcuts = mode == "nearest" and len(out_size) == 2
            taps, w = _nearest(n_in, n_out, s, mode == "nearest-exact", shortcuts)
        elif mode == "bicubic":
            taps, w = _cubic(n_in, n_out, s, align_corners, om)
        else:
            taps, w = _linear(n_in, n_out, s, align_corners, om)
        mats.append(_matrix(taps, w, n_in))
    return mats


def _upsample(input, out_size, scales, mode, align_corners):
    nd = input.ndim - 2
    op = {"nearest": "upsample_nearest", "nearest-exact": "_upsample_nearest_exact",
          "linear": "upsample_linear", "bilinear": "upsample_bilinear",
          "trilinear": "upsample_trilinear", "bicubic": "upsample_bicubic"}[mode] + f"{nd}d"
    (x,) = cast_inputs(op.lstrip("_"), input)
    out_size = _output_size(x, out_size, scales, op)
    mats = _maps(x, out_size, scales, mode, align_corners)
    dt = float_dt(x)
    prof = _cpu_model(x)
    if prof is not None:
        res, nearest_sel = _cpu_upsample(x._data, out_size, scales, mode, align_corners, prof)
        if nearest_sel is not None:
            mats = [_matrix(i[None], np.ones((1, len(i))), n)
                    for i, n in zip(nearest_sel, x.shape[2:])]
    elif mode in ("nearest", "nearest-exact"):
        sel = [np.argmax(M, axis=1) for M in mats]           # one source per output
        res = x._data[(slice(None), slice(None)) + np.ix_(*sel)]
    else:
        res = _store(_apply(x._data.astype(np.float64), mats), dt)

    def backward(g):
        return (_store(_apply(g.astype(np.float64), [M.T for M in mats]), dt),)
    return _result(np.ascontiguousarray(res), dt, (x,), backward, op=op)


def _cpu_model(x):
    """The CPU profile when fpemu models ATen's CPU resampling kernels for
    ``x`` (float32 / float64 under AVX2 or AVX512), else None."""
    prof = get_profile()
    if prof.device == "cpu" and x.dtype in (float32, float64) \
            and prof.cpu_capability.upper() in _cpu_resample.CAPABILITIES:
        return prof
    return None


def _cpu_upsample(arr, out_size, scales, mode, align_corners, prof):
    """ATen's CPU upsample kernels (UpSampleKernel.cpp) as torch picks them:
    the channels-last kernels for 2-d outputs of at most 128 rows plus
    columns, for channels-last input of more than 3 channels, and (bilinear)
    for 3 channels on one thread; the generic kernel otherwise. Returns the
    output and, for the nearest modes, each dim's input indices."""
    nd = len(out_size)
    C = arr.shape[1]
    cl = _cpu_resample.channels_last_contiguous(arr) and C > 3
    small = nd == 2 and sum(out_size) <= 128          # _use_vectorized_kernel_cond_2d
    lanes = prof.cpu_lanes(arr.itemsize)
    cap = prof.cpu_capability
    om = arr.dtype.type
    if mode in ("nearest", "nearest-exact"):
        vectorized = cl or small
        sel = [_cpu_resample.nearest_index(n_in, n_out, None if scales is None else scales[k],
                                           mode == "nearest-exact", vectorized, om)
               for k, (n_in, n_out) in enumerate(zip(arr.shape[2:], out_size))]
        return arr[(slice(None), slice(None)) + np.ix_(*sel)], sel
    if mode in ("bilinear", "trilinear") and (
            cl or small or (mode == "bilinear" and prof.cpu_threads == 1 and C == 3)):
        return _cpu_resample.upsample_linear_channels_last(arr, out_size, scales, align_corners,
                                                           lanes, cap), None
    return _cpu_resample.upsample_generic(arr, out_size, scales, align_corners,
                                          mode == "bicubic"), None


def _cpu_adaptive(x, outs, prof):
    """ATen's CPU adaptive average pooling of ``x`` (AdaptiveAvgPoolKernel.cpp;
    one output per plane: ``mean``, as ATen's adaptive_avg_pool2d/3d call)."""
    nd = len(outs)
    if all(o == 1 for o in outs):
        return x.mean(tuple(range(-nd, 0)), keepdim=True)
    arr = x._data
    batched = arr.reshape((-1,) + arr.shape[-nd - 1:]) if arr.ndim == nd + 2 else arr[None]
    lanes = None
    if nd == 2 and _cpu_resample.suggests_channels_last(arr):
        lanes = prof.cpu_lanes(arr.itemsize)
    res = _cpu_resample.adaptive_avg_pool(batched, outs, lanes, prof.cpu_capability)
    return res.reshape(tuple(x.shape[:-nd]) + tuple(outs))


def adaptive_avg_pool2d(input, output_size):
    """The mean over torch's adaptive windows: output row i averages input rows
    floor(i H / oh) .. ceil((i + 1) H / oh) - 1, likewise the columns (None
    keeps the input's size); in float64, rounded once (a CPU profile: ATen's
    CPU kernel, bit for bit, see the module note)."""
    oh, ow = _adaptive_sizes(input, output_size, 2)
    H, W = input.shape[-2:]
    if oh == 0 or ow == 0:
        return zeros(tuple(input.shape[:-2]) + (oh, ow), dtype=input.dtype) * input.sum()
    prof = _cpu_model(input)
    if prof is not None:
        if oh == 1 and ow == 1:
            return _cpu_adaptive(input, (1, 1), prof)
        Ah, Aw = _adaptive_weights(H, oh), _adaptive_weights(W, ow)
        dt = float_dt(input)

        def cpu_backward(g):
            return (_store(Ah.T @ g.astype(np.float64) @ Aw, dt),)
        return _result(_cpu_adaptive(input, (oh, ow), prof), dt, (input,), cpu_backward,
                       op="adaptive_avg_pool2d")
    if H % oh == 0 and W % ow == 0:
        return _pooling.avg_pool("avg_pool2d", input, 2, (H // oh, W // ow), None, 0, False,
                                 True, None)
    Ah, Aw = _adaptive_weights(H, oh), _adaptive_weights(W, ow)
    dt = float_dt(input)
    res = _store(Ah @ f64(input) @ Aw.T, dt)

    def backward(g):
        return (_store(Ah.T @ g.astype(np.float64) @ Aw, dt),)
    return _result(res, dt, (input,), backward, op="adaptive_avg_pool2d")


def _adaptive_weights(n, out):
    """(out, n): row i is 1 / len over torch's window i of an adaptive pool."""
    A = np.zeros((out, n))
    for i in range(out):
        lo, hi = (i * n) // out, -(-((i + 1) * n) // out)
        A[i, lo:hi] = 1.0 / (hi - lo)
    return A


def adaptive_avg_pool1d(input, output_size):
    size = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,)
    if len(size) != 1:
        raise FpemuRuntimeError(f"adaptive_avg_pool1d(): 'output_size' should contain one int, "
                                f"got {output_size!r}")
    if size[0] is not None and size[0] < 0:
        raise FpemuRuntimeError(f"adaptive_avg_pool1d(): elements of output_size must be "
                                f"greater than or equal to 0 but received {list(size)}")
    if input.ndim not in (2, 3):
        raise RuntimeError(f"adaptive_avg_pool1d(): Expected 2D or 3D input, but got input of "
                           f"size: {list(input.shape)}")
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, size[0])).squeeze(-2)


def _adaptive_sizes(x, output_size, nd):
    """torch's checks of an adaptive pooling over the last ``nd`` dims, and
    its output sizes (None keeps the input's)."""
    name = f"adaptive_avg_pool{nd}d"
    if x.ndim < nd + 1:
        raise FpemuValueError(f"Input dimension should be at least {nd + 1}, got {x.ndim}")
    if x.ndim > nd + 2:
        raise FpemuRuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got "
                                f"{list(x.shape)}")
    sizes = _sizes(output_size, nd)
    if len(sizes) != nd:
        raise FpemuRuntimeError(f"{name}: output_size must be {nd}, got {output_size!r}")
    if any(v is not None and v < 0 for v in sizes):
        raise FpemuRuntimeError(f"{name}: elements of output_size must be greater than or "
                                f"equal to 0 but received {list(sizes)}")
    return [n if v is None else int(v) for v, n in zip(sizes, x.shape[-nd:])]


def _sizes(v, n):
    """An output size for each of ``n`` dims: one value (or a 1-tuple) for all."""
    if isinstance(v, (tuple, list)):
        return tuple(v) * n if len(v) == 1 else tuple(v)
    return (v,) * n


def adaptive_avg_pool3d(input, output_size):
    """The mean over torch's adaptive windows along the last three dims
    (output i averages inputs floor(i n / o) .. ceil((i + 1) n / o) - 1;
    None keeps the input's size), in float64, rounded once (a CPU profile:
    ATen's CPU kernel, bit for bit, see the module note)."""
    outs = _adaptive_sizes(input, output_size, 3)
    spatial = input.shape[-3:]
    if any(n == 0 for n in spatial) and any(o for o in outs):
        raise FpemuRuntimeError(f"adaptive_avg_pool3d(): Expected input to have non-zero size "
                                f"for non-batch dimensions, but input has sizes "
                                f"{list(input.shape)} with dimension {input.ndim - 3} being "
                                f"empty")
    mats = [_adaptive_weights(n, o) for n, o in zip(spatial, outs)]
    (input,) = cast_inputs("adaptive_avg_pool3d", input)
    dt = float_dt(input)
    lead = tuple(input.shape[:-3])
    prof = _cpu_model(input)
    if prof is not None and all(o == 1 for o in outs):
        return _cpu_adaptive(input, tuple(outs), prof)
    if prof is not None:
        res = _cpu_adaptive(input, tuple(outs), prof)
    else:
        X = input._data.astype(np.float64).reshape((-1, 1) + tuple(spatial))
        res = _store(_apply(X, mats).reshape(lead + tuple(outs)), dt)

    def backward(g):
        G = g.astype(np.float64).reshape((-1, 1) + tuple(outs))
        return (_store(_apply(G, [M.T for M in mats]).reshape(input.shape), dt),)
    return _result(res, dt, (input,), backward, op="adaptive_avg_pool3d")


def upsample(input, size=None, scale_factor=None, mode="nearest",
             align_corners=None):
    """Deprecated alias of :func:`interpolate` (torch warns as well)."""
    warnings.warn("`nn.functional.upsample` is deprecated. Use `nn.functional.interpolate` "
                  "instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input, size=None, scale_factor=None):
    """Deprecated: ``interpolate(mode="nearest")``."""
    warnings.warn("`nn.functional.upsample_nearest` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """Deprecated: ``interpolate(mode="bilinear", align_corners=True)``."""
    warnings.warn("`nn.functional.upsample_bilinear` is deprecated. Use "
                  "`nn.functional.interpolate` instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


__all__ = ["interpolate", "upsample", "upsample_nearest", "upsample_bilinear",
           "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d"]
