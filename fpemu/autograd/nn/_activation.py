"""The activations and softmax of ``torch.nn.functional`` (the text of
:mod:`fpemu.autograd.nn.functional`)."""

from __future__ import annotations

import warnings

import numpy as np

from ...errors import FpemuRuntimeError, FpemuValueError
from ...formats import Format
from .._autocast import cast_inputs
from .._common import f64, float_dt, wrap_dim
from .._core import Tensor, _result, _store, float32, float64, is_float, to_dtype
from .. import _cpu_math
from .._cpu_reduce import cpu_log_softmax_backward
from .._cuda_reduce import (
    cuda_softmax_backward, cuda_softmax_forward, persistent_softmax_applies,
)
from .._profile import get_profile
from ..ops.elementwise import _unary, mul, neg, relu, sigmoid, where
from ..ops.inplace import apply_inplace


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
        return apply_inplace(x, op)
    return op(x)


def softplus(x, beta=1.0, threshold=20.0):
    (x,) = cast_inputs("softplus", x)

    def fwd(v):
        return np.where(v * beta > threshold, v, np.log1p(np.exp(beta * v)) / beta)

    def bwd(g, v, y):
        return np.where(v * beta > threshold, g, g / (1 + np.exp(-beta * v)))
    if _cpu_exact(x.dtype):
        return _activation("softplus", x, None, bwd,
                           cpu=lambda X: _cpu_math.softplus(X, beta, threshold))
    return _unary("softplus", x, fwd, bwd)


def _activation(name, x, fwd, bwd, inplace=False, autocast=False, cpu=None):
    """An elementwise activation through ``_unary`` (float64, one rounding),
    or written into ``x`` with ``inplace``. ``cpu``: instead of ``fwd``, the
    model of ATen's CPU kernel on the tensor's float32 / float64 values
    (:mod:`.._cpu_math`); the backward stays ``bwd`` in float64."""
    def run(v):
        if cpu is None:
            return _unary(name, v, fwd, bwd, autocast=autocast)
        return _cpu_unary(name, v, cpu, bwd)
    if inplace:
        return apply_inplace(x, run)
    return run(x)


def _cpu_unary(name, x, kernel, bwd):
    """``kernel(x's values)`` as the output; the gradient ``bwd(g, x, y)`` in
    float64, rounded once (as :func:`_unary`)."""
    dt = x.dtype
    with np.errstate(all="ignore"):
        res = kernel(x._data)
    X = x._data

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(bwd(g.astype(np.float64), X.astype(np.float64),
                               res.astype(np.float64)), dt),)
    return _result(res, dt, (x,), backward, saved=(x,), op=name, stored=True)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp(x, min_val, max_val); the gradient passes strictly inside."""
    if min_val > max_val:
        raise FpemuValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val "
                              f"({max_val})")
    return _activation("hardtanh", input, lambda v: np.clip(v, min_val, max_val),
                       lambda g, v, y: np.where((v > min_val) & (v < max_val), g, 0.0),
                       inplace)


def hardtanh_(input, min_val=-1.0, max_val=1.0):
    return hardtanh(input, min_val, max_val, inplace=True)


def relu6(input, inplace=False):
    return hardtanh(input, 0.0, 6.0, inplace)


def _cpu_elu(dt, alpha, scale, input_scale):
    """Under the CPU profile on float32 / float64: ATen's ``elu_kernel``
    (:func:`.._cpu_math.elu`) with these coefficients, else None."""
    if not _cpu_exact(dt):
        return None
    return lambda X: _cpu_math.elu(X, alpha, scale, input_scale)


def elu(input, alpha=1.0, inplace=False):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return _activation("elu", input, lambda v: np.where(v > 0, v, alpha * np.expm1(v)),
                       lambda g, v, y: np.where(v > 0, g, g * alpha * np.exp(v)), inplace,
                       cpu=_cpu_elu(input.dtype, alpha, 1.0, 1.0))


def elu_(input, alpha=1.0):
    return elu(input, alpha, inplace=True)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with the constants of Klambauer et al. (2017)."""
    a, s = _SELU_ALPHA, _SELU_SCALE
    return _activation("selu", input, lambda v: s * np.where(v > 0, v, a * np.expm1(v)),
                       lambda g, v, y: g * s * np.where(v > 0, 1.0, a * np.exp(v)), inplace,
                       cpu=_cpu_elu(input.dtype, a, s, 1.0))


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise FpemuValueError("ZeroDivisionError: alpha cannot be 0 for CELU")
    # ATen's celu is elu(x, alpha, scale 1, input_scale 1 / alpha), the
    # reciprocal taken in double
    return _activation("celu", input,
                       lambda v: np.where(v > 0, v, alpha * np.expm1(v / alpha)),
                       lambda g, v, y: np.where(v > 0, g, g * np.exp(v / alpha)), inplace,
                       cpu=_cpu_elu(input.dtype, alpha, 1.0, 1.0 / float(alpha)))


