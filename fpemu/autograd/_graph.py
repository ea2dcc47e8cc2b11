"""The backward graph: its :class:`Node` objects (autograd's ``grad_fn``),
the checks of the values a node saved, how nodes are named, the order the
backward pass visits them, and the sums it makes of gradients.

An op's output points at its node, the node at the nodes of the inputs (a
leaf that requires grad has an :class:`AccumulateGrad` node). An in-place op
gives the tensor a new node and leaves the old one to the ops that read the
old value. The backward pass over this graph is ``_core.run_backward``.
"""

from __future__ import annotations

import functools
import re
import weakref

import numpy as np

from ..errors import FpemuRuntimeError
from ._cpu_reduce import cpu_sum
from ._cuda_reduce import cuda_sum
from ._dtypes import bfloat16, float16, float32, float64, is_float, opmath, _store
from ._hooks import RemovableHandle
from ._profile import get_profile

_SAVED_FREED = ("Trying to backward through the graph a second time (or directly access "
                "saved tensors after they have already been freed). Saved intermediate values "
                "of the graph are freed when you call .backward() or autograd.grad(). Specify "
                "retain_graph=True if you need to backward through the graph a second time or "
                "if you need to access saved tensors after calling backward.")


class Node:
    """A step of the backward graph (``tensor.grad_fn``).

    ``back(g)`` returns one gradient (or None) per input; ``inputs`` holds,
    per input, ``(node, dtype, shape)`` or None for an input that needs no
    gradient. ``saved`` lists ``(tensor, version)`` pairs that ``back`` reads.
    ``stored``: ``back`` returns values of each input's dtype already (it
    rounds them itself, or only moves the values of ``g``), so the backward
    pass does not round them again.
    """

    __slots__ = ("back", "inputs", "saved", "freed", "hooks", "retained", "op", "stored",
                 "__weakref__")

    def __init__(self, op, back, inputs, saved=(), stored=False):
        self.op, self.back, self.inputs = op, back, inputs
        self.saved = saved
        self.stored = stored
        self.freed = False
        self.hooks = []
        self.retained = None

    def name(self):
        # a custom autograd.Function's node is named as torch names it ("MyReLUBackward");
        # an op of another overload carries its number ("SumBackward1")
        if self.op.endswith("Backward") or _NUMBERED.search(self.op):
            return self.op
        return f"{self.op}Backward0"

    @property
    def next_functions(self):
        return tuple((i[0] if i else None, 0) for i in self.inputs)

    def register_hook(self, hook):
        self.hooks.append(hook)
        return RemovableHandle(self.hooks, hook)

    def __repr__(self):
        return f"<{self.name()} object>"


class AccumulateGrad(Node):
    """The node of a leaf that requires grad: adds the gradient into ``.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable):
        super().__init__("AccumulateGrad", None, ())
        self.variable = weakref.ref(variable)

    def name(self):
        return "AccumulateGrad"


def _shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_saved(node):
    if node.freed:
        raise FpemuRuntimeError(_SAVED_FREED)
    for t, version in node.saved:
        if t._vc[0] != version:
            raise FpemuRuntimeError(
                f"one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: [{t.dtype} {_shape_str(t.shape)}], which is an input "
                f"of {node.name()}, is at version {t._vc[0]}; expected version {version} "
                f"instead. Hint: the in-place operation changed a value this backward needs; "
                f"use the out-of-place form (x = x + y rather than x += y), or .clone() first.")


def _topo(roots):
    """Nodes reachable from ``roots``, each after every node that feeds it a
    gradient (reverse topological order of the forward)."""
    order, seen, stack = [], set(), [(r, False) for r in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for edge in node.inputs:
            if edge is not None and id(edge[0]) not in seen:
                stack.append((edge[0], False))
    order.reverse()
    return order


def _accumulate(old, new, dtype):
    if old is None:
        return new
    dt = opmath(dtype)
    return _store(old.astype(dt, copy=False) + new.astype(dt, copy=False), dtype)


def _named(t, name):
    """``t`` with its graph node named ``name`` as torch names it ("T",
    "SqueezeBackward1"): ops that fpemu composes of others, or that torch
    counts as another overload of one function, print torch's grad_fn."""
    node = t.grad_fn
    if node is not None and not isinstance(node, AccumulateGrad):
        node.op = name
    return t


_NUMBERED = re.compile(r"Backward\d+$")


@functools.lru_cache(maxsize=None)
def _node_name(name):
    return "".join(part[:1].upper() + part[1:] for part in name.strip("_").split("_"))


def _sum_to(g, shape, dtype):
    """Sum a gradient over broadcast axes, one reduction as ATen's ``sum_to``
    (ExpandUtils.h): the gradient's values in ``dtype`` added in float32
    (float64 for float64) in the order of ATen's reduction kernel, under the
    CUDA profile its CUDA kernel's (``fpemu.autograd._cuda_reduce``), under
    the CPU profile ``cascade_sum``'s (``fpemu.autograd._cpu_reduce``, which
    also rounds a 16-bit sum as torch's kernel does); other formats in
    float64, rounded once."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    if get_profile().device == "cuda" and g.size and is_float(dtype):
        vals = np.asarray(g, np.float64) if dtype is float64 else (
            g if g.dtype == np.float32 and dtype.name == "fp32" else _store(g, dtype))
        return cuda_sum(vals, axes, True, dtype).reshape(shape)
    if g.size and dtype in (float32, float64, bfloat16, float16):
        prof = get_profile()
        vals = np.asarray(g, np.float64) if dtype is float64 else (
            g if g.dtype == np.float32 and dtype is float32 else _store(g, dtype))
        half = "bfloat16" if dtype is bfloat16 else "float16" if dtype is float16 else None
        return cpu_sum(vals, axes, True, threads=prof.cpu_threads,
                       capability=prof.cpu_capability, dtype=half).reshape(shape)
    s = g.astype(np.float64).sum(axis=axes, keepdims=True)
    return _store(s.reshape(shape), dtype)
