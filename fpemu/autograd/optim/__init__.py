"""SGD, Adam and AdamW (and RMSprop, Adagrad, Adadelta) with PyTorch's op
sequences on CUDA (or, under ``Profile("cpu", ...)``, on the CPU build: see
``docs/fidelity.md``).

Each optimizer has the three implementations of torch 2.13 and computes each
the way ``docs/pytorch-numerics.md`` §3-4 writes it down:

* ``foreach`` (the default, as on CUDA): every ``torch._foreach_*`` call is a
  kernel of its own, computed in float32 and rounded to the parameter dtype
  (``L``) at its end; ``add(alpha)``, ``lerp`` and ``addcmul``/``addcdiv``
  with a value are exact fmas (nvcc contracts them); bias corrections are
  Python doubles, converted to float32 where they enter a kernel;
* ``foreach=False`` (single-tensor): the same, except that Adam's
  ``sqrt(v) / bc2_sqrt`` divides by a Python number and so multiplies by its
  reciprocal, taken in double and rounded to float32;
* ``fused=True``: one kernel in float32, states rounded only when stored;
  bias corrections in float32 from CUDA's own ``powf``, emulated bit for bit
  (``_cuda_math``); fused SGD in float32 with nvcc's contractions, as measured
  on an H200.
  Fused optimizers take GradScaler's ``grad_scale`` / ``found_inf``.

Parameters may be float32, float16 or bfloat16 (or any fpemu format).
``master_weights=True`` keeps a float32 master copy of every low-precision
parameter: gradients are widened into the masters, the step updates the
masters and each model parameter is the master rounded to its dtype after
every step (Micikevicius et al. 2018, §3.1).
"""

from __future__ import annotations

import math

import numpy as np

from .._core import Tensor, _store, float32
from .._cuda_math import powf
from .._profile import get_profile
from .. import _aten as aten
from . import _loops
from .optimizer import (  # noqa: F401
    Optimizer, _advance, _check_lr, _cpu_tail, _cuda_lanes, _f, _fma, _step_tensor,
    _unscaled_grad,
)


def _foreach_batches(todo, batchable):
    """The (param, state, step) triples of one group as torch's foreach
    optimizers apply them: one batch per dtype and step count (bias
    corrections are per step; ``torch._foreach_*`` groups tensors by dtype),
    in order of first appearance; one parameter per batch unless
    ``batchable``. Every kernel of a batch is element-wise, so running it
    once on the concatenated parameters gives each element the bits it gets
    alone, for a kernel launch per op instead of one per op and parameter."""
    if not batchable:
        return [[item] for item in todo]
    batches = {}
    for item in todo:
        batches.setdefault((item[0].dtype, item[2]), []).append(item)
    return list(batches.values())


def _flat(arrays):
    """The arrays of one batch, flattened and concatenated (a view for one)."""
    if len(arrays) == 1:
        return arrays[0].reshape(-1)
    return np.concatenate([a.reshape(-1) for a in arrays])


def _inplace(a):
    """A float32 array as a flat view of the same storage, or None."""
    if a.dtype != np.float32 or not a.flags.c_contiguous or not a.flags.writeable:
        return None
    return a.reshape(-1)


def _unbatch(batch, P, M, V, MX):
    """Hand each parameter of a batch its slice of the new values, and its
    states theirs in storage of their own (``MX``: amsgrad's maximum, or
    None)."""
    D = batch[0][0].dtype
    at = 0
    for p, st, _ in batch:
        shape, n = p._a.shape, p._a.size
        part = slice(at, at + n)
        at += n
        p._a = P[part].reshape(shape)            # written into its storage
        st["exp_avg"] = Tensor(M[part].reshape(shape).copy(), D)
        st["exp_avg_sq"] = Tensor(V[part].reshape(shape).copy(), D)
        if MX is not None:
            st["max_exp_avg_sq"] = Tensor(MX[part].reshape(shape).copy(), D)


