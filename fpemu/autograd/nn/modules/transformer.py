"""``torch.nn.modules.transformer``: the ``nn.Transformer`` family, with
torch's names, arguments, parameter layout, initialisation order (so a seed
gives torch's weights) and forward op sequence.

torch switches to fused native kernels in eval mode without gradients (the
"fast path"). Those compute the same operations in the same precision, so
fpemu runs the op-by-op path in every mode; the one visible effect of the
fast path, kept here, is that ``TransformerEncoder`` then returns zeros at
the positions ``src_key_padding_mask`` pads (it runs on a nested tensor).
See ``docs/autograd.md`` ("API coverage").
"""

from __future__ import annotations

import copy
import warnings

import numpy as np

from ..._core import _store, float32, Tensor, tensor
from ..._state import State
from .. import functional as F
from .. import init
from .activation import GELU, MultiheadAttention, ReLU
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .normalization import LayerNorm
from ..._autocast import is_autocast_enabled
from ...ops.elementwise import where

__all__ = ["Transformer", "TransformerDecoder", "TransformerDecoderLayer",
           "TransformerEncoder", "TransformerEncoderLayer"]


def _activation(activation):
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    return activation


def _is_relu_or_gelu(activation):
    if activation is F.relu or isinstance(activation, ReLU):
        return 1
    if activation is F.gelu or isinstance(activation, GELU):
        return 2
    return 0


def generate_square_subsequent_mask(sz, device=None, dtype=None):
    """(sz, sz) float mask: 0 on and below the diagonal, -inf above."""
    dt = float32 if dtype is None else dtype
    return Tensor(_store(np.triu(np.full((sz, sz), -np.inf), 1), dt), dt)


def _detect_is_causal_mask(mask, is_causal, size):
    if is_causal is True:
        return True
    if is_causal is None and mask is not None:
        sz = size if size is not None else mask.shape[-2]
        if tuple(mask.shape) != (sz, sz):
            return False
        ref = np.triu(np.full((sz, sz), -np.inf), 1)
        return bool(np.array_equal(mask._data.astype(np.float64), ref))
    return False


class _Layer(Module):
    """What torch's encoder and decoder layers share: the feed-forward parts
    and the norms and dropouts, registered in torch's order (so parameters
    and state_dict keys come in torch's order), and the self-attention and
    feed-forward blocks."""

    def _add_parts(self, d_model, dim_feedforward, dropout, layer_norm_eps, norm_first, bias,
                   count):
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        for i in range(1, count + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for i in range(1, count + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _feed_forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class TransformerEncoderLayer(_Layer):
    """Self-attention and feed-forward blocks with residuals and LayerNorms
    (post-norm unless ``norm_first``), as torch's."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self._add_parts(d_model, dim_feedforward, dropout, layer_norm_eps, norm_first, bias, 2)
        activation = _activation(activation)
        self.activation_relu_or_gelu = _is_relu_or_gelu(activation)
        self.activation = activation
        if dtype is not None:
            self.to(dtype)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        src_key_padding_mask = F._canonical_mask(src_key_padding_mask, "src_key_padding_mask",
                                                 F._none_or_dtype(src_mask), "src_mask",
                                                 src.dtype)
        src_mask = F._canonical_mask(src_mask, "src_mask", None, "", src.dtype,
                                     check_other=False)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _ff_block(self, x):
        return self.dropout2(self._feed_forward(x))


class TransformerDecoderLayer(_Layer):
    """Self-attention, cross-attention on ``memory`` and feed-forward blocks,
    as torch's."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout,
                                            batch_first=batch_first, bias=bias)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout,
                                                 batch_first=batch_first, bias=bias)
        self._add_parts(d_model, dim_feedforward, dropout, layer_norm_eps, norm_first, bias, 3)
        self.activation = _activation(activation)
        if dtype is not None:
            self.to(dtype)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                               memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self._feed_forward(x))


def _clones(module, n):
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def _seq_len(src, batch_first):
    if src.ndim == 2:
        return src.shape[0]
    return src.shape[1 if batch_first else 0]


