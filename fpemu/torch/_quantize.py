"""fpemu's rounding in torch, on the tensor's own device.

:func:`quantize`, :func:`encode` and :func:`decode` give the same bits as
:func:`fpemu.quantize`, :func:`fpemu.encode` and :func:`fpemu.decode` on
every float32 input, for every format, rounding mode, overflow policy and
subnormal setting, computed where the tensor lives: a CPU tensor by fpemu's
Numba kernels on its own memory (:meth:`fpemu.Cast.round_into`), a CUDA tensor
by one fused Triton kernel (``_triton.py``) where ``triton`` is installed,
anything else with the torch code of this module: element-wise integer
operations on the float32 bits (``t.view(torch.int32)``), no copy to the host,
no floating-point arithmetic (so no flush-to-zero mode of any device or
compiler can change a bit).

The arithmetic is fpemu's element rounding, :mod:`fpemu._elemround`, the
source that the Numba kernels and the Triton kernels run too, here run on
whole tensors (:data:`_elements`: each of its primitives an element-wise
torch operation): split each float32 into sign, exponent and integer
significand, round at the format's quantum in the mode, then overflow and
the policy, flushing, the sign rules, NaN; and the float32 bits of a code,
built with shifts.

Stochastic rounding draws, for element ``i`` of the flattened (row-major)
tensor, the 63-bit number ``splitmix64(key + (offset + i + 1) * golden) >> 1``
(Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014), in wrapping 64-bit integer arithmetic, and rounds up where it
is below the dropped bits read as a 63-bit fraction: the generator of
:func:`fpemu.quantize`, so a seed gives the same bits on any device and in
any chunking (``seed=(seed, offset)``).

Under ``torch.compile`` the three functions are custom operators, opaque in
the graph (the end of this module).
"""

from __future__ import annotations

import ast
import dataclasses

import numpy as np

from .. import _elemround, _jit
from ..checks import seed_key
from ..errors import FpemuTypeError, FpemuValueError
from ..formats import Format
from ..quantize import Cast
from ..rounding import Overflow, Rounding
from ._import import torch_module

FLUSH, FNUZ, UNSIGNED = Cast.FLUSH, Cast.FNUZ, Cast.UNSIGNED
NO_ZERO, NORMALIZE = Cast.NO_ZERO, Cast.NORMALIZE
torch = torch_module()

