"""fpemu.collectives against real gloo processes and independent oracles.

* The committed traces (tests/reference/, scenarios ``collectives-gloo-*``)
  are replayed by tests/test_reference.py. Here three live gloo processes run
  an all-reduce of 3.3 M bf16 values (nine ring segments, more than a trace
  should hold) against the model, and a peer that dies makes the run fail
  with a message instead of hanging.
* gloo's ring is simulated message by message, as ``gloo/allreduce.cc``
  sends its segments (ml_dtypes / numpy do the rounding), against the
  closed-form order of the model, on many segment sizes.
* ``"exact"`` against exact rationals rounded by the test oracle.
"""

import json
import math
import os
import time
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fpemu
import fpemu.autograd as ft
from fpemu import _coll_kernels, collectives
from fpemu.autograd.distributed import EmulatedDDP, EmulatedFSDP, EmulatedZeRO
from fpemu.collectives.algorithms import ALGORITHM_TABLE, Algorithm, Param
from fpemu.quantize import quantize
from fpemu.reference import _gloo
from fpemu.reference.scenarios import SCENARIOS
from oracle import SPECS, TableOracle, round_to_ieee

try:
    import torch  # noqa: F401
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="runs torch.distributed (gloo)")

ROUND = {"bf16": lambda v: np.float32(v).astype(ml_dtypes.bfloat16).astype(np.float32),
         "fp16": lambda v: np.float32(v).astype(np.float16).astype(np.float32),
         "fp32": lambda v: np.float32(v)}
IEEE = {"bf16": (8, 7), "fp16": (5, 10), "fp32": (8, 23), "e4m3fn": (4, 3), "e5m2": (5, 2)}
FP8 = ("e4m3fn", "e5m2")


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _values(world, n, fmt, seed, specials=False):
    """Exact values of ``fmt``: integer significands times powers of two (for
    FP8, in its range), and NaN, inf (FP8: the largest value) and -0."""
    rng = np.random.default_rng(seed)
    p = IEEE[fmt][1] + 1
    lo, hi = {"e4m3fn": (-5, 5), "e5m2": (-8, 9)}.get(fmt, (-8, 9))
    m = rng.integers(-(2 ** p - 1), 2 ** p, size=(world, n)).astype(np.float64)
    x = np.ldexp(m, rng.integers(lo, hi, size=(world, n)) - p).astype(np.float32)
    if specials:
        big = {"e4m3fn": 448.0, "e5m2": 57344.0}.get(fmt, np.inf)
        x[0, 0], x[1, 1], x[-1, 2] = np.nan, big, -0.0
    return x


def _oracle_wire(q, fmt):
    """The wire value of an exact result ``q`` (a Fraction): rounded once; FP8
    as NCCL computes it, rounded to fp16 first, then to the FP8 format,
    saturating (the table oracle of tests/oracle.py)."""
    if fmt not in FP8:
        return np.float32(round_to_ieee(q, *IEEE[fmt]))
    return _fp8_of(round_to_ieee(q, 5, 10), fmt)


