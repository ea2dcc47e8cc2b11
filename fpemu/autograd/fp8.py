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
* :class:`MXFP8BlockScaling`: 1x32 blocks (``block_2d_weights``: 32x32
  weight tiles) with E8M0 (power-of-two) scales; ``scale_rule`` one of
  :data:`fpemu.block.MX_RULES` (``"rceil"``, the default, is
  TransformerEngine MXFP8: nothing overflows; ``"floor"`` is OCP MX /
  microxcaling: floor(log2 amax) - emax, then saturate) or ``"nearest"``
  (ml_dtypes' float -> E8M0 cast of amax / fp8_max). The GEMMs run on
  Blackwell's ``b200-mxf8f6f4`` model.
* :class:`NVFP4BlockScaling`: TransformerEngine's NVFP4 recipe: e2m1 with
  e4m3 scales per 16 and an fp32 tensor scale (:mod:`fpemu.block`); weights
  in 16x16 tiles, the wgrad operands through the 16-point random Hadamard
  transform, gradients with 8-bit stochastic rounding; GEMMs on
  ``b200-mxf4nvf4``.

Every recipe takes ``high_precision_modules``: modules whose ``nn.Linear``
layers (themselves or inside them) keep running in high precision, as the
NVFP4 paper keeps the first and last blocks of its model in BF16.

``fp8_format``: ``Fp8Format.HYBRID`` (E4M3 forward, E5M2 gradients) or
``Fp8Format.E4M3`` (everywhere). Casts saturate.

Every recipe's ``quantize`` returns its operand as one type,
:class:`fpemu.block.BlockQuantized`: element codes, scale codes (fp32
decode scales per row and K block for the per-tensor and fp8 block recipes,
E8M0 for MX, E4M3 with a tensor scale and its amax for NVFP4), the block
and the rule; one :meth:`gemm` takes two of them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import warnings

import numpy as np

from .. import accumulate as _acc
from ..block import FP4_RULES, MX_RULES, BlockQuantized, hadamard, quantize_blocks
from ..block.host import OPS as _HOST_OPS
from ..block.rules import array_namespace, mx_exponent, te_scale
from ..formats import e2m1, e4m3fn, e5m2, e8m0, fp32
from ..quantize import decode, encode
from ._autocast import cast_inputs
from ._cpu_fp8 import k_block_epilogue_stacked
from ._core import _result, _store, result_type
from ._state import State

FLT_MAX = np.float32(np.finfo(np.float32).max)
_f = np.float32
_NP = array_namespace("numpy")

#: TransformerEngine's NVFP4 GEMM epilogue divides the product of the two
#: tensor amaxes by (e2m1 max * e4m3 max)**2: alpha = amax_a * amax_b / this.
NVFP4_ALPHA_DIVISOR = _f(e2m1.max * e2m1.max * e4m3fn.max * e4m3fn.max)


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


@dataclasses.dataclass(frozen=True)
class OperandPlan:
    """How a recipe quantizes one GEMM operand (a (rows, K) array, blocks
    along K): the element format, the scale format, the block (an int: 1 x
    block along K; a pair: 2-D tiles; None: one scale for the whole tensor,
    which :meth:`Recipe.tensor_scale` gives), the scale rule (a rule of
    :mod:`fpemu.block`, or ``"delayed"`` / ``"current"`` / ``"pow2"`` for the
    per-tensor recipes), the element rounding and its seed, and whether the
    random Hadamard transform comes first. Both drivers run it: the host
    (:meth:`Recipe.quantize`) and the device (``fpemu.torch.emulate``)."""

    role: str
    elem: object
    scale_fmt: object
    block: object
    scale_rule: str
    rounding: str = "rne"
    seed: object = None
    rht: bool = False


@dataclasses.dataclass
class Recipe:
    """What every recipe shares: the accumulation model of its GEMMs, TE's
    split accumulator per GEMM (fprop, dgrad, wgrad), the modules left in
    high precision; :meth:`operand_plan` (how each operand is quantized) and
    :meth:`epilogue` (what the GEMM does after accumulating) define a recipe,
    and :meth:`quantize` and :meth:`gemm` run them on the host."""

    accumulate_model: str = "h100-fp8"
    split_accumulator: tuple = (False, True, True)
    high_precision_modules: tuple = ()

    #: Whether the recipe keeps state between steps (:meth:`new_state`).
    stateful = False

    def keeps_high_precision(self, module):
        """Whether ``module`` is, or sits inside, one of
        ``high_precision_modules`` (it then skips the recipe)."""
        for m in self.high_precision_modules:
            if m is module or any(sub is module for sub in m.modules()):
                return True
        return False

    def formats(self):
        fwd = e4m3fn
        bwd = e5m2 if self.fp8_format is Fp8Format.HYBRID else e4m3fn
        return fwd, bwd

    def role_format(self, role):
        """The element format of an operand role: forward roles (input,
        weight) the forward format, grad_output the backward one."""
        fwd, bwd = self.formats()
        return bwd if role.startswith("grad_output") else fwd

    def new_state(self):
        """The per-layer state of a stateful recipe (None: stateless)."""
        return None

    def operand_plan(self, role, shape, fmt=None):
        """The :class:`OperandPlan` of operand ``role`` (``"input"``,
        ``"weight"``, ``"grad_output"``, and ``"..._t"`` for the transposes
        of dgrad and wgrad) of a (rows, K) array of ``shape``; ``fmt``
        overrides the element format."""
        raise NotImplementedError(f"{type(self).__name__} is not a scaling recipe: use one of "
                                  f"{', '.join(c.__name__ for c in RECIPE_CLASSES)}, or define "
                                  f"operand_plan() in a subclass")

    def tensor_scale(self, plan, amax, state=None):
        """(scale, scale_inv) in float32 of a per-tensor plan (``plan.block``
        None) for an operand of this amax."""
        raise NotImplementedError(
            f"{type(self).__name__}.operand_plan returned a plan with block=None (one scale "
            f"for the tensor) for role {plan.role!r}, but the recipe does not define "
            "tensor_scale(plan, amax, state); define it (return the float32 scale and its "
            "inverse), or give the plan a block")

    def epilogue(self, a, b):
        """The float32 factor ``alpha`` the GEMM's epilogue multiplies the
        accumulator by (NVFP4: the product of the two tensor amaxes over
        :data:`NVFP4_ALPHA_DIVISOR`), or None."""
        if a.tensor_amax is None:
            return None
        return _f(_f(_f(a.tensor_amax) * _f(b.tensor_amax)) / NVFP4_ALPHA_DIVISOR)

    def gemm(self, a, b, split):
        """``a @ b.T`` in float32 for two quantized operands (each a
        :class:`BlockQuantized` of shape (rows, K), blocks along K):
        block-scaled tensor cores take the codes and scales as they are
        (E8M0 on ``b200-mxf8f6f4``, E4M3 with the tensor amaxes on
        ``b200-mxf4nvf4``), then the :meth:`epilogue`; other models multiply
        each K block's GEMM by its two scales in fp32 (:func:`scaled_gemm`,
        promoted every 128 products when ``split``)."""
        model = self.accumulate_model
        ca, sa, bk = _rowwise(a)
        cb, sb, _ = _rowwise(b)
        tensor_core = a.scale_fmt.name == "e4m3fn" or (
            a.scale_fmt.name == "e8m0" and model in _acc.BLOCK_SCALED_CORES)
        if tensor_core:
            return _acc.scaled_matmul(ca, sa, np.ascontiguousarray(cb.T),
                                      np.ascontiguousarray(sb.T), a.elem, b.elem, a.scale_fmt,
                                      block=bk, model=model, alpha=self.epilogue(a, b))
        return scaled_gemm(decode(ca, a.elem), decode(sa, a.scale_fmt).astype(np.float32),
                           decode(cb, b.elem), decode(sb, b.scale_fmt).astype(np.float32),
                           bk, a.elem, b.elem, model, split)

    def quantize(self, X, fmt, role, state=None):
        """Quantize a (rows, K) float32 array for a GEMM over K by its
        :meth:`operand_plan`: a :class:`BlockQuantized` with blocks along K."""
        X = np.asarray(X, np.float32)
        return run_plan(self, self.operand_plan(role, X.shape, fmt), X, state)

    def transpose(self, X, q, fmt, role, state=None):
        """The operand of a GEMM over the other axis of X (dgrad, wgrad):
        a per-tensor scale reuses the codes; block recipes quantize X.T
        again, with blocks along its rows."""
        return transpose_plan(self, np.asarray(X, np.float32), q, fmt, role, state)


class PlanOps:
    """How :func:`run_plan` and :func:`transpose_plan` touch arrays: the
    host's (NumPy arrays, :mod:`fpemu.block`, :class:`BlockQuantized`);
    ``fpemu.torch.emulate`` hands them its device's. ``reads_transposed``:
    the blocks of an operand's transpose can be read where the operand lies
    (1-D blocks along its first axis); ``tiles_transpose``: a 2-D tiled
    operand rounded to nearest transposes as its tiles (the same tiles,
    codes and scales). A backend with either gives ``transposed(q)``, the
    blocks of ``q`` transposed."""

    reads_transposed = tiles_transpose = False

    @staticmethod
    def amax(X):
        """The largest magnitude in X, as a float32 (NaN propagates)."""
        return _f(np.max(np.abs(X))) if X.size else _f(0)

    @staticmethod
    def cast(X, scale, fmt):
        """The codes of fp32(X * scale), saturated."""
        with np.errstate(over="ignore", invalid="ignore"):
            return encode(X.astype(np.float32) * _f(scale), fmt, overflow="saturate")

    @staticmethod
    def per_row(codes, sinv, fmt, bk, rule, source=None):
        """The operand with one fp32 decode scale per row and K block of
        length ``bk`` (``sinv``: a float32 number for every row, or the
        per-row, per-block scale values; a 128 x 128 weight tile repeats its
        scale on each of its rows); ``source``: the operand whose transposed
        codes these are (a backend may reuse what it holds)."""
        if np.ndim(sinv) == 0:
            sinv = np.full((codes.shape[0], 1), sinv, np.float32)
        return BlockQuantized(codes, encode(sinv, fp32), elem=fmt, scale_fmt=fp32, block=bk,
                              axis=1, scale_rule=rule)

    @staticmethod
    def hadamard(X):
        return hadamard(X, 16, axis=1, signs="te")

    @staticmethod
    def quantize_blocks(X, plan, axis):
        return quantize_blocks(X, plan.elem, plan.scale_fmt, plan.block, axis=axis,
                               scale_rule=plan.scale_rule, rounding=plan.rounding,
                               seed=plan.seed)

    @staticmethod
    def decode(codes, fmt):
        return decode(codes, fmt)

    @staticmethod
    def repeat_rows(a, n):
        return np.repeat(a, n, axis=0)

    @staticmethod
    def transpose_array(X):
        return np.ascontiguousarray(X.T)

    @staticmethod
    def transpose_codes(q):
        return np.ascontiguousarray(q.codes.T)


#: The host's :class:`PlanOps`.
HOST_PLAN_OPS = PlanOps()


def run_plan(recipe, plan, X, state=None, ops=HOST_PLAN_OPS, transposed=False):
    """The driver of an :class:`OperandPlan`, on the host (``ops`` the host's
    :class:`PlanOps`) and on a torch device (``fpemu.torch.emulate``'s): X
    (rows, K, float32) quantized as ``recipe`` plans it (one scale for the
    tensor, or :func:`fpemu.block.quantize_blocks` along K, fp32 block scales
    turned into one decode scale per row and K block). ``transposed``: the
    operand is ``X.T``, its 1-D blocks read along X's first axis where X lies
    where ``ops.reads_transposed`` (the blocks, their codes and scales are
    the same)."""
    if transposed and not (ops.reads_transposed and isinstance(plan.block, int)
                           and not plan.rht):
        X, transposed = ops.transpose_array(X), False
    R, K = X.shape[::-1] if transposed else X.shape
    if plan.block is None:
        scale, sinv = recipe.tensor_scale(plan, ops.amax(X), state)
        return ops.per_row(ops.cast(X, scale, plan.elem), _f(sinv), plan.elem, max(K, 1),
                           plan.scale_rule)
    if plan.rht:
        X = ops.hadamard(X)
    q = ops.quantize_blocks(X, plan, 0 if transposed else 1)
    if transposed:
        q = ops.transposed(q)
    if plan.scale_fmt.name != "fp32":
        return q
    sinv = ops.decode(q.scales, fp32)
    if isinstance(plan.block, tuple):                  # a tile's scale on each of its rows
        sinv = ops.repeat_rows(sinv, plan.block[0])[:R]
    bk = plan.block[1] if isinstance(plan.block, tuple) else plan.block
    return ops.per_row(q.codes, sinv, plan.elem, bk, plan.scale_rule)


def transpose_plan(recipe, X, q, fmt, role, state=None, ops=HOST_PLAN_OPS):
    """The operand of a GEMM over X's other axis, X quantized as ``q``
    (``ops`` as in :func:`run_plan`): a per-tensor scale reuses the codes;
    block recipes quantize X.T again (``role + "_t"``), except, where
    ``ops.tiles_transpose``, 2-D tiles rounded to nearest, whose transpose
    is the same tiles (quantizing X.T again gives them bit for bit)."""
    R, K = X.shape
    plan = recipe.operand_plan(role + "_t", (K, R), fmt)
    if plan.block is None:
        sinv0 = _f(np.asarray(ops.decode(q.scales[:1, :1], fp32)).reshape(()))
        return ops.per_row(ops.transpose_codes(q), sinv0, fmt, max(1, R), q.scale_rule,
                           source=q)
    if ops.tiles_transpose and isinstance(q.block, tuple) and q.rounding == "rne":
        return ops.transposed(q)
    return run_plan(recipe, plan, X, state, ops, transposed=True)


@dataclasses.dataclass
class DelayedScaling(Recipe):
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

    stateful = True

    def new_state(self):
        """The delayed state of a layer: one :class:`DelayedState` per role."""
        fwd, bwd = self.formats()
        return {"input": DelayedState.new(self, fwd.max), "weight": DelayedState.new(self, fwd.max),
                "grad_output": DelayedState.new(self, bwd.max)}

    def operand_plan(self, role, shape, fmt=None):
        """One scale for the tensor, from the delayed state."""
        return OperandPlan(role, fmt or self.role_format(role), fp32, None, "delayed")

    def tensor_scale(self, plan, amax, state=None):
        """The scale of the delayed state for the role; records this amax."""
        st = state[plan.role]
        st.record(amax)
        return st.scale, st.scale_inv


@dataclasses.dataclass
class Float8CurrentScaling(Recipe):
    fp8_format: Fp8Format = Fp8Format.HYBRID
    power_2_scale: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)

    def operand_plan(self, role, shape, fmt=None):
        """One scale from this tensor's amax."""
        return OperandPlan(role, fmt or self.role_format(role), fp32, None,
                           "pow2" if self.power_2_scale else "current")

    def tensor_scale(self, plan, amax, state=None):
        scale = scale_from_amax(amax, plan.elem.max, self.power_2_scale, self.amax_epsilon)
        return scale, _f(_f(1) / scale)


