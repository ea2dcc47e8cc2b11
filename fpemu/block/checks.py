"""The argument checks of the block quantizers, shared by the host driver
(:mod:`fpemu.block`) and the device driver (``fpemu.torch.quantize_blocks``):
one message for one mistake, whichever driver sees it."""

from __future__ import annotations

import re

import numpy as np

from ..checks import real_array
from ..errors import FpemuTypeError, FpemuValueError
from ..formats import format as lookup
from ..rounding import parse_rng
from .rules import SCALE_RULES, TENSOR_SCALE_RULES
from .spec import INF_BLOCK, PRESETS, scales_shape

__all__ = ["resolve_args", "check_block", "check_axis", "check_layout", "check_padding",
           "check_tensor_amax", "check_inf_block", "srn_bits", "float32_input", "block_rng",
           "SRN_RNGS",
           "check_scales", "check_tensor_scale", "lookup", "PAD_SLACK"]


def resolve_args(elem, scale_fmt, block, scale_rule):
    """(elem, scale_fmt, block, rule) from a preset name or formats, each
    given argument overriding the preset's; the rule checked against the
    scale format's kind."""
    if isinstance(elem, str) and elem.lower() in PRESETS:
        p = PRESETS[elem.lower()]
        elem = p.elem
        scale_fmt = p.scale_fmt if scale_fmt is None else scale_fmt
        block = p.block if block is None else block
        scale_rule = p.scale_rule if scale_rule is None else scale_rule
    elem = lookup(elem)
    scale_fmt = lookup("e8m0" if scale_fmt is None else scale_fmt)
    block = 32 if block is None else block
    if scale_rule is None:
        scale_rule = {"e8m0": "floor", "fp32": "pow2"}.get(scale_fmt.name, "nvfp4")
    if not isinstance(scale_rule, str) or scale_rule.lower() not in SCALE_RULES:
        raise FpemuValueError(f"quantize_blocks(): unknown scale_rule {scale_rule!r}; choose one "
                              f"of {', '.join(SCALE_RULES)}")
    scale_rule = scale_rule.lower()
    kind = SCALE_RULES[scale_rule].kind
    want = {"mx": "an E8M0 scale (scale_fmt='e8m0')",
            "fp32": "fp32 scales (scale_fmt='fp32')",
            "fp4": "a small float scale such as scale_fmt='e4m3fn'"}[kind]
    ok = {"mx": scale_fmt.name == "e8m0", "fp32": scale_fmt.name == "fp32",
          "fp4": scale_fmt.name not in ("e8m0", "fp32") and scale_fmt.bits <= 16}[kind]
    if not ok:
        raise FpemuValueError(f"quantize_blocks(): scale_rule {scale_rule!r} needs {want}; got "
                              f"scale_fmt={scale_fmt.name!r}")
    if elem.bits > 16 or not elem.signed:
        raise FpemuValueError(f"quantize_blocks(): elements must be a signed format of at most "
                              f"16 bits (e4m3fn, e5m2, e2m3, e3m2, e2m1, ...); got {elem.name}")
    return elem, scale_fmt, block, scale_rule


def check_block(block, fname):
    """``block`` as an int or a pair of ints, each at least 1."""
    if isinstance(block, (int, np.integer)) and not isinstance(block, bool):
        if block < 1:
            raise FpemuValueError(f"{fname}(): block must be >= 1, got {block}")
        return int(block)
    if (isinstance(block, (tuple, list)) and len(block) == 2
            and all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1
                    for b in block)):
        return (int(block[0]), int(block[1]))
    raise FpemuTypeError(f"{fname}(): block must be an int (1-D blocks along axis) or a pair "
                         f"(rows, cols) of ints (2-D tiles over the last two axes), got "
                         f"{block!r}")


