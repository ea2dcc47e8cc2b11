"""Elementwise ops, forward and backward side by side.

How each op computes (``docs/pytorch-numerics.md`` §3.2, §6):

* inputs are widened exactly to opmath (float32; float64 for float64);
* ``+ - * /``, ``sqrt`` and ``abs`` are IEEE float32 operations (numpy's),
  so the float32 result is correctly rounded; ``add(a, b, alpha)`` with
  alpha != 1 is the exact ``fma(alpha, b, a)`` nvcc contracts it to;
* a Python number is converted once to float32 (CUDA's wrapped scalars);
  ``tensor / number`` multiplies by the reciprocal of the number, taken in
  double and rounded to float32, as CUDA's ``div_true`` kernel does
  (measured, ``docs/pytorch-numerics.md`` §13; the formulas that differ on
  the CPU build are in :mod:`.._aten`);
* exp, log, tanh, sigmoid, silu, gelu, cos, sin and rsqrt compute in float64
  and round to float32: CUDA's libdevice functions are within a few float32
  ulp of that but not bit-defined (tier 2, ``docs/autograd.md``);
* the float32 result is rounded once to the output dtype (RNE, the format's
  PyTorch overflow rule).

Backward formulas compute in the same way and round into the dtype of the
op's output; the engine then casts each gradient to its input's dtype.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["abs", "add", "addcdiv", "addcmul", "allclose", "bitwise_and", "bitwise_not",
           "bitwise_or", "bitwise_xor", "ceil", "clamp", "clamp_max", "clamp_min", "clip", "clone",
           "cos", "div", "eq", "equal", "erf", "erfc", "exp", "expm1", "fix", "floor",
           "floor_divide", "frac", "ge", "gelu", "gt", "isclose", "isfinite", "isinf", "isnan",
           "le", "lerp", "log", "log1p", "logical_and", "logical_not", "logical_or", "lt",
           "masked_fill", "maximum", "minimum", "mul", "nan_to_num", "ne", "neg", "pow",
           "reciprocal", "relu", "remainder", "round", "rsqrt", "rsub", "sigmoid", "sign", "silu",
           "sin", "sqrt", "square", "sub", "tanh", "trunc", "where"]

import builtins

import numpy as np

from ...quantize import decode
from ...errors import (
    FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError, FpemuValueError,
)
from .. import _aten
from .._autocast import cast_inputs
from .._profile import get_profile
from .._core import (
    _named, _result, _store, as_dtype, bool_, check_memory_format, float32, float64, int64,
    is_float, np_dtype, opmath, result_type, Tensor, to_dtype as _to,
)
from .. import _cpu_math, _special
from .._cuda_math import powf
from .._common import (
    broadcast_check, f64, float_dt, grad_part, int_binary, operand, scalar_type, t_or_number,
)
from .inplace import apply_inplace, copy_into, resize_out
from .._finfo import finfo

_SQRT_2_PI = 0.7978845608028654
_TWO_OVER_SQRT_PI = 1.1283791670955126


# ------------------------------------------------------------------ arithmetic
def add(a, b, alpha=1, out=None, *, _op="add"):
    """a + alpha * b (alpha != 1: the exact fma nvcc makes of it)."""
    a, b = t_or_number(a, "add()"), t_or_number(b, "add()")
    broadcast_check(a, b)
    dt = result_type(a, b)
    if not is_float(dt):
        return _out(int_binary(lambda x, y: x + alpha * y, a, b, dt), out)
    A, B = operand(a, dt), operand(b, dt)
    if _aten.cpu_rounds_scalars(dt):
        # CPU ufuncs take alpha and a CPU scalar (a Python number, or a 0-d
        # tensor beside a dimensioned one) as the tensor's dtype
        A = A if not _cpu_scalar(a, b) else _aten.scalar(A, dt)
        B = B if not _cpu_scalar(b, a) else _aten.scalar(B, dt)
    with np.errstate(all="ignore"):
        if alpha == 1:
            res = _store(A + B, dt)
        else:
            res = _aten.add_alpha(A, B, _aten.scalar(alpha, dt), dt)
    alpha_o = _aten.scalar(alpha, dt)

    def backward(g):
        gb = g if alpha == 1 else _store(g.astype(opmath(dt)) * alpha_o, dt)
        return grad_part(g, a, dt), grad_part(gb, b, dt)
    return _out(_result(res, dt, (a, b), backward, op=_op), out)


def _cpu_scalar(x, other):
    """ATen's ``is_cpu_scalar``: a number, or a 0-d tensor beside a
    dimensioned tensor (the CPU kernels read it as a scalar)."""
    if not isinstance(x, Tensor):
        return True
    return x.ndim == 0 and isinstance(other, Tensor) and other.ndim > 0


def sub(a, b, alpha=1, out=None):
    if isinstance(a, Tensor) and a.dtype is bool_ and isinstance(b, Tensor) and \
            b.dtype is bool_:
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not "
                           "supported. Use the `^` or `logical_xor()` operator instead.")
    # ATen's sub is add with -alpha: one node, a - alpha * b rounded once
    return add(a, b, -alpha, out=out, _op="sub")


def rsub(a, b, alpha=1):
    """``b - alpha * a`` (``number - tensor``): torch's ``sub(b, a, alpha)``,
    one rounding (the fma of ``-alpha * a + b`` where alpha != 1)."""
    _tensor_args("rsub", a, b)
    return _named(sub(b, a, alpha=alpha), "RsubBackward0" if isinstance(b, Tensor)
                  else "RsubBackward1")


def neg(a):
    if a.dtype is bool_:
        raise FpemuRuntimeError("Negation, the `-` operator, on a bool tensor is not supported. "
                                "If you are trying to invert a mask, use the `~` or "
                                "`logical_not()` operator instead.")
    res = -a._data

    def backward(g):
        return (-g,)
    return _result(res, a.dtype, (a,), backward, op="neg")


def mul(a, b, out=None):
    a, b = t_or_number(a, "mul()"), t_or_number(b, "mul()")
    broadcast_check(a, b)
    dt = result_type(a, b)
    if not is_float(dt):
        return _out(int_binary(np.multiply, a, b, dt), out)
    A, B = operand(a, dt), operand(b, dt)
    with np.errstate(all="ignore"):
        res = _store(A * B, dt)
    a_needs = isinstance(a, Tensor) and a.requires_grad
    b_needs = isinstance(b, Tensor) and b.requires_grad

    def backward(g):
        G = g.astype(opmath(dt))
        with np.errstate(all="ignore"):
            return (grad_part(_store(G * B, dt), a, dt) if a_needs else None,
                    grad_part(_store(G * A, dt), b, dt) if b_needs else None)
    saved = ((b if a_needs else None), (a if b_needs else None))
    return _out(_result(res, dt, (a, b), backward, saved=_tensors(saved), op="mul"), out)


def _tensors(xs):
    return tuple(x for x in xs if isinstance(x, Tensor))


def div(a, b, rounding_mode=None, out=None):
    """True division; on CUDA a tensor divided by a number multiplies by the
    reciprocal of the number, taken in double and rounded to float32
    (div_true with a scalar); the CPU profile divides. ``rounding_mode``
    "trunc" / "floor" as torch."""
    a, b = t_or_number(a, "div()"), t_or_number(b, "div()")
    broadcast_check(a, b)
    if rounding_mode is not None:
        return _out(_div_rounded(a, b, rounding_mode), out)
    dt = float_dt(a, b)
    om = opmath(dt)
    A, B = operand(a, dt), operand(b, dt)
    with np.errstate(all="ignore"):
        if isinstance(b, Tensor):
            inv = None
            res = _store(A / B, dt)
        else:
            res = _aten.div_scalar(A, b, dt)
            inv = None if get_profile().cpu else om(1.0 / float(b))
    b_needs = isinstance(b, Tensor) and b.requires_grad

    def backward(g):
        G = g.astype(om)
        with np.errstate(all="ignore"):
            ga = gb = None
            if isinstance(a, Tensor):
                ga = grad_part(_store(G / B if inv is None else G * inv, dt), a, dt)
            if b_needs:
                gb = grad_part(_store(-(G * (A / B)) / B, dt), b, dt)
            return ga, gb
    saved = (b, a if b_needs else None)
    return _out(_result(res, dt, (a, b), backward, saved=_tensors(saved), op="div"), out)


def _div_rounded(a, b, mode):
    if mode not in ("trunc", "floor"):
        raise FpemuValueError(f"div expected rounding_mode to be one of None, 'trunc', or "
                              f"'floor' but found '{mode}'")
    dt = result_type(a, b)
    A = a._data if isinstance(a, Tensor) else a
    B = b._data if isinstance(b, Tensor) else b
    if not is_float(dt):
        q = np.floor_divide(A, B) if mode == "floor" else np.trunc(np.divide(A, B))
        return Tensor(np.asarray(q).astype(dt.np_dtype), dt)
    Af, Bf = operand(a, dt), operand(b, dt)
    with np.errstate(all="ignore"):
        q = Af / Bf
        q = np.floor(q) if mode == "floor" else np.trunc(q)
    return _result(_store(q, dt), dt, (a, b), _zero_grads(a, b), op="div")


def _zero_grads(*xs):
    """The backward of a step function (rounded quotients, sign): zeros for
    each tensor input, as torch's derivatives give them (its result still
    requires a gradient)."""
    def backward(g):
        return tuple(np.zeros(x.shape, g.dtype) if isinstance(x, Tensor) else None for x in xs)
    return backward


def floor_divide(a, b):
    return div(a, b, rounding_mode="floor")


def remainder(a, b):
    _tensor_args("remainder", a, b, "one")
    dt = result_type(a, b)
    A = a._data if isinstance(a, Tensor) else a
    B = b._data if isinstance(b, Tensor) else b
    if not is_float(dt):
        return Tensor(np.asarray(np.mod(A, B)).astype(dt.np_dtype), dt)
    Af, Bf = operand(a, dt), operand(b, dt)
    with np.errstate(all="ignore"):
        res = _store(np.mod(Af, Bf), dt)

    def backward(g):
        # torch's derivative: grad for a, -grad * floor(a / b) for b
        G = g.astype(opmath(dt))
        with np.errstate(all="ignore"):
            q = _store(np.floor(Af / Bf), dt).astype(G.dtype)
            return (grad_part(_store(G, dt), a, dt) if isinstance(a, Tensor) else None,
                    grad_part(_store(-G * q, dt), b, dt) if isinstance(b, Tensor) else None)
    return _result(res, dt, (a, b), backward, op="remainder")


def rdiv(a, s):
    """``s / a`` for a Python number s: ``reciprocal(a) * s`` (two roundings, as
    torch's ``Tensor.__rdiv__``)."""
    return mul(reciprocal(a), s)


def reciprocal(a):
    (a,) = cast_inputs("reciprocal", a)     # float32 under CUDA autocast (measured, torch 2.11)
    dt = float_dt(a)
    A = operand(a, dt)
    with np.errstate(all="ignore"):
        res = _store(opmath(dt)(1) / A, dt)

    def backward(g):
        r = res.astype(opmath(dt))
        with np.errstate(all="ignore"):
            return (_store(-(g.astype(opmath(dt)) * r) * r, dt),)
    return _result(res, dt, (a,), backward, saved=("out",), op="reciprocal")


def pow(a, exponent):
    """a ** exponent; exponents 2, 3, 0.5, -0.5, -1, -2 take the special
    forms of CUDA's pow kernel (``x*x``, ``sqrt``, ...), 1 copies the base.
    Others, under the CUDA profile for float32, float16 and bfloat16 (their
    opmath is float32), are CUDA's ``powf`` as measured on an H200
    (:mod:`fpemu.autograd._cuda_math`; not correctly rounded: an ulp off on
    about 3 % of inputs), the result rounded to the dtype; float64, and
    the CPU profile, take the power in float64, rounded once."""
    a = t_or_number(a, "pow()")
    if not isinstance(a, Tensor):
        return _pow_scalar_base(a, exponent)
    (a, exponent) = cast_inputs("pow", a, exponent)
    dt = float_dt(a, exponent) if is_float(a.dtype) or not _is_int(exponent) else a.dtype
    if not is_float(dt):
        return Tensor(np.power(a._data, exponent._data if isinstance(exponent, Tensor)
                               else exponent).astype(dt.np_dtype), dt)
    om = opmath(dt)
    A = operand(a, dt)
    cuda_powf = getattr(dt, "name", None) in ("fp32", "fp16", "bf16") and not get_profile().cpu
    cpu_sleef = get_profile().cpu and dt in (float32, float64)
    with np.errstate(all="ignore"):
        if isinstance(exponent, Tensor):
            E = operand(exponent, dt)
            if cpu_sleef:                       # PowKernel.cpp: SLEEF's pow, libm's in the tail
                R = _cpu_math.pow_model(A, E)
            else:
                R = _store(powf(A, E) if cuda_powf else
                           np.power(A.astype(np.float64), E.astype(np.float64)), dt)
        else:
            e = float(exponent)
            special = {2.0: lambda x: x * x, 3.0: lambda x: x * x * x,
                       0.5: np.sqrt, -0.5: lambda x: om(1) / np.sqrt(x),
                       -1.0: lambda x: om(1) / x, -2.0: lambda x: om(1) / (x * x),
                       1.0: lambda x: x}
            if e in special:
                R = _store(special[e](A), dt)
            elif cpu_sleef:
                R = _cpu_math.pow_model(A, e)
            elif cuda_powf:                     # the exponent as a float32 (opmath) scalar
                R = _store(powf(A, np.float32(e)), dt)
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
                return (grad_part(_store(ga, dt), a, dt),
                        grad_part(_store(gb, dt), exponent, dt))
            ga = G * e * np.power(X, e - 1) if e != 0 else np.zeros_like(X)
            return (_store(ga, dt), None)
    return _result(R, dt, (a, exponent), backward, saved=_tensors((a, exponent)), op="pow")


def _is_int(x):
    if isinstance(x, Tensor):
        return not is_float(x.dtype)
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _pow_scalar_base(s, exponent):
    """``number ** tensor``: ``exp(exponent * log(s))`` in float64, rounded once."""
    if not isinstance(exponent, Tensor):
        raise TypeError("pow(): one of the arguments must be a Tensor")
    if isinstance(s, (int, np.integer, np.bool_)) and not is_float(exponent.dtype) and \
            result_type(s, exponent) is not bool_:
        return _int_pow_scalar_base(int(s), exponent, result_type(s, exponent))
    dt = float_dt(exponent)
    E = f64(exponent)
    with np.errstate(all="ignore"):
        if get_profile().cpu and dt in (float32, float64):
            # torch wraps the number as a 0-dim tensor of the dtype: pow_tensor_tensor_kernel
            res = _cpu_math.pow_model(np.asarray(s, np_dtype(dt)),
                                      exponent._data.astype(np_dtype(dt), copy=False))
            R = res.astype(np.float64)
        else:
            R = np.power(float(s), E)
            res = _store(R, dt)

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(g.astype(np.float64) * R * np.log(float(s)), dt),)
    return _result(res, dt, (exponent,), backward, saved=("out",), op="pow")


