"""The monitor's hooks on a torch model: a forward pre-hook on the root
(where a step ends), forward hooks on the watched modules (activations, and
tensor hooks for their gradients), post-accumulate-grad hooks on the
parameters (weights, weight gradients) and the optimizer's step post-hook
(its moments). Each hook hands the tensors it sees to the counting
(:mod:`._monitor_count`)."""

from __future__ import annotations

from ._import import torch_module


def _float_tensors(output, torch, key=""):
    """(key, tensor) of every floating-point tensor in a module's output:
    a tensor, or tuples, lists and dicts of them (nested), keyed by their
    position or name ("0", "logits", "1.hidden")."""
    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            yield key or "0", output
        return
    if isinstance(output, dict):
        items = output.items()
    elif isinstance(output, (tuple, list)):
        items = enumerate(output)
    else:
        return
    for k, v in items:
        yield from _float_tensors(v, torch, f"{key}.{k}" if key else str(k))


class _Hooks:
    """The hooks of :class:`~fpemu.torch.Monitor` (a mixin: the state is the
    monitor's, set by its ``__init__``)."""

    def start(self):
        if self._running:
            return self
        torch = torch_module()
        root = type(self.model).__name__
        watched = []
        for name, m in self.model.named_modules():
            own = list(m.named_parameters(recurse=False))
            if own or not any(True for _ in m.children()):
                watched.append((name or root, m))
            for pname, p in own:
                self._owner[id(p)] = (name or root, pname)
        self._names = {id(m): n for n, m in watched}
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre))
        for name, m in watched:
            self._handles.append(m.register_forward_hook(self._forward_hook(name)))
        for p in self.model.parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._param_hook))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_post_hook(self._after_step))
        self._torch = torch
        self._running = True
        return self

    def stop(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._running = False
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def _on(self):
        return self.step % self.every == 0

    def _root_pre(self, module, args):
        if self._saw_backward:
            self.step += 1
            self._saw_backward = False

    def _forward_hook(self, name):
        def hook(module, args, output):
            if not self._on():
                return
            tensors = list(_float_tensors(output, self._torch))
            for key, t in tensors:
                label = name if len(tensors) == 1 else f"{name}[{key}]"
                self._trace.setdefault(self.step, []).append(("forward", label))
                if "activation" in self.kinds:
                    self._record("activation", label, t)
                if t.requires_grad and "activation_grad" in self.kinds:
                    t.register_hook(self._grad_hook(label))
        return hook

    def _grad_hook(self, label):
        def hook(grad):
            self._saw_backward = True
            if self._on():
                self._trace.setdefault(self.step, []).append(("backward", label))
                self._record("activation_grad", label, grad, unscale=True)
        return hook

    def _param_hook(self, p):
        self._saw_backward = True
        if not self._on():
            return
        module, pname = self._owner.get(id(p), ("?", "?"))
        label = f"{module}.{pname}"
        if "weight" in self.kinds:
            self._record("weight", label, p)
        if "weight_grad" in self.kinds and p.grad is not None:
            self._record("weight_grad", label, p.grad, unscale=True)

    def _after_step(self, optimizer, args, kwargs):
        if not self._on():
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                module, pname = self._owner.get(id(p), ("?", "?"))
                for kind in ("exp_avg", "exp_avg_sq"):
                    t = st.get(kind)
                    if kind in self.kinds and isinstance(t, self._torch.Tensor):
                        self._record(kind, f"{module}.{pname}", t)
