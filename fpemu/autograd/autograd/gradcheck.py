"""``torch.autograd.gradcheck`` and ``gradgradcheck``.

:func:`gradcheck` follows torch's algorithm (torch/autograd/gradcheck.py,
torch 2.13; written anew here for fpemu's tensors):

* the inputs that require grad should be float64 (a UserWarning otherwise) and
  must not overlap in memory (a stride-0 dim raises RuntimeError); none
  requiring grad raises ValueError;
* the numerical Jacobian: each element of each such input in turn is set to
  ``x - eps`` and ``x + eps`` (the arithmetic in the input's dtype, as torch's
  ``copy_(orig - v)``), the function is run on both, and its outputs give the
  column ``(out(x + eps) - out(x - eps)) / (2 * eps)``, central differences;
* the analytical Jacobian: one backward vector-Jacobian product per output
  element (``autograd.grad`` of the output against a one-hot cotangent), run
  twice: the two must agree to ``nondet_tol`` ("Backward is not reentrant");
* each pair must be ``allclose(analytical, numerical, rtol, atol)``, else a
  :class:`GradcheckError` (a RuntimeError) says "Jacobian mismatch for output
  i with respect to input j" with both matrices; a function with no
  differentiable output must have a zero numerical Jacobian;
* the gradients for zero cotangents must be zero ("backward not multiplied by
  grad_output"), of the input's dtype and shape.

``fast_mode=True`` is torch's fast gradcheck: it compares ``v^T J u`` for
random unit vectors ``u`` (per input) and ``v`` (per output), drawn from a
fresh generator (torch's default seed: the draws are torch's), with ``atol``
scaled by ``sum(u) * sum(v)``; on a mismatch it recomputes both Jacobians in
full for the message, as torch does.

``raise_exception=False`` returns False instead of raising GradcheckError.
Not emulated (they raise NotImplementedError): ``check_forward_ad``,
``check_batched_grad`` and ``check_batched_forward_grad`` (fpemu has no
forward-mode AD and no vmap). ``check_undefined_grad`` is accepted: fpemu's
engine has no undefined gradients (a custom Function's backward receives
zeros, as torch's does with ``materialize_grads``), so torch's check of them
is the zero-cotangent check above. :func:`gradgradcheck` needs a graph of
the backward pass (``create_graph=True``), which fpemu's engine does not
build: it raises NotImplementedError saying so.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from ...errors import FpemuNotImplementedError
from .. import ops as O  # noqa: E741
from .._core import Tensor, float64, is_float, np_dtype, result_type
from .._rng import Generator
from ._backward import grad


class GradcheckError(RuntimeError):
    """Raised by :func:`gradcheck` and :func:`gradgradcheck` (torch's class
    of the same name, a RuntimeError)."""


def _as_tuple(x):
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _differentiable(outs):
    return tuple(o for o in _as_tuple(outs) if isinstance(o, Tensor) and o.requires_grad)


def _grad_inputs(inputs):
    return [(i, t) for i, t in enumerate(inputs) if isinstance(t, Tensor) and t.requires_grad]


def _check_inputs(inputs):
    any_grad = False
    for idx, inp in enumerate(inputs):
        if isinstance(inp, Tensor) and inp.requires_grad:
            if inp.dtype is not float64:
                warnings.warn(f"Input #{idx} requires gradient and is not a double precision "
                              f"floating point or complex. This check will likely fail if all "
                              f"the inputs are not of double precision floating point or "
                              f"complex. ", UserWarning, stacklevel=3)
            if not all(st > 0 or sz <= 1 for st, sz in zip(inp.stride(), inp.shape)):
                raise RuntimeError(
                    f"The {idx}th input has a dimension with stride 0. gradcheck only supports "
                    f"inputs that are non-overlapping to be able to compute the numerical "
                    f"gradients correctly. You should call .contiguous on the input before "
                    f"passing it to gradcheck.")
            any_grad = True
    if not any_grad:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, "
                         "but none of them have requires_grad=True.")


def _write(x, values):
    """Set the values of input ``x`` in place, outside the graph and without
    a version bump (torch writes through ``x.data``)."""
    x._data[...] = values._data if isinstance(values, Tensor) else values


def _central_difference(fn, x, delta, eps, where=None):
    """``(f(x + delta) - f(x - delta)) / (2 * eps)`` per float output, flat;
    ``delta`` is a tensor of x's shape or a number for element ``where``."""
    orig = Tensor(x._data.copy(), x.dtype)
    entry = orig if where is None else Tensor(np.array(orig._data[where]), x.dtype)

    def at(value):
        if where is None:
            _write(x, value)
        else:
            x._data[where] = value._data
        return tuple(o.detach().clone() if isinstance(o, Tensor) else o
                     for o in _as_tuple(fn()))

    try:
        outa = at(O.sub(entry, delta))
        outb = at(O.add(entry, delta))
    finally:
        _write(x, orig)
    cols = []
    for a, b in zip(outa, outb):
        if not (isinstance(a, Tensor) and is_float(a.dtype)):
            cols.append(None)
            continue
        on = f"on index {where} " if where is not None else ""
        if a.shape != b.shape:
            raise AssertionError(f"Expected `func` to return outputs with the same shape when "
                                 f"inputs are perturbed {on}by {eps}, but got: shapes "
                                 f"{a.shape} and {b.shape}.")
        if a.dtype != b.dtype:
            raise AssertionError(f"Expected `func` to return outputs with the same dtype when "
                                 f"inputs are perturbed {on}by {eps}, but got: dtypes "
                                 f"{a.dtype} and {b.dtype}.")
        cols.append(O.div(O.sub(b, a), 2 * eps).reshape(-1))
    return cols


