"""The differentiable ops, forward and backward side by side.

How each op computes (``numerics-pytorch.md`` §3.2, §5):

* inputs are widened exactly to opmath (float32; float64 for float64);
* ``+ - * /`` and ``sqrt`` are IEEE float32 operations (numpy's), so the
  float32 result is correctly rounded; ``add(a, b, alpha)`` with alpha != 1
  is the exact ``fma(alpha, b, a)`` nvcc contracts it to;
* a Python number is converted once to float32 (CUDA's wrapped scalars);
  ``tensor / number`` multiplies by the float32 reciprocal, as CUDA's
  ``div_true`` kernel does;
* exp, log, tanh, gelu, softmax, log_softmax, layer_norm, rms_norm, the
  losses and the reductions compute in float64 and round to float32: CUDA's
  own versions (libdevice transcendentals, tree reductions) are within a few
  float32 ulp of that but not bit-defined (tier 2, ``design.md``);
* the float32 result is rounded once to the output dtype (RNE, the format's
  PyTorch overflow rule);
* matmul runs through :mod:`fpemu.accumulate` with an fp32 accumulator (model
  ``"sequential"`` by default: see :func:`set_matmul_model`) and rounds the
  accumulator once to the output dtype; ``linear`` adds its bias to the fp32
  accumulator first.

Backward formulas compute in the same way and round into the dtype of the
op's output; the engine then casts each gradient to its input's dtype (the
backward of a cast is a cast back).
"""

from __future__ import annotations

import contextlib

import numpy as np

from .. import accumulate as _acc
from ..arith import fma as _fma_exact
from ._autocast import cast_inputs
from ._profile import get_profile
from ._core import (
    Tensor, _State, _result, _store, _sum_to, as_dtype, bool_, float32, float64, int64,
    is_float, np_dtype, opmath, result_type,
)
from ..formats import Format
from ._special import erf as _erf

_SQRT1_2 = 0.7071067811865476
_SQRT_2_PI = 0.7978845608028654


class _Config:
    matmul_model = "sequential"
    matmul_block = 128
    matmul_inner = "sequential"


def set_matmul_model(model="sequential", block=128, inner="sequential"):
    """Choose the accumulation model of every matmul / linear (a name of
    :data:`fpemu.accumulate.MODELS` or a tensor-core preset such as "h100")."""
    _acc._resolve_model(model, "set_matmul_model")
    _Config.matmul_model, _Config.matmul_block, _Config.matmul_inner = model, block, inner


@contextlib.contextmanager
def matmul_model(model, block=128, inner="sequential"):
    """``with matmul_model("h100"):`` runs the region's matmuls under a model."""
    old = (_Config.matmul_model, _Config.matmul_block, _Config.matmul_inner)
    set_matmul_model(model, block, inner)
    try:
        yield
    finally:
        _Config.matmul_model, _Config.matmul_block, _Config.matmul_inner = old


# -------------------------------------------------------------------- helpers
def _t(x, what):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number)):
        return x
    raise TypeError(f"{what}: expected a Tensor or a Python number, got {type(x).__name__}")


def _operand(x, dt):
    om = opmath(dt)
    if isinstance(x, Tensor):
        return x._a.astype(om, copy=False)
    return om(x)


def _fma(a, b, c, dt):
    """fma(a, b, c) in opmath: exact then one rounding for float32."""
    if opmath(dt) is np.float64:
        return a * b + c
    return np.asarray(_fma_exact(a, b, c, "fp32"), np.float32)


def _f64(x):
    return x._a.astype(np.float64)


def _float_dt(*xs):
    dt = result_type(*xs)
    return dt if is_float(dt) else float32


def _shape_of(x):
    return x.shape if isinstance(x, Tensor) else ()


def _grad_part(g, x, dt):
    if not isinstance(x, Tensor):
        return None
    return _sum_to(g, x.shape, dt)


def _int_binary(npop, a, b, dt):
    A = a._a if isinstance(a, Tensor) else a
    B = b._a if isinstance(b, Tensor) else b
    return Tensor(np.asarray(npop(A, B)).astype(dt.np_dtype), dt)


# ------------------------------------------------------------------ arithmetic
def _cpu_rounds_scalars(dt):
    """True under the CPU profile for 16-bit (and smaller) float dtypes."""
    return get_profile().cpu and isinstance(dt, Format) and dt.bits < 32


