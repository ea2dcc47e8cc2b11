"""``torch.nn.utils.convert_parameters``: all parameters as one vector, and back."""

from __future__ import annotations

from ..._core import Tensor, no_grad
from ...ops.shape import cat


def parameters_to_vector(parameters):
    """The parameters flattened and concatenated (a differentiable copy)."""
    ps = list(parameters)
    if not ps:
        raise RuntimeError("parameters_to_vector: no parameters given")
    return cat([p.reshape(-1) for p in ps], 0)


def vector_to_parameters(vec, parameters):
    """Copy consecutive slices of ``vec`` into the parameters (their ``.data``)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    pointer = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p.data = vec[pointer:pointer + n].view_as(p).data.clone()
            pointer += n