__all__ = ["quantize", "encode", "decode"]

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(v, bits=64):
    """The two's-complement signed value of the ``bits``-bit pattern ``v``."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _lsr64(z, k):
    """Logical right shift of int64 ``z`` by ``k`` (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _random63(key, offset, shape, device):
    """63 uniform random bits (int64 >= 0) for each element of a tensor of
    ``shape``, element ``i`` (flat, row-major) drawing ``splitmix64(key +
    (offset + i + 1) * golden) >> 1``, as fpemu's host kernels do."""
    index = torch.arange(shape.numel(), device=device, dtype=torch.int64).view(shape)
    z = index * _signed(_GOLDEN) + _signed(key + (offset + 1) * _GOLDEN)
    z = (z ^ _lsr64(z, 30)) * _signed(_MIX1)
    z = (z ^ _lsr64(z, 27)) * _signed(_MIX2)
    z = z ^ _lsr64(z, 31)
    return _lsr64(z, 1)


_PH_M0, _PH_M1 = 0xD2511F53, 0xCD9E8D57
_PH_W0, _PH_W1 = 0x9E3779B9, 0xBB67AE85
_M32 = 0xFFFFFFFF


def _philox63(key, offset, shape, device):
    """63 uniform random bits (int64 >= 0) for each element of a tensor of
    ``shape``: element ``i`` takes Philox4x32-10 of counter ``(offset + i,
    0)`` under the 64-bit ``key``, the top 63 bits of its first two words
    (word 1 high), as fpemu's host kernels do (``rng="philox"``). The 32 x
    32-bit products are int64 products: where one wraps past 2**63 its low
    64 bits, which are all that is read, are still the product's."""
    n = torch.arange(shape.numel(), device=device, dtype=torch.int64).view(shape) + offset
    c0, c1 = n & _M32, n >> 32
    c2 = c3 = torch.zeros_like(n)
    k = key & ((1 << 64) - 1)
    k0, k1 = k & _M32, k >> 32
    for _ in range(10):
        p0, p1 = c0 * _PH_M0, c2 * _PH_M1
        c0, c1, c2, c3 = (((p1 >> 32) & _M32) ^ c1 ^ k0, p1 & _M32,
                          ((p0 >> 32) & _M32) ^ c3 ^ k1, p0 & _M32)
        k0, k1 = (k0 + _PH_W0) & _M32, (k1 + _PH_W1) & _M32
    return (c1 << 31) | (c0 >> 1)


def _draw63(key, index, mode):
    """The 63-bit draws of a tensor's elements; ``index`` is (offset, shape,
    device) (see :data:`_elements`)."""
    offset, shape, device = index
    return (_philox63 if mode == Cast.SR_PHILOX else _random63)(key, offset, shape, device)


def _where(c, a, b):
    return torch.where(c, a, b) if isinstance(c, torch.Tensor) else (a if c else b)


def _clamped(a, b, op, bound):
    """``op(a, b)`` (torch.minimum or torch.maximum) where either may be a
    Python int: a bound of ``clamp`` (``bound``: "max" or "min")."""
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    if not isinstance(a, torch.Tensor):
        return (min if bound == "max" else max)(a, b)
    return op(a, b) if isinstance(b, torch.Tensor) else a.clamp(**{bound: b})


def _to(dtype, wrap):
    return lambda x: x.to(dtype) if isinstance(x, torch.Tensor) else wrap(x)


#: :mod:`fpemu._elemround` on whole tensors: each primitive an element-wise
#: torch operation (a Python int, as the format's parameters are, stays one),
#: so that the functions compute every element of a tensor at once with
#: integer operations on the float32 bits; stochastic rounding's ``index``
#: is the tensor's (first flat index, shape, device).
_elements = _elemround.bind("fpemu.torch._quantize.elements", dict(
    where=_where,
    minimum=lambda a, b: _clamped(a, b, torch.minimum, "max"),
    maximum=lambda a, b: _clamped(a, b, torch.maximum, "min"),
    i32=_to(torch.int32, _elemround.i32), i64=_to(torch.int64, int),
    shl=lambda a, s: _elemround.shl(a, s) if isinstance(a, int) and isinstance(s, int)
    else a << s,
    ashr=lambda a, s: a >> s,
    lnot=lambda b: ~b if isinstance(b, torch.Tensor) else not b,
    float_bits=lambda n: n.to(torch.float32).view(torch.int32),
    draw63=_draw63))


def _rounded(u, cast, key, offset):
    """(magnitude code, negative, nan) of the float32 bits ``u`` (int32)
    rounded under ``cast``, the flat index of ``u``'s first element being
    ``offset``."""
    L = cast.layout
    return _elements.rounded(u, L.mantissa_bits, L.emin, L.emax, L.bias, L.max_code,
                             L.inf_code, cast.flags, cast.mode, key, (offset, u.shape, u.device))


def _value_bits(mag, negative, nan, cast):
    """The float32 bits (int32) of magnitude codes ``mag``."""
    L = cast.layout
    return _elements.value_bits(mag, negative, nan, L.mantissa_bits, L.emin, L.bias, L.inf_code,
                                cast.flags)


# ------------------------------------------------------------------ input checks
_WHAT = ("a floating-point torch tensor (float32, or float16 / bfloat16 / float8, whose "
         "values float32 holds exactly, or float64 holding float32 values)")


def _check_tensor(t, fname):
    if not isinstance(t, torch.Tensor):
        hint = ("; for NumPy arrays and Python numbers use fpemu.quantize / fpemu.encode, "
                "or wrap them with torch.as_tensor(x, dtype=torch.float32)")
        raise FpemuTypeError(f"fpemu.torch.{fname}() takes {_WHAT}; got "
                             f"{type(t).__name__}{hint}")
    if t.layout != torch.strided:
        raise FpemuTypeError(f"fpemu.torch.{fname}() takes a dense tensor; got layout "
                             f"{t.layout}; pass t.to_dense()")
    if t.is_meta:
        raise FpemuValueError(f"fpemu.torch.{fname}() got a meta tensor, which has a shape but "
                              "no values to round; pass a tensor on the CPU or a GPU")


def _float32_bits(t, fname):
    """The float32 bits (int32 tensor) of ``t``: float32 as it is, narrower
    floats widened (exact), float64 only where each value is a float32."""
    _check_tensor(t, fname)
    t = t.detach()
    if t.is_complex() or not t.is_floating_point():
        extra = ("; round its real and imaginary parts separately (t.real, t.imag)"
                 if t.is_complex() else
                 "; cast it first with t.to(torch.float32) if its values are float32 numbers, "
                 "or round integers exactly with fpemu.quantize(t.numpy(), ...)")
        raise FpemuTypeError(f"fpemu.torch.{fname}() takes {_WHAT}; got {t.dtype}{extra}")
    if t.dtype == torch.float64:
        t32 = t.to(torch.float32)
        off = (t32.to(torch.float64) != t) & ~torch.isnan(t)
        first = "" if not bool(off.any()) else \
            f" (the first: {float(t[off].reshape(-1)[0])!r})"
        _refuse(off,
                f"fpemu.torch.{fname}() got float64 values that float32 does not hold{first}; "
                "rounding them to float32 first would round twice. Round them once with "
                "fpemu.quantize(t.cpu().numpy(), ...), which reads float64 exactly, or pass "
                "t.to(torch.float32) if float32 is what you mean")
        t = t32
    elif t.dtype != torch.float32:
        t = t.to(torch.float32)
    return t.resolve_neg().contiguous().view(torch.int32)


def _refuse(bad, message):
    """Raise ``message`` where the bool tensor ``bad`` has a True (one scalar
    comes back to the host)."""
    if bool(bad.any()):
        raise FpemuValueError(message)


def _no_nan_into(cast, u, fname):
    """fpemu never turns a NaN into a number: a NaN into a format without
    one is an error, as in :func:`fpemu.quantize`."""
    if cast.has_nan or u.numel() == 0:
        return
    f = u.view(torch.float32)
    # (on the CPU NumPy's isnan reads the tensor's memory 3x faster than torch's)
    nan = np.isnan(f.numpy()).any() if f.device.type == "cpu" else torch.isnan(f).any()
    if bool(nan):
        raise FpemuValueError(
            f"fpemu.torch.{fname}(): the input holds NaN and {cast.name} has no NaN "
            "encoding; fpemu does not turn NaN into a number. Remove or replace the NaNs "
            "first (torch.nan_to_num), or pick a format with a NaN")


def _wide_rne(cast):
    """Whether ``cast`` rounds to nearest even into an IEEE-style format with
    float32's exponent range (bf16, tf32) under the inf policy: there every
    float32 (subnormals too) rounds by one integer addition on its bits, and
    an overflow carries into the infinity pattern by itself."""
    f = cast.fmt
    return (cast.rounding is Rounding.RNE and cast.flags == int(Overflow.INF) and f.signed
            and f.nan_encoding == "ieee" and f.has_inf and f.has_subnormals
            and (f.emin, f.emax) == (-126, 127) and 0 < f.mantissa_bits < 23)


def _wide_rne_bits(u, cast, out):
    """The float32 bits of :func:`_wide_rne`'s rounding, written into ``out``
    (int32, u's shape, or None: a new tensor): add half an ulp less one plus
    the kept last bit, clear the dropped bits; NaN becomes the canonical
    0x7fc00000 (as every fpemu result does). In place after the first
    operation: on the CPU a new tensor's first write costs as much as the
    arithmetic (its pages are faulted in)."""
    sh = 23 - cast.layout.mantissa_bits
    nan = u.view(torch.float32).isnan()
    r = torch.bitwise_right_shift(u, sh, out=out)
    r &= 1
    r += u.clamp(max=0x7F800000)        # NaN (replaced below) as inf: no int32 overflow
    r += (1 << (sh - 1)) - 1
    r &= _signed(~((1 << sh) - 1), 32)
    return r.masked_fill_(nan, 0x7FC00000)


class _Plan(tuple):
    """What the tensor code reads of a configuration, as plain Python values:
    (layout, flags, mode, wide, has_nan, name, bits, code bytes, key, offset,
    cast); ``layout`` is :attr:`fpemu.Cast.layout` (the kernel parameters by
    name), ``cast`` the :class:`fpemu.Cast` whose Numba kernels round CPU
    tensors."""

    layout, flags, mode, wide, has_nan, name, bits, code_bytes, key, offset, cast = (
        property(lambda self, i=i: self[i]) for i in range(11))


_PLANS = {}


def _plan(fmt, rounding, subnormals, overflow, seed, rng=None):
    """The checked configuration (:class:`fpemu.Cast`) and stochastic
    rounding's key as plain Python values, built once per configuration."""
    try:
        return _PLANS[(fmt, rounding, subnormals, type(subnormals), overflow, seed, rng)]
    except (KeyError, TypeError):
        pass
    cast = Cast.of(fmt, rounding, subnormals, overflow, rng)
    f = cast.fmt
    plan = _Plan((cast.layout, cast.flags, cast.kernel_mode, _wide_rne(cast), f.has_nan,
                  f.name, f.bits, f.code_dtype.itemsize, *seed_key(seed, cast.rounding), cast))
    if seed is not None or cast.rounding is not Rounding.SR:     # seed=None: new bits each call
        try:
            _PLANS[(fmt, rounding, subnormals, type(subnormals), overflow, seed, rng)] = plan
        except TypeError:                                       # unhashable: not kept
            pass
    return plan


def _layout(fmt, subnormals, overflow):
    """The plan of what follows the rounding (a code's value and layout),
    which depends on no rounding mode or seed."""
    return _plan(fmt, "rne", subnormals, overflow, None)


def _checked_bits(t, cast, fname):
    """The float32 bits of ``t`` (int32), once checked for ``cast``."""
    u = _float32_bits(t, fname)
    _no_nan_into(cast, u, fname)
    return u


#: The torch dtype of a format's codes, by the byte size of its NumPy code dtype.
_CODE_DTYPES = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}

