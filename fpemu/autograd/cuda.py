"""``torch.cuda``: fpemu emulates one CUDA device; this namespace answers as
torch.cuda does for it. ``cuda.amp`` holds the deprecated ``autocast`` and
``GradScaler`` spellings that tutorials use."""

import time

from . import amp as _amp
from ._autocast import autocast as _autocast
from ._core import float16 as _float16
from ._core import manual_seed as _manual_seed
from ._profile import get_profile


def is_available():
    """True under the CUDA profile (the default), so programs take their GPU
    branches; False under a CPU profile (``FPEMU_PROFILE=cpu``)."""
    return not get_profile().cpu


def is_bf16_supported(including_emulation=True):
    return True


def device_count():
    return 1


def current_device():
    return 0


def set_device(device):
    """Only device 0 exists."""
    idx = device if isinstance(device, int) else getattr(device, "index", None)
    if isinstance(device, str):
        idx = int(device.split(":")[1]) if ":" in device else 0
    if idx not in (None, 0):
        raise RuntimeError(f"CUDA error: invalid device ordinal (fpemu emulates one device, "
                           f"index 0; got {device!r})")


def get_device_name(device=None):
    return "fpemu emulated CUDA device"


def get_device_capability(device=None):
    return (9, 0)


def synchronize(device=None):
    return None


def empty_cache():
    return None


def manual_seed(seed):
    return _manual_seed(seed)


def manual_seed_all(seed):
    return _manual_seed(seed)


def max_memory_allocated(device=None):
    return 0


def memory_allocated(device=None):
    return 0


def reset_peak_memory_stats(device=None):
    return None


def memory_reserved(device=None):
    """0: fpemu's tensors live in host memory (NumPy arrays), none on a device."""
    return 0


def max_memory_reserved(device=None):
    return 0


class Event:
    """``torch.cuda.Event``: marks a point in the program; with
    ``enable_timing=True``, :meth:`elapsed_time` gives the milliseconds of
    host wall time between two recorded events (fpemu computes on the host,
    synchronously, so that is the time the work between them took here, not
    a GPU's)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = bool(enable_timing)
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def synchronize(self):
        return None

    def wait(self, stream=None):
        return None

    def query(self):
        return True

    def elapsed_time(self, end_event):
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._t - self._t) * 1000.0


class amp:
    """``torch.cuda.amp`` (deprecated in torch, still in tutorials)."""

    @staticmethod
    def autocast(enabled=True, dtype=None, cache_enabled=True):
        return _autocast("cuda", dtype=dtype or _float16, enabled=enabled,
                         cache_enabled=cache_enabled)

    @staticmethod
    def GradScaler(init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,  # noqa: N802
                   growth_interval=2000, enabled=True):
        return _amp.GradScaler("cuda", init_scale, growth_factor, backoff_factor,
                               growth_interval, enabled)


from ._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr("fpemu.autograd.cuda (torch.cuda)")
