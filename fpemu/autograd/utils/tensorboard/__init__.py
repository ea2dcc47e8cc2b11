"""``torch.utils.tensorboard``: torch's own ``SummaryWriter`` (it needs torch
and tensorboard installed), with fpemu tensors turned into numpy arrays on
the way in. fpemu computes no graph torch could trace, so ``add_graph``
says so."""

from __future__ import annotations

try:
    from torch.utils.tensorboard import SummaryWriter as _TorchWriter
except ImportError as err:                  # torch or tensorboard missing
    raise ImportError(
        f"fpemu.autograd.utils.tensorboard passes through to torch.utils.tensorboard, which "
        f"needs torch and tensorboard installed (pip install torch tensorboard); importing it "
        f"failed: {err}") from None

from ..._core import Tensor


def _plain(v):
    """fpemu tensors (anywhere in lists, tuples and dicts) as numpy arrays."""
    if isinstance(v, Tensor):
        return v.detach()._data.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


class SummaryWriter:
    """torch's SummaryWriter; every ``add_*`` takes fpemu tensors too."""

    def __init__(self, *args, **kwargs):
        self._writer = _TorchWriter(*args, **kwargs)

    def add_graph(self, model, input_to_model=None, verbose=False, use_strict_trace=True):
        raise NotImplementedError("add_graph traces a torch model with torch.jit; an fpemu "
                                  "model has no torch graph. Log scalars, histograms and "
                                  "images instead.")

    def __getattr__(self, name):
        attr = getattr(self._writer, name)
        if not callable(attr) or not name.startswith("add_"):
            return attr

        def call(*args, **kwargs):
            return attr(*_plain(args), **_plain(kwargs))
        call.__name__ = name
        return call

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._writer.close()


__all__ = ["SummaryWriter"]
