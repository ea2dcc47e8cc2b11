"""Where tensors live and how they are laid out: :class:`device`
(``torch.device``), the checks of a device argument, and
:class:`memory_format` (``torch.memory_format``).

fpemu emulates a machine with one CUDA device: every tensor computes as the
active profile's device does, whatever device it names.
"""

from __future__ import annotations

from ..errors import FpemuNotImplementedError, FpemuRuntimeError, FpemuTypeError
from ._profile import get_profile

#: the module pickles name for the classes and functions here: they were defined
#: in ``_core``, which re-exports them, and files saved before keep loading (a
#: weights-only load allows ``fpemu.autograd._core.device``)
_PICKLED_AS = "fpemu.autograd._core"


class device:
    """``torch.device``: fpemu computes every tensor as the active profile's
    device does; a device object records what the program asked for."""

    __module__ = _PICKLED_AS

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if isinstance(type, int) and not isinstance(type, bool):
            type, index = "cuda", type
        if not isinstance(type, str):
            raise FpemuTypeError(f"device(): expected a string such as 'cuda' or 'cpu', got "
                                 f"{type!r}")
        if ":" in type:
            type, _, idx = type.partition(":")
            index = int(idx)
        if type not in ("cuda", "cpu", "meta", "mps", "xpu"):
            raise FpemuTypeError(f"Expected one of cpu, cuda, mps, xpu, meta device type at "
                                 f"start of device string: {type}")
        self.type, self.index = type, index

    def __repr__(self):
        idx = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{idx})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        if isinstance(other, str):
            other = device(other)
        return (isinstance(other, device)
                and (self.type, self.index) == (other.type, other.index))

    def __hash__(self):
        return hash((self.type, self.index))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_device(dev, what="to()"):
    """``dev`` as a :class:`device`, refused as torch refuses it on a machine
    with one CUDA device and no MPS or XPU (fpemu emulates exactly that):
    ``mps`` and ``xpu`` are not there, ``cuda:1`` is an invalid ordinal, and
    ``meta`` tensors (shapes without values) are not emulated."""
    d = dev if isinstance(dev, device) else device(dev)
    if d.type == "mps":
        raise FpemuRuntimeError(f"{what}: PyTorch is not linked with support for mps devices "
                                f"(fpemu emulates one CUDA device; use 'cuda' or 'cpu')")
    if d.type == "xpu":
        raise FpemuRuntimeError(f"{what}: Torch not compiled with XPU enabled (fpemu emulates "
                                f"one CUDA device; use 'cuda' or 'cpu')")
    if d.type == "meta":
        raise FpemuNotImplementedError(
            f"{what}: meta tensors (shapes without values) are not emulated; fpemu computes "
            f"every value. Build the model on 'cuda' or 'cpu'.")
    if d.type == "cuda" and d.index not in (None, 0):
        raise FpemuRuntimeError(f"{what}: CUDA error: invalid device ordinal (fpemu emulates "
                                f"one device, cuda:0; got {d})")
    return d


def current_device():
    prof = get_profile()
    return device("cuda", 0) if prof.device == "cuda" else device("cpu")


class memory_format:
    """``torch.memory_format``: how torch lays a tensor out in memory. fpemu's
    values do not depend on it: the formats are accepted and checked
    (channels_last needs 4 dims, channels_last_3d 5), not stored."""

    __module__ = _PICKLED_AS

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return f"torch.{self._name}"

    def __reduce__(self):
        return (_memory_format_named, (self._name,))


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")
_MEMORY_FORMATS = {m._name: m for m in (contiguous_format, channels_last, channels_last_3d,
                                        preserve_format)}


def _memory_format_named(name):
    return _MEMORY_FORMATS[name]


_memory_format_named.__module__ = _PICKLED_AS


def check_memory_format(x, fmt, what):
    """torch's checks of a ``memory_format=`` argument for tensor ``x``."""
    if fmt is None:
        return
    if not isinstance(fmt, memory_format):
        raise TypeError(f"{what}: argument 'memory_format' must be torch.memory_format, not "
                        f"{type(fmt).__name__}")
    rank = {"channels_last": 4, "channels_last_3d": 5}.get(fmt._name)
    if rank is not None and x.ndim != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {fmt._name} format")
