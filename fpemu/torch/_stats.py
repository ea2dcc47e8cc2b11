"""fpemu.stats on a tensor's own device: only the count vectors come back.

:func:`stats` classifies each element of ``t * scale`` rounded (to nearest
even) into a format exactly as :func:`fpemu.stats` does (its module text
defines the classes, the overflow destinations, the amax and the log2
histogram), with torch operations where the tensor lives, so that a CUDA
tensor is counted without copying it to the host. The product ``t * scale``
is taken in float64, as on the host; where it is a float32 number (every
element for a power-of-two scale, but those pushed below float32's normal
range or beyond its largest value) it is rounded by
:func:`fpemu.torch.quantize` (bit for bit :func:`fpemu.quantize`); the few
other elements go to the host's :func:`fpemu.stats`, and the two counts add.
A CPU tensor is counted by :func:`fpemu.stats` itself, on its own memory.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import stats as _host
from ..checks import as_format
from . import _quantize as _q

torch = _q.torch

__all__ = ["stats"]

# class ids of one element (the order of _host.CLASSES, overflow split by destination)
_NAN, _INF, _ZERO, _FLUSHED, _SUB, _NORMAL, _TO_INF, _TO_NAN, _SAT, _DROP = range(10)


@torch.compiler.disable
def stats(t, fmt, *, scale=1.0, overflow=None, log2_range=_host.LOG2_RANGE):
    """:func:`fpemu.stats` of a tensor (round to nearest even), counted on
    its device; returns the same :class:`fpemu.stats.Counts`.

    Examples
    --------
    >>> import torch, fpemu.torch
    >>> c = fpemu.torch.stats(torch.tensor([0.0, 1e-9, 1e-6, 1.0, 7e4, float("nan")]), "fp16")
    >>> c.counts
    {'nan': 1, 'inf': 0, 'zero': 1, 'flushed': 1, 'subnormal': 1, 'normal': 1, 'overflow': 1}
    """
    f = as_format(fmt)
    empty = _host.stats(np.zeros(0, np.float32), f, scale=scale, overflow=overflow,
                        log2_range=log2_range)            # checks the arguments
    _q._check_tensor(t, "stats")
    if t.is_complex() or not t.is_floating_point():
        raise _q.FpemuTypeError(f"fpemu.torch.stats() takes a floating-point tensor, got "
                                f"{t.dtype}")
    x = t.detach().reshape(-1)
    if x.numel() == 0:
        return empty
    if _q._on_cpu(x):           # the host's counting kernels on the tensor's own memory
        if x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32)                 # (narrower floats widen exactly)
        with _q._host_kernels():
            return _host.stats(x.resolve_neg().numpy(), f, scale=scale, overflow=overflow,
                               log2_range=log2_range)
    lo, hi = empty.log2_lo, empty.log2_lo + empty.hist.size
    x64 = x.to(torch.float64)
    finite = x64.isfinite()
    v = torch.where(finite, x64, 0.0) * float(scale)
    v32 = v.to(torch.float32)
    hard = finite & (v32.to(torch.float64) != v)          # not a float32 number
    v32 = torch.where(hard, 0.0, v32)
    q = _q.quantize(v32, f, overflow=overflow)
    aq = q.abs()
    zero = x64 == 0
    cls = torch.full(x.shape, _NORMAL, dtype=torch.int64, device=x.device)
    if f.has_zero:
        cls = torch.where(aq < float(f.min_normal), _SUB, cls)
    cls = torch.where(aq == 0, _FLUSHED, cls)
    over_to = torch.where(q.isnan(), _TO_NAN, torch.where(aq.isinf(), _TO_INF, _SAT))
    cls = torch.where(v.abs() > float(f.max), over_to, cls)
    cls = torch.where(zero, _ZERO, cls)
    cls = torch.where(x64.isinf(), _INF, cls)
    invalid = finite & q.isnan() & (v == 0)
    if not f.signed:
        invalid = invalid | (finite & (v < 0))
    cls = torch.where(x64.isnan() | invalid, _NAN, cls)
    cls = torch.where(hard, _DROP, cls)
    n = torch.bincount(cls, minlength=_DROP + 1)
    # floor(log2 |x * scale|) of the finite nonzero values: an underflow to zero in
    # the first bin, beyond float64 (inf) in the last
    binned = finite & ~zero & ~hard
    k = torch.frexp(v.abs()).exponent.to(torch.int64) - 1 - lo
    k = torch.where(v == 0, 0, torch.where(v.abs().isinf(), hi - lo - 1, k))
    k = torch.where(binned, k.clamp(0, hi - lo - 1), hi - lo)
    hist = torch.bincount(k, minlength=hi - lo + 1)
    amax = torch.where(finite & ~hard, x64.abs(), 0.0).max()
    small = torch.cat([n, hist, (zero & ~hard).sum().reshape(1),
                       amax.view(torch.int64).reshape(1)]).cpu().numpy()
    n, hist, zero_bin = small[:_DROP + 1], small[_DROP + 1:-3], int(small[-2])
    amax = float(small[-1:].view(np.float64)[0])
    names = ("nan", "inf", "zero", "flushed", "subnormal", "normal")
    counts = {k: int(n[i]) for i, k in enumerate(names)}
    counts["overflow"] = int(n[_TO_INF] + n[_TO_NAN] + n[_SAT])
    res = dataclasses.replace(
        empty, counts=counts, amax=amax, hist=hist.astype(np.int64), zero_bin=zero_bin,
        overflow_to={"inf": int(n[_TO_INF]), "nan": int(n[_TO_NAN]), "saturated": int(n[_SAT])})
    if bool(hard.any()):
        rest = x[hard].to("cpu", torch.float64).numpy()
        res = res + _host.stats(rest, f, scale=scale, overflow=overflow, log2_range=log2_range)
    return res
