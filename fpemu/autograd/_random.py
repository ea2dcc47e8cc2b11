"""``torch.random``: seeding the default generator, whose integers, uniforms
and permutations are torch's CPU ones (:mod:`fpemu.autograd._rng`)."""

from __future__ import annotations

from ._state import State


def manual_seed(seed):
    """Seed the default generator, as ``torch.manual_seed``: the integers,
    uniforms and permutations that follow are torch's CPU ones (``_rng``)."""
    return State.generator.manual_seed(seed)


def initial_seed():
    return State.generator.initial_seed()


def seed():
    return State.generator.seed()


def get_rng_state():
    return State.generator.get_state()


def set_rng_state(state):
    State.generator.set_state(state)