#: Elements per piece on the CPU (see :func:`_by_pieces`).
CPU_PIECE = 1 << 18


def _by_pieces(fn, u, dtype, out=None):
    """``fn(piece, start)`` over the flat int32 bits ``u`` in pieces of
    :data:`CPU_PIECE` elements on the CPU (``start``: the piece's first flat
    index), written into ``out`` (or a new tensor of ``dtype``); one call
    elsewhere.

    The rounding takes a few dozen element-wise operations, each making a
    tensor. On the CPU a new tensor of tens of megabytes is fresh memory whose
    first write costs a page fault per page, more than the arithmetic; pieces
    of about a megabyte reuse the allocator's freed memory and stay in cache,
    and are large enough that each operation's fixed cost (microseconds) does
    not count. Measured (``bench/bench_torch_quantize.py``, 2**24 float32 to
    e4m3fn, 2 threads): 0.87 s in one call, 0.27-0.33 s in pieces of 2**18 to
    2**20, 1.2 s in pieces of 2**12. On CUDA the caching allocator already
    reuses memory.
    Every element is computed on its own (the stochastic draws by flat
    index), so the pieces change no bit."""
    n = u.numel()
    if u.device.type != "cpu" or n <= CPU_PIECE:
        r = fn(u, 0)
        return r if out is None else out.copy_(r)
    flat = u.reshape(-1)
    res = torch.empty(n, dtype=dtype) if out is None else out.reshape(-1)
    for start in range(0, n, CPU_PIECE):
        res[start:start + CPU_PIECE] = fn(flat[start:start + CPU_PIECE], start)
    return res.view(u.shape)