class SGD(Optimizer):
    """SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
    nesterov=False, *, maximize=False, foreach=None, fused=None,
    master_weights=False), torch's defaults."""

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None, master_weights=False):
        _check_lr(lr)
        if momentum < 0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        if differentiable:
            raise ValueError("fpemu's optimizers have no differentiable mode; pass "
                             "differentiable=False")
        self.impl = self._impl(foreach, fused)
        self._step_supports_amp_scaling = self.impl == "fused"
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize), master_weights)

    def _update_group(self, group):
        lr, mom, damp = group["lr"], group["momentum"], group["dampening"]
        wd, nesterov, maximize = group["weight_decay"], group["nesterov"], group["maximize"]
        grad_scale, found_inf = self._grad_scale_and_found_inf()
        if self.impl == "fused" and found_inf is not None and found_inf == 1:
            return
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {})
            D = p.dtype
            if self.impl == "fused":
                fused = self._fused_cpu if get_profile().cpu else self._fused
                fused(p, st, D, lr, mom, damp, wd, nesterov, maximize, grad_scale)
                continue

            def L(x):
                return _store(x, D)
            P, G = p._a, L(p.grad._a)
            if maximize:
                G = -G
            if wd:                                       # g.add(p, alpha=wd)
                G = aten.add_alpha(G, P, aten.scalar(wd, D), D)
            if mom:
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = G.copy()
                else:
                    buf = aten.mul_scalar(buf._a, mom, D, self.impl == "foreach")
                    buf = (L(buf + G) if 1 - damp == 1
                           else aten.add_alpha(buf, G, aten.scalar(1 - damp, D), D))
                st["momentum_buffer"] = Tensor(buf, D)
                G = aten.add_alpha(G, buf, aten.scalar(mom, D), D) if nesterov else buf
            p._a = aten.add_alpha(P, G, aten.scalar(-lr, D), D)  # p.add_(g, alpha=-lr)

    def _fused(self, p, st, D, lr, mom, damp, wd, nesterov, maximize, grad_scale):
        """The CUDA fused SGD kernel as measured with torch 2.11 on an H200
        (the fused-* and optim-sgd-fused-* scenarios): float32 throughout with
        float32 scalars and nvcc's contractions: ``g = fma(wd, p, g)``, ``buf =
        fma(1 - dampening, g, r(momentum * buf))`` (with ``maximize`` and no
        weight decay: ``fma(momentum, buf, r((1 - dampening) * g))``), Nesterov
        ``g = fma(momentum, buf, g)``, ``p = fma(-lr, g, p)``. With a
        GradScaler's ``grad_scale`` the aligned path computes lanes 0-2 of
        each 4 as ``p - r(lr * g)``, unfused (:func:`_cuda_lanes`)."""
        G = _unscaled_grad(p, grad_scale)
        P = p._a.astype(np.float32)
        with np.errstate(all="ignore"):
            if maximize:
                G = -G
            if wd:
                G = _fma(_f(wd), P, G)
            if mom:
                buf = st.get("momentum_buffer")
                if buf is None:
                    B = G
                elif maximize and not wd:
                    B = _fma(_f(mom), buf._a.astype(np.float32), _f(1 - damp) * G)
                else:
                    B = _fma(_f(1 - damp), G, _f(mom) * buf._a.astype(np.float32))
                st["momentum_buffer"] = Tensor(_store(B, D), D)
                G = _fma(_f(mom), B, G) if nesterov else B
            P_new = _fma(_f(-lr), G, P)
            if grad_scale is not None:
                lane, aligned = _cuda_lanes(P.shape)
                P_new = np.where(aligned & (lane < 3), P - _f(lr) * G, P_new)
            p._a = _store(P_new, D)

    def _fused_cpu(self, p, st, D, lr, mom, damp, wd, nesterov, maximize, grad_scale):
        """FusedSGDKernel.cpp (CPU, float32 parameters): float32 throughout,
        explicit fmas for the weight decay and the momentum, the parameter
        update contracted by GCC; the scalar tail contracts the momentum the
        other way. (For 16-bit parameters torch 2.13's vector body never
        stores the parameter and reads the momentum buffer as float32, a
        torch bug fpemu does not reproduce: it computes what the tail does.)"""
        G = _unscaled_grad(p, grad_scale)
        with np.errstate(all="ignore"):
            if maximize:
                G = -G
            P = p._a.astype(np.float32)
            if wd:
                G = _fma(P, _f(wd), G)
            if mom:
                buf = st.get("momentum_buffer")
                if buf is None:
                    B = G
                else:
                    B0 = buf._a.astype(np.float32)
                    B = _fma(_f(1 - damp), G, B0 * _f(mom))
                    if D == float32:
                        tail = _cpu_tail(B.size, D).reshape(B.shape)
                        B = np.where(tail, _fma(B0, _f(mom), G * _f(1 - damp)), B)
                st["momentum_buffer"] = Tensor(_store(B, D), D)
                G = _fma(B, _f(mom), G) if nesterov else B
            P = _fma(G, _f(-lr), P)
        p._a = _store(P, D)


