"""Collective operations over N emulated ranks, bit for bit.

What does a bf16 all-reduce over 8 ranks do to a gradient? Each function here
takes one array per rank (a list, or an array whose first axis is the rank),
casts each to the wire format ``fmt`` to nearest even (as ``tensor.to(dtype)``
does) and returns one float32 array per rank, holding what that rank ends up
with (where the ranks end with the same bits, read-only views of one array:
``np.array(r)`` gives a copy of your own):

* :func:`all_reduce`: every rank gets the reduction of all ranks' arrays;
* :func:`reduce_scatter`: rank ``r`` gets slice ``r`` (along the first axis)
  of that reduction (``torch.distributed.reduce_scatter_tensor``);
* :func:`all_gather`: every rank gets the ranks' arrays concatenated along
  the first axis (``all_gather_into_tensor``): copies, no arithmetic;
* :func:`broadcast`: every rank gets rank ``src``'s array;
* :func:`ddp_all_reduce`: the gradients DistributedDataParallel leaves on
  every rank (its buckets, its division, its compression hooks, PowerSGD
  with a :class:`PowerSGDState`);
* :func:`fsdp_reduce_scatter` and :func:`fsdp1_reduce_scatter`: the
  gradients FSDP2's and FSDP1's mixed precision leave (``reduce_dtype``,
  their shard layouts, their divisions);
* :func:`zero_reduce`: the gradients DeepSpeed ZeRO (stages 1, 2 and 3;
  bf16, and fp16 modelled) leaves, configured by its JSON, and
  :class:`DeepSpeedLossScaler`, its dynamic fp16 loss scale;
* :func:`fp8_all_reduce`: an all-reduce with FP8 on the wire and a shared
  scale.

Algorithms (``algorithm=``):

``"exact"``
    The exact result rounded once to ``fmt``: ``sum``, ``avg`` (the exact sum
    divided by the world size), ``premul_sum`` (the exact sum times
    ``factor``), ``product``, ``max`` and ``min`` (IEEE maximum / minimum: a
    NaN on any rank gives NaN; +0 is above -0).
``"gloo"``
    What ``torch.distributed`` with the gloo backend computes on CPU tensors
    (torch 2.13, gloo's ``allreduce.cc`` at commit 70dc360, read 2026-11-26),
    equal bit for bit to real gloo processes (``tests/test_collectives.py``
    and the recorded traces under ``tests/reference/``). ProcessGroupGloo
    leaves gloo's algorithm unspecified, which is the ring:

    - the buffer of ``n`` elements of ``b`` bytes is cut into ``S`` segments,
      ``S`` = the smallest multiple of the world size ``P`` that is at least
      ``max(ceil(n b / M), 2 P)``, with ``M`` = 1 MiB (gloo's
      ``kMaxSegmentSize``; ``max_segment_bytes=`` changes it), each of
      ``ceil(n b / S)`` bytes rounded up to whole elements; rank ``c`` owns
      chunk ``c``, segments ``c S/P .. (c + 1) S/P - 1``;
    - in the reduce-scatter phase rank ``c - 1`` sends its chunk-``c``
      segments to rank ``c - 2``, which adds its own values and sends on,
      around the ring down to rank ``c``; each hop computes
      ``own + received`` in float32 and rounds to the wire dtype (c10's
      ``BFloat16`` and gloo's ``float16`` ``operator+``, both to nearest even);
    - the all-gather phase copies the finished chunks around: every rank
      holds the same bits.

    So the ranks enter each element's sum in the order ``c - 1, c - 2, ...,
    c`` (mod ``P``) of its chunk ``c``, one rounding per hop. ``max`` and
    ``min`` are ``std::max(own, received)`` / ``std::min``, which keep
    ``own`` when either is NaN: a NaN that arrives from a neighbour is
    dropped (gloo's behaviour, reproduced, not endorsed). ``product``
    multiplies along the same ring, ``own * received`` in float32 rounded
    to the wire dtype at each hop. ``avg`` (torch 2.13's ProcessGroupGloo)
    is the ring's sum divided by the world size in the wire dtype (float32
    division, rounded once). Gloo has no ``premul_sum`` (torch raises
    "Cannot use ReduceOp.PREMUL_SUM with Gloo"). NaN bits (see
    docs/collectives.md): copies keep a NaN of the wire format; an fp32 sum
    or product gives x86's NaN (the own value's NaN, then the received one's,
    quieted; inf - inf the default 0xffc00000); a bf16 sum 0x7fc0; an fp16
    sum, product or average c10's 0x7e00 with the sign of x86's NaN.
    Wire formats: fp32, bf16 and fp16 (the float dtypes gloo reduces here).
    ``reduce_scatter_tensor`` on gloo returns the slices of this all-reduce
    (observed with torch 2.13), and :func:`reduce_scatter` does the same.

``"ring"``
    NCCL's ring all-reduce (``runRing`` in ``src/device/all_reduce.h`` of
    github.com/NVIDIA/nccl at commit 5067397, read 2026-11-26), modelled
    from the source: it cannot run here (no GPUs), and a step-by-step
    simulation written in the tests is its oracle. Each channel's part of
    the buffer is cut, loop by loop, into one chunk per ring position;
    chunk ``k`` is reduced along the ring from position ``k + 1`` to ``k``,
    each hop combining the rank's own value with the partial result it
    received, in the wire dtype: the exact sum rounded once (``__hadd`` on
    bf16 / fp16 since sm_80 / sm_53, binary32 addition for fp32); for the
    FP8 types (e4m3fn, e5m2, sm_90) the sum of the values widened to fp16,
    rounded to fp16 and converted back saturating (``__NV_SATFINITE``);
    ``max`` / ``min`` as ``__hmax`` / ``fmaxf`` (a NaN gives the other
    operand). ``avg`` and ``premul_sum`` multiply each rank's values by the
    scalar in the wire dtype first, one rounding per product: for ``avg``
    the scalar is ``T(float(1 / world))`` (``src/enqueue.cc``), so bf16's
    1/3 is 0.333984375. Which channels and chunk sizes NCCL picks comes
    from its tuning on the machine: pass them as ``parts=[(count,
    chunk_count), ...]`` (NCCL's ``count{Lo,Mid,Hi}`` and
    ``chunkBytes{Lo,Mid,Hi}``: a TRACE line, printed with
    ``NCCL_DEBUG=TRACE`` only by an NCCL built with ``TRACE=1``; from the
    count, channels and protocol a release NCCL prints,
    :func:`nccl_channel_parts` computes them as NCCL does), and the ring's
    rank order as ``ring=``; the default is one channel and one loop.

``"tree"``
    NCCL's tree all-reduce (``runTreeUpDown``), modelled from the same
    source and checked the same way: up the tree each rank reduces its own
    (pre-multiplied) value with its children's partial results in
    ``tree.down`` order, one rounding per step, and the root's result comes
    back down as copies. The tree (:func:`nccl_tree`): within a node a chain
    in local-rank order; across nodes NCCL's double binary tree of the
    nodes (``ncclGetDtree``), hung on each node's first rank. Half of the
    channels run tree 0 and half tree 1 (mirrored, or shifted for an odd
    node count): ``parts=`` as for the ring, ``trees=`` which tree each part
    runs, ``gpus_per_node=`` (default 8). The real intra-node order comes
    from NCCL's topology search (``NCCL_DEBUG=INFO`` prints each channel's
    tree); the model takes local-rank order.

``"nvls"``
    NVLink SHARP, the reduction in the NVSwitch (``multimem.ld_reduce`` with
    ``.acc::f32`` for bf16 / fp16 in ``src/device/reduce_kernel.h``): every
    rank's value added with float32 accumulation, then rounded once to the
    wire dtype. The switch's order of the adds is not documented; the model
    adds in rank order (it only matters where a float32 partial sum
    rounds). ``sum`` only: NCCL never runs NVLS for avg or premul_sum.

Examples
--------
>>> import numpy as np
>>> from fpemu import collectives
>>> x = np.float32([2.0**-8 + 2.0**-10])         # 0.625 of bf16's ulp at 1
>>> xs = [x, x, np.float32([1.0])]
>>> collectives.all_reduce(xs, "bf16", algorithm="exact")[0].tolist()
[1.0078125]
>>> collectives.all_reduce(xs, "bf16", algorithm="gloo")[0].tolist()     # 1 + x, then + x
[1.015625]
"""

from __future__ import annotations

import collections
import functools
import math
import numbers
import os
from fractions import Fraction

import numpy as np

from . import _coll_kernels
from ._exact import to_float64_odd
from ._jit import run_kernel
from .checks import as_format, real_array
from .errors import (FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError,
                     FpemuValueError)

ALGORITHMS = ("exact", "gloo", "ring", "tree", "nvls")
OPS = ("sum", "avg", "max", "min", "premul_sum", "product")
#: the ops each algorithm has
ALGORITHM_OPS = {"exact": OPS, "gloo": ("sum", "avg", "product", "max", "min"),
                 "ring": ("sum", "avg", "max", "min", "premul_sum"),
                 "tree": ("sum", "avg", "max", "min", "premul_sum"), "nvls": ("sum",)}
#: wire formats of NCCL's ring and tree, with their element sizes in bytes
NCCL_FORMATS = {"fp32": 4, "bf16": 2, "fp16": 2, "e4m3fn": 1, "e5m2": 1}
#: NCCL's FP8 types: their arithmetic runs in fp16 and converts back saturating
NCCL_FP8 = ("e4m3fn", "e5m2")
#: wire formats of the gloo backend, with their element sizes in bytes
GLOO_FORMATS = {"fp32": 4, "bf16": 2, "fp16": 2}
#: gloo's AllreduceOptions::kMaxSegmentSize
GLOO_MAX_SEGMENT_BYTES = 1 << 20


