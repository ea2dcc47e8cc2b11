"""torch's legacy tensor constructors: ``torch.Tensor(2, 3)``, ``torch.Tensor([1, 2])``,
``torch.FloatTensor(...)``, ``torch.LongTensor(...)``.

Older programs build their parameters with them (``nn.Parameter(torch.Tensor(in, out))``
then ``reset_parameters()``). The rules are torch's (``torch/csrc/utils/tensor_new.cpp``,
``legacy_tensor_generic_ctor_new``, read by experiment on torch 2.13):

* no argument: an empty 1-d tensor (shape ``(0,)``);
* ints (``Tensor(2, 3)``) or one ``Size``: a tensor of that shape. torch leaves its
  memory uninitialised; fpemu fills it with zeros (deterministic);
* one sequence (list, tuple, range, numpy array): its values, copied into the
  dtype; a numpy array of the dtype's own storage type (float32 for ``Tensor``,
  int64 for ``LongTensor``) shares its memory, as in torch (fpemu stores float16
  and bfloat16 in float32, so a float16 array is copied into a ``HalfTensor``);
* one tensor: an alias of it (the same storage, dtype and version counter; its
  gradient flows back through ``AliasBackward0``); a typed class refuses another dtype;
* keywords: ``device=`` (a CPU device only: the legacy constructors build CPU
  tensors, also on a CUDA machine), or, instead of the positional argument,
  one of ``size=``, ``data=``, ``other=``.

Everything else raises torch's exception with torch's message, followed by a line
saying what to write instead.
"""

from __future__ import annotations

import collections.abc

import numpy as np

from ..errors import FpemuRuntimeError, FpemuTypeError, FpemuValueError
from ._common import ONE_ELEMENT_ONLY, c10_name
from ._core import (
    Node, Size, Tensor, bool_, device as _device, float32, is_float, np_dtype,
    set_legacy_constructor, tensor,
)
from ._dtypes import DType, Format
from ._state import State

_SIGNATURES = (" * (*, torch.device device = None)\n"
               " * (torch.Storage storage)\n"
               " * (Tensor other)\n"
               " * (tuple of ints size, *, torch.device device = None)\n"
               " * (object data, *, torch.device device = None)\n")
_FIX = ("(fpemu: the legacy constructor takes a shape as ints, Tensor(2, 3), or one sequence "
        "of values, Tensor([1.0, 2.0]); for another dtype or requires_grad use "
        "torch.tensor(data, dtype=..., requires_grad=...) or torch.zeros(shape, dtype=...))")


def type_name(obj):
    """The type of ``obj`` as torch's argument parser names it (``int``,
    ``Tensor``, ``torch.Size``, ``numpy.float64``)."""
    if isinstance(obj, Tensor):
        return "Tensor"
    if isinstance(obj, Size):
        return "torch.Size"
    if isinstance(obj, (DType, Format)):
        return "torch.dtype"
    if isinstance(obj, _device):
        return "torch.device"
    cls = type(obj)
    mod = cls.__module__
    return cls.__name__ if mod == "builtins" or not mod.startswith("numpy") else \
        f"{mod.split('.')[0]}.{cls.__name__}"


def _invalid_combination(args, kwargs):
    got = ", ".join([type_name(a) for a in args]
                    + [f"{k}={type_name(v)}" for k, v in kwargs.items()])
    if kwargs and not args:
        got += ", "                     # torch's spelling of keywords alone: "(size=int, )"
    return FpemuTypeError(f"new() received an invalid combination of arguments - got ({got}), "
                          f"but expected one of:\n{_SIGNATURES}{_FIX}")


def _int_like(x, bool_ok=False):
    """An int of a shape: a Python or numpy int, a 0-d integer array; a bool
    only after the first size (as torch's parser takes them)."""
    if isinstance(x, (bool, np.bool_)):
        return bool_ok
    if isinstance(x, (int, np.integer)):
        return True
    if isinstance(x, np.ndarray):
        return x.ndim == 0 and x.dtype.kind in "iu"
    return bool_ok and isinstance(x, Tensor) and x.dtype.__class__ is DType and \
        x.dtype is not bool_ and x.numel() == 1


def _options(dt):
    return (f"TensorOptions(dtype={c10_name(dt)}, device=cpu, layout=Strided, requires_grad="
            f"false (default), pinned_memory=false (default), memory_format=(nullopt))")


