"""The block driver's two passes over the elements as fused Numba kernels,
for NumPy arrays and CPU tensors' memory.

:func:`fpemu.block.driver.run` reads a block quantization's elements twice:
for each block's amax, and for the element step (each element times its
block's factor, clamped to the element format's largest value, rounded, a
NaN block's codes signed zeros; :meth:`fpemu.block.driver.Ops.scale_round`).
Written with array operations each is several passes and temporaries (the
absolute values, the products, the clamp, NaN masks, the codes, the
replacement of NaN blocks); here each is one read of the elements and one
write (the amaxes, the codes), on every core, for every rule: a rule decides
per block (the factor, NaN blocks), the kernel runs the step that follows it,
so no rule is written twice. The scales, clip flags and tensor scale stay the
rule's array code on the per-block arrays, 1/16 or 1/32 of the data.

The kernels (:mod:`fpemu.block._kernels`) read the block layout of
:func:`fpemu.block.driver.to_blocks` as a 5-D view (:func:`five_d`) and give
the bits of the array code for every rounding mode of the element rounding
(nearest and directed modes, ``"sr"`` by element index of the block layout,
``"srN"`` with each element's drawn bits, as
:func:`fpemu.block.driver.round_srn` compares them, in float64, where each
of its steps is exact); element formats wider than 16 bits run the array
code. Asked for (``fpemu.torch.emulate``'s GEMM operands), the
element step also writes each code's value times its block's scale value in
the same pass. ``tests/test_fused_blocks.py`` holds the kernels to the array
code.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import run_kernel
from ..checks import seed_key
from ..quantize import Cast, decode
from ..rounding import Rounding
from . import _kernels, checks

__all__ = ["five_d", "block_shape", "block_amax", "scale_round", "fuses", "value_table"]

#: what a kernel that writes no values gets for the table, scales and values
_NO_TABLE = np.zeros(1, np.float32)
_NO_DQ = np.zeros((1, 1, 1), np.float32)
_NO_VALS = np.zeros((1, 1, 1, 1), np.float32)
#: the draws and constants of a kernel without "srN"
_NO_DRAWS = np.zeros((1, 1, 1, 1), np.uint64)
_NO_SR = (np.float64(0), np.int64(0), np.int64(0), np.float64(0))

#: the fast-path arguments of a kernel without one (the types of a real set)
_NO_FAST = (np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0), np.float32(0),
            np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0), np.uint32(0))


def five_d(shape, dims):
    """The 5-D shape ``(L, NR, TY, NC, TX)`` of a block layout of
    ``shape`` whose blocks span ``dims`` (:func:`fpemu.block.driver.amax_dims`):
    ``-1`` (each block along the last axis), an axis ``a`` (blocks read where
    they lie: axis ``a - 1`` numbers them) or ``(-3, -1)`` (2-D tiles)."""
    shape = tuple(shape)
    if dims == -1:
        return (math.prod(shape[:-2]), 1, 1, shape[-2], shape[-1])
    if dims == (-3, -1):
        return (math.prod(shape[:-4]),) + shape[-4:]
    a = dims
    return (math.prod(shape[:a - 1]), shape[a - 1], shape[a], math.prod(shape[a + 1:]), 1)


def fuses(elem, rounding, srn=False):
    """Whether the element step of this element format and rounding runs
    fused: codes of at most 16 bits, and a rounding mode of the element
    rounding, or ``"srN"`` where ``srn`` (the Numba kernel has it; the
    Triton kernel of :mod:`fpemu.torch` has not)."""
    return elem.bits <= 16 and (srn or not checks.srn_bits_name(rounding))


def block_amax(B, dims):
    """Each block's ``max |x|`` (float32, the per-block shape of the layout;
    a block holding a NaN: the canonical NaN) of the float32 block layout
    ``B`` (a NumPy array, any strides)."""
    L, NR, TY, NC, TX = five_d(B.shape, dims)
    out = np.empty((L, NR, NC), np.int32)
    if out.size:
        run_kernel(_kernels.block_amax5, B.reshape(L, NR, TY, NC, TX), out, inputs=1)
    return out.view(np.float32).reshape(block_shape(B.shape, dims))


def block_shape(shape, dims):
    """The shape of the per-block arrays of a block layout of ``shape``:
    the layout without the axes a block spans (``dims``)."""
    n = len(shape)
    spans = {d % n for d in (dims if isinstance(dims, tuple) else (dims,))}
    return tuple(s for i, s in enumerate(shape) if i not in spans)


def scale_round(job, factor, divide, block_nan, has_nan, dq=None):
    """The element step (:meth:`fpemu.block.driver.Ops.scale_round`) of the
    NumPy block layout ``job.Bk`` (its blocks span ``job.dims``): codes of
    ``job.elem`` (its code dtype, ``job.Bk``'s shape); with ``dq`` (each
    block's scale value, float32) also each code's value times it (float32,
    the same shape), written in the same pass: ``(codes, values)``."""
    B, elem = job.Bk, job.elem
    L, NR, TY, NC, TX = five_d(B.shape, job.dims)
    n = checks.srn_bits(job.rounding, job.seed)
    # "srN" rounds each value to one of the format's, which is then encoded exactly
    rounding = "rne" if n is not None else job.rounding
    cast = Cast.of(elem, rounding, overflow="saturate",
                   rng=job.rng if rounding == "sr" else None)
    key, offset = 0, 0
    if cast.rounding is Rounding.SR:
        key, offset = seed_key((job.seed, job.offset) if job.seed is not None else None,
                               Rounding.SR)
    out = np.empty(B.shape, elem.code_dtype)
    vals = None if dq is None else np.empty(B.shape, np.float32)
    table = _NO_TABLE if dq is None else value_table(elem)
    fast, fa = 0, _NO_FAST
    if cast.fast_encode is not None:
        # the fast path's arguments, as encode_rne_ieee derives them from its own
        shift, normal_bits, overflow_bits, magic, *rest = cast.fast_encode
        fast = 2 if elem.emin == -126 else 1
        fa = (np.uint32((1 << (shift - 1)) - 1), ~np.uint32((1 << shift) - 1),
              np.uint32(shift), normal_bits, overflow_bits, magic,
              np.float32(magic).view(np.uint32), *rest)
    draws, sr = _NO_DRAWS, _NO_SR
    if n is not None and out.size:
        draws = job.draws
        if draws is None:
            draws = job.ops.srn_draws(n, job.seed, B, checks.block_rng(job.rounding, job.rng))
        # element i of the block layout takes draw i (module text of fpemu.block.driver)
        draws = np.require(draws, np.uint64, ["C", "W"]).reshape(L, NR, TY, NC * TX)
        sr = (np.float64(2.0**n), np.int64(elem.mantissa_bits), np.int64(elem.emin),
              np.float64(elem.max))
    if out.size:
        # (writeable, as every call passes them: one compiled signature)
        f = np.require(factor, np.float32, ["C", "W"]).reshape(L, NR, NC)
        nan = np.require(block_nan, np.bool_, ["C", "W"]).reshape(L, NR, NC)
        d = _NO_DQ if dq is None else np.require(dq, np.float32, ["C", "W"]).reshape(L, NR, NC)
        run_kernel(_kernels.scale_round_kernel(cast.kernel_mode, cast.kernel_flags, fast,
                                               dq is not None, n is not None),
                   B.reshape(L, NR, TY, NC * TX), TX, f, nan, bool(divide), bool(has_nan),
                   np.float32(elem.max), elem.bits - 1, cast.params, key, offset, cast.flags,
                   fa, table, d, draws, sr, out.reshape(L, NR, TY, NC * TX),
                   _NO_VALS if dq is None else vals.reshape(L, NR, TY, NC * TX), inputs=1)
    return out if dq is None else (out, vals)


def value_table(elem):
    """The float32 value of every code of ``elem`` (at most 16 bits), by code."""
    t = _TABLES.get(elem)
    if t is None:
        t = _TABLES[elem] = decode(np.arange(1 << elem.bits).astype(elem.code_dtype),
                                   elem).astype(np.float32)
    return t


_TABLES = {}
