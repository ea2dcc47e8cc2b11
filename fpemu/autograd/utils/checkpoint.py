"""``torch.utils.checkpoint``: activation checkpointing.

Checkpointing trades memory for a second forward pass in the backward; it
does not change a single number (torch restores the random state for the
recomputation, so even dropout masks repeat). fpemu keeps every activation
anyway, so ``checkpoint(fn, *args)`` runs ``fn`` once, with torch's argument
checks and its one visible difference: with the reentrant variant (the
default when ``use_reentrant`` is not given), if no tensor input requires a
gradient, the parameters inside get none, with torch's warning.
"""

from __future__ import annotations

import contextlib
import warnings

from .._core import Tensor, no_grad


def noop_context_fn():
    return contextlib.nullcontext(), contextlib.nullcontext()


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn,
               determinism_check="default", debug=False, early_stop=True, **kwargs):
    """``function(*args, **kwargs)``, checkpointed (module docstring)."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint: the use_reentrant parameter should be passed "
                      "explicitly. use_reentrant=False is recommended; without it torch (and "
                      "fpemu) use the reentrant variant.", stacklevel=2)
        use_reentrant = True
    kwargs.pop("preserve_rng_state", None)        # fpemu runs once: nothing to restore
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got "
                         f"{determinism_check}")
    if use_reentrant:
        if context_fn is not noop_context_fn or debug:
            raise ValueError("Passing `context_fn` or `debug` is only supported when "
                             "use_reentrant=False.")
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None",
                          stacklevel=2)
            with no_grad():
                return function(*args)
        return function(*args)
    forward_ctx, _ = context_fn()
    with forward_ctx:
        return function(*args, **kwargs)


def checkpoint_sequential(functions, segments, input, use_reentrant=None,
                          **kwargs):
    """Run a Sequential (or a list of modules) in ``segments`` checkpointed
    chunks; the last chunk runs plainly, as torch's."""
    if use_reentrant is None:
        warnings.warn("torch.utils.checkpoint.checkpoint_sequential: the use_reentrant "
                      "parameter should be passed explicitly.", stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    mods = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = len(mods) // segments
    end = -1

    def run(start, stop):
        def forward(x):
            for m in mods[start:stop + 1]:
                x = m(x)
            return x
        return forward
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run(end + 1, len(mods) - 1)(input)
