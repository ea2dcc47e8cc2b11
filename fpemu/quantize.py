"""quantize, encode, decode, next_up, next_down, ulp, classify.

These functions check and prepare; the kernels in :mod:`fpemu._kernels`
compute. The numeric contract (one rounding from the exact input, IEEE 754
§7.4 overflow then the policy, flush after rounding, no -0 in fnuz formats,
NaN into a format without NaN is an error) is in ``docs/numeric-contract.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import numpy as np

from . import _kernels
from ._jit import run_kernel
from .checks import (as_format, no_nan_into, output_array, real_array, same_buffer,
                     seed_key)
from .errors import FpemuTypeError, FpemuValueError
from .formats import FORMATS, Format
from .rounding import Overflow, Rounding, parse_overflow, parse_rng, parse_rounding

__all__ = ["Cast", "quantize", "encode", "decode", "next_up", "next_down", "ulp", "classify",
           "not_in_format", "stochastic_bits"]

#: The classes :func:`classify` returns, in order.
CLASSES = ("zero", "subnormal", "normal", "inf", "nan")


# ------------------------------------------------------------- kernel side
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


@functools.lru_cache(maxsize=None)
def _common_flags() -> frozenset:
    """The kernel flags of every named format with its default overflow
    policy and subnormals: the configurations worth a kernel of their own."""
    return frozenset(_kernel_params(f, _resolve_overflow(f, None), True)[1] for f in FORMATS)


def specialise(flags: int) -> int:
    """``flags`` if a kernel compiled for them alone pays (a named format's
    defaults), else -1: the kernel that reads the flags at run time (see
    :func:`fpemu._kernels.rounding_kernel`)."""
    return flags if flags in _common_flags() else -1


def _ieee_fast_kind(fmt: Format, flags: int):
    """How many ulps below the top of its exponent range ``fmt``'s largest
    value lies (1 for IEEE-style formats, 2 for "fn" ones), where the fast
    paths take ``fmt`` under ``flags``: nothing but the overflow policy set
    (no flush), and ``fmt`` signed with a signed zero, subnormals, a NaN and
    exponents within float32's, either IEEE-style (inf and NaN in the top
    exponent: bf16, fp16, e5m2) or "fn" (no inf, the top binade's last code
    the NaN: e4m3fn); else None."""
    policy = Overflow(flags & 3) if flags in (0, 1, 2) else None
    if policy is None:
        return None
    m = fmt.mantissa_bits
    if not (fmt.has_nan and fmt.has_subnormals and fmt.signed and 1 <= m < 23
            and -126 <= fmt.emin and fmt.emax <= 127):
        return None
    if fmt.nan_encoding == "ieee" and fmt.has_inf:
        ulps_below_top = 1              # max = (2 - 2**-m) * 2**emax, odd: its tie rounds up
    elif fmt.nan_encoding == "fn" and not fmt.has_inf:
        ulps_below_top = 2              # the top code is NaN: max is even, its tie stays
    else:
        return None
    if fmt.max != (2.0 - ulps_below_top * 2.0 ** -m) * 2.0 ** fmt.emax:
        return None
    if policy is Overflow.INF and not fmt.has_inf:
        return None
    return ulps_below_top


def _f32_bits(v):
    return np.uint32(np.array(v, np.float32).view(np.uint32))


def _overflow_result(fmt, flags):
    """The float32 bits, ``(sign & ovf_sign) | ovf_mag``, of an overflow that
    goes to infinity under the overflow policy in ``flags``."""
    return {Overflow.INF: (np.uint32(0x7F800000), np.uint32(0x80000000)),
            Overflow.SATURATE: (_f32_bits(fmt.max), np.uint32(0x80000000)),
            Overflow.NAN: (np.uint32(0x7FC00000), np.uint32(0))}[Overflow(flags & 3)]


def _overflow_code(fmt, flags):
    sign_code = 1 << (fmt.bits - 1)
    code, sign = {Overflow.INF: (fmt.inf_code, sign_code),
                  Overflow.SATURATE: (fmt.max_code, sign_code),
                  Overflow.NAN: (fmt.nan_code, 0)}[Overflow(flags & 3)]
    return np.uint32(code), np.uint32(sign)


@functools.lru_cache(maxsize=None)
def _fast_rne_params(fmt: Format, mode: Rounding, flags: int):
    """The arguments of ``quantize_rne_ieee`` (``fpemu/_kernels/fast.py``) when ``mode``
    is RNE and :func:`_ieee_fast_kind` takes the format; else None."""
    ulps_below_top = _ieee_fast_kind(fmt, flags)
    if mode is not Rounding.RNE or ulps_below_top is None:
        return None
    m = fmt.mantissa_bits
    halfway = fmt.max + 2.0 ** (fmt.emax - m - 1)
    overflow = _f32_bits(halfway) + np.uint32(ulps_below_top - 1)
    return (23 - m, _f32_bits(2.0 ** fmt.emin), overflow, np.float32(2.0 ** (fmt.emin - m + 23)),
            *_overflow_result(fmt, flags))


@functools.lru_cache(maxsize=None)
def _fast_encode_params(fmt: Format, mode: Rounding, flags: int):
    """The arguments of :func:`fpemu._kernels.encode_rne_ieee` where
    :func:`_fast_rne_params` has a fast path (else None): the quantize
    arguments, less the overflow result, plus the code layout (rebias, NaN
    code, overflow code and its sign mask, the sign bit)."""
    q = _fast_rne_params(fmt, mode, flags)
    if q is None:
        return None
    m = fmt.mantissa_bits
    return (q[0], q[1], q[2], q[3], np.uint32((127 - fmt.bias) << m), np.uint32(fmt.nan_code),
            *_overflow_code(fmt, flags), np.uint32(1 << (fmt.bits - 1)))


_DIRECTED = (Rounding.RNA, Rounding.RTZ, Rounding.RUP, Rounding.RDN, Rounding.RTO)


@functools.lru_cache(maxsize=None)
def _fast_directed_params(fmt: Format, mode: Rounding, flags: int):
    """The arguments of ``fpemu._kernels.directed_kernel("quantize", mode)``
    for the other deterministic modes (RNA, RTZ, RUP, RDN, RTO) where
    :func:`_ieee_fast_kind` takes the format; else None: the shift, the
    bits of 2**emin and of the largest value, magic (2**(emin - m + 23),
    whose ulp is the subnormal step), the step, the overflow result."""
    if mode not in _DIRECTED or _ieee_fast_kind(fmt, flags) is None:
        return None
    m = fmt.mantissa_bits
    return (23 - m, _f32_bits(2.0 ** fmt.emin), _f32_bits(fmt.max),
            np.float32(2.0 ** (fmt.emin - m + 23)), np.float32(2.0 ** (fmt.emin - m)),
            *_overflow_result(fmt, flags))


@functools.lru_cache(maxsize=None)
def _fast_directed_encode_params(fmt: Format, mode: Rounding, flags: int):
    """The arguments of ``fpemu._kernels.directed_kernel("encode", mode)``:
    those of :func:`_fast_directed_params` up to the step, then the code
    layout (rebias, NaN code, overflow code and its sign mask, the sign bit,
    the largest value's code); else None."""
    q = _fast_directed_params(fmt, mode, flags)
    if q is None:
        return None
    m = fmt.mantissa_bits
    return (*q[:5], np.uint32((127 - fmt.bias) << m), np.uint32(fmt.nan_code),
            *_overflow_code(fmt, flags), np.uint32(1 << (fmt.bits - 1)),
            np.uint32(fmt.max_code))


# ------------------------------------------------------------------------ Cast
class Layout(NamedTuple):
    """What a kernel sees of a format (``Cast.params``, by name): the
    mantissa width, the exponents of the normal range, the bias, the largest
    finite magnitude code, the infinity's and the NaN's magnitude codes (-1:
    none) and the position of the sign bit."""

    mantissa_bits: int
    emin: int
    emax: int
    bias: int
    max_code: int
    inf_code: int
    nan_code: int
    sign_shift: int


@dataclasses.dataclass(frozen=True, eq=False)
class Cast:
    """One rounding configuration, checked once: the format, the rounding
    mode, the overflow policy and subnormals, with what the kernels see of
    them (``params``, ``flags``, the specialised ``kernel_flags``) and the
    arguments of the IEEE-style nearest-even fast path (``fast``, or None).

    ``Cast.of(fmt, rounding="rne", subnormals=True, overflow=None)`` builds
    it once per configuration (cached); :func:`quantize`, :func:`encode`,
    :func:`classify`, :mod:`fpemu.stats`, :mod:`fpemu.arith`,
    :mod:`fpemu.accumulate` and ``fpemu.autograd``'s storage rounding all go
    through it.

    Examples
    --------
    >>> import fpemu
    >>> c = fpemu.Cast.of("bf16")
    >>> c.quantize([1 + 2**-8 + 2**-30]).tolist(), c is fpemu.Cast.of("bf16")
    ([1.0078125], True)
    """

    fmt: Format
    rounding: Rounding
    overflow: Overflow
    subnormals: bool
    params: tuple
    flags: int
    kernel_flags: int
    fast: Optional[tuple]
    fast_encode: Optional[tuple] = None
    fast_directed: Optional[tuple] = None
    fast_directed_encode: Optional[tuple] = None
    rng: str = "splitmix64"

    # the bits of ``flags`` beyond the overflow policy (``flags & 3``), by name,
    # for code that reads them (fpemu.torch's quantizers)
    FLUSH = _kernels.FLUSH          #: subnormals flushed to zero
    FNUZ = _kernels.FNUZ            #: fnuz NaN (the negative-zero code)
    UNSIGNED = _kernels.UNSIGNED    #: no sign bit
    NO_ZERO = _kernels.NO_ZERO      #: no zero (e8m0)
    NORMALIZE = _kernels.NORMALIZE  #: subnormals below float32's range
    SR_PHILOX = _kernels.SR_PHILOX  #: :attr:`kernel_mode` of stochastic rounding by Philox

    @staticmethod
    def of(fmt, rounding="rne", subnormals=True, overflow=None, rng=None) -> "Cast":
        """The cast for this configuration (built once; the arguments are
        those of :func:`quantize`)."""
        key = (fmt, rounding, subnormals, type(subnormals), overflow, rng)
        try:
            return _CASTS[key]
        except KeyError:
            pass
        except TypeError:                       # an unhashable argument: check it, uncached
            return Cast._build(fmt, rounding, subnormals, overflow, rng)
        cast = _CASTS[key] = Cast._build(fmt, rounding, subnormals, overflow, rng)
        return cast

    @staticmethod
    def default(fmt) -> "Cast":
        """``Cast.of(fmt)`` (nearest even, the format's default overflow and
        subnormals) in one dict lookup by the format object: the storage
        rounding of every ``fpemu.autograd`` op asks for it."""
        try:
            return _DEFAULT_CASTS[fmt]
        except KeyError:
            cast = _DEFAULT_CASTS[fmt] = Cast.of(fmt)
            return cast

    @staticmethod
    def _build(fmt, rounding, subnormals, overflow, rng=None):
        fmt = as_format(fmt)
        mode = parse_rounding(rounding)
        pol = _resolve_overflow(fmt, overflow)
        params, flags = _kernel_params(fmt, pol, subnormals)
        return Cast(fmt, mode, pol, bool(subnormals), params, flags, specialise(flags),
                    _fast_rne_params(fmt, mode, flags), _fast_encode_params(fmt, mode, flags),
                    _fast_directed_params(fmt, mode, flags),
                    _fast_directed_encode_params(fmt, mode, flags), parse_rng(rng))

    @property
    def kernel_mode(self) -> int:
        """The rounding mode as the kernels number it: the :class:`Rounding`
        value, except stochastic rounding drawing from Philox4x32-10
        (``rng="philox"``)."""
        if self.rounding is Rounding.SR and self.rng == "philox":
            return _kernels.SR_PHILOX
        return int(self.rounding)

    @property
    def layout(self) -> Layout:
        """:attr:`params` by name (:class:`Layout`), for code outside the
        kernels that reads them (``fpemu.torch``'s quantizers)."""
        return Layout(*self.params)

    def seed_key(self, seed):
        """(64-bit key, index offset) of ``seed`` for stochastic rounding
        (0, 0 for the other modes)."""
        return seed_key(seed, self.rounding)

    def fast_path(self, op):
        """(kernel, arguments) of the fast path of ``op`` ("quantize" or
        "encode") on float32 input, or None: nearest even
        (``rne_kernel``) or another deterministic mode (``directed_kernel``),
        where the format and policy allow one; a format with float32's
        exponent range (bf16, tf32) takes the integer-only twin."""
        wide = self.fmt.emin == -126        # float32's exponent range (see rne_kernel)
        if op == "quantize":
            if self.fast is not None:
                return _kernels.rne_kernel(op, wide), self.fast
            args = self.fast_directed
        else:
            if self.fast_encode is not None:
                return _kernels.rne_kernel(op, wide), self.fast_encode
            args = self.fast_directed_encode
        return None if args is None else (_kernels.directed_kernel(op, self.rounding, wide), args)

    def kernel(self, op, dtype):
        """The rounding kernel of ``op`` ("quantize" or "encode") for input
        ``dtype`` (float32 or float64)."""
        return _kernels.rounding_kernel(op, np.dtype(dtype).str[1:], self.kernel_mode,
                                        self.kernel_flags)

    def _run(self, op, x, seed, out, dtype, fname):
        key, offset = seed_key(seed, self.rounding)
        arr, shape = real_array(x, fname)
        no_nan_into(self.fmt, arr, fname)
        result = output_array(out, shape, self.fmt.code_dtype if dtype is None else dtype,
                              fname)
        if out is not None and np.may_share_memory(arr, result) and not same_buffer(arr,
                                                                                    result):
            arr = arr.copy()  # out overlaps x at an offset: elements would be read after written
        if arr.size:
            fast = self.fast_path(op)
            out_dtype = np.float32 if op == "quantize" else self.fmt.code_dtype
            if fast is not None and arr.dtype == np.float32 and result.dtype == out_dtype:
                run_kernel(fast[0], arr, result.reshape(-1), *fast[1], inputs=1)
                return result
            run_kernel(self.kernel(op, arr.dtype), arr, result.reshape(-1), self.params, key,
                       offset, self.flags, inputs=1)
        return result

    def quantize(self, x, *, seed=None, out=None, fname="quantize"):
        """:func:`quantize` under this configuration."""
        return self._run("quantize", x, seed, out, np.float32, fname)

    def encode(self, x, *, seed=None, out=None, fname="encode"):
        """:func:`encode` under this configuration."""
        return self._run("encode", x, seed, out, None, fname)

    def decode(self, codes):
        """:func:`decode` of this format."""
        return decode(codes, self.fmt)

    def classify(self, x, *, seed=None):
        """:func:`classify` under this configuration."""
        return _classes(self.encode(x, seed=seed, fname="classify"), self.fmt)

    def round_float32(self, x32, out=None):
        """The rounded values of a C-contiguous float32 array, with no
        argument checks (callers that have checked already: fpemu.autograd's
        storage rounding). Deterministic modes only."""
        res = np.empty(x32.shape, np.float32) if out is None else out
        return self.round_into("quantize", x32, res)

    def round_into(self, op, x, out, key=0, offset=0):
        """``op`` ("quantize" or "encode") of the C-contiguous float32 or
        float64 array ``x`` into ``out`` (C-contiguous, x's size, float32 or
        the format's code dtype), with no argument checks: for callers that
        checked the input already (no NaN into a format without one) and hold
        stochastic rounding's ``(key, offset)`` (:meth:`seed_key`), such as
        ``fpemu.torch``'s quantizers on a CPU tensor's own memory. ``out``
        may be ``x``'s own memory (each element is read before it is
        written). Returns ``out``."""
        if x.size:
            flat, dst = x.reshape(-1), out.reshape(-1)
            fast = self.fast_path(op)
            if fast is not None and x.dtype == np.float32:
                run_kernel(fast[0], flat, dst, *fast[1], inputs=1)
            else:
                run_kernel(self.kernel(op, x.dtype), flat, dst, self.params, key, offset,
                           self.flags, inputs=1)
        return out

    def decode_into(self, codes, out):
        """The float32 values of the C-contiguous codes ``codes`` (the
        format's code dtype, every code valid: no check) into ``out``
        (C-contiguous float32 of the same size). Returns ``out``."""
        if codes.size:
            p, flags = _kernel_params(self.fmt, Overflow.SATURATE, True)
            run_kernel(_kernels.decode_kernel(flags), codes.reshape(-1), out.reshape(-1), p,
                       inputs=1)
        return out


_CASTS = {}
_DEFAULT_CASTS = {}


# ------------------------------------------------------------------ public API
def not_in_format(x, fmt: Format):
    """Mask of the elements of the float array ``x`` that are not values of
    ``fmt`` (a NaN counts as one where the format has NaN; -0 only where it
    has a signed zero)."""
    nan = np.isnan(x)
    xs = np.where(nan, 0.0, x)
    q = quantize(xs, fmt, rounding="rtz").astype(x.dtype)
    bad = ~((q == xs) & (np.signbit(q) == np.signbit(xs))) & ~nan
    return bad | nan if not fmt.has_nan else bad


@_masked
def quantize(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None,
             rng=None):
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
    rng : {None, "splitmix64", "philox"}
        Stochastic rounding only: the generator of those bits. None takes
        ``"splitmix64"`` (fpemu's stream from the start, so earlier results
        reproduce); ``"philox"`` is Philox4x32-10, cuRAND's and PyTorch
        CUDA's generator. Both are counter-based: the same bits from the
        Numba kernels, :mod:`fpemu.torch` and its Triton kernels.
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
    return Cast.of(fmt, rounding, subnormals, overflow, rng).quantize(x, seed=seed, out=out)


@_masked
def encode(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None,
           rng=None):
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
    return Cast.of(fmt, rounding, subnormals, overflow, rng).encode(x, seed=seed, out=out)


def decode(codes, fmt):
    """The float32 values of codes of a format (inverse of :func:`encode`).

    Examples
    --------
    >>> import fpemu
    >>> fpemu.decode([0x7E, 0xFE, 0x01], "e4m3fn").tolist()
    [448.0, -448.0, 0.001953125]
    """
    fmt = as_format(fmt)
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
        run_kernel(_kernels.decode_kernel(flags), flat, out.reshape(-1), p, inputs=1)
    return out


def stochastic_bits(seed, size, *, rng=None):
    """The 63 random bits (int64 >= 0) that stochastic rounding compares with
    the dropped bits, for elements ``offset .. offset + size - 1`` of a call
    with ``seed`` (an int, or ``(seed, offset)`` as in :func:`quantize`, or a
    list of ints >= 0: NumPy's entropy, as the fp8 recipes seed ``"srN"``).

    ``rng="splitmix64"`` (None): ``splitmix64(key + (i + 1) * 0x9E3779B97F4A7C15)
    >> 1``; ``rng="philox"``: Philox4x32-10 of counter ``(i mod 2**32, i >>
    32, 0, 0)`` under key ``(key mod 2**32, key >> 32)``, its words 1 and 0
    as one 64-bit number, shifted right once; ``key`` is the seed's 64-bit
    key (NumPy's ``SeedSequence(seed)``). :func:`quantize` rounds element
    ``i`` up where its draw is below the dropped part read as a 63-bit
    fraction; ``fpemu.block``'s ``"srN"`` takes the top N bits of the Philox
    draw.

    Examples
    --------
    >>> from fpemu.quantize import stochastic_bits
    >>> bool(stochastic_bits((7, 10), 3, rng="philox")[1]
    ...      == stochastic_bits(7, 12, rng="philox")[11])
    True
    """
    cast = Cast.of("bf16", "sr", rng=rng)
    key, offset = seed_key(seed, Rounding.SR, entropy=True)
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
        raise FpemuValueError(f"stochastic_bits(): size is a count of elements, an int >= 0; "
                              f"got {size!r}")
    out = np.empty(int(size), np.int64)
    if out.size:
        run_kernel(_kernels.random63_kernel, key, offset, cast.kernel_mode, out)
    return out


def _neighbour(x, fmt, up):
    """next_up / next_down of real x: one float64 step past x, then rounded
    toward the step. No float64 lies strictly between x and the step and every
    grid point is a float64, so that rounding gives the nearest grid point
    strictly beyond x, in every format."""
    fname = "next_up" if up else "next_down"
    fmt = as_format(fmt)
    arr, shape = real_array(x, fname)
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
    fmt = as_format(fmt)
    arr, shape = real_array(x, "ulp")
    a = np.abs(arr.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e = np.frexp(a)  # a = m * 2**e with m in [0.5, 1)
    e = np.where(a == 0, fmt.emin, np.clip(e.astype(np.int64) - 1, fmt.emin, fmt.emax))
    res = np.ldexp(1.0, e - fmt.mantissa_bits)
    res = np.where(np.isinf(a), np.inf, res)
    res = np.where(np.isnan(a), np.nan, res)
    return res.astype(np.float32).reshape(shape)


def classify(x, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, rng=None):
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
    cast = Cast.of(fmt, rounding, subnormals, overflow, rng)
    if isinstance(x, np.ma.MaskedArray):
        res = cast.classify(x.filled(0), seed=seed)
        return np.ma.MaskedArray(res, mask=np.ma.getmaskarray(x).copy())
    return cast.classify(x, seed=seed)


def _classes(codes, fmt):
    """The class names of codes of ``fmt``."""
    codes = codes.astype(np.int64)
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
