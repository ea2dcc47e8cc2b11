"""Matrix products: fp32 accumulation under an accumulation model of
:mod:`fpemu.accumulate`, one rounding to the output dtype.

The model is the active profile's unless a program chooses one
(``set_matmul_model("h100")`` or ``with matmul_model("a100"):``;
``set_matmul_model("auto")`` goes back to the profile's):

* CUDA profile, bf16 / fp16 operands: the tensor-core model of the profile's
  GPU (``Profile("cuda", gpu="h100")``: Hopper, 16 products a step aligned to
  25 fraction bits), with cuBLAS's split of K where the probes recorded it
  (:func:`fpemu.cublaslt.gemm16_decision`). An H200 wrote every bit of the
  40 bf16 / fp16 ``torch.mm`` probes of ``tests/test_gpu_probes.py`` this way.
* CUDA profile, float32 operands read as TF32
  (``torch.backends.cuda.matmul.allow_tf32 = True``): rounded to tf32
  (nearest, ties to even), then the GPU's TF32 tensor-core model (Hopper:
  ``"h100-tf32"``, 8 products a step) with cuBLAS's split of K into runs of
  32-wide k-tiles (:func:`fpemu.cublaslt.tf32_decision`): every bit of the 20
  TF32 probes an H200 wrote (``tests/test_gpu_probes_tf32.py``). Convolutions
  (cuDNN, ``torch.backends.cudnn.allow_tf32``) use the model unsplit: cuDNN's
  order is not probed.
* The recorded splits are of single GEMMs on Hopper: batched products
  (``bmm``), the products inside a fused attention kernel and convolutions run
  the tensor-core model unsplit, and a GPU of another architecture runs it
  unsplit with a warning past K = 2048.
* float32 without TF32 (cuBLAS's SGEMM on CUDA, MKL on the CPU), 16-bit
  formats other than bf16 / fp16, and every product of the CPU profile:
  ``"sequential"``, fp32 adds in index order, run by a batched float32
  kernel. SGEMM's order is not yet probed.
* float64: under the CPU profile ``"sequential"`` in float64 (products and
  sums rounded to float64 in index order: MKL's DGEMM for the small
  products of torch's op tests, not its blocked large ones); under the CUDA
  profile numpy's matmul.
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["addmm", "baddbmm", "bmm", "dot", "ger", "linear", "matmul", "matmul_model", "mm", "mv",
           "outer", "set_matmul_model"]

import contextlib
import os
import sys
import warnings

import numpy as np

from ... import accumulate as _acc
from ... import cublaslt as _cublaslt
from ...formats import tf32 as _tf32
from ...quantize import quantize
from .._autocast import cast_inputs
from .._core import (
    Tensor, _named, _result, _store, _sum_to, bfloat16, float16, float32, float64, is_float,
    result_type,
)
from .._profile import get_profile
from .._state import State
from .._common import c10_name, operand, scalar_type  # noqa: F401  (re-exported)
from .elementwise import mul

#: the value of ``set_matmul_model`` that follows the active profile
AUTO = "auto"


def set_matmul_model(model=AUTO, block=128, inner="sequential"):
    """Choose the accumulation model of every matmul / linear: a name of
    :data:`fpemu.accumulate.MODELS`, a tensor-core preset such as "h100", or
    ``"auto"`` (the default): the active profile's (module text)."""
    if model != AUTO:
        _acc.resolve_model(model, "set_matmul_model")
    m = State.matmul
    m.model, m.block, m.inner = model, block, inner


@contextlib.contextmanager
def matmul_model(model, block=128, inner="sequential"):
    """``with matmul_model("h100"):`` runs the region's matmuls under a model."""
    m = State.matmul
    old = (m.model, m.block, m.inner)
    set_matmul_model(model, block, inner)
    try:
        yield
    finally:
        m.model, m.block, m.inner = old


def _tf32_inputs(dt, conv=False):
    """True when float32 operands are read as tf32 (CUDA profile, switch on)."""
    if dt is not float32 or get_profile().device != "cuda":
        return False
    return State.matmul.cudnn_allow_tf32 if conv else State.matmul.allow_tf32


def _in_fmt(dt, tf32):
    return _tf32 if tf32 else dt


