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
from ._jit import inlining, run_kernel
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


# ----------------------------------------------------------------- preparation
def _as_format(fmt) -> Format:
    return _lookup(fmt)


def _prepare_input(x, fname):
    """Return (1-D contiguous native float32/float64 array, original shape)."""
    arr = np.asarray(x)
    dt = arr.dtype
    if dt.kind == "c":
        raise TypeError(
            f"{fname}() got a complex array ({dt}); pass real values, "
            "e.g. x.real and x.imag separately"
        )
    if dt.kind in "OUSMmV" and dt.name not in _ML_DTYPES_NAMES:
        got = "a Python object array" if dt.kind == "O" else f"an array of dtype {dt}"
        raise TypeError(
            f"{fname}() got {got}; pass real numbers (a float32 or float64 array, "
            "or anything np.asarray turns into one)"
        )
    if dt.name in _ML_DTYPES_NAMES:
        arr = arr.astype(np.float32)  # every ml_dtypes value is exact in float32
    elif dt.kind == "b":
        arr = arr.astype(np.float32)
    elif dt.kind in "iu":
        wide = arr.astype(np.float64)
        back = wide.astype(dt) if wide.size and np.all(np.abs(wide) < 2.0**63) else None
        if back is None or not np.array_equal(back, arr):
            raise ValueError(
                f"{fname}() got integers that float64 cannot hold exactly (|x| > 2**53); "
                "round them yourself first or pass a float array"
            )
        arr = wide
    elif dt.kind == "f":
        if dt.itemsize == 2:
            arr = arr.astype(np.float32)  # exact
        elif dt.itemsize > 8:
            wide = arr.astype(np.float64)
            same = (wide == arr) | (np.isnan(arr) & np.isnan(wide))
            if not np.all(same):
                raise ValueError(
                    f"{fname}() got {dt} values that float64 cannot hold exactly; "
                    "converting would round twice. Pass float64 values."
                )
            arr = wide
    else:  # pragma: no cover - every numpy kind is handled above
        raise TypeError(f"{fname}() cannot read dtype {dt}")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    shape = arr.shape
    return np.ascontiguousarray(arr).reshape(-1), shape


def _prepare_out(out, shape, dtype, fname):
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{fname}(): out must be a numpy array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{fname}(): out must have dtype {np.dtype(dtype)}, got {out.dtype}")
    if out.shape != tuple(shape):
        raise ValueError(f"{fname}(): out has shape {out.shape}, the input has {tuple(shape)}")
    if not (out.flags.c_contiguous and out.flags.writeable and out.dtype.isnative):
        raise ValueError(
            f"{fname}(): out must be a writeable, C-contiguous, native-byte-order array; "
            "pass np.empty(shape, dtype) or leave out=None"
        )
    return out


def _resolve_overflow(fmt: Format, overflow) -> Overflow:
    pol = parse_overflow(fmt.default_overflow if overflow is None else overflow)
    if pol is Overflow.INF and not fmt.has_inf:
        choices = "'saturate' or 'nan'" if fmt.has_nan else "'saturate'"
        raise ValueError(
            f"{fmt.long_name or fmt.name} has no infinity; pass overflow={choices} "
            f"(or None for its default, {fmt.default_overflow!r})"
        )
    if pol is Overflow.NAN and not fmt.has_nan:
        raise ValueError(
            f"{fmt.long_name or fmt.name} has no NaN; pass overflow='saturate'"
        )
    return pol


def _kernel_params(fmt: Format, pol: Overflow, subnormals: bool) -> tuple:
    """(p, flags): what a kernel sees of the format (layout in fpemu._kernels)."""
    if not isinstance(subnormals, (bool, np.bool_)):
        raise TypeError(f"subnormals must be True or False, got {subnormals!r}")
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