# ------------------------------------------------------------- gloo's ring
def _simulate_gloo_ring(xs, fmt, op, max_segment_bytes):
    """gloo's ring all-reduce, step by step: each rank's buffer, the segment
    offsets of ``computeReduceScatterOffsets`` / ``computeAllgatherOffsets``,
    sends read before receives reduce (a segment sent at iteration i was
    reduced at an earlier iteration: the pipeline does not change the data)."""
    P, n = len(xs), xs[0].size
    elem = 4 if fmt == "fp32" else 2
    total = n * elem
    max_seg = elem * max(1, max_segment_bytes // elem)
    num_seg = max((total + max_seg - 1) // max_seg, 2 * P)
    num_seg = ((num_seg + P - 1) // P) * P
    per_rank = num_seg // P
    seg_bytes = (total + num_seg - 1) // num_seg
    seg_bytes = ((seg_bytes + elem - 1) // elem) * elem
    seg = seg_bytes // elem
    buf = [np.array(x, np.float32) for x in xs]

    def reduce(a, b):
        if op == "sum":
            return ROUND[fmt](np.float32(a) + np.float32(b))
        if op == "max":
            return b if a < b else a
        return b if b < a else a

    def span(offset):
        lo = offset * seg
        return lo, min(lo + seg, n)

    for i in range(num_seg - per_rank):
        sent = []
        for r in range(P):
            k = ((r + 1) * per_rank + i) % num_seg
            lo, hi = span(k)
            sent.append((k, buf[r][lo:hi].copy()))
        for r in range(P):
            k, data = sent[(r + 1) % P]                     # from rank r + 1
            assert k == ((r + 2) * per_rank + i) % num_seg
            lo, hi = span(k)
            for j in range(hi - lo):
                buf[r][lo + j] = reduce(buf[r][lo + j], data[j])
    for i in range(num_seg - per_rank):
        sent = []
        for r in range(P):
            k = (r * per_rank + i) % num_seg
            lo, hi = span(k)
            sent.append((k, buf[r][lo:hi].copy()))
        for r in range(P):
            k, data = sent[(r + 1) % P]
            lo, hi = span(k)
            buf[r][lo:hi] = data
    return buf


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("world,n,seg", [(2, 1, 1 << 20), (3, 10, 1 << 20), (3, 50, 8),
                                         (4, 37, 6), (5, 101, 16), (8, 64, 2)])
def test_gloo_model_matches_a_step_by_step_simulation_of_the_ring(fmt, world, n, seg):
    for op in ("sum", "max", "min"):
        x = _values(world, n, fmt, seed=world * 1000 + n, specials=n >= 3)
        want = _simulate_gloo_ring(list(x), fmt, op, seg)
        got = collectives.all_reduce(list(x), fmt, op, "gloo", max_segment_bytes=seg)
        for r in range(world):
            np.testing.assert_array_equal(_bits(got[r]), _bits(want[r]), err_msg=f"{op} rank {r}")


def test_gloo_order_is_not_the_exact_sum_and_max_drops_a_neighbours_nan():
    x = np.float32([2.0 ** -8 + 2.0 ** -10])          # 0.625 ulp of bf16 at 1
    xs = [x, x, np.float32([1.0])]
    assert collectives.all_reduce(xs, "bf16")[0][0] == 1.015625          # (1 + x) + x
    assert collectives.all_reduce(xs, "bf16", algorithm="exact")[0][0] == 1.0078125
    # one element, chunk 0: rank 2 starts, rank 1 then rank 0 take max(own, received)
    nan = [np.float32([np.nan]), np.float32([1.0]), np.float32([2.0])]
    assert np.isnan(collectives.all_reduce(nan, "fp32", "max")[0][0])   # rank 0 keeps its own NaN
    nan_last = [np.float32([1.0]), np.float32([5.0]), np.float32([np.nan])]
    # rank 2's NaN starts the chain; rank 1 keeps its own 5 (5 < NaN is false)
    assert collectives.all_reduce(nan_last, "fp32", "max")[0][0] == 5.0
    assert np.isnan(collectives.all_reduce(nan_last, "fp32", "max", "exact")[0][0])


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_gloo_kernel_casts_float32_ranks_as_quantize_does(fmt):
    """A float32 array of ranks goes to the kernel uncast (it rounds each value
    as it reads it: bf16 on the bits, fp16 by the fast path); a list of
    float64 arrays is cast by fpemu.quantize first. Same bits, on every
    float32 pattern class: random bits (all exponents, subnormals, inf, NaN)."""
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2 ** 32, size=(3, 200_000), dtype=np.uint64).astype(np.uint32)
    bits[:, :8] = np.array([0x7F7FFFFF, 0x7F7F8000, 0x00007FFF, 0x00008000, 0x00018000,
                            0x7F800000, 0xFF800001, 0x80000000], np.uint32)
    raw = bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        wide = [r.astype(np.float64) for r in raw]

    def bits(v):                # fp32 keeps a float32 NaN's bits; float64 ones are cast
        return np.where(np.isnan(v), 0, _bits(v)) if fmt == "fp32" else _bits(v)
    for op in ("sum", "max", "min"):
        a = collectives.all_reduce(raw, fmt, op)[0]
        b = collectives.all_reduce(wide, fmt, op)[0]
        np.testing.assert_array_equal(bits(a), bits(b), err_msg=op)
        assert np.array_equal(np.isnan(a), np.isnan(b))
    gathered = collectives.all_gather(raw, fmt)[0][:200_000]
    np.testing.assert_array_equal(bits(gathered), bits(fpemu.quantize(raw[0], fmt)))
    if fmt == "fp32":                                          # a copy: every bit
        np.testing.assert_array_equal(_bits(gathered), raw[0].view(np.uint32))
        assert np.isnan(raw[0]).sum() > 100


# The live tests below run real gloo processes. Starting them takes seconds
# (each imports torch), so each world size starts once: _live(world) runs the
# inputs of every live test of that world, each in its own dtype and through
# its own collectives, in one start, and the tests read their parts. Under
# make test one pytest worker runs this file (conftest.py), so each world
# starts once.
_LIVE = {}
#: torch's threads in each live process (torch.set_num_threads): three, so
#: that a bf16 avg's division splits over threads on any machine
LIVE_THREADS = 3


def _live_cases(world):
    """{key: (sent array, torch dtype, collectives)} of every live test of ``world``."""
    cases = {}
    if world == 3:
        cases["many"] = (_many_segments_input(), "bfloat16",
                         ["all_reduce.sum", "reduce_scatter.sum"])
    for dtype, fmt, w in AVG_PRODUCT:
        if w == world:
            cases[f"avgprod-{fmt}"] = (_avg_product_input(fmt, w), dtype,
                                       ["all_reduce.avg", "all_reduce.product"])
    for dtype, fmt, w in NAN_BITS:
        if w == world:
            _, sent, which = _nan_case(fmt, w)
            cases[f"nan-{fmt}"] = (sent, dtype, which)
    for fmt, dtype in NAN_OPS_FORMATS:
        for n in NAN_OPS_SIZES:
            cases[f"nanops-{fmt}-{n}"] = (_nan_ops_input(fmt, world, n)[1], dtype, NAN_OPS)
    return cases


def _live(world):
    """What each rank of ``world`` real gloo processes holds after the
    collectives of :func:`_live_cases` (run once per world and process)."""
    if world not in _LIVE:
        cases = _live_cases(world)
        _LIVE[world] = _gloo.run({k: c[0] for k, c in cases.items()},
                                 {k: c[1] for k, c in cases.items()},
                                 {k: c[2] for k, c in cases.items()}, world, timeout=120,
                                 threads=LIVE_THREADS)
    return _LIVE[world]


def _many_segments_input():
    return _values(3, 3_300_000, "bf16", seed=5)      # 6.6 MB of bf16: 9 segments of the ring


@needs_torch
def test_live_gloo_all_reduce_of_many_segments_matches_bit_for_bit():
    x = _many_segments_input()
    got = _live(3)
    model = collectives.all_reduce(list(x), "bf16")
    scatter = collectives.reduce_scatter(list(x), "bf16")
    assert not np.array_equal(_bits(model[0]), _bits(collectives.all_reduce(
        list(x), "bf16", algorithm="exact")[0]))
    for r in range(3):
        np.testing.assert_array_equal(_bits(got["all_reduce.sum.many"][r]), _bits(model[r]))
        np.testing.assert_array_equal(_bits(got["reduce_scatter.sum.many"][r]),
                                      _bits(scatter[r]))


def test_gloo_run_refuses_inputs_without_a_dtype_or_collectives():
    x = {"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 4), np.float32)}
    with pytest.raises(ValueError, match=r"dtype_name names inputs \['a'\]; the inputs are "
                                         r"\['a', 'b'\]: give one entry for each"):
        _gloo.run(x, {"a": "float32"}, ["all_reduce.sum"], 2)
    with pytest.raises(ValueError, match=r"which names inputs \['a', 'b', 'c'\]"):
        _gloo.run(x, "float32", {"a": [], "b": [], "c": []}, 2)
    with pytest.raises(ValueError, match=r"unknown collectives \['all_reduce.mean'\]"):
        _gloo.run(x, "float32", {"a": ["all_reduce.mean"], "b": []}, 2)


@needs_torch
def test_a_peer_that_dies_fails_the_run_with_a_message():
    x = _values(2, 100, "bf16", seed=6)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="rank 1 of the 2 gloo processes exited with code 3"):
        _gloo.run({"x": x}, "bfloat16", ["all_reduce.sum"], 2, timeout=90, die_rank=1)
    # noticed when the rank exits, not at the run's timeout (start-up takes seconds)
    assert time.perf_counter() - t0 < 60


# --------------------------------------------------------------- NCCL ring
def _oracle_sum(a, b, fmt):
    """One NCCL hop from exact rationals: a + b to the wire (-0 only from -0 + -0)."""
    if not (np.isfinite(a) and np.isfinite(b)):
        return _oracle_special(np.float64(a) + np.float64(b), fmt)
    q = Fraction(float(a)) + Fraction(float(b))
    if q == 0:
        return np.float32(-0.0) if np.signbit(a) and np.signbit(b) else np.float32(0.0)
    return _oracle_wire(q, fmt)


def _oracle_special(v, fmt):
    """inf / NaN on the wire: FP8's saturating conversion turns inf into max."""
    if fmt in FP8 and np.isinf(v):
        return np.float32(np.copysign(float(TableOracle(SPECS[fmt]).max), v))
    return np.float32(v)


def _fp8_of(v, fmt):
    """``v`` (a number, or a Fraction) to the FP8 format, to nearest even,
    saturating (the table oracle); NaN stays NaN."""
    v = float(v)
    if math.isnan(v):
        return np.float32(np.nan)
    t = TableOracle(SPECS[fmt])
    code = int(t.round(np.array([v]), overflow="saturate")[0])
    mag = float(t.values[code & (t.sign_bit - 1)])
    return np.float32(-mag if code & t.sign_bit else mag)


def _premultiplied_oracle(xs, fmt, op, factor):
    """avg / premul_sum: each value times the scalar in the wire dtype."""
    if op not in ("avg", "premul_sum"):
        return xs
    q = Fraction(float(np.float32(1.0 / len(xs)))) if op == "avg" else Fraction(factor)
    s = float(_fp8_of(q, fmt)) if fmt in FP8 else float(_oracle_wire(q, fmt))
    out = []
    for x in xs:
        row = []
        for v in x:
            if not np.isfinite(v):
                row.append(_oracle_special(np.float64(v) * s, fmt))
            elif v == 0 or s == 0:
                row.append(np.float32(v * s))
            else:
                row.append(_oracle_wire(Fraction(float(v)) * Fraction(s), fmt))
        out.append(np.array(row, np.float32))
    return out


def _simulate_nccl_ring(xs, fmt, op, parts, ring, factor=None):
    """NCCL's runRing (src/device/all_reduce.h), step by step on every rank's
    buffer: per channel part and loop, ring position p sends its chunk p - 1,
    then receives, reduces (own value, after the pre-multiplication of avg /
    premul_sum, with what arrived) and sends on chunks p - 2, ..., and ends
    with chunk p; the all-gather steps copy. Every reduction is the exact
    result rounded once by the test oracle."""
    P, elem = len(xs), {"fp32": 4, "e4m3fn": 1, "e5m2": 1}.get(fmt, 2)
    xs = _premultiplied_oracle(xs, fmt, op, factor)

    def reduce(own, got):
        if op == "max":
            return got if np.isnan(own) or (got > own or (got == own == 0 and not np.signbit(got))
                                            and not np.isnan(got)) else own
        if op == "min":
            return got if np.isnan(own) or (got < own or (got == own == 0 and np.signbit(got))
                                            and not np.isnan(got)) else own
        return _oracle_sum(own, got, fmt)

    out = [np.array(x, np.float32) for x in xs]
    pos_rank = list(ring)
    start = 0
    for count, chunk in parts:
        loop_count = P * chunk
        off = 0
        while off < count:
            rem = count - off
            c = chunk if rem >= loop_count else -(-(-(-rem // P)) // max(1, 16 // elem)) * (
                max(1, 16 // elem))

            def span(k):
                lo = start + off + k * c
                return range(lo, min(lo + c, start + count))
            partial = {}
            for p in range(P):                          # step 0: send chunk p - 1
                partial[(p + 1) % P] = (p - 1) % P, [out[pos_rank[p]][i] for i in span((p - 1) % P)]
            for step in range(2, P + 1):                # receive, reduce, send on
                nxt = {}
                for p in range(P):
                    k, data = partial[p]
                    assert k == (p - step) % P
                    me = out[pos_rank[p]]
                    red = [reduce(me[i], d) for i, d in zip(span(k), data)]
                    if step == P:
                        for i, v in zip(span(k), red):
                            me[i] = v
                    else:
                        nxt[(p + 1) % P] = k, red
                partial = nxt
            for p in range(P):                          # all-gather: copies
                for k in range(P):
                    owner = out[pos_rank[k]]
                    for i in span(k):
                        out[pos_rank[p]][i] = owner[i]
            off += loop_count
        start += count
    return out


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "e4m3fn", "e5m2"])
@pytest.mark.parametrize("world,parts,ring", [
    (2, [(9, 9)], None), (3, [(40, 40)], [2, 0, 1]), (4, [(30, 4), (22, 8)], None),
    (5, [(64, 2)], [4, 3, 2, 1, 0]), (3, [(0, 1), (17, 16), (5, 1)], None)])
def test_nccl_ring_model_matches_a_step_by_step_simulation(fmt, world, parts, ring):
    n = sum(c for c, _ in parts)
    ring = list(range(world)) if ring is None else ring
    x = _values(world, n, fmt, seed=world * 77 + n, specials=n >= 3)
    for op, factor in (("sum", None), ("avg", None), ("premul_sum", 0.3), ("max", None),
                       ("min", None)):
        want = _simulate_nccl_ring(list(x), fmt, op, parts, ring, factor)
        got = collectives.all_reduce(list(x), fmt, op, "ring", parts=parts, ring=ring,
                                     factor=factor)
        for r in range(world):
            np.testing.assert_array_equal(_bits(got[r]), _bits(want[r]), err_msg=f"{op} rank {r}")


def test_nccl_ring_avg_premultiplies_by_a_rounded_reciprocal():
    """NCCL's bf16 AVG multiplies each rank's value by bf16(1/3) = 0.333984375
    before summing: 7 * 0.333984375 = 2.337890625 rounds to 2.34375, so three
    ranks of 7.0 average to 7.03125."""
    xs = [np.float32([7.0])] * 3
    assert collectives.all_reduce(xs, "bf16", "avg", "ring")[0][0] == 7.03125
    assert collectives.all_reduce(xs, "bf16", "avg", "exact")[0][0] == 7.0


# --------------------------------------------------------------- NCCL tree
def test_nccl_trees_are_the_pictures_in_trees_cc():
    """The trees drawn in the comments of NCCL's src/graph/trees.cc: the
    binary tree on 14 ranks, its mirror on 12 (even) and its shift on 13
    (odd), one rank per node; each rank's children in tree.down order."""
    t14 = collectives.nccl_tree(14, 1, 0)
    assert t14[0] == [8] and t14[8] == [4, 12] and t14[4] == [2, 6] and t14[12] == [10, 13]
    assert t14[2] == [1, 3] and t14[6] == [5, 7] and t14[10] == [9, 11]
    assert all(t14[r] == [] for r in (1, 3, 5, 7, 9, 11, 13))
    m12 = collectives.nccl_tree(12, 1, 1)
    assert m12[11] == [3] and m12[3] == [7, 1] and m12[7] == [9, 5] and m12[1] == [2, 0]
    assert m12[9] == [10, 8] and m12[5] == [6, 4]
    s13 = collectives.nccl_tree(13, 1, 1)
    assert s13[1] == [9] and s13[9] == [5, 0] and s13[5] == [3, 7] and s13[0] == [11]
    assert s13[11] == [10, 12] and s13[3] == [2, 4] and s13[7] == [6, 8]
    # two nodes of 4: chains 0-1-2-3 and 4-5-6-7; tree 0 hangs node 1 under rank 0
    assert collectives.nccl_tree(8, 4, 0) == [[1, 4], [2], [3], [], [5], [6], [7], []]
    assert collectives.nccl_tree(8, 4, 1) == [[1], [2], [3], [], [5, 0], [6], [7], []]


@pytest.mark.parametrize("world,gpn", [(8, 4), (12, 4), (16, 2), (40, 8)])
def test_nccl_tree_patterns_move_the_child_links_as_connect_cc_says(world, gpn):
    """ncclTopoPreset: the parent link on a node's first GPU; child 0's link on
    the second GPU unless the pattern is TREE, child 1's on the second GPU only
    for SPLIT_TREE. connectTrees adds child 0, then child 1, after the chain."""
    for which in (0, 1):
        base = collectives.nccl_tree(world, gpn, which, "tree")
        for pattern, (at0, at1) in (("balanced_tree", (1, 0)), ("split_tree", (1, 1))):
            want = [[c for c in d if c == r + 1 and (r + 1) % gpn] for r, d in enumerate(base)]
            for node in range(world // gpn):
                first = node * gpn
                # which child node is child 0 and which child 1 (a root has only
                # child 1): ncclGetDtree, whose trees the picture test checks
                _, d0, d1 = collectives._dtree(world // gpn, node, which)
                for d, at in ((d0, at0), (d1, at1)):
                    if d != -1:
                        assert d * gpn in base[first]
                        want[first + at].append(d * gpn)
            assert collectives.nccl_tree(world, gpn, which, pattern) == want, (pattern, which)
    with pytest.raises(fpemu.errors.FpemuValueError, match="use 'tree'"):
        collectives.nccl_tree(4, 1, 0, "balanced_tree")
    with pytest.raises(fpemu.errors.FpemuValueError, match="pattern must be one of"):
        collectives.nccl_tree(8, 4, 0, "ring")


def _simulate_nccl_tree(xs, fmt, op, down, factor=None):
    """Up the tree with messages: a rank sends once every child it waits for
    has sent; it reduces its own (pre-multiplied) value with the children's
    messages in tree.down order, each step rounded from exact rationals."""
    P = len(xs)
    xs = _premultiplied_oracle(xs, fmt, op, factor)

    def red(a, b):
        if op in ("max", "min"):
            if np.isnan(a):
                return b
            if np.isnan(b):
                return a
            if a == b == 0:
                neg = (np.signbit(a) and np.signbit(b)) if op == "max" else (
                    np.signbit(a) or np.signbit(b))
                return np.float32(-0.0) if neg else np.float32(0.0)
            return max(a, b) if op == "max" else min(a, b)
        return _oracle_sum(a, b, fmt)

    sent = {}
    while len(sent) < P:
        for r in range(P):
            if r not in sent and all(c in sent for c in down[r]):
                acc = list(xs[r])
                for c in down[r]:
                    acc = [red(a, b) for a, b in zip(acc, sent[c])]
                sent[r] = acc
    root = [r for r in range(P) if all(r not in d for d in down)][0]
    return np.array(sent[root], np.float32)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "e4m3fn", "e5m2"])
@pytest.mark.parametrize("world,gpn,which,pattern", [
    (2, 2, 0, "tree"), (5, 1, 1, "tree"), (6, 3, 0, "tree"), (6, 3, 1, "tree"),
    (8, 2, 1, "tree"), (12, 4, 0, "tree"), (12, 4, 0, "balanced_tree"),
    (12, 4, 1, "split_tree"), (8, 2, 1, "balanced_tree")])
def test_nccl_tree_model_matches_a_message_passing_simulation(fmt, world, gpn, which, pattern):
    x = _values(world, 23, fmt, seed=world * 31 + gpn, specials=True)
    down = collectives.nccl_tree(world, gpn, which, pattern)
    for op, factor in (("sum", None), ("avg", None), ("premul_sum", -1.7), ("max", None),
                       ("min", None)):
        want = _simulate_nccl_tree(list(x), fmt, op, down, factor)
        got = collectives.all_reduce(list(x), fmt, op, "tree", gpus_per_node=gpn,
                                     parts=[(23, 23)], trees=[which], factor=factor,
                                     tree_pattern=pattern)
        for r in range(world):
            np.testing.assert_array_equal(_bits(got[r]), _bits(want), err_msg=f"{op} rank {r}")


def test_the_tree_pattern_changes_the_multi_node_order():
    x = _values(12, 64, "bf16", seed=21)
    got = {p: collectives.all_reduce(list(x), "bf16", "sum", "tree", gpus_per_node=4,
                                     parts=[(64, 64)], trees=[0], tree_pattern=p)[0]
           for p in ("tree", "balanced_tree", "split_tree")}
    assert not np.array_equal(_bits(got["tree"]), _bits(got["balanced_tree"]))
    assert not np.array_equal(_bits(got["balanced_tree"]), _bits(got["split_tree"]))
    with pytest.raises(fpemu.errors.FpemuValueError, match="tree_pattern= is a parameter of "
                                                           "algorithm='tree'"):
        collectives.all_reduce(list(x), "bf16", tree_pattern="split_tree")


def test_nccl_tree_parts_run_their_own_tree():
    x = _values(4, 40, "bf16", seed=3)
    both = collectives.all_reduce(list(x), "bf16", "sum", "tree", gpus_per_node=1,
                                  parts=[(16, 16), (24, 24)])[0]
    t0 = collectives.all_reduce(list(x), "bf16", "sum", "tree", gpus_per_node=1,
                                parts=[(40, 40)], trees=[0])[0]
    t1 = collectives.all_reduce(list(x), "bf16", "sum", "tree", gpus_per_node=1,
                                parts=[(40, 40)], trees=[1])[0]
    np.testing.assert_array_equal(_bits(both), _bits(np.concatenate([t0[:16], t1[16:]])))
    assert not np.array_equal(_bits(t0), _bits(t1))


def _raw_float32(world, n, seed):
    """float32 arrays as the ranks hold them before the cast to the wire
    (full float32 precision, over 38 binades: fp16 subnormals to near its
    largest), with NaNs, infinities and
    zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((world, n)) * np.exp2(rng.integers(-26, 12, (world, n)))
         ).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, 40, replace=False)
    flat[idx[:10]] = np.nan
    flat[idx[10:20]] = np.inf
    flat[idx[20:30]] = -np.inf
    flat[idx[30:35]] = 0.0
    flat[idx[35:]] = -0.0
    return x


def _equal_bits_any_nan(got, want, what):
    """Bit for bit, but a NaN matches any NaN: the oracles' inf - inf is the
    processor's default NaN, the emulator's the canonical one (the NaN bits
    of an NCCL reduction are not modelled)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    ok = ~np.isnan(got)
    assert ok.sum() > 0.9 * ok.size
    np.testing.assert_array_equal(_bits(got)[ok], _bits(want)[ok], err_msg=what)


def _wire_cast(x, fmt):
    """The ranks' cast to the wire, by ml_dtypes / numpy (NaN: the quiet NaN
    the emulator gives it, whatever its payload)."""
    t = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}[fmt]
    with np.errstate(over="ignore", invalid="ignore"):
        w = x.astype(t).astype(np.float32)
    w[np.isnan(w)] = np.nan
    return w


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_ring_tree_and_nvls_read_float32_arrays_as_the_ranks_cast_them(fmt):
    """ring, tree and NVLS take a float32 array of the ranks (first axis the
    rank) as it is and put each value on the wire as their kernels read it:
    the same bits as the oracles on the values cast first, over several of
    the kernels' blocks (``_coll_kernels.TREE_BLOCK``, ``COLUMN_BLOCK``) and
    parts, with NaNs, infinities and signed zeros among the inputs."""
    world, n = 6, 2 * _coll_kernels.COLUMN_BLOCK + 37
    x = _raw_float32(world, n, seed=5)
    w = _wire_cast(x, fmt)
    # NVLS: float32 adds in rank order, one rounding to the wire at the end
    acc = w[0].copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(1, world):
            acc += w[r]
    want = _wire_cast(acc, fmt)
    got = collectives.all_reduce(x, fmt, "sum", "nvls")[0]
    _equal_bits_any_nan(got, want, "nvls")
    # tree, two parts on NCCL's two trees, against the message-passing oracle
    # on a slice per part (the oracle reduces element by element in Python)
    m = _coll_kernels.TREE_BLOCK + 19
    parts = [(n - m, n - m), (m, m)]
    got = collectives.all_reduce(x, fmt, "sum", "tree", gpus_per_node=3, parts=parts)[0]
    for (lo, hi), which in (((0, 300), 0), ((n - m - 150, n - m), 0), ((n - m, n), 1)):
        down = collectives.nccl_tree(world, 3, which)
        with np.errstate(invalid="ignore"):                         # inf - inf
            want = _simulate_nccl_tree(list(w[:, lo:hi]), fmt, "sum", down)
        _equal_bits_any_nan(got[lo:hi], want, f"tree {lo}:{hi}")
    # ring: as the same arrays cast first (each hop's oracle: the simulation above)
    parts = [(n, 40)]
    want = collectives.all_reduce(list(w), fmt, "max", "ring", parts=parts)[0]
    got = collectives.all_reduce(x, fmt, "max", "ring", parts=parts)[0]
    np.testing.assert_array_equal(_bits(got), _bits(want))
    k = 120
    with np.errstate(invalid="ignore"):
        want = _simulate_nccl_ring(list(w[:, :k]), fmt, "sum", [(k, 40)], list(range(world)))
    got = collectives.all_reduce(x[:, :k].copy(), fmt, "sum", "ring", parts=[(k, 40)])
    _equal_bits_any_nan(got[0], want[0], "ring")


# -------------------------------------------------------------------- NVLS
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_nvls_adds_in_float32_and_rounds_once(fmt):
    E, M = IEEE[fmt]
    x = _values(6, 50, fmt, seed=21, specials=True)
    x[:, 3] = [2.0 ** 15, 1.0, 2.0 ** -20, -2.0 ** 15, 0.0, 0.0]      # float32 drops 2**-20
    got = collectives.all_reduce(list(x), fmt, "sum", "nvls")
    for j in range(x.shape[1]):
        acc = float(x[0, j])
        for r in range(1, 6):
            acc = float(np.float32(acc + float(x[r, j])))   # binary32: one rounding per add
        if np.isfinite(acc) and acc != 0:
            acc = round_to_ieee(Fraction(acc), E, M)
        want = np.float32(acc)
        assert _bits(got[0][j]) == _bits(want) or (np.isnan(want) and np.isnan(got[0][j])), j
    assert got[0][3] == 1.0


# ---------------------------------------------------------------------- DDP
def test_ddp_buckets_follow_torch_rules():
    """The first all-reducing backward: one bucket, registration order; then
    the rebuilt buckets in gradient-ready order, closed once they reach 1 MiB
    (the first) or the cap (the others). The recorded DDP scenarios
    (tests/reference, ``ddp-gloo-*``) check the bits of the whole reduction."""
    sizes = [300_000, 300, 90_000, 90, 10]                  # float32: 1.2 MB, 360 kB, ...
    assert collectives.ddp_buckets(sizes, 4, 0) == [[0, 1, 2, 3, 4]]
    assert collectives.ddp_buckets(sizes, 4, 1) == [[4, 3, 2, 1, 0]]
    assert collectives.ddp_buckets(sizes, 4, 1, bucket_cap_bytes=1000,
                                   first_bucket_bytes=1000) == [[4, 3, 2], [1], [0]]
    assert collectives.ddp_buckets(sizes, 4, 1, ready_order=[0, 1, 2, 3, 4]) == [
        [0], [1, 2, 3, 4]]
    with pytest.raises(fpemu.errors.FpemuValueError, match="order of the parameters 0 .. 4"):
        collectives.ddp_buckets(sizes, 4, 1, ready_order=[0, 0, 1, 2, 3])


def test_ddp_all_reduce_divides_then_sums_and_refuses_bad_input():
    g = [[np.float32([3.0, 1.0])], [np.float32([3.0, 1.0])], [np.float32([3.0, 2.0])]]
    # each gradient times float32(1/3), then a gloo sum: 3 * fl(1/3) = 1.0000000298 -> 1.0
    out = collectives.ddp_all_reduce(g, "fp32")[0]
    third = np.float32(1 / 3)
    want = [np.float32(np.float32(np.float32(3 * third) + np.float32(3 * third))
                       + np.float32(3 * third))]
    assert out[0] == want[0]
    with pytest.raises(fpemu.errors.FpemuValueError, match="unknown hook 'powersgd'"):
        collectives.ddp_all_reduce(g, "fp32", hook="powersgd")
    with pytest.raises(fpemu.errors.FpemuValueError, match="rank 1's gradients have the shapes"):
        collectives.ddp_all_reduce([[np.ones(2)], [np.ones(3)]], "fp32")
    with pytest.raises(fpemu.errors.FpemuValueError, match="at least 2 ranks"):
        collectives.ddp_all_reduce([[np.ones(2)]], "fp32")
    with pytest.raises(fpemu.errors.FpemuValueError, match="fp32, bf16 or fp16 tensors"):
        collectives.ddp_all_reduce(g, "e4m3fn")


def _powersgd_oracle(grads, world, rank, iterations, start, seed=0):
    """PowerSGD (Vogels et al. 2019, Algorithm 1, with torch's choices: error
    feedback, warm start, gradients of one dimension or too small to pay
    averaged, Q's first draw torch.randn after torch.manual_seed of a NumPy
    RandomState draw) in float64, one bucket, written from the paper: the
    reduced gradients of each iteration."""
    rng = np.random.RandomState(seed)
    err, qs, out = None, None, []
    for it in range(iterations):
        g = [[np.asarray(x, np.float64) for x in grads[it][r]] for r in range(world)]
        if it < start:
            out.append([sum(g[r][i] / world for r in range(world)) for i in range(len(g[0]))])
            continue
        if err is None:
            err = [[np.zeros_like(x) for x in g[r]] for r in range(world)]
        m = [[g[r][i] + err[r][i] for i in range(len(g[r]))] for r in range(world)]
        res = [None] * len(m[0])
        for i in reversed(range(len(m[0]))):     # DDP's rebuilt bucket: the last layer first
            x = m[0][i]
            n = x.shape[0]
            k = x.size // n
            rk = min(n, k, rank)
            if x.ndim < 2 or (n + k) * rk * 2 >= n * k:
                res[i] = sum(m[r][i] for r in range(world)) / world
                continue
            if qs is None:
                qs = {}
            if i not in qs:
                if not qs:
                    torch.manual_seed(rng.randint(1_000_000_000))
                qs[i] = torch.randn(1, k, rk, dtype=torch.float32).numpy()[0].astype(np.float64)
            q = np.linalg.qr(qs[i])[0]
            p = sum(m[r][i].reshape(n, k) @ q for r in range(world))
            p = np.linalg.qr(p)[0]
            q = sum(m[r][i].reshape(n, k).T @ p for r in range(world)) / world
            qs[i] = q
            res[i] = (p @ q.T).reshape(x.shape)
        for r in range(world):
            err[r] = [m[r][i] - res[i] for i in range(len(res))]
        out.append(res)
    return out


def test_powersgd_follows_the_algorithm_and_its_error_feedback():
    """fpemu's PowerSGD (float32, gloo sums) against the float64 oracle above
    on a small MLP's gradients over 3 ranks and 5 iterations (plain averaging
    for the first 2): within float32 rounding, normwise; the bias and the
    too-small matrix are averaged as the plain path; each rank's error
    is what it had less what it got."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    shapes = [(16, 12), (16,), (3, 16), (3,), (2, 3)]     # (2, 3): (2+3)*1*2 >= 6, not compressed
    world, iters = 3, 5
    grads = [[[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(world)]
             for _ in range(iters)]
    state = collectives.PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2)
    want = _powersgd_oracle(grads, world, 1, iters, 2)
    for it in range(iters):
        err_before = state.error.get(0, np.zeros((world, 1)))
        got = collectives.ddp_all_reduce(grads[it], "fp32", iteration=min(it, 1),
                                         hook="powerSGD", state=state)
        for g, w in zip(got, want[it]):
            assert np.linalg.norm(g - w) <= 1e-5 * np.linalg.norm(w), (it, g, w)
        # the compressed gradient has rank 1 from the third iteration on
        assert np.linalg.matrix_rank(got[0], tol=1e-5) == (1 if it >= 2 else 12)
    assert state.iter == iters
    # each rank's error is what it had less what it got: the bucket (last layer first)
    # starts with the (2, 3) gradient, averaged, not compressed
    had = grads[-1][1][4].reshape(-1) + err_before[1][:6]
    np.testing.assert_array_equal(state.error[0][1][:6], had - got[4].reshape(-1))


def test_powersgd_refuses_what_torch_refuses():
    g = [[np.ones((4, 4), np.float32)], [np.ones((4, 4), np.float32)]]
    with pytest.raises(fpemu.errors.FpemuValueError, match="start_powerSGD_iter must be > 1"):
        collectives.PowerSGDState(start_powerSGD_iter=1)
    with pytest.raises(fpemu.errors.FpemuValueError, match="matrix_approximation_rank must be"):
        collectives.PowerSGDState(matrix_approximation_rank=0)
    with pytest.raises(fpemu.errors.FpemuValueError, match="hook='powerSGD' takes state="):
        collectives.ddp_all_reduce(g, "fp32", hook="powerSGD")
    with pytest.raises(fpemu.errors.FpemuValueError, match="hook='powerSGD' takes state="):
        collectives.ddp_all_reduce(g, "fp32", state=collectives.PowerSGDState())
    with pytest.raises(fpemu.errors.FpemuNotImplementedError, match="float32 gradients"):
        collectives.ddp_all_reduce(g, "bf16", hook="powerSGD",
                                   state=collectives.PowerSGDState())


def _recorded_mlp_case(name):
    """A recorded DDP / FSDP case: its config, its recorded arrays, an fpemu
    MLP holding torch's initial weights, and ``batches(it)``, the ranks'
    batches of iteration ``it`` (both made as the recording made them)."""
    cfg = SCENARIOS[name].config
    rec = np.load(os.path.join(os.path.dirname(__file__), "reference",
                               "cpu-x86-64-torch2.13.0", f"{name}.npz"))
    widths, layers = cfg["widths"], []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [ft.nn.Linear(a, b), ft.nn.ReLU()]
    fm = ft.nn.Sequential(*layers[:-1])
    with ft.no_grad():
        for pf, pt in zip(fm.parameters(), _gloo._mlp(torch, cfg).parameters()):
            pf.copy_(ft.tensor(pt.detach().numpy()))

    def batches(it):
        return [tuple(ft.tensor(t.numpy()) for t in _gloo._batch(torch, cfg, it, r))
                for r in range(cfg["world"])]
    return cfg, rec, fm, batches


@needs_torch
@pytest.mark.parametrize("name", ["ddp-gloo-fp32-w3", "ddp-gloo-fp32-w3-powersgd-r1"])
def test_emulated_ddp_step_matches_real_ddp_within_the_matmul_bound(name):
    """fpemu.autograd's EmulatedDDP against the recorded real DDP run
    (torch's initial weights and batches, made again here): the reducer is
    bit-exact given torch's local gradients (the scenario; PowerSGD's
    compressed gradients within float32 rounding), but the local gradients
    themselves come from fpemu's fp32 matmul model, not MKL's kernels, and
    differ by a few ulps (normwise 1.6e-7 measured); the reduced gradients
    stay within 1e-6 of DDP's, normwise, with PowerSGD (rank 1, five
    iterations, error feedback) too."""
    cfg, rec, fm, batches = _recorded_mlp_case(name)
    state = collectives.PowerSGDState(**cfg["powersgd"]) if "powersgd" in cfg else None
    ddp = EmulatedDDP(fm, cfg["world"], bucket_cap_mb=cfg["bucket_cap_mb"], hook=cfg["hook"],
                      state=state)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        for it in range(cfg["iterations"]):
            losses = ddp.backward(lambda m, x, y: ((m(x) - y) ** 2).mean(), batches(it))
            assert len(losses) == cfg["world"]
            for i, p in enumerate(fm.parameters()):
                got, want = p.grad.numpy(), rec[f"out.reduced.{it}.{i}"][0]
                assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want), (it, i)


#: the fp16 compression measurement: world sizes and DDP steps (one start of
#: max(worlds) processes, one DDP per world on a subgroup)
FP16_COMPRESS_WORLDS = (2, 3, 4, 5, 8)
FP16_COMPRESS_STEPS = 6


def _fp16_spacing(v):
    """fp16's gap between neighbours at |v| (float64; 2**-24 in the subnormals)."""
    return np.spacing(np.abs(np.asarray(v, np.float32)).astype(np.float16)).astype(np.float64)


def _fp16_compress_figures(worlds=FP16_COMPRESS_WORLDS, steps=FP16_COMPRESS_STEPS):
    """Real DDP with torch's fp16_compress_hook over gloo against (a) fpemu's
    reducer fed torch's local gradients and (b) EmulatedDDP (fpemu's own
    local gradients), the MLP and batches of the recorded scenario
    ``ddp-gloo-fp32-w4-fp16-compress``, ``steps`` backward passes of each
    world size. Per world: the figures, and the worst ratio of a
    difference to the bound derived in the test below."""
    cfg = dict(SCENARIOS["ddp-gloo-fp32-w4-fp16-compress"].config, iterations=steps)
    rec = _gloo.run_ddp_worlds(cfg, worlds, timeout=300)
    loss_fn = lambda m, x, y: ((m(x) - y) ** 2).mean()           # noqa: E731
    figures = {}
    for P in worlds:
        fm = _recorded_mlp_case("ddp-gloo-fp32-w4-fp16-compress")[2]
        params = list(fm.parameters())
        ddp = EmulatedDDP(fm, P, bucket_cap_mb=cfg["bucket_cap_mb"], hook=cfg["hook"])
        f = dict(reducer_differ=0, local_differ=0, flips=0, flips_without_local=0,
                 most_flips=0, normwise=0.0, ulps_of_result=0.0, ulps_of_largest=0.0,
                 to_bound=0.0)
        with ft.use_profile(ft.Profile("cpu", "2.13.0")):
            for it in range(steps):
                batches = [tuple(ft.tensor(t.numpy()) for t in _gloo._batch(torch, cfg, it, r))
                           for r in range(P)]
                mine = []                                   # fpemu's local gradients
                for b in batches:
                    for p in params:
                        p.grad = None
                    loss_fn(fm, *b).backward()
                    mine.append([p.grad.numpy().copy() for p in params])
                ddp.backward(loss_fn, batches)
                theirs = [[rec[f"w{P}.local.{it}.{i}"][r] for i in range(len(params))]
                          for r in range(P)]
                red = collectives.ddp_all_reduce(theirs, "fp32", iteration=min(it, 1),
                                                 hook=cfg["hook"],
                                                 bucket_cap_mb=cfg["bucket_cap_mb"])
                for i, p in enumerate(params):
                    want = rec[f"w{P}.reduced.{it}.{i}"][0].ravel()
                    f["reducer_differ"] += int((_bits(red[i].ravel()) != _bits(want)).sum())
                    got = p.grad.numpy().ravel()
                    g = np.stack([theirs[r][i].ravel() for r in range(P)])
                    h = np.stack([mine[r][i].ravel() for r in range(P)])
                    local = (_bits(g) != _bits(h)).any(axis=0)
                    flip = _bits(got) != _bits(want)
                    f["local_differ"] += int(local.sum())
                    f["flips"] += int(flip.sum())
                    f["flips_without_local"] += int((flip & ~local).sum())
                    f["most_flips"] = max(f["most_flips"], int(flip.sum()))
                    f["normwise"] = max(f["normwise"], float(
                        np.linalg.norm(got - want) / np.linalg.norm(want)))
                    delta = np.abs(got.astype(np.float64) - want)
                    G = np.maximum(np.abs(g), np.abs(h)).max(axis=0)
                    bound = (np.abs(g.astype(np.float64) - h).sum(axis=0) / P
                             + (2 * P + 1) * _fp16_spacing(2 * G))
                    f["to_bound"] = max(f["to_bound"], float(np.max(delta / bound)))
                    if flip.any():
                        f["ulps_of_result"] = max(f["ulps_of_result"], float(np.max(
                            delta[flip] / _fp16_spacing(want[flip]))))
                        f["ulps_of_largest"] = max(f["ulps_of_largest"], float(np.max(
                            delta[flip] / _fp16_spacing(G[flip]))))
        figures[P] = f
    return figures


@needs_torch
def test_emulated_ddp_fp16_compression_is_exact_but_for_the_local_gradients():
    """torch's fp16_compress_hook against real DDP over gloo, worlds 2, 3, 4,
    5 and 8, six steps each. The reducer is exact: fed torch's own local
    gradients, ddp_all_reduce gives DDP's bits everywhere. EmulatedDDP's
    local gradients are fpemu's (its float32 matmul model, not MKL's
    kernels) and differ from torch's by a few float32 ulps in most
    elements; an element's reduced value differs from DDP's only where a
    rank's local gradient differs, and then by at most
    sum_r |g_r - g'_r| / P + (2 P + 1) u, u the fp16 spacing at twice the
    largest |local gradient| of the element (g DDP's, g' fpemu's): each
    rank's cast to fp16 and division by P (float32, then fp16) move its
    addend by |g - g'| / P plus at most u (two roundings on each side), and
    each of the P - 1 hops of the ring's sum, whose partial sums stay below
    twice the largest |g|, rounds differently by at most u. How many
    elements flip, and by how many ulps of the (possibly cancelled) result,
    depends on how far the CPU's MKL is from fpemu's matmul; the figures are
    printed (pytest -s) and in docs/collectives.md."""
    figures = _fp16_compress_figures()
    for P, f in figures.items():
        print(f"fp16_compress, world {P}, {FP16_COMPRESS_STEPS} steps: " + ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in f.items()))
    for P, f in figures.items():
        assert f["reducer_differ"] == 0, (P, f)
        assert f["flips_without_local"] == 0, (P, f)
        assert f["to_bound"] <= 1.0, (P, f)
        assert f["local_differ"] > 0            # fpemu's local gradients are not MKL's ...
    assert sum(f["flips"] for f in figures.values()) > 0      # ... and the flips are seen


def test_emulated_ddp_refuses_bad_input():
    m = ft.nn.Linear(3, 2)
    with pytest.raises(fpemu.errors.FpemuValueError, match="world_size must be an int >= 2"):
        EmulatedDDP(m, 1)
    with pytest.raises(fpemu.errors.FpemuValueError, match="unknown hook"):
        EmulatedDDP(m, 2, hook="powersgd")
    with pytest.raises(fpemu.errors.FpemuValueError, match="one batch per rank"):
        EmulatedDDP(m, 2).backward(lambda mod, x: mod(x).sum(), [ft.ones(1, 3)])
    mixed = ft.nn.Sequential(ft.nn.Linear(3, 2), ft.nn.Linear(2, 2).to(ft.bfloat16))
    with pytest.raises(fpemu.errors.FpemuValueError, match="share one dtype"):
        EmulatedDDP(mixed, 2)


# --------------------------------------------------------------------- FSDP
@needs_torch
def test_fsdp_divide_factors_are_torchs():
    """Against FSDP2's own _get_gradient_divide_factors (torch 2.13), every
    world size to 16, the three reduce dtypes, with and without a factor."""
    # local: torch is optional here, and this is its private module
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        _get_gradient_divide_factors)

    class Group:
        def __init__(self, n):
            self.n = n

        def size(self):
            return self.n

    names = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    for world in range(2, 17):
        for fmt, dt in names.items():
            for factor in (None, float(world), 2.0 * world):
                pre, post, op, _ = _get_gradient_divide_factors(Group(world), None, dt, "cpu",
                                                                factor)
                got = collectives.fsdp_divide_factors(world, fmt, factor)
                assert got[:2] == (pre, post), (world, fmt, factor)
                want_op = {"SUM": "sum", "AVG": "avg"}.get(str(op).split(".")[-1])
                if want_op is None:                          # PREMUL_SUM(1 / factor)
                    assert got[2] == ("premul_sum", 1.0 / factor)
                else:
                    assert got[2] == want_op, (world, fmt, factor, op)


def test_fsdp_reduce_scatter_refuses_bad_input():
    g = [[np.ones((3, 2), np.float32)], [np.ones((3, 2), np.float32)]]
    with pytest.raises(fpemu.errors.FpemuValueError, match="reduce_dtype must be fp32, bf16 or"):
        collectives.fsdp_reduce_scatter(g, "e4m3fn")
    with pytest.raises(fpemu.errors.FpemuValueError, match="rank 1's gradients have the shapes"):
        collectives.fsdp_reduce_scatter([g[0], [np.ones((2, 2))]], "fp32")
    with pytest.raises(fpemu.errors.FpemuValueError, match="0-d gradient"):
        collectives.fsdp_reduce_scatter([[np.float32(1)], [np.float32(1)]], "fp32")
    with pytest.raises(fpemu.errors.FpemuValueError, match="at least 2 ranks"):
        collectives.fsdp_reduce_scatter(g[:1], "fp32")
    # shards of 2 rows (3 rows over 2 ranks, one padded): the reduced gradient comes back whole
    out = collectives.fsdp_reduce_scatter(g, "bf16")[0]
    assert out.shape == (3, 2) and np.all(out == 1.0)


@needs_torch
@pytest.mark.parametrize("name", ["fsdp2-gloo-bf16-reduce-fp32-w3",
                                  "fsdp2-gloo-bf16-reduce-bf16-w3",
                                  "fsdp2-gloo-bf16-reduce-fp16-w4",
                                  "fsdp1-gloo-bf16-reduce-fp32-w3",
                                  "fsdp1-gloo-bf16-reduce-bf16-w4"])
def test_emulated_fsdp_step_is_real_fsdp_bit_for_bit(name):
    """fpemu.autograd's EmulatedFSDP against the recorded FSDP2 and FSDP1 runs (torch's
    initial weights and batches, made again here): the bf16 forward and
    backward under the CPU profile give torch's local gradients bit for bit,
    and the reduce-scatter model the rest, so every reduced gradient is the
    recorded one."""
    cfg, rec, fm, batches = _recorded_mlp_case(name)
    fsdp = EmulatedFSDP(fm, cfg["world"], param_dtype=ft.bfloat16,
                        reduce_dtype=getattr(ft, cfg["reduce_dtype"]),
                        flavor=cfg.get("flavor", "fsdp2"))
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        fsdp.backward(lambda f, x, y: ((f(x).float() - y) ** 2).mean(), batches(0))
    for i, p in enumerate(fm.parameters()):
        assert p.grad.dtype == ft.float32
        np.testing.assert_array_equal(_bits(p.grad.numpy()), _bits(rec[f"out.reduced.{i}"][0]))


def test_emulated_fsdp_refuses_bad_input():
    m = ft.nn.Linear(3, 2)
    with pytest.raises(fpemu.errors.FpemuValueError, match="world_size must be an int >= 2"):
        EmulatedFSDP(m, 0)
    with pytest.raises(fpemu.errors.FpemuValueError, match="float32, bfloat16 or float16"):
        EmulatedFSDP(m, 2, param_dtype=ft.float8_e4m3fn)
    with pytest.raises(fpemu.errors.FpemuValueError, match="one batch per rank"):
        EmulatedFSDP(m, 2).backward(lambda f, x: f(x).sum(), [ft.ones(1, 3)] * 3)
    with pytest.raises(fpemu.errors.FpemuValueError, match="flavor must be 'fsdp2'"):
        EmulatedFSDP(m, 2, flavor="zero3")
    with pytest.raises(fpemu.errors.FpemuValueError, match="units must share out"):
        collectives.fsdp1_reduce_scatter([[np.ones(2)], [np.ones(2)]], "fp32", units=[[0, 0]])


# ---------------------------------------------------------------------- FP8
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_all_reduce_with_a_shared_scale_against_its_recipe(fmt):
    """The recipe composed by hand: the global amax, the float32 scale with
    room for the sum, ml_dtypes' cast of the scaled values, the step-by-step
    ring simulation of the FP8 sum, and the division by the scale."""
    rng = np.random.default_rng(9)
    xs = [(rng.standard_normal(40) * 1e-3).astype(np.float32) for _ in range(3)]
    got, scale = collectives.fp8_all_reduce(xs, fmt, "ring")
    fmax = {"e4m3fn": 448.0, "e5m2": 57344.0}[fmt]
    amax = max(float(np.max(np.abs(x))) for x in xs)
    want_scale = np.float32(np.float32(np.float32(fmax) / np.float32(amax)) / np.float32(3))
    assert np.float32(scale) == want_scale
    dt = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[fmt]
    q = [(x * want_scale).astype(np.float32).astype(dt).astype(np.float32) for x in xs]
    summed = _simulate_nccl_ring(q, fmt, "sum", [(40, 40)], [0, 1, 2])[0]
    want = (summed / want_scale).astype(np.float32)
    np.testing.assert_array_equal(_bits(got[0]), _bits(want))
    plain, one = collectives.fp8_all_reduce(xs, fmt, "exact", scaling="none")
    assert one == 1.0 and np.mean(plain[0] == 0) > np.mean(got[0] == 0)
    with pytest.raises(fpemu.errors.FpemuValueError, match="gloo has no FP8 types"):
        collectives.fp8_all_reduce(xs, fmt, "gloo")
    with pytest.raises(fpemu.errors.FpemuValueError, match="scaling must be 'shared'"):
        collectives.fp8_all_reduce(xs, fmt, scaling="per_rank")
    with pytest.raises(fpemu.errors.FpemuValueError, match="fmt must be one of e4m3fn, e5m2"):
        collectives.fp8_all_reduce(xs, "bf16")


# --------------------------------------------------------------------- ZeRO
def test_zero_reduce_reads_deepspeed_json_and_refuses_what_it_does_not_model(tmp_path):
    """The bits are checked against real DeepSpeed by the recorded scenarios
    (tests/reference, ``zero-gloo-*``); here the configuration handling."""
    g = [[np.float32([[1.0, 2.0]])], [np.float32([[3.0, 4.0]])]]
    cfg = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    a = collectives.zero_reduce(g, cfg)[0]
    assert a.tolist() == [[2.0, 3.0]]          # (1 + 3) / 2, (2 + 4) / 2: exact in bf16
    three = dict(cfg, zero_optimization={"stage": 3})
    assert collectives.zero_reduce(g, three)[0].tolist() == a.tolist()
    assert collectives.zero_reduce(g, str(path))[0].tolist() == a.tolist()
    assert collectives.zero_reduce(g, json.dumps(cfg))[0].tolist() == a.tolist()
    err = fpemu.errors
    with pytest.raises(err.FpemuValueError,
                       match="unknown DeepSpeed key 'stagee' in 'zero_optimization'; the keys"):
        collectives.zero_reduce(g, {"bf16": {"enabled": True},
                                    "zero_optimization": {"stagee": 2}})
    with pytest.raises(err.FpemuValueError, match="unknown DeepSpeed key 'bf_16' at the top"):
        collectives.zero_reduce(g, {"bf_16": {"enabled": True}})
    with pytest.raises(err.FpemuNotImplementedError, match="float32 ZeRO is not"):
        collectives.zero_reduce(g, {"zero_optimization": {"stage": 2}})
    with pytest.raises(err.FpemuValueError, match="both true"):
        collectives.zero_reduce(g, dict(cfg, fp16={"enabled": True}))
    with pytest.raises(err.FpemuValueError, match="must be fp16 or fp32 for a fp16 model"):
        collectives.zero_reduce(g, {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2},
                                    "communication_data_type": "bf16"})
    with pytest.raises(err.FpemuValueError, match="stage must be 1, 2 or 3.*got 0"):
        collectives.zero_reduce(g, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 0}})
    with pytest.raises(err.FpemuNotImplementedError, match="stage 3 with reduce_scatter false"):
        collectives.zero_reduce(g, {"bf16": {"enabled": True},
                                    "zero_optimization": {"stage": 3, "reduce_scatter": False}})
    with pytest.raises(err.FpemuNotImplementedError, match="not modelled for stage 3"):
        collectives.zero_reduce(g, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                                    "gradient_predivide_factor": 2.0})
    with pytest.raises(err.FpemuValueError, match="DeepSpeed refuses gradient_predivide_factor"):
        collectives.zero_reduce(g, dict(cfg, gradient_predivide_factor=2.0))
    with pytest.raises(err.FpemuNotImplementedError, match="not modelled for stage 1"):
        collectives.zero_reduce(g, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                                    "gradient_predivide_factor": 2.0})
    with pytest.raises(err.FpemuValueError, match="communication_data_type must be bf16 or fp32"):
        collectives.zero_reduce(g, dict(cfg, communication_data_type="fp8"))
    with pytest.raises(err.FpemuTypeError, match="DeepSpeed configuration"):
        collectives.zero_reduce(g, 3)


