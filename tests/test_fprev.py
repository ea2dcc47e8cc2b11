"""bench/fprev.py rebuilds a summation tree from FPRev probes (arXiv
2411.00442). Each known order below is a float32 sum written out here (a
loop, a recursion, a warp's shuffles, blocks), run on the probe inputs
(units, +M at i, -M at j); its expected tree is written here by the same
steps on symbols. The recovered tree must equal it."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))

import fprev  # noqa: E402

f32 = np.float32


# --------------------------------------------- sums in known orders (float32)
def seq_sum(x):
    acc = f32(0)
    for v in x:
        acc = f32(acc + v)
    return acc


def pairwise_sum(x):
    if len(x) == 1:
        return f32(x[0])
    h = len(x) // 2
    return f32(pairwise_sum(x[:h]) + pairwise_sum(x[h:]))


def warp_sum(x, add=lambda a, b: f32(a + b)):
    """32 lanes: lane l sums x[l], x[l + 32], ... in turn (a thread's loop),
    then shfl_down by 16, 8, 4, 2, 1; lane 0 holds the result."""
    lanes = [None] * 32
    for lane in range(32):
        acc = None
        for k in range(lane, len(x), 32):
            acc = x[k] if acc is None else add(acc, x[k])
        lanes[lane] = acc
    for off in (16, 8, 4, 2, 1):
        lanes = [add(lanes[t], lanes[t + off]) if t + off < 32 and lanes[t + off] is not None
                 and lanes[t] is not None else lanes[t] for t in range(32)]
    return lanes[0]


def blocked_sum(x, block=8):
    """Blocks of ``block`` summed in a loop from zero, the blocks' sums added in
    a loop."""
    total = None
    for b in range(0, len(x), block):
        part = x[b]
        for v in x[b + 1:b + block]:
            part = f32(part + v)
        total = part if total is None else f32(total + part)
    return total


# the same orders on symbols: each addition makes a node (a, b)
def sym_add(a, b):
    return (a, b)


def seq_tree(n):
    t = 0
    for i in range(1, n):
        t = (t, i)
    return t


def pairwise_tree(ids):
    if len(ids) == 1:
        return ids[0]
    h = len(ids) // 2
    return (pairwise_tree(ids[:h]), pairwise_tree(ids[h:]))


def blocked_tree(n, block=8):
    total = None
    for b in range(0, n, block):
        part = b
        for v in range(b + 1, min(b + block, n)):
            part = (part, v)
        total = part if total is None else (total, part)
    return total


def probe_with(sum_fn, n, dtype="float32", leaf_ids=None, calls=None):
    """probe(pairs) for fprev.reveal: each pair a float32 run of sum_fn on
    units with +M at i and -M at j (zeros outside leaf_ids)."""
    ids = list(range(n)) if leaf_ids is None else list(leaf_ids)
    u, M = fprev.unit_and_big(dtype, len(ids))

    def probe(pairs):
        if calls is not None:
            calls.append(len(pairs))
        out = []
        for i, j in pairs:
            x = np.zeros(n, f32)
            x[ids] = f32(u)
            x[i], x[j] = f32(M), f32(-M)
            out.append(fprev.count_from_sum(float(sum_fn(list(x))), u, len(ids)))
        return out
    return probe


@pytest.mark.parametrize("n", [2, 3, 17, 64])
def test_a_loop_is_a_chain_in_index_order(n):
    calls = []
    tree, known = fprev.reveal(probe_with(seq_sum, n, calls=calls), range(n))
    assert fprev.canonical(tree) == fprev.canonical(seq_tree(n))
    assert sum(calls) == n - 1 and len(calls) == 1          # one round, n - 1 probes
    assert "a chain of" in fprev.describe(tree)[0] and "in index order" in fprev.describe(tree)[0]


@pytest.mark.parametrize("n", [4, 13, 64])
def test_a_pairwise_sum_is_the_balanced_tree(n):
    calls = []
    tree, _ = fprev.reveal(probe_with(pairwise_sum, n, calls=calls), range(n))
    assert fprev.canonical(tree) == fprev.canonical(pairwise_tree(list(range(n))))
    assert fprev.canonical(tree) != fprev.canonical(seq_tree(n))
    assert sum(calls) <= 3 * n
    if n == 64:
        assert "a balanced tree of 64 leaves {0..63}" in fprev.describe(tree)[0]


@pytest.mark.parametrize("n", [32, 100, 256])
def test_a_warp_butterfly_is_revealed(n):
    """32 lanes each summing a strided run, then shfl_down 16, 8, 4, 2, 1."""
    tree, _ = fprev.reveal(probe_with(warp_sum, n), range(n))
    want = warp_sum(list(range(n)), add=sym_add)
    assert fprev.canonical(tree) == fprev.canonical(want)
    if n == 256:        # lane 0's chain is leaves 0, 32, ..., 224
        text = "\n".join(fprev.describe(tree))
        assert "chains: 32 of 8 leaves (e.g. {0..224 step 32} in index order" in text
        assert "joined by a balanced tree of 32 parts" in text


def test_a_blocked_sum_is_revealed():
    n = 40
    tree, _ = fprev.reveal(probe_with(blocked_sum, n), range(n))
    assert fprev.canonical(tree) == fprev.canonical(blocked_tree(n))
    assert fprev.canonical(tree) != fprev.canonical(seq_tree(n))


def test_a_subset_of_leaves_gives_the_induced_tree():
    """Zeros off the probed leaves: the warp tree restricted to them."""
    n = 256
    ids = list(range(0, 64)) + list(range(64, 256, 16))
    tree, _ = fprev.reveal(probe_with(warp_sum, n, leaf_ids=ids), ids)

    def induced(t):
        if not isinstance(t, tuple):
            return t if t in ids else None
        kids = [k for k in (induced(c) for c in t) if k is not None]
        return None if not kids else kids[0] if len(kids) == 1 else tuple(kids)
    want = induced(warp_sum(list(range(n)), add=sym_add))
    assert fprev.canonical(tree) == fprev.canonical(want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_inputs_with_a_float32_accumulator(dtype):
    """The unit and M are values of the dtype and the sums float32 (ATen's
    opmath): the probes still count whole units."""
    import ml_dtypes
    n = 48
    u, M = fprev.unit_and_big(dtype, n)
    np_dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.float16
    assert float(np.array(u, np_dt)) == u and float(np.array(M, np_dt)) == M
    tree, _ = fprev.reveal(probe_with(pairwise_sum, n, dtype=dtype), range(n))
    assert fprev.canonical(tree) == fprev.canonical(pairwise_tree(list(range(n))))


def test_a_fused_add_of_several_terms_is_refused():
    """Four partial sums added exactly and rounded once (a tensor core's fused
    add, not a binary tree): the sizes fit no tree, and reveal says so."""
    def sum4(x):
        parts = [pairwise_sum(x[k:k + 4]) for k in range(0, 16, 4)]
        return f32(np.float64(parts[0]) + parts[1] + parts[2] + parts[3])   # exact, one rounding
    with pytest.raises(fprev.Inconsistent, match="node of 8 leaves make 16"):
        fprev.reveal(probe_with(sum4, 16), range(16))


def test_recorded_sizes_rebuild_the_tree_without_probing():
    probe = probe_with(warp_sum, 64)
    tree, known = fprev.reveal(probe, range(64))

    def refuse(pairs):
        raise AssertionError(f"probed {len(pairs)} pairs again")
    again, _ = fprev.reveal(refuse, range(64), known=known)
    assert again == tree


def test_sizes_that_fit_no_tree_are_refused():
    # L(0, 1) = 2 and L(0, 2) = 2: a node of two leaves cannot hold three
    with pytest.raises(fprev.Inconsistent, match="make 3"):
        fprev.reveal(lambda pairs: [2 for _ in pairs], range(3))
    with pytest.raises(fprev.Inconsistent, match="not a whole number"):
        fprev.count_from_sum(2.5, 1.0, 10)
    with pytest.raises(RuntimeError, match="more than 5 probes"):
        fprev.reveal(probe_with(seq_sum, 10), range(10), max_probes=5)
    with pytest.raises(ValueError, match="at most 2\\^13"):
        fprev.unit_and_big("float16", 2**14)
