"""The host driver of the block quantizers: NumPy arrays in, the block
layout, the amaxes, the scale rule of :mod:`fpemu.block.rules` run with the
NumPy namespace, the elements rounded by :func:`fpemu.encode` (or the
``"srN"`` rounding below), :class:`~fpemu.block.BlockQuantized` out."""

from __future__ import annotations

import numpy as np

from ..errors import FpemuTypeError, FpemuValueError
from ..formats import Format
from .._jit import run_kernel
from ..quantize import decode, encode, quantize, stochastic_bits
from . import _kernels, checks
from .rules import SCALE_RULES, TENSOR_SCALE_RULES, Job, Scaled, array_namespace
from .spec import BlockQuantized, exact_values

__all__ = ["quantize_blocks", "dequantize_blocks", "to_blocks", "round_elements", "srn_draws",
           "round_srn", "OPS", "scaled_values"]

_f32 = np.float32
_NP = array_namespace("numpy")

#: Blocks per chunk of a ``chunked`` rule: about 2**18 elements at a time.
_CHUNK_ELEMENTS = 1 << 18


# ------------------------------------------------------------------ layout
def to_blocks(X, block, axis):
    """X as (..., nblocks, block_len) (a view where no padding is needed),
    padded with zeros; the function that takes such an array back to X's
    layout; the shape of the scales; the function that orders them."""
    if isinstance(block, int):
        Xm = np.moveaxis(X, axis, -1)
        lead = Xm.shape[:-1]
        n = Xm.shape[-1]
        nb = -(-n // block)
        if nb * block == n:
            P = Xm
        else:
            P = np.zeros(lead + (nb * block,), X.dtype)
            P[..., :n] = Xm
        Bk = P.reshape(lead + (nb, block))

        def back(A):
            A = A.reshape(lead + (nb * block,))[..., :n]
            return np.moveaxis(A, -1, axis)

        return Bk, back, lead + (nb,), (lambda S: np.moveaxis(S, -1, axis))
    ty, tx = block
    lead = X.shape[:-2]
    R, C = X.shape[-2:]
    nr, nc = -(-R // ty), -(-C // tx)
    P = np.zeros(lead + (nr * ty, nc * tx), X.dtype)
    P[..., :R, :C] = X
    k = len(lead)
    Bk = P.reshape(lead + (nr, ty, nc, tx))
    Bk = np.moveaxis(Bk, k + 1, k + 2).reshape(lead + (nr, nc, ty * tx))

    def back(A):
        A = A.reshape(lead + (nr, nc, ty, tx))
        A = np.moveaxis(A, k + 2, k + 1).reshape(lead + (nr * ty, nc * tx))
        return A[..., :R, :C]

    return Bk, back, lead + (nr, nc), (lambda S: S)


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


def round_elements(V, elem, rounding, seed, has_nan=True, offset=0, draws=None, rng=None):
    """V (float32, block layout) rounded to elem: codes (block layout). NaNs
    (only in blocks whose scale is NaN: their codes are replaced) round as 0.
    ``offset``: the flat position of V's first element in the whole block
    layout (stochastic modes); ``draws``: V's share of the ``"srN"`` bits;
    ``rng``: the generator (:func:`fpemu.block.checks.block_rng`)."""
    flat = V.reshape(-1)
    safe = np.where(np.isnan(flat), np.float32(0), flat) if has_nan else flat
    n = checks.srn_bits(rounding, seed)
    if n is not None:
        if draws is None:
            draws = srn_draws(n, seed, flat.size, checks.block_rng(rounding, rng))
        vals = round_srn(safe.astype(np.float64), elem, n, draws.reshape(-1))
        codes = encode(vals, elem)
    else:
        kw = {"seed": (seed, offset) if seed is not None else None,
              "rng": rng} if rounding == "sr" else {}
        codes = encode(safe, elem, rounding=rounding, overflow="saturate", **kw)
    return codes.reshape(V.shape)


def round_srn(v, elem: Format, n, draws):
    """Stochastic rounding with n random bits per element (module text),
    ``draws`` the bits (one per element of v)."""
    a = np.abs(v)
    with np.errstate(divide="ignore"):
        _, ex = np.frexp(a)
    e = np.maximum(ex.astype(np.int64) - 1, elem.emin)
    u = np.ldexp(1.0, e - elem.mantissa_bits)
    t = a / u                                   # exact: a power-of-two scaling
    k = np.floor(t)
    r = np.floor((t - k) * 2.0**n)              # the n bits below the point
    R = draws.astype(np.float64).reshape(a.shape)
    mag = (k + (r + R >= 2.0**n)) * u
    mag = np.minimum(mag, elem.max)
    return np.copysign(mag, v)


class _HostOps:
    """The host's rounding, as the rules call it (``job.ops``)."""

    @staticmethod
    def cast(v, fmt, rounding="rne"):
        return quantize(v, fmt, rounding=rounding).astype(np.float32)

    encode = staticmethod(encode)
    decode = staticmethod(decode)

    @staticmethod
    def round_elements(V, job, has_nan=True):
        return round_elements(V, job.elem, job.rounding, job.seed, has_nan, job.offset,
                              job.draws, job.rng)


#: The host's rounding as the rules call it.
OPS = _HostOps()


def _ex(t):
    return t[..., None]


def _run_chunked(rule, job):
    """A ``chunked`` rule run on about 2**18 elements at a time, so that its
    candidates never exist for the whole array at once."""
    blen = job.Bk.shape[-1]
    B, a = job.Bk.reshape(-1, blen), job.amax_b.reshape(-1)
    draws = None if job.draws is None else job.draws.reshape(B.shape)
    step = max(1, _CHUNK_ELEMENTS // blen)
    parts = []
    for lo in range(0, a.size, step):
        hi = min(a.size, lo + step)
        sub = Job(B[lo:hi], a[lo:hi], job.elem, job.scale_fmt, job.rule, job.rounding,
                  job.seed, job.tensor_amax, job.inf_block, _ex, _NP, OPS,
                  draws=None if draws is None else draws[lo:hi], offset=lo * blen, rng=job.rng)
        parts.append(rule(sub))
    if not parts:
        return rule(job)

    def cat(k, shape):
        return None if parts[0][k] is None else np.concatenate([p[k] for p in parts]).reshape(
            shape)

    return Scaled(cat(0, a.shape), cat(1, B.shape), cat(2, job.Bk.shape),
                  cat(3, job.amax_b.shape), cat(4, job.amax_b.shape), parts[0].tensor_scale)


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
    elem, scale_fmt, block, rule = checks.resolve_args(elem, scale_fmt, block, scale_rule)
    block = checks.check_block(block, "quantize_blocks")
    checks.check_inf_block(inf_block)
    n_sr = checks.srn_bits(rounding, seed)
    rng = checks.block_rng(rounding, rng)
    amax_given = checks.check_tensor_amax(tensor_amax, rule)
    X32 = checks.float32_input(x, "quantize_blocks")
    ax = checks.check_layout(X32.shape, block, axis, "quantize_blocks")
    Bk, back, sshape, sback = to_blocks(X32, block, ax)
    with np.errstate(invalid="ignore"):
        amax_b = np.max(np.abs(Bk), axis=-1).astype(np.float32)  # NaN propagates
    tensor_amax = amax_given
    if tensor_amax is None and rule in TENSOR_SCALE_RULES:
        tensor_amax = _f32(np.max(np.abs(X32))) if X32.size else _f32(0)    # NaN propagates
    draws = None if n_sr is None else srn_draws(n_sr, seed, Bk.size, rng).reshape(Bk.shape)
    job = Job(Bk, amax_b, elem, scale_fmt, rule, rounding, seed, tensor_amax, inf_block, _ex,
              _NP, OPS, draws=draws, rng=rng)
    r = SCALE_RULES[rule]
    res = _run_chunked(r, job) if r.chunked else r(job)
    block_nan, codes = res.block_nan, res.codes
    has_nan = bool(block_nan.any())
    if codes is None:
        codes = round_elements(res.V, elem, rounding, seed, has_nan, draws=draws, rng=rng)
    if has_nan:
        # a NaN-scaled block decodes to NaN whatever its codes: they keep only
        # the inputs' signs (a zero of each sign), so that -x mirrors x
        signed0 = (np.signbit(Bk) * (1 << (elem.bits - 1))).astype(elem.code_dtype)
        codes = np.where(block_nan[..., None], signed0, codes)
    return BlockQuantized(
        np.ascontiguousarray(back(codes)).astype(elem.code_dtype),
        np.ascontiguousarray(sback(np.asarray(res.scodes).reshape(sshape))).astype(
            scale_fmt.code_dtype),
        elem=elem, scale_fmt=scale_fmt, block=block, axis=ax, scale_rule=rule,
        tensor_scale=res.tensor_scale, clipped=np.ascontiguousarray(sback(res.clipped)),
        rounding=rounding, shape=tuple(X32.shape),
        tensor_amax=tensor_amax if rule in TENSOR_SCALE_RULES else None)


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
    table = _value_table(elem)
    out = np.empty((rows, cols), np.float32)
    if out.size:
        run_kernel(_kernels.scaled_values, codes.reshape(-1), table,
                   np.ascontiguousarray(scale_values, np.float32).reshape(-1), rows, cols, by,
                   bx, out.reshape(-1), inputs=3)
    return out


_TABLES = {}


def _value_table(elem):
    """The float32 value of every code of ``elem`` (up to 16 bits)."""
    table = _TABLES.get(elem)
    if table is None:
        table = _TABLES[elem] = decode(np.arange(1 << elem.bits).astype(elem.code_dtype), elem)
    return table


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
