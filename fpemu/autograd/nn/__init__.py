"""Modules, as ``torch.nn``: enough for an MLP and a tiny transformer.

``Linear`` runs a scaled fp8 GEMM inside :func:`fpemu.autograd.fp8.fp8_autocast`.
Initialisation follows torch's rules (uniform in ±1/sqrt(fan_in) for Linear,
N(0, 1) for Embedding) with fpemu's generator, so the numbers are not torch's.
"""

from __future__ import annotations

import collections
import collections.abc
import math

import numpy as np

from .._core import (
    Tensor, as_dtype, bfloat16, device, float16, float32, float64, is_float, no_grad, tensor,
    to_dtype,
)
from . import functional as F
from . import functional, init, utils  # noqa: F401
from . import parallel  # noqa: F401


class Parameter(Tensor):
    """A tensor that a Module registers as a parameter (requires grad by
    default). ``Parameter(t)`` shares ``t``'s storage, as in torch."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = tensor(np.zeros(0, np.float32))
        src = data if isinstance(data, Tensor) else tensor(data)
        super().__init__(src._data, src.dtype, requires_grad and is_float(src.dtype))

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


class Buffer(Tensor):
    """``nn.Buffer(t, persistent=True)``: a tensor a Module registers as a buffer."""

    def __init__(self, data, persistent=True):
        super().__init__(data._data, data.dtype)
        self.persistent = persistent


class _IncompatibleKeys(collections.namedtuple("IncompatibleKeys",
                                               ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()


def _typename(v):
    if isinstance(v, Tensor):
        return "torch.FloatTensor" if v.dtype is float32 else f"Tensor ({v.dtype})"
    return type(v).__name__


class Module:
    """Base class: parameters, buffers, submodules, train/eval, state_dict,
    hooks, with torch's attribute rules (``__setattr__``)."""

    def __init__(self, *args, **kwargs):
        d = self.__dict__
        d["_parameters"] = collections.OrderedDict()
        d["_buffers"] = collections.OrderedDict()
        d["_non_persistent"] = set()
        d["_modules"] = collections.OrderedDict()
        d["_forward_hooks"] = []
        d["_forward_pre_hooks"] = []
        d["training"] = True

    def __setattr__(self, name, value):
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError("cannot assign parameters before Module.__init__() call")
        params, bufs, mods = d["_parameters"], d["_buffers"], d["_modules"]
        if isinstance(value, Parameter):
            d.pop(name, None)
            bufs.pop(name, None)
            mods.pop(name, None)
            params[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                                f"(torch.nn.Parameter or None expected)")
            params[name] = None
        elif isinstance(value, Module):
            d.pop(name, None)
            params.pop(name, None)
            bufs.pop(name, None)
            mods[name] = value
        elif name in mods:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as child module '{name}' "
                                f"(torch.nn.Module or None expected)")
            mods[name] = None
        elif name in bufs:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{_typename(value)}' as buffer '{name}' "
                                f"(torch.Tensor or None expected)")
            bufs[name] = value
        elif isinstance(value, Buffer):
            self.register_buffer(name, value, value.persistent)
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[store]:
                del self.__dict__[store][name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                            f"(torch.nn.Parameter or None required)")
        if "." in name or not name:
            raise KeyError('parameter name can\'t contain "." and can\'t be empty')
        self.__dict__.pop(name, None)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """A tensor that is part of the module's state but not a parameter:
        in ``state_dict`` if persistent, cast by ``.to(dtype)``."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                            f"(torch Tensor or None required)")
        if "." in name or not name:
            raise KeyError('buffer name can\'t contain "." and can\'t be empty')
        if name in self._parameters or (name in self.__dict__ and name not in self._buffers):
            raise KeyError(f"attribute '{name}' already exists")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def register_module(self, name, module):
        setattr(self, name, module)

    add_module = register_module

    def get_submodule(self, target):
        m = self
        for part in target.split(".") if target else ():
            m = getattr(m, part)
        return m

    def get_parameter(self, target):
        mod, _, name = target.rpartition(".")
        return getattr(self.get_submodule(mod), name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    def __call__(self, *args, **kwargs):
        for hook in list(self._forward_pre_hooks):
            res = hook(self, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks):
            res = hook(self, args, out)
            if res is not None:
                out = res
        return out

    def register_forward_hook(self, hook):
        """``hook(module, inputs, output)``, called after every forward."""
        self._forward_hooks.append(hook)
        return _Removable(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook):
        self._forward_pre_hooks.append(hook)
        return _Removable(self._forward_pre_hooks, hook)

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name,
                                       remove_duplicate)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        return (m for _, m in self.named_children())

    def _named_members(self, store, prefix, recurse, remove_duplicate=True):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mname, m in mods:
            for pname, p in getattr(m, store).items():
                if p is None or (remove_duplicate and id(p) in seen):
                    continue
                seen.add(id(p))
                yield (f"{mname}.{pname}" if mname else pname), p

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(name, parameter) pairs; a parameter shared by two modules (tied
        weights) is listed once, under its first name."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        return (b for _, b in self.named_buffers(recurse=recurse))

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            m.__dict__["training"] = mode
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad._a = np.zeros_like(p.grad._data)

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """Parameters then persistent buffers, module by module, every name of
        a tied parameter included; the values share storage with the module
        (``detach()``), as in torch."""
        out = collections.OrderedDict() if destination is None else destination
        for name, p in self._parameters.items():
            if p is not None:
                out[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                out[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=out, prefix=f"{prefix}{name}.", keep_vars=keep_vars)
        return out

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy the values of ``state_dict`` into the parameters and
        persistent buffers (cast to their dtypes, in place). With ``strict``,
        missing or unexpected keys raise torch's report; returns
        ``(missing_keys, unexpected_keys)``."""
        if not isinstance(state_dict, collections.abc.Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:
            if unexpected:
                errors.append("Unexpected key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in missing) + ". ")
        for k, target in own.items():
            if k not in state_dict:
                continue
            value = _as_fpemu(state_dict[k])
            if tuple(value.shape) != tuple(target.shape):
                errors.append(f"size mismatch for {k}: copying a param with shape "
                              f"torch.Size({list(value.shape)}) from checkpoint, the shape in "
                              f"current model is torch.Size({list(target.shape)}).")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                               + "\n\t".join(errors))
        from ..ops.inplace import copy_into
        with no_grad():
            for k, target in own.items():
                if k in state_dict:
                    copy_into(target, _as_fpemu(state_dict[k]))
        return _IncompatibleKeys(missing, unexpected)

    def _apply_to_tensors(self, fn):
        for m in self.modules():
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None:
                        fn(t)

    def to(self, *args, **kwargs):
        """Cast every floating parameter and buffer (their storage is replaced,
        the objects stay, as torch's ``param.data = ...``); devices accepted."""
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, (str, device)) or a is None:
                continue
            if isinstance(a, Tensor):
                dtype = a.dtype
            else:
                dtype = a
        if dtype is not None:
            dtype = as_dtype(dtype, "Module.to()")
            if not is_float(dtype):
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, "
                                f"but got desired dtype={dtype}")

            def cast(t):
                if is_float(t.dtype) and t.dtype != dtype:
                    t._set_data(np.array(to_dtype(t.detach(), dtype)._data), dtype)
                    if t._grad is not None:
                        g = t._grad
                        t._grad = Tensor(np.array(to_dtype(g, dtype)._data), dtype)
            self._apply_to_tensors(cast)
        return self

    def type(self, dst_type):
        return self.to(dst_type)

    def float(self):
        return self.to(float32)

    def double(self):
        from .._core import float64
        return self.to(float64)

    def half(self):
        return self.to(float16)

    def bfloat16(self):
        return self.to(bfloat16)

    def cuda(self, *args, **kwargs):
        return self

    def cpu(self):
        return self

    def share_memory(self):
        return self

    def apply(self, fn):
        """``fn(module)`` for every submodule (children first), then self."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + ("\n)" if self._modules else ")")


class _Removable:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def _as_fpemu(v):
    """A value of a state_dict: an fpemu tensor, a real torch tensor (read
    exactly), or an array."""
    if isinstance(v, Tensor):
        return v
    if type(v).__module__.startswith("torch"):
        return from_torch(v)
    return tensor(np.asarray(v))


def from_torch(t):
    """A real torch tensor as an fpemu tensor of the same dtype, exactly (its
    bits decoded where numpy has no such dtype)."""
    from ...quantize import _from_torch
    name = str(t.dtype).replace("torch.", "")
    arr = _from_torch(t, "load_state_dict")
    return tensor(arr, dtype=as_dtype(name) if name != "float32" else float32,
                  requires_grad=False)


def _empty_param(*shape):
    return Parameter(tensor(np.zeros(shape, np.float32)))


class Linear(Module):
    """y = x @ W.T + b, W of shape (out, in). Inside ``fp8_autocast`` the GEMMs
    are scaled fp8 GEMMs under the active recipe."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty_param(out_features, in_features)
        self.bias = _empty_param(out_features) if bias else None
        self.fp8_state = None
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """torch's: kaiming_uniform_(a=sqrt(5)) for the weight, uniform in
        +-1/sqrt(fan_in) for the bias, drawn in that order."""
        _reset_fan_in(self.weight, self.bias)

    def forward(self, x):
        from .. import fp8
        recipe = fp8.active_recipe()
        if recipe is not None and not recipe.keeps_high_precision(self):
            return fp8.fp8_linear(self, x, recipe)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


