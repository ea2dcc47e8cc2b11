"""The normalizations of ``torch.nn.functional``: batch, layer, group,
instance and RMS norms, local response norm, normalize."""

from __future__ import annotations

import numpy as np

from ...errors import FpemuRuntimeError
from .._autocast import cast_inputs
from .._common import f64, float_dt, wrap_dim
from .._core import _result, _store, float64, is_float, no_grad, Tensor, to_dtype
from .._cuda_reduce import _storage_offset, cuda_layer_norm, vectorized_layer_norm_applies
from .._profile import get_profile
from ..ops.reduce import norm, sum as _sum
from ..ops.elementwise import clamp, clone, div, mul
from ..ops.inplace import write
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


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
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


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
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


def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
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
    res = _store(xhat * Wv + Bv, dt)

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


def _update_running(stat, batch_value, momentum):
    """``stat = (1 - momentum) * stat + momentum * batch`` in double, stored
    once into the buffer's dtype (no graph)."""
    new = (1.0 - momentum) * f64(stat) + momentum * batch_value.reshape(stat.shape)
    write(stat, new)


def instance_norm(input, running_mean=None, running_var=None, weight=None,  # noqa: A002
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


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
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
    res = _store(xhat * Wv + Bv, dt)
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


def normalize(input, p=2.0, dim=1, eps=1e-12):  # noqa: A002
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
