"""The block quantizers on the host: NumPy arrays in, the steps of
:mod:`fpemu.block.driver` run with the NumPy namespace and fpemu's Numba
quantizers (the elements rounded by :func:`fpemu.encode`, the ``"srN"``
draws by :func:`srn_draws`), :class:`~fpemu.block.BlockQuantized` out."""

from __future__ import annotations

import numpy as np

from ..errors import FpemuTypeError, FpemuValueError
from .._jit import run_kernel
from ..quantize import decode, encode, quantize, stochastic_bits
from . import _kernels, checks, driver, fused
from .rules import array_namespace
from .spec import BlockQuantized, exact_values

__all__ = ["quantize_blocks", "dequantize_blocks", "srn_draws", "OPS", "scaled_values"]

_NP = array_namespace("numpy")


# ------------------------------------------------------------ element rounding
def srn_draws(n, seed, size, rng="philox"):
    """The random bits of ``"srN"``: element i of the block layout takes draw
    i, the top ``n`` bits of :func:`fpemu.quantize.stochastic_bits` (Philox,
    ``rng="philox"``) or the i-th of NumPy's ``PCG64(seed)`` integers below
    ``2**n`` (``rng="pcg64"``, drawn in sequence: host only)."""
    if rng not in checks.SRN_RNGS:
        raise FpemuValueError(f"srn_draws(): rng is one of {checks.SRN_RNGS}, got {rng!r}")
    if rng == "pcg64":
        gen = np.random.Generator(np.random.PCG64(seed))
        return gen.integers(0, 2**n, size=size, dtype=np.uint64)
    return (stochastic_bits(seed, size, rng="philox") >> (63 - n)).astype(np.uint64)


class _HostOps(driver.Ops):
    """The host's rounding backend (:class:`fpemu.block.driver.Ops`):
    fpemu's Numba quantizers, and the fused kernels of
    :mod:`fpemu.block.fused` for the amaxes and the element step."""

    @staticmethod
    def cast(v, fmt, rounding="rne"):
        return quantize(v, fmt, rounding=rounding).astype(np.float32)

    encode = staticmethod(encode)
    decode = staticmethod(decode)

    @staticmethod
    def srn_draws(n, seed, like, rng):
        return srn_draws(n, seed, like.size, rng).reshape(like.shape)

    @staticmethod
    def block_amax(Bk, dims, xp):
        return fused.block_amax(Bk, dims)

    @staticmethod
    def scale_round(job, factor, divide, block_nan, has_nan, dq=None):
        if fused.fuses(job.elem, job.rounding, srn=True):
            return fused.scale_round(job, factor, divide, block_nan, has_nan, dq)
        return driver.Ops.scale_round(job, factor, divide, block_nan, has_nan, dq)

    @staticmethod
    def within(v, fmt):
        if v.size == 0:
            return False
        with np.errstate(invalid="ignore"):
            return bool(np.max(np.abs(v)) <= fmt.max)       # NaN: False


#: The host's rounding as the rules call it.
OPS = _HostOps()


