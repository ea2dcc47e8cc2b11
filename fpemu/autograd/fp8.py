"""FP8 training recipes for ``nn.Linear``: delayed, current, block and MX scaling.

Inside ``with fp8_autocast(fp8_recipe=...):`` every ``nn.Linear`` runs its
three GEMMs (forward, input gradient, weight gradient) as scaled fp8 GEMMs:
each operand is multiplied by its scale, cast to fp8 with saturation, the
GEMM runs through :mod:`fpemu.accumulate` (``h100-fp8`` by default) and its
fp32 result is multiplied by the inverse scales. The recipes follow
TransformerEngine (``papers.md`` §3):

* :class:`DelayedScaling`: one scale per tensor from an amax history
  (length 1024, ``max`` or ``most_recent``), ``scale = fp8_max * 2**-margin /
  amax`` computed *after* the step that used the old scale; a zero, inf or
  NaN amax keeps the old scale; an infinite scale becomes FLT_MAX; the history
  rolls as TE's ``delayed_scaling.cu`` rolls it (slot 0 stages the newest
  amax; after the update the window shifts and slot 0 is zeroed). Forward
  scales update when ``fp8_autocast`` exits, the gradient's after backward.
* :class:`Float8CurrentScaling`: the amax of the tensor itself, TE's
  ``compute_scale_from_amax`` (inf / 0 / NaN amax: scale 1; inf scale:
  FLT_MAX; optional power-of-two scales, rounded down).
* :class:`Float8BlockScaling`: 1x128 blocks for activations and gradients,
  128x128 for weights, power-of-two scales; E4M3 everywhere; the GEMM adds
  each 128-block's partial product into fp32 with its two scales (DeepSeek-V3).
* :class:`MXFP8BlockScaling`: 1x32 blocks with E8M0 (power-of-two) scales;
  ``scale_rounding`` ``"up"`` (TransformerEngine MXFP8: nothing overflows),
  ``"down"`` (OCP MX / microxcaling: floor(log2 amax) - emax, then
  saturate), ``"nearest"`` (ml_dtypes' float -> E8M0 cast of amax / fp8_max).

``fp8_format``: ``Fp8Format.HYBRID`` (E4M3 forward, E5M2 gradients) or
``Fp8Format.E4M3`` (everywhere). Casts saturate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum

import numpy as np

from .. import accumulate as _acc
from ..formats import e4m3fn, e5m2, e8m0
from ..quantize import quantize
from ._autocast import cast_inputs
from ._core import _result, _store, result_type
from ._state import State

FLT_MAX = np.float32(np.finfo(np.float32).max)
_f = np.float32


class Fp8Format(enum.Enum):
    """TransformerEngine's fp8 formats of a recipe (``Format`` in
    ``transformer_engine.common.recipe``; fpemu names it ``Fp8Format`` so that
    it does not clash with :class:`fpemu.Format`, and keeps ``Format`` as an
    alias for TransformerEngine code)."""

    E4M3 = "E4M3"
    HYBRID = "HYBRID"
    E5M2 = "E5M2"


Format = Fp8Format


def _check_format(fmt):
    fmt = Fp8Format(fmt) if not isinstance(fmt, Fp8Format) else fmt
    if fmt is Fp8Format.E5M2:
        raise ValueError("Pure E5M2 training is not supported; use Fp8Format.HYBRID (E4M3 "
                         "forward, E5M2 backward) or Fp8Format.E4M3")
    return fmt


@dataclasses.dataclass
class _Recipe:
    accumulate_model: str = "h100-fp8"
    split_accumulator: tuple = (False, True, True)

    def formats(self):
        fwd = e4m3fn
        bwd = e5m2 if self.fp8_format is Fp8Format.HYBRID else e4m3fn
        return fwd, bwd

    def quantize(self, X, fmt, role, state=None):
        """Quantize a (rows, K) float32 array for a GEMM over K: returns (q,
        scale_inv, bk), the fp8 values, inverse scales of shape (rows, number
        of K blocks) and the K block length."""
        raise NotImplementedError(f"{type(self).__name__} is not a scaling recipe: use "
                                  f"DelayedScaling, Float8CurrentScaling, Float8BlockScaling "
                                  f"or MXFP8BlockScaling, or define quantize() in a subclass")

    def transpose(self, X, q, sinv, fmt, role, state=None):
        """The operand of a GEMM over the other axis of X (dgrad, wgrad):
        block recipes quantize X.T again, with blocks along its rows."""
        return self.quantize(np.ascontiguousarray(X.T), fmt, role + "_t")


class _PerTensorRecipe(_Recipe):
    def transpose(self, X, q, sinv, fmt, role, state=None):
        """One scale for the whole tensor: the transpose reuses the fp8 values."""
        return (np.ascontiguousarray(q.T), np.full((X.shape[1], 1), sinv[0, 0], np.float32),
                max(1, X.shape[0]))


@dataclasses.dataclass
class DelayedScaling(_PerTensorRecipe):
    """TE's ``DelayedScaling(margin=0, fp8_format=HYBRID, amax_history_len=1024,
    amax_compute_algo="max")``. ``split_accumulator`` (fprop, dgrad, wgrad)
    promotes partial sums into fp32 every 128 products, TE's defaults."""

    margin: int = 0
    fp8_format: Fp8Format = Fp8Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got "
                             f"{self.amax_compute_algo!r}")
        if not (isinstance(self.amax_history_len, int) and self.amax_history_len >= 1):
            raise ValueError(f"amax_history_len must be an int >= 1, got "
                             f"{self.amax_history_len!r}")

    def quantize(self, X, fmt, role, state=None):
        """The scale of the delayed state for ``role``; records this amax."""
        R, K = X.shape
        absx = np.abs(X.astype(np.float32))
        st = state[role]
        st.record(np.max(absx) if absx.size else 0.0)
        q = _cast(X, np.full((R, 1), st.scale, np.float32), fmt)
        return q, np.full((R, 1), st.scale_inv, np.float32), max(K, 1)


