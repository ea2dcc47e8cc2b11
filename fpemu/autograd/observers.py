"""Observers: per-step underflow / overflow counts of every tensor of a model.

``Observer(model, optimizer)`` hooks every leaf module and, on each training
step, records :func:`fpemu.stats` counts and the amax of

* ``activation``: each module's output (forward hook);
* ``activation_grad``: the gradient reaching each module's output;
* ``weight_grad``: each parameter's ``.grad``, read by :meth:`Observer.step`;
* ``optimizer_state``: each tensor in the optimizer's state (``exp_avg``,
  ``exp_avg_sq``, ``momentum_buffer``), also read by :meth:`Observer.step`.

Counts are taken in ``fmt`` (default: the tensor's own dtype) after
multiplying by ``scale``: pass ``fmt="fp16"`` to ask how many fp32 values
would underflow in fp16. Call :meth:`step` once per iteration, after the
optimizer step; :attr:`records` is a list of :class:`Record`.
"""

from __future__ import annotations

import dataclasses

from ..stats import Counts, stats
from ._core import Tensor, float64


@dataclasses.dataclass
class Record:
    step: int
    kind: str
    name: str
    counts: Counts

    @property
    def amax(self):
        return self.counts.amax


class Observer:
    KINDS = ("activation", "activation_grad", "weight_grad", "optimizer_state")

    def __init__(self, model, optimizer=None, fmt=None, *, scale=1.0,
                 kinds=("activation", "activation_grad", "weight_grad", "optimizer_state")):
        unknown = set(kinds) - set(self.KINDS)
        if unknown:
            raise ValueError(f"Observer: unknown kinds {sorted(unknown)}; choose from "
                             f"{self.KINDS}")
        self.model, self.optimizer = model, optimizer
        self.fmt, self.scale, self.kinds = fmt, scale, tuple(kinds)
        self.step_index = 0
        self.records = []
        self._handles = []
        for name, module in model.named_modules():
            if not module._modules:
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))

    def _count(self, kind, name, t):
        if not isinstance(t, Tensor) or t.dtype is float64 and self.fmt is None:
            return
        fmt = self.fmt or t.dtype
        counts = stats(t._a, fmt, scale=self.scale)
        self.records.append(Record(self.step_index, kind, name, counts))

    def _forward_hook(self, name):
        def hook(module, inputs, output):
            if not isinstance(output, Tensor):
                return None
            if "activation" in self.kinds:
                self._count("activation", name, output)
            if "activation_grad" in self.kinds and output.requires_grad:
                step = self.step_index

                def grad_hook(g, step=step):
                    if step == self.step_index:
                        self._count("activation_grad", name, g)
                output.register_hook(grad_hook)
            return None
        return hook

    def step(self):
        """Record weight gradients and optimizer states, then advance."""
        if "weight_grad" in self.kinds:
            for name, p in self.model.named_parameters():
                if p.grad is not None:
                    self._count("weight_grad", name, p.grad)
        if "optimizer_state" in self.kinds and self.optimizer is not None:
            names = {id(p): n for n, p in self.model.named_parameters()}
            masters = getattr(self.optimizer, "_model_of", {})
            for p, st in self.optimizer.state.items():
                pname = names.get(id(masters.get(id(p), p)), "?")
                for key, value in st.items():
                    if isinstance(value, Tensor):
                        self._count("optimizer_state", f"{pname}.{key}", value)
        self.step_index += 1

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def select(self, kind=None, name=None, step=None):
        return [r for r in self.records if (kind is None or r.kind == kind)
                and (name is None or r.name == name) and (step is None or r.step == step)]

    def total(self, kind, step=None):
        """All counts of one kind (one step, or all) merged into one."""
        parts = [r.counts for r in self.select(kind, step=step)]
        return sum(parts[1:], parts[0]) if parts else None

    def table(self, step=None):
        """Rows of (step, kind, name, total, % zero, % flushed, % subnormal,
        % overflow, amax)."""
        rows = []
        for r in self.select(step=step):
            c = r.counts
            rows.append((r.step, r.kind, r.name, c.total, 100 * c.fraction("zero"),
                         100 * c.fraction("flushed"), 100 * c.fraction("subnormal"),
                         100 * c.fraction("overflow"), c.amax))
        return rows