def _add_alpha(A, B, alpha_o, dt):
    """``a + alpha*b`` (alpha != 1) rounded to ``dt``: the exact fma on CUDA.
    Under the CPU profile a 16-bit dtype's alpha is already rounded to it, and
    the tail after the last full vector computes ``L(a + L(alpha*b))``."""
    out = _store(_fma(alpha_o, B, A, dt), dt)
    if _cpu_rounds_scalars(dt) and out.size:
        lanes = get_profile().cpu_binary_body((dt.bits + 7) // 8)
        start = (out.size // lanes) * lanes
        if start < out.size:
            Af = np.broadcast_to(A, out.shape).reshape(-1)[start:]
            Bf = np.broadcast_to(B, out.shape).reshape(-1)[start:]
            flat = out.reshape(-1)
            flat[start:] = _store(Af + _store(alpha_o * Bf, dt), dt)
            out = flat.reshape(out.shape)
    return out


def add(a, b, alpha=1):
    """a + alpha * b (alpha != 1: the exact fma nvcc makes of it)."""
    a, b = _t(a, "add()"), _t(b, "add()")
    dt = result_type(a, b)
    if not is_float(dt):
        return _int_binary(lambda x, y: x + alpha * y, a, b, dt)
    A, B = _operand(a, dt), _operand(b, dt)
    alpha_o = opmath(dt)(alpha)
    if _cpu_rounds_scalars(dt):
        # CPU ufuncs take alpha and a Python number as the tensor's dtype (§3.8)
        A = A if isinstance(a, Tensor) else _store(A, dt)[()]
        B = B if isinstance(b, Tensor) else _store(B, dt)[()]
        alpha_o = _store(alpha_o, dt)[()]
    with np.errstate(all="ignore"):
        out = _store(A + B, dt) if alpha == 1 else _add_alpha(A, B, alpha_o, dt)

    def backward(g):
        gb = g if alpha == 1 else _store(g.astype(opmath(dt)) * alpha_o, dt)
        return _grad_part(g, a, dt), _grad_part(gb, b, dt)
    return _result(out, dt, (a, b), backward)


def sub(a, b, alpha=1):
    return add(a, neg(b) if isinstance(b, Tensor) else -b, alpha)


def neg(a):
    out = -a._a

    def backward(g):
        return (-g,)
    return _result(out, a.dtype, (a,), backward)


def mul(a, b):
    a, b = _t(a, "mul()"), _t(b, "mul()")
    dt = result_type(a, b)
    if not is_float(dt):
        return _int_binary(np.multiply, a, b, dt)
    A, B = _operand(a, dt), _operand(b, dt)
    with np.errstate(all="ignore"):
        out = _store(A * B, dt)

    def backward(g):
        G = g.astype(opmath(dt))
        with np.errstate(all="ignore"):
            return (_grad_part(_store(G * B, dt), a, dt) if isinstance(a, Tensor) else None,
                    _grad_part(_store(G * A, dt), b, dt) if isinstance(b, Tensor) else None)
    return _result(out, dt, (a, b), backward)


def div(a, b):
    """True division; on CUDA a tensor divided by a number multiplies by the
    float32 reciprocal of the number (div_true with a scalar); the CPU profile
    divides."""
    a, b = _t(a, "div()"), _t(b, "div()")
    dt = _float_dt(a, b)
    om = opmath(dt)
    A, B = _operand(a, dt), _operand(b, dt)
    with np.errstate(all="ignore"):
        if isinstance(b, Tensor) or get_profile().cpu:
            inv = None
            out = _store(A / B, dt)
        else:
            inv = om(1) / B
            out = _store(A * inv, dt)

    def backward(g):
        G = g.astype(om)
        with np.errstate(all="ignore"):
            ga = gb = None
            if isinstance(a, Tensor):
                ga = _grad_part(_store(G / B if inv is None else G * inv, dt), a, dt)
            if isinstance(b, Tensor):
                gb = _grad_part(_store(-(G * (A / B)) / B, dt), b, dt)
            return ga, gb
    return _result(out, dt, (a, b), backward)


def rdiv(a, s):
    """``s / a`` for a Python number s: ``reciprocal(a) * s`` (two roundings, as
    torch's ``Tensor.__rdiv__``)."""
    return mul(reciprocal(a), s)


def reciprocal(a):
    dt = _float_dt(a)
    A = _operand(a, dt)
    with np.errstate(all="ignore"):
        out = _store(opmath(dt)(1) / A, dt)

    def backward(g):
        O = out.astype(opmath(dt))
        with np.errstate(all="ignore"):
            return (_store(-(g.astype(opmath(dt)) * O) * O, dt),)
    return _result(out, dt, (a,), backward)


def pow(a, exponent):  # noqa: A001 - torch's name
    """a ** exponent; exponents 2, 3, 0.5, -0.5, -1, -2 take the special
    forms of CUDA's pow kernel (``x*x``, ``sqrt``, ...), others ``powf``."""
    a = _t(a, "pow()")
    if not isinstance(a, Tensor):
        return _pow_scalar_base(a, exponent)
    (a, exponent) = cast_inputs("pow", a, exponent)
    dt = _float_dt(a, exponent)
    om = opmath(dt)
    A = _operand(a, dt)
    with np.errstate(all="ignore"):
        if isinstance(exponent, Tensor):
            E = _operand(exponent, dt)
            R = _store(np.power(A.astype(np.float64), E.astype(np.float64)), dt)
        else:
            e = float(exponent)
            special = {2.0: lambda x: x * x, 3.0: lambda x: x * x * x,
                       0.5: np.sqrt, -0.5: lambda x: om(1) / np.sqrt(x),
                       -1.0: lambda x: om(1) / x, -2.0: lambda x: om(1) / (x * x),
                       1.0: lambda x: x}
            if e in special:
                R = _store(special[e](A), dt)
            else:
                R = _store(np.power(A.astype(np.float64), e), dt)

    def backward(g):
        G = g.astype(np.float64)
        X = A.astype(np.float64)
        with np.errstate(all="ignore"):
            if isinstance(exponent, Tensor):
                Ev = E.astype(np.float64)
                ga = G * Ev * np.power(X, Ev - 1)
                gb = G * R.astype(np.float64) * np.log(X)
                return (_grad_part(_store(ga, dt), a, dt), _grad_part(_store(gb, dt), exponent,
                                                                      dt))
            ga = G * e * np.power(X, e - 1) if e != 0 else np.zeros_like(X)
            return (_store(ga, dt), None)
    return _result(R, dt, (a, exponent), backward)


def _pow_scalar_base(s, exponent):
    return exp(mul(exponent, float(np.log(s))))


# ------------------------------------------------------------------ elementwise
def _unary(op, x, fwd, bwd, autocast=False):
    """y = fwd(x) and dx = bwd(g, x, y), both in float64, each rounded once to
    float32 and then to the dtype."""
    if autocast:
        (x,) = cast_inputs(op, x)
    dt = _float_dt(x)
    X = _f64(x)
    with np.errstate(all="ignore"):
        out = _store(fwd(X), dt)

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(bwd(g.astype(np.float64), X, out.astype(np.float64)), dt),)
    return _result(out, dt, (x,), backward)


def exp(x):
    return _unary("exp", x, np.exp, lambda g, x, y: g * y, autocast=True)


def log(x):
    return _unary("log", x, np.log, lambda g, x, y: g / x, autocast=True)


def sqrt(x):
    """IEEE square root in opmath; backward ``g / (2 * y)``."""
    dt = _float_dt(x)
    with np.errstate(all="ignore"):
        out = _store(np.sqrt(_operand(x, dt)), dt)

    def backward(g):
        om = opmath(dt)
        with np.errstate(all="ignore"):
            return (_store(g.astype(om) / (om(2) * out.astype(om)), dt),)
    return _result(out, dt, (x,), backward)


def tanh(x):
    return _unary("tanh", x, np.tanh, lambda g, x, y: g * (1 - y * y))


def sigmoid(x):
    return _unary("sigmoid", x, lambda v: 1 / (1 + np.exp(-v)), lambda g, x, y: g * y * (1 - y))


def relu(x):
    """max(x, 0), exact; the gradient passes where the output is > 0."""
    dt = x.dtype
    out = np.where(x._a > 0, x._a, np.zeros((), x._a.dtype)).astype(x._a.dtype)

    def backward(g):
        return (np.where(out > 0, g, np.zeros((), g.dtype)),)
    return _result(out, dt, (x,), backward)


def gelu(x, approximate="none"):
    """x * Phi(x) (erf form), or the tanh approximation."""
    if approximate == "none":
        def fwd(v):
            return 0.5 * v * (1 + _erf(v * _SQRT1_2))

        def bwd(g, v, y):
            cdf = 0.5 * (1 + _erf(v * _SQRT1_2))
            return g * (cdf + v * np.exp(-0.5 * v * v) * 0.3989422804014327)
    elif approximate == "tanh":
        def fwd(v):
            return 0.5 * v * (1 + np.tanh(_SQRT_2_PI * (v + 0.044715 * v ** 3)))

        def bwd(g, v, y):
            inner = _SQRT_2_PI * (v + 0.044715 * v ** 3)
            t = np.tanh(inner)
            d_inner = _SQRT_2_PI * (1 + 3 * 0.044715 * v * v)
            return g * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * d_inner)
    else:
        raise ValueError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu", x, fwd, bwd)