class Adam(Optimizer):
    """Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False, *, foreach=None, maximize=False, fused=None,
    decoupled_weight_decay=False, master_weights=False), torch's defaults."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False,
                 master_weights=False):
        _check_lr(lr)
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"Invalid beta parameters: {betas}; each must be in [0, 1)")
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if capturable or differentiable:
            raise ValueError("fpemu emulates the non-capturable, non-differentiable paths; "
                             "pass capturable=False and differentiable=False")
        self.impl = self._impl(foreach, fused)
        self._step_supports_amp_scaling = self.impl == "fused"
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay),
                         master_weights)

    #: float32 parameters on CUDA take the one-loop form of the op-by-op
    #: step (``_loops``; False: the op-by-op form, which the tests compare)
    _fp32_kernel = True

    def _update_group(self, group):
        grad_scale, found_inf = self._grad_scale_and_found_inf()
        todo = []
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {})
            if not st:
                st["step"] = _step_tensor()
                st["exp_avg"] = Tensor(np.zeros_like(p._a), p.dtype)
                st["exp_avg_sq"] = Tensor(np.zeros_like(p._a), p.dtype)
                if group["amsgrad"]:
                    st["max_exp_avg_sq"] = Tensor(np.zeros_like(p._a), p.dtype)
            if self.impl == "fused":
                fused = self._fused_cpu if get_profile().cpu else self._fused
                fused(p, st, group, grad_scale, found_inf)
            else:
                todo.append((p, st, float(_advance(st))))
        for batch in _foreach_batches(todo, self.impl == "foreach" and self._batchable(group)):
            self._op_by_op(batch, group, single=self.impl == "single")

    @staticmethod
    def _batchable(group):
        """Whether every kernel of the foreach step is element-wise (the same
        bits on a concatenation of the parameters): all but CPU's 16-bit
        ``add(alpha)``, whose tail depends on each tensor's own size."""
        return (group["weight_decay"] == 0 or group["decoupled_weight_decay"]
                or not get_profile().cpu)

    def _op_by_op(self, batch, group, single):
        """_multi_tensor_adam / _single_tensor_adam, one ATen kernel per line
        (the kernels' CUDA and CPU formulas are in ``_aten``), on a batch of
        parameters of one dtype and step (:func:`_foreach_batches`)."""
        D = batch[0][0].dtype
        t = batch[0][2]
        foreach = not single
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if D is float32 and self._fp32_kernel and not get_profile().cpu:
            self._fp32_loop(batch, group, single)
            return
        P = _flat([p._a for p, _, _ in batch])
        G = _store(_flat([p.grad._a for p, _, _ in batch]), D)
        M = _flat([st["exp_avg"]._a for _, st, _ in batch])
        V = _flat([st["exp_avg_sq"]._a for _, st, _ in batch])
        if group["maximize"]:
            G = -G
        if wd != 0:
            if group["decoupled_weight_decay"]:
                P = aten.mul_scalar(P, 1 - lr * wd, D, foreach)      # param.mul_(1 - lr*wd)
            else:
                G = aten.add_alpha(G, P, aten.scalar(wd, D), D)     # grad.add(param, alpha=wd)
        M = aten.lerp(M, G, 1 - b1, D)                               # exp_avg.lerp_(grad, 1-b1)
        V = aten.mul_scalar(V, b2, D, foreach)                       # exp_avg_sq.mul_(b2)
        V = aten.addcmul(V, G, G, 1 - b2, D)                         # .addcmul_(g, g, 1-b2)
        bc1 = 1 - b1 ** t
        bc2 = 1 - b2 ** t
        step_size = (lr / bc1) * -1
        bc2_sqrt = bc2 ** 0.5
        if group["amsgrad"]:
            MX = np.maximum(_flat([st["max_exp_avg_sq"]._a for _, st, _ in batch]), V)
            V_used = MX
        else:
            V_used = V
        with np.errstate(all="ignore"):
            d = aten.sqrt(V_used, D)                                 # exp_avg_sq.sqrt()
            if foreach:
                d = aten.foreach_div(d, bc2_sqrt, D)                 # _foreach_div_(., bc2_sqrt)
            else:
                d = aten.div_scalar(d, bc2_sqrt, D)                  # / bias_correction2_sqrt
            d = aten.add_scalar(d, eps, D)                           # .add_(eps)
            P = aten.addcdiv(P, M, d, step_size, D)                  # param.addcdiv_(m, d, ss)
        _unbatch(batch, P, M, V, MX if group["amsgrad"] else None)

    def _fp32_loop(self, batch, group, single):
        """:meth:`_op_by_op` for float32 parameters on CUDA: the same kernels,
        one element at a time in one loop (``_loops``), writing the
        parameter and its states in place as torch's in-place kernels do
        (one call per parameter: nothing is concatenated or allocated)."""
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        t = batch[0][2]
        bc1, bc2_sqrt = 1 - b1 ** t, (1 - b2 ** t) ** 0.5
        K = _loops
        flags = ((K.MAXIMIZE if group["maximize"] else 0) | (K.SINGLE if single else 0)
                 | (K.AMSGRAD if group["amsgrad"] else 0)
                 | (0 if wd == 0 else K.DECOUPLED if group["decoupled_weight_decay"] else K.L2))
        scalars = np.array([wd, 1 - lr * wd, 1 - b1, b2, 1 - b2,
                            1.0 / float(bc2_sqrt) if single else bc2_sqrt, eps,
                            (lr / bc1) * -1], np.float32)
        names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
        none = np.empty(0, np.float32)
        with np.errstate(all="ignore"):
            for p, st, _ in batch:
                tensors = [p] + [st[k] for k in names]
                G = np.ascontiguousarray(p.grad._a, np.float32).reshape(-1)
                flat = [_inplace(x._data) for x in tensors]
                copied = any(a is None for a in flat)        # a strided view, say
                if copied:
                    flat = [np.array(x._data, np.float32).reshape(-1) for x in tensors]
                P, M, V, MX = flat + [none] * (4 - len(flat))
                K.adam_fp32_step(P, G, M, V, MX, scalars, flags)
                for x, a in zip(tensors, flat):
                    if copied:
                        x._a = a.reshape(x.shape)            # written back (and bumped)
                    else:
                        x._bump()

    def _fused(self, p, st, group, grad_scale, found_inf):
        """fused_adam_utils.cuh::adam_math as measured with torch 2.11 on an
        H200: float32 throughout, one store; bias corrections with CUDA's own
        ``powf``; L2 weight decay ``g = fma(p, wd, g)``, except in lane 0 of
        each 4 (:func:`_cuda_lanes`) and under ``maximize``, where nvcc leaves
        ``g + r(wd * p)`` unfused, and with a ``grad_scale``, where every lane
        is fused."""
        if found_inf is not None and found_inf == 1:
            return
        D = p.dtype
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        lr32, b1f, b2f, wd32, eps32 = _f(lr), _f(b1), _f(b2), _f(wd), _f(eps)
        step = _f(_advance(st))
        bc1 = _f(1) - powf(b1f, step)                 # CUDA's powf, bit for bit
        bc2_sqrt = np.sqrt(_f(1) - powf(b2f, step))
        G = _unscaled_grad(p, grad_scale)
        with np.errstate(all="ignore"):
            if group["maximize"]:
                G = -G
            P = p._a.astype(np.float32)
            M, V = st["exp_avg"]._a, st["exp_avg_sq"]._a
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    P = _fma(-_f(lr32 * wd32), P, P)
                elif group["maximize"]:
                    G = G + wd32 * P                    # measured: never contracted
                elif grad_scale is not None:
                    G = _fma(P, wd32, G)
                else:                                   # lane 0 of each 4 is not contracted
                    lane, _ = _cuda_lanes(P.shape)
                    G = np.where(lane == 0, G + wd32 * P, _fma(P, wd32, G))
            M = _fma(b1f, M, _fma(-b1f, G, G))
            GG = G * G
            V = _fma(b2f, V, _fma(-b2f, GG, GG))
            if group["amsgrad"]:
                MX = np.maximum(st["max_exp_avg_sq"]._a, V)
                st["max_exp_avg_sq"] = Tensor(_store(MX, D), D)
                V_used = MX
            else:
                V_used = V
            step_size = lr32 / bc1
            d = np.sqrt(V_used) / bc2_sqrt + eps32
            P = P - (step_size * M) / d
        p._a = _store(P, D)
        st["exp_avg"] = Tensor(_store(M, D), D)
        st["exp_avg_sq"] = Tensor(_store(V, D), D)

    def _fused_cpu(self, p, st, group, grad_scale, found_inf):
        """FusedAdamKernel.cpp (CPU): bias corrections in double, coefficients
        rounded to float32, the arithmetic in float32 opmath, states rounded
        when stored; lerp by an explicit fma. For float32 parameters GCC
        contracts ``v*beta2 + (1-beta2)*g*g`` as ``fma(r((1-beta2)*g), g,
        r(v*beta2))`` in the vector body and as ``fma(v, beta2, r(r((1-beta2)*g)*g))``
        in the scalar tail (measured on the 2.13 x86-64 build)."""
        if found_inf is not None and found_inf == 1:
            return
        D = p.dtype
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        step = float(_advance(st))
        bc1 = 1 - b1 ** step
        bc2_sqrt = math.sqrt(1 - b2 ** step)
        step_size = lr / bc1
        w, c2 = _f(1 - b1), _f(1 - b2)
        G = _unscaled_grad(p, grad_scale)
        with np.errstate(all="ignore"):
            if group["maximize"]:
                G = -G
            P = p._a.astype(np.float32)
            M = st["exp_avg"]._a.astype(np.float32)
            V0 = st["exp_avg_sq"]._a.astype(np.float32)
            if wd != 0:
                if group["decoupled_weight_decay"]:
                    P = P * _f(1 - lr * wd)
                else:
                    G = _fma(P, _f(wd), G)
            M = aten.lerp_opmath(M, G, w)                  # exp_avg.lerp_(grad, 1-b1)
            V = _fma(c2 * G, G, V0 * _f(b2))
            if D == float32:
                tail = _cpu_tail(V.size, D).reshape(V.shape)
                V = np.where(tail, _fma(V0, _f(b2), (c2 * G) * G), V)
            if group["amsgrad"]:
                MX = np.maximum(st["max_exp_avg_sq"]._a.astype(np.float32), V)
                st["max_exp_avg_sq"] = Tensor(_store(MX, D), D)
                V_used = MX
            else:
                V_used = V
            d = np.sqrt(V_used) / _f(bc2_sqrt) + _f(eps)
            P = P + (_f(-step_size) * M) / d
        p._a = _store(P, D)
        st["exp_avg"] = Tensor(_store(M, D), D)
        st["exp_avg_sq"] = Tensor(_store(V, D), D)