# ------------------------------------------------------------ CPU: Numba kernels
#: Whether CPU tensors go through fpemu's Numba kernels (True) or through the
#: element-wise torch code that other devices run (False: the tests set it to
#: check that code on this CPU, bit for bit, where CI has no GPU).
CPU_KERNELS = True


def _on_cpu(t):
    """Whether ``t`` lives in the host's memory, where fpemu's Numba kernels
    (:meth:`fpemu.Cast.round_into`) run on it in place of the element-wise
    tensor code: the same bits, one pass over memory on every core Numba
    uses, instead of a few dozen torch operations."""
    return CPU_KERNELS and isinstance(t, torch.Tensor) and t.device.type == "cpu"


# --------------------------------------------------------- CUDA: Triton kernels
#: The device types whose tensors go through the fused Triton kernels
#: (``_triton.py``) where ``triton`` imports. The tests add "cpu" under
#: ``TRITON_INTERPRET=1`` (Triton's interpreter) to run them on CI's CPU.
TRITON_DEVICES = ("cuda",)
_TRITON = None


def _triton_for(t):
    """The Triton kernels' module for a tensor on a :data:`TRITON_DEVICES`
    device, where ``triton`` is installed; else None (the torch code runs)."""
    global _TRITON
    if not isinstance(t, torch.Tensor) or t.device.type not in TRITON_DEVICES:
        return None
    if _TRITON is None:
        try:
            from . import _triton as module     # (optional, and only for a Triton device)
        except ImportError:                 # no triton (the "cuda" extra): the torch code
            module = False
        _TRITON = module
    return _TRITON or None


def _host_kernels():
    """The context in which fpemu.torch runs fpemu's Numba kernels on CPU
    tensors: serial on arrays below ``fpemu._jit.TORCH_SERIAL_BELOW``
    elements, where a parallel launch among torch's own thread pool's work
    costs more than it saves."""
    return _jit.serial_below(_jit.TORCH_SERIAL_BELOW)


def _host_round(op, u, cast, out=None):
    """``op`` ("quantize" or "encode") of the checked float32 bits ``u`` (a
    contiguous int32 CPU tensor) by the Numba kernels, reading ``u``'s
    memory in place and writing a new tensor (or ``out``) that NumPy sees
    through the same buffer: no copy either way."""
    x = u.view(torch.float32).numpy()
    if op == "quantize":
        res = torch.empty(u.shape, dtype=torch.float32) if out is None else out
    else:
        res = torch.empty(u.shape, dtype=_CODE_DTYPES[cast.code_bytes])
    dst = res.detach().numpy()
    if np.may_share_memory(x, dst) and x.ctypes.data != dst.ctypes.data:
        x = x.copy()                    # out overlaps t at an offset: read before written
    with _host_kernels():
        cast.cast.round_into(op, x, dst, cast.key, cast.offset)
    return res