def _left_aligned(keep):
    """True when every row of the keep mask is a run of True then False."""
    k = np.asarray(keep, bool)
    return bool(np.all(k[..., 1:] <= k[..., :-1]))


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer`` and an optional final
    norm. In eval mode without gradients, with ``src_key_padding_mask`` (a
    left-aligned boolean mask) and a layer torch's nested-tensor path
    accepts, the padded positions of the output are zeros, as in torch."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.use_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check
        why = ""
        el = "encoder_layer"
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            why = f"{el} was not TransformerEncoderLayer"
        elif encoder_layer.norm_first:
            why = f"{el}.norm_first was True"
        elif not encoder_layer.self_attn.batch_first:
            why = (f"{el}.self_attn.batch_first was not True(use batch_first for better "
                   f"inference performance)")
        elif not encoder_layer.self_attn._qkv_same_embed_dim:
            why = f"{el}.self_attn._qkv_same_embed_dim was not True"
        elif encoder_layer.self_attn.in_proj_bias is None:
            why = f"{el}.self_attn was passed bias=False"
        elif not encoder_layer.activation_relu_or_gelu:
            why = f"{el}.activation_relu_or_gelu was not True"
        elif encoder_layer.norm1.eps != encoder_layer.norm2.eps:
            why = f"{el}.norm1.eps was not equal to {el}.norm2.eps"
        elif encoder_layer.self_attn.num_heads % 2 == 1:
            why = f"{el}.self_attn.num_heads is odd"
        if enable_nested_tensor and why:
            warnings.warn(f"enable_nested_tensor is True, but self.use_nested_tensor is False "
                          f"because {why}", stacklevel=2)
            self.use_nested_tensor = False

    def _pads_to_zero(self, src, mask, kpm):
        """torch's conditions for running the layers on a nested tensor."""
        first = self.layers[0]
        if not (self.use_nested_tensor and not first.training and src.ndim == 3
                and kpm is not None and mask is None and not is_autocast_enabled()):
            return False
        if getattr(self, "mask_check", True) and not _left_aligned(kpm._data == 0):
            return False
        if State.grad_enabled and (src.requires_grad or any(
                p.requires_grad for p in first.parameters())):
            return False
        return True

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        kpm = F._canonical_mask(src_key_padding_mask, "src_key_padding_mask",
                                F._none_or_dtype(mask), "mask", src.dtype)
        mask = F._canonical_mask(mask, "mask", None, "", src.dtype, check_other=False)
        batch_first = self.layers[0].self_attn.batch_first
        zero_pads = self._pads_to_zero(src, mask, kpm)
        is_causal = _detect_is_causal_mask(mask, is_causal, _seq_len(src, batch_first))
        output = src
        for mod in self.layers:
            output = mod(output, src_mask=mask, is_causal=is_causal,
                         src_key_padding_mask=kpm)
        if zero_pads:
            output = where(tensor(kpm._data == 0).unsqueeze(-1), output, 0.0)
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoder(Module):
    """``num_layers`` deep copies of ``decoder_layer`` and an optional final norm."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        output = tgt
        seq = _seq_len(tgt, self.layers[0].self_attn.batch_first)
        tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal, seq)
        for mod in self.layers:
            output = mod(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                         tgt_key_padding_mask=tgt_key_padding_mask,
                         memory_key_padding_mask=memory_key_padding_mask,
                         tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """Encoder-decoder transformer ("Attention Is All You Need"), torch's
    layout; every parameter of two or more dimensions is re-initialised with
    ``xavier_uniform_`` after construction, as torch does."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation=F.relu, custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        super().__init__()
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
                                            layer_norm_eps, batch_first, norm_first, bias)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation,
                                            layer_norm_eps, batch_first, norm_first, bias)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first
        if dtype is not None:
            self.to(dtype)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        is_batched = src.ndim == 3
        bdim = 0 if self.batch_first else 1
        if is_batched and src.shape[bdim] != tgt.shape[bdim]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    generate_square_subsequent_mask = staticmethod(generate_square_subsequent_mask)
