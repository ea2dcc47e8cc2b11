"""The fused attention kernels torch runs on CUDA, operation by operation.

``F.scaled_dot_product_attention`` on a CUDA device with bf16 / fp16 inputs
runs one of two fused kernels (``docs/pytorch-numerics.md`` §11):

* **flash** (FlashAttention-2 as torch vendors it:
  ``aten/src/ATen/native/transformers/cuda/flash_attn/``): :func:`flash_forward`
  and :func:`flash_backward`;
* **memory-efficient** (xFormers' CUTLASS kernels:
  ``aten/src/ATen/native/transformers/cuda/mem_eff_attention/``):
  :func:`efficient_forward` and :func:`efficient_backward`.

Each function takes one (batch, head) slice: float64 arrays holding values
of the input format, ``(L, E)`` queries and ``(S, E)`` keys and values. The
tensor-core products inside (``Q Kᵀ``, ``P V``, the gradients' products)
run under a tensor-core accumulation model of :mod:`fpemu.accumulate`
(``"h100"`` on Hopper), over the k-order of the kernel's tiles: a chain of
16-wide k-steps inside a tile, continued from tile to tile through the fp32
accumulator. Everything between the products is float32 arithmetic, as the
kernels write it. Two of the GPU's functions are not correctly rounded and
are modelled by the correctly rounded value of their float32 argument:
``exp2f`` (``ex2.approx``, within 2 ulps) and ``__logf`` (``lg2.approx`` times
ln 2); :mod:`bench.fit_attention` measures what that costs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import accumulate
from ..quantize import quantize

_f = np.float32
LOG2E = _f(np.log2(np.e))            # float(M_LOG2E)
LN2 = _f(np.log(2.0))


def exp2f(x):
    """exp2 of float32 ``x``, correctly rounded to float32 (the GPU's
    ``exp2f`` is ``ex2.approx``, within 2 ulps of this)."""
    with np.errstate(all="ignore"):
        return np.exp2(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)


def logf(x):
    """``__logf``: log2 of float32 ``x`` (correctly rounded here; the GPU's
    ``lg2.approx`` is not) times float32 ln 2, rounded."""
    with np.errstate(all="ignore"):
        l2 = np.log2(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)
        return (l2 * LN2).astype(np.float32)


def fma32(a, b, c):
    """float32 fused multiply-add: the exact a*b + c, rounded once. a*b is
    exact in float64; the float64 sum's error is recovered exactly (TwoSum)
    and breaks the one case float64 rounding could get wrong, a sum that
    lands on a float32 tie."""
    a, b, c = np.broadcast_arrays(*(np.asarray(t, np.float32).astype(np.float64)
                                    for t in (a, b, c)))
    p = a * b
    with np.errstate(all="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        r = s.astype(np.float32)
        lo = np.nextafter(r, _f(-np.inf)).astype(np.float64)
        hi = np.nextafter(r, _f(np.inf)).astype(np.float64)
        r64 = r.astype(np.float64)
        tie = (err != 0) & np.isfinite(s) & ((s == (r64 + hi) / 2) | (s == (r64 + lo) / 2))
        if np.any(tie):
            r = np.where(tie, np.nextafter(s, s + err).astype(np.float32), r)
    return r


def rnd(x, fmt):
    """float32 values rounded to ``fmt`` ("bf16" / "fp16"), nearest even."""
    return quantize(np.asarray(x, np.float32), fmt)


def tc_mm(A, B, fmt, tc, c=None, step=16):
    """A @ B under the tensor-core model ``tc`` from the fp32 accumulator
    ``c`` (+0 when None), k in the given order (pad with zeros to keep the
    kernel's 16-wide steps aligned)."""
    A = np.asarray(A, np.float64)
    B = np.asarray(B, np.float64)
    if c is None:
        c = np.zeros((A.shape[0], B.shape[1]), np.float64)
    return np.asarray(accumulate.matmul(A, B, fmt, "fp32", "fp32", model=tc,
                                        c=np.asarray(c, np.float64)), np.float32)


def _pad_rows(X, n):
    """X with zero rows appended up to n rows."""
    if X.shape[0] == n:
        return X
    out = np.zeros((n,) + X.shape[1:], X.dtype)
    out[:X.shape[0]] = X
    return out


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """The flash kernel's launch (torch's ``run_mha_fwd_hdim64`` /
    ``run_mha_bwd_hdim64`` on sm_80 and later, no dropout) and the
    arithmetic choices a fit may vary."""

    block_m: int = 128            # forward kBlockM
    block_n: int = 128            # forward kBlockN
    bwd_block_m: int = 128        # backward kBlockM
    bwd_block_n: int = 128        # backward kBlockN
    exp_fma: bool = False         # exp2f(fma(s, c, -m c)) rather than exp2f(r(s c) - r(m c))
    recip: bool = True            # out = acc * (1 / sum), not acc / sum
    tc: str = "h100"


def _thread_columns(block_n):
    """Column order of the 4 threads that share a row in the m16n8k16
    accumulator: thread t holds columns 8 ni + 2 t + {0, 1}, ni = 0, 1, ..."""
    return np.array([[8 * ni + 2 * t + j for ni in range(block_n // 8) for j in (0, 1)]
                     for t in range(4)])


def _scaled_exp(s, m_scaled, c, exp_fma):
    """exp2f(s * c - m_scaled), as scale_apply_exp2 computes it."""
    with np.errstate(all="ignore"):
        if exp_fma:
            z = fma32(s, np.broadcast_to(c, s.shape), -np.broadcast_to(m_scaled, s.shape))
        else:
            z = ((s * c).astype(_f) - m_scaled).astype(_f)
        return exp2f(z)


def flash_forward(Q, K, V, scale, fmt, causal=False, cfg=FlashConfig()):
    """FlashAttention-2's forward (``flash_fwd_kernel.h``,
    ``compute_attn_1rowblock``) on one head: returns (out32, lse) with out32
    the float32 output before its rounding to ``fmt`` and lse the float32
    log-sum-exp the backward reads."""
    L, E = Q.shape
    S = K.shape[0]
    c = _f(np.float64(_f(scale)) * np.log2(np.e))     # params.scale_softmax_log2
    bm, bn = cfg.block_m, cfg.block_n
    cols_t = _thread_columns(bn)
    out = np.zeros((L, V.shape[1]), _f)
    lse = np.zeros(L, _f)
    for m0 in range(0, L, bm):
        rows = np.arange(m0, min(m0 + bm, L))
        n_blocks = -(-S // bn)
        if causal:
            n_blocks = min(n_blocks, -(-(m0 + bm + S - L) // bn))
        m = np.full((rows.size, 1), -np.inf, _f)
        tsum = np.zeros((rows.size, 4), _f)
        acc = np.zeros((rows.size, V.shape[1]), _f)
        for it, nb in enumerate(reversed(range(n_blocks))):
            n0 = nb * bn
            Kb = _pad_rows(K[n0:n0 + bn], bn)
            Vb = _pad_rows(V[n0:n0 + bn], bn)
            s = tc_mm(Q[rows], Kb.T, fmt, cfg.tc)
            col = n0 + np.arange(bn)
            mask = col[None, :] >= S
            if causal:
                mask = mask | (col[None, :] > rows[:, None] + (S - L))
            s = np.where(mask, _f(-np.inf), s).astype(_f)
            m_prev = m
            m = np.maximum(m, s.max(axis=1, keepdims=True))
            with np.errstate(all="ignore"):
                if it > 0:
                    cur = np.where(m == -np.inf, _f(0), m) if causal else m
                    rescale = exp2f(((m_prev - cur).astype(_f) * c).astype(_f))
                    tsum = (tsum * rescale).astype(_f)
                    acc = (acc * rescale).astype(_f)
                m_scaled = np.where(m == -np.inf, _f(0), (m * c).astype(_f)).astype(_f)
            p = _scaled_exp(s, m_scaled, c, cfg.exp_fma)
            for j in range(cols_t.shape[1]):
                tsum = (tsum + p[:, cols_t[:, j]]).astype(_f)
            acc = tc_mm(rnd(p, fmt), Vb, fmt, cfg.tc, c=acc)
        total = ((tsum[:, 0] + tsum[:, 2]).astype(_f) + (tsum[:, 1] + tsum[:, 3]).astype(_f)
                 ).astype(_f)[:, None]
        with np.errstate(all="ignore"):
            bad = (total == 0) | np.isnan(total)
            if cfg.recip:
                inv = np.where(bad, _f(1), (_f(1) / total).astype(_f)).astype(_f)
                o = (acc * inv).astype(_f)
            else:
                o = np.where(bad, acc, (acc / total).astype(_f)).astype(_f)
            l = np.where(bad, _f(np.inf), fma32(m, _f(scale), logf(total)))
        out[rows] = o
        lse[rows] = l[:, 0]
    return out, lse