class AdamW(Adam):
    """Adam with decoupled weight decay (default 1e-2), torch's subclass."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, master_weights=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, master_weights=master_weights)


from . import lr_scheduler  # noqa: E402,F401  (torch.optim.lr_scheduler)
from .lbfgs import LBFGS  # noqa: E402,F401


class _Simple(Optimizer):
    """Shared set-up of RMSprop, Adagrad and Adadelta: foreach and
    single-tensor forms, and Adagrad's fused form (torch has it on the CPU
    only, so only the CPU profile runs it)."""

    def __init__(self, params, defaults, foreach, fused, maximize, master_weights):
        _check_lr(defaults["lr"])
        if fused and not get_profile().cpu:
            raise RuntimeError(f"{type(self).__name__}(fused=True): torch's fused kernel of "
                               f"this optimizer runs on the CPU only, and the CUDA profile "
                               f"emulates a GPU; use foreach=True (the GPU default), or "
                               f"set_profile(Profile('cpu')) to emulate torch on the CPU")
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        for key in ("eps", "weight_decay"):
            if key in defaults and not defaults[key] >= 0:
                raise ValueError(f"Invalid {key.replace('_', ' ')} value: {defaults[key]}")
        self.impl = "fused" if fused else self._impl(foreach, None)
        self._step_supports_amp_scaling = self.impl == "fused"
        defaults["maximize"] = maximize
        super().__init__(params, defaults, master_weights)

    def _update_group(self, group):
        foreach = self.impl == "foreach"
        if self.impl == "fused":
            grad_scale, found_inf = self._grad_scale_and_found_inf()
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state.setdefault(p, {})
            if self.impl == "fused":
                self._fused_cpu(p, st, group, grad_scale, found_inf)
                continue
            D = p.dtype
            G = _store(p.grad._a, D)
            if group["maximize"]:
                G = -G
            if group["weight_decay"] != 0:
                G = aten.add_alpha(G, p._a, aten.scalar(group["weight_decay"], D), D)
            p._a = self._update(p._a, G, st, group, D, foreach)


def _zero_state(st, P, D, *names):
    """A new state: step 0 and zero buffers of the parameter's dtype."""
    st["step"] = _step_tensor()
    for name in names:
        st[name] = Tensor(np.zeros_like(P), D)