@dataclasses.dataclass
class Float8BlockScaling(Recipe):
    fp8_format: Fp8Format = Fp8Format.E4M3
    block: int = 128

    def __post_init__(self):
        self.fp8_format = _check_format(self.fp8_format)

    def operand_block(self, role):
        """The block of an operand: block x block tiles for the weight, in
        both orientations (its transpose keeps the tiles and their scales,
        as TransformerEngine's 2-D block scaling does), 1 x block otherwise."""
        return (self.block, self.block) if role.startswith("weight") else self.block

    def operand_plan(self, role, shape, fmt=None):
        """Power-of-two fp32 scales per 1 x block tile (activations,
        gradients) or block x block tile (weights)."""
        return OperandPlan(role, fmt or self.role_format(role), fp32,
                           self.operand_block(role), "pow2")


@dataclasses.dataclass
class MXFP8BlockScaling(Recipe):
    """TE's ``MXFP8BlockScaling(fp8_format=E4M3)``: 1x32 blocks, E8M0 scales.

    ``scale_rule``: ``"rceil"`` (TE: rounded up), ``"floor"`` (OCP),
    ``"ceil"``, ``"even"`` (:mod:`fpemu.block`) or ``"nearest"``
    (ml_dtypes). ``scale_rounding="up"`` / ``"down"``, the older spelling
    of rceil / floor, still works and warns (DeprecationWarning).
    ``block_2d_weights`` quantizes weights in 32x32 tiles, so that W and its
    transpose share scales."""

    fp8_format: Fp8Format = Fp8Format.E4M3
    block: int = 32
    scale_rule: str = "rceil"
    block_2d_weights: bool = False
    accumulate_model: str = "b200-mxf8f6f4"
    scale_rounding: dataclasses.InitVar[str] = None

    _ALIASES = {"up": "rceil", "down": "floor"}

    def __post_init__(self, scale_rounding):
        self.fp8_format = _check_format(self.fp8_format)
        rule = self.scale_rule
        if scale_rounding is not None:
            warnings.warn("MXFP8BlockScaling(scale_rounding=...) is deprecated: pass "
                          f"scale_rule={self._ALIASES.get(scale_rounding, scale_rounding)!r}",
                          DeprecationWarning, stacklevel=3)
            rule = scale_rounding
        rule = self._ALIASES.get(rule, rule)
        if rule not in MX_RULES:
            raise ValueError(f"scale_rule must be one of {', '.join(MX_RULES)} (or "
                             f"scale_rounding 'up' / 'down'), got {rule!r}")
        self.scale_rule = rule

    def operand_plan(self, role, shape, fmt=None):
        """E8M0 scales per 1 x block (or block x block weight tiles),
        elements x / 2**e saturated (exact power-of-two scaling)."""
        return OperandPlan(role, fmt or self.role_format(role), e8m0,
                           self.operand_block(role), self.scale_rule)

    def operand_block(self, role):
        """1 x block, or block x block weight tiles with ``block_2d_weights``."""
        two_d = self.block_2d_weights and role.startswith("weight")
        return (self.block, self.block) if two_d else self.block