def _int_pow_scalar_base(s, exponent, dt):
    """``int ** integer tensor``: integers, as torch's ``powi`` (repeated
    squaring that wraps around; a negative exponent gives 0, or 1 and -1 for
    the bases 1 and -1). numpy's int64 power also squares and wraps, and the
    product of wrapping multiplications does not depend on their order."""
    E = exponent._data.astype(np.int64)
    neg = E < 0
    with np.errstate(all="ignore"):
        R = np.power(np.int64(s), np.where(neg, 0, E))
    R[neg] = 1 if s == 1 else 0
    if s == -1:
        R[neg] = np.where(E[neg] % 2 == 0, 1, -1)
    return Tensor(R.astype(np_dtype(dt)), dt)


def square(x):
    return _named(mul(x, x), "Pow")                  # torch's square is pow(x, 2)


# ------------------------------------------------------------------ elementwise
def _unary(op, x, fwd, bwd, autocast=False, save_out=False):
    """y = fwd(x) and dx = bwd(g, x, y), both in float64, each rounded once to
    float32 and then to the dtype."""
    if autocast:
        (x,) = cast_inputs(op, x)
    dt = float_dt(x)
    X = f64(x)
    with np.errstate(all="ignore"):
        res = _store(fwd(X), dt)

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(bwd(g.astype(np.float64), X, res.astype(np.float64)), dt),)
    return _result(res, dt, (x,), backward, saved=("out",) if save_out else (x,), op=op,
                   stored=dt is x.dtype)