def _seed_key(seed, mode: Rounding):
    """(64-bit key as int64, index offset) for stochastic rounding."""
    if mode is not Rounding.SR:
        return 0, 0
    offset = 0
    if isinstance(seed, tuple):
        if len(seed) != 2:
            raise ValueError(f"seed must be an int or a pair (seed, offset), got {seed!r}")
        seed, offset = seed
        if not isinstance(offset, numbers.Integral) or offset < 0:
            raise ValueError(
                f"the offset in seed=(seed, offset) must be an int >= 0, got {offset!r}"
            )
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)
                             or seed < 0):
        raise ValueError(
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
            raise ValueError(
                f"{fname}(): {fmt.long_name or fmt.name} has no NaN, but the input holds "
                f"{int(bad.sum())} NaN value(s) (the first at flat index {first}); "
                "replace them (np.nan_to_num) or use a format with NaN"
            )


def _run(op, x, fmt, rounding, subnormals, overflow, seed, out, dtype, fname):
    fmt = _as_format(fmt)
    mode = parse_rounding(rounding)
    pol = _resolve_overflow(fmt, overflow)
    params, flags = _kernel_params(fmt, pol, subnormals)
    key, offset = _seed_key(seed, mode)
    arr, shape = _prepare_input(x, fname)
    _check_nan_input(fmt, arr, fname)
    result = _prepare_out(out, shape, fmt.code_dtype if dtype is None else dtype, fname)
    if arr.size:
        kernel = _kernels.rounding_kernel(op, arr.dtype.str[1:], int(mode), flags)
        run_kernel(kernel, arr, result.reshape(-1), params, key, offset)
    return result


# ------------------------------------------------------------------ public API
def quantize(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None):
    """Round real values to a format; return the values as float32.

    Parameters
    ----------
    x : array_like
        Real values: float16/32/64, ml_dtypes types, integers exact in
        float64, Python scalars. float32 and float64 are read as they are;
        a float64 value is rounded once, never through float32 first.
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
            raise TypeError(
                f"decode() needs integer codes, got dtype {arr.dtype}; pass "
                "codes.astype(np.uint32) if these floats are codes"
            )
        raise TypeError(f"decode() needs integer codes, got dtype {arr.dtype}")
    limit = 1 << fmt.bits
    if arr.size and (arr.min() < 0 or arr.max() >= limit):
        bad = arr[(arr < 0) | (arr >= limit)].reshape(-1)[0]
        raise ValueError(
            f"decode(): {fmt.name} codes are {fmt.bits}-bit, in 0..{limit - 1}; "
            f"got {int(bad)}"
        )
    shape = arr.shape
    flat = np.ascontiguousarray(arr.astype(fmt.code_dtype, copy=False)).reshape(-1)
    out = np.empty(shape, np.float32)
    if flat.size:
        with inlining():
            p, flags = _kernel_params(fmt, Overflow.SATURATE, True)
            _kernels.decode_kernel(flags)(flat, out.reshape(-1), p)
    return out


@functools.lru_cache(maxsize=None)
def _finite_values(fmt: Format) -> np.ndarray:
    """Sorted distinct finite values of a format of at most 20 bits (float64)."""
    codes = np.arange(1 << fmt.bits, dtype=np.uint32).astype(fmt.code_dtype)
    vals = decode(codes, fmt).astype(np.float64)
    vals = vals[np.isfinite(vals)]
    vals = np.unique(np.where(vals == 0, 0.0, vals))  # one zero entry, +0
    vals.setflags(write=False)
    return vals


def _neighbour(x, fmt, up):
    fname = "next_up" if up else "next_down"
    fmt = _as_format(fmt)
    arr, shape = _prepare_input(x, fname)
    a = arr.astype(np.float64)
    if fmt.bits > 20:  # fp32 is float32 itself
        with np.errstate(over="ignore"):
            res = np.nextafter(arr.astype(np.float32), np.float32(np.inf if up else -np.inf))
        return res.reshape(shape)
    vals = _finite_values(fmt)
    with np.errstate(invalid="ignore"):
        if up:
            idx = np.searchsorted(vals, a, side="right")
            ok = idx < vals.size
            res = np.where(ok, vals[np.minimum(idx, vals.size - 1)], np.inf)
        else:
            idx = np.searchsorted(vals, a, side="left") - 1
            ok = idx >= 0
            res = np.where(ok, vals[np.maximum(idx, 0)], -np.inf)
        if fmt.has_negative_zero:  # IEEE 754 nextUp(-min_subnormal) is -0
            res = np.where((res == 0) & (a < 0), -0.0, res)
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

    For ``|x|`` in ``[2**e, 2**(e+1))`` it is ``2**(max(e, emin) - M)``
    (so at a power of two it is the spacing above); ``ulp(0)`` is the
    smallest subnormal; inf for ±inf, NaN for NaN. x is taken as a real
    number, not rounded first.

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
    e = np.where(a == 0, fmt.emin, np.maximum(e.astype(np.int64) - 1, fmt.emin))
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
    return np.asarray(CLASSES)[cls].astype("<U9")
