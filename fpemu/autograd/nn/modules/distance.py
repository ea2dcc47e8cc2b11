"""``torch.nn.modules.distance``: :class:`CosineSimilarity`."""

from __future__ import annotations

from .. import functional as F
from .module import Module


class CosineSimilarity(Module):
    """``F.cosine_similarity(x1, x2, dim, eps)``."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)
