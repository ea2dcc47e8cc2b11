"""In-place ops: they write into the tensor's storage, so every view and
alias sees the new values, and bump the shared version counter.

Under grad mode an in-place op on a tensor in the graph (or with an operand
that requires grad) is recorded as autograd records it: the tensor gets a
new ``grad_fn`` whose input is the tensor's old node, with the old values
saved where the backward needs them. An in-place op on a view rewrites the
base's history as torch's CopySlices does. As in torch, an in-place op on a
leaf that requires grad, or on a view of one, raises.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np

from ...errors import FpemuRuntimeError, FpemuTypeError
from .._core import (
    Node, Tensor, _result, _store, bool_, is_float, np_dtype, result_type, to_dtype,
)
from .._state import State, grad_mode
from .._common import scalar_type

_LEAF = ("a leaf Variable that requires grad is being used in an in-place operation.")
_VIEW_OF_LEAF = ("a view of a leaf Variable that requires grad is being used in an in-place "
                 "operation.")


def _needs_graph(x, args):
    if not State.grad_enabled:
        return False
    if x.requires_grad:
        return True
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)


def _check_cast(x, dt):
    """torch refuses an in-place result that does not fit the tensor's kind
    (a float result into an integer tensor)."""
    if dt is None or dt == x.dtype:
        return
    kind_out = 2 if is_float(dt) else (0 if dt is bool_ else 1)
    kind_x = 2 if is_float(x.dtype) else (0 if x.dtype is bool_ else 1)
    if kind_out > kind_x:
        raise RuntimeError(f"result type {scalar_type(dt)} can't be cast to the desired output "
                           f"type {scalar_type(x.dtype)}")


def write(x, values):
    """Store ``values`` (an array, rounded to x's dtype) into x's storage."""
    if is_float(x.dtype):
        arr = _store(values, x.dtype)
    else:
        arr = np.asarray(values).astype(np_dtype(x.dtype))
    if not x._data.flags.writeable:
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    x._a = np.broadcast_to(arr, x.shape)
    return x


def apply_inplace(x, op, *args, **kwargs):
    """``x.op_(*args)``: the values of ``op(x, *args)``, written into x."""
    if not isinstance(x, Tensor):
        raise TypeError(f"in-place op on {type(x).__name__}: expected a Tensor")
    if not _needs_graph(x, args + tuple(kwargs.values())):
        with grad_mode(False):
            out = op(x, *args, **kwargs)
        _check_cast(x, out.dtype)
        if tuple(np.broadcast_shapes(out.shape, x.shape)) != tuple(x.shape):
            raise RuntimeError(f"output with shape {list(x.shape)} doesn't match the broadcast "
                               f"shape {list(np.broadcast_shapes(out.shape, x.shape))}")
        return write(x, out._data)
    if x.is_leaf and x.requires_grad:
        raise RuntimeError(_LEAF)
    base = x._base
    if base is not None:
        if base.requires_grad and base.is_leaf:
            raise RuntimeError(_VIEW_OF_LEAF)
        return _inplace_on_view(x, base, op, args, kwargs)
    old = Tensor(x._data.copy(), x.dtype)
    old.grad_fn, old._requires_grad = x.grad_fn, x._requires_grad
    old._acc = x._acc
    out = op(old, *args, **kwargs)
    _check_cast(x, out.dtype)
    if out.dtype != x.dtype:
        out = to_dtype(out, x.dtype)
    x._a = np.broadcast_to(out._data, x.shape)
    x.grad_fn = out.grad_fn
    if x.grad_fn is not None and x.grad_fn.saved:
        # an op that saved its output saved x as it is now (relu_, exp_, ...)
        x.grad_fn.saved = tuple((x, x._vc[0]) if t is out else (t, v)
                                for t, v in x.grad_fn.saved)
    if x._retain and x.grad_fn is not None:
        x.grad_fn.retained = weakref.ref(x)
    return x


def _byte_offsets(a):
    """The byte offset of every element of ``a`` from its first element's
    address in memory, in ``a``'s shape."""
    off = np.zeros(a.shape, np.int64)
    for axis, (n, step) in enumerate(zip(a.shape, a.strides)):
        idx = [None] * a.ndim
        idx[axis] = slice(None)
        off = off + (np.arange(n, dtype=np.int64) * step)[tuple(idx)]
    return off


def _positions_in(base, view):
    """For each element of ``view`` (an array into ``base``'s memory), the
    flat C-order index of the same element of ``base``; any strides."""
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    where = _byte_offsets(base).reshape(-1)
    order = np.argsort(where, kind="stable")
    want = (_byte_offsets(view) + start).reshape(-1)
    return order[np.searchsorted(where[order], want)].reshape(view.shape)


def _inplace_on_view(x, base, op, args, kwargs):
    """An in-place op on a view ``x`` of ``base`` under grad mode, as torch's
    CopySlices records it: the op runs on the view's old values, whose
    gradient flows back into the base's old history at the view's elements;
    the base's new ``grad_fn`` (``CopySlicesBackward0``) sends the gradient of
    the written elements to the op and the rest to the old history; the view
    becomes a view of the new base. A base that did not require grad (a
    buffer written with values that do) becomes part of the graph.

    Other views of the base taken before the write keep their old history
    (torch regenerates them; fpemu does not)."""
    shape, bshape, dt = tuple(x.shape), tuple(base.shape), x.dtype
    pos = _positions_in(base._data, x._data)

    def into_base(g):
        G = np.zeros(bshape, g.dtype)
        G.reshape(-1)[pos] = g
        return (G,)

    base_edge = (base._edge(), dt, bshape) if base.requires_grad else None
    old = Tensor(x._data.copy(), dt)
    if base_edge is not None:
        old.grad_fn = Node("AsStrided", into_base, (base_edge,))
    out = op(old, *args, **kwargs)
    _check_cast(x, out.dtype)
    if out.dtype != dt:
        out = to_dtype(out, dt)
    x._a = np.broadcast_to(out._data, shape)            # writes into the base
    out_edge = (out._edge(), dt, shape) if out.requires_grad else None

    def copy_slices(g):
        rest = np.array(g, copy=True, order="C")
        g_out = rest.reshape(-1)[pos]
        rest.reshape(-1)[pos] = 0
        return (rest if base_edge is not None else None, g_out)
    node = Node("CopySlices", copy_slices, (base_edge, out_edge))
    base.grad_fn = node
    x.grad_fn = Node("AsStrided", into_base, ((node, dt, bshape),))
    if x._retain:
        x.grad_fn.retained = weakref.ref(x)
    return x


def write_out(out, t, fname):
    """``t`` written into an ``out=`` tensor of a selection or reduction, as
    torch's structured kernels take it: the same dtype (else torch's error),
    resized to the result's shape where it has another (:func:`resize_out`);
    without ``out``, ``t`` itself."""
    if out is None:
        return t
    if not isinstance(out, Tensor):
        raise FpemuTypeError(f"{fname}(): argument 'out' must be Tensor, not "
                             f"{type(out).__name__}")
    if out.dtype is not t.dtype:
        raise FpemuRuntimeError(f"{fname}(): Expected out tensor to have dtype {t.dtype}, but "
                                f"got {out.dtype} instead (Expected the dtype for input and "
                                f"out to match)")
    resize_out(out, t.shape, fname)
    return copy_into(out, t)


def resize_out(out, shape, fname):
    """torch's ``resize_output``: an ``out=`` tensor of another shape than the
    result is resized to it (with torch's deprecation warning when it held
    elements). A view cannot be resized here: fpemu asks for a fitting one."""
    shape = tuple(shape)
    if tuple(out.shape) == shape:
        return
    if out._base is not None:
        raise FpemuRuntimeError(f"{fname}(): out= is a view of shape {list(out.shape)}, the "
                                f"result has shape {list(shape)}; torch would resize the view's "
                                f"storage, fpemu does not: pass an out of the result's shape")
    if out.numel():
        warnings.warn(f"An output with one or more elements was resized since it had shape "
                      f"{list(out.shape)}, which does not match the required output shape "
                      f"{list(shape)}. This behavior is deprecated, and in a future PyTorch "
                      f"release outputs will not be resized unless they have zero elements. "
                      f"You can explicitly reuse an out tensor t by resizing it, inplace, to "
                      f"zero elements with t.resize_(0).", UserWarning, stacklevel=4)
    out._set_data(np.zeros(shape, out._data.dtype))
    out._vc[0] += 1


def copy_into(dst, src):
    """``dst.copy_(src)``: src's values cast to dst's dtype, broadcast to its
    shape; differentiable with respect to src."""
    if not isinstance(src, Tensor):
        src_t = Tensor(np.asarray(src), result_type(src))
    else:
        src_t = src

    def take(_x, s):
        """``s`` cast to x's dtype and broadcast to its shape: a fresh
        tensor whose gradient is summed back to s's shape by the engine."""
        if s.dtype != _x.dtype:
            s = to_dtype(s, _x.dtype)
        values = np.array(np.broadcast_to(s._data, _x.shape))

        def backward(g):
            return (g,)
        return _result(values, s.dtype, (s,), backward, op="copy")
    if tuple(np.broadcast_shapes(src_t.shape, dst.shape)) != tuple(dst.shape):
        raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the broadcast "
                           f"shape {list(np.broadcast_shapes(src_t.shape, dst.shape))}")
    if not _needs_graph(dst, (src_t,)):
        if is_float(dst.dtype):
            vals = src_t._data if src_t.dtype == dst.dtype else to_dtype(
                Tensor(src_t._data, src_t.dtype), dst.dtype)._data
        else:
            vals = src_t._data
        return write(dst, vals)
    return apply_inplace(dst, take, src_t)


def _constant(name, value):
    """The op ``t -> value`` everywhere, whose gradient to ``t`` is zero (the
    history of a tensor that ``fill_`` / ``zero_`` overwrite)."""
    def op(t):
        def backward(g):
            return (np.zeros(t.shape, g.dtype),)
        arr = np.array(np.broadcast_to(value, t.shape), dtype=t._data.dtype)
        return _result(arr, t.dtype, (t,), backward, op=name)
    return op


def fill(x, value):
    """``x.fill_(value)``: a number through float32 to the dtype, or a 0-d tensor."""
    if isinstance(value, Tensor):
        if value.ndim:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                               f"with {value.ndim} dimensions.")
        return copy_into(x, value)
    if is_float(x.dtype):
        v = _store(np.float32(value), x.dtype)
    else:
        v = np.asarray(value).astype(np_dtype(x.dtype))
    if _needs_graph(x, ()):
        return apply_inplace(x, _constant("fill", v))
    return write(x, v)


def zero(x):
    if _needs_graph(x, ()):
        return apply_inplace(x, _constant("zero", np.zeros((), np_dtype(x.dtype))))
    return write(x, np.zeros((), np_dtype(x.dtype)))
