"""The errors fpemu's own argument checks raise.

They subclass the built-in ``ValueError`` and ``TypeError``, so ``except
ValueError`` keeps working; the ``fpemu`` command tells them (a user's
mistake: one line, exit status 2) from anything else (a bug: a traceback).
"""


class FpemuError(Exception):
    """Base of the errors raised by fpemu's checks of its arguments."""


class FpemuValueError(FpemuError, ValueError):
    """An argument of the right type with a value fpemu cannot take."""


class FpemuTypeError(FpemuError, TypeError):
    """An argument of a type fpemu cannot take."""


class FpemuRuntimeError(FpemuError, RuntimeError):
    """A call that PyTorch would refuse with a ``RuntimeError`` (fpemu.autograd
    raises it with torch's wording)."""


class FpemuNotImplementedError(FpemuError, NotImplementedError):
    """A PyTorch name fpemu.autograd does not emulate; the message says what
    fpemu emulates instead."""
