"""Numba kernels of :mod:`fpemu.collectives`.

``ring_fold(op, kind)(V, out, lo, hi, start, step, order, ...)`` folds the ranks' arrays the way
gloo's ring all-reduce does (``gloo/allreduce.cc``, ``ring()``; the order is
derived in :mod:`fpemu.collectives`): chunk ``c`` of the buffer (elements
``bounds[c]:bounds[c + 1]``) starts as rank ``c - 1``'s values, then ranks
``c - 2, c - 3, ..., c`` (modulo the world size) each combine their own value
``a`` with the partial result ``b`` they received, ``reduce(a, b)``:

* sum: the float32 sum ``a + b`` (the processor's binary32 add, as gloo's
  ``float16`` and c10's ``BFloat16`` ``operator+`` compute it), rounded to
  the wire format to nearest even (``kind``: fp16 with the arguments of
  :func:`fpemu._kernels.quantize_rne_ieee`, bf16 on the bits, fp32 as it
  is);
* max: ``std::max(a, b)``, that is ``b if a < b else a``;
* min: ``std::min(a, b)``, that is ``b if b < a else a``.

A NaN compares false, so max and min keep whichever operand is ``a`` when
either is NaN: gloo's own rule, kept here.

Every rank's float32 value is first rounded to the wire format (the cast to
the tensor's dtype, to nearest even), in the same pass: the ranks' arrays
need no rounded copy. The chunks are independent (one task
each), and each hop runs in blocks of 16 elements, one vector each.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from ._jit import cache_unit, f32_from_ubits, f32_ubits, jit, pjit, lshr32
from ._kernels import SOURCES, LANES, _rne_ieee_one

# the kernels below inline fpemu._kernels' functions: their cache is valid only
# while those files are as they are (fpemu._jit.cache_unit)
cache_unit(__name__, SOURCES)

SUM, MAX, MIN, NUMBER_MAX, NUMBER_MIN, PROD = range(6)
#: how a value becomes a value of the wire format: unchanged but for a NaN's
#: payload (fp32), rounded by the IEEE-style fast path (fp16), or by bf16's
#: integer rounding
AS_IS, RNE_IEEE, RNE_BF16 = range(3)
#: fp32 as gloo computes it on an x86 CPU: a NaN keeps its bits, and an add or a
#: product that gives NaN gives what SSE's addss / mulss give: the first NaN
#: operand (own, then received), quieted; inf - inf and inf * 0 the default NaN
#: 0xffc00000 (measured against real gloo processes, tests/test_collectives.py)
AS_IS_X86 = 3
#: fp16 as gloo computes it on an x86 CPU (c10::Half's arithmetic: float32, then
#: c10's conversion): values rounded as RNE_IEEE; an add or a product that gives
#: NaN takes its sign from SSE's NaN (own, then received, else the default
#: NaN's, negative) and its payload from c10, which writes every NaN as 0x7e00
#: with the sign: float32 sign | 0x7fc00000. A NaN the rank holds enters as it
#: is when it is one of fp16's (its low 13 bits zero), so max / min pass its
#: bits on; another float32 NaN is cast as fpemu.quantize casts it
RNE_IEEE_X86 = 4


@jit
def _rne_bf16(v):
    """float32 -> bf16 to nearest even, on the bits: add 0x7fff plus the kept
    last bit and clear the low 16 (a carry into the exponent is the correct
    rounding up, also from the subnormals, whose grid is float32's bits; past
    the largest value it reaches infinity); NaN -> 0x7fc00000, as
    :func:`fpemu._kernels.quantize_rne_ieee` gives for bf16."""
    u = f32_ubits(v)
    r = np.uint32(np.uint32(u + np.uint32(0x7FFF) + (lshr32(u, np.uint32(16)) & np.uint32(1)))
                  & np.uint32(0xFFFF0000))
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return f32_from_ubits(np.uint32(0x7FC00000) if nan else r)


@functools.lru_cache(maxsize=None)
def ring_fold(op, kind):
    """The kernel that folds the rows of ``V`` (ranks x elements, float32)
    into ``out`` along a ring, for one op and one wire rounding (constants
    to the compiler, so each hop is one vector loop), called as
    ``kernel(V, out, lo, hi, start, step, order, shift, normal_bits,
    overflow_bits, magic, ovf_mag, ovf_sign)``: elements ``lo[j]:hi[j]`` (a
    run) are reduced by the ranks ``order[(start[j] + step * h) % P]`` for h =
    0 .. P - 1, the first one's value as it is, then each rank's own value
    combined with the partial result. gloo's ring: one run per chunk c,
    start c - 1, step -1; NCCL's: one run per chunk of a loop, start k + 1,
    step +1, its ring order. The runs are independent, one task each. The
    closure holds ints only (see :func:`fpemu._kernels.rounding_kernel`)."""
    op = int(op)
    kind = int(kind)

    @pjit
    def ring_fold_kernel(V, out, lo_, hi_, start, step, order, shift, normal_bits, overflow_bits,
                         magic, ovf_mag, ovf_sign):
        P = V.shape[0]
        half = np.uint32((1 << (shift - 1)) - 1)
        keep = ~np.uint32((1 << shift) - 1)
        one = np.uint32(1)
        sh = np.uint32(shift)
        for j in prange(lo_.size):
            lo = lo_[j]
            hi = hi_[j]
            nb = (hi - lo) // LANES
            first = V[order[start[j] % P]]
            for e in range(lo, hi):
                out[e] = _wire(first[e], kind, half, keep, one, sh, normal_bits, overflow_bits,
                               magic, ovf_mag, ovf_sign)
            for h in range(1, P):
                own = V[order[(start[j] + step * h) % P]]
                for b in range(nb):
                    i0 = lo + b * LANES
                    _hop(own[i0:i0 + LANES], out[i0:i0 + LANES], LANES, op, kind, half, keep,
                         one, sh, normal_bits, overflow_bits, magic, ovf_mag, ovf_sign)
                t0 = lo + nb * LANES
                _hop(own[t0:hi], out[t0:hi], hi - t0, op, kind, half, keep, one, sh,
                     normal_bits, overflow_bits, magic, ovf_mag, ovf_sign)

    return ring_fold_kernel


@functools.lru_cache(maxsize=None)
def tree_fold(op, kind):
    """The kernel that reduces the rows of ``V`` up a tree into ``out``,
    called as ``kernel(V, out, lo, hi, sched_lo, sched_hi, parent, child,
    root, shift, ...)`` (the wire arguments of :func:`ring_fold`; every
    array int64, one entry per part but ``parent`` and ``child``, one per
    pair of the schedules laid end to end): for the elements
    ``lo[j]:hi[j]`` (a part), every rank starts from its own value on the
    wire, then the pairs ``(parent[i], child[i])`` of part j's schedule
    (``sched_lo[j]:sched_hi[j]``, a post-order walk: a child's subtree is
    complete before its parent takes it) each set the parent's partial
    result to ``reduce(parent's, child's)``, rounded to the wire, and the
    root's is the part's result. Blocks of :data:`TREE_BLOCK` elements are
    independent, one task each; a block's partial results live in one
    (ranks x block) scratch array, each parent taking over the slot its
    child's result is written in."""
    op = int(op)
    kind = int(kind)

    @pjit
    def tree_fold_kernel(V, out, lo_, hi_, sched_lo, sched_hi, parent, child, root, shift,
                         normal_bits, overflow_bits, magic, ovf_mag, ovf_sign):
        P = V.shape[0]
        half = np.uint32((1 << (shift - 1)) - 1)
        keep = ~np.uint32((1 << shift) - 1)
        one = np.uint32(1)
        sh = np.uint32(shift)
        nblocks = np.zeros(lo_.size + 1, np.int64)
        for j in range(lo_.size):
            nblocks[j + 1] = nblocks[j] + (hi_[j] - lo_[j] + TREE_BLOCK - 1) // TREE_BLOCK
        for t in prange(nblocks[lo_.size]):
            j = 0
            while nblocks[j + 1] <= t:
                j += 1
            lo = lo_[j] + (t - nblocks[j]) * TREE_BLOCK
            hi = min(hi_[j], lo + TREE_BLOCK)
            m = hi - lo
            acc = np.empty((P, TREE_BLOCK), np.float32)
            slot = np.arange(P)
            for r in range(P):
                for e in range(m):
                    acc[r, e] = _wire(V[r, lo + e], kind, half, keep, one, sh, normal_bits,
                                      overflow_bits, magic, ovf_mag, ovf_sign)
            for i in range(sched_lo[j], sched_hi[j]):
                p = slot[parent[i]]
                c = slot[child[i]]
                _hop(acc[p], acc[c], m, op, kind, half, keep, one, sh, normal_bits,
                     overflow_bits, magic, ovf_mag, ovf_sign)
                slot[parent[i]] = c               # the parent's result is in the child's slot
            res = acc[slot[root[j]]]
            for e in range(m):
                out[lo + e] = res[e]

    return tree_fold_kernel


