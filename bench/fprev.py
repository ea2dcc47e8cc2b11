"""The order of a floating-point sum, revealed from its outputs (FPRev).

FPRev (Xie et al., "FPRev: Revealing the order of floating-point summation
by numerical testing", arXiv 2411.00442) feeds a reduction ``n`` units (ones,
or another small value ``u``) with a big ``+M`` at leaf ``i`` and ``-M`` at
leaf ``j``: every partial sum of units added to ``+M`` or ``-M`` is absorbed
(``M`` is chosen so that ``M + c*u == M`` for every count ``c`` up to ``n``),
``M`` and ``-M`` cancel exactly where their subtrees meet, and every other
partial sum of units is exact. The output is therefore ``(n - L(i, j)) * u``,
``L(i, j)`` the number of leaves of the smallest subtree holding both ``i``
and ``j``. From these sizes the summation tree is rebuilt:

- for one leaf ``i``, the sizes ``L(i, j)`` of every other ``j`` name the
  chain of subtrees holding ``i``: the leaves with ``L(i, j) = s`` are the
  ones joined to ``i``'s subtree at the node of ``s`` leaves;
- each such group is rebuilt the same way (its own pairs).

Additions are binary (a CUDA core's, a CPU's). A fused add of several
terms rounded once (a tensor core's) gives sizes that fit no tree, and is
refused (:class:`Inconsistent`) rather than rebuilt wrong.

So a binary tree of ``n`` leaves takes about ``2n`` probes (``n - 1`` for a
chain), batched by rounds: every probe a round needs is known before any is
run, and :func:`reveal` asks for them at once (a kernel with many outputs
runs one pair per output in the same launch). Leaves that are not probed
hold zeros: the tree is then the one the sum induces on the probed leaves
(a node with one probed child is skipped).

A tree is a leaf index (an int) or a tuple of subtrees (the children of an
addition, in no particular order: the sum is commutative, only the grouping
shows in the rounding). :func:`canonical` sorts children by their smallest
leaf, so trees compare with ``==``; :func:`describe` says what a tree is in a
few lines (``bench/gpu_check.py``'s reductions step prints it).
"""

from __future__ import annotations

import math

__all__ = ["Inconsistent", "reveal", "canonical", "leaves", "size", "describe",
           "sequential_tree", "pairwise_tree", "unit_and_big", "count_from_sum"]


class Inconsistent(Exception):
    """The recorded sizes fit no summation tree (e.g. the units were not all
    absorbed, or the reduction's order changed between launches); the
    message says where."""


def leaves(tree):
    """The leaves of a tree, left to right."""
    if isinstance(tree, tuple):
        out = []
        for t in tree:
            out.extend(leaves(t))
        return out
    return [tree]


def size(tree):
    return len(leaves(tree))


def canonical(tree):
    """The tree with every node's children sorted by their smallest leaf
    (and a node with one child replaced by the child)."""
    if not isinstance(tree, tuple):
        return int(tree)
    kids = [canonical(t) for t in tree]
    if len(kids) == 1:
        return kids[0]
    return tuple(sorted(kids, key=lambda t: min(leaves(t))))


def _forest(group, cap, known, need):
    """The maximal subtrees whose leaves are ``group``; two leaves of
    ``group`` with L >= cap lie in different ones. None while a size is
    unknown (the pairs wanted are added to ``need``)."""
    trees = []
    rest = list(group)
    while rest:
        i, others = rest[0], rest[1:]
        missing = [(i, j) for j in others if (i, j) not in known]
        if missing:
            need.extend(missing)
            return None
        sizes = {j: known[(i, j)] for j in others}
        by_size = {}
        for j in others:
            s = sizes[j]
            if s < 2:
                raise Inconsistent(f"leaves {i} and {j}: a subtree of {s} leaves holds both")
            if s < cap:
                by_size.setdefault(s, []).append(j)
        tree, count, complete = i, 1, True
        for s in sorted(by_size):
            kids = _forest(by_size[s], s, known, need)
            count += len(by_size[s])
            if count != s:
                raise Inconsistent(
                    f"leaf {i}: the leaves joined at the node of {s} leaves make {count} with "
                    f"those below it (sizes seen from leaf {i}: "
                    f"{sorted(set(sizes.values()))[:12]})")
            if kids is None:
                complete = False
            elif complete:
                tree = (tree, *kids)
        if not complete:
            return None
        trees.append(tree)
        rest = [j for j in others if sizes[j] >= cap]
    return trees


