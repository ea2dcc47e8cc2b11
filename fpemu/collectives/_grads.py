"""What the gradient reducers (DDP, FSDP, ZeRO) share: each rank's
gradients checked, FSDP's reduce dtype, torch's in-place division, errors
named after the function the user called."""

from __future__ import annotations

import functools

import numpy as np

from ..checks import as_format
from ..errors import FpemuTypeError, FpemuValueError
from ..quantize import quantize


# --------------------------------------------- per-rank gradients (DDP, FSDP, ZeRO)
def _rank_grads(grads, fname, dtype=None):
    """(world, each rank's gradients as arrays, the parameters' shapes), with
    the checks every reducer of local gradients makes."""
    if not hasattr(grads, "__len__") or len(grads) < 2:
        raise FpemuValueError(f"{fname}(): grads must hold each rank's list of gradients, at "
                              "least 2 ranks")
    ranks = [[np.asarray(g, dtype) for g in r] for r in grads]
    shapes = [g.shape for g in ranks[0]]
    for r, gs in enumerate(ranks):
        if [g.shape for g in gs] != shapes:
            raise FpemuValueError(f"{fname}(): rank {r}'s gradients have the shapes "
                                  f"{[g.shape for g in gs]}, rank 0's {shapes}: every rank "
                                  "holds the same parameters")
    return len(ranks), ranks, shapes


def _reduce_format(reduce_fmt, fname):
    """The Format of an FSDP ``reduce_dtype`` (fp32, bf16 or fp16)."""
    rfmt = as_format(reduce_fmt)
    if rfmt.name not in ("fp32", "bf16", "fp16"):
        raise FpemuValueError(f"{fname}(): reduce_dtype must be fp32, bf16 or fp16, got "
                              f"{rfmt.name}")
    return rfmt


def _div_(x, d, fmt):
    """torch's in-place division of a ``fmt`` tensor by a number: the float32
    quotient (the float32 math of a reduced-precision tensor), rounded to
    ``fmt``."""
    return quantize(quantize(np.asarray(x, np.float64) / d, "fp32"), fmt)


def _unflatten(flat, indices, shapes, out):
    """Parameters ``indices``, laid end to end in ``flat``, into ``out[i]``
    (float32 arrays of their shapes)."""
    at = 0
    for i in indices:
        k = int(np.prod(shapes[i]))
        out[i] = np.array(flat[at:at + k], np.float32).reshape(shapes[i])
        at += k


def _in_the_name_of(fname):
    """A decorator: an error of the all-reduce / reduce-scatter a wrapper
    calls (an unknown algorithm, a bad collective parameter) names the
    function the user called, not the inner one."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (FpemuValueError, FpemuTypeError) as err:
                text = str(err)
                for inner in ("all_reduce(): ", "reduce_scatter(): "):
                    if text.startswith(inner):
                        raise type(err)(f"{fname}(): {text[len(inner):]}") from None
                raise
        return call
    return wrap
