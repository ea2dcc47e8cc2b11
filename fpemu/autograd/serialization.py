"""``torch.serialization``: ``save``, ``load`` and the allowlist of a
weights-only load, with torch 2.13's semantics.

``load(f)`` reads with ``weights_only=True`` unless told otherwise, as torch
has since 2.6: the file may hold tensors, parameters, dtypes, devices, sizes,
the plain Python containers and numbers, ``OrderedDict`` and ``Counter``,
and nothing else unless it is allowlisted with :func:`add_safe_globals` or
the :class:`safe_globals` context manager (``sys``, ``os``, ``posix`` and
``nt`` stay blocked even then). Anything else stops the load with torch's
``Weights only load failed ... Unsupported global: GLOBAL <name> was not an
allowed global by default`` error, before any object is built. A module
pickled whole therefore loads only when its classes (and the functions it
holds, such as a ``TransformerEncoderLayer``'s activation) are allowed.
``weights_only=False`` unpickles anything (only for files you trust), and
``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` / ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``
act as in torch.

fpemu writes plain pickles (tensors as their bytes, dtype and shape); a real
torch checkpoint (a zip archive) is read with torch, under the same
``weights_only``, and its tensors become fpemu tensors exactly.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import collections
import io
import os
import pickle
import pickletools
import warnings
import zipfile

from ..errors import FpemuTypeError
from ..formats import Format
from . import _core
from ._core import from_torch
from .nn import parameter
from .nn.parameter import Parameter

DEFAULT_PROTOCOL = 2
_BLOCKED_MODULES = ("sys", "os", "posix", "nt")
_user_globals = set()


# ------------------------------------------------------------------- allowlist
def _default_globals():
    """The globals a weights-only load accepts without being told."""

    allowed = {
        "collections.OrderedDict": collections.OrderedDict,
        "collections.Counter": collections.Counter,
        "_codecs.encode": codecs.encode,              # bytes, in protocol 2
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.bytearray": bytearray,
        "builtins.complex": complex,
        "builtins.slice": slice,
        "fpemu.formats.Format": Format,
    }
    for obj in (_core._rebuild_tensor, _core._dtype_by_name, _core.Size, _core.device,
                parameter._rebuild_parameter):
        allowed[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return allowed


def _key(obj):
    if isinstance(obj, tuple):
        if len(obj) != 2:
            raise ValueError(f"Expected tuple of length 2 (global, str of callable full path), "
                             f"but got tuple of length: {len(obj)}")
        if not isinstance(obj[1], str):
            raise TypeError(f"Expected second item in tuple to be str of callable full path, "
                            f"but got: {type(obj[1])}")
        return obj[1], obj[0]
    name = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if name is None or module is None:
        raise FpemuTypeError(f"add_safe_globals: {obj!r} has no __module__ and __qualname__; "
                             f"pass a class or function, or a (object, 'module.name') pair")
    return f"{module}.{name}", obj


def _user_allowed():
    return dict(_key(g) for g in _user_globals)


def add_safe_globals(safe_globals):
    """Allow these classes and functions (or ``(object, "module.name")``
    pairs) in every later weights-only load."""
    global _user_globals
    entries = _entries(safe_globals, "add_safe_globals")
    _user_globals = _user_globals | set(entries)


def _entries(safe_globals, fname):
    """The allowlist entries, checked now, not at load time."""
    if isinstance(safe_globals, (str, bytes)) or not hasattr(safe_globals, "__iter__"):
        raise FpemuTypeError(
            f"{fname}: expects a list of classes or functions (or (object, 'module.name') "
            f"pairs), got {type(safe_globals).__name__} {safe_globals!r}; pass a list, e.g. "
            f"[MyModule] (a name as text is not an object: import it first)")
    entries = list(safe_globals)
    for g in entries:
        _key(g)
    return entries


def get_safe_globals():
    """The user's allowlist (``add_safe_globals`` and active ``safe_globals``)."""
    return list(_user_globals)


def clear_safe_globals():
    """Forget every allowlisted global."""
    global _user_globals
    _user_globals = set()


