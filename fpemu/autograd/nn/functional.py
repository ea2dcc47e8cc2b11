"""The functional forms, as ``torch.nn.functional``: activations, softmax,
norms, losses, dropout, embedding, attention, convolution and pooling.

Softmax, the norms and the losses compute in float64 and round once to the
output dtype (tier 2: CUDA's fp32 reductions are within a few ulp of that).
Attention follows the backend model of ``docs/pytorch-numerics.md`` §11
("Attention"); convolution is im2col followed by the emulated matmul.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math

import numpy as np

from ...errors import FpemuRuntimeError, FpemuValueError
from ...formats import Format
from .. import _special
from .._autocast import cast_inputs
from .._core import (
    Tensor, _result, _store, bool_, float32, float64, int64, is_float, to_dtype,
)
from .._profile import get_profile
from .._state import State
from ..ops import linalg as _linalg
from .._common import f64, float_dt, wrap_dim
from ..ops.elementwise import (  # noqa: F401  (torch.nn.functional's names)
    gelu, masked_fill, relu, sigmoid, silu, tanh,
)
from ..ops.linalg import linear  # noqa: F401
from ..ops.reduce import sum as _sum
from . import _pooling
from ._resample import (  # noqa: F401  (torch.nn.functional's names)
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d, interpolate, upsample,
    upsample_bilinear, upsample_nearest,
)


def relu_(x):
    return relu(x, inplace=True)


def leaky_relu(x, negative_slope=0.01, inplace=False):
    def op(v):
        dt = v.dtype
        X = v._data
        # the slope as the kernel holds it: a double for float64 tensors, else
        # float32 (rounded to a 16-bit dtype first)
        om = np.float64 if dt is float64 else np.float32
        s = om(_store(om(negative_slope), dt)) if is_float(dt) else negative_slope
        res = _store(np.where(X > 0, X, X * s), dt)

        def backward(g):
            return (_store(np.where(X > 0, g, g * s), dt),)
        return _result(res, dt, (v,), backward, saved=(v,), op="leaky_relu")
    if inplace:
        from ..ops.inplace import apply_inplace
        return apply_inplace(x, op)
    return op(x)


def softplus(x, beta=1.0, threshold=20.0):
    (x,) = cast_inputs("softplus", x)
    from ..ops.elementwise import _unary

    def fwd(v):
        return np.where(v * beta > threshold, v, np.log1p(np.exp(beta * v)) / beta)

    def bwd(g, v, y):
        return np.where(v * beta > threshold, g, g / (1 + np.exp(-beta * v)))
    return _unary("softplus", x, fwd, bwd)


def _activation(name, x, fwd, bwd, inplace=False, autocast=False):
    """An elementwise activation through ``_unary`` (float64, one rounding),
    or written into ``x`` with ``inplace``."""
    from ..ops.elementwise import _unary
    if inplace:
        from ..ops.inplace import apply_inplace
        return apply_inplace(x, lambda v: _unary(name, v, fwd, bwd, autocast=autocast))
    return _unary(name, x, fwd, bwd, autocast=autocast)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):  # noqa: A002
    """clamp(x, min_val, max_val); the gradient passes strictly inside."""
    if min_val > max_val:
        raise FpemuValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val "
                              f"({max_val})")
    return _activation("hardtanh", input, lambda v: np.clip(v, min_val, max_val),
                       lambda g, v, y: np.where((v > min_val) & (v < max_val), g, 0.0),
                       inplace)


def hardtanh_(input, min_val=-1.0, max_val=1.0):  # noqa: A002
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input, inplace=False):  # noqa: A002
    return hardtanh(input, 0.0, 6.0, inplace)


def elu(input, alpha=1.0, inplace=False):  # noqa: A002
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return _activation("elu", input, lambda v: np.where(v > 0, v, alpha * np.expm1(v)),
                       lambda g, v, y: np.where(v > 0, g, g * alpha * np.exp(v)), inplace)


def elu_(input, alpha=1.0):  # noqa: A002
    return elu(input, alpha, inplace=True)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):  # noqa: A002
    """scale * elu(x, alpha) with the constants of Klambauer et al. (2017)."""
    a, s = _SELU_ALPHA, _SELU_SCALE
    return _activation("selu", input, lambda v: s * np.where(v > 0, v, a * np.expm1(v)),
                       lambda g, v, y: g * s * np.where(v > 0, 1.0, a * np.exp(v)), inplace)


def celu(input, alpha=1.0, inplace=False):  # noqa: A002
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise FpemuValueError("ZeroDivisionError: alpha cannot be 0 for CELU")
    return _activation("celu", input,
                       lambda v: np.where(v > 0, v, alpha * np.expm1(v / alpha)),
                       lambda g, v, y: np.where(v > 0, g, g * np.exp(v / alpha)), inplace)


def mish(input, inplace=False):  # noqa: A002
    """x * tanh(softplus(x))."""
    def fwd(v):
        return v * np.tanh(np.logaddexp(0.0, v))

    def bwd(g, v, y):
        t = np.tanh(np.logaddexp(0.0, v))
        sig = 1 / (1 + np.exp(-v))
        return g * (t + v * sig * (1 - t * t))
    return _activation("mish", input, fwd, bwd, inplace)


def logsigmoid(input):  # noqa: A002
    """log(sigmoid(x)) = -softplus(-x), computed without overflow."""
    return _activation("log_sigmoid", input, lambda v: -np.logaddexp(0.0, -v),
                       lambda g, v, y: g / (1 + np.exp(v)))


def softsign(input):  # noqa: A002
    return _activation("softsign", input, lambda v: v / (1 + np.abs(v)),
                       lambda g, v, y: g / (1 + np.abs(v)) ** 2)


def hardsigmoid(input, inplace=False):  # noqa: A002
    """relu6(x + 3) / 6."""
    # the backward multiplies by ATen's one_sixth, 1.0f / 6.0f (float32's, for
    # float64 tensors too)
    return _activation("hardsigmoid", input, lambda v: np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                       lambda g, v, y: np.where((v > -3) & (v < 3),
                                                g * float(np.float32(1) / np.float32(6)), 0.0),
                       inplace)


def hardswish(input, inplace=False):  # noqa: A002
    """x * relu6(x + 3) / 6."""
    return _activation("hardswish", input, lambda v: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                       lambda g, v, y: np.where(v < -3, 0.0,
                                                np.where(v <= 3, g * (2 * v + 3) / 6.0, g)),
                       inplace)


def tanhshrink(input):  # noqa: A002
    return _activation("tanhshrink", input, lambda v: v - np.tanh(v),
                       lambda g, v, y: g * np.tanh(v) ** 2)


def prelu(input, weight):  # noqa: A002
    """x if x > 0 else weight * x, with one learnable slope or one per
    channel (dim 1)."""
    from ..ops.elementwise import mul, where
    if not isinstance(weight, Tensor):
        raise TypeError(f"prelu(): weight must be a Tensor, got {type(weight).__name__}")
    if weight.ndim > 1:
        raise FpemuRuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: "
                                f"ndim = {weight.ndim}")
    n = weight.numel()
    if n != 1 and input.ndim == 0:
        raise FpemuRuntimeError("Not allow zero-dim input tensor.")
    if n == 1:
        weight = weight.reshape(())           # one slope: the input's shape, 0-d too
    else:
        channels = input.shape[1] if input.ndim > 1 else input.shape[0]
        if n != channels:
            raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found "
                               f"parameter numbers = {n} and channel size = {channels}.")
        if input.ndim > 1:
            weight = weight.reshape((n,) + (1,) * (input.ndim - 2))
    return where(input > 0, input, mul(weight, input))


def glu(input, dim=-1):  # noqa: A002
    """a * sigmoid(b), the halves of ``input`` along ``dim``."""
    from ..ops.elementwise import mul
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension "
                           f"{wrap_dim(dim, input.ndim)} is size {input.shape[dim]}")
    a, b = input.chunk(2, dim)
    return mul(a, sigmoid(b))


# ------------------------------------------------------------------- softmax
def _dim(dim, ndim, what):
    if dim is None:
        raise TypeError(f"{what}(): pass dim= explicitly (the implicit choice is deprecated "
                        f"in PyTorch)")
    d = wrap_dim(dim, ndim)
    return d if ndim else None        # a 0-d tensor: softmax over itself


def _softmax_input(op, x, dim, dtype):
    if dtype is None:
        (x,) = cast_inputs(op, x)
    else:
        x = to_dtype(x, dtype)
    return x, float_dt(x), _dim(dim, x.ndim, op), f64(x)


def softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """exp(x - max) / sum, in float64, rounded once. Autocast: fp32 output.

    Under the CPU profile a bfloat16 / float16 input follows ATen's CPU
    kernels (bit for bit on torch 2.13 CPU): the exponentials and their sum
    in float32, along the last dim ``e * (1 / sum)``, along another dim as
    :func:`_cpu_softmax_inner` says. The backward reads the stored output:
    ``y * (g - sum(g * y))``."""
    x, dt, d, X = _softmax_input("softmax", input, dim, dtype)
    with np.errstate(all="ignore"):
        e = np.exp(X - X.max(axis=d, keepdims=True, initial=-np.inf))
        if get_profile().cpu and isinstance(dt, Format) and dt.bits == 16 and d is not None:
            e32 = e.astype(np.float32)
            if d == x.ndim - 1:
                s32 = e32.astype(np.float64).sum(axis=d, keepdims=True).astype(np.float32)
                Y = e32 * (np.float32(1) / s32)
            else:
                Y = _cpu_softmax_inner(e32, d, dt)
        else:
            Y = e / e.sum(axis=d, keepdims=True)
    res = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        Yo = res.astype(np.float64)
        om = np.float64 if dt is float64 else np.float32
        with np.errstate(all="ignore"):
            if get_profile().cpu and om is np.float32 and d is not None and d != x.ndim - 1:
                # ATen's CPU kernel along an inner dim: float32 in index order
                S = _sequential_sum_f32((G * Yo).astype(np.float32), d).astype(np.float64)
            else:
                S = (G * Yo).sum(axis=d, keepdims=True).astype(om).astype(np.float64)
            return (_store(Yo * (G - S), dt),)
    return _result(res, dt, (x,), backward, saved=("out",), op="softmax")


def softmin(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """softmax(-x)."""
    from ..ops.elementwise import neg
    return softmax(neg(input), dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):  # noqa: A002
    """x - max - log(sum(exp(x - max))), in float64, rounded once.
    Autocast: fp32 output.

    Under the CPU profile a bfloat16 / float16 input follows ATen's CPU
    kernels (bit for bit on torch 2.13 CPU): along the last dim the sum of
    exponentials and its logarithm are kept in the tensor's dtype before the
    subtraction; along another dim everything is float32, the sum in index
    order. The backward reads the stored output: ``g - exp(y) * sum(g)``."""
    x, dt, d, X = _softmax_input("log_softmax", input, dim, dtype)
    with np.errstate(all="ignore"):
        shifted = X - X.max(axis=d, keepdims=True, initial=-np.inf)
        total = np.exp(shifted).sum(axis=d, keepdims=True)
        if _cpu_reduced_lastdim(dt, d, x.ndim):
            log_sum = _store(np.log(_store(total, dt).astype(np.float64)), dt)
            Y = shifted.astype(np.float32).astype(np.float64) - log_sum
        elif get_profile().cpu and isinstance(dt, Format) and dt.bits == 16 and d is not None:
            # float32 throughout: the sum in index order, its log, x - max - log
            s32 = _sequential_sum_f32(np.exp(shifted).astype(np.float32), d)
            log32 = np.log(s32.astype(np.float64)).astype(np.float32)
            Y = shifted.astype(np.float32) - log32
        else:
            Y = shifted - np.log(total)
    res = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        om = np.float64 if dt is float64 else np.float32
        with np.errstate(all="ignore"):
            S = G.sum(axis=d, keepdims=True).astype(om).astype(np.float64)
            E = np.exp(res.astype(np.float64)).astype(om).astype(np.float64)
            return (_store(G - E * S, dt),)
    return _result(res, dt, (x,), backward, saved=("out",), op="log_softmax")


def _sequential_sum_f32(E, axis):
    """The float32 sum along ``axis`` in index order, one rounding per add."""
    E = np.moveaxis(E, axis, 0)
    acc = np.zeros(E.shape[1:], np.float32)
    for k in range(E.shape[0]):
        acc = acc + E[k]
    return np.expand_dims(acc, axis)


def _cpu_softmax_inner(e32, d, dt):
    """ATen's CPU softmax of a 16-bit tensor along a dim that is not the
    last (``_vec_softmax`` for reduced floating types): the exponentials and
    their sum (in index order) in float32; the columns it runs as one vector
    of ``lanes`` 16-bit values take ``e / sum``, the others (the scalar
    tail) ``round(e) / sum``. Which columns are vectors depends on how
    ``at::parallel_for`` splits the outer x inner positions over the
    profile's ``cpu_threads`` (measured bit for bit on torch 2.13 CPU, one
    and two threads)."""
    shape = e32.shape
    outer = int(np.prod(shape[:d], dtype=np.int64))
    inner = int(np.prod(shape[d + 1:], dtype=np.int64))
    E = e32.reshape(outer, shape[d], inner)
    S = _sequential_sum_f32(E, 1)
    prof = get_profile()
    lanes = prof.cpu_lanes(2)
    n = outer * inner
    vector = np.zeros(n, bool)
    threads = prof.cpu_threads if n > 1 else 1
    chunk = -(-n // max(threads, 1))
    for begin in range(0, n, chunk):
        end = min(n, begin + chunk)
        idx = begin
        while idx < end:
            col = idx % inner
            if col + lanes <= inner and idx + lanes <= end:
                vector[idx:idx + lanes] = True
                idx += lanes
            else:
                idx += (end - idx) if idx + lanes > end else (inner - col)
    vector = vector.reshape(outer, 1, inner)
    Y = np.where(vector, E / S, _store(E, dt) / S)
    return Y.reshape(shape)


def _cpu_reduced_lastdim(dt, d, ndim):
    """True for ATen's CPU softmax kernels on a 16-bit float along the last dim."""
    return (get_profile().cpu and isinstance(dt, Format) and dt.bits == 16
            and d is not None and d == ndim - 1)


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
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dims, in
    float64. Autocast: fp32 (input, weight and bias cast, fp32 output)."""
    x, weight, bias = cast_inputs("layer_norm", input, weight, bias)
    axes, ns = _norm_axes(x, normalized_shape)
    dt = float_dt(x)
    X = f64(x)
    mu = X.mean(axis=axes, keepdims=True)
    xc = X - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    xhat = xc * rstd
    Wv = f64(weight) if weight is not None else 1.0
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
        from ..ops.elementwise import clone
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
    from ..ops.inplace import write
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
    from ..ops.elementwise import clamp, div
    from ..ops.reduce import norm
    return div(input, clamp(norm(input, p, dim, keepdim=True), min=eps))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """Cosine of the angle between x1 and x2 along ``dim``, as ATen computes
    it: each input divided by its 2-norm (the norm clamped to ``eps`` outside
    the graph), then the products summed, ``((x1 / |x1|) * (x2 / |x2|)).sum(dim)``
    (checked bit for bit against torch 2.13's own function). Autocast: fp32."""
    from ..ops.elementwise import div, mul
    from ..ops.reduce import norm
    from ..ops.shape import broadcast_tensors
    from .._core import no_grad
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


# -------------------------------------------------------------------- losses
def _reduction(reduction, size_average=None, reduce=None):
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "none" if not reduce else ("mean" if size_average else "sum")
    if reduction not in ("mean", "sum", "none"):
        raise FpemuValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100,  # noqa: A002
             reduce=None, reduction="mean"):
    """-w[t] * logp[n, t, ...] over the targets that are not ``ignore_index``;
    "mean" divides by the sum of their weights (torch's weighted mean). Input
    (N, C), (C,) or (N, C, d1, ...). Autocast: fp32."""
    reduction = _reduction(reduction, size_average, reduce)
    (logp,) = cast_inputs("nll_loss", input)
    if not isinstance(target, Tensor) or is_float(target.dtype):
        from ..ops.linalg import scalar_type
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
    if reduction == "none":
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


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,  # noqa: A002
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
            from ..ops.linalg import scalar_type
            raise RuntimeError(f"Expected floating point type for target with class "
                               f"probabilities, got {scalar_type(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        return _soft_cross_entropy(logp, target, weight, reduction, label_smoothing, cdim)
    loss = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if not label_smoothing:
        return loss
    from ..ops.elementwise import add, div, mul, neg
    from ..ops.shape import gather, masked_select
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
    from ..ops.elementwise import add, div, mul, neg
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


def _pointwise_loss(name, input, target, reduction, fwd, bwd):  # noqa: A002
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
    if reduction == "none":
        res, scale = _store(per, dt), None
    else:
        scale = per.size if reduction == "mean" else 1
        with np.errstate(all="ignore"):
            res = _store(np.asarray(per.sum() / scale), dt)

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            gi = bwd(X - T) * (G if scale is None else G / scale)
        gi = np.broadcast_to(gi, np.broadcast_shapes(X.shape, np.shape(T)))
        from .._common import grad_part
        return (grad_part(_store(gi, dt), input, dt),
                grad_part(_store(-gi, dt), target, dt) if isinstance(target, Tensor) else None)
    return _result(res, dt, (input, target), backward,
                   saved=tuple(t for t in (input, target) if isinstance(t, Tensor)), op=name)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean",  # noqa: A002
             weight=None):
    """mean((input - target)^2) in float64, rounded once. Autocast: fp32."""
    return _pointwise_loss("mse_loss", input, target, _reduction(reduction, size_average,
                                                                 reduce),
                           lambda d: d * d, lambda d: 2 * d)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):  # noqa: A002
    return _pointwise_loss("l1_loss", input, target, _reduction(reduction, size_average,
                                                                reduce),
                           np.abs, np.sign)


