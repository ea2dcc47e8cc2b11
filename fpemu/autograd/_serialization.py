"""``save`` and ``load``: fpemu tensors (and state_dicts, optimizer states,
any picklable object holding them) with pickle; ``load`` also reads a real
torch checkpoint when torch is installed, turning its tensors into fpemu
tensors of the same dtype, exactly."""

from __future__ import annotations

import io
import os
import pickle
import zipfile


def save(obj, f, pickle_module=pickle, pickle_protocol=2, **kwargs):
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle_module.dump(obj, fh, protocol=max(pickle_protocol, 2))
    else:
        pickle_module.dump(obj, f, protocol=max(pickle_protocol, 2))


def load(f, map_location=None, pickle_module=None, weights_only=None, mmap=None, **kwargs):
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            data = fh.read()
    else:
        data = f.read()
    if zipfile.is_zipfile(io.BytesIO(data)):
        return _load_torch(data)
    return pickle.loads(data)


def _load_torch(data):
    try:
        import torch
    except ImportError:
        raise RuntimeError("this file is a torch checkpoint (a zip archive); reading it needs "
                           "torch installed (pip install torch), or save it again with "
                           "fpemu.autograd.save") from None
    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return _convert(obj, torch)


def _convert(obj, torch):
    from .nn import from_torch
    if isinstance(obj, torch.Tensor):
        return from_torch(obj)
    if isinstance(obj, dict):
        out = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            out[k] = _convert(v, torch)
        return out
    if isinstance(obj, list):
        return [_convert(v, torch) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_convert(v, torch) for v in obj)
    return obj
