"""Attention in ``torch.nn.functional``: ``scaled_dot_product_attention``
(the backend model of ``docs/pytorch-numerics.md`` §11) and multi-head attention."""

from __future__ import annotations

import contextlib
import enum
import warnings

import numpy as np

from .._autocast import cast_inputs
from .._core import Tensor, _result, _store, float32, float64, is_float, to_dtype
from .._dtypes import bfloat16, float16
from .. import _fused_attention as _fused
from .._profile import get_profile
from .._state import State
from ..ops import linalg as _linalg
from ..ops.linalg import linear
from ._activation import softmax
from ._dropout import dropout, pad
from ..ops.creation import zeros
from ..ops.elementwise import add, mul
from ..ops.shape import cat, repeat_interleave


# ------------------------------------------------------------------ attention
class SDPBackend(enum.IntEnum):
    """``torch.nn.attention.SDPBackend``."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


_ALL_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH, SDPBackend.CUDNN_ATTENTION)
_sdpa_allowed = [_ALL_BACKENDS]


@contextlib.contextmanager
def sdpa_kernel(backends, set_priority=False):
    """``with sdpa_kernel(SDPBackend.MATH):`` restricts attention to those
    backends (``torch.nn.attention.sdpa_kernel``)."""
    if isinstance(backends, SDPBackend):
        backends = [backends]
    backends = tuple(backends)
    for b in backends:
        if not isinstance(b, SDPBackend):
            raise TypeError(f"sdpa_kernel expects SDPBackend values, got {b!r}")
    _sdpa_allowed.append(backends)
    try:
        yield
    finally:
        _sdpa_allowed.pop()


def sdpa_backend(q, dropout_p=0.0):
    """The backend torch would pick: on the CUDA profile flash attention for
    float16 / bfloat16 inputs, memory-efficient attention for float32 (both
    the online-softmax model here), unless :func:`sdpa_kernel` allows only
    math; the CPU profile runs its flash kernel (same model)."""
    allowed = _sdpa_allowed[-1]
    online = [b for b in allowed if b in (SDPBackend.FLASH_ATTENTION,
                                          SDPBackend.EFFICIENT_ATTENTION,
                                          SDPBackend.CUDNN_ATTENTION)]
    if q.dtype is float64 or not online:
        if SDPBackend.MATH not in allowed:
            raise RuntimeError("No available kernel. Aborting execution.")
        return SDPBackend.MATH
    if get_profile().device == "cuda" and q.dtype is float32 and \
            SDPBackend.EFFICIENT_ATTENTION not in allowed:
        if SDPBackend.MATH in allowed:
            return SDPBackend.MATH
        raise RuntimeError("No available kernel. Aborting execution.")
    return online[0]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(q k^T * scale + mask) v, on (..., L, E) query and (..., S, E)
    key / value, with a backend model (``docs/pytorch-numerics.md`` §11):

    * flash / memory-efficient (the default for 16-bit inputs on CUDA): the
      scores q k^T accumulate in fp32 and stay fp32, the softmax runs in fp32,
      the probabilities P are rounded to the input dtype before P v (fp32
      accumulation), and the fp32 result is divided by the fp32 row sum, then
      rounded once. Tier 2: the kernels' online softmax rescales block by
      block, which moves the last bits;
    * math (``with sdpa_kernel(SDPBackend.MATH)``, and float64): q, k and v are
      cast to float32, q and k each scaled by sqrt(scale), and every step runs
      in float32; the output is cast back to the input dtype.
    """
    q, k, v = cast_inputs("scaled_dot_product_attention", query, key, value)
    if not (q.dtype == k.dtype == v.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {q.dtype} key.dtype: {k.dtype} and value.dtype: "
                           f"{v.dtype} instead.")
    if q.shape[-1] != k.shape[-1]:
        raise RuntimeError("query and key must have the same last dimension")
    if enable_gqa and q.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = repeat_interleave(k, rep, -3), repeat_interleave(v, rep, -3)
    if attn_mask is not None and is_causal:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be "
                           "set when is_causal=True")
    E = q.shape[-1]
    sc = 1.0 / float(np.sqrt(E)) if scale is None else float(scale)
    L, S = q.shape[-2], k.shape[-2]
    mask_add = None
    if is_causal:
        mask_add = np.where(np.tril(np.ones((L, S), bool)), 0.0, -np.inf)
    elif attn_mask is not None:
        m = attn_mask._data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        mask_add = np.where(m, 0.0, -np.inf) if m.dtype == bool else m.astype(np.float64)
    # a float mask that needs a gradient: torch's fused kernels give it none, so
    # torch takes the math path, whose graph reaches the mask
    mask_t = attn_mask if (not is_causal and isinstance(attn_mask, Tensor)
                           and is_float(attn_mask.dtype) and attn_mask.requires_grad) else None
    backend = SDPBackend.MATH if mask_t is not None else sdpa_backend(q, dropout_p)
    if backend == SDPBackend.MATH:
        return _sdpa_math(q, k, v, mask_add, dropout_p, sc, mask_t)
    if _kernel_model_applies(q, k, v, attn_mask, dropout_p, is_causal, backend):
        return _sdpa_kernel(q, k, v, backend, is_causal, sc)
    return _sdpa_online(q, k, v, mask_add, dropout_p, sc)