def _as_code_dtype(c, cast):
    """Valid codes ``c`` (any integer dtype) as a contiguous tensor of the
    format's code dtype (uint8, uint16 or uint32), as the kernels read them."""
    dtype = _CODE_DTYPES[cast.code_bytes]
    c = c.detach()
    if c.dtype != dtype:
        c = (c & 0xFFFFFFFF if dtype == torch.uint32 and c.dtype == torch.int64 else c).to(dtype)
    return c.contiguous()


def _host_decode(c, cast):
    """The float32 values of valid codes ``c`` (an integer CPU tensor) by the
    Numba decode kernel, on ``c``'s memory where it already holds the
    format's code dtype."""
    c = _as_code_dtype(c, cast)
    res = torch.empty(c.shape, dtype=torch.float32)
    with _host_kernels():
        cast.cast.decode_into(c.numpy(), res.numpy())
    return res


# -------------------------------------------------------------------- public API
def quantize(t, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, out=None,
             rng=None):
    """Round a tensor to a format on its own device; return float32 values.

    The arguments and the result's bits are those of :func:`fpemu.quantize`
    (every format, rounding mode, overflow policy; ``seed`` or ``(seed,
    offset)`` for stochastic rounding, drawn per flat row-major index):
    ``fpemu.torch.quantize(t, f)`` equals ``fpemu.quantize(t.cpu().numpy(), f)``
    bit for bit, on the CPU and on CUDA, in eager mode and under
    ``torch.compile`` (where it is the custom operator ``fpemu::quantize``,
    one opaque kernel in the graph: no graph break).

    Parameters
    ----------
    t : torch.Tensor
        float32 (or a narrower float type, widened exactly; or float64 whose
        values are all float32), dense, on any device but ``meta``.
    fmt, rounding, subnormals, overflow, seed, rng
        As in :func:`fpemu.quantize`.
    out : torch.Tensor, optional
        A contiguous float32 tensor of ``t``'s shape on ``t``'s device to
        write the result into (it may be ``t`` itself); returned.

    Returns
    -------
    torch.Tensor
        float32, ``t``'s shape and device, contiguous, detached from autograd.

    Examples
    --------
    >>> import torch, fpemu.torch
    >>> fpemu.torch.quantize(torch.tensor([500.0, 1 + 2**-4, -1e-8]), "e4m3fn").tolist()
    [448.0, 1.0, -0.0]
    """
    if torch.compiler.is_compiling():
        return _in_graph("quantize", t, fmt, rounding, subnormals, overflow, seed, rng, out)
    cast = _plan(fmt, rounding, subnormals, overflow, seed, rng)
    out32 = None if out is None else _out_bits(out, t)
    if _on_cpu(t):
        return _host_round("quantize", _checked_bits(t, cast, "quantize"), cast, out)
    kernels = _triton_for(t)
    if kernels is not None:
        u = _checked_bits(t, cast, "quantize")
        if out32 is not None and out32.data_ptr() == u.data_ptr():
            u = u.clone()
        res = torch.empty_like(u) if out32 is None else out32
        return kernels.round_bits(u, cast, res, encode=False).view(torch.float32)
    if cast.wide:
        u = _float32_bits(t, "quantize")
        if out32 is not None and out32.data_ptr() == u.data_ptr():
            u = u.clone()               # rounding in place: the first write would clobber u
        n = u.numel()
        if u.device.type != "cpu" or n <= CPU_PIECE:
            return _wide_rne_bits(u, cast, out32).view(torch.float32)
        res = torch.empty(u.shape, dtype=torch.int32) if out32 is None else out32
        flat, dst = u.reshape(-1), res.view(-1)
        for start in range(0, n, CPU_PIECE):             # see _by_pieces
            _wide_rne_bits(flat[start:start + CPU_PIECE], cast, dst[start:start + CPU_PIECE])
        return res.view(torch.float32)
    u = _checked_bits(t, cast, "quantize")
    if out32 is not None and out32.data_ptr() == u.data_ptr():
        u = u.clone()
    layout = _layout(fmt, subnormals, overflow)

    def piece(v, start):
        if small:                   # the code, then its value from the format's table
            return _decoded(_encode_small(v, cast), layout).view(torch.int32)
        mag, negative, nan = _rounded(v, cast, cast.key, cast.offset + start)
        return _value_bits(mag, negative, nan, layout)

    small = _small_rne(cast)

    return _by_pieces(piece, u, torch.int32, out32).view(torch.float32)