def exp(x):
    return _unary("exp", x, np.exp, lambda g, x, y: g * y, autocast=True, save_out=True)


def log(x):
    return _unary("log", x, np.log, lambda g, x, y: g / x, autocast=True)


def _log1p_grad(g, x, y):
    return g / (1 + x)


def log1p(x):
    """log(1 + x); under the CPU profile (float32 / float64) ATen's
    ``log1p_kernel`` bit for bit: SLEEF's log1p on every element
    (:func:`.._cpu_math.log1p`)."""
    (x,) = cast_inputs("log1p", x)
    if _cpu_kernel(x):
        return _cpu_unary("log1p", x, _cpu_math.log1p, _log1p_grad)
    return _unary("log1p", x, np.log1p, _log1p_grad)


def _expm1_grad(g, x, y):
    return g * (y + 1)


def expm1(x):
    """exp(x) - 1; under the CPU profile (float32 / float64) ATen's
    ``expm1_kernel`` bit for bit: SLEEF's expm1 on every element
    (:func:`.._cpu_math.expm1`)."""
    (x,) = cast_inputs("expm1", x)
    if _cpu_kernel(x):
        return _cpu_unary("expm1", x, _cpu_math.expm1, _expm1_grad, save_out=True)
    return _unary("expm1", x, np.expm1, _expm1_grad, save_out=True)


