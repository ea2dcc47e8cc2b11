"""quantize, encode, decode, next_up, next_down, ulp, classify.

These functions check and prepare; the kernels in :mod:`fpemu._kernels`
compute. The numeric contract (one rounding from the exact input, IEEE 754
§7.4 overflow then the policy, flush after rounding, no -0 in fnuz formats,
NaN into a format without NaN is an error) is in ``docs/numeric-contract.md``.
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from . import _kernels
from ._exact import EXACT_TYPES, array_to_float64_odd, to_float64_odd
from ._jit import run_kernel
from .errors import FpemuTypeError, FpemuValueError
from .formats import Format
from .formats import format as _lookup
from .rounding import Overflow, Rounding, parse_overflow, parse_rounding

__all__ = ["quantize", "encode", "decode", "next_up", "next_down", "ulp", "classify"]

#: The classes :func:`classify` returns, in order.
CLASSES = ("zero", "subnormal", "normal", "inf", "nan")

_ML_DTYPES_NAMES = {
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e4m3", "float8_e3m4", "float8_e4m3b11fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn",
}
#: ml_dtypes' narrow integer types: numpy sees them as void, their values are ints
_ML_DTYPES_INTS = {"int2", "int4", "uint2", "uint4"}


# ----------------------------------------------------------------- preparation
def _as_format(fmt) -> Format:
    return _lookup(fmt)


_TORCH_FORMATS = {"bfloat16": "bf16", "float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2",
                  "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
                  "float8_e8m0fnu": "e8m0"}


def _from_torch(t, fname):
    """A torch tensor of any real dtype as a numpy array, exactly: the dtypes
    numpy lacks (bfloat16, the float8 types) are decoded from their bits."""
    import torch  # only reached with a torch tensor in hand
    t = t.detach().cpu().resolve_conj().resolve_neg()
    name = str(t.dtype).replace("torch.", "")
    if t.is_complex():
        raise FpemuTypeError(f"{fname}() got a complex torch tensor ({name}); pass real values, "
                             "e.g. t.real and t.imag separately")
    if name in _TORCH_FORMATS:
        fmt = _lookup(_TORCH_FORMATS[name])
        raw = torch.uint8 if fmt.bits <= 8 else torch.int16
        codes = t.contiguous().view(raw).numpy().view(fmt.code_dtype)
        return decode(codes, fmt)
    try:
        return t.numpy()
    except TypeError as err:
        raise FpemuTypeError(f"{fname}() cannot read a torch tensor of dtype {name} ({err}); "
                             "unpack it (packed fp4 pairs) or cast it to float32 first") from None


def _is_torch_tensor(x) -> bool:
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


def _prepare_input(x, fname):
    """Return (1-D contiguous native float32/float64 array, original shape).

    Every value comes out exactly, or, where float64 cannot hold it (big
    integers, Fraction, Decimal, longdouble), rounded to odd (fpemu._exact),
    so that the kernel's one rounding is the correct rounding of the input.
    """
    if _is_torch_tensor(x):
        x = _from_torch(x, fname)
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
    elif dt.name in _ML_DTYPES_INTS:
        arr = arr.astype(np.int64).astype(np.float64)   # every value is a small int
    elif dt.kind in "USMmV" and dt.name not in _ML_DTYPES_NAMES:
        text = " (text is read exactly by decimal.Decimal(text))" if dt.kind in "US" else ""
        raise FpemuTypeError(
            f"{fname}() got an array of dtype {dt}; pass real numbers (a float32 or "
            f"float64 array, or anything np.asarray turns into one){text}"
        )
    elif dt.name in _ML_DTYPES_NAMES:
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


def _prepare_out(out, shape, dtype, fname):
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


def _resolve_overflow(fmt: Format, overflow) -> Overflow:
    pol = parse_overflow(fmt.default_overflow if overflow is None else overflow)
    if pol is Overflow.INF and not fmt.has_inf:
        choices = "'saturate' or 'nan'" if fmt.has_nan else "'saturate'"
        raise FpemuValueError(
            f"{fmt.long_name or fmt.name} has no infinity; pass overflow={choices} "
            f"(or None for its default, {fmt.default_overflow!r})"
        )
    if pol is Overflow.NAN and not fmt.has_nan:
        raise FpemuValueError(
            f"{fmt.long_name or fmt.name} has no NaN; pass overflow='saturate'"
        )
    return pol


def _kernel_params(fmt: Format, pol: Overflow, subnormals: bool) -> tuple:
    """(p, flags): what a kernel sees of the format (layout in fpemu._kernels)."""
    if not isinstance(subnormals, (bool, np.bool_)):
        raise FpemuTypeError(f"subnormals must be True or False, got {subnormals!r}")
    p = (
        fmt.mantissa_bits,
        fmt.emin,
        fmt.emax,
        fmt.bias,
        fmt.max_code,
        -1 if fmt.inf_code is None else fmt.inf_code,
        -1 if fmt.nan_code is None else fmt.nan_code,
        fmt.exponent_bits + fmt.mantissa_bits,
    )
    flags = int(pol)
    if fmt.has_subnormals and not subnormals:
        flags |= _kernels.FLUSH
    if fmt.nan_encoding == "fnuz":
        flags |= _kernels.FNUZ
    if not fmt.signed:
        flags |= _kernels.UNSIGNED
    if not fmt.has_zero:
        flags |= _kernels.NO_ZERO
    if fmt.emin < -126:
        flags |= _kernels.NORMALIZE
    return p, flags


_MAX_OFFSET = 2**62   # offset + element index stays inside the kernels' int64


def _seed_key(seed, mode: Rounding):
    """(64-bit key as int64, index offset) for stochastic rounding."""
    if mode is not Rounding.SR:
        return 0, 0
    offset = 0
    if isinstance(seed, tuple):
        if len(seed) != 2:
            raise FpemuValueError(f"seed must be an int or a pair (seed, offset), got {seed!r}")
        seed, offset = seed
        if not isinstance(offset, numbers.Integral) or not 0 <= offset < _MAX_OFFSET:
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


def _check_nan_input(fmt: Format, arr, fname):
    if not fmt.has_nan and arr.size:
        bad = np.isnan(arr)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise FpemuValueError(
                f"{fname}(): {fmt.long_name or fmt.name} has no NaN, but the input holds "
                f"{int(bad.sum())} NaN value(s) (the first at flat index {first}); "
                "replace them (np.nan_to_num) or use a format with NaN"
            )


def _same_buffer(a, b) -> bool:
    """a and b are the same contiguous elements (an in-place call, safe)."""
    return (a.dtype.itemsize == b.dtype.itemsize and a.size == b.size
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _masked(fn):
    """Let ``fn(x, ...)`` take a masked array: masked elements are not read
    (they are filled with 0 first) and the result carries x's mask."""
    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        if not isinstance(x, np.ma.MaskedArray):
            return fn(x, *args, **kwargs)
        out = kwargs.get("out")
        res = fn(x.filled(0), *args, **kwargs)
        mask = np.ma.getmaskarray(x)
        return np.ma.MaskedArray(res if out is None else out, mask=mask.copy())
    return wrapper


