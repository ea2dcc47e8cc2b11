"""The block scale rules, each written once (the formulas are stated in the
text of :mod:`fpemu.block`).

A rule reads a :class:`Job` (the blocks, their amaxes, the formats, the
rounding) and returns a :class:`Scaled`: per block, the scale code, the
*factor* that takes the block's elements to the element format's range
(``x * factor``, or ``x / factor`` for a rule marked ``divide``), which
blocks clipped and which are NaN, and the tensor scale. A rule decides per
block only; the element step that follows, :func:`scale_elements` (the
product, a zero kept with its sign, the clamp to the element's largest
value) and the rounding, is the driver's, written once, and a backend may
run it fused with the rounding in one pass (``Ops.scale_round``). It computes with
``job.xp``, the array namespace of the driver that made the job (NumPy on
the host, torch on the tensor's device; ``fpemu/block/_xp.py`` holds what
the two spell differently), and rounds through ``job.ops``, the driver's
rounding (``cast``: float32 values to the scale format; ``encode``: scale
values to codes; ``round_elements``; ``decode``). The per-tensor numbers of
the two-level rules (the tensor scale) are host scalars in both drivers.

``job.ex(t)`` spreads a per-block array over its blocks' elements
(broadcasting): the driver chooses the block layout, the rule never looks at
it (except Four Over Six, which rounds its two candidates itself and returns
their codes). A rule marked ``chunked`` (Four Over Six, which holds two candidates and
their errors at once) may be given its blocks a chunk at a time.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from ..formats import Format, e8m0
from . import _xp
from .spec import FLT_MAX

__all__ = ["Job", "Scaled", "ScaleRule", "SCALE_RULES", "MX_RULES", "FP4_RULES", "FP32_RULES",
           "TENSOR_SCALE_RULES", "MX_EXPONENTS", "array_namespace", "mx_exponent", "te_scale",
           "nvfp4_tensor_scale", "clip_threshold", "floor_log2", "halving_sum", "scale_elements",
           "scaled_top"]

_f32 = np.float32


def array_namespace(name):
    """The array namespace a driver hands its jobs: ``"numpy"`` or ``"torch"``."""
    return _xp.namespace(name)


@dataclasses.dataclass
class Job:
    """What a scale rule is given: the blocks ``Bk`` (float32, zero padded,
    in the driver's layout), each block's amax ``amax_b``, the formats, the
    rule's name, the element rounding and its seed, the tensor amax (the
    two-level rules), what an infinite MX block gets, the ``"srN"`` bits
    (``draws``, or None) and the flat position of the first element
    (``offset``, stochastic modes), ``ex`` (per block -> per element),
    ``xp`` (array namespace), ``ops`` (the driver's rounding) and the axes
    of ``Bk`` a block spans (``dims``, :func:`fpemu.block.driver.amax_dims`)."""

    Bk: Any
    amax_b: Any
    elem: Format
    scale_fmt: Format
    rule: str
    rounding: str
    seed: Optional[int]
    tensor_amax: Optional[np.float32]
    inf_block: str
    ex: Callable
    xp: Any
    ops: Any
    draws: Any = None
    offset: int = 0
    rng: Optional[str] = None
    dims: Any = -1


class Scaled(NamedTuple):
    """What a scale rule returns: scale codes (one per block); each block's
    element factor (float32, one per block: the elements to round are
    :func:`scale_elements` of it) or, for a rule that rounds them itself,
    the element codes (block layout) and no factor; which blocks clipped or
    are NaN; the fp32 decode tensor scale (two-level rules); ``divide``:
    the elements are divided by the factor instead of multiplied."""

    scodes: Any
    factor: Any
    codes: Any
    clipped: Any
    block_nan: Any
    tensor_scale: Optional[np.float32] = None
    divide: bool = False


@dataclasses.dataclass(frozen=True)
class ScaleRule:
    """One entry of :data:`SCALE_RULES`: its ``kind`` (``"mx"``: E8M0
    scales, ``"fp4"``: a small float scale with an optional fp32 tensor
    scale, ``"fp32"``: float32 scales), the function computing scales and
    scaled elements from a :class:`Job`, whether it takes a tensor amax
    (``two_level``) and whether a driver may run it a chunk of blocks at a
    time (``chunked``)."""

    name: str
    kind: str
    compute: Callable
    two_level: bool = False
    chunked: bool = False

    def __call__(self, job: Job) -> Scaled:
        return self.compute(job)


# ------------------------------------------------------------ host scalars
def floor_log2(v):
    """floor(log2 v) of a positive float, from its binary exponent (exact,
    whatever numpy's SIMD log2 does)."""
    return int(np.frexp(float(v))[1]) - 1


def clip_threshold(elem: Format):
    """The element maximum plus half its spacing there: a scaled value above
    it is clipped (rounding alone would not have brought it to the maximum:
    7 for e2m1, 464 for e4m3fn)."""
    emax = floor_log2(elem.max)
    return elem.max + 2.0 ** (emax - elem.mantissa_bits) / 2


def nvfp4_tensor_scale(amax_t, fp8_max, elem_max=6.0):
    """TE's tensor encode scale ``min(fp8_max * elem_max / amax, FLT_MAX)``
    (1 for a zero amax or scale) and its float32 inverse (host scalars)."""
    with np.errstate(all="ignore"):
        S = _f32(_f32(fp8_max * elem_max) / _f32(amax_t))
    S = np.minimum(S, FLT_MAX)
    if amax_t == 0 or S == 0:
        S = _f32(1.0)
    return _f32(S), _f32(_f32(1.0) / _f32(S))


def halving_sum(a):
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


# ------------------------------------------------------------ shared steps
def mx_exponent(xp, amax32, elem: Format, rule, ops=None):
    """Unbiased E8M0 exponents (int64, clamped to [-127, 127]) of float32
    block amaxes under the MX rule ``rule`` (a key of :data:`MX_EXPONENTS`),
    and the NaN mask (``"nearest"`` rounds with the driver's ``ops.encode``)."""
    with xp.errstate():
        e, nan = MX_EXPONENTS[rule](xp, amax32, elem, ops)
    return xp.clip(e, -127, 127), nan


def _exponent_field(bits):
    """The unbiased exponent field of float32 bits."""
    return ((bits >> 23) & 0xFF) - 127


def _floor_exponent(xp, amax32, elem, ops):
    """``"floor"``: floor(log2 amax) less the element's emax, read from the
    amax's float32 exponent field."""
    e = _exponent_field(xp.f32_bits(amax32))
    return e - floor_log2(elem.max), xp.isnan(amax32)


def _ceil_exponent(xp, amax32, elem, ops):
    """``"ceil"``: as ``"floor"``, one more where the amax is not a power of
    two."""
    bits = xp.f32_bits(amax32)
    e = _exponent_field(bits)
    e = xp.where((bits & 0x7FFFFF) != 0, e + 1, e)
    return e - floor_log2(elem.max), xp.isnan(amax32)


def _even_exponent(xp, amax32, elem, ops):
    """``"even"``: ``"floor"`` of the amax rounded half up at the element's
    mantissa width, in its float32 bits."""
    bits = xp.f32_bits(amax32)
    bits = (bits + (1 << (23 - elem.mantissa_bits - 1))) & (0x1FF << 23)
    return _exponent_field(bits) - floor_log2(elem.max), xp.isnan(amax32)


def _rceil_exponent(xp, amax32, elem, ops):
    """``"rceil"``: ceil(log2 d) of the float32 quotient d = fp32(amax /
    elem_max), from its bits."""
    d = amax32 / xp.const(elem.max, amax32)
    bits = xp.f32_bits(d)
    ef = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    # ceil(log2 d) from the bits: normal d = (1 + f) 2**(ef-127)
    e = xp.where(frac != 0, ef - 127 + 1, ef - 127)
    # subnormal d (ef == 0): d = frac * 2**-149, ceil(log2 d) exactly
    sub = (ef == 0) & (frac != 0)
    top = xp.ilog2(xp.where(sub, frac, 1))
    pow2 = (frac & (frac - 1)) == 0
    e = xp.where(sub, top - 149 + xp.where(pow2, 0, 1), e)
    e = xp.where(d == 0, -127, e)
    return xp.where(xp.isinf(d), 127, e), xp.isnan(amax32)


def _rceil_exact_exponent(xp, amax32, elem, ops):
    """``"rceil-exact"``: ceil(log2(amax / elem_max)) of the exact quotient."""
    return _ceil_log2_ratio(xp, amax32, float(elem.max)), xp.isnan(amax32)


def _nearest_exponent(xp, amax32, elem, ops):
    """``"nearest"``: ml_dtypes' cast of fp32(amax / elem_max) to E8M0; a zero or
    NaN quotient takes 2**-127, and a NaN block is marked only where the
    element format has no NaN (as the fp32 rules do)."""
    d = amax32 / xp.const(elem.max, amax32)
    d = xp.where(d > 0, d, xp.f32(2.0**-127))
    e = xp.to_int64(ops.encode(d, e8m0)) - 127
    return e, xp.zeros_bool(amax32) if elem.has_nan else xp.isnan(amax32)


#: The MX rules by name (the text of :mod:`fpemu.block`), each the function
#: of its E8M0 exponent: ``f(xp, amax32, elem, ops)`` gives the unbiased
#: exponents (before clamping) and the mask of NaN blocks. Each is also a
#: :data:`SCALE_RULES` entry of kind ``"mx"``: a new MX rule is one line here.
MX_EXPONENTS = {
    "floor": _floor_exponent,
    "rceil": _rceil_exponent,
    "ceil": _ceil_exponent,
    "even": _even_exponent,
    "rceil-exact": _rceil_exact_exponent,
    "nearest": _nearest_exponent,
}


def _ceil_log2_ratio(xp, a32, m):
    """ceil(log2(a / m)) of the exact quotient, for float32 amaxes ``a`` and
    an element maximum ``m``: the smallest e with ``a <= m * 2**e`` (int64;
    -127 for a zero, 127 for inf, anything for NaN). Compared exactly in
    float64: ``m * 2**e`` is exact for every e in range."""
    a = xp.to_f64(xp.where(xp.isfinite(a32) & (a32 > 0), a32, 1))
    ea = xp.frexp_exponent(a) - 1                          # 2**ea <= a < 2**(ea + 1)
    e = ea - floor_log2(m)                                 # a / m < 2**(e + 1)
    e = xp.where(a > xp.ldexp64(m, e), e + 1, e)           # each test exact
    e = xp.where(a <= xp.ldexp64(m, e - 1), e - 1, e)
    e = xp.where(a32 == 0, -127, e)
    return xp.where(xp.isinf(a32), 127, e)


def te_scale(xp, amax32, fp8_max, pow2):
    """TransformerEngine's ``compute_scale_from_amax`` for an array of amaxes:
    fp32(fp8_max / amax); 1 for a zero, inf or NaN amax; FLT_MAX for an
    infinite scale; ``pow2`` rounds down to a power of two (mantissa bits
    cleared)."""
    with xp.errstate():
        enc = xp.const(fp8_max, amax32) / amax32
    enc = xp.where(xp.isinf(enc), xp.f32(FLT_MAX), enc)
    enc = xp.where(xp.isfinite(amax32) & (amax32 != 0), enc, xp.f32(1.0))
    return xp.clear_mantissa(enc) if pow2 else enc


def scale_elements(job, factor, divide=False):
    """The elements to round (float32, the block layout): ``fp32(x *
    factor)`` of each element and its block's factor (``fp32(x / factor)``
    with ``divide``), a zero element kept as it is, with its sign (where the
    factor is 0 or infinite, whose products with zero are NaN), clamped to
    the element format's largest magnitude (NaN stays NaN). This is the
    element step of every rule, written once; a fused backend
    (``Ops.scale_round``) computes the same per element."""
    xp = job.xp
    f = job.ex(factor)
    with xp.errstate():
        V = job.Bk / f if divide else job.Bk * f
        if xp.any((factor == 0) | xp.isinf(factor)):
            V = xp.where(job.Bk == 0, job.Bk, V)
    m = xp.f32(job.elem.max)
    return xp.clip_(V, -m, m)


def scaled_top(job, factor, divide=False):
    """Each block's largest scaled magnitude, ``fp32(amax * factor)`` (or
    ``/``): above :func:`clip_threshold`, the block clipped (rounding is
    monotonic)."""
    with job.xp.errstate():
        return job.amax_b / factor if divide else job.amax_b * factor


def _clipped(job, factor, divide=False):
    return scaled_top(job, factor, divide) > clip_threshold(job.elem)


def _te_blocks(job, S, Sdec, map_to, fold):
    """TE's block decode scales (scale format values, float32) and element
    encode scales for amax mapped to ``map_to``: ``fp32(a * fp32(S * fp32(1 /
    map_to)))`` with ``fold`` (TE's current rule), else ``fp32(fp32(a /
    map_to) * S)``."""
    xp = job.xp
    with xp.errstate():
        if fold:
            ds = job.amax_b * xp.f32(S * (_f32(1.0) / _f32(map_to)))
        else:
            ds = (job.amax_b / xp.const(map_to, job.amax_b)) * xp.f32(S)
        ds = xp.minimum(ds, xp.f32(FLT_MAX))                 # NaN stays NaN
        smax = xp.f32(job.scale_fmt.max)
        dsq = job.ops.cast(xp.clip(ds, -smax, smax), job.scale_fmt)
        enc = xp.minimum(xp.const(1.0, dsq) / (dsq * xp.f32(Sdec)), xp.f32(FLT_MAX))
    return dsq, enc


def _fp4_result(job, dsq, factor, clipped, tensor_scale=None, codes=None, divide=False):
    """A small-float-scale rule's result from its scale values ``dsq``."""
    block_nan = job.xp.isnan(dsq)
    return Scaled(job.ops.encode(dsq, job.scale_fmt), factor, codes, clipped & ~block_nan,
                  block_nan, tensor_scale, divide)


# ------------------------------------------------------------------ rules
def _mx_rule(job):
    """E8M0 scales (module text of :mod:`fpemu.block`); elements ``x / 2**e``."""
    xp = job.xp
    e, nan = mx_exponent(xp, job.amax_b, job.elem, job.rule, job.ops)
    if job.inf_block == "nan":
        nan = nan | xp.isinf(job.amax_b)
    with xp.errstate():
        # x / 2**e in float32, as x * 2**-e (a float32 power of two, -e in
        # -127 .. 127): exact, except for values pushed below float32's normal
        # range, which lie far below the element's smallest subnormal (they
        # become 0 either way); one rounding, as ldexp
        p = xp.pow2_f32(-e)
    clipped = _clipped(job, p) & ~nan
    return Scaled(xp.where(nan, 0xFF, e + 127), p, None, clipped, nan)


def _fp32_rule(job):
    """TransformerEngine's per-block fp32 scales; ``pow2`` rounds them down to
    a power of two."""
    xp = job.xp
    enc = te_scale(xp, job.amax_b, job.elem.max, job.rule == "pow2")
    with xp.errstate():
        dec = xp.const(1.0, enc) / enc
    clipped = _clipped(job, enc)
    # TE casts a NaN to the fp8 NaN under scale 1; an element format without
    # NaN marks the block by a NaN scale instead
    block_nan = xp.isnan(job.amax_b) if not job.elem.has_nan else xp.zeros_bool(clipped)
    scodes = job.ops.encode(xp.where(block_nan, xp.f32(np.nan), dec), job.scale_fmt)
    return Scaled(scodes, enc, None, clipped, block_nan)


def _te_nvfp4_rule(job):
    """TransformerEngine's NVFP4 quantizer: ``"nvfp4"`` folds its block scale
    ``amax * fp32(S * fp32(1/6))``, ``"nvfp4-div6"`` the older
    ``fp32(amax / 6) * S``."""
    S, Sdec = nvfp4_tensor_scale(job.tensor_amax, float(job.scale_fmt.max))
    dsq, enc = _te_blocks(job, S, Sdec, 6.0, fold=job.rule == "nvfp4")
    return _fp4_result(job, dsq, enc, _clipped(job, enc), Sdec)


def _torchao_nvfp4(job):
    """torchao's ``nvfp4_quantize`` with a per-tensor scale."""
    xp = job.xp
    with np.errstate(all="ignore"):
        t = _f32(job.tensor_amax / _f32(448.0 * 6.0))
        inv_t = _f32(_f32(1.0) / t)
    with xp.errstate():
        bs = job.amax_b / xp.const(6.0, job.amax_b)
        sb = bs / xp.const(t, bs)
        sb = xp.clip(sb, xp.f32(2.0**-6), xp.f32(job.scale_fmt.max))
        dsq = job.ops.cast(sb, job.scale_fmt)
        rs = xp.const(inv_t, dsq) / dsq
    bad = xp.isinf(rs)
    if xp.any(bad) and xp.any(job.ex(bad) & (job.Bk == 0)):
        # torchao's element multiplier 1/t / scale overflowed (a tensor amax
        # below about 2.3e-35): its zero elements are 0 * inf, NaN in torchao,
        # whose bits it then writes as a code. fpemu keeps them zeros
        # (scale_elements), and says so
        warnings.warn(
            f"quantize_blocks(): the tensor amax {float(job.tensor_amax):.3g} is so small "
            "that torchao's element multiplier 1/t overflows to inf; torchao turns the "
            "zero elements of those blocks into NaN and writes its bits as a code (11, "
            "-1.5, on x86 CPUs); fpemu keeps them zeros, with their signs. Rescale the "
            "tensor, or use the 'nvfp4' rule", RuntimeWarning, stacklevel=5)
    return _fp4_result(job, dsq, rs, _clipped(job, rs), t)


def _four_over_six_rule(job):
    """Four Over Six: the tensor constant 256; each block quantized with its
    amax mapped to 6 and to 4, keeping the one whose dequantized values have
    the smaller sum of squared errors (float64 of exact products, summed in
    the order of :func:`halving_sum`; a tie or NaN keeps 6)."""
    xp = job.xp
    S, Sdec = nvfp4_tensor_scale(job.tensor_amax, 256.0)
    found = []
    for map_to in (6.0, 4.0):
        dsq, enc = _te_blocks(job, S, Sdec, map_to, fold=False)
        clipped = _clipped(job, enc)
        codes = job.ops.round_elements(scale_elements(job, enc), job)
        q = xp.to_f64(job.ops.decode(codes, job.elem))
        with xp.errstate():
            d = xp.to_f64(job.Bk) - q * job.ex(xp.to_f64(dsq)) * float(Sdec)
            found.append((codes, dsq, clipped, halving_sum(d * d)))
    (c6, d6, cl6, err6), (c4, d4, cl4, err4) = found
    use4 = err4 < err6
    return _fp4_result(job, xp.where(use4, d4, d6), None, xp.where(use4, cl4, cl6), Sdec,
                       xp.where(job.ex(use4), c4, c6))


def _cudnn_rule(job):
    """cuDNN's documented block-scale quantize: one level, the scale rounded up;
    an all-zero block gets scale 0 and zero elements (with their signs)."""
    xp = job.xp
    with xp.errstate():
        d = xp.minimum(job.amax_b / xp.const(job.elem.max, job.amax_b),
                       xp.f32(job.scale_fmt.max))
        dsq = job.ops.cast(d, job.scale_fmt, rounding="rup")
    # the elements divided by the scale; an all-zero block (scale 0) keeps
    # its zeros, with their signs (scale_elements)
    return _fp4_result(job, dsq, dsq, _clipped(job, dsq, divide=True), divide=True)


#: Every block scale rule by name (the text of :mod:`fpemu.block`):
#: ``SCALE_RULES[name](job)``.
SCALE_RULES = {r.name: r for r in (
    *(ScaleRule(name, "mx", _mx_rule) for name in MX_EXPONENTS),
    ScaleRule("nvfp4", "fp4", _te_nvfp4_rule, two_level=True),
    ScaleRule("nvfp4-div6", "fp4", _te_nvfp4_rule, two_level=True),
    ScaleRule("nvfp4-torchao", "fp4", _torchao_nvfp4, two_level=True),
    ScaleRule("4over6", "fp4", _four_over_six_rule, two_level=True, chunked=True),
    ScaleRule("cudnn", "fp4", _cudnn_rule),
    ScaleRule("current", "fp32", _fp32_rule),
    ScaleRule("pow2", "fp32", _fp32_rule),
)}
MX_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "mx")
FP4_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "fp4")
FP32_RULES = tuple(n for n, r in SCALE_RULES.items() if r.kind == "fp32")
#: The two-level NVFP4 rules, which take ``tensor_amax``.
TENSOR_SCALE_RULES = tuple(n for n, r in SCALE_RULES.items() if r.two_level)
