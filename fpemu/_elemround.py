"""The rounding of float32 elements, written once for Numba, torch and Triton.

Each function here is the algorithm for one float32 element, given as its
bits (an int32). The same source runs in three places: fpemu's Numba
kernels (:mod:`fpemu._kernels.round32`: one element of a loop that LLVM
vectorises), the torch code (:mod:`fpemu.torch._quantize`: every element of
a tensor at once) and the fused Triton kernels (:mod:`fpemu.torch._triton`:
a block of elements per program). The functions are written against a few
primitives, module globals that each backend replaces (:func:`bind`)::

    where(c, a, b)          a where c holds, else b (element-wise select)
    minimum(a, b)           the smaller, element-wise; maximum(a, b) the larger
    shl(a, s), ashr(a, s)   int32 shifts left / right (arithmetic), 0 <= s <= 31
    i32(x), i64(x)          int32 (wrapping) / int64 of an integer or a bool
    lnot(b)                 logical not of a bool
    float_bits(n)           the bits (int32) of int32 n converted to float32
                            (exact for n < 2**24)
    draw63(key, index, mode)  63 random bits of element ``index`` from the
                            generator of ``mode`` (SR: splitmix64, SR_PHILOX:
                            Philox4x32-10)

and Python's ``+ - * & | == < ...`` on integers, ``&`` and ``|`` on bools
(never ``and``, ``or`` or ``not`` on a value of an element: a tensor has no
truth value), ``<<`` and ``>>`` only on int64 (every int32 shift goes through
``shl`` / ``ashr``, which Numba keeps 32 bits wide; they wrap, but the code
shifts no negative number left, which torch's C++ need not define). ``i32``
wraps each int32 result: Numba widens int32 arithmetic to int64, and the
wrapping lets LLVM keep 16 lanes per AVX-512 vector instead of 8; it changes
nothing in torch or Triton, where int32 stays int32. An ``if`` tests only
the mode, the flags and the format's parameters: per configuration constants
in every backend (``tl.constexpr`` in Triton; Python ints in torch; in Numba
values that LLVM folds in each compiled loop). The defaults below are these
primitives on Python ints, so that the module also runs as it reads, one
element at a time (``tests/test_elemround.py`` runs it so against the
kernels).

A format reaches the functions as the fields of ``fpemu.Cast.layout``
(``fpemu._kernels`` documents the tuple ``p`` they come from), the flags and
the mode as the kernels number them (:data:`RNE` .. :data:`SR_PHILOX`,
:data:`FLUSH` .. :data:`NORMALIZE`).

The rounding. A finite float32 is ``sig * 2**(e - 23)``, ``sig < 2**24``::

    bits:  s | eeeeeeee | fffffffffffffffffffffff      sig = 1.fff (0.fff)

On the format's grid the quantum at ``e`` is ``2**(max(e, emin) - M)``, so
``shift`` low bits of ``sig`` are dropped::

    sig:  1 xxxxxxxx xxxx | r ssssssss      kept = sig >> shift
          \\ kept (M+1) /   \\  rem  /       rem  = the dropped bits

``kept`` is incremented or not as the mode says (stochastic rounding: when
a 63-bit draw lies below ``rem`` read as a 63-bit fraction). The magnitude
code is ``((max(e, emin) + bias - 1) << M) + kept``: a carry out of the
significand moves into the exponent field by itself, and a subnormal result
(``kept < 2**M``) lands in field 0. Then overflow (IEEE 754-2019 §7.4, then
the policy), flushing after rounding, the sign rules of fnuz and unsigned
formats, NaN; and the float32 bits of a code, built with shifts from the
exact integer-to-float32 conversion of its significand, so that no
floating-point mode of a device (flush-to-zero) can change a bit.
"""

from __future__ import annotations

import struct
import sys
import types

#: The rounding modes as the kernels number them (fpemu.rounding.Rounding's
#: values), and SR_PHILOX: stochastic rounding drawing from Philox4x32-10
#: (``rng="philox"``) where SR draws from splitmix64. Every test of the mode
#: below treats both as the last case, so only the draw differs.
RNE, RNA, RTZ, RUP, RDN, RTO, SR = range(7)
SR_PHILOX = 7
#: The overflow policy (the flags' low two bits) and the flags.
OVF_INF, OVF_SATURATE, OVF_NAN = range(3)
POLICY_MASK, FLUSH, FNUZ, UNSIGNED, NO_ZERO, NORMALIZE = 3, 4, 8, 16, 32, 64
#: float32's sign bit as an int32
SIGN_BIT = -(1 << 31)
#: float32's infinity and canonical NaN
INF_BITS, NAN_BITS = 0x7F800000, 0x7FC00000

#: The names of the constants above (each backend reads them as it reads
#: constants: Triton's as ``tl.constexpr``).
CONSTANTS = ("RNE", "RNA", "RTZ", "RUP", "RDN", "RTO", "SR", "SR_PHILOX", "OVF_INF",
             "OVF_SATURATE", "OVF_NAN", "POLICY_MASK", "FLUSH", "FNUZ", "UNSIGNED", "NO_ZERO",
             "NORMALIZE", "SIGN_BIT", "INF_BITS", "NAN_BITS")


# ------------------------------------------------------------ the primitives
# On Python ints: the module's own binding (see the module note).
def where(c, a, b):
    return a if c else b


minimum, maximum = min, max


def i32(x):
    x = int(x) & 0xFFFFFFFF
    return x - (1 << 32) if x >> 31 else x


def i64(x):
    return int(x)


def shl(a, s):
    return i32(a << s)


def ashr(a, s):
    return i32(a) >> s


def lnot(b):
    return not b


def float_bits(n):
    return struct.unpack("<i", struct.pack("<f", n))[0]


def draw63(key, index, mode):
    raise NotImplementedError("stochastic rounding draws in the backends: bind draw63 "
                              "(fpemu.quantize.stochastic_bits gives the draws)")


PRIMITIVES = ("where", "minimum", "maximum", "i32", "i64", "shl", "ashr", "lnot", "float_bits",
              "draw63")


# ------------------------------------------------------------- the algorithm
#   float32:  s | eeeeeeee | fffffffffffffffffffffff
def split(u, flags):
    """(negative, e, sig, special, fraction != 0) of the float32 with bits
    ``u`` (int32): its value is ``sig * 2**(e - 23)``, ``sig`` an int32 below
    2**24; ``special``: inf or NaN. Under NORMALIZE a subnormal's ``sig`` is
    shifted up to bit 23 (``e`` below -126): formats such as e8m0 have
    binades below float32's normal range."""
    neg = u < 0
    a = i32(u & 0x7FFFFFFF)
    ef = ashr(a, 23)
    fr = i32(a & 0x7FFFFF)
    special = ef == 255
    frac_nz = fr != 0
    sig = i32(fr | shl(i32(ef != 0), 23))
    e = i32(maximum(ef, 1) - 127)
    if flags & NORMALIZE:
        # leading zeros below bit 23: 150 less the exponent field of
        # float32(sig) (exact), 23 for zero
        lz = i32(minimum(i32(150 - ashr(float_bits(sig), 23)), 23))
        e = i32(e - lz)
        sig = shl(sig, lz)
    return neg, e, sig, special, frac_nz


