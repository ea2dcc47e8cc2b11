"""Modules that can be called like their main function.

``fpemu.explain`` and ``fpemu.stats`` are modules (``fpemu.explain.values``,
``fpemu.stats.stats_chunked``) and calling them calls the function of the same
name (``fpemu.explain(0.1, "bf16")`` is ``fpemu.explain.explain(0.1, "bf16")``).
"""

from __future__ import annotations

import sys
import types


class CallableModule(types.ModuleType):
    """A module whose call is its function of the same name."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rsplit(".", 1)[-1])(*args, **kwargs)


def make_callable(name: str) -> None:
    """Make the module ``name`` (already in sys.modules) callable."""
    sys.modules[name].__class__ = CallableModule