def smooth_l1_loss(input, target, size_average=None, reduce=None,  # noqa: A002
                   reduction="mean", beta=1.0):
    if beta == 0:
        return l1_loss(input, target, reduction=reduction)
    return _pointwise_loss(
        "smooth_l1_loss", input, target, _reduction(reduction, size_average, reduce),
        lambda d: np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta),
        lambda d: np.where(np.abs(d) < beta, d / beta, np.sign(d)))


def huber_loss(input, target, reduction="mean", delta=1.0):  # noqa: A002
    if delta <= 0:
        raise FpemuRuntimeError("huber_loss does not support non-positive values for delta.")
    return _pointwise_loss(
        "huber_loss", input, target, _reduction(reduction),
        lambda d: np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta)),
        lambda d: np.where(np.abs(d) < delta, d, delta * np.sign(d)))


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6,  # noqa: A002
                      reduction="mean"):
    """The Gaussian negative log-likelihood, torch's sequence of ops: var
    (a number, the input's shape, or one dim short of it / broadcasting in
    one dim) clamped to ``eps`` outside the graph, then
    ``0.5 * (log(var) + (input - target) ** 2 / var)`` (+ 0.5 log 2 pi)."""
    from ..ops.creation import ones_like
    from ..ops.elementwise import add, div, log, mul, pow, sub
    from ..ops.reduce import any as _any
    from ..ops.reduce import mean as _mean
    from .._core import no_grad
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