def sqrt(x):
    """IEEE square root in opmath; backward ``g / (2 * y)``."""
    dt = float_dt(x)
    res = _aten.sqrt(operand(x, dt), dt)

    def backward(g):
        om = opmath(dt)
        with np.errstate(all="ignore"):
            return (_store(g.astype(om) / (om(2) * res.astype(om)), dt),)
    return _result(res, dt, (x,), backward, saved=("out",), op="sqrt")


def _rsqrt_grad(g, x, y):
    return -0.5 * g * y * y * y


def _rsqrt_cpu(v):
    """``rsqrt_kernel`` (UnaryOpsKernel.cpp): the vector body's
    ``Vectorized::rsqrt`` is ``1 / sqrt(x)`` (a division of the IEEE root)
    and the scalar tail's ``1 / std::sqrt(x)`` the same two roundings in the
    dtype, so the layout does not matter (measured, torch 2.13)."""
    one = v.dtype.type(1)
    return one / np.sqrt(v)


def rsqrt(x):
    """1 / sqrt(x) (CUDA's ``rsqrtf``: within an ulp of the float64 value
    rounded, tier 2); under the CPU profile (float32 / float64) torch CPU's
    two roundings, the root and then the quotient, bit for bit. Autocast:
    fp32."""
    (x,) = cast_inputs("rsqrt", x)
    if _cpu_kernel(x):
        return _cpu_unary("rsqrt", x, _rsqrt_cpu, _rsqrt_grad, save_out=True)
    return _unary("rsqrt", x, lambda v: 1.0 / np.sqrt(v), _rsqrt_grad, save_out=True)


def tanh(x):
    return _unary("tanh", x, np.tanh, lambda g, x, y: g * (1 - y * y), save_out=True)


def _cpu_kernel(x):
    """The CPU profile on a float32 / float64 tensor: the forward is the
    model of ATen's CPU kernel (:mod:`.._cpu_math`), bit for bit."""
    return get_profile().cpu and isinstance(x, Tensor) and x.dtype in (float32, float64)


def _cpu_unary(op, x, model, bwd, save_out=False):
    """``model(x's values)`` as the output (:mod:`.._cpu_math`); the gradient
    ``bwd(g, x, y)`` in float64, rounded once, as :func:`_unary` rounds it."""
    dt = x.dtype
    X = x._data
    with np.errstate(all="ignore"):
        res = model(X)

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(bwd(g.astype(np.float64), X.astype(np.float64),
                               res.astype(np.float64)), dt),)
    return _result(res, dt, (x,), backward, saved=("out",) if save_out else (x,), op=op,
                   stored=True)


def _sigmoid_grad(g, x, y):
    return g * y * (1 - y)


def sigmoid(x):
    """1 / (1 + exp(-x)); under the CPU profile ATen's ``sigmoid_kernel``
    bit for bit (:func:`.._cpu_math.sigmoid`)."""
    if _cpu_kernel(x):
        return _cpu_unary("sigmoid", x, _cpu_math.sigmoid, _sigmoid_grad, save_out=True)
    return _unary("sigmoid", x, lambda v: 1 / (1 + np.exp(-v)), _sigmoid_grad, save_out=True)


def _silu_grad(g, v, y):
    s = 1 / (1 + np.exp(-v))
    return g * s * (1 + v * (1 - s))


def silu(x, inplace=False):
    """x * sigmoid(x), in float64, rounded once; under the CPU profile ATen's
    ``silu_kernel`` bit for bit (:func:`.._cpu_math.silu`)."""
    if inplace:
        return apply_inplace(x, silu)
    if _cpu_kernel(x):
        return _cpu_unary("silu", x, _cpu_math.silu, _silu_grad)
    return _unary("silu", x, lambda v: v / (1 + np.exp(-v)), _silu_grad)


def cos(x):
    return _unary("cos", x, np.cos, lambda g, x, y: -g * np.sin(x))


def sin(x):
    return _unary("sin", x, np.sin, lambda g, x, y: g * np.cos(x))


def abs(x):
    """|x|, exact; the gradient is sign(x) * g (0 at 0)."""
    if not is_float(x.dtype):
        return Tensor(np.abs(x._data), x.dtype)
    res = np.abs(x._data)

    def backward(g):
        return (np.sign(x._data).astype(g.dtype) * g,)
    return _result(res, x.dtype, (x,), backward, saved=(x,), op="abs")


def sign(x):
    res = np.sign(x._data).astype(x._data.dtype)
    if not is_float(x.dtype):
        return Tensor(res, x.dtype)
    return _result(res, x.dtype, (x,), _zero_grads(x), op="sign")


def erf(x):
    """The error function, in float64 (libm's) rounded once (torch: Sleef's
    erff on CPU, CUDA's erff; both within an ulp: tier 2)."""
    return _unary("erf", x, _special.erf,
                  lambda g, x, y: g * _TWO_OVER_SQRT_PI * np.exp(-x * x))


def erfc(x):
    """1 - erf(x), in float64 (libm's erfc: no cancellation) rounded once."""
    return _unary("erfc", x, _special.erfc,
                  lambda g, x, y: -g * _TWO_OVER_SQRT_PI * np.exp(-x * x))


