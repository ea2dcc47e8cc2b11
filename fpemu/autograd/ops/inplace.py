"""In-place ops: they write into the tensor's storage, so every view and
alias sees the new values, and bump the shared version counter.

Under grad mode an in-place op on a tensor in the graph (or with an operand
that requires grad) is recorded as autograd records it: the tensor gets a
new ``grad_fn`` whose input is the tensor's old node, with the old values
saved where the backward needs them. As in torch, an in-place op on a leaf
that requires grad, or on a view of one, raises.
"""

from __future__ import annotations

import weakref

import numpy as np

from ...errors import FpemuNotImplementedError
from .._core import (
    Tensor, _store, bool_, is_float, np_dtype, result_type, to_dtype,
)
from .._state import State, grad_mode

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
        from .linalg import scalar_type
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
    if base is not None and base.requires_grad:
        if base.is_leaf:
            raise RuntimeError(_VIEW_OF_LEAF)
        raise FpemuNotImplementedError(
            "an in-place op on a view of a tensor in the autograd graph (torch rebases the "
            "base's history with CopySlices) is not emulated; write the op out of place, "
            "e.g. x = torch.cat(...) or y = x.clone(); y[...] = ...")
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


def copy_into(dst, src):
    """``dst.copy_(src)``: src's values cast to dst's dtype, broadcast to its
    shape; differentiable with respect to src."""
    if not isinstance(src, Tensor):
        src_t = Tensor(np.asarray(src), result_type(src))
    else:
        src_t = src

    def take(_x, s):
        if s.dtype == _x.dtype:
            from .elementwise import clone
            out = clone(s) if s.requires_grad else Tensor(np.array(s._data), s.dtype)
        else:
            out = to_dtype(s, _x.dtype)
        if tuple(out.shape) != tuple(_x.shape):
            from .shape import expand
            out = expand(out, _x.shape)
        return out
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


def setitem(x, idx, value):
    """``x[idx] = value``: value rounded to x's dtype (a Python number through
    float32, as torch's fill), written into x's storage."""
    from .shape import _index, index_put
    if not _needs_graph(x, (value,)):
        np_idx = _index(idx)
        if isinstance(value, Tensor):
            v = to_dtype(Tensor(value._data, value.dtype), x.dtype)._data if \
                value.dtype != x.dtype else value._data
        elif is_float(x.dtype):
            v = _store(np.asarray(value, np.float64).astype(np.float32), x.dtype)
        else:
            v = np.asarray(value).astype(np_dtype(x.dtype))
        try:
            x._data[np_idx] = v
        except ValueError as err:
            raise RuntimeError(str(err)) from None
        x._bump()
        return x
    return apply_inplace(x, index_put, idx, value)


def fill(x, value):
    """``x.fill_(value)``: a number through float32 to the dtype, or a 0-d tensor."""
    if isinstance(value, Tensor):
        if value.ndim:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                               f"with {value.ndim} dimensions.")
        return copy_into(x, value)
    if is_float(x.dtype):
        return write(x, np.float32(value))
    return write(x, np.asarray(value).astype(np_dtype(x.dtype)))


def zero(x):
    return write(x, np.zeros((), np_dtype(x.dtype)))