def mish(input, inplace=False):
    """x * tanh(softplus(x))."""
    def fwd(v):
        return v * np.tanh(np.logaddexp(0.0, v))

    def bwd(g, v, y):
        t = np.tanh(np.logaddexp(0.0, v))
        sig = 1 / (1 + np.exp(-v))
        return g * (t + v * sig * (1 - t * t))
    return _activation("mish", input, fwd, bwd, inplace,
                       cpu=_cpu_math.mish if _cpu_exact(input.dtype) else None)


def logsigmoid(input):
    """log(sigmoid(x)) = -softplus(-x), computed without overflow."""
    return _activation("log_sigmoid", input, lambda v: -np.logaddexp(0.0, -v),
                       lambda g, v, y: g / (1 + np.exp(v)),
                       cpu=_cpu_math.log_sigmoid if _cpu_exact(input.dtype) else None)


def softsign(input):
    return _activation("softsign", input, lambda v: v / (1 + np.abs(v)),
                       lambda g, v, y: g / (1 + np.abs(v)) ** 2)


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6."""
    # the backward multiplies by ATen's one_sixth, 1.0f / 6.0f (float32's, for
    # float64 tensors too)
    if _cpu_exact(input.dtype):
        return _activation("hardsigmoid", input, None, _hardsigmoid_grad, inplace,
                           cpu=_cpu_math.hardsigmoid)
    return _activation("hardsigmoid", input, lambda v: np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                       _hardsigmoid_grad, inplace)


def _hardsigmoid_grad(g, v, y):
    return np.where((v > -3) & (v < 3), g * float(np.float32(1) / np.float32(6)), 0.0)


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6."""
    if _cpu_exact(input.dtype):
        return _activation("hardswish", input, None, _hardswish_grad, inplace,
                           cpu=_cpu_math.hardswish)
    return _activation("hardswish", input, lambda v: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                       _hardswish_grad, inplace)


def _hardswish_grad(g, v, y):
    return np.where(v < -3, 0.0, np.where(v <= 3, g * (2 * v + 3) / 6.0, g))


def tanhshrink(input):
    return _activation("tanhshrink", input, lambda v: v - np.tanh(v),
                       lambda g, v, y: g * np.tanh(v) ** 2)


def prelu(input, weight):
    """x if x > 0 else weight * x, with one learnable slope or one per
    channel (dim 1)."""
    if not isinstance(weight, Tensor):
        raise TypeError(f"prelu(): weight must be a Tensor, got {type(weight).__name__}")
    input, weight = cast_inputs("prelu", input, weight)
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


def glu(input, dim=-1):
    """a * sigmoid(b), the halves of ``input`` along ``dim``."""
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension "
                           f"{wrap_dim(dim, input.ndim)} is size {input.shape[dim]}")
    if _cpu_exact(input.dtype):
        return _cpu_glu(input, wrap_dim(dim, input.ndim))
    a, b = input.chunk(2, dim)
    return mul(a, sigmoid(b))


def _cpu_exact(dt):
    """The CPU profile on a float32 / float64 tensor: the forward follows
    ATen's CPU kernel bit for bit (:mod:`.._cpu_math`)."""
    return get_profile().cpu and (dt is float32 or dt is float64)


def _cpu_glu(x, d):
    """glu as ``glu_kernel`` (Activation.cpp) computes it over the halves'
    strided views (:func:`.._cpu_math.glu`); the backward, ``g * s`` and
    ``g * a * s * (1 - s)`` with ``s = sigmoid(b)``, in float64 rounded once."""
    dt = x.dtype
    M = x.shape[d] // 2
    X = x._data
    lo = tuple(slice(0, M) if k == d else slice(None) for k in range(X.ndim))
    hi = tuple(slice(M, 2 * M) if k == d else slice(None) for k in range(X.ndim))
    with np.errstate(all="ignore"):
        res = _cpu_math.glu(X[lo], X[hi])

    def backward(g):
        A, B = X[lo].astype(np.float64), X[hi].astype(np.float64)
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            s = 1 / (1 + np.exp(-B))
            return (_store(np.concatenate([G * s, G * A * s * (1 - s)], axis=d), dt),)
    return _result(res, dt, (x,), backward, saved=(x,), op="glu")


