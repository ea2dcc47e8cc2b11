"""ATen's CPU resampling kernels in their own float32 / float64 arithmetic:
``interpolate``'s nearest, linear, bilinear, trilinear and bicubic modes and
the adaptive average poolings, as torch 2.13 computes them on x86 (AVX2 and
AVX512 builds).

The sources are ``aten/src/ATen/native/cpu/UpSampleKernel.cpp``,
``aten/src/ATen/native/UpSample.h`` and
``aten/src/ATen/native/cpu/AdaptiveAvgPoolKernel.cpp``. ATen compiles its
CPU kernels once per instruction set with FMA enabled, and GCC contracts
some of their products and sums into fused multiply-adds. Which ones was
measured against torch 2.13 (impulse inputs isolate each weight; random
inputs each sum), on AVX512 and under ``ATEN_CPU_CAPABILITY=avx2``:

* source index (``area_pixel_compute_source_index``, align_corners=False):
  ``fma(scale, o + 0.5, -0.5)``; with align_corners ``scale * o``. The scale
  is the opmath type's (float32 for float32, float64 for float64):
  ``(in - 1) / (out - 1)``, ``1 / scale_factor`` (the double reciprocal
  rounded) or ``in / out``. ``guard_index_and_lambda`` floors the source
  index through ``floorf`` (a float64 index is rounded to float32 first).
* bicubic weights (``get_cubic_upsample_coefficients``, A = -0.75):
  ``fma(A + 2, x, -(A + 3)) * x * x + 1`` for ``|x| <= 1`` and
  ``fma(fma(A, x, -5A), x, 8A) * x - 4A`` for ``1 < |x| < 2``: the last
  multiply-add of each is not fused.
* generic kernel (``cpu_upsample_generic``: linear 1-d, trilinear, bicubic,
  bilinear on large outputs): one dimension at a time from the last, each
  output ``fma(t0, w0, t1 * w1)`` over two taps, and
  ``fma(t3, w3, fma(t2, w2, fma(t0, w0, t1 * w1)))`` over four.
* channels-last kernel (``cpu_upsample_linear_channels_last``: bilinear on
  small outputs or channels-last input with more than 3 channels, trilinear
  on channels-last-3d input with more than 3 channels): the weights are the
  products of the per-dim lambdas (``d * h * w``, left to right), and over
  the channels, in vectors of ATen's width, the terms in reverse,
  ``fma(a0, w0, fma(a1, w1, ... fma(a(n-1), w(n-1), an * wn)))``; the
  channels past the last full vector in the scalar order
  ``fma(an, wn, ... fma(a2, w2, fma(a0, w0, a1 * w1)))``. On AVX512 builds
  the compiler vectorizes that scalar loop by half a vector (8 floats, 4
  doubles), and those channels take the vector order; on AVX2 none does.
* adaptive average pooling: each window summed in index order, then divided
  by each window length in turn (``sum / kh / kw``); channels-last 4-d
  input (``suggest_memory_format``) divides the vector channels (with
  AVX512's half vector, as above) by ``kh * kw`` at once, the others in
  turn. 3-d pooling divides in turn in both layouts.

Other instruction sets (``DEFAULT`` builds have no FMA) are not modelled:
the callers keep their float64 formula there.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..._jit import fma, fma32, jit

#: the instruction sets whose kernels this module models
CAPABILITIES = ("AVX2", "AVX512")
_A = -0.75          # the bicubic kernel's parameter without antialias


@jit
def _fma32_flat(a, b, c, out):
    for i in range(out.size):
        out[i] = fma32(a[i], b[i], c[i])


@jit
def _fma64_flat(a, b, c, out):
    for i in range(out.size):
        out[i] = fma(a[i], b[i], c[i])


def fmadd(a, b, c):
    """Elementwise ``a * b + c`` with one rounding, in the arrays' common
    dtype (float32 or float64), broadcast."""
    a, b, c = (np.asarray(v) for v in (a, b, c))
    dt = np.result_type(a, b, c)
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    flat = [np.ascontiguousarray(np.broadcast_to(v.astype(dt, copy=False), shape)).reshape(-1)
            for v in (a, b, c)]
    out = np.empty(int(np.prod(shape)), dt)
    (_fma32_flat if dt == np.float32 else _fma64_flat)(*flat, out)
    return out.reshape(shape)


# ------------------------------------------------------------ layouts
def _strides(arr):
    return [s // arr.itemsize for s in arr.strides]


def channels_last_contiguous(arr):
    """torch's ``is_contiguous(channels_last)`` (4-d) or
    ``is_contiguous(channels_last_3d)`` (5-d) of an array's layout: the
    dims of more than one element, in the order C, W, H(, D), N, dense."""
    if arr.ndim not in (4, 5):
        return False
    order = (1, 3, 2, 0) if arr.ndim == 4 else (1, 4, 3, 2, 0)
    st, expected = _strides(arr), 1
    for d in order:
        if arr.shape[d] != 1:
            if st[d] != expected:
                return False
            expected *= arr.shape[d]
    return True


def suggests_channels_last(arr):
    """torch's ``suggest_memory_format() == channels_last`` of a 4-d array's
    layout (``is_channels_last_strides_2d``: strides rising in the order C,
    W, H, N; ambiguous layouts count as contiguous)."""
    if arr.ndim != 4:
        return False
    st, lo = _strides(arr), 0
    if st[1] == 0:
        return False
    for d in (1, 3, 2, 0):
        if arr.shape[d] == 0 or st[d] < lo:
            return False
        if d == 0 and lo == st[1]:
            return False
        lo = st[d] * (arr.shape[d] if arr.shape[d] > 1 else 1)
    return True


def vector_channels(channels, lanes, capability):
    """How many leading channels a channels-last kernel computes in its
    vector order: whole vectors of ``lanes``, and on AVX512 half a vector
    more when the rest has that many."""
    n = channels - channels % lanes
    if capability.upper().startswith("AVX512") and channels - n >= lanes // 2:
        n += lanes // 2
    return n


# ------------------------------------------------------------ indices and weights
def _scale(n_in, n_out, align_corners, scale, om):
    """``area_pixel_compute_scale`` in opmath ``om``."""
    if align_corners:
        return om(n_in - 1) / om(n_out - 1) if n_out > 1 else om(0)
    if scale is not None and scale > 0:
        return om(1.0 / scale)
    return om(n_in) / om(n_out)


def _source(s, n_out, align_corners, cubic, om):
    """``area_pixel_compute_source_index`` for every output index."""
    o = np.arange(n_out).astype(om)
    if align_corners:
        return s * o
    src = fmadd(np.full(n_out, s, om), o + om(0.5), np.full(n_out, -0.5, om))
    return src if cubic else np.where(src < 0, om(0), src).astype(om)


def _guard(src, n_in, om):
    """``guard_index_and_lambda``: the index below (``floorf``) and the
    fraction clamped to [0, 1]."""
    idx = np.minimum(np.floor(src.astype(np.float32)).astype(np.int64), n_in - 1)
    lam = np.minimum(np.maximum(src - idx.astype(om), om(0)), om(1)).astype(om)
    return idx, lam


def linear_taps(n_in, n_out, align_corners, scale, om):
    """``compute_source_index_and_lambda`` of every output index: the two
    input indices and their weights (``[i0, i1], [lambda0, lambda1]``)."""
    o = np.arange(n_out)
    if n_in == n_out:
        return [o, o], [np.ones(n_out, om), np.zeros(n_out, om)]
    s = _scale(n_in, n_out, align_corners, scale, om)
    idx, lam = _guard(_source(s, n_out, align_corners, False, om), n_in, om)
    return [idx, idx + (idx < n_in - 1)], [(om(1) - lam).astype(om), lam]


def cubic_taps(n_in, n_out, align_corners, scale, om):
    """``HelperInterpCubic.compute_indices_weights``: four clamped input
    indices and Keys' weights (A = -0.75) of every output index."""
    s = _scale(n_in, n_out, align_corners, scale, om)
    idx, t = _guard(_source(s, n_out, align_corners, True, om), n_in, om)
    A = om(_A)

    def near(x):            # cubic_convolution1, |x| <= 1
        return fmadd(np.full_like(x, A + om(2)), x, np.full_like(x, -(A + om(3)))) * x * x \
            + om(1)

    def far(x):             # cubic_convolution2, 1 < |x| < 2
        inner = fmadd(np.full_like(x, A), x, np.full_like(x, -(om(5) * A)))
        return fmadd(inner, x, np.full_like(x, om(8) * A)) * x - om(4) * A

    t2 = (om(1) - t).astype(om)
    weights = [far((t + om(1)).astype(om)), near(t), near(t2), far((t2 + om(1)).astype(om))]
    taps = [np.clip(idx - 1 + j, 0, n_in - 1) for j in range(4)]
    return taps, [w.astype(om) for w in weights]


