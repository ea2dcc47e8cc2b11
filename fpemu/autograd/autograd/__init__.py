"""``torch.autograd``: ``backward``, ``grad``, the grad-mode switches,
custom functions (:class:`Function`, in ``autograd.function`` as in torch),
:func:`gradcheck` (``autograd.gradcheck``) and the deprecated
:class:`Variable`."""

from .._core import Tensor, enable_grad, no_grad, run_backward, set_grad_enabled  # noqa: F401
from . import function  # noqa: F401
from .function import Function, FunctionCtx, once_differentiable  # noqa: F401
from .variable import Variable  # noqa: F401
from ._backward import backward, grad  # noqa: F401
from .gradcheck import gradcheck, gradgradcheck  # noqa: F401,E402  (the module stays importable)

from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr("fpemu.autograd.autograd (torch.autograd)")