def _run(op, x, fmt, rounding, subnormals, overflow, seed, out, dtype, fname):
    fmt = _as_format(fmt)
    mode = parse_rounding(rounding)
    pol = _resolve_overflow(fmt, overflow)
    params, flags = _kernel_params(fmt, pol, subnormals)
    key, offset = _seed_key(seed, mode)
    arr, shape = _prepare_input(x, fname)
    _check_nan_input(fmt, arr, fname)
    result = _prepare_out(out, shape, fmt.code_dtype if dtype is None else dtype, fname)
    if out is not None and np.may_share_memory(arr, result) and not _same_buffer(arr, result):
        arr = arr.copy()  # out overlaps x at an offset: elements would be read after written
    if arr.size:
        fast = _fast_rne_params(fmt, mode, flags) if op == "quantize" else None
        if fast is not None and arr.dtype == np.float32 and result.dtype == np.float32:
            run_kernel(_kernels.quantize_rne_ieee, arr, result.reshape(-1), *fast)
            return result
        kernel = _kernels.rounding_kernel(op, arr.dtype.str[1:], int(mode), specialise(flags))
        run_kernel(kernel, arr, result.reshape(-1), params, key, offset, flags)
    return result


@functools.lru_cache(maxsize=None)
def _common_flags() -> frozenset:
    """The kernel flags of every named format with its default overflow
    policy and subnormals: the configurations worth a kernel of their own."""
    from .formats import FORMATS
    return frozenset(_kernel_params(f, _resolve_overflow(f, None), True)[1] for f in FORMATS)


