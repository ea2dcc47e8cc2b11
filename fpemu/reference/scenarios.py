"""The fidelity scenarios, each written once and run on both backends.

A scenario is a function ``run(env, config, inputs)`` that uses only the API
that ``torch`` and ``fpemu.autograd`` share (through ``env.T``) and returns
named arrays (a :class:`Trace`). Its inputs are made at record time, by
``make_inputs(env, config)`` with NumPy (and, for the optimizer replays, a small
model trained with real PyTorch), and saved with the trace, so a replay
feeds fpemu exactly what PyTorch was fed.

Each scenario also states the tier of each of its arrays under a profile
(``tiers(config, profile)``): bit-exact where ``docs/pytorch-numerics.md`` §6 says
the result is determined, a tolerance with its reason elsewhere.

Inputs made with NumPy are bit-reproducible on any CPU: seeded generators,
integers, ``ldexp`` and single correctly rounded operations (+ - * / sqrt, and
NumPy's pairwise sums, whose order is fixed in its source), never libm
(``exp``, ``log``: NumPy's SIMD versions differ in the last bit between AVX2
and AVX-512) and never BLAS. What PyTorch computes may depend on the CPU
(MKL's GEMM kernels and thread count, ATen's vector width): each scenario
lists those arrays in ``host_dependent`` with the reason, and only the other
arrays of a fresh recording must equal the committed trace.

Nothing here imports Numba: recording needs only NumPy and PyTorch.

The scenarios, by group, each module registering its own in this order
(:data:`SCENARIOS` keeps it):

* ``_casts``: ``casts-*``, the casts to every low-precision dtype;
* ``_loss_scaling``: ``scaler-*`` and ``unscale-*``, GradScaler;
* ``_optim``: ``optim-*`` (200-step replays) and ``fused-*``, the optimizers;
* ``_autocast``: ``autocast-*``, output dtypes under autocast;
* ``_e2e``: ``e2e-*``, small models trained end to end;
* ``_distributed``: ``collectives-gloo-*``, ``ddp-*``, ``fsdp*-*``, ``zero-*``,
  against real ``torch.distributed`` processes.

A new scenario goes into the module of its group with a ``_register`` call
(``_registry``); a new group is a new module imported below.
"""

from __future__ import annotations

from ._registry import SCENARIOS, Scenario, Trace  # noqa: F401  (re-exported)
# the groups, in the order they register (SCENARIOS keeps it), their constants re-exported
from . import _casts  # noqa: F401
from ._loss_scaling import SCALER_CASES, UNSCALE_SCALES  # noqa: F401
from ._optim import (  # noqa: F401
    FUSED_CONFIGS, FUSED_N, FUSED_STEPS, IMPLS, OPTIMIZERS, PARAMS, REAL_COLUMNS, REPLAY_STEPS,
)
from . import _autocast  # noqa: F401
from ._e2e import E2E_STEPS, LOSS_WEIGHT  # noqa: F401
from ._distributed import (  # noqa: F401
    COLLECTIVE_OPS, DDP_CASES, FSDP_CASES, ZERO_CASES, ZERO_TRAIN_CASES,
)