# ------------------------------------------------------------------ arguments
def _ranks(xs, fmt, fname, cast=True):
    """(Format, float32 array ranks x elements, the ranks' common shape): the
    ranks' arrays checked and cast to ``fmt``. With ``cast=False`` a float32
    array whose first axis is the rank comes back as it is (a view, no copy:
    the gloo kernel casts each value as it reads it); other inputs are cast."""
    from .quantize import quantize
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
    low = _NAN_LOW_BITS.get(fmt.name)
    for r, a in enumerate(arrays):
        quantize(a, fmt, out=V[r])
        if low is not None and a.dtype == np.float32:
            # a NaN that is already one of the wire format's (its payload fits)
            # keeps its bits: a collective copies it, as torch.distributed does
            bits = a.reshape(-1).view(np.uint32)
            nan = ((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)) & \
                ((bits & np.uint32(low)) == 0)
            if nan.any():
                V[r].view(np.uint32)[nan] = bits[nan]
    return fmt, V, shapes[0]


#: the float32 bits below a wire format's payload: a float32 NaN whose bits
#: there are zero is a NaN of that format, widened exactly (bf16: the top 16
#: bits; fp16 as torch widens it: payload << 13)
_NAN_LOW_BITS = {"fp32": 0, "bf16": 0xFFFF, "fp16": 0x1FFF}


def _shared(out, world, shape=None):
    """One result per rank: views of the same read-only array (the ranks of
    these collectives end with the same bits; ``np.array(r)`` copies)."""
    out = out if shape is None else out.reshape(shape)
    out.setflags(write=False)
    return [out.view() for _ in range(world)]


def _algorithm(algorithm, op, fmt, fname):
    if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHMS:
        raise FpemuValueError(f"{fname}(): unknown algorithm {algorithm!r}; the algorithms "
                              f"are {', '.join(map(repr, ALGORITHMS))}")
    algorithm = algorithm.lower()
    if not isinstance(op, str) or op.lower() not in OPS:
        raise FpemuValueError(f"{fname}(): unknown op {op!r}; the ops are "
                              f"{', '.join(map(repr, OPS))}")
    op = op.lower()
    if op not in ALGORITHM_OPS[algorithm] and algorithm == "nvls":
        raise FpemuValueError(
            f"{fname}(): the NVLS model covers op='sum' only (NCCL runs NVLS for sum, min and "
            "max, and never for avg or premul_sum: ncclNvlsSupported in src/include/device.h; "
            "the switch's min / max are not modelled); use algorithm='ring' or 'tree'")
    if op not in ALGORITHM_OPS[algorithm] and algorithm == "gloo":
        raise FpemuValueError(
            f"{fname}(): gloo has no op {op!r} (torch raises 'Cannot use "
            f"ReduceOp.{op.upper()} with Gloo'); multiply the arrays by the factor and pass "
            "op='sum', or use algorithm='exact'")
    if op not in ALGORITHM_OPS[algorithm]:
        raise FpemuValueError(
            f"{fname}(): the NCCL {algorithm} model has no op {op!r} (ncclProd's order is not "
            "modelled); use algorithm='gloo' or 'exact'")
    if algorithm == "gloo" and fmt.name not in GLOO_FORMATS:
        raise FpemuValueError(f"{fname}(): gloo reduces {', '.join(GLOO_FORMATS)} tensors, "
                              f"not {fmt.name}; pick one of those, or algorithm='exact'")
    if algorithm in ("ring", "tree", "nvls") and fmt.name not in NCCL_FORMATS:
        raise FpemuValueError(f"{fname}(): the NCCL {algorithm} model covers "
                              f"{', '.join(NCCL_FORMATS)}, not {fmt.name}; pick one of those, "
                              "or algorithm='exact'")
    if algorithm == "nvls" and fmt.name in NCCL_FP8:
        raise FpemuValueError(f"{fname}(): NCCL runs NVLS for fp32, bf16 and fp16, not "
                              f"{fmt.name} (ncclNvlsSupported); use algorithm='ring' or 'tree'")
    return algorithm, op


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


def _segment_bytes(max_segment_bytes, fname):
    if max_segment_bytes is None:
        return GLOO_MAX_SEGMENT_BYTES
    if (isinstance(max_segment_bytes, bool) or not isinstance(max_segment_bytes, numbers.Integral)
            or max_segment_bytes < 1):
        raise FpemuValueError(f"{fname}(): max_segment_bytes must be an int >= 1 (gloo's "
                              f"default is {GLOO_MAX_SEGMENT_BYTES}), got {max_segment_bytes!r}")
    return int(max_segment_bytes)


