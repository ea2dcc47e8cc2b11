"""``torch.utils``: ``data`` (datasets, samplers, the loader) and
``checkpoint``; ``tensorboard`` is imported on demand, as in torch."""

from . import checkpoint, data  # noqa: F401