# ------------------------------------------------------------------- softmax
def _implicit_dim(name, ndim, stacklevel):
    """torch's ``_get_softmax_dim`` (torch/nn/functional.py): without ``dim``,
    softmax warns that the implicit choice is deprecated and takes dim 0 for
    0-, 1- and 3-d inputs, else dim 1. ``stacklevel`` counts from here."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  f"to include dim=X as an argument.", stacklevel=stacklevel)
    return 0 if ndim in (0, 1, 3) else 1


def _dim(dim, ndim):
    d = wrap_dim(dim, ndim)
    return d if ndim else None        # a 0-d tensor: softmax over itself


def _softmax_input(op, x, dim, dtype, stacklevel):
    if dim is None:                   # torch takes the dim before the cast
        dim = _implicit_dim(op, x.ndim, stacklevel + 1)
    if dtype is None:
        (x,) = cast_inputs(op, x)
    else:
        x = to_dtype(x, dtype)
    return x, float_dt(x), _dim(dim, x.ndim), f64(x)


def _cuda_rows(x, dt, d):
    """Under the CUDA profile, when ATen runs the persistent warp softmax
    (PersistentSoftmax.cuh; ``_cuda_reduce``): the shape of its rows, else None.
    float64 and softmaxes along an inner dim or over more than 1024 elements
    (cunn_SoftMaxForward, cunn_SpatialSoftMaxForward) stay float64 rounded once."""
    if get_profile().device != "cuda" or dt is float64 or d is None or x._data.size == 0:
        return None
    n = x.shape[d]
    inner = int(np.prod(x.shape[d + 1:], dtype=np.int64))
    itemsize = 4 if dt.name == "fp32" else (dt.bits + 7) // 8
    if not persistent_softmax_applies(n, inner, itemsize):
        return None
    return (x._data.size // n, n)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x - max) / sum, in float64, rounded once. Autocast: fp32 output.

    Under the CPU profile float32 and float64 follow ATen's CPU kernels bit
    for bit (:func:`.._cpu_math.softmax`); a bfloat16 / float16 input follows ATen's CPU
    kernels (bit for bit on torch 2.13 CPU): the exponentials and their sum
    in float32, along the last dim ``e * (1 / sum)``, along another dim as
    :func:`_cpu_softmax_inner` says. The backward reads the stored output:
    ``y * (g - sum(g * y))``."""
    return _softmax_op("softmax", input, dim, dtype, _stacklevel)


def _softmax_op(op, input, dim, dtype, stacklevel):
    """softmax or log_softmax (``op``): the input cast, the CUDA profile's
    persistent warp kernel where ATen runs it (:func:`_cuda_rows`), else the
    CPU kernels or the float64 values rounded once; the backward reads the
    stored output."""
    log = op == "log_softmax"
    x, dt, d, X = _softmax_input(op, input, dim, dtype, stacklevel + 1)
    rows = _cuda_rows(x, dt, d)
    if rows is not None:
        return _cuda_softmax(x, dt, rows, log)
    with np.errstate(all="ignore"):
        if _cpu_exact(dt):
            Y = (_cpu_math.log_softmax if log else _cpu_math.softmax)(
                x._data, 0 if d is None else d)
        else:
            Y = (_log_softmax_values if log else _softmax_values)(x, dt, d, X)
    res = _store(Y, dt)
    grad = _log_softmax_grad if log else _softmax_grad
    return _result(res, dt, (x,), lambda g: grad(g, x, dt, d, res), saved=("out",), op=op)


def _softmax_grad(g, x, dt, d, res):
    """softmax's backward from its stored output ``res``: ``y * (g - sum(g * y))``."""
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