def _count(value, what, fname, least):
    """An int argument of the layout helpers, at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise FpemuValueError(f"{fname}(): {what} must be an int >= {least}, got {value!r}")
    return int(value)


# ----------------------------------------------------------------- gloo ring
def gloo_ring_chunks(n, world, element_bytes, max_segment_bytes=GLOO_MAX_SEGMENT_BYTES):
    """The element boundaries of gloo's ring chunks: ``bounds[c]:bounds[c + 1]``
    is the part of an ``n``-element buffer that rank ``c`` finishes (see the
    module note)."""
    fname = "gloo_ring_chunks"
    n, world = _count(n, "n", fname, 0), _count(world, "world (the number of ranks)", fname, 1)
    element_bytes = _count(element_bytes, "element_bytes", fname, 1)
    max_segment_bytes = _count(max_segment_bytes, "max_segment_bytes", fname, 1)
    total = n * element_bytes
    seg_max = element_bytes * max(1, max_segment_bytes // element_bytes)
    segments = max(-(-total // seg_max), 2 * world)
    segments = -(-segments // world) * world
    seg_bytes = -(-total // segments)
    seg_elems = -(-seg_bytes // element_bytes)
    per_rank = segments // world
    return np.minimum(np.arange(world + 1, dtype=np.int64) * per_rank * seg_elems, n)


def _fold(V, fmt, op, lo, hi, start, step, order, x86=False):
    """Runs ``lo[j]:hi[j]`` of the ranks' arrays folded along a ring (see
    :func:`fpemu._coll_kernels.ring_fold`), each hop rounded to ``fmt``
    (fp32, bf16 or fp16); ``x86``: fp32 and fp16 NaNs as gloo on an x86 CPU gives them."""
    from .quantize import Cast
    out = np.empty(V.shape[1], np.float32)
    code = {"sum": _coll_kernels.SUM, "prod": _coll_kernels.PROD, "max": _coll_kernels.MAX,
            "min": _coll_kernels.MIN,
            "number_max": _coll_kernels.NUMBER_MAX,
            "number_min": _coll_kernels.NUMBER_MIN}[op]
    kind = {"fp32": _coll_kernels.AS_IS_X86 if x86 else _coll_kernels.AS_IS,
            "fp16": _coll_kernels.RNE_IEEE_X86 if x86 else _coll_kernels.RNE_IEEE,
            "bf16": _coll_kernels.RNE_BF16}.get(fmt.name, _coll_kernels.RNE_IEEE)
    args = Cast.of(fmt).fast if kind in (_coll_kernels.RNE_IEEE,
                                         _coll_kernels.RNE_IEEE_X86) else (
        1, np.uint32(0), np.uint32(0), np.float32(0), np.uint32(0), np.uint32(0))
    as64 = [np.ascontiguousarray(a, np.int64) for a in (lo, hi, start, order)]
    run_kernel(_coll_kernels.ring_fold(code, kind), V, out, as64[0], as64[1], as64[2],
               np.int64(step), as64[3], *args, inputs=1)
    return out


def _gloo_all_reduce(V, fmt, op, max_segment_bytes):
    P, n = V.shape
    bounds = gloo_ring_chunks(n, P, GLOO_FORMATS[fmt.name], max_segment_bytes)
    ring_op = {"avg": "sum", "product": "prod"}.get(op, op)
    out = _fold(V, fmt, ring_op, bounds[:-1], bounds[1:], np.arange(P) - 1 + P, -1,
                np.arange(P), x86=True)
    if op == "avg":
        # ProcessGroupGloo's AVG: the ring's sum, then divided by the world size
        # in the tensor's dtype (float32 division, rounded once to bf16 / fp16;
        # in fp32 the division is the rounding, and a NaN keeps its bits)
        from .quantize import quantize
        with np.errstate(invalid="ignore", over="ignore"):
            out = out / np.float32(P)
            if fmt.name != "fp32":
                nan = np.isnan(out)
                sign = out.view(np.uint32) & np.uint32(0x80000000)
                out = quantize(out, fmt)
                if fmt.name == "fp16" and nan.any():
                    # c10's conversion keeps the sign of divss's NaN
                    out.view(np.uint32)[nan] = sign[nan] | np.uint32(0x7FC00000)
    return out


# ----------------------------------------------------------------- NCCL ring
def _ring_parts(n, parts, fname):
    if parts is None:
        return [(n, max(n, 1))]
    try:
        items = [(p[0], p[1]) for p in parts]
    except (TypeError, IndexError):
        raise FpemuValueError(f"{fname}(): parts must be a list of (count, chunk_count) pairs, "
                              f"as NCCL's count{{Lo,Mid,Hi}} and "
                              f"chunkBytes{{Lo,Mid,Hi}}; got {parts!r}") from None
    out = []
    for count, chunk in items:
        for v, what in ((count, "count"), (chunk, "chunk_count")):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < (
                    0 if what == "count" else 1):
                raise FpemuValueError(f"{fname}(): each part's {what} must be an int >= "
                                      f"{0 if what == 'count' else 1}, got {v!r} in {parts!r}")
        out.append((int(count), int(chunk)))
    if sum(c for c, _ in out) != n:
        raise FpemuValueError(f"{fname}(): the parts' counts add up to "
                              f"{sum(c for c, _ in out)}, the buffer has {n} elements; the "
                              "parts (one per channel) must cover it exactly")
    return out


def nccl_ring_chunks(n, world, element_bytes, parts=None):
    """For each of ``n`` elements, the ring position ``k`` of its chunk in
    NCCL's ring all-reduce (``runRing`` in ``src/device/all_reduce.h``): its
    reduction starts at position ``k + 1`` and ends at ``k``.

    ``parts``: the channels' shares of the buffer, in order, as
    ``(count, chunk_count)`` pairs (NCCL's ``count{Lo,Mid,Hi}`` and
    ``chunkBytes / element_bytes``); default one channel, one loop. Within a
    part, loops of ``world * chunk_count`` elements are cut into ``world``
    chunks; a last, shorter loop uses chunks of ``ceil(rest / world)``
    elements rounded up to 16 bytes."""
    fname = "nccl_ring_chunks"
    n, world = _count(n, "n", fname, 0), _count(world, "world (the number of ranks)", fname, 1)
    element_bytes = _count(element_bytes, "element_bytes", fname, 1)
    grain = max(1, 16 // element_bytes)
    k = np.empty(n, np.int64)
    start = 0
    for count, chunk in _ring_parts(n, parts, "nccl_ring_chunks"):
        o = np.arange(count, dtype=np.int64)
        loop = world * chunk
        full = (count // loop) * loop
        k[start:start + full] = (o[:full] % loop) // chunk
        rest = count - full
        if rest:
            last = -(-(-(-rest // world)) // grain) * grain
            k[start + full:start + count] = (o[full:] - full) // last
        start += count
    return k


#: NCCL's protocols: (default buffer bytes per channel and peer, grain bytes).
#: Simple: NCCL_BUFFSIZE 4 MiB, 512-byte grains; LL: 8 lines x 512 threads x
#: 8 steps of 16-byte lines; LL128: 120 words x 640 threads x 8 steps of 8
#: bytes, grains of 32 threads x 8 words x 15/16 data x 8 bytes (device.h)
NCCL_PROTOCOLS = {"simple": (1 << 22, 512), "ll": (8 * 512 * 8 * 16, 16),
                  "ll128": (120 * 640 * 8 * 8, 32 * 8 // 16 * 15 * 8)}
NCCL_STEPS = 8
#: the releases whose scheduler ``nccl_channel_parts`` follows, and the
#: minimal traffic per channel (``MinTrafficPerChannel``) of each
_NCCL_MIN_TRAFFIC = (((2, 26), 16 << 10), ((2, 29), 32 << 10))


class NcclSchedule(collections.namedtuple("NcclSchedule", "channels parts chunk_bytes")):
    """What NCCL's enqueue gives one all-reduce: ``channels`` (the channel
    of each part, ``channel{Lo..Hi}``), ``parts`` (``(count, chunk_count)``
    per channel, for ``all_reduce(parts=...)``) and ``chunk_bytes``
    (``chunkBytes{Lo,Mid,Hi}`` per part)."""

    __slots__ = ()

    def trees(self, search_channels):
        """Which tree each part runs (for ``all_reduce(trees=...)``): NCCL's
        channels ``0 .. S-1`` run tree 0 and ``S .. 2S-1`` its mirror, then
        repeat, where ``S`` is the number of channels the topology search
        found (``NCCL_DEBUG=INFO`` prints a ``Tree c : ...`` line for each of
        the ``2S``)."""
        s = _count(search_channels, "search_channels", "NcclSchedule.trees", 1)
        return [int(c % (2 * s) >= s) for c in self.channels]


def _nccl_version(version, fname):
    if isinstance(version, str):
        try:
            version = tuple(int(v) for v in version.split("."))
        except ValueError:
            version = None
    if (not isinstance(version, tuple) or len(version) < 2
            or not all(isinstance(v, numbers.Integral) for v in version)):
        raise FpemuValueError(f"{fname}(): version must be NCCL's release as '2.28' or a tuple "
                              "such as torch.cuda.nccl.version()'s (2, 28, 9); got "
                              f"{version!r}")
    major_minor = tuple(int(v) for v in version[:2])
    if major_minor < _NCCL_MIN_TRAFFIC[0][0]:
        raise FpemuValueError(
            f"{fname}(): NCCL {'.'.join(map(str, version))} schedules channels differently "
            "(before 2.26 the LL protocol's traffic was not weighted and before 2.23 the cells "
            "were 16 bytes); the model follows NCCL 2.26 to 2.30: pass parts= by hand for an "
            "older release")
    return [t for v, t in _NCCL_MIN_TRAFFIC if major_minor >= v][-1]


def _nccl_chunk_bytes(nbytes, protocol, algorithm, buffsize, nodes, per_node):
    """``calcCollChunking`` for one part of a ring or tree all-reduce on one
    channel (no tuner plugin)."""
    grain = NCCL_PROTOCOLS[protocol][1]
    step = buffsize // NCCL_STEPS
    chunk = step * (NCCL_STEPS // 2 if protocol == "simple" and algorithm == "ring" else 1)
    if protocol == "ll":
        chunk //= 2
    elif protocol == "ll128":
        chunk = chunk // 16 * 15
        if algorithm == "tree":
            f32 = np.float32
            ppn = f32(nodes * per_node) / f32(nodes)
            steps = f32(1 + (nodes.bit_length() - 1) + 0.1 * float(ppn))
            while f32(nbytes // chunk) < steps * f32(64) / ppn and chunk > 131072:
                chunk //= 2
            while f32(nbytes // chunk) < steps * f32(16) / ppn and chunk > 32768:
                chunk //= 2
    return chunk // grain * grain


def nccl_channel_parts(count, element_bytes, channels, protocol="simple", algorithm="ring", *,
                       comm_channels=None, version=(2, 30), buffsize=None, world=None,
                       gpus_per_node=None):
    """How NCCL spreads one all-reduce of ``count`` elements over its
    channels, as ``scheduleCollTasksToPlan`` and ``calcCollChunking`` in
    ``src/enqueue.cc`` (NCCL 2.26 to 2.30) compute it when the call is alone
    in its plan (one ``all_reduce``, not a group of them) and no tuner
    plugin changes the chunk size: the result's ``parts`` go to
    ``all_reduce(..., parts=)``.

    ``channels``: the channels NCCL's tuning gave the call (``nMaxChannels``;
    a release NCCL prints ``AllReduce: B Bytes -> Algo RING proto SIMPLE
    channel{Lo..Hi}={0..C-1}`` on rank 0 with ``NCCL_DEBUG=INFO
    NCCL_DEBUG_SUBSYS=TUNING``: for messages of a few MiB or more ``C`` is
    the value; for smaller ones fewer channels than tuned can be used, and
    the returned ``channels`` should equal the printed range).
    ``protocol``: ``"simple"``, ``"ll"`` or ``"ll128"`` (printed on the same
    line). ``comm_channels``: the communicator's channel count (default
    ``channels``). ``version``: NCCL's release, e.g.
    ``torch.cuda.nccl.version()``; 2.29 raised the minimal traffic per
    channel from 16 KiB to 32 KiB. ``buffsize``: the protocol's buffer
    (``NCCL_BUFFSIZE``, ``NCCL_LL_BUFFSIZE``, ``NCCL_LL128_BUFFSIZE``; default
    NCCL's). ``world`` and ``gpus_per_node``: needed for the tree with LL128
    only, whose chunk shrinks with the node count.

    The split: the traffic (2 x the bytes for an all-reduce, 8 x with LL, at
    least the minimal traffic) is shared out in cells of the minimal traffic;
    each channel takes the cells its share rounds up to, the last channel
    the rest, and the last part gives back the padding of the last cell.
    """
    fname = "nccl_channel_parts"
    count = _count(count, "count", fname, 0)
    element_bytes = _count(element_bytes, "element_bytes", fname, 1)
    channels = _count(channels, "channels", fname, 1)
    comm = channels if comm_channels is None else _count(comm_channels, "comm_channels", fname, 1)
    if protocol not in NCCL_PROTOCOLS:
        raise FpemuValueError(f"{fname}(): protocol must be one of {', '.join(NCCL_PROTOCOLS)} "
                              f"(NCCL_PROTO's names, lower case), got {protocol!r}")
    if algorithm not in ("ring", "tree"):
        raise FpemuValueError(f"{fname}(): algorithm must be 'ring' or 'tree' (NVLS and "
                              "CollNet share their work out differently), got {algorithm!r}")
    min_traffic = _nccl_version(version, fname)
    buff = NCCL_PROTOCOLS[protocol][0] if buffsize is None else \
        _count(buffsize, "buffsize", fname, NCCL_STEPS)
    nodes = per_node = None
    if algorithm == "tree" and protocol == "ll128":
        if world is None:
            raise FpemuValueError(f"{fname}(): the tree with LL128 sizes its chunks by the node "
                                  "count: pass world= (the ranks) and gpus_per_node=")
        world = _count(world, "world", fname, 1)
        per_node = _count(8 if gpus_per_node is None else gpus_per_node, "gpus_per_node",
                          fname, 1)
        if world % per_node:
            raise FpemuValueError(f"{fname}(): world={world} is not a whole number of nodes of "
                                  f"gpus_per_node={per_node}")
        nodes = world // per_node
    if count == 0:
        return NcclSchedule([], [], [])
    nc = min(channels, comm)
    per_byte = 2 * (4 if protocol == "ll" else 1)
    traffic_per_channel = -(-(max(min_traffic, count * element_bytes * per_byte) // nc) // 16) * 16
    cell = -(-(-(-min_traffic // per_byte)) // 16) * 16
    per_cell = cell // element_bytes
    cells = -(-(count * element_bytes) // cell)
    cell_traffic = cell * per_byte
    per_channel = min(cells, -(-traffic_per_channel // cell_traffic))
    lo = cells if comm == 1 else min(cells, -(-traffic_per_channel // cell_traffic))
    mid, hi = divmod(cells - lo, per_channel)
    if comm < (lo != 0) + mid + (hi != 0):         # more than the channels there are
        mid = comm - 2
        per_channel = (cells - lo) // (mid + 1)
        hi = per_channel + (cells - lo) % (mid + 1)
    if hi == 0 and mid:
        hi, mid = per_channel, mid - 1
    # (lo is at least one cell here: NCCL's "least channel skipped" branch
    # only meets a call that shares its plan with earlier ones)
    counts = [lo * per_cell] + [per_channel * per_cell] * mid + ([hi * per_cell] if hi else [])
    counts[-1] -= cells * per_cell - count          # the last cell's padding
    chunks = [_nccl_chunk_bytes(c * element_bytes, protocol, algorithm, buff, nodes, per_node)
              for c in counts]
    return NcclSchedule(list(range(len(counts))),
                        [(c, b // element_bytes) for c, b in zip(counts, chunks)], chunks)


def _nccl_ring_all_reduce(V, fmt, op, scale, parts, ring):
    P, n = V.shape
    k = nccl_ring_chunks(n, P, NCCL_FORMATS[fmt.name], parts)
    order = np.arange(P) if ring is None else np.asarray(ring, np.int64)
    W = _premultiplied(V, fmt, op, scale)
    if fmt.name not in NCCL_FP8:
        # one run per stretch of equal chunk index: the kernel (a hop of two
        # values of at most 11 bits rounded through float32, then to the wire,
        # is the exact sum rounded once: 24 >= 2 p + 2)
        cut = np.flatnonzero(np.diff(k)) + 1
        lo = np.concatenate([[0], cut]).astype(np.int64) if n else np.zeros(0, np.int64)
        hi = np.concatenate([cut, [n]]).astype(np.int64) if n else np.zeros(0, np.int64)
        fold_op = {"max": "number_max", "min": "number_min"}.get(op, "sum")
        return _fold(np.ascontiguousarray(W, np.float32), fmt, fold_op, lo, hi, k[lo] + 1 + P,
                     1, order)
    cols = np.arange(n)
    acc = None
    for h in range(P):
        own = W[order[(k + 1 + h) % P], cols]
        if acc is None:
            acc = own.copy()
        elif op in ("max", "min"):
            acc = _number_max(own, acc) if op == "max" else _number_min(own, acc)
        else:       # own + received, the exact sum (float64 holds it) to the wire
            with np.errstate(invalid="ignore"):
                acc = _to_wire(own.astype(np.float64) + acc, fmt)
    return acc


def _premultiplied(V, fmt, op, scale):
    """The ranks' contributions: NCCL multiplies each by the scalar of avg /
    premul_sum in the wire dtype, the product rounded once (``__hmul``,
    binary32 multiply); avg's scalar is T(float(1.0 / nRanks))
    (src/enqueue.cc)."""
    from .quantize import quantize
    if op not in ("avg", "premul_sum"):
        return V
    s = np.float32(1.0 / V.shape[0]) if op == "avg" else np.float64(float(scale))
    kw = {"overflow": "saturate"} if fmt.name in NCCL_FP8 else {}
    s = np.float64(quantize(np.float64(s), fmt, **kw))
    with np.errstate(invalid="ignore"):
        return _to_wire(V.astype(np.float64) * s, fmt).reshape(V.shape)


def _to_wire(exact, fmt):
    """An exact result (float64) as NCCL's arithmetic leaves it in the wire
    dtype: rounded once (bf16, fp16, fp32), or, for FP8, rounded to fp16
    (``__hadd`` / ``__hmul`` on the fp8 values widened to half) and then to the
    FP8 format, saturating (``__nv_fp8_e4m3(__half)`` converts with
    ``__NV_SATFINITE``: an overflow or an infinity becomes the largest
    finite value, NaN stays NaN)."""
    from .quantize import quantize
    if fmt.name in NCCL_FP8:
        return quantize(quantize(exact, "fp16"), fmt, overflow="saturate")
    return quantize(exact, fmt)


def _number_max(a, b):
    """IEEE 754-2019 maximumNumber (CUDA's __hmax / fmaxf): a NaN operand
    gives the other; +0 is above -0."""
    r = np.fmax(a, b)
    z = (a == 0) & (b == 0)
    r[z] = np.where(np.signbit(a[z]) & np.signbit(b[z]), np.float32(-0.0), np.float32(0.0))
    return r


def _number_min(a, b):
    r = np.fmin(a, b)
    z = (a == 0) & (b == 0)
    r[z] = np.where(np.signbit(a[z]) | np.signbit(b[z]), np.float32(-0.0), np.float32(0.0))
    return r


# ----------------------------------------------------------------- NCCL tree
def _btree(nranks, rank):
    """(parent, child 0, child 1) of ``rank`` in NCCL's binary tree over
    ``nranks`` (``ncclGetBtree``, src/graph/trees.cc; -1: none)."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if nranks > 1 else -1)
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    down0 = -1 if low == 0 else rank - low
    down1 = -1 if low == 0 else rank + low
    while down1 >= nranks:
        down1 = -1 if low == 0 else rank + low
        low >>= 1
    return up, down0, down1


def _dtree(nranks, rank, which):
    """Tree ``which`` (0 or 1) of NCCL's double binary tree (``ncclGetDtree``):
    tree 1 mirrors tree 0 for an even count, shifts it by one for an odd."""
    if which == 0:
        return _btree(nranks, rank)
    if nranks % 2:
        u, d0, d1 = _btree(nranks, (rank - 1 + nranks) % nranks)
        return tuple(-1 if v == -1 else (v + 1) % nranks for v in (u, d0, d1))
    u, d0, d1 = _btree(nranks, nranks - 1 - rank)
    return tuple(-1 if v == -1 else nranks - 1 - v for v in (u, d0, d1))


#: NCCL's tree patterns (``NCCL_TOPO_PATTERN_*``, src/include/graph.h): on which
#: of a node's first two GPUs (in tree order) the links to the child nodes of
#: the double binary tree attach; the link to the parent node is on the first
TREE_PATTERNS = {"tree": (0, 0), "balanced_tree": (1, 0), "split_tree": (1, 1)}


def nccl_tree(world, gpus_per_node, which=0, pattern="tree"):
    """The children of every rank (lists, in NCCL's ``tree.down`` order) in
    tree ``which`` of NCCL's all-reduce tree for ``world`` ranks on nodes of
    ``gpus_per_node``: within a node a chain in local-rank order (each rank's
    first child is the next local rank), across nodes the double binary tree
    of the nodes, whose links to a node's two child nodes follow the chain
    child on the GPU the ``pattern`` says (``ncclTopoPreset`` and
    ``connectTrees``, src/graph/connect.cc): ``"tree"`` both on the node's
    first GPU, ``"balanced_tree"`` the first child node on the second GPU and
    the second on the first, ``"split_tree"`` both on the second GPU. The
    link up to the parent node is always on the first GPU."""
    world = _count(world, "world (the number of ranks)", "nccl_tree", 1)
    gpus_per_node = _count(gpus_per_node, "gpus_per_node", "nccl_tree", 1)
    if which not in (0, 1):
        raise FpemuValueError(f"nccl_tree(): which must be 0 or 1 (NCCL's two trees), got "
                              f"{which!r}")
    if not isinstance(pattern, str) or pattern.lower() not in TREE_PATTERNS:
        raise FpemuValueError(f"nccl_tree(): pattern must be one of "
                              f"{', '.join(map(repr, TREE_PATTERNS))}, got {pattern!r}")
    at0, at1 = TREE_PATTERNS[pattern.lower()]
    if max(at0, at1) >= gpus_per_node:
        raise FpemuValueError(f"nccl_tree(): the {pattern!r} pattern puts child links on a "
                              f"node's second GPU; with gpus_per_node={gpus_per_node} use "
                              "'tree'")
    if world % gpus_per_node:
        raise FpemuValueError(f"nccl_tree(): the world ({world} ranks) must be a whole number of "
                              f"nodes of gpus_per_node={gpus_per_node}")
    nodes = world // gpus_per_node
    down = [[] for _ in range(world)]
    for r in range(world):
        if (r + 1) % gpus_per_node:
            down[r].append(r + 1)
    for node in range(nodes):
        _, d0, d1 = _dtree(nodes, node, which)
        for d, at in ((d0, at0), (d1, at1)):       # connectTrees: child 0, then child 1
            if d != -1:
                down[node * gpus_per_node + at].append(d * gpus_per_node)
    return down


def _tree_root(down):
    children = {c for ds in down for c in ds}
    return [r for r in range(len(down)) if r not in children][0]


def _nccl_tree_all_reduce(V, fmt, op, scale, parts, trees, gpus_per_node, pattern="tree"):
    """runTreeUpDown (src/device/all_reduce.h): up the tree every rank reduces
    its own value with what each child sent, in ``tree.down`` order, each
    step rounded; the root's result is broadcast down (copies)."""
    P, n = V.shape
    W = _premultiplied(V, fmt, op, scale)
    parts = _ring_parts(n, parts, "all_reduce")
    which = trees if trees is not None else [0 if i < -(-len(parts) // 2) else 1
                                             for i in range(len(parts))]
    out = np.empty(n, np.float32)
    start = 0
    for (count, _), t in zip(parts, which):
        down = nccl_tree(P, gpus_per_node, t, pattern)
        sl = slice(start, start + count)

        def up(r):
            acc = W[r, sl].copy()
            for child in down[r]:
                got = up(child)
                if op == "max":
                    acc = _number_max(acc, got)
                elif op == "min":
                    acc = _number_min(acc, got)
                else:
                    with np.errstate(invalid="ignore"):
                        acc = _to_wire(acc.astype(np.float64) + got, fmt)
            return acc
        out[sl] = up(_tree_root(down))
        start += count
    return out


# --------------------------------------------------------------------- exact
def _exact_product(V, fmt):
    """The exact product of the ranks' values, rounded once to ``fmt``
    (IEEE's signs: inf * 0 is NaN, a zero's sign the XOR of the signs)."""
    from .quantize import quantize
    out = np.empty(V.shape[1], np.float32)
    finite = np.isfinite(V).all(axis=0)
    S = V[:, ~finite].astype(np.float64)
    # a column with an inf or a NaN: only the finite factors' signs and zeros matter
    S = np.where(np.isfinite(S) & (S != 0), np.sign(S), S)
    with np.errstate(invalid="ignore"):
        out[~finite] = S.prod(axis=0).astype(np.float32)
    W = V[:, finite]
    odd = np.empty(W.shape[1], np.float64)
    for j in range(W.shape[1]):
        q = Fraction(1)
        for v in W[:, j]:
            q *= Fraction(float(v))
        odd[j] = to_float64_odd(q)
    zero = odd == 0
    odd[zero] = np.where(np.signbit(W[:, zero]).sum(axis=0) % 2 == 1, -0.0, 0.0)
    out[finite] = quantize(odd, fmt)
    return out


def _exact_all_reduce(V, fmt, op, scale):
    from .quantize import quantize
    if op == "product":
        return _exact_product(V, fmt)
    if op in ("max", "min"):
        with np.errstate(invalid="ignore"):
            r = (np.max if op == "max" else np.min)(V, axis=0)
        zero = r == 0
        if zero.any():          # +0 is above -0
            neg = np.signbit(V[:, zero])
            keep_neg = neg.all(axis=0) if op == "max" else neg.any(axis=0)
            r[zero] = np.where(keep_neg, np.float32(-0.0), np.float32(0.0))
        return r.astype(np.float32)
    finite = np.isfinite(V).all(axis=0)
    out = np.empty(V.shape[1], np.float32)
    if not finite.all():        # inf, -inf, NaN: IEEE's rules, the factor's sign
        with np.errstate(invalid="ignore", over="ignore"):
            special = V[:, ~finite].astype(np.float64).sum(axis=0) * float(scale)
        out[~finite] = special.astype(np.float32)
    W = V[:, finite]
    if scale == 1:
        from . import accumulate
        out[finite] = accumulate.sum(W, "fp32", fmt, axis=0, model="exact")
        return out
    # the exact sum as integers (every float32 is k * 2**-149, |k| < 2**277),
    # times the factor, rounded to odd in float64, then once to fmt
    to_int = np.frompyfunc(int, 1, 1)
    sums = to_int(W.astype(np.float64) * 2.0 ** 149).sum(axis=0) if W.size else W[0]
    num, den = scale.numerator, scale.denominator << 149
    odd = np.array([to_float64_odd(Fraction(int(s) * num, den)) for s in np.atleast_1d(sums)],
                   np.float64)
    zero = odd == 0
    if zero.any():              # an exact zero: -0 only when every term is -0 (and factor > 0)
        all_neg = np.signbit(W[:, zero]).all(axis=0) if W.shape[0] else np.zeros(0, bool)
        odd[zero] = np.where(all_neg == (scale > 0), -0.0, 0.0)
    out[finite] = quantize(odd, fmt)
    return out


# --------------------------------------------------------------------- public
def _reduce(xs, fmt, op, algorithm, factor, params, fname):
    fmt = as_format(fmt)
    algorithm, op = _algorithm(algorithm, op, fmt, fname)
    fmt, V, shape = _ranks(xs, fmt, fname, cast=algorithm != "gloo")
    scale = _factor(op, factor, V.shape[0], fname)
    owners = {"max_segment_bytes": ("gloo",), "parts": ("ring", "tree"), "ring": ("ring",),
              "trees": ("tree",), "gpus_per_node": ("tree",), "tree_pattern": ("tree",)}
    for name, value in params.items():
        if value is not None and algorithm not in owners[name]:
            raise FpemuValueError(f"{fname}(): {name}= is a parameter of algorithm="
                                  f"{' or '.join(map(repr, owners[name]))}, not {algorithm!r}")
    if algorithm == "gloo":
        out = _gloo_all_reduce(V, fmt, op, _segment_bytes(params["max_segment_bytes"], fname))
    elif algorithm == "ring":
        _ring_parts(V.shape[1], params["parts"], fname)
        ring = params["ring"]
        if ring is not None and sorted(np.asarray(ring).tolist()) != list(range(V.shape[0])):
            raise FpemuValueError(f"{fname}(): ring must be an order of the ranks 0 .. "
                                  f"{V.shape[0] - 1} (each once), got {ring!r}")
        out = _nccl_ring_all_reduce(V, fmt, op, scale, params["parts"], ring)
    elif algorithm == "nvls":
        # the switch adds every rank's value with float32 accumulation
        # (multimem.ld_reduce.add.acc::f32, src/device/reduce_kernel.h) and
        # rounds once to the wire dtype; the switch's order of the adds is
        # not documented: rank order
        acc = V[0].copy()
        with np.errstate(invalid="ignore", over="ignore"):
            for r in range(1, V.shape[0]):
                acc += V[r]
        from .quantize import quantize
        out = quantize(acc, fmt)
    elif algorithm == "tree":
        parts = _ring_parts(V.shape[1], params["parts"], fname)
        trees = params["trees"]
        if trees is not None and (len(trees) != len(parts)
                                  or any(t not in (0, 1) for t in trees)):
            raise FpemuValueError(f"{fname}(): trees must give 0 or 1 (NCCL's two trees) for "
                                  f"each of the {len(parts)} parts, got {trees!r}")
        gpn = params["gpus_per_node"]
        gpn = 8 if gpn is None and V.shape[0] % 8 == 0 else (V.shape[0] if gpn is None else gpn)
        if isinstance(gpn, bool) or not isinstance(gpn, numbers.Integral) or gpn < 1 or \
                V.shape[0] % gpn:
            raise FpemuValueError(f"{fname}(): gpus_per_node must divide the world size "
                                  f"{V.shape[0]}, got {gpn!r}")
        out = _nccl_tree_all_reduce(V, fmt, op, scale, params["parts"], trees, int(gpn),
                                    params["tree_pattern"] or "tree")
    else:
        out = _exact_all_reduce(V, fmt, op, scale)
    return out.reshape(shape), V.shape[0]


def all_reduce(xs, fmt, op="sum", algorithm="gloo", *, factor=None, max_segment_bytes=None,
               parts=None, ring=None, trees=None, gpus_per_node=None, tree_pattern=None):
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
    algorithm : {"gloo", "exact", "ring", "tree", "nvls"}
    factor : float
        ``premul_sum`` only: every rank's array is multiplied by it.
    max_segment_bytes : int
        gloo only: the largest segment of the ring (gloo's default 1 MiB).
    parts : list of (count, chunk_count)
        ``"ring"`` and ``"tree"``: the channels' shares of the buffer and their chunk
        sizes in elements (see :func:`nccl_ring_chunks`); default one
        channel, one loop.
    ring : sequence of int
        ``"ring"`` only: the ranks in ring order (default 0, 1, ...).
    trees : sequence of {0, 1}
        ``"tree"`` only: which of NCCL's two trees each part (channel) runs
        (default: the first half of the parts tree 0, the rest tree 1).
    gpus_per_node : int
        ``"tree"`` only: ranks per node (default 8 where the world is a
        multiple of 8, else one node).
    tree_pattern : {"tree", "balanced_tree", "split_tree"}
        ``"tree"`` only: where a node's links to its child nodes attach
        (:func:`nccl_tree`; default ``"tree"``). NCCL's topology search tries
        BALANCED_TREE first, then SPLIT_TREE, then TREE, and keeps the first
        that meets its bandwidth target; ``NCCL_DEBUG=INFO
        NCCL_DEBUG_SUBSYS=GRAPH`` prints the pattern it kept and each
        rank's ``Tree c : up -> rank -> down`` line.

    Returns
    -------
    list of numpy.ndarray
        One float32 array per rank, of the ranks' shape: read-only views of
        the same values (every rank ends with the same bits).
    """
    out, world = _reduce(xs, fmt, op, algorithm, factor,
                         dict(max_segment_bytes=max_segment_bytes, parts=parts, ring=ring,
                              trees=trees, gpus_per_node=gpus_per_node,
                              tree_pattern=tree_pattern), "all_reduce")
    return _shared(out, world)


def reduce_scatter(xs, fmt, op="sum", algorithm="gloo", *, factor=None, max_segment_bytes=None,
                   parts=None, ring=None, trees=None, gpus_per_node=None, tree_pattern=None):
    """Rank ``r``'s share of the reduction of ``xs``: slice ``r`` of ``world``
    equal slices along the first axis (``reduce_scatter_tensor``). The
    ranks' first axis must be a multiple of the world size."""
    first = np.shape(xs[0])[:1] if hasattr(xs, "__len__") and len(xs) else ()
    world = len(xs) if hasattr(xs, "__len__") else 0
    if world >= 2 and (not first or first[0] % world):
        raise FpemuValueError(
            f"reduce_scatter(): each rank's first axis must be a multiple of the world size "
            f"{world} (rank r gets slice r), got shape {np.shape(xs[0])}; pad the arrays, or "
            "flatten them and pad to a multiple")
    out, world = _reduce(xs, fmt, op, algorithm, factor,
                         dict(max_segment_bytes=max_segment_bytes, parts=parts, ring=ring,
                              trees=trees, gpus_per_node=gpus_per_node,
                              tree_pattern=tree_pattern), "reduce_scatter")
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
    from .quantize import quantize
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


# ---------------------------------------------------------------------- DDP
#: DDP's bucket sizes when bucket_cap_mb is not passed: the first bucket after
#: the rebuild, then every other (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
#: and 25 MiB)
DDP_FIRST_BUCKET_BYTES = 1 << 20
DDP_BUCKET_BYTES = 25 << 20
#: DDP's communication hooks of torch.distributed.algorithms.ddp_comm_hooks
#: (the wire format of the compression hooks; PowerSGD keeps float32)
DDP_HOOKS = {None: None, "fp16_compress": "fp16", "bf16_compress": "bf16", "powerSGD": None}


class PowerSGDState:
    """The state of torch's ``powerSGD_hook`` (Vogels, Karimireddy and Jaggi,
    "PowerSGD: Practical low-rank gradient compression for distributed
    optimization", NeurIPS 2019), as
    ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState``
    holds it (torch 2.13), for :func:`ddp_all_reduce` ``(hook="powerSGD",
    state=...)``. The arguments are torch's, with its defaults.

    Per bucket and iteration from ``start_powerSGD_iter`` on (before it, the
    bucket is divided by the world size and all-reduced): each rank adds its
    error from the previous iteration (``use_error_feedback``); each gradient
    of two or more dimensions, seen as a matrix M (its first dimension by the
    rest), is compressed where ``(n + m) * rank * min_compression_rate < n * m``;
    the others are concatenated, summed and divided by the world size. For
    the compressed ones: P = M Q (Q from the previous iteration,
    ``warm_start``, else random draws), P summed over the ranks and
    orthogonalized, Q = Mᵀ P summed and divided by the world size, and M
    replaced by P Qᵀ; each rank's new error is what it had less what it gets.
    Orthogonalization: Gram-Schmidt for ranks up to 2, else a QR
    factorization (LAPACK's, in NumPy). The first Q matrices are
    ``torch.randn`` draws after ``torch.manual_seed`` of a NumPy
    ``RandomState(random_seed)`` draw, as torch makes them: PyTorch makes them
    here too (it must be installed for that).

    The products, norms and factorizations are float32 in NumPy (its BLAS and
    LAPACK), not in the order of torch's MKL, so the result follows torch's
    within float32 rounding, not bit for bit; the all-reduces are
    :func:`all_reduce`'s (``algorithm=`` of :func:`ddp_all_reduce`)."""

    def __init__(self, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0):
        fname = "PowerSGDState"
        for name, v in (("matrix_approximation_rank", matrix_approximation_rank),
                        ("start_powerSGD_iter", start_powerSGD_iter),
                        ("random_seed", random_seed)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise FpemuValueError(f"{fname}(): {name} must be an int >= 0, got {v!r}")
        if matrix_approximation_rank < 1:
            raise FpemuValueError(f"{fname}(): matrix_approximation_rank must be >= 1, got "
                                  f"{matrix_approximation_rank}")
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise FpemuValueError(
                f"{fname}(): start_powerSGD_iter must be > 1 with use_error_feedback or "
                f"warm_start (torch's rule: PowerSGD starts after DDP's first two iterations, "
                f"which rebuild the buckets); got {start_powerSGD_iter}")
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.iter = 0
        self.error = {}          # bucket index -> (world, n) float32, each rank's error
        self.p_memory = {}
        self.q_memory = {}

    def _random_qs(self, shapes):
        """torch's first Q matrices: ``torch.randn`` of each shape in turn
        after ``torch.manual_seed(rng.randint(1_000_000_000))``, on the CPU."""
        seed = self.rng.randint(1_000_000_000)
        try:
            import torch
        except ImportError as err:
            raise ImportError(
                "PowerSGDState: the first Q matrices are torch.randn draws (torch.manual_seed of "
                "a NumPy RandomState draw); emulating them needs PyTorch: pip install torch"
            ) from err
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return [torch.randn(*s, dtype=torch.float32).numpy() for s in shapes]


def _orthogonalize(m, epsilon):
    """torch's ``_orthogonalize`` of one float32 matrix (n x rank), in place:
    Gram-Schmidt for rank <= 2, else the Q of a QR factorization."""
    rank = m.shape[1]
    if rank > 2:
        m[:] = np.linalg.qr(m)[0]
        return
    for i in range(rank):
        col = m[:, i:i + 1]
        norm = np.float32(np.sqrt(np.sum(col.astype(np.float64) ** 2)))
        with np.errstate(divide="ignore", invalid="ignore"):
            col /= norm + np.float32(epsilon) if epsilon else norm
        if not epsilon and norm == 0:
            col[:] = 0                                 # torch fills a zero column with 0
        if i + 1 < rank:
            rest = m[:, i + 1:]
            rest -= np.sum(col * rest, axis=0, keepdims=True, dtype=np.float32) * col


def _powersgd_bucket(state, index, flat, shapes, algorithm, params):
    """One bucket through ``powerSGD_hook``: ``flat`` (world, n) float32, the
    ranks' bucket buffers (gradients of ``shapes``, end to end). Returns the
    reduced buffer (the same on every rank)."""
    world = flat.shape[0]
    if state.iter < state.start_powerSGD_iter:           # default.allreduce_hook
        return all_reduce(_div_(flat, world, "fp32").reshape(world, -1), "fp32", "sum",
                          algorithm, **params)[0]
    flat = flat.astype(np.float32)
    if state.use_error_feedback:
        if index in state.error:
            flat = (flat + state.error[index]).astype(np.float32)
        else:
            state.error[index] = np.zeros_like(flat)
    local = flat.copy()
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    compress, plain = [], []
    for i, s in enumerate(shapes):
        n = s[0] if len(s) else 1
        m = int(np.prod(s)) // n if n else 0
        r = min(n, m, state.matrix_approximation_rank)
        (compress if (n + m) * r * state.min_compression_rate < n * m else plain).append(
            (i, n, m, r))
    # the uncompressed gradients: concatenated, summed, divided
    if plain:
        cat = np.concatenate([flat[:, offsets[i]:offsets[i + 1]] for i, *_ in plain], axis=1)
        avg = _div_(all_reduce(cat, "fp32", "sum", algorithm, **params)[0], world, "fp32")
        at = 0
        for i, *_ in plain:
            k = offsets[i + 1] - offsets[i]
            flat[:, offsets[i]:offsets[i + 1]] = avg[at:at + k]
            at += k
    # the compressed ones grouped by shape, in the order torch's dict of shapes takes them
    groups = {}
    for c in compress:
        groups.setdefault((c[1], c[2]), []).append(c)
    compress = [c for g in groups.values() for c in g]
    if compress:
        fresh = not state.warm_start or index not in state.q_memory
        if fresh:
            qs = state._random_qs([(1, m, r) for _, _, m, r in compress])
            qs = [q[0].astype(np.float32) for q in qs]
        else:
            qs = state.q_memory[index]
        for q in qs:
            _orthogonalize(q, state.orthogonalization_epsilon)
        mats = [flat[:, offsets[i]:offsets[i + 1]].reshape(world, n, m)
                for i, n, m, _ in compress]
        ps = np.concatenate([np.stack([mt[r] @ q for r in range(world)]).reshape(world, -1)
                             for mt, q in zip(mats, qs)], axis=1)
        p_sum = all_reduce(ps, "fp32", "sum", algorithm, **params)[0]
        p_list, at = [], 0
        for _, n, _, r in compress:
            p = np.array(p_sum[at:at + n * r], np.float32).reshape(n, r)
            _orthogonalize(p, state.orthogonalization_epsilon)
            p_list.append(p)
            at += n * r
        qs_local = np.concatenate([np.stack([mt[r].T @ p for r in range(world)]).reshape(world, -1)
                                   for mt, p in zip(mats, p_list)], axis=1)
        q_avg = _div_(all_reduce(qs_local, "fp32", "sum", algorithm, **params)[0], world,
                      "fp32")
        q_list, at = [], 0
        for (i, n, m, r), p in zip(compress, p_list):
            q = np.array(q_avg[at:at + m * r], np.float32).reshape(m, r)
            q_list.append(q)
            at += m * r
            flat[:, offsets[i]:offsets[i + 1]] = (p @ q.T).reshape(-1)
        state.q_memory[index] = [q.copy() for q in q_list]
    if state.use_error_feedback:
        state.error[index] = (local - flat).astype(np.float32)
    if not state.warm_start:
        state.q_memory.clear()
    return flat[0]


def ddp_buckets(sizes, element_bytes, iteration, ready_order=None,
                bucket_cap_bytes=DDP_BUCKET_BYTES, first_bucket_bytes=DDP_FIRST_BUCKET_BYTES):
    """DDP's buckets: lists of parameter indices, in bucket order.

    ``sizes``: the parameters' element counts, in registration order. The
    first iteration that all-reduces (``iteration=0``) puts every parameter
    in one bucket in registration order (torch 2.13 starts with one bucket
    where ``find_unused_parameters`` is off). From the next on, the buckets
    are rebuilt in the order the gradients became ready in that first
    backward (``ready_order``, default the reverse of registration, which is
    the order of a chain of layers): parameters join the current bucket until
    it holds at least ``first_bucket_bytes`` (the first bucket) or
    ``bucket_cap_bytes`` (the others)."""
    n = len(sizes)
    if iteration == 0:
        return [list(range(n))]
    order = list(range(n))[::-1] if ready_order is None else list(ready_order)
    if sorted(order) != list(range(n)):
        raise FpemuValueError(f"ddp_buckets(): ready_order must be an order of the parameters "
                              f"0 .. {n - 1} (each once), got {ready_order!r}")
    buckets, cur, size = [], [], 0
    for i in order:
        cur.append(i)
        size += int(sizes[i]) * element_bytes
        if size >= (first_bucket_bytes if not buckets else bucket_cap_bytes):
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


@_in_the_name_of("ddp_all_reduce")
def ddp_all_reduce(grads, fmt, algorithm="gloo", *, iteration=1, hook=None, ready_order=None,
                   bucket_cap_mb=None, state=None, **params):
    """The gradients every rank holds after DDP's backward: ``grads[r][i]`` is
    rank ``r``'s local gradient of parameter ``i`` (registration order), of
    the parameters' dtype ``fmt`` (fp32, bf16 or fp16).

    Without a hook, DDP multiplies each gradient by 1 / world as it copies it
    into its bucket (a float32 product, then the gradient's dtype) and sums
    each bucket with an all-reduce. With ``hook="fp16_compress"`` or
    ``"bf16_compress"`` (torch's ``default_hooks``) it casts the bucket to that
    dtype, divides by the world size there (float32 division, then that
    dtype), sums it in that dtype and casts back. With ``hook="powerSGD"``
    (float32 gradients) ``state`` is a :class:`PowerSGDState` that carries
    each rank's error and the Q matrices from one call (one backward) to the
    next. Buckets: :func:`ddp_buckets` (``iteration=0`` is the first
    all-reducing backward). ``bucket_cap_mb`` as DDP takes it: ``None`` (not
    passed) gives buckets of 25 MiB after a first one of 1 MiB; a number,
    even 25, makes every bucket that size, the first too. ``params`` go to
    the all-reduce (``algorithm`` and its parameters, see :func:`all_reduce`).

    Returns the reduced gradients, one float32 array per parameter.
    """
    from .quantize import quantize
    fname = "ddp_all_reduce"
    fmt = as_format(fmt)
    if fmt.name not in ("fp32", "bf16", "fp16"):
        raise FpemuValueError(f"{fname}(): DDP's gradients are fp32, bf16 or fp16 tensors, "
                              f"got {fmt.name}")
    if hook not in DDP_HOOKS:
        raise FpemuValueError(f"{fname}(): unknown hook {hook!r}; the hooks are "
                              f"{', '.join(map(repr, DDP_HOOKS))}")
    world, ranks, shapes = _rank_grads(grads, fname)
    if isinstance(iteration, bool) or not isinstance(iteration, numbers.Integral) or iteration < 0:
        raise FpemuValueError(f"{fname}(): iteration must be an int >= 0, got {iteration!r}")
    if bucket_cap_mb is None:           # DDP's default: 25 MiB after a first bucket of 1 MiB
        cap, first = DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES
    elif (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real)
          or not 0 < bucket_cap_mb < math.inf):
        raise FpemuValueError(f"{fname}(): bucket_cap_mb must be a number > 0 (or None, DDP's "
                              f"default), got {bucket_cap_mb!r}")
    else:                               # passed, even as 25: the first bucket too
        cap = first = int(bucket_cap_mb * (1 << 20))
    elem = fmt.bits // 8
    buckets = ddp_buckets([int(np.prod(s)) for s in shapes], elem, iteration, ready_order,
                          cap, first)
    if (hook == "powerSGD") != isinstance(state, PowerSGDState):
        raise FpemuValueError(
            f"{fname}(): hook='powerSGD' takes state=PowerSGDState(...) (and only it takes a "
            f"state); got hook={hook!r}, state={type(state).__name__}")
    if hook == "powerSGD" and fmt.name != "fp32":
        raise FpemuNotImplementedError(f"{fname}(): PowerSGD is modelled for float32 gradients, "
                                       f"got {fmt.name}")
    wire = DDP_HOOKS[hook]
    out = [None] * len(shapes)
    if hook == "powerSGD":
        for index, b in enumerate(buckets):
            flat = np.stack([np.concatenate([quantize(ranks[r][i].reshape(-1), fmt) for i in b])
                             for r in range(world)])
            _unflatten(_powersgd_bucket(state, index, flat, [shapes[i] for i in b], algorithm,
                                        params), b, shapes, out)
        state.iter += 1
        return out
    for b in buckets:
        flat = np.stack([np.concatenate([quantize(ranks[r][i].reshape(-1), fmt) for i in b])
                         for r in range(world)])
        if wire is None:
            inv = np.float64(np.float32(1.0 / world))
            flat = quantize(quantize(flat.astype(np.float64) * inv, "fp32"), fmt)
            summed = all_reduce(flat.reshape(world, -1), fmt, "sum", algorithm, **params)[0]
        else:
            c = quantize(flat, wire).astype(np.float64)
            c = _div_(c, world, wire)
            summed = quantize(all_reduce(c.reshape(world, -1), wire, "sum", algorithm,
                                         **params)[0], fmt)
        _unflatten(summed, b, shapes, out)
    return out


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
    from .quantize import quantize
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
    from .quantize import quantize
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
    from .quantize import quantize
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


# --------------------------------------------------------------------- ZeRO
#: the DeepSpeed configuration keys zero_reduce reads or accepts, by section
ZERO_KEYS = {
    "": ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
         "bf16", "fp16", "zero_optimization", "communication_data_type",
         "gradient_predivide_factor", "zero_allow_untested_optimizer", "optimizer",
         "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown"),
    "bf16": ("enabled",),
    "fp16": ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "min_loss_scale", "consecutive_hysteresis"),
    "zero_optimization": ("stage", "reduce_bucket_size", "reduce_scatter", "overlap_comm",
                          "contiguous_gradients", "allgather_bucket_size",
                          "allgather_partitions"),
}


class DeepSpeedLossScaler:
    """DeepSpeed's dynamic fp16 loss scale (``DynamicLossScaler`` of
    ``deepspeed/runtime/fp16/loss_scaler.py``, 0.19.8), from the ``fp16``
    section of a DeepSpeed JSON (:meth:`from_config`): the scale starts at
    2**``initial_scale_power``; an overflow skips the step and, once
    ``hysteresis`` overflows have used up the hysteresis, halves the scale
    (not below ``min_loss_scale``; an overflow at the minimum is an error, as
    in DeepSpeed); ``loss_scale_window`` clean steps after the last overflow
    double it and refill the hysteresis (``consecutive_hysteresis`` refills
    it after every clean step instead). Unlike torch's ``GradScaler``, whose
    scale halves at every overflow, the hysteresis lets an isolated overflow
    pass at the same scale.

    ``tests/data/deepspeed_loss_scaler.json`` holds DeepSpeed's own scales
    for fixed overflow patterns (``scripts/make_deepspeed_scaler_vectors.py``)
    and the tests replay them here."""

    def __init__(self, init_scale=2.0 ** 16, scale_window=1000, min_scale=1.0, delayed_shift=2,
                 consecutive_hysteresis=False):
        self.cur_scale = float(init_scale)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.cur_hysteresis = int(delayed_shift)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.cur_iter = 0
        self.last_overflow_iter = -1

    @classmethod
    def from_config(cls, config):
        """The scaler of a DeepSpeed JSON's ``fp16`` section (dict, JSON text
        or path), with DeepSpeed's defaults."""
        cfg = _zero_config(config, "DeepSpeedLossScaler.from_config")
        fp16 = cfg.get("fp16", {})
        if not fp16.get("enabled", False):
            raise FpemuValueError("DeepSpeedLossScaler.from_config(): the configuration's "
                                  "fp16.enabled is not true; DeepSpeed scales the loss for fp16 "
                                  "only")
        if fp16.get("loss_scale", 0) != 0:
            raise FpemuValueError(
                f"DeepSpeedLossScaler.from_config(): fp16.loss_scale is "
                f"{fp16['loss_scale']!r}, a static scale (DeepSpeed scales dynamically only "
                "with loss_scale 0, its default): multiply the loss by it yourself")
        return cls(2.0 ** fp16.get("initial_scale_power", 16), fp16.get("loss_scale_window", 1000),
                   fp16.get("min_loss_scale", 1), fp16.get("hysteresis", 2),
                   fp16.get("consecutive_hysteresis", False))

    def update_scale(self, overflow):
        """After a step: ``overflow`` says whether its gradients held an inf
        or a NaN (the step is then skipped)."""
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise FpemuRuntimeError(
                        f"DeepSpeedLossScaler: the loss scale is already at its minimum "
                        f"({self.min_scale:g}) and the gradients overflowed again; DeepSpeed "
                        "stops the run here ('Current loss scale already at minimum'). Lower "
                        "fp16.min_loss_scale, or find the overflow (fpemu.torch.monitor)")
                self.cur_scale = max(self.cur_scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= 2.0
        self.cur_iter += 1


def _zero_config(config, fname):
    import json
    if isinstance(config, str):
        text, where = config, "the configuration text"
        if not text.lstrip().startswith("{"):
            if not os.path.isfile(config):
                raise FpemuValueError(f"{fname}(): config is a DeepSpeed configuration: a dict, "
                                      f"JSON text or the path of a JSON file; {config!r} is "
                                      "none of these (no such file)")
            with open(config) as fh:
                text = fh.read()
            where = config
        try:
            config = json.loads(text)
        except ValueError as err:
            raise FpemuValueError(f"{fname}(): {where} is not valid JSON ({err}); pass a "
                                  "DeepSpeed configuration as a dict, JSON text or a JSON "
                                  "file") from None
    if not isinstance(config, dict):
        raise FpemuTypeError(f"{fname}(): config must be a DeepSpeed configuration (a dict, a "
                             f"JSON string or a path), got {type(config).__name__}")
    for section, keys in ZERO_KEYS.items():
        block = config if not section else config.get(section, {})
        if not isinstance(block, dict):
            raise FpemuValueError(f"{fname}(): the {section!r} section must be an object, got "
                                  f"{block!r}")
        for key in block:
            if key not in keys:
                where = f"in {section!r}" if section else "at the top level"
                raise FpemuValueError(f"{fname}(): unknown DeepSpeed key {key!r} {where}; the "
                                      f"keys read or accepted there are {', '.join(keys)}")
    return config


def _ready_order(n, ready_order, fname):
    """The order ZeRO's gradients become ready: ``ready_order`` checked, by
    default the reverse of registration (a chain of layers)."""
    order = list(range(n))[::-1] if ready_order is None else list(ready_order)
    if sorted(order) != list(range(n)):
        raise FpemuValueError(f"{fname}(): ready_order must be an order of the parameters "
                              f"0 .. {n - 1} (each once), got {ready_order!r}")
    return order


def _zero3_reduce(ranks, shapes, world, model, wire, zero, ready_order, algorithm, params, fname):
    """ZeRO stage 3 (DeepSpeed 0.19.8, ``stage3.py`` and
    ``runtime/comm/coalesced_collectives.py``): gradients join a bucket in the
    order they become ready until the next would pass ``reduce_bucket_size``
    elements; each bucket, sorted back into registration order, is cast to
    the wire dtype and reduce-scattered by ``reduce_scatter_coalesced``: rank
    c's part of the buffer holds chunk c (ceil(numel / world) elements,
    padded) of every gradient in turn, the whole buffer is divided by the
    world size in the wire dtype and summed; each rank's partition is then
    copied into the parameter's gradient partition of the model's dtype
    (``partition_grads``), rounding an fp32 sum to bf16 (or fp16) once."""
    from .quantize import quantize
    n = len(shapes)
    order = _ready_order(n, ready_order, fname)
    limit = int(zero.get("reduce_bucket_size", 500_000_000))
    buckets, cur, size = [], [], 0
    for i in order:
        k = int(np.prod(shapes[i]))
        if cur and size + k > limit:
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += k
    if cur:
        buckets.append(cur)
    out = [None] * n
    for b in buckets:
        b = sorted(b)
        chunks = [math.ceil(int(np.prod(shapes[i])) / world) for i in b]
        rows = []
        for gs in ranks:
            parts = []
            for c in range(world):
                for i, k in zip(b, chunks):
                    piece = quantize(gs[i].reshape(-1)[c * k:(c + 1) * k], model)
                    parts.append(np.pad(piece, (0, k - piece.size)))
            rows.append(np.concatenate(parts))
        flat = quantize(np.stack(rows), wire)
        with np.errstate(over="ignore", invalid="ignore"):
            flat = _div_(flat, world, wire)
        red = all_reduce(flat, wire, "sum", algorithm, **params)[0].reshape(world, -1)
        at = 0
        for i, k in zip(b, chunks):
            numel = int(np.prod(shapes[i]))
            whole = np.concatenate([red[c, at:at + k] for c in range(world)])[:numel]
            out[i] = quantize(whole, model).reshape(shapes[i])
            at += k
    return out


@_in_the_name_of("zero_reduce")
def zero_reduce(grads, config, algorithm="gloo", *, ready_order=None, **params):
    """The gradients every rank holds after DeepSpeed ZeRO's reduction, from
    each rank's local gradients (``grads[rank][parameter]``, registration
    order), configured by the DeepSpeed JSON the user writes (a dict, a JSON
    string or a path; unknown keys are an error).

    Modelled and checked bit for bit against DeepSpeed 0.19.8 on gloo (CPU
    accelerator): ``bf16.enabled`` with ``zero_optimization.stage`` 1, 2 or 3.
    Stages 1 and 2: the bf16 gradients are laid out in one buffer (stage 1:
    registration order; stage 2: the order they became ready, default the
    reverse, in buckets of ``reduce_bucket_size`` elements), divided by the
    world size in bf16 (a float32 division rounded to bf16), summed by an
    all-reduce in ``communication_data_type`` (bf16 by default, or fp32) and
    cast back to bf16. Stage 3: DeepSpeed's coalesced reduce-scatter
    (:func:`_zero3_reduce`), the same division, sum and cast.

    ``fp16.enabled`` runs the same code with fp16 in place of bf16, as
    DeepSpeed does (its reduction takes the model's dtype), but is modelled
    only: DeepSpeed's CPU accelerator refuses fp16 ("Type fp16 is not
    supported on your device"), so no run was recorded. The gradients are
    the loss-scaled ones; an fp16 sum that overflows gives inf, which
    :class:`DeepSpeedLossScaler` then sees. In stages 1 and 3 a
    ``gradient_predivide_factor`` other than 1 is refused: not modelled
    (stage 2 refuses that factor as DeepSpeed itself does).
    Returns one float32 array (of bf16 or fp16 values) per parameter.
    """
    from .quantize import quantize
    fname = "zero_reduce"
    cfg = _zero_config(config, fname)
    zero = cfg.get("zero_optimization", {})
    stage = zero.get("stage", 0)
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    fp16 = cfg.get("fp16", {}).get("enabled", False)
    if bf16 and fp16:
        raise FpemuValueError(f"{fname}(): bf16.enabled and fp16.enabled are both true; "
                              "DeepSpeed takes one of them")
    if not (bf16 or fp16):
        raise FpemuNotImplementedError(
            f"{fname}(): ZeRO's mixed precision is modelled (bf16.enabled or fp16.enabled); "
            "float32 ZeRO is not")
    model = "bf16" if bf16 else "fp16"
    if stage not in (1, 2, 3):
        raise FpemuValueError(f"{fname}(): zero_optimization.stage must be 1, 2 or 3 (ZeRO's "
                              f"stages; 0 is plain data parallelism: ddp_all_reduce), got "
                              f"{stage!r}")
    if stage == 3 and not zero.get("reduce_scatter", True):
        raise FpemuNotImplementedError(f"{fname}(): stage 3 with reduce_scatter false (its "
                                       "contiguous-buffer path) is not modelled")
    if cfg.get("gradient_predivide_factor", 1.0) != 1.0:
        if stage == 2 and zero.get("reduce_scatter", True):
            raise FpemuValueError(f"{fname}(): DeepSpeed refuses gradient_predivide_factor != "
                                  "1.0 with ZeRO stage 2's reduce-scatter (an assertion in "
                                  "stage_1_and_2.py); drop it, or set "
                                  "zero_optimization.reduce_scatter to false")
        raise FpemuNotImplementedError(f"{fname}(): gradient_predivide_factor other than 1.0 "
                                       f"is not modelled for stage {stage} (DeepSpeed's "
                                       "pre- and post-scaling there were not recorded)")
    comm = {None: model, "fp32": "fp32", "float32": "fp32"}
    if bf16:
        comm.update(bf16="bf16", bfp16="bf16")
    else:
        comm.update(fp16="fp16", float16="fp16")
    if cfg.get("communication_data_type") not in comm:
        raise FpemuValueError(f"{fname}(): communication_data_type must be {model} or fp32 for "
                              f"a {model} model, got {cfg.get('communication_data_type')!r}")
    wire = comm[cfg.get("communication_data_type")]
    world, ranks, shapes = _rank_grads(grads, fname, np.float32)
    n = len(shapes)
    if stage == 3:
        return _zero3_reduce(ranks, shapes, world, model, wire, zero, ready_order, algorithm,
                             params, fname)
    if stage == 1:
        order = list(range(n))
    else:
        order = _ready_order(n, ready_order, fname)
    limit = int(zero.get("reduce_bucket_size", 500_000_000))
    buckets, cur, size = [], [], 0
    for i in order:
        cur.append(i)
        size += int(np.prod(shapes[i]))
        if stage == 2 and size > limit:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    out = [None] * n
    for b in buckets:
        flat = np.stack([quantize(np.concatenate([gs[i].reshape(-1) for i in b]), model)
                         for gs in ranks])
        with np.errstate(over="ignore", invalid="ignore"):
            flat = _div_(flat, world, model)
        red = quantize(all_reduce(flat, wire, "sum", algorithm, **params)[0], model)
        _unflatten(red, b, shapes, out)
    return out
