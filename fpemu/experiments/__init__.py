"""Lesson experiments: one module per scenario, each runnable in seconds.

Each module has a ``Config`` dataclass whose defaults run in under 20 s on two
cores, a ``QUICK`` dict of smaller settings (the tests use them), a ``WARM``
dict (the defaults' sizes with the fewest steps: ``fpemu warmup`` runs it, so
that the demo's full run loads every kernel it calls), and
``run(config=None, **overrides)``, which returns a :class:`Result` with
``summary()`` (the key numbers as a dict, printed as text), ``plot()`` (the
figures) and ``conclusion`` (two sentences computed from the numbers).

>>> from fpemu import experiments
>>> sorted(experiments.EXPERIMENTS)[:3]
['accumulation', 'adam_epsilon', 'attention']
"""

from __future__ import annotations

import importlib

from ._base import Result, Summary

__all__ = ["Result", "Summary", "ORDER", "EXPERIMENTS", "module", "run"]

#: name -> module, in the order of the lessons
ORDER = ("underflow", "loss_scaling", "master_weights", "adam_epsilon", "range_precision",
         "attention", "fp8_training", "accumulation", "stochastic_rounding", "block_formats",
         "collectives", "emulated_training")
EXPERIMENTS = {name: f"fpemu.experiments.{name}" for name in ORDER}


def module(name):
    """The module of one experiment, by name."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; the experiments are {', '.join(ORDER)}")
    return importlib.import_module(EXPERIMENTS[name])


def run(name, config=None, quick=False, **overrides):
    """Run one experiment by name; ``quick`` uses its reduced sizes, then ``overrides``."""
    mod = module(name)
    if quick:
        overrides = {**mod.QUICK, **overrides}
    return mod.run(config, **overrides)