def poisson_nll_loss(input, target, log_input=True, full=False,  # noqa: A002
                     size_average=None, eps=1e-8, reduce=None, reduction="mean"):
    """Poisson negative log-likelihood, ATen's steps: ``exp(input) - target *
    input`` (or ``input - target * log(input + eps)``), plus Stirling's
    ``target log target - target + 0.5 log(2 pi target)`` where target > 1
    when ``full``; then the reduction."""
    from ..ops.elementwise import add, exp, log, masked_fill, mul, sub
    from ..ops.reduce import mean as _mean
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
    from ..ops.elementwise import add, clamp_min, mul, neg, sub
    from ..ops.reduce import mean as _mean
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


def hinge_embedding_loss(input, target, margin=1.0, size_average=None,  # noqa: A002
                         reduce=None, reduction="mean"):
    """ATen's: ``max(0, margin - input)`` where target is not 1, plus input
    where target is not -1, then the reduction."""
    from ..ops.elementwise import add, clamp_min, rsub, where
    from ..ops.reduce import mean as _mean
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
    from ..ops.einsum import einsum
    from ..ops.elementwise import add
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


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
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


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):  # noqa: A002
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


def _same_size_target(input, target, what):  # noqa: A002
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


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None,  # noqa: A002
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
    res = _store(loss, dt)

    def backward(g):
        G = g.astype(np.float64)
        Gs = G if scale is None else G / scale
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


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,  # noqa: A002
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
    res = _store(loss, dt)

    def backward(g):
        G = g.astype(np.float64)
        Gs = G if scale is None else G / scale
        with np.errstate(all="ignore"):
            gi = (X - T) / np.maximum((1 - X) * X, 1e-12) * W * Gs
            gt = (log_1mx - log_x) * W * Gs
        return (_store(np.broadcast_to(gi, X.shape), dt),
                _store(np.broadcast_to(gt, X.shape), dt) if target.requires_grad else None)
    return _result(res, dt, (input, target), backward, saved=(input, target),
                   op="binary_cross_entropy")