@dataclasses.dataclass
class NVFP4BlockScaling(Recipe):
    """TransformerEngine's ``NVFP4BlockScaling`` (NVIDIA, arXiv 2509.25149).

    Every GEMM operand is NVFP4 (:mod:`fpemu.block`, ``scale_rule``
    ``"nvfp4"``: TE's quantizer; ``"nvfp4-torchao"`` or ``"4over6"``):

    ============  ===========================  ==========================
    operand       fprop / dgrad (rowwise)      wgrad (columnwise)
    ============  ===========================  ==========================
    input         1 x 16, nearest              1 x 16, RHT, nearest
    weight        16 x 16 tiles, nearest       the same tiles, transposed
    grad_output   1 x 16, stochastic (sr8)     1 x 16, RHT, stochastic
    ============  ===========================  ==========================

    The switches of TE's ``NVTE_NVFP4_DISABLE_RHT``,
    ``..._STOCHASTIC_ROUNDING`` and ``..._2D_QUANTIZATION`` are the
    ``disable_*`` arguments. The random Hadamard transform uses TE's fixed
    sign vector and needs the number of tokens to be a multiple of 16; the
    stochastic rounding draws ``sr_bits`` bits per element from ``seed``
    and a per-call counter. GEMMs run on Blackwell's ``b200-mxf4nvf4`` with
    ``alpha = amax_a * amax_b / NVFP4_ALPHA_DIVISOR`` (6 * 6 * 448 * 448) in
    float32, as TE.
    """

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    scale_rule: str = "nvfp4"
    sr_bits: int = 8
    seed: int = 0
    accumulate_model: str = "b200-mxf4nvf4"

    def __post_init__(self):
        if self.scale_rule not in FP4_RULES:
            raise ValueError(f"scale_rule must be one of {', '.join(FP4_RULES)}, got "
                             f"{self.scale_rule!r}")
        if not (isinstance(self.sr_bits, int) and 1 <= self.sr_bits <= 32):
            raise ValueError(f"sr_bits must be an int in 1..32, got {self.sr_bits!r}")
        self._calls = 0

    def formats(self):
        return e2m1, e2m1

    def operand_plan(self, role, shape, fmt=None):
        """How the operand ``role`` of a (rows, K) array of ``shape`` is
        quantized (its ``tensor_amax`` feeds the GEMM's alpha); counts the
        call (the stochastic rounding's seed is ``[seed, calls]``)."""
        base = role[:-2] if role.endswith("_t") else role
        rht = role in ("input_t", "grad_output_t") and not self.disable_rht
        sr = base == "grad_output" and not self.disable_stochastic_rounding
        two_d = base == "weight" and not self.disable_2d_quantization
        if rht and shape[1] % 16:
            raise ValueError(f"NVFP4BlockScaling: the random Hadamard transform of the "
                             f"wgrad operands needs the token count to be a multiple of 16 "
                             f"(TransformerEngine's rule), got {shape[1]}; pad the batch "
                             f"or pass disable_rht=True")
        self._calls += 1
        return OperandPlan(role, e2m1, e4m3fn, (16, 16) if two_d else 16, self.scale_rule,
                           f"sr{self.sr_bits}" if sr else "rne",
                           [self.seed, self._calls] if sr else None, rht)


