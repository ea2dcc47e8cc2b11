"""ATen's CPU range factories, bit for bit (the CPU profile): the values of
``torch.arange``, ``torch.linspace`` and ``torch.logspace`` on torch 2.13's
x86-64 CPU build.

Where the kernels run. ``arange_stub`` and ``linspace_stub``
(``aten/src/ATen/native/cpu/RangeFactoriesKernel.cpp``) are registered with
``REGISTER_DISPATCH``, which leaves the AVX-512 slot empty
(``native/DispatchStub.h``: only ``ALSO_REGISTER_AVX512_DISPATCH`` fills it),
so an AVX512 machine runs their AVX2 build: 256-bit ``Vectorized`` values
(4 doubles, 8 floats, 16 sixteen-bit values, ``32 / itemsize`` integers)
under both AVX2 and AVX512. Measured: torch 2.13's float64 ``arange`` on this
project's AVX-512 machine matches 4-lane vectors and not 8-lane ones. The
AVX2 build is compiled with ``-mfma`` and GCC contracts ``a + b*c`` into one
FMA (``fp-contract=fast``, the default for GNU C++), so every such
expression below is ``fma(b, c, a)``: measured for both kernels.
``logspace`` (``native/RangeFactories.cpp``, ``logspace_out``) is compiled
once for the baseline ISA, without FMA instructions: its exponents are a
rounded product and a rounded sum.

arange (``arange_kernel``). ``at::parallel_for(0, size, GRAIN_SIZE)`` cuts
the ``size`` elements into per-thread chunks when there are more than 32768
of them and more than one thread (OpenMP: ``min(threads, ceil(size /
32768))`` chunks of ``ceil(size / chunks)``); each chunk runs
``cpu_serial_kernel_vec`` (``native/cpu/Loops.h``, ``vectorized_loop``):
two vectors a step from the chunk's first index, then the leftover
elements one by one. With ``acc`` = ``at::acc_type<scalar_t, false>``
(double for float32 and float64, float for bfloat16 and float16, int64 for
the integers) and ``start``, ``step`` the Python numbers converted to
``acc``:

* the scalar tail stores ``(scalar_t) fma(step, (acc) idx, start)``;
* a vector starting at index ``v`` first rounds its base to the element
  type, ``b = (scalar_t) fma(step, (acc) v, start)``
  (``Vectorized<scalar_t>::arange`` takes a ``scalar_t`` base), then lane
  ``k`` stores ``(scalar_t) fma((acc) k, step, (acc) b)`` (``base + k *
  step`` in the type of ``step``; for bfloat16 / float16 c10's mixed
  operators compute in float).

The integers compute in int64 and wrap to the element type (two's
complement). The size is ``ceil((end - start) / step)`` in double (int64:
``ceil((end - start + step - sign(step)) / step)`` in int64 arithmetic, as
``arange_out`` computes it).

linspace (``linspace_kernel``, a scalar loop: the parallel split does not
change any value). ``start`` and ``end`` are first converted to the
element type; ``step = (end - start) / (steps - 1)`` in ``step_t`` (the
element type for floating types, double for the integers); the first
``steps // 2`` elements are ``start + step * idx``, the others ``end - step
* (steps - idx - 1)``. float32 / float64 / integers: one FMA each
(``fma(-step, n, end)`` for the second half), the integers truncated toward
zero. bfloat16 / float16: c10's ``BFloat16`` / ``Half`` operators compute
each operation in float and round it to the 16-bit type, and an ``int64_t``
operand is first converted to the 16-bit type (``static_cast<Half>(idx)``),
so ``step = r(r(end - start) / r(steps - 1))`` and each value is ``r(start
+ r(step * r(idx)))``; no contraction crosses those roundings. One step
fills ``start``.

logspace (``logspace_out``): ``start`` and ``end`` converted to the element
type, ``step = (double)(end - start) / (steps - 1)`` with the subtraction in
the element type (c10's operators round it for the 16-bit types); exponent
``start + step * i`` or ``end - step * (steps - i - 1)`` in double (no FMA,
see above); ``std::pow(base, exponent)``, glibc's ``pow``, which Python's
``math.pow`` calls in this process too; the double result converted to the
element type (16-bit types through float; integers truncated, wrapping as
x86's conversion through int32 does). One step fills ``pow(base, start)``
with ``start`` as a double.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import fma, fma32, jit
from ._profile import GRAIN_SIZE
from ..errors import FpemuRuntimeError
from ._dtypes import _store, bfloat16, float16, float32, float64, int64, np_dtype

VECTOR_BYTES = 32           # the AVX2 build's Vectorized width (see the module note)

_SIXTEEN = (bfloat16, float16)


@jit
def _fma64(a, b, c, out):
    for i in range(out.shape[0]):
        out[i] = fma(a[i], b[i], c[i])


@jit
def _fma32(a, b, c, out):
    for i in range(out.shape[0]):
        out[i] = fma32(a[i], b[i], c[i])


def _fma(a, b, c, ty):
    """Elementwise ``a * b + c`` with one rounding in ``ty`` (float32 or
    float64); numbers and 1-d arrays of one length mix."""
    n = max(np.size(x) for x in (a, b, c))
    a, b, c = (np.full(n, x, ty) if np.ndim(x) == 0 else np.ascontiguousarray(x, ty)
               for x in (a, b, c))
    out = np.empty(n, ty)
    (_fma64 if ty is np.float64 else _fma32)(a, b, c, out)
    return out


def _r16(x, dtype):
    """Round float32 values to bfloat16 / float16 (c10's conversions from
    float: round to nearest even), kept in float32. A NaN becomes c10's:
    bfloat16's is positive (0x7FC0), float16's keeps the sign."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        out = np.asarray(_store(x, dtype), np.float32)
    if dtype is float16:
        nan = np.isnan(x)
        if nan.any():
            out = np.where(nan, np.copysign(np.float32(np.nan), x), out)
    return out


