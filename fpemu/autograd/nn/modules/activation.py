"""``torch.nn.modules.activation``: the activation layers and
:class:`MultiheadAttention` (where torch keeps it)."""

from __future__ import annotations

import numpy as np

from ..._core import tensor
from .. import functional as F, init as _init
from .. import init
from ..parameter import Parameter
from .linear import NonDynamicallyQuantizableLinear
from .module import Module
from .utils import _empty_param


class _Elementwise(Module):
    """An activation with an ``inplace`` flag over a functional form."""

    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return type(self)._fn(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_Elementwise):
    _fn = staticmethod(F.relu)


class SiLU(_Elementwise):
    _fn = staticmethod(F.silu)


class Mish(_Elementwise):
    _fn = staticmethod(F.mish)


class SELU(_Elementwise):
    _fn = staticmethod(F.selu)


class Hardsigmoid(_Elementwise):
    _fn = staticmethod(F.hardsigmoid)


class Hardswish(_Elementwise):
    _fn = staticmethod(F.hardswish)


class Hardtanh(Module):
    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        if min_val >= max_val:
            raise AssertionError(f"min_val must be smaller than max_val, got {min_val}, "
                                 f"{max_val}")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        inplace = ", inplace=True" if self.inplace else ""
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace}"


class ReLU6(Hardtanh):
    def __init__(self, inplace=False):
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """x if x > 0 else negative_slope * x."""

    def __init__(self, negative_slope=1e-2, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        inplace = ", inplace=True" if self.inplace else ""
        return f"negative_slope={self.negative_slope}{inplace}"


class ELU(Module):
    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.elu(input, self.alpha, self.inplace)

    def extra_repr(self):
        inplace = ", inplace=True" if self.inplace else ""
        return f"alpha={self.alpha}{inplace}"


class CELU(ELU):
    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class Softsign(Module):
    def forward(self, input):
        return F.softsign(input)


class Tanhshrink(Module):
    def forward(self, input):
        return F.tanhshrink(input)


class Softplus(Module):
    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class GLU(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class PReLU(Module):
    """x if x > 0 else a * x with a learnable ``a`` (one, or one per channel),
    initialised to ``init``."""

    def __init__(self, num_parameters=1, init=0.25, device=None, dtype=None):
        super().__init__()
        self.num_parameters, self.init = num_parameters, init
        self.weight = Parameter(tensor(np.full(num_parameters, init, np.float32)))
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        _init.constant_(self.weight, self.init)

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


class _SoftmaxBase(Module):
    _fn = None

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("dim", None)

    def forward(self, input):
        # _stacklevel: torch's; the implicit-dim warning names the module call's caller
        return type(self)._fn(input, self.dim, _stacklevel=5)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmax(_SoftmaxBase):
    _fn = staticmethod(F.softmax)


class LogSoftmax(_SoftmaxBase):
    _fn = staticmethod(F.log_softmax)


class Softmin(_SoftmaxBase):
    _fn = staticmethod(F.softmin)


class MultiheadAttention(Module):
    """Multi-head attention, ``(L, N, E)`` inputs unless ``batch_first``.

    Parameters as torch lays them out: a packed ``in_proj_weight`` (3E, E)
    when key and value have the query's width (else ``q_proj_weight``,
    ``k_proj_weight``, ``v_proj_weight``), ``in_proj_bias``, ``out_proj``
    (a Linear) and the optional ``bias_k`` / ``bias_v``, initialised in
    torch's order (so a seed gives torch's weights). ``forward`` returns
    ``(output, weights)``; the weights (averaged over heads by default) come
    from the explicit path, ``need_weights=False`` runs
    :func:`~fpemu.autograd.nn.functional.scaled_dot_product_attention`.

    torch runs a fused native kernel in eval mode without gradients (the
    "fast path"); it computes the same operations in the same precision, so
    fpemu runs the op-by-op path in every mode (``docs/autograd.md``).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _empty_param(3 * embed_dim, embed_dim)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = _empty_param(embed_dim, embed_dim)
            self.k_proj_weight = _empty_param(embed_dim, self.kdim)
            self.v_proj_weight = _empty_param(embed_dim, self.vdim)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = _empty_param(3 * embed_dim)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias)
        if add_bias_kv:
            self.bias_k = _empty_param(1, 1, embed_dim)
            self.bias_v = _empty_param(1, 1, embed_dim)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        is_batched = query.ndim == 3
        key_padding_mask = F._canonical_mask(key_padding_mask, "key_padding_mask",
                                             F._none_or_dtype(attn_mask), "attn_mask",
                                             query.dtype)
        attn_mask = F._canonical_mask(attn_mask, "attn_mask", None, "", query.dtype,
                                      check_other=False)
        if self.batch_first and is_batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, use_separate_proj_weight=separate,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight, average_attn_weights=average_attn_weights,
            is_causal=is_causal)
        if self.batch_first and is_batched:
            out = out.transpose(1, 0)
        return out, weights

    def merge_masks(self, attn_mask, key_padding_mask, query):
        """One additive mask of shape (N, heads, L, S) and torch's mask_type
        (0: attn_mask only, 1: key padding only, 2: merged)."""
        if key_padding_mask is None and attn_mask is None:
            return None, None
        n, seq = query.shape[0], query.shape[1]
        if key_padding_mask is not None and attn_mask is None:
            return key_padding_mask, 1
        am = attn_mask.view(1, 1, seq, seq).expand(n, self.num_heads, -1, -1)
        if key_padding_mask is None:
            return attn_mask, 0
        kpm = key_padding_mask.view(n, 1, 1, seq).expand(-1, self.num_heads, -1, -1)
        return am + kpm, 2
