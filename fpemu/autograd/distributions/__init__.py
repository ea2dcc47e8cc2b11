"""``torch.distributions``: the distributions reinforcement-learning and
variational examples use, written with fpemu's ops in torch's formulas
(``torch/distributions/*.py``, torch 2.13), so ``log_prob`` and ``entropy``
take torch's steps in the emulated dtype and are differentiable.

``Categorical``, ``Normal``, ``Bernoulli`` and ``Uniform``, each with
``sample`` (and ``rsample`` where torch has it), ``log_prob``, ``entropy``,
``mean``, ``mode``, ``variance``, ``stddev``, ``batch_shape`` and
``event_shape``, and torch's argument validation. The samples are drawn by
fpemu's generator after the same seed: torch's sampling law, not its numbers
(docs/autograd.md, random numbers).
"""

from __future__ import annotations

import math

import numpy as np

from .. import _core
from .._core import Tensor, float32, no_grad
from .._finfo import finfo
from ..nn.functional import binary_cross_entropy_with_logits, softmax
from ..ops.creation import bernoulli, full, multinomial, normal, rand, randn
from ..ops.shape import broadcast_tensors


def _as_tensor(v):
    return v if isinstance(v, Tensor) else _core.tensor(np.float32(v), dtype=float32)


def _broadcast_all(*values):
    """torch's ``broadcast_all``: numbers become tensors of the tensors'
    dtype (float32 if none), all expanded to one shape."""
    dtype = next((v.dtype for v in values if isinstance(v, Tensor)), float32)
    ts = [v if isinstance(v, Tensor) else _core.tensor(v, dtype=dtype) for v in values]
    return broadcast_tensors(*ts)


def _size(sample_shape):
    return tuple(int(s) for s in sample_shape)


class Distribution:
    """The base class: shapes, validation and ``sample`` through ``rsample``."""

    has_rsample = False
    arg_constraints: dict = {}

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape = _core.Size(batch_shape)
        self._event_shape = _core.Size(event_shape)
        self._validate_args = True if validate_args is None else bool(validate_args)
        if self._validate_args:
            for name, check in self.arg_constraints.items():
                value = self.__dict__.get(name)
                if value is None:
                    continue
                ok, what = check(value)
                if not ok:
                    raise ValueError(
                        f"Expected parameter {name} ({type(value).__name__} of shape "
                        f"{tuple(value.shape)}) of distribution {self!r} to satisfy the "
                        f"constraint {what}, but found invalid values:\n{value}")

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def _extended_shape(self, sample_shape=()):
        return _core.Size(_size(sample_shape) + tuple(self._batch_shape)
                          + tuple(self._event_shape))

    def sample(self, sample_shape=()):
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no rsample (it is not "
                                  "reparameterizable); use sample()")

    @property
    def stddev(self):
        return self.variance.sqrt()

    def _check_value(self, value, support, ok):
        if self._validate_args and not bool(ok.all()):
            raise ValueError(f"Expected value argument ({type(value).__name__} of shape "
                             f"{tuple(value.shape)}) to be within the support ({support}) of "
                             f"the distribution {self!r}, but found invalid values:\n{value}")

    def __repr__(self):
        params = ", ".join(f"{k}: {self._param_repr(k)}" for k in self.arg_constraints
                           if self.__dict__.get(k) is not None)
        return f"{type(self).__name__}({params})"

    def _param_repr(self, k):
        v = self.__dict__[k]
        return v if v.numel() == 1 else _core.Size(v.shape)


def _positive(v):
    return bool((v > 0).all()), "GreaterThan(lower_bound=0.0)"


def _real(v):
    return bool((v == v).all()), "Real()"


def _unit_interval(v):
    return bool(((v >= 0) & (v <= 1)).all()), "Interval(lower_bound=0.0, upper_bound=1.0)"


def _simplex(v):
    ok = bool((v >= 0).all()) and v.ndim >= 1
    return ok, "IndependentConstraint(Real(), 1)"


class Normal(Distribution):
    """``Normal(loc, scale)``: ``log_prob(x) = -(x - loc)**2 / (2 scale**2) -
    log(scale) - log(sqrt(2 pi))``, ``entropy = 0.5 + 0.5 log(2 pi) +
    log(scale)``; ``rsample`` is ``loc + eps * scale``."""

    has_rsample = True
    arg_constraints = {"loc": _real, "scale": _positive}

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast_all(loc, scale)
        super().__init__(self.loc.shape, (), validate_args)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.stddev.pow(2)

    def sample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        with no_grad():
            return normal(self.loc.expand(shape), self.scale.expand(shape))

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        eps = randn(shape, dtype=self.loc.dtype)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        value = _as_tensor(value)
        self._check_value(value, "Real()", value == value)
        var = self.scale ** 2
        log_scale = self.scale.log()
        return -((value - self.loc) ** 2) / (2 * var) - log_scale - \
            math.log(math.sqrt(2 * math.pi))

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()


