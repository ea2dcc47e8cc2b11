"""``einsum`` as torch computes it: views, sums and batched matrix products.

torch's einsum (``aten/src/ATen/native/Linear.cpp``) never multiplies and
sums in one loop of its own. It takes diagonals for repeated labels, permutes
every operand into one label order (output labels first), sums a label that
only one operand has, and contracts the operands left to right, two at a
time, with ``bmm`` (``sumproduct_pair``). fpemu composes the same steps from
its own ops, so each contraction is an emulated matmul (fp32 accumulation
under the matmul model, tf32 where enabled) with its own rounding, and the
gradient comes from those ops. Autocast: ``lower``, as torch's.

torch orders three or more operands by opt_einsum's path when that package is
installed; fpemu always contracts left to right (torch's order without it).
"""

from __future__ import annotations

#: What ``fpemu.autograd.ops`` gathers from this module (and with it
#: ``fpemu.autograd``, torch's namespace); its other public names are helpers
#: the sibling modules share.
__all__ = ["einsum"]

import string

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from .._autocast import cast_inputs
from .._core import Tensor
from .linalg import bmm
from .reduce import sum as _sum
from .shape import diagonal, permute, reshape, squeeze, unsqueeze
from .elementwise import mul

_LETTERS = string.ascii_uppercase + string.ascii_lowercase     # torch's label order


def _sublists(args):
    """``einsum(a, [0, 1], b, [1, 2], [0, 2])`` as an equation and operands."""
    def letters(sub):
        out = ""
        for s in sub:
            if s is Ellipsis:
                out += "..."
            elif isinstance(s, (int, np.integer)) and 0 <= s < 52:
                out += _LETTERS[s]
            else:
                raise FpemuValueError(f"einsum(): expected subscript to be within the range "
                                      f"[0, 52), but got {s!r}")
        return out
    ops, terms = [], []
    i = 0
    while i + 1 < len(args) and isinstance(args[i], Tensor):
        ops.append(args[i])
        terms.append(letters(args[i + 1]))
        i += 2
    eq = ",".join(terms)
    if i < len(args):
        eq += "->" + letters(args[i])
    return eq, ops


def _parse(equation, n_ops):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) < n_ops:
        raise FpemuValueError("einsum(): more operands were provided than specified in the "
                              "equation")
    if len(terms) > n_ops:
        raise FpemuValueError("einsum(): fewer operands were provided than specified in the "
                              "equation")
    for t in terms + ([rhs] if arrow else []):
        body = t.replace("...", "", 1)
        if "." in body:
            raise FpemuValueError("einsum(): found '.' for operand that is not part of any "
                                  "ellipsis")
        bad = [c for c in body if c not in _LETTERS]
        if bad:
            raise FpemuValueError(f"einsum(): invalid subscript given at index "
                                  f"{eq.index(bad[0])} in the equation string, subscripts "
                                  f"must be in [a-zA-Z]")
    return terms, (rhs if arrow else None)


def _tokens(term, ndim, i, ell_total):
    """The labels of an operand's dims; the ellipsis's dims are ("...", k)
    aligned to the right across operands."""
    if "..." in term:
        head, tail = term.split("...")
        ell = ndim - len(head) - len(tail)
        if ell < 0:
            raise FpemuRuntimeError(
                f"einsum(): the number of subscripts in the equation ({len(head) + len(tail)}) "
                f"is more than the number of dimensions ({ndim}) for operand {i}")
        return (list(head) + [("...", ell_total - ell + k) for k in range(ell)] + list(tail),
                ell)
    if len(term) != ndim:
        raise FpemuRuntimeError(
            f"einsum(): the number of subscripts in the equation ({len(term)}) does not match "
            f"the number of dimensions ({ndim}) for operand {i} and no ellipsis was given")
    return list(term), 0