class safe_globals:
    """``with safe_globals([Net, ...]):`` allows them for loads inside the block."""

    def __init__(self, safe_globals):
        self.safe_globals = _entries(safe_globals, "safe_globals")

    def __enter__(self):
        add_safe_globals(self.safe_globals)
        return self

    def __exit__(self, *exc):
        global _user_globals
        _user_globals = _user_globals - set(self.safe_globals)
        return False


def _globals_in(data):
    """Every ``module.name`` global a pickle refers to, in order."""
    found, strings = [], []
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        if op.name == "GLOBAL":
            found.append(arg.replace(" ", ".", 1))
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append(f"{strings[-2]}.{strings[-1]}")
        elif isinstance(arg, str):
            strings.append(arg)
    return list(dict.fromkeys(found))


def _py3_name(full):
    module, _, name = full.rpartition(".")
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    return f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}"


def get_unsafe_globals_in_checkpoint(f):
    """The globals of the checkpoint ``f`` that a weights-only load would
    refuse (read without unpickling anything)."""
    data = _read(f)
    if zipfile.is_zipfile(io.BytesIO(data)):
        torch = _torch("get_unsafe_globals_in_checkpoint")
        return torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    allowed = set(_default_globals()) | set(_user_allowed())
    return [g for g in map(_py3_name, _globals_in(data)) if g not in allowed]


# ------------------------------------------------------------------ unpickling
_UNSAFE = ("In PyTorch 2.6 the default of `weights_only` in `torch.load` changed from False to "
           "True (fpemu follows torch 2.13). Loading with `weights_only=False` will likely "
           "succeed, but it runs whatever code the file names: do it only for a file from a "
           "trusted source.")


def _builtin_name(full):
    return full[len("builtins."):] if full.startswith("builtins.") else full


class _WeightsUnpickler(pickle.Unpickler):
    """A pickle reader that builds only allowlisted classes and calls only
    allowlisted functions: every global goes through :meth:`find_class`."""

    def __init__(self, file, allowed, **kwargs):
        super().__init__(file, **kwargs)
        self._allowed = allowed

    def find_class(self, module, name):
        # protocol 0-2 pickles name Python 2's modules (__builtin__.set)
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f"{module}.{name}"
        if module.split(".")[0] in _BLOCKED_MODULES:
            raise pickle.UnpicklingError(f"Trying to load unsupported GLOBAL {full} whose "
                                         f"module {module} is blocked.")
        if full in self._allowed:
            return self._allowed[full]
        if full == "fpemu.autograd._core._rebuild":
            raise pickle.UnpicklingError(
                f"Unsupported global: GLOBAL {full} was not an allowed global by default. "
                f"The file was written by an earlier fpemu release, whose tensors a "
                f"weights-only load cannot read: load it once with weights_only=False (if you "
                f"trust it) and save it again.")
        shown = _builtin_name(full)
        raise pickle.UnpicklingError(
            f"Unsupported global: GLOBAL {shown} was not an allowed global by default. Please "
            f"use `torch.serialization.add_safe_globals([{shown}])` or the "
            f"`torch.serialization.safe_globals([{shown}])` context manager to allowlist this "
            f"global if you trust this class/function.")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("unsupported persistent id encountered")


def _weights_only_message(err):
    text = str(err)
    if "was not an allowed global by default" in text:
        return ("Weights only load failed. This file can still be loaded; do either of these "
                "only if you trust the source of the checkpoint.\n\t(1) " + _UNSAFE
                + "\n\t(2) To load with `weights_only=True`, allowlist what the error below "
                "names.\n\tWeightsUnpickler error: " + text)
    return f"Weights only load failed. {_UNSAFE}\n\n{text}"


def _read(f):
    if isinstance(f, (str, os.PathLike)):
        path = os.fspath(f)
        if os.path.isdir(path):
            raise IsADirectoryError(f"load: {path!r} is a directory, not a checkpoint file")
        with open(path, "rb") as fh:
            return fh.read()
    if not hasattr(f, "read"):
        raise FpemuTypeError(f"load: expected a path or a file opened in binary mode, got "
                             f"{type(f).__name__}")
    data = f.read()
    if isinstance(data, str):
        raise FpemuTypeError("load: the file is open in text mode; open it with 'rb'")
    return data