def nearest_index(n_in, n_out, scale, exact, vectorized, om):
    """The input index of every output index. ``vectorized``: the
    channels-last kernel's ``nearest_idx`` / ``nearest_exact_idx`` (float32
    scale; ``nearest_idx`` copies when out == in and halves when out ==
    2 in); else ``HelperInterpNearest(Exact).compute_indices_weights`` (scale
    in opmath ``om``)."""
    o = np.arange(n_out)
    if vectorized:
        if not exact and n_out == n_in:
            return o
        if not exact and n_out == 2 * n_in:
            return o >> 1
        s = _scale(n_in, n_out, False, scale, np.float32)
        if exact:       # floorf((o + 0.5) * scale): a double product, to float
            src = ((o + 0.5) * np.float64(s)).astype(np.float32)
        else:
            src = o.astype(np.float32) * s
    else:
        s = _scale(n_in, n_out, False, scale, om)
        if exact:       # floorf(source index + 0.5), the sum in double
            src = _source(s, n_out, False, False, om).astype(np.float64) + 0.5
        else:
            src = s * o.astype(om)
        src = src.astype(np.float32)
    return np.minimum(np.floor(src).astype(np.int64), n_in - 1)


# ------------------------------------------------------------ the kernels
def _combine_generic(ts, ws):
    out = fmadd(ts[0], ws[0], ts[1] * ws[1])
    for t, w in zip(ts[2:], ws[2:]):
        out = fmadd(t, w, out)
    return out