def to_dtype(x, dtype):
    """Cast (RNE, the target's overflow rule); the backward casts back."""
    dtype = as_dtype(dtype, "to()")
    if dtype == x.dtype:
        return x
    if is_float(dtype):
        with np.errstate(over="ignore", invalid="ignore"):
            out = _store(x._a, dtype)
    else:
        if is_float(x.dtype) and not np.all(np.isfinite(x._a)):
            raise ValueError(f"to({dtype}): the tensor holds inf or NaN, which have no "
                             f"integer value")
        out = np.trunc(x._a).astype(dtype.np_dtype) if dtype is not bool_ else x._a != 0
        return Tensor(out, dtype)

    def backward(g):
        return (g,)
    return _result(out, dtype, (x,), backward)


# -------------------------------------------------------------------- reductions
def wrap_dim(dim, ndim):
    """A dim in ``[-ndim, ndim)`` as an index, as torch's ``maybe_wrap_dim``: a
    0-d tensor takes -1 and 0. Out of range is torch's IndexError."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"dim must be an int, got {type(dim).__name__} ({dim!r})")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return int(dim) % n


def _axes(dim, ndim):
    """The numpy axes of a reduction over ``dim`` (None or () for all);
    a 0-d tensor reduces over nothing."""
    if dim is None:
        return tuple(range(ndim))
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    axes = [wrap_dim(d, ndim) for d in dims]
    for a in set(axes):
        if axes.count(a) > 1:
            raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(axes)) if ndim else ()


def _expand_back(g, axes, keepdim, shape):
    if not keepdim:
        for ax in axes:
            g = np.expand_dims(g, ax)
    return np.broadcast_to(g, shape)


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001 - torch's name
    """Sum with a float64 accumulator, rounded once to the output dtype.
    Under autocast the op runs with dtype=float32 (fp32 output)."""
    if dtype is None:
        (x,) = cast_inputs("sum", x)
    else:
        x = to_dtype(x, dtype)
    dt = x.dtype if is_float(x.dtype) else int64
    axes = _axes(dim, x.ndim)
    if not is_float(dt):
        return Tensor(np.sum(x._a, axis=axes, keepdims=keepdim).astype(np.int64), int64)
    out = _store(np.sum(_f64(x), axis=axes, keepdims=keepdim), dt)

    def backward(g):
        return (_expand_back(g, axes, keepdim, x.shape),)
    return _result(out, dt, (x,), backward)


def mean(x, dim=None, keepdim=False, dtype=None):
    """Mean with a float64 accumulator (not in the autocast lists: a bf16
    input gives a bf16 output)."""
    if dtype is not None:
        x = to_dtype(x, dtype)
    if not is_float(x.dtype):
        raise RuntimeError(f"mean(): needs a floating-point tensor, got {x.dtype}; use "
                           f".float() first or pass dtype=")
    dt = x.dtype
    axes = _axes(dim, x.ndim)
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    with np.errstate(all="ignore"):
        out = _store(np.sum(_f64(x), axis=axes, keepdims=keepdim) / n, dt)

    def backward(g):
        return (_expand_back(_store(g.astype(np.float64) / n, dt), axes, keepdim, x.shape),)
    return _result(out, dt, (x,), backward)


def amax(x, dim=None, keepdim=False):
    axes = _axes(dim, x.ndim)
    out = np.max(x._a, axis=axes, keepdims=keepdim)

    def backward(g):
        full = np.max(x._a, axis=axes, keepdims=True)
        hit = (x._a == full)
        count = hit.sum(axis=axes, keepdims=True)
        G = _expand_back(g, axes, keepdim, x.shape).astype(np.float64)
        return (_store(np.where(hit, G / count, 0.0), x.dtype),)
    return _result(np.asarray(out), x.dtype, (x,), backward)


def argmax(x, dim=None, keepdim=False):
    if dim is None:
        return Tensor(np.asarray(np.argmax(x._a)), int64)
    return Tensor(np.argmax(x._a, axis=dim, keepdims=keepdim).astype(np.int64), int64)


# ---------------------------------------------------------------------- matmul
def _mm2_acc(A, B, dt):
    """fp32 accumulator of A @ B (2-D, values of dt) under the configured model."""
    if dt is float64:
        return A.astype(np.float64) @ B.astype(np.float64)
    return _acc._matmul_values(A, B, dt, "fp32", "fp32", _Config.matmul_model,
                               _Config.matmul_block, _Config.matmul_inner)


def _mm_acc(A, B, dt):
    """Batched A @ B with numpy's broadcasting, both at least 2-D."""
    if A.ndim == 2 and B.ndim == 2:
        return _mm2_acc(A, B, dt)
    if B.ndim == 2:
        lead = A.shape[:-1]
        return _mm2_acc(A.reshape(-1, A.shape[-1]), B, dt).reshape(lead + (B.shape[1],))
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = np.broadcast_to(A, batch + A.shape[-2:])
    B = np.broadcast_to(B, batch + B.shape[-2:])
    out = np.empty(batch + (A.shape[-2], B.shape[-1]), np.float64 if dt is float64
                   else np.float32)
    for idx in np.ndindex(*batch):
        out[idx] = _mm2_acc(A[idx], B[idx], dt)
    return out


