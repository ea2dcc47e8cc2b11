"""fpemu tensors print, character for character, as torch's do.

Every case builds one tensor the same way in real torch (CPU, the oracle)
and in fpemu.autograd, and compares the whole ``repr`` and ``str`` text:
fixed, int and scientific modes, column widths, wrapping at 80 characters,
nested dimensions, summarization past 1,000 elements, nan/inf/-0.0, empty
and 0-d tensors, every dtype's ``dtype=`` suffix, ``requires_grad=True``,
``grad_fn=<...>``, ``Parameter containing:``, sparse tensors, and
``set_printoptions``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.autograd as ft  # noqa: E402

NAN, INF = math.nan, math.inf

# values both libraries build alike: Python floats, each exact in float32
_RAMP = [(i - 7) / 8 for i in range(40)]
_BIG = [((i * 37) % 101 - 50) / 4 for i in range(2000)]


def _t(values, dtype=None, **kw):
    def build(T):
        return T.tensor(values, dtype=None if dtype is None else getattr(T, dtype), **kw)
    return build


CASES = {
    # fixed, int and scientific modes
    "fixed": _t([0.375]),
    "fixed-negative": _t([0.375, -1.5, 2.25]),
    "fixed-wide": _t([123.5, -0.0625, 7.0]),
    "int-mode": _t([1.0, 2.0]),
    "int-mode-negative": _t([1.0, -200.0, 3.0]),
    "int-mode-large": _t([12345678.0, -3.0]),
    "sci-small": _t([1e-5, 1.0]),
    "sci-large": _t([1e9, 1.0]),
    "sci-ratio": _t([0.1, 100.5]),
    "sci-ratio-int": _t([1.0, 1001.0]),
    "not-sci-ratio-1000": _t([0.125, 125.0]),
    "sci-one-large": _t([1e10]),
    "sci-one-tiny": _t([2.0 ** -20]),
    "sci-negative": _t([-1e-7, 3.5, -2e6]),
    "sci-float64-range": _t([1e-300, 1e300], "float64"),
    # zeros, nan, inf
    "zeros": _t([0.0, 0.0]),
    "negative-zero": _t([-0.0, 0.0]),
    "negative-zero-fixed": _t([-0.0, 1.5]),
    "nan-inf-int-mode": _t([NAN, INF, -INF, 1.0]),
    "nan-fixed": _t([NAN, 0.5]),
    "nan-only": _t([NAN]),
    "inf-only": _t([INF, -INF]),
    "nan-sci": _t([NAN, 1e-6, 1.0]),
    "inf-float16": _t([INF, 0.5, -2.0], "float16"),
    # 0-d
    "scalar-fixed": _t(0.375),
    "scalar-int-mode": _t(1.0),
    "scalar-sci": _t(1e-8),
    "scalar-nan": _t(NAN),
    "scalar-int": _t(3),
    "scalar-bool": _t(True),
    "scalar-float16": _t(0.1, "float16"),
    "scalar-requires-grad": _t(2.5, requires_grad=True),
    # integers and bool
    "int64": _t([1, -20, 300]),
    "int64-huge": _t([2 ** 40, -1]),
    "int32": _t([1, -20, 300], "int32"),
    "int16": _t([7, -8], "int16"),
    "int8": _t([-128, 127], "int8"),
    "uint8": _t([0, 255, 3], "uint8"),
    "bool": _t([True, False, True]),
    "bool-2d": _t([[True, False], [False, True]]),
    # float dtypes (values printed after exact widening, as tolist gives them)
    "float16": _t([0.1, 0.2, 65504.0], "float16"),
    "float16-fixed": _t([0.1, 0.2], "float16"),
    "bfloat16": _t([0.1, 3.14159], "bfloat16"),
    "bfloat16-int-mode": _t([1.0, 256.0, -3.0], "bfloat16"),
    "float64": _t([0.1, 1 / 3], "float64"),
    "float64-int-mode": _t([1.0, 2.0], "float64"),
    "float32-explicit": _t([0.5], "float32"),
    "float8_e4m3fn": _t([0.1, 448.0, -2.0], "float8_e4m3fn"),
    "float8_e5m2": _t([0.1, 57344.0, 1.5], "float8_e5m2"),
    "float8_e4m3fnuz": _t([0.1, 240.0], "float8_e4m3fnuz"),
    "float8_e5m2fnuz": _t([0.375, -3.0], "float8_e5m2fnuz"),
    # empty
    "empty": _t([]),
    "empty-2d": lambda T: T.zeros(0, 3),
    "empty-3d-float16": lambda T: T.zeros(2, 0, 3, dtype=T.float16),
    "empty-int64": lambda T: T.zeros(0, dtype=T.int64),
    "empty-bool": lambda T: T.zeros(0, dtype=T.bool),
    "empty-float64": lambda T: T.zeros(0, dtype=T.float64),
    "empty-requires-grad": lambda T: T.zeros(0, 2, requires_grad=True),
    # rows that wrap, nested dimensions
    "wrap-fixed": _t(_RAMP),
    "wrap-int": _t(list(range(-20, 40))),
    "wrap-sci": _t([v * 1e-6 for v in _RAMP[:20]]),
    "wrap-2d": _t([_RAMP[:20], _RAMP[20:]]),
    "wrap-3d": _t([[_RAMP[i:i + 13] for i in (0, 13)], [_RAMP[i:i + 13] for i in (1, 14)]]),
    "2d": _t([[1.5, -2.0], [3.25, 4.0]]),
    "3d": lambda T: T.tensor(_RAMP[:24]).reshape(2, 3, 4),
    "4d-int": lambda T: T.tensor(list(range(16))).reshape(2, 2, 2, 2),
    "column": _t([[0.5], [1.0], [-2.0]]),
    "wrap-suffixes": _t([0.5] * 12, "float16", requires_grad=True),
    "wrap-suffix-grad-fn": lambda T: T.tensor([0.5] * 11, dtype=T.bfloat16,
                                              requires_grad=True) * 2,
    # summarization past 1,000 elements
    "summarize-1d-float": _t(_BIG),
    "summarize-1d-int": _t(list(range(2000))),
    "summarize-1d-bool": _t([i % 3 == 0 for i in range(1001)]),
    "summarize-2d": lambda T: T.tensor(_BIG).reshape(40, 50),
    "summarize-2d-short-rows": lambda T: T.tensor(_BIG).reshape(1000, 2),
    "summarize-2d-two-rows": lambda T: T.tensor(_BIG).reshape(2, 1000),
    "summarize-3d": lambda T: T.tensor(_BIG).reshape(20, 10, 10),
    "summarize-sci": lambda T: T.tensor([v * 1e5 + 1e-3 for v in _BIG]).reshape(50, 40),
    "summarize-layout-from-edges": _t([1e-8] + [0.5] * 1000 + [1e-8]),
    "summarize-float16": _t(_BIG[:1500], "float16"),
    "not-summarized-1000": _t(_BIG[:1000]),
    # autograd suffixes; grad_fn names of ops whose names fpemu shares with torch
    "requires-grad": _t([1.0, 2.0], requires_grad=True),
    "requires-grad-float64": _t([1.0, 2.5], "float64", requires_grad=True),
    "grad-fn-mul": lambda T: T.tensor([1.0, 2.5], requires_grad=True) * 2,
    "grad-fn-add": lambda T: T.tensor([1.0, 2.5], requires_grad=True) + 1,
    "grad-fn-div": lambda T: T.tensor([1.0, 2.5], requires_grad=True) / 2,
    "grad-fn-neg": lambda T: -T.tensor([1.0, 2.5], requires_grad=True),
    "grad-fn-pow": lambda T: T.tensor([1.0, 2.5], requires_grad=True) ** 2,
    "grad-fn-exp": lambda T: T.tensor([1.0, 2.5], requires_grad=True).exp(),
    "grad-fn-sum": lambda T: T.tensor([1.0, 2.5], requires_grad=True).sum(),
    "grad-fn-mean": lambda T: T.tensor([1.0, 2.5], requires_grad=True).mean(),
    "grad-fn-relu": lambda T: T.tensor([1.0, -2.5], requires_grad=True).relu(),
    "grad-fn-view": lambda T: T.tensor([1.0, 2.5, 3, 4], requires_grad=True).view(2, 2),
    "grad-fn-select": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True)[0],
    "grad-fn-transpose": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True).transpose(0, 1),
    "grad-fn-cat": lambda T: T.cat([T.tensor([1.0], requires_grad=True)] * 2),
    "grad-fn-to": lambda T: T.tensor([1.0, 2.5], requires_grad=True).to(T.bfloat16),
    "grad-fn-softmax": lambda T: T.tensor([0.0, 0.0], requires_grad=True).softmax(0),
    "grad-fn-addmm": lambda T: T.addmm(T.ones(2, 2), T.ones(2, 2, requires_grad=True),
                                       T.ones(2, 2)),
    # ops fpemu composes, or that torch counts as another overload, print torch's name
    "grad-fn-sub": lambda T: T.tensor([1.0, 2.5], requires_grad=True) - 1,
    "grad-fn-rsub": lambda T: 1 - T.tensor([1.0, 2.5], requires_grad=True),
    "grad-fn-sum-dim": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True).sum(1),
    "grad-fn-mean-dim": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True).mean(1),
    "grad-fn-t": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True).t(),
    "grad-fn-squeeze-dim": lambda T: T.tensor([[1.0, 2.5]], requires_grad=True).squeeze(0),
    "grad-fn-clamp": lambda T: T.tensor([1.0, 2.5], requires_grad=True).clamp(0, 1),
    "grad-fn-square": lambda T: T.tensor([1.0, 2.5], requires_grad=True).square(),
    "grad-fn-stack": lambda T: T.stack([T.tensor([1.0], requires_grad=True)] * 2),
    "grad-fn-max": lambda T: T.tensor([1.0, 2.5], requires_grad=True).max(),
    "grad-fn-slice": lambda T: T.tensor([1.0, 2.5], requires_grad=True)[1:],
    "grad-fn-norm": lambda T: T.tensor([1.0, 2.5], requires_grad=True).norm(),
    "grad-fn-mm": lambda T: T.ones(2, 2, requires_grad=True) @ T.ones(2, 2),
    "grad-fn-mv": lambda T: T.ones(2, 2, requires_grad=True) @ T.ones(2),
    "grad-fn-dot": lambda T: T.ones(2, requires_grad=True) @ T.ones(2),
    "grad-fn-matmul-3d": lambda T: T.ones(2, 2, 2, requires_grad=True) @ T.ones(2, 2),
    "grad-fn-linear-no-bias": lambda T: T.nn.functional.linear(
        T.ones(2, 2, requires_grad=True), T.ones(2, 2)),
    "detached": lambda T: (T.tensor([1.0, 2.5], requires_grad=True) * 2).detach(),
    "no-grad": lambda T: _no_grad(T),
    # Parameter
    "parameter": lambda T: T.nn.Parameter(T.tensor([1.0, 2.5])),
    "parameter-frozen": lambda T: T.nn.Parameter(T.tensor([[1.0], [2.5]]), requires_grad=False),
    "parameter-bfloat16": lambda T: T.nn.Parameter(T.tensor([0.1], dtype=T.bfloat16)),
    # sparse (coalesced)
    "sparse": lambda T: T.tensor([[0.0, 1.5], [2.0, 0.0]]).to_sparse(),
    "sparse-int": lambda T: T.tensor([[0, 3, 0], [0, 0, -4]]).to_sparse(),
    "sparse-empty": lambda T: T.zeros(2, 3).to_sparse(),
}


def _no_grad(T):
    x = T.tensor([1.0, 2.5], requires_grad=True)
    with T.no_grad():
        return x * 2


# (set_printoptions keywords, tensor)
OPTION_CASES = {
    "precision-2": ({"precision": 2}, _t([1.12345, -0.5])),
    "precision-0": ({"precision": 0}, _t([1.5, -0.25])),
    "precision-8-sci": ({"precision": 8}, _t([1e-6, 1.0])),
    "threshold-5": ({"threshold": 5}, lambda T: T.arange(10)),
    "threshold-5-2d": ({"threshold": 5}, lambda T: T.tensor(_RAMP[:36]).reshape(6, 6)),
    "threshold-0-scalar": ({"threshold": 0}, _t(0.5)),
    "threshold-inf": ({"threshold": math.inf}, _t(list(range(1200)))),
    "edgeitems-1": ({"edgeitems": 1}, _t(_BIG)),
    "edgeitems-0-1d": ({"edgeitems": 0}, _t(_BIG)),
    "edgeitems-0-2d": ({"edgeitems": 0}, lambda T: T.tensor(_BIG).reshape(40, 50)),
    "edgeitems-0-small": ({"edgeitems": 0}, _t([1.5, 2.0])),
    "linewidth-40": ({"linewidth": 40}, _t(_RAMP)),
    "linewidth-40-suffix": ({"linewidth": 40}, _t(_RAMP[:6], "float16", requires_grad=True)),
    "linewidth-5": ({"linewidth": 5}, _t([[1.5, 2.0], [3.0, 4.0]])),
    "sci-mode-true": ({"sci_mode": True}, _t([0.5, 1.5])),
    "sci-mode-true-int": ({"sci_mode": True}, _t([1.0, 200.0])),
    "sci-mode-false": ({"sci_mode": False}, _t([1e-6, 1e9])),
    "sci-mode-false-int": ({"sci_mode": False}, _t([1.0, 1e10])),
    "profile-short": ({"profile": "short"}, _t(_BIG)),
    "profile-full": ({"profile": "full"}, _t(_BIG[:1200])),
    "profile-short-precision": ({"profile": "short", "precision": 3}, _t([1 / 3])),
}


@pytest.fixture(autouse=True)
def _default_options():
    yield
    torch.set_printoptions(profile="default")
    ft.set_printoptions(profile="default")


def _texts(build, options=None):
    out = []
    for T in (torch, ft):
        if options:
            T.set_printoptions(**options)
        x = build(T)
        out.append((repr(x), str(x)))
        if options:
            T.set_printoptions(profile="default")
    return out


@pytest.mark.parametrize("name", CASES)
def test_prints_as_torch(name):
    (theirs, theirs_str), (ours, ours_str) = _texts(CASES[name])
    assert ours == theirs
    assert ours_str == theirs_str


@pytest.mark.parametrize("name", OPTION_CASES)
def test_printoptions_as_torch(name):
    options, build = OPTION_CASES[name]
    (theirs, _), (ours, _) = _texts(build, options)
    assert ours == theirs


def test_set_printoptions_resets_sci_mode_as_torch():
    for T in (torch, ft):
        T.set_printoptions(sci_mode=True)
        T.set_printoptions(precision=4)          # leaves sci_mode out: back to None
    assert repr(ft.tensor([0.5])) == repr(torch.tensor([0.5])) == "tensor([0.5000])"


def test_format_of_a_tensor_is_its_repr():
    x = [[1.5, -2.0], [3.0, 1e-5]]
    assert f"{ft.tensor(x)}" == f"{torch.tensor(x)}"
    assert f"{ft.tensor(0.375):.2f}" == f"{torch.tensor(0.375):.2f}" == "0.38"


def test_a_tensor_in_a_container_prints_as_torch():
    def build(T):
        return [T.tensor([1.0, 0.5]), T.tensor(3)]
    assert repr(build(ft)) == repr(build(torch))


def test_non_contiguous_views_print_their_values():
    a = np.arange(24, dtype=np.float32).reshape(4, 6) / 4
    assert repr(ft.tensor(a)[::2, 1::2].t()) == repr(torch.tensor(a)[::2, 1::2].t())


def test_subclass_prints_its_name():
    class Mine(ft.Tensor):
        pass

    x = ft.tensor([1.5, 2.0])
    mine = Mine.__new__(Mine)
    ft.Tensor.__init__(mine, x._data, x.dtype)
    assert repr(mine) == "Mine([1.5000, 2.0000])"


@pytest.mark.parametrize("kwargs,error", [
    ({"precision": 2.5}, TypeError),
    ({"precision": -1}, ValueError),
    ({"edgeitems": "3"}, TypeError),
    ({"linewidth": True}, TypeError),
    ({"threshold": "1000"}, TypeError),
    ({"sci_mode": "yes"}, TypeError),
    ({"profile": "long"}, ValueError),
])
def test_set_printoptions_names_a_bad_option(kwargs, error):
    with pytest.raises(error, match=next(iter(kwargs))):
        ft.set_printoptions(**kwargs)
    assert repr(ft.tensor([0.5])) == "tensor([0.5000])"


def test_printoptions_context_restores():
    from fpemu.autograd._print import get_printoptions, printoptions
    before = get_printoptions()
    with printoptions(precision=1, linewidth=30):
        assert repr(ft.tensor([0.25, 1.5])) == "tensor([0.2, 1.5])"
    assert get_printoptions() == before
    assert get_printoptions() == torch._tensor_str.get_printoptions()
