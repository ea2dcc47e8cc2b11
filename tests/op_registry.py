"""Every op of fpemu.autograd, listed once, in the spirit of torch's OpInfo.

An :class:`Op` names the function (``ops.<module>.<name>`` or
``nn.functional.<name>``), how to call it on both libraries, the sample
inputs, whether a gradient is checked and how the result is compared:

* ``"values"``: fpemu's result (under the CPU profile, float32) against
  torch CPU's: bit for bit where both round one exact result (``exact``:
  arithmetic, comparisons, selections, data movement, the seeded draws),
  else to a few float32 ulps (``rtol``), where torch's SIMD exp / log /
  sin or its blocked sums differ from fpemu's correctly rounded or
  index-order ones;
* ``"shape"``: random ops whose law, not draws, fpemu follows: shape and
  dtype only;
* ``"internal"``: a helper of the package that no program calls by name;
  ``via`` names the entry whose call exercises it.

A sample is ``(args, kwargs)``: numpy arrays become tensors of both
libraries (float arrays with ``requires_grad`` when ``grad`` is on), other
values pass as they are. The samples cover the shapes the op takes:
broadcasting, 0-d and empty tensors where the op accepts them.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Optional

import numpy as np

# The generator the sample builders draw from; Op.draw seeds it anew for each
# op, so that an op's samples do not depend on which tests ran before it in
# the process (pytest-xdist deals these tests to its workers one at a time).
R = np.random.default_rng(1234)


def f32(*shape, lo=-2.0, hi=2.0, positive=False):
    x = np.asarray(R.uniform(lo, hi, shape), np.float32)
    return np.asarray(np.abs(x) + np.float32(0.1), np.float32) if positive else x


def ints(*shape, hi=5):
    return R.integers(0, hi, shape).astype(np.int64)


def bools(*shape):
    return R.random(shape) < 0.5


@dataclasses.dataclass
class Op:
    name: str                                   # "ops.elementwise.exp", "nn.functional.relu"
    call: Optional[Callable] = None             # call(lib, *args, **kwargs); default lib.<name>
    samples: Callable = None                    # () -> [(args, kwargs), ...]
    grad: bool = True
    compare: str = "values"                     # "values", "shape", "internal"
    via: str = ""                               # for "internal": the entry that exercises it
    rtol: float = 3e-6
    atol: float = 1e-6
    bf16: bool = False                          # also run on bfloat16 tensors (one bf16 ulp)
    exact: bool = False                         # values and gradients compared bit for bit

    @property
    def short(self):
        return self.name.rsplit(".", 1)[1]

    def draw(self):
        """The op's samples, drawn from ``R`` seeded by the op's name: the
        same inputs in every run and for every test that draws them."""
        global R
        R = np.random.default_rng(zlib.crc32(self.name.encode()))
        return self.samples()

    def run(self, lib, *args, **kwargs):
        if self.call is not None:
            return self.call(lib, *args, **kwargs)
        ns = lib.nn.functional if self.name.startswith("nn.functional.") else lib
        return getattr(ns, self.short)(*args, **kwargs)


def unary(positive=False):
    def gen():
        out = [((f32(3, 4, positive=positive),), {}), ((f32(positive=positive),), {}),
               ((f32(0, 4, positive=positive),), {})]
        return out
    return gen


def binary(positive_b=False):
    def gen():
        return [((f32(3, 4), f32(3, 4, positive=positive_b)), {}),
                ((f32(3, 1), f32(1, 4, positive=positive_b)), {}),     # broadcasting
                ((f32(3, 4), f32(positive=positive_b)), {}),           # with a 0-d tensor
                ((f32(3, 4), 1.5), {}),                                # with a Python number
                ((f32(0, 4), f32(1, 4, positive=positive_b)), {})]     # empty
    return gen


def compare_only(*pairs):
    def gen():
        return [((a, b), {}) for a, b in pairs]
    return gen


def fixed(*samples):
    def gen():
        return [s if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], dict)
                else (s, {}) for s in samples]
    return gen


def _values_and_indices(lib, pair):
    """A (values, indices) result as one float tensor: both compared, the
    values' gradient checked."""
    values, indices = pair
    return lib.cat([values, indices.float()], -1)


E, S, RD, L, C, IP, F = ("ops.elementwise.", "ops.shape.", "ops.reduce.", "ops.linalg.",
                         "ops.creation.", "ops.inplace.", "nn.functional.")

