"""The normalizations of ``torch.nn.functional``: batch, layer, group,
instance and RMS norms, local response norm, normalize."""

from __future__ import annotations

import numpy as np

from ...errors import FpemuRuntimeError
from .._autocast import cast_inputs
from .._common import f64, float_dt, wrap_dim
from .._core import _result, _store, float32, float64, is_float, no_grad, Tensor, to_dtype
from .._cpu_norm import aten_lanes, columnwise_sums, fmadd, rowwise_moments
from .._cpu_reduce import cpu_sum
from .._cuda_reduce import _storage_offset, cuda_layer_norm, vectorized_layer_norm_applies
from .._profile import get_profile
from ..ops.reduce import norm, sum as _sum
from ..ops.elementwise import clamp, clone, div, mul
from ..ops.inplace import write
from ._pooling import _channels_last
from ..ops.shape import broadcast_tensors


# --------------------------------------------------------------------- norms
def _norm_axes(x, normalized_shape, weight=None):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not ns:
        raise FpemuRuntimeError(f"Expected normalized_shape to be at least 1-dimensional, i.e., "
                                f"containing at least one element, but got normalized_shape = "
                                f"{list(ns)}")
    if weight is not None and tuple(weight.shape) != ns:
        raise FpemuRuntimeError(f"Expected weight to be of same shape as normalized_shape, but "
                                f"got weight of shape {list(weight.shape)} and normalized_shape "
                                f"= {list(ns)}")
    if tuple(x.shape[x.ndim - len(ns):]) != ns:
        raise RuntimeError(f"Given normalized_shape={list(ns)}, expected input with shape "
                           f"[*, {', '.join(map(str, ns))}], but got input of size"
                           f"{list(x.shape)}")
    return tuple(range(x.ndim - len(ns), x.ndim)), ns


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dims.
    Under the CUDA profile, where ATen runs ``vectorized_layer_norm_kernel``
    (float32 / 16-bit rows of a multiple of 4 elements), its Welford order and
    float32 epilogue (``fpemu.autograd._cuda_reduce.cuda_layer_norm``);
    otherwise, and for the backward, float64 rounded once. Autocast: fp32
    (input, weight and bias cast, fp32 output)."""
    x, weight, bias = cast_inputs("layer_norm", input, weight, bias)
    axes, ns = _norm_axes(x, normalized_shape)
    dt = float_dt(x)
    X = f64(x)
    mu = X.mean(axis=axes, keepdims=True)
    xc = X - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    xhat = xc * rstd
    Wv = f64(weight) if weight is not None else 1.0
    N = int(np.prod(ns, dtype=np.int64))
    if (get_profile().device == "cuda" and x._data.size
            and all(t is None or t.dtype == dt for t in (weight, bias))
            and vectorized_layer_norm_applies(N, _storage_offset(x._data), dt is float64)):
        # the vectorized CUDA kernel's Welford statistics and epilogue in
        # float32 (layer_norm_kernel.cu; fpemu.autograd._cuda_reduce); the
        # backward below stays float64
        Y32, _, _ = cuda_layer_norm(x._data.reshape(-1, N),
                                    None if weight is None else weight._data.reshape(-1),
                                    None if bias is None else bias._data.reshape(-1), eps)
        res = _store(Y32.reshape(x.shape), dt)
    elif get_profile().device == "cpu" and x._data.size and dt in (float64, float32) or (
            get_profile().device == "cpu" and x._data.size and dt.bits == 16):
        res = _cpu_layer_norm(x, weight, bias, eps, N)
    else:
        Y = xhat * Wv + (f64(bias) if bias is not None else 0.0)
        res = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        lead = tuple(range(x.ndim - len(ns)))
        gw = _store((G * xhat).sum(axis=lead), weight.dtype) if weight is not None else None
        gb = _store(G.sum(axis=lead), bias.dtype) if bias is not None else None
        gh = G * Wv
        gx = rstd * (gh - gh.mean(axis=axes, keepdims=True)
                     - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        return _store(gx, dt), gw, gb
    return _result(res, dt, (x, weight, bias), backward,
                   saved=tuple(t for t in (x, weight) if t is not None), op="native_layer_norm")


def _cpu_layer_norm(x, weight, bias, eps, N):
    """torch CPU's forward (``cpu/layer_norm_kernel.cpp``, the AVX2 build that
    also runs on AVX512, :func:`fpemu.autograd._cpu_norm.aten_lanes`): each
    row's ``RowwiseMoments``, ``rstd = 1 / sqrt(var + eps)`` with eps in the
    row's precision, then ``(x - mean) * rstd * gamma + beta``, which GCC
    contracts: ``fma((x - mean) * rstd, gamma, beta)``, or without a gamma
    ``fma(x - mean, rstd, beta)`` (beta 0 where absent). A 16-bit input
    (``layer_norm_kernel_mixed_type``) computes in float32 ``fma(fma(x, rstd,
    -rstd * mean), gamma, beta)``, rounded once to its dtype."""
    dt = x.dtype
    lead = x._data.size // N
    sixteen = dt not in (float32, float64)
    acc = np.float64 if dt is float64 else np.float32
    X = np.ascontiguousarray(x._data, acc).reshape(lead, N)
    mean, var = rowwise_moments(X, aten_lanes(8 if dt is float64 else 4), sixteen_bit=sixteen)
    rstd = acc(1) / np.sqrt(var + acc(eps))
    G = None if weight is None else weight._data.reshape(N).astype(acc)
    B = np.zeros(N, acc) if bias is None else bias._data.reshape(N).astype(acc)
    if sixteen:
        t = fmadd(X, rstd[:, None], (-rstd * mean)[:, None])
        Y = fmadd(t, np.ones(N, acc) if G is None else G, B)
    elif G is None:
        Y = fmadd(X + (-mean)[:, None], rstd[:, None], B)
    else:
        Y = fmadd((X + (-mean)[:, None]) * rstd[:, None], G, B)
    return _store(Y.reshape(x.shape), dt)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight, in float64; eps None is the
    machine epsilon of x's dtype (torch's default). Autocast: fp32."""
    x, weight = cast_inputs("rms_norm", input, weight)
    axes, ns = _norm_axes(x, normalized_shape, weight)
    dt = float_dt(x)
    if eps is None:
        eps = float(np.finfo(np.float64).eps) if dt is float64 else dt.eps
    X = f64(x)
    rstd = 1.0 / np.sqrt((X * X).mean(axis=axes, keepdims=True) + eps)
    xhat = X * rstd
    Wv = f64(weight) if weight is not None else 1.0
    prof = get_profile()
    if prof.cpu and dt in (float32, float64) and x.numel() and (
            weight is None or weight.dtype is dt):
        # torch's rms_norm on CPU (layer_norm.cpp, rms_norm_symint): x * x,
        # its mean (cascade_sum's order, divided by the count), + eps, rsqrt
        # (two roundings), x * rstd, * weight: each step rounded in the dtype
        om = np.float64 if dt is float64 else np.float32
        xd = x._data.astype(om)
        sq = np.multiply(xd, xd)
        m = cpu_sum(sq, axes, True, threads=prof.cpu_threads,
                    capability=prof.cpu_capability) / om(int(np.prod([x.shape[a] for a in axes])))
        r = om(1) / np.sqrt((m + om(eps)).astype(om))
        y = (xd * r.astype(om)).astype(om)
        res = _store(y * weight._data.astype(om) if weight is not None else y, dt)
    else:
        res = _store(xhat * Wv, dt)

    def backward(g):
        G = g.astype(np.float64)
        lead = tuple(range(x.ndim - len(ns)))
        gw = _store((G * xhat).sum(axis=lead), weight.dtype) if weight is not None else None
        gh = G * Wv
        gx = rstd * (gh - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        return _store(gx, dt), gw
    return _result(res, dt, (x, weight), backward,
                   saved=tuple(t for t in (x, weight) if t is not None), op="rms_norm")


def _channel_shape(x, what):
    if x.ndim < 2:
        raise ValueError(f"{what}: expected an input of 2 or more dimensions (N, C, ...), got "
                         f"shape {list(x.shape)}")
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def batch_norm(input, running_mean, running_var, weight=None, bias=None,
               training=False, momentum=0.1, eps=1e-5):
    """Normalise each channel (dim 1) over the batch and the spatial dims.

    Training: the batch's mean and biased variance normalise; the running
    statistics, when given, become ``(1 - momentum) * running + momentum *
    batch`` with the *unbiased* variance, updated in place (torch's CPU
    kernel computes them in double and stores once; so does fpemu). Eval:
    the running statistics normalise. Computed in float64, rounded once to
    the input's dtype (tier 2); not in any autocast list, so the output
    keeps the input's dtype.
    """
    x = input
    if x.numel() == 0 and x.ndim < 2:
        return clone(x)             # torch passes an empty 1-D input through
    shape = _channel_shape(x, "batch_norm")
    C = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and t.numel() != C:
            raise RuntimeError(f"batch_norm: {name} should contain {C} elements not "
                               f"{t.numel()}")
    dt = float_dt(x)
    X = f64(x)
    n = X.size // C if C else 0
    if training:
        if n <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size torch.Size({list(x.shape)})")
        mu = X.mean(axis=axes, keepdims=True)
        xc = X - mu
        var = (xc * xc).mean(axis=axes, keepdims=True)
        if running_mean is not None:
            _update_running(running_mean, mu.reshape(C), momentum)
        if running_var is not None:
            _update_running(running_var, var.reshape(C) * (n / (n - 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("batch_norm: running_mean and running_var must be defined in "
                               "evaluation mode")
        mu = f64(running_mean).reshape(shape)
        var = f64(running_var).reshape(shape)
        xc = X - mu
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    Wv = f64(weight).reshape(shape) if weight is not None else 1.0
    Bv = f64(bias).reshape(shape) if bias is not None else 0.0
    cpu = _cpu_batch_norm(x, running_mean, running_var, weight, bias, training, eps) \
        if get_profile().device == "cpu" and X.size else None
    res = cpu if cpu is not None else _store(xhat * Wv + Bv, dt)

    def backward(g):
        G = g.astype(np.float64)
        gw = _store((G * xhat).sum(axis=axes), weight.dtype) if weight is not None else None
        gb = _store(G.sum(axis=axes), bias.dtype) if bias is not None else None
        gh = G * Wv
        if training:
            gx = rstd * (gh - gh.mean(axis=axes, keepdims=True)
                         - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        else:
            gx = gh * rstd
        return _store(gx, dt), gw, gb
    return _result(res, dt, (x, weight, bias), backward,
                   saved=tuple(t for t in (x, weight) if t is not None),
                   op="native_batch_norm")


def _cpu_batch_norm(x, running_mean, running_var, weight, bias, training, eps):
    """torch CPU's forward output (``cpu/batch_norm_kernel.cpp``,
    ``Normalization.cpp``'s ``batch_norm_cpu_update_stats_template``) for
    float32 / float64 tensors, contiguous or channels-last; None elsewhere
    (other layouts, 16-bit, channels-last training with no more positions
    than threads).

    Training statistics, contiguous: per channel the sum in double in memory
    order, ``mean = T(sum / n)``; ``var_sum`` adds ``T((x - mean)^2)`` in
    double (for double the odd last element of each image row with an fma,
    measured), stored as T. Channels-last: ``at::parallel_for`` over the n
    positions hands each of ``cpu_threads`` threads a block of
    ``ceil(n / threads)`` rows, summed in T per channel; the threads' sums add
    in double. Then ``invstd = T(1 / sqrt(double(T(var_sum / n)) + eps))``.
    Eval: ``invstd = 1 / sqrt(running_var + T(eps))`` in T. The output is
    ``fma(x, alpha, beta)`` with ``alpha = invstd * weight`` and ``beta =
    fma(-mean, alpha, bias)`` (GCC's contraction)."""
    dt = x.dtype
    if dt not in (float32, float64):
        return None
    acc = np.float64 if dt is float64 else np.float32
    C = x.shape[1]
    A = x._data
    n = A.size // C
    # an (N, C, 1, ...) contiguous input takes the channels-last kernels
    # (batch_norm_cpu_collect_stats_kernel: "NC11 is also channels last")
    cl = _channels_last(A) or (A.flags.c_contiguous and n == A.shape[0])
    if not (A.flags.c_contiguous or cl):
        return None
    if training:
        if cl:
            T = min(get_profile().cpu_threads, n)
            if n <= max(get_profile().cpu_threads, 1):
                return None
            rows = np.moveaxis(A, 1, -1).reshape(n, C)
            chunk = -(-n // T)
            parts = [rows[t * chunk:(t + 1) * chunk] for t in range(T) if t * chunk < n]
            total = np.zeros(C, np.float64)
            for part in parts:
                buf = np.zeros(C, acc)
                for r in part:
                    buf = r + buf
                total = total + buf
            mean = (total / n).astype(acc)
            total = np.zeros(C, np.float64)
            for part in parts:
                buf = np.zeros(C, acc)
                for r in part:
                    d = r - mean
                    buf = fmadd(d, d, buf)
                total = total + buf
            var_sum = total.astype(acc)
        else:
            rows = np.moveaxis(A.reshape(A.shape[0], C, -1), 1, 0).reshape(C, n)
            total = np.zeros(C, np.float64)
            for i in range(n):
                total = total + rows[:, i]
            mean = (total / n).astype(acc)
            total = np.zeros(C, np.float64)
            img = n // A.shape[0]
            for i in range(n):
                d = rows[:, i] - mean
                # float: a float square added to a double. double (measured):
                # each image row's pairs add the rounded square, an odd last
                # element adds it with an fma (the compiler's unrolled loop)
                odd = acc is np.float64 and img % 2 and i % img == img - 1
                total = fmadd(d, d, total) if odd else total + d * d
            var_sum = total.astype(acc)
        var = var_sum / acc(n)
        invstd = (1.0 / np.sqrt(var.astype(np.float64) + eps)).astype(acc)
    else:
        mean = running_mean._data.reshape(C).astype(acc)
        invstd = acc(1) / np.sqrt(running_var._data.reshape(C).astype(acc) + acc(eps))
    w = np.ones(C, acc) if weight is None else weight._data.reshape(C).astype(acc)
    b = np.zeros(C, acc) if bias is None else bias._data.reshape(C).astype(acc)
    alpha = invstd * w
    beta = fmadd(-mean, alpha, b)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return _store(fmadd(A.astype(acc), alpha.reshape(shape), beta.reshape(shape)), dt)


def _update_running(stat, batch_value, momentum):
    """``stat = (1 - momentum) * stat + momentum * batch`` in double, stored
    once into the buffer's dtype (no graph)."""
    new = (1.0 - momentum) * f64(stat) + momentum * batch_value.reshape(stat.shape)
    write(stat, new)


def instance_norm(input, running_mean=None, running_var=None, weight=None,
                  bias=None, use_input_stats=True, momentum=0.1, eps=1e-5):
    """Each sample's channels normalised over their own spatial dims."""
    if not use_input_stats:
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    N, C = input.shape[0], input.shape[1]
    x = input.reshape((1, N * C) + tuple(input.shape[2:]))
    w = None if weight is None else weight.repeat(N)
    b = None if bias is None else bias.repeat(N)
    out = batch_norm(x, None, None, w, b, True, momentum, eps)
    return out.reshape(input.shape)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """The channels (dim 1) split into ``num_groups`` groups, each normalised
    over its channels and the spatial dims, then a per-channel affine; in
    float64, rounded once. Autocast: fp32."""
    x, weight, bias = cast_inputs("group_norm", input, weight, bias)
    if x.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received "
                           f"{x.ndim}")
    N, C = x.shape[0], x.shape[1]
    if num_groups <= 0 or C % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by "
                           f"num_groups, but got input of shape {list(x.shape)} and "
                           f"num_groups={num_groups}")
    dt = float_dt(x)
    per = int(np.prod(x.shape[1:])) // num_groups        # (not -1: N may be 0)
    X = f64(x).reshape(N, num_groups, per)
    mu = X.mean(axis=2, keepdims=True)
    xc = X - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=2, keepdims=True) + eps)
    xhat = (xc * rstd).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    Wv = f64(weight).reshape(shape) if weight is not None else 1.0
    Bv = f64(bias).reshape(shape) if bias is not None else 0.0
    cpu = _cpu_group_norm(x, num_groups, weight, bias, eps) \
        if get_profile().device == "cpu" and x._data.size else None
    res = cpu if cpu is not None else _store(xhat * Wv + Bv, dt)
    spatial = (0,) + tuple(range(2, x.ndim))

    def backward(g):
        G = g.astype(np.float64)
        gw = _store((G * xhat).sum(axis=spatial), weight.dtype) if weight is not None else None
        gb = _store(G.sum(axis=spatial), bias.dtype) if bias is not None else None
        gh = (G * Wv).reshape(N, num_groups, per)
        xh = xhat.reshape(N, num_groups, per)
        gx = rstd * (gh - gh.mean(axis=2, keepdims=True)
                     - xh * (gh * xh).mean(axis=2, keepdims=True))
        return _store(gx.reshape(x.shape), dt), gw, gb
    return _result(res, dt, (x, weight, bias), backward,
                   saved=tuple(t for t in (x, weight) if t is not None),
                   op="native_group_norm")


def _cpu_group_norm(x, G, weight, bias, eps):
    """torch CPU's forward (``cpu/group_norm_kernel.cpp``, AVX2 build), or
    None where it is not modelled (16-bit inputs in channels-last, and
    channels-last feature maps of 1024 or more positions, whose per-thread
    buffers are not).

    Contiguous (``GroupNormKernelImplInternal``): each (n, g) row's
    ``RowwiseMoments``; ``rstd = 1 / sqrt(max(var, 0) + eps)`` in double (eps
    is a double there), rounded to opmath; without gamma and beta ``(x -
    mean) * rstd``, else per channel ``scale = rstd * gamma``, ``bias =
    fma(-scale, mean, beta)`` and ``fma(scale, x, bias)`` (GCC's contraction).
    Channels-last, under 1024 positions (``ColumnwiseMoments``): vector sums
    of x and x*x over the positions, ``vec_reduce_all``, ``mean = sum * s``,
    ``var = max(fma(sumsq, s, -mean * mean), 0)`` with ``s = 1 / (D HxW)``,
    then the same scale and bias."""
    dt = x.dtype
    sixteen = dt not in (float32, float64)
    acc = np.float64 if dt is float64 else np.float32
    N, C = x.shape[0], x.shape[1]
    D = C // G
    HW = x._data.size // (N * C)
    lanes = aten_lanes(8 if dt is float64 else 4)
    gamma = None if weight is None else weight._data.reshape(C).astype(acc)
    beta = None if bias is None else bias._data.reshape(C).astype(acc)
    if _channels_last(x._data):
        if sixteen or HW >= 1024:
            return None
        Xc = np.moveaxis(x._data, 1, -1).reshape(N, HW, C).astype(acc)
        s1, s2 = columnwise_sums(Xc, G, lanes)
        s = acc(1) / acc(D * HW)
        mean = s1 * s
        var = np.maximum(fmadd(s2, s, -(mean * mean)), acc(0))
        rstd = (1.0 / np.sqrt(var.astype(np.float64) + eps)).astype(acc)
        scale = rstd[:, :, None] * (np.ones(C, acc) if gamma is None else gamma).reshape(G, D)
        b = np.zeros(C, acc) if beta is None else beta
        if gamma is None:           # no contraction in this loop's gamma-less copy
            bias_c = -scale * mean[:, :, None] + b.reshape(G, D)
        else:
            bias_c = fmadd(-scale, mean[:, :, None], b.reshape(G, D))
        Y = fmadd(Xc.reshape(N, HW, G, D), scale[:, None], bias_c[:, None])
        Y = np.moveaxis(Y.reshape(N, HW, C), -1, 1).reshape(x.shape)
        return _store(Y, dt)
    X = np.ascontiguousarray(x._data, acc).reshape(N * G, D * HW)
    mean, var = rowwise_moments(X, lanes, sixteen_bit=sixteen)
    rstd = (1.0 / np.sqrt(np.maximum(var, acc(0)).astype(np.float64) + eps)).astype(acc)
    if gamma is None and beta is None:
        Y = (X - mean[:, None]) * rstd[:, None]
    else:
        scale = rstd.reshape(N, G, 1) * (np.ones(C, acc) if gamma is None else gamma).reshape(G, D)
        b = np.zeros(C, acc) if beta is None else beta
        bias_c = fmadd(-scale, mean.reshape(N, G, 1), b.reshape(G, D))
        Y = fmadd(scale[..., None], X.reshape(N, G, D, HW), bias_c[..., None])
    return _store(Y.reshape(x.shape), dt)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    return div(input, clamp(norm(input, p, dim, keepdim=True), min=eps))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along ``dim``, as ATen computes
    it: each input divided by its 2-norm (the norm clamped to ``eps`` outside
    the graph), then the products summed, ``((x1 / |x1|) * (x2 / |x2|)).sum(dim)``
    (checked bit for bit against torch 2.13's own function). Autocast: fp32."""
    for pos, t in ((1, x1), (2, x2)):
        if not isinstance(t, Tensor):
            raise TypeError(f"cosine_similarity(): argument 'x{pos}' (position {pos}) must be "
                            f"Tensor, not {type(t).__name__}")
    x1, x2 = cast_inputs("cosine_similarity", x1, x2)
    if not is_float(x1.dtype) or not is_float(x2.dtype):
        dt = float_dt(x1, x2)
        x1, x2 = to_dtype(x1, dt), to_dtype(x2, dt)
    try:
        x1, x2 = broadcast_tensors(x1, x2)
    except (RuntimeError, ValueError):
        raise FpemuRuntimeError(f"The size of tensor a ({list(x1.shape)}) must match the size "
                                f"of tensor b ({list(x2.shape)}): cosine_similarity needs "
                                f"inputs that broadcast") from None
    d = wrap_dim(dim, x1.ndim)
    norms = []
    for t in (x1, x2):
        n = norm(t, 2, d, keepdim=True).clone()
        with no_grad():
            n.clamp_min_(eps)
        norms.append(n)
    return _sum(mul(div(x1, norms[0]), div(x2, norms[1])), d)


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["batch_norm", "cosine_similarity", "group_norm", "instance_norm", "layer_norm",
           "normalize", "rms_norm"]