def _wrap(values, dtype):
    """int64 values wrapped to an integer dtype (two's complement)."""
    return np.asarray(values, np.int64).astype(np_dtype(dtype))


def _chunks(n, threads):
    """``at::parallel_for(0, n, GRAIN_SIZE)``'s ranges (OpenMP backend)."""
    if n <= GRAIN_SIZE or threads <= 1:
        return [(0, n)]
    tasks = min(threads, -(-n // GRAIN_SIZE))
    chunk = -(-n // tasks)
    return [(b, min(n, b + chunk)) for b in range(0, n, chunk)]


def _vector_layout(n, lanes, threads):
    """Per element of an ``n``-element ``cpu_serial_kernel_vec`` loop: whether
    the vector body computes it, the index of its vector's first element and
    its lane."""
    body = np.zeros(n, bool)
    first = np.arange(n, dtype=np.int64)
    for b, e in _chunks(n, threads):
        size = (e - b) // (2 * lanes) * (2 * lanes)
        body[b:b + size] = True
        first[b:b + size] = b + (first[b:b + size] - b) // lanes * lanes
    return body, first, np.arange(n, dtype=np.int64) - first


def _to_int(x):
    """``Scalar::to<int64_t>()``: a float truncated toward zero."""
    _check_fits(x, int64)
    return int(x)


#: c10's names of the element types in its overflow message, and their ranges
_C_NAMES = {"int64": ("int64_t", -(1 << 63), (1 << 63) - 1), "int32": ("int", -(1 << 31),
            (1 << 31) - 1), "int16": ("int16_t", -(1 << 15), (1 << 15) - 1),
            "int8": ("int8_t", -128, 127), "uint8": ("uint8_t", 0, 255)}


def _check_fits(x, dtype):
    """``c10::checked_convert``'s refusal, as a RuntimeError with its
    message: a number outside the element type's finite range (floating
    types take infinities and NaN; uint8 takes the ints -255..-1, wrapped;
    the integers take no NaN or infinity)."""
    if dtype is float64:
        return
    if dtype is float32 or dtype in _SIXTEEN:
        name, top = {float32: ("float", float(np.finfo(np.float32).max)),
                     bfloat16: ("c10::BFloat16", 3.3895313892515355e38),
                     float16: ("c10::Half", 65504.0)}[dtype]
        bad = math.isfinite(x) and abs(x) > top
    else:
        name, lo, hi = _C_NAMES[dtype.name]
        if isinstance(x, float) and not math.isfinite(x):
            bad = True
        elif dtype.name == "uint8":
            bad = x > hi or (x < 0 and (isinstance(x, float) or x < -hi))
        else:
            bad = x < lo or x > hi
    if bad:
        raise FpemuRuntimeError(f"value cannot be converted to type {name} without overflow "
                                f"(the number {x!r} does not fit {dtype})")


def arange_size(start, end, step, dtype):
    """``arange_out``'s element count (the checks are the caller's)."""
    if dtype is int64:
        s, e, st = _to_int(start), _to_int(end), _to_int(step)
        sgn = (st > 0) - (st < 0)
        num = e - s + st - sgn
        # C's int64 division truncates toward zero; ceil of an integer is itself
        q = abs(num) // abs(st)
        return q if (num >= 0) == (st > 0) else -q
    return int(math.ceil((float(end) - float(start)) / float(step)))


def arange_values(start, end, step, dtype, threads):
    """The values of ``torch.arange(start, end, step, dtype=dtype)`` on the
    CPU (module note): a numpy array in ``dtype``'s storage."""
    n = arange_size(start, end, step, dtype)
    if n <= 0:
        return np.zeros(0, np_dtype(dtype))
    idx = np.arange(n, dtype=np.int64)
    if not (dtype is float64 or dtype is float32 or dtype in _SIXTEEN):
        s, st = _to_int(start), _to_int(step)
        # the integers: int64 arithmetic (body and tail agree), which numpy
        # wraps as the machine does, then the element type's low bytes
        with np.errstate(over="ignore"):
            return _wrap(np.int64(s) + np.int64(st) * idx, dtype)
    itemsize = 8 if dtype is float64 else (4 if dtype is float32 else 2)
    body, first, lane = _vector_layout(n, VECTOR_BYTES // itemsize, threads)
    if dtype in _SIXTEEN:
        acc = np.float32
        s, st = _scalar_to(start, float32), _scalar_to(step, float32)

        def to_elem(x):
            return _r16(x, dtype)
    else:
        acc = np.float64
        s, st = np.float64(start), np.float64(step)

        def to_elem(x):
            return np.asarray(x, np.float64).astype(np.float32 if dtype is float32 else
                                                    np.float64)
    out = np.empty(n, np.float32 if dtype is not float64 else np.float64)
    tail = ~body
    out[tail] = to_elem(_fma(st, idx[tail].astype(acc), s, acc))
    base = to_elem(_fma(st, first[body].astype(acc), s, acc))
    out[body] = to_elem(_fma(lane[body].astype(acc), st, base.astype(acc), acc))
    return out


def _scalar_to(x, dtype):
    """``Scalar::to<scalar_t>()`` of the Python number ``x``, checked as c10
    checks it: rounded to the element type for the floating types (16-bit
    types through float, kept in float32), truncated toward zero and
    wrapped for the integers."""
    _check_fits(x, dtype)
    if dtype is float64:
        return np.float64(x)
    if dtype is float32:
        return np.float32(x)
    if dtype in _SIXTEEN:
        return _r16(np.float32(x), dtype)[()]
    return int(_wrap(np.int64(int(x)), dtype))


def linspace_values(start, end, steps, dtype):
    """The values of ``torch.linspace(start, end, steps, dtype=dtype)`` on
    the CPU (module note)."""
    storage = np_dtype(dtype)
    if steps == 0:
        return np.zeros(0, storage)
    a, b = _scalar_to(start, dtype), _scalar_to(end, dtype)
    if steps == 1:
        return np.array([a], storage)
    idx = np.arange(steps, dtype=np.int64)
    half = steps // 2
    first = idx < half
    rest = steps - idx - 1
    if dtype is float64 or dtype is float32:
        ty = np.float64 if dtype is float64 else np.float32
        a, b = ty(a), ty(b)
        with np.errstate(all="ignore"):
            step = ty(b - a) / ty(steps - 1)
        up = _fma(step, idx.astype(ty), a, ty)
        down = _fma(-step, rest.astype(ty), b, ty)
        return np.where(first, up, down).astype(storage)
    if dtype in _SIXTEEN:
        def r(x):
            return _r16(x, dtype)
        with np.errstate(all="ignore"):
            step = r(r(np.float32(b) - np.float32(a)) / r(np.float32(steps - 1)))
            up = r(np.float32(a) + r(step * r(idx.astype(np.float32))))
            down = r(np.float32(b) - r(step * r(rest.astype(np.float32))))
        return np.where(first, up, down).astype(np.float32)
    # integers: step in double, one FMA, truncated toward zero
    step = (float(b) - float(a)) / float(steps - 1)
    up = _fma(step, idx.astype(np.float64), float(a), np.float64)
    down = _fma(-step, rest.astype(np.float64), float(b), np.float64)
    return _int_from_double(np.where(first, up, down), dtype)


def _int_from_double(x, dtype):
    """C's conversion of doubles to ``dtype`` as x86 code does it: truncated
    toward zero to int64 (int64) or int32 (narrower types: the low bytes
    kept)."""
    x = np.trunc(np.asarray(x, np.float64))
    if dtype is int64:
        return x.astype(np.int64)
    with np.errstate(invalid="ignore"):
        wide = np.where((x >= -2.0 ** 31) & (x < 2.0 ** 31), x, -2.0 ** 31).astype(np.int64)
    return _wrap(wide, dtype)


def logspace_values(start, end, steps, base, dtype):
    """The values of ``torch.logspace(start, end, steps, base, dtype=dtype)``
    on the CPU (module note)."""
    storage = np_dtype(dtype)
    if steps == 0:
        return np.zeros(0, storage)
    base = float(base)
    if steps == 1:
        exps = np.array([float(start)])
    else:
        a, b = _scalar_to(start, dtype), _scalar_to(end, dtype)
        if dtype in _SIXTEEN:
            diff = float(_r16(np.float32(b) - np.float32(a), dtype)[()])
        elif dtype is float32:
            diff = float(np.float32(b) - np.float32(a))
        elif dtype is float64:
            diff = float(b) - float(a)
        else:
            diff = float(b - a)
        step = diff / float(steps - 1)
        i = np.arange(steps, dtype=np.int64)
        half = steps // 2
        with np.errstate(all="ignore"):
            up = float(a) + step * i.astype(np.float64)
            down = float(b) - step * (steps - i - 1).astype(np.float64)
        exps = np.where(i < half, up, down)
    vals = np.array([_pow(base, e) for e in exps.tolist()], np.float64)
    if dtype is float64:
        return vals
    if dtype is float32:
        with np.errstate(over="ignore"):
            return vals.astype(np.float32)
    if dtype in _SIXTEEN:
        with np.errstate(over="ignore"):
            return _r16(vals.astype(np.float32), dtype)
    return _int_from_double(vals, dtype)


def _pow(x, y):
    """glibc's ``pow`` (through Python's ``math.pow``), with C's results
    where Python raises: an overflow gives an infinity, ``pow(0, y < 0)`` an
    infinity, a negative base with a non-integer exponent the x86 default
    NaN (sign bit set), as glibc returns it."""
    odd = float(y).is_integer() and abs(y) < 2.0 ** 53 and int(y) % 2 == 1
    try:
        return math.pow(x, y)
    except OverflowError:
        return -math.inf if x < 0 and odd else math.inf
    except ValueError:
        if x == 0.0:
            return math.copysign(math.inf, x) if odd else math.inf
        return math.copysign(math.nan, -1.0)
