"""Dynamic loss scalers as the training frameworks implement them.

fpemu has torch's ``GradScaler`` (:class:`fpemu.autograd.amp.GradScaler`,
bit for bit torch's) and DeepSpeed's (:class:`fpemu.collectives.DeepSpeedLossScaler`).
This module adds the two the mixed-precision literature keeps naming:

* :class:`MegatronGradScaler`: Megatron-core's ``DynamicGradScaler``
  (``megatron/core/optimizer/grad_scaler.py``, megatron-core 0.16.1), with
  Megatron's defaults (``OptimizerConfig``: initial scale 2**32, minimum 1,
  window 1000, hysteresis 2; growth 2 and backoff 0.5 as
  ``megatron/core/optimizer/__init__.py`` builds it). Its scale is a float32
  number, and every update is a float32 product.
* :class:`ApexLossScaler`: APEX amp's ``LossScaler``
  (``apex/amp/scaler.py``), with its defaults (2**16, window 2000, maximum
  2**24, no minimum). Its scale is a Python float.

They differ where a run goes NaN. torch's ``GradScaler`` and APEX halve the
scale at every overflow; Megatron and DeepSpeed let ``hysteresis - 1``
overflows in a row pass at the same scale (each still skips its step) and
halve it at the next one. APEX never grows the scale above its maximum and,
unless given ``min_loss_scale``, lets it fall without bound; Megatron never
lets it fall below its minimum (an overflow there skips the step and leaves
the scale); DeepSpeed stops the run.

Each scaler is driven the same way (``found_inf``: did any gradient of the
step hold an inf or a NaN, once unscaled or before; the frameworks check the
scaled gradients)::

    loss_to_backward = loss * scaler.scale
    ...                                         # backward, check the gradients
    skip = scaler.update(found_inf)             # True: do not step the optimizer

``tests/test_loss_scaling.py`` checks Megatron's against the real class
(megatron-core installs from the package index; its scaler runs on the CPU
with its tensors moved there) and APEX's against a transcription of its
source, step by step.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import FpemuTypeError, FpemuValueError

__all__ = ["MegatronGradScaler", "ApexLossScaler"]

_f32 = np.float32


def _number(name, value, cls):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise FpemuTypeError(f"{cls}(): {name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise FpemuValueError(f"{cls}(): {name} must be finite, got {value!r}")
    return value


def _count(name, value, cls, lo=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise FpemuValueError(f"{cls}(): {name} must be an int >= {lo}, got {value!r}")
    return int(value)


class MegatronGradScaler:
    """Megatron-core's ``DynamicGradScaler``.

    An overflow resets the clean-step count and uses up one unit of
    hysteresis; with none left the scale becomes ``max(scale * backoff,
    min_scale)`` in float32, and so at every further overflow until a growth
    refills the hysteresis. ``growth_interval`` clean steps in a row multiply
    the scale by ``growth_factor`` (float32, no maximum) and refill the
    hysteresis. Every overflow skips its step (Megatron's optimizer skips
    whatever the scaler does).

    Parameters are Megatron's, with ``OptimizerConfig``'s defaults.
    """

    def __init__(self, initial_scale=2.0 ** 32, min_scale=1.0, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=1000, hysteresis=2):
        cls = type(self).__name__
        initial_scale = _number("initial_scale", initial_scale, cls)
        min_scale = _number("min_scale", min_scale, cls)
        growth_factor = _number("growth_factor", growth_factor, cls)
        backoff_factor = _number("backoff_factor", backoff_factor, cls)
        if not initial_scale > 0:
            raise FpemuValueError(f"{cls}(): initial_scale must be > 0, got {initial_scale!r}")
        if not 0 < min_scale <= initial_scale:
            raise FpemuValueError(f"{cls}(): min_scale must be > 0 and <= initial_scale "
                                  f"({initial_scale:g}), got {min_scale!r}")
        if not growth_factor > 1:
            raise FpemuValueError(f"{cls}(): growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise FpemuValueError(f"{cls}(): backoff_factor must be in (0, 1), got "
                                  f"{backoff_factor!r}")
        # Megatron keeps each of these in a one-element float32 tensor
        self._scale = _f32(initial_scale)
        self.min_scale = _f32(min_scale)
        self.growth_factor = _f32(growth_factor)
        self.backoff_factor = _f32(backoff_factor)
        self.growth_interval = _count("growth_interval", growth_interval, cls)
        self.hysteresis = _count("hysteresis", hysteresis, cls)
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    @property
    def scale(self) -> float:
        """The loss scale (a float32 value)."""
        return float(self._scale)

    @property
    def inv_scale(self) -> float:
        """1 / scale as Megatron computes it: in float64, rounded to float32."""
        return float(_f32(1.0 / float(self._scale)))

    def update(self, found_inf) -> bool:
        """After a step's backward; returns whether the step is skipped."""
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = max(_f32(self._scale * self.backoff_factor), self.min_scale)
            return True
        self._growth_tracker += 1
        if self._growth_tracker == self.growth_interval:
            self._growth_tracker = 0
            self._hysteresis_tracker = self.hysteresis
            self._scale = _f32(self._scale * self.growth_factor)
        return False

    def state_dict(self) -> dict:
        return {"scale": float(self._scale), "growth_tracker": self._growth_tracker,
                "hysteresis_tracker": self._hysteresis_tracker}

    def load_state_dict(self, state):
        self._scale = _f32(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])
        self._hysteresis_tracker = int(state["hysteresis_tracker"])