def _kernel_model_applies(q, k, v, attn_mask, dropout_p, is_causal, backend):
    """Whether the kernel-level model (``fpemu/autograd/_fused_attention.py``)
    covers this call: the CUDA profile, bf16 / fp16 inputs, the flash or
    memory-efficient backend, no mask other than ``is_causal`` (with as many
    queries as keys), no dropout, and head dim 64 (the launches fitted to
    the H200's probes, docs/pytorch-numerics.md §11)."""
    return (get_profile().device == "cuda" and q.dtype in (bfloat16, float16)
            and backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
            and attn_mask is None and not dropout_p and q.ndim >= 2
            and q.shape[-1] == 64 and v.shape[-1] == 64
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and k.shape[-2] == v.shape[-2] and q.shape[-2] > 0 and k.shape[-2] > 0
            and (not is_causal or q.shape[-2] == k.shape[-2]))


def _sdpa_kernel(q, k, v, backend, causal, sc):
    """The flash or memory-efficient kernel of torch 2.11 on CUDA, head by
    head (:mod:`fpemu.autograd._fused_attention`), with its own backward."""
    dt = q.dtype
    fmt = dt.name
    tc = get_profile().gpu_spec.tensor_core
    if backend == SDPBackend.FLASH_ATTENTION:
        cfg = _fused.FlashConfig(tc=tc)
        fwd, bwd = _fused.flash_forward, _fused.flash_backward
        op = "scaled_dot_product_flash_attention"
    else:
        cfg = _fused.EfficientConfig(tc=tc)
        fwd, bwd = _fused.efficient_forward, _fused.efficient_backward
        op = "scaled_dot_product_efficient_attention"
    lead = q.shape[:-2]
    L, Ev = q.shape[-2], v.shape[-1]
    Q, K, V = (t._data.astype(np.float64).reshape((-1,) + tuple(t.shape[-2:]))
               for t in (q, k, v))
    out = np.empty((Q.shape[0], L, Ev), np.float32)
    lse = np.empty((Q.shape[0], L), np.float32)
    for h in range(Q.shape[0]):
        o32, lse[h] = fwd(Q[h], K[h], V[h], sc, fmt, causal, cfg)
        out[h] = _fused.rnd(o32, fmt)
    res = out.reshape(tuple(lead) + (L, Ev))

    def backward(g):
        G = np.asarray(g, np.float64).reshape((-1, L, Ev))
        dq = np.empty(Q.shape, np.float32)
        dk = np.empty(K.shape, np.float32)
        dv = np.empty(V.shape, np.float32)
        for h in range(Q.shape[0]):
            dq[h], dk[h], dv[h] = bwd(Q[h], K[h], V[h], out[h], G[h], lse[h], sc, fmt,
                                      causal, cfg)
        return (dq.reshape(q.shape) if q.requires_grad else None,
                dk.reshape(k.shape) if k.requires_grad else None,
                dv.reshape(v.shape) if v.requires_grad else None)
    return _result(res, dt, (q, k, v), backward, saved=(q, k, v), op=op, stored=True)


def _sdpa_math(q, k, v, mask_add, dropout_p, sc, mask_t=None):
    dt = q.dtype
    q32, k32, v32 = (to_dtype(t, float32) if t.dtype is not float64 else t for t in (q, k, v))
    s = float(np.sqrt(sc))
    scores = _linalg._matmul(mul(q32, s), mul(k32, s).transpose(-2, -1), "matmul")
    if mask_t is not None:
        scores = add(scores, mask_t if mask_t.dtype is scores.dtype else
                     to_dtype(mask_t, scores.dtype))
    elif mask_add is not None:
        scores = add(scores, Tensor(mask_add.astype(scores._data.dtype), scores.dtype))
    p = softmax(scores, dim=-1)
    if dropout_p:
        p = dropout(p, dropout_p)
    out = _linalg._matmul(p, v32, "matmul")
    return to_dtype(out, dt)


