"""fpemu.autograd: a PyTorch-shaped autograd engine that computes as CUDA does.

Replace ``import torch`` with ``import fpemu.autograd as torch`` in a small
training loop and every number is the one the emulated GPU would produce:
ops in float32 opmath with one rounding to their output dtype, autocast with
PyTorch's CUDA op lists, the optimizers' exact op sequences, GradScaler's
state machine and FP8 scaling recipes. See ``docs/autograd.md``. A
:class:`Profile` switches to the formulas of PyTorch's CPU build or of another
torch version (``docs/fidelity.md``).

>>> import fpemu.autograd as torch
>>> x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad
tensor([2., 4., 6.])
>>> torch.tensor(1 + 2**-8 + 2**-30, dtype=torch.bfloat16).item()   # via float32, as torch
1.0
"""

from . import _methods  # noqa: F401  (binds the Tensor methods)
from . import amp, fp8, nn, optim  # noqa: F401
from ._autocast import (
    Policy, TORCH_CPU, TORCH_CUDA, autocast, get_autocast_dtype, is_autocast_enabled,
)
from ._core import (
    DType, Tensor, arange, bfloat16, bool_, enable_grad, float16, float32, float64,
    float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, full, int32, int64,
    is_grad_enabled, manual_seed, no_grad, ones, ones_like, rand, randint, randn,
    result_type, tensor, zeros, zeros_like,
)
from ._ops import (
    add, amax, argmax, cat, clone, div, exp, flatten, gelu, layer_norm, log, log_softmax,
    masked_fill, matmul, matmul_model, mean, mul, neg, permute, pow, reciprocal, relu,
    reshape, rms_norm, set_matmul_model, sigmoid, softmax, sqrt, squeeze, stack, sub, sum,
    tanh, transpose, unsqueeze, where,
)
from ._profile import Profile, get_profile, set_profile, use_profile
from .observers import Observer

half = float16
float = float32  # noqa: A001 - torch's alias
double = float64
long = int64
int = int32  # noqa: A001 - torch's alias
bool = bool_  # noqa: A001 - torch's alias


class cuda:
    """fpemu emulates one CUDA device; this namespace answers as torch.cuda."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def is_bf16_supported():
        return True

    @staticmethod
    def manual_seed(seed):
        return manual_seed(seed)


__all__ = [
    "Tensor", "DType", "tensor", "zeros", "ones", "full", "zeros_like", "ones_like", "randn",
    "rand", "randint", "arange", "manual_seed", "no_grad", "enable_grad", "is_grad_enabled",
    "result_type", "autocast", "Policy", "TORCH_CUDA", "TORCH_CPU", "Profile", "get_profile",
    "set_profile", "use_profile", "get_autocast_dtype",
    "is_autocast_enabled", "float32", "float16", "bfloat16", "float64", "float8_e4m3fn",
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "int64", "int32", "bool_", "half",
    "add", "sub", "mul", "div", "neg", "pow", "reciprocal", "exp", "log", "sqrt", "tanh",
    "sigmoid", "relu", "gelu", "softmax", "log_softmax", "layer_norm", "rms_norm", "sum",
    "mean", "amax", "argmax", "matmul", "reshape", "transpose", "permute", "flatten",
    "unsqueeze", "squeeze", "cat", "stack", "where", "masked_fill", "clone",
    "set_matmul_model", "matmul_model", "nn", "optim", "amp", "fp8", "Observer", "cuda",
]
