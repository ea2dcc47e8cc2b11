"""Train a real torch model under an emulated low-precision recipe.

``with fpemu.torch.emulate(model, recipe):`` makes every ``nn.Linear`` of
``model`` run its three GEMMs (fprop ``y = x W^T``, dgrad ``dx = dy W``,
wgrad ``dW = dy^T x``) the way the recipe runs them on the hardware it was
written for: each operand quantized as TransformerEngine quantizes it, the
GEMM computed on the tensor's device from the quantized values, TE's epilogue
(per-tensor or per-block scales, NVFP4's ``alpha``) applied in float32. The
rest of the model, the loss, the optimizer and the loop run unchanged.

The recipes are the classes of :mod:`fpemu.autograd.fp8` (one definition of
each rule: which operand gets which block, scale rule, rounding and
transform), plus :class:`GemmRounding` (operands and outputs of each GEMM
rounded to bf16 or fp16). The quantization is ``fpemu.torch.quantize_blocks``
/ ``fpemu.torch.encode``: bit for bit what the host recipe computes for the
same arrays (``tests/test_torch_emulate.py`` compares every operand of a
training step, codes and scales). The GEMM itself runs in float32 on the
device (``torch.matmul``): products of the quantized values are exact in
float32 (an e2m1 or fp8 element times an e4m3 or power-of-two scale has at
most 8 significant bits), so the result differs from the host model's
(``fpemu.accumulate``: the tensor core's alignment and truncation) only by
the summation order and width of float32 accumulation; ``accumulation=`` runs
the host model instead (for small layers: it is Numba on the CPU).

What is not emulated: the GEMM's internal accumulation (above), and anything
outside ``nn.Linear`` (attention's ``matmul``, convolutions), which runs in
the model's own precision.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref

import numpy as np

from .. import accumulate
from .. import block as _b
from ..autograd import fp8 as _fp8
from ..errors import FpemuTypeError, FpemuValueError
from ..formats import format as _lookup
from ..formats import fp32 as _fp32
from . import _blocks
from ._hooked_script import _check_script, run_hooked
from . import _quantize as _q

torch = _q.torch

__all__ = ["emulate", "Emulation", "GemmRounding", "RECIPES", "recipe_of"]

_f = np.float32


@dataclasses.dataclass
class GemmRounding(_fp8.Recipe):
    """Plain low-precision GEMMs without scaling: each operand rounded to
    ``fmt`` (nearest even), the product accumulated in float32, the bias
    added and the result rounded to ``fmt``, as a bf16 / fp16 GEMM with a
    float32 accumulator writes it (``operands=False`` rounds the outputs
    only)."""

    fmt: str = "bf16"
    operands: bool = True

    def __post_init__(self):
        f = _lookup(self.fmt)
        if f.bits > 16 or not f.signed:
            raise FpemuValueError(f"GemmRounding: fmt must be a signed format of at most 16 "
                                  f"bits (bf16, fp16, e4m3fn, ...), got {f.name}")
        self.fmt = f.name


#: Recipe names ``fpemu emulate --recipe`` and :func:`recipe_of` take.
RECIPES = {
    "delayed": _fp8.DelayedScaling, "current": _fp8.Float8CurrentScaling,
    "fp8-block": _fp8.Float8BlockScaling, "mxfp8": _fp8.MXFP8BlockScaling,
    "nvfp4": _fp8.NVFP4BlockScaling,
    "bf16": lambda: GemmRounding("bf16"), "fp16": lambda: GemmRounding("fp16"),
}


def recipe_of(recipe):
    """A recipe object from a recipe, or a name of :data:`RECIPES`."""
    if isinstance(recipe, str):
        key = recipe.lower()
        if key not in RECIPES:
            raise FpemuValueError(f"unknown recipe {recipe!r}; choose one of "
                                  f"{', '.join(RECIPES)}, or pass a recipe object of "
                                  "fpemu.autograd.fp8")
        return RECIPES[key]()
    if not isinstance(recipe, _fp8.RECIPE_CLASSES + (GemmRounding,)):
        classes = ", ".join(c.__name__ for c in _fp8.RECIPE_CLASSES)
        raise FpemuTypeError(
            f"emulate(): recipe must be one of fpemu.autograd.fp8's {classes}, a GemmRounding, "
            f"or a name ({', '.join(RECIPES)}); got {type(recipe).__name__}")
    return recipe


# ------------------------------------------------------------ operands
def _amax(X):
    """max |X| (NaN if X holds one), in one read of X (no |X| tensor)."""
    if not X.numel():
        return 0.0
    lo, hi = torch.aminmax(X)
    return float(torch.maximum(-lo, hi).abs())


#: TransformerEngine's signed 16 x 16 Hadamard matrix (float64), by device.
_HADAMARD = {}


def hadamard(X):
    """``fpemu.block.hadamard(X, 16, axis=1, signs="te")`` on X's device: each
    run of 16 values times TE's signed Hadamard matrix, exact, rounded once
    to float32. The float64 product is exact where the exponent fields of a
    run's nonzero values differ by at most 25 (every product with ±1/4 is a
    multiple of 2**(smallest field - 152) below 2**(largest field - 128), so
    it and every partial sum of 16 fit float64's 53 bits, whatever the
    summation order); the other runs (and those holding inf or NaN) go to the
    host's exact computation."""
    R, K = X.shape
    runs = X.reshape(-1, 16)
    H = _HADAMARD.get(X.device)
    if H is None:
        H = _HADAMARD[X.device] = torch.from_numpy(_b.hadamard_matrix(16, "te")).to(X.device)
    Y = (runs.to(torch.float64) @ H).to(torch.float32)
    # biased exponent fields, from each run's largest and smallest nonzero magnitude
    # bits; a float32 subnormal counts as field 1, whose last bit (2**-149) it
    # shares: all values are multiples of 2**(min field - 150). Zero's bits minus 1,
    # masked, are the largest key, so the smallest nonzero wins (an all-zero run:
    # field 256, above its largest). inf and NaN: field 255
    b = runs.view(torch.int32) & 0x7FFFFFFF
    big = b.amax(dim=1) >> 23
    least = (b - 1).bitwise_and_(0x7FFFFFFF).amin(dim=1)
    small = ((least.to(torch.int64) + 1) >> 23).clamp(min=1)
    hard = (big - small > 25) | (big == 255)
    if bool(hard.any()):
        idx = hard.nonzero().reshape(-1)
        host = _b.hadamard(runs[idx].cpu().numpy(), 16, axis=1, signs="te")
        Y[idx] = torch.from_numpy(host).to(X.device)
    return Y.reshape(R, K)