# ----------------------------------------------------- rounding to integers
def _to_integer(name, npop):
    """floor / ceil / trunc: exact; an integer tensor comes back as a copy (as
    torch's); the gradient is zero (torch's, which still requires one)."""
    def op(x, out=None):
        _unary_tensor(name, x)
        if not is_float(x.dtype):
            if x.dtype is bool_:
                raise FpemuRuntimeError(f'"{name}_vml_cpu" not implemented for \'Bool\'')
            return _out(Tensor(x._data.copy(), x.dtype), out)
        res = npop(x._data)
        return _out(_result(res, x.dtype, (x,), _zero_grads(x), op=name), out)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"``{name}(x)``, exact (the float32 storage of a 16-bit tensor holds its "
                  f"integers exactly); zero gradient.")
    return op


floor = _to_integer("floor", np.floor)
ceil = _to_integer("ceil", np.ceil)
trunc = _to_integer("trunc", np.trunc)
fix = trunc


def round(x, decimals=0, out=None):
    """Round half to even (``nearbyint``). With ``decimals``, torch's kernel
    in opmath: ``nearbyint(x * 10**d) / 10**d``, or for d < 0
    ``nearbyint(x / 10**-d) * 10**-d`` (10**|d| taken in double, rounded to
    opmath; each step rounds). Zero gradient."""
    _unary_tensor("round", x)
    if not is_float(x.dtype):
        if decimals:
            raise FpemuRuntimeError("round_cpu not implemented for integer tensors with "
                                    f"decimals={decimals}: round a float tensor")
        return _out(Tensor(x._data.copy(), x.dtype), out)
    if not decimals:
        res = np.rint(x._data)
    else:
        om = opmath(x.dtype)
        ten = om(10.0 ** builtins.abs(decimals))
        X = x._data.astype(om)
        with np.errstate(all="ignore"):
            res = _store(np.rint(X / ten) * ten if decimals < 0 else np.rint(X * ten) / ten,
                         x.dtype)
    return _out(_result(res, x.dtype, (x,), _zero_grads(x), op="round"), out)


def frac(x, out=None):
    """``x - trunc(x)``, exact (the fractional part); the gradient passes."""
    _unary_tensor("frac", x)
    if not is_float(x.dtype):
        raise FpemuRuntimeError(f'"frac_cpu" not implemented for \'{_c10(x.dtype)}\': '
                                f'frac takes a float tensor')
    with np.errstate(all="ignore"):
        res = x._data - np.trunc(x._data)

    def backward(g):
        return (g,)
    return _out(_result(res, x.dtype, (x,), backward, op="frac"), out)


def nan_to_num(x, nan=0.0, posinf=None, neginf=None, out=None):
    """NaN, +inf and -inf replaced by ``nan``, ``posinf`` and ``neginf``
    (by default 0 and the dtype's largest and lowest finite values), each
    converted to the dtype; other elements unchanged. The gradient passes
    where x is finite, and is 0 where it was replaced."""
    _unary_tensor("nan_to_num", x)
    if not is_float(x.dtype):
        return _out(Tensor(x._data.copy(), x.dtype), out)
    fi = finfo(x.dtype)
    vals = [nan, fi.max if posinf is None else posinf, fi.min if neginf is None else neginf]
    if x.dtype is float64:
        vals = [np.float64(v) for v in vals]
    else:
        with np.errstate(over="ignore"):
            vals = [_store(np.float32(v), x.dtype) for v in vals]     # static_cast<scalar_t>
    X = x._data
    res = np.where(np.isnan(X), vals[0],
                   np.where(X == np.inf, vals[1], np.where(X == -np.inf, vals[2], X)))
    res = res.astype(X.dtype)
    finite = np.isfinite(X)

    def backward(g):
        return (np.where(finite, g, np.zeros((), g.dtype)),)
    return _out(_result(res, x.dtype, (x,), backward, op="nan_to_num"), out)


def clamp_min(x, min, out=None):
    """``clamp(x, min=min)``: a number or a tensor bound."""
    _unary_tensor("clamp_min", x)
    return _out(clamp(x, min=min), out)


def clamp_max(x, max, out=None):
    """``clamp(x, max=max)``: a number or a tensor bound."""
    _unary_tensor("clamp_max", x)
    return _out(clamp(x, max=max), out)


def _unary_tensor(name, x):
    if not isinstance(x, Tensor):
        raise FpemuTypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not "
                             f"{type(x).__name__}")


def _c10(dt):
    return scalar_type(dt)


# ------------------------------------------------------- addcmul / addcdiv
def _addc(name, input, tensor1, tensor2):
    for pos, (what, t) in enumerate((("input", input), ("tensor1", tensor1),
                                     ("tensor2", tensor2)), 1):
        if not isinstance(t, Tensor):
            raise FpemuTypeError(f"{name}(): argument '{what}' (position {pos}) must be "
                                 f"Tensor, not {type(t).__name__}")
    (input, tensor1, tensor2) = cast_inputs(name, input, tensor1, tensor2)
    return input, tensor1, tensor2, result_type(input, tensor1, tensor2)


