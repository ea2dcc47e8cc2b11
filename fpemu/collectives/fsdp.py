"""FSDP's gradient reduce-scatter (FSDP2's ``fully_shard`` and FSDP1) and
its pre- and post-division factors."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import FpemuValueError
from ..quantize import quantize
from .algorithms import _count
from ._grads import _div_, _in_the_name_of, _rank_grads, _reduce_format, _unflatten
from .primitives import all_reduce


# --------------------------------------------------------------------- FSDP
def fsdp_divide_factors(world, reduce_fmt, gradient_divide_factor=None):
    """FSDP2's ``_get_gradient_divide_factors`` (torch 2.13, one reduce-scatter
    group): (pre-divide factor, post-divide factor, op). fp32 and bf16 reduce
    with ``avg`` (or ``premul_sum`` by 1 / factor); fp16, which could
    overflow, sums with the factor split into a power of two before the sum
    and the rest after it."""
    fname = "fsdp_divide_factors"
    world = _count(world, "world (the number of ranks)", fname, 1)
    reduce_fmt = _reduce_format(reduce_fmt, fname).name
    if gradient_divide_factor is not None and (
            isinstance(gradient_divide_factor, bool)
            or not isinstance(gradient_divide_factor, numbers.Real)
            or not 0 < gradient_divide_factor < math.inf):
        raise FpemuValueError(f"{fname}(): gradient_divide_factor must be a finite number > 0 "
                              f"(or None: the world size), got {gradient_divide_factor!r}")
    if reduce_fmt in ("fp32", "bf16"):
        if gradient_divide_factor is None:
            return None, None, "avg"
        if gradient_divide_factor == world:
            return None, None, "avg"
        return None, None, ("premul_sum", 1.0 / gradient_divide_factor)
    factor = float(world) if gradient_divide_factor is None else gradient_divide_factor
    pre = 1
    while factor % pre == 0 and factor / pre > pre:
        pre *= 2
    return pre, factor / pre, "sum"


@_in_the_name_of("fsdp_reduce_scatter")
def fsdp_reduce_scatter(grads, reduce_fmt, algorithm="gloo", *, orig_fmt="fp32",
                        gradient_divide_factor=None, **params):
    """The gradients FSDP2 (``fully_shard`` with a ``MixedPrecisionPolicy``)
    leaves, gathered whole: ``grads[r][i]`` is rank ``r``'s unsharded local
    gradient of parameter ``i`` (in ``param_dtype``), ``reduce_fmt`` the
    policy's ``reduce_dtype`` (fp32, bf16 or fp16), ``orig_fmt`` the sharded
    parameters' dtype.

    FSDP2 casts the gradients to ``reduce_dtype`` and lays them out for one
    reduce-scatter: row ``r`` of the input holds, parameter after parameter,
    chunk ``r`` of each gradient's first dimension (chunks of ceil(dim0 /
    world) rows, zero-padded). It divides as :func:`fsdp_divide_factors`
    says, reduce-scatters (on gloo the all-reduce of the whole buffer, sliced;
    FSDP2 does not ask gloo for ``avg``: torch sums and divides in
    ``reduce_dtype``, a float32 division rounded to it, the same bits as
    gloo's own ``avg``), divides by the post factor and casts the
    shard to the parameters' dtype. Returns one float32 array per parameter.
    """
    fname = "fsdp_reduce_scatter"
    rfmt = _reduce_format(reduce_fmt, fname)
    world, ranks, shapes = _rank_grads(grads, fname, np.float32)
    if any(len(sh) == 0 for sh in shapes):
        raise FpemuValueError(f"{fname}(): FSDP shards along dim 0; a 0-d gradient has none")
    rows = [-(-sh[0] // world) for sh in shapes]
    chunk = [rows[i] * int(np.prod(shapes[i][1:])) for i in range(len(shapes))]

    def layout(gs):
        out = []
        for dst in range(world):
            for i, g in enumerate(gs):
                part = np.zeros((rows[i],) + shapes[i][1:], np.float32)
                piece = g[dst * rows[i]:(dst + 1) * rows[i]]
                part[:piece.shape[0]] = piece
                out.append(part.reshape(-1))
        return np.concatenate(out)

    flat = np.stack([quantize(layout(gs), rfmt) for gs in ranks])
    pre, post, op = fsdp_divide_factors(world, rfmt.name, gradient_divide_factor)
    with np.errstate(over="ignore", invalid="ignore"):
        if pre is not None and pre != 1:
            flat = _div_(flat, pre, rfmt)
        factor = None
        if isinstance(op, tuple):
            op, factor = op
        if algorithm == "gloo" and op in ("avg", "premul_sum"):
            div = world if op == "avg" else 1.0 / factor
            summed = all_reduce(flat, rfmt, "sum", "gloo", **params)[0].astype(np.float64)
            red = _div_(summed, div, rfmt)
        else:
            red = all_reduce(flat, rfmt, op, algorithm, factor=factor, **params)[0]
        if post is not None and post != 1:
            red = _div_(red, post, rfmt)
    red = quantize(red, orig_fmt).reshape(world, -1)
    out, off = [], 0
    for i, sh in enumerate(shapes):
        full = np.concatenate([red[dst][off:off + chunk[i]] for dst in range(world)])
        out.append(np.array(full[:int(np.prod(sh))], np.float32).reshape(sh))
        off += chunk[i]
    return out


@_in_the_name_of("fsdp1_reduce_scatter")
def fsdp1_reduce_scatter(grads, reduce_fmt, algorithm="gloo", *, orig_fmt="fp32", units=None,
                         **params):
    """The gradients FSDP1 (``FullyShardedDataParallel`` with
    ``MixedPrecision(param_dtype, reduce_dtype)``) leaves, gathered whole:
    ``grads[r][i]`` is rank ``r``'s unsharded local gradient of parameter
    ``i`` (in ``param_dtype``).

    Each FSDP unit (``units``: lists of parameter indices, default one unit
    holding them all, the root) flattens its gradients into one buffer, in
    order, zero-padded to a multiple of the world size; the buffer is cast to
    ``reduce_dtype``, divided by FSDP1's pre-divide factor (the power of two
    of :func:`fsdp_divide_factors`' fp16 rule, for every dtype), summed by a
    reduce-scatter (rank ``r`` keeps the ``r``-th contiguous slice), divided
    by the post-divide factor and cast to the parameters' dtype. Each
    division is a float32 division rounded to ``reduce_dtype``."""
    fname = "fsdp1_reduce_scatter"
    rfmt = _reduce_format(reduce_fmt, fname)
    world, ranks, shapes = _rank_grads(grads, fname, np.float32)
    units = [list(range(len(shapes)))] if units is None else [list(u) for u in units]
    if sorted(i for u in units for i in u) != list(range(len(shapes))):
        raise FpemuValueError(f"{fname}(): units must share out the parameters 0 .. "
                              f"{len(shapes) - 1}, each to one unit; got {units!r}")
    pre, post, _ = fsdp_divide_factors(world, "fp16")
    out = [None] * len(shapes)
    for unit in units:
        flat = []
        for gs in ranks:
            f = np.concatenate([gs[i].reshape(-1) for i in unit])
            f = np.concatenate([f, np.zeros((-f.size) % world, np.float32)])
            flat.append(quantize(f, rfmt))
        flat = np.stack(flat)
        with np.errstate(over="ignore", invalid="ignore"):
            if pre != 1:
                flat = _div_(flat, pre, rfmt)
            red = all_reduce(flat, rfmt, "sum", algorithm, **params)[0]
            if post != 1:
                red = _div_(red, post, rfmt)
        red = quantize(red, orig_fmt)
        _unflatten(red, unit, shapes, out)
    return out
