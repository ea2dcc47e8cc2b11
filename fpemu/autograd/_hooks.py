"""What registering a hook returns (``torch.utils.hooks.RemovableHandle``):
the one handle of tensor and graph-node hooks (``Tensor.register_hook``) and
of module hooks (``Module.register_*_hook``)."""

from __future__ import annotations


class RemovableHandle:
    """``handle.remove()`` unregisters the hook ``entry`` from the list
    ``hooks`` it was appended to (also as a context manager, which removes it
    on exit); removing it twice does nothing."""

    def __init__(self, hooks, entry):
        self._hooks, self._entry = hooks, entry

    def remove(self):
        if self._entry in self._hooks:
            self._hooks.remove(self._entry)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