class Uniform(Distribution):
    """``Uniform(low, high)``: ``log_prob = log(low <= x < high) - log(high -
    low)``, ``entropy = log(high - low)``; ``rsample`` is ``low + u (high -
    low)``."""

    has_rsample = True
    arg_constraints = {"low": _real, "high": _real}

    def __init__(self, low, high, validate_args=None):
        self.low, self.high = _broadcast_all(low, high)
        super().__init__(self.low.shape, (), validate_args)
        if self._validate_args and not bool((self.low < self.high).all()):
            raise ValueError(f"Expected parameter low ({type(self.low).__name__} of shape "
                             f"{tuple(self.low.shape)}) of distribution {self!r} to satisfy "
                             f"the constraint LessThan(upper_bound=high), but found invalid "
                             f"values:\n{self.low}")

    @property
    def mean(self):
        return (self.high + self.low) / 2

    @property
    def mode(self):
        return self.high * float("nan")

    @property
    def stddev(self):
        return (self.high - self.low) / 12 ** 0.5

    @property
    def variance(self):
        return (self.high - self.low).pow(2) / 12

    def rsample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        u = rand(shape, dtype=self.low.dtype)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        value = _as_tensor(value)
        self._check_value(value, f"Interval(lower_bound={self.low}, upper_bound={self.high})",
                          (self.low <= value) & (value < self.high))
        lb = self.low.le(value).type_as(self.low)
        ub = self.high.gt(value).type_as(self.low)
        return (lb * ub).log() - (self.high - self.low).log()

    def entropy(self):
        return (self.high - self.low).log()


def _clamp_probs(probs):
    eps = finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def _one_of(probs, logits, name):
    if (probs is None) == (logits is None):
        raise ValueError("Either `probs` or `logits` must be specified, but not both.")


class _ProbsOrLogits(Distribution):
    """A distribution given by ``probs`` or ``logits``: the other made on
    first use from :meth:`_logits_of` or :meth:`_probs_of` (torch's
    ``lazy_property``)."""

    def __getattr__(self, name):
        if name == "logits":
            self.logits = self._logits_of(self.probs)
            return self.logits
        if name == "probs":
            self.probs = self._probs_of(self.logits)
            return self.probs
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")


class Categorical(_ProbsOrLogits):
    """``Categorical(probs=None, logits=None)`` over the last dim: ``probs``
    normalized to sum 1, ``logits`` to ``logits - logsumexp``; ``log_prob``
    gathers the log-probabilities, ``entropy = -sum(logits p)``; ``sample``
    draws with ``multinomial``."""

    arg_constraints = {"probs": _simplex, "logits": _real}

    def __init__(self, probs=None, logits=None, validate_args=None):
        _one_of(probs, logits, "Categorical")
        if probs is not None:
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = probs / probs.sum(-1, keepdim=True)
            self._logits = None
            param = self.probs
        else:
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)
            self._probs = None
            param = self.logits
        self._num_events = param.shape[-1]
        super().__init__(param.shape[:-1], (), validate_args)

    def _logits_of(self, probs):
        return _clamp_probs(probs).log()

    def _probs_of(self, logits):
        return softmax(logits, dim=-1)

    @property
    def param_shape(self):
        return self.probs.shape

    @property
    def mean(self):
        return full(tuple(self._extended_shape()), float("nan"), dtype=self.probs.dtype)

    @property
    def mode(self):
        return self.probs.argmax(dim=-1)

    @property
    def variance(self):
        return self.mean

    def sample(self, sample_shape=()):
        n = int(np.prod(_size(sample_shape), dtype=np.int64))
        with no_grad():
            probs_2d = self.probs.reshape(-1, self._num_events)
            samples_2d = multinomial(probs_2d, n, True).t()
        return samples_2d.reshape(tuple(self._extended_shape(sample_shape)))

    def log_prob(self, value):
        value = value if isinstance(value, Tensor) else _core.tensor(value)
        ok = (value >= 0) & (value < self._num_events) & (value == value.long())
        self._check_value(value, f"IntegerInterval(lower_bound=0, upper_bound="
                                 f"{self._num_events - 1})", ok)
        value = value.long().unsqueeze(-1)
        value, log_pmf = broadcast_tensors(value, self.logits)
        value = value[..., :1]
        return log_pmf.gather(-1, value).squeeze(-1)

    def entropy(self):
        min_real = finfo(self.logits.dtype).min
        logits = self.logits.clamp(min=min_real)
        p_log_p = logits * self.probs
        return -p_log_p.sum(-1)

    def _param_repr(self, k):
        return _core.Size(self.__dict__[k].shape)


class Bernoulli(_ProbsOrLogits):
    """``Bernoulli(probs=None, logits=None)``: ``log_prob`` is minus
    ``binary_cross_entropy_with_logits(logits, x)``, ``entropy`` that of the
    probabilities; ``sample`` draws with ``bernoulli``."""

    arg_constraints = {"probs": _unit_interval, "logits": _real}

    def __init__(self, probs=None, logits=None, validate_args=None):
        _one_of(probs, logits, "Bernoulli")
        if probs is not None:
            (self.probs,) = _broadcast_all(probs)
            param = self.probs
        else:
            (self.logits,) = _broadcast_all(logits)
            param = self.logits
        super().__init__(param.shape, (), validate_args)

    def _logits_of(self, probs):
        p = _clamp_probs(probs)
        return p.log() - (-p).log1p()

    def _probs_of(self, logits):
        return logits.sigmoid()

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        mode[self.probs == 0.5] = float("nan")
        return mode

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def sample(self, sample_shape=()):
        shape = tuple(self._extended_shape(sample_shape))
        with no_grad():
            return bernoulli(self.probs.expand(shape))

    def log_prob(self, value):
        value = _as_tensor(value)
        self._check_value(value, "Boolean()", (value == 0) | (value == 1))
        logits, value = _broadcast_all(self.logits, value)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")


__all__ = ["Bernoulli", "Categorical", "Distribution", "Normal", "Uniform"]