def addcmul(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 * tensor2`` with ATen's fma (``_aten.addcmul``:
    the CPU and CUDA builds fuse different products). Autocast: promote."""
    input, tensor1, tensor2, dt = _addc("addcmul", input, tensor1, tensor2)
    if not is_float(dt):
        if isinstance(value, float) and not float(value).is_integer():
            raise FpemuRuntimeError("For integral input tensors, argument value must not be a "
                                    "floating point number.")
        res = (input._data + int(value) * tensor1._data * tensor2._data).astype(dt.np_dtype)
        return _out(Tensor(res, dt), out)
    S, T1, T2 = (operand(t, dt) for t in (input, tensor1, tensor2))
    res = _aten.addcmul(S, T1, T2, value, dt)
    om = opmath(dt)
    v = om(value)

    def backward(g):
        # torch: grad * (tensor2 * value), grad * (tensor1 * value)
        G = g.astype(om)
        with np.errstate(all="ignore"):
            g1 = grad_part(_store(G * _store(T2 * v, dt).astype(om), dt), tensor1, dt) \
                if tensor1.requires_grad else None
            g2 = grad_part(_store(G * _store(T1 * v, dt).astype(om), dt), tensor2, dt) \
                if tensor2.requires_grad else None
        return grad_part(g, input, dt), g1, g2
    return _out(_result(res, dt, (input, tensor1, tensor2), backward,
                        saved=_tensors((tensor1, tensor2)), op="addcmul"), out)


def addcdiv(input, tensor1, tensor2, *, value=1, out=None):
    """``input + value * tensor1 / tensor2`` as ATen computes it
    (``_aten.addcdiv``). Autocast: promote. Integer tensors are refused, as
    torch refuses them."""
    input, tensor1, tensor2, dt = _addc("addcdiv", input, tensor1, tensor2)
    if not is_float(tensor1.dtype) and not is_float(tensor2.dtype):
        raise FpemuRuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future release "
            "addcdiv will perform a true division of tensor1 and tensor2. The historic "
            "addcdiv behavior can be implemented as (input + value * torch.trunc(tensor1 / "
            "tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / "
            "tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes.")
    S, T1, T2 = (operand(t, dt) for t in (input, tensor1, tensor2))
    res = _aten.addcdiv(S, T1, T2, value, dt)
    om = opmath(dt)
    v = om(value)

    def backward(g):
        # torch: grad * (value / tensor2), -grad * (value * tensor1 / (tensor2 * tensor2))
        G = g.astype(om)
        with np.errstate(all="ignore"):
            g1 = grad_part(_store(G * _store(v / T2, dt).astype(om), dt), tensor1, dt) \
                if tensor1.requires_grad else None
            g2 = None
            if tensor2.requires_grad:
                num = _store(v * T1, dt).astype(om)
                den = _store(T2 * T2, dt).astype(om)
                g2 = grad_part(_store(-G * _store(num / den, dt).astype(om), dt), tensor2, dt)
        return grad_part(g, input, dt), g1, g2
    return _out(_result(res, dt, (input, tensor1, tensor2), backward,
                        saved=_tensors((tensor1, tensor2)), op="addcdiv"), out)


def relu(x, inplace=False):
    """max(x, 0), exact; the gradient passes where the output is > 0."""
    if inplace:
        return apply_inplace(x, relu)
    dt = x.dtype
    res = np.where(x._data > 0, x._data, np.zeros((), x._data.dtype)).astype(x._data.dtype)

    def backward(g):
        return (np.where(res > 0, g, np.zeros((), g.dtype)),)
    return _result(res, dt, (x,), backward, saved=("out",), op="relu")


_GELU16_OUT = {}


def _gelu16(x):
    """GELU (erf form) of a bf16 or fp16 tensor through the tables of all its
    codes (``_special``): each output is the table's value rounded once to
    the dtype, each gradient the float64 product of ``g`` and the table's
    factor rounded to float32 and then to the dtype, as :func:`_unary`
    rounds them. None when an element is not a finite value of the dtype."""
    dt = x.dtype
    codes = _special.codes16(x._data, dt.name)
    if codes is None:
        return None
    # torch CPU hands a contiguous bfloat16 tensor of two or more elements to
    # oneDNN, whose AVX-512 gelu computes in float32 (_cpu_math.onednn_gelu,
    # measured: every one of 100000 values); its output per code, rounded
    onednn = (get_profile().cpu and dt.name == "bf16" and x._data.flags.c_contiguous
              and x._data.size > 1
              and get_profile().cpu_capability.upper().startswith("AVX512"))
    key = dt.name + ("-onednn" if onednn else "")
    out = _GELU16_OUT.get(key)
    if out is None:                        # every code's output, rounded once
        with np.errstate(all="ignore"):
            if onednn:
                values = decode(np.arange(1 << 16).astype(np.uint16), "bf16")
                out = _store(_cpu_math.onednn_gelu(np.asarray(values, np.float32)), dt)
            else:
                out = _store(_special.table16(dt.name)[0], dt)
            _GELU16_OUT[key] = out
    res = _special.gather(out, codes).reshape(x.shape)

    def backward(g):
        with np.errstate(all="ignore"):
            return (_store(_special.times_factor(np.broadcast_to(g, x.shape), codes, dt.name)
                           .reshape(x.shape), dt),)
    return _result(res, dt, (x,), backward, saved=(x,), op="gelu", stored=True)


def _gelu_erf_grad(g, v, y):
    return _special.gelu_erf_grad(np.broadcast_to(g, v.shape), v, _special.gelu_erf(v)[1])


def gelu(x, approximate="none"):
    """x * Phi(x) (erf form), or the tanh approximation. Under the CPU
    profile a float32 / float64 tensor follows torch CPU bit for bit where
    :func:`.._cpu_math.gelu` models the path (see there)."""
    if approximate in ("none", "tanh") and _cpu_kernel(x):
        model = _cpu_math.gelu_model(x._data, approximate)
        if model is not None:
            bwd = _gelu_erf_grad if approximate == "none" else _gelu_tanh_grad
            return _cpu_unary("gelu", x, model, bwd)
    if approximate == "none":
        if isinstance(x, Tensor) and getattr(x.dtype, "name", None) in ("bf16", "fp16"):
            res = _gelu16(x)
            if res is not None:
                return res

        phi = []                                     # Phi(x), kept for the backward

        def fwd(v):
            y, cdf = _special.gelu_erf(v)
            phi.append(cdf)
            return y

        def bwd(g, v, y):
            return _special.gelu_erf_grad(np.broadcast_to(g, v.shape), v, phi[0])
    elif approximate == "tanh":
        # v * v * v, not v ** 3: v holds float32 values, so v * v is exact in
        # float64 and the cube is rounded once, correctly; numpy's float64
        # power is not (2.8% of standard-normal float32 inputs a last bit
        # off) and took 4.4 ms for 2**16 values, 100x the products
        def fwd(v):
            return 0.5 * v * (1 + np.tanh(_SQRT_2_PI * (v + 0.044715 * (v * v * v))))

        bwd = _gelu_tanh_grad
    else:
        raise FpemuRuntimeError(f"gelu(): approximate must be 'none' or 'tanh', got "
                                f"{approximate!r}")
    return _unary("gelu", x, fwd, bwd)


def _gelu_tanh_grad(g, v, y):
    inner = _SQRT_2_PI * (v + 0.044715 * (v * v * v))
    t = np.tanh(inner)
    d_inner = _SQRT_2_PI * (1 + 3 * 0.044715 * v * v)
    return g * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * d_inner)


def clamp(x, min=None, max=None):
    """min(max(x, min), max), exact; the gradient passes where x is inside.
    Bounds are numbers (rounded to x's dtype) or tensors."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    dt = result_type(*(v for v in (x, min, max) if v is not None))
    if not is_float(dt):
        lo = None if min is None else (min._data if isinstance(min, Tensor) else min)
        hi = None if max is None else (max._data if isinstance(max, Tensor) else max)
        return Tensor(np.clip(x._data, lo, hi).astype(dt.np_dtype), dt)
    X = operand(x, dt)
    res = X
    lo = hi = None
    with np.errstate(invalid="ignore"):
        if min is not None:
            lo = operand(min, dt) if isinstance(min, Tensor) else _aten.scalar(min, dt)
            res = np.where(np.isnan(X), X, np.maximum(res, lo))
        if max is not None:
            hi = operand(max, dt) if isinstance(max, Tensor) else _aten.scalar(max, dt)
            res = np.where(np.isnan(X), X, np.minimum(res, hi))
    res = _store(res, dt)

    def backward(g):
        # torch's clamp_backward and clamp_backward_min_max: x gets g where it
        # is inside; a tensor min where x < min (and min < max), a tensor max
        # where x > max (or max < min: it won)
        zero = np.zeros((), g.dtype)
        keep = np.ones(X.shape, bool)
        if lo is not None:
            keep = keep & (X >= lo)
        if hi is not None:
            keep = keep & (X <= hi)
        gx = grad_part(np.where(keep, g, zero), x, dt)
        gmin = gmax = None
        if isinstance(min, Tensor):
            below = (X < lo) & (lo < hi) if hi is not None else X < lo
            gmin = grad_part(np.where(below, g, zero), min, dt)
        if isinstance(max, Tensor):
            above = (X > hi) | (hi < lo) if lo is not None else X > hi
            gmax = grad_part(np.where(above, g, zero), max, dt)
        return (gx, gmin, gmax)
    # torch: ClampBackward1 for number bounds, ClampBackward0 for tensor ones
    tensor_bound = isinstance(min, Tensor) or isinstance(max, Tensor)
    return _result(res, dt, (x, min, max), backward, saved=_tensors((x, min, max)),
                   op="clamp" if tensor_bound else "ClampBackward1")


clip = clamp


def lerp(input, end, weight):
    """``torch.lerp``: ``input + weight * (end - input)``, ATen's two-sided
    formula in opmath (:func:`fpemu.autograd._aten.lerp`; both branches
    fused, float64 too); ``weight`` a tensor or a number."""
    dt = result_type(input, end)
    om = opmath(dt)
    A, B = input._data.astype(om), end._data.astype(om)
    Wv = weight._data.astype(om) if isinstance(weight, Tensor) else om(weight)
    with np.errstate(all="ignore"):
        res = _aten.lerp(A, B, Wv, dt)

    def backward(g):
        G = g.astype(om)
        gw = None
        if isinstance(weight, Tensor):          # d/dw of a + w (b - a) is b - a
            gw = _store(G * (B - A), weight.dtype)
        return (_store(G * (om(1) - Wv), dt), _store(G * Wv, dt), gw)
    return _result(res, dt, (input, end, weight), backward, op="lerp")


def maximum(a, b):
    return _minmax(a, b, np.maximum, "maximum")


def minimum(a, b):
    return _minmax(a, b, np.minimum, "minimum")


def _minmax(a, b, npop, name):
    _tensor_args(name, a, b, "both")
    dt = result_type(a, b)
    A, B = operand(a, dt), operand(b, dt)
    res = _store(npop(A, B), dt)
    if not is_float(dt):
        return Tensor(res, dt)

    def backward(g):
        ta = (A > B) if npop is np.maximum else (A < B)
        tie = A == B
        G = g.astype(np.float64)
        ga = np.where(ta, G, np.where(tie, G / 2, 0.0))
        gb = np.where(ta, 0.0, np.where(tie, G / 2, G))
        return grad_part(_store(ga, dt), a, dt), grad_part(_store(gb, dt), b, dt)
    return _result(res, dt, (a, b), backward, saved=_tensors((a, b)), op=name)


def to_dtype(x, dtype):
    return _to(x, as_dtype(dtype, "to()"))


def where(cond, a=None, b=None):
    """``where(cond, a, b)``: a where cond else b; ``where(cond)`` is
    ``nonzero(cond, as_tuple=True)``."""
    if a is None and b is None:
        c = cond._data if isinstance(cond, Tensor) else np.asarray(cond)
        return tuple(Tensor(i.astype(np.int64), _int64()) for i in np.nonzero(c))
    c = cond._data.astype(bool) if isinstance(cond, Tensor) else np.asarray(cond, bool)
    dt = result_type(a, b)
    A, B = operand(a, dt), operand(b, dt)
    res = _store(np.where(c, A, B), dt)
    if not is_float(dt):
        return Tensor(res, dt)

    def backward(g):
        z = np.zeros((), g.dtype)
        return (grad_part(np.where(c, g, z), a, dt), grad_part(np.where(c, z, g), b, dt))
    return _result(res, dt, (a, b), backward, op="where")


def _int64():
    return int64


def masked_fill(x, mask, value):
    """x with ``value`` where mask is true: a number is rounded to x's dtype
    (through float32, as torch's fill), a 0-d tensor is cast."""
    m = mask._data.astype(bool) if isinstance(mask, Tensor) else np.asarray(mask, bool)
    if isinstance(mask, Tensor) and mask.dtype is not bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with "
                           f"dtype {mask.dtype}")
    if isinstance(value, complex) or (isinstance(value, Tensor) and "complex" in str(value.dtype)):
        raise FpemuRuntimeError(f"masked_fill(): value cannot be converted to type "
                                f"{x.dtype} without overflow: {value!r}")
    vt = value if isinstance(value, Tensor) else None
    if vt is not None:
        if value.ndim:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but "
                               f"got tensor with {value.ndim} dimension(s).")
        value = value.item()
    if x.dtype is float64:
        fill = np.float64(value)                        # a double stays a double
    else:
        fill = _store(np.float32(value), x.dtype) if is_float(x.dtype) else value
    res = np.where(m, fill, x._data).astype(x._data.dtype)

    def backward(g):
        zero = np.zeros((), g.dtype)
        gv = None
        if vt is not None and vt.requires_grad:          # the value: the filled places' sum
            gv = _store(np.where(m, g, zero).astype(np.float64).sum(), vt.dtype)
        return (grad_part(np.where(m, zero, g), x, x.dtype), gv)
    return _result(res, x.dtype, (x, vt), backward, op="masked_fill")