def _numerical_jacobian(func, inputs, outputs, eps):
    """Per input that requires grad, per float output: the (input numel,
    output numel) Jacobian in the output's dtype, by central differences."""
    outs = _as_tuple(outputs)
    jacobians = []
    for idx, x in _grad_inputs(inputs):
        mats = [np.zeros((x.numel(), o.numel()), np_dtype(o.dtype)) if isinstance(o, Tensor)
                and is_float(o.dtype) else None for o in outs]
        for k, where in enumerate(itertools.product(*[range(n) for n in x.shape])):
            cols = _central_difference(lambda: func(*inputs), x, eps, eps, where)
            for m, c in zip(mats, cols):
                if m is not None and c is not None:
                    m[k] = c._data
        jacobians.append(tuple(Tensor(m, o.dtype) for m, o in zip(mats, outs)
                               if m is not None))
    return jacobians


def _vjp(output, inputs, cotangent):
    return grad(output, [t for _, t in _grad_inputs(inputs)], cotangent, retain_graph=True,
                allow_unused=True)


def _analytical_rows(output, inputs, nondet_tol, check_grad_dtypes, v=None):
    """Per input that requires grad: the (input numel, output numel) Jacobian
    of ``output`` by backward products with one-hot cotangents (or, with
    ``v``, the single column ``J^T v``); computed twice for reentrancy."""
    diff = [t for _, t in _grad_inputs(inputs)]

    def once():
        cols = 1 if v is not None else output.numel()
        mats = [np.zeros((t.numel(), cols), np_dtype(t.dtype)) for t in diff]
        sizes_ok = types_ok = True
        for j in range(cols):
            if v is not None:
                cot = v.reshape(output.shape)
            else:
                flat = np.zeros(output.numel(), np_dtype(output.dtype))
                flat[j] = 1
                cot = Tensor(flat.reshape(output.shape), output.dtype)
            for m, d, g in zip(mats, diff, _vjp(output, inputs, cot)):
                if g is None:
                    continue
                if g.shape != d.shape:
                    sizes_ok = False
                elif g.dtype != d.dtype:
                    types_ok = False
                if g.numel() != d.numel():
                    raise AssertionError(f"Expected out_jacobian column to have {g.numel()} "
                                         f"elements, but got {d.numel()}")
                m[:, j] = g._data.reshape(-1)
        return [Tensor(m, d.dtype) for m, d in zip(mats, diff)], sizes_ok, types_ok

    first, sizes_ok, types_ok = once()
    second, _, _ = once()
    reentrant = all(a.numel() == 0 or float(np.max(np.abs(
        a._data.astype(np.float64) - b._data.astype(np.float64)))) <= nondet_tol
        for a, b in zip(first, second))
    if not types_ok and check_grad_dtypes:
        raise GradcheckError("Gradient has dtype mismatch")
    if not sizes_ok:
        raise GradcheckError("Analytical gradient has incorrect size")
    if not reentrant:
        raise GradcheckError(
            f"Backward is not reentrant, i.e., running backward with same input and "
            f"grad_output multiple times gives different values, although analytical gradient "
            f"matches numerical gradient.The tolerance for nondeterminism was {nondet_tol}.")
    return first