def matmul(a, b):
    """a @ b: fp32 accumulation under the configured model, one rounding to
    the output dtype. Autocast: ``lower`` (bf16/fp16 inputs and output)."""
    a, b = cast_inputs("matmul", a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError("matmul(): both arguments need at least one dimension")
    if a.ndim == 1:
        return matmul(a.reshape(1, -1), b).reshape(b.shape[:-2] + b.shape[-1:])
    if b.ndim == 1:
        return matmul(a, b.reshape(-1, 1)).reshape(a.shape[:-1])
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"matmul(): shapes {a.shape} and {b.shape} cannot be multiplied "
                           f"({a.shape[-1]} != {b.shape[-2]})")
    _same_mm_dtype(a.dtype, b.dtype)
    dt = result_type(a, b)
    if not is_float(dt):
        return Tensor(a._a @ b._a, dt)
    _check_mm_dtype(dt)
    A, B = _operand(a, dt), _operand(b, dt)
    out = _store(_mm_acc(A, B, dt), dt)

    def backward(g):
        ga = gb = None
        if a.requires_grad:
            ga = _sum_to(_store(_mm_acc(g, np.swapaxes(B, -1, -2), dt), dt), a.shape, dt)
        if b.requires_grad:
            if b.ndim == 2 and a.ndim > 2:
                gb = _store(_mm2_acc(A.reshape(-1, A.shape[-1]).T,
                                     g.reshape(-1, g.shape[-1]), dt), dt)
            else:
                gb = _sum_to(_store(_mm_acc(np.swapaxes(A, -1, -2), g, dt), dt), b.shape, dt)
        return ga, gb
    return _result(out, dt, (a, b), backward)


