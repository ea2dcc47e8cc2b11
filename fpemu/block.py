"""Block-scaled formats: MX (OCP MX v1.0), NVFP4, fp8 block scaling.

A block format stores a tensor as small **elements** (e4m3fn, e5m2, e2m3,
e3m2, e2m1, ...) and one **scale** per block of them: a value is
``element * scale`` (NVFP4 also multiplies by one fp32 **tensor scale**).
:func:`quantize_blocks` computes the codes and scales the way a named
library or piece of hardware does, bit for bit; :func:`dequantize_blocks`
gives the exact values they stand for.

Blocks are 1-D (``block=32``: 32 consecutive elements along ``axis``) or 2-D
tiles over the last two axes (``block=(16, 16)``: NVFP4 weights;
``(128, 128)``: DeepSeek-V3 / TransformerEngine fp8 weights). A length that
is not a multiple of the block is padded with zeros for the amax and the pad
is dropped from the codes, as TransformerEngine does.

Scale rules (``scale_rule``)
----------------------------
E8M0 scales (MX), the four rules of torchao's ``ScaleCalculationMode``, for
a block of amax ``a`` and elements whose largest power of two is
``2**emax_elem`` (e4m3fn 8, e5m2 15, e2m3 2, e3m2 4, e2m1 2):

``"floor"`` (OCP MX v1.0 §6.3, torchao FLOOR)
    ``e = floor(log2 a) - emax_elem``, read from the float32 exponent field
    (a float32 subnormal counts as 2**-127, inf as 2**128). Elements that
    land above the element maximum saturate ("clipped" blocks).
``"rceil"`` (NVIDIA, ``cvt.rp.satfinite.ue8m0``; TransformerEngine MXFP8)
    ``e = ceil(log2(fp32(a / elem_max)))``: the float32 quotient rounded up
    to a power of two, so nothing clips. inf gives 2**127. The quotient is
    rounded to float32 first, as TransformerEngine's kernel and torchao
    compute it: where ``a`` lies just above ``elem_max * 2**k`` (one float32
    ulp above ``448 * 2**-127``, say) the rounded quotient can land on the
    power of two and give ``2**k`` although ``a / 2**k`` clips slightly.
``"rceil-exact"``
    ``e = ceil(log2(a / elem_max))`` of the exact quotient: the smallest
    power of two for which no element clips (``2**-126`` in the example
    above). No library is known to compute this; it is the rule's intent.
``"ceil"`` (torchao CEIL)
    ``floor(log2 a)`` plus one unless ``a`` is a power of two, minus
    ``emax_elem``.
``"even"`` (torchao EVEN)
    ``a`` rounded at the element's mantissa width (half up in the float32
    bits: add ``2**(22 - mbits)``, keep sign and exponent) before FLOOR.

Every rule clamps ``e`` to [-127, 127]; a NaN amax gives the NaN scale
(0xFF) and the whole block decodes to NaN. Elements are ``x / 2**e``,
clamped to the element maximum, rounded once.

An infinity inside a block (``inf_block``): ``"saturate"`` (default) gives
the largest scale the rule allows for an infinite amax (2**127) and the
infinity saturates to the element maximum, as torchao 0.18 does; ``"nan"``
gives the block the NaN scale, as Microsoft's ``microxcaling`` library does
(its ``_quantize_mx`` turns a shared exponent above 127 into NaN).

E4M3 scales with an fp32 tensor scale (NVFP4: e2m1 elements, blocks of 16):

``"nvfp4"`` (TransformerEngine's reference quantizer ``NVFP4QuantizerRef``
    in ``reference_nvfp4.py`` as of TE commit d0067d0 and still at 1498424,
    which its CUDA kernel matches)
    tensor encode scale ``S = min(fp32(448*6 / amax_tensor), FLT_MAX)``
    (1 where amax is 0 or S is 0, as TE's CUDA kernel); decode scale
    ``fp32(1 / S)``. Block scale: ``fp32(a * fp32(S * fp32(1/6)))`` (the
    reciprocal of 6 folded into the tensor scale), capped at FLT_MAX and
    448, cast to e4m3fn (round to nearest even). Element encode scale
    ``min(fp32(1 / fp32(scale * (1/S))), FLT_MAX)``; elements
    ``fp32(x * enc)`` clamped to ±6, then rounded to e2m1.
``"nvfp4-div6"`` (TransformerEngine's reference before commit d0067d0)
    as ``"nvfp4"`` with the block scale ``fp32(fp32(a / 6) * S)``. The two
    differ in one block scale code where ``a / 6 * S`` falls on or next to a
    midpoint of e4m3fn: ``a = 0.0703125`` with a tensor amax of 3 gives 10
    (``"nvfp4-div6"``: 10.5 rounds to even) or 11 (``"nvfp4"``).
``"nvfp4-torchao"`` (torchao ``nvfp4_quantize`` with a per-tensor scale)
    tensor scale ``t = fp32(amax_tensor / 2688)``; block scale
    ``fp32(fp32(a / 6) / t)`` clamped to [2**-6, 448] (torchao's lower clamp
    keeps every scale normal) and cast to e4m3fn; elements
    ``fp32(x * fp32(fp32(1 / t) / scale))`` clamped to ±6. An all-zero
    tensor gives ``t = 0`` and NaN scales in torchao; this preset keeps that.
    A tensor amax below about 2.3e-35 makes ``t`` so small that ``1 / t``
    overflows: torchao then multiplies its zero elements by infinity and
    writes the resulting NaN's bits as a code (11, -1.5, on x86 CPUs); fpemu
    gives those elements 0 and warns (nonzero elements become ±6 in both).
``"4over6"`` (Four Over Six, TransformerEngine PR #2972)
    the tensor encode scale uses 256 in place of 448 (``256*6 / amax``),
    leaving room for the block scale to grow by 6/4; each block is quantized
    twice, its amax mapped to 6 and to 4, and keeps the one whose
    dequantized values have the smaller sum of squared errors (computed
    exactly; a tie keeps 6). This is the PR's rule; TransformerEngine's
    merged reference (commit 1498424) keeps the tensor constant 448 unless
    configured to 256, derives the map-to-4 scale as 1.5 times the map-to-6
    one and compares float32 sums of absolute errors by default.

``"cudnn"`` (cuDNN frontend's Block Scale Quantize, as its documentation
    states it: ``scale = quantize_round_up(amax / vmax)``, ``output =
    quantize_round_to_even(vals / scale)``)
    one level, no tensor scale: the block scale is ``fp32(a / 6)`` rounded
    *up* to e4m3fn (capped at 448), elements ``fp32(x / scale)`` rounded to
    nearest even. Not checked against cuDNN (no GPU here); an all-zero
    block gets scale 0 and zero elements.

fp32 scales (``scale_fmt="fp32"``, fp8 block scaling):

``"current"`` / ``"pow2"``
    TransformerEngine's ``compute_scale_from_amax`` per block (encode
    ``fp32(elem_max / a)``, 1 for a zero, inf or NaN amax, FLT_MAX for an
    infinite scale; ``"pow2"`` rounds it down to a power of two, the
    default of ``Float8BlockScaling``). The stored scale is the decode
    scale ``fp32(1 / enc)``; elements ``fp32(x * enc)`` saturate.

Rounding of the elements (``rounding``)
----------------------------------------
``"rne"`` (default) and the other modes of :func:`fpemu.quantize`,
``"sr"`` (fpemu's full-width stochastic rounding, seeded) and ``"srN"``
(``"sr8"``...): the hardware's stochastic rounding with N random bits, as
``cvt.rs`` takes 8 bits per element on Blackwell. Let ``u`` be the spacing
of the element format at ``|v|``, ``k = floor(|v| / u)`` and ``r`` the N bits
of ``|v| / u - k`` just below the point (the bits further down are
dropped). With N uniform random bits ``R`` the magnitude is ``(k + 1) * u``
when ``r + R >= 2**N``, else ``k * u``: up with probability ``r / 2**N``.
``R`` for the element at flat position ``i`` of the block layout (blocks
in the order of the scales array, elements in order within a block) is the
``i``-th draw of ``numpy.random.Generator(PCG64(seed)).integers(0, 2**N)``.

Random Hadamard transform
-------------------------
:func:`hadamard` multiplies each run of 16 values by ``diag(s) H / 4``
(Sylvester ``H``; ``s``: TransformerEngine's fixed sign vector, random signs
from a seed, or none), computed exactly and rounded once to float32.

Not provided: NVFP4 with UE5M3 scales (TransformerEngine PR #3325, an open
prototype for Rubin): the public thread does not state the encoding (bias,
NaN, largest value) or the tensor-scale constant. Any scale format can be
passed as a :class:`fpemu.Format` (``Format.custom``) with the ``"nvfp4"``
rule's structure once those are known.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple, Optional, Tuple, Union

import numpy as np

from .errors import FpemuTypeError, FpemuValueError
from .formats import Format
from .formats import format as _lookup
from .checks import real_array
from .quantize import decode, encode, quantize

__all__ = ["BlockQuantized", "BlockSpec", "PRESETS", "SCALE_RULES", "ScaleRule", "INF_BLOCK",
           "quantize_blocks", "dequantize_blocks", "hadamard", "hadamard_matrix", "TE_SIGNS",
           "error_table"]

FLT_MAX = np.float32(np.finfo(np.float32).max)
_f32 = np.float32

#: TransformerEngine's fixed sign vector for the 16-point RHT
#: (``get_wgrad_sign_vector`` in its NVFP4 reference quantizer).
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)

#: What an MX block holding an infinity gets (``quantize_blocks(inf_block=)``).
INF_BLOCK = ("saturate", "nan")


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """A named block format: element and scale formats (fpemu format names),
    block shape (a length along an axis, or a (rows, cols) tile over the
    last two axes), scale rule (a key of :data:`SCALE_RULES`) and where it
    comes from."""

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


# ----------------------------------------------------------------- result
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
        return dequantize_blocks(self)

    def __repr__(self):
        return (f"BlockQuantized(elem={self.elem.name}, scale_fmt={self.scale_fmt.name}, "
                f"block={self.block}, axis={self.axis}, scale_rule={self.scale_rule!r}, "
                f"shape={self.codes.shape}, tensor_scale={self.tensor_scale})")


def _rebuild_quantized(pair, fields):
    return BlockQuantized(*pair, **fields)


# ------------------------------------------------------------------ layout
def _check_block(block, fname):
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


def _to_blocks(X, block, axis):
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


# ------------------------------------------------------------ scale rules
def _f32_bits(a):
    return np.asarray(a, np.float32).view(np.uint32).astype(np.int64)


def _floor_log2(v):
    """floor(log2 v) of a positive float, from its binary exponent (exact,
    whatever numpy's SIMD log2 does)."""
    return int(np.frexp(float(v))[1]) - 1


def _mx_exponent(amax32, elem: Format, rule):
    """Unbiased E8M0 exponents (int64, clamped to [-127, 127]) and the NaN mask."""
    nan = np.isnan(amax32)
    emax_elem = _floor_log2(elem.max)
    mbits = elem.mantissa_bits
    with np.errstate(all="ignore"):
        if rule == "rceil":
            d = (amax32 / _f32(elem.max)).astype(np.float32)
            bits = _f32_bits(d)
            ef = (bits >> 23) & 0xFF
            frac = bits & 0x7FFFFF
            # ceil(log2 d) from the bits: normal d = (1 + f) 2**(ef-127)
            e = np.where(frac != 0, ef - 127 + 1, ef - 127)
            # subnormal d (ef == 0): d = frac * 2**-149, ceil(log2 d) exactly
            sub = (ef == 0) & (frac != 0)
            top = np.frexp(np.where(sub, frac, 1).astype(np.float64))[1].astype(np.int64) - 1
            pow2 = (frac & (frac - 1)) == 0
            e = np.where(sub, top - 149 + np.where(pow2, 0, 1), e)
            e = np.where(d == 0, -127, e)
            e = np.where(np.isinf(d), 127, e)
        elif rule == "rceil-exact":
            e = _ceil_log2_ratio(amax32, float(elem.max))
        else:
            bits = _f32_bits(amax32)
            if rule == "even":
                bits = (bits + (1 << (23 - mbits - 1))) & (0x1FF << 23)
            ef = (bits >> 23) & 0xFF
            e = ef - 127
            if rule == "ceil":
                e = e + ((bits & 0x7FFFFF) != 0)
            e = e - emax_elem
    return np.clip(e, -127, 127).astype(np.int64), nan


def _ceil_log2_ratio(a32, m):
    """ceil(log2(a / m)) of the exact quotient, for float32 amaxes ``a`` and
    an element maximum ``m``: the smallest e with ``a <= m * 2**e`` (int64;
    -127 for a zero, 127 for inf, anything for NaN). Compared exactly in
    float64: ``m * 2**e`` is exact for every e in range."""
    a = np.where(np.isfinite(a32) & (a32 > 0), a32, 1).astype(np.float64)
    ea = np.frexp(a)[1].astype(np.int64) - 1              # 2**ea <= a < 2**(ea + 1)
    e = ea - _floor_log2(m)                                # a / m < 2**(e + 1)
    e = np.where(a > np.ldexp(m, e), e + 1, e)             # each test exact
    e = np.where(a <= np.ldexp(m, e - 1), e - 1, e)
    e = np.where(a32 == 0, -127, e)
    return np.where(np.isinf(a32), 127, e)


def _e4m3_cast(v32, scale_fmt):
    """float32 values rounded to the scale format, nearest even (values already
    within its range)."""
    return quantize(v32, scale_fmt).astype(np.float32)


def _nvfp4_te_tensor(amax_t, fp8_max, elem_max=6.0):
    """TE's tensor encode scale ``min(fp8_max * elem_max / amax, FLT_MAX)``
    (1 for a zero amax or scale) and its float32 inverse."""
    with np.errstate(all="ignore"):
        S = _f32(_f32(fp8_max * elem_max) / _f32(amax_t))
    S = np.minimum(S, FLT_MAX)
    if amax_t == 0 or S == 0:
        S = _f32(1.0)
    return _f32(S), _f32(_f32(1.0) / _f32(S))


def _nvfp4_te_blocks(amax_b, S, Sdec, elem, scale_fmt, map_to, fold=False):
    """TE's block decode scale (scale_fmt values, float32) and element
    encode scale for amax mapped to ``map_to``: ``fp32(a * fp32(S * fp32(1 /
    map_to)))`` with ``fold`` (TE's current rule), else ``fp32(fp32(a /
    map_to) * S)``."""
    with np.errstate(all="ignore"):
        if fold:
            ds = (amax_b.astype(np.float32) * _f32(S * (_f32(1.0) / _f32(map_to))))
            ds = ds.astype(np.float32)
        else:
            ds = (amax_b.astype(np.float32) / _f32(map_to)).astype(np.float32)
            ds = (ds * S).astype(np.float32)
        ds = np.minimum(ds, FLT_MAX)                       # NaN stays NaN, as torch.min
        ds = np.clip(ds, -_f32(scale_fmt.max), _f32(scale_fmt.max))
        dsq = _e4m3_cast(ds, scale_fmt)
        enc = (_f32(1.0) / (dsq * Sdec).astype(np.float32)).astype(np.float32)
        enc = np.minimum(enc, FLT_MAX)
    return dsq, enc


def _te_scale(amax32, fp8_max, pow2):
    """TransformerEngine's ``compute_scale_from_amax`` for an array of amaxes:
    fp32(fp8_max / amax); 1 for a zero, inf or NaN amax; FLT_MAX for an
    infinite scale; ``pow2`` rounds down to a power of two (mantissa bits
    cleared)."""
    with np.errstate(all="ignore"):
        enc = (_f32(fp8_max) / amax32).astype(np.float32)
    enc = np.where(np.isinf(enc), FLT_MAX, enc)
    enc = np.where(np.isfinite(amax32) & (amax32 != 0), enc, _f32(1.0)).astype(np.float32)
    if pow2:
        enc = (enc.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return enc


def _scale_elements(Bk, enc, elem, clamp_to=None, amax_b=None):
    """fp32(x * enc) per block, clamped to the element maximum; and which
    blocks clipped."""
    enc = enc.astype(np.float32)
    with np.errstate(all="ignore"):
        v = Bk.astype(np.float32, copy=False) * enc[..., None]
        amax = np.max(np.abs(Bk), axis=-1).astype(np.float32) if amax_b is None else amax_b
        top = amax * enc          # the largest scaled magnitude: rounding is monotonic
    m = _f32(elem.max if clamp_to is None else clamp_to)
    clipped = top > _clip_threshold(elem)
    np.clip(v, -m, m, out=v)
    return v, clipped


def _clip_threshold(elem: Format):
    """The element maximum plus half its spacing there: a scaled value above
    it is clipped (rounding alone would not have brought it to the maximum:
    7 for e2m1, 464 for e4m3fn)."""
    emax = _floor_log2(elem.max)
    return elem.max + 2.0 ** (emax - elem.mantissa_bits) / 2


# ------------------------------------------------------------ element rounding
_SRN = re.compile(r"^sr(\d+)$")


def _srn_bits(rounding, seed):
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


def _srn_draws(n, seed, size):
    """The random bits of ``"srN"``: element i of the block layout takes draw i."""
    gen = np.random.Generator(np.random.PCG64(seed))
    return gen.integers(0, 2**n, size=size, dtype=np.uint64)


def _round_elements(V, elem, rounding, seed, has_nan=True, offset=0, draws=None):
    """V (float32, block layout) rounded to elem: codes (block layout). NaNs
    (only in blocks whose scale is NaN: their codes are replaced) round as 0.
    ``offset``: the flat position of V's first element in the whole block
    layout (stochastic modes); ``draws``: V's share of the ``"srN"`` bits."""
    flat = V.reshape(-1)
    safe = np.where(np.isnan(flat), np.float32(0), flat) if has_nan else flat
    n = _srn_bits(rounding, seed)
    if n is not None:
        if draws is None:
            draws = _srn_draws(n, seed, flat.size)
        vals = _round_srn(safe.astype(np.float64), elem, n, draws.reshape(-1))
        codes = encode(vals, elem)
    else:
        kw = {"seed": (seed, offset) if seed is not None else None} if rounding == "sr" else {}
        codes = encode(safe, elem, rounding=rounding, overflow="saturate", **kw)
    return codes.reshape(V.shape)


def _round_srn(v, elem: Format, n, draws):
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


# ------------------------------------------------------------ the rule table
class _Job(NamedTuple):
    """What a scale rule is given: the blocks (block layout, float32, zero
    padded), each block's amax, the formats and the element rounding, the
    tensor amax (NVFP4 rules; None: the amax of the whole input) and what
    an infinite MX block gets."""

    Bk: np.ndarray
    amax_b: np.ndarray
    elem: Format
    scale_fmt: Format
    rounding: str
    seed: Optional[int]
    tensor_amax: Optional[np.float32]
    inf_block: str


class _Scaled(NamedTuple):
    """What a scale rule returns: scale codes (one per block), the scaled
    elements still to be rounded (float32, block layout) or, for a rule that
    rounds them itself, their codes; which blocks clipped or are NaN; the
    fp32 decode tensor scale (two-level rules)."""

    scodes: np.ndarray
    V: Optional[np.ndarray]
    codes: Optional[np.ndarray]
    clipped: np.ndarray
    block_nan: np.ndarray
    tensor_scale: Optional[np.float32] = None


@dataclasses.dataclass(frozen=True)
class ScaleRule:
    """One entry of :data:`SCALE_RULES`: its ``kind`` (``"mx"``: E8M0
    scales, ``"fp4"``: a small float scale with an optional fp32 tensor
    scale, ``"fp32"``: float32 scales) and the function computing scales and
    scaled elements from a :class:`_Job`."""

    name: str
    kind: str
    compute: object

    def __call__(self, job: _Job) -> _Scaled:
        return self.compute(job)


def _mx_rule(rule):
    def compute(job):
        e, nan = _mx_exponent(job.amax_b, job.elem, rule)
        if job.inf_block == "nan":
            nan = nan | np.isinf(job.amax_b)
        k = (-e).astype(np.int32)
        with np.errstate(all="ignore"):
            # x / 2**e in float32: exact, except for values pushed below float32's
            # normal range, which lie far below the element's smallest subnormal
            # (they become 0 either way)
            V = np.ldexp(job.Bk, k[..., None])
            top = np.ldexp(job.amax_b, k)
        m = _f32(job.elem.max)
        clipped = (top > _clip_threshold(job.elem)) & ~nan
        np.clip(V, -m, m, out=V)
        scodes = np.where(nan, 0xFF, e + 127).astype(job.scale_fmt.code_dtype)
        return _Scaled(scodes, V, None, clipped, nan)
    return compute


def _fp32_rule(pow2):
    def compute(job):
        enc = _te_scale(job.amax_b, job.elem.max, pow2)
        dec = (_f32(1.0) / enc).astype(np.float32)
        V, clipped = _scale_elements(job.Bk, enc, job.elem, amax_b=job.amax_b)
        # TE casts a NaN to the fp8 NaN under scale 1; an element format without
        # NaN marks the block by a NaN scale instead
        block_nan = (np.isnan(job.amax_b) if not job.elem.has_nan
                     else np.zeros(job.amax_b.shape, bool))
        scodes = encode(np.where(block_nan, np.float32(np.nan), dec), job.scale_fmt)
        return _Scaled(scodes, V, None, clipped, block_nan)
    return compute


def _fp4_result(job, dsq, V, clipped, tensor_scale=None, codes=None):
    """A small-float-scale rule's result from its scale values ``dsq``."""
    block_nan = np.isnan(dsq)
    return _Scaled(encode(dsq, job.scale_fmt), V, codes, clipped & ~block_nan, block_nan,
                   tensor_scale)


def _te_nvfp4_rule(fold):
    """TransformerEngine's NVFP4 quantizer: ``fold`` its current block scale
    ``amax * fp32(S * fp32(1/6))``, else the older ``fp32(amax / 6) * S``."""
    def compute(job):
        S, Sdec = _nvfp4_te_tensor(job.tensor_amax, float(job.scale_fmt.max))
        dsq, enc = _nvfp4_te_blocks(job.amax_b, S, Sdec, job.elem, job.scale_fmt, 6.0,
                                    fold=fold)
        V, clipped = _scale_elements(job.Bk, enc, job.elem, amax_b=job.amax_b)
        return _fp4_result(job, dsq, V, clipped, Sdec)
    return compute


def _torchao_nvfp4(job):
    """torchao's ``nvfp4_quantize`` with a per-tensor scale."""
    with np.errstate(all="ignore"):
        t = _f32(job.tensor_amax / _f32(448.0 * 6.0))
        bs = (job.amax_b / _f32(6.0)).astype(np.float32)
        sb = (bs / t).astype(np.float32)
        sb = np.clip(sb, _f32(2.0**-6), _f32(job.scale_fmt.max))
        dsq = _e4m3_cast(sb, job.scale_fmt)
        rs = ((_f32(1.0) / t) / dsq).astype(np.float32)
    V, clipped = _scale_elements(job.Bk, rs, job.elem, amax_b=job.amax_b)
    _torchao_zero_times_inf(V, job.Bk, rs, job.tensor_amax)
    return _fp4_result(job, dsq, V, clipped, t)


def _four_over_six_rule(job):
    """Four Over Six: the tensor constant 256; each block mapped to 6 and to 4."""
    S, Sdec = _nvfp4_te_tensor(job.tensor_amax, 256.0)
    codes, dsq, clipped = _four_over_six(job.Bk, job.amax_b, S, Sdec, job.elem,
                                         job.scale_fmt, job.rounding, job.seed)
    return _fp4_result(job, dsq, None, clipped, Sdec, codes)


def _cudnn_rule(job):
    """cuDNN's documented block-scale quantize: one level, the scale rounded up."""
    with np.errstate(all="ignore"):
        d = np.minimum((job.amax_b / _f32(job.elem.max)).astype(np.float32),
                       _f32(job.scale_fmt.max))
        dsq = quantize(d, job.scale_fmt, rounding="rup").astype(np.float32)
        V = job.Bk.astype(np.float32, copy=False) / dsq[..., None]
        zero = dsq == 0         # an all-zero block: zeros, with their signs
        if zero.any():
            V[zero] = np.copysign(np.float32(0), job.Bk[zero])
        top = (job.amax_b / dsq).astype(np.float32)
    clipped = top > _clip_threshold(job.elem)
    np.clip(V, -_f32(job.elem.max), _f32(job.elem.max), out=V)
    return _fp4_result(job, dsq, V, clipped)


#: Every block scale rule by name (module text): ``SCALE_RULES[name](job)``.
SCALE_RULES = {r.name: r for r in (
    ScaleRule("floor", "mx", _mx_rule("floor")),
    ScaleRule("rceil", "mx", _mx_rule("rceil")),
    ScaleRule("ceil", "mx", _mx_rule("ceil")),
    ScaleRule("even", "mx", _mx_rule("even")),
    ScaleRule("rceil-exact", "mx", _mx_rule("rceil-exact")),
    ScaleRule("nvfp4", "fp4", _te_nvfp4_rule(fold=True)),
    ScaleRule("nvfp4-div6", "fp4", _te_nvfp4_rule(fold=False)),
    ScaleRule("nvfp4-torchao", "fp4", _torchao_nvfp4),
    ScaleRule("4over6", "fp4", _four_over_six_rule),
    ScaleRule("cudnn", "fp4", _cudnn_rule),
    ScaleRule("current", "fp32", _fp32_rule(pow2=False)),
    ScaleRule("pow2", "fp32", _fp32_rule(pow2=True)),
)}
MX_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "mx")
FP4_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "fp4")
FP32_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "fp32")
#: The two-level NVFP4 rules, which take ``tensor_amax``.
TENSOR_SCALE_RULES = ("nvfp4", "nvfp4-div6", "nvfp4-torchao", "4over6")