def test_zero_fp16_reduces_in_fp16_and_overflows_to_inf():
    """fp16 ZeRO runs the reduction of the (recorded, bit-exact) bf16 one
    with fp16 in place of bf16: each rank's gradient divided by the world
    size in fp16, the fp16 ring sum, rounded to fp16 (stages 1, 2, 3). Loss-
    scaled gradients near fp16's top: pre-divided they fit, but a gloo ring
    hop can still pass 65504 and give inf (the scaler's overflow)."""
    rng = np.random.default_rng(5)
    g = [[quantize(rng.standard_normal((6, 5)) * 100, "fp16")] for _ in range(3)]
    for stage in (1, 2, 3):
        cfg = {"fp16": {"enabled": True}, "zero_optimization": {"stage": stage}}
        got = collectives.zero_reduce(g, cfg)[0]
        ring = collectives.all_reduce(
            np.stack([collectives._div_(x[0].reshape(-1), 3, "fp16") for x in g]), "fp16")[0]
        # one gradient of 30 elements: stage 3's coalesced buffer (3 chunks of 10) is the
        # same flat buffer, so every stage runs the same ring
        np.testing.assert_array_equal(got.reshape(-1), ring)
        assert np.array_equal(got, quantize(got, "fp16"))
    big = [[np.full((4,), 60000.0, np.float32)] for _ in range(2)]
    got = collectives.zero_reduce(big, {"fp16": {"enabled": True},
                                        "zero_optimization": {"stage": 2}})[0]
    assert np.all(got == 60000.0)                 # 30000 + 30000: pre-division saves it
    got = collectives.zero_reduce(big, {"fp16": {"enabled": True}, "zero_optimization": {
        "stage": 2}, "communication_data_type": "fp32"})[0]
    assert np.all(got == 60000.0)
    over = [[np.full((4,), 65504.0, np.float32)] for _ in range(2)] + \
        [[np.full((4,), 65504.0, np.float32)]]
    got = collectives.zero_reduce(over, {"fp16": {"enabled": True},
                                         "zero_optimization": {"stage": 1}})[0]
    # 65504 / 3 = 21834.67 -> 21840 in fp16; 3 x 21840 = 65520 rounds to inf in fp16
    assert np.all(np.isinf(got))