#: The recipe classes (``fp8_autocast(fp8_recipe=)`` takes an instance of one).
RECIPE_CLASSES = (DelayedScaling, Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling,
                  NVFP4BlockScaling)


def active_recipe():
    """The recipe of the innermost enabled ``fp8_autocast``, or None."""
    return State.fp8[-1][0] if State.fp8 and State.fp8[-1][0] is not None else None


@contextlib.contextmanager
def fp8_autocast(enabled=True, fp8_recipe=None):
    """Run ``nn.Linear`` GEMMs in fp8 under ``fp8_recipe`` (default
    ``DelayedScaling()``); delayed forward scales update on exit."""
    recipe = (fp8_recipe if fp8_recipe is not None else DelayedScaling()) if enabled else None
    if recipe is not None and not isinstance(recipe, RECIPE_CLASSES):
        raise TypeError(f"fp8_recipe must be one of "
                        f"{', '.join(c.__name__ for c in RECIPE_CLASSES)}; got "
                        f"{type(recipe).__name__}")
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
    return _f(te_scale(_NP, np.array([amax], np.float32), fp8_max, power_2_scale)[0])


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
    """The E8M0 exponent of MX blocks with these amaxes (int64, clamped to
    [-127, 127]; zero blocks get 2**-127), read from the float32 bits as
    :mod:`fpemu.block` reads them: ``"down"`` its floor rule, ``"up"`` its
    rceil rule, ``"nearest"`` the E8M0 code of ``fp32(amax / fmt.max)``
    rounded to nearest (ml_dtypes' cast)."""
    amax32 = np.asarray(amax, np.float64).astype(np.float32)
    rule = {"down": "floor", "up": "rceil"}.get(rounding, rounding)
    return mx_exponent(_NP, amax32, fmt, rule, _HOST_OPS)[0]


