"""Block dequantization (element codes times block scales) as one fused
Triton kernel, for CUDA tensors.

The emulated GEMMs of :mod:`fpemu.torch` multiply block-scaled operands as
their float32 values: each element's value times its block's scale, one
float32 product (``fpemu.torch._emulate._block_scaled``). With torch
operations (``fpemu.torch._blocks._dequantize``) that is a decode of the
codes, a widening, the scales repeated or broadcast to the elements' shape
and a product: several kernels, each a pass over memory with its own
temporary. :func:`scaled_values` is one kernel, one read of the codes (and
of the scales, a small array the caches hold) and one write of the float32
values: the CUDA counterpart of the CPU's Numba pass,
:func:`fpemu.block.host.scaled_values`, and its bits::

    out[r, c] = fp32(value(codes[r, c]) * scales[r // by, c // bx])

over a 2-D ``(rows, cols)`` array, ``(by, bx)`` the block: ``(1, block)``
for 1-D blocks along axis 1, ``(block, 1)`` along axis 0, the tile for 2-D
tiles; the last block along an axis may be partial.

Each code's value is fpemu's element decoding, :mod:`fpemu._elemround` as
:mod:`fpemu.torch._triton` binds it (integer operations on the float32
bits, the source of :func:`fpemu.torch._triton.decode_codes`); the product is
Triton's ``*`` on two float32 numbers, IEEE multiplication rounded to
nearest even, alone in its expression, so nothing fuses it into an FMA.
Where float32 holds every element times every scale
(:func:`fpemu.torch._blocks.float32_exact`: every MX and NVFP4 pairing),
each product is exact, or inf where it overflows, so the values are those
of :func:`fpemu.block.dequantize_blocks` (without NVFP4's tensor scale). A
NaN scale (E8M0's ``0xFF``) makes its block NaN, as a NaN element makes its
value NaN; NaN payloads are the GPU's.

The tiling. A program takes a ``(BR, BC)`` tile of the ``(rows, cols)``
array (``BC`` a power of two up to 128 columns, ``BR`` rows up to
:data:`TILE` elements in all; a one-dimensional grid, column tiles
fastest), reads the codes through their strides (any layout, no copy) and
each element's scale through the scales' strides (``by`` and ``bx`` are
``tl.constexpr``: the divisions by them compile to shifts or products), and
writes the values row-major. ``tests/test_triton_dequant.py`` runs the
kernel under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors
against :func:`fpemu.block.host.scaled_values`, bit for bit.
"""

from __future__ import annotations

import contextlib

import numpy as np
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..errors import FpemuValueError
from . import _quantize as _q
from ._triton import _elements

torch = _q.torch

__all__ = ["scaled_values", "TILE"]

#: The most elements a program holds at once.
TILE = 2048