@dataclasses.dataclass
class Float8CurrentScaling(_PerTensorRecipe):
    fp8_format: Fp8Format = Fp8Format.HYBRID
    power_2_scale: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)

    def quantize(self, X, fmt, role, state=None):
        """One scale from this tensor's amax."""
        R, K = X.shape
        absx = np.abs(X.astype(np.float32))
        amax = np.max(absx) if absx.size else _f(0)
        scale = scale_from_amax(amax, fmt.max, self.power_2_scale, self.amax_epsilon)
        q = _cast(X, np.full((R, 1), scale, np.float32), fmt)
        return q, np.full((R, 1), _f(_f(1) / scale), np.float32), max(K, 1)


@dataclasses.dataclass
class Float8BlockScaling(_Recipe):
    fp8_format: Fp8Format = Fp8Format.E4M3
    block: int = 128

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)

    def quantize(self, X, fmt, role, state=None):
        """Power-of-two scales per 1 x block tile (activations, gradients) or
        block x block tile (weights)."""
        R, K = X.shape
        absx = np.abs(X.astype(np.float32))
        bk = self.block
        spans = _blocks(K, bk)
        tile_rows = bk if role == "weight" else 1
        sinv = np.empty((R, len(spans)), np.float32)
        scales = np.empty((R, K), np.float32)
        for j, (s, e) in enumerate(spans):
            for r0 in range(0, R, tile_rows):
                r1 = min(R, r0 + tile_rows)
                amax = np.max(absx[r0:r1, s:e]) if e > s else 0.0
                sc = scale_from_amax(amax, fmt.max, power_2_scale=True)
                scales[r0:r1, s:e] = sc
                sinv[r0:r1, j] = _f(_f(1) / sc)
        return _cast(X, scales, fmt), sinv, bk


@dataclasses.dataclass
class MXFP8BlockScaling(_Recipe):
    fp8_format: Fp8Format = Fp8Format.E4M3
    block: int = 32
    scale_rounding: str = "up"

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)
        if self.scale_rounding not in ("up", "down", "nearest"):
            raise ValueError(f"scale_rounding must be 'up' (TransformerEngine), 'down' (OCP) "
                             f"or 'nearest' (ml_dtypes), got {self.scale_rounding!r}")

    def quantize(self, X, fmt, role, state=None):
        """E8M0 scales per 1 x block, elements x / 2**e saturated (exact
        power-of-two scaling)."""
        R, K = X.shape
        absx = np.abs(X.astype(np.float32))
        spans = _blocks(K, self.block)
        sinv = np.empty((R, len(spans)), np.float32)
        q = np.empty((R, K), np.float32)
        for j, (s, e) in enumerate(spans):
            amax = absx[:, s:e].max(axis=1) if e > s else np.zeros(R)
            ex = mx_scale_exponent(amax, fmt, self.scale_rounding)
            sinv[:, j] = np.ldexp(np.float32(1), ex)
            with np.errstate(over="ignore"):
                q[:, s:e] = quantize(np.ldexp(X[:, s:e].astype(np.float64), -ex[:, None]), fmt,
                                     overflow="saturate")
        return q, sinv, self.block


_RECIPES = (DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling)


def active_recipe():
    """The recipe of the innermost enabled ``fp8_autocast``, or None."""
    return State.fp8[-1][0] if State.fp8 and State.fp8[-1][0] is not None else None


