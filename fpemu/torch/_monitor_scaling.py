"""The monitor's scalings: how a tensor is scaled before its values are
classified in a what-if format (:class:`~fpemu.torch.Monitor`, ``scaling=``).

Each function takes the torch module and returns the scaled values in float32
(float64 for MX); ``"none"`` and ``"loss_scale"`` need no values of their own
(stats() applies their factor), so they are not here.
"""

from __future__ import annotations

import math

import numpy as np

#: How each tensor is scaled before it is classified (see Monitor).
SCALINGS = ("none", "loss_scale", "current", "delayed", "mx", "nvfp4")


def te_scale(fmax, ref, margin):
    """TransformerEngine's per-tensor scale: ``(max / amax) / 2**margin`` in
    float32, 1 when the reference amax ``ref`` is 0 or None (nothing recorded
    yet), at most FLT_MAX when it is tiny."""
    with np.errstate(over="ignore"):
        s = np.float32(1.0) if not ref else np.float32(
            np.float32(fmax) / np.float32(ref) / np.float32(2.0 ** margin))
    return min(s, np.finfo(np.float32).max)


def te_scaled(torch, flat, s):
    """``flat`` times the float32 scale ``s``: the cast kernel's float32
    multiply, before the classification."""
    return flat.to(torch.float32) * torch.tensor(float(s), dtype=torch.float32,
                                                 device=flat.device)


def mx_scaled(torch, t, f, block):
    """``t`` (float64) divided by OCP MX's power-of-two scale of its block:
    one scale per ``block`` values of the last dimension (rows never share
    one), ``2**(floor(log2 amax) - emax)`` with ``emax`` the exponent of
    ``f.max``; flattened."""
    x = t.to(torch.float64)
    last = x.shape[-1] if x.dim() else 1
    rows = x.reshape(-1, last)
    pad = (-last) % block
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad))
    blocks = rows.reshape(rows.shape[0], -1, block)
    bmax = torch.where(torch.isfinite(blocks), blocks.abs(),
                       torch.zeros((), dtype=blocks.dtype, device=blocks.device))
    bmax = bmax.amax(dim=-1, keepdim=True)
    _, e = torch.frexp(bmax)                       # bmax = m * 2**e, m in [0.5, 1)
    emax = math.floor(math.log2(f.max))
    expo = torch.where(bmax > 0, e - 1 - emax, torch.zeros_like(e)).clamp(-127, 127)
    y = (blocks / torch.ldexp(torch.ones_like(bmax), expo)).reshape(rows.shape)
    return y[:, :last].reshape(-1)


def nvfp4_scaled(torch, t, f, amax=None):
    """x times TransformerEngine's NVFP4 element encode scale, in float32
    (see :mod:`fpemu.block`, rule ``"nvfp4"``), with ``f.max`` for 6; the
    tensor scale from ``amax`` where given (a shard's: the whole tensor's)."""
    # (local: fpemu.block needs Numba, which importing fpemu.torch does not)
    from ..block.rules import nvfp4_tensor_scale
    f32 = np.float32
    x = t.to(torch.float32)
    last = x.shape[-1] if x.dim() else 1
    rows = x.reshape(-1, last)
    pad = (-last) % 16
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad))
    blocks = rows.reshape(rows.shape[0], -1, 16)
    finite = torch.where(torch.isfinite(blocks), blocks.abs(),
                         torch.zeros((), dtype=blocks.dtype, device=blocks.device))
    bmax = finite.amax(dim=-1, keepdim=True)
    if amax is not None:
        amax_t = f32(amax)
    else:
        amax_t = f32(finite.max().item()) if finite.numel() else f32(0)
    S, Sdec = nvfp4_tensor_scale(amax_t, 448.0, f.max)
    flt_max = torch.tensor(float(np.finfo(np.float32).max), device=x.device)
    # TE's current rule: amax times fp32(S * fp32(1 / 6)) (fpemu.block, "nvfp4")
    mult = f32(S * (f32(1.0) / f32(f.max)))
    ds = bmax * torch.tensor(float(mult), dtype=torch.float32, device=x.device)
    ds = torch.clamp(torch.minimum(ds, flt_max), max=448.0)
    ds = ds.to(torch.float8_e4m3fn).to(torch.float32)
    enc = torch.minimum(1.0 / (ds * torch.tensor(float(Sdec), device=x.device)), flt_max)
    return (blocks * enc).reshape(rows.shape)[:, :last].reshape(-1)