def _out_bits(out, t):
    """``out``'s int32 view, after checking it can take quantize(t)."""
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or \
            out.shape != t.shape or out.device != t.device or not out.is_contiguous():
        what = (f"{out.dtype}, shape {tuple(out.shape)}, on {out.device}"
                f"{'' if out.is_contiguous() else ', not contiguous'}"
                if isinstance(out, torch.Tensor) else type(out).__name__)
        raise FpemuValueError(
            f"fpemu.torch.quantize(out=...) takes a contiguous float32 tensor of the input's "
            f"shape {tuple(t.shape)} on {t.device}; got {what}. Pass "
            "out=torch.empty_like(t, dtype=torch.float32) or leave it out")
    return out.view(torch.int32)


def _small_rne(cast):
    """Whether ``cast`` rounds to nearest even into a signed format of at most
    16 bits with a mantissa bit and subnormals kept, whose smallest
    subnormal is at least 2**-125 (every fp16, fp8, fp6 and fp4 format), and
    saturates, or overflows to an infinity whose code follows the largest
    finite one (fp16, e5m2): :func:`_encode_small` then applies."""
    L = cast.layout
    M, emin, maxmag, inf = L.mantissa_bits, L.emin, L.max_code, L.inf_code
    overflow = Overflow(cast.flags & 3)
    return (cast.mode == Rounding.RNE
            and (overflow is Overflow.SATURATE
                 or (overflow is Overflow.INF and inf == maxmag + 1))
            and not cast.flags & (FLUSH | UNSIGNED | NO_ZERO | NORMALIZE)
            and cast.bits <= 16 and M >= 1 and emin - M >= -125)


def _encode_small(u, cast, in_range=False):
    """Codes (int32) of the float32 bits ``u`` (int32) under a
    :func:`_small_rne` cast, in fewer operations than :func:`_rounded`. With
    ``e`` the binade of ``|v|`` (at least emin), ``|v| * 2**(M - e)`` is a
    float32 product by a power of two built from its bits (exact where it is
    a normal float32, as in the format's binades, where it lies in [2**M,
    2**(M+1)); one below float32's normal range rounds to 0 either way),
    ``torch.round`` rounds it half to even (exact), and the magnitude code
    is ``(e + bias - 1) * 2**M`` plus that integer, a carry moving into the
    exponent field by itself; then saturation (or infinity, the code after
    the largest), the sign, NaN. ``in_range``: the caller knows every value
    is finite and at most the format's largest in magnitude (then neither
    saturation nor NaN needs an operation)."""
    L = cast.layout
    M, emin, emax, bias, maxmag = L.mantissa_bits, L.emin, L.emax, L.bias, L.max_code
    a = u & 0x7FFFFFFF
    if not in_range:
        nan = a > 0x7F800000
        a = a.clamp(max=(emax + 128) << 23)              # inf and NaN: 2**(emax + 1)
    eb = (a >> 23).clamp_(min=emin + 127)                # the biased binade, at least emin's
    up = ((254 + M) - eb) << 23                          # the bits of 2**(M - e)
    kept = torch.round(a.view(torch.float32) * up.view(torch.float32)).to(torch.int32)
    mag = ((eb + (bias - 128)) << M).add_(kept)
    if not in_range:
        # saturation, or infinity: past the largest finite code (inf and NaN
        # inputs, clamped above, land there too; NaN is replaced below)
        top = maxmag if Overflow(cast.flags & 3) is Overflow.SATURATE else maxmag + 1
        mag = mag.clamp_(max=top)
    s = L.sign_shift
    if cast.flags & FNUZ:
        code = mag | ((u < 0) & (mag != 0)).to(torch.int32) << s
    else:
        code = mag.bitwise_or_((u >> (31 - s)) & (1 << s))
    return code if in_range else code.masked_fill_(nan, L.nan_code)


def encode(t, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, rng=None):
    """Round a tensor to a format on its own device; return the codes.

    The codes of :func:`fpemu.encode`, bit for bit: ``torch.uint8`` for
    formats of up to 8 bits (fp6 / fp4 in the low bits), ``torch.uint16`` up
    to 16, ``torch.uint32`` above; NaN gives the format's canonical NaN code.
    The arguments are those of :func:`quantize`.

    Examples
    --------
    >>> import torch, fpemu.torch
    >>> fpemu.torch.encode(torch.tensor([1.0, -2.0, 448.0]), "e4m3fn").tolist()
    [56, 192, 126]
    """
    if torch.compiler.is_compiling():
        return _in_graph("encode", t, fmt, rounding, subnormals, overflow, seed, rng)
    cast = _plan(fmt, rounding, subnormals, overflow, seed, rng)
    u = _checked_bits(t, cast, "encode")
    return _encode_any(u, cast, _layout(fmt, subnormals, overflow))