def _torch(what):
    try:
        import torch                        # (local: torch is an optional dependency)
    except ImportError:
        raise RuntimeError(f"{what}: this file is a torch checkpoint (a zip archive); reading "
                           f"it needs torch installed (pip install torch), or save it again "
                           f"with fpemu.autograd.save") from None
    return torch


def _weights_only_flag(weights_only):
    """torch's rule: the argument, unless an environment variable forces it."""
    truthy = ("1", "y", "yes", "true")
    force = os.getenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in truthy
    force_no = os.getenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "0").lower() in truthy
    if force and force_no:
        raise RuntimeError("Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or "
                           "`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` should be set, but both were "
                           "set.")
    if force:
        return True
    if force_no and weights_only is None:
        warnings.warn("Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since "
                      "the`weights_only` argument was not explicitly passed to `torch.load`, "
                      "forcing weights_only=False.", UserWarning, stacklevel=3)
        return False
    return True if weights_only is None else bool(weights_only)


def save(obj, f, pickle_module=pickle, pickle_protocol=DEFAULT_PROTOCOL,
         _use_new_zipfile_serialization=True, _disable_byteorder_record=False):
    """Pickle ``obj`` (tensors, state_dicts, optimizer states, modules, ...)
    to a path or a binary file."""
    protocol = max(int(pickle_protocol), 2)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle_module.dump(obj, fh, protocol=protocol)
    else:
        pickle_module.dump(obj, f, protocol=protocol)


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None,
         **pickle_load_args):
    """Read what :func:`save` (or ``torch.save``) wrote. ``map_location`` is
    accepted and changes nothing: fpemu tensors live on its one device."""
    weights_only = _weights_only_flag(weights_only)
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is "
                           "specified")
    if weights_only and pickle_load_args:
        warnings.warn("pickle_load_args only works if `weights_only=False`.", stacklevel=2)
    data = _read(f)
    if zipfile.is_zipfile(io.BytesIO(data)):
        return _load_torch(data, weights_only)
    if data[:4] == b"PK\x03\x04":            # a zip archive without its directory: cut short
        raise RuntimeError("PytorchStreamReader failed reading zip archive: failed finding "
                           "central directory (the checkpoint is truncated or damaged; save it "
                           "again, weights_only has nothing to do with it)")
    if not weights_only:
        module = pickle if pickle_module is None else pickle_module
        return module.loads(data, **pickle_load_args)
    allowed = _default_globals()
    allowed.update(_user_allowed())
    try:
        return _WeightsUnpickler(io.BytesIO(data), allowed, encoding="utf-8").load()
    except EOFError as err:
        raise EOFError(f"load: the checkpoint ends too soon ({err or 'Ran out of input'}): "
                       "it is truncated or empty; save it again") from None
    except pickle.UnpicklingError as err:
        if "truncated" in str(err):
            raise pickle.UnpicklingError(f"load: {err}: the checkpoint is truncated; save it "
                                         "again") from None
        raise pickle.UnpicklingError(_weights_only_message(err)) from None


def _load_torch(data, weights_only):
    torch = _torch("load")
    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    return _convert(obj, torch)


def _convert(obj, torch):
    """A torch checkpoint's objects with every torch tensor made an fpemu
    tensor of the same dtype, exactly; containers keep their type."""
    if isinstance(obj, torch.nn.Parameter):
        return Parameter(from_torch(obj.detach()), obj.requires_grad)
    if isinstance(obj, torch.Tensor):
        return from_torch(obj.detach())
    if isinstance(obj, torch.nn.Module):
        raise FpemuTypeError(
            f"this checkpoint holds a whole torch module ({type(obj).__name__}); fpemu cannot "
            f"run torch's module objects. Save its state_dict() with torch and load that into "
            f"the same model built with fpemu.autograd.nn (model.load_state_dict(...)).")
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = _convert(v, torch)
        return out
    if isinstance(obj, list):
        return [_convert(v, torch) for v in obj]
    if isinstance(obj, tuple):
        items = [_convert(v, torch) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj
