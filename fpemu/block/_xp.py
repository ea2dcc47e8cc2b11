"""The array operations the scale rules use, for NumPy and for torch.

A rule of :mod:`fpemu.block.rules` is written once against ``xp``; the few
things the two libraries spell differently live here, with the numbers each
spelling gives kept the same (float32 arithmetic rounds once per operation
in both):

* **bit views** of float32 as int64, and clearing a float32's mantissa;
* **powers of two, ldexp / frexp**: ``2**k`` as a float32 (NumPy's
  ``ldexp`` of 1; in torch built from its bits), float64 ``m * 2**e``, a
  float64's binary exponent, and ``floor(log2 n)`` of positive integers
  below ``2**24``;
* **a float32 constant** to multiply by (a NumPy float32; in torch a Python
  float, which a float32 tensor multiplies in float32) and **a divisor on
  the operand's device**: CUDA turns a division by a Python number into a
  multiplication by its reciprocal, which can differ in the last bit, so a
  torch rule always divides by a 0-d tensor;
* **floating-point warnings**: NumPy's are silenced inside a rule (an
  overflow to inf or a 0/0 is part of the rule); torch raises none;
* **the block layout** (:mod:`fpemu.block.driver`): moving an axis, zero
  padding at the end of each axis, a block's amax (NaN propagates), the
  largest of all, and the same-width integer view of a float array that
  the ``"srN"`` rounding reads exponents from.

torch is imported only when its namespace is first asked for: it is an
optional dependency.
"""

from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["namespace"]


class _NumPy:
    name = "numpy"
    float32, float64, int64 = np.float32, np.float64, np.int64

    @staticmethod
    def errstate():
        return np.errstate(all="ignore")

    @staticmethod
    def f32(v):
        return np.float32(v)

    @staticmethod
    def const(v, like):
        return np.float32(v)

    @staticmethod
    def f32_bits(a):
        return np.asarray(a, np.float32).view(np.uint32).astype(np.int64)

    @staticmethod
    def clear_mantissa(a):
        return (a.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)

    @staticmethod
    def pow2_f32(k):
        """2**k as float32 (int k in -149 .. 127: each one is a float32)."""
        return np.ldexp(np.float32(1), np.asarray(k).astype(np.int32))

    @staticmethod
    def ldexp64(m, e):
        return np.ldexp(m, e)

    @staticmethod
    def frexp_exponent(a):
        return np.frexp(a)[1].astype(np.int64)

    @staticmethod
    def ilog2(n):
        return np.frexp(np.asarray(n).astype(np.float64))[1].astype(np.int64) - 1

    @staticmethod
    def to_f64(a):
        return np.asarray(a).astype(np.float64)

    @staticmethod
    def to_f32(a):
        return np.asarray(a).astype(np.float32, copy=False)

    @staticmethod
    def to_int64(a):
        return np.asarray(a).astype(np.int64)

    where = staticmethod(np.where)
    isnan = staticmethod(np.isnan)
    isinf = staticmethod(np.isinf)
    isfinite = staticmethod(np.isfinite)
    signbit = staticmethod(np.signbit)

    @staticmethod
    def clip_(a, lo, hi):
        """``a`` clamped in place (a fresh array); NaN stays NaN."""
        return np.clip(a, lo, hi, out=a)

    @staticmethod
    def clip(a, lo, hi):
        return np.clip(a, lo, hi)

    @staticmethod
    def minimum(a, v):
        return np.minimum(a, v)

    @staticmethod
    def zeros_bool(like):
        return np.zeros(np.shape(like), bool)

    @staticmethod
    def any(a):
        return bool(np.any(a))

    @staticmethod
    def copy(a):
        return a.copy()

    #: Elements a ``chunked`` rule is given at a time (module text of
    #: :mod:`fpemu.block.driver`): about 2**18, so that its candidates never
    #: exist for the whole array at once.
    chunk_elements = 1 << 18

    moveaxis = staticmethod(np.moveaxis)
    floor = staticmethod(np.floor)
    abs = staticmethod(np.abs)
    copysign = staticmethod(np.copysign)

    @staticmethod
    def concat(parts):
        return np.concatenate(parts)

    @staticmethod
    def reshape(a, shape):
        return np.reshape(np.asarray(a), shape)

    @staticmethod
    def pad_end(a, shape):
        """``a`` zero padded at the end of each axis to ``shape`` (``a``
        itself where it has that shape)."""
        if tuple(a.shape) == tuple(shape):
            return a
        P = np.zeros(shape, a.dtype)
        P[tuple(slice(0, n) for n in a.shape)] = a
        return P

    @staticmethod
    def block_amax(B, dims):
        """max |B| over ``dims`` (float32; NaN propagates)."""
        with np.errstate(invalid="ignore"):
            return np.max(np.abs(B), axis=dims).astype(np.float32)

    @staticmethod
    def max_f32(a):
        """The largest element of a float32 array, as a NumPy float32."""
        return np.float32(np.max(a))

    @staticmethod
    def maximum(a, v):
        return np.maximum(a, v)

    @staticmethod
    def float_bits(a):
        """The signed integer view of a float32 / float64 array."""
        return a.view(np.int64 if a.dtype == np.float64 else np.int32)

    @staticmethod
    def from_float_bits(i, like):
        """The float array of ``like``'s dtype whose bits are ``i``."""
        if like.dtype == np.float64:
            return np.asarray(i).astype(np.int64).view(np.float64)
        return np.asarray(i).astype(np.int32).view(np.float32)

    @staticmethod
    def is_f64(a):
        return a.dtype == np.float64

    @staticmethod
    def astype_like(a, like):
        return np.asarray(a).astype(like.dtype)

    @staticmethod
    def size(a):
        return a.size


class _Torch:
    name = "torch"

    def __init__(self):
        import torch                        # optional dependency: only when asked for
        self.torch = torch
        self.float32, self.float64, self.int64 = torch.float32, torch.float64, torch.int64
        self.where, self.isnan, self.isinf = torch.where, torch.isnan, torch.isinf
        self.isfinite, self.signbit = torch.isfinite, torch.signbit

    @staticmethod
    def errstate():
        return contextlib.nullcontext()

    @staticmethod
    def f32(v):
        return float(np.float32(v))

    def const(self, v, like):
        return self.torch.tensor(float(np.float32(v)), dtype=self.torch.float32,
                                 device=like.device)

    def f32_bits(self, a):
        return a.contiguous().view(self.torch.int32).to(self.torch.int64) & 0xFFFFFFFF

    def clear_mantissa(self, a):
        return (a.view(self.torch.int32) & -0x800000).view(self.torch.float32)

    def ldexp64(self, m, e):
        return m * ((e.to(self.torch.int64) + 1023) << 52).view(self.torch.float64)

    def frexp_exponent(self, a):
        return self.torch.frexp(a).exponent.to(self.torch.int64)

    def ilog2(self, n):
        # the exponent field of its float32 conversion, exact below 2**24
        f = n.to(self.torch.int32).to(self.torch.float32).view(self.torch.int32)
        return ((f >> 23) - 127).to(self.torch.int64)

    def pow2_f32(self, e):
        """2**e as float32 (int tensor e in -149 .. 127), built from its bits."""
        torch = self.torch
        e = e.to(torch.int32)
        normal = ((e + 127).clamp(1, 254) << 23)
        sub = torch.ones_like(e) << (e + 149).clamp(0, 22)
        return torch.where(e >= -126, normal, sub).view(torch.float32)

    def to_f64(self, a):
        return a.to(self.torch.float64)

    def to_f32(self, a):
        return a.to(self.torch.float32)

    def to_int64(self, a):
        return a.to(self.torch.int64)

    @staticmethod
    def clip_(a, lo, hi):
        return a.clamp_(lo, hi)

    @staticmethod
    def clip(a, lo, hi):
        return a.clamp(lo, hi)

    @staticmethod
    def minimum(a, v):
        return a.clamp(max=v)

    def zeros_bool(self, like):
        return self.torch.zeros(like.shape, dtype=self.torch.bool, device=like.device)

    @staticmethod
    def any(a):
        return bool(a.any())

    @staticmethod
    def copy(a):
        return a.clone()

    #: A torch driver runs a ``chunked`` rule on all its blocks at once.
    chunk_elements = None

    @staticmethod
    def moveaxis(a, src, dst):
        return a.movedim(src, dst)

    def floor(self, a):
        return self.torch.floor(a)

    @staticmethod
    def abs(a):
        return a.abs()

    def copysign(self, a, b):
        return self.torch.copysign(a, b)

    def concat(self, parts):
        return self.torch.cat(parts)

    @staticmethod
    def reshape(a, shape):
        return a.reshape(shape)

    def pad_end(self, a, shape):
        """``a`` zero padded at the end of each axis to ``shape`` (``a``
        itself where it has that shape)."""
        if tuple(a.shape) == tuple(shape):
            return a
        widths = []
        for have, want in zip(reversed(tuple(a.shape)), reversed(tuple(shape))):
            widths += [0, want - have]
        return self.torch.nn.functional.pad(a, widths)

    @staticmethod
    def block_amax(B, dims):
        """max |B| over ``dims`` (NaN propagates)."""
        return B.abs().amax(dim=dims)

    @staticmethod
    def max_f32(a):
        """The largest element, as a NumPy float32 (one number to the host)."""
        return np.float32(a.max().item())

    @staticmethod
    def maximum(a, v):
        return a.clamp(min=v)

    def float_bits(self, a):
        """The signed integer view of a float32 / float64 tensor."""
        t = self.torch
        return a.view(t.int64 if a.dtype == t.float64 else t.int32)

    def from_float_bits(self, i, like):
        """The float tensor of ``like``'s dtype whose bits are ``i``."""
        t = self.torch
        if like.dtype == t.float64:
            return i.to(t.int64).view(t.float64)
        return i.to(t.int32).view(t.float32)

    def is_f64(self, a):
        return a.dtype == self.torch.float64

    @staticmethod
    def astype_like(a, like):
        return a.to(like.dtype)

    @staticmethod
    def size(a):
        return a.numel()


_SPACES = {"numpy": _NumPy()}


def namespace(name):
    """The array namespace ``"numpy"`` or ``"torch"``."""
    if name not in _SPACES:
        _SPACES[name] = _Torch()
    return _SPACES[name]
