"""The random Hadamard transform TransformerEngine applies to the wgrad
operands of NVFP4 GEMMs (the text of :mod:`fpemu.block`)."""

from __future__ import annotations

import numpy as np

from .._jit import run_kernel
from ..accumulate import matmul
from ..checks import real_array
from ..errors import FpemuValueError
from . import _kernels

__all__ = ["TE_SIGNS", "hadamard_matrix", "hadamard"]

#: TransformerEngine's fixed sign vector for the 16-point RHT
#: (``get_wgrad_sign_vector`` in its NVFP4 reference quantizer).
TE_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)


def hadamard_matrix(size=16, signs="te"):
    """``diag(s) H / sqrt(size)`` (float64, exact): ``H`` the
    Sylvester Hadamard matrix; ``signs``: ``"te"`` (TransformerEngine's fixed
    vector, size 16), ``None`` (no signs), an int seed (random signs from
    ``numpy.random.default_rng(seed)``) or an array of ±1."""
    if not (isinstance(size, int) and size >= 1 and size & (size - 1) == 0
            and (size.bit_length() - 1) % 2 == 0):
        raise FpemuValueError(f"hadamard_matrix(): size must be a power of four (4, 16, 64, "
                              f"...: 1/sqrt(size) is then a power of two), got {size!r}")
    H = np.ones((1, 1))
    while H.shape[0] < size:
        H = np.block([[H, H], [H, -H]])
    if isinstance(signs, str) and signs == "te":
        if size != 16:
            raise FpemuValueError("hadamard_matrix(): TransformerEngine's sign vector has 16 "
                                  f"entries; size is {size}: pass signs=None or a seed")
        s = TE_SIGNS
    elif signs is None:
        s = np.ones(size)
    elif isinstance(signs, (int, np.integer)) and not isinstance(signs, bool):
        s = np.random.default_rng(int(signs)).choice([-1.0, 1.0], size)
    else:
        s = np.asarray(signs, np.float64)
        if s.shape != (size,) or not np.all(np.abs(s) == 1):
            raise FpemuValueError(f"hadamard_matrix(): signs must be {size} values of ±1, got "
                                  f"{signs!r}")
    return s[:, None] * H / np.sqrt(size)


def hadamard(x, size=16, axis=-1, signs="te"):
    """The random Hadamard transform of each run of ``size`` values along
    ``axis``: ``x_run @ hadamard_matrix(size, signs)``, the exact result
    rounded once to float32 (TransformerEngine applies it to the wgrad
    operands of NVFP4 GEMMs, along the reduced dimension). A run whose
    magnitudes span few enough binades is summed in float64, exactly
    (:func:`fpemu.block._kernels.hadamard_runs`); the others, and those
    holding inf or NaN, by :func:`fpemu.accumulate.matmul`'s exact model.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> y = block.hadamard(np.arange(16, dtype=np.float32), signs=None)
    >>> float(y[0]), float(np.sum(y.astype(np.float64)**2))   # 120/4; the norm is kept
    (30.0, 1240.0)
    """
    H = hadamard_matrix(size, signs)
    flat, shape = real_array(x, "hadamard")
    X = np.moveaxis(flat.reshape(shape).astype(np.float64), axis, -1)
    if X.shape[-1] % size:
        raise FpemuValueError(f"hadamard(): the axis has length {X.shape[-1]}, not a multiple "
                              f"of size={size}; pad it first")
    if not np.all((X.astype(np.float32) == X) | np.isnan(X)):
        raise FpemuValueError("hadamard(): x must hold float32 values; round first with "
                              "fpemu.quantize(x, 'fp32')")
    runs = X.reshape(-1, size)
    # the runs whose sum float64 holds exactly in one pass; the others (a wide
    # spread of magnitudes, inf or NaN) by the exact accumulation model
    Y = np.empty(runs.shape, np.float32)
    hard = np.empty(runs.shape[0], np.bool_)
    if runs.size:
        run_kernel(_kernels.hadamard_runs, runs.astype(np.float32), H, Y, hard,
                   29 - (size.bit_length() - 1), inputs=2)
        if hard.any():
            Y[hard] = matmul(runs[hard], H, "fp32", "fp32", model="exact")
    return np.moveaxis(Y.reshape(X.shape), -1, axis)