def test_deepspeed_loss_scaler_replays_deepspeeds_own_scales():
    """tests/data/deepspeed_loss_scaler.json: DeepSpeed 0.19.8's
    DynamicLossScaler driven through fixed overflow patterns under five
    fp16 configurations (scripts/make_deepspeed_scaler_vectors.py); fpemu's
    scaler, built from the same JSON, gives the same scale before every
    step, and raises where DeepSpeed raised (an overflow at the minimum)."""
    path = os.path.join(os.path.dirname(__file__), "data", "deepspeed_loss_scaler.json")
    with open(path) as fh:
        cases = json.load(fh)
    assert len(cases) == 5 and sum(c["raised_at"] is not None for c in cases) == 2
    for case in cases:
        scaler = collectives.DeepSpeedLossScaler.from_config(
            {"fp16": dict(case["fp16"], enabled=True)})
        got = []
        for i, c in enumerate(case["pattern"]):
            got.append(scaler.cur_scale)
            if i == case["raised_at"]:
                with pytest.raises(fpemu.errors.FpemuRuntimeError, match="already at its minimum"):
                    scaler.update_scale(c == "1")
                break
            scaler.update_scale(c == "1")
        assert got == case["scales"], case["fp16"]
    with pytest.raises(fpemu.errors.FpemuValueError, match="fp16.enabled is not true"):
        collectives.DeepSpeedLossScaler.from_config({"bf16": {"enabled": True}})
    with pytest.raises(fpemu.errors.FpemuValueError, match="a static scale"):
        collectives.DeepSpeedLossScaler.from_config({"fp16": {"enabled": True,
                                                              "loss_scale": 128}})