def _check_device(dev):
    if dev is None:
        return
    d = dev if isinstance(dev, _device) else _device(dev)
    if d.type != "cpu":
        raise FpemuRuntimeError(
            f"legacy constructor expects device type: cpu but device type: {d.type} was "
            f"passed (fpemu: the legacy constructors build CPU tensors, as torch's do on a "
            f"CUDA machine; use torch.zeros(shape, device='{d.type}') or "
            f"torch.tensor(data, device='{d.type}'))")


def _shape(sizes):
    shape = tuple(int(s) for s in sizes)
    for s in shape:
        if s < 0:
            raise FpemuRuntimeError(f"Trying to create tensor with negative dimension {s}: "
                                    f"{list(shape)}")
    return shape


def _alias(target, src, kwargs):
    if "device" in kwargs:
        raise FpemuRuntimeError(
            "Legacy tensor constructor of the form torch.Tensor(tensor, device=device) "
            "is not supported.  Use torch.tensor(...) or torch.as_tensor(...) instead.")
    if target is not None and src.dtype != target:
        raise FpemuTypeError(f"expected {_options(target)} (got {_options(src.dtype)})"
                             f" (fpemu: convert it with .to({target}))")
    return src._data.view(), src.dtype, src


def _sizes(sizes, dt):
    for pos, s in enumerate(sizes[1:], start=2):
        if not _int_like(s, bool_ok=True):
            raise FpemuTypeError(f"new(): argument 'size' failed to unpack the object at pos "
                                 f"{pos} with error \"type must be tuple of ints,but got "
                                 f"{type_name(s)}\" {_FIX}")
    return np.zeros(_shape(sizes), np_dtype(dt)), dt, None


_SEQUENCES = (list, tuple)


def _is_sequence(obj):
    return isinstance(obj, _SEQUENCES) or (isinstance(obj, (np.ndarray, Tensor)) and obj.ndim)


def _nested_shape(data):
    """The shape torch reads off nested lists: the first element of each level."""
    sizes, seq = [], data
    while _is_sequence(seq) and not isinstance(seq, Tensor):
        sizes.append(len(seq))
        if not len(seq):
            break
        seq = seq[0]
    return sizes


def _nested(data):
    """The shape and the flat values of nested lists, by torch's rules
    (tensor_new.cpp, ``compute_sizes`` and ``recursive_store``): the shape is
    read off the first element of each level (a tensor there is a number, not
    a level); a list of another length raises ValueError, a number where a
    list belongs or a list where a number belongs TypeError, a tensor of more
    than one element where a number belongs ValueError. Nothing is checked
    when the shape holds no element, as in torch."""
    sizes = _nested_shape(data)
    flat = []
    if 0 in sizes:
        return sizes, flat

    def visit(obj, dim):
        if dim == len(sizes):
            if isinstance(obj, Tensor) or (isinstance(obj, np.ndarray) and obj.ndim == 0):
                if obj.size != 1 if isinstance(obj, np.ndarray) else obj.numel() != 1:
                    raise FpemuValueError(ONE_ELEMENT_ONLY)
                obj = obj.item()
            if not isinstance(obj, (bool, int, float, np.bool_, np.integer, np.floating)):
                raise FpemuTypeError(f"must be real number, not {type_name(obj)}")
            flat.append(obj)
            return
        if not _is_sequence(obj):
            raise FpemuTypeError("not a sequence")
        if len(obj) != sizes[dim]:
            raise FpemuValueError(f"expected sequence of length {sizes[dim]} at dim {dim} "
                                  f"(got {len(obj)})")
        for item in obj:
            visit(item, dim + 1)
    visit(data, 0)
    return sizes, flat


def _from_numbers(numbers, shape, dt):
    try:
        return tensor(numbers, dtype=dt)._data.reshape(shape)
    except FpemuTypeError:
        if not is_float(dt):
            raise
        # ints past int64 (Tensor([2**70])): torch reads each number as a double
        return tensor(np.array([float(v) for v in numbers], np.float64),
                      dtype=dt)._data.reshape(shape)


