"""``torch.optim.LBFGS``: limited-memory BFGS with an optional strong-Wolfe
line search, the algorithm of ``torch/optim/lbfgs.py`` (itself after
Schmidt's minFunc; Nocedal and Wright, *Numerical Optimization*, 2nd ed.,
Algorithms 7.4 and 3.5-3.6), step by step in the same order, so that a
program gets torch's trajectory.

The vectors (the flat gradient, directions, history) are tensors of the
parameters' dtype and every vector op is fpemu's (dot products under the
matmul model, ``add_(alpha=...)`` as :func:`~fpemu.autograd.add`); the
0-d results torch keeps as tensors (``y.dot(s)``, ``1 / ys``, the history
coefficients) are numbers of that dtype here, and the line search works in
Python floats where torch's does. Float64 parameters are accepted, as torch's
LBFGS examples use them (``docs/autograd.md``: float64 arithmetic is numpy's).
"""

from __future__ import annotations

import numpy as np

from .._core import Tensor, enable_grad, is_float, no_grad, opmath
from .optimizer import Optimizer, _check_lr, _param_groups
from ..ops.creation import zeros
from ..ops.shape import cat


def _scalar(t):
    """A 0-d tensor's value, as a number of its opmath type."""
    return opmath(t.dtype)(t._data)


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None):
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2),
    clamped to ``bounds`` (the interval itself by default); the midpoint when
    the cubic has no minimum (Nocedal and Wright, eq. 3.59)."""
    if bounds is not None:
        lo, hi = bounds
    else:
        lo, hi = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1 ** 2 - g1 * g2
    if d2_square >= 0:
        d2 = np.sqrt(d2_square)
        if x1 <= x2:
            pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(pos, lo), hi)
    return (lo + hi) / 2.0


def _strong_wolfe(obj_func, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9,
                  max_ls=25):
    """A step ``t`` along ``d`` that satisfies the strong Wolfe conditions:
    bracket it by growing the step, then zoom in by cubic interpolation.
    Returns (loss, flat gradient, t, evaluations)."""
    d_norm = _scalar(d.abs().max())
    g = g.clone()
    f_new, g_new = obj_func(x, t, d)
    evals = 1
    gtd_new = _scalar(g_new.dot(d))
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    bracket = bracket_f = bracket_g = bracket_gtd = None
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        lo_step, hi_step = t + 0.01 * (t - t_prev), t * 10
        previous = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new,
                               bounds=(lo_step, hi_step))
        t_prev, f_prev, g_prev, gtd_prev = previous, f_new, g_new.clone(), gtd_new
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = _scalar(g_new.dot(d))
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]

    # zoom: shrink the bracket around a point that satisfies the conditions
    insufficient = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1],
                               bracket_f[1], bracket_gtd[1])
        # a trial too near an end of the bracket moves a tenth of its length
        # inside, unless the previous trial made progress
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insufficient or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = obj_func(x, t, d)
        evals += 1
        gtd_new = _scalar(g_new.dot(d))
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low]:
            bracket[high], bracket_f[high] = t, f_new
            bracket_g[high], bracket_gtd[high] = g_new.clone(), gtd_new
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high] - bracket[low]) >= 0:
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low] = t, f_new
            bracket_g[low], bracket_gtd[low] = g_new.clone(), gtd_new
    return bracket_f[low], bracket_g[low], bracket[low], evals


class LBFGS(Optimizer):
    """``LBFGS(params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
    tolerance_change=1e-9, history_size=100, line_search_fn=None)``, torch's
    defaults; ``step(closure)`` needs a closure that recomputes the loss
    (zeroing the gradients and calling ``backward`` itself)."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        if isinstance(lr, Tensor):
            if lr.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")
            lr = lr.item()
        _check_lr(lr)
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"LBFGS: line_search_fn must be None or 'strong_wolfe', got "
                             f"{line_search_fn!r}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        self.defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                             tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                             history_size=history_size, line_search_fn=line_search_fn)
        groups = _param_groups(params)
        if len(groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        group = dict(groups[0])
        group["params"] = list(group["params"])
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        for p in group["params"]:
            if not isinstance(p, Tensor) or not is_float(p.dtype):
                raise TypeError(f"optimizer can only optimize floating-point Tensors, got "
                                f"{getattr(p, 'dtype', type(p).__name__)}")
        self.param_groups = [group]
        self._params = group["params"]
        self.state = {}
        self.master_weights, self._model_of, self._pulled = False, {}, {}

    def zero_grad(self, set_to_none=True):
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def _gather_flat_grad(self):
        views = [p.grad.reshape(-1) if p.grad is not None
                 else zeros(p.numel(), dtype=p.dtype) for p in self._params]
        return cat(views, 0)

    def _add_grad(self, step_size, update):
        offset = 0
        for p in self._params:
            n = p.numel()
            p.add_(update[offset:offset + n].view_as(p), alpha=float(step_size))
            offset += n

    def _clone_param(self):
        return [p.clone() for p in self._params]

    def _set_param(self, params_data):
        for p, data in zip(self._params, params_data):
            p.copy_(data)

    def _directional_evaluate(self, closure, x, t, d):
        self._add_grad(t, d)
        loss = float(closure())
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    def step(self, closure):
        """Up to ``max_iter`` L-BFGS iterations on the closure's loss;
        returns the loss of the first evaluation."""
        if closure is None:
            raise RuntimeError("LBFGS.step() needs a closure that recomputes the loss "
                               "(torch's LBFGS evaluates the function several times per step)")
        with no_grad():
            return self._step(enable_grad()(closure))

    def _step(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        line_search, history_size = group["line_search_fn"], group["history_size"]
        state = self.state.setdefault(self._params[0], {})
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = closure()
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1
        flat_grad = self._gather_flat_grad()
        if _scalar(flat_grad.abs().max()) <= tol_grad:
            return orig_loss

        om = opmath(flat_grad.dtype)
        d, t = state.get("d"), state.get("t")
        old_dirs, old_stps = state.get("old_dirs"), state.get("old_stps")
        ro, H_diag = state.get("ro"), state.get("H_diag")
        prev_flat_grad, prev_loss = state.get("prev_flat_grad"), state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            # the descent direction
            if state["n_iter"] == 1:
                d = flat_grad.neg()
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = _scalar(y.dot(s))
                if ys > 1e-10:
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(om(1.0) / ys)
                    H_diag = ys / _scalar(y.dot(y))
                num_old = len(old_dirs)
                al = state.setdefault("al", [None] * history_size)
                # the two-loop recursion (Nocedal and Wright, Algorithm 7.4)
                q = flat_grad.neg()
                for i in range(num_old - 1, -1, -1):
                    al[i] = _scalar(old_stps[i].dot(q)) * ro[i]
                    q.add_(old_dirs[i], alpha=-float(al[i]))
                d = r = q.mul(H_diag)
                for i in range(num_old):
                    be_i = _scalar(old_dirs[i].dot(r)) * ro[i]
                    r.add_(old_stps[i], alpha=float(al[i] - be_i))
            if prev_flat_grad is None:
                prev_flat_grad = flat_grad.clone()
            else:
                prev_flat_grad.copy_(flat_grad)
            prev_loss = loss

            # the step length
            if state["n_iter"] == 1:
                # min(1, 1 / |g|_1) * lr: a tensor product (in the dtype) when
                # the reciprocal wins, a Python one otherwise
                inv = om(1.0) / _scalar(flat_grad.abs().sum())
                t = (inv if inv < 1.0 else 1.0) * lr
            else:
                t = lr
            gtd = _scalar(flat_grad.dot(d))
            if gtd > -tol_change:
                break

            evals = 0
            if line_search is not None:
                x_init = self._clone_param()

                def obj_func(x, step, direction):
                    return self._directional_evaluate(closure, x, step, direction)
                loss, flat_grad, t, evals = _strong_wolfe(obj_func, x_init, t, d, loss,
                                                          flat_grad, gtd,
                                                          max_ls=max_eval - current_evals)
                self._add_grad(t, d)
                opt_cond = _scalar(flat_grad.abs().max()) <= tol_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = float(closure())
                    flat_grad = self._gather_flat_grad()
                    opt_cond = _scalar(flat_grad.abs().max()) <= tol_grad
                    evals = 1
            current_evals += evals
            state["func_evals"] += evals

            if n_iter == max_iter or current_evals >= max_eval or opt_cond:
                break
            if _scalar(d.mul(t).abs().max()) <= tol_change:
                break
            if abs(loss - prev_loss) < tol_change:
                break

        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=H_diag,
                     prev_flat_grad=prev_flat_grad, prev_loss=prev_loss)
        return orig_loss

    def state_dict(self):
        state = {0: dict(self.state[self._params[0]])} if self.state else {}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self._params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict):
        saved = state_dict["param_groups"][0]
        self.param_groups[0].update({k: v for k, v in saved.items() if k != "params"})
        self.state = {self._params[0]: dict(state_dict["state"][0])} \
            if state_dict["state"] else {}

    def __repr__(self):
        g = self.param_groups[0]
        lines = [f"    {k}: {g[k]}" for k in sorted(g) if k != "params"]
        return "LBFGS (\nParameter Group 0\n" + "\n".join(lines) + "\n)"