def _softmax_values(x, dt, d, X):
    """softmax's values in float64 (``X``: the input in float64), except
    that under the CPU profile a 16-bit tensor keeps the exponentials and
    their sum in float32 as ATen's CPU kernels do."""
    e = np.exp(X - X.max(axis=d, keepdims=True, initial=-np.inf))
    if get_profile().cpu and isinstance(dt, Format) and dt.bits == 16 and d is not None:
        e32 = e.astype(np.float32)
        if d == x.ndim - 1:
            s32 = e32.astype(np.float64).sum(axis=d, keepdims=True).astype(np.float32)
            return e32 * (np.float32(1) / s32)
        return _cpu_softmax_inner(e32, d, dt)
    return e / e.sum(axis=d, keepdims=True)


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x)."""
    if dim is None:
        dim = _implicit_dim("softmin", input.ndim, _stacklevel)
    return softmax(neg(input), dim, dtype=dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """x - max - log(sum(exp(x - max))), in float64, rounded once.
    Autocast: fp32 output.

    Under the CPU profile float32 and float64 follow ATen's CPU kernels bit
    for bit (:func:`.._cpu_math.log_softmax`).

    Under the CPU profile a bfloat16 / float16 input follows ATen's CPU
    kernels (bit for bit on torch 2.13 CPU): along the last dim the sum of
    exponentials and its logarithm are kept in the tensor's dtype before the
    subtraction; along another dim everything is float32, the sum in index
    order. The backward reads the stored output: ``g - exp(y) * sum(g)``."""
    return _softmax_op("log_softmax", input, dim, dtype, _stacklevel)


def _log_softmax_grad(g, x, dt, d, res):
    """log_softmax's backward from its stored output ``res``: ``g - exp(y) * sum(g)``."""
    om = np.float64 if dt is float64 else np.float32
    if _cpu_exact(dt) and (d is None or d == x.ndim - 1 or x.ndim == 0):
        # torch CPU's kernel along the last dim: the gradient's lane sum,
        # then g - exp(y) * sum as one FMA (_cpu_reduce)
        return (cpu_log_softmax_backward(_store(g, dt).astype(om), res.astype(om),
                                         get_profile().cpu_capability),)
    G = g.astype(np.float64)
    with np.errstate(all="ignore"):
        S = G.sum(axis=d, keepdims=True).astype(om).astype(np.float64)
        E = np.exp(res.astype(np.float64)).astype(om).astype(np.float64)
        return (_store(G - E * S, dt),)


def _log_softmax_values(x, dt, d, X):
    """log_softmax's values in float64 (``X``: the input in float64), except
    for a 16-bit tensor under the CPU profile (see :func:`log_softmax`)."""
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
    return Y


def _cuda_softmax(x, dt, rows, log):
    """softmax / log_softmax by PersistentSoftmax.cuh's kernels (forward: max,
    the lanes' sums of expf(x - max), the butterfly, ``e / sum`` or ``x - max -
    logf(sum)``; backward: SoftMax.cu's ``tmp = grad * output`` in the dtype for
    softmax, the sum of it (or of grad for log_softmax) in the same order, then
    ``fma(-y, sum, tmp)`` / ``fma(-expf(y), sum, grad)``), rounded to the dtype."""
    shape = x.shape
    with np.errstate(all="ignore"):
        res = _store(cuda_softmax_forward(x._data.reshape(rows), log).reshape(shape), dt)

    def backward(g):
        Yo = res.reshape(rows)
        with np.errstate(all="ignore"):
            G = _store(g, dt).reshape(rows)
            T = G if log else _store(G.astype(np.float64) * Yo, dt)
            return (_store(cuda_softmax_backward(T, Yo, log).reshape(shape), dt),)
    return _result(res, dt, (x,), backward, saved=("out",),
                   op="log_softmax" if log else "softmax")


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
    vector = _cpu_math._softmax_vector_positions(outer, inner, shape[d], prof.cpu_lanes(2),
                                                 prof.cpu_threads)
    Y = np.where(vector.reshape(outer, 1, inner), E / S, _store(E, dt) / S)
    return Y.reshape(shape)


def _cpu_reduced_lastdim(dt, d, ndim):
    """True for ATen's CPU softmax kernels on a 16-bit float along the last dim."""
    return (get_profile().cpu and isinstance(dt, Format) and dt.bits == 16
            and d is not None and d == ndim - 1)


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["celu", "elu", "elu_", "glu", "hardsigmoid", "hardswish", "hardtanh", "hardtanh_",
           "leaky_relu", "log_softmax", "logsigmoid", "mish", "prelu", "relu6", "relu_",
           "selu", "softmax", "softmin", "softplus", "softsign", "tanhshrink"]