_C10_NAMES = {"fp32": "float", "float64": "double", "bf16": "c10::BFloat16", "fp16": "c10::Half",
              "int64": "long int", "int32": "int", "bool": "bool"}


def _c10_name(dt):
    """The dtype as ATen's error messages spell it (``c10::BFloat16``)."""
    name = getattr(dt, "name", str(dt))
    if name in _C10_NAMES:
        return _C10_NAMES[name]
    long = getattr(dt, "long_name", None) or name
    return "c10::" + long[0].upper() + long[1:].replace("float8", "Float8")


def _scalar_type(dt):
    """The dtype as ATen's ScalarType names it (``BFloat16``, ``Float``)."""
    c10 = _c10_name(dt).replace("c10::", "")
    return {"float": "Float", "double": "Double", "long int": "Long", "int": "Int",
            "bool": "Bool"}.get(c10, c10)


def _same_mm_dtype(da, db):
    """torch's matmul does not promote: outside autocast, mixed dtypes raise."""
    if da is not db:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{_c10_name(da)} != {_c10_name(db)}")


def _check_mm_dtype(dt):
    if dt is not float64 and dt.bits <= 8:
        raise TypeError(f"matmul of {dt} tensors: PyTorch has no plain fp8 matmul; use "
                        f"fpemu.autograd.fp8.fp8_autocast with nn.Linear for scaled fp8 GEMMs")


def linear(x, weight, bias=None):
    """x @ weight.T + bias; the bias is added to the fp32 accumulator before
    the one rounding to the output dtype (cuBLASLt's bias epilogue)."""
    x, weight, bias = cast_inputs("linear", x, weight, bias)
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"linear(): input of shape {x.shape} and weight of shape "
                           f"{weight.shape} do not fit (need input[..., {weight.shape[-1]}])")
    _same_mm_dtype(x.dtype, weight.dtype)
    if bias is not None and bias.dtype is not x.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got "
                           f"{_scalar_type(bias.dtype)} and {_scalar_type(x.dtype)}")
    dt = result_type(x, weight) if bias is None else result_type(x, weight, bias)
    _check_mm_dtype(dt)
    X = _operand(x, dt).reshape(-1, x.shape[-1])
    W = _operand(weight, dt)
    acc = _mm2_acc(X, W.T, dt)
    if bias is not None:
        acc = acc + _operand(bias, dt)
    out = _store(acc, dt).reshape(x.shape[:-1] + (W.shape[0],))

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = gw = gb = None
        if x.requires_grad:
            gx = _store(_mm2_acc(g2, W, dt), dt).reshape(x.shape)
        if weight.requires_grad:
            gw = _store(_mm2_acc(np.ascontiguousarray(g2.T), X, dt), dt)
        if bias is not None and bias.requires_grad:
            gb = _store(g2.astype(np.float64).sum(axis=0), dt)
        return gx, gw, gb
    return _result(out, dt, (x, weight, bias), backward)


# ----------------------------------------------------------------------- shapes
def reshape(x, *shape):
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
        else shape
    out = x._a.reshape(shape)

    def backward(g):
        return (g.reshape(x.shape),)
    return _result(out, x.dtype, (x,), backward)


def transpose(x, dim0, dim1):
    out = np.swapaxes(x._a, dim0, dim1)

    def backward(g):
        return (np.swapaxes(g, dim0, dim1),)
    return _result(out, x.dtype, (x,), backward)