class _DevicePlanOps(_fp8.PlanOps):
    """The device's :class:`fpemu.autograd.fp8.PlanOps`: the operand plans of
    ``fpemu.autograd.fp8.run_plan`` / ``transpose_plan`` run on a tensor's
    device, as :class:`fpemu.torch.TensorBlocks` with the host's codes and
    scales. A transposed operand's 1-D blocks are read where it lies, and 2-D
    tiles rounded to nearest transpose as they are (:meth:`TensorBlocks.t`)."""

    reads_transposed = tiles_transpose = True

    @staticmethod
    def amax(X):
        return _f(_amax(X))

    @staticmethod
    def cast(X, scale, fmt):
        return _q.encode(X * float(scale), fmt, overflow="saturate")

    @staticmethod
    def per_row(codes, sinv, fmt, bk, rule, source=None):
        """fp8 codes with float32 decode scales, one per row and K block
        (a float32 number: the tensor's, kept as ``cache["tensor_sinv"]``)."""
        tensor_sinv = np.float32(sinv) if np.ndim(sinv) == 0 else None
        if tensor_sinv is not None:
            sinv = torch.full((codes.shape[0], 1), float(sinv), device=codes.device)
        q = _blocks.TensorBlocks(
            codes, _q.encode(sinv, _fp32), clipped=None, elem=fmt, scale_fmt=_fp32, block=bk,
            axis=1, scale_rule=rule, tensor_scale=None, tensor_amax=None, rounding="rne",
            shape=tuple(codes.shape))
        if tensor_sinv is not None:
            q.cache["tensor_sinv"] = tensor_sinv
        if source is not None and "values" in source.cache:
            q.cache["values"] = source.cache["values"].t()     # the forward's, transposed
        return q

    @staticmethod
    def hadamard(X):
        return hadamard(X)

    @staticmethod
    def quantize_blocks(X, plan, axis):
        # with the GEMM's operand values (elements times block scales) from the same pass
        return _blocks.quantize_blocks_scaled(X, plan.elem, plan.scale_fmt, plan.block, axis,
                                              plan.scale_rule, plan.rounding, plan.seed)

    @staticmethod
    def decode(codes, fmt):
        return _q.decode_trusted(codes, fmt)

    @staticmethod
    def repeat_rows(a, n):
        return a.repeat_interleave(n, dim=0)

    @staticmethod
    def transpose_array(X):
        return X.t().contiguous()

    @staticmethod
    def transpose_codes(q):
        return q.codes.t()

    @staticmethod
    def transposed(q):
        if q.scale_fmt.name != "fp32":
            _block_scaled(q)       # the GEMM's values, transposed with the codes (a view)
        return q.t()