def reveal(probe, leaf_ids, max_probes=None, known=None):
    """The summation tree over ``leaf_ids``, and the sizes it was built from.

    ``probe(pairs)`` takes a list of ``(i, j)`` leaf pairs and returns the
    list of ``L(i, j)``, the leaf count (among ``leaf_ids``) of the smallest
    subtree holding both, each from one run with ``+M`` at ``i``, ``-M`` at
    ``j``; it is called once per round with every pair the round needs.
    ``known`` ({(i, j): L}) are sizes measured before (a recorded run:
    :func:`reveal` then probes nothing it holds). Returns ``(tree, known)``;
    raises :class:`Inconsistent` when the sizes fit no tree, and
    RuntimeError past ``max_probes`` probes.
    """
    ids = [int(i) for i in leaf_ids]
    if len(set(ids)) != len(ids) or not ids:
        raise ValueError(f"reveal(): expected distinct leaf indices, got {len(ids)} with "
                         f"{len(ids) - len(set(ids))} repeated")
    known = dict(known or {})
    n = len(ids)
    probed = 0
    while True:
        need = []
        trees = _forest(ids, math.inf, known, need)
        if trees is not None:
            if len(trees) != 1:
                raise Inconsistent(f"the sizes split the {n} leaves into {len(trees)} trees")
            return trees[0], known
        need = list(dict.fromkeys(need))
        if max_probes is not None and probed + len(need) > max_probes:
            raise RuntimeError(f"reveal(): more than {max_probes} probes needed ({probed} made, "
                               f"{len(need)} more wanted)")
        got = probe(need)
        if len(got) != len(need):
            raise ValueError(f"reveal(): probe returned {len(got)} sizes for {len(need)} pairs")
        for (i, j), s in zip(need, got):
            known[(i, j)] = int(s)
        probed += len(need)


# ------------------------------------------------------------ the inputs
def unit_and_big(dtype, n):
    """(u, M): the unit and the big value of a probe of ``n`` leaves whose
    inputs are ``dtype`` values summed in a float32 accumulator (ATen's
    opmath for float32, bfloat16 and float16): ``M`` is a power of two with
    ``n * u`` below half an ulp of ``M`` in float32, so that every partial sum
    of units added to ``M`` is absorbed, and both are values of ``dtype``.
    float16's largest power of two is 2^15, so its unit is 2^-24 (a
    subnormal) and ``n`` at most 2^13."""
    if n < 2:
        raise ValueError(f"unit_and_big(): a probe needs two leaves or more, got n = {n}")
    if dtype == "float16":
        if n > 2**13:
            raise ValueError(f"unit_and_big(): float16 probes hold at most 2^13 leaves "
                             f"(M = 2^15, u = 2^-24), got n = {n}; probe a subset of the leaves")
        return 2.0**-24, 2.0**15
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"unit_and_big(): dtype must be float32, bfloat16 or float16, got "
                         f"{dtype!r}")
    return 1.0, 2.0 ** (25 + math.ceil(math.log2(n)))


def count_from_sum(value, u, n_leaves):
    """L(i, j) from a probe's sum ``value`` (``(n - L) * u``), or an
    :class:`Inconsistent` error when the value is no whole count of units."""
    c = value / u
    if not (math.isfinite(c) and abs(c - round(c)) < 1e-3 and 0 <= round(c) <= n_leaves - 2):
        raise Inconsistent(f"a probe's output {value!r} is not a whole number of units "
                           f"{u!r} between 0 and {n_leaves - 2}: the big values were not "
                           "absorbed as FPRev assumes")
    return n_leaves - int(round(c))


# ------------------------------------------------ trees of known orders
def sequential_tree(ids):
    """(((i0 + i1) + i2) + ...): a loop in index order."""
    ids = list(ids)
    tree = ids[0]
    for i in ids[1:]:
        tree = (tree, i)
    return tree


def pairwise_tree(ids):
    """A balanced tree: the first half's sum plus the second half's."""
    ids = list(ids)
    if len(ids) == 1:
        return ids[0]
    h = len(ids) // 2
    return (pairwise_tree(ids[:h]), pairwise_tree(ids[h:]))


# ------------------------------------------------------------ describing
def _progression(xs):
    """'a..b step d' for an arithmetic progression, else None."""
    xs = sorted(xs)
    if len(xs) == 1:
        return f"{xs[0]}"
    d = xs[1] - xs[0]
    if all(b - a == d for a, b in zip(xs, xs[1:])):
        return f"{xs[0]}..{xs[-1]}" + (f" step {d}" if d != 1 else "")
    return None


def _leaf_text(ls):
    p = _progression(ls)
    if p is not None:
        return f"{{{p}}}"
    return f"{{{len(ls)} leaves, {min(ls)}..{max(ls)}}}"


