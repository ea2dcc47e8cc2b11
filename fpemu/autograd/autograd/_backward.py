"""``torch.autograd.backward`` and ``torch.autograd.grad`` (re-exported by
the package; :mod:`.gradcheck` calls ``grad`` from here)."""

from .._core import Tensor, run_backward
from ..ops.creation import zeros_like


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    grads = [None] * len(tensors) if grad_tensors is None else (
        [grad_tensors] if isinstance(grad_tensors, Tensor) else list(grad_tensors))
    run_backward(tensors, grads, retain_graph, create_graph, inputs)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=None, materialize_grads=False):
    """The gradients of ``outputs`` with respect to ``inputs``, returned (not
    accumulated into ``.grad``)."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    grads = [None] * len(outputs) if grad_outputs is None else (
        [grad_outputs] if isinstance(grad_outputs, Tensor) else list(grad_outputs))
    got = run_backward(outputs, grads, retain_graph, create_graph, capture=inputs)
    for i, g in enumerate(got):
        if g is None and not allow_unused and not materialize_grads:
            raise RuntimeError("One of the differentiated Tensors appears to not have been "
                               "used in the graph. Set allow_unused=True if this is the "
                               "desired behavior.")
        if g is None and materialize_grads:
            got[i] = zeros_like(inputs[i])
    return tuple(got)
