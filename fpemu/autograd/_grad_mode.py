"""Grad mode (``torch.autograd.grad_mode``): whether ops record a graph,
switched by :class:`no_grad`, :class:`enable_grad`, :class:`set_grad_enabled`
and :class:`inference_mode`, each a context manager and a decorator."""

from __future__ import annotations

import functools

from ._state import State


def is_grad_enabled() -> bool:
    return State.grad_enabled


def is_inference_mode_enabled() -> bool:
    return State.inference


class _GradModeBase:
    """A context manager that is also a decorator (``@no_grad()``)."""

    _flag = False

    def __init__(self, mode=True):
        self._mode = mode

    def __enter__(self):
        self._old = (State.grad_enabled, State.inference)
        State.grad_enabled = self._flag

    def __exit__(self, *exc):
        State.grad_enabled, State.inference = self._old
        return False

    def __call__(self, fn):

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with type(self)(self._mode):
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradModeBase):
    """Ops inside record no graph (a context manager and a decorator)."""


class enable_grad(_GradModeBase):
    _flag = True


class set_grad_enabled(_GradModeBase):
    """``set_grad_enabled(False)``: as a call it switches for good, as a
    context manager for the region."""

    def __init__(self, mode):
        super().__init__(mode)
        self._flag = bool(mode)
        self._old = (State.grad_enabled, State.inference)
        State.grad_enabled = bool(mode)

    def __enter__(self):
        pass


class inference_mode(_GradModeBase):
    """``inference_mode()`` is ``no_grad()`` here (fpemu keeps no version
    counters apart); ``inference_mode(False)`` changes nothing."""

    def __enter__(self):
        self._old = (State.grad_enabled, State.inference)
        if self._mode:
            State.grad_enabled, State.inference = False, True