_PLAN_OPS = _DevicePlanOps()


def quantize_operand(recipe, X, fmt, role, state=None):
    """The device twin of ``recipe.quantize(X, fmt, role, state)``: a
    (rows, K) float32 tensor quantized for a GEMM over K by the recipe's
    :meth:`~fpemu.autograd.fp8.Recipe.operand_plan`, as a
    :class:`fpemu.torch.TensorBlocks` with the host's codes and scales."""
    return _fp8.run_plan(recipe, recipe.operand_plan(role, tuple(X.shape), fmt), X, state,
                         _PLAN_OPS)


def transpose_operand(recipe, X, q, fmt, role, state=None):
    """The device twin of ``recipe.transpose``: the operand of a GEMM over
    X's other axis (``fpemu.autograd.fp8.transpose_plan``)."""
    return _fp8.transpose_plan(recipe, X, q, fmt, role, state, _PLAN_OPS)


# ----------------------------------------------------------------- GEMMs
def _block_scaled(q):
    """Elements times their block scales, float32 (exact: see the module
    text), without the NVFP4 tensor scale (the epilogue's alpha has it)."""
    if "scaled32" not in q.cache and _q._on_cpu(q.codes) and q.codes.dim() == 2 and \
            q.elem.bits <= 16 and _blocks.float32_exact(q.elem, q.scale_fmt):
        # on the CPU one Numba pass: each code's value times its block's scale
        codes = q.codes.contiguous().numpy().view(q.elem.code_dtype)
        svals = _q.decode_trusted(q.scales, q.scale_fmt).numpy()
        with _q._host_kernels():
            q.cache["scaled32"] = torch.from_numpy(
                _b.host.scaled_values(codes, svals, q.elem, q.block, q.axis))
    if "scaled32" not in q.cache and _q._triton_for(q.codes) is not None and \
            q.codes.dim() == 2 and q.elem.bits <= 16 and \
            _blocks.float32_exact(q.elem, q.scale_fmt):
        # on CUDA one fused Triton kernel: each code's value times its block's scale
        from . import _triton_dequant      # (imports triton: only for the tensors it runs on)
        q.cache["scaled32"] = _triton_dequant.scaled_values(
            q.codes, _q.decode_trusted(q.scales, q.scale_fmt), q.elem, q.block, q.axis)
    if "scaled32" not in q.cache:
        exact32 = _blocks.float32_exact(q.elem, q.scale_fmt)
        v = _blocks._dequantize(q.codes, q.scales, q.elem, q.scale_fmt, q.block, q.axis, None,
                                trusted=True, dtype=torch.float32 if exact32 else torch.float64)
        q.cache["scaled32"] = v.to(torch.float32)
    return q.cache["scaled32"]


def _check_accumulation(recipe, accumulation):
    """``accumulation=`` of :func:`emulate`: None or a model of
    :mod:`fpemu.accumulate`, for a scaled recipe."""
    if accumulation is None:
        return
    known = accumulate.MODELS + tuple(accumulate.BLOCK_SCALED_CORES)
    if not isinstance(accumulation, str) or accumulation not in known:
        raise FpemuValueError(f"emulate(accumulation=...) names a model of fpemu.accumulate "
                              f"({', '.join(known)}), got {accumulation!r}")
    if isinstance(recipe, GemmRounding):
        raise FpemuValueError("emulate(accumulation=...) runs a scaled recipe's GEMMs on the "
                              "host; GemmRounding has none: drop it")