def clone(x, memory_format=None):
    check_memory_format(x, memory_format, "clone()")

    def backward(g):
        return (g,)
    return _result(np.array(x._data, copy=True), x.dtype, (x,), backward, op="clone")


def _out(t, out):
    """Write ``t`` into ``out=`` (torch's out= argument: resized to the
    result's shape where it has another, then cast to its dtype) or return it."""
    if out is None:
        return t
    resize_out(out, t.shape, "out")
    return copy_into(out, t)


# ------------------------------------------------------------- comparisons
def _tensor_args(name, a, b, need="first"):
    """torch's argument parser: ``need`` "first" (the input must be a Tensor),
    "both", or "one" (a Tensor and a number, either way round)."""
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    if ta and (tb or need != "both"):
        return
    if need == "one" and tb:
        return
    bad, pos, what = (a, 1, "input") if not ta else (b, 2, "other")
    raise FpemuTypeError(f"{name}(): argument '{what}' (position {pos}) must be Tensor, not "
                         f"{type(bad).__name__}" + ("; one of the two may be a number"
                                                    if need == "one" else ""))


def _compare(npop, name):
    def op(a, b):
        _tensor_args(name, a, b)
        A = a._data if isinstance(a, Tensor) else a
        B = b._data if isinstance(b, Tensor) else b
        if not isinstance(B, (np.ndarray, bool, int, float, np.number)):
            return NotImplemented
        return Tensor(np.asarray(npop(A, B)), bool_)
    op.__name__ = name
    return op