@contextlib.contextmanager
def fp8_autocast(enabled=True, fp8_recipe=None):
    """Run ``nn.Linear`` GEMMs in fp8 under ``fp8_recipe`` (default
    ``DelayedScaling()``); delayed forward scales update on exit."""
    recipe = (fp8_recipe if fp8_recipe is not None else DelayedScaling()) if enabled else None
    if recipe is not None and not isinstance(recipe, _RECIPES):
        raise TypeError(f"fp8_recipe must be one of DelayedScaling, Float8CurrentScaling, "
                        f"Float8BlockScaling, MXFP8BlockScaling; got {type(recipe).__name__}")
    used = []
    State.fp8.append((recipe, used))
    try:
        yield recipe
    finally:
        State.fp8.pop()
        for state in used:
            for role in ("input", "weight"):
                if role in state:
                    state[role].update()


# ------------------------------------------------------------------- scales
def scale_from_amax(amax, fp8_max, power_2_scale=False, epsilon=0.0):
    """TE's ``compute_scale_from_amax``: fp8_max / amax in float32; amax
    below epsilon is epsilon; inf, 0 or NaN amax gives 1; an infinite scale
    gives FLT_MAX; power_2_scale rounds down by zeroing the mantissa."""
    amax = _f(amax)
    if amax < _f(epsilon):
        amax = _f(epsilon)
    if not np.isfinite(amax) or amax == 0:
        return _f(1.0)
    with np.errstate(over="ignore"):
        scale = _f(_f(fp8_max) / amax)
    if np.isinf(scale):
        scale = FLT_MAX
    if power_2_scale:
        scale = np.array(scale, np.float32).view(np.uint32) & np.uint32(0xFF800000)
        scale = _f(scale.view(np.float32))
    return scale


@dataclasses.dataclass
class DelayedState:
    """One tensor's delayed-scaling state: amax history, scale, scale_inv."""

    history: np.ndarray
    scale: np.float32
    scale_inv: np.float32
    fp8_max: float
    margin: int
    algo: str

    @classmethod
    def new(cls, recipe, fp8_max):
        return cls(np.zeros(recipe.amax_history_len, np.float32), _f(1), _f(1), fp8_max,
                   recipe.margin, recipe.amax_compute_algo)

    def record(self, amax):
        self.history[0] = np.fmax(self.history[0], _f(amax))

    def update(self):
        """TE ``amax_and_scale_update``: roll, pick the amax, new scale."""
        h = self.history
        last = h[0]
        window = np.concatenate([h[1:], [last]])
        amax = np.fmax.reduce(np.concatenate([[_f(0)], window])) if self.algo == "max" else last
        new = window.copy()
        new[0] = 0
        self.history = new.astype(np.float32)
        scaled_max = _f(_f(self.fp8_max) * _f(2.0 ** -self.margin))
        if np.isfinite(amax) and amax > 0:
            with np.errstate(over="ignore"):
                scale = _f(scaled_max / _f(amax))
            if np.isinf(scale):
                scale = FLT_MAX
            self.scale = scale
        self.scale_inv = _f(_f(1) / self.scale)


def mx_scale_exponent(amax, fmt, rounding):
    """The E8M0 exponent of one MX block with this amax (clamped to
    [-127, 127]); zero blocks get 2**-127."""
    amax = np.asarray(amax, np.float64)
    emax_elem = int(np.floor(np.log2(fmt.max)))
    with np.errstate(divide="ignore", invalid="ignore"):
        if rounding == "down":
            e = np.floor(np.log2(np.where(amax > 0, amax, 2.0 ** -126))) - emax_elem
        elif rounding == "up":
            x = (amax.astype(np.float32) / np.float32(fmt.max)).astype(np.float64)
            m, ex = np.frexp(np.where(x > 0, x, 1.0))       # x = m * 2**ex, m in [0.5, 1)
            e = np.where(m == 0.5, ex - 1, ex).astype(np.float64)
            e = np.where(x > 0, e, -127)
        else:
            x = (amax.astype(np.float32) / np.float32(fmt.max))
            v = quantize(np.where(x > 0, x, 2.0 ** -127), e8m0)
            e = np.log2(v.astype(np.float64))
    return np.clip(e, -127, 127).astype(np.int64)


# ------------------------------------------------------------- quantization
def _blocks(K, bk):
    return [(s, min(K, s + bk)) for s in range(0, K, bk)] or [(0, 0)]


def _cast(X, scale, fmt):
    with np.errstate(over="ignore", invalid="ignore"):
        return quantize(X.astype(np.float32) * scale.astype(np.float32),
                        fmt, overflow="saturate")


def quantize_operand(X, fmt, recipe, role, state=None):
    """Quantize a (rows, K) float32 array for a GEMM over K under ``recipe``
    (its :meth:`quantize`). Returns (q, scale_inv, bk)."""
    if not isinstance(recipe, _Recipe):
        raise TypeError(f"expected an fp8 recipe, got {type(recipe).__name__}")
    return recipe.quantize(X, fmt, role, state)