def encode_trusted(t, fmt, *, rounding="rne", subnormals=True, overflow=None, seed=None, rng=None,
                   in_range=False):
    """:func:`encode` of a float32 tensor fpemu made, with no NaN where the
    format has none (no check, no host round trip). ``in_range``: every
    value is finite and at most the format's largest in magnitude (see
    :func:`_encode_small`)."""
    cast = _plan(fmt, rounding, subnormals, overflow, seed, rng)
    return _encode_any(t.contiguous().view(torch.int32), cast, _layout(fmt, subnormals, overflow),
                       in_range)


def _encode_any(u, cast, layout, in_range=False):
    """The codes of the float32 bits ``u`` on their device: Numba on the
    CPU, Triton on CUDA, else the torch code."""
    if _on_cpu(u):
        return _host_round("encode", u, cast)
    kernels = _triton_for(u)
    if kernels is not None:
        out = torch.empty(u.shape, dtype=_CODE_DTYPES[cast.code_bytes], device=u.device)
        return kernels.round_bits(u, cast, out, encode=True)
    return _encode(u, cast, layout, in_range)


def _encode(u, cast, layout, in_range=False):
    L = layout.layout
    dtype = _CODE_DTYPES[layout.code_bytes]
    if _small_rne(cast):
        return _by_pieces(lambda v, start: _encode_small(v, cast, in_range).to(dtype), u, dtype)

    def piece(v, start):
        mag, negative, nan = _rounded(v, cast, cast.key, cast.offset + start)
        code = _elements.code(mag, negative, nan, L.sign_shift, _signed(L.nan_code, 32))
        if dtype == torch.uint32:       # codes of 32-bit formats: through int64, no wrap
            return (code.to(torch.int64) & 0xFFFFFFFF).to(dtype)
        return code.to(dtype)

    return _by_pieces(piece, u, dtype)


def decode(codes, fmt):
    """The float32 values of a format's codes (an integer tensor), on the
    codes' device: :func:`fpemu.decode`, bit for bit.

    Examples
    --------
    >>> import torch, fpemu.torch
    >>> fpemu.torch.decode(torch.tensor([0x7E, 0xFE, 0x01], dtype=torch.uint8), "e4m3fn").tolist()
    [448.0, -448.0, 0.001953125]
    """
    if torch.compiler.is_compiling():
        return _in_graph("decode", codes, fmt, "rne", True, "saturate", None, None)
    cast = _plan(fmt, "rne", True, "saturate", None)     # what decode reads of the format
    _check_tensor(codes, "decode")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise FpemuTypeError(
            f"fpemu.torch.decode() needs integer codes, got {codes.dtype}; pass "
            "codes.to(torch.int64) if these numbers are codes, or fpemu.torch.quantize for values")
    c = codes.detach().to(torch.int64)
    limit = 1 << cast.bits
    if c.numel():
        bad = (c < 0) | (c >= limit)
        first = "" if not bool(bad.any()) else f"; got {int(c[bad].reshape(-1)[0])}"
        _refuse(bad, f"fpemu.torch.decode(): {cast.name} codes are {cast.bits}-bit, "
                f"in 0..{limit - 1}{first}")
    kernels_read_codes = _on_cpu(codes) or _triton_for(codes) is not None
    return _decoded(codes.detach() if kernels_read_codes else c, cast)


def _decode_bits(c, cast):
    """The float32 bits (int32) of int64 codes ``c`` under ``cast``."""
    L = cast.layout
    mag, negative, nan = _elements.decoded(c.to(torch.int32).contiguous(), L.mantissa_bits,
                                           L.emin, L.bias, L.max_code, L.inf_code, L.sign_shift,
                                           cast.flags)
    return _value_bits(mag, negative, nan, cast)


#: Value tables of formats of up to 16 bits, by (format, device).
_TABLES = {}


def _decoded(c, cast):
    """The float32 values of valid codes (any integer dtype): a lookup in the
    format's table of all its values (built once per device with the same
    integer code) for formats of up to 16 bits, else the computation."""
    if _on_cpu(c):
        return _host_decode(c, cast)
    kernels = _triton_for(c)
    if kernels is not None:
        c = _as_code_dtype(c, cast)
        out = torch.empty(c.shape, dtype=torch.int32, device=c.device)
        return kernels.decode_codes(c, cast, out).view(torch.float32)
    if cast.bits > 16:
        return _decode_bits(c.to(torch.int64), cast).view(torch.float32)
    key = (cast.layout, cast.flags, cast.bits, str(c.device))
    table = _TABLES.get(key)
    if table is None:
        every = torch.arange(1 << cast.bits, dtype=torch.int64, device=c.device)
        table = _TABLES[key] = _decode_bits(every, cast).view(torch.float32)
    flat = c.reshape(-1).to(torch.int32)
    return table.index_select(0, flat).view(c.shape)     # (the fastest gather on CPUs)