@triton.jit
def _scaled_kernel(c_ptr, s_ptr, out_ptr, rows, cols, ntc, scr, scc, ssr, ssc,
                   M: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr,
                   MAXMAG: tl.constexpr, INFMAG: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                   FLAGS: tl.constexpr, BY: tl.constexpr, BX: tl.constexpr,
                   BR: tl.constexpr, BC: tl.constexpr):
    """``out[r, c] = value(c_ptr[r scr + c scc]) * s_ptr[(r // BY) ssr +
    (c // BX) ssc]`` (float32, ``out`` row-major) over program ``pid``'s
    tile: rows ``pid // ntc``, columns ``pid % ntc`` of ``(BR, BC)``
    tiles."""
    pid = tl.program_id(0)
    pr = pid // ntc
    r = pr * BR + tl.arange(0, BR)
    c = (pid - pr * ntc) * BC + tl.arange(0, BC)
    m = (r < rows)[:, None] & (c < cols)[None, :]
    r64 = r.to(tl.int64)
    c64 = c.to(tl.int64)
    code = tl.load(c_ptr + (r64 * scr)[:, None] + (c64 * scc)[None, :], mask=m, other=0)
    code = code.to(tl.int64).to(tl.int32)                  # (wraps 32-bit codes)
    mag, negative, nan = _elements.decoded(code, M, EMIN, BIAS, MAXMAG, INFMAG, SIGN_SHIFT,
                                           FLAGS)
    v = _elements.value_bits(mag, negative, nan, M, EMIN, BIAS, INFMAG, FLAGS)
    s_off = ((r // BY).to(tl.int64) * ssr)[:, None] + ((c // BX).to(tl.int64) * ssc)[None, :]
    s = tl.load(s_ptr + s_off, mask=m, other=1.0)
    tl.store(out_ptr + (r64 * cols)[:, None] + c64[None, :], v.to(tl.float32, bitcast=True) * s,
             mask=m)


#: whether the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``)
_INTERPRETED = isinstance(_scaled_kernel, InterpretedFunction)


def _quiet():
    """No NumPy warnings while the interpreter runs the kernel with NumPy
    (a product past float32's range, inf times zero: what the arithmetic
    means); a GPU launch ignores it."""
    return np.errstate(all="ignore") if _INTERPRETED else contextlib.nullcontext()


def _by_bx(block, axis):
    """The block's extent ``(by, bx)`` over the rows and the columns."""
    if isinstance(block, tuple):
        return tuple(int(b) for b in block)
    return (int(block), 1) if axis is not None and axis % 2 == 0 else (1, int(block))


def scaled_values(codes, scale_values, elem, block, axis):
    """Element values times their block scales, float32, in one kernel.

    Parameters
    ----------
    codes : torch.Tensor
        2-D ``(rows, cols)`` element codes on a Triton device: valid codes of
        ``elem`` in any unsigned integer dtype (uint8, uint16, uint32; int32
        holding 32-bit patterns), any strides.
    scale_values : torch.Tensor
        The blocks' scales as float32 values (decoded scale codes: NaN where
        a scale is NaN), any strides, the scales' shape: ``(rows, ceil(cols
        / block))`` for blocks along axis 1, ``(ceil(rows / block), cols)``
        along axis 0, ``(ceil(rows / ty), ceil(cols / tx))`` for tiles.
    elem : Format or str
        The element format.
    block : int or (int, int)
        The block length along ``axis``, or a 2-D tile ``(ty, tx)``.
    axis : int or None
        The blocked axis of 1-D blocks, 0 or 1 (-2, -1); ignored for tiles.

    Returns
    -------
    torch.Tensor
        float32 ``(rows, cols)``, contiguous: ``value(codes[r, c]) *
        scale_values[r // by, c // bx]``, one IEEE float32 product rounded
        to nearest even per element, the bits of
        :func:`fpemu.block.host.scaled_values` (NaN payloads aside). Exact
        where float32 holds every element times every scale
        (:func:`fpemu.torch._blocks.float32_exact`: every MX and NVFP4
        pairing); NVFP4's tensor scale is not applied.
    """
    if codes.dim() != 2:
        raise FpemuValueError(f"scaled_values(): codes must be 2-D (rows, cols), got shape "
                              f"{tuple(codes.shape)}")
    rows, cols = codes.shape
    by, bx = _by_bx(block, axis)
    want = (-(-rows // by), -(-cols // bx))
    if tuple(scale_values.shape) != want:
        raise FpemuValueError(f"scaled_values(): scale_values must have the scales' shape "
                              f"{want} for codes of shape {(rows, cols)} in blocks of "
                              f"{(by, bx)}, got {tuple(scale_values.shape)}")
    out = torch.empty((rows, cols), dtype=torch.float32, device=codes.device)
    if not out.numel():
        return out
    s = scale_values if scale_values.dtype == torch.float32 else scale_values.float()
    plan = _q._plan(elem, "rne", True, "saturate", None)
    L = plan.layout
    BC = min(triton.next_power_of_2(cols), 128)
    BR = min(triton.next_power_of_2(rows), max(1, TILE // BC))
    ntc = triton.cdiv(cols, BC)
    with _quiet():
        _scaled_kernel[(triton.cdiv(rows, BR) * ntc,)](
            codes, s, out, rows, cols, ntc, *codes.stride(), *s.stride(), M=L.mantissa_bits,
            EMIN=L.emin, BIAS=L.bias, MAXMAG=L.max_code, INFMAG=L.inf_code,
            SIGN_SHIFT=L.sign_shift, FLAGS=plan.flags, BY=by, BX=bx, BR=BR, BC=BC)
    return out