def check_axis(axis, ndim, shape, fname):
    """``axis`` as a non-negative axis of an array of ``ndim`` axes."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise FpemuTypeError(f"{fname}(): axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise FpemuValueError(f"{fname}(): axis {axis} is out of range for shape {shape} "
                              f"(use -{ndim} .. {ndim - 1})")
    return int(axis) % ndim


#: How much larger than the input the zero-padded block layout may be: a block
#: far longer than its axis would pad it to a huge array.
PAD_SLACK = 2**24


def check_padding(shape, block, ax, fname):
    """Refuse a block so much longer than its axis that padding would blow up."""
    n = int(np.prod(shape, dtype=object))
    if isinstance(block, tuple):
        lead = int(np.prod(shape[:-2], dtype=object))
        rows = -(-shape[-2] // block[0]) * block[0]
        cols = -(-shape[-1] // block[1]) * block[1]
        padded = lead * rows * cols
    else:
        padded = n // max(shape[ax], 1) * (-(-shape[ax] // block) * block)
    if padded > 2 * n + PAD_SLACK:
        raise FpemuValueError(
            f"{fname}(): block={block} is far longer than the array (shape {tuple(shape)}): the "
            f"zero-padded layout would hold {padded:,} values. Pass a block no longer than the "
            f"blocked axis (MX: 32, NVFP4: 16, fp8 block scaling: 128)")


def check_layout(shape, block, axis, fname, noun="an array", fix0d="np.atleast_1d(x)"):
    """The blocked axis (None for 2-D tiles) of an input of ``shape``: at
    least one axis, two for tiles, ``axis`` in range, no runaway padding.
    ``noun`` and ``fix0d`` name the input the way its driver's users see it."""
    shape = tuple(shape)
    if not shape:
        raise FpemuValueError(f"{fname}(): needs {noun} with at least one axis, got a 0-d "
                              f"value; pass {fix0d}")
    if isinstance(block, tuple):
        if len(shape) < 2:
            raise FpemuValueError(f"{fname}(): 2-D tiles {block} need {noun} with two axes or "
                                  f"more; got shape {shape}")
        ax = None
    else:
        ax = check_axis(axis, len(shape), shape, fname.rsplit(".", 1)[-1])
    check_padding(shape, block, ax, fname.rsplit(".", 1)[-1])
    return ax


def check_tensor_amax(tensor_amax, rule):
    """``tensor_amax`` as a float32 (None stays None), for a two-level rule."""
    if tensor_amax is None:
        return None
    if rule not in TENSOR_SCALE_RULES:
        raise FpemuValueError(
            f"quantize_blocks(): tensor_amax= sets the tensor scale of the two-level NVFP4 "
            f"rules ({', '.join(TENSOR_SCALE_RULES)}); scale_rule {rule!r} has no tensor "
            f"scale: drop tensor_amax")
    t = np.asarray(tensor_amax)
    if t.size != 1 or t.dtype.kind not in "iuf" or t.dtype.kind == "b":
        raise FpemuValueError(f"quantize_blocks(): tensor_amax must be one real number (the "
                              f"absolute maximum of the tensor), got {tensor_amax!r}")
    v = np.float32(t.reshape(()))
    if v < 0:
        raise FpemuValueError(f"quantize_blocks(): tensor_amax is an absolute maximum and "
                              f"cannot be negative, got {float(v)!r}; pass abs(x).max()")
    return v


def check_inf_block(inf_block):
    if inf_block not in INF_BLOCK:
        raise FpemuValueError(f"quantize_blocks(): inf_block must be one of "
                              f"{', '.join(map(repr, INF_BLOCK))}, got {inf_block!r}")


_SRN = re.compile(r"^sr(\d+)$")


def srn_bits(rounding, seed):
    """N of an ``"srN"`` rounding (checked, with its seed), else None."""
    m = _SRN.match(rounding) if isinstance(rounding, str) else None
    if not m:
        return None
    n = int(m.group(1))
    if not 1 <= n <= 32:
        raise FpemuValueError(f"quantize_blocks(): rounding 'srN' takes N in 1..32 random "
                              f"bits, got {rounding!r}")
    if seed is None:
        raise FpemuValueError(f"quantize_blocks(): rounding={rounding!r} needs seed= (an "
                              "int), so that the random bits can be reproduced")
    return n


