"""The collectives of N emulated ranks: :func:`all_reduce`,
:func:`reduce_scatter`, :func:`all_gather`, :func:`broadcast` and the scaled
:func:`fp8_all_reduce`; the algorithm of a reduction comes from
:data:`fpemu.collectives.algorithms.ALGORITHM_TABLE`."""

from __future__ import annotations

import math
import numbers

from fractions import Fraction

import numpy as np

from ..checks import as_format, real_array
from ..errors import FpemuTypeError, FpemuValueError
from ..quantize import quantize
from .algorithms import NCCL_FP8, algorithm_of, check_params, document_params, keep_wire_nans
from ._grads import _in_the_name_of


def _ranks(xs, fmt, fname, cast=True):
    """(Format, float32 array ranks x elements, the ranks' common shape): the
    ranks' arrays checked and cast to ``fmt``. With ``cast=False`` a float32
    array whose first axis is the rank comes back as it is (a view, no copy:
    the gloo kernel casts each value as it reads it); other inputs are cast."""
    fmt = as_format(fmt)
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__len__"):
        raise FpemuTypeError(f"{fname}(): xs must hold one array per rank (a list, or an array "
                             f"whose first axis is the rank), got {type(xs).__name__}")
    if len(xs) < 2:
        raise FpemuValueError(
            f"{fname}(): a collective needs a world of at least 2 ranks, got {len(xs)}; pass "
            "one array per rank (with one rank every collective returns its input cast to "
            "the wire format: fpemu.quantize(x, fmt))")
    if fmt.bits > 32 or fmt.precision > 24 or fmt.emax > 127:
        raise FpemuValueError(f"{fname}(): the wire format must fit float32 (fp32 or "
                              f"narrower), got {fmt.name}")
    if not cast and type(xs) is np.ndarray and xs.dtype == np.float32:     # not a subclass
        return fmt, np.ascontiguousarray(xs.reshape(len(xs), -1)), xs.shape[1:]
    arrays, shapes, dtypes = [], [], []
    for r, x in enumerate(xs):
        a, shape = real_array(x, fname)
        arrays.append(a)
        shapes.append(shape)
        # the dtype each rank holds, before any conversion: a torch bf16 tensor
        # and a float32 one differ though both reach numpy as float32
        dtypes.append(str(x.dtype).replace("torch.", "") if hasattr(x, "detach")
                      else str(np.asarray(x).dtype))
    for r in range(1, len(arrays)):
        if shapes[r] != shapes[0] or dtypes[r] != dtypes[0]:
            raise FpemuValueError(
                f"{fname}(): every rank must hold an array of the same shape and dtype (as "
                f"torch.distributed requires); rank 0 has {shapes[0]} {dtypes[0]}, rank {r} "
                f"has {shapes[r]} {dtypes[r]}")
    V = np.empty((len(arrays), arrays[0].size), np.float32)
    for r, a in enumerate(arrays):
        keep_wire_nans(a, quantize(a, fmt, out=V[r]), fmt)
    return fmt, V, shapes[0]


def _shared(out, world, shape=None):
    """One result per rank: views of the same read-only array (the ranks of
    these collectives end with the same bits; ``np.array(r)`` copies)."""
    out = out if shape is None else out.reshape(shape)
    out.setflags(write=False)
    return [out.view() for _ in range(world)]


def _factor(op, factor, world, fname):
    """The exact rational that scales the sum: 1, 1/world or ``factor``."""
    if op == "premul_sum":
        if (factor is None or isinstance(factor, bool)
                or not isinstance(factor, numbers.Real) or not math.isfinite(factor)):
            raise FpemuValueError(f"{fname}(): op='premul_sum' multiplies every rank's array by "
                                  f"factor=, a finite real number; got {factor!r}")
        return Fraction(float(factor))          # numpy scalars too
    if factor is not None:
        raise FpemuValueError(f"{fname}(): factor= belongs to op='premul_sum'; got op={op!r} "
                              f"with factor={factor!r}")
    return Fraction(1, world) if op == "avg" else Fraction(1)


# --------------------------------------------------------------------- public
def _reduce(xs, fmt, op, algorithm, factor, params, fname):
    fmt = as_format(fmt)
    alg, op = algorithm_of(algorithm, op, fmt, fname)
    fmt, V, shape = _ranks(xs, fmt, fname, cast=not alg.reads_float32)
    scale = _factor(op, factor, V.shape[0], fname)
    check_params(alg, params, fname)
    return alg.run(V, fmt, op, scale, params, fname).reshape(shape), V.shape[0]


def all_reduce(xs, fmt, op="sum", algorithm="gloo", *, factor=None, **params):
    """Every rank's result of an all-reduce of ``xs`` (one array per rank)
    with the wire format ``fmt`` (see the module note for the algorithms).

    Parameters
    ----------
    xs : sequence of array_like
        One array per rank, all of the same shape and dtype (at least 2).
        Each is cast to ``fmt`` to nearest even first.
    fmt : str or Format
        The dtype on the wire: fp32, bf16 or fp16 for gloo; any format of at
        most float32's range and precision for ``"exact"``.
    op : {"sum", "avg", "max", "min", "premul_sum", "product"}
        ``product``: gloo and exact only (NCCL's is not modelled).
    algorithm : {algorithms}
    factor : float
        ``premul_sum`` only: every rank's array is multiplied by it.
    {params}

    Returns
    -------
    list of numpy.ndarray
        One float32 array per rank, of the ranks' shape: read-only views of
        the same values (every rank ends with the same bits).
    """
    out, world = _reduce(xs, fmt, op, algorithm, factor, params, "all_reduce")
    return _shared(out, world)