def permute(x, *dims):
    dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    out = np.transpose(x._a, dims)
    inv = np.argsort(dims)

    def backward(g):
        return (np.transpose(g, inv),)
    return _result(out, x.dtype, (x,), backward)


def _index(idx):
    if isinstance(idx, Tensor):
        return idx._a
    if isinstance(idx, tuple):
        return tuple(_index(i) for i in idx)
    return idx


def getitem(x, idx):
    idx = _index(idx)
    out = np.array(x._a[idx], copy=True)

    def backward(g):
        G = np.zeros(x.shape, np.float64)
        np.add.at(G, idx, g.astype(np.float64))
        return (_store(G, x.dtype),)
    return _result(out, x.dtype, (x,), backward)


def cat(tensors, dim=0):
    """Concatenate along ``dim`` (type promotion across the inputs)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat(): expected a non-empty list of tensors")
    dt = result_type(*tensors)
    parts = [_store(t._a, dt) if t.dtype != dt else t._a for t in tensors]
    out = np.concatenate(parts, axis=dim)
    bounds = np.cumsum([t.shape[dim] for t in tensors])[:-1]

    def backward(g):
        return tuple(np.split(g, bounds, axis=dim))
    return _result(out, dt, tuple(tensors), backward)


def stack(tensors, dim=0):
    tensors = list(tensors)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def unsqueeze(x, dim):
    return reshape(x, np.expand_dims(x._a, dim).shape)


def squeeze(x, dim=None):
    return reshape(x, np.squeeze(x._a, axis=dim).shape)


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        wrap_dim(start_dim, 0), wrap_dim(end_dim, 0)
        return reshape(x, (1,))
    s, e = wrap_dim(start_dim, x.ndim), wrap_dim(end_dim, x.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    shape = x.shape[:s] + (int(np.prod(x.shape[s:e + 1])),) + x.shape[e + 1:]
    return reshape(x, shape)


def where(cond, a, b):
    cond = cond._a.astype(bool) if isinstance(cond, Tensor) else np.asarray(cond, bool)
    dt = result_type(a, b)
    A, B = _operand(a, dt), _operand(b, dt)
    out = _store(np.where(cond, A, B), dt)

    def backward(g):
        z = np.zeros((), g.dtype)
        return (_grad_part(np.where(cond, g, z), a, dt), _grad_part(np.where(cond, z, g), b, dt))
    return _result(out, dt, (a, b), backward)


def masked_fill(x, mask, value):
    """x with ``value`` (rounded to x's dtype) where mask is true."""
    m = mask._a.astype(bool) if isinstance(mask, Tensor) else np.asarray(mask, bool)
    fill = _store(np.float32(value), x.dtype) if is_float(x.dtype) else value
    out = np.where(m, fill, x._a).astype(x._a.dtype)

    def backward(g):
        return (np.where(m, np.zeros((), g.dtype), g),)
    return _result(out, x.dtype, (x,), backward)


def clone(x):
    def backward(g):
        return (g,)
    return _result(x._a.copy(), x.dtype, (x,), backward)


# ------------------------------------------------------------- comparisons
def _compare(npop):
    def op(a, b):
        A = a._a if isinstance(a, Tensor) else a
        B = b._a if isinstance(b, Tensor) else b
        return Tensor(np.asarray(npop(A, B)), bool_)
    return op


eq, ne, lt, le, gt, ge = (_compare(f) for f in (np.equal, np.not_equal, np.less,
                                                   np.less_equal, np.greater,
                                                   np.greater_equal))


# --------------------------------------------------------- softmax and norms
def _dim(dim, ndim):
    if dim is None:
        raise TypeError("softmax(): pass dim= explicitly (the implicit choice is deprecated "
                        "in PyTorch)")
    d = wrap_dim(dim, ndim)
    return d if ndim else None        # a 0-d tensor: softmax over itself


def _softmax_input(op, x, dim, dtype):
    """The input as softmax / log_softmax read it (autocast, or ``dtype=``),
    its output dtype, the reduced dim and the values in float64."""
    if dtype is None:
        (x,) = cast_inputs(op, x)
    else:
        x = to_dtype(x, dtype)
    return x, _float_dt(x), _dim(dim, x.ndim), _f64(x)


def softmax(x, dim=None, dtype=None):
    """exp(x - max) / sum, in float64, rounded once. Autocast: fp32 output."""
    x, dt, d, X = _softmax_input("softmax", x, dim, dtype)
    with np.errstate(all="ignore"):
        e = np.exp(X - X.max(axis=d, keepdims=True))
        Y = e / e.sum(axis=d, keepdims=True)
    out = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            return (_store(Y * (G - (G * Y).sum(axis=d, keepdims=True)), dt),)
    return _result(out, dt, (x,), backward)


def log_softmax(x, dim=None, dtype=None):
    """x - max - log(sum(exp(x - max))), in float64. Autocast: fp32 output."""
    x, dt, d, X = _softmax_input("log_softmax", x, dim, dtype)
    with np.errstate(all="ignore"):
        shifted = X - X.max(axis=d, keepdims=True)
        Y = shifted - np.log(np.exp(shifted).sum(axis=d, keepdims=True))
    out = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        with np.errstate(all="ignore"):
            return (_store(G - np.exp(Y) * G.sum(axis=d, keepdims=True), dt),)
    return _result(out, dt, (x,), backward)


def _norm_axes(x, normalized_shape):
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.ndim - len(ns):]) != ns:
        raise RuntimeError(f"normalized_shape {ns} does not match the last dimensions of an "
                           f"input of shape {x.shape}")
    return tuple(range(x.ndim - len(ns), x.ndim)), ns


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dims, in
    float64. Autocast: fp32 (input, weight and bias cast, fp32 output)."""
    x, weight, bias = cast_inputs("layer_norm", x, weight, bias)
    axes, ns = _norm_axes(x, normalized_shape)
    dt = _float_dt(x)
    X = _f64(x)
    mu = X.mean(axis=axes, keepdims=True)
    xc = X - mu
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + eps)
    xhat = xc * rstd
    Wv = _f64(weight) if weight is not None else 1.0
    Y = xhat * Wv + (_f64(bias) if bias is not None else 0.0)
    out = _store(Y, dt)

    def backward(g):
        G = g.astype(np.float64)
        lead = tuple(range(x.ndim - len(ns)))
        gw = _store((G * xhat).sum(axis=lead), weight.dtype) if weight is not None else None
        gb = _store(G.sum(axis=lead), bias.dtype) if bias is not None else None
        gh = G * Wv
        gx = rstd * (gh - gh.mean(axis=axes, keepdims=True)
                     - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        return _store(gx, dt), gw, gb
    return _result(out, dt, (x, weight, bias), backward)


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight, in float64; eps None is the
    machine epsilon of x's dtype (torch's default). Autocast: fp32."""
    x, weight = cast_inputs("rms_norm", x, weight)
    axes, ns = _norm_axes(x, normalized_shape)
    dt = _float_dt(x)
    if eps is None:
        eps = float(np.finfo(np.float64).eps) if dt is float64 else dt.eps
    X = _f64(x)
    rstd = 1.0 / np.sqrt((X * X).mean(axis=axes, keepdims=True) + eps)
    xhat = X * rstd
    Wv = _f64(weight) if weight is not None else 1.0
    out = _store(xhat * Wv, dt)

    def backward(g):
        G = g.astype(np.float64)
        lead = tuple(range(x.ndim - len(ns)))
        gw = _store((G * xhat).sum(axis=lead), weight.dtype) if weight is not None else None
        gh = G * Wv
        gx = rstd * (gh - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
        return _store(gx, dt), gw
    return _result(out, dt, (x, weight), backward)


# ------------------------------------------------------------------- losses
def _reduce(loss, reduction, what):
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def nll_loss(logp, target, reduction="mean", ignore_index=-100):
    """-logp[i, target[i]], averaged over the targets that are not
    ``ignore_index``. Autocast: fp32."""
    (logp,) = cast_inputs("nll_loss", logp)
    if logp.ndim != 2:
        raise ValueError(f"nll_loss(): expects input of shape (N, C), got {logp.shape}")
    if not isinstance(target, Tensor) or is_float(target.dtype):
        raise TypeError("nll_loss()/cross_entropy(): target must be an integer tensor of class "
                        "indices (fpemu.autograd.tensor([...]) of ints)")
    t = target._a.astype(np.int64)
    N, C = logp.shape
    if t.shape != (N,):
        if t.ndim == 1:
            raise ValueError(f"Expected input batch_size ({N}) to match target batch_size "
                             f"({t.shape[0]}).")
        raise RuntimeError(f"nll_loss(): target must be 1-D of class indices, one per row of "
                           f"the input (shape ({N},)), got shape {t.shape}")
    keep = t != ignore_index
    if np.any((t[keep] < 0) | (t[keep] >= C)):
        raise IndexError(f"nll_loss(): target values must be in [0, {C}), got "
                         f"{t[keep].min()}..{t[keep].max()}")
    rows = np.flatnonzero(keep)
    dt = _float_dt(logp)
    picked = np.zeros(N, np.float64)
    picked[rows] = -logp._a[rows, t[rows]].astype(np.float64)
    if reduction == "none":
        out, scale = _store(picked, dt), None
    elif reduction in ("mean", "sum"):
        count = len(rows) if reduction == "mean" else 1
        with np.errstate(all="ignore"):
            out = _store(np.asarray(picked.sum() / count), dt)
        scale = count
    else:
        raise ValueError(f"nll_loss(): reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")

    def backward(g):
        G = np.zeros((N, C), np.float64)
        gv = g.astype(np.float64)
        with np.errstate(all="ignore"):
            G[rows, t[rows]] = -(gv[rows] if scale is None else gv / scale)
        return (_store(G, dt),)
    return _result(out, dt, (logp,), backward)


def cross_entropy(input, target, reduction="mean", ignore_index=-100,  # noqa: A002
                  label_smoothing=0.0):
    """log_softmax over dim 1, then nll_loss (both fp32 under autocast), as
    torch decomposes it; label smoothing mixes in the mean of -logp."""
    (input,) = cast_inputs("cross_entropy_loss", input)   # listed on CPU only
    logp = log_softmax(input, dim=1)
    loss = nll_loss(logp, target, reduction, ignore_index)
    if not label_smoothing:
        return loss
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy(): label_smoothing must be in [0, 1], got "
                         f"{label_smoothing}")
    keep = tensor_from((target._a != ignore_index).astype(np.float32))
    smooth = mul(neg(mean(logp, dim=1)), keep)
    if reduction == "mean":
        smooth = div(sum(smooth), float(keep._a.sum()))
    else:
        smooth = _reduce(smooth, reduction, "cross_entropy()")
    return add(mul(loss, 1.0 - label_smoothing), mul(smooth, label_smoothing))