def _zero_model():
    ft.manual_seed(3)
    return ft.nn.Sequential(ft.nn.Linear(4, 6), ft.nn.ReLU(), ft.nn.Linear(6, 2))


def _zero_batches(scale, world=2, seed=0):
    rng = np.random.default_rng(seed)
    return [(ft.tensor(rng.standard_normal((3, 4)).astype(np.float32) * scale),
             ft.tensor(rng.standard_normal((3, 2)).astype(np.float32))) for _ in range(world)]


def _mse(dtype):
    return lambda m, x, y: ((m(x.to(dtype)).float() - y) ** 2).mean()


def test_emulated_zero_fp16_skips_overflowing_steps_as_deepspeed_scales():
    """fp16 ZeRO: the loss is multiplied by the scale (2**16 here); inputs of
    1e4 make the scaled fp16 gradients overflow, so the step is skipped with
    the masters untouched, the first overflow only uses up the hysteresis
    (DeepSpeed's default 2), the second halves the scale; small inputs step,
    with the gradients unscaled (the losses come back unscaled). The exact
    DeepSpeed bf16 run is checked by the zero-train-* scenarios."""
    m = _zero_model()
    zero = EmulatedZeRO(m, 2, {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    opt = ft.optim.SGD(m.parameters(), lr=0.1)
    before = [p.detach().numpy().copy() for p in m.parameters()]
    assert all(np.array_equal(b, fpemu.quantize(b, "fp16")) for b in before)   # fp16 masters
    for want_scale in (2.0 ** 16, 2.0 ** 16):
        assert zero.loss_scale == want_scale
        zero.backward(_mse(ft.float16), _zero_batches(1e4))
        assert zero.step(opt) is False
        assert all(np.array_equal(b, p.detach().numpy()) for b, p in zip(before, m.parameters()))
    assert zero.loss_scale == 2.0 ** 15
    losses = zero.backward(_mse(ft.float16), _zero_batches(0.5))
    assert 0.1 < losses[0] < 10                             # unscaled
    assert zero.step(opt) is True
    assert not all(np.array_equal(b, p.detach().numpy()) for b, p in zip(before, m.parameters()))
    with pytest.raises(fpemu.errors.FpemuRuntimeError, match=r"call backward\(\) first"):
        zero.step(opt)


def test_emulated_zero_clips_by_the_global_norm_of_the_unscaled_gradients():
    """gradient_clipping: DeepSpeed multiplies the gradients by
    1 / (scale x clip factor), factor = (norm / scale + 1e-6) / clip where it
    passes 1: after the step the gradients' norm is the clip value."""
    m = _zero_model()
    zero = EmulatedZeRO(m, 2, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                               "gradient_clipping": 0.01})
    opt = ft.optim.SGD(m.parameters(), lr=0.0)
    zero.backward(_mse(ft.bfloat16), _zero_batches(3.0))
    raw = [g.copy() for g in zero._reduced]
    norm = np.sqrt(sum(np.sum(np.float64(g) ** 2) for g in raw))
    assert norm > 0.01
    assert zero.step(opt)
    clipped = np.sqrt(sum(np.sum(np.float64(p.grad.numpy()) ** 2) for p in m.parameters()))
    assert abs(clipped - 0.01) < 1e-6


def test_emulated_zero_refuses_bad_input():
    m = _zero_model()
    with pytest.raises(fpemu.errors.FpemuValueError, match="exactly one of bf16 and fp16"):
        EmulatedZeRO(m, 2, {"zero_optimization": {"stage": 2}})
    with pytest.raises(fpemu.errors.FpemuValueError, match="float32 master weights"):
        EmulatedZeRO(_zero_model().to(ft.bfloat16), 2, {"bf16": {"enabled": True}})
    with pytest.raises(fpemu.errors.FpemuValueError, match="world_size must be an int >= 2"):
        EmulatedZeRO(m, 1, {"bf16": {"enabled": True}})
    with pytest.raises(fpemu.errors.FpemuValueError, match="unknown DeepSpeed key"):
        EmulatedZeRO(m, 2, {"bf16": {"enabled": True}, "zero_optimisation": {"stage": 2}})
    zero = EmulatedZeRO(m, 2, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    with pytest.raises(fpemu.errors.FpemuValueError, match="one batch per rank"):
        zero.backward(_mse(ft.bfloat16), _zero_batches(1.0, world=3))


# ------------------------------------------------------------------- exact
def _exact_oracle(x, fmt, scale):
    E, M = IEEE[fmt]
    out = []
    for col in np.asarray(x, np.float64).T:
        if not np.all(np.isfinite(col)):
            out.append(float(np.sum(col)) * float(scale))
            continue
        s = sum((Fraction(v) for v in col), Fraction(0)) * scale
        if s != 0:
            out.append(round_to_ieee(s, E, M))
        else:                        # -0 from -0 on every rank; a negative factor flips it
            out.append(-0.0 if all(np.signbit(col)) == (scale > 0) else 0.0)
    return np.array(out, np.float32)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("op", ["sum", "avg", "premul_sum"])
def test_exact_is_the_exact_result_rounded_once(fmt, op):
    world = 5
    x = _values(world, 300, fmt, seed=11, specials=True)
    x[:, 3] = -0.0
    x[:, 4] = [2.0 ** -3, -2.0 ** -3, 2.0 ** -30, 0.0, 0.0]        # needs more than float32
    scale = {"sum": Fraction(1), "avg": Fraction(1, world), "premul_sum": Fraction(-0.3)}[op]
    kw = {"factor": -0.3} if op == "premul_sum" else {}
    got = collectives.all_reduce(list(x), fmt, op, "exact", **kw)
    want = _exact_oracle(x, fmt, scale)
    for r in range(world):
        np.testing.assert_array_equal(_bits(got[r]), _bits(want))


def test_exact_max_and_min_propagate_nan_and_order_zeros():
    xs = [np.float32([np.nan, -0.0, -0.0, 3.0]), np.float32([1.0, 0.0, -0.0, -4.0])]
    mx = collectives.all_reduce(xs, "bf16", "max", "exact")[0]
    mn = collectives.all_reduce(xs, "bf16", "min", "exact")[0]
    assert np.isnan(mx[0]) and np.isnan(mn[0])
    assert _bits(mx[1:]).tolist() == _bits([0.0, -0.0, 3.0]).tolist()
    assert _bits(mn[1:]).tolist() == _bits([-0.0, -0.0, -4.0]).tolist()


@pytest.mark.parametrize("algorithm", ["exact", "gloo", "ring", "tree", "nvls"])
def test_empty_and_0d_ranks(algorithm):
    assert collectives.all_reduce([np.zeros(0, np.float32)] * 3, "bf16",
                                  algorithm=algorithm)[0].shape == (0,)
    got = collectives.all_reduce([np.float32(1.5), np.float32(2.0)], "bf16", algorithm=algorithm)
    assert got[0].shape == () and got[1] == 3.5


def test_inputs_are_cast_to_the_wire_format_and_gather_and_broadcast_copy():
    xs = [np.array([[1 + 2.0 ** -9, 2.0]]), np.array([[3.0, 4.0]])]      # float64, 1 x 2
    gathered = collectives.all_gather(xs, "bf16")
    assert gathered[0].shape == (2, 2) and gathered[0].dtype == np.float32
    assert gathered[1].tolist() == [[1.0, 2.0], [3.0, 4.0]]              # 1 + 2**-9 -> 1 (bf16)
    assert collectives.broadcast(xs, "bf16", src=1)[0].tolist() == [[3.0, 4.0]]
    rs = collectives.reduce_scatter([np.arange(6.0), np.ones(6)], "fp32")
    assert [r.tolist() for r in rs] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("call,match", [
    (lambda: collectives.all_reduce([np.ones(3), np.ones(4)], "bf16"), "same shape"),
    (lambda: collectives.all_reduce([np.ones(3), np.ones(3, np.float32)], "bf16"), "dtype"),
    (lambda: collectives.all_reduce([], "bf16"), "at least 2 ranks, got 0"),
    (lambda: collectives.all_reduce([np.ones(3)], "bf16"), "at least 2 ranks, got 1"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="nccl"),
     "unknown algorithm 'nccl'; the algorithms are 'exact', 'gloo'"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", op="mean"), "unknown op 'mean'"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", op="premul_sum", factor=0.5),
     "Cannot use ReduceOp.PREMUL_SUM"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", "product", "ring"),
     "NCCL ring model has no op 'product'"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "e4m3fn"), "gloo reduces fp32, bf16, fp16"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", "premul_sum", "exact"), "factor="),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", factor=2.0), "premul_sum"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", max_segment_bytes=0), ">= 1"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", "avg", threads=0),
     r"threads must be an int >= 1 \(torch.get_num_threads\(\) in the ranks' processes\)"),
    (lambda: collectives.reduce_scatter([np.ones(4)] * 2, "bf16", threads=2.0), "threads must"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="ring", threads=2),
     "threads= is a parameter of algorithm='gloo', not 'ring'"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="exact",
                                    max_segment_bytes=64), "parameter of algorithm='gloo'"),
    (lambda: collectives.reduce_scatter([np.ones(3)] * 2, "bf16"), "multiple of the world size"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="ring",
                                    parts=[(2, 1)]), "add up to 2, the buffer has 3"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="ring",
                                    parts=[(3, 0)]), "chunk_count must be an int >= 1"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="ring",
                                    parts=[3]), "list of \\(count, chunk_count\\) pairs"),
    (lambda: collectives.all_reduce([np.ones(3)] * 3, "bf16", algorithm="ring", ring=[0, 0, 1]),
     "order of the ranks 0 .. 2"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", parts=[(3, 1)]),
     "parts= is a parameter of algorithm='ring' or 'tree', not 'gloo'"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "e2m1", algorithm="ring"),
     "NCCL ring model covers fp32, bf16, fp16, e4m3fn, e5m2"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "e5m2", algorithm="nvls"),
     "NVLS for fp32, bf16 and fp16, not e5m2"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", "avg", "nvls"), "op='sum' only"),
    (lambda: collectives.all_reduce([np.ones(3)] * 6, "bf16", algorithm="tree", gpus_per_node=4),
     "gpus_per_node must divide the world size 6"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="tree", trees=[2]),
     "trees must give 0 or 1"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "bf16", algorithm="ring", trees=[0]),
     "trees= is a parameter of algorithm='tree', not 'ring'"),
    (lambda: collectives.broadcast([np.ones(3)] * 2, "bf16", src=2), "src must be a rank"),
    (lambda: collectives.all_reduce([np.ones(3)] * 2, "fp64"), "format|fp64"),
    (lambda: collectives.all_reduce(np.ma.masked_array(np.ones((2, 3), np.float32),
                                                       mask=[[0, 1, 0], [0, 0, 0]]), "bf16"),
     "masked arrays"),
])
def test_bad_input_is_refused_with_the_fix(call, match):
    with pytest.raises((fpemu.errors.FpemuValueError, fpemu.errors.FpemuTypeError), match=match):
        call()


