"""fpemu.autograd: a PyTorch-shaped autograd engine that computes as CUDA does.

Replace ``import torch`` with ``import fpemu.autograd as torch`` in a training
program and every number is the one the emulated GPU would produce: ops in
float32 opmath with one rounding to their output dtype, autocast with
PyTorch's CUDA op lists, the optimizers' exact op sequences, GradScaler's
state machine and FP8 scaling recipes. Tensors have torch's storage
semantics (views, in-place ops, version counters). See ``docs/autograd.md``
and ``docs/pytorch-numerics.md``. A :class:`Profile` switches to the formulas
of PyTorch's CPU build or of another torch version (``docs/fidelity.md``).

>>> import fpemu.autograd as torch
>>> x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad
tensor([2., 4., 6.])
>>> torch.tensor(1 + 2**-8 + 2**-30, dtype=torch.bfloat16).item()   # via float32, as torch
1.0
"""

import builtins as _builtins
import math as _math

import numba

from . import _methods  # noqa: F401  (binds the Tensor methods)
from . import amp, backends, cuda, fp8, nn, onnx, optim, utils  # noqa: F401
from . import autograd  # noqa: F401
from . import distributions, sparse, version  # noqa: F401
from .sparse import sparse_coo, sparse_coo_tensor  # noqa: F401
from .sparse import mm as spmm  # noqa: F401
from ._finfo import finfo  # noqa: F401
from ._autocast import (  # noqa: F401
    Policy, TORCH_CPU, TORCH_CUDA, autocast, get_autocast_dtype, is_autocast_enabled,
)
from ._core import (  # noqa: F401
    DType, Size, Tensor, bfloat16, bool_, channels_last, channels_last_3d, contiguous_format,
    device, enable_grad, float16, float32, float64, memory_format, preserve_format,
    float8_e4m3fn, float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, get_rng_state,
    inference_mode, initial_seed, int8, int16, int32, int64, is_grad_enabled,
    is_inference_mode_enabled, manual_seed, no_grad, result_type, seed, set_grad_enabled,
    set_rng_state, tensor, uint8,
)
from ._print import set_printoptions  # noqa: F401
from ._profile import Profile, get_profile, set_profile, use_profile  # noqa: F401
from ._rng import Generator  # noqa: F401
from ._state import State as _State  # noqa: F401
from ._legacy import LegacyTensorType as _LegacyTensorType
from .nn.functional import (  # noqa: F401
    layer_norm, log_softmax, rms_norm, softmax,
)
from .observers import Observer  # noqa: F401
from .ops import *  # noqa: F401,F403
from .ops import __dict__ as _ops_dict
from .ops.elementwise import rdiv  # noqa: F401
from .ops.scaled_mm import _scaled_mm  # noqa: F401  (torch._scaled_mm)
from .ops.foreach import TORCH_NAMES as _FOREACH_NAMES
from . import serialization  # noqa: F401
# torch.linalg (the star import above bound ``linalg`` to ops.linalg, the matmuls)
import fpemu.autograd.linalg as linalg  # noqa: E402,F401
from .serialization import load, save  # noqa: F401
from .ops.creation import zeros  # noqa: E402,F401
from ..errors import FpemuTypeError as _FpemuTypeError

half = float16
float = float32  # torch's alias
double = float64
long = int64
int = int32  # torch's alias
short = int16
bool = bool_  # torch's alias
strided = "torch.strided"
default_generator = _State.generator
__version__ = "2.13.0+fpemu"
inf = _math.inf
nan = _math.nan
pi = _math.pi
e = _math.e
newaxis = None


def compile(model=None, *args, **kwargs):  # torch's name
    """``torch.compile``: fpemu runs the model as written (no compiler is
    needed to get its numbers); returns the model, or a decorator. The steps
    run eagerly, no faster than without it (``docs/performance.md``, "What a
    capture of the step could win")."""
    if model is None:
        return lambda m: m
    return model


def zero_(input):
    """``torch.zero_(t)``: fill ``t`` with zeros in place; returns it."""
    if not isinstance(input, Tensor):
        raise _FpemuTypeError(f"zero_(): argument 'input' (position 1) must be Tensor, not "
                              f"{type(input).__name__}")
    return input.zero_()


def get_default_dtype():
    return float32


def set_default_dtype(d):
    if d is not float32:
        raise NotImplementedError("fpemu.autograd keeps float32 as the default dtype; pass "
                                  "dtype= to the factories instead")


def set_float32_matmul_precision(precision):
    """"highest" keeps float32 matmuls; "high" reads float32 operands as tf32
    (``backends.cuda.matmul.allow_tf32``), as torch does on CUDA."""
    if precision not in ("highest", "high", "medium"):
        raise ValueError(f"Invalid precision {precision!r}")
    _State.matmul.allow_tf32 = precision != "highest"


def get_float32_matmul_precision():
    return "highest" if not _State.matmul.allow_tf32 else "high"


def use_deterministic_algorithms(mode, *, warn_only=False):
    """fpemu is deterministic already."""


def set_num_threads(n):
    """Threads of fpemu's kernels (Numba's); the numbers do not depend on them.
    At most Numba's ``NUMBA_NUM_THREADS`` (the machine's cores by default)."""
    from ..errors import FpemuRuntimeError          # RuntimeError, as torch raises
    if isinstance(n, _builtins.bool) or not isinstance(n, _builtins.int):
        raise FpemuRuntimeError(f"set_num_threads expects an int, but got "
                                f"{type(n).__name__}: pass a whole number of threads")
    if n < 1:
        raise FpemuRuntimeError(f"set_num_threads expects a positive integer, got {n}")
    # builtins: this module's min, int and bool are torch's (a reduction, dtypes)
    numba.set_num_threads(_builtins.min(n, numba.config.NUMBA_NUM_THREADS))


def get_num_threads():
    return numba.get_num_threads()


# torch's legacy typed tensor classes (the rules of torch.Tensor(...): _legacy.py)
FloatTensor = _LegacyTensorType(float32, "FloatTensor")
DoubleTensor = _LegacyTensorType(float64, "DoubleTensor")
HalfTensor = _LegacyTensorType(float16, "HalfTensor")
BFloat16Tensor = _LegacyTensorType(bfloat16, "BFloat16Tensor")
LongTensor = _LegacyTensorType(int64, "LongTensor")
IntTensor = _LegacyTensorType(int32, "IntTensor")
ShortTensor = _LegacyTensorType(int16, "ShortTensor")
CharTensor = _LegacyTensorType(int8, "CharTensor")
BoolTensor = _LegacyTensorType(bool_, "BoolTensor")
ByteTensor = _LegacyTensorType(uint8, "ByteTensor")


class accelerator:
    """``torch.accelerator``: the one emulated device."""

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def current_accelerator(check_available=False):
        return device("cuda")

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def current_device_index():
        return 0

    @staticmethod
    def set_device_index(i):
        cuda.set_device(i)

    @staticmethod
    def synchronize(device=None):
        return None


globals().update(_FOREACH_NAMES)          # torch._foreach_mul_, torch._amp_update_scale_, ...

__all__ = sorted(n for n in list(globals()) if not n.startswith("_")) + [
    n for n in _ops_dict if not n.startswith("_")]


from ._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd (torch)')