OPS = [
    # ------------------------------------------------------------ elementwise
    *[Op(E + n, samples=unary(), bf16=True) for n in
      ("abs", "cos", "exp", "expm1", "neg", "relu", "sigmoid", "sin", "tanh", "square",
       "clone")],
    *[Op(E + n, call=(lambda n: lambda lib, x: getattr(lib.nn.functional, n)(x))(n),
         samples=unary()) for n in ("silu", "gelu")],     # torch has them in F only
    *[Op(E + n, samples=unary(positive=True), bf16=True) for n in
      ("log", "log1p", "sqrt", "rsqrt", "reciprocal")],
    Op(E + "sign", samples=unary(), grad=False),
    *[Op(E + n, samples=fixed((f32(3, 4, lo=-4, hi=4),), (np.array(
        [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, np.inf, -np.inf, np.nan], np.float32),),
        (f32(),)), bf16=True) for n in ("floor", "ceil", "trunc", "fix", "frac")],
    Op(E + "round", call=lambda lib, x, **k: lib.round(x, **k), samples=fixed(
        (np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.0, np.inf, np.nan], np.float32),),
        (f32(3, 4, lo=-4, hi=4),), ((f32(3, 4, lo=-40, hi=40),), {"decimals": 2}),
        ((f32(3, 4, lo=-4000, hi=4000),), {"decimals": -2}))),
    *[Op(E + n, samples=unary(), bf16=True) for n in ("erf", "erfc")],
    Op(E + "nan_to_num", samples=fixed(
        (np.array([1.5, np.nan, np.inf, -np.inf, -0.0], np.float32),),
        ((np.array([1.5, np.nan, np.inf, -np.inf], np.float32),),
         {"nan": 2.0, "posinf": 1e30, "neginf": -7.25})), bf16=True),
    *[Op(E + n, samples=fixed((f32(3, 4), 0.25), (f32(3, 4), f32(3, 4)), (f32(3, 4), f32(1, 4))))
      for n in ("clamp_min", "clamp_max")],
    *[Op(E + n, samples=fixed((f32(3, 4), f32(3, 4), f32(3, 4, positive=True)),
                              ((f32(3, 4), f32(3, 1), f32(1, 4, positive=True)), {"value": 0.3}),
                              ((f32(4), f32(3, 4), f32(3, 4, positive=True)), {"value": -2})),
         bf16=True) for n in ("addcmul", "addcdiv")],
    *[Op(E + n, samples=binary(), bf16=True) for n in ("add", "sub", "mul")],
    *[Op(E + n, samples=fixed((f32(3, 4), f32(3, 4)), (f32(3, 1), f32(1, 4)), (f32(3, 4), f32()),
                              (f32(0, 4), f32(1, 4))))
      for n in ("maximum", "minimum")],
    Op(E + "div", samples=binary(positive_b=True)),
    Op(E + "rsub", samples=binary()),
    Op(E + "pow", samples=fixed((f32(3, 4, positive=True), f32(3, 4)),
                                (f32(3, 4, positive=True), 2.0), (f32(3, 1, positive=True), 3))),
    Op(E + "remainder", samples=fixed((f32(3, 4), np.float32(0.7)), (f32(3, 4), 1.5)),
       grad=False),
    Op(E + "floor_divide", samples=fixed((f32(3, 4), 0.7), (ints(3, 4), 2)), grad=False),
    Op(E + "rdiv", call=lambda lib, x, s: s / x, samples=fixed((f32(3, 4, positive=True), 2.0))),
    Op(E + "clamp", samples=fixed(((f32(3, 4),), {"min": -0.5, "max": 0.7}),
                                  ((f32(3, 4),), {"min": -0.5}), ((f32(3, 4),), {"max": 0.1}))),
    Op(E + "clip", samples=fixed(((f32(3, 4),), {"min": -0.5, "max": 0.7}))),
    Op(E + "lerp", samples=fixed((f32(3, 4), f32(3, 4), 0.3), (f32(3, 4), f32(3, 4), 0.8),
                                 (f32(3, 4), f32(3, 4), f32(3, 4, lo=-0.2, hi=1.2)))),
    Op(E + "where", call=lambda lib, c, a, b: lib.where(c, a, b),
       samples=fixed((bools(3, 4), f32(3, 4), f32(3, 4)), (bools(3, 1), f32(1, 4), f32(3, 4)))),
    Op(E + "masked_fill", call=lambda lib, x, m: x.masked_fill(m, -1.5),
       samples=fixed((f32(3, 4), bools(3, 4)), (f32(3, 4), bools(1, 4)))),
    *[Op(E + n, samples=compare_only((f32(3, 4), f32(3, 4)), (f32(3, 1), f32(1, 4)),
                                     (f32(3, 4), 0.0)), grad=False)
      for n in ("eq", "ne", "lt", "le", "gt", "ge")],
    *[Op(E + n, samples=compare_only((bools(3, 4), bools(3, 4)), (bools(3, 1), bools(1, 4))),
         grad=False) for n in ("logical_and", "logical_or")],
    Op(E + "logical_not", samples=fixed((bools(3, 4),)), grad=False),
    *[Op(E + n, samples=compare_only((ints(3, 4, hi=64), ints(3, 4, hi=64)),
                                     (bools(3, 4), bools(3, 4))), grad=False)
      for n in ("bitwise_and", "bitwise_or", "bitwise_xor")],
    Op(E + "bitwise_not", samples=fixed((ints(3, 4, hi=64),), (bools(3, 4),)), grad=False),
    *[Op(E + n, samples=fixed((np.array([1.0, np.inf, -np.inf, np.nan, 0.0], np.float32),)),
         grad=False) for n in ("isfinite", "isinf", "isnan")],
    Op(E + "isclose", samples=compare_only((f32(3, 4), f32(3, 4)),
                                           (np.ones(4, np.float32), np.float32(1 + 1e-7) *
                                            np.ones(4, np.float32))), grad=False),
    Op(E + "allclose", call=lambda lib, a, b: np.array(lib.allclose(a, b)),
       samples=compare_only((np.ones(4, np.float32), np.ones(4, np.float32) * 1.0001)),
       grad=False),
    Op(E + "equal", call=lambda lib, a, b: np.array(lib.equal(a, b)),
       samples=compare_only((np.ones(4, np.float32), np.ones(4, np.float32))), grad=False),
    # ------------------------------------------------------------------ shape
    Op(S + "view", call=lambda lib, x: x.view(4, 3), samples=fixed((f32(3, 4),))),
    Op(S + "reshape", call=lambda lib, x: lib.reshape(x, (2, -1)), samples=fixed((f32(3, 4),))),
    Op(S + "view_as", call=lambda lib, x, y: x.view_as(y),
       samples=fixed((f32(3, 4), f32(12)))),
    Op(S + "reshape_as", call=lambda lib, x, y: x.reshape_as(y),
       samples=fixed((f32(3, 4), f32(2, 6)))),
    Op(S + "contiguous", call=lambda lib, x: x.t().contiguous(), samples=fixed((f32(3, 4),))),
    *[Op(S + n, call=(lambda n: lambda lib, x: getattr(lib, n)(x, 0, 1))(n),
         samples=fixed((f32(3, 4),), (f32(2, 3, 4),))) for n in
      ("transpose", "swapaxes", "swapdims")],
    Op(S + "t", samples=fixed((f32(3, 4),), (f32(4),))),
    Op(S + "permute", call=lambda lib, x: x.permute(2, 0, 1), samples=fixed((f32(2, 3, 4),))),
    Op(S + "movedim", call=lambda lib, x: lib.movedim(x, 0, -1), samples=fixed((f32(2, 3, 4),))),
    Op(S + "unsqueeze", call=lambda lib, x: lib.unsqueeze(x, -1),
       samples=fixed((f32(3, 4),), (f32(),))),
    Op(S + "squeeze", samples=fixed((f32(3, 1, 4),), ((f32(3, 1, 4),), {"dim": 1}))),
    Op(S + "flatten", samples=fixed((f32(2, 3, 4),), ((f32(2, 3, 4),), {"start_dim": 1}))),
    Op(S + "unflatten", call=lambda lib, x: x.unflatten(1, (2, 2)), samples=fixed((f32(3, 4),))),
    Op(S + "expand", call=lambda lib, x: x.expand(3, 4), samples=fixed((f32(3, 1),), (f32(4),))),
    Op(S + "expand_as", call=lambda lib, x, y: x.expand_as(y),
       samples=fixed((f32(1, 4), f32(3, 4)))),
    Op(S + "broadcast_to", call=lambda lib, x: lib.broadcast_to(x, (2, 3, 4)),
       samples=fixed((f32(3, 1),))),
    Op(S + "meshgrid", call=lambda lib, a, b: lib.stack(lib.meshgrid(a, b, indexing="ij")),
       samples=fixed((f32(3), f32(4)))),
    Op(S + "repeat", call=lambda lib, x: x.repeat(2, 3), samples=fixed((f32(3, 4),))),
    Op(S + "repeat_interleave", call=lambda lib, x: lib.repeat_interleave(x, 2, dim=1),
       samples=fixed((f32(3, 4),))),
    Op(S + "narrow", call=lambda lib, x: lib.narrow(x, 1, 1, 2), samples=fixed((f32(3, 4),))),
    Op(S + "select", call=lambda lib, x: lib.select(x, 1, 2), samples=fixed((f32(3, 4),))),
    Op(S + "split", call=lambda lib, x: lib.cat(lib.split(x, [1, 3], dim=1)[::-1], 1),
       samples=fixed((f32(3, 4),))),
    Op(S + "chunk", call=lambda lib, x: lib.chunk(x, 2, dim=1)[1], samples=fixed((f32(3, 4),))),
    Op(S + "tensor_split", call=lambda lib, x: lib.tensor_split(x, 3, dim=1)[0],
       samples=fixed((f32(3, 4),))),
    Op(S + "unbind", call=lambda lib, x: lib.unbind(x, 1)[2], samples=fixed((f32(3, 4),))),
    *[Op(S + n, call=(lambda n: lambda lib, a, b: getattr(lib, n)([a, b], dim=1))(n),
         samples=fixed((f32(3, 4), f32(3, 2)), (f32(3, 0), f32(3, 2))))
      for n in ("cat", "concat", "concatenate")],
    Op(S + "stack", call=lambda lib, a, b: lib.stack([a, b], dim=1),
       samples=fixed((f32(3, 4), f32(3, 4)))),
    Op(S + "flip", call=lambda lib, x: lib.flip(x, (0, 1)), samples=fixed((f32(3, 4),))),
    Op(S + "roll", call=lambda lib, x: lib.roll(x, 1, 1), samples=fixed((f32(3, 4),))),
    Op(S + "tril", samples=fixed((f32(4, 4),), ((f32(4, 4),), {"diagonal": -1}))),
    Op(S + "diag", samples=fixed((f32(4, 5),), ((f32(4, 5),), {"diagonal": 2}), (f32(3),),
                                 ((f32(3),), {"diagonal": -1}))),
    Op(S + "diagonal", samples=fixed(
        (f32(4, 5),), ((f32(2, 3, 4),), {"offset": -1, "dim1": 2, "dim2": 0}))),
    Op(S + "trace", samples=fixed((f32(4, 5),), (f32(5, 3),))),
    Op(S + "broadcast_tensors", call=lambda lib, a, b: lib.broadcast_tensors(a, b)[1] * 2,
       samples=fixed((f32(3, 1), f32(4)), (f32(2, 1, 3), f32(5, 1)))),
    Op(S + "triu", samples=fixed((f32(4, 4),), ((f32(4, 4),), {"diagonal": 1}))),
    Op(S + "gather", call=lambda lib, x, i: lib.gather(x, 1, i),
       samples=fixed((f32(3, 4), ints(3, 2, hi=4)))),
    Op(S + "index_select", call=lambda lib, x, i: lib.index_select(x, 1, i),
       samples=fixed((f32(3, 4), np.array([3, 0, 3]))),),
    Op(S + "getitem", call=lambda lib, x: x[1:, ::2], samples=fixed((f32(3, 4),))),
    Op(S + "setitem", compare="internal", via="ops.shape.index_put"),
    Op(S + "index_put", call=lambda lib, x, v: lib.index_put(
        x.clone(), (lib.tensor([0, 2]),), v, accumulate=True),
       samples=fixed((f32(3, 4), f32(2, 4)))),
    Op("ops.scatter.scatter", call=lambda lib, x, d, i, src: x.scatter(d, i, src),
       samples=fixed((f32(3, 4), 1, np.array([[3, 0], [1, 2], [0, 1]]), f32(3, 2)),
                     (f32(3, 4), 0, np.array([[2, 0, 1, 1]]), 2.5))),
    Op("ops.scatter.scatter_add", call=lambda lib, x, i, src: lib.scatter_add(x, 1, i, src),
       samples=fixed((f32(3, 4), np.array([[3, 3, 3], [1, 2, 1], [0, 0, 0]]), f32(3, 3)))),
    Op("ops.scatter.index_add", call=lambda lib, x, i, src, **k: lib.index_add(x, 0, i, src, **k),
       samples=fixed((f32(4, 3), np.array([3, 0, 3, 3, 1]), f32(5, 3)),
                     ((f32(5), np.array([4, 4, 0]), f32(3)), {"alpha": 0.3}),
                     ((f32(4, 3), np.array([2, 2]), f32(2, 3)), {"alpha": -1.5}))),
    Op("ops.einsum.einsum", call=lambda lib, eq, *xs: lib.einsum(eq, *xs), samples=fixed(
        ("ij,jk->ik", f32(3, 4), f32(4, 5)), ("bij,bjk", f32(2, 3, 4), f32(2, 4, 5)),
        ("ii", f32(4, 4)), ("i,j->ij", f32(3), f32(4)), ("...ij,...j->...i", f32(2, 3, 4), f32(4)),
        ("ij,jk,kl->il", f32(3, 4), f32(4, 5), f32(5, 2)), ("iij->j", f32(3, 3, 4)),
        ("bhqd,bhkd->bhqk", f32(2, 2, 3, 4), f32(2, 2, 5, 4)))),
    Op("ops.search.searchsorted", call=lambda lib, s, v, o=None, **k: lib.searchsorted(
        s, v, sorter=o, **k),
       samples=fixed((np.array([-1.0, 0.0, 0.0, 2.5, np.inf], np.float32),
                      np.array([0.0, 3.0, -5.0, np.nan, 2.5], np.float32)),
                     ((np.sort(f32(3, 5), -1), f32(3, 4)), {"right": True}),
                     (np.array([3.0, 1.0, 2.0], np.float32), np.array([1.5, 2.5], np.float32),
                      np.array([1, 2, 0]))), grad=False),
    Op("ops.search.bucketize", call=lambda lib, x, b: lib.bucketize(x, b),
       samples=fixed((f32(3, 4), np.array([-1.0, 0.0, 1.0], np.float32))), grad=False),
    Op("ops.search.unique", call=lambda lib, x, **k: lib.cat([
        t.reshape(-1).float() for t in lib.unique(x, return_inverse=True, return_counts=True,
                                                  **k)]),
       samples=fixed((np.array([[2.0, 1.0, 2.0], [np.nan, 1.0, np.nan]], np.float32),),
                     ((np.array([[2.0, 1.0], [0.0, 1.0], [2.0, 1.0]], np.float32),),
                      {"dim": 0})), grad=False),
    Op("ops.search.unique_consecutive", call=lambda lib, x: lib.unique_consecutive(
        x, return_counts=True)[1], samples=fixed(
        (np.array([1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 3.0], np.float32),)), grad=False),
    Op("ops.search.histc", call=lambda lib, x, **k: lib.histc(x, **k), samples=fixed(
        ((f32(50),), {"bins": 7}), ((f32(50),), {"bins": 4, "min": -1, "max": 1})), grad=False),
    Op("ops.search.histogram", call=lambda lib, x, w=None, **k: lib.histogram(
        x, weight=w, **k)[0],
       samples=fixed(((f32(50),), {"bins": 7}),
                     ((f32(50),), {"bins": 4, "range": (-1.0, 1.0), "density": True}),
                     ((f32(20), f32(20)), {"bins": 3})), grad=False),
    Op("ops.distance.cdist", call=lambda lib, a, b, **k: lib.cdist(a, b, **k), samples=fixed(
        (f32(4, 3), f32(5, 3)), ((f32(2, 4, 3), f32(5, 3)), {"p": 1.0}),
        ((f32(4, 3), f32(5, 3)), {"p": float("inf")}), ((f32(4, 3), f32(5, 3)), {"p": 3.0}),
        ((f32(30, 3), f32(5, 3)), {}))),
    Op("linalg.vector_norm", call=lambda lib, x, **k: lib.linalg.vector_norm(x, **k),
       samples=fixed((f32(3, 4),), ((f32(3, 4),), {"ord": 1, "dim": 1}),
                     ((f32(3, 4),), {"ord": float("inf"), "dim": (0, 1), "keepdim": True}))),
    Op("linalg.matrix_norm", call=lambda lib, x, **k: lib.linalg.matrix_norm(x, **k),
       samples=fixed((f32(3, 4),), ((f32(2, 3, 4),), {"ord": "nuc"}),
                     ((f32(3, 4),), {"ord": 2}), ((f32(3, 4),), {"ord": -1}),
                     ((f32(3, 4),), {"ord": float("inf")}))),
    Op("linalg.norm", call=lambda lib, x, **k: lib.linalg.norm(x, **k),
       samples=fixed((f32(3, 4),), ((f32(3, 4),), {"ord": 1, "dim": 0}), (f32(5),))),
    Op("linalg.vecdot", call=lambda lib, x, y: lib.linalg.vecdot(x, y),
       samples=fixed((f32(3, 4), f32(3, 4)))),
    Op("linalg.solve", call=lambda lib, a, b, **k: lib.linalg.solve(a, b, **k), samples=fixed(
        (f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(3)),
        (f32(2, 3, 3) + 3 * np.eye(3, dtype=np.float32), f32(3, 2)),
        ((f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(4, 3)), {"left": False}))),
    Op("linalg.inv", call=lambda lib, a: lib.linalg.inv(a),
       samples=fixed((f32(3, 3) + 3 * np.eye(3, dtype=np.float32),))),
    Op("linalg.solve_triangular", call=lambda lib, a, b, **k: lib.linalg.solve_triangular(
        a, b, **k), samples=fixed(
        ((f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(3, 2)), {"upper": True}),
        ((f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(2, 3)),
         {"upper": False, "left": False, "unitriangular": True}))),
    Op("linalg.lu_factor", call=lambda lib, a: lib.linalg.lu_factor(a)[0],
       samples=fixed((f32(4, 4),), (f32(3, 5),), (f32(5, 3),), (f32(2, 4, 4),))),
    Op("linalg.lu_solve", call=lambda lib, a, b, **k: lib.linalg.lu_solve(
        *lib.linalg.lu_factor(a), b, **k), samples=fixed(
        (f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(3, 2)),
        ((f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(3, 2)), {"adjoint": True}),
        ((f32(3, 3) + 3 * np.eye(3, dtype=np.float32), f32(2, 3)), {"left": False}))),
    Op("ops.composite.diff", call=lambda lib, x, *a, **k: lib.diff(x, *a, **k), samples=fixed(
        (f32(3, 5),), ((f32(3, 5), 2, 0), {}), ((f32(4, 5), 1, 1, f32(4, 1), f32(4, 2)), {}),
        (bools(6),))),
    Op("ops.composite.tile", call=lambda lib, x, d: lib.tile(x, d),
       samples=fixed((f32(2, 3), (2,)), (f32(2, 3), (2, 1, 3)))),
    Op("ops.composite.rot90", call=lambda lib, x, k, d: lib.rot90(x, k, d),
       samples=fixed((f32(2, 3, 4), 1, (0, 2)), (f32(2, 3), 2, (0, 1)), (f32(2, 3), -1, (1, 0)))),
    Op("ops.composite.diag_embed", call=lambda lib, x, **k: lib.diag_embed(x, **k),
       samples=fixed((f32(2, 3),), ((f32(2, 3),), {"offset": -1, "dim1": 0, "dim2": 2}))),
    Op("ops.composite.combinations", call=lambda lib, x, **k: lib.combinations(x, **k),
       samples=fixed((f32(4),), ((f32(3),), {"r": 3, "with_replacement": True}))),
    *[Op("ops.composite." + n, call=(lambda n: lambda lib, x, **k: getattr(lib, n)(x, **k))(n),
         samples=fixed((np.array([[1.5, np.nan, 2.0], [np.nan, np.nan, 0.5]], np.float32),),
                       ((np.array([[1.5, np.nan, 2.0], [-1.0, 3.0, 0.5]], np.float32),),
                        {"dim": 1}))) for n in ("nansum", "nanmean")],
    *[Op("ops.composite." + n, call=(lambda n: lambda lib, x, **k: lib.stack(list(getattr(
        lib, n)(x, **k))))(n), samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1})))
      for n in ("var_mean", "std_mean")],
    Op("ops.composite.dist", call=lambda lib, a, b, *p: lib.dist(a, b, *p),
       samples=fixed((f32(3, 4), f32(3, 4)), (f32(3, 4), f32(4), 1.0), (f32(5), f32(5), 3.0))),
    Op("ops.composite.copysign", samples=fixed(
        (f32(3, 4), f32(3, 4)), (f32(3, 4), np.array([-0.0], np.float32)), (f32(3, 4), -1.0))),
    Op("ops.composite.kthvalue", call=lambda lib, x, k, **kw: lib.kthvalue(x, k, **kw)[0],
       samples=fixed((f32(3, 5), 2), ((f32(3, 5), 1), {"dim": 0, "keepdim": True}))),
    *[Op("ops.composite." + n, call=(lambda n: lambda lib, x, **k: getattr(lib, n)(x, **k)[0]
                                     if k else getattr(lib, n)(x))(n),
         samples=fixed((f32(3, 5),), ((f32(3, 5),), {"dim": 1}),
                       ((np.array([[1.0, np.nan, 3.0, 2.0]], np.float32),), {"dim": 1})))
      for n in ("median", "nanmedian")],
    *[Op("ops.composite." + n, call=(lambda n: lambda lib, x, q, **k: getattr(lib, n)(
        x, q, **k))(n), samples=fixed(
        (f32(3, 5), 0.3), ((f32(3, 5), 0.75), {"dim": 1, "interpolation": "midpoint"}),
        ((f32(3, 5), np.array([0.1, 0.5, 1.0], np.float32)), {"dim": 0, "keepdim": True}),
        ((np.array([[1.0, np.nan, 3.0, 2.0]], np.float32), 0.5), {"dim": 1})))
      for n in ("quantile", "nanquantile")],
    Op("ops.composite.broadcast_shapes", call=lambda lib: lib.zeros(
        lib.broadcast_shapes((3, 1), (1, 4), (4,))), samples=fixed(()), grad=False),
    Op(S + "masked_select", call=lambda lib, x, m: lib.masked_select(x, m),
       samples=fixed((f32(3, 4), bools(3, 4)))),
    Op(S + "nonzero", samples=fixed((np.array([[0, 1.5], [2.0, 0]], np.float32),)), grad=False),
    # ----------------------------------------------------------------- reduce
    *[Op(RD + n, samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1}),
                               ((f32(3, 4),), {"dim": 0, "keepdim": True})))
      for n in ("sum", "mean", "amax", "amin", "prod")],
    Op(RD + "logsumexp", call=lambda lib, x, **k: lib.logsumexp(x, **k),
       samples=fixed(((f32(3, 4),), {"dim": 1}), ((f32(3, 4),), {"dim": 0, "keepdim": True}))),
    *[Op(RD + n, samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1}),
                               ((f32(3, 4),), {"dim": 1, "correction": 0})))
      for n in ("var", "std")],
    Op(RD + "max", call=lambda lib, x, **k: lib.max(x, **k)[0] if k else lib.max(x),
       samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1}))),
    Op(RD + "min", call=lambda lib, x, **k: lib.min(x, **k)[0] if k else lib.min(x),
       samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1}))),
    *[Op(RD + n, samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1})), grad=False)
      for n in ("argmax", "argmin")],
    Op(RD + "topk", call=lambda lib, x: lib.topk(x, 2, dim=1)[0], samples=fixed((f32(3, 4),))),
    Op(RD + "sort", call=lambda lib, x, **k: _values_and_indices(
        lib, lib.sort(x, dim=1, stable=True, **k)),
       samples=fixed(((f32(3, 4),), {"descending": True}), (f32(3, 4),),
                     ((np.array([[1.0, np.nan, np.inf, 2.0, np.nan, -np.inf, np.inf]],
                                np.float32),), {"descending": True}),
                     (np.array([[1.0, np.nan, np.inf, 2.0, np.nan, -np.inf, np.inf]],
                               np.float32),))),
    Op(RD + "argsort", call=lambda lib, x: lib.argsort(x, dim=1), samples=fixed((f32(3, 4),)),
       grad=False),
    Op(RD + "cumsum", call=lambda lib, x: lib.cumsum(x, 1), samples=fixed((f32(3, 4),))),
    Op(RD + "cumprod", call=lambda lib, x, d=1: lib.cumprod(x, d), samples=fixed(
        (f32(3, 4),), (np.array([[2.0, 0.0, 3.0, 0.5], [0.0, 1.5, 0.0, 2.0]], np.float32),),
        (np.array([1.5, -2.0, 0.0, 4.0, 0.0], np.float32), 0))),
    Op(RD + "norm", samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 1}),
                                  ((f32(3, 4),), {"p": 1, "dim": 0}))),
    *[Op(RD + n, samples=fixed((bools(3, 4),), ((bools(3, 4),), {"dim": 1})), grad=False)
      for n in ("any", "all")],
    Op(RD + "count_nonzero", samples=fixed((np.array([[0, 1.5], [2.0, 0]], np.float32),)),
       grad=False),
    # ----------------------------------------------------------------- linalg
    Op(L + "matmul", samples=fixed((f32(3, 4), f32(4, 5)), (f32(2, 3, 4), f32(4, 5)),
                                   (f32(4), f32(4, 5)), (f32(3, 4), f32(4)))),
    Op(L + "mm", samples=fixed((f32(3, 4), f32(4, 5)))),
    Op(L + "bmm", samples=fixed((f32(2, 3, 4), f32(2, 4, 5)))),
    Op(L + "mv", samples=fixed((f32(3, 4), f32(4)))),
    Op(L + "dot", samples=fixed((f32(4), f32(4)))),
    *[Op(L + n, samples=fixed((f32(3), f32(4)))) for n in ("outer", "ger")],
    Op(L + "linear", call=lambda lib, x, w, b: lib.nn.functional.linear(x, w, b),
       samples=fixed((f32(3, 4), f32(5, 4), f32(5)))),
    Op(L + "addmm", samples=fixed((f32(3, 5), f32(3, 4), f32(4, 5)),
                                  ((f32(5), f32(3, 4), f32(4, 5)), {"beta": 0.5, "alpha": 2.0}))),
    Op(L + "baddbmm", samples=fixed((f32(2, 3, 5), f32(2, 3, 4), f32(2, 4, 5)))),
    Op(L + "mm_acc", compare="internal", via="ops.linalg.matmul"),
    Op(L + "same_mm_dtype", compare="internal", via="ops.linalg.matmul"),
    Op(L + "check_mm_dtype", compare="internal", via="ops.linalg.matmul"),
    Op(L + "set_matmul_model", compare="internal", via="ops.linalg.matmul"),
    Op(L + "matmul_model", compare="internal", via="ops.linalg.matmul"),
    Op(L + "effective_model", compare="internal", via="ops.linalg.matmul"),
    # -------------------------------------------------------------- inplace
    Op(IP + "write", compare="internal", via="ops.inplace.copy_into"),
    Op(IP + "write_out", compare="internal", via="ops.shape.gather"),
    Op(IP + "resize_out", compare="internal", via="ops.shape.gather"),
    Op(RD + "singular_norm", compare="internal", via="linalg.matrix_norm"),
    Op(IP + "apply_inplace", call=lambda lib, x: x.clone().mul_(2.0).add_(1.0),
       samples=fixed((f32(3, 4),))),
    Op(IP + "copy_into", call=lambda lib, x, y: lib.zeros(3, 4).copy_(y) + x,
       samples=fixed((f32(3, 4), f32(1, 4)))),
    Op(IP + "fill", call=lambda lib, x: x.clone().fill_(2.5) * x, samples=fixed((f32(3, 4),))),
    Op(IP + "zero", call=lambda lib, x: x.clone().zero_() + x, samples=fixed((f32(3, 4),))),
    # ------------------------------------------------------------- creation
    Op(C + "arange", call=lambda lib: lib.arange(1, 7, 2), samples=fixed(()), grad=False),
    Op(C + "linspace", call=lambda lib: lib.linspace(-1, 1, 7), samples=fixed(()), grad=False),
    Op(C + "eye", call=lambda lib: lib.eye(3, 4), samples=fixed(()), grad=False),
    Op(C + "logspace", call=lambda lib, *a, **k: lib.logspace(*a, **k), samples=fixed(
        (-2.0, 3.0, 7), ((0.0, 1.0, 5), {"base": 2.0}), (1.5, 1.5, 1), (0.0, 1.0, 0)),
       grad=False),
    *[Op(C + n, call=(lambda n: lambda lib: getattr(lib, n)(2, 3))(n), samples=fixed(()),
         grad=False) for n in ("zeros", "ones")],
    Op(C + "empty", call=lambda lib: lib.empty(2, 3), samples=fixed(()), grad=False,
       compare="shape"),                       # uninitialised: only shape and dtype
    Op(C + "full", call=lambda lib: lib.full((2, 3), 1.5), samples=fixed(()), grad=False),
    *[Op(C + n, call=(lambda n: lambda lib, x: getattr(lib, n)(x))(n), samples=fixed((f32(2, 3),)),
         grad=False) for n in ("zeros_like", "ones_like")],
    Op(C + "empty_like", call=lambda lib, x: lib.empty_like(x), samples=fixed((f32(2, 3),)),
       grad=False, compare="shape"),
    Op(C + "full_like", call=lambda lib, x: lib.full_like(x, 3.0), samples=fixed((f32(2, 3),)),
       grad=False),
    Op(C + "as_tensor", call=lambda lib: lib.as_tensor([1.0, 2.0]), samples=fixed(()),
       grad=False),
    Op(C + "from_numpy", call=lambda lib: lib.from_numpy(np.arange(3.0)), samples=fixed(()),
       grad=False),
    Op(C + "is_tensor", call=lambda lib, x: np.array(lib.is_tensor(x)),
       samples=fixed((f32(2),)), grad=False),
    Op(C + "is_floating_point", call=lambda lib, x: np.array(lib.is_floating_point(x)),
       samples=fixed((f32(2),), (ints(2),)), grad=False),
    Op(C + "numel", call=lambda lib, x: np.array(lib.numel(x)), samples=fixed((f32(2, 3),)),
       grad=False),
    *[Op(C + n, call=(lambda n: lambda lib: (lib.manual_seed(3), getattr(lib, n)(3, 4))[1])(n),
         samples=fixed(()), grad=False) for n in ("rand",)],
    Op(C + "randint", call=lambda lib: (lib.manual_seed(3), lib.randint(0, 9, (3, 4)))[1],
       samples=fixed(()), grad=False),
    Op(C + "randperm", call=lambda lib: (lib.manual_seed(3), lib.randperm(9))[1],
       samples=fixed(()), grad=False),
    Op(C + "randn", call=lambda lib: (lib.manual_seed(3), lib.randn(3, 4))[1],
       samples=fixed(()), grad=False, rtol=1e-6),
    *[Op(C + n, call=(lambda n: lambda lib, x: (lib.manual_seed(3), getattr(lib, n)(x))[1])(n),
         samples=fixed((f32(3, 4),)), grad=False, compare="shape")
      for n in ("rand_like", "randn_like")],
    Op(C + "randint_like", call=lambda lib, x: lib.randint_like(x, 5), samples=fixed((f32(3, 4),)),
       grad=False, compare="shape"),
    Op(C + "bernoulli", call=lambda lib, x: lib.bernoulli(x),
       samples=fixed((f32(3, 4, lo=0, hi=1),)), grad=False, compare="shape"),
    Op(C + "multinomial", call=lambda lib, x: lib.multinomial(x, 2),
       samples=fixed((f32(3, 4, positive=True),)), grad=False, compare="shape"),
    Op(C + "normal", call=lambda lib, x: lib.normal(x, 1.0), samples=fixed((f32(3, 4),)),
       grad=False, compare="shape"),
    Op(E + "to_dtype", call=lambda lib, x: x.to(lib.bfloat16).float(),
       samples=fixed((f32(3, 4),))),
    # ---------------------------------------------------------- nn.functional
    *[Op(F + n, samples=unary()) for n in
      ("relu6", "elu", "selu", "celu", "softsign", "tanhshrink", "mish", "hardswish",
       "hardsigmoid", "logsigmoid", "softplus", "hardtanh")],
    Op(F + "leaky_relu", samples=fixed((f32(3, 4),), ((f32(3, 4),), {"negative_slope": 0.2}))),
    Op(F + "glu", samples=fixed((f32(3, 4),))),
    Op(F + "prelu", samples=fixed((f32(2, 3, 4), np.array([0.25, -0.1, 0.5], np.float32)))),
    *[Op(F + n, call=(lambda n: lambda lib, x: getattr(lib.nn.functional, n)(x.clone()))(n),
         samples=fixed((f32(3, 4),))) for n in ("relu_", "elu_", "hardtanh_")],
    *[Op(F + n, samples=fixed(((f32(3, 4),), {"dim": 1}), ((f32(3, 4),), {"dim": 0})))
      for n in ("softmax", "log_softmax", "softmin")],
    Op(F + "normalize", samples=fixed((f32(3, 4),), ((f32(3, 4),), {"dim": 0}))),
    Op(F + "layer_norm", call=lambda lib, x, w, b: lib.nn.functional.layer_norm(x, (4,), w, b),
       samples=fixed((f32(3, 4), f32(4), f32(4)))),
    Op(F + "rms_norm", call=lambda lib, x, w: lib.nn.functional.rms_norm(x, (4,), w),
       samples=fixed((f32(3, 4), f32(4)))),
    Op(F + "group_norm", call=lambda lib, x, w, b: lib.nn.functional.group_norm(x, 2, w, b),
       samples=fixed((f32(2, 4, 3), f32(4), f32(4)))),
    Op(F + "batch_norm", call=lambda lib, x, w, b: lib.nn.functional.batch_norm(
        x, None, None, w, b, training=True), samples=fixed((f32(5, 3), f32(3), f32(3)))),
    Op(F + "instance_norm", call=lambda lib, x: lib.nn.functional.instance_norm(x),
       samples=fixed((f32(2, 3, 5),))),
    Op(F + "conv1d", samples=fixed((f32(2, 3, 8), f32(4, 3, 3), f32(4)),
                                   ((f32(2, 3, 8), f32(4, 3, 3)), {"stride": 2, "padding": 1}))),
    Op(F + "conv2d", samples=fixed((f32(2, 3, 6, 6), f32(4, 3, 3, 3), f32(4)),
                                   ((f32(1, 2, 5, 5), f32(2, 2, 3, 3)), {"padding": 1}))),
    Op(F + "conv3d", samples=fixed((f32(2, 3, 5, 4, 6), f32(4, 3, 3, 2, 3), f32(4)),
                                   ((f32(1, 4, 4, 5, 4), f32(2, 2, 3, 3, 1)),
                                    {"padding": "same", "groups": 2, "dilation": (1, 2, 1)}),
                                   ((f32(3, 5, 5, 5), f32(2, 3, 2, 2, 2)), {"stride": 2})),
       atol=8e-6),    # sums of 54 products reaching 26: an ulp there is 2e-6
    Op(F + "cosine_similarity", samples=fixed((f32(3, 4), f32(3, 4)),
                                              ((f32(2, 3, 4), f32(1, 3, 4)), {"dim": -1}),
                                              ((np.zeros((2, 3), np.float32), f32(2, 3)), {}))),
    Op(F + "interpolate", samples=fixed(
        ((f32(2, 3, 5, 4),), {"scale_factor": 2.0}),
        ((f32(2, 3, 5, 4),), {"size": (7, 3), "mode": "bilinear"}),
        ((f32(2, 3, 5, 4),), {"scale_factor": 1.5, "mode": "bicubic", "align_corners": True}),
        ((f32(2, 3, 6),), {"size": 4, "mode": "linear"}),
        ((f32(1, 2, 3, 4, 5),), {"scale_factor": (2.0, 1.0, 0.5), "mode": "trilinear"}),
        ((f32(1, 2, 7, 5),), {"size": (3, 2), "mode": "area"}),
        ((f32(1, 2, 7),), {"scale_factor": 2.3, "mode": "nearest-exact"}),
        ((f32(1, 2, 5),), {"size": 8}),                            # nearest, 1-d
        ((f32(1, 2, 3, 2, 4),), {"scale_factor": 2.0}))),           # nearest, 3-d
    Op(F + "upsample", call=lambda lib, x: lib.nn.functional.interpolate(x, scale_factor=2),
       compare="internal", via="nn.functional.interpolate"),
    *[Op(F + n, compare="internal", via="nn.functional.interpolate")
      for n in ("upsample_nearest", "upsample_bilinear")],
    Op(F + "adaptive_avg_pool3d", call=lambda lib, x, s: lib.nn.functional.adaptive_avg_pool3d(
        x, s), samples=fixed((f32(2, 3, 7, 5, 6), (3, 2, 4)), (f32(3, 4, 4, 4), 2),
                             (f32(1, 2, 5, 6, 4), (None, 3, 1)))),
    Op(F + "gaussian_nll_loss", samples=fixed(
        (f32(3, 4), f32(3, 4), f32(3, 4, positive=True)),
        ((f32(3, 4), f32(3, 4), f32(3, positive=True)), {"full": True, "reduction": "sum"}),
        ((f32(3, 4), f32(3, 4), f32(3, 1, positive=True)), {"reduction": "none"}))),
    Op(F + "poisson_nll_loss", samples=fixed(
        (f32(3, 4), f32(3, 4, positive=True)),
        ((f32(3, 4, positive=True), f32(3, 4, lo=0, hi=3)), {"log_input": False, "full": True}),
        ((f32(3, 4), f32(3, 4, lo=0, hi=3)), {"reduction": "none", "full": True}))),
    Op(F + "margin_ranking_loss", samples=fixed(
        (f32(5), f32(5), np.array([1, -1, 1, 1, -1], np.float32)),
        ((f32(5), f32(5), np.array([1, -1, 1, 1, -1], np.float32)),
         {"margin": 0.5, "reduction": "sum"}))),
    Op(F + "hinge_embedding_loss", samples=fixed(
        (f32(3, 4), np.where(bools(3, 4), 1.0, -1.0).astype(np.float32)),
        ((f32(3, 4), np.where(bools(3, 4), 1.0, -1.0).astype(np.float32)),
         {"margin": 0.3, "reduction": "none"}))),
    Op(F + "bilinear", samples=fixed((f32(4, 3), f32(4, 5), f32(2, 3, 5), f32(2)),
                                     (f32(2, 4, 3), f32(2, 4, 5), f32(2, 3, 5)))),
    Op(F + "conv_transpose1d", samples=fixed((f32(2, 3, 6), f32(3, 2, 3), f32(2)),
                                             ((f32(1, 2, 5), f32(2, 2, 2)),
                                              {"stride": 2, "padding": 1}))),
    Op(F + "unfold", call=lambda lib, x, **k: lib.nn.functional.unfold(x, **k), samples=fixed(
        ((f32(2, 3, 5, 6),), {"kernel_size": 2}),
        ((f32(3, 5, 6),), {"kernel_size": (2, 3), "dilation": 2, "padding": 1, "stride": 2}))),
    Op(F + "fold", call=lambda lib, x, **k: lib.nn.functional.fold(x, **k), samples=fixed(
        ((f32(2, 12, 20),), {"output_size": (5, 6), "kernel_size": 2}),
        ((f32(18, 6),), {"output_size": (5, 6), "kernel_size": (2, 3), "dilation": 2,
                         "padding": 1, "stride": 2}))),
    Op(F + "conv_transpose2d", samples=fixed((f32(2, 3, 4, 4), f32(3, 2, 3, 3), f32(2)),
                                             ((f32(1, 2, 3, 3), f32(2, 2, 2, 2)),
                                              {"stride": 2}))),
    *[Op(F + n, call=(lambda n: lambda lib, x: getattr(lib.nn.functional, n)(x, 2))(n),
         samples=fixed((f32(2, 3, 8),))) for n in ("max_pool1d", "avg_pool1d")],
    *[Op(F + n, call=(lambda n: lambda lib, x: getattr(lib.nn.functional, n)(x, 2))(n),
         samples=fixed((f32(2, 3, 6, 6),))) for n in ("max_pool2d", "avg_pool2d")],
    Op(F + "max_pool3d", call=lambda lib, x, **k: lib.nn.functional.max_pool3d(x, 2, **k),
       samples=fixed((f32(2, 3, 4, 6, 5),), ((f32(2, 3, 5, 6, 5),), {"ceil_mode": True}),
                     ((f32(3, 5, 5, 5),), {"padding": 1, "dilation": 2}))),
    Op(F + "avg_pool3d", call=lambda lib, x, **k: lib.nn.functional.avg_pool3d(x, 3, **k),
       samples=fixed((f32(2, 3, 4, 6, 5),), ((f32(2, 3, 5, 6, 5),),
                                             {"ceil_mode": True, "stride": 2, "padding": 1}),
                     ((f32(3, 5, 5, 5),), {"padding": 1, "count_include_pad": False}))),
    *[Op(F + f"max_unpool{n}d", call=(lambda n: lambda lib, x: getattr(
        lib.nn.functional, f"max_unpool{n}d")(*getattr(lib.nn.functional, f"max_pool{n}d")(
            x, 2, return_indices=True), 2))(n), samples=fixed((f32(*((2, 3) + (4,) * n)),)))
      for n in (1, 2, 3)],
    Op(F + "adaptive_avg_pool1d", call=lambda lib, x: lib.nn.functional.adaptive_avg_pool1d(x, 3),
       samples=fixed((f32(2, 3, 9),))),
    Op(F + "adaptive_avg_pool2d", call=lambda lib, x: lib.nn.functional.adaptive_avg_pool2d(
        x, (2, 3)), samples=fixed((f32(2, 3, 6, 6),))),
    Op(F + "pad", call=lambda lib, x, p, mode="constant": lib.nn.functional.pad(x, p, mode),
       samples=fixed((f32(3, 4), (1, 2)), (f32(1, 2, 5), (2, 1), "reflect"),
                     (f32(1, 2, 4, 5), (1, 2, 2, 1), "reflect"),
                     (f32(1, 2, 5), (2, 1), "replicate"),
                     (f32(1, 2, 4, 5), (1, 2, 2, 1), "replicate"),
                     (f32(1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2), "replicate"),
                     (f32(1, 2, 4, 5), (1, 2, 2, 1), "circular"))),
    Op(F + "pixel_shuffle", call=lambda lib, x: lib.nn.functional.pixel_shuffle(x, 2),
       samples=fixed((f32(1, 8, 2, 3),))),
    Op(F + "pixel_unshuffle", call=lambda lib, x: lib.nn.functional.pixel_unshuffle(x, 2),
       samples=fixed((f32(1, 2, 4, 6),))),
    Op(F + "embedding", call=lambda lib, i, w: lib.nn.functional.embedding(i, w),
       samples=fixed((ints(3, 2, hi=5), f32(5, 4)))),
    Op(F + "one_hot", call=lambda lib, i: lib.nn.functional.one_hot(i, 5),
       samples=fixed((ints(4, hi=5),)), grad=False),
    *[Op(F + n, call=(lambda n: lambda lib, x: (lib.manual_seed(0),
                                                getattr(lib.nn.functional, n)(x, 0.0))[1])(n),
         samples=fixed((f32(2, 3, 4, 4),))) for n in ("dropout", "dropout2d", "dropout3d")],
    Op(F + "dropout1d", call=lambda lib, x: lib.nn.functional.dropout1d(x, 0.0),
       samples=fixed((f32(2, 3, 4),))),
    *[Op(F + n, samples=fixed((f32(3, 4), f32(3, 4)))) for n in
      ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")],
    Op(F + "binary_cross_entropy",
       samples=fixed((f32(3, 4, lo=0.05, hi=0.95), f32(3, 4, lo=0, hi=1)))),
    Op(F + "binary_cross_entropy_with_logits", samples=fixed((f32(3, 4), f32(3, 4, lo=0, hi=1)))),
    Op(F + "cross_entropy", samples=fixed((f32(3, 5), ints(3, hi=5)),
                                          ((f32(3, 5), ints(3, hi=5)),
                                           {"label_smoothing": 0.1}))),
    Op(F + "nll_loss", call=lambda lib, x, t: lib.nn.functional.nll_loss(
        lib.nn.functional.log_softmax(x, 1), t), samples=fixed((f32(3, 5), ints(3, hi=5)))),
    Op(F + "kl_div", call=lambda lib, x, t: lib.nn.functional.kl_div(
        lib.nn.functional.log_softmax(x, 1), t, reduction="batchmean"),
       samples=fixed((f32(3, 5), f32(3, 5, lo=0.01, hi=1)))),
    Op(F + "scaled_dot_product_attention", samples=fixed(
        (f32(2, 3, 5, 4), f32(2, 3, 5, 4), f32(2, 3, 5, 4)),
        ((f32(1, 2, 4, 4), f32(1, 2, 4, 4), f32(1, 2, 4, 4)), {"is_causal": True}))),
    Op(F + "multi_head_attention_forward", compare="internal",
       via="nn.functional.scaled_dot_product_attention"),
    Op(F + "sdpa_backend", compare="internal", via="nn.functional.scaled_dot_product_attention"),
    Op(F + "sdpa_kernel", compare="internal", via="nn.functional.scaled_dot_product_attention"),
    # torch's own private name: the fp8 GEMM (fpemu/autograd/ops/scaled_mm.py), under the
    # CPU profile as torch CPU computes it
    Op("ops.scaled_mm._scaled_mm", call=lambda lib, a, b, sa, sb: lib._scaled_mm(
        a.to(lib.float8_e4m3fn), b.to(lib.float8_e4m3fn).t(), sa, sb, out_dtype=lib.float32),
       samples=fixed((f32(4, 32), f32(16, 32), np.array(1.0, np.float32),
                      np.array(0.5, np.float32)),
                     (f32(8, 16, lo=-400, hi=400), f32(8, 16), np.array(0.25, np.float32),
                      np.array(2.0, np.float32))), grad=False),
]

