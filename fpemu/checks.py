"""The argument checks that fpemu's modules share: what a format name
stands for, how any real input becomes a float32 / float64 array exactly
(torch tensors, ml_dtypes, big integers, Fraction, Decimal), the output
arrays, the stochastic-rounding seed and the NaN rule. Each raises an
:mod:`fpemu.errors` error naming the function (``fname``), what it expected
and the fix. :class:`fpemu.quantize.Cast` holds the kernel side.
"""

from __future__ import annotations

import numbers

import numpy as np

from ._exact import EXACT_TYPES, array_to_float64_odd, to_float64_odd
from .errors import FpemuTypeError, FpemuValueError
from .formats import Format
from .formats import format as _lookup
from .rounding import Rounding

__all__ = ["as_format", "real_array", "output_array", "from_torch", "is_torch_tensor",
           "seed_key", "no_nan_into", "same_buffer", "flatten", "ML_DTYPES_NAMES", "ML_DTYPES_INTS",
           "TORCH_FORMATS", "MAX_OFFSET"]

ML_DTYPES_NAMES = {
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
}
#: ml_dtypes' narrow integer types: numpy sees them as void, their values are ints
ML_DTYPES_INTS = {"int2", "int4", "uint2", "uint4"}


def as_format(fmt) -> Format:
    """The :class:`Format` a name or a Format stands for (the error lists the names)."""
    return _lookup(fmt)


TORCH_FORMATS = {"bfloat16": "bf16", "float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2",
                 "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
                 "float8_e8m0fnu": "e8m0"}


def from_torch(t, fname):
    """A torch tensor of any real dtype as a numpy array, exactly: the dtypes
    numpy lacks (bfloat16, the float8 types) are widened to float32 by torch
    (every one of their values is a float32; ``tests/test_checks.py``
    compares each code with :func:`fpemu.decode`)."""
    import torch  # only reached with a torch tensor in hand
    t = t.detach().cpu().resolve_conj().resolve_neg()
    name = str(t.dtype).replace("torch.", "")
    if t.is_complex():
        raise FpemuTypeError(f"{fname}() got a complex torch tensor ({name}); pass real values, "
                             "e.g. t.real and t.imag separately")
    if name in TORCH_FORMATS:
        return t.to(torch.float32).numpy()
    try:
        return t.numpy()
    except TypeError as err:
        raise FpemuTypeError(f"{fname}() cannot read a torch tensor of dtype {name} ({err}); "
                             "unpack it (packed fp4 pairs) or cast it to float32 first") from None


def is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "dtype") and hasattr(
        x, "detach")


def _object_values(arr, fname):
    """An object array of real numbers (Python ints of any size, Fraction,
    Decimal, floats) as float64, each rounded to odd where not exact."""
    flat = arr.reshape(-1)
    for v in flat:
        if isinstance(v, (numbers.Real, EXACT_TYPES)) and not isinstance(v, (str, bytes)):
            continue
        what = "None" if v is None else f"a {type(v).__name__} ({v!r:.40})"
        kind = "complex " if isinstance(v, numbers.Complex) else ""
        raise FpemuTypeError(
            f"{fname}() got a Python object array holding {kind}{what}; pass real numbers: "
            "floats, ints, Fractions or Decimals (a float32 or float64 array is fastest)"
        )
    return np.array([to_float64_odd(v) for v in flat], np.float64).reshape(arr.shape)