#: the GPUs whose cuBLAS splits of K were recorded (the H200's probes)
_SPLITS_RECORDED_ON = ("hopper",)


def _warn_unrecorded(text):
    """An UnrecordedSplitWarning pointing at the first frame outside fpemu
    (the user's line that asked for the product)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frame, level = sys._getframe(0), 1          # level 1: this function
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1
    warnings.warn(text, _cublaslt.UnrecordedSplitWarning, stacklevel=level)


def effective_model(dt, tf32, M=0, N=0, K=0, conv=False, batch=1, fused=False):
    """``(model, block, inner, splitk)`` of a product of ``dt`` operands of
    shape (M, K) @ (K, N) under the chosen model or the profile's (module
    text). cuBLAS's recorded splits apply to a single GEMM (``batch`` 1) on
    the GPU they were recorded on; ``conv`` (cuDNN), ``fused`` (a product
    inside a fused kernel, attention's) and batched products run the
    tensor-core model unsplit."""
    m = State.matmul
    if m.model != AUTO:
        return m.model, m.block, m.inner, 1
    prof = get_profile()
    gpu = prof.gpu_spec
    if prof.device != "cuda":
        return "sequential", 128, "sequential", 1
    if tf32 and gpu.tf32_core:
        core, decide, what = gpu.tf32_core, _cublaslt.tf32_decision, "TF32"
    elif not tf32 and dt in (bfloat16, float16):
        core, decide, what = gpu.tensor_core, None, dt.name
    else:                      # float32 SGEMM (not probed), other formats: in order
        return "sequential", 128, "sequential", 1
    if conv or fused or batch != 1:
        return core, 128, "sequential", 1
    if gpu.arch not in _SPLITS_RECORDED_ON:
        if K > _cublaslt.GEMM16_UNSPLIT_UP_TO:
            _warn_unrecorded(f"{M}x{K} @ {K}x{N} {what} product: cuBLAS's split of K on "
                             f"{gpu.name} is not recorded: unsplit assumed, the GPU may split "
                             f"it; pass set_matmul_model('{core}') and splitk through "
                             "fpemu.accumulate to choose")
        return core, 128, "sequential", 1
    d = decide(M, N, K) if decide else _cublaslt.gemm16_decision(M, N, K, dt.name)
    if d.source == "unrecorded":
        _warn_unrecorded(f"{M}x{K} @ {K}x{N} {what} product: {d.note}; pass "
                         f"set_matmul_model('{core}') and splitk through fpemu.accumulate to "
                         "choose")
    return core, 128, "sequential", d.splitk


def mm_acc(A, B, dt, tf32=False, conv=False, fused=False):
    """The fp32 accumulator (float32 array; float64 for float64) of A @ B, both
    at least 2-D with numpy's batch broadcasting, values of ``dt``
    (``conv``: a convolution's product; ``fused``: a product inside a fused
    kernel; neither is split as cuBLAS splits)."""
    if dt is float64 and get_profile().device == "cuda":
        return np.matmul(A.astype(np.float64), B.astype(np.float64))
    if tf32:
        A = quantize(np.asarray(A, np.float32), "tf32")
        B = quantize(np.asarray(B, np.float32), "tf32")
    batch = (A.shape[:-2] if A.shape[:-2] == B.shape[:-2]
             else np.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    M, K, N = A.shape[-2], A.shape[-1], B.shape[-1]
    if 0 in batch or 0 in (M, K, N):      # an empty sum is 0; no rows or columns: empty
        return np.zeros(batch + (M, N), np.float64 if dt is float64 else np.float32)
    model, block, inner, splitk = effective_model(dt, tf32, M, N, K, conv,
                                                  int(np.prod(batch, dtype=np.int64)), fused)
    if model == "sequential":
        A3 = (A if A.shape[:-2] == batch else np.broadcast_to(A, batch + (M, K))).reshape(
            -1, M, K)
        om = np.float64 if dt is float64 else np.float32
        if A3.dtype != om or not (A3.flags.c_contiguous
                                  or A3.swapaxes(1, 2).flags.c_contiguous):
            A3 = np.ascontiguousarray(A3, om)            # (a transposed A is read in place)
        B3 = np.ascontiguousarray(
            B if B.shape[:-2] == batch else np.broadcast_to(B, batch + (K, N)),
            om).reshape(-1, K, N)
        return _acc.bmm_fp32_sequential(A3, B3).reshape(batch + (M, N))
    fmt = _in_fmt(dt, tf32)
    plan = _acc.Plan.of(fmt, "fp32", "fp32", model=model, block=block, inner=inner,
                        splitk=splitk)                                 # parsed once
    if not batch:
        return plan.matmul(A, B).astype(np.float32)
    return _batched(plan, np.broadcast_to(A, batch + (M, K)).reshape(-1, M, K),
                    np.broadcast_to(B, batch + (K, N)).reshape(-1, K, N)).reshape(
                        batch + (M, N))


#: a matrix of at most this many products (M * N * K) joins the others of its
#: batch in one call of the row-by-row kernel (each product spelled out as a
#: pair of rows: memory grows with M * N * K); a larger one runs alone
_SMALL_PRODUCT = 1 << 16
#: products per call of the row-by-row kernel
_PAIRED_CHUNK = 1 << 20


def _batched(plan, A3, B3):
    """A batch of products under one plan. A tensor-core plan runs the batch
    in one kernel call (:meth:`fpemu.accumulate.Plan.bmm`). Under other
    models, small matrices (attention's many 8x16 heads, where a call per
    matrix costs more than its arithmetic) go as row-by-column dot products,
    many matrices a kernel call; larger ones one call each
    (:meth:`fpemu.accumulate.Plan.matmul`, memory M*K + K*N). All give the
    same bits."""
    nb, M, K = A3.shape
    N = B3.shape[2]
    if plan.tensor_core:
        return plan.bmm(A3, B3)
    out = np.empty((nb, M, N), np.float32)
    if M * N * K > _SMALL_PRODUCT:
        for b in range(nb):
            out[b] = plan.matmul(A3[b], B3[b])
        return out
    per = max(1, _PAIRED_CHUNK // max(M * N * K, 1))
    for b0 in range(0, nb, per):
        b1 = min(nb, b0 + per)
        Ar = np.broadcast_to(np.asarray(A3[b0:b1], np.float64)[:, :, None, :],
                             (b1 - b0, M, N, K)).reshape(-1, K)
        Br = np.broadcast_to(np.swapaxes(np.asarray(B3[b0:b1], np.float64), 1, 2)[:, None],
                             (b1 - b0, M, N, K)).reshape(-1, K)
        out[b0:b1] = plan.dot_rows(Ar, Br).reshape(b1 - b0, M, N)
    return out


def same_mm_dtype(da, db):
    """torch's matmul does not promote: outside autocast, mixed dtypes raise."""
    if da is not db:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: "
                           f"{c10_name(da)} != {c10_name(db)}")