#: Ops whose values both libraries round once from the exact result, or only
#: move, select or draw: compared bit for bit. (Not sqrt: torch CPU's SIMD
#: sqrt is off by one ulp on some inputs; fpemu's is correctly rounded, as
#: CUDA's sqrtf.)
EXACT = {
    "add", "sub", "mul", "div", "rsub", "rdiv", "neg", "abs", "relu", "square", "clone",
    "reciprocal", "maximum", "minimum", "clamp", "clip", "where", "masked_fill", "lerp", "sign",
    "floor_divide", "remainder", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "isfinite", "isinf", "isnan", "isclose", "allclose", "equal", "to_dtype",
    "view", "reshape", "view_as", "reshape_as", "contiguous", "transpose", "swapaxes",
    "swapdims", "t", "permute", "movedim", "unsqueeze", "squeeze", "flatten", "unflatten",
    "expand", "expand_as", "broadcast_to", "meshgrid", "repeat", "repeat_interleave", "narrow",
    "select", "split", "chunk", "tensor_split", "unbind", "cat", "concat", "concatenate",
    "stack", "flip", "roll", "tril", "triu", "diag", "diagonal", "gather", "index_select",
    "getitem", "index_put",
    "masked_select", "nonzero", "amax", "amin", "max", "min", "argmax", "argmin", "topk", "sort",
    "argsort", "any", "all", "count_nonzero", "apply_inplace", "copy_into", "fill", "zero",
    "arange", "eye", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
    "full_like", "as_tensor", "from_numpy", "is_tensor", "is_floating_point", "numel", "rand",
    "randint", "randperm", "relu6", "hardtanh", "leaky_relu", "relu_", "hardtanh_", "pad",
    "pixel_shuffle", "pixel_unshuffle", "embedding", "one_hot", "dropout", "dropout1d",
    "dropout2d", "dropout3d", "max_pool1d", "max_pool2d",
    "floor", "ceil", "trunc", "fix", "round", "frac", "nan_to_num", "clamp_min", "clamp_max",
    "addcmul", "addcdiv", "cumprod", "scatter", "scatter_add", "index_add", "max_pool3d",
    "max_unpool1d", "max_unpool2d", "max_unpool3d", "searchsorted", "bucketize", "unique",
    "unique_consecutive", "histc", "unfold", "diff", "tile", "rot90", "diag_embed",
    "combinations", "copysign", "kthvalue", "median", "nanmedian", "broadcast_shapes",
    "max_pool2d_with_indices_backward", "_scaled_mm",
}
for _op in OPS:
    _op.exact = _op.short in EXACT


