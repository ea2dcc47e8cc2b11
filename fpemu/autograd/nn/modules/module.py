"""``torch.nn.modules.module``: :class:`Module`, the base of every layer."""

from __future__ import annotations

import collections
import collections.abc

import numpy as np

from ..._core import (
    Tensor, as_dtype, bfloat16, check_device, float16, float32, float64, from_torch, is_float,
    no_grad, tensor, to_dtype,
)
from ..._hooks import RemovableHandle
from ..parameter import Buffer, Parameter
from ...ops.inplace import copy_into


class _IncompatibleKeys(collections.namedtuple("IncompatibleKeys",
                                               ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _typename(v):
    if isinstance(v, Tensor):
        return "torch.FloatTensor" if v.dtype is float32 else f"Tensor ({v.dtype})"
    return type(v).__name__


def _addindent(text, spaces):
    """Indent every line of ``text`` but the first (torch's ``_addindent``)."""
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    pad = " " * spaces
    return lines[0] + "\n" + "\n".join(pad + line for line in lines[1:])


def _as_fpemu(v):
    """A value of a state_dict: an fpemu tensor, a real torch tensor (read
    exactly), or an array."""
    if isinstance(v, Tensor):
        return v
    if type(v).__module__.startswith("torch"):
        return from_torch(v)
    return tensor(np.asarray(v))


class Module:
    """Base class: parameters, buffers, submodules, train/eval, state_dict,
    hooks, with torch's attribute rules (``__setattr__``) and ``repr``."""

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments "
                            f"{args or ''}{kwargs or ''}: Module.__init__ takes none")
        _init_state(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)
        _init_state(self.__dict__, keep=True)

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

    # ------------------------------------------------------------ registration
    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                            f"(torch.nn.Parameter or None required)")
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {type(name).__name__}")
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
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {type(name).__name__}")
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
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {type(name).__name__}")
        if "." in name or not name:
            raise KeyError('module name can\'t contain "." and can\'t be empty')
        self.__dict__.pop(name, None)
        self._modules[name] = module

    add_module = register_module

    def get_submodule(self, target):
        m = self
        for part in target.split(".") if target else ():
            if not hasattr(m, part):
                raise AttributeError(f"{m._get_name()} has no attribute `{part}`")
            m = getattr(m, part)
            if not isinstance(m, Module):
                raise AttributeError(f"`{part}` is not an nn.Module")
        return m

    def set_submodule(self, target, module):
        parent, _, name = target.rpartition(".")
        setattr(self.get_submodule(parent), name, module)

    def get_parameter(self, target):
        mod, _, name = target.rpartition(".")
        owner = self.get_submodule(mod)
        if name not in owner._parameters:
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return owner._parameters[name]

    def get_buffer(self, target):
        mod, _, name = target.rpartition(".")
        owner = self.get_submodule(mod)
        if name not in owner._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return owner._buffers[name]

    # ----------------------------------------------------------------- calling
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  f'"forward" function')

    def __call__(self, *args, **kwargs):
        for hook, with_kwargs in list(self._forward_pre_hooks):
            if with_kwargs:
                res = hook(self, args, kwargs)
                if res is not None:
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        out = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(self._forward_hooks):
            res = hook(self, args, kwargs, out) if with_kwargs else hook(self, args, out)
            if res is not None:
                out = res
        return out

    def _add_hook(self, hooks, hook, prepend, with_kwargs):
        entry = (hook, with_kwargs)
        if prepend:
            hooks.insert(0, entry)
        else:
            hooks.append(entry)
        return RemovableHandle(hooks, entry)

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False,
                              always_call=False):
        """``hook(module, args, output)`` (or ``hook(module, args, kwargs,
        output)`` with ``with_kwargs``) after every forward; a returned value
        replaces the output."""
        return self._add_hook(self._forward_hooks, hook, prepend, with_kwargs)

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """``hook(module, args)`` before every forward; a returned value
        replaces the positional arguments."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend, with_kwargs)

    # --------------------------------------------------------------- traversal
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
        mods = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                if recurse else [(prefix, self)])
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

    # ------------------------------------------------------------------ modes
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

    # -------------------------------------------------------------- state dicts
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
        with no_grad():
            for k, target in own.items():
                if k in state_dict:
                    copy_into(target, _as_fpemu(state_dict[k]))
        return _IncompatibleKeys(missing, unexpected)

    # ---------------------------------------------------------- dtype, device
    def _apply_to_tensors(self, fn):
        for m in self.modules():
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None:
                        fn(t)

    def to(self, *args, **kwargs):
        """Cast every floating parameter and buffer (their storage is replaced,
        the objects stay, as torch's ``param.data = ...``). Devices are
        checked as torch checks them (``docs/autograd.md``) and otherwise
        change nothing: fpemu computes as the active profile's device."""
        dtype = kwargs.pop("dtype", None)
        if kwargs.get("device") is not None:
            check_device(kwargs["device"], "Module.to()")
        for a in args:
            if isinstance(a, (str,)) or type(a).__name__ == "device":
                check_device(a, "Module.to()")
            elif a is None or isinstance(a, bool):
                continue
            elif isinstance(a, Tensor):
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
        return self.to(float64)

    def half(self):
        return self.to(float16)

    def bfloat16(self):
        return self.to(bfloat16)

    def cuda(self, device=None):
        return self if device is None else self.to(device if not isinstance(device, int)
                                                   else f"cuda:{device}")

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

    # ---------------------------------------------------------------- printing
    def extra_repr(self):
        """The arguments shown between the parentheses of ``repr``."""
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _addindent(repr(m), 2)
                       for name, m in self._modules.items()]
        lines = extra_lines + child_lines
        head = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                head += extra_lines[0]
            else:
                head += "\n  " + "\n  ".join(lines) + "\n"
        return head + ")"


def _init_state(d, keep=False):
    """The bookkeeping attributes of a Module (``keep``: fill in only the
    missing ones, for an object unpickled from an older layout)."""
    fresh = {"_parameters": collections.OrderedDict, "_buffers": collections.OrderedDict,
             "_non_persistent": set, "_modules": collections.OrderedDict,
             "_forward_hooks": list, "_forward_pre_hooks": list}
    for k, make in fresh.items():
        if not keep or k not in d:
            d[k] = make()
    if not keep or "training" not in d:
        d["training"] = True