#: elements per task of :func:`tree_fold` (its scratch: ranks x block float32)
TREE_BLOCK = 1024
#: elements per task of :func:`column_sum`: each task reads every rank's
#: stretch of them, long enough for the processor's prefetcher to stream
COLUMN_BLOCK = 4096


@functools.lru_cache(maxsize=None)
def column_sum(kind):
    """The kernel that sums the rows of ``V`` in float32, in rank order,
    each value first put on the wire (NVLS's switch: float32 accumulation of
    the ranks' wire values), into ``out``, called as ``kernel(V, out, shift,
    ...)`` (the wire arguments of :func:`ring_fold`). Blocks of
    :data:`COLUMN_BLOCK` elements are independent, one task each."""
    kind = int(kind)

    @pjit
    def column_sum_kernel(V, out, shift, normal_bits, overflow_bits, magic, ovf_mag, ovf_sign):
        P, n = V.shape
        half = np.uint32((1 << (shift - 1)) - 1)
        keep = ~np.uint32((1 << shift) - 1)
        one = np.uint32(1)
        sh = np.uint32(shift)
        for t in prange((n + COLUMN_BLOCK - 1) // COLUMN_BLOCK):
            lo = t * COLUMN_BLOCK
            hi = min(n, lo + COLUMN_BLOCK)
            for e in range(lo, hi):
                out[e] = _wire(V[0, e], kind, half, keep, one, sh, normal_bits, overflow_bits,
                               magic, ovf_mag, ovf_sign)
            nb = (hi - lo) // LANES
            for r in range(1, P):
                row = V[r]
                for b in range(nb):                 # one vector each
                    i0 = lo + b * LANES
                    _add_wire(row[i0:i0 + LANES], out[i0:i0 + LANES], LANES, kind, half, keep,
                              one, sh, normal_bits, overflow_bits, magic, ovf_mag, ovf_sign)
                t0 = lo + nb * LANES
                _add_wire(row[t0:hi], out[t0:hi], hi - t0, kind, half, keep, one, sh,
                          normal_bits, overflow_bits, magic, ovf_mag, ovf_sign)

    return column_sum_kernel


@jit
def _add_wire(w, o, n, kind, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag,
              ovf_sign):
    """``o[j] += wire(w[j])`` in float32 on ``n`` elements."""
    for j in range(n):
        o[j] = np.float32(o[j] + _wire(w[j], kind, half, keep, one, sh, normal_bits,
                                       overflow_bits, magic, ovf_mag, ovf_sign))


@jit
def _wire(v, kind, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag, ovf_sign):
    """``v`` as a value of the wire format (see AS_IS, RNE_IEEE, RNE_BF16)."""
    if kind == RNE_BF16:
        return _rne_bf16(v)
    if kind == RNE_IEEE:
        return _rne_ieee_one(v, False, half, keep, one, sh, normal_bits, overflow_bits, magic,
                             ovf_mag, ovf_sign)
    if kind == AS_IS_X86:
        return v
    if kind == RNE_IEEE_X86:
        if v != v:
            u = f32_ubits(v)
            if u & np.uint32(0x1FFF) == np.uint32(0):        # one of fp16's NaNs
                return v
            return f32_from_ubits(np.uint32(0x7FC00000))      # as fpemu.quantize casts it
        return _rne_ieee_one(v, False, half, keep, one, sh, normal_bits, overflow_bits, magic,
                             ovf_mag, ovf_sign)
    # fp32: the value itself, a NaN as the canonical 0x7fc00000 (as fpemu.quantize
    # gives it; the processor's inf - inf is 0xffc00000)
    return f32_from_ubits(np.uint32(0x7FC00000)) if v != v else v


@jit
def _x86_nan(a, b):
    """The NaN SSE's addss / mulss return for ``a op b``: a's if a is NaN,
    else b's, quieted; else (inf - inf, inf * 0) the default NaN."""
    if a != a:
        return f32_from_ubits(np.uint32(f32_ubits(a) | np.uint32(0x00400000)))
    if b != b:
        return f32_from_ubits(np.uint32(f32_ubits(b) | np.uint32(0x00400000)))
    return f32_from_ubits(np.uint32(0xFFC00000))


@jit
def _c10_half_nan(v):
    """c10's float32 -> fp16 conversion of a NaN: 0x7e00 with its sign (as
    float32, sign | 0x7fc00000)."""
    return f32_from_ubits(np.uint32((f32_ubits(v) & np.uint32(0x80000000))
                                    | np.uint32(0x7FC00000)))


@jit
def _hop(w, o, n, op, kind, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag,
         ovf_sign):
    """One hop on ``n`` elements: ``o[j] = reduce(wire(w[j]), o[j])``."""
    for j in range(n):
        a = _wire(w[j], kind, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag,
                  ovf_sign)
        b = o[j]
        if kind == AS_IS_X86 and (op == SUM or op == PROD):
            s = np.float32(a + b) if op == SUM else np.float32(a * b)
            o[j] = _x86_nan(a, b) if s != s else s
        elif kind == RNE_IEEE_X86 and (op == SUM or op == PROD):
            s = np.float32(a + b) if op == SUM else np.float32(a * b)
            o[j] = _c10_half_nan(_x86_nan(a, b)) if s != s else _wire(
                s, kind, half, keep, one, sh, normal_bits, overflow_bits, magic, ovf_mag,
                ovf_sign)
        elif op == SUM:
            o[j] = _wire(np.float32(a + b), kind, half, keep, one, sh, normal_bits, overflow_bits,
                         magic, ovf_mag, ovf_sign)
        elif op == PROD:
            o[j] = _wire(np.float32(a * b), kind, half, keep, one, sh, normal_bits, overflow_bits,
                         magic, ovf_mag, ovf_sign)
        elif op == MAX:
            o[j] = b if a < b else a
        elif op == MIN:
            o[j] = b if b < a else a
        elif op == NUMBER_MAX:
            o[j] = _number_max(a, b)
        else:
            o[j] = _number_min(a, b)


@jit
def _number_max(a, b):
    """IEEE 754-2019 maximumNumber (CUDA's ``__hmax`` / ``fmaxf``): a NaN
    operand gives the other; +0 is above -0."""
    if a != a:
        return b
    if b != b:
        return a
    if a == b:
        return b if f32_ubits(a) > np.uint32(0x7FFFFFFF) else a     # a is -0: take b
    return a if a > b else b


@jit
def _number_min(a, b):
    """maximumNumber's counterpart: a NaN gives the other; -0 is below +0."""
    if a != a:
        return b
    if b != b:
        return a
    if a == b:
        return a if f32_ubits(a) > np.uint32(0x7FFFFFFF) else b     # a is -0: keep it
    return a if a < b else b