def _decay_square_avg(st, G, decay, D, foreach):
    """step += 1; square_avg.mul_(decay).addcmul_(g, g, value=1 - decay), as
    RMSprop and Adadelta write it; returns the new square_avg values."""
    _advance(st)
    V = aten.mul_scalar(st["square_avg"]._a, decay, D, foreach)
    V = aten.addcmul(V, G, G, 1 - decay, D)
    st["square_avg"] = Tensor(V, D)
    return V


class RMSprop(_Simple):
    """RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0,
    momentum=0, centered=False, *, foreach=None, maximize=False), torch's
    op sequence (``_single_tensor_rmsprop`` / ``_multi_tensor_rmsprop``)."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False, *, master_weights=False):
        if not momentum >= 0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not alpha >= 0:
            raise ValueError(f"Invalid alpha value: {alpha}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered), foreach, None,
                         maximize, master_weights)

    def _update(self, P, G, st, group, D, foreach):
        lr, alpha, eps, mom = group["lr"], group["alpha"], group["eps"], group["momentum"]
        if not st:
            _zero_state(st, P, D, "square_avg", *(("momentum_buffer",) if mom > 0 else ()),
                        *(("grad_avg",) if group["centered"] else ()))
        V = _decay_square_avg(st, G, alpha, D, foreach)
        with np.errstate(all="ignore"):
            if group["centered"]:
                GA = aten.lerp(st["grad_avg"]._a, G, 1 - alpha, D)        # grad_avg.lerp_(g, 1-a)
                st["grad_avg"] = Tensor(GA, D)
                avg = aten.sqrt(aten.addcmul(V, GA, GA, -1, D), D)     # addcmul(., -1).sqrt_()
            else:
                avg = aten.sqrt(V, D)                                   # square_avg.sqrt()
            avg = aten.add_scalar(avg, eps, D)                          # .add_(eps)
            if mom > 0:
                B = aten.mul_scalar(st["momentum_buffer"]._a, mom, D, foreach)
                B = aten.addcdiv(B, G, avg, 1, D)                       # buf.addcdiv_(g, avg)
                st["momentum_buffer"] = Tensor(B, D)
                return aten.add_alpha(P, B, aten.scalar(-lr, D), D)     # p.add_(buf, alpha=-lr)
            return aten.addcdiv(P, G, avg, -lr, D)                      # p.addcdiv_(g, avg, -lr)


class Adagrad(_Simple):
    """Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0,
    initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False),
    torch's op sequences (the foreach form scales the gradient by -clr before
    one addcdiv; the single-tensor form passes -clr to addcdiv)."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0,
                 initial_accumulator_value=0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None, master_weights=False):
        if not lr_decay >= 0:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not initial_accumulator_value >= 0:
            raise ValueError(f"Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps), foreach, fused, maximize, master_weights)
        for group in self.param_groups:          # torch fills the state at construction
            for p in group["params"]:
                self.state[p] = {"step": _step_tensor(), "sum": Tensor(
                    _store(np.full(p.shape, group["initial_accumulator_value"], np.float64),
                           p.dtype), p.dtype)}

    def _fused_cpu(self, p, st, group, grad_scale, found_inf):
        """FusedAdagradKernel.cpp (CPU): clr = lr / (1 + (step - 1) * lr_decay)
        in double; float32 opmath; GCC contracts ``g + p * wd`` and
        ``sum + g * g`` into fmas; ``p - clr * g / std`` stays three
        roundings. For 16-bit parameters the vector body reads ``wd``,
        ``eps`` and ``clr`` rounded to the parameter's dtype, the scalar tail
        (the last ``n % lanes`` elements of each chunk) as float32; the sum
        is stored rounded but ``std`` uses it unrounded."""
        if found_inf is not None and found_inf == 1:
            return
        D = p.dtype
        clr = group["lr"] / (1.0 + (float(_advance(st)) - 1.0) * group["lr_decay"])
        wd, eps = group["weight_decay"], group["eps"]

        def const(v):
            """A double argument as the vector body and the tail read it."""
            if D == float32:
                return _f(v)
            lanes = get_profile().cpu_lanes(2)
            tail = np.zeros(p._a.size, bool)
            for _, body_end, end in get_profile().cpu_fused_parts(p._a.size, 2, lanes):
                tail[body_end:end] = True
            body = _store(np.float32(v), D).astype(np.float32)
            return np.where(tail.reshape(p._a.shape), _f(v), body).astype(np.float32)
        G = _unscaled_grad(p, grad_scale)
        with np.errstate(all="ignore"):
            if group["maximize"]:
                G = G * _f(-1.0)
            P = p._a.astype(np.float32)
            if wd != 0:
                G = _fma(P, const(wd), G)
            S = _fma(G, G, st["sum"]._a.astype(np.float32))
            std = np.sqrt(S) + const(eps)
            P = P - (const(clr) * G) / std
        st["sum"] = Tensor(_store(S, D), D)
        p._a = _store(P, D)

    def _update(self, P, G, st, group, D, foreach):
        lr, decay, eps = group["lr"], group["lr_decay"], group["eps"]
        clr = lr / (1 + (float(_advance(st)) - 1) * decay)
        S = aten.addcmul(st["sum"]._a, G, G, 1, D)                    # state_sum.addcmul_(g, g)
        st["sum"] = Tensor(S, D)
        with np.errstate(all="ignore"):
            std = aten.add_scalar(aten.sqrt(S, D), eps, D)              # sqrt().add_(eps)
            if foreach:
                num = aten.mul_scalar(G, -clr, D, True)                 # _foreach_mul(g, -clr)
                return aten.addcdiv(P, num, std, 1, D)                  # addcdiv_(p, num, std)
            return aten.addcdiv(P, G, std, -clr, D)                     # p.addcdiv_(g, std, -clr)


class Adadelta(_Simple):
    """Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0,
    foreach=None, *, maximize=False), torch's op sequence."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None,
                 *, capturable=False, maximize=False, differentiable=False,
                 master_weights=False):
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay),
                         foreach, None, maximize, master_weights)

    def _update(self, P, G, st, group, D, foreach):
        lr, rho, eps = group["lr"], group["rho"], group["eps"]
        if not st:
            _zero_state(st, P, D, "square_avg", "acc_delta")
        V = _decay_square_avg(st, G, rho, D, foreach)
        with np.errstate(all="ignore"):
            std = aten.sqrt(aten.add_scalar(V, eps, D), D)              # add(eps).sqrt_()
            delta = aten.sqrt(aten.add_scalar(st["acc_delta"]._a, eps, D), D)
            delta = _store(delta / std, D)                              # delta.div_(std)
            delta = _store(delta * G, D)                                # .mul_(grad)
            A = aten.mul_scalar(st["acc_delta"]._a, rho, D, foreach)    # acc_delta.mul_(rho)
            A = aten.addcmul(A, delta, delta, 1 - rho, D)               # .addcmul_(d, d, 1-rho)
            st["acc_delta"] = Tensor(A, D)
            return aten.add_alpha(P, delta, aten.scalar(-lr, D), D)     # p.add_(delta, -lr)


from .._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.optim (torch.optim)')