def kl_div(input, target, size_average=None, reduce=None, reduction="mean",  # noqa: A002
           log_target=False):
    """``t * (log t - x)`` (or ``exp(t) * (t - x)`` with ``log_target``),
    zero where t = 0; "batchmean" divides the sum by the batch size.
    Autocast: fp32."""
    if reduction == "batchmean":
        red = "sum"
    else:
        red = _reduction(reduction, size_average, reduce)
        if red == "mean":
            import warnings
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
    res = _store(loss, dt)

    def backward(g):
        G = g.astype(np.float64)
        Gs = G if scale is None else G / scale
        with np.errstate(all="ignore"):
            gi = -(np.exp(T) if log_target else T) * Gs
            # d/dt of t (log t - x) is log t - x + 1; of exp(t) (t - x), exp(t) (t - x + 1)
            gt = (np.exp(T) * (T - X + 1) if log_target
                  else np.where(T > 0, np.log(T) - X + 1, 0.0)) * Gs
        return (_store(np.broadcast_to(gi, X.shape), dt),
                _store(np.broadcast_to(gt, T.shape), dt))
    return _result(res, dt, (input, target), backward, saved=(target,), op="kl_div")


# ------------------------------------------------------------ dropout, embedding
def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zero each element with probability p and scale the rest by the float32
    1/(1-p); the mask comes from fpemu's seeded generator (not torch's numbers)."""
    if not 0.0 <= p <= 1.0:
        raise FpemuValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if inplace:
        from ..ops.inplace import apply_inplace
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
    import warnings
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


def _feature_dropout(input, p, training, inplace, batched_ndim, name):  # noqa: A002
    """Zero whole channels: one draw per (sample, channel), the kept
    channels scaled by the float32 1/(1-p); ``batched_ndim`` is the input
    rank with a batch dim (3 for dropout1d, 4 for 2d, 5 for 3d); other
    ranks as torch takes them (:func:`_feature_rank_rule`)."""
    if not 0.0 <= p <= 1.0:
        raise FpemuValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    x = input
    lead = _feature_rank_rule(x, batched_ndim, name)
    if not training or p == 0.0:
        return x
    if inplace:
        from ..ops.inplace import apply_inplace
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


def dropout1d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, 3, "dropout1d")


def dropout2d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, 4, "dropout2d")


def dropout3d(input, p=0.5, training=True, inplace=False):  # noqa: A002
    return _feature_dropout(input, p, training, inplace, 5, "dropout3d")


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
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


def pad(input, pad, mode="constant", value=None):  # noqa: A002
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


# ------------------------------------------------------------------ attention
class SDPBackend(enum.IntEnum):
    """``torch.nn.attention.SDPBackend``."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


