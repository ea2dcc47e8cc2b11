"""``torch.backends.cudnn``: ``allow_tf32`` (True by default, as in torch:
float32 convolutions read their operands as tf32 under the CUDA profile);
``enabled``, ``benchmark`` and ``deterministic`` are kept and change
nothing."""

from __future__ import annotations

import contextlib

from .._state import State
from ._prop import with_properties

enabled = True
benchmark = False
deterministic = False
benchmark_limit = 10


def is_available():
    return True


def version():
    """A cuDNN 9.10 version number, as torch 2.13's CUDA wheels report."""
    return 91000


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False,
          allow_tf32=True):
    mod = _module
    old = (mod.enabled, mod.benchmark, mod.benchmark_limit, mod.deterministic,
           mod.allow_tf32)
    mod.enabled, mod.benchmark, mod.benchmark_limit = enabled, benchmark, benchmark_limit
    mod.deterministic, mod.allow_tf32 = deterministic, allow_tf32
    try:
        yield
    finally:
        (mod.enabled, mod.benchmark, mod.benchmark_limit, mod.deterministic,
         mod.allow_tf32) = old


def _get_tf32(mod):
    return State.matmul.cudnn_allow_tf32


def _set_tf32(mod, flag):
    State.matmul.cudnn_allow_tf32 = bool(flag)


_module = with_properties(__name__, allow_tf32=property(_get_tf32, _set_tf32))