def gemm(recipe, qa, qb, split=False, accumulation=None):
    """``a @ b.T`` (float32) of two quantized operands, on their device:
    block-scaled operands (E8M0, E4M3 scales) multiplied as their exact
    float32 values, then NVFP4's ``alpha = amax_a amax_b / (6*6*448*448)``;
    fp32-scaled ones per K block, each partial product times its two
    scales, added in K order (``fpemu.autograd.fp8.scaled_gemm``).
    ``accumulation``: run the host recipe's GEMM with that
    :mod:`fpemu.accumulate` model instead."""
    if accumulation is not None:
        host = copy.copy(recipe)
        host.accumulate_model = accumulation
        out = host.gemm(qa.numpy(), qb.numpy(), split)
        return torch.from_numpy(np.ascontiguousarray(out)).to(qa.codes.device)
    if qa.scale_fmt.name != "fp32":
        acc = _block_scaled(qa) @ _block_scaled(qb).t()
        alpha = recipe.epilogue(qa, qb)
        return acc if alpha is None else acc * float(alpha)
    A, B = _values(qa), _values(qb)
    if "tensor_sinv" in qa.cache and "tensor_sinv" in qb.cache:
        # one K block and one scale per operand (the per-tensor recipes): the
        # epilogue's part * (sa_i sb_j) has the same float32 product sa sb for
        # every element, so it is one product by that number, in place
        out = A @ B.t()
        with np.errstate(all="ignore"):
            s = qa.cache["tensor_sinv"] * qb.cache["tensor_sinv"]
        return out.mul_(float(s))
    sa, sb = _q.decode_trusted(qa.scales, _fp32), _q.decode_trusted(qb.scales, _fp32)
    if _q._on_cpu(A) and A.shape[1]:
        # the partial products stacked, then the epilogue in one Numba pass
        P = _k_block_stack(A, B, qa.block)
        with _q._host_kernels():
            return torch.from_numpy(_fp8.k_block_epilogue_stacked(P.numpy(), sa.numpy(),
                                                                  sb.numpy()))
    out = _fp8.k_block_epilogue(_k_block_parts(A, B, qa.block), sa, sb)
    if out is None:
        return torch.zeros(A.shape[0], B.shape[0], device=A.device)
    return out


