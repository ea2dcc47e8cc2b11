"""``torch.optim.optimizer``: :class:`Optimizer`, the base of fpemu's
optimizers (param groups, state, ``zero_grad``, master weights), and the
float32 helpers they share."""

from __future__ import annotations

import numbers

import numpy as np

from .._core import Tensor, _store, float32, float64, is_float
from .._profile import get_profile
from .._aten import fma as _fma_dt

_f = np.float32


def _fma(a, b, c):
    """Exact float32 fma, then one rounding."""
    return _fma_dt(a, b, c, float32)


def _cpu_tail(n, D):
    """Boolean mask of the elements a CPU fused optimizer kernel computes one
    at a time. Each chunk runs full ATen vectors, then a tail loop that GCC
    auto-vectorises 8 floats at a time (256-bit), then the last few elements
    scalar; the contraction differs only in those (measured on 2.13)."""
    itemsize = 4 if D == float32 else (D.bits + 7) // 8
    prof = get_profile()
    lanes = prof.cpu_lanes(4) if D == float32 else prof.cpu_lanes(2)
    mask = np.zeros(n, bool)
    for _, body_end, end in prof.cpu_fused_parts(n, itemsize, lanes):
        mask[body_end + (end - body_end) // 8 * 8:end] = True
    return mask


# CUDA's fused optimizers run through multi_tensor_apply (ATen's
# MultiTensorApply.cuh): chunks of 65,536 elements, blocks of 512 threads,
# each thread holding kILP = 4 elements. A chunk whose length is a multiple
# of 4 takes the aligned path, where a thread's 4 elements are adjacent
# (element j of the chunk is lane j % 4); otherwise the thread's elements are
# 512 apart (lane (j // 512) % 4). nvcc contracts the unrolled lanes
# differently in places (measured with torch 2.11 on an H200; the
# fused-* scenarios): docs/pytorch-numerics.md §3.5 and §4.
_CUDA_CHUNK, _CUDA_BLOCK, _CUDA_ILP = 65536, 512, 4


def _cuda_lanes(shape):
    """(lane, aligned) of every element of a tensor of ``shape`` in CUDA's
    fused optimizer kernels: the unrolled lane (0..3) that computes it and
    whether its chunk took the aligned path."""
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    j = i % _CUDA_CHUNK
    chunk_len = np.minimum(_CUDA_CHUNK, n - (i - j))
    aligned = chunk_len % _CUDA_ILP == 0
    lane = np.where(aligned, j % _CUDA_ILP, (j // _CUDA_BLOCK) % _CUDA_ILP)
    return lane.reshape(shape), aligned.reshape(shape)


def _step_tensor():
    """A new ``state["step"]``: a 0-d float32 tensor, as torch keeps it (on
    the CPU unless capturable or fused)."""
    return Tensor(np.zeros((), np.float32), float32)


def _advance(st):
    """``state["step"] += 1`` in float32; returns the new count (np.float32).
    A step loaded as a number (older checkpoints) becomes a tensor."""
    s = st["step"]
    if not isinstance(s, Tensor):
        s = st["step"] = Tensor(np.asarray(s, np.float32), float32)
    s._a = np.asarray(s._data.astype(np.float32) + _f(1), np.float32)
    return _f(s._data)


def _param_groups(params):
    """An optimizer's ``params`` as a list of param-group dicts, checked as
    torch checks it: an iterable of Tensors (one group) or of dicts, neither a
    lone Tensor nor empty."""
    if isinstance(params, Tensor):
        raise TypeError("params argument given to the optimizer should be an iterable of "
                        "Tensors or dicts, but got a Tensor")
    groups = list(params)
    if not groups:
        raise ValueError("optimizer got an empty parameter list")
    return groups if isinstance(groups[0], dict) else [{"params": groups}]


class Optimizer:
    """Base class: param groups, state, zero_grad, master weights."""

    _step_supports_amp_scaling = False

    def __init__(self, params, defaults, master_weights=False):
        groups = _param_groups(params)
        self.defaults = dict(defaults)
        self.state = {}
        self.param_groups = []
        self.master_weights = bool(master_weights)
        self._model_of = {}
        self._pulled = {}
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group):
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for name, value in self.defaults.items():
            group.setdefault(name, value)
        kept = []
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not is_float(p.dtype) or p.dtype is float64:
                raise TypeError(f"fpemu's optimizers emulate float32, float16, bfloat16 (and "
                                f"other fpemu format) parameters; got {p.dtype}")
            if self.master_weights and p.dtype != float32:
                master = Tensor(p._a.astype(np.float32), float32, requires_grad=True)
                self._model_of[id(master)] = p
                kept.append(master)
            else:
                kept.append(p)
        group["params"] = kept
        self.param_groups.append(group)

    # -- master weights
    def _masters(self):
        for group in self.param_groups:
            for m in group["params"]:
                model = self._model_of.get(id(m))
                if model is not None:
                    yield m, model

    def _prepare_grads(self):
        """Widen the model's new gradients into the float32 masters (exact)."""
        for m, model in self._masters():
            g = model.grad
            if g is None:
                m.grad = None
                self._pulled.pop(id(m), None)
            elif self._pulled.get(id(m)) is not g:
                m.grad = Tensor(g._a.astype(np.float32), float32)
                self._pulled[id(m)] = g

    def _push(self):
        for m, model in self._masters():
            model._a = _store(m._a, model.dtype)

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                targets = [p] + ([self._model_of[id(p)]] if id(p) in self._model_of else [])
                for t in targets:
                    if set_to_none:
                        t.grad = None
                    elif t.grad is not None:
                        t.grad._a = np.zeros_like(t.grad._a)
        self._pulled.clear()

    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()
        self._prepare_grads()
        with np.errstate(all="ignore"):          # inf - inf is NaN, silently, as in torch
            for group in self.param_groups:
                self._update_group(group)
        self._push()
        return loss

    def state_dict(self):
        index = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            groups.append({k: v for k, v in group.items() if k != "params"} | {"params": ids})
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = {k: (Tensor(v._a.copy(), v.dtype)
                                               if isinstance(v, Tensor) else v)
                                           for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        params = [p for g in self.param_groups for p in g["params"]]
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, st in state_dict["state"].items():
            self.state[params[int(i)]] = {k: (Tensor(v._a.copy(), v.dtype)
                                              if isinstance(v, Tensor) else v)
                                          for k, v in st.items()}

    # -- for the subclasses
    def _impl(self, foreach, fused):
        """"fused", "single", "foreach", or None: torch's default, decided at
        each step from the device (foreach on CUDA, single-tensor on the CPU)."""
        if foreach and fused:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        if fused:
            return "fused"
        if foreach is False:
            return "single"
        return "foreach" if foreach else None

    @property
    def impl(self):
        if self._impl_arg is not None:
            return self._impl_arg
        return "single" if get_profile().cpu else "foreach"

    @impl.setter
    def impl(self, value):
        self._impl_arg = value

    def _grad_scale_and_found_inf(self):
        scale = getattr(self, "grad_scale", None)
        found = getattr(self, "found_inf", None)
        return (None if scale is None else _f(scale)), (None if found is None else _f(found))


def _unscaled_grad(p, grad_scale, opmath=np.float32):
    """``p.grad`` in opmath divided by GradScaler's scale, as a fused
    kernel's first step does (and written back to ``p.grad``, as the fused
    kernels write the unscaled gradient); the gradient itself without one."""
    G = p.grad._a.astype(opmath)
    if grad_scale is not None:
        with np.errstate(all="ignore"):
            G = G / opmath(grad_scale)
        p.grad._a = _store(G, p.grad.dtype)
    return G


def _check_lr(lr):
    # torch checks only 0 <= lr: numpy scalars (np.float32(0.1)) are fine
    if isinstance(lr, (bool, np.bool_)) or not isinstance(lr, numbers.Real) or not lr >= 0:
        raise ValueError(f"Invalid learning rate: {lr}")