def real_array(x, fname):
    """Return (1-D contiguous native float32/float64 array, original shape).

    Every value comes out exactly, or, where float64 cannot hold it (big
    integers, Fraction, Decimal, longdouble), rounded to odd (fpemu._exact),
    so that the kernel's one rounding is the correct rounding of the input.
    """
    if is_torch_tensor(x):
        x = from_torch(x, fname)
    if isinstance(x, np.ma.MaskedArray):
        raise FpemuTypeError(
            f"{fname}() does not take masked arrays (the mask would be lost); pass "
            "x.compressed() for the unmasked values or x.filled(value)"
        )
    try:
        arr = np.asarray(x)
    except ValueError as err:
        raise FpemuValueError(
            f"{fname}() got a ragged nested sequence (rows of different lengths: {err}); "
            "pass a rectangular array, or call it once per row"
        ) from None
    dt = arr.dtype
    if dt.kind == "c":
        raise FpemuTypeError(
            f"{fname}() got a complex array ({dt}); pass real values, "
            "e.g. x.real and x.imag separately"
        )
    if dt.kind == "O":
        arr = _object_values(arr, fname)
    elif dt.name in ML_DTYPES_INTS:
        arr = arr.astype(np.int64).astype(np.float64)   # every value is a small int
    elif dt.kind in "USMmV" and dt.name not in ML_DTYPES_NAMES:
        text = " (text is read exactly by decimal.Decimal(text))" if dt.kind in "US" else ""
        raise FpemuTypeError(
            f"{fname}() got an array of dtype {dt}; pass real numbers (a float32 or "
            f"float64 array, or anything np.asarray turns into one){text}"
        )
    elif dt.name in ML_DTYPES_NAMES:
        arr = arr.astype(np.float32)  # every ml_dtypes value is exact in float32
    elif dt.kind == "b":
        arr = arr.astype(np.float32)
    elif dt.kind in "iu":
        arr = array_to_float64_odd(arr)
    elif dt.kind == "f":
        if dt.itemsize == 2:
            arr = arr.astype(np.float32)  # exact
        elif dt.itemsize > 8:
            arr = array_to_float64_odd(arr)
    else:  # pragma: no cover - every numpy kind is handled above
        raise FpemuTypeError(f"{fname}() cannot read dtype {dt}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    shape = arr.shape
    return np.ascontiguousarray(arr).reshape(-1), shape


def output_array(out, shape, dtype, fname):
    """``out`` checked as the destination of a result of ``shape`` and
    ``dtype`` (writeable, C-contiguous, native), or a new array if None."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray):
        raise FpemuTypeError(f"{fname}(): out must be a numpy array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise FpemuTypeError(f"{fname}(): out must have dtype {np.dtype(dtype)}, got {out.dtype}")
    if out.shape != tuple(shape):
        raise FpemuValueError(f"{fname}(): out has shape {out.shape}, the input has {tuple(shape)}")
    if not (out.flags.c_contiguous and out.flags.writeable and out.dtype.isnative):
        raise FpemuValueError(
            f"{fname}(): out must be a writeable, C-contiguous, native-byte-order array; "
            "pass np.empty(shape, dtype) or leave out=None"
        )
    return out


MAX_OFFSET = 2**62   # offset + element index stays inside the kernels' int64


def seed_key(seed, mode: Rounding, *, entropy=False):
    """(64-bit key as int64, index offset) for stochastic rounding: the
    first 64-bit word of NumPy's ``SeedSequence(seed)``. ``seed`` is an int
    >= 0 or a pair ``(seed, offset)``; with ``entropy=True`` also a list of
    ints >= 0 (NumPy's entropy: ``fpemu.block``'s ``"srN"`` seeds of the fp8
    recipes, a seed and a call counter). The public functions take no list:
    ``seed=[1, 2]`` would be read as entropy, other bits than ``(1, 2)``."""
    if mode is not Rounding.SR:
        return 0, 0
    offset = 0
    if isinstance(seed, list) and not entropy:
        fix = (f"for a seed and an offset pass a tuple, seed={tuple(seed)!r}" if len(seed) == 2
               else "pass one int")
        raise FpemuTypeError(f"seed must be None, an int >= 0 or a tuple (seed, offset), got "
                             f"the list {seed!r}; {fix}")
    if isinstance(seed, list):
        if not seed or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool)
                               and s >= 0 for s in seed):
            raise FpemuValueError(f"a list seed is NumPy's entropy, ints >= 0; got {seed!r}")
        state = np.random.SeedSequence([int(s) for s in seed]).generate_state(1, np.uint64)[0]
        return int(state.view(np.int64)), 0
    if isinstance(seed, tuple):
        if len(seed) != 2:
            raise FpemuValueError(f"seed must be an int or a pair (seed, offset), got {seed!r}")
        seed, offset = seed
        if not isinstance(offset, numbers.Integral) or not 0 <= offset < MAX_OFFSET:
            raise FpemuValueError(
                f"the offset in seed=(seed, offset) must be an int in 0 .. 2**62 - 1 (the "
                f"flat index of x[0] in the whole array), got {offset!r}"
            )
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)
                             or seed < 0):
        raise FpemuValueError(
            f"seed must be None, an int >= 0 or a pair (seed, offset), got {seed!r}"
        )
    state = np.random.SeedSequence(None if seed is None else int(seed)).generate_state(
        1, np.uint64
    )[0]
    return int(state.view(np.int64)), int(offset)


def no_nan_into(fmt: Format, arr, fname):
    """An error if ``arr`` holds a NaN and ``fmt`` has none (fpemu never
    turns a NaN into a number)."""
    if not fmt.has_nan and arr.size:
        bad = np.isnan(arr)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise FpemuValueError(
                f"{fname}(): {fmt.long_name or fmt.name} has no NaN, but the input holds "
                f"{int(bad.sum())} NaN value(s) (the first at flat index {first}); "
                "replace them (np.nan_to_num) or use a format with NaN"
            )


def same_buffer(a, b) -> bool:
    """a and b are the same contiguous elements (an in-place call, safe)."""
    return (a.dtype.itemsize == b.dtype.itemsize and a.size == b.size
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def flatten(items):
    """The leaves of nested lists and tuples, depth first."""
    for v in items:
        if isinstance(v, (list, tuple)):
            yield from flatten(v)
        else:
            yield v