# ------------------------------------------------ gloo's avg and product, the corners
AVG_PRODUCT = [("bfloat16", "bf16", 3), ("float16", "fp16", 2), ("float32", "fp32", 4)]


def _avg_product_input(fmt, world):
    x = _values(world, 40_000, fmt, seed=9)
    x[:, :8] = [[1, 2, 7, 0.0, -0.0, 3, 1e-3, 65504.0]] * world       # zeros, an fp16 overflow
    return x


@needs_torch
@pytest.mark.parametrize("dtype,fmt,world", AVG_PRODUCT)
def test_live_gloo_avg_and_product_match_bit_for_bit(dtype, fmt, world):
    """torch 2.13's gloo has AVG (the ring's sum divided by the world size in
    the dtype) and PRODUCT (the same ring, multiplying): real processes."""
    x = _avg_product_input(fmt, world)
    got = _live(world)
    for op in ("avg", "product"):
        model = collectives.all_reduce(list(x), fmt, op)[0]
        for r in range(world):
            rec = got[f"all_reduce.{op}.avgprod-{fmt}"][r]
            both_nan = np.isnan(rec) & np.isnan(model)
            np.testing.assert_array_equal(np.where(both_nan, 0, _bits(rec)),
                                          np.where(both_nan, 0, _bits(model)), err_msg=op)
    avg = collectives.all_reduce([np.array([1.0, 2, 7]), np.array([2.0, 4, 14])], "bf16", "avg")
    assert avg[0].tolist() == [1.5, 3.0, 10.5]


def test_exact_product_is_the_product_rounded_once():
    rng = np.random.default_rng(3)
    x = _values(3, 300, "bf16", seed=4)        # bf16 values: the wire cast keeps them
    x[:, :6] = [[np.inf, 0.0, -0.0, np.nan, 3.0, -2.0],
                [0.0, -5.0, -1.0, 1.0, -np.inf, 2.0**-130],
                [2.0, 1.0, 1.0, 1.0, 2.0, 2.0**-130]]
    got = collectives.all_reduce(list(x), "bf16", "product", "exact")[0]
    for j in list(range(6)) + list(rng.integers(6, 300, 40)):
        vals = [float(v) for v in x[:, j]]
        if all(math.isfinite(v) for v in vals):
            q = Fraction(1)
            for v in vals:
                q *= Fraction(v)
            want = round_to_ieee(q, 8, 7) if q else math.copysign(
                0.0, -1.0 if sum(math.copysign(1, v) < 0 for v in vals) % 2 else 1.0)
            assert _bits(np.float32(got[j])) == _bits(np.float32(want)), (j, vals)
        else:
            with np.errstate(invalid="ignore"):
                want = np.prod(np.float64(vals))
            assert (np.isnan(got[j]) and np.isnan(want)) or got[j] == want, (j, vals)
    assert np.isnan(got[0]) and got[1] == 0 and np.signbit(got[1])        # inf * 0; 0 * -5 * 1
    assert got[5] == 0 and np.signbit(got[5])          # -2 * 2**-260: -0 after rounding


def test_ddp_bucket_cap_mb_passed_as_25_is_not_the_default():
    """torch's DDP gives a first bucket of 1 MiB only when bucket_cap_mb is
    not passed; an explicit 25 makes the first bucket 25 MiB too, as 25.000001
    does. A 1.5 MB model (fp32): the default splits it, 25 does not."""
    sizes = [131072, 131072, 131072]                       # 3 x 512 KiB
    rng = np.random.default_rng(1)
    grads = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(3)]
    default = collectives.ddp_all_reduce(grads, "fp32", iteration=1)
    explicit = collectives.ddp_all_reduce(grads, "fp32", iteration=1, bucket_cap_mb=25)
    nudged = collectives.ddp_all_reduce(grads, "fp32", iteration=1, bucket_cap_mb=25.000001)
    for a, b in zip(explicit, nudged):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    assert any((_bits(a) != _bits(b)).any() for a, b in zip(default, explicit))
    assert len(collectives.ddp_buckets(sizes, 4, 1)) == 2
    assert len(collectives.ddp_buckets(sizes, 4, 1, None, 25 << 20, 25 << 20)) == 1


@needs_torch
def test_mixed_torch_dtypes_across_ranks_are_refused():
    xs = [torch.tensor([1.0, 2.0]).bfloat16(), torch.tensor([1.0, 2.0])]
    with pytest.raises(fpemu.errors.FpemuValueError, match="rank 0 has .* bfloat16, rank 1 "
                                                           ".* float32"):
        collectives.all_reduce(xs, "bf16")


@pytest.mark.parametrize("call,match", [
    (lambda: collectives.gloo_ring_chunks(10, 0, 2), r"world \(the number of ranks\) must be an "
     "int >= 1, got 0"),
    (lambda: collectives.nccl_ring_chunks(10, 0, 2), r"world .* >= 1, got 0"),
    (lambda: collectives.nccl_tree(8, 0), "gpus_per_node must be an int >= 1, got 0"),
    (lambda: collectives.nccl_tree(0, 8), r"world .* >= 1, got 0"),
    (lambda: collectives.fsdp_divide_factors(0, "fp32"), r"world .* >= 1, got 0"),
    (lambda: collectives.fsdp_divide_factors(2, "e4m3fn"), "reduce_dtype must be fp32, bf16"),
    (lambda: collectives.fp8_all_reduce([np.ones(3)] * 2, margin=2000),
     "margin must be an int from 0 to 127"),
    (lambda: collectives.fp8_all_reduce([np.ones(3)] * 2, margin=128), "2\\*\\*128"),
])
def test_layout_helpers_and_fp8_margin_refuse_what_cannot_work(call, match):
    with pytest.raises(fpemu.errors.FpemuValueError, match=match):
        call()


def test_premul_sum_takes_numpy_scalars():
    xs = [np.array([1.0, 2.0, 3.0])] * 2
    a = collectives.all_reduce(xs, "bf16", "premul_sum", "exact", factor=np.float32(0.5))
    b = collectives.all_reduce(xs, "bf16", "premul_sum", "exact", factor=0.5)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].tolist() == [1.0, 2.0, 3.0]
    assert collectives.fp8_all_reduce([np.ones(3)] * 2, margin=127)[1] > 0


@pytest.mark.parametrize("fn", ["ddp_all_reduce", "fsdp_reduce_scatter", "fsdp1_reduce_scatter",
                                "fp8_all_reduce"])
def test_a_wrappers_errors_name_the_wrapper(fn):
    xs = [[np.ones(4)], [np.ones(4)]] if fn != "fp8_all_reduce" else [np.ones(4)] * 2
    fmt = "bf16" if fn != "fp8_all_reduce" else "e4m3fn"
    with pytest.raises(fpemu.errors.FpemuValueError, match=rf"^{fn}\(\): unknown algorithm "):
        getattr(collectives, fn)(xs, fmt, algorithm="nccl")


def test_zero_reduce_refuses_bad_json_and_missing_files():
    grads = [[np.ones(4)], [np.ones(4)]]
    with pytest.raises(fpemu.errors.FpemuValueError, match=r"zero_reduce\(\): the configuration "
                                                           "text is not valid JSON"):
        collectives.zero_reduce(grads, "{bad json")
    with pytest.raises(fpemu.errors.FpemuValueError, match="'no/such.json' is none of these"):
        collectives.zero_reduce(grads, "no/such.json")


def _nan_inputs(world, fmt, n=48):
    """Finite values with NaNs of several payloads and signs, signalling and
    quiet, and infinities of both signs, spread over the chunks of the ring."""
    x = _values(world, n, fmt, seed=12)
    v = x.view(np.uint32)
    payloads = ([0x7FA00001, 0xFFC00123, 0x7FC00ABC, 0xFFC00DEF] if fmt == "fp32"
                else [0x7FA10000, 0xFFC30000, 0x7FC50000, 0xFF810000])
    rng = np.random.default_rng(13)
    for j in range(0, n, 3):
        r = int(rng.integers(world))
        v[r, j] = payloads[int(rng.integers(len(payloads)))]
        if j % 2:                                  # a second NaN on another rank
            v[(r + 1) % world, j] = payloads[int(rng.integers(len(payloads)))]
    x[0, 1], x[1 % world, 1] = np.inf, -np.inf    # inf - inf
    x[:, 4] = np.inf
    return x


