"""PyTorch, imported when first needed: an optional dependency of fpemu."""

from __future__ import annotations

__all__ = ["torch_module"]


def torch_module():
    """The ``torch`` module, or an ImportError that says how to install it."""
    try:
        import torch  # optional dependency
    except ImportError as err:    # pragma: no cover - the tests run with torch
        raise ImportError("fpemu.torch watches PyTorch models and needs PyTorch: "
                          "pip install torch (or pip install 'fpemu[torch]')") from err
    return torch
