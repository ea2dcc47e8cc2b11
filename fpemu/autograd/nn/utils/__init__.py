"""``torch.nn.utils``: gradient clipping, packed sequences
(:mod:`.rnn`) and the parameter-vector conversions."""

from . import clip_grad, rnn  # noqa: F401
from .clip_grad import (  # noqa: F401
    clip_grad_norm, clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_, get_total_norm,
)
from .convert_parameters import parameters_to_vector, vector_to_parameters  # noqa: F401

from ..._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.nn.utils (torch.nn.utils)')
