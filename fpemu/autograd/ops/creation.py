"""Factories: ``zeros``, ``ones``, ``full``, ``empty``, ``arange``,
``linspace``, ``eye``, ``from_numpy`` and the random ones, which draw from
the generator of :mod:`.._rng` (torch's CPU numbers for integers, uniforms
and permutations)."""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["arange", "as_tensor", "bernoulli", "empty", "empty_like", "eye", "from_numpy", "full",
           "full_like", "is_floating_point", "is_tensor", "linspace", "multinomial", "normal",
           "numel", "ones", "ones_like", "rand", "logspace", "rand_like", "randint",
           "randint_like", "randn", "randn_like", "randperm", "zeros", "zeros_like"]

import functools

import numpy as np

from ...errors import (
    FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError, FpemuValueError,
)
from .._core import (
    _result, _values_as, as_dtype, bfloat16, bool_, check_device, float16, float32, float64,
    int16, int32, int64, int8, is_float, np_dtype, result_type, Tensor, tensor, uint8,
)
from .._state import State
from .._common import shape_arg
from .._profile import get_profile
from .. import _cpu_factories
from .elementwise import _zero_grads
from .inplace import copy_into, write_out


def _dtype(dtype, default=float32):
    return default if dtype is None else as_dtype(dtype)