def _is_chain(tree):
    """A chain: every node adds one leaf to the rest (left- or right-deep)."""
    while isinstance(tree, tuple):
        if len(tree) != 2:
            return False
        a, b = tree
        if not isinstance(a, tuple):
            tree = b
        elif not isinstance(b, tuple):
            tree = a
        else:
            return False
    return True


def _chain_order(tree):
    """The leaves of a chain in the order they are added (first two first)."""
    order = []
    while isinstance(tree, tuple):
        a, b = tree
        if isinstance(a, tuple):
            order.append(b)
            tree = a
        elif isinstance(b, tuple):
            order.append(a)
            tree = b
        else:                       # the first addition: its two leaves in index order
            order += [max(a, b), min(a, b)]
            break
    else:
        order.append(tree)
    return order[::-1]


def _is_balanced(tree):
    if not isinstance(tree, tuple):
        return True
    return (len(tree) == 2 and abs(size(tree[0]) - size(tree[1])) <= 1
            and all(_is_balanced(t) for t in tree))


def shape_text(tree):
    """One phrase for a subtree: a chain (in which order), a balanced tree,
    or a node of k children."""
    ls = leaves(tree)
    if not isinstance(tree, tuple):
        return f"leaf {tree}"
    if _is_chain(tree):
        order = _chain_order(tree)
        if order == sorted(order):
            how = "in index order"
        elif order == sorted(order)[::-1]:
            how = "in reverse index order"
        else:
            more = ", ..." if len(order) > 4 else ""
            how = "in the order " + ", ".join(map(str, order[:4])) + more
        return f"a chain of {len(ls)} leaves {_leaf_text(ls)} {how}"
    if _is_balanced(tree):
        return f"a balanced tree of {len(ls)} leaves {_leaf_text(ls)}"
    return (f"a node of {len(tree)} subtrees ({' + '.join(str(size(t)) for t in tree)} leaves) "
            f"over {_leaf_text(ls)}")


def _bottom(tree, chains, singles):
    """The maximal chains of a tree (a thread's loop shows as one) and the
    leaves added on their own."""
    if not isinstance(tree, tuple):
        singles.append(tree)
    elif _is_chain(tree):
        chains.append(tree)
    else:
        for t in tree:
            _bottom(t, chains, singles)


def _collapse(tree):
    """The tree with each maximal chain replaced by its smallest leaf."""
    if not isinstance(tree, tuple) or _is_chain(tree):
        return min(leaves(tree))
    return tuple(_collapse(t) for t in tree)


def _depth(tree):
    return 1 + max(_depth(t) for t in tree) if isinstance(tree, tuple) else 0


def describe(tree, depth=2, width=4):
    """A few lines saying what ``tree`` is: the root; the chains at the
    bottom (a thread's loop over its elements shows as one) with their leaf
    sets as progressions, and the tree that joins them; then ``depth`` levels
    from the root (``width`` nodes a level at most). Small trees are also
    printed whole."""
    tree = canonical(tree)
    n = size(tree)
    lines = [f"{n} leaves, depth {_depth(tree)}; the root is {shape_text(tree)}"]
    chains, singles = [], []
    _bottom(tree, chains, singles)
    if isinstance(tree, tuple) and not _is_chain(tree) and not _is_balanced(tree) and chains:
        by_len = {}
        for c in chains:
            by_len.setdefault(size(c), []).append(c)
        parts = []
        for k in sorted(by_len, reverse=True):
            cs = by_len[k]
            eg = "; ".join(shape_text(c).split(" leaves ", 1)[1] for c in cs[:2])
            parts.append(f"{len(cs)} of {k} leaves (e.g. {eg})")
        lines.append("  at the bottom, chains: " + ", ".join(parts)
                     + (f"; {len(singles)} leaves on their own" if singles else ""))
        top = canonical(_collapse(tree))
        lines.append(f"  joined by {shape_text(top).replace(' leaves', ' parts')}"
                     .replace("{", "(first leaves {").replace("}", "})")
                     + f", depth {_depth(top)}")
    level = [tree]
    for d in range(depth):
        kids = [k for t in level if isinstance(t, tuple) and not _is_chain(t)
                and not _is_balanced(t) for k in t if isinstance(k, tuple)]
        if not kids:
            break
        more = f" (+{len(kids) - width} more)" if len(kids) > width else ""
        lines.append(f"  level {d + 1}: " + "; ".join(shape_text(k) for k in kids[:width]) + more)
        level = kids
    if n <= 24:
        lines.append(f"  whole: {tree}")
    return lines
