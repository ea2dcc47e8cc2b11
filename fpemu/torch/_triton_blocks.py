"""The block driver's two passes over the elements as fused Triton kernels,
for CUDA tensors.

:func:`fpemu.block.driver.run` reads a block quantization's elements twice:
for each block's amax (step 2) and for the element step (step 5: each
element times its block's factor, clamped to the element format's largest
value, rounded with overflow saturating, a NaN block's codes signed zeros).
Written with torch operations each is a dozen kernels and as many
temporaries; here each is one Triton kernel, one read of the elements and
one write (the amaxes, the codes). The kernels run what the scale rule
decided per block (its factor, whether the block is NaN): the rule stays the
array code of :mod:`fpemu.block.rules` on the per-block arrays, so no rule is
written twice. They are the CUDA counterparts of the Numba kernels of
:mod:`fpemu.block.fused` and give their bits:

* :func:`block_amax`: the largest magnitude of each block as the largest
  float32 magnitude bits (integer compares: NaN's above inf's above every
  number's), a block holding a NaN the canonical ``0x7fc00000``;
* :func:`scale_round`: ``w = fp32(x * f)`` (``fp32(x / f)`` for a rule that
  divides, IEEE division: ``tl.math.div_rn``, where Triton's ``/`` on
  float32 is an approximate ``div.full``), a zero element kept with its
  sign, ``w`` clamped to the format's largest magnitude (NaN stays NaN),
  NaN read as 0 where some block is NaN, then fpemu's element rounding,
  :mod:`fpemu._elemround` as :mod:`fpemu.torch._triton` binds it (integer
  operations on the float32 bits), and a NaN block's codes a zero of each
  input's sign. Stochastic rounding (``"sr"``) draws by element index in
  the driver's block layout, offset by the job's offset, as the Numba kernel
  and the array code do. ``"srN"`` and element formats wider than 16 bits
  run the driver's torch code (:func:`fpemu.block.fused.fuses`).

The layout. Both kernels read the block layout as the 5-D array ``(L, NR,
TY, NC, TX)`` of :func:`fpemu.block.fused.five_d` (each block a ``(TY, TX)``
slice), through its strides: a view where torch can make one, so blocks
along an axis other than the last and 2-D tiles are read where they lie, in
the input's own memory. Blocks along the last axis, ``(L, 1, 1, NC, TX)``,
are read as one run of ``L NC`` blocks. A program takes ``BC`` consecutive
blocks of one ``(l, r)`` (a tile of ``BC`` blocks by ``BE`` of their
elements, at most :data:`TILE` elements, ``BE`` a power of two covering the
block up to that) and loops over the block's elements ``BE`` at a time; the
grid is one-dimensional, ``L NR ceil(NC / BC)`` programs. The codes are
written in the layout's C order (the shape of ``job.Bk``, contiguous), the
amaxes in the per-block shape.

``tests/test_triton_blocks.py`` runs the kernels under Triton's interpreter
(``TRITON_INTERPRET=1``) on CPU tensors and holds
:func:`fpemu.torch.quantize_blocks` through them to
:func:`fpemu.block.quantize_blocks`, bit for bit, for every preset and
scale rule, layout and rounding mode; and each kernel alone, the amaxes to
a loop over the blocks, the element step to the driver's NumPy array code.
"""

from __future__ import annotations

import contextlib

import numpy as np
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from ..block import fused as _fused
from . import _quantize as _q
from ._triton import _elements, _int32

torch = _q.torch

__all__ = ["block_amax", "scale_round", "TILE"]

#: The most elements a program holds at once (its tile of blocks by elements).
TILE = 2048


# ------------------------------------------------------------------ kernels
@triton.jit
def _tile(pid, NR, NC, nchunks, sL, sR, sC, BC: tl.constexpr):
    """The ``(l, r)`` row of blocks of program ``pid`` (as ``l NR + r``), its
    blocks' ``c`` (``BC`` of them), which of them exist and their first
    elements' offsets."""
    lr = pid // nchunks
    c = (pid - lr * nchunks) * BC + tl.arange(0, BC)
    lead = lr // NR
    r = lr - lead * NR
    return lr, c, c < NC, lead * sL + r * sR + c.to(tl.int64) * sC


