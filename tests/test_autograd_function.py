"""Custom differentiable functions (``torch.autograd.Function``), as the
tutorials and real programs write them, run on torch and on fpemu side by
side: the same values, the same gradients, the same errors."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): the reference behaviour


def _functions(lib):
    class MyReLU(lib.autograd.Function):
        """The PyTorch tutorial's: ctx, save_for_backward, a non-tensor argument."""

        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x.clamp(min=0) * scale

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            gi = g.clone()
            gi[x < 0] = 0
            return gi * ctx.scale, None

    class MulAdd(lib.autograd.Function):
        """torch 2's style: forward without ctx, setup_context, two outputs."""

        @staticmethod
        def forward(x, w):
            return x * w, x + w

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        @lib.autograd.function.once_differentiable
        def backward(ctx, ga, gb):
            x, w = ctx.saved_tensors
            gx = ga * w + gb if ctx.needs_input_grad[0] else None
            gw = ga * x + gb if ctx.needs_input_grad[1] else None
            return gx, gw

    class SortValues(lib.autograd.Function):
        """An integer output marked non-differentiable, and no materialized grads."""

        @staticmethod
        def forward(ctx, x):
            v, i = x.sort(dim=-1)
            ctx.mark_non_differentiable(i)
            ctx.save_for_backward(i)
            ctx.set_materialize_grads(False)
            return v, i

        @staticmethod
        def backward(ctx, gv, gi):
            i, = ctx.saved_tensors
            assert gi is None
            return gv.gather(-1, i.argsort(dim=-1))        # back to the unsorted places

    return MyReLU, MulAdd, SortValues


X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
W = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)


def _run(lib, conv, need_w=True):
    relu, muladd, _ = _functions(lib)
    a = conv(X.copy()).requires_grad_()
    b = conv(W.copy()).requires_grad_(need_w)
    y = relu.apply(a, 3.0)
    p, q = muladd.apply(y, b)
    loss = p.sum() + (q * q * 0.5).sum()
    loss.backward()
    return y, p, q, a.grad, b.grad


@pytest.mark.parametrize("need_w", [True, False])
def test_custom_functions_give_torchs_values_and_gradients(need_w):
    t = _run(torch, torch.from_numpy, need_w)
    f = _run(ft, ft.tensor, need_w)
    for name, u, v in zip(("y", "p", "q", "x.grad"), t[:4], f[:4]):
        np.testing.assert_array_equal(v.detach().numpy(), u.detach().numpy(), err_msg=name)
    if need_w:
        np.testing.assert_array_equal(f[4].numpy(), t[4].numpy())
    else:
        assert f[4] is None and t[4] is None
    assert t[0].grad_fn.name() == f[0].grad_fn.name() == "MyReLUBackward"


def test_a_non_differentiable_output_and_unmaterialized_grads():
    for lib, conv in ((torch, torch.from_numpy), (ft, ft.tensor)):
        _, _, sort = _functions(lib)
        x = conv(X.copy()).requires_grad_()
        v, i = sort.apply(x)
        assert not i.requires_grad and v.requires_grad
        (v * v).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), 2 * X)


def test_no_graph_without_a_tensor_that_requires_grad():
    relu, _, _ = _functions(ft)
    y = relu.apply(ft.tensor(X), 2.0)
    assert y.grad_fn is None and not y.requires_grad
    with ft.no_grad():
        assert relu.apply(ft.tensor(X, requires_grad=True), 2.0).grad_fn is None


@pytest.mark.parametrize("lib,conv", [(torch, torch.from_numpy), (ft, ft.tensor)],
                         ids=["torch", "fpemu"])
def test_the_errors_torch_gives(lib, conv):
    class TooFew(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    class WrongShape(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g[:1]

    class Saves(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * x

    a = conv(X.copy()).requires_grad_()
    with pytest.raises(RuntimeError, match=r"returned an incorrect number of gradients "
                                           r"\(expected 2, got 1\)"):
        TooFew.apply(a, a).sum().backward()
    with pytest.raises(RuntimeError, match="returned an invalid gradient at index 0 - got "
                                           r"\[1, 4\] but expected shape compatible with "
                                           r"\[3, 4\]"):
        WrongShape.apply(a).sum().backward()
    x = conv(X.copy())
    y = Saves.apply(x.requires_grad_() * 1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z = Saves.apply(y)
        y.add_(1)
        z.sum().backward()
    with pytest.raises(NotImplementedError, match="implement the forward"):
        lib.autograd.Function.apply(a)


def test_imports_as_programs_write_them():
    from fpemu.autograd.autograd import Function
    from fpemu.autograd.autograd.function import FunctionCtx, once_differentiable
    assert Function is ft.autograd.Function and callable(once_differentiable)
    assert FunctionCtx((True,)).needs_input_grad == (True,)