def _fp16_codes(x):
    """float32 values (NaNs with fp16 payloads) as fp16 codes, by integer
    operations on the NaNs (no CPU's conversion of a NaN involved)."""
    b = x.view(np.uint32)
    h = x.astype(np.float16).view(np.uint16).copy()
    nan = np.isnan(x)
    h[nan] = (((b >> 16) & 0x8000) | 0x7C00 | ((b >> 13) & 0x3FF))[nan].astype(np.uint16)
    return h.view(np.float16)


NAN_BITS = [("float32", "fp32", 2), ("float32", "fp32", 3), ("bfloat16", "bf16", 3),
            ("float16", "fp16", 2), ("float16", "fp16", 3)]


def _nan_case(fmt, world):
    """(the ranks' values, what the processes are sent, the collectives): bf16
    and fp16 are sent as their codes, NaN payloads included."""
    x = _nan_inputs(world, fmt)
    which = ["all_reduce.sum", "all_gather"]
    if fmt == "fp32":
        return x, x, which
    if fmt == "bf16":           # bf16 values: the top half of each float32 is the code
        return x, (x.view(np.uint32) >> 16).astype(np.uint16).view(ml_dtypes.bfloat16), which
    which.append("all_reduce.avg")
    codes = _fp16_codes(x)
    h = codes.view(np.uint16).astype(np.uint32)
    x = codes.astype(np.float32)            # the numbers; the NaNs by their bits:
    nan = (h & 0x7C00) == 0x7C00
    x.view(np.uint32)[nan] = (((h & 0x8000) << 16) | 0x7F800000 | ((h & 0x3FF) << 13))[nan]
    assert np.array_equal(_fp16_codes(x).view(np.uint16), codes.view(np.uint16))
    return x, codes, which


@needs_torch
@pytest.mark.parametrize("dtype,fmt,world", NAN_BITS)
def test_live_gloo_nan_bits_in_sums_and_copies(dtype, fmt, world):
    """Copies keep a NaN's bits; an fp32 sum gives the NaN SSE's addss gives
    (the own value's NaN before the received one's, quieted; inf - inf the
    default 0xffc00000); a bf16 sum c10's one NaN 0x7fc0; an fp16 sum c10's
    0x7e00 with the sign of SSE's NaN. (bf16 and fp16 tensors are made from
    their codes: torch's float32 -> bf16 cast writes a NaN as 0xffff on this
    CPU.)"""
    x, _, which = _nan_case(fmt, world)
    got = {name: _live(world)[f"{name}.nan-{fmt}"] for name in which}
    model = {"all_reduce.sum": collectives.all_reduce(list(x), fmt)[0],
             "all_gather": collectives.all_gather(list(x), fmt)[0]}
    if fmt == "fp16":
        model["all_reduce.avg"] = collectives.all_reduce(list(x), fmt, "avg")[0]
        signs = got["all_reduce.sum"][0].view(np.uint32)[np.isnan(got["all_reduce.sum"][0])]
        assert len(set((signs >> 31).tolist())) == 2          # NaNs of both signs came out
    assert sorted(model) == sorted(got)
    for name, ours in model.items():
        rec = got[name][0]
        assert np.isnan(rec).sum() > 5, name
        np.testing.assert_array_equal(_bits(ours), _bits(rec), err_msg=name)


def test_copies_keep_a_nans_bits_when_it_is_one_of_the_wire_formats():
    """A bf16 tensor's NaN (payload 0x7fa1) and an fp32 signalling NaN travel
    unchanged through broadcast and all_gather; a float32 NaN whose payload
    bf16 cannot hold is cast (fpemu's one NaN)."""
    bf = np.array([0x7FA10000, 0xFFC30000, 0x7FA00001], np.uint32).view(np.float32)
    got = collectives.broadcast([bf, bf], "bf16")[0].view(np.uint32)
    assert [hex(v) for v in got] == ["0x7fa10000", "0xffc30000", "0x7fc00000"]
    f32 = np.array([0x7FA00001, 0xFFC00123], np.uint32).view(np.float32)
    got = collectives.all_gather([f32, f32], "fp32")[0].view(np.uint32)
    assert got.tolist() == [0x7FA00001, 0xFFC00123] * 2


# ------------------------------------------- NaN bits of every gloo op, bf16 and fp16
NAN_OPS_FORMATS = [("bf16", "bfloat16"), ("fp16", "float16")]
#: 48: one thread's range, ATen's vector loop on [0, 32) and its scalar rest;
#: 100,002: three threads' ranges of 33,334 (and gloo's ring in 2 P chunks)
NAN_OPS_SIZES = [48, 100_002]
NAN_OPS = [f"{kind}.{op}" for kind in ("all_reduce", "reduce_scatter")
           for op in ("sum", "avg", "max", "min", "product")]


def _nan_ops_input(fmt, world, n):
    """(float32 values, the codes sent): random values of ``fmt`` with 15 %
    NaNs (payloads quiet and signalling, both signs, the all-ones code) and
    5 % infinities of both signs (inf - inf, inf * 0), on every rank. Both
    are made from the codes, by integer operations (no CPU's NaN conversion)."""
    rng = np.random.default_rng(70 + world + n)
    x = (rng.standard_normal((world, n)) * 4).astype(np.float32)
    if fmt == "bf16":
        codes = x.astype(ml_dtypes.bfloat16).view(np.uint16).copy()
        nans = [0x7FA1, 0xFFC3, 0x7FC5, 0xFF81, 0x7FC0, 0xFFC0, 0xFFFF, 0x7F81]
        infs = [0x7F80, 0xFF80]
    else:
        codes = x.astype(np.float16).view(np.uint16).copy()
        nans = [0x7D08, 0xFE61, 0x7E05, 0xFC01, 0x7E00, 0xFE00, 0x7FFF, 0xFDFF]
        infs = [0x7C00, 0xFC00]
    u = rng.random((world, n))
    codes[u < 0.15] = rng.choice(nans, size=int((u < 0.15).sum()))
    inf = (u >= 0.15) & (u < 0.2)
    codes[inf] = rng.choice(infs, size=int(inf.sum()))
    h = codes.astype(np.uint32)
    if fmt == "bf16":
        return (h << 16).view(np.float32), codes.view(ml_dtypes.bfloat16)
    wide = codes.view(np.float16).astype(np.float32)
    special = (h & 0x7C00) == 0x7C00
    wide.view(np.uint32)[special] = (((h & 0x8000) << 16) | 0x7F800000
                                     | ((h & 0x3FF) << 13))[special]
    return wide, codes.view(np.float16)


@needs_torch
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_live_gloo_nan_bits_of_every_op(fmt, world):
    """Every op of all_reduce and reduce_scatter_tensor on bf16 and fp16
    tensors full of NaNs (payloads, signs) and infinities, against real gloo
    processes, code for code on every rank: max / min keep the finishing
    rank's own NaN as it is (0x7fa1 stays 0x7fa1); a bf16 sum or product
    gives 0x7fc0, an fp16 one 0x7e00 with the sign of x86's NaN; a bf16 avg
    writes 0xffff where ATen's vector loop divides and 0x7fc0 in each
    thread's scalar rest (three threads here)."""
    got = _live(world)
    seen = set()
    for n in NAN_OPS_SIZES:
        x, _ = _nan_ops_input(fmt, world, n)
        for name in NAN_OPS:
            kind, op = name.split(".")
            model = getattr(collectives, kind)(list(x), fmt, op, threads=LIVE_THREADS)
            for r in range(world):
                rec = got[f"{name}.nanops-{fmt}-{n}"][r]
                ours = model[r] if kind == "reduce_scatter" else model[0]
                np.testing.assert_array_equal(_bits(ours), _bits(rec),
                                              err_msg=f"{name} n={n} rank {r}")
                seen.update(_bits(rec)[np.isnan(rec)].tolist())
    # the NaNs that came out: kept payloads of both signs, c10's, ATen's vector one
    want = ({0x7FA10000, 0xFFC30000, 0xFFFF0000, 0x7FC00000} if fmt == "bf16"
            else {0x7FA10000, 0xFFCC2000, 0x7FC00000, 0xFFC00000})
    assert want <= seen, sorted(map(hex, seen))


# NCCL's channel split (scheduleCollTasksToPlan and calcCollChunking in
# src/enqueue.cc, NCCL 2.26-2.30), worked by hand from the source: each case
# below gives the arithmetic, so the expected values do not come from fpemu.
@pytest.mark.parametrize("args, kw, channels, parts, chunk_bytes", [
    # 2^20 fp32, 8 channels, Simple, 2.30: traffic 8 MiB -> 1 MiB per channel;
    # cells of 16 KiB (32 KiB of traffic / 2), 256 of them, 32 per channel:
    # lo 32, mid 7 -> 6 once hi takes a full 32; chunk 4 MiB / 8 steps x 4 = 2 MiB
    ((2**20, 4, 8), {}, list(range(8)), [(131072, 524288)] * 8, [2 << 20] * 8),
    # 1000 fp16 on LL: traffic max(32 KiB, 1000 x 2 x 2 x 4) -> 8 KiB per channel;
    # cells of 4096 bytes (32 KiB / 8), one cell, whose padding comes back;
    # chunk 512 KiB / 8 / 2 = 32 KiB
    ((1000, 2, 4, "ll"), {}, [0], [(1000, 16384)], [32768]),
    # 3,000,000 bf16 on 2.28 (16 KiB minimum), 16 of 32 channels: 750,000 bytes of
    # traffic per channel, cells of 8192 bytes (733 of them), 46 per channel:
    # lo 46, 14 mid, hi 43 cells less the 2368 elements of padding
    ((3000000, 2, 16), {"comm_channels": 32, "version": "2.28"}, list(range(16)),
     [(188416, 1048576)] * 15 + [(173760, 1048576)], [2 << 20] * 16),
    # 11,550,721 fp16 on 10 channels: 1411 cells of 16 KiB, 141 per channel, so
    # lo + 9 mid + a hi of 1 = 11 channels > 10: NCCL's overflow branch gives
    # 8 mid of 141 and a hi of 141 + 1270 % 9 = 142 cells, less 8191 padding
    ((11550721, 2, 10), {}, list(range(10)), [(1155072, 1048576)] * 9 + [(1155073, 1048576)],
     [2 << 20] * 10),
    # a communicator of one channel takes everything on it
    ((5000000, 4, 1), {}, [0], [(5000000, 524288)], [2 << 20]),
    # LL128 tree over 8 nodes of 8: 4.8 steps; from 576,000 bytes (614,400 / 16 x 15)
    # the chunk halves to 72,000 (< 4.8 x 64 / 8 chunks), then to 36,000 (< 9.6),
    # and for the 347,520-byte last part once more to 18,000; grains of 1920 bytes
    ((3000000, 2, 16, "ll128", "tree"), {"world": 64, "gpus_per_node": 8}, list(range(16)),
     [(188416, 17280)] * 15 + [(173760, 8640)], [34560] * 15 + [17280]),
    # NCCL_BUFFSIZE=1 MiB: Simple ring chunks of 1 MiB / 8 x 4 = 512 KiB
    ((2**20, 4, 8), {"buffsize": 1 << 20}, list(range(8)), [(131072, 131072)] * 8,
     [512 << 10] * 8),
    ((0, 4, 8), {}, [], [], []),
])
def test_nccl_channel_parts_follow_enqueue_cc(args, kw, channels, parts, chunk_bytes):
    s = collectives.nccl_channel_parts(*args, **kw)
    assert (s.channels, s.parts, s.chunk_bytes) == (channels, parts, chunk_bytes)


def test_nccl_channel_parts_cover_the_buffer_and_feed_the_models():
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n, es = int(rng.integers(1, 1 << 26)), int(rng.choice([1, 2, 4]))
        ch, proto = int(rng.integers(1, 33)), str(rng.choice(["simple", "ll", "ll128"]))
        s = collectives.nccl_channel_parts(n, es, ch, proto)
        counts = [c for c, _ in s.parts]
        assert sum(counts) == n and 1 <= len(counts) <= ch
        cell = {"simple": 16384, "ll": 4096, "ll128": 16384}[proto] // es
        # every part but the last whole cells; the middle ones alike
        assert all(c % cell == 0 for c in counts[:-1]) and len(set(counts[1:-1])) <= 1
        grain = collectives.NCCL_PROTOCOLS[proto][1]
        assert all(b % grain == 0 and b > 0 for b in s.chunk_bytes)
    # the schedule goes straight into the models
    x = np.random.default_rng(6).standard_normal((4, 70000)).astype(np.float32)
    s = collectives.nccl_channel_parts(70000, 2, 4)
    # 140,000 bytes: 70,000 of traffic per channel, 9 cells of 16 KiB, 3 per
    # channel (70,000 / 32,768 rounded up): three channels of the four tuned
    assert s.channels == [0, 1, 2] and [c for c, _ in s.parts] == [24576, 24576, 20848]
    ring = collectives.all_reduce(list(x), "bf16", algorithm="ring", parts=s.parts)[0]
    one = collectives.all_reduce(list(x), "bf16", algorithm="ring")[0]
    assert not np.array_equal(ring.view(np.uint32), one.view(np.uint32))
    tree = collectives.all_reduce(list(x), "bf16", algorithm="tree", parts=s.parts,
                                  trees=s.trees(search_channels=1), gpus_per_node=2)[0]
    assert tree.shape == (70000,)
    assert s.trees(1) == [0, 1, 0] and s.trees(2) == [0, 0, 1]