def _make(array, dtype, requires_grad):
    t = Tensor(_values_as(array, dtype), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _exact(values, dtype, requires_grad):
    """A tensor holding ``values``, already in ``dtype``'s storage and
    rounding (the CPU range kernels' models: no second rounding, which would
    drop a float16 NaN's sign)."""
    t = Tensor(np.ascontiguousarray(values, np_dtype(dtype)), dtype)
    if requires_grad:
        t.requires_grad_(True)
    return t


_NO_SIZE = object()


def _size(shape, size, name):
    """The shape of ``f(2, 3)``, ``f((2, 3))`` or ``f(size=(2, 3))``, as torch
    takes it: ``size=`` a tuple, list or Size of ints, and not besides a
    positional shape."""
    if size is _NO_SIZE:
        if not shape:
            raise FpemuTypeError(f'{name}() missing 1 required positional arguments: "size" '
                                 f'(a 0-d tensor is {name}(()) or {name}([]))')
        return shape_arg(shape, f"{name}()")
    if shape:
        raise FpemuTypeError(f"{name}() got multiple values for argument 'size' (pass the "
                             f"shape once: {name}(2, 3), {name}((2, 3)) or {name}(size=(2, 3)))")
    if not isinstance(size, (tuple, list)):
        hint = f"size=({size},) for one dim" if isinstance(size, (int, np.integer)) else \
            "a tuple such as size=(2, 3)"
        raise FpemuTypeError(f"{name}(): argument 'size' must be tuple of ints, not "
                             f"{type(size).__name__} (pass {hint})")
    return shape_arg((tuple(size),), f"{name}()")


def zeros(*shape, size=_NO_SIZE, dtype=None, device=None, requires_grad=False, out=None,
          layout=None, pin_memory=False):
    return _make(np.zeros(_size(shape, size, "zeros")), _dtype(dtype), requires_grad)


def ones(*shape, size=_NO_SIZE, dtype=None, device=None, requires_grad=False, out=None,
         layout=None, pin_memory=False):
    return _make(np.ones(_size(shape, size, "ones")), _dtype(dtype), requires_grad)


def empty(*shape, size=_NO_SIZE, dtype=None, device=None, requires_grad=False, layout=None,
          pin_memory=False, memory_format=None):
    """Uninitialised in torch; zeros here (deterministic)."""
    return zeros(_size(shape, size, "empty"), dtype=dtype, requires_grad=requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False, layout=None):
    size = shape_arg(size if isinstance(size, (tuple, list)) else (size,), "full()")
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    dtype = result_type(fill_value) if dtype is None else as_dtype(dtype)
    return _make(np.full(size, fill_value), dtype, requires_grad)


def _like(t, dtype):
    if not isinstance(t, Tensor):
        raise FpemuTypeError(f"expected a Tensor, got {type(t).__name__}")
    return t.dtype if dtype is None else as_dtype(dtype)


def zeros_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return zeros(t.shape, dtype=_like(t, dtype), requires_grad=requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return ones(t.shape, dtype=_like(t, dtype), requires_grad=requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False, memory_format=None):
    return zeros(t.shape, dtype=_like(t, dtype), requires_grad=requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False,
              memory_format=None):
    return full(t.shape, fill_value, dtype=_like(t, dtype), requires_grad=requires_grad)


def rand_like(t, dtype=None, device=None, requires_grad=False):
    return rand(t.shape, dtype=_like(t, dtype), requires_grad=requires_grad)


def randn_like(t, dtype=None, device=None, requires_grad=False):
    return randn(t.shape, dtype=_like(t, dtype), requires_grad=requires_grad)


def randint_like(t, low=0, high=None, dtype=None, device=None):
    """torch.randint_like(t, high) or (t, low, high)."""
    if high is None:
        low, high = 0, low
    return randint(low, high, t.shape, dtype=_like(t, dtype))


def _gen(generator):
    return State.generator if generator is None else generator


def _drawn(size, name, dtype, generator, requires_grad, draw):
    """A tensor of ``size`` filled by ``draw(gen, n, dtype)``."""
    shape = shape_arg(size, name)
    dtype = _dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    return _make(draw(_gen(generator), n, dtype).reshape(shape), dtype, requires_grad)


def rand(*shape, size=_NO_SIZE, generator=None, dtype=None, device=None, requires_grad=False,
         out=None):
    """Uniform in [0, 1): torch's CPU numbers for float32 and float64."""
    return _drawn((_size(shape, size, "rand"),), "rand()", dtype, generator, requires_grad,
                  lambda g, n, dt: g.uniform(n, double=dt is float64))


def randn(*shape, size=_NO_SIZE, generator=None, dtype=None, device=None, requires_grad=False,
          out=None):
    """Standard normal values, drawn as torch's CPU generator draws them."""
    return _drawn((_size(shape, size, "randn"),), "randn()", dtype, generator, requires_grad,
                  lambda g, n, dt: g.normal(n, fill32=dt is float32, fill64=dt is float64))


def randint(*args, size=None, generator=None, dtype=None, device=None, requires_grad=False,
            low=None, high=None):
    """``randint(high, size)`` or ``randint(low, high, size)``: integers in
    [low, high), torch's CPU numbers. int64 unless ``dtype`` says otherwise."""
    args = list(args)
    if size is None and args and isinstance(args[-1], (tuple, list)):
        size = args.pop()
    if high is None and low is None:
        if len(args) == 1:
            low, high = 0, args[0]
        elif len(args) == 2:
            low, high = args
        else:
            raise FpemuTypeError("randint() received an invalid combination of arguments; "
                                 "expected randint(high, size) or randint(low, high, size), "
                                 f"got {len(args)} positional numbers and size={size!r}")
    elif high is None:
        low, high = 0, low if not args else args[0]
    elif low is None:
        low = args[0] if args else 0
    if size is None:
        raise FpemuTypeError("randint() missing 1 required positional argument: 'size'")
    shape = shape_arg((size,), "randint()")
    n = int(np.prod(shape, dtype=np.int64))
    vals = _gen(generator).randint(int(low), int(high), n).reshape(shape)
    return _make(vals, _dtype(dtype, int64), requires_grad)


def randperm(n, generator=None, dtype=None, device=None, requires_grad=False):
    """A permutation of 0..n-1, torch's CPU one for the same seed."""
    return _make(_gen(generator).randperm(int(n)), _dtype(dtype, int64), requires_grad)


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False, out=None, layout=None, pin_memory=False):
    """``torch.normal``: tensor means and / or standard deviations (one draw
    per element of their broadcast shape), or two numbers and a ``size``."""
    _check_std(std)
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        m = mean._data if isinstance(mean, Tensor) else mean
        s = std._data if isinstance(std, Tensor) else std
        shape = np.broadcast_shapes(np.shape(m), np.shape(s))
        dt = mean.dtype if isinstance(mean, Tensor) else std.dtype
        # torch: output.normal_(0, 1), then output.mul_(std).add_(mean)
        z = _gen(generator).normal(int(np.prod(shape, dtype=np.int64)), fill32=dt is float32,
                                   fill64=dt is float64).reshape(shape)
        om = np.float64 if dt is float64 else np.float32
        Z = _values_as(z, dt).astype(om)
        with np.errstate(all="ignore"):
            P = _values_as(Z * np.asarray(s, om), dt).astype(om)
            vals = _values_as(P + np.asarray(m, om), dt)
        return _drawn_from(Tensor(vals, dt), (mean, std), "normal")
    shape = shape_arg((size,), "normal()")
    dtype = _dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    vals = _gen(generator).normal(n, mean, std, fill32=dtype is float32,
                                  fill64=dtype is float64)
    t = _make(vals.reshape(shape), dtype, requires_grad)
    return t if out is None else copy_into(out, t)


def _check_std(std):
    """torch's ``normal expects std >= 0.0`` (a RuntimeError)."""
    bad = (np.any(std._data < 0) if isinstance(std, Tensor) and std.numel() else
           (not isinstance(std, Tensor) and std < 0))
    if bad:
        shown = std if not isinstance(std, Tensor) else "a negative element"
        raise FpemuRuntimeError(f"normal expects std >= 0.0, but found std {shown}: pass a "
                                f"non-negative standard deviation")


def multinomial(input, num_samples, replacement=False, *, generator=None,
                out=None):
    """Category indices drawn with the given weights per row (torch's law, not
    its numbers)."""
    if not is_float(input.dtype):
        raise FpemuRuntimeError(f"multinomial only supports floating-point dtypes for input, "
                                f"got: {input.dtype}: pass probabilities as a float tensor")
    if num_samples <= 0:
        raise FpemuRuntimeError(f"cannot sample n_sample <= 0 samples (got {num_samples})")
    P = input._data.astype(np.float64)
    if input.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if np.any(P < 0) or not np.all(np.isfinite(P)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if np.any(P.sum(axis=-1) <= 0):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > P.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if P.shape[-1] > 2 ** 24:
        raise FpemuRuntimeError(f"number of categories cannot exceed 2^24 (got "
                                f"{P.shape[-1]})")
    if out is not None and getattr(out, "dtype", None) is not int64:
        raise FpemuRuntimeError(f"multinomial expects Long tensor out, got: "
                                f"{getattr(out, 'dtype', type(out).__name__)}")
    t = Tensor(_gen(generator).multinomial(P, int(num_samples), replacement), int64)
    return t if out is None else write_out(out, t, "multinomial")


def bernoulli(input, p=None, generator=None):
    probs = input._data if p is None else np.full(input.shape, p)
    draw = _gen(generator).uniform(int(np.prod(input.shape, dtype=np.int64))).reshape(
        input.shape)
    out = Tensor(_values_as((draw < probs).astype(np.float64), input.dtype), input.dtype)
    return _drawn_from(out, (input,) if p is None else (), "bernoulli")


def _drawn_from(out, params, op):
    """A draw whose parameters need a gradient: torch's result needs one too,
    and gives the parameters zeros (its derivatives of normal and bernoulli)."""
    params = tuple(t for t in params if isinstance(t, Tensor))
    if not any(t.requires_grad for t in params) or not is_float(out.dtype):
        return out
    return _result(out._data, out.dtype, params, _zero_grads(*params), op=op)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False, out=None):
    """Values from ``start`` up to (not including) ``end`` by ``step``
    (numbers or 0-d tensors). Under the CPU profile, torch's CPU kernel bit
    for bit (:mod:`.._cpu_factories`: vector lanes and scalar tail, per
    thread chunk); under the CUDA profile, numpy's ``arange`` rounded once to
    the dtype."""
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, Tensor) else v for v in (start, end, step)]
    if out is not None and dtype is None:
        dtype = out.dtype
    if dtype is not None and not is_float(as_dtype(dtype)):
        if int(vals[2]) == 0:
            raise FpemuValueError(f"arange(): step must be nonzero (step {vals[2]} is 0 in the "
                                  f"integer dtype {as_dtype(dtype)})")
    lo, hi, st = vals
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise FpemuRuntimeError(f"arange(): unsupported range: {lo} -> {hi}")
    if st == 0:
        raise FpemuRuntimeError("arange(): step must be nonzero")
    if (st > 0 and hi < lo) or (st < 0 and hi > lo):
        raise FpemuRuntimeError(f"arange(): upper bound and lower bound inconsistent with step "
                                f"sign (start={lo}, end={hi}, step={st})")
    if dtype is None:
        dtype = float32 if any(isinstance(v, float) for v in vals) else int64
    dtype = as_dtype(dtype)
    prof = get_profile()
    if prof.device == "cpu":
        _cpu_factory_dtype("arange", dtype)
        t = _exact(_cpu_factories.arange_values(lo, hi, st, dtype, prof.cpu_threads), dtype,
                   requires_grad)
    else:
        t = _make(np.arange(*vals), dtype, requires_grad)
    return write_out(out, t, "arange")