eq, ne, lt, le, gt, ge = (_compare(f, n) for f, n in (
    (np.equal, "eq"), (np.not_equal, "ne"), (np.less, "lt"), (np.less_equal, "le"),
    (np.greater, "gt"), (np.greater_equal, "ge")))


def equal(a, b):
    """True when ``a`` and ``b`` have the same shape and equal elements (NaN
    equals nothing); a Python bool, as torch's."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError(f"equal(): argument 'other' must be Tensor, not "
                        f"{type(b if isinstance(a, Tensor) else a).__name__}")
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(np.array_equal(a._data, b._data))


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """``|a - b| <= atol + rtol * |b|`` elementwise (in the promoted dtype's
    opmath, as torch's), with infinities equal to themselves."""
    _tensor_args("isclose", a, b, "both")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v < 0:
            raise FpemuRuntimeError(f"isclose(): {name} must be greater than or equal to zero, "
                                    f"but got {v}")
    dt = result_type(a, b)
    A = operand(a, dt) if isinstance(a, Tensor) else np.asarray(a)
    B = operand(b, dt) if isinstance(b, Tensor) else np.asarray(b)
    with np.errstate(all="ignore"):
        close = np.isclose(A, B, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return Tensor(np.asarray(close), bool_)


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(isclose(a, b, rtol, atol, equal_nan)._data.all())


def isnan(x):
    return Tensor(np.isnan(x._data), bool_)


def isinf(x):
    return Tensor(np.isinf(x._data), bool_)


def isfinite(x):
    return Tensor(np.isfinite(x._data), bool_)


def logical_not(x):
    return Tensor(np.logical_not(x._data), bool_)


def logical_and(a, b):
    _tensor_args("logical_and", a, b, "both")
    return Tensor(np.logical_and(_arr(a), _arr(b)), bool_)


def logical_or(a, b):
    _tensor_args("logical_or", a, b, "both")
    return Tensor(np.logical_or(_arr(a), _arr(b)), bool_)


def _arr(x):
    return x._data if isinstance(x, Tensor) else np.asarray(x)


def _bitwise(npop, name):
    def op(a, b):
        _tensor_args(name, a, b, "one")
        dt = result_type(a, b)
        if is_float(dt):                 # torch's dispatch: NotImplementedError
            raise FpemuNotImplementedError(f'"{name}_cpu" not implemented for '
                                           f'\'{_c10(dt)}\'')
        return Tensor(np.asarray(npop(_arr(a), _arr(b))).astype(dt.np_dtype), dt)
    return op


bitwise_and = _bitwise(np.bitwise_and, "bitwise_and")
bitwise_or = _bitwise(np.bitwise_or, "bitwise_or")
bitwise_xor = _bitwise(np.bitwise_xor, "bitwise_xor")


def bitwise_not(x):
    if is_float(x.dtype):
        raise FpemuNotImplementedError(f'"bitwise_not_cpu" not implemented for '
                                       f'\'{_c10(x.dtype)}\'')
    return Tensor(np.invert(x._data), x.dtype)
