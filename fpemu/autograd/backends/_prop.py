"""Module attributes that read and write fpemu's global state
(``torch.backends.cudnn.allow_tf32 = False``), as torch's ``PropModule``."""

from __future__ import annotations

import sys
import types


def with_properties(module_name, **props):
    """Give the module ``module_name`` the properties ``props``
    (name -> property)."""
    module = sys.modules[module_name]
    cls = type(f"{module_name}.module", (types.ModuleType,), dict(props))
    module.__class__ = cls
    return module
