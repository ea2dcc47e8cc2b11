"""The error for a PyTorch name fpemu.autograd does not have: it says what
fpemu emulates and where to look, instead of a bare AttributeError (it is
still an AttributeError, so ``hasattr`` keeps working)."""


class MissingName(AttributeError):
    pass


def missing(where, name):
    if name.startswith("__") and name.endswith("__"):
        return AttributeError(name)       # Python's protocol probes stay plain
    return MissingName(
        f"{where} has no attribute '{name}': fpemu.autograd emulates the part of PyTorch "
        f"that training programs use (tensors, autograd, nn, optim, amp, fp8; the list is in "
        f"docs/autograd.md, 'API coverage'). Compute this part with torch and pass the "
        f"result in with fpemu.autograd.tensor(...), or write it with the ops that exist.")


def module_getattr(where):
    def __getattr__(name):
        raise missing(where, name)
    return __getattr__
