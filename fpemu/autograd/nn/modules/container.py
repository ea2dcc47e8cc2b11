"""``torch.nn.modules.container``: :class:`Sequential`, :class:`ModuleList`,
:class:`ModuleDict`, :class:`ParameterList`, :class:`ParameterDict`."""

from __future__ import annotations

import collections
import collections.abc
import operator

from ..._core import Tensor
from ..parameter import Parameter
from .module import Module, _addindent


def _index(i, n, what):
    """An int index into ``n`` entries, wrapped as Python lists do."""
    i = operator.index(i)
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range")
    return i % n


def _delete_renumbered(container, idx, what):
    """``del container[idx]`` (an index or a slice) for the numbered
    containers, which then renumber their modules 0, 1, ... as torch's do."""
    keys = list(container._modules)
    if isinstance(idx, slice):
        for k in keys[idx]:
            del container._modules[k]
    else:
        del container._modules[keys[_index(idx, len(keys), what)]]
    items = list(container._modules.values())
    container._modules.clear()
    for i, m in enumerate(items):
        container._modules[str(i)] = m


class Sequential(Module):
    """Modules called in order, each on the previous one's output."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], collections.OrderedDict):
            for name, m in args[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(args):
                self.add_module(str(i), m)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)(collections.OrderedDict(list(self._modules.items())[idx]))
        keys = list(self._modules)
        return self._modules[keys[_index(idx, len(keys), "Sequential")]]

    def __setitem__(self, idx, module):
        keys = list(self._modules)
        setattr(self, keys[_index(idx, len(keys), "Sequential")], module)

    def __delitem__(self, idx):
        _delete_renumbered(self, idx, "Sequential")

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __add__(self, other):
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but "
                             f"{type(other)} is given.")
        return Sequential(*self, *other)

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, sequential):
        for m in sequential:
            self.append(m)
        return self

    def insert(self, index, module):
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        n = len(self._modules)
        if not -n <= index <= n:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += n
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self._modules[str(i)] = m
        return self

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleList(Module):
    """A list of modules, registered as children (their parameters count)."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, idx):
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            return type(self)(mods[idx])
        return mods[_index(idx, len(mods), "ModuleList")]

    def __setitem__(self, idx, module):
        key = list(self._modules)[_index(idx, len(self._modules), "ModuleList")]
        setattr(self, key, module)

    def __delitem__(self, idx):
        _delete_renumbered(self, idx, "ModuleList")

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        out = ModuleList()
        for m in list(self) + list(other):
            out.append(m)
        return out

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        if not isinstance(modules, collections.abc.Iterable):
            raise TypeError(f"ModuleList.extend should be called with an iterable, but got "
                            f"{type(modules).__name__}")
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        for i, m in enumerate(items):
            self.add_module(str(i), m)

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def __repr__(self):
        """Runs of equal entries are folded, as torch prints them:
        ``(0-2): 3 x Linear(...)``."""
        reprs = [repr(m) for m in self]
        if not reprs:
            return self._get_name() + "()"
        runs = []                          # [first, last, repr]
        for i, r in enumerate(reprs):
            if runs and runs[-1][2] == r:
                runs[-1][1] = i
            else:
                runs.append([i, i, r])
        lines = [_addindent(f"({a}): {r}" if a == b else f"({a}-{b}): {b - a + 1} x {r}", 2)
                 for a, b, r in runs]
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """A dict of modules, registered as children, in insertion order."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def clear(self):
        self._modules.clear()

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules):
        if not isinstance(modules, collections.abc.Iterable):
            raise TypeError(f"ModuleDict.update should be called with an iterable of "
                            f"key/value pairs, but got {type(modules).__name__}")
        items = modules.items() if isinstance(modules, collections.abc.Mapping) else modules
        for j, kv in enumerate(items):
            if not isinstance(modules, collections.abc.Mapping) and len(kv) != 2:
                raise ValueError(f"ModuleDict update sequence element #{j} has length "
                                 f"{len(kv)}; 2 is required")
            k, m = kv
            self[k] = m


def _param_line(k, p, typename=False):
    """One entry of a parameter container's repr, as torch prints it (the
    dtype for a list, the tensor type for a dict)."""
    if isinstance(p, Tensor):
        size = "x".join(str(s) for s in p.shape)
        dev = f" ({p.device})" if p.device.type == "cuda" else ""
        kind = "Parameter" if isinstance(p, Parameter) else "Tensor"
        what = p.type() if typename else p.dtype
        return f"  ({k}): {kind} containing: [{what} of size {size}{dev}]"
    return f"  ({k}): Object of type: {type(p).__name__}"


class ParameterList(Module):
    """A list of parameters, registered on the module."""

    def __init__(self, values=None):
        super().__init__()
        for v in values or ():
            self.append(v)

    def __getitem__(self, idx):
        vals = list(self._parameters.values())
        if isinstance(idx, slice):
            return type(self)(vals[idx])
        return vals[_index(idx, len(vals), "ParameterList")]

    def __setitem__(self, idx, value):
        key = list(self._parameters)[_index(idx, len(self._parameters), "ParameterList")]
        self.register_parameter(key, value if isinstance(value, Parameter) else
                                Parameter(value))

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def __iadd__(self, values):
        return self.extend(values)

    def append(self, value):
        p = value if isinstance(value, Parameter) else Parameter(value)
        self.register_parameter(str(len(self._parameters)), p)
        return self

    def extend(self, values):
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(_param_line(k, p) for k, p in enumerate(self))


class ParameterDict(Module):
    """A dict of parameters, registered on the module, in insertion order."""

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key):
        return self._parameters[key]

    def __setitem__(self, key, value):
        self.register_parameter(key, value if isinstance(value, Parameter) else
                                Parameter(value))

    def __delitem__(self, key):
        del self._parameters[key]

    def __contains__(self, key):
        return key in self._parameters

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

    def get(self, key, default=None):
        return self._parameters.get(key, default)

    def pop(self, key):
        v = self[key]
        del self[key]
        return v

    def update(self, parameters):
        items = (parameters.items() if isinstance(parameters, collections.abc.Mapping)
                 else parameters)
        for k, v in items:
            self[k] = v

    def extra_repr(self):
        return "\n".join(_param_line(k, p, typename=True) for k, p in self.items())
