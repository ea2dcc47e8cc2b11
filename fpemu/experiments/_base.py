"""What every experiment shares: the result object, the training helpers."""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import numpy as np

from ..errors import FpemuValueError
from ..numtext import summary as _show
from ..plotting import lecture_style


class Summary(dict):
    """The key numbers of a result: a dict, printed as aligned text."""

    def __init__(self, numbers, title=""):
        super().__init__(numbers)
        self.title = title

    def __str__(self):
        width = max((len(k) for k in self), default=0)
        lines = [self.title] if self.title else []
        lines += [f"  {k:<{width}}  {_show(v)}" for k, v in self.items()]
        return "\n".join(lines)


def _jsonable(v):
    """numbers, lists and dicts that json.dumps accepts (inf / NaN as strings)."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_jsonable(x) for x in np.asarray(v, dtype=object).tolist()] \
            if isinstance(v, np.ndarray) else [_jsonable(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer, int)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return v if math.isfinite(v) else str(v)
    return v


@dataclasses.dataclass
class Result:
    """One experiment's outcome.

    ``summary()`` gives the key numbers (a dict whose ``str`` is text),
    ``plot()`` the figures as ``{name: matplotlib Figure}``, ``conclusion``
    two sentences computed from the numbers, and ``to_json()`` all of it
    but the figures.
    """

    name: str
    title: str
    question: str
    setup: str
    config: object
    numbers: dict
    conclusion: str
    data: dict
    seconds: float = 0.0
    _plotter: object = dataclasses.field(default=None, repr=False)

    def summary(self) -> Summary:
        return Summary(self.numbers, f"{self.title} ({self.name})")

    def plot(self) -> dict:
        """The figures, ``{name: Figure}``, drawn in the lecture style."""
        with lecture_style():
            return self._plotter(self)

    def to_json(self) -> dict:
        return _jsonable({
            "name": self.name, "title": self.title, "question": self.question,
            "setup": self.setup, "config": dataclasses.asdict(self.config),
            "numbers": self.numbers, "conclusion": self.conclusion,
            "seconds": round(self.seconds, 2)})

    def __str__(self):
        return f"{self.summary()}\n\n{self.conclusion}"


def make_config(cls, config=None, **overrides):
    """A config of type cls: the defaults, or ``config``, with ``overrides`` applied.

    Unknown names raise a TypeError that lists the parameters.
    """
    if config is None:
        config = cls()
    elif not isinstance(config, cls):
        raise TypeError(f"expected a {cls.__qualname__}, got {type(config).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"{cls.__module__.rsplit('.', 1)[-1]} has no parameter "
                        f"{', '.join(unknown)}; its parameters are {', '.join(sorted(names))}")
    for name, value in overrides.items():
        _check_value(cls, name, value, getattr(config, name))
    return dataclasses.replace(config, **overrides)


#: int parameters that may be 0 (the others count steps, sizes, layers: at least 1)
_ZERO_OK = ("seed", "spike_step")


def _check_value(cls, name, value, default):
    """A ValueError naming the parameter, what it needs and what it got."""
    where = f"{cls.__module__.rsplit('.', 1)[-1]}: {name}"
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        need = "True or False"
    elif isinstance(default, int):
        lo = 0 if name in _ZERO_OK else 1
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo
        need = f"an int >= {lo}"
    elif isinstance(default, float):
        ok = (isinstance(value, (int, float, np.integer, np.floating))
              and not isinstance(value, bool) and math.isfinite(value) and value > 0)
        need = "a finite number > 0"
    elif isinstance(default, tuple):
        ok = isinstance(value, (tuple, list)) and len(value) > 0
        need = f"a non-empty tuple like {default!r}"
    else:
        return
    if not ok:
        raise FpemuValueError(f"{where} must be {need}, got {value!r} (default {default!r})")


def finish(module_name, config, numbers, conclusion, data, plotter, t0):
    """The Result of the experiment module ``module_name`` (its NAME, TITLE, QUESTION and
    setup text), timed from ``t0``."""
    m = sys.modules[module_name]
    return Result(m.NAME, m.TITLE, m.QUESTION, m.setup(config), config, numbers, conclusion,
                  data, time.perf_counter() - t0, plotter)


def final_loss(losses, steps):
    """The mean loss of the last tenth of ``steps`` (at least one step)."""
    k = max(1, steps // 10)
    return float(np.mean(losses[-k:]))


def num(x):
    """A number for prose: powers of two as 2^k, others with 6 significant digits."""
    m, e = np.frexp(x)
    if x > 0 and m == 0.5 and abs(e - 1) > 4:
        return f"2^{int(e) - 1}"
    return f"{x:g}"


def rel(x):
    """A signed relative difference for prose: +44.8%, or ±0.0% when it rounds to zero."""
    return "±0.0%" if round(abs(100 * x), 1) == 0 else f"{x:+.1%}"


def pct(x):
    """A share as a short percentage for prose."""
    if x == 0:
        return "0%"
    if x < 0.001:
        return "<0.1%"
    return f"{100 * x:.1f}%"


# -- small models and data shared by the experiments --------------------------------------

def regression_data(n, d_in, d_out, seed):
    """Inputs uniform in [-1, 1) (exact float32), targets a smooth function of them.

    Made with NumPy's generator and single float64 operations rounded to
    float32, so the data are the same on every machine.
    """
    rng = np.random.default_rng(seed)
    X = (rng.integers(-2**20, 2**20, size=(n, d_in)) * 2.0**-20).astype(np.float32)
    w = rng.integers(-2**10, 2**10, size=(d_in, d_out)) * 2.0**-12
    z = X.astype(np.float64) @ w          # exact: 21 + 11 bits, 16 terms
    y = (z / (1 + np.abs(z))).astype(np.float32)   # no transcendentals: same everywhere
    return X, y


def mlp(torch, d_in, width, depth, d_out, gain=1.0, act="tanh", seed=0):
    """A plain MLP (Linear + activation) x depth, then a Linear head; weights scaled by gain."""
    nn = torch.nn
    torch.manual_seed(seed)
    layers, d = [], d_in
    for _ in range(depth):
        lin = nn.Linear(d, width)
        with torch.no_grad():
            lin.weight.mul_(gain)
        layers += [lin, nn.Tanh() if act == "tanh" else nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)