def round_split(neg, e, sig, special, frac_nz, M, emin, emax, bias, maxmag, infmag, flags,
                mode, key, index):
    """(magnitude code, negative, nan) of ``±sig * 2**(e - 23)`` (as
    :func:`split` gives it) rounded to the format in ``mode``: the rounding
    at the quantum, then overflow and the policy, flushing, the sign rules
    and NaN. ``key`` and ``index`` are stochastic rounding's (``draw63``)."""
    shift = i32(maximum(i32(emin - e), 0) + (23 - M))
    # sig < 2**24: a shift clamped to 30 drops everything any larger one does
    s = i32(minimum(shift, 30))
    kept = ashr(sig, s)
    one_s = shl(1, s)
    rem = i32(sig & i32(one_s - 1))
    half = ashr(one_s, 1)
    if mode == RNE:
        # add half an ulp, less one unless the kept last bit is odd (ties to
        # even), and drop the low bits: the carry is the increment
        up = where(s > 0, i32(half - 1 + i32(kept & 1)), 0)
        kept = ashr(i32(sig + up), s)
    elif mode == RNA:
        kept = ashr(i32(sig + half), s)
    elif mode != RTZ:
        inexact = rem != 0
        if mode == RUP:
            inc = inexact & lnot(neg)
        elif mode == RDN:
            inc = inexact & neg
        elif mode == RTO:
            inc = inexact & (i32(kept & 1) == 0)
        else:
            # up with probability rem / 2**shift, read as a 63-bit threshold
            sh = i64(shift)
            r64 = i64(rem)
            threshold = where(sh <= 63, r64 << (63 - minimum(sh, 63)),
                              r64 >> minimum(maximum(sh - 63, 0), 63))
            inc = draw63(key, index, mode) < threshold
        kept = i32(kept + i32(inc))
    q = minimum(maximum(e, emin), emax)
    # ((q + bias - 1) << M) + kept, shifting no negative number (e8m0's
    # field is -1 below its smallest binade)
    mag = i32(i32(shl(i32(q + bias), M) - shl(1, M)) + kept)
    ovf = (e > emax) | (mag > maxmag)
    # IEEE 754 §7.4: the directed modes overflow to infinity only outward
    if mode == RTZ or mode == RTO:
        ovf_to_inf = ovf & False
    elif mode == RUP:
        ovf_to_inf = ovf & lnot(neg)
    elif mode == RDN:
        ovf_to_inf = ovf & neg
    else:
        ovf_to_inf = ovf
    to_policy = ovf_to_inf | (special & lnot(frac_nz))    # overflow to inf, or ±inf input
    mag = where(ovf, maxmag, mag)
    if (flags & POLICY_MASK) == OVF_INF:
        mag = where(to_policy, infmag, mag)
    else:
        mag = where(to_policy, maxmag, mag)
    if flags & FLUSH:                   # subnormal results (after rounding) to zero
        mag = where(mag < shl(1, M), 0, mag)
    if flags & NO_ZERO:                 # below the smallest value gives the smallest
        mag = maximum(mag, 0)
    nan = special & frac_nz
    if (flags & POLICY_MASK) == OVF_NAN:
        nan = nan | to_policy
    if flags & UNSIGNED:                # zero and negative numbers are NaN
        nan = nan | neg | ((sig == 0) & lnot(special))
    if flags & FNUZ:                    # no -0
        negative = neg & (mag != 0)
    else:
        negative = neg
    return mag, negative, nan


def rounded(u, M, emin, emax, bias, maxmag, infmag, flags, mode, key, index):
    """(magnitude code, negative, nan) of the float32 with bits ``u``:
    :func:`split`, then :func:`round_split`."""
    neg, e, sig, special, frac_nz = split(u, flags)
    return round_split(neg, e, sig, special, frac_nz, M, emin, emax, bias, maxmag, infmag, flags,
                       mode, key, index)


def code(mag, negative, nan, sign_shift, nancode):
    """The code (int32: a 32-bit format's code is its pattern) of a rounded
    element."""
    return where(nan, nancode, where(negative, i32(mag | shl(1, sign_shift)), mag))


def bits_of(sig, ex):
    """The float32 bits (int32) of ``sig * 2**ex`` (``sig`` in 0 .. 2**24), a
    value float32 holds exactly: float32(sig) with ``ex`` added to its
    exponent field, or below float32's normal range the value in units of
    2**-149."""
    f = float_bits(sig)
    normal = i32(f + ex * (1 << 23))
    up = i32(ex + 149)
    sub = where(up >= 0, shl(sig, minimum(maximum(up, 0), 31)),
                ashr(sig, minimum(maximum(-up, 0), 31)))
    return where(sig == 0, 0, where(i32(ashr(f, 23) + ex) >= 1, normal, sub))