class ApexLossScaler:
    """APEX amp's ``LossScaler`` (``opt_level`` O1 / O2's ``loss_scale="dynamic"``).

    Dynamic: an overflow skips the step, halves the scale (not below
    ``min_loss_scale`` when one is given; APEX treats 0 as none) and resets
    the clean-step count; ``scale_window`` clean steps in a row double it,
    up to ``max_loss_scale``. The halving and the doubling are by 2 whatever
    ``scale_factor`` says: APEX accepts the argument and does not use it.

    Static (``loss_scale`` a number): the scale never changes and no step is
    skipped, even one whose gradients overflowed (APEX checks for overflow
    only when dynamic).

    The dynamic scale starts at ``min(max_loss_scale, init_scale)``, as APEX's
    does. Settings APEX would accept but that cannot be meant are refused: a
    ``max_loss_scale`` or scale <= 0, a negative ``min_loss_scale``, a
    ``min_loss_scale`` above the starting scale.

    Examples
    --------
    >>> ApexLossScaler(init_scale=2.0 ** 30).scale
    16777216.0
    """

    def __init__(self, loss_scale="dynamic", init_scale=2.0 ** 16, scale_factor=2.0,
                 scale_window=2000, min_loss_scale=None, max_loss_scale=2.0 ** 24):
        cls = type(self).__name__
        self.max_loss_scale = _number("max_loss_scale", max_loss_scale, cls)
        if not self.max_loss_scale > 0:
            raise FpemuValueError(f"{cls}(): max_loss_scale must be > 0, got "
                                  f"{self.max_loss_scale!r}; APEX's default is 2**24")
        if loss_scale == "dynamic":
            self.dynamic = True
            init = _number("init_scale", init_scale, cls)
            if not init > 0:
                raise FpemuValueError(f"{cls}(): the scale must be > 0, got init_scale={init!r}")
            # apex/amp/scaler.py: the dynamic scale starts at min(max_loss_scale, init_scale)
            self._scale = min(self.max_loss_scale, init)
        else:
            self.dynamic = False
            self._scale = _number("loss_scale", loss_scale, cls)
            if not self._scale > 0:
                raise FpemuValueError(f"{cls}(): the scale must be > 0, got {self._scale!r}")
        self.scale_factor = _number("scale_factor", scale_factor, cls)    # unused, as in APEX
        self.scale_window = _count("scale_window", scale_window, cls)
        self.min_loss_scale = (None if min_loss_scale is None
                               else _number("min_loss_scale", min_loss_scale, cls))
        if self.min_loss_scale is not None:
            # 0 is APEX's "no floor" (its update tests the floor for truth)
            if self.min_loss_scale < 0:
                raise FpemuValueError(f"{cls}(): min_loss_scale must be >= 0 (0 or None: no "
                                      f"floor), got {self.min_loss_scale!r}")
            if self.dynamic and self.min_loss_scale > self._scale:
                raise FpemuValueError(
                    f"{cls}(): min_loss_scale={self.min_loss_scale!r} is above the starting "
                    f"scale {self._scale!r} (min(max_loss_scale, init_scale)); pass a "
                    f"min_loss_scale <= {self._scale!r} or a larger init_scale")
        self._unskipped = 0

    @property
    def scale(self) -> float:
        return self._scale

    def update(self, found_inf) -> bool:
        """After a step's backward; returns whether the step is skipped."""
        skip = bool(found_inf) and self.dynamic
        if skip:
            halved = self._scale / 2.0
            self._scale = max(self.min_loss_scale, halved) if self.min_loss_scale else halved
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self.dynamic and self._unskipped == self.scale_window:
            self._scale = min(self.max_loss_scale, self._scale * 2.0)
            self._unskipped = 0
        return skip

    def state_dict(self) -> dict:
        return {"loss_scale": self._scale, "unskipped": self._unskipped}

    def load_state_dict(self, state):
        self._scale = float(state["loss_scale"])
        self._unskipped = int(state["unskipped"])
