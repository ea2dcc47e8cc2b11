"""``torch._scaled_mm``: the fp8 GEMM real fp8 code calls (torch 2.13's
signature: ``input, mat2, scale_a, scale_b, bias=None, scale_result=None,
out_dtype=None, use_fast_accum=False``).

Under the CUDA profile (the default) it computes as an H100 does through
cuBLASLt, with the checks of torch's CUDA kernel:

* the fp32 accumulator: Hopper's fp8 tensor core (``accumulate``'s
  ``"h100-fp8"``: 32 products a step, aligned to 13 fraction bits, each
  operand's subnormals at its own format's emin); ``use_fast_accum=False``
  restarts the chain every 128 products and adds the chains in fp32
  (``"blocked"``, 128). Both checked bit for bit against mmaemu 0.1.0, which
  was validated on an H100 PCIe (``tests/test_fp8_gemm_oracles.py``);
* the epilogue as mmaemu measured it: ``alpha = fp32(scale_a * scale_b)``,
  ``y = fp32(acc * alpha + 0)`` (an exact zero product gives +0, an
  underflowing one keeps its sign), then the output dtype: float32 as is,
  bfloat16 / float16 rounded from y, fp8 y saturated and rounded; NaN is the
  canonical NaN of the output dtype. ``scale_result`` has no effect: on an
  H200 with torch 2.11.0+cu130, e4m3fn outputs with ``scale_result=0.5`` are
  y itself, saturated and rounded, on all 20 probes of ``make gpu-check``
  (``bench/gpu_check/nvidia-h200-torch2.11.0``), although cuBLASLt's
  documented formula multiplies by a D scale;
* split-K (``splitk=``, an fpemu extension of torch's signature): ``"auto"``
  (the default) runs the split cuBLASLt picks for the shape, dtypes and
  accumulation on an H100 PCIe with torch's 1 MiB workspace, as recorded in
  mmaemu's heuristic table (:func:`fpemu.cublaslt.splitk_decision`; e.g.
  16x64x8192 and 64x128x8192 split three ways); an int or
  :class:`fpemu.accumulate.SplitK` forces a split (``1``: one chain). Split
  parts are 128-wide k-tiles, each part accumulated as above from +0, the
  parts added in fp32 before the epilogue; checked bit for bit against
  mmaemu's ``splitk="auto"`` (``tests/test_splitk.py``). Where the table
  does not hold the shape and K spans more than one k-tile, ``"auto"`` runs
  one chain and warns (:class:`fpemu.cublaslt.UnrecordedSplitWarning`): the
  GPU may split such a shape (an H200 split two of them), and mmaemu refuses
  it; with one k-tile a split could only turn a -0 result into +0;
* row-wise scales (``scale_a`` (M, 1), ``scale_b`` (1, N), float32) give each
  output its own ``alpha = fp32(scale_a[m] * scale_b[n])``, and a bias is
  added to y in float32 before the output rounding: these two follow the
  cuBLASLt documentation's formula and are not checked against a GPU.

Under ``Profile("cpu")`` it computes as torch's CPU kernel does, up to the
order of the float32 sums: the operands dequantized (``fp32(a * scale_a)``)
and multiplied in float32 (fpemu adds the K products in index order; torch
2.13's CPU BLAS adds them in blocks, so about a third of the float32 outputs
differ in the last bit, each within the float32 error bound of the sum),
the bias added, for an fp8 output multiplied by ``fp32(1 / scale_result)``,
then torch's plain cast to the output dtype (``.to()``: e5m2 overflows to inf,
e4m3fn follows the profile's cast, saturating from torch 2.12 on). That is
torch's portable CPU path; where torch uses oneDNN's fp8 GEMM instead (seen
on an AVX-512 FP16 Xeon) its e4m3fn overflow is NaN
(``docs/pytorch-numerics.md`` §12). The CPU kernel does not
split K: ``splitk`` must stay ``"auto"`` or 1 there.
"""

from __future__ import annotations

import warnings

import numpy as np

from ... import accumulate as _acc
from ... import cublaslt
from ...quantize import quantize
from .._core import (
    Tensor, _result, _store, as_dtype, bfloat16, float16, float32, float8_e4m3fn, float8_e5m2,
)
from .._profile import get_profile
from .._common import scalar_type
from .linalg import mm_acc

_FP8 = (float8_e4m3fn, float8_e5m2)
_OUT = (float32, bfloat16, float16, float8_e4m3fn, float8_e5m2)