def specialise(flags: int) -> int:
    """``flags`` if a kernel compiled for them alone pays (a named format's
    defaults), else -1: the kernel that reads the flags at run time (see
    :func:`fpemu._kernels.rounding_kernel`)."""
    return flags if flags in _common_flags() else -1


@functools.lru_cache(maxsize=None)
def _fast_rne_params(fmt: Format, mode: Rounding, flags: int):
    """The arguments of :func:`fpemu._kernels.quantize_rne_ieee` when ``fmt``
    is an IEEE-style format (inf and NaN in the top exponent, subnormals, a
    signed zero, exponents within float32's), ``mode`` is RNE and nothing
    changes the IEEE behaviour (overflow to inf, no flush); else None."""
    if mode is not Rounding.RNE or flags != int(Overflow.INF):
        return None
    m = fmt.mantissa_bits
    if not (fmt.has_inf and fmt.has_nan and fmt.has_subnormals and fmt.signed
            and fmt.nan_encoding == "ieee" and 1 <= m < 23 and -126 <= fmt.emin
            and fmt.emax <= 127 and fmt.max == (2.0 - 2.0 ** -m) * 2.0 ** fmt.emax):
        return None

    def bits(v):
        return np.uint32(np.array(v, np.float32).view(np.uint32))

    overflow = (2.0 - 2.0 ** -(m + 1)) * 2.0 ** fmt.emax      # halfway above max: inf
    return (23 - m, bits(2.0 ** fmt.emin), bits(overflow),
            np.float32(2.0 ** (fmt.emin - m + 23)))


# ------------------------------------------------------------------ public API
@_masked
def quantize(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None):
    """Round real values to a format; return the values as float32.

    Parameters
    ----------
    x : array_like
        Real values: float16/32/64, ml_dtypes types, torch tensors of any
        real dtype, integers of any size, Fraction, Decimal, longdouble.
        float32 and float64 are read as they are; every value is rounded once
        from its exact value, never through float32 (or float64) first. A
        masked array gives a masked result with the same mask.
    fmt : str or Format
        Target format (``"bf16"``, ``"float8_e4m3fn"``, a :class:`Format`...).
    rounding : {"rne", "rna", "rtz", "rup", "rdn", "rto", "sr"}
        Rounding mode (see :class:`fpemu.Rounding`).
    subnormals : bool
        False flushes results that are subnormal *after rounding* to a zero of
        the input's sign.
    overflow : {None, "inf", "saturate", "nan"}
        What a result that overflows to infinity under IEEE 754 §7.4 (and a
        ±inf input) becomes; None takes ``fmt.default_overflow`` (PyTorch on
        CUDA: inf for fp32/tf32/fp16/bf16/e5m2, saturate for e4m3fn and the
        MX formats, NaN for fnuz).
    seed : int, (int, int) or None
        Stochastic rounding only: the seed, or ``(seed, offset)`` where
        ``offset`` is the flat index of ``x[0]`` in a larger array, so that a
        chunk gets the same random bits as in one whole-array call. The bits of
        element ``i`` depend on ``(seed, offset + i)`` only, not on threads.
    out : ndarray, optional
        float32, C-contiguous, of x's shape; written and returned.

    Returns
    -------
    ndarray of float32, x's shape (0-d for a scalar).

    Examples
    --------
    >>> import fpemu
    >>> float(fpemu.quantize(1 + 2**-8 + 2**-30, "bf16"))   # one rounding
    1.0078125
    >>> fpemu.quantize([500.0, 465.0, -1e-8], "e4m3fn").tolist()
    [448.0, 448.0, -0.0]
    >>> fpemu.quantize(500.0, "e4m3fn", overflow="nan")
    array(nan, dtype=float32)
    """
    return _run("quantize", x, fmt, rounding, subnormals, overflow, seed, out, np.float32,
                "quantize")