@triton.jit
def _amax_kernel(x_ptr, out_ptr, NR, NC, nchunks, sL, sR, sY, sC, sX, TY: tl.constexpr,
                 TX: tl.constexpr, BC: tl.constexpr, BE: tl.constexpr):
    """``out[l NR NC + r NC + c]``: the float32 bits (int32) of block ``(l,
    r, c)``'s largest magnitude, the canonical NaN where it holds one."""
    pid = tl.program_id(0).to(tl.int64)
    lr, c, cm, base = _tile(pid, NR, NC, nchunks, sL, sR, sC, BC)
    acc = tl.zeros([BC], dtype=tl.int32)
    for e0 in range(0, TY * TX, BE):
        e = e0 + tl.arange(0, BE)
        y = e // TX
        off = base[:, None] + (y.to(tl.int64) * sY + (e - y * TX).to(tl.int64) * sX)[None, :]
        m = cm[:, None] & (e < TY * TX)[None, :]
        b = tl.load(x_ptr + off, mask=m, other=0) & 0x7FFFFFFF
        acc = tl.maximum(acc, tl.max(b, axis=1))
    acc = tl.where(acc > 0x7F800000, 0x7FC00000, acc)
    tl.store(out_ptr + lr * NC + c, acc, mask=cm)


@triton.jit
def _scale_round_kernel(x_ptr, f_ptr, nan_ptr, out_ptr, maxv, key, offset, NR, NC, nchunks,
                        sL, sR, sY, sC, sX, M: tl.constexpr, EMIN: tl.constexpr,
                        EMAX: tl.constexpr, BIAS: tl.constexpr, MAXMAG: tl.constexpr,
                        INFMAG: tl.constexpr, NANCODE: tl.constexpr, SIGN_SHIFT: tl.constexpr,
                        ZERO_SHIFT: tl.constexpr, FLAGS: tl.constexpr, MODE: tl.constexpr,
                        DIVIDE: tl.constexpr, HAS_NAN: tl.constexpr, TY: tl.constexpr,
                        TX: tl.constexpr, BC: tl.constexpr, BE: tl.constexpr):
    """The codes of block ``(l, r, c)``'s elements times (``DIVIDE``: over)
    its factor ``f_ptr[l NR NC + r NC + c]``, a block marked in ``nan_ptr``
    (``HAS_NAN``: some are) given a zero of each element's sign (its sign
    bit at ``ZERO_SHIFT``); element ``(l, r, y, c, x)`` written, and drawn
    for, at its C-order index of the 5-D layout (plus ``offset`` for the
    draw)."""
    pid = tl.program_id(0).to(tl.int64)
    lr, c, cm, base = _tile(pid, NR, NC, nchunks, sL, sR, sC, BC)
    blk = lr * NC + c
    f = tl.load(f_ptr + blk, mask=cm, other=1.0)[:, None]
    if HAS_NAN:
        nanb = (tl.load(nan_ptr + blk, mask=cm, other=0) != 0)[:, None]
    first = lr * (TY * NC * TX) + c.to(tl.int64) * TX          # element (l, r, 0, c, 0)
    for e0 in range(0, TY * TX, BE):
        e = e0 + tl.arange(0, BE)
        y = (e // TX).to(tl.int64)
        x = (e % TX).to(tl.int64)
        m = cm[:, None] & (e < TY * TX)[None, :]
        u = tl.load(x_ptr + base[:, None] + (y * sY + x * sX)[None, :], mask=m, other=0)
        v = u.to(tl.float32, bitcast=True)
        if DIVIDE:
            w = tl.math.div_rn(v, f)
        else:
            w = v * f
        w = tl.where(v == 0, v, w)                          # a zero keeps its sign
        w = tl.where(w > maxv, maxv, w)                     # (NaN stays NaN)
        w = tl.where(w < -maxv, -maxv, w)
        if HAS_NAN:
            w = tl.where(w != w, 0.0, w)
        idx = first[:, None] + (y * (NC * TX) + x)[None, :]
        mag, negative, nan = _elements.rounded(w.to(tl.int32, bitcast=True), M, EMIN, EMAX, BIAS,
                                               MAXMAG, INFMAG, FLAGS, MODE, key, idx + offset)
        code = _elements.code(mag, negative, nan, SIGN_SHIFT, NANCODE)
        if HAS_NAN:
            code = tl.where(nanb, ((u >> 31) & 1) << ZERO_SHIFT, code)
        tl.store(out_ptr + idx, code.to(out_ptr.dtype.element_ty), mask=m)


# ------------------------------------------------------------------ launchers
#: whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``)
_INTERPRETED = isinstance(_amax_kernel, InterpretedFunction)


def _quiet():
    """No NumPy warnings while a kernel runs: the interpreter computes with
    NumPy, which warns of the overflow and NaN that the arithmetic means
    (``x * f`` past float32's range, clamped next); a GPU launch ignores it."""
    return np.errstate(all="ignore") if _INTERPRETED else contextlib.nullcontext()


def _layout(B, dims):
    """The float32 bits (int32) of the block layout ``B`` as its 5-D view
    ``(L, NR, TY, NC, TX)`` (a copy only where torch can make no view),
    blocks along the last axis as one run ``(1, 1, 1, L NC, TX)``."""
    L, NR, TY, NC, TX = _fused.five_d(B.shape, dims)
    if dims == -1:
        L, NC = 1, L * NC
    return B.view(torch.int32).reshape(L, NR, TY, NC, TX)


def _launch(kernel, V, *args, **constexprs):
    """``kernel`` over the 5-D layout ``V``: the tile sizes and the grid
    (module text)."""
    L, NR, TY, NC, TX = V.shape
    BE = min(triton.next_power_of_2(TY * TX), TILE)
    BC = min(triton.next_power_of_2(NC), max(1, TILE // BE))
    nchunks = triton.cdiv(NC, BC)
    sL, sR, sY, sC, sX = V.stride()
    with _quiet():
        kernel[(L * NR * nchunks,)](V, *args, NR, NC, nchunks, sL, sR, sY, sC, sX, TY=TY, TX=TX,
                                    BC=BC, BE=BE, **constexprs)


def block_amax(Bk, dims):
    """Each block's largest magnitude, one kernel.

    Parameters
    ----------
    Bk : torch.Tensor
        The float32 block layout of :func:`fpemu.block.driver.to_blocks`
        (any strides), on a Triton device.
    dims : int or tuple
        The axes of ``Bk`` a block spans
        (:func:`fpemu.block.driver.amax_dims`).

    Returns
    -------
    torch.Tensor
        float32, one per block (``Bk``'s shape without ``dims``); a block
        holding a NaN gives the canonical NaN: the bits of
        :func:`fpemu.block.fused.block_amax`.
    """
    V = _layout(Bk, dims)
    L, NR, _, NC, _ = V.shape
    out = torch.empty(L * NR * NC, dtype=torch.int32, device=Bk.device)
    if V.numel():
        _launch(_amax_kernel, V, out)
    return out.view(torch.float32).reshape(_fused.block_shape(Bk.shape, dims))


def scale_round(job, factor, divide, block_nan, has_nan):
    """The element step (:meth:`fpemu.block.driver.Ops.scale_round`), one
    kernel.

    Parameters
    ----------
    job : fpemu.block.rules.Job
        The blocks (``job.Bk``, float32, on a Triton device, spanning
        ``job.dims``), the element format (at most 16 bits), its rounding
        (not ``"srN"``), seed, offset and generator.
    factor : torch.Tensor
        Each block's factor (float32, the per-block shape).
    divide : bool
        The elements are divided by their factor, not multiplied.
    block_nan : torch.Tensor
        Which blocks are NaN (bool, the per-block shape).
    has_nan : bool or torch.Tensor
        Whether any block is.

    Returns
    -------
    torch.Tensor
        The codes (the format's code dtype, ``job.Bk``'s shape,
        contiguous): those of :func:`fpemu.block.fused.scale_round`.
    """
    B, elem = job.Bk, job.elem
    V = _layout(B, job.dims)
    sr = job.rounding == "sr"
    plan = _q._plan(elem, job.rounding, True, "saturate",
                    (job.seed, job.offset) if job.seed is not None else None,
                    job.rng if sr else None)
    out = torch.empty(B.shape, dtype=_q._CODE_DTYPES[plan.code_bytes], device=B.device)
    if not V.numel():
        return out
    f = factor.to(torch.float32).contiguous()
    has_nan = bool(has_nan)
    nan = block_nan.to(torch.uint8).contiguous() if has_nan else f
    L = plan.layout
    _launch(_scale_round_kernel, V, f, nan, out, float(np.float32(elem.max)), plan.key,
            plan.offset, M=L.mantissa_bits, EMIN=L.emin, EMAX=L.emax, BIAS=L.bias,
            MAXMAG=L.max_code, INFMAG=L.inf_code, NANCODE=_int32(L.nan_code),
            SIGN_SHIFT=L.sign_shift, ZERO_SHIFT=elem.bits - 1, FLAGS=plan.flags, MODE=plan.mode,
            DIVIDE=bool(divide), HAS_NAN=has_nan)
    return out
