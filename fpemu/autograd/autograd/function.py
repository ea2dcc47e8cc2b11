"""``torch.autograd.function``: custom differentiable functions.

A subclass of :class:`Function` writes ``forward`` and ``backward`` as
static methods and is called through ``apply``, as in torch::

    class MyReLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.clamp(min=0)

        @staticmethod
        def backward(ctx, grad_output):
            x, = ctx.saved_tensors
            return grad_output * (x > 0)

    y = MyReLU.apply(x)

``forward`` runs with gradients off, on the arguments as given; its outputs
join the graph in one node whose backward calls ``backward`` with one
gradient per output (zeros for an output that got none, unless
``ctx.set_materialize_grads(False)``) and takes one gradient per argument
(None for an argument that needs none). The torch 2 style, a ``forward``
without ``ctx`` and a ``setup_context(ctx, inputs, output)``, works too.
fpemu's backward builds no graph of itself, so every custom function is
once differentiable (:func:`once_differentiable` is accepted and changes
nothing). Not emulated: ``jvp`` / forward-mode AD, ``vmap``,
``save_for_forward``.
"""

from __future__ import annotations

import functools

import numpy as np

from ...errors import FpemuNotImplementedError
from .._core import Tensor, _result, _sum_to, float64, is_float, no_grad
from .._state import State


class FunctionCtx:
    """The ``ctx`` a custom function's ``forward`` / ``setup_context`` fills
    and its ``backward`` reads."""

    def __init__(self, needs_input_grad):
        #: per argument of ``apply``: whether it is a tensor that requires grad
        self.needs_input_grad = needs_input_grad
        self.materialize_grads = True
        self._saved = ()
        self._non_differentiable = ()
        self._dirty = ()

    def save_for_backward(self, *tensors):
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self._saved = tuple((t, None if t is None else t._vc[0]) for t in tensors)

    @property
    def saved_tensors(self):
        out = []
        for i, (t, version) in enumerate(self._saved):
            if t is not None and t._vc[0] != version:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: saved tensor {i} of shape {list(t.shape)} is at "
                    f"version {t._vc[0]}; expected version {version} instead.")
            out.append(t)
        return tuple(out)

    def mark_non_differentiable(self, *outputs):
        self._non_differentiable = tuple(outputs)

    def mark_dirty(self, *tensors):
        """Accepted: fpemu's outputs of ``apply`` are new tensors with the
        values ``forward`` wrote."""
        self._dirty = tuple(tensors)

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)


def once_differentiable(fn):
    """torch's decorator for a ``backward`` that is not itself
    differentiable: every fpemu backward is (its backward builds no graph)."""
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with no_grad():
            return fn(ctx, *args)
    return wrapper


class Function:
    """Base class of custom differentiable functions (module docstring)."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            "Legacy autograd function with non-static forward method is deprecated. Please "
            "use new-style autograd function with static forward method. (Example: "
            "https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function)")

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward "
                                  "mode AD.")

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise FpemuNotImplementedError("forward-mode AD (jvp) is not emulated; fpemu's "
                                       "custom functions run in backward mode")

    @classmethod
    def apply(cls, *args, **kwargs):
        grad_on = State.grad_enabled
        needs = tuple(bool(grad_on and isinstance(a, Tensor) and a.requires_grad)
                      for a in args)
        ctx = FunctionCtx(needs)
        own_setup = getattr(cls.setup_context, "__func__", cls.setup_context) is not \
            Function.__dict__["setup_context"].__func__
        with no_grad():
            if own_setup:
                out = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args, **kwargs)
        if not any(needs):
            return out
        many = isinstance(out, tuple)
        outs = list(out) if many else [out]
        return _connect(cls, ctx, args, outs, many)


def _connect(cls, ctx, args, outs, many):
    """The outputs of ``apply`` joined to the graph (module docstring)."""
    name = cls.__name__
    parents = [a for a in args if isinstance(a, Tensor)]
    arg_of_parent = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    tensor_at = [i for i, o in enumerate(outs) if isinstance(o, Tensor)]
    non_diff = {id(t) for t in ctx._non_differentiable}
    diff = [i for i in tensor_at if id(outs[i]) not in non_diff and is_float(outs[i].dtype)]

    def user_backward(grads):
        """``grads``: {output index: numpy gradient}; returns one array (or
        None) per tensor argument."""
        gts = []
        for i in tensor_at:
            g = grads.get(i)
            if g is not None:
                gts.append(Tensor(np.asarray(g), outs[i].dtype))
            elif ctx.materialize_grads:
                gts.append(Tensor(np.zeros(outs[i]._data.shape, outs[i]._data.dtype),
                                  outs[i].dtype))
            else:
                gts.append(None)
        res = cls.backward(ctx, *gts)
        res = res if isinstance(res, tuple) else (res,)
        if len(res) > len(args) and all(r is None for r in res[len(args):]):
            res = res[:len(args)]
        if len(res) != len(args):
            raise RuntimeError(f"function {name}Backward returned an incorrect number of "
                               f"gradients (expected {len(args)}, got {len(res)})")
        arrays = []
        for i in arg_of_parent:
            r, a = res[i], args[i]
            if r is None or not a.requires_grad:
                arrays.append(None)
                continue
            if not isinstance(r, Tensor):
                raise TypeError(f"function {name}Backward returned a gradient of type "
                                f"{type(r).__name__} at index {i}; return a Tensor or None")
            data = r._data
            if tuple(r.shape) != tuple(a.shape):
                try:        # a gradient that a's shape broadcasts to is summed back to it
                    ok = np.broadcast_shapes(tuple(a.shape), tuple(r.shape)) == tuple(r.shape)
                except ValueError:
                    ok = False
                if not ok:
                    raise RuntimeError(
                        f"Function {name}Backward returned an invalid gradient at index {i} - "
                        f"got {list(r.shape)} but expected shape compatible with "
                        f"{list(a.shape)}")
                data = _sum_to(data, a.shape, a.dtype)
            arrays.append(data)
        return tuple(arrays)

    if len(diff) == 1 and len(tensor_at) == 1:
        i = diff[0]
        o = outs[i]
        outs[i] = _result(o._data, o.dtype, parents, lambda g: user_backward({i: g}),
                          op=f"{name}Backward")
        return tuple(outs) if many else outs[0]
    # several outputs: one hidden node holds them all, flat (float64 holds every
    # output dtype exactly), so that ``backward`` runs once with every gradient
    sizes = [outs[i]._data.size for i in diff]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = np.concatenate([outs[i]._data.astype(np.float64).ravel() for i in diff]) \
        if diff else np.zeros(0)

    received = set()        # the outputs a gradient reached in this backward pass

    def flat_backward(g):
        grads = {i: g[offsets[k]:offsets[k + 1]].reshape(outs[i]._data.shape)
                 for k, i in enumerate(diff) if k in received}
        received.clear()
        return user_backward(grads)
    hidden = _result(flat, float64, parents, flat_backward, op=f"{name}Backward")
    for k, i in enumerate(diff):
        o = outs[i]

        def part(g, k=k):
            received.add(k)
            full = np.zeros(flat.size, np.float64)
            full[offsets[k]:offsets[k + 1]] = np.asarray(g, np.float64).ravel()
            return (full,)
        outs[i] = _result(o._data, o.dtype, (hidden,), part, op=f"{name}Output")
    return tuple(outs) if many else outs[0]