# the algorithms and their parameters, documented from ALGORITHM_TABLE
all_reduce.__doc__ = document_params(all_reduce.__doc__)


def reduce_scatter(xs, fmt, op="sum", algorithm="gloo", *, factor=None, **params):
    """Rank ``r``'s share of the reduction of ``xs``: slice ``r`` of ``world``
    equal slices along the first axis (``reduce_scatter_tensor``). The
    ranks' first axis must be a multiple of the world size; the other
    arguments are :func:`all_reduce`'s."""
    first = np.shape(xs[0])[:1] if hasattr(xs, "__len__") and len(xs) else ()
    world = len(xs) if hasattr(xs, "__len__") else 0
    if world >= 2 and (not first or first[0] % world):
        raise FpemuValueError(
            f"reduce_scatter(): each rank's first axis must be a multiple of the world size "
            f"{world} (rank r gets slice r), got shape {np.shape(xs[0])}; pad the arrays, or "
            "flatten them and pad to a multiple")
    out, world = _reduce(xs, fmt, op, algorithm, factor, params, "reduce_scatter")
    k = out.shape[0] // world
    out.setflags(write=False)
    return [out[r * k:(r + 1) * k] for r in range(world)]


def all_gather(xs, fmt):
    """Every rank's result of an all-gather: the ranks' arrays, cast to
    ``fmt``, concatenated along the first axis (``all_gather_into_tensor``;
    0-d arrays are stacked)."""
    fmt, V, shape = _ranks(xs, fmt, "all_gather")
    whole = V.reshape((V.shape[0],) + shape)
    whole = whole.reshape((-1,) + shape[1:]) if shape else whole
    return _shared(whole, V.shape[0])


def broadcast(xs, fmt, src=0):
    """Every rank's result of a broadcast from rank ``src``: its array, cast
    to ``fmt``."""
    fmt, V, shape = _ranks(xs, fmt, "broadcast")
    if isinstance(src, bool) or not isinstance(src, numbers.Integral) or not 0 <= src < len(V):
        raise FpemuValueError(f"broadcast(): src must be a rank in 0 .. {len(V) - 1}, got "
                              f"{src!r}")
    return _shared(V[src].copy(), V.shape[0], shape)


# ---------------------------------------------------------------------- FP8
@_in_the_name_of("fp8_all_reduce")
def fp8_all_reduce(xs, fmt="e4m3fn", algorithm="ring", *, op="sum", scaling="shared", margin=0,
                   power_of_two=False, predivide=True, **params):
    """An all-reduce with FP8 on the wire, as FP8 gradient communication does
    (MS-AMP's FP8 all-reduce, TransformerEngine's scaling rule): returns
    ``(results, scale)``, one float32 array per rank, already divided by the
    scale.

    ``scaling="shared"``: a max all-reduce of every rank's amax first (exact),
    then one scale for all ranks (FP8-LM's shared scale, the smallest of the
    ranks' own: Peng et al. 2023), ``fp8_max / amax / 2**margin`` computed in
    float32, divided by the world size when ``predivide`` (a sum of ``world``
    values then stays within ``fp8_max``; ``op="avg"`` needs no room and
    ignores it); ``power_of_two=True`` rounds the scale down to a power of
    two, so that dividing by it is exact. ``"none"``: scale 1, the values cast
    as they are. Each rank's values times the scale (a float32 product) are cast to
    ``fmt`` (e4m3fn or e5m2, saturating, as TransformerEngine casts), summed
    with ``algorithm`` (NCCL's FP8 arithmetic for ``"ring"`` and ``"tree"``,
    or ``"exact"``), and the sum is divided by the scale in float32."""
    fname = "fp8_all_reduce"
    f = as_format(fmt)
    if f.name not in NCCL_FP8:
        raise FpemuValueError(f"{fname}(): fmt must be one of {', '.join(NCCL_FP8)}, got "
                              f"{f.name}")
    if scaling not in ("shared", "none"):
        raise FpemuValueError(f"{fname}(): scaling must be 'shared' (one scale from the global "
                              f"amax) or 'none', got {scaling!r}")
    if (isinstance(margin, bool) or not isinstance(margin, numbers.Integral) or margin < 0
            or margin > 127):
        raise FpemuValueError(f"{fname}(): margin must be an int from 0 to 127 (the scale is "
                              f"fp8_max / amax / 2**margin, and 2**128 is no float32), got "
                              f"{margin!r}")
    _, X, shape = _ranks(xs, "fp32", fname)
    if algorithm == "gloo":
        raise FpemuValueError(f"{fname}(): gloo has no FP8 types; use algorithm='ring', "
                              "'tree' or 'exact'")
    scale = np.float32(1.0)
    if scaling == "shared":
        with np.errstate(invalid="ignore"):
            amax = np.float32(np.nanmax(np.abs(X))) if X.size else np.float32(0)
        if amax > 0 and np.isfinite(amax):
            scale = np.float32(np.float32(f.max) / amax) / np.float32(2.0 ** margin)
            if predivide and op == "sum":
                scale = np.float32(scale / np.float32(len(X)))
            if power_of_two:
                scale = np.float32(2.0 ** np.floor(np.log2(np.float64(scale))))
    kw = {"overflow": "saturate"}
    with np.errstate(over="ignore", invalid="ignore"):
        q = quantize(quantize(X.astype(np.float64) * np.float64(scale), "fp32"), f, **kw)
    out = all_reduce(q.reshape((len(q),) + shape), f, op, algorithm, **params)[0]
    res = quantize(out.astype(np.float64) / np.float64(scale), "fp32").reshape(shape)
    return _shared(res, len(q)), float(scale)