def _values(data, dt):
    if isinstance(data, (str, bytes)):
        raise FpemuTypeError(f"new(): invalid data type '{type(data).__name__}' {_FIX}")
    if not isinstance(data, (np.ndarray, collections.abc.Sequence)):
        raise FpemuTypeError(f"new(): data must be a sequence (got {type_name(data)}) {_FIX}")
    if isinstance(data, np.ndarray) and (dt is float32 or isinstance(dt, DType)) \
            and data.dtype == np.dtype(np_dtype(dt)):
        # an array of the dtype's storage type: shared, as torch.from_numpy shares it
        if any(s < 0 for s in data.strides):
            raise FpemuValueError(
                "At least one stride in the given numpy array is negative, and tensors with "
                "negative strides are not currently supported. (You can probably work around "
                "this by making a copy of your array  with array.copy().) ")
        return data, dt, None
    if isinstance(data, _SEQUENCES):
        # regular nested numbers: numpy reads them at once, as torch would; anything
        # else (ragged, tensors inside, ints past int64) by torch's walk
        try:
            with np.errstate(all="ignore"):
                arr = np.asarray(data)
            regular = arr.dtype.kind in "biuf" and list(arr.shape) == _nested_shape(data)
        except (ValueError, TypeError):
            regular = False
        if not regular:
            sizes, flat = _nested(data)
            return _from_numbers(flat, sizes, dt), dt, None
    return tensor(data, dtype=dt)._data, dt, None


def legacy_new(target, args, kwargs):
    """``(array, dtype, alias_of)`` for ``torch.Tensor(*args, **kwargs)``
    (``target`` None) or a typed class of dtype ``target``: the storage of
    the new tensor, its dtype, and the tensor it aliases (or None)."""
    dt = float32 if target is None else target
    named = [k for k in ("size", "data", "other") if k in kwargs]
    if any(k not in ("device", "size", "data", "other") for k in kwargs) or len(named) > 1 \
            or (named and args):
        raise _invalid_combination(args, kwargs)
    if named:                   # Tensor(size=...), Tensor(data=...), Tensor(other=...)
        value = kwargs[named[0]]
        if named == ["other"]:
            if not isinstance(value, Tensor):
                raise _invalid_combination(args, kwargs)
            return _alias(target, value, kwargs)
        _check_device(kwargs.get("device"))
        if named == ["data"]:
            return _values(value, dt)
        if not isinstance(value, (tuple, list, Size)) or (value and not _int_like(value[0])):
            raise _invalid_combination(args, kwargs)
        return _sizes(tuple(value), dt)
    if not args:
        _check_device(kwargs.get("device"))
        return np.zeros(0, np_dtype(dt)), dt, None
    first = args[0]
    if len(args) == 1:
        if isinstance(first, Tensor):
            return _alias(target, first, kwargs)
        _check_device(kwargs.get("device"))
        if isinstance(first, Size):
            return _sizes(tuple(first), dt)
        if _int_like(first):
            return _sizes(args, dt)
        return _values(first, dt)
    if not _int_like(first):
        raise _invalid_combination(args, kwargs)
    _check_device(kwargs.get("device"))
    return _sizes(args, dt)


def legacy_init(self, target, args, kwargs):
    """Fill the new tensor ``self`` as ``torch.Tensor(*args, **kwargs)`` (or the
    typed class of dtype ``target``) builds it."""
    array, dt, src = legacy_new(target, args, kwargs)
    Tensor.__init__(self, array, dt, _vc=None if src is None else src._vc,
                    _base=None if src is None else (src._base if src._base is not None
                                                    else src))
    if src is not None and src.requires_grad and State.grad_enabled:
        # torch's alias() of the tensor: its gradient passes through unchanged
        self.grad_fn = Node("Alias", lambda g: (g,), ((src._edge(), src.dtype,
                                                       tuple(src.shape)),), (), True)
    return self


class LegacyTensorType:
    """``torch.FloatTensor``, ``torch.LongTensor``...: ``FloatTensor(2, 3)`` and
    ``LongTensor([1, 2])`` build tensors of that dtype by the rules of
    ``torch.Tensor(...)`` (module doc); ``isinstance(x, torch.FloatTensor)``
    checks the dtype; ``x.type(torch.LongTensor)`` converts."""

    def __init__(self, dtype, name):
        self.dtype = dtype
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return legacy_init(Tensor.__new__(Tensor), self.dtype, args, kwargs)

    def __instancecheck__(self, obj):
        return isinstance(obj, Tensor) and obj.dtype is self.dtype

    def __repr__(self):
        return f"<class 'torch.{self.__name__}'>"


set_legacy_constructor(legacy_init)