def _sdpa_online(q, k, v, mask_add, dropout_p, sc):
    dt = q.dtype
    Q, K, V = (t._data.astype(np.float32, copy=False) for t in (q, k, v))  # saved: checked
    S32 = _linalg.mm_acc(Q, np.swapaxes(K, -1, -2), dt, fused=True)          # fp32 scores
    with np.errstate(all="ignore"):
        Z = S32.astype(np.float64) * np.float32(sc)
        if mask_add is not None:
            Z = Z + mask_add
        m = Z.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(Z - m).astype(np.float32)                    # fp32 probabilities
        lsum = p.astype(np.float64).sum(axis=-1, keepdims=True).astype(np.float32)
    keep = None
    if dropout_p:
        keep = ~State.generator.bernoulli(p.shape, dropout_p)
        p_used = np.where(keep, p / np.float32(1 - dropout_p), np.float32(0)).astype(
            np.float32)
    else:
        p_used = p
    P16 = _store(p_used, dt).astype(np.float32, copy=False)
    acc = _linalg.mm_acc(P16, V, dt, fused=True)
    with np.errstate(all="ignore"):
        O32 = (acc / lsum).astype(np.float32)
    res = _store(O32, dt)
    qn, kn, vn = q.requires_grad, k.requires_grad, v.requires_grad

    def backward(g):
        G = g.astype(np.float32, copy=False)
        with np.errstate(all="ignore"):
            Pn = (p_used / lsum).astype(np.float32)            # normalised, fp32
            Pn16 = _store(Pn, dt).astype(np.float32, copy=False)
            dV = _linalg.mm_acc(np.swapaxes(Pn16, -1, -2), G, dt, fused=True) if vn else None
            dP = _linalg.mm_acc(G, np.swapaxes(V, -1, -2), dt, fused=True)
            if keep is not None:
                dP = np.where(keep, dP / np.float32(1 - dropout_p), np.float32(0))
            D = (G.astype(np.float64) * res.astype(np.float64)).sum(axis=-1, keepdims=True)
            Pbase = (p / lsum).astype(np.float32)
            dS = (Pbase * (dP - D.astype(np.float32))).astype(np.float32)
            dS16 = _store(dS, dt).astype(np.float32, copy=False)
            dQ = _linalg.mm_acc(dS16, K, dt, fused=True) * np.float32(sc) if qn else None
            dK = (_linalg.mm_acc(np.swapaxes(dS16, -1, -2), Q, dt, fused=True)
                  * np.float32(sc) if kn else None)
        return (None if dQ is None else _store(dQ, dt), None if dK is None else _store(dK, dt),
                None if dV is None else _store(dV, dt))
    return _result(res, dt, (q, k, v), backward, saved=(q, k, v),
                   op="scaled_dot_product_flash_attention", stored=True)   # q, k, v: dtype dt


# ------------------------------------------------------ multi-head attention
def _canonical_mask(mask, mask_name, other_type, other_name, target_type, check_other=True):
    """A boolean mask (True = masked out) becomes an additive one of
    ``target_type`` (0 and -inf); a float mask is returned as it is."""
    if mask is None:
        return None
    if mask.dtype.name != "bool" and not is_float(mask.dtype):
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype is not other_type:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. "
                      f"Use same type for both instead.", stacklevel=3)
    if is_float(mask.dtype):
        return mask
    add = np.where(mask._data, -np.inf, 0.0)
    return Tensor(_store(add, target_type), target_type)


def _none_or_dtype(t):
    return None if t is None else t.dtype