def value_bits(mag, negative, nan, M, emin, bias, infmag, flags):
    """The float32 bits (int32) of magnitude code ``mag`` with its sign and
    NaN. Where the format's normal binades are float32 normals (emin >=
    -126: every format but e8m0 and some custom ones) a normal code's bits
    are the code shifted into place plus the difference of the biases."""
    if emin >= -126 and (flags & NO_ZERO) == 0:
        normal = i32(shl(mag, 23 - M) + (127 - bias) * (1 << 23))
        # a subnormal code is mag * 2**k: float32(mag) with k added to its
        # exponent field, or below float32's normal range (k + 149 >= 0
        # here) mag in units of 2**-149
        k = emin - M
        f = float_bits(mag)
        sub = where(i32(ashr(f, 23) + k) >= 1, i32(f + k * (1 << 23)),
                    shl(mag, minimum(maximum(k + 149, 0), 31)))
        bits = where(mag < shl(1, M), where(mag == 0, 0, sub), normal)
    else:
        field = ashr(mag, M)
        frac = i32(mag & i32(shl(1, M) - 1))
        if flags & NO_ZERO:
            sig = i32(frac | shl(1, M))
            ex = i32(field - (bias + M))
        else:
            sig = i32(frac | shl(i32(field != 0), M))
            ex = i32(maximum(field, 1) - (bias + M))
        bits = bits_of(sig, ex)
    if infmag >= 0:
        bits = where(mag == infmag, INF_BITS, bits)
    bits = where(negative, i32(bits | SIGN_BIT), bits)
    return where(nan, NAN_BITS, bits)


def decoded(c, M, emin, bias, maxmag, infmag, sign_shift, flags):
    """(magnitude code, negative, nan) of a valid code ``c`` (int32)."""
    mag = i32(c & i32(shl(1, sign_shift) - 1))
    if flags & UNSIGNED:                # no sign bit: False, in mag's shape
        negative = mag < 0
    else:
        negative = i32(ashr(c, sign_shift) & 1) != 0
    nan = (mag > maxmag) & (mag != infmag)
    if flags & FNUZ:                    # the -0 code is NaN
        nan = nan | (negative & (mag == 0))
    return mag, negative, nan


#: The functions of the algorithm, which :func:`bind` rebinds.
ALGORITHM = ("split", "round_split", "rounded", "code", "bits_of", "value_bits", "decoded")


def bind(name, primitives, wrap=None, constant=None):
    """This module's algorithm over other primitives: a new module ``name``
    whose :data:`ALGORITHM` functions run this file's code with the names
    of :data:`PRIMITIVES` taken from ``primitives`` (a dict). ``wrap``
    compiles each function (``numba.njit``, ``triton.jit``); ``constant``
    turns each of :data:`CONSTANTS` into what the backend reads as one
    (``triton.language.constexpr``). Extra entries of ``primitives`` become
    globals of the functions too (Triton's interpreter looks for
    ``triton.language`` among them).

    The functions are this file's code objects under the new module's
    globals, so their source is this file's: Triton reads it with
    ``inspect``, Numba's on-disk cache keys their compiled code by it. The
    module is entered in ``sys.modules``: Numba's cache finds a function's
    globals by importing its module when it loads the function.
    """
    missing = set(PRIMITIVES) - set(primitives)
    if missing:
        raise ValueError(f"bind({name!r}): no primitive {sorted(missing)}")
    mod = types.ModuleType(name, __doc__)
    g = mod.__dict__
    g["__file__"] = __file__
    g.update(primitives)
    for k in CONSTANTS:
        v = globals()[k]
        g[k] = v if constant is None else constant(v)
    for k in ALGORITHM:
        f = globals()[k]
        fn = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
        fn.__qualname__, fn.__doc__, fn.__module__ = f.__qualname__, f.__doc__, name
        g[k] = fn if wrap is None else wrap(fn)
    sys.modules[name] = mod
    return mod