def decode_trusted(codes, fmt):
    """:func:`decode` of codes fpemu itself made (no range check, no host
    round trip)."""
    return _decoded(codes, _plan(fmt, "rne", True, "saturate", None))


# ---------------------------------------------------------- torch.compile: ops
# Under torch.compile the three functions are custom operators (fpemu::quantize,
# fpemu::encode, fpemu::decode): Inductor keeps each as one opaque call of the
# eager function above (Numba on the CPU, Triton on CUDA), so no graph breaks at
# them and no compiler rewrites their integer constants. (Compiled *into* the
# graph, Inductor's C++ code once gave wrong bits: Dynamo made a format's
# constants symbols and Inductor evaluated an integer expression of them in
# floating point; docs/monitor.md.) The configuration travels as a string that
# describes it completely (the format's fields, the mode, policy, subnormals,
# seed and generator), so a graph cached on disk and loaded in another process
# still means the same rounding.

def _describe(fmt, rounding, subnormals, overflow, seed, rng):
    """The configuration as a Python literal (checked: its errors come at
    trace time, as they would in eager mode)."""
    cast = Cast.of(fmt, rounding, subnormals, overflow, rng)
    seed_key(seed, cast.rounding)
    fields = tuple(sorted(dataclasses.asdict(cast.fmt).items()))
    return repr((fields, cast.rounding.name.lower(), cast.subnormals,
                 cast.overflow.name.lower(), seed, cast.rng))


_CONFIGS = {}


_ERRORS = {"FpemuValueError": FpemuValueError, "FpemuTypeError": FpemuTypeError}


def _config(text):
    """(fmt, rounding, subnormals, overflow, seed, rng) of a description; the
    error of a configuration that eager mode refuses, raised when the
    compiled code runs (raised while tracing, Dynamo would wrap it in an
    error of its own)."""
    cfg = _CONFIGS.get(text)
    if cfg is None:
        parsed = ast.literal_eval(text)
        if parsed[0] == "error":
            raise _ERRORS[parsed[1]](parsed[2])
        fields, rounding, subnormals, overflow, seed, rng = parsed
        cfg = _CONFIGS[text] = (Format(**dict(fields)), rounding, subnormals, overflow, seed,
                                rng)
    return cfg


def _code_dtype_of(text):
    """The codes' dtype of a description (uint8 for one that is an error)."""
    parsed = ast.literal_eval(text)
    if parsed[0] == "error":
        return torch.uint8
    return _CODE_DTYPES[Format(**dict(parsed[0])).code_dtype.itemsize]


@torch._dynamo.assume_constant_result
def _config_text(fmt, rounding, subnormals, overflow, seed, rng):
    try:
        return _describe(fmt, rounding, subnormals, overflow, seed, rng)
    except (FpemuValueError, FpemuTypeError) as err:
        return repr(("error", type(err).__name__, str(err)))


def _in_graph(op, t, fmt, rounding, subnormals, overflow, seed, rng, out=None):
    """The custom operator ``fpemu::<op>`` on ``t`` under this configuration."""
    res = getattr(torch.ops.fpemu, op)(
        t.detach(), _config_text(fmt, rounding, subnormals, overflow, seed, rng))
    return res if out is None else out.copy_(res)


@torch.library.custom_op("fpemu::quantize", mutates_args=())
def _quantize_op(t: torch.Tensor, config: str) -> torch.Tensor:
    fmt, rounding, subnormals, overflow, seed, rng = _config(config)
    return quantize(t, fmt, rounding=rounding, subnormals=subnormals, overflow=overflow,
                    seed=seed, rng=rng)


@torch.library.custom_op("fpemu::encode", mutates_args=())
def _encode_op(t: torch.Tensor, config: str) -> torch.Tensor:
    fmt, rounding, subnormals, overflow, seed, rng = _config(config)
    return encode(t, fmt, rounding=rounding, subnormals=subnormals, overflow=overflow,
                  seed=seed, rng=rng)


@torch.library.custom_op("fpemu::decode", mutates_args=())
def _decode_op(codes: torch.Tensor, config: str) -> torch.Tensor:
    return decode(codes, _config(config)[0])


@_quantize_op.register_fake
def _(t, config):
    return torch.empty(t.shape, dtype=torch.float32, device=t.device)


@_encode_op.register_fake
def _(t, config):
    return torch.empty(t.shape, dtype=_code_dtype_of(config), device=t.device)


@_decode_op.register_fake
def _(codes, config):
    return torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