def einsum(*args):
    """``einsum(equation, *operands)``, ``einsum(equation, [operands])`` or the
    sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``."""
    if args and isinstance(args[0], Tensor):
        equation, ops = _sublists(args)
    else:
        if not args or not isinstance(args[0], str):
            raise FpemuTypeError("einsum(): expected an equation string and tensors, got "
                                 f"{[type(a).__name__ for a in args]}")
        equation, ops = args[0], list(args[1:])
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = list(ops[0])
    if not ops:
        raise FpemuValueError("einsum(): must provide at least one operand")
    for t in ops:
        if not isinstance(t, Tensor):
            raise FpemuTypeError(f"einsum(): expected Tensors as operands, got "
                                 f"{type(t).__name__}")
    ops = list(cast_inputs("einsum", *ops))
    terms, rhs = _parse(equation, len(ops))
    ell_total = max(t.ndim - len(term.replace("...", "")) if "..." in term else 0
                    for t, term in zip(ops, terms))
    toks = []
    for i, (t, term) in enumerate(zip(ops, terms)):
        tk, _ = _tokens(term, t.ndim, i, ell_total)
        toks.append(tk)
    ell = [("...", k) for k in range(ell_total)]
    counts = {}
    for tk in toks:
        for lab in set(tk):
            counts[lab] = counts.get(lab, 0) + 1
    if rhs is None:
        singles = sorted((lab for lab in counts if isinstance(lab, str) and
                          sum(tk.count(lab) for tk in toks) == 1), key=_LETTERS.index)
        out = ell + singles
    else:
        out = []
        seen_ell = "..." in rhs
        head, _, tail = rhs.partition("...") if seen_ell else (rhs, "", "")
        for part, is_ell in ((head, False), ("", True), (tail, False)):
            if is_ell:
                if seen_ell:
                    out += ell
                continue
            for c in part:
                if c in out:
                    raise FpemuValueError(f"einsum(): output subscript {c} appears more than "
                                          f"once in the output")
                if c not in counts:
                    raise FpemuValueError(f"einsum(): output subscript {c} does not appear in "
                                          f"the equation for any input operand")
                out.append(c)
    contraction = sorted((lab for lab in counts if lab not in out),
                         key=lambda lab: (isinstance(lab, str), _LETTERS.index(lab)
                                          if isinstance(lab, str) else lab[1]))
    order = out + contraction
    sizes = {}
    perm_ops = []
    for i, (t, tk) in enumerate(zip(ops, toks)):
        t, tk = _diagonals(t, tk)
        for lab, n in zip(tk, t.shape):
            if n != 1:
                if sizes.setdefault(lab, n) != n:
                    raise FpemuRuntimeError(
                        f"einsum(): operands do not broadcast with remapped shapes "
                        f"(original->remapped): the subscript {_name(lab)} has size "
                        f"{sizes[lab]} in one operand and {n} in operand {i}")
        # permute to the common order, a size-1 dim for each label it lacks
        have = [order.index(lab) for lab in tk]
        t = permute(t, tuple(int(k) for k in np.argsort(have))) if tk else t
        present = sorted(have)
        for pos, lab in enumerate(order):
            if pos not in present:
                t = unsqueeze(t, pos)
        perm_ops.append(t)
    n_out = len(out)
    if len(perm_ops) == 1:
        res = perm_ops[0]
        if contraction:
            res = _sum(res, tuple(range(n_out, len(order))))
        return res
    # how many operands still hold each contraction label (size != 1)
    dim_counts = [sum(1 for t in perm_ops if t.shape[d] != 1) for d in range(len(order))]
    a = perm_ops[0]
    for b in perm_ops[1:]:
        sum_dims, a_sum, b_sum = [], [], []
        for d in range(n_out, len(order)):
            if a.shape[d] != 1 and b.shape[d] != 1:
                dim_counts[d] -= 1
                if dim_counts[d] == 1:
                    sum_dims.append(d)
                    dim_counts[d] = 0
            elif dim_counts[d] == 1:
                if a.shape[d] != 1:
                    a_sum.append(d)
                    dim_counts[d] = 0
                elif b.shape[d] != 1:
                    b_sum.append(d)
                    dim_counts[d] = 0
        if a_sum:
            a = _sum(a, tuple(a_sum), keepdim=True)
        if b_sum:
            b = _sum(b, tuple(b_sum), keepdim=True)
        a = _sumproduct_pair(a, b, sum_dims)
    if len(order) > n_out:
        rest = tuple(range(n_out, len(order)))
        if any(a.shape[d] != 1 for d in rest):
            a = _sum(a, rest)
        else:
            for d in reversed(rest):
                a = squeeze(a, d)
    return a


def _name(lab):
    return "'...'" if isinstance(lab, tuple) else lab


def _diagonals(t, tk):
    """Repeated labels of one operand: their diagonal, as one dim (last)."""
    tk = list(tk)
    while True:
        rep = next((lab for lab in tk if tk.count(lab) > 1), None)
        if rep is None:
            return t, tk
        i = tk.index(rep)
        j = tk.index(rep, i + 1)
        if t.shape[i] != t.shape[j]:
            raise FpemuRuntimeError(f"einsum(): subscript {rep} is repeated for operand but "
                                    f"the sizes don't match, {t.shape[i]} != {t.shape[j]}")
        t = diagonal(t, 0, i, j)
        tk = [lab for k, lab in enumerate(tk) if k not in (i, j)] + [rep]


def _sumproduct_pair(a, b, sum_dims):
    """torch's ``sumproduct_pair`` with keepdim: the product of ``a`` and
    ``b`` (same rank, dims of size 1 broadcast), summed over ``sum_dims``,
    as one ``bmm`` of (batch, left-only, summed) by (batch, summed,
    right-only)."""
    nd = a.ndim
    if not sum_dims:
        return mul(a, b)
    lro, lo, ro = [], [], []
    for d in range(nd):
        if d in sum_dims:
            continue
        if a.shape[d] != 1 and b.shape[d] != 1:
            lro.append(d)
        elif a.shape[d] != 1:
            lo.append(d)
        elif b.shape[d] != 1:
            ro.append(d)
        else:
            lro.append(d)

    def size(t, ds):
        return int(np.prod([t.shape[d] for d in ds])) if ds else 1
    left = permute(a, tuple(lro + lo + sum_dims + ro))
    right = permute(b, tuple(lro + sum_dims + ro + lo))
    left = reshape(left, (size(a, lro), size(a, lo), size(a, sum_dims)))
    right = reshape(right, (size(b, lro), size(b, sum_dims), size(b, ro)))
    prod = bmm(left, right)
    shape = [a.shape[d] for d in lro] + [a.shape[d] for d in lo] + [b.shape[d] for d in ro]
    prod = reshape(prod, tuple(shape))
    placed = lro + lo + ro
    for d in sorted(sum_dims):
        placed.append(d)
        prod = unsqueeze(prod, prod.ndim)
    inverse = [placed.index(d) for d in range(nd)]
    return permute(prod, tuple(inverse))