@_masked
def encode(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None):
    """Round real values to a format; return the codes.

    Same arguments and semantics as :func:`quantize`. Codes are uint8 for
    formats of up to 8 bits (fp6 / fp4 in the low bits), uint16 up to 16,
    uint32 above (tf32: the 19-bit code, the top 19 bits of the fp32 pattern).
    NaN gives the format's canonical NaN code (``Format.nan_code``).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.encode([1.0, -2.0, 448.0], "e4m3fn")
    array([ 56, 192, 126], dtype=uint8)
    >>> hex(int(fpemu.encode(65520.0, "fp16")))
    '0x7c00'
    """
    return _run("encode", x, fmt, rounding, subnormals, overflow, seed, out, None, "encode")


def decode(codes, fmt):
    """The float32 values of codes of a format (inverse of :func:`encode`).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.decode([0x7E, 0xFE, 0x01], "e4m3fn").tolist()
    [448.0, -448.0, 0.001953125]
    """
    fmt = _as_format(fmt)
    arr = np.asarray(codes)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(
            arr == np.round(arr)
        ):
            raise FpemuTypeError(
                f"decode() needs integer codes, got dtype {arr.dtype}; pass "
                "codes.astype(np.uint32) if these floats are codes"
            )
        raise FpemuTypeError(f"decode() needs integer codes, got dtype {arr.dtype}")
    limit = 1 << fmt.bits
    if arr.size and (arr.min() < 0 or arr.max() >= limit):
        bad = arr[(arr < 0) | (arr >= limit)].reshape(-1)[0]
        raise FpemuValueError(
            f"decode(): {fmt.name} codes are {fmt.bits}-bit, in 0..{limit - 1}; "
            f"got {int(bad)}"
        )
    shape = arr.shape
    flat = np.ascontiguousarray(arr.astype(fmt.code_dtype, copy=False)).reshape(-1)
    out = np.empty(shape, np.float32)
    if flat.size:
        p, flags = _kernel_params(fmt, Overflow.SATURATE, True)
        run_kernel(_kernels.decode_kernel(flags), flat, out.reshape(-1), p)
    return out


def _neighbour(x, fmt, up):
    """next_up / next_down of real x: one float64 step past x, then rounded
    toward the step. No float64 lies strictly between x and the step and every
    grid point is a float64, so that rounding gives the nearest grid point
    strictly beyond x, in every format."""
    fname = "next_up" if up else "next_down"
    fmt = _as_format(fmt)
    arr, shape = _prepare_input(x, fname)
    a = arr.astype(np.float64)
    with np.errstate(over="ignore"):                   # next after ±DBL_MAX is ±inf
        step = np.nextafter(a, np.inf if up else -np.inf)
    lowest = -fmt.max if fmt.signed else (0.0 if fmt.has_zero else fmt.min_normal)
    inside = np.clip(np.where(np.isnan(step), 0.0, step), lowest, fmt.max)
    res = quantize(inside, fmt, rounding="rup" if up else "rdn",
                   overflow="saturate").astype(np.float64)
    if up:
        res = np.where(step > fmt.max, np.inf, res)     # past max: +inf, with or without inf
    else:
        res = np.where(step < lowest, -np.inf, res)     # below the lowest value: -inf
    res = np.where(np.isnan(a), np.nan, res)
    return res.astype(np.float32).reshape(shape)