def _allclose(a, b, rtol, atol):
    dt = result_type(a, b)
    return bool(O.allclose(a.to(dt), b.to(dt), rtol, atol))


def _mismatch(a, n, out_idx, in_idx):
    return (f"Jacobian mismatch for output {out_idx:d} with respect to input {in_idx:d},\n"
            f"numerical:{n}\nanalytical:{a}\n")


def _slow(func, func_out, inputs, outputs, eps, rtol, atol, check_grad_dtypes, nondet_tol):
    if not outputs:
        for per_input in _numerical_jacobian(func, inputs, func_out, eps):
            for jac in per_input:
                if np.count_nonzero(jac._data):
                    raise GradcheckError("Numerical gradient for function expected to be zero")
        return
    numerical = _numerical_jacobian(func, inputs, func_out, eps)
    float_outs = [o for o in _as_tuple(func_out) if isinstance(o, Tensor) and is_float(o.dtype)]
    # per output that requires grad, per input: the numerical Jacobian
    per_output = [tuple(per_input[k] for per_input in numerical)
                  for k, o in enumerate(float_outs) if o.requires_grad]
    for i, o in enumerate(outputs):
        analytical = _analytical_rows(o, inputs, nondet_tol, check_grad_dtypes)
        for j, (a, n) in enumerate(zip(analytical, per_output[i])):
            if not _allclose(a, n, rtol, atol):
                raise GradcheckError(_mismatch(a, n, i, j))


def _unit_vector(x, gen, dtype):
    vec = O.rand(x.numel(), generator=gen).to(dtype)
    return O.div(vec, O.norm(vec))


def _fast(func, func_out, inputs, outputs, eps, rtol, atol, check_grad_dtypes, nondet_tol):
    gen = Generator()               # torch's own generator for these draws, default seed
    diff = _grad_inputs(inputs)
    all_u = [_unit_vector(t, gen, t.dtype) for _, t in diff]
    all_v = [_unit_vector(o, gen, o.dtype) for o in outputs]
    float_outs = [o for o in _as_tuple(func_out) if isinstance(o, Tensor) and is_float(o.dtype)]
    numerical = []
    for (idx, x), u in zip(diff, all_u):
        cols = _central_difference(lambda: func(*inputs), x,
                                   O.mul(u.reshape(x.shape), eps), eps)
        ju = [c for c in cols if c is not None]
        if not outputs:
            for c in ju:
                if c.numel() and float(np.max(np.abs(c._data.astype(np.float64)))) > nondet_tol:
                    raise GradcheckError("Numerical gradient for function expected to be zero")
        numerical.append([O.sum(O.mul(v, c)) for v, c in zip(
            all_v, [c for c, o in zip(ju, float_outs) if o.requires_grad])])
    analytical = []
    for o, v in zip(outputs, all_v):
        vj = _analytical_rows(o, inputs, nondet_tol, check_grad_dtypes, v=v)
        analytical.append([O.dot(m.reshape(-1), u) for m, u in zip(vj, all_u)])
    for i, per_input in enumerate(numerical):
        for j, n in enumerate(per_input):
            a = analytical[j][i]
            scaled = atol * float(O.sum(all_u[i])) * float(O.sum(all_v[j]))
            if not _allclose(a, n, rtol, scaled):
                raise GradcheckError(_mismatch(a, n, j, i) + _slow_mode_report(
                    func, inputs, outputs, i, j, rtol, atol, eps))