def _cpu_factory_dtype(name, dtype):
    """The CPU range kernels' dtypes (ATen dispatches them over the float and
    integer types, bfloat16 and float16; bool and float8 are refused)."""
    if dtype not in (float64, float32, bfloat16, float16, int64, int32, int16, int8, uint8):
        raise FpemuNotImplementedError(f'"{name}_cpu" not implemented for \'{dtype}\' (the CPU '
                                       f"range kernels take float64, float32, bfloat16, "
                                       f"float16 and the integer dtypes)")


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """``steps`` values from ``start`` to ``end`` (numbers or 0-d tensors, as
    torch's tensor overload takes them). Under the CPU profile, torch's CPU
    kernel bit for bit (:mod:`.._cpu_factories`: the first half steps up from
    ``start``, the second down from ``end``, with one FMA each); under the
    CUDA profile, numpy's ``linspace`` in float64 rounded once."""
    ends = _endpoints("linspace", start, end, steps)
    dt = _dtype(dtype)
    if get_profile().device == "cpu":
        _cpu_factory_dtype("linspace", dt)
        return _exact(_cpu_factories.linspace_values(ends[0], ends[1], int(steps), dt), dt,
                      requires_grad)
    return _make(np.linspace(ends[0], ends[1], int(steps)), dt, requires_grad)