# ------------------------------------------------------------- quantization
def _blocks(K, bk):
    return [(s, min(K, s + bk)) for s in range(0, K, bk)] or [(0, 0)]


def _rowwise(bq):
    """(codes, scale codes with one row per row of codes, K block length) of
    an operand: 2-D tiles repeat their scales down their rows."""
    s = bq.scales
    if isinstance(bq.block, tuple):
        s = np.repeat(s, bq.block[0], axis=0)[:bq.codes.shape[0]]
        return bq.codes, s, bq.block[1]
    return bq.codes, s, bq.block


def quantize_operand(X, fmt, recipe, role, state=None):
    """Quantize a (rows, K) float32 array for a GEMM over K under ``recipe``
    (its :meth:`quantize`): a :class:`BlockQuantized`."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"expected an fp8 recipe, got {type(recipe).__name__}")
    return recipe.quantize(X, fmt, role, state)


def scaled_gemm(qa, sa, qb, sb, bk, fmt_a, fmt_b, model, split):
    """sum over K blocks of (qa_blk @ qb_blk.T) * sa_blk * sb_blk, in fp32.

    qa (M, K), qb (N, K) fp8 values; sa (M, nK), sb (N, nK) inverse scales.
    Each block's GEMM runs under ``model`` (promoted into fp32 every 128
    products when ``split``)."""
    M, K = qa.shape
    N = qb.shape[0]
    in_fmt = (fmt_a, fmt_b)         # each operand aligned with its own format's emin
    plans = {}                      # parsed once per configuration, not per K block

    def parts():
        for j, (s, e) in enumerate(_blocks(K, bk)):
            if e == s:
                continue
            promote = bool(split and e - s > 128)
            if promote not in plans:
                kw = dict(model="blocked", block=128, inner=model) if promote else dict(
                    model=model)
                plans[promote] = _acc.Plan.of(in_fmt, "fp32", "fp32", **kw)
            yield j, plans[promote].matmul(qa[:, s:e], qb[:, s:e].T).astype(np.float32)

    out = k_block_epilogue(parts(), sa, sb)
    if out is None:
        return np.zeros((M, N), np.float32)
    return np.where(np.isnan(out), _acc.CANONICAL_NAN32, out).astype(np.float32)


def k_block_epilogue(parts, sa, sb):
    """The epilogue of a GEMM with fp32 scales per row and K block (the
    host's :func:`scaled_gemm` and ``fpemu.torch.emulate`` both run it): the
    sum over K blocks ``j``, in K order, of ``part_j * (sa[:, j] sb[:, j]^T)``
    in float32, where ``parts`` yields ``(j, part_j)``, the float32 GEMM of
    block j. The first block's scaled result is the accumulator (a negative
    product that underflows stays -0, as on the GPU); later blocks add.
    None for no blocks. NumPy arrays or torch tensors; each ``part_j`` is
    scaled in place (a fresh array, or a slice of one the caller drops)."""
    out = None
    with np.errstate(all="ignore"):
        for j, part in parts:
            part *= sa[:, j:j + 1] * sb[:, j][None, :]
            if out is None:
                out = part
            else:
                out += part
    return out


def fp8_linear(module, x, recipe):
    """y = x @ W.T + b with the recipe's three scaled fp8 GEMMs."""
    weight, bias = module.weight, module.bias
    x, weight, bias = cast_inputs("linear", x, weight, bias)
    dt = result_type(x, weight)
    fwd_fmt, bwd_fmt = recipe.formats()
    state = None
    if recipe.stateful:
        state = module.fp8_state
        if state is None or state.get("recipe") is not recipe:
            state = {"recipe": recipe, **recipe.new_state()}
            module.fp8_state = state
        if State.fp8 and all(s is not state for s in State.fp8[-1][1]):
            State.fp8[-1][1].append(state)
    X = x._a.reshape(-1, x.shape[-1]).astype(np.float32)
    W = weight._a.astype(np.float32)
    fprop, dgrad, wgrad = recipe.split_accumulator
    qx = quantize_operand(X, fwd_fmt, recipe, "input", state)
    qw = quantize_operand(W, fwd_fmt, recipe, "weight", state)
    acc = recipe.gemm(qx, qw, fprop)
    if bias is not None:
        acc = acc + bias._a.astype(np.float32)
    out = _store(acc, dt).reshape(x.shape[:-1] + (W.shape[0],))

    def backward(g):
        G = g.reshape(-1, g.shape[-1]).astype(np.float32)
        qg = quantize_operand(G, bwd_fmt, recipe, "grad_output", state)
        if state is not None:
            state["grad_output"].update()
        gx = gw = gb = None
        if x.requires_grad:                               # dgrad: K = out features
            qwt = recipe.transpose(W, qw, fwd_fmt, "weight", state)
            gx = _store(recipe.gemm(qg, qwt, dgrad), dt).reshape(x.shape)
        if weight.requires_grad:                          # wgrad: K = batch
            qgt = recipe.transpose(G, qg, bwd_fmt, "grad_output", state)
            qxt = recipe.transpose(X, qx, fwd_fmt, "input", state)
            gw = _store(recipe.gemm(qgt, qxt, wgrad), weight.dtype)
        if bias is not None and bias.requires_grad:
            gb = _store(G.astype(np.float64).sum(axis=0), bias.dtype)
        return gx, gw, gb

    return _result(out, dt, (x, weight, bias), backward)


__all__ = ["Fp8Format", "Format", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
           "MXFP8BlockScaling", "NVFP4BlockScaling", "fp8_autocast", "scale_from_amax",
           "mx_scale_exponent", "quantize_operand", "scaled_gemm", "DelayedState",
           "NVFP4_ALPHA_DIVISOR", "Recipe", "OperandPlan", "RECIPE_CLASSES", "run_plan",
           "k_block_epilogue", "k_block_epilogue_stacked"]
