"""The common ground of the two backends a scenario runs on.

A scenario receives an :class:`Env` and writes its code once against
``env.T``, a module with PyTorch's API: ``torch`` itself or
``fpemu.autograd``. The few places where the two must be addressed
differently (where tensors live, how a tensor becomes a NumPy array, what a
dtype is called) go through the env's methods.
"""

from __future__ import annotations

import contextlib

import numpy as np

# dtype names as torch spells them (without "torch."), in a fixed order: the
# index of a name is how an autocast scenario records an output dtype
DTYPE_NAMES = ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2",
               "float8_e4m3fnuz", "float8_e5m2fnuz", "int64", "int32", "bool")
LOW_PRECISION = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                 "float8_e5m2fnuz")


class Env:
    """``Env(T, device, backend)``: ``T`` is the module, ``device`` "cpu" or
    "cuda" (where torch tensors live; the device whose numbers fpemu
    reproduces), ``backend`` "torch" or "fpemu"."""

    def __init__(self, T, device, backend):
        if backend not in ("torch", "fpemu"):
            raise ValueError(f"backend must be 'torch' or 'fpemu', got {backend!r}")
        self.T = T
        self.device = device
        self.backend = backend
        # an fpemu.reference.opstream.OpCapture while `fpemu record --ops` runs
        self.capture = None

    def step(self, i):
        """``with env.step(i):`` around a training step: the op-stream
        recorder (fpemu/reference/opstream.py) records the chosen steps."""
        if self.capture is None:
            return contextlib.nullcontext()
        return self.capture.step(i)

    # -- dtypes
    def dtype(self, name):
        """The backend's dtype called ``name`` (torch's spelling)."""
        dt = getattr(self.T, "bool" if name == "bool" else name, None)
        if dt is None:
            raise ValueError(f"the {self.backend} backend has no dtype {name!r}")
        return dt

    def has_dtype(self, name):
        return getattr(self.T, name, None) is not None

    def dtype_name(self, dt):
        """torch's name of a backend dtype: 'bfloat16', 'float32', ..."""
        if self.backend == "torch":
            return str(dt).replace("torch.", "")
        return getattr(dt, "long_name", None) or {"fp32": "float32"}.get(dt.name, dt.name)

    # -- tensors
    def tensor(self, array, dtype=None, requires_grad=False):
        """A tensor on the env's device holding ``array`` (converted to
        ``dtype``, a name or a backend dtype, through torch's cast rules)."""
        a = np.asarray(array)
        dt = self.dtype(dtype) if isinstance(dtype, str) else dtype
        if self.backend == "torch":
            t = self.T.tensor(a, device=self.device)
            if dt is not None:
                t = t.to(dt)
        else:
            t = self.T.tensor(a)
            if dt is not None:
                t = t.to(dt)
        if requires_grad:
            t.requires_grad_(True)
        return t

    def array(self, t):
        """A tensor's values as NumPy: floating dtypes widened exactly to
        float32 (float64 stays), integers as int64."""
        if self.capture is not None:
            with self.capture.paused():
                return self._array(t)
        return self._array(t)

    def _array(self, t):
        t = t.detach()
        name = self.dtype_name(t.dtype)
        if name in LOW_PRECISION:
            t = t.float()
        if self.backend == "torch":
            t = t.cpu()
        a = np.array(t.numpy(), copy=True)      # torch shares memory with in-place updates
        if name in ("int64", "int32", "bool"):
            return a.astype(np.int64)
        return a

    def sync(self):
        if self.backend == "torch" and self.device == "cuda":
            self.T.cuda.synchronize()