def _k_block_stack(A, B, bk):
    """The products ``A_j @ B_j^T`` of every K block j, stacked in K order
    (nk, M, N): one batched matmul, the last partial block into its slot."""
    (M, K), N = A.shape, B.shape[0]
    nk, full = -(-K // bk), K // bk
    P = torch.empty((nk, M, N), dtype=torch.float32, device=A.device)
    if full:
        torch.bmm(A[:, :full * bk].reshape(M, full, bk).transpose(0, 1),
                  B[:, :full * bk].reshape(N, full, bk).permute(1, 2, 0), out=P[:full])
    if full < nk:
        torch.matmul(A[:, full * bk:], B[:, full * bk:].t(), out=P[full])
    return P


def _k_block_parts(A, B, bk):
    """``(j, A_j @ B_j^T)`` of each K block j of ``bk`` columns, in K order:
    the products of all blocks in one batched matmul (the blocks made
    contiguous once, not a strided slice per block), the last partial
    block on its own."""
    (M, K), N = A.shape, B.shape[0]
    nk = K // bk
    if nk > 1:
        A3 = A[:, :nk * bk].reshape(M, nk, bk).transpose(0, 1)
        B3 = B[:, :nk * bk].reshape(N, nk, bk).permute(1, 2, 0)
        parts = torch.bmm(A3, B3)
        yield from enumerate(parts)
    else:
        nk = 0
    for j, s in enumerate(range(nk * bk, K, bk), start=nk):
        yield j, A[:, s:s + bk] @ B[:, s:s + bk].t()


def _values(q):
    """The element values of an fp32-scaled operand's codes (float32),
    decoded once (a transposed operand shares them, transposed)."""
    if "values" not in q.cache:
        q.cache["values"] = _q.decode_trusted(q.codes, q.elem)
    return q.cache["values"]


# ------------------------------------------------------------ the layer
class _WeakPickle:
    """Pickles the object that the weak reference in attribute ``_weak``
    points to, and makes it weak again on loading (pickling a whole model)."""

    _weak = ""

    def __getstate__(self):
        state = dict(self.__dict__)
        state[self._weak] = state[self._weak]()
        return state

    def __setstate__(self, state):
        target = state.pop(self._weak)
        self.__dict__.update(state)
        setattr(self, self._weak, weakref.ref(target) if target is not None else _gone)


def _gone():
    return None


class _Layer(_WeakPickle):
    """One emulated ``nn.Linear``: its name, recipe, delayed-scaling state and
    (``keep_operands``) the quantized operands of its last GEMMs by role."""

    _weak = "_module"

    def __init__(self, name, module, emu):
        # the module by weak reference: the module holds this layer (its
        # ``_fpemu_layer``), and a cycle through the model would keep the model,
        # its parameters and their hooks (a DDP reducer and its process group)
        # alive until the garbage collector runs, or to the interpreter's end
        self.name, self._module, self.emu = name, weakref.ref(module), emu
        self.state = None
        self.operands = {} if emu.keep_operands else None

    def delayed_state(self, recipe):
        if self.state is None:
            self.state = recipe.new_state()
        return self.state

    @property
    def module(self):
        """The ``nn.Linear``, or None once it is gone."""
        return self._module()

    def keep(self, role, q):
        if self.operands is not None:
            self.operands[role] = q
        return q


def _out_dtype(x, weight):
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.result_type(x, weight)


class _EmulatedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        out_dtype = _out_dtype(x, weight)
        dev = x.device.type
        with torch.autocast(dev, enabled=False):
            X = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
            W = weight.detach().to(torch.float32)
            recipe = layer.emu.recipe
            if isinstance(recipe, GemmRounding):
                Xq = _q.quantize(X, recipe.fmt) if recipe.operands else X
                Wq = _q.quantize(W, recipe.fmt) if recipe.operands else W
                acc = Xq @ Wq.t()
                if bias is not None:
                    acc = acc + bias.detach().to(torch.float32)
                y = _q.quantize(acc, recipe.fmt)
                ctx.saved = (Xq, Wq, None, None)
            else:
                fwd, _ = recipe.formats()
                state = layer.delayed_state(recipe) if recipe.stateful else None
                qx = layer.keep("input", quantize_operand(recipe, X, fwd, "input", state))
                qw = layer.keep("weight", quantize_operand(recipe, W, fwd, "weight", state))
                y = gemm(recipe, qx, qw, recipe.split_accumulator[0], layer.emu.accumulation)
                if bias is not None:
                    y = y + bias.detach().to(torch.float32)
                if state is not None:          # TE updates forward scales after the forward
                    state["input"].update()
                    state["weight"].update()
                ctx.saved = (X, W, qx, qw)
        ctx.layer, ctx.has_bias = layer, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.x_shape = x.shape
        out = y.reshape(*x.shape[:-1], W.shape[0]).to(out_dtype)
        # not a view, as nn.Linear's output is not (FSDP2 warns of a module that
        # returns one: an in-place op on it would drop its pre-backward hook)
        return out.detach() if out._is_view() else out

    @staticmethod
    def backward(ctx, g):
        layer = ctx.layer
        recipe = layer.emu.recipe
        X, W, qx, qw = ctx.saved
        ctx.saved = None
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(g.device.type, enabled=False):
            G = g.reshape(-1, g.shape[-1]).to(torch.float32)
            gx = gw = gb = None
            if isinstance(recipe, GemmRounding):
                Gq = _q.quantize(G, recipe.fmt) if recipe.operands else G
                if need_x:
                    gx = _q.quantize(Gq @ W, recipe.fmt)
                if need_w:
                    gw = _q.quantize(Gq.t() @ X, recipe.fmt)
            else:
                fwd, bwd = recipe.formats()
                state = layer.state if recipe.stateful else None
                acc = layer.emu.accumulation
                qg = layer.keep("grad_output",
                                quantize_operand(recipe, G, bwd, "grad_output", state))
                if state is not None:
                    state["grad_output"].update()
                _, dgrad, wgrad = recipe.split_accumulator
                if need_x:                                  # dgrad: K = out features
                    qwt = layer.keep("weight_t",
                                     transpose_operand(recipe, W, qw, fwd, "weight", state))
                    gx = gemm(recipe, qg, qwt, dgrad, acc)
                if need_w:                                  # wgrad: K = tokens
                    qgt = layer.keep("grad_output_t",
                                     transpose_operand(recipe, G, qg, bwd, "grad_output", state))
                    qxt = layer.keep("input_t",
                                     transpose_operand(recipe, X, qx, fwd, "input", state))
                    gw = gemm(recipe, qgt, qxt, wgrad, acc)
            if ctx.has_bias and need_b:
                gb = G.to(torch.float64).sum(dim=0).to(b_dtype)
        if gx is not None:
            gx = gx.reshape(ctx.x_shape).to(x_dtype)
        if gw is not None:
            gw = gw.to(w_dtype)
        return gx, gw, gb, None


@torch.compiler.disable
def _forward(module, input):
    # under torch.compile each emulated Linear runs between graphs, as eager code
    # (its quantizers do: fpemu/torch/_quantize.py), the rest of the model compiled
    return _EmulatedLinear.apply(input, module.weight, module.bias, module._fpemu_layer)


class _Forward:
    """An emulated layer's ``forward``, in its ``__dict__``. It holds the
    layer by weak reference: a bound method there would make a cycle (see
    _Layer). A deep copy of the model (an EMA copy, say) gets one bound to
    the copied layer, and pickling keeps the layer, as a bound method would."""

    __slots__ = ("ref",)

    def __init__(self, module):
        self.ref = weakref.ref(module)

    @torch.compiler.disable            # (dynamo does not follow the weak reference)
    def __call__(self, input):
        return _forward(self.ref(), input)

    def __deepcopy__(self, memo):
        m = self.ref()
        return _Forward(memo.get(id(m), m))

    def __reduce__(self):
        return (_Forward, (self.ref(),))


# ------------------------------------------------------------ the context
class Emulation(_WeakPickle):
    """What :func:`emulate` returns: ``layers`` (the emulated ``nn.Linear``
    names), ``operands(name)`` (the last quantized operands of a layer, by
    role, with ``keep_operands=True``), :meth:`state_dict` /
    :meth:`load_state_dict` of the recipe state (delayed scaling's amax
    histories and scales, NVFP4's stochastic-rounding call counter), and
    :meth:`stop` (also on leaving the ``with`` block)."""

    _weak = "_model"

    def __init__(self, model, recipe, *, accumulation=None, keep_operands=False):
        if not isinstance(model, torch.nn.Module):
            raise FpemuTypeError(f"emulate() takes a torch.nn.Module, got "
                                 f"{type(model).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module    # the layers' names are the model's own on every rank
        self._model = weakref.ref(model)     # no cycle through the model: see _Layer
        self.recipe = recipe_of(recipe)
        _check_accumulation(self.recipe, accumulation)
        self.accumulation = accumulation
        self.keep_operands = keep_operands
        self._layers = {}
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                if self.recipe.keeps_high_precision(m):
                    continue
                self._layers[name] = _Layer(name, m, self)
        if not self._layers:
            kinds = sorted({type(m).__name__ for m in model.modules()})
            raise FpemuValueError(
                f"emulate(): {type(model).__name__} has no nn.Linear to emulate (its modules: "
                f"{', '.join(kinds[:8])}{', ...' if len(kinds) > 8 else ''}); the recipes "
                "quantize the operands of nn.Linear GEMMs. Pass the model that holds them, or "
                "check high_precision_modules")
        self.active = False
        self._start()

    @property
    def model(self):
        """The emulated model (None once nothing else holds it: the emulation
        does not keep a model alive)."""
        return self._model()

    @property
    def layers(self):
        return list(self._layers)

    def operands(self, name):
        if not self.keep_operands:
            raise FpemuValueError("operands() needs emulate(..., keep_operands=True)")
        return dict(self._layers[name].operands)

    def _start(self):
        for layer in self._layers.values():
            m = layer.module
            if "forward" in m.__dict__ or hasattr(m, "_fpemu_layer"):
                raise FpemuValueError(
                    f"emulate(): layer {layer.name!r} already has its own forward (another "
                    "emulate() or a patch of its own); stop that one first")
            m._fpemu_layer = layer
            m.forward = _Forward(m)
        self.active = True

    def stop(self):
        """Give every layer its own forward back (idempotent)."""
        if not self.active:
            return
        for layer in self._layers.values():
            m = layer.module
            if m is not None:                        # None: the model is gone
                m.__dict__.pop("forward", None)
                m.__dict__.pop("_fpemu_layer", None)
        self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def state_dict(self):
        """The recipe state, as tensors and plain values."""
        layers = {}
        for name, layer in self._layers.items():
            if layer.state is not None:
                layers[name] = {role: {"amax_history": torch.from_numpy(st.history.copy()),
                                       "scale": torch.tensor(float(st.scale)),
                                       "scale_inv": torch.tensor(float(st.scale_inv))}
                                for role, st in layer.state.items()}
        return {"recipe": type(self.recipe).__name__, "layers": layers,
                "calls": getattr(self.recipe, "_calls", None)}

    def load_state_dict(self, sd):
        mine = type(self.recipe).__name__
        if sd.get("recipe") != mine:
            raise FpemuValueError(f"load_state_dict(): the state is of a "
                                  f"{sd.get('recipe')} recipe, this emulation runs {mine}")
        unknown = sorted(set(sd["layers"]) - set(self._layers))
        if unknown:
            raise FpemuValueError(f"load_state_dict(): no emulated layer named "
                                  f"{', '.join(map(repr, unknown))}; this model's: "
                                  f"{', '.join(self._layers)}")
        for name, roles in sd["layers"].items():
            state = self._layers[name].delayed_state(self.recipe)
            for role, v in roles.items():
                st = state[role]
                st.history = v["amax_history"].numpy().astype(np.float32).copy()
                st.scale = _f(float(v["scale"]))
                st.scale_inv = _f(float(v["scale_inv"]))
        if sd.get("calls") is not None:
            self.recipe._calls = int(sd["calls"])


def emulate(model, recipe, *, accumulation=None, keep_operands=False):
    """Run every ``nn.Linear`` of ``model`` under ``recipe`` (module text);
    use as ``with fpemu.torch.emulate(model, recipe) as emu:`` around the
    training loop, or call ``.stop()`` on what it returns.

    Parameters
    ----------
    model : torch.nn.Module
    recipe : a recipe of :mod:`fpemu.autograd.fp8`, a :class:`GemmRounding`,
        or a name: ``"delayed"``, ``"current"``, ``"fp8-block"``, ``"mxfp8"``,
        ``"nvfp4"``, ``"bf16"``, ``"fp16"``.
    accumulation : str, optional
        A :mod:`fpemu.accumulate` model (``"h100-fp8"``, ``"b200-mxf4nvf4"``,
        ...): the GEMMs run on the host under it (slow; small layers).
    keep_operands : bool
        Keep each layer's last quantized operands (``emu.operands(name)``).
    """
    return Emulation(model, recipe, accumulation=accumulation, keep_operands=keep_operands)


def run_script(path, argv=(), recipe="nvfp4", *, accumulation=None, reraise=True):
    """Run an unchanged training script with every ``nn.Linear`` of its model
    under ``recipe`` (``fpemu emulate``). The model is the module that owns
    the parameters of the first optimizer the script creates (as ``fpemu
    monitor`` finds it). Returns ``(emulation or None, error, exit code)``:
    the script's exception (re-raised unless ``reraise=False``) and its
    ``sys.exit`` status."""
    _check_script(path, "emulate")
    recipe = recipe_of(recipe)
    _check_accumulation(recipe, accumulation)        # before the script runs, not in its hook
    found = []
    try:
        error, exit_code = run_hooked(
            path, argv, lambda model, opt: found.append(
                emulate(model, recipe, accumulation=accumulation)), lambda: bool(found))
    finally:
        for emu in found:
            emu.stop()
    if error is not None and reraise:
        raise error
    return (found[0] if found else None), error, exit_code