@pytest.mark.parametrize("call, match", [
    (lambda: collectives.nccl_channel_parts(10, 2, 4, "LL"), "protocol must be one of simple"),
    (lambda: collectives.nccl_channel_parts(10, 2, 4, algorithm="nvls"),
     "algorithm must be 'ring' or 'tree'"),
    (lambda: collectives.nccl_channel_parts(10, 2, 4, version="2.21"),
     "follows NCCL 2.26 to 2.30: pass parts= by hand"),
    (lambda: collectives.nccl_channel_parts(10, 2, 4, version="two"), "version must be"),
    (lambda: collectives.nccl_channel_parts(10, 2, 0), r"channels must be an int >= 1, got 0"),
    (lambda: collectives.nccl_channel_parts(10, 2, 4, "ll128", "tree"), "pass world="),
    (lambda: collectives.nccl_channel_parts(10, 2, 4, "ll128", "tree", world=12),
     "not a whole number of nodes"),
])
def test_nccl_channel_parts_refuse_bad_input(call, match):
    with pytest.raises(fpemu.errors.FpemuValueError, match=match):
        call()


def test_gloo_fp16_nan_is_c10s_with_the_sign_of_x86s():
    """Without processes: inf - inf gives 0xfe00 (the default NaN's sign); the
    own value's NaN wins over the received one's; max passes a held NaN's bits
    on; avg keeps the sign through the division."""
    f = lambda *b: np.array(b, np.uint32).view(np.float32)          # noqa: E731
    a = f(0x7F800000, 0xFFC02000, 0x7FC00000, 0x3F800000, 0xFFD00000)     # rank 0
    b = f(0xFF800000, 0x7FC00000, 0xFFC00000, 0xFFC00000, 0x7FC00000)     # rank 1
    # gloo's chunks of 5 fp16 on 2 ranks are [0, 4) and [4, 5): chunk 0 starts
    # at rank 1 and ends at rank 0, whose value is the own operand; chunk 1 the
    # other way round
    assert collectives.gloo_ring_chunks(5, 2, 2).tolist() == [0, 4, 5]
    want = [0xFFC00000,     # +inf (own) + -inf: the default NaN, negative
            0xFFC00000,     # own -NaN (payload dropped) over the received +NaN
            0x7FC00000,     # own +NaN over the received -NaN
            0xFFC00000,     # 1 + received -NaN
            0x7FC00000]     # chunk 1: own (rank 1) +NaN over rank 0's -NaN
    got = collectives.all_reduce([a, b], "fp16")[0].view(np.uint32)
    assert [hex(v) for v in got] == [hex(v) for v in want]
    avg = collectives.all_reduce([a, b], "fp16", "avg")[0].view(np.uint32)
    assert [hex(v) for v in avg] == [hex(v) for v in want]
    mx = collectives.all_reduce([a, b], "fp16", "max")[0].view(np.uint32)
    assert hex(mx[1]) == "0xffc02000"           # std::max keeps own's NaN, bits and all


def test_gloo_bf16_max_keeps_the_finishing_ranks_nan_and_avg_follows_atens_loop():
    """Without processes. std::max(own, received) / std::min return own when
    either is NaN, so the result is NaN where the rank that finishes the
    chunk holds one, and it is that NaN's code. A bf16 avg's NaN is 0xffff
    where ATen's vector loop (32 bf16 a step) divides, 0x7fc0 in the scalar
    rest of each thread's range; the ranges are ATen's parallel_for split
    (one below 32,768 elements; else ceil(n / t) each, t = min(threads,
    ceil(n / 32768)))."""
    f = lambda *b: np.array(b, np.uint32).view(np.float32)          # noqa: E731
    # 2 ranks of 5: chunk [0, 4) ends at rank 0, chunk [4, 5) at rank 1
    assert collectives.gloo_ring_chunks(5, 2, 2).tolist() == [0, 4, 5]
    a = f(0x7FA10000, 0x3F800000, 0xFFC30000, 0x7FA00001, 0x3F800000)     # rank 0
    b = f(0xFFC30000, 0x7FA10000, 0x40000000, 0x3F800000, 0xFF810000)     # rank 1
    want = [0x7FA10000,     # own (rank 0) NaN, signalling, kept as it is
            0x3F800000,     # own 1 over the received NaN: the NaN is dropped
            0xFFC30000,     # own negative NaN
            0x7FC00000,     # own float32 NaN that is no bf16 NaN: cast (fpemu's one NaN)
            0xFF810000]     # chunk 1 ends at rank 1: its own NaN
    for op in ("max", "min"):
        got = collectives.all_reduce([a, b], "bf16", op)[0].view(np.uint32)
        assert [hex(v) for v in got] == [hex(v) for v in want], op
    assert collectives.all_reduce([b, a], "bf16", "max")[0].view(np.uint32)[4] == 0x3F800000

    def avg_nans(n, threads, where):
        x = np.ones(n, np.float32)
        x[where] = np.nan
        out = collectives.all_reduce([x, x], "bf16", "avg", threads=threads)[0]
        return [hex(v) for v in out.view(np.uint32)[where]]
    vec, rest = "0xffff0000", "0x7fc00000"
    assert avg_nans(100, 1, [0, 95, 96, 99]) == [vec, vec, rest, rest]
    assert avg_nans(30000, 8, [29983, 29984]) == [vec, rest]      # under the grain: one range
    # 70,000 on 2 threads: [0, 35000) and [35000, 70000), vector loops to 34,976 and 69,976
    at = [34975, 34976, 34999, 35000, 69975, 69976, 69999]
    assert avg_nans(70000, 2, at) == [vec, rest, rest, vec, vec, rest, rest]
    assert avg_nans(70000, 1, at) == [vec] * 6 + [rest]            # one range: 69,984
    # 100,002 on 8 threads: min(8, 4) = 4 ranges of 25,001
    assert avg_nans(100002, 8, [24991, 24992, 25001, 100001]) == [vec, rest, vec, rest]
    assert [hex(v) for v in collectives.reduce_scatter(
        [np.full(64, np.nan, np.float32)] * 2, "bf16", "avg")[1].view(np.uint32)[-1:]] == [vec]
    # fp16's NaN is the same from either path
    x = np.full(100, np.nan, np.float32)
    assert set(collectives.all_reduce([x, x], "fp16", "avg", threads=3)[0].view(
        np.uint32).tolist()) == {0x7FC00000}


def test_a_new_algorithm_is_one_table_entry(monkeypatch):
    """An algorithm added as one ALGORITHM_TABLE entry runs through every
    collective that takes ``algorithm=`` (all_reduce, reduce_scatter, DDP),
    with the table's checks of its ops and parameters."""

    def halving(V, fmt, op, scale, params, fname):
        # ranks added in pairs, each sum rounded to the wire format
        rows = [V[r].astype(np.float64) for r in range(V.shape[0])]
        while len(rows) > 1:
            rows = [fpemu.quantize(rows[i] + rows[i + 1], fmt).astype(np.float64)
                    if i + 1 < len(rows) else rows[i] for i in range(0, len(rows), 2)]
        return fpemu.quantize(rows[0], fmt)

    monkeypatch.setitem(ALGORITHM_TABLE, "halving",
                        Algorithm("halving", ("sum",), ("bf16",), (), halving))
    x = np.float32([1.0, 2.0**-8, 3.0, 2.0**-8 + 2.0**-9])
    xs = [x, x[::-1].copy(), np.float32([2.0**-8] * 4), np.float32([1.0] * 4)]
    got = collectives.all_reduce(xs, "bf16", algorithm="halving")[0]
    b = [fpemu.quantize(v, "bf16").astype(np.float64) for v in xs]
    want = fpemu.quantize(fpemu.quantize(b[0] + b[1], "bf16").astype(np.float64)
                          + fpemu.quantize(b[2] + b[3], "bf16").astype(np.float64), "bf16")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    parts = collectives.reduce_scatter([v.reshape(4, 1) for v in xs], "bf16",
                                       algorithm="halving")
    np.testing.assert_array_equal(np.concatenate(parts).reshape(-1), want)
    grads = [[v.reshape(2, 2)] for v in xs]
    ddp = collectives.ddp_all_reduce(grads, "bf16", algorithm="halving")
    exact = collectives.ddp_all_reduce(grads, "bf16", algorithm="exact")
    assert len(ddp) == 1 and ddp[0].shape == (2, 2)
    assert np.abs(ddp[0] - exact[0]).max() <= 2.0**-7     # one bf16 rounding apart at most
    with pytest.raises(fpemu.errors.FpemuValueError,
                       match="algorithm 'halving' has no op 'max' \\(its ops: sum\\)"):
        collectives.all_reduce(xs, "bf16", "max", algorithm="halving")
    with pytest.raises(fpemu.errors.FpemuValueError, match="covers bf16, not fp16"):
        collectives.all_reduce(xs, "fp16", algorithm="halving")
    with pytest.raises(fpemu.errors.FpemuValueError,
                       match="parts= is a parameter of algorithm='ring' or 'tree', not "
                             "'halving'"):
        collectives.all_reduce(xs, "bf16", algorithm="halving", parts=[(4, 4)])


def test_a_new_algorithm_parameter_is_part_of_its_entry(monkeypatch):
    """A parameter is declared in its algorithm's ALGORITHM_TABLE entry and
    nowhere else: all_reduce, reduce_scatter and DDP pass it on, the other
    algorithms refuse it naming its owner, and a keyword no algorithm takes
    is a TypeError that lists the parameters."""
    def ordered(V, fmt, op, scale, params, fname):
        # the ranks added one by one, in the order ``reverse`` asks for, each
        # sum rounded to the wire format
        rows = [V[r].astype(np.float64) for r in range(V.shape[0])]
        rows = rows[::-1] if params.get("reverse") else rows
        acc = rows[0]
        for row in rows[1:]:
            acc = fpemu.quantize(acc + row, fmt).astype(np.float64)
        return fpemu.quantize(acc, fmt)

    monkeypatch.setitem(ALGORITHM_TABLE, "ordered", Algorithm(
        "ordered", ("sum",), ("bf16",), {"reverse": Param("bool", "add the last rank first.")},
        ordered))
    one, tiny = np.float32([1.0]), np.float32([2.0**-8])
    xs = [one, tiny, tiny]                   # 1 + 2**-8 rounds to 1 in bf16; 2**-7 + 1 does not
    fwd = collectives.all_reduce(xs, "bf16", algorithm="ordered")[0]
    rev = collectives.all_reduce(xs, "bf16", algorithm="ordered", reverse=True)[0]
    assert fwd.tolist() == [1.0] and rev.tolist() == [1.0078125]
    parts = collectives.reduce_scatter([np.concatenate([x] * 3).reshape(3, 1) for x in xs],
                                       "bf16", algorithm="ordered", reverse=True)
    assert [p.tolist() for p in parts] == [[[1.0078125]]] * 3
    ddp = collectives.ddp_all_reduce([[x.reshape(1, 1)] for x in xs], "bf16",
                                     algorithm="ordered", reverse=True)
    assert ddp[0].shape == (1, 1)
    with pytest.raises(fpemu.errors.FpemuValueError,
                       match="reverse= is a parameter of algorithm='ordered', not 'gloo'"):
        collectives.all_reduce(xs, "bf16", reverse=True)
    with pytest.raises(fpemu.errors.FpemuTypeError,
                       match="all_reduce\\(\\): unexpected keyword argument 'revers': no "
                             "algorithm takes it; the algorithms' parameters are "
                             "gpus_per_node, .*reverse"):
        collectives.all_reduce(xs, "bf16", algorithm="ordered", revers=True)
    with pytest.raises(fpemu.errors.FpemuTypeError,
                       match="ddp_all_reduce\\(\\): unexpected keyword argument 'revers'"):
        collectives.ddp_all_reduce([[x] for x in xs], "bf16", algorithm="ordered", revers=True)


def test_every_algorithm_and_parameter_is_documented():
    """all_reduce's text lists every algorithm of ALGORITHM_TABLE and
    documents every parameter (it is made from the table); the text of
    fpemu.collectives and docs/collectives.md describe each algorithm."""
    doc = collectives.all_reduce.__doc__
    names = "{" + ", ".join(f'"{n}"' for n in ALGORITHM_TABLE) + "}"
    assert f"algorithm : {names}\n" in doc
    for alg in ALGORITHM_TABLE.values():
        for name, param in alg.params.items():
            assert f"\n    {name} : {param.type}\n" in doc, name
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "collectives.md")) as fh:
        page = fh.read()
    for name in ALGORITHM_TABLE:
        assert f'\n``"{name}"``\n' in collectives.__doc__, (
            f"describe algorithm {name!r} in the module text of fpemu/collectives/__init__.py")
        assert f'\n**`"{name}"`**: ' in page, (
            f"describe algorithm {name!r} under 'Algorithms' in docs/collectives.md")