# ------------------------------------------------------------------- public
def _resolve_args(elem, scale_fmt, block, scale_rule):
    if isinstance(elem, str) and elem.lower() in PRESETS:
        p = PRESETS[elem.lower()]
        elem = p.elem
        scale_fmt = p.scale_fmt if scale_fmt is None else scale_fmt
        block = p.block if block is None else block
        scale_rule = p.scale_rule if scale_rule is None else scale_rule
    elem = _lookup(elem)
    scale_fmt = _lookup("e8m0" if scale_fmt is None else scale_fmt)
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


def _float32_input(x, fname):
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


def _check_axis(axis, ndim, shape, fname):
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise FpemuTypeError(f"{fname}(): axis must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise FpemuValueError(f"{fname}(): axis {axis} is out of range for shape {shape} "
                              f"(use -{ndim} .. {ndim - 1})")
    return int(axis) % ndim


#: How much larger than the input the zero-padded block layout may be: a block
#: far longer than its axis would pad it to a huge array.
_PAD_SLACK = 2**24


def _check_padding(shape, block, ax, fname):
    n = int(np.prod(shape, dtype=object))
    if isinstance(block, tuple):
        lead = int(np.prod(shape[:-2], dtype=object))
        rows = -(-shape[-2] // block[0]) * block[0]
        cols = -(-shape[-1] // block[1]) * block[1]
        padded = lead * rows * cols
    else:
        padded = n // max(shape[ax], 1) * (-(-shape[ax] // block) * block)
    if padded > 2 * n + _PAD_SLACK:
        raise FpemuValueError(
            f"{fname}(): block={block} is far longer than the array (shape {tuple(shape)}): the "
            f"zero-padded layout would hold {padded:,} values. Pass a block no longer than the "
            f"blocked axis (MX: 32, NVFP4: 16, fp8 block scaling: 128)")


def _check_tensor_amax(tensor_amax, rule):
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
    v = _f32(t.reshape(()))
    if v < 0:
        raise FpemuValueError(f"quantize_blocks(): tensor_amax is an absolute maximum and "
                              f"cannot be negative, got {float(v)!r}; pass abs(x).max()")
    return v


def quantize_blocks(x, elem="mxfp8", scale_fmt=None, block=None, axis=-1, scale_rule=None,
                    rounding="rne", seed=None, *, tensor_amax=None, inf_block="saturate"):
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
    elem, scale_fmt, block, rule = _resolve_args(elem, scale_fmt, block, scale_rule)
    block = _check_block(block, "quantize_blocks")
    if inf_block not in INF_BLOCK:
        raise FpemuValueError(f"quantize_blocks(): inf_block must be one of "
                              f"{', '.join(map(repr, INF_BLOCK))}, got {inf_block!r}")
    _srn_bits(rounding, seed)
    amax_given = _check_tensor_amax(tensor_amax, rule)
    X32 = _float32_input(x, "quantize_blocks")
    if X32.ndim == 0:
        raise FpemuValueError("quantize_blocks(): needs an array with at least one axis, got a "
                              "0-d value; pass np.atleast_1d(x)")
    if isinstance(block, tuple):
        if X32.ndim < 2:
            raise FpemuValueError(f"quantize_blocks(): 2-D tiles {block} need an array with two "
                                  f"axes or more; got shape {X32.shape}")
        ax = None
    else:
        ax = _check_axis(axis, X32.ndim, X32.shape, "quantize_blocks")
    _check_padding(X32.shape, block, ax, "quantize_blocks")
    Bk, back, sshape, sback = _to_blocks(X32, block, ax)
    with np.errstate(invalid="ignore"):
        amax_b = np.max(np.abs(Bk), axis=-1).astype(np.float32)  # NaN propagates
    tensor_amax = amax_given
    if tensor_amax is None and rule in TENSOR_SCALE_RULES:
        tensor_amax = _f32(np.max(np.abs(X32))) if X32.size else _f32(0)    # NaN propagates
    res = SCALE_RULES[rule](_Job(Bk, amax_b, elem, scale_fmt, rounding, seed, tensor_amax,
                                 inf_block))
    block_nan, codes = res.block_nan, res.codes
    has_nan = bool(block_nan.any())
    if codes is None:
        codes = _round_elements(res.V, elem, rounding, seed, has_nan)
    if has_nan:
        # a NaN-scaled block decodes to NaN whatever its codes: they keep only
        # the inputs' signs (a zero of each sign), so that -x mirrors x
        signed0 = (np.signbit(Bk) * (1 << (elem.bits - 1))).astype(elem.code_dtype)
        codes = np.where(block_nan[..., None], signed0, codes)
    return BlockQuantized(
        np.ascontiguousarray(back(codes)).astype(elem.code_dtype),
        np.ascontiguousarray(sback(res.scodes.reshape(sshape))).astype(scale_fmt.code_dtype),
        elem=elem, scale_fmt=scale_fmt, block=block, axis=ax, scale_rule=rule,
        tensor_scale=res.tensor_scale, clipped=np.ascontiguousarray(sback(res.clipped)),
        rounding=rounding, shape=tuple(X32.shape),
        tensor_amax=tensor_amax if rule in TENSOR_SCALE_RULES else None)


def _torchao_zero_times_inf(V, Bk, rs, amax_t):
    """Where torchao's element multiplier ``1/t / scale`` overflowed (a tensor
    amax below about 2.3e-35), its zero elements are 0 * inf: NaN in torchao,
    whose bits it then writes as a code. fpemu keeps them 0, and says so."""
    bad = np.isinf(rs)
    if not bad.any():
        return
    zero = bad[..., None] & (Bk == 0)
    if zero.any():
        import warnings
        warnings.warn(
            f"quantize_blocks(): the tensor amax {float(amax_t):.3g} is so small that "
            "torchao's element multiplier 1/t overflows to inf; torchao turns the zero "
            "elements of those blocks into NaN and writes its bits as a code (11, -1.5, on "
            "x86 CPUs); fpemu gives them 0. Rescale the tensor, or use the 'nvfp4' rule",
            RuntimeWarning, stacklevel=5)
        V[zero] = 0


def _four_over_six(Bk, amax_b, S, Sdec, elem, scale_fmt, rounding, seed):
    """Four Over Six: each block quantized with its amax mapped to 6 and to 4,
    keeping the one of smaller squared error. Element codes (block layout),
    scale values and clipped flags; blocks are taken a chunk at a time so
    that the two candidates and their errors never exist for the whole
    tensor at once."""
    blen = Bk.shape[-1]
    B = Bk.reshape(-1, blen)
    a = amax_b.reshape(-1)
    nblocks = a.size
    n = _srn_bits(rounding, seed)
    draws = _srn_draws(n, seed, B.size).reshape(B.shape) if n is not None else None
    codes = np.empty(B.shape, elem.code_dtype)
    dsq = np.empty(a.shape, np.float32)
    clipped = np.empty(a.shape, bool)
    step = max(1, (1 << 18) // blen)
    for lo in range(0, nblocks, step):
        hi = min(nblocks, lo + step)
        Bc, ac = B[lo:hi], a[lo:hi]
        dc = None if draws is None else draws[lo:hi]
        found = []
        for map_to in (6.0, 4.0):
            d, enc = _nvfp4_te_blocks(ac, S, Sdec, elem, scale_fmt, map_to)
            V, cl = _scale_elements(Bc, enc, elem, amax_b=ac)
            c = _round_elements(V, elem, rounding, seed, offset=lo * blen, draws=dc)
            found.append((c, d, cl, _block_sse(Bc, c, d, Sdec, elem)))
        (c6, d6, cl6, err6), (c4, d4, cl4, err4) = found
        use4 = err4 < err6                              # a tie (or NaN) keeps 6
        codes[lo:hi] = np.where(use4[:, None], c4, c6)
        dsq[lo:hi] = np.where(use4, d4, d6)
        clipped[lo:hi] = np.where(use4, cl4, cl6)
    return codes.reshape(Bk.shape), dsq.reshape(amax_b.shape), clipped.reshape(amax_b.shape)


def _block_sse(Bk, codes, dsq, Sdec, elem):
    """Sum of squared errors of each block, dequantized (float64 of exact
    products; squares summed in float64 by :func:`_halving_sum`, an order
    that ``fpemu.torch.quantize_blocks`` repeats bit for bit)."""
    q = decode(codes, elem).astype(np.float64)
    deq = q * dsq[..., None].astype(np.float64) * np.float64(Sdec)
    with np.errstate(invalid="ignore"):
        return _halving_sum((Bk.astype(np.float64) - deq) ** 2)


def _halving_sum(a):
    """The sum over the last axis in a fixed order: the first half added to
    the second, element by element (an odd element left over is carried),
    until one is left. Works on NumPy arrays and torch tensors alike."""
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2
        head = a[..., :h] + a[..., h:2 * h]
        if a.shape[-1] % 2:
            head = head.copy() if isinstance(head, np.ndarray) else head.clone()
            head[..., -1] = head[..., -1] + a[..., -1]
        a = head
    return a[..., 0]


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
        codes, scales = q
        elem, scale_fmt, block, axis = q.elem, q.scale_fmt, q.block, q.axis
        tensor_scale = q.tensor_scale
        shape = q.shape
    else:
        if scales is None or elem is None or scale_fmt is None or block is None:
            raise FpemuValueError("dequantize_blocks(): pass a BlockQuantized, or codes with "
                                  "scales=, elem=, scale_fmt= and block=")
        codes = np.asarray(q)
        scales = np.asarray(scales)
        elem, scale_fmt = _lookup(elem), _lookup(scale_fmt)
        block = _check_block(block, "dequantize_blocks")
        shape = codes.shape
        for name, a in (("codes", codes), ("scales", scales)):
            if a.dtype.kind not in "iu":
                raise FpemuTypeError(f"dequantize_blocks(): {name} must be integer codes (as "
                                     f"quantize_blocks returns them), got dtype {a.dtype}")
        if isinstance(block, tuple):
            if codes.ndim < 2:
                raise FpemuValueError(f"dequantize_blocks(): 2-D tiles {block} need codes with "
                                      f"two axes or more; got shape {shape}")
            axis = None
            want = shape[:-2] + (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
        else:
            if codes.ndim == 0:
                raise FpemuValueError("dequantize_blocks(): codes must have at least one axis, "
                                      "got a 0-d value; pass np.atleast_1d(codes)")
            axis = _check_axis(axis, codes.ndim, shape, "dequantize_blocks")
            want = shape[:axis] + (-(-shape[axis] // block),) + shape[axis + 1:]
        if scales.shape != want:
            raise FpemuValueError(
                f"dequantize_blocks(): codes of shape {shape} in blocks of {block} along "
                f"{'the last two axes' if axis is None else f'axis {axis}'} need scales of "
                f"shape {want}, got {scales.shape}: pass the scales quantize_blocks returned "
                "with these codes, and the same block and axis")
        if tensor_scale is not None:
            t = np.asarray(tensor_scale)
            if t.size != 1 or t.dtype.kind not in "iuf":
                raise FpemuValueError(f"dequantize_blocks(): tensor_scale must be one real "
                                      f"number (the fp32 decode tensor scale), got "
                                      f"{tensor_scale!r}")
            tensor_scale = t.reshape(())
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


# ---------------------------------------------------------------- Hadamard
def hadamard_matrix(size=16, signs="te"):
    """``diag(s) H / sqrt(size)`` (float64, exact): ``H`` the
    Sylvester Hadamard matrix; ``signs``: ``"te"`` (TransformerEngine's fixed
    vector, size 16), ``None`` (no signs), an int seed (random signs from
    ``numpy.random.default_rng(seed)``) or an array of ±1."""
    if not (isinstance(size, int) and size >= 1 and size & (size - 1) == 0
            and (size.bit_length() - 1) % 2 == 0):
        raise FpemuValueError(f"hadamard_matrix(): size must be a power of four (4, 16, 64, "
                              f"...: 1/sqrt(size) is then a power of two), got {size!r}")
    H = np.ones((1, 1))
    while H.shape[0] < size:
        H = np.block([[H, H], [H, -H]])
    if isinstance(signs, str) and signs == "te":
        if size != 16:
            raise FpemuValueError("hadamard_matrix(): TransformerEngine's sign vector has 16 "
                                  f"entries; size is {size}: pass signs=None or a seed")
        s = TE_SIGNS
    elif signs is None:
        s = np.ones(size)
    elif isinstance(signs, (int, np.integer)) and not isinstance(signs, bool):
        s = np.random.default_rng(int(signs)).choice([-1.0, 1.0], size)
    else:
        s = np.asarray(signs, np.float64)
        if s.shape != (size,) or not np.all(np.abs(s) == 1):
            raise FpemuValueError(f"hadamard_matrix(): signs must be {size} values of ±1, got "
                                  f"{signs!r}")
    return s[:, None] * H / np.sqrt(size)


def hadamard(x, size=16, axis=-1, signs="te"):
    """The random Hadamard transform of each run of ``size`` values along
    ``axis``: ``x_run @ hadamard_matrix(size, signs)``, the exact result
    rounded once to float32 (TransformerEngine applies it to the wgrad
    operands of NVFP4 GEMMs, along the reduced dimension).

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> y = block.hadamard(np.arange(16, dtype=np.float32), signs=None)
    >>> float(y[0]), float(np.sum(y.astype(np.float64)**2))   # 120/4; the norm is kept
    (30.0, 1240.0)
    """
    from .accumulate import matmul
    H = hadamard_matrix(size, signs)
    flat, shape = real_array(x, "hadamard")
    X = np.moveaxis(flat.reshape(shape).astype(np.float64), axis, -1)
    if X.shape[-1] % size:
        raise FpemuValueError(f"hadamard(): the axis has length {X.shape[-1]}, not a multiple "
                              f"of size={size}; pad it first")
    if not np.all((X.astype(np.float32) == X) | np.isnan(X)):
        raise FpemuValueError("hadamard(): x must hold float32 values; round first with "
                              "fpemu.quantize(x, 'fp32')")
    runs = X.reshape(-1, size)
    Y = matmul(runs, H, "fp32", "fp32", model="exact")
    return np.moveaxis(Y.reshape(X.shape), -1, axis).astype(np.float32)


# ------------------------------------------------------------ comparisons
#: The presets :func:`error_table` compares by default.
TABLE_PRESETS = ("mxfp8", "mxfp8-te", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "mxfp4-rceil",
                 "nvfp4", "nvfp4-2d", "nvfp4-torchao", "nvfp4-4over6", "nvfp4-cudnn")


def error_table(x, presets=TABLE_PRESETS, axis=-1):
    """How well each block format represents ``x`` (float32 values): one row
    per preset with ``bits`` (per value: element bits plus the scale's share),
    ``mse``, ``sqnr_db`` (10 log10 of sum x**2 over the sum of squared errors,
    both exact), ``clipped`` (the share of blocks with a scaled value that
    the clamp to the element maximum, not rounding, brought down) and
    ``flushed`` (the share of nonzero values that became zero); and the
    counts behind them (``values``, ``blocks``, ``clipped_blocks``,
    ``nonzero``, ``flushed_values``, ``sse``: the sum of squared errors,
    ``power``: the sum of squares), so that rows of several tensors add up.
    ``"mxfp4-rceil"`` is MXFP4 with the scale rounded up.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    >>> rows = block.error_table(x, ["mxfp8", "nvfp4"])
    >>> [(r["preset"], r["bits"], round(r["sqnr_db"], 1)) for r in rows]
    [('mxfp8', 8.25, 30.3), ('nvfp4', 4.5, 20.5)]
    """
    x = _float32_input(x, "error_table")
    ref = x.astype(np.float64)
    power = float(np.sum(ref ** 2))
    rows = []
    for name in presets:
        key, rule = (name, None)
        if name == "mxfp4-rceil":
            key, rule = "mxfp4", "rceil"
        if key not in PRESETS:
            raise FpemuValueError(f"error_table(): unknown preset {name!r}; choose from "
                                  f"{', '.join(PRESETS)} or mxfp4-rceil")
        p = PRESETS[key]
        q = quantize_blocks(x, key, axis=axis, scale_rule=rule)
        v = q.values
        err = float(np.sum((ref - v) ** 2))
        nblock = int(np.prod(p.block)) if isinstance(p.block, tuple) else p.block
        nz = ref != 0
        counts = {"values": int(x.size), "blocks": int(q.clipped.size),
                  "clipped_blocks": int(q.clipped.sum()), "nonzero": int(nz.sum()),
                  "flushed_values": int(np.sum(v[nz] == 0)), "sse": err, "power": power}
        rows.append({
            "preset": name, "elem": q.elem.name, "scale": q.scale_fmt.name, **counts,
            "block": "x".join(map(str, p.block)) if isinstance(p.block, tuple) else p.block,
            "rule": q.scale_rule,
            "bits": q.elem.bits + q.scale_fmt.bits / nblock,
            "mse": err / max(x.size, 1),
            **_shares(counts),
        })
    return rows


def _shares(c):
    """``sqnr_db``, ``clipped`` and ``flushed`` from the counts of
    :func:`error_table` (of one tensor, or summed over several)."""
    err = c["sse"]
    return {"sqnr_db": float(10 * np.log10(c["power"] / err)) if err > 0 else float("inf"),
            "clipped": c["clipped_blocks"] / c["blocks"] if c["blocks"] else 0.0,
            "flushed": c["flushed_values"] / c["nonzero"] if c["nonzero"] else 0.0}
