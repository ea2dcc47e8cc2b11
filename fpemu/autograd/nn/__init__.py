"""Modules, as ``torch.nn``: enough for an MLP and a tiny transformer.

``Linear`` runs a scaled fp8 GEMM inside :func:`fpemu.autograd.fp8.fp8_autocast`.
Initialisation follows torch's rules (uniform in ±1/sqrt(fan_in) for Linear,
N(0, 1) for Embedding) with fpemu's generator, so the numbers are not torch's.
"""

from __future__ import annotations

import collections

import numpy as np

from .. import _ops as F
from .._core import Tensor, _State, as_dtype, bfloat16, float16, float32, is_float, tensor
from . import functional, utils  # noqa: F401


class Parameter(Tensor):
    """A tensor that a Module registers as a parameter (requires grad)."""

    def __init__(self, data, requires_grad=True):
        src = data if isinstance(data, Tensor) else tensor(data)
        super().__init__(src._a, src.dtype, requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Module:
    """Base class: parameters, submodules, train/eval, state_dict, hooks."""

    def __init__(self):
        object.__setattr__(self, "_parameters", collections.OrderedDict())
        object.__setattr__(self, "_modules", collections.OrderedDict())
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("call Module.__init__() (super().__init__()) before assigning "
                                 "attributes")
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif value is None and name in self._parameters:
            self._parameters[name] = None
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks):
            res = hook(self, args, out)
            if res is not None:
                out = res
        return out

    def register_forward_hook(self, hook):
        """``hook(module, inputs, output)``, called after every forward."""
        self._forward_hooks.append(hook)
        hooks = self._forward_hooks

        class _H:
            def remove(_self):
                if hook in hooks:
                    hooks.remove(hook)
        return _H()

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self):
        return (m for _, m in self.named_modules())

    def children(self):
        return iter(self._modules.values())

    def named_parameters(self, prefix=""):
        seen = set()
        for mname, m in self.named_modules(prefix):
            for pname, p in m._parameters.items():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mname}.{pname}" if mname else pname), p

    def parameters(self):
        return (p for _, p in self.named_parameters())

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad._a = np.zeros_like(p.grad._a)

    def state_dict(self):
        return collections.OrderedDict((n, Tensor(p._a.copy(), p.dtype))
                                       for n, p in self.named_parameters())

    def load_state_dict(self, state):
        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise RuntimeError(f"load_state_dict(): missing keys {missing}, unexpected keys "
                               f"{unexpected}")
        for name, value in state.items():
            p = own[name]
            if tuple(value.shape) != p.shape:
                raise RuntimeError(f"load_state_dict(): {name} has shape {p.shape}, the state "
                                   f"{tuple(value.shape)}")
            p._a = F._store(value._a if isinstance(value, Tensor) else np.asarray(value),
                            p.dtype).copy()
        return self

    def to(self, *args, **kwargs):
        """Cast every floating parameter in place (devices are ignored)."""
        dtype = kwargs.get("dtype")
        for a in args:
            if not isinstance(a, str):
                dtype = a
        if dtype is not None:
            dtype = as_dtype(dtype, "Module.to()")
            for p in self.parameters():
                if is_float(p.dtype):
                    p._a = F._store(p._a, dtype)
                    p.dtype = dtype
                    if p.grad is not None:
                        p.grad = None
        return self

    def float(self):
        return self.to(float32)

    def half(self):
        return self.to(float16)

    def bfloat16(self):
        return self.to(bfloat16)

    def cuda(self, *args, **kwargs):
        return self

    def apply(self, fn):
        for m in self.modules():
            fn(m)
        return self

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + ("\n)" if self._modules else ")")


def _uniform(shape, bound):
    return tensor(_State.rng.uniform(-bound, bound, size=shape).astype(np.float32))


class Linear(Module):
    """y = x @ W.T + b, W of shape (out, in). Inside ``fp8_autocast`` the GEMMs
    are scaled fp8 GEMMs under the active recipe."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / np.sqrt(in_features) if in_features else 0.0
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None
        self.fp8_state = None
        if dtype is not None:
            self.to(dtype)

    def forward(self, x):
        from .. import fp8
        recipe = fp8.active_recipe()
        if recipe is not None:
            return fp8.fp8_linear(self, x, recipe)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, dtype=None, device=None):
        super().__init__()
        self.weight = Parameter(tensor(_State.rng.standard_normal(
            (num_embeddings, embedding_dim)).astype(np.float32)))
        if dtype is not None:
            self.to(dtype)

    def forward(self, idx):
        return F.embedding(idx, self.weight)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 dtype=None, device=None):
        super().__init__()
        self.normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                                 else tuple(normalized_shape))
        self.eps = eps
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) \
            if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) \
            if elementwise_affine and bias else None
        if dtype is not None:
            self.to(dtype)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, dtype=None,
                 device=None):
        super().__init__()
        self.normalized_shape = ((normalized_shape,) if isinstance(normalized_shape, int)
                                 else tuple(normalized_shape))
        self.eps = eps
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) \
            if elementwise_affine else None
        if dtype is not None:
            self.to(dtype)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Dropout(Module):
    """Dropout with a mask from fpemu's seeded generator; identity in eval()."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class CrossEntropyLoss(Module):
    def __init__(self, reduction="mean", ignore_index=-100, label_smoothing=0.0):
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):  # noqa: A002
        return F.cross_entropy(input, target, self.reduction, self.ignore_index,
                               self.label_smoothing)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, self.reduction)


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
        pos = Tensor(np.arange(T, dtype=np.int64), idx.dtype)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))