def _endpoints(name, start, end, steps):
    """linspace's and logspace's checks: start and end numbers or 0-d
    tensors (as numbers), steps a non-negative int."""
    ends = []
    for what, v in (("start", start), ("end", end)):
        if isinstance(v, Tensor):
            if v.ndim:
                raise FpemuRuntimeError(f"{name} only supports 0-dimensional start and end "
                                        f"tensors, but got {what} with {v.ndim} dimension(s).")
            v = v.item()
        ends.append(v)
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise FpemuTypeError(f"{name}(): argument 'steps' must be int, not "
                             f"{type(steps).__name__}")
    if steps < 0:
        raise FpemuRuntimeError(f"{name}(): number of steps must be non-negative, got {steps}")
    return ends


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False,
             out=None):
    """``base ** linspace(start, end, steps)``: torch's kernel takes the
    power of each exponent (steps from the start in the first half, from the
    end in the second) in double and rounds it to the dtype. Under the CPU
    profile, bit for bit (:mod:`.._cpu_factories`: the endpoints first
    converted to the dtype, glibc's ``pow``); under the CUDA profile, the
    exponents in float64 and each power rounded once."""
    ends = _endpoints("logspace", start, end, steps)
    dt = _dtype(dtype)
    n = int(steps)
    if get_profile().device == "cpu":
        _cpu_factory_dtype("logspace", dt)
        t = _exact(_cpu_factories.logspace_values(ends[0], ends[1], n, base, dt), dt,
                   requires_grad)
        return t if out is None else copy_into(out, t)
    a, b = (float(e) for e in ends)
    i = np.arange(n, dtype=np.float64)
    if n == 1:
        exps = np.array([a])
    else:
        step = (b - a) / (n - 1)
        half = n // 2
        exps = np.where(i < half, a + step * i, b - step * (n - 1 - i))
    with np.errstate(all="ignore"):
        vals = np.power(np.float64(base), exps)
    if not is_float(dt):
        vals = np.trunc(vals)
    t = _make(vals, dt, requires_grad)
    return t if out is None else copy_into(out, t)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    for name, v in (("n", n), ("m", m)):
        if v is not None and v < 0:
            raise FpemuRuntimeError(f"{name} must be greater or equal to 0, got {v}")
    return _make(np.eye(n, m), _dtype(dtype), requires_grad)


def from_numpy(array):
    """A tensor that shares ``array``'s memory (float32, float64 and integer
    arrays; writes go both ways, as ``torch.from_numpy``)."""
    if not isinstance(array, np.ndarray):
        raise FpemuTypeError(f"expected np.ndarray (got {type(array).__name__})")
    kinds = {np.dtype(np.float32): float32, np.dtype(np.float64): float64,
             np.dtype(np.int64): int64, np.dtype(np.bool_): bool_, np.dtype(np.uint8): uint8}
    kinds.update({np.dtype(np.int32): int32, np.dtype(np.int16): int16,
                  np.dtype(np.int8): int8})
    dt = kinds.get(array.dtype)
    if dt is None:
        raise FpemuTypeError(f"can't convert np.ndarray of type numpy.{array.dtype}. The only "
                             f"supported types are: float64, float32, int64, int32, int16, "
                             f"int8, uint8, and bool (float16 arrays: use "
                             f"fpemu.autograd.tensor(array, dtype=float16), which copies)")
    return Tensor(array, dt)


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor) and (dtype is None or as_dtype(dtype) == data.dtype):
        return data
    if isinstance(data, np.ndarray) and dtype is None and \
            data.dtype in (np.float32, np.float64, np.int64):
        return from_numpy(data)
    return tensor(data, dtype=dtype)


def is_tensor(x):
    return isinstance(x, Tensor)


def is_floating_point(x):
    return is_float(x.dtype)


def numel(x):
    return x.numel()


def _checks_device(fn):
    """``fn`` refusing ``device=`` values torch would refuse on fpemu's
    machine (one CUDA device; ``_core.check_device``)."""

    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if kwargs.get("device") is not None:
            check_device(kwargs["device"], f"{fn.__name__}()")
        return fn(*args, **kwargs)
    return factory


for _name in ("zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
              "full_like", "rand_like", "randn_like", "randint_like", "rand", "randn", "randint",
              "randperm", "arange", "linspace", "eye", "as_tensor"):
    globals()[_name] = _checks_device(globals()[_name])
del _name
