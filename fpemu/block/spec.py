"""What a block format is: :class:`BlockSpec` and the named :data:`PRESETS`,
and :class:`BlockQuantized`, the codes and scales a quantizer returns, with
the exact values they stand for (:func:`exact_values`, the one dequantize
formula of the host; ``fpemu/torch/_blocks.py`` has the device's)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import numpy as np

from ..errors import FpemuTypeError
from ..formats import Format
from ..quantize import decode

__all__ = ["BlockSpec", "PRESETS", "BlockQuantized", "FLT_MAX", "INF_BLOCK", "exact_values",
           "scales_shape"]

FLT_MAX = np.float32(np.finfo(np.float32).max)

#: What an MX block holding an infinity gets (``quantize_blocks(inf_block=)``).
INF_BLOCK = ("saturate", "nan")


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """A named block format: element and scale formats (fpemu format names),
    block shape (a length along an axis, or a (rows, cols) tile over the
    last two axes), scale rule (a key of :data:`fpemu.block.SCALE_RULES`)
    and where it comes from."""

    name: str
    elem: str
    scale_fmt: str
    block: Union[int, Tuple[int, int]]
    scale_rule: str
    source: str

    def __post_init__(self):
        ok = (isinstance(self.block, int) and self.block >= 1) or (
            isinstance(self.block, tuple) and len(self.block) == 2
            and all(isinstance(b, int) and b >= 1 for b in self.block))
        if not ok:
            raise FpemuTypeError(f"BlockSpec {self.name!r}: block must be an int >= 1 or a "
                                 f"pair of them, got {self.block!r}")


#: Named block formats (``quantize_blocks(x, "nvfp4")``).
PRESETS = {p.name: p for p in (
    BlockSpec("mxfp8", "e4m3fn", "e8m0", 32, "floor", "OCP MX v1.0 MXFP8 (E4M3)"),
    BlockSpec("mxfp8-e5m2", "e5m2", "e8m0", 32, "floor", "OCP MX v1.0 MXFP8 (E5M2)"),
    BlockSpec("mxfp6-e2m3", "e2m3", "e8m0", 32, "floor", "OCP MX v1.0 MXFP6 (E2M3)"),
    BlockSpec("mxfp6-e3m2", "e3m2", "e8m0", 32, "floor", "OCP MX v1.0 MXFP6 (E3M2)"),
    BlockSpec("mxfp4", "e2m1", "e8m0", 32, "floor", "OCP MX v1.0 MXFP4"),
    BlockSpec("mxfp8-te", "e4m3fn", "e8m0", 32, "rceil",
              "TransformerEngine MXFP8BlockScaling: scales rounded up"),
    BlockSpec("nvfp4", "e2m1", "e4m3fn", 16, "nvfp4",
              "NVFP4, TransformerEngine's reference quantizer"),
    BlockSpec("nvfp4-2d", "e2m1", "e4m3fn", (16, 16), "nvfp4",
              "NVFP4 16x16 tiles (TransformerEngine's weights)"),
    BlockSpec("nvfp4-torchao", "e2m1", "e4m3fn", 16, "nvfp4-torchao",
              "NVFP4, torchao's nvfp4_quantize with a per-tensor scale"),
    BlockSpec("nvfp4-4over6", "e2m1", "e4m3fn", 16, "4over6",
              "NVFP4 with Four Over Six block-scale selection (TE PR #2972)"),
    BlockSpec("nvfp4-cudnn", "e2m1", "e4m3fn", 16, "cudnn",
              "NVFP4 as cuDNN's block-scale quantize states it: one level, scale rounded up"),
    BlockSpec("fp8-block", "e4m3fn", "fp32", (128, 128), "pow2",
              "TransformerEngine Float8BlockScaling weights / DeepSeek-V3 128x128"),
    BlockSpec("fp8-block-1d", "e4m3fn", "fp32", 128, "pow2",
              "TransformerEngine Float8BlockScaling activations / DeepSeek-V3 1x128"),
)}


class BlockQuantized(tuple):
    """``(codes, scales)`` of a block-quantized array, with what decodes them.

    ``codes``: element codes (the element format's code dtype), the input's
    shape. ``scales``: scale codes (``scale_fmt``'s code dtype), the input's
    shape with the blocked axis (axes) divided by the block, rounded up.
    Attributes: ``elem``, ``scale_fmt`` (:class:`fpemu.Format`), ``block``
    (int or pair), ``axis``, ``scale_rule``, ``tensor_scale`` (the fp32
    decode tensor scale, or None), ``tensor_amax`` (the amax the tensor
    scale came from, two-level rules), ``clipped`` (per block: did some
    element exceed the element maximum by more than half its spacing there,
    so that the clamp, not rounding, brought it down: beyond 7 for e2m1, 464
    for e4m3fn; None where the producer, an fp8 recipe, does not track it),
    ``rounding``, ``shape``. The fp8 recipes of :mod:`fpemu.autograd.fp8`
    return their operands as this type too.
    """

    elem: Format
    scale_fmt: Format
    block: Union[int, Tuple[int, int]]
    axis: Optional[int]
    scale_rule: str
    tensor_scale: Optional[np.float32]
    clipped: Optional[np.ndarray]
    rounding: str
    shape: Tuple[int, ...]
    tensor_amax: Optional[np.float32]

    def __new__(cls, codes, scales, *, elem, scale_fmt, block, axis, scale_rule,
                tensor_scale=None, clipped=None, rounding="rne", shape=None, tensor_amax=None):
        self = super().__new__(cls, (codes, scales))
        self.elem, self.scale_fmt, self.block, self.axis = elem, scale_fmt, block, axis
        self.scale_rule, self.tensor_scale, self.clipped = scale_rule, tensor_scale, clipped
        self.rounding = rounding
        self.shape = tuple(np.shape(codes)) if shape is None else shape
        self.tensor_amax = tensor_amax
        return self

    def __reduce__(self):                   # pickles with its fields
        return (_rebuild_quantized, (tuple(self), dict(self.__dict__)))

    @property
    def codes(self):
        return self[0]

    @property
    def scales(self):
        return self[1]

    @property
    def scale_values(self):
        """The scales as float64 (NaN for a NaN scale)."""
        return decode(self.scales, self.scale_fmt).astype(np.float64)

    @property
    def values(self):
        """The exact values the codes stand for (float64)."""
        return exact_values(self.codes, self.scales, self.elem, self.scale_fmt, self.block,
                            self.axis, self.tensor_scale, self.shape)

    def __repr__(self):
        return (f"BlockQuantized(elem={self.elem.name}, scale_fmt={self.scale_fmt.name}, "
                f"block={self.block}, axis={self.axis}, scale_rule={self.scale_rule!r}, "
                f"shape={self.codes.shape}, tensor_scale={self.tensor_scale})")


def _rebuild_quantized(pair, fields):
    return BlockQuantized(*pair, **fields)


def scales_shape(shape, block, axis):
    """The shape of the scales of codes of ``shape`` in blocks of ``block``
    (1-D along ``axis``, or 2-D tiles over the last two axes)."""
    shape = tuple(shape)
    if isinstance(block, tuple):
        return shape[:-2] + (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
    return shape[:axis] + (-(-shape[axis] // block),) + shape[axis + 1:]


def exact_values(codes, scales, elem, scale_fmt, block, axis, tensor_scale, shape=None):
    """``element * scale`` (times the tensor scale) in float64, exact: every
    product of an element of at most 16 bits and a scale fits float64. A
    NaN scale makes its whole block NaN."""
    shape = tuple(np.shape(codes)) if shape is None else tuple(shape)
    vals = decode(codes, elem).astype(np.float64)
    svals = decode(scales, scale_fmt).astype(np.float64)
    if isinstance(block, tuple):
        ty, tx = block
        full = np.repeat(np.repeat(svals, ty, axis=-2), tx, axis=-1)
        full = full[..., :shape[-2], :shape[-1]]
    else:
        full = np.repeat(svals, block, axis=axis)
        full = np.take(full, np.arange(shape[axis]), axis=axis)
    with np.errstate(invalid="ignore"):     # 0 * a NaN or infinite scale is NaN
        out = vals * full
        if tensor_scale is not None:
            out = out * np.float64(tensor_scale)
    return out
