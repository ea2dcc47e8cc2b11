"""``torch.nn.parameter``: :class:`Parameter` and :class:`Buffer`."""

from __future__ import annotations

import numpy as np

from .._core import Tensor, is_float, tensor


class Parameter(Tensor):
    """A tensor that a Module registers as a parameter (requires grad by
    default). ``Parameter(t)`` shares ``t``'s storage, as in torch."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = tensor(np.zeros(0, np.float32))
        src = data if isinstance(data, Tensor) else tensor(data)
        super().__init__(src._data, src.dtype,
                         requires_grad=requires_grad and is_float(src.dtype))

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        # the values and requires_grad, not the gradient (torch's _rebuild_parameter)
        return (_rebuild_parameter, (Tensor(self._data, self.dtype), self.requires_grad))


class Buffer(Tensor):
    """``nn.Buffer(t, persistent=True)``: a tensor a Module registers as a buffer."""

    def __init__(self, data, persistent=True):
        super().__init__(data._data, data.dtype)
        self.persistent = persistent


def _rebuild_parameter(data, requires_grad):
    return Parameter(data, requires_grad)