def _in_projection_packed(q, k, v, w, b=None):
    """The q, k, v projections of one packed (3E, E) weight, as torch forms
    them: one GEMM for self-attention, q and (k, v) for encoder-decoder
    attention, three otherwise (each a separately rounded GEMM)."""
    E = q.shape[-1]
    if k is v:
        if q is k:
            proj = linear(q, w, b).unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2)
            proj = proj.squeeze(-2).contiguous()
            return proj[0], proj[1], proj[2]
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        kv = linear(k, w_kv, b_kv).unflatten(-1, (2, E)).unsqueeze(0).transpose(0, -2)
        kv = kv.squeeze(-2).contiguous()
        return linear(q, w_q, b_q), kv[0], kv[1]
    w_q, w_k, w_v = w.chunk(3)
    b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
    return linear(q, w_q, b_q), linear(k, w_k, b_k), linear(v, w_v, b_v)


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads,
                                 in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
                                 dropout_p, out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False):
    """torch's multi-head attention on (L, N, E) query and (S, N, E) key /
    value (unbatched (L, E) too), op for op: projections, masks merged into
    one additive mask, then either the explicit path that returns the
    weights (q scaled by 1/sqrt(head_dim), ``baddbmm`` with the mask, fp32
    softmax, ``bmm``) or, with ``need_weights=False``,
    :func:`scaled_dot_product_attention` under its backend model."""
    is_batched = query.ndim == 3
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise AssertionError(f"query, key and value should be all 3-D (batched) or all 2-D "
                             f"(unbatched) tensors, but received query {query.ndim}-D, key "
                             f"{key.ndim}-D and value {value.ndim}-D")
    if not is_batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    tgt_len, bsz, embed_dim = query.shape
    src_len = key.shape[0]
    key_padding_mask = _canonical_mask(key_padding_mask, "key_padding_mask",
                                       _none_or_dtype(attn_mask), "attn_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None            # SDPA applies the causal mask itself
    else:
        attn_mask = _canonical_mask(attn_mask, "attn_mask", None, "", query.dtype,
                                    check_other=False)
        if key_padding_mask is not None:
            is_causal = False
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, "
                             f"but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if tuple(key.shape[:2]) != tuple(value.shape[:2]):
            raise AssertionError(f"key's sequence and batch dims {tuple(key.shape[:2])} do "
                                 f"not match value's {tuple(value.shape[:2])}")
        b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else in_proj_bias.chunk(3)
        q, k, v = (linear(query, q_proj_weight, b_q), linear(key, k_proj_weight, b_k),
                   linear(value, v_proj_weight, b_v))
    else:
        if tuple(key.shape) != tuple(value.shape):
            raise AssertionError(f"key shape {tuple(key.shape)} does not match value shape "
                                 f"{tuple(value.shape)}")
        q, k, v = _in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is "
                                   f"{tuple(attn_mask.shape)}, but should be "
                                   f"{(tgt_len, src_len)}.")
            attn_mask = attn_mask.unsqueeze(0)
        elif attn_mask.ndim == 3:
            if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is "
                                   f"{tuple(attn_mask.shape)}, but should be "
                                   f"{(bsz * num_heads, tgt_len, src_len)}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")
    if bias_k is not None and bias_v is not None:
        k = cat([k, bias_k.repeat(1, bsz, 1)])
        v = cat([v, bias_v.repeat(1, bsz, 1)])
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    elif (bias_k is None) != (bias_v is None):
        raise AssertionError("bias_k and bias_v must both be given or both be None")
    q = q.view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = (k.view(k.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_k is None
         else static_k)
    v = (v.view(v.shape[0], bsz * num_heads, head_dim).transpose(0, 1) if static_v is None
         else static_v)
    if add_zero_attn:
        zshape = (bsz * num_heads, 1, head_dim)
        k = cat([k, zeros(zshape, dtype=k.dtype)], dim=1)
        v = cat([v, zeros(zshape, dtype=v.dtype)], dim=1)
        if attn_mask is not None:
            attn_mask = pad(attn_mask, (0, 1))
        if key_padding_mask is not None:
            key_padding_mask = pad(key_padding_mask, (0, 1))
    src_len = k.shape[1]
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (bsz, src_len):
            raise AssertionError(f"expecting key_padding_mask shape of {(bsz, src_len)}, but "
                                 f"got {tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask.view(bsz, 1, 1, src_len).expand(-1, num_heads, -1, -1)
        kpm = kpm.reshape(bsz * num_heads, 1, src_len)
        attn_mask = kpm if attn_mask is None else attn_mask + kpm
    if not training:
        dropout_p = 0.0
    if need_weights:
        E = q.shape[-1]
        q_scaled = q * float(np.sqrt(1.0 / float(E)))
        if attn_mask is not None:
            w = _linalg.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
        else:
            w = _linalg.bmm(q_scaled, k.transpose(-2, -1))
        w = softmax(w, dim=-1)
        if dropout_p > 0.0:
            w = dropout(w, p=dropout_p)
        out = _linalg.bmm(w, v).transpose(0, 1).reshape(tgt_len * bsz, embed_dim)
        out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, -1)
        w = w.view(bsz, num_heads, tgt_len, src_len)
        if average_attn_weights:
            w = w.mean(dim=1)
        if not is_batched:
            out, w = out.squeeze(1), w.squeeze(0)
        return out, w
    if attn_mask is not None:
        if attn_mask.shape[0] == 1 and attn_mask.ndim == 3:
            attn_mask = attn_mask.unsqueeze(0)
        else:
            attn_mask = attn_mask.view(bsz, num_heads, -1, src_len)
    q = q.view(bsz, num_heads, tgt_len, head_dim)
    k = k.view(bsz, num_heads, src_len, head_dim)
    v = v.view(bsz, num_heads, src_len, head_dim)
    out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
    out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, embed_dim)
    out = linear(out, out_proj_weight, out_proj_bias).view(tgt_len, bsz, -1)
    if not is_batched:
        out = out.squeeze(1)
    return out, None


#: torch.nn.functional's names this module defines (nn/functional.py gathers them)
__all__ = ["multi_head_attention_forward", "scaled_dot_product_attention", "sdpa_backend",
           "sdpa_kernel", "SDPBackend"]
