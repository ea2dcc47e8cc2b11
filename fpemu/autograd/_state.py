"""Every global mode of fpemu.autograd, in one place.

* ``grad_enabled``: recording of the graph (``no_grad``, ``enable_grad``,
  ``inference_mode``);
* ``generator``: the default random generator (:mod:`._rng`);
* ``autocast``: the stack of active :class:`~._autocast.autocast` regions;
* ``profiles``: the stack of :class:`~._profile.Profile` (CUDA by default);
* ``matmul``: the accumulation model of every matmul (``"auto"``: the
  profile's), and the TF32 switches
  (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``);
* ``fp8``: the stack of ``fp8_autocast`` regions, each ``(recipe, states)``.

Modules read and change these attributes; nothing else holds global state.
"""

from __future__ import annotations

import contextlib

from ._rng import default_generator


class _Matmul:
    model = "auto"                # the profile's (ops/linalg.py); or a model of fpemu.accumulate
    block = 128
    inner = "sequential"
    allow_tf32 = False            # torch.backends.cuda.matmul.allow_tf32 (False since 1.12)
    cudnn_allow_tf32 = True       # torch.backends.cudnn.allow_tf32 (True by default)


class State:
    grad_enabled = True
    inference = False
    generator = default_generator
    autocast = []
    profiles = []
    matmul = _Matmul
    fp8 = []


@contextlib.contextmanager
def grad_mode(flag):
    old = State.grad_enabled
    State.grad_enabled = bool(flag)
    try:
        yield
    finally:
        State.grad_enabled = old