def next_up(x, fmt):
    """The smallest value of the format greater than x.

    Defined for any real x, on the grid or not (IEEE 754 nextUp on the
    grid). Past the largest finite value the answer is +inf (float32),
    whether or not the format has an infinity; ``next_up(-inf)`` is
    ``-max``; NaN stays NaN; ``next_up(-min_subnormal)`` is -0.

    Examples
    --------
    >>> import fpemu
    >>> fpemu.next_up([1.0, 0.0, -2**-24, 65504.0], "fp16").tolist()
    [1.0009765625, 5.960464477539063e-08, -0.0, inf]
    """
    return _neighbour(x, fmt, True)


def next_down(x, fmt):
    """The largest value of the format less than x (mirror of :func:`next_up`).

    Below the smallest value the answer is -inf (also for e8m0, whose
    smallest value is 2**-127).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.next_down([1.0, 0.0], "bf16").tolist() == [1 - 2**-8, -2.0**-133]
    True
    """
    return _neighbour(x, fmt, False)


def ulp(x, fmt):
    """Unit in the last place of the format at x: the spacing of its binade.

    For ``|x|`` in ``[2**e, 2**(e+1))`` it is ``2**(min(max(e, emin), emax) - M)``
    (so at a power of two it is the spacing above; past the largest binade,
    that binade's spacing); ``ulp(0)`` is the smallest subnormal; inf for
    ±inf, NaN for NaN. x is taken as a real number, not rounded first (text,
    Fraction and big integers exactly).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.ulp([1.0, 256.0, 0.0], "fp16").tolist() == [2**-10, 0.25, 2**-24]
    True
    """
    fmt = _as_format(fmt)
    arr, shape = _prepare_input(x, "ulp")
    a = np.abs(arr.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(a)  # a = m * 2**e with m in [0.5, 1)
    e = np.where(a == 0, fmt.emin, np.clip(e.astype(np.int64) - 1, fmt.emin, fmt.emax))
    res = np.ldexp(1.0, e - fmt.mantissa_bits)
    res = np.where(np.isinf(a), np.inf, res)
    res = np.where(np.isnan(a), np.nan, res)
    return res.astype(np.float32).reshape(shape)


def classify(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None):
    """Class of each value once rounded to the format.

    Returns a string array of ``"zero"``, ``"subnormal"``, ``"normal"``,
    ``"inf"`` or ``"nan"`` (see :data:`CLASSES`), x's shape. The keywords are
    those of :func:`quantize`.

    Examples
    --------
    >>> import fpemu
    >>> fpemu.classify([1.0, 1e-6, 1e-9, 7e4, float("nan")], "fp16")
    array(['normal', 'subnormal', 'zero', 'inf', 'nan'], dtype='<U9')
    """
    fmt = _as_format(fmt)
    if isinstance(x, np.ma.MaskedArray):
        res = classify(x.filled(0), fmt, rounding=rounding, subnormals=subnormals,
                       overflow=overflow, seed=seed)
        return np.ma.MaskedArray(res, mask=np.ma.getmaskarray(x).copy())
    codes = encode(x, fmt, rounding=rounding, subnormals=subnormals, overflow=overflow,
                   seed=seed).astype(np.int64)
    mag = codes & (fmt.sign_code - 1) if fmt.signed else codes
    field = mag >> fmt.mantissa_bits
    cls = np.full(codes.shape, 2, np.int8)  # normal
    if fmt.has_subnormals:
        cls = np.where(field == 0, np.where(mag == 0, 0, 1), cls)
    if fmt.has_inf:
        cls = np.where(mag == fmt.inf_code, 3, cls)
    if fmt.has_nan:
        cls = np.where(codes == fmt.nan_code, 4, cls)
    return np.asarray(CLASSES, dtype="<U9")[cls.reshape(-1)].reshape(codes.shape)
