"""``torch.nn.init``: the initialisers, drawing from the default generator as
torch's do (``uniform_`` and ``normal_`` in place, under no_grad), with
torch's formulas for gains and fans, so that a seeded model starts from
torch's CPU weights (uniform draws bit for bit; normals to the last bits,
``_rng``)."""

from __future__ import annotations

import math

import numpy as np

from ...errors import FpemuValueError
from .._core import no_grad
from .._special import erf
from ..ops.creation import empty
from ..ops.inplace import write


def calculate_gain(nonlinearity, param=None):
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            slope = param
        else:
            raise FpemuValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise FpemuValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.dim() < 2:
        raise FpemuValueError("Fan in and fan out can not be computed for tensor with fewer "
                              "than 2 dimensions")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise FpemuValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def constant_(tensor, val):
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor):
    with no_grad():
        return tensor.zero_()


def ones_(tensor):
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tensor.shape:
        return tensor
    fan = _fan(tensor, mode)
    gain = calculate_gain(nonlinearity, a)
    std = gain / math.sqrt(fan)
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    if 0 in tensor.shape:
        return tensor
    fan = _fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def _erfinv(y):
    """Inverse error function in float64: a starting guess refined by Newton
    steps on erf (to the last bits of float64)."""
    y = np.asarray(y, np.float64)
    w = -np.log((1.0 - y) * (1.0 + y))
    x = np.sign(y) * np.sqrt(np.sqrt((4.3307 + w / 2) ** 2 - w / 0.147) - (4.3307 + w / 2))
    for _ in range(4):
        err = erf(x) - y
        x = x - err / (2.0 / math.sqrt(math.pi) * np.exp(-x * x))
    return x


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """Normal values truncated to [a, b], by torch's method: uniform draws
    between the two CDF values, then the inverse CDF (erfinv), scaled,
    shifted and clamped."""
    def norm_cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0
    lo, hi = norm_cdf((a - mean) / std), norm_cdf((b - mean) / std)
    with no_grad():
        tensor.uniform_(2 * lo - 1, 2 * hi - 1, generator=generator)
        vals = _erfinv(tensor._data.astype(np.float64)) * (std * math.sqrt(2.0)) + mean
        write(tensor, np.clip(vals, a, b))
    return tensor


def eye_(tensor):
    if tensor.dim() != 2:
        raise FpemuValueError("Only tensors with 2 dimensions are supported")
    with no_grad():
        return write(tensor, np.eye(*tensor.shape))


def orthogonal_(tensor, gain=1, generator=None):
    """torch's recipe: a (rows, numel / rows) matrix of standard normals from
    the generator, transposed if wide, its QR decomposition (numpy's LAPACK
    Householder QR, as torch's), Q's columns signed by R's diagonal, written
    into the tensor and scaled by ``gain``. Agrees with torch to the
    normals' last bits and LAPACK's rounding (tier 2)."""
    if tensor.ndim < 2:
        raise FpemuValueError(f"Only tensors with 2 or more dimensions are supported; got a "
                              f"{tensor.ndim}-D tensor of shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    with no_grad():
        flat = empty(rows, cols, dtype=tensor.dtype).normal_(0, 1, generator=generator)
        A = flat._data.astype(np.float64)
        if rows < cols:
            A = A.T
        q, r = np.linalg.qr(A)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        write(tensor, q.reshape(tensor.shape))
        return tensor.mul_(gain)