def _slow_mode_report(func, inputs, outputs, input_idx, output_idx, rtol, atol, eps):
    numerical = _numerical_jacobian(func, inputs, outputs, eps)[input_idx][output_idx]
    analytical = _analytical_rows(outputs[output_idx], inputs, float("inf"), False)[input_idx]
    diff = float(np.max(np.abs(numerical._data.astype(np.float64)
                               - analytical._data.astype(np.float64))))
    msg = ("\nThe above quantities relating the numerical and analytical jacobians are "
           "computed \nin fast mode. See: https://github.com/pytorch/pytorch/issues/53876 for "
           "more background \nabout fast mode. Below, we recompute numerical and analytical "
           "jacobians in slow mode:\n\n"
           f"Numerical:\n {numerical}\nAnalytical:\n{analytical}\n\n"
           f"The max per-element difference (slow mode) is: {diff}.\n")
    if _allclose(analytical, numerical, rtol, atol):
        msg += ("\nFast gradcheck failed but element-wise differences are small. This means "
                "that the\ntest might've passed in slow_mode!\n\nCall gradcheck with "
                "`fast_mode=False` to check element by element.")
    return msg


def _backward_mul_by_grad_output(outputs, inputs):
    diff = [t for _, t in _grad_inputs(inputs)]
    if not diff:
        raise GradcheckError("no Tensors requiring grad found in input")
    zeros = [O.zeros_like(o) for o in outputs]
    for gi, di in zip(grad(list(outputs), diff, zeros, allow_unused=True), diff):
        if gi is None:
            continue
        if np.count_nonzero(gi._data):
            raise GradcheckError("backward not multiplied by grad_output")
        if gi.dtype != di.dtype:
            raise GradcheckError("grad is incorrect type")
        if gi.shape != di.shape:
            raise GradcheckError("grad is incorrect size")


def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              nondet_tol=0.0, check_undefined_grad=True, check_grad_dtypes=False,
              check_batched_grad=False, check_batched_forward_grad=False,
              check_forward_ad=False, check_backward_ad=True, fast_mode=False, masked=None):
    """Check the gradients of ``func`` at ``inputs`` against central finite
    differences (module doc). Returns True, or raises :class:`GradcheckError`
    (``raise_exception=False``: returns False)."""
    if not (check_forward_ad or check_backward_ad):
        raise AssertionError("Expected at least one of check_forward_ad or check_backward_ad "
                             "to be True")
    if check_batched_grad and not check_backward_ad:
        raise AssertionError("Setting check_batched_grad=True requires check_backward_ad to "
                             "be True")
    if check_batched_forward_grad and not check_forward_ad:
        raise AssertionError("Setting check_batched_forward_grad=True requires "
                             "check_forward_ad to be True")
    for flag, what in ((check_forward_ad, "check_forward_ad (forward-mode AD)"),
                       (check_batched_grad, "check_batched_grad (vmap)"),
                       (check_batched_forward_grad, "check_batched_forward_grad (vmap)")):
        if flag:
            raise FpemuNotImplementedError(
                f"gradcheck({what.split(' ')[0]}=True): {what} is not emulated; fpemu checks "
                f"backward-mode gradients only. Leave it False, or run this check in torch.")
    try:
        tupled = _as_tuple(inputs)
        _check_inputs(tupled)
        func_out = func(*tupled)
        outputs = _differentiable(func_out)
        check = _fast if fast_mode else _slow
        check(func, func_out, tupled, outputs, eps, rtol, atol, check_grad_dtypes, nondet_tol)
        _backward_mul_by_grad_output(outputs, tupled)
    except GradcheckError:
        if raise_exception:
            raise
        return False
    return True


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  gen_non_contig_grad_outputs=False, raise_exception=True, nondet_tol=0.0,
                  check_undefined_grad=True, check_grad_dtypes=False, check_batched_grad=False,
                  check_fwd_over_rev=False, check_rev_over_rev=True, fast_mode=False,
                  masked=False):
    """torch's check of second derivatives: not emulated (module doc)."""
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError("Expected at least one of check_fwd_over_rev or "
                             "check_rev_over_rev to be True")
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_undefined_grad=True requires check_rev_over_rev "
                             "to be True")
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError("Setting check_batched_grad=True requires check_rev_over_rev to "
                             "be True")
    raise FpemuNotImplementedError(
        "gradgradcheck differentiates the gradients, which needs a graph of the backward pass "
        "(autograd.grad(..., create_graph=True)); fpemu's backward does not build one "
        "(second derivatives are not emulated). Check first derivatives with gradcheck, and "
        "second derivatives with torch.autograd.gradgradcheck.")
