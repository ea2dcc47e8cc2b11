"""The scenario registry: :class:`Scenario` (a run, its inputs and its
tiers), :data:`SCENARIOS` (every scenario by name, in the order the modules
``fpemu.reference.scenarios`` imports register them) and :class:`Trace`, the
named arrays a run returns."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ._env import Env
from .compare import EXACT


class Trace:
    """Named arrays, appended to step by step or set once, with their dtypes."""

    def __init__(self, env: Env):
        self.env = env
        self._rows: dict[str, list] = {}
        self._once: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, str] = {}

    def _conv(self, value, dtype):
        if hasattr(value, "detach"):
            return self.env.array(value), self.env.dtype_name(value.dtype)
        a = np.asarray(value)
        if dtype is None:
            dtype = {"f": "float64" if a.dtype == np.float64 else "float32", "b": "int64",
                     "i": "int64", "u": "int64"}[a.dtype.kind]
        return a.astype({"float64": np.float64, "float32": np.float32}.get(dtype, np.int64)), dtype

    def add(self, name, value, dtype=None):
        """Append one step's value of ``name``."""
        a, dt = self._conv(value, dtype)
        self._rows.setdefault(name, []).append(a)
        self.dtypes[name] = dt

    def set(self, name, value, dtype=None):
        a, dt = self._conv(value, dtype)
        self._once[name] = a
        self.dtypes[name] = dt

    def arrays(self):
        out = {k: np.stack(v) for k, v in self._rows.items()}
        out.update(self._once)
        return out


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    group: str
    run: Callable
    config: dict
    make_inputs: Callable
    tiers: Callable = None
    description: str = ""
    #: recorded arrays (``in.x``, ``out.p``; ``out.*`` for all outputs) whose bits
    #: may differ between recording machines, each with the reason
    host_dependent: dict = dataclasses.field(default_factory=dict)

    def depends_on_host(self, key):
        """The reason why recorded array ``key`` may differ between CPUs, or None."""
        kind = key.split(".", 1)[0]
        return self.host_dependent.get(key, self.host_dependent.get(f"{kind}.*"))

    def tier_of(self, array, profile):
        table = self.tiers(self.config, profile) if self.tiers else {}
        if array in table:
            return table[array]
        return table.get("*", EXACT)


SCENARIOS: dict[str, Scenario] = {}


def _register(name, group, run, config, make_inputs, tiers=None, description="",
              host_dependent=None):
    if name in SCENARIOS:
        raise ValueError(f"scenario {name!r} registered twice")
    SCENARIOS[name] = Scenario(name, group, run, dict(config), make_inputs, tiers, description,
                               dict(host_dependent or {}))