#: The generators of ``rng=`` in :func:`fpemu.block.quantize_blocks`, by
#: element rounding: ``"sr"`` takes those of :func:`fpemu.quantize`
#: (splitmix64 by default); ``"srN"`` takes Philox4x32-10 (the default: drawn
#: where the data lies, the same bits on every device) or NumPy's PCG64 (the
#: stream of earlier releases, drawn on the host).
SRN_RNGS = ("philox", "pcg64")


def block_rng(rounding, rng):
    """The checked ``rng=`` of a block quantizer (None: the mode's default)."""
    if srn_bits_name(rounding):
        if rng is None:
            return "philox"
        if isinstance(rng, str) and rng.lower() in SRN_RNGS:
            return rng.lower()
        raise FpemuValueError(f"quantize_blocks(): rounding={rounding!r} draws its bits from "
                              f"rng='philox' (the default) or 'pcg64' (NumPy's stream, as "
                              f"earlier releases); got rng={rng!r}")
    return parse_rng(rng)


def srn_bits_name(rounding):
    """Whether ``rounding`` is spelled ``"srN"``."""
    return isinstance(rounding, str) and bool(_SRN.match(rounding))


def float32_input(x, fname):
    """x as an array of float32 values (a float64 array must hold float32
    values: block quantizers read float32 or bfloat16 tensors)."""
    flat, shape = real_array(x, fname)
    X = flat.reshape(shape)
    X32 = X.astype(np.float32, copy=False)
    if X.dtype != np.float32:
        same = (X32.astype(np.float64) == X) | (np.isnan(X) & np.isnan(X32))
        if not np.all(same):
            first = float(X[~same].reshape(-1)[0])
            raise FpemuValueError(
                f"{fname}(): x holds {int((~same).sum())} value(s) that are not float32 "
                f"values (the first: {first!r}); block quantizers read float32 (or bfloat16) "
                "tensors: round first with fpemu.quantize(x, 'fp32')")
    return X32


def check_scales(shape, scales_shape_given, block, axis, fname, noun="codes",
                 fix0d="np.atleast_1d(codes)"):
    """The blocked axis of codes of ``shape`` whose scales have
    ``scales_shape_given`` (refused unless they match the block layout)."""
    shape = tuple(shape)
    if isinstance(block, tuple):
        if len(shape) < 2:
            raise FpemuValueError(f"{fname}(): 2-D tiles {block} need {noun} with two axes or "
                                  f"more; got shape {shape}")
        axis = None
    else:
        if not shape:
            raise FpemuValueError(f"{fname}(): {noun} must have at least one axis, got a 0-d "
                                  f"value; pass {fix0d}")
        axis = check_axis(axis, len(shape), shape, fname.rsplit(".", 1)[-1])
    want = scales_shape(shape, block, axis)
    if tuple(scales_shape_given) != want:
        raise FpemuValueError(
            f"{fname}(): codes of shape {shape} in blocks of {block} along "
            f"{'the last two axes' if axis is None else f'axis {axis}'} need scales of "
            f"shape {want}, got {tuple(scales_shape_given)}: pass the scales quantize_blocks "
            "returned with these codes, and the same block and axis")
    return axis


def check_tensor_scale(tensor_scale, fname):
    """``tensor_scale`` as a 0-d array (None stays None)."""
    if tensor_scale is None:
        return None
    t = np.asarray(tensor_scale)
    if t.size != 1 or t.dtype.kind not in "iuf":
        raise FpemuValueError(f"{fname}(): tensor_scale must be one real number (the fp32 "
                              f"decode tensor scale), got {tensor_scale!r}")
    return t.reshape(())