def check_mm_dtype(dt):
    if dt is not float64 and dt.bits <= 8:
        raise TypeError(f"matmul of {dt} tensors: PyTorch has no plain fp8 matmul; use "
                        f"fpemu.autograd.fp8.fp8_autocast with nn.Linear for scaled fp8 GEMMs")


def matmul(a, b, out=None):
    """a @ b: fp32 accumulation under the configured model, one rounding to
    the output dtype. Autocast: ``lower`` (bf16/fp16 inputs and output)."""
    a, b = cast_inputs("matmul", a, b)
    return _matmul(a, b, "matmul")


def _matmul(a, b, op):
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{a.ndim}D and {b.ndim}D")
    if a.ndim == 1 and b.ndim == 1:
        if a.shape[0] != b.shape[0]:
            raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and "
                               f"src [{b.shape[0]}] to have the same number of elements, but "
                               f"got {a.shape[0]} and {b.shape[0]} elements respectively")
        return _named(_matmul(a.reshape(1, -1), b.reshape(-1, 1), op).reshape(()), "Dot")
    # torch's grad_fn of these shapes: a vector times a matrix squeezes the
    # product (SqueezeBackward4), a matrix times a vector is mv
    if a.ndim == 1:
        return _named(_matmul(a.reshape(1, -1), b, op).reshape(b.shape[:-2] + b.shape[-1:]),
                      "SqueezeBackward4" if b.ndim == 2 else "UnsafeView")
    if b.ndim == 1:
        return _named(_matmul(a, b.reshape(-1, 1), op).reshape(a.shape[:-1]),
                      "Mv" if a.ndim == 2 else "UnsafeView")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({int(np.prod(a.shape[:-1]))}x{a.shape[-1]} and "
                           f"{b.shape[-2]}x{b.shape[-1]})")
    same_mm_dtype(a.dtype, b.dtype)
    dt = result_type(a, b)
    if not is_float(dt):
        return Tensor(np.matmul(a._data, b._data), dt)
    check_mm_dtype(dt)
    tf32 = _tf32_inputs(dt)
    A, B = operand(a, dt), operand(b, dt)
    res = _store(mm_acc(A, B, dt, tf32), dt)
    a_needs, b_needs = a.requires_grad, b.requires_grad

    def backward(g):
        ga = gb = None
        if a_needs:
            ga = _sum_to(_store(mm_acc(g, np.swapaxes(B, -1, -2), dt, tf32), dt), a.shape, dt)
        if b_needs:
            if b.ndim == 2 and a.ndim > 2:
                rows = int(np.prod(A.shape[:-1]))       # (not -1: the rows may be none)
                gb = _store(mm_acc(A.reshape(rows, A.shape[-1]).T,
                                   g.reshape(rows, g.shape[-1]), dt, tf32), dt)
            else:
                gb = _sum_to(_store(mm_acc(np.swapaxes(A, -1, -2), g, dt, tf32), dt),
                             b.shape, dt)
        return ga, gb
    saved = tuple(t for t, need in ((b, a_needs), (a, b_needs)) if need)
    if op == "matmul":              # torch's matmul runs mm, or a batched product viewed
        op = "mm" if a.ndim == 2 and b.ndim == 2 else "UnsafeView"
    return _result(res, dt, (a, b), backward, saved=saved, op=op)