def _reset_fan_in(weight, bias):
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


class Embedding(Module):
    """A lookup table, N(0, 1) at init (torch's ``normal_``); the row of
    ``padding_idx`` starts at zero and gets no gradient."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        if _weight is None:
            self.weight = _empty_param(num_embeddings, embedding_dim)
            init.normal_(self.weight)
            if padding_idx is not None:
                with no_grad():
                    self.weight[padding_idx].fill_(0)
        else:
            self.weight = Parameter(_weight, requires_grad=not _freeze)
        if dtype is not None:
            self.to(dtype)

    def forward(self, idx):
        return F.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


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


class _Activation(Module):
    _fn = None

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return type(self)._fn(x, inplace=True) if self.inplace else type(self)._fn(x)


class ReLU(_Activation):
    _fn = staticmethod(F.relu)


class SiLU(_Activation):
    _fn = staticmethod(F.silu)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, self.dim)


class Dropout(Module):
    """Dropout with a mask from fpemu's seeded generator; identity in eval()."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.inplace)


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], collections.OrderedDict):
            for name, m in modules[0].items():
                setattr(self, name, m)
        else:
            for i, m in enumerate(modules):
                setattr(self, str(i), m)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return Sequential(*mods[i])
        return mods[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        setattr(self, str(len(self)), module)
        return self

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(Module):
    def __init__(self, modules=None):
        super().__init__()
        for m in modules or ():
            self.append(m)

    def __getitem__(self, i):
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return ModuleList(mods[i])
        return mods[i]

    def __setitem__(self, i, module):
        key = list(self._modules)[i]
        setattr(self, key, module)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        setattr(self, str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        mods = list(self._modules.values())
        mods.insert(index, module)
        self._modules.clear()
        for m in mods:
            self.append(m)


class ModuleDict(Module):
    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        setattr(self, key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules):
        items = modules.items() if isinstance(modules, collections.abc.Mapping) else modules
        for k, m in items:
            setattr(self, k, m)


class ParameterList(Module):
    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def __getitem__(self, i):
        return list(self._parameters.values())[i]

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def append(self, value):
        p = value if isinstance(value, Parameter) else Parameter(value)
        self.register_parameter(str(len(self._parameters)), p)
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self


class ParameterDict(Module):
    def __init__(self, parameters=None):
        super().__init__()
        for k, v in (parameters or {}).items():
            self[k] = v

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        self.register_parameter(key, value if isinstance(value, Parameter) else Parameter(value))

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def keys(self):
        return self._parameters.keys()

    def items(self):
        return self._parameters.items()

    def values(self):
        return self._parameters.values()


class Conv2d(Module):
    """2-D convolution (im2col + the emulated matmul), torch's init."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", device=None,
                 dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError("in_channels and out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise ValueError("Conv2d: only padding_mode='zeros' is emulated")
        kh, kw = F._pair(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = (kh, kw), F._pair(stride)
        self.padding = padding if isinstance(padding, str) else F._pair(padding)
        self.dilation, self.groups = F._pair(dilation), groups
        self.weight = _empty_param(out_channels, in_channels // groups, kh, kw)
        self.bias = _empty_param(out_channels) if bias else None
        _reset_fan_in(self.weight, self.bias)
        if dtype is not None:
            self.to(dtype)

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.args = (kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)

    def forward(self, x):
        return F.avg_pool2d(x, *self.args)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = F._reduction(reduction, size_average, reduce)


class CrossEntropyLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):  # noqa: A002
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index

    def forward(self, input, target):  # noqa: A002
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class MSELoss(_Loss):
    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    def forward(self, input, target):  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class BCEWithLogitsLoss(_Loss):
    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, reduction=self.reduction)


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
        pos = tensor(np.arange(T, dtype=np.int64))
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln(self.blocks(x)))


class _RNNBase(Module):
    """LSTM, GRU and RNN over (seq, batch, feature) or, with ``batch_first``,
    (batch, seq, feature) inputs; ``num_layers`` stacked, optionally
    bidirectional. Weights are named, shaped and initialised as torch's
    (uniform in +-1/sqrt(hidden_size), drawn in parameter order), gates in
    cuDNN's order (LSTM: i, f, g, o; GRU: r, z, n). Each step composes torch's
    CPU cell: the input projection of the whole sequence first, then per step
    the hidden projection ``linear(h, w_hh, b_hh)``. Under autocast the
    projections run in the autocast dtype and the gate math in float32, as
    cuDNN's kernels do (tier 2, ``docs/autograd.md``)."""

    _gates = 1

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None,
                 nonlinearity="tanh"):
        super().__init__()
        if proj_size:
            raise NotImplementedError(
                f"LSTM(proj_size={proj_size}): the projected LSTM (weight_hr) is not "
                f"emulated; use proj_size=0, or apply an nn.Linear(hidden_size, proj_size) to "
                f"the output (which, unlike torch's, does not feed the projection back)")
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.nonlinearity = bidirectional, nonlinearity
        dirs = 2 if bidirectional else 1
        G = self._gates * hidden_size
        for layer in range(num_layers):
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                inp = input_size if layer == 0 else hidden_size * dirs
                setattr(self, "weight_ih" + sfx, _empty_param(G, inp))
                setattr(self, "weight_hh" + sfx, _empty_param(G, hidden_size))
                if bias:
                    setattr(self, "bias_ih" + sfx, _empty_param(G))
                    setattr(self, "bias_hh" + sfx, _empty_param(G))
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        std = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for w in self.parameters():
            init.uniform_(w, -std, std)

    def flatten_parameters(self):
        return None

    def forward(self, input, hx=None):  # noqa: A002
        from .._state import State
        from ..ops.shape import cat, stack
        x = input
        batched = x.ndim == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        T, B = x.shape[0], x.shape[1]
        dirs = 2 if self.bidirectional else 1
        lstm = self._gates == 4
        if hx is None:
            zeros = tensor(np.zeros((self.num_layers * dirs, B, self.hidden_size),
                                    np.float32)).to(x.dtype)
            h0, c0 = zeros, (zeros if lstm else None)
        else:
            h0, c0 = hx if lstm else (hx, None)
            if not batched:
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
        auto = bool(State.autocast) and State.autocast[-1].enabled
        if auto and x.dtype is not float64:         # _cudnn_rnn: lower-precision list
            low = State.autocast[-1].dtype
            x, h0 = x.to(low), h0.to(low)
            c0 = c0.to(low) if c0 is not None else None
        hs, cs = [], []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)
                b_ih = getattr(self, "bias_ih" + sfx) if self.bias else None
                b_hh = getattr(self, "bias_hh" + sfx) if self.bias else None
                k = layer * dirs + d
                h, c = h0[k], (c0[k] if c0 is not None else None)
                pre = F.linear(layer_in, w_ih, b_ih)               # (T, B, G)
                ys = [None] * T
                for t in (range(T - 1, -1, -1) if d else range(T)):
                    hh = F.linear(h, w_hh, b_hh)
                    pt = pre[t]
                    if auto:                                        # fp32 gate math
                        pt, hh = pt.float(), hh.float()
                    h, c = self._cell(pt, hh, h, c)
                    ys[t] = h
                outs.append(stack(ys, 0))
                hs.append(h)
                cs.append(c)
            layer_in = outs[0] if dirs == 1 else cat(outs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        out, h_n = layer_in, stack(hs, 0)
        c_n = stack(cs, 0) if lstm else None
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if lstm else None
        elif self.batch_first:
            out = out.transpose(0, 1)
        return (out, (h_n, c_n)) if lstm else (out, h_n)

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"


class LSTM(_RNNBase):
    """torch's CPU cell: ``c' = f*c + i*g``, ``h' = o*tanh(c')``."""

    _gates = 4

    def _cell(self, pre, hh, h, c):
        i, f, g, o = (pre + hh).chunk(4, 1)
        i, f, g, o = F.sigmoid(i), F.sigmoid(f), F.tanh(g), F.sigmoid(o)
        c_new = f * c.to(i.dtype) + i * g
        h_new = o * F.tanh(c_new)
        return h_new.to(h.dtype), c_new.to(c.dtype)


class GRU(_RNNBase):
    """torch's CPU cell: r, z = sigmoid(hh + pre), n = tanh(pre_n + r*hh_n),
    ``h' = (h - n)*z + n``."""

    _gates = 3

    def _cell(self, pre, hh, h, c):
        pr, pz, pn = pre.chunk(3, 1)
        hr, hz, hn = hh.chunk(3, 1)
        r, z = F.sigmoid(hr + pr), F.sigmoid(hz + pz)
        n = F.tanh(pn + hn * r)
        return ((h.to(n.dtype) - n) * z + n).to(h.dtype), None


class RNN(_RNNBase):
    """Elman RNN: ``h' = tanh(pre + hh)`` (or relu)."""

    def _cell(self, pre, hh, h, c):
        act = F.tanh if self.nonlinearity == "tanh" else F.relu
        return act(pre + hh).to(h.dtype), None


from .transformer import (  # noqa: E402,F401
    MultiheadAttention, Transformer, TransformerDecoder, TransformerDecoderLayer,
    TransformerEncoder, TransformerEncoderLayer,
)
from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.nn (torch.nn)')
