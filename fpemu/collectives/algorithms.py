"""The all-reduce algorithms, as a table: :data:`ALGORITHM_TABLE` maps each
name to its ops, wire formats, parameters and run function (the text of
:mod:`fpemu.collectives` says what each computes). A new algorithm is one
:class:`Algorithm` entry and its run function."""

from __future__ import annotations

import collections
import dataclasses
import numbers
import textwrap

from fractions import Fraction
from typing import Callable, Mapping, NamedTuple

import numpy as np

from .. import _coll_kernels, accumulate
from .._exact import to_float64_odd
from .._jit import run_kernel

from ..errors import FpemuTypeError, FpemuValueError
from ..quantize import Cast, quantize


OPS = ("sum", "avg", "max", "min", "premul_sum", "product")
#: wire formats of NCCL's ring and tree, with their element sizes in bytes
NCCL_FORMATS = {"fp32": 4, "bf16": 2, "fp16": 2, "e4m3fn": 1, "e5m2": 1}
#: NCCL's FP8 types: their arithmetic runs in fp16 and converts back saturating
NCCL_FP8 = ("e4m3fn", "e5m2")
#: wire formats of the gloo backend, with their element sizes in bytes
GLOO_FORMATS = {"fp32": 4, "bf16": 2, "fp16": 2}
#: gloo's AllreduceOptions::kMaxSegmentSize
GLOO_MAX_SEGMENT_BYTES = 1 << 20


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


#: the float32 bits below a wire format's payload: a float32 NaN whose bits
#: there are zero is a NaN of that format, widened exactly (bf16: the top 16
#: bits; fp16 as torch widens it: payload << 13)
NAN_LOW_BITS = {"fp32": 0, "bf16": 0xFFFF, "fp16": 0x1FFF}


def keep_wire_nans(a, out, fmt):
    """Where the float32 array ``a`` holds a NaN that is already one of the
    wire format's (its payload fits), put its bits into ``out`` (``a`` cast
    to ``fmt``): a collective copies such a NaN, as torch.distributed does."""
    low = NAN_LOW_BITS.get(fmt.name)
    if low is None or a.dtype != np.float32:
        return out
    bits = a.reshape(-1).view(np.uint32)
    nan = ((bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)) & \
        ((bits & np.uint32(low)) == 0)
    if nan.any():
        out.reshape(-1).view(np.uint32)[nan] = bits[nan]
    return out


def _on_wire(V, fmt):
    """The ranks' float32 arrays (ranks x elements) cast to the wire format,
    as :mod:`fpemu.collectives` casts every rank's input, for the run
    functions that read float32 (``reads_float32``) but need the wire values
    themselves. Values already on the wire come back unchanged."""
    return keep_wire_nans(V, quantize(V, fmt), fmt)


_FOLD_OPS = {"sum": _coll_kernels.SUM, "prod": _coll_kernels.PROD, "max": _coll_kernels.MAX,
             "min": _coll_kernels.MIN, "number_max": _coll_kernels.NUMBER_MAX,
             "number_min": _coll_kernels.NUMBER_MIN}


def _wire_kind(fmt, x86=False):
    """(kind, wire arguments) of :mod:`fpemu._coll_kernels` for a wire
    format (fp32, bf16 or fp16); ``x86``: fp32 and fp16 NaNs as gloo on an
    x86 CPU gives them."""
    kind = {"fp32": _coll_kernels.AS_IS_X86 if x86 else _coll_kernels.AS_IS,
            "fp16": _coll_kernels.RNE_IEEE_X86 if x86 else _coll_kernels.RNE_IEEE,
            "bf16": _coll_kernels.RNE_BF16}.get(fmt.name, _coll_kernels.RNE_IEEE)
    args = Cast.of(fmt).fast if kind in (_coll_kernels.RNE_IEEE,
                                         _coll_kernels.RNE_IEEE_X86) else (
        1, np.uint32(0), np.uint32(0), np.float32(0), np.uint32(0), np.uint32(0))
    return kind, args


def _fold(V, fmt, op, lo, hi, start, step, order, x86=False):
    """Runs ``lo[j]:hi[j]`` of the ranks' arrays folded along a ring (see
    :func:`fpemu._coll_kernels.ring_fold`), each hop rounded to ``fmt``
    (fp32, bf16 or fp16); ``x86``: fp32 and fp16 NaNs as gloo on an x86 CPU gives them."""
    out = np.empty(V.shape[1], np.float32)
    kind, args = _wire_kind(fmt, x86)
    as64 = [np.ascontiguousarray(a, np.int64) for a in (lo, hi, start, order)]
    run_kernel(_coll_kernels.ring_fold(_FOLD_OPS[op], kind), V, out, as64[0], as64[1], as64[2],
               np.int64(step), as64[3], *args, inputs=1)
    return out