def _scales(scale_a, scale_b, M, N, a_dt, b_dt):
    """(alpha rows factor, alpha cols factor) as float32 arrays broadcasting
    to (M, N): one scale each (tensor-wise) or one per row of a and column
    of b (row-wise); torch's ValueError otherwise."""
    ok = (isinstance(scale_a, Tensor) and isinstance(scale_b, Tensor)
          and scale_a.dtype is float32 and scale_b.dtype is float32
          and a_dt in _FP8 and b_dt in _FP8)
    if ok and scale_a.numel() == 1 and scale_b.numel() == 1:
        return scale_a._data.reshape(1, 1), scale_b._data.reshape(1, 1)
    if ok and tuple(scale_a.shape) == (M, 1) and tuple(scale_b.shape) == (1, N):
        return scale_a._data.reshape(M, 1), scale_b._data.reshape(1, N)
    raise ValueError(
        "Invalid scaling configuration.\n- For TensorWise scaling, a and b should be float8, "
        "scales should be float and singletons.\n- For RowWise scaling, a and b should be "
        f"float8, scales should be float, scale_a should be ({M}, 1) and scale_b should be "
        f"(1, {N}), and both should be contiguous.\nGot a.dtype={a_dt}, "
        f"scale_a.dtype={getattr(scale_a, 'dtype', type(scale_a).__name__)}, "
        f"scale_a.size()={list(getattr(scale_a, 'shape', []))}, b.dtype={b_dt}, "
        f"scale_b.dtype={getattr(scale_b, 'dtype', type(scale_b).__name__)} and "
        f"scale_b.size()={list(getattr(scale_b, 'shape', []))}")


def _check_cuda(a, b, bias, out_dtype, M, K, N):
    """The checks of torch's CUDA ``_scaled_mm`` (``aten/src/ATen/native/
    cuda/Blas.cpp``), with its wording."""
    if bias is not None and bias.numel() != N:
        raise RuntimeError(f"Bias must be size {N} but got {bias.numel()}")
    if K % 16:
        raise RuntimeError(f"Expected trailing dimension of mat1 to be divisible by 16 but got "
                           f"mat1 shape: ({M}x{K}).")
    if N % 16:
        raise RuntimeError(f"mat2 shape ({K}x{N}) must be divisible by 16")
    if a.dtype is float8_e5m2 and b.dtype is float8_e5m2:
        raise ValueError("Multiplication of two Float8_e5m2 matrices is not supported")
    if bias is not None:
        if out_dtype is float32:
            raise RuntimeError("Bias is not supported when out_dtype is set to Float32")
        if bias.dtype not in (bfloat16, float16):
            raise RuntimeError(f"Bias must be either Half or BFloat16, but got "
                               f"{scalar_type(bias.dtype)}")
        if out_dtype is bfloat16 and bias.dtype is not bfloat16:
            raise RuntimeError(f"Bias must be BFloat16 to compute {scalar_type(out_dtype)} "
                               f"output, but got {scalar_type(bias.dtype)}")
        if out_dtype is float16 and bias.dtype is not float16:
            raise RuntimeError(f"Bias must be Float16 to compute {scalar_type(out_dtype)} "
                               f"output, but got {scalar_type(bias.dtype)}")
    # cuBLASLt's fp8 GEMM takes a row-major first operand and a column-major
    # second one (mat2 = w.t() of a row-major weight)
    row_major = a.stride(1) == 1 or M == 1
    col_major = b.stride(0) == 1 or N == 1
    if not (row_major and col_major):
        raise RuntimeError("Only multiplication of row-major and column-major matrices is "
                           "supported by cuBLASLt")


def _to_output(y, out_dtype, scale_result, cpu):
    """fp32 y in the output dtype, as the epilogue writes it (module
    docstring: the CPU kernel divides an fp8 output by ``scale_result`` and
    casts; the GPU ignores it and saturates)."""
    if out_dtype is float32:
        out = y
    elif out_dtype in _FP8 and cpu:
        if scale_result is not None:
            # torch's CPU kernel: out * (1 / scale_result), the reciprocal in float32
            with np.errstate(all="ignore"):
                inv = np.float32(1) / np.float32(scale_result._data.reshape(()))
                y = (y * inv).astype(np.float32)
        out = _store(y, out_dtype)                      # the plain cast: e5m2 overflows to inf
    elif out_dtype in _FP8:
        fmt_max = np.float32(out_dtype.max)
        y = np.where(np.isnan(y), y, np.clip(y, -fmt_max, fmt_max))     # saturation, NaN passes
        out = quantize(y, out_dtype).astype(np.float32)
    else:
        out = _store(y, out_dtype)
    return out