def upsample_generic(x, out_size, scales, align_corners, cubic):
    """``upsample_generic_Nd_kernel_impl`` (linear or cubic) on an
    (N, C, *spatial) float32 / float64 array: the last dim first, each
    output the kernel's fused sum of its taps."""
    om = x.dtype.type
    nd = len(out_size)
    with np.errstate(all="ignore"):         # NaN / inf inputs give what the kernel gives
        for k in reversed(range(nd)):
            x = _generic_pass(x, k, nd, out_size, scales, align_corners, cubic, om)
    return x


def _generic_pass(x, k, nd, out_size, scales, align_corners, cubic, om):
    """Spatial dim ``k`` of ``nd`` resized: each output the fused sum of its
    taps along that dim."""
    axis = x.ndim - nd + k
    scale = None if scales is None else scales[k]
    taps, ws = (cubic_taps if cubic else linear_taps)(x.shape[axis], out_size[k],
                                                      align_corners, scale, om)
    shape = [1] * x.ndim
    shape[axis] = -1
    return _combine_generic([np.take(x, t, axis=axis) for t in taps],
                            [w.reshape(shape) for w in ws])


def upsample_linear_channels_last(x, out_size, scales, align_corners, lanes, capability):
    """``cpu_upsample_linear_channels_last`` (2-d or 3-d) on an
    (N, C, *spatial) array; ``lanes``: ATen's vector width for the dtype."""
    om = x.dtype.type
    nd = len(out_size)
    per = [linear_taps(x.shape[2 + k], out_size[k], align_corners,
                       None if scales is None else scales[k], om) for k in range(nd)]
    terms = []
    for corner in itertools.product((0, 1), repeat=nd):
        w, idx = None, []
        for k, j in enumerate(corner):
            shape = [1] * nd
            shape[k] = -1
            wk = per[k][1][j].reshape(shape)
            w = wk if w is None else w * wk
            idx.append(per[k][0][j])
        terms.append((x[(slice(None), slice(None)) + np.ix_(*idx)], w[None, None]))
    with np.errstate(all="ignore"):         # NaN / inf inputs give what the kernel gives
        return _channels_last_sums(terms, x.shape[:2] + tuple(out_size), lanes, capability, om)