#: Tensor methods that are not an op function of the registry bound as they
#: are (``x.add`` is ``ops.elementwise.add``; ``x.add_`` and ``x.new_zeros``
#: wrap theirs and say which in ``__wrapped__``): the op each runs, or what
#: it is (``"python"``: a Python protocol; ``"conversion"``: a dtype cast,
#: ``ops.elementwise.to_dtype``'s entry; ``"random"``: an in-place draw of
#: ``fpemu.autograd``'s generator, the distribution of its creation op).
METHOD_OPS = {
    "__radd__": E + "add", "__rsub__": E + "rsub", "__rmul__": E + "mul",
    "__rtruediv__": E + "rdiv", "__rpow__": E + "pow", "__rmatmul__": L + "matmul",
    "__rdiv__": E + "rdiv", "__rmod__": E + "remainder", "__rfloordiv__": E + "floor_divide",
    "__rand__": E + "bitwise_and", "__ror__": E + "bitwise_or", "__rxor__": E + "bitwise_xor",
    "__iadd__": E + "add", "__isub__": E + "sub", "__imul__": E + "mul",
    "__itruediv__": E + "div", "__setitem__": S + "setitem", "__iter__": S + "unbind",
    "softmax": F + "softmax", "log_softmax": F + "log_softmax", "where": E + "where",
    "new_full": C + "full", "new_tensor": C + "as_tensor", "copy_": IP + "copy_into",
    "__pos__": "python", "__bool__": "python", "__float__": "python", "__int__": "python",
    "__index__": "python", "__format__": "python",
    "to": "conversion", "type": "conversion", "type_as": "conversion", "float": "conversion",
    "half": "conversion", "bfloat16": "conversion", "double": "conversion",
    "long": "conversion", "int": "conversion", "short": "conversion", "char": "conversion",
    "byte": "conversion", "bool": "conversion",
    "uniform_": C + "rand", "normal_": C + "normal", "random_": C + "randint",
    "bernoulli_": C + "bernoulli", "exponential_": "random",
}
METHOD_KINDS = ("python", "conversion", "random")