def scaled_gemm(qa, sa, qb, sb, bk, fmt_a, fmt_b, model, split):
    """sum over K blocks of (qa_blk @ qb_blk.T) * sa_blk * sb_blk, in fp32.

    qa (M, K), qb (N, K) fp8 values; sa (M, nK), sb (N, nK) inverse scales.
    Each block's GEMM runs under ``model`` (promoted into fp32 every 128
    products when ``split``)."""
    M, K = qa.shape
    N = qb.shape[0]
    in_fmt = fmt_a if fmt_a == fmt_b else e5m2       # mixed E4M3 x E5M2: the wider range
    out = np.zeros((M, N), np.float32)
    for j, (s, e) in enumerate(_blocks(K, bk)):
        if e == s:
            continue
        if split and e - s > 128:
            part = _acc._matmul_values(qa[:, s:e], qb[:, s:e].T, in_fmt, "fp32", "fp32",
                                       "blocked", 128, model)
        else:
            part = _acc._matmul_values(qa[:, s:e], qb[:, s:e].T, in_fmt, "fp32", "fp32", model)
        alpha = (sa[:, j][:, None] * sb[:, j][None, :]).astype(np.float32)
        with np.errstate(all="ignore"):
            out = out + part.astype(np.float32) * alpha
    return out


def fp8_linear(module, x, recipe):
    """y = x @ W.T + b with the recipe's three scaled fp8 GEMMs."""
    weight, bias = module.weight, module.bias
    x, weight, bias = cast_inputs("linear", x, weight, bias)
    dt = result_type(x, weight)
    fwd_fmt, bwd_fmt = recipe.formats()
    state = None
    if isinstance(recipe, DelayedScaling):
        state = module.fp8_state
        if state is None or state.get("recipe") is not recipe:
            state = {"recipe": recipe,
                     "input": DelayedState.new(recipe, fwd_fmt.max),
                     "weight": DelayedState.new(recipe, fwd_fmt.max),
                     "grad_output": DelayedState.new(recipe, bwd_fmt.max)}
            module.fp8_state = state
        if State.fp8 and all(s is not state for s in State.fp8[-1][1]):
            State.fp8[-1][1].append(state)
    X = x._a.reshape(-1, x.shape[-1]).astype(np.float32)
    W = weight._a.astype(np.float32)
    fprop, dgrad, wgrad = recipe.split_accumulator
    qx, sx, bk = quantize_operand(X, fwd_fmt, recipe, "input", state)
    qw, sw, _ = quantize_operand(W, fwd_fmt, recipe, "weight", state)
    acc = scaled_gemm(qx, sx, qw, sw, bk, fwd_fmt, fwd_fmt, recipe.accumulate_model, fprop)
    if bias is not None:
        acc = acc + bias._a.astype(np.float32)
    out = _store(acc, dt).reshape(x.shape[:-1] + (W.shape[0],))

    def backward(g):
        G = g.reshape(-1, g.shape[-1]).astype(np.float32)
        if state is not None:
            qg, sg, bkg = quantize_operand(G, bwd_fmt, recipe, "grad_output", state)
            state["grad_output"].update()
        else:
            qg, sg, bkg = quantize_operand(G, bwd_fmt, recipe, "grad_output")
        gx = gw = gb = None
        if x.requires_grad:                               # dgrad: K = out features
            qwt, swt, _ = recipe.transpose(W, qw, sw, fwd_fmt, "weight", state)
            gx = _store(scaled_gemm(qg, sg, qwt, swt, bkg, bwd_fmt, fwd_fmt,
                                    recipe.accumulate_model, dgrad), dt).reshape(x.shape)
        if weight.requires_grad:                          # wgrad: K = batch
            qgt, sgt, bkt = recipe.transpose(G, qg, sg, bwd_fmt, "grad_output", state)
            qxt, sxt, _ = recipe.transpose(X, qx, sx, fwd_fmt, "input", state)
            gw = _store(scaled_gemm(qgt, sgt, qxt, sxt, bkt, bwd_fmt, fwd_fmt,
                                    recipe.accumulate_model, wgrad), weight.dtype)
        if bias is not None and bias.requires_grad:
            gb = _store(G.astype(np.float64).sum(axis=0), bias.dtype)
        return gx, gw, gb

    return _result(out, dt, (x, weight, bias), backward)


__all__ = ["Fp8Format", "Format", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
           "MXFP8BlockScaling", "fp8_autocast", "scale_from_amax", "mx_scale_exponent",
           "quantize_operand", "scaled_gemm", "DelayedState"]