#: ATen's parallel_for grain (at::internal::GRAIN_SIZE): a TensorIterator
#: kernel over fewer elements runs on one thread
ATEN_GRAIN_SIZE = 32768
#: bf16 elements per step of ATen's vectorized CPU loop (two AVX2 vectors of
#: 16, ``vectorized_loop`` in aten/src/ATen/native/cpu/Loops.h), measured on
#: an AVX-512 CPU (torch 2.13 runs its division kernel at AVX2 there)
ATEN_BF16_STEP = 32


def aten_thread_ranges(n, threads, grain=ATEN_GRAIN_SIZE):
    """The ranges ``[(begin, end), ...]`` an elementwise ATen CPU kernel over
    ``n`` contiguous elements gives its threads: one range when ``n`` is
    below the grain or ``threads`` is 1, else ``t = min(threads,
    ceil(n / grain))`` ranges of ``ceil(n / t)`` elements (ATen's
    ``invoke_parallel`` in ATen/ParallelOpenMP.h)."""
    if n < grain or threads == 1:
        return [(0, n)]
    t = min(threads, -(-n // grain))
    chunk = -(-n // t)
    return [(b, min(n, b + chunk)) for b in range(0, n, chunk)]


def _threads(threads, fname):
    if threads is None:
        return 1
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise FpemuValueError(f"{fname}(): threads must be an int >= 1 (torch.get_num_threads() "
                              f"in the ranks' processes), got {threads!r}")
    return int(threads)


def _gloo_all_reduce(V, fmt, op, max_segment_bytes, threads=1):
    P, n = V.shape
    bounds = gloo_ring_chunks(n, P, GLOO_FORMATS[fmt.name], max_segment_bytes)
    ring_op = {"avg": "sum", "product": "prod"}.get(op, op)
    out = _fold(V, fmt, ring_op, bounds[:-1], bounds[1:], np.arange(P) - 1 + P, -1,
                np.arange(P), x86=True)
    if op in ("max", "min"):
        # std::max(own, received) is own when own is NaN and when received is:
        # the result is NaN exactly where the rank that finishes the chunk
        # (rank c for chunk c) holds a NaN, and it is that NaN as it entered
        # the wire, bits and all (the kernel writes bf16's as 0x7fc0)
        nan = np.flatnonzero(np.isnan(out))
        if nan.size:
            own = V[np.repeat(np.arange(P), np.diff(bounds))[nan], nan]
            out[nan] = keep_wire_nans(own, quantize(own, fmt), fmt)
    if op == "avg":
        # ProcessGroupGloo's AVG: the ring's sum, then ``tensor /= size``
        # (ProcessGroupGlooDetail.hpp), ATen's division in the tensor's
        # dtype: float32 division, rounded once to bf16 / fp16 (in fp32 the
        # division is the rounding, and a NaN keeps its bits)
        with np.errstate(invalid="ignore", over="ignore"):
            out = out / np.float32(P)
            if fmt.name != "fp32":
                nan = np.isnan(out)
                sign = out.view(np.uint32) & np.uint32(0x80000000)
                out = quantize(out, fmt)
                if fmt.name == "fp16" and nan.any():
                    # c10's conversion keeps the sign of divss's NaN
                    out.view(np.uint32)[nan] = sign[nan] | np.uint32(0x7FC00000)
                if fmt.name == "bf16" and nan.any():
                    # ATen's vector loop converts float32 -> bf16 writing a NaN
                    # as 0xffff (cvtfp32_bf16, AVX2 / AVX-512); the scalar rest
                    # of each thread's range goes through c10::BFloat16, 0x7fc0
                    vec = np.zeros(n, bool)
                    for b, e in aten_thread_ranges(n, threads):
                        vec[b:b + (e - b) // ATEN_BF16_STEP * ATEN_BF16_STEP] = True
                    out.view(np.uint32)[nan & vec] = np.uint32(0xFFFF0000)
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
    if fmt.name in NCCL_FP8 or op in ("avg", "premul_sum"):
        V = _on_wire(V, fmt)                    # the kernel below casts as it reads
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
    fp8 = fmt.name in NCCL_FP8
    if fp8 or op in ("avg", "premul_sum"):
        V = _on_wire(V, fmt)                    # the kernel below casts as it reads
    W = _premultiplied(V, fmt, op, scale)
    parts = _ring_parts(n, parts, "all_reduce")
    which = trees if trees is not None else [0 if i < -(-len(parts) // 2) else 1
                                             for i in range(len(parts))]
    if not fp8:
        return _tree_kernel(np.ascontiguousarray(W, np.float32), fmt, op, parts,
                            [nccl_tree(P, gpus_per_node, t, pattern) for t in which])
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


def _post_order(down, root):
    """The (parent, child) pairs of a tree in the order ``up`` above reduces
    them: each child's subtree first, a parent's children in ``down`` order."""
    pairs, stack = [], [(root, 0)]
    while stack:
        r, i = stack.pop()
        if i < len(down[r]):
            stack.append((r, i + 1))
            stack.append((down[r][i], 0))
            if i:
                pairs.append((r, down[r][i - 1]))
        elif down[r]:
            pairs.append((r, down[r][-1]))
    return pairs


def _tree_kernel(W, fmt, op, parts, downs):
    """The tree all-reduce of fp32 / bf16 / fp16 in one kernel
    (:func:`fpemu._coll_kernels.tree_fold`): the same reductions as ``up``
    in :func:`_nccl_tree_all_reduce` (a hop of two wire values in float32,
    rounded to the wire, is their exact sum rounded once)."""
    lo, hi, slo, shi, parent, child, root = [], [], [], [], [], [], []
    start = 0
    for (count, _), down in zip(parts, downs):
        r = _tree_root(down)
        pairs = _post_order(down, r)
        lo.append(start)
        hi.append(start + count)
        slo.append(len(parent))
        parent.extend(p for p, _ in pairs)
        child.extend(c for _, c in pairs)
        shi.append(len(parent))
        root.append(r)
        start += count
    kind, args = _wire_kind(fmt)
    out = np.empty(W.shape[1], np.float32)
    fold_op = {"max": "number_max", "min": "number_min"}.get(op, "sum")
    as64 = [np.asarray(a, np.int64) for a in (lo, hi, slo, shi, parent, child, root)]
    run_kernel(_coll_kernels.tree_fold(_FOLD_OPS[fold_op], kind), W, out, *as64, *args,
               inputs=1)
    return out


# --------------------------------------------------------------------- exact
def _exact_product(V, fmt):
    """The exact product of the ranks' values, rounded once to ``fmt``
    (IEEE's signs: inf * 0 is NaN, a zero's sign the XOR of the signs)."""
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


# ---------------------------------------------------------------- the table
def _run_gloo(V, fmt, op, scale, params, fname):
    return _gloo_all_reduce(V, fmt, op, _segment_bytes(params.get("max_segment_bytes"), fname),
                            _threads(params.get("threads"), fname))


def _run_ring(V, fmt, op, scale, params, fname):
    _ring_parts(V.shape[1], params.get("parts"), fname)
    ring = params.get("ring")
    if ring is not None and sorted(np.asarray(ring).tolist()) != list(range(V.shape[0])):
        raise FpemuValueError(f"{fname}(): ring must be an order of the ranks 0 .. "
                              f"{V.shape[0] - 1} (each once), got {ring!r}")
    return _nccl_ring_all_reduce(V, fmt, op, scale, params.get("parts"), ring)


def _run_nvls(V, fmt, op, scale, params, fname):
    # the switch adds every rank's value with float32 accumulation
    # (multimem.ld_reduce.add.acc::f32, src/device/reduce_kernel.h) and rounds
    # once to the wire dtype; the switch's order of the adds is not
    # documented: rank order
    kind, args = _wire_kind(fmt)
    acc = np.empty(V.shape[1], np.float32)
    run_kernel(_coll_kernels.column_sum(kind), V, acc, *args, inputs=1)
    return quantize(acc, fmt)


def _run_tree(V, fmt, op, scale, params, fname):
    parts = _ring_parts(V.shape[1], params.get("parts"), fname)
    trees = params.get("trees")
    if trees is not None and (len(trees) != len(parts) or any(t not in (0, 1) for t in trees)):
        raise FpemuValueError(f"{fname}(): trees must give 0 or 1 (NCCL's two trees) for "
                              f"each of the {len(parts)} parts, got {trees!r}")
    gpn = params.get("gpus_per_node")
    gpn = 8 if gpn is None and V.shape[0] % 8 == 0 else (V.shape[0] if gpn is None else gpn)
    if isinstance(gpn, bool) or not isinstance(gpn, numbers.Integral) or gpn < 1 or \
            V.shape[0] % gpn:
        raise FpemuValueError(f"{fname}(): gpus_per_node must divide the world size "
                              f"{V.shape[0]}, got {gpn!r}")
    return _nccl_tree_all_reduce(V, fmt, op, scale, params.get("parts"), trees, int(gpn),
                                 params.get("tree_pattern") or "tree")


def _run_exact(V, fmt, op, scale, params, fname):
    return _exact_all_reduce(V, fmt, op, scale)


_NCCL_OP = ("{fname}(): the NCCL {name} model has no op {op!r} (ncclProd's order is not "
            "modelled); use algorithm='gloo' or 'exact'")
_NCCL_FMT = ("{fname}(): the NCCL {name} model covers {formats}, not {fmt}; pick one of "
             "those, or algorithm='exact'")
_OP = "{fname}(): algorithm {name!r} has no op {op!r} (its ops: {ops}); use algorithm='exact'"
_FMT = ("{fname}(): algorithm {name!r} covers {formats}, not {fmt}; pick one of those, or "
        "algorithm='exact'")


class Param(NamedTuple):
    """An algorithm's keyword parameter as :func:`all_reduce`'s text
    documents it: its type and what it does (the text says which
    algorithms take it)."""

    type: str
    text: str


_PARTS = Param("list of (count, chunk_count)",
               "the channels' shares of the buffer and their chunk sizes in elements (see "
               ":func:`nccl_ring_chunks`); default one channel, one loop.")


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One all-reduce algorithm: its ``name``, the ``ops`` it has, its wire
    ``formats`` (None: any format within float32's range and precision),
    the keyword ``params`` it takes (name -> :class:`Param`: every
    collective that takes ``algorithm=`` passes them on, and
    :func:`all_reduce`'s text documents them), ``run(V, fmt, op, scale,
    params, fname)`` (V: float32, ranks x elements, already on the wire
    format, unless ``reads_float32``: then the run function casts each
    value as it reads it; ``scale``: the exact rational factor of avg /
    premul_sum; ``params``: a dict of the given parameters) returning the
    reduced float32 array, and the refusals (format strings of ``fname``,
    ``name``, ``op``, ``fmt``, ``formats``) for an op or a format it lacks;
    ``no_fp8`` refuses the FP8 wire formats."""

    name: str
    ops: tuple
    formats: object
    params: Mapping[str, Param]
    run: Callable
    op_refusal: str = _OP
    format_refusal: str = _FMT
    reads_float32: bool = False
    no_fp8: str = ""


#: Every all-reduce algorithm by name (the text of :mod:`fpemu.collectives`).
ALGORITHM_TABLE = {a.name: a for a in (
    Algorithm("exact", OPS, None, {}, _run_exact),
    Algorithm("gloo", ("sum", "avg", "product", "max", "min"), GLOO_FORMATS, {
        "max_segment_bytes": Param("int", "the largest segment of the ring, in bytes (gloo's "
                                          "default: 2**20)."),
        "threads": Param("int", "``torch.get_num_threads()`` in the ranks' processes (default "
                                "1, torchrun's ``OMP_NUM_THREADS=1``; a process started "
                                "otherwise has one per core). It splits ``avg``'s division "
                                "over threads, and with it the bits of a bf16 average's NaNs "
                                "(0xffff in ATen's vector loop, 0x7fc0 in each thread's scalar "
                                "rest); nothing else depends on it.")}, _run_gloo,
              op_refusal="{fname}(): gloo has no op {op!r} (torch raises 'Cannot use "
                         "ReduceOp.{OP} with Gloo'); multiply the arrays by the factor and "
                         "pass op='sum', or use algorithm='exact'",
              format_refusal="{fname}(): gloo reduces {formats} tensors, not {fmt}; pick one "
                             "of those, or algorithm='exact'",
              reads_float32=True),
    Algorithm("ring", ("sum", "avg", "max", "min", "premul_sum"), NCCL_FORMATS, {
        "parts": _PARTS,
        "ring": Param("sequence of int", "the ranks in ring order (default 0, 1, ...).")},
              _run_ring, _NCCL_OP, _NCCL_FMT, reads_float32=True),
    Algorithm("tree", ("sum", "avg", "max", "min", "premul_sum"), NCCL_FORMATS, {
        "parts": _PARTS,
        "trees": Param("sequence of {0, 1}", "which of NCCL's two trees each part (channel) "
                                             "runs (default: the first half of the parts tree "
                                             "0, the rest tree 1)."),
        "gpus_per_node": Param("int", "ranks per node (default 8 where the world is a "
                                      "multiple of 8, else one node)."),
        "tree_pattern": Param('{"tree", "balanced_tree", "split_tree"}',
                              "where a node's links to its child nodes attach (:func:`nccl_tree`; "
                              "default ``\"tree\"``). NCCL's topology search tries "
                              "BALANCED_TREE first, then SPLIT_TREE, then TREE, and keeps the "
                              "first that meets its bandwidth target; ``NCCL_DEBUG=INFO "
                              "NCCL_DEBUG_SUBSYS=GRAPH`` prints the pattern it kept and each "
                              "rank's ``Tree c : up -> rank -> down`` line.")},
              _run_tree, _NCCL_OP, _NCCL_FMT, reads_float32=True),
    Algorithm("nvls", ("sum",), NCCL_FORMATS, {}, _run_nvls, format_refusal=_NCCL_FMT,
              op_refusal="{fname}(): the NVLS model covers op='sum' only (NCCL runs NVLS for "
                         "sum, min and max, and never for avg or premul_sum: ncclNvlsSupported "
                         "in src/include/device.h; the switch's min / max are not modelled); "
                         "use algorithm='ring' or 'tree'",
              no_fp8="{fname}(): NCCL runs NVLS for fp32, bf16 and fp16, not {fmt} "
                     "(ncclNvlsSupported); use algorithm='ring' or 'tree'",
              reads_float32=True),
)}
ALGORITHMS = tuple(ALGORITHM_TABLE)
#: the ops each algorithm has
ALGORITHM_OPS = {a.name: a.ops for a in ALGORITHM_TABLE.values()}


def algorithm_of(algorithm, op, fmt, fname):
    """(the :class:`Algorithm`, the op) of these arguments, checked: a known
    algorithm and op, an op and a wire format the algorithm has."""
    if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHM_TABLE:
        raise FpemuValueError(f"{fname}(): unknown algorithm {algorithm!r}; the algorithms "
                              f"are {', '.join(map(repr, ALGORITHMS))}")
    alg = ALGORITHM_TABLE[algorithm.lower()]
    if not isinstance(op, str) or op.lower() not in OPS:
        raise FpemuValueError(f"{fname}(): unknown op {op!r}; the ops are "
                              f"{', '.join(map(repr, OPS))}")
    op = op.lower()
    words = dict(fname=fname, name=alg.name, op=op, OP=op.upper(), fmt=fmt.name,
                 formats=", ".join(alg.formats or ()), ops=", ".join(alg.ops))
    if op not in alg.ops:
        raise FpemuValueError(alg.op_refusal.format(**words))
    if alg.formats is not None and fmt.name not in alg.formats:
        raise FpemuValueError(alg.format_refusal.format(**words))
    if alg.no_fp8 and fmt.name in NCCL_FP8:
        raise FpemuValueError(alg.no_fp8.format(**words))
    return alg, op


def check_params(alg, params, fname):
    """Refuse a keyword no algorithm takes, and a parameter given (not None)
    for an algorithm that does not take it."""
    for name, value in params.items():
        owners = [a.name for a in ALGORITHM_TABLE.values() if name in a.params]
        if not owners:
            known = sorted({n for a in ALGORITHM_TABLE.values() for n in a.params})
            raise FpemuTypeError(f"{fname}(): unexpected keyword argument {name!r}: no "
                                 f"algorithm takes it; the algorithms' parameters are "
                                 f"{', '.join(known)}")
        if value is not None and name not in alg.params:
            raise FpemuValueError(f"{fname}(): {name}= is a parameter of algorithm="
                                  f"{' or '.join(map(repr, owners))}, not {alg.name!r}")


def document_params(doc):
    """``doc`` (a NumPy-style docstring) with ``{algorithms}`` replaced by
    the set of algorithm names and ``{params}`` by the Parameters entries of
    every algorithm's keyword parameters, from :data:`ALGORITHM_TABLE` (a
    new algorithm and its parameters need no edit of the functions that
    pass them on). None (``python -OO``) stays None."""
    if doc is None:
        return None
    owners = {}
    for a in ALGORITHM_TABLE.values():
        for name, param in a.params.items():
            owners.setdefault((name, param), []).append(f'``"{a.name}"``')
    entries = []
    for (name, param), names in owners.items():
        text = f"{' and '.join(names)} only: {param.text}"
        entries.append(f"    {name} : {param.type}\n"
                       + textwrap.fill(text, 76, initial_indent=" " * 8,
                                       subsequent_indent=" " * 8))
    algorithms = "{" + ", ".join(f'"{n}"' for n in ALGORITHM_TABLE) + "}"
    return doc.replace("{algorithms}", algorithms).replace("    {params}", "\n".join(entries))