# ------------------------------------------------------------------- public
def quantize_blocks(x, elem="mxfp8", scale_fmt=None, block=None, axis=-1, scale_rule=None,
                    rounding="rne", seed=None, *, tensor_amax=None, inf_block="saturate",
                    rng=None):
    """Quantize to a block-scaled format; returns ``(codes, scales)`` as a
    :class:`BlockQuantized`.

    Parameters
    ----------
    x : array_like
        float32 values (float64 input must hold float32 values: the
        quantizers read float32 or bfloat16 tensors; round first with
        ``fpemu.quantize(x, "fp32")``).
    elem : str or Format
        Element format, or a preset name from :data:`PRESETS` (``"mxfp8"``,
        ``"mxfp4"``, ``"nvfp4"``, ``"nvfp4-torchao"``, ...) whose settings
        the other arguments override.
    scale_fmt : str or Format
        ``"e8m0"`` (MX), ``"e4m3fn"`` (NVFP4) or ``"fp32"``.
    block : int or (int, int)
        Block length along ``axis``, or a 2-D tile over the last two axes.
    axis : int
        The blocked axis of 1-D blocks.
    scale_rule : str
        One of :data:`SCALE_RULES` (module text).
    rounding : str
        ``"rne"``, another mode of :func:`fpemu.quantize`, ``"sr"`` or
        ``"srN"`` (``"sr8"``: 8 random bits per element, as ``cvt.rs``).
    seed : int
        For the stochastic modes.
    rng : str, optional
        Their generator: for ``"sr"`` those of :func:`fpemu.quantize`
        (``"splitmix64"``, the default, or ``"philox"``); for ``"srN"``
        ``"philox"`` (the default: Philox4x32-10, drawn where the data lies,
        so ``fpemu.torch.quantize_blocks`` makes the same bits on its device)
        or ``"pcg64"`` (NumPy's stream, the default of earlier releases).
    tensor_amax : float, optional
        NVFP4 rules: the amax the tensor scale is computed from (default:
        the amax of ``x``), e.g. the amax before a Hadamard transform.
    inf_block : str
        MX rules: what a block holding an infinity gets, ``"saturate"``
        (the largest scale; the infinity becomes the element maximum, as
        torchao) or ``"nan"`` (the NaN scale, as microxcaling).

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> x = np.array([[0.1, -3.0, 7.5, 0.0]], np.float32)
    >>> q = block.quantize_blocks(x, "mxfp4", block=4)
    >>> q.scales, q.clipped, q.values     # OCP's floor rule: scale 2**0, 7.5 clips to 6
    (array([[127]], dtype=uint8), array([[ True]]), array([[ 0., -3.,  6.,  0.]]))
    >>> r = block.quantize_blocks(x, "mxfp4", block=4, scale_rule="rceil")  # rounds up
    >>> r.scales, r.clipped, r.values
    (array([[128]], dtype=uint8), array([[False]]), array([[ 0., -3.,  8.,  0.]]))
    """
    cfg = driver.configure(elem, scale_fmt, block, scale_rule, rounding, seed, rng, tensor_amax,
                           inf_block)
    X32 = checks.float32_input(x, "quantize_blocks")
    ax = checks.check_layout(X32.shape, cfg.block, axis, "quantize_blocks")
    r = driver.run(X32, cfg, ax, _NP, OPS, allow_in_place=True)
    return BlockQuantized(
        np.ascontiguousarray(r.codes).astype(cfg.elem.code_dtype),
        np.ascontiguousarray(r.scodes).astype(cfg.scale_fmt.code_dtype),
        elem=cfg.elem, scale_fmt=cfg.scale_fmt, block=cfg.block, axis=ax,
        scale_rule=cfg.rule, tensor_scale=r.tensor_scale,
        clipped=np.ascontiguousarray(r.clipped), rounding=rounding, shape=tuple(X32.shape),
        tensor_amax=r.tensor_amax)


def scaled_values(codes, scale_values, elem, block, axis):
    """The float32 products ``element value * block scale`` of a 2-D array's
    codes (C-contiguous, ``elem``'s code dtype) and its block scales' values
    (float32, the scales' shape), one float32 product each: 1-D blocks of
    ``block`` along ``axis`` (0 or 1) or 2-D tiles (``block`` a pair). Exact
    where every element times every scale is a float32 number
    (``fpemu.torch``'s ``float32_exact``: every MX and NVFP4 pairing); the
    GEMM operands of ``fpemu.torch.emulate`` on the CPU."""
    rows, cols = codes.shape
    by, bx = block if isinstance(block, tuple) else ((block, 1) if axis == 0 else (1, block))
    table = fused.value_table(elem)
    out = np.empty((rows, cols), np.float32)
    if out.size:
        run_kernel(_kernels.scaled_values, codes.reshape(-1), table,
                   np.ascontiguousarray(scale_values, np.float32).reshape(-1), rows, cols, by,
                   bx, out.reshape(-1), inputs=3)
    return out


def dequantize_blocks(q, scales=None, *, elem=None, scale_fmt=None, block=None, axis=-1,
                      tensor_scale=None):
    """The exact values (float64) of block codes: ``element * scale`` (times
    the tensor scale for NVFP4).

    ``q`` is a :class:`BlockQuantized`, or element codes with ``scales``
    (scale codes) and ``elem``, ``scale_fmt``, ``block``, ``axis``,
    ``tensor_scale`` given. A NaN scale makes its whole block NaN.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> block.dequantize_blocks(np.array([[2, 15]], np.uint8), np.array([[127]], np.uint8),
    ...                         elem="e2m1", scale_fmt="e8m0", block=2)
    array([[ 1., -6.]])
    """
    if isinstance(q, BlockQuantized):
        return q.values
    if scales is None or elem is None or scale_fmt is None or block is None:
        raise FpemuValueError("dequantize_blocks(): pass a BlockQuantized, or codes with "
                              "scales=, elem=, scale_fmt= and block=")
    codes, scales = np.asarray(q), np.asarray(scales)
    elem, scale_fmt = checks.lookup(elem), checks.lookup(scale_fmt)
    block = checks.check_block(block, "dequantize_blocks")
    for name, a in (("codes", codes), ("scales", scales)):
        if a.dtype.kind not in "iu":
            raise FpemuTypeError(f"dequantize_blocks(): {name} must be integer codes (as "
                                 f"quantize_blocks returns them), got dtype {a.dtype}")
    axis = checks.check_scales(codes.shape, scales.shape, block, axis, "dequantize_blocks")
    tensor_scale = checks.check_tensor_scale(tensor_scale, "dequantize_blocks")
    return exact_values(codes, scales, elem, scale_fmt, block, axis, tensor_scale)
