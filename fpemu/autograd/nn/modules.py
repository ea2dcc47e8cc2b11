"""``torch.nn.modules``: the same classes as ``fpemu.autograd.nn``."""

from . import *  # noqa: F401,F403
from . import Module  # noqa: F401