def tensor_from(array):
    return Tensor(np.asarray(array, np.float32), float32)


def mse_loss(input, target, reduction="mean"):  # noqa: A002
    """mean((input - target)^2) in float64, rounded once. Autocast: fp32."""
    input, target = cast_inputs("mse_loss", input, target)
    dt = _float_dt(input, target)
    D = _f64(input) - _f64(target) if isinstance(target, Tensor) else _f64(input) - target
    sq = D * D
    if reduction == "none":
        out = _store(sq, dt)
        scale = None
    elif reduction in ("mean", "sum"):
        scale = sq.size if reduction == "mean" else 1
        out = _store(np.asarray(sq.sum() / scale), dt)
    else:
        raise ValueError(f"mse_loss(): reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")

    def backward(g):
        G = g.astype(np.float64)
        gi = 2 * D * (G if scale is None else G / scale)
        return (_grad_part(_store(gi, dt), input, dt),
                _grad_part(_store(-gi, dt), target, dt) if isinstance(target, Tensor) else None)
    return _result(out, dt, (input, target), backward)


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by the float32
    1/(1-p); the mask comes from fpemu's seeded generator."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout(): p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    dt = x.dtype
    om = opmath(dt)
    keep = _State.rng.random(x.shape) >= p
    scale = om(0.0) if p == 1.0 else om(1.0) / om(1.0 - p)
    out = _store(np.where(keep, x._a.astype(om) * scale, om(0)), dt)

    def backward(g):
        return (_store(np.where(keep, g.astype(om) * scale, om(0)), dt),)
    return _result(out, dt, (x,), backward)


