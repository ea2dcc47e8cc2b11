"""fpemu's own small models (torch has no such classes): the causal
self-attention, the pre-norm block and the tiny language model that the
experiments and lessons train."""

from __future__ import annotations

import numpy as np

from ..._core import tensor
from .. import functional as F
from .activation import GELU
from .container import Sequential
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm
from .sparse import Embedding


class MultiheadSelfAttention(Module):
    """Multi-head self-attention on (batch, seq, d_model): one fused qkv
    projection, scaled dot-product attention per head (optionally causal),
    an output projection."""

    def __init__(self, d_model, n_heads, causal=True, dropout=0.0):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"MultiheadSelfAttention: d_model ({d_model}) must be divisible "
                             f"by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.causal = d_model, n_heads, causal
        self.qkv = Linear(d_model, 3 * d_model)
        self.proj = Linear(d_model, d_model)
        self.drop = Dropout(dropout)

    def forward(self, x):
        B, T, D = x.shape
        H = self.n_heads
        qkv = self.qkv(x).reshape(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        y = self.drop(y.transpose(1, 2).reshape(B, T, D))
        return self.proj(y)

    def extra_repr(self):
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"


class TransformerBlock(Module):
    """Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)) with a GELU MLP
    of width ``4 * d_model``."""

    def __init__(self, d_model, n_heads, causal=True, dropout=0.0):
        super().__init__()
        self.ln1 = LayerNorm(d_model)
        self.attn = MultiheadSelfAttention(d_model, n_heads, causal, dropout)
        self.ln2 = LayerNorm(d_model)
        self.mlp = Sequential(Linear(d_model, 4 * d_model), GELU(),
                              Linear(4 * d_model, d_model), Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(Module):
    """Token and position embeddings, ``n_layers`` blocks, a final LayerNorm
    and a linear head: a small causal language model."""

    def __init__(self, vocab, d_model=64, n_heads=4, n_layers=2, max_len=64, dropout=0.0):
        super().__init__()
        self.tok = Embedding(vocab, d_model)
        self.pos = Embedding(max_len, d_model)
        self.blocks = Sequential(*[TransformerBlock(d_model, n_heads, True, dropout)
                                   for _ in range(n_layers)])
        self.ln = LayerNorm(d_model)
        self.head = Linear(d_model, vocab)

    def forward(self, idx):
        T = idx.shape[1]
        pos = tensor(np.arange(T, dtype=np.int64))
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))