def mm(a, b):
    (a, b) = cast_inputs("mm", a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise RuntimeError(f"{'self' if a.ndim != 2 else 'mat2'} must be a matrix")
    return _matmul(a, b, "mm")


def bmm(a, b):
    (a, b) = cast_inputs("bmm", a, b)
    if a.ndim != 3 or b.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if a.ndim != 3 else
                           "batch2 must be a 3D tensor")
    if a.shape[0] != b.shape[0]:
        raise RuntimeError("batch1 and batch2 must have same number of batches, got "
                           f"{a.shape[0]} and {b.shape[0]}")
    return _matmul(a, b, "bmm")


def mv(a, v):
    a, v = cast_inputs("mv", a, v)
    return _matmul(a, v, "mv")


def dot(a, b):
    a, b = cast_inputs("dot", a, b)
    if a.ndim != 1 or b.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    return _matmul(a, b, "dot")


def outer(a, b):
    """a[:, None] * b[None, :], one rounding per product (exact in opmath
    before it: torch's outer is a broadcast multiply)."""
    return mul(a.reshape(-1, 1), b.reshape(1, -1))


ger = outer


def linear(x, weight, bias=None):
    """x @ weight.T + bias; the bias is added to the fp32 accumulator before
    the one rounding to the output dtype (cuBLASLt's bias epilogue)."""
    x, weight, bias = cast_inputs("linear", x, weight, bias)
    if weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({int(np.prod(x.shape[:-1]))}x{x.shape[-1]} and "
                           f"{weight.shape[-1]}x{weight.shape[0]})")
    same_mm_dtype(x.dtype, weight.dtype)
    if bias is not None and bias.dtype is not x.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got "
                           f"{scalar_type(bias.dtype)} and {scalar_type(x.dtype)}")
    dt = result_type(x, weight) if bias is None else result_type(x, weight, bias)
    check_mm_dtype(dt)
    tf32 = _tf32_inputs(dt)
    X = operand(x, dt).reshape(-1, x.shape[-1])
    W = operand(weight, dt)
    acc = mm_acc(X, W.T, dt, tf32)
    if bias is not None:
        acc = acc + operand(bias, dt)
    res = _store(acc, dt).reshape(x.shape[:-1] + (W.shape[0],))
    x_needs, w_needs = x.requires_grad, weight.requires_grad

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = gw = gb = None
        if x_needs:
            gx = _store(mm_acc(g2, W, dt, tf32), dt).reshape(x.shape)
        if w_needs:
            gw = _store(mm_acc(g2.T, X, dt, tf32), dt)
        if bias is not None and bias.requires_grad:
            # torch's bias gradient is sum_to(grad, bias.shape): one reduction over
            # the rows, in the order of ATen's CUDA kernel under the CUDA profile
            with np.errstate(invalid="ignore"):      # inf + -inf is NaN, as on the GPU
                gb = _sum_to(np.ascontiguousarray(g2), bias.shape, dt)
        return gx, gw, gb
    saved = tuple(t for t, need in ((weight, x_needs), (x, w_needs)) if need)
    # torch's grad_fn: addmm / mm on a matrix, a view of them on other inputs
    # (a 1-D input without bias: its mv squeezed)
    op = {(2, True): "addmm", (2, False): "mm", (1, False): "SqueezeBackward4"}.get(
        (x.ndim, bias is not None), "view" if bias is not None else "UnsafeView")
    return _result(res, dt, (x, weight, bias), backward, saved=saved, op=op,
                   stored=True)                      # x, weight and bias are of dtype dt