def embedding(input, weight):  # noqa: A002
    """weight[input]; the backward adds rows in float64, rounded once."""
    if not isinstance(input, Tensor) or is_float(input.dtype):
        raise TypeError("embedding(): indices must be an integer tensor")
    idx = input._a.astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"embedding(): index out of range for {weight.shape[0]} rows")
    out = weight._a[idx]

    def backward(g):
        G = np.zeros(weight.shape, np.float64)
        np.add.at(G, idx.reshape(-1), g.reshape(-1, weight.shape[1]).astype(np.float64))
        return (None, _store(G, weight.dtype))
    return _result(out, weight.dtype, (input, weight), backward)


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale + mask) v, the math path: matmuls in the autocast
    dtype, softmax in fp32."""
    q, k, v = cast_inputs("scaled_dot_product_attention", q, k, v)
    d = q.shape[-1]
    scale = 1.0 / float(np.sqrt(d)) if scale is None else scale
    scores = mul(matmul(q, transpose(k, -2, -1)), scale)
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        scores = masked_fill(scores, np.triu(np.ones((L, S), bool), 1), float("-inf"))
    if attn_mask is not None:
        m = attn_mask._a if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        if m.dtype == bool:
            scores = masked_fill(scores, ~m, float("-inf"))
        else:
            scores = add(scores, attn_mask)
    p = softmax(scores, dim=-1)
    return matmul(to_dtype(p, v.dtype), v)


# ----------------------------------------------------------- in-place (no graph)
def _inplace(x, values):
    if x.requires_grad and x.is_leaf and _State.grad_enabled:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation; wrap it in fpemu.autograd.no_grad()")
    x._a = _store(values, x.dtype) if is_float(x.dtype) else np.asarray(values).astype(
        np_dtype(x.dtype))
    return x
