"""Block-scaled formats in torch, on the tensor's own device.

:func:`quantize_blocks` and :func:`dequantize_blocks` give the codes, scales
and values of :func:`fpemu.block.quantize_blocks` and
:func:`fpemu.block.dequantize_blocks`, bit for bit, for every preset and
scale rule (MX: floor, rceil, ceil, even, rceil-exact; NVFP4: TE's rule, its
older division, torchao's, Four Over Six, cuDNN's; fp32 scales: current and
pow2), every element rounding, 1-D blocks along any axis and 2-D tiles,
zero-padded tails. The scale rules are those of :mod:`fpemu.block.rules`
(the formulas: the text of :mod:`fpemu.block`) and the steps of
:mod:`fpemu.block.driver` (block layout, amaxes, draws, element rounding),
each written once and run here with torch's array namespace and this
package's quantizers as the rounding backend:

* the block layout (1-D blocks along an axis other than the last and 2-D
  tiles read where they lie, as a view), the amaxes, the scale exponents
  (from the float32 bits, integer operations) and the rounding of scales and
  elements (:mod:`fpemu.torch`'s quantizers, integer operations) stay on the
  device;
* the float32 arithmetic of the rules (``amax / 6``, ``fp8_max / amax``,
  ``x * enc``) is torch's float32 arithmetic, one rounding per operation as
  in NumPy. A division is always by a tensor on the same device: CUDA
  divides by a Python number as a multiplication by its reciprocal, which
  can differ in the last bit;
* the tensor scale of the two-level NVFP4 rules is computed on the host from
  the tensor amax (one number comes back), by the same scalar code as
  :mod:`fpemu.block`;
* ``"srN"`` rounding draws its bits from Philox4x32-10 by element index,
  on the device (the same bits as :mod:`fpemu.block` for the same seed);
  with ``rng="pcg64"`` (NumPy's stream, earlier releases' default) they are
  made on the host and sent to the device;
* Four Over Six sums each block's squared errors in float64 in the fixed
  halving order of :func:`fpemu.block.halving_sum`.

A CPU tensor lies in host memory: it goes through the host's driver, the
rules run with NumPy's namespace on a view of its memory (DLPack, no copy)
and the results come back as CPU tensors. The rules' per-block arithmetic
is a few dozen small array operations, each a few microseconds in NumPy and
several times that in torch's CPU operations: 600 -> 325 us for an MXFP8
quantization of a 256 x 64 tensor (``docs/performance.md``, issue 71).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..block import checks as _checks
from ..block import driver as _driver
from ..block import fused as _fused
from ..block import host as _host
from ..block.rules import array_namespace
from ..block.spec import BlockQuantized
from ..checks import seed_key
from ..errors import FpemuValueError
from ..rounding import Rounding
from . import _quantize as _q

torch = _q.torch

__all__ = ["quantize_blocks", "dequantize_blocks", "TensorBlocks"]


class TensorBlocks:
    """The result of :func:`quantize_blocks`: ``codes`` and ``scales``
    (integer tensors on the input's device, the dtypes and layout of
    :class:`fpemu.block.BlockQuantized`), ``clipped`` (a bool tensor per
    block) and the same fields (``elem``, ``scale_fmt``, ``block``,
    ``axis``, ``scale_rule``, ``tensor_scale``, ``tensor_amax``,
    ``rounding``, ``shape``). ``values`` are the exact values (float64);
    :meth:`dequantize` gives them in float32 where float32 holds them;
    :meth:`numpy` the host :class:`fpemu.block.BlockQuantized`."""

    __slots__ = ("codes", "scales", "clipped", "elem", "scale_fmt", "block", "axis",
                 "scale_rule", "tensor_scale", "tensor_amax", "rounding", "shape", "cache")

    def __init__(self, codes, scales, *, clipped, elem, scale_fmt, block, axis, scale_rule,
                 tensor_scale, tensor_amax, rounding, shape):
        self.codes, self.scales, self.clipped = codes, scales, clipped
        self.elem, self.scale_fmt, self.block, self.axis = elem, scale_fmt, block, axis
        self.scale_rule, self.tensor_scale, self.tensor_amax = scale_rule, tensor_scale, tensor_amax
        self.rounding, self.shape = rounding, tuple(shape)
        self.cache = {}

    def t(self):
        """The transpose of a 2-D array's blocks: the same blocks, codes and
        scales transposed. 2-D tiles: what quantizing the transposed array
        gives, tile by tile, for a deterministic rounding; 1-D blocks along
        one axis: what quantizing the transposed array along the other axis
        gives (the same blocks in the same order, so stochastic rounding's
        draws too). The codes, scales and cached values are transposed views
        of these (no copy: the kernels that read them make them contiguous
        where they need to)."""
        if len(self.shape) != 2:
            raise FpemuValueError(f"TensorBlocks.t(): only a 2-D array's blocks can be "
                                  f"transposed as they are; this one has shape {self.shape}: "
                                  "quantize the transpose instead")
        tiles = isinstance(self.block, tuple)
        q = TensorBlocks(
            self.codes.t(), self.scales.t(),
            clipped=None if self.clipped is None else self.clipped.t(),
            elem=self.elem, scale_fmt=self.scale_fmt,
            block=self.block[::-1] if tiles else self.block, axis=None if tiles else 1 - self.axis,
            scale_rule=self.scale_rule, tensor_scale=self.tensor_scale,
            tensor_amax=self.tensor_amax, rounding=self.rounding, shape=self.shape[::-1])
        q.cache = {k: v.t() for k, v in self.cache.items()}
        return q

    def __iter__(self):
        return iter((self.codes, self.scales))

    @property
    def device(self):
        return self.codes.device

    @property
    def values(self):
        """The exact values the codes stand for (float64, on the device)."""
        return dequantize_blocks(self)

    def dequantize(self, dtype=None):
        """The values as ``dtype`` (default float32), rounded once from the
        exact values (exact wherever the dtype holds them: elements times a
        power-of-two or e4m3 scale always fit float32, except where the
        product falls below float32's subnormals)."""
        return self.values.to(torch.float32 if dtype is None else dtype)

    def numpy(self):
        """The host :class:`fpemu.block.BlockQuantized` of these codes."""
        return BlockQuantized(
            self.codes.cpu().numpy().astype(self.elem.code_dtype),
            self.scales.cpu().numpy().astype(self.scale_fmt.code_dtype),
            elem=self.elem, scale_fmt=self.scale_fmt, block=self.block, axis=self.axis,
            scale_rule=self.scale_rule, tensor_scale=self.tensor_scale,
            clipped=None if self.clipped is None else self.clipped.cpu().numpy(),
            rounding=self.rounding, shape=self.shape, tensor_amax=self.tensor_amax)

    def __repr__(self):
        return (f"TensorBlocks(elem={self.elem.name}, scale_fmt={self.scale_fmt.name}, "
                f"block={self.block}, axis={self.axis}, scale_rule={self.scale_rule!r}, "
                f"shape={self.shape}, device={self.device}, tensor_scale={self.tensor_scale})")


# ------------------------------------------------------------------ helpers
def _codes(t, fmt, **kw):
    """fpemu.torch.encode of float32 values: uint8 for formats of up to 8
    bits, else int32 (int64 for 32-bit codes, fp32 scales)."""
    assert t.dtype == torch.float32
    if fmt.bits <= 8 and not _q._on_cpu(t):      # (the Numba kernels need no range hint)
        return _q.encode_trusted(t, fmt, in_range=_within(t, fmt, **kw), **kw)
    if fmt.bits <= 8:
        return _q.encode_trusted(t, fmt, **kw)
    return _q.encode_trusted(t, fmt, **kw).to(torch.int32 if fmt.bits <= 16 else torch.int64)


def _within(t, fmt, rounding="rne", **kw):
    """Whether every value of ``t`` is finite and at most ``fmt``'s largest
    in magnitude (one pass, no copy), for round-to-nearest-even encodes,
    which then skip saturation and NaN (the short encode of fpemu/torch/_quantize.py)."""
    if rounding != "rne" or t.numel() == 0:
        return False
    lo, hi = torch.aminmax(t)
    m = float(fmt.max)
    return bool((lo >= -m) & (hi <= m))


class _DeviceOps(_driver.Ops):
    """The device's rounding backend (:class:`fpemu.block.driver.Ops`):
    :mod:`fpemu.torch`'s quantizers, on the tensor's device."""

    @staticmethod
    def cast(v, fmt, rounding="rne"):
        return _q.quantize(v, fmt, rounding=rounding)

    @staticmethod
    def encode(v, fmt, **kw):
        # ("srN" values of a float64 computation are grid values of fmt: float32 holds them)
        return _codes(v.to(torch.float32), fmt, **kw)

    @staticmethod
    def decode(codes, fmt):
        return _q.decode_trusted(codes, fmt)

    @staticmethod
    def within(v, fmt):
        return _within(v, fmt)

    @staticmethod
    def block_amax(Bk, dims, xp):
        """The block amaxes: one fused kernel on CPU tensors (Numba, on their
        memory) and CUDA tensors (Triton), torch's ``amax`` elsewhere."""
        if _q._on_cpu(Bk):
            return torch.from_numpy(_fused.block_amax(_host_view(Bk), dims))
        kernels = _triton_blocks_for(Bk)
        if kernels is not None:
            return kernels.block_amax(Bk, dims)
        return xp.block_amax(Bk, dims)

    @staticmethod
    def scale_round(job, factor, divide, block_nan, has_nan, dq=None):
        """The element step: one fused kernel on CPU tensors (Numba; with
        ``dq``, the values in the same pass) and CUDA tensors (Triton; the
        values then by :func:`fpemu.block.driver.block_values`) where
        :func:`fpemu.block.fused.fuses`, the driver's torch code elsewhere."""
        if _fused.fuses(job.elem, job.rounding):
            if _q._on_cpu(job.Bk):
                host = dataclasses.replace(job, Bk=_host_view(job.Bk))
                out = _fused.scale_round(host, _host_view(factor), divide,
                                         _host_view(block_nan), has_nan,
                                         None if dq is None else _host_view(dq))
                if dq is None:
                    return torch.from_numpy(out)
                return torch.from_numpy(out[0]), torch.from_numpy(out[1])
            kernels = _triton_blocks_for(job.Bk)
            if kernels is not None:
                codes = kernels.scale_round(job, factor, divide, block_nan, has_nan)
                return codes if dq is None else (codes, _driver.block_values(job, codes, dq))
        return _driver.Ops.scale_round(job, factor, divide, block_nan, has_nan, dq)

    @staticmethod
    def srn_draws(n, seed, like, rng):
        """:func:`fpemu.block.host.srn_draws` on ``like``'s device in its
        shape: Philox drawn there (the top ``n`` bits of each element's 63-bit
        draw, by this package's quantizers' code), or NumPy's PCG64 drawn on
        the host and sent (``rng="pcg64"``)."""
        if rng == "philox":
            key, offset = seed_key(seed, Rounding.SR, entropy=True)  # a recipe's [seed, calls]
            kernels = _q._triton_for(like)
            if _q._on_cpu(like):                      # the Numba kernel, on the host's memory
                d = torch.from_numpy(_host.srn_draws(n, seed, like.numel(), rng).view(np.int64))
            elif kernels is not None:                 # one Triton kernel
                d = kernels.philox_draws(torch.empty(like.shape, dtype=torch.int64,
                                                     device=like.device), key, offset, n)
            else:
                d = _q._philox63(key, offset, like.shape, like.device) >> (63 - n)
            return d.view(like.shape)
        d = _host.srn_draws(n, seed, like.numel(), rng)
        d = d.astype(np.uint8 if n <= 8 else np.int32 if n <= 31 else np.int64)   # (fewer bytes)
        return torch.from_numpy(d).to(like.device).view(like.shape)


def _host_view(t):
    """NumPy's view of a CPU tensor's memory (any strides), by DLPack:
    ``Tensor.numpy()`` would mark the storage as not resizable, and the
    tensor may be a parameter whose storage FSDP frees and regrows."""
    return np.from_dlpack(t.detach())


def _triton_blocks_for(t):
    """The fused Triton block kernels for a tensor they run on (CUDA, or any
    device under ``TRITON_INTERPRET=1`` in fpemu's tests), else None."""
    if _q._triton_for(t) is None:
        return None
    from . import _triton_blocks        # (imports triton: only for the tensors it runs on)
    return _triton_blocks


_OPS = _DeviceOps()
_XP = array_namespace("torch")
_HOST_XP = array_namespace("numpy")


# ------------------------------------------------------------------- public
@torch.compiler.disable
def quantize_blocks(t, elem="mxfp8", scale_fmt=None, block=None, axis=-1, scale_rule=None,
                    rounding="rne", seed=None, *, tensor_amax=None, inf_block="saturate",
                    rng=None):
    """:func:`fpemu.block.quantize_blocks` on a tensor's own device.

    The arguments are those of :func:`fpemu.block.quantize_blocks` (a
    preset name such as ``"mxfp8"``, ``"nvfp4"``, ``"fp8-block"``, or the
    element and scale formats, block, axis, scale rule, rounding). Returns a
    :class:`TensorBlocks` whose ``codes``, ``scales`` and ``clipped`` equal
    the host function's on ``t.cpu().numpy()`` bit for bit; ``values`` are
    its values (float64).

    Examples
    --------
    >>> import torch, fpemu.torch
    >>> q = fpemu.torch.quantize_blocks(torch.tensor([[0.1, -3.0, 7.5, 0.0]]), "mxfp4", block=4)
    >>> q.scales.tolist(), q.values.tolist()
    ([[127]], [[0.0, -3.0, 6.0, 0.0]])
    """
    return _quantize_blocks(t, elem, scale_fmt, block, axis, scale_rule, rounding, seed,
                            tensor_amax, inf_block, rng)


@torch.compiler.disable
def quantize_blocks_scaled(t, elem, scale_fmt, block, axis, scale_rule, rounding, seed):
    """:func:`quantize_blocks` whose result also holds each element's value
    times its block scale in float32 (``cache["scaled32"]``, the operand
    values of ``fpemu.torch.emulate``'s GEMMs), written by the element step
    in the same pass as the codes, on the CPU where float32 holds every such
    product (:func:`float32_exact`). Other devices compute them from the
    codes when the GEMM asks (on CUDA one Triton kernel)."""
    return _quantize_blocks(t, elem, scale_fmt, block, axis, scale_rule, rounding, seed, None,
                            "saturate", None, scaled=True)


def _quantize_blocks(t, elem, scale_fmt, block, axis, scale_rule, rounding, seed, tensor_amax,
                     inf_block, rng, scaled=False):
    cfg = _driver.configure(elem, scale_fmt, block, scale_rule, rounding, seed, rng,
                            tensor_amax, inf_block)
    X = _q._float32_bits(t, "quantize_blocks").view(torch.float32)
    ax = _checks.check_layout(tuple(X.shape), cfg.block, axis, "fpemu.torch.quantize_blocks",
                              noun="a tensor", fix0d="t.reshape(1)")
    host = _q._on_cpu(X) and _triton_blocks_for(X) is None
    scaled = scaled and host and cfg.elem.bits <= 16 and float32_exact(cfg.elem, cfg.scale_fmt)
    ctype = _q._CODE_DTYPES[cfg.elem.code_dtype.itemsize]
    stype = _q._CODE_DTYPES[cfg.scale_fmt.code_dtype.itemsize]
    if host:
        # a CPU tensor is host memory: the host's driver reads it in place (the
        # rules' per-block arithmetic in NumPy, a few microseconds an operation
        # where torch's CPU operations take several times that on small tensors)
        with _q._host_kernels():
            r = _driver.run(_host_view(X), cfg, ax, _HOST_XP, _host.OPS, allow_in_place=True,
                            values=scaled)
        r = r._replace(codes=_from_host(r.codes, cfg.elem.code_dtype),
                       scodes=_from_host(r.scodes, cfg.scale_fmt.code_dtype),
                       clipped=_from_host(r.clipped, np.bool_),
                       values=None if r.values is None else _from_host(r.values, np.float32))
    else:
        r = _driver.run(X, cfg, ax, _XP, _OPS, allow_in_place=True, values=scaled)
    q = TensorBlocks(
        _as_codes(r.codes, ctype), _as_codes(r.scodes, stype), clipped=r.clipped.contiguous(),
        elem=cfg.elem, scale_fmt=cfg.scale_fmt, block=cfg.block, axis=ax, scale_rule=cfg.rule,
        tensor_scale=r.tensor_scale, tensor_amax=r.tensor_amax, rounding=rounding,
        shape=tuple(X.shape))
    if scaled:
        q.cache["scaled32"] = r.values
    return q


def _from_host(a, dtype):
    """A host array of the driver's result as a CPU tensor of ``dtype`` (a
    NumPy dtype), contiguous, without a copy where it is one already."""
    return torch.from_numpy(np.ascontiguousarray(a, dtype))


def _as_codes(c, dtype):
    if dtype == torch.uint32:
        return (c & 0xFFFFFFFF).to(dtype).contiguous()
    return c.to(dtype).contiguous()


@torch.compiler.disable
def dequantize_blocks(q, scales=None, *, elem=None, scale_fmt=None, block=None, axis=-1,
                      tensor_scale=None):
    """:func:`fpemu.block.dequantize_blocks` on the codes' device: the exact
    values (float64) of a :class:`TensorBlocks`, or of codes with
    ``scales``, ``elem``, ``scale_fmt``, ``block``, ``axis`` and
    ``tensor_scale``. A NaN scale makes its whole block NaN."""
    if isinstance(q, TensorBlocks):
        return _dequantize(q.codes, q.scales, q.elem, q.scale_fmt, q.block, q.axis,
                           q.tensor_scale, trusted=True)
    for name, a in (("codes", q), ("scales", scales)):
        if not isinstance(a, torch.Tensor) or a.is_floating_point() or a.is_complex():
            what = a.dtype if isinstance(a, torch.Tensor) else type(a).__name__
            raise FpemuValueError(
                f"fpemu.torch.dequantize_blocks(): pass a TensorBlocks, or codes and scales= "
                f"as integer tensors with elem=, scale_fmt= and block=; {name} is {what}")
    if elem is None or scale_fmt is None or block is None:
        raise FpemuValueError("fpemu.torch.dequantize_blocks(): pass a TensorBlocks, or "
                              "codes with scales=, elem=, scale_fmt= and block=")
    elem, scale_fmt = _checks.lookup(elem), _checks.lookup(scale_fmt)
    block = _checks.check_block(block, "dequantize_blocks")
    axis = _checks.check_scales(tuple(q.shape), tuple(scales.shape), block, axis,
                                "fpemu.torch.dequantize_blocks", fix0d="codes.reshape(1)")
    _checks.check_tensor_scale(tensor_scale, "fpemu.torch.dequantize_blocks")
    return _dequantize(q, scales, elem, scale_fmt, block, axis, tensor_scale)


def float32_exact(elem, scale_fmt):
    """Whether float32 arithmetic gives every element times every scale as
    the exact product rounded once to float32: the significands fit 24 bits
    together and the smallest product, the smallest subnormal element times
    the smallest scale, is at least 2**-149 (every MX and NVFP4 pairing; a
    custom format may not be), so each product is exact unless it overflows,
    and then both give inf."""
    if scale_fmt.name == "fp32" or elem.bits > 16 or scale_fmt.bits > 16:
        return False
    digits = elem.mantissa_bits + scale_fmt.mantissa_bits + 2
    tiny = float(elem.min_subnormal if elem.has_subnormals else elem.min_normal)
    stiny = float(scale_fmt.min_subnormal if scale_fmt.has_subnormals else
                  scale_fmt.min_normal)
    return digits <= 24 and tiny * stiny >= 2.0**-149


def _expand_scales(svals, block, axis, shape):
    """Block scale values repeated over their blocks, cut to ``shape``."""
    if isinstance(block, tuple):
        ty, tx = block
        full = svals.repeat_interleave(ty, dim=-2).repeat_interleave(tx, dim=-1)
        return full[..., :shape[-2], :shape[-1]]
    return svals.repeat_interleave(block, dim=axis).narrow(axis, 0, shape[axis])


def _dequantize(codes, scales, elem, scale_fmt, block, axis, tensor_scale, trusted=False,
                dtype=torch.float64):
    """Elements times their scales (times the tensor scale), as ``dtype``:
    float64 is exact; float32 is asked for only where the products are
    float32 numbers (:func:`float32_exact`)."""
    decode = _q.decode_trusted if trusted else _q.decode
    vals = decode(codes, elem).to(dtype)
    svals = decode(scales, scale_fmt).to(dtype)
    shape = tuple(codes.shape)
    if isinstance(block, tuple) and shape[-2] % block[0] == 0 and shape[-1] % block[1] == 0:
        # whole tiles: each tile times its scale by broadcasting, no repeated copy
        lead, (R, C), (ty, tx) = shape[:-2], shape[-2:], block
        out = (vals.view(lead + (R // ty, ty, C // tx, tx))
               * svals.unsqueeze(-2).unsqueeze(-1)).view(shape)
    elif isinstance(block, int) and shape[axis] % block == 0:
        # whole blocks along any axis: the axis split in two, each block times its
        # scale by broadcasting
        split = shape[:axis] + (shape[axis] // block, block) + shape[axis + 1:]
        out = (vals.view(split) * svals.unsqueeze(axis + 1)).view(shape)
    else:
        out = vals * _expand_scales(svals, block, axis, shape)
    if tensor_scale is not None:
        out = out * float(np.float32(np.asarray(tensor_scale).reshape(())))
    return out