def _add_product(inp, a, b, beta, alpha, op):
    """beta * inp + alpha * (a @ b): the fp32 accumulator meets ``inp`` in
    opmath and is rounded once to the output dtype (a GEMM's beta epilogue)."""
    same_mm_dtype(a.dtype, b.dtype)
    dt = result_type(a, b)
    check_mm_dtype(dt)
    if not is_float(dt):
        raise RuntimeError(f"{op}: fpemu emulates floating-point products only; got "
                           f"{scalar_type(dt)} operands (use a float dtype)")
    tf32 = _tf32_inputs(dt)
    A, B = operand(a, dt), operand(b, dt)
    C = operand(inp, dt)
    acc = mm_acc(A, B, dt, tf32)
    om = acc.dtype.type
    if alpha != 1:
        acc = acc * om(alpha)
    if beta == 0:              # beta == 0 ignores inp, NaN and inf included (BLAS)
        full = acc + np.zeros_like(C)
    else:
        full = acc + (C if beta == 1 else C * om(beta))
    out_shape = np.broadcast_shapes(np.shape(C), acc.shape)
    if out_shape != acc.shape:
        raise RuntimeError(f"{op}: the input of shape {list(np.shape(C))} does not broadcast "
                           f"to the product's shape {list(acc.shape)}; expected a tensor that "
                           f"broadcasts to it")
    res = _store(full, dt)
    needs = (getattr(inp, "requires_grad", False), a.requires_grad, b.requires_grad)

    def backward(g):
        gi = ga = gb = None
        if needs[0]:
            gi = _sum_to(g if beta == 1 else _store(g * om(beta), dt), inp.shape, dt)
        ga_src = g if alpha == 1 else _store(g * om(alpha), dt)
        if needs[1]:
            ga = _store(mm_acc(ga_src, np.swapaxes(B, -1, -2), dt, tf32), dt)
        if needs[2]:
            gb = _store(mm_acc(np.swapaxes(A, -1, -2), ga_src, dt, tf32), dt)
        return gi, ga, gb
    saved = tuple(t for t, need in ((b, needs[1]), (a, needs[2])) if need)
    return _result(res, dt, (inp, a, b), backward, saved=saved, op=op)


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), one rounding (autocast ``lower``)."""
    input, mat1, mat2 = cast_inputs("addmm", input, mat1, mat2)
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"{'mat1' if mat1.ndim != 2 else 'mat2'} must be a matrix, got "
                           f"{mat1.ndim if mat1.ndim != 2 else mat2.ndim}-D tensor")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x"
                           f"{mat1.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})")
    return _add_product(input, mat1, mat2, beta, alpha, "addmm")


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * (batch1 @ batch2) per batch, one rounding
    (autocast ``lower``; nn.MultiheadAttention adds its mask this way)."""
    input, batch1, batch2 = cast_inputs("baddbmm", input, batch1, batch2)
    if batch1.ndim != 3 or batch2.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor" if batch1.ndim != 3 else
                           "batch2 must be a 3D tensor")
    if batch1.shape[0] != batch2.shape[0] or batch1.shape[2] != batch2.shape[1]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{batch1.shape[0]}, {batch1.shape[2]}] but got: "
                           f"[{batch2.shape[0]}, {batch2.shape[1]}].")
    return _add_product(input, batch1, batch2, beta, alpha, "baddbmm")
