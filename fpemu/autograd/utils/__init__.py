"""``torch.utils``: ``data`` (datasets and the loader)."""

from . import data  # noqa: F401
