"""``torch.finfo``: the limits of a floating-point dtype, read off its
fpemu Format (float64 off NumPy's)."""

from __future__ import annotations

import math

import numpy as np

from ._core import as_dtype, float32, is_float


class finfo:  # noqa: N801 - torch's name
    """``finfo(dtype=torch.float32)``: ``bits``, ``eps`` (the gap above 1),
    ``max``, ``min`` (= -max), ``tiny`` / ``smallest_normal``,
    ``resolution`` (10 ** -digits) and ``dtype`` (its name)."""

    def __init__(self, dtype=None):
        dt = float32 if dtype is None else as_dtype(dtype, "finfo()")
        if not is_float(dt):
            raise TypeError(f"torch.finfo() requires a floating point input type. Use "
                            f"torch.iinfo to handle '{dt}'")
        if dt.name == "float64":
            f = np.finfo(np.float64)
            self.bits, self.eps, self.max = 64, float(f.eps), float(f.max)
            self.tiny = float(f.tiny)
            digits = 15
        else:
            self.bits, self.eps, self.max = dt.bits, float(dt.eps), float(dt.max)
            self.tiny = float(dt.min_normal)
            digits = int(math.floor((dt.precision - 1) * math.log10(2)))
        self.min = -self.max
        self.smallest_normal = self.tiny
        self.resolution = 10.0 ** -digits
        self.dtype = str(dt).replace("torch.", "")

    def __repr__(self):
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.tiny:g}, tiny={self.tiny:g}, "
                f"dtype={self.dtype})")