def _channels_last_sums(terms, shape, lanes, capability, om):
    """The channels-last kernel's sums of (input, weight) terms: the vector
    channels in the vector order, the rest in the scalar order."""
    C = shape[1]
    nv = vector_channels(C, lanes, capability)
    out = np.empty(shape, om)
    if nv:
        part = [(t[:, :nv], w) for t, w in terms]
        (a, wa), (b, wb) = part[-2], part[-1]
        acc = fmadd(b, wb, a * wa)
        for t, w in reversed(part[:-2]):
            acc = fmadd(t, w, acc)
        out[:, :nv] = acc
    if nv < C:
        part = [(t[:, nv:], w) for t, w in terms]
        acc = fmadd(part[0][0], part[0][1], part[1][0] * part[1][1])
        for t, w in part[2:]:
            acc = fmadd(t, w, acc)
        out[:, nv:] = acc
    return out


@jit
def _adaptive_avg(x, od, oh, ow, kd, kh, kw, whole, out):
    """x (N, C, D, H, W): each window summed in index order; channel c
    divided by the window's size at once where ``whole[c]``, else by kd,
    kh and kw in turn (sizes given in x's dtype)."""
    N, C, D, H, W = x.shape
    for n in range(N):
        for c in range(C):
            for a in range(od):
                d0 = (a * D) // od
                d1 = ((a + 1) * D + od - 1) // od
                for b in range(oh):
                    h0 = (b * H) // oh
                    h1 = ((b + 1) * H + oh - 1) // oh
                    for e in range(ow):
                        w0 = (e * W) // ow
                        w1 = ((e + 1) * W + ow - 1) // ow
                        s = out[n, c, a, b, e]
                        for i in range(d0, d1):
                            for j in range(h0, h1):
                                for m in range(w0, w1):
                                    s += x[n, c, i, j, m]
                        if whole[c]:
                            s = s / (kd[a] * kh[b] * kw[e])
                        else:
                            s = s / kd[a]
                            s = s / kh[b]
                            s = s / kw[e]
                        out[n, c, a, b, e] = s


def _window_sizes(n, o, om):
    a = np.arange(o)
    return (-(-((a + 1) * n) // o) - (a * n) // o).astype(om)


def adaptive_avg_pool(x, out_size, lanes=None, capability="AVX512"):
    """``cpu_adaptive_avg_pool2d`` / ``cpu_adaptive_avg_pool3d`` on an
    (N, C, *spatial) array (1 to 3 spatial dims). ``lanes``: the 4-d
    channels-last kernel's vector width (its vector channels divide by the
    window size at once), else None."""
    om = x.dtype.type
    nd = len(out_size)
    sp = (1,) * (3 - nd) + tuple(x.shape[2:])
    outs = (1,) * (3 - nd) + tuple(out_size)
    X = np.ascontiguousarray(x).reshape(x.shape[:2] + sp)
    ks = [_window_sizes(n, o, om) for n, o in zip(sp, outs)]
    C = x.shape[1]
    whole = np.zeros(C, np.bool_)
    if lanes is not None:
        whole[:vector_channels(C, lanes, capability)] = True
    out = np.zeros(x.shape[:2] + outs, om)
    if out.size:
        _adaptive_avg(X, outs[0], outs[1], outs[2], ks[0], ks[1], ks[2], whole, out)
    return out.reshape(x.shape[:2] + tuple(out_size))


__all__ = ["CAPABILITIES", "adaptive_avg_pool", "channels_last_contiguous", "cubic_taps",
           "fmadd", "linear_taps", "nearest_index", "suggests_channels_last",
           "upsample_generic", "upsample_linear_channels_last", "vector_channels"]
