"""``torch.nn``: the layers (``nn.modules``, laid out as torch's), parameters,
``functional``, ``init`` and ``utils``.

``Linear`` runs a scaled fp8 GEMM inside :func:`fpemu.autograd.fp8.fp8_autocast`.
Initialisation follows torch's rules with torch's CPU generator
(``fpemu.autograd._rng``), so a seeded model starts from torch's weights.
"""

from .parameter import Buffer, Parameter  # noqa: F401
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from . import functional, init, modules, parallel, parameter, utils  # noqa: F401
from .._core import from_torch  # noqa: F401

__all__ = ["Buffer", "Parameter", "functional", "init", "modules", "parallel", "parameter",
           "utils"] + list(_modules_all)

from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.nn (torch.nn)')