_ALL_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION)
_sdpa_allowed = [_ALL_BACKENDS]


@contextlib.contextmanager
def sdpa_kernel(backends, set_priority=False):
    """``with sdpa_kernel(SDPBackend.MATH):`` restricts attention to those
    backends (``torch.nn.attention.sdpa_kernel``)."""
    if isinstance(backends, SDPBackend):
        backends = [backends]
    backends = tuple(backends)
    for b in backends:
        if not isinstance(b, SDPBackend):
            raise TypeError(f"sdpa_kernel expects SDPBackend values, got {b!r}")
    _sdpa_allowed.append(backends)
    try:
        yield
    finally:
        _sdpa_allowed.pop()


def sdpa_backend(q, dropout_p=0.0):
    """The backend torch would pick: on the CUDA profile flash attention for
    float16 / bfloat16 inputs, memory-efficient attention for float32 (both
    the online-softmax model here), unless :func:`sdpa_kernel` allows only
    math; the CPU profile runs its flash kernel (same model)."""
    allowed = _sdpa_allowed[-1]
    online = [b for b in allowed if b in (SDPBackend.FLASH_ATTENTION,
                                          SDPBackend.EFFICIENT_ATTENTION,
                                          SDPBackend.CUDNN_ATTENTION)]
    if q.dtype is float64 or not online:
        if SDPBackend.MATH not in allowed:
            raise RuntimeError("No available kernel. Aborting execution.")
        return SDPBackend.MATH
    if get_profile().device == "cuda" and q.dtype is float32 and \
            SDPBackend.EFFICIENT_ATTENTION not in allowed:
        if SDPBackend.MATH in allowed:
            return SDPBackend.MATH
        raise RuntimeError("No available kernel. Aborting execution.")
    return online[0]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v, on (..., L, E) query and (..., S, E)
    key / value, with a backend model (``docs/pytorch-numerics.md`` §11):

    * flash / memory-efficient (the default for 16-bit inputs on CUDA): the
      scores q k^T accumulate in fp32 and stay fp32, the softmax runs in fp32,
      the probabilities P are rounded to the input dtype before P v (fp32
      accumulation), and the fp32 result is divided by the fp32 row sum, then
      rounded once. Tier 2: the kernels' online softmax rescales block by
      block, which moves the last bits;
    * math (``with sdpa_kernel(SDPBackend.MATH)``, and float64): q, k and v are
      cast to float32, q and k each scaled by sqrt(scale), and every step runs
      in float32; the output is cast back to the input dtype.
    """
    q, k, v = cast_inputs("scaled_dot_product_attention", query, key, value)
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {q.dtype} key.dtype: {k.dtype} and value.dtype: "
                           f"{v.dtype} instead.")
    if q.shape[-1] != k.shape[-1]:
        raise RuntimeError("query and key must have the same last dimension")
    if enable_gqa and q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        from ..ops.shape import repeat_interleave
        k, v = repeat_interleave(k, rep, -3), repeat_interleave(v, rep, -3)
    if attn_mask is not None and is_causal:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                           "set when is_causal=True")
    E = q.shape[-1]
    sc = 1.0 / float(np.sqrt(E)) if scale is None else float(scale)
    L, S = q.shape[-2], k.shape[-2]
    mask_add = None
    if is_causal:
        mask_add = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf)
    elif attn_mask is not None:
        m = attn_mask._data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        mask_add = np.where(m, 0.0, -np.inf) if m.dtype == bool else m.astype(np.float64)
    # a float mask that needs a gradient: torch's fused kernels give it none, so
    # torch takes the math path, whose graph reaches the mask
    mask_t = attn_mask if (not is_causal and isinstance(attn_mask, Tensor)
                           and is_float(attn_mask.dtype) and attn_mask.requires_grad) else None
    backend = SDPBackend.MATH if mask_t is not None else sdpa_backend(q, dropout_p)
    if backend == SDPBackend.MATH:
        return _sdpa_math(q, k, v, mask_add, dropout_p, sc, mask_t)
    return _sdpa_online(q, k, v, mask_add, dropout_p, sc)


def _sdpa_math(q, k, v, mask_add, dropout_p, sc, mask_t=None):
    from ..ops.elementwise import add, mul
    dt = q.dtype
    q32, k32, v32 = (to_dtype(t, float32) if t.dtype is not float64 else t for t in (q, k, v))
    s = float(np.sqrt(sc))
    scores = _linalg._matmul(mul(q32, s), mul(k32, s).transpose(-2, -1), "matmul")
    if mask_t is not None:
        scores = add(scores, mask_t if mask_t.dtype is scores.dtype else
                     to_dtype(mask_t, scores.dtype))
    elif mask_add is not None:
        scores = add(scores, Tensor(mask_add.astype(scores._data.dtype), scores.dtype))
    p = softmax(scores, dim=-1)
    if dropout_p:
        p = dropout(p, dropout_p)
    out = _linalg._matmul(p, v32, "matmul")
    return to_dtype(out, dt)


def _sdpa_online(q, k, v, mask_add, dropout_p, sc):
    dt = q.dtype
    Q, K, V = (t._data.astype(np.float32, copy=False) for t in (q, k, v))  # saved: checked
    S32 = _linalg.mm_acc(Q, np.swapaxes(K, -1, -2), dt)          # fp32 scores
    with np.errstate(all="ignore"):
        Z = S32.astype(np.float64) * np.float32(sc)
        if mask_add is not None:
            Z = Z + mask_add
        m = Z.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(Z - m).astype(np.float32)                    # fp32 probabilities
        lsum = p.astype(np.float64).sum(axis=-1, keepdims=True).astype(np.float32)
    keep = None
    if dropout_p:
        keep = ~State.generator.bernoulli(p.shape, dropout_p)
        p_used = np.where(keep, p / np.float32(1 - dropout_p), np.float32(0)).astype(
            np.float32)
    else:
        p_used = p
    P16 = _store(p_used, dt).astype(np.float32, copy=False)
    acc = _linalg.mm_acc(P16, V, dt)
    with np.errstate(all="ignore"):
        O32 = (acc / lsum).astype(np.float32)
    res = _store(O32, dt)
    qn, kn, vn = q.requires_grad, k.requires_grad, v.requires_grad

    def backward(g):
        G = g.astype(np.float32, copy=False)
        with np.errstate(all="ignore"):
            Pn = (p_used / lsum).astype(np.float32)            # normalised, fp32
            Pn16 = _store(Pn, dt).astype(np.float32, copy=False)
            dV = _linalg.mm_acc(np.swapaxes(Pn16, -1, -2), G, dt) if vn else None
            dP = _linalg.mm_acc(G, np.swapaxes(V, -1, -2), dt)
            if keep is not None:
                dP = np.where(keep, dP / np.float32(1 - dropout_p), np.float32(0))
            D = (G.astype(np.float64) * res.astype(np.float64)).sum(axis=-1, keepdims=True)
            Pbase = (p / lsum).astype(np.float32)
            dS = (Pbase * (dP - D.astype(np.float32))).astype(np.float32)
            dS16 = _store(dS, dt).astype(np.float32, copy=False)
            dQ = _linalg.mm_acc(dS16, K, dt) * np.float32(sc) if qn else None
            dK = _linalg.mm_acc(np.swapaxes(dS16, -1, -2), Q, dt) * np.float32(sc) if kn \
                else None
        return (None if dQ is None else _store(dQ, dt), None if dK is None else _store(dK, dt),
                None if dV is None else _store(dV, dt))
    return _result(res, dt, (q, k, v), backward, saved=(q, k, v),
                   op="scaled_dot_product_flash_attention", stored=True)   # q, k, v: dtype dt


# ------------------------------------------------------ multi-head attention
def _canonical_mask(mask, mask_name, other_type, other_name, target_type, check_other=True):
    """A boolean mask (True = masked out) becomes an additive one of
    ``target_type`` (0 and -inf); a float mask is returned as it is."""
    if mask is None:
        return None
    if mask.dtype.name != "bool" and not is_float(mask.dtype):
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype is not other_type:
        import warnings
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. "
                      f"Use same type for both instead.", stacklevel=3)
    if is_float(mask.dtype):
        return mask
    add = np.where(mask._data, -np.inf, 0.0)
    return Tensor(_store(add, target_type), target_type)


def _none_or_dtype(t):
    return None if t is None else t.dtype


def _in_projection_packed(q, k, v, w, b=None):
    """The q, k, v projections of one packed (3E, E) weight, as torch forms
    them: one GEMM for self-attention, q and (k, v) for encoder-decoder
    attention, three otherwise (each a separately rounded GEMM)."""
    E = q.shape[-1]
    if k is v:
        if q is k:
            proj = linear(q, w, b).unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2)
            proj = proj.squeeze(-2).contiguous()
            return proj[0], proj[1], proj[2]
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        kv = linear(k, w_kv, b_kv).unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2)
        kv = kv.squeeze(-2).contiguous()
        return linear(q, w_q, b_q), kv[0], kv[1]
    w_q, w_k, w_v = w.chunk(3)
    b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    return linear(q, w_q, b_q), linear(k, w_k, b_k), linear(v, w_v, b_v)


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads,
                                 in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
                                 dropout_p, out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False):
    """torch's multi-head attention on (L, N, E) query and (S, N, E) key /
    value (unbatched (L, E) too), op for op: projections, masks merged into
    one additive mask, then either the explicit path that returns the
    weights (q scaled by 1/sqrt(head_dim), ``baddbmm`` with the mask, fp32
    softmax, ``bmm``) or, with ``need_weights=False``,
    :func:`scaled_dot_product_attention` under its backend model."""
    from ..ops.creation import zeros
    from ..ops.shape import cat
    is_batched = query.ndim == 3
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise AssertionError(f"query, key and value should be all 3-D (batched) or all 2-D "
                             f"(unbatched) tensors, but received query {query.ndim}-D, key "
                             f"{key.ndim}-D and value {value.ndim}-D")
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask",
                                       _none_or_dtype(attn_mask), "attn_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None            # SDPA applies the causal mask itself
    else:
        attn_mask = _canonical_mask(attn_mask, "attn_mask", None, "", query.dtype,
                                    check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, "
                             f"but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do "
                                 f"not match value's {tuple(value.shape[:2])}")
        b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
        q, k, v = (linear(query, q_proj_weight, b_q), linear(key, k_proj_weight, b_k),
                   linear(value, v_proj_weight, b_v))
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape "
                                 f"{tuple(value.shape)}")
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is "
                                   f"{tuple(attn_mask.shape)}, but should be "
                                   f"{(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.ndim == 3:
            if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is "
                                   f"{tuple(attn_mask.shape)}, but should be "
                                   f"{(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")
    if bias_k is not None and bias_v is not None:
        k = cat([k, bias_k.repeat(1, bsz, 1)])
        v = cat([v, bias_v.repeat(1, bsz, 1)])
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    elif (bias_k is None) != (bias_v is None):
        raise AssertionError("bias_k and bias_v must both be given or both be None")
    q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = (k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_k is None
         else static_k)
    v = (v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_v is None
         else static_v)
    if add_zero_attn:
        zshape = (bsz * num_heads, 1, head_dim)
        k = cat([k, zeros(zshape, dtype=k.dtype)], dim=1)
        v = cat([v, zeros(zshape, dtype=v.dtype)], dim=1)
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    src_len = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise AssertionError(f"expecting key_padding_mask shape of {(bsz, src_len)}, but "
                                 f"got {tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
        kpm = kpm.reshape(bsz * num_heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if not training:
        dropout_p = 0.0
    if need_weights:
        E = q.shape[-1]
        q_scaled = q * float(np.sqrt(1.0 / float(E)))
        if attn_mask is not None:
            w = _linalg.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
        else:
            w = _linalg.bmm(q_scaled, k.transpose(-2, -1))
        w = softmax(w, dim=-1)
        if dropout_p > 0.0:
            w = dropout(w, p=dropout_p)
        out = _linalg.bmm(w, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, -1)
        w = w.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            w = w.mean(dim=1)
        if not is_batched:
            out, w = out.squeeze(1), w.squeeze(0)
        return out, w
    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.ndim == 3:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            attn_mask = attn_mask.view(bsz, num_heads, -1, src_len)
    q = q.view(bsz, num_heads, tgt_len, head_dim)
    k = k.view(bsz, num_heads, src_len, head_dim)
    v = v.view(bsz, num_heads, src_len, head_dim)
    out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, -1)
    if not is_batched:
        out = out.squeeze(1)
    return out, None


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


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """2-D convolution as im2col and the emulated matmul (fp32 accumulation
    under the matmul model, the bias added to the accumulator, one rounding).
    Autocast: lower. Under the CUDA profile ``torch.backends.cudnn.allow_tf32``
    (on by default, as in torch) reads float32 operands as tf32."""
    x, w, b = cast_inputs("conv2d", input, weight, bias)
    return _convnd(x, w, b, stride, padding, dilation, groups, 2)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """3-D convolution, as :func:`conv2d` over three spatial dims. Autocast:
    lower."""
    x, w, b = cast_inputs("conv3d", input, weight, bias)
    return _convnd(x, w, b, stride, padding, dilation, groups, 3)


def _convnd(x, w, b, stride, padding, dilation, groups, nd):
    _conv_args(x, w, b, stride, padding, dilation, groups, nd)
    batched = x.ndim == nd + 2
    if not batched:
        from ..ops.shape import unsqueeze
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
        parts.append(_linalg.mm_acc(cg, Wm[gi * Og:(gi + 1) * Og].T, dt, tf32))
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
                                     colsg[gi], dt, tf32) for gi in range(groups)]
            gw = _store(np.concatenate(gparts, 0).reshape(w.shape), dt)
        if xn:
            dcols = np.concatenate(
                [_linalg.mm_acc(G[:, gi * Og:(gi + 1) * Og], Wm[gi * Og:(gi + 1) * Og], dt,
                                tf32) for gi in range(groups)], axis=1)
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
        from ..ops.shape import squeeze
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


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """1-D convolution: :func:`conv2d` over a height of one."""
    from ..ops.shape import squeeze, unsqueeze
    (x, w, b) = cast_inputs("conv1d", input, weight, bias)
    if x.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2D (unbatched) or 3D (batched) input to conv1d, but got "
                           f"input of size: {list(x.shape)}")
    pad = padding if isinstance(padding, str) else (0, _pair(padding, 1)[0])
    out = conv2d(unsqueeze(x, -2), unsqueeze(w, -2), b, (1, _pair(stride, 1)[0]), pad,
                 (1, _pair(dilation, 1)[0]), groups)
    return squeeze(out, -2)


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """1-D transposed convolution: :func:`conv_transpose2d` over a height of one."""
    from ..ops.shape import squeeze, unsqueeze
    input, weight, bias = cast_inputs("conv_transpose1d", input, weight, bias)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2D (unbatched) or 3D (batched) input to "
                           f"conv_transpose1d, but got input of size: {list(input.shape)}")
    one = (lambda v: (1, _pair(v, 1)[0]))
    out = conv_transpose2d(unsqueeze(input, -2), unsqueeze(weight, -2), bias, one(stride),
                           (0, _pair(padding, 1)[0]), (0, _pair(output_padding, 1)[0]),
                           groups, one(dilation))
    return squeeze(out, -2)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
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
        from ..ops.shape import unsqueeze
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
                              Wm[gi * Cg:(gi + 1) * Cg], dt, tf32)
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
                                    tf32) for gi in range(groups)]
            gx = _store(np.concatenate(parts, 1).reshape(N, H, W, C).transpose(0, 3, 1, 2),
                        dt)
        if wn:
            parts = [_linalg.mm_acc(np.ascontiguousarray(Xm[:, gi * Cg:(gi + 1) * Cg].T),
                                    np.ascontiguousarray(patches[:, gi]), dt, tf32)
                     for gi in range(groups)]
            gw = _store(np.concatenate(parts, 0).reshape(w.shape), dt)
        if b is not None and b.requires_grad:
            gb = _store(g.astype(np.float64).sum(axis=(0, 2, 3)), dt)
        return gx, gw, gb
    out = _result(res, dt, (x, w, b), backward, saved=(x, w), op="convolution")
    if not batched:
        from ..ops.shape import squeeze
        out = squeeze(out, 0)
    return out


def pixel_shuffle(input, upscale_factor):  # noqa: A002
    """(*, C r^2, H, W) -> (*, C, H r, W r): a reshape and a permute (exact)."""
    r = int(upscale_factor)
    x = input
    if x.ndim < 3:
        raise RuntimeError(f"pixel_shuffle expects input to have at least 3 dimensions, but "
                           f"got input with {x.ndim} dimension(s)")
    *lead, c, h, w = x.shape
    if r <= 0 or c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be "
                           f"divisible by the square of upscale_factor, but input.size(-3)={c}"
                           f" is not divisible by {r * r}")
    n = len(lead)
    y = x.reshape(*lead, c // (r * r), r, r, h, w)
    y = y.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return y.reshape(*lead, c // (r * r), h * r, w * r)


def pixel_unshuffle(input, downscale_factor):  # noqa: A002
    """(*, C, H r, W r) -> (*, C r^2, H, W), the inverse of pixel_shuffle."""
    r = int(downscale_factor)
    x = input
    if x.ndim < 3:
        raise RuntimeError(f"pixel_unshuffle expects input to have at least 3 dimensions, but "
                           f"got input with {x.ndim} dimension(s)")
    *lead, c, h, w = x.shape
    if r <= 0 or h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle expects height and width to be divisible by "
                           f"downscale_factor, but got {h} x {w} and {r}")
    n = len(lead)
    y = x.reshape(*lead, c, h // r, r, w // r, r)
    y = y.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return y.reshape(*lead, c * r * r, h // r, w // r)


# ----------------------------------------------------------------- pooling
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    """The maximum over each window (exact; ``_pooling``); with
    ``return_indices`` also each maximum's index in the input row."""
    return _pooling.max_pool("max_pool1d", input, 1, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    """The maximum over each window (exact; ``_pooling``); the gradient goes
    to the window's first maximum (its last NaN)."""
    return _pooling.max_pool("max_pool2d", input, 2, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    """3-D max pooling, as :func:`max_pool2d`."""
    return _pooling.max_pool("max_pool3d", input, 3, kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True):
    """The mean over each window in float64, rounded once (``_pooling``)."""
    return _pooling.avg_pool("avg_pool1d", input, 1, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, None)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    """The mean over each window in float64, rounded once (``_pooling``)."""
    return _pooling.avg_pool("avg_pool2d", input, 2, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True, divisor_override=None):
    """3-D average pooling, as :func:`avg_pool2d`."""
    return _pooling.avg_pool("avg_pool3d", input, 3, kernel_size, stride, padding, ceil_mode,
                             count_include_pad, divisor_override)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None):
    """Each value written at its index of a zero output (``_pooling``)."""
    return _pooling.max_unpool("max_unpool1d", input, indices, 1, kernel_size, stride,
                               padding, output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None):
    """The inverse of :func:`max_pool2d` with ``return_indices``."""
    return _pooling.max_unpool("max_unpool2d", input, indices, 2, kernel_size, stride,
                               padding, output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0,  # noqa: A002
                 output_size=None):
    """The inverse of :func:`max_pool3d` with ``return_indices``."""
    return _pooling.max_unpool("max_unpool3d", input, indices, 3, kernel_size, stride,
                               padding, output_size)


from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.nn.functional (torch.nn.functional)')
