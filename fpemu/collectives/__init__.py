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
    docs/collectives.md): copies keep a NaN of the wire format; max and min
    the finishing rank's own NaN, code for code; an fp32 sum or product
    gives x86's NaN (the own value's NaN, then the received one's, quieted;
    inf - inf the default 0xffc00000); a bf16 sum or product 0x7fc0; an
    fp16 sum, product or average c10's 0x7e00 with the sign of x86's NaN; a
    bf16 average ATen's 0xffff in its vector loop and 0x7fc0 in each
    thread's scalar rest (``threads=``, torch's threads in the processes).
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

Layout
------
``primitives.py`` (the four collectives and :func:`fp8_all_reduce`),
``algorithms.py`` (:data:`ALGORITHM_TABLE`: each algorithm's ops, wire
formats, parameters and run function, and the gloo and NCCL models behind
them), ``ddp.py``, ``fsdp.py``, ``zero.py`` (the gradient reducers of
DistributedDataParallel, FSDP and DeepSpeed ZeRO), ``_grads.py`` (what the
reducers share). Every public name is importable from ``fpemu.collectives``.
"""

from __future__ import annotations

from .algorithms import (  # noqa: F401  (_dtree: see below)
    ALGORITHM_OPS, ALGORITHM_TABLE, ALGORITHMS, GLOO_FORMATS, GLOO_MAX_SEGMENT_BYTES,
    NCCL_FORMATS, NCCL_FP8, NCCL_PROTOCOLS, NCCL_STEPS, OPS, TREE_PATTERNS, Algorithm,
    NcclSchedule, _dtree, gloo_ring_chunks, nccl_channel_parts, nccl_ring_chunks, nccl_tree,
)
from .ddp import (
    DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, DDP_HOOKS, PowerSGDState, ddp_all_reduce,
    ddp_buckets,
)
from .fsdp import fsdp1_reduce_scatter, fsdp_divide_factors, fsdp_reduce_scatter
from ._grads import _div_  # noqa: F401  (see below)
from .primitives import all_gather, all_reduce, broadcast, fp8_all_reduce, reduce_scatter
from .zero import ZERO_KEYS, DeepSpeedLossScaler, zero_config, zero_reduce

__all__ = ["ALGORITHMS", "OPS", "ALGORITHM_OPS", "ALGORITHM_TABLE", "Algorithm", "NCCL_FORMATS",
           "NCCL_FP8", "GLOO_FORMATS", "GLOO_MAX_SEGMENT_BYTES", "gloo_ring_chunks",
           "nccl_ring_chunks", "NCCL_PROTOCOLS", "NCCL_STEPS", "NcclSchedule",
           "nccl_channel_parts", "TREE_PATTERNS", "nccl_tree", "all_reduce", "reduce_scatter",
           "all_gather", "broadcast", "DDP_FIRST_BUCKET_BYTES", "DDP_BUCKET_BYTES",
           "DDP_HOOKS", "PowerSGDState", "ddp_buckets", "ddp_all_reduce",
           "fsdp_divide_factors", "fsdp_reduce_scatter", "fp8_all_reduce",
           "fsdp1_reduce_scatter", "ZERO_KEYS", "DeepSpeedLossScaler", "zero_reduce",
           "zero_config"]
# (_dtree and _div_ stay reachable for the tests that check NCCL's trees and
# torch's in-place division against independent simulations)