def _split_of(splitk, cpu, M, N, K, a_dt, b_dt, out_dtype, fast):
    """The :class:`fpemu.accumulate.SplitK` of this call (module docstring)."""
    if isinstance(splitk, str) and splitk == "auto":
        if cpu:
            return _acc.SplitK(1)
        d = cublaslt.splitk_decision(M, N, K, str(a_dt), str(b_dt), str(out_dtype),
                                     fast=bool(fast))
        if d.source == "unrecorded" and K > d.splitk.tile:
            # more than one k-tile: a split the GPU may choose would change bits
            warnings.warn(cublaslt.UnrecordedSplitWarning(
                f"_scaled_mm(): {d.note}. It ran as one chain (splitk=1); pass splitk= an int "
                f"to choose the split, or run make gpu-check on a GPU to record it"),
                stacklevel=3)
        return d.splitk
    split = _acc.SplitK.of(splitk, "_scaled_mm")
    if cpu and split.splits > 1:
        raise ValueError(f"_scaled_mm(): splitk={splitk!r} under the CPU profile: torch's CPU "
                         "kernel does not split K; pass splitk='auto' or 1, or use the CUDA "
                         "profile")
    return split


def _scaled_mm(input, mat2, scale_a, scale_b, bias=None, scale_result=None,
               out_dtype=None, use_fast_accum=False, *, splitk="auto"):
    """``torch._scaled_mm``: the scaled fp8 GEMM (module docstring). Not
    differentiable, as in torch. ``splitk`` (fpemu's): ``"auto"``, cuBLASLt's
    split on an H100 PCIe (:func:`fpemu.cublaslt.splitk_decision`), or an
    explicit number of K splits."""
    a, b = input, mat2
    for name, t in (("self", a), ("mat2", b)):
        if not isinstance(t, Tensor):
            raise TypeError(f"_scaled_mm(): argument '{name}' must be Tensor, not "
                            f"{type(t).__name__}")
    if a.ndim != 2:
        raise RuntimeError("mat1 must be a matrix")
    if b.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({M}x{K} and "
                           f"{K2}x{N})")
    out_dtype = a.dtype if out_dtype is None else as_dtype(out_dtype, "_scaled_mm()")
    if out_dtype not in _OUT:
        raise RuntimeError(f"_scaled_mm(): out_dtype must be float32, bfloat16, float16 or a "
                           f"float8 dtype, got {out_dtype}")
    sa, sb = _scales(scale_a, scale_b, M, N, a.dtype, b.dtype)
    cpu = get_profile().cpu
    if not cpu:
        _check_cuda(a, b, bias, out_dtype, M, K, N)
    split = _split_of(splitk, cpu, M, N, K, a.dtype, b.dtype, out_dtype, use_fast_accum)
    A = a._data.astype(np.float32)
    B = b._data.astype(np.float32)
    with np.errstate(all="ignore"):
        if cpu:
            # torch's CPU kernel: dequantize, then a float32 GEMM
            Ad = (A * sa).astype(np.float32)
            Bd = (B * sb).astype(np.float32)
            y = mm_acc(Ad, Bd, float32)
            if bias is not None:
                y = (y + bias._data.astype(np.float32)).astype(np.float32)
        else:
            fmts = (a.dtype, b.dtype)
            if use_fast_accum:
                acc = _acc.matmul(A, B, fmts, "fp32", "fp32", model="h100-fp8", splitk=split)
            else:
                acc = _acc.matmul(A, B, fmts, "fp32", "fp32", model="blocked", block=128,
                                  inner="h100-fp8", splitk=split)
            alpha = (sa.astype(np.float64) * sb.astype(np.float64)).astype(np.float32)
            # fma(acc, alpha, +0): the exact product rounded once (+0 for an exact zero)
            y = (acc.astype(np.float64) * alpha.astype(np.float64) + 0.0).astype(np.float32)
            if bias is not None:
                y = (y + bias._data.astype(np.float32)).astype(np.float32)
    out = _to_output(np.asarray(y, np.float32), out_dtype, scale_result, cpu)
    if not cpu:                     # the GPU writes its canonical NaN
        out = np.where(np.isnan(out), _acc.CANONICAL_NAN32, out)

    def backward(g):
        raise NotImplementedError("the derivative for '_scaled_mm' is not implemented (as in "
                                  "torch); differentiate the high-precision GEMM instead")
    return _result(np.ascontiguousarray(out, np.float32), out_dtype, (a, b), backward,
                   op="scaled_mm")
