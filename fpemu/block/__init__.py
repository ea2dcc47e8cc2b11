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

``"nearest"`` (ml_dtypes' cast to ``float8_e8m0fnu``; the scale of
    ``fpemu.autograd.fp8.MXFP8BlockScaling(scale_rule="nearest")``)
    ``fp32(a / elem_max)`` rounded to the nearer power of two, a tie
    (``1.5 * 2**k``) up. A zero or NaN amax takes ``2**-127``; a NaN block
    is marked NaN only where the element format has no NaN (else its NaN
    elements get the element format's NaN code, as in ml_dtypes).

Every rule clamps ``e`` to [-127, 127]; a NaN amax gives the NaN scale
(0xFF; except ``"nearest"``, above) and the whole block decodes to NaN.
Elements are ``x / 2**e``, clamped to the element maximum, rounded once.

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
top N bits of the ``i``-th 63-bit Philox4x32-10 draw of
:func:`fpemu.quantize.stochastic_bits` (``rng="philox"``, the default, the
same bits on every device), or with ``rng="pcg64"`` the ``i``-th draw of
``numpy.random.Generator(PCG64(seed)).integers(0, 2**N)`` (earlier
releases' stream).

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

from .hadamard import TE_SIGNS, hadamard, hadamard_matrix
from .host import dequantize_blocks, quantize_blocks
from .rules import (
    FP4_RULES, FP32_RULES, MX_RULES, SCALE_RULES, TENSOR_SCALE_RULES, ScaleRule, halving_sum,
)
from .spec import FLT_MAX, INF_BLOCK, PRESETS, BlockQuantized, BlockSpec
from .table import TABLE_PRESETS, error_shares, error_table

__all__ = ["BlockQuantized", "BlockSpec", "PRESETS", "SCALE_RULES", "ScaleRule", "INF_BLOCK",
           "quantize_blocks", "dequantize_blocks", "hadamard", "hadamard_matrix", "TE_SIGNS",
           "error_table", "error_shares", "TABLE_PRESETS", "MX_RULES", "FP4_RULES",
           "FP32_RULES", "TENSOR_SCALE_RULES", "FLT_MAX", "halving_sum"]