#: Names on torch's autocast lists (``fpemu/autograd/_autocast.py``) that no op
#: of fpemu looks up: ATen's internal or alternative kernels of ops fpemu has
#: under their public name (convolution's, attention's, layer_norm's and
#: nll_loss's inner kernels, the fused RNN cells behind ``nn.LSTM`` / ``nn.GRU``,
#: the old ``torch.lu_solve`` / ``torch.inverse``), and the ops fpemu does not
#: have (FFTs, decompositions, the other losses, ...). The test in
#: ``tests/test_op_registry.py`` keeps it exact both ways.
AUTOCAST_ABSENT = frozenset("""
    _addmm_activation _convolution _lu_with_info _native_multi_head_attention
    _scaled_dot_product_flash_attention _thnn_fused_gru_cell _thnn_fused_lstm_cell
    conv_tbc convolution gru_cell inverse linalg_cholesky_ex linalg_inv_ex lstm_cell
    lu_solve mkldnn_rnn_layer multilabel_margin_loss_forward native_layer_norm
    nll_loss2d rnn_relu_cell rnn_tanh_cell
    acos adaptive_max_pool3d addbmm addmv addr asin atan2 chain_matmul cholesky
    cholesky_inverse cholesky_solve conv_transpose3d cosh cosine_embedding_loss
    cross ctc_loss erfinv fake_quantize_per_tensor_affine fft_fft fft_fft2 fft_fftn
    fft_hfft fft_ifft fft_ifft2 fft_ifftn fft_ihfft fft_irfft fft_irfft2 fft_irfftn
    fft_rfft fft_rfft2 fft_rfftn fractional_max_pool2d fractional_max_pool3d
    frobenius_norm geqrf grid_sampler grid_sampler_2d grid_sampler_3d index_copy
    linalg_cholesky linalg_cond linalg_eig linalg_eigh linalg_eigvals
    linalg_eigvalsh linalg_householder_product linalg_lstsq linalg_matrix_rank
    linalg_multi_dot linalg_qr linalg_svd linalg_svdvals linalg_tensorinv
    linalg_tensorsolve log10 log2 multi_margin_loss multilabel_margin_loss
    nuclear_norm orgqr ormqr pdist pinverse polar qr renorm sinh soft_margin_loss
    stft svd tan tensordot triangular_solve triplet_margin_loss vdot view_as_complex
""".split())
