"""Sums, dot products and matrix products under accumulation models.

Every function takes the **input format** (the operands must be its values),
the **accumulator format** (where partial sums live) and the **output
format** (the result is rounded into it once at the end, round to nearest
even, as a GEMM epilogue does; default: the accumulator format), and a
``model`` saying how the hardware or library accumulates:

``"exact"``
    The exact sum, rounded once into the accumulator format.
``"sequential"``
    Each product rounded into the accumulator format, then each addition
    rounded, in index order (a CPU loop; a CUDA-core FMA-less reduction).
``"pairwise"``
    Products rounded, then summed in a balanced tree (numpy's ``sum`` is
    pairwise in blocks of 128 elements; this is the pure tree).
``"fma"``
    A chain of fused multiply-adds, ``acc = fma(a_k, b_k, acc)``.
``"blocked"``
    The model ``inner`` (default ``"sequential"``) on consecutive blocks of
    ``block`` elements (default 128) with a fresh zero accumulator, each
    block's result added into an fp32 accumulator (round to nearest even):
    DeepSeek-V3's promotion of fp8 partial sums every N_C = 128 elements.
``"v100"``, ``"a100"``, ``"h100"``, ``"h100-tf32"``, ``"h100-fp8"``, ``"b200-fp8"``
    Tensor-core models (see :data:`TENSOR_CORES` and :class:`TensorCore`),
    or a :class:`TensorCore` of your own.

A GEMM library may also **split K** (``splitk=``, :class:`SplitK`): the
reduction is cut into parts, each accumulated as ``model`` says from +0, and
the partial sums added in fp32, as cuBLASLt's split-K kernels do
(:mod:`fpemu.cublaslt` says which split cuBLASLt picks for a shape).

Rounding mode, subnormals and overflow policy (``rounding``,
``subnormals``, ``overflow``, ``seed``) apply to the roundings into the
accumulator format of the first four models; tensor-core models truncate as
the hardware does and ignore them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from . import _accum_kernels as _ak
from ._jit import run_kernel
from .errors import FpemuTypeError, FpemuValueError
from .formats import Format
from .checks import as_format, real_array
from .quantize import Cast, decode, not_in_format, quantize
from .rounding import Rounding, parse_rounding

__all__ = ["TensorCore", "TENSOR_CORES", "MODELS", "SplitK", "BlockScaledCore",
           "BLOCK_SCALED_CORES", "sum", "dot", "matmul", "scaled_matmul", "bmm_fp32_sequential",
           "Plan", "CANONICAL_NAN32", "resolve_model"]


@dataclasses.dataclass(frozen=True)
class TensorCore:
    """A tensor-core accumulation model (Fasi, Higham, Mikaitis and Pranesh
    2021; Khattak and Mikaitis 2025; the same algorithm in MMA-Sim, Xie et
    al. 2025).

    One step computes ``c + sum(a_k * b_k)`` over a block of ``terms``
    products: every product is exact; every term, the accumulator ``c``
    included, is truncated toward zero to ``fraction_bits`` bits below the
    largest exponent among them (a product's exponent is ``e(a) + e(b)``,
    not renormalised; subnormal inputs count with their format's emin and
    zero terms with ``e_zero``); the truncated terms are summed exactly; the
    sum is normalised and truncated to fp32 with ``out_fraction_bits``
    fraction bits (23: fp32 itself). Long dot products chain the steps,
    the result of one being ``c`` of the next. Infinite and NaN inputs give
    the IEEE result of the plain sum.
    """

    name: str
    terms: int
    fraction_bits: int
    out_fraction_bits: int = 23
    e_zero: int = -133
    source: str = ""

    def __post_init__(self):
        if not (isinstance(self.terms, int) and self.terms >= 1):
            raise FpemuValueError(f"TensorCore {self.name!r}: terms must be an int >= 1, "
                                  f"got {self.terms!r}")
        if not (isinstance(self.fraction_bits, int) and 0 <= self.fraction_bits <= 30):
            raise FpemuValueError(f"TensorCore {self.name!r}: fraction_bits must be an int in "
                                  f"0..30 (the exact block sum must fit float64), got "
                                  f"{self.fraction_bits!r}")
        if not (isinstance(self.out_fraction_bits, int) and 0 <= self.out_fraction_bits <= 23):
            raise FpemuValueError(f"TensorCore {self.name!r}: out_fraction_bits must be in 0..23, "
                                  f"got {self.out_fraction_bits!r}")
        if isinstance(self.e_zero, bool) or not isinstance(self.e_zero, int) \
                or not -300 <= self.e_zero <= 127:
            raise FpemuValueError(f"TensorCore {self.name!r}: e_zero (the exponent a zero "
                                  f"term aligns with) must be an int in -300..127, got "
                                  f"{self.e_zero!r}; the presets use -131..-133, below fp32's "
                                  "subnormals")


#: The published presets (fp32 output/accumulation).
TENSOR_CORES = {
    "v100": TensorCore(
        "v100", 4, 23, 23, -131,
        "Volta fp16: 4 products per block, no extra alignment bits (F = 23); reproduces "
        "Fasi et al. 2021 (no guard bits, truncation, alignment to the largest "
        "exponent); parameters as MMA-Sim's Volta mma"),
    "a100": TensorCore(
        "a100", 8, 24, 23, -132,
        "Ampere fp16/bf16: 8 products per block, 1 extra alignment bit (F = 24); "
        "Fasi et al. 2021 and MMA-Sim's Ampere mma"),
    "h100": TensorCore(
        "h100", 16, 25, 23, -133,
        "Hopper fp16/bf16: 16 products per block, 2 extra bits (F = 25); Khattak and "
        "Mikaitis 2025 and MMA-Sim's Hopper wgmma"),
    "h100-tf32": TensorCore(
        "h100-tf32", 8, 25, 23, -133,
        "Hopper TF32 as cuBLAS runs it (torch.backends.cuda.matmul.allow_tf32): the float32 "
        "operands rounded to tf32 to nearest, ties to even, first (quantize(x, 'tf32'); ties "
        "away, PTX cvt.rna.tf32.f32, misses the 10 probes with a tie, truncation all 20), "
        "then 8 products per step (the k "
        "of wgmma's tf32 instruction), F = 25, truncation, as the 'h100' fp16/bf16 model but "
        "with 8 terms a step. Fitted here to the 20 TF32 GEMM probes an H200 recorded with "
        "torch 2.11.0+cu130 (bench/fit_tf32.py): every output bit, with cuBLAS's split of K "
        "into contiguous runs of 32-wide k-tiles, each part from +0, the parts added in fp32 "
        "(SplitK(S, tile=32); 16x16x16 ran as four runs of 4, SplitK(4, tile=4); the split "
        "is the kernel's choice per shape, see tests/test_gpu_probes_tf32.py). e_zero is not "
        "pinned by the probes (no zero ever set an alignment); -133 as 'h100'. Algorithm of "
        "Fasi et al. 2021 and Khattak and Mikaitis 2025"),
    "h100-fp8": TensorCore(
        "h100-fp8", 32, 13, 13, -133,
        "Hopper fp8 (e4m3/e5m2): 32 products per block aligned to 13 fraction bits, and "
        "the fp32 accumulator itself truncated to 13 fraction bits (MMA-Sim's RZ-E8M13); "
        "reproduces DeepSeek-V3's 'around 14 bits' (13 plus the leading bit) and its "
        "~2% error for K = 4096"),
    "b200-fp8": TensorCore(
        "b200-fp8", 32, 25, 23, -133,
        "Blackwell fp8: 32 products per block, F = 25, fp32 accumulator (Khattak and "
        "Mikaitis 2025; MMA-Sim's tcgen05.mma)"),
}

MODELS = ("exact", "sequential", "pairwise", "blocked", "fma") + tuple(TENSOR_CORES)


@dataclasses.dataclass(frozen=True)
class SplitK:
    """A split of the K reduction, as cuBLASLt's split-K GEMM kernels on
    Hopper (sm_90) run it.

    K is cut into ``tile``-wide k-tiles (the kernel's k-stage, 128 on the
    H100; a last, shorter tile is the ragged rest of K); split ``s`` of
    ``splits`` owns the contiguous run of tiles ``[s q, (s + 1) q)`` with
    ``q = ceil(T / splits)`` for ``T`` tiles (the last splits may own fewer
    tiles, or none). Each split is accumulated under the GEMM's model from
    +0 (``"blocked"`` restarts its chains inside the split, every ``block``
    of the split's own elements); the partial sums are then added in fp32,
    round to nearest even, in split order: ``((p_0 + p_1) + p_2) + ...``;
    an empty split is +0.

    This is the layout mmaemu 0.1.0 (Hopper preset, "contiguous") fitted to
    3,465 live split calls of cuBLASLt 12.8.3.14 on an H100 PCIe, and that
    ``tests/test_splitk.py`` checks fpemu against. ``splits=1`` is the
    unsplit GEMM.

    Examples
    --------
    >>> from fpemu.accumulate import SplitK
    >>> SplitK(3).parts(1000)            # 8 k-tiles of 128: 3 + 3 + 2 tiles
    [(0, 384), (384, 768), (768, 1000)]
    >>> SplitK(4).parts(256)             # 2 k-tiles: two splits stay empty
    [(0, 128), (128, 256), (256, 256), (256, 256)]
    """

    splits: int = 1
    tile: int = 128

    def __post_init__(self):
        for name, v in (("splits", self.splits), ("tile", self.tile)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
                raise FpemuValueError(f"SplitK: {name} must be an int >= 1, got {v!r}; e.g. "
                                      "SplitK(3) for cuBLASLt's three-way split of K")
        object.__setattr__(self, "splits", int(self.splits))
        object.__setattr__(self, "tile", int(self.tile))

    @classmethod
    def of(cls, splitk, fname="matmul"):
        """A SplitK from ``splitk``: an int (the number of splits), a SplitK, or
        an ``(S, "contiguous")`` pair as mmaemu spells it; a clear error
        otherwise, in the words of the function ``fname``."""
        if isinstance(splitk, SplitK):
            return splitk
        if isinstance(splitk, tuple) and len(splitk) == 2 and splitk[1] == "contiguous":
            splitk = splitk[0]
        if (isinstance(splitk, (int, np.integer)) and not isinstance(splitk, (bool, np.bool_))
                and splitk >= 1):
            return cls(int(splitk))
        raise FpemuValueError(
            f"{fname}(): splitk must be an int >= 1 (the number of K splits), a "
            f"fpemu.accumulate.SplitK or (S, 'contiguous'); got {splitk!r}. For cuBLASLt's own "
            "choice use fpemu.cublaslt.splitk_decision")

    def check(self, K, fname="matmul"):
        """``K`` as an int, after refusing a K that is not an int >= 0 and a
        split of K into more parts than K has elements (every part past the
        K-th would be empty: such a split cannot be meant, and would only
        cost memory and time)."""
        if isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer)):
            raise FpemuTypeError(f"{fname}(): K must be an int >= 0 (the length of the "
                                 f"reduction), got {type(K).__name__} {K!r}")
        if K < 0:
            raise FpemuValueError(f"{fname}(): K must be an int >= 0 (the length of the "
                                  f"reduction), got {K!r}")
        K = int(K)
        if self.splits > max(K, 1):
            raise FpemuValueError(
                f"{fname}(): splitk={self.splits} splits K = {K} into more parts than K has "
                f"elements; the limit is max(K, 1) = {max(K, 1)} (cuBLASLt splits K into a "
                f"few runs of 128-wide k-tiles: {-(-K // self.tile)} here)")
        return K

    def parts(self, K):
        """The ``splits`` half-open K ranges ``(start, stop)``, in split order
        (K an int >= 0, at least ``splits`` unless K is 0)."""
        K = self.check(K, "SplitK.parts")
        tiles = -(-K // self.tile)
        q = -(-tiles // self.splits)
        return [(min(s * q * self.tile, K), min((s + 1) * q * self.tile, K))
                for s in range(self.splits)]


def resolve_model(model, name):
    """The accumulation model named ``model`` (a key of :data:`MODELS` or
    :data:`TENSOR_CORES`, or a :class:`TensorCore`); ``name`` names the
    caller in the error for any other value."""
    if isinstance(model, TensorCore):
        return model
    if isinstance(model, str):
        key = model.lower()
        if key in TENSOR_CORES:
            return TENSOR_CORES[key]
        if key in MODELS:
            return key
    raise FpemuValueError(
        f"{name}: unknown accumulation model {model!r}; choose one of {', '.join(MODELS)} "
        "or pass a fpemu.accumulate.TensorCore"
    )


def _check_operand(x, fmt: Format, label, fname):
    if x.size:
        bad = not_in_format(x, fmt)
        if bad.any():
            first = int(np.flatnonzero(bad.reshape(-1))[0])
            lname = fmt.long_name or fmt.name
            raise FpemuValueError(
                f"{fname}(): {label} holds {int(bad.sum())} value(s) that are not {lname} "
                f"values (the first, {float(x.reshape(-1)[first])!r}, at flat index {first}); "
                f"round them first with fpemu.quantize({label}, {fmt.name!r})"
            )


def _in_formats(in_fmt, fname):
    """(format of a, format of b): ``in_fmt`` is one format or a pair of them
    (an e5m2 x e4m3 fp8 GEMM)."""
    if isinstance(in_fmt, (tuple, list)):
        if len(in_fmt) != 2:
            raise FpemuValueError(f"{fname}(): in_fmt is one format or a pair (format of a, "
                                  f"format of b); got {in_fmt!r}")
        return as_format(in_fmt[0]), as_format(in_fmt[1])
    f = as_format(in_fmt)
    return f, f


#: The NaN tensor cores write (as MMA-Sim and mmaemu model it; fpemu's scaled_matmul).
CANONICAL_NAN32 = np.uint32(0x7FFFFFFF).view(np.float32)


class _TC(NamedTuple):
    """What the tensor-core kernels take of a model and the input formats."""

    terms: int             # products per instruction
    fraction_bits: int     # alignment bits kept below the largest exponent
    out_fraction_bits: int
    e_zero: int            # the exponent a zero term counts with
    emin_a: int            # a subnormal input counts at its own format's emin
    emin_b: int


_NO_TC = _TC(1, 0, 23, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class Plan:
    """An accumulation's arguments parsed and checked once (one per call of
    matmul / dot / sum, or one for all the batch elements and K blocks of a
    caller that runs many GEMMs of one configuration).

    ``Plan.of(in_fmt, acc_fmt, out_fmt, model=, block=, ...)`` takes the
    arguments of :func:`matmul`; :meth:`matmul` runs one GEMM under it
    without checking its operands again.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import accumulate
    >>> plan = accumulate.Plan.of("bf16", "fp32", model="h100-fp8")
    >>> plan.matmul(np.ones((1, 4)), np.ones((4, 1))).tolist()
    [[4.0]]
    """

    fmt_a: Format
    fmt_b: Format
    cast: Cast              # the accumulator format with its rounding configuration
    out_fmt: Format
    kind: int               # a model of fpemu._accum_kernels
    block: int              # 0, or the promotion interval of "blocked"
    tc: _TC
    key: int                # the stochastic-rounding key
    splitk: SplitK = SplitK()

    @property
    def acc_fmt(self):
        return self.cast.fmt

    @property
    def tensor_core(self) -> bool:
        """Whether the plan runs a tensor-core model (:class:`TensorCore`)."""
        return self.kind == _ak.TC

    @staticmethod
    def of(in_fmt, acc_fmt="fp32", out_fmt=None, *, model="sequential", block=128,
           inner="sequential", rounding="rne", subnormals=True, overflow=None, seed=None,
           fname="matmul", splitk=1) -> "Plan":
        """The plan of these arguments (those of :func:`matmul`; the checks
        raise here, naming ``fname``)."""
        return _plan(in_fmt, acc_fmt, out_fmt, model, block, inner, rounding, subnormals,
                     overflow, seed, fname, splitk)

    def matmul(self, a, b, c=None):
        """``a @ b`` (2-D, float32 or float64 arrays already holding in_fmt
        values: not checked again) accumulated under this plan, as
        :func:`matmul` computes it (float64 results); ``c``, the
        accumulator's start as :func:`matmul` takes it (values of acc_fmt,
        not checked again, broadcast to (M, N))."""
        _no_c_when_split(self, c, "Plan.matmul")
        C = _identity("rne", a.shape[1]) if c is None else np.asarray(c, np.float64)
        C = np.ascontiguousarray(np.broadcast_to(C, (a.shape[0], b.shape[1])))
        return _run(self, np.ascontiguousarray(a, np.float64),
                    np.ascontiguousarray(b.T, np.float64), C, False, check=False)

    def dot_rows(self, a, b):
        """``out[i] = dot(a[i], b[i])`` for (R, K) arrays already holding
        in_fmt values (not checked again), each a dot product as
        :func:`matmul` accumulates it: many small products in one kernel
        call. Returns float64 results of shape (R,)."""
        C = np.full((a.shape[0], 1), _identity("rne", a.shape[1]))
        return _run(self, np.ascontiguousarray(a, np.float64),
                    np.ascontiguousarray(b, np.float64), C, True, check=False)[:, 0]

    def bmm(self, a, b):
        """``out[n] = a[n] @ b[n]`` for (nb, M, K) and (nb, K, N) arrays already
        holding in_fmt values (not checked again), each product as
        :meth:`matmul` computes it (float32 results, (nb, M, N)). A
        tensor-core plan without a split K runs the whole batch in one
        kernel call (attention's many small heads); other plans, and
        operands holding inf or NaN, run product by product."""
        nb, M, K = a.shape
        N = b.shape[2]
        A = np.ascontiguousarray(a, np.float64)
        B = np.ascontiguousarray(b, np.float64)
        if not (self.tensor_core and self.splitk.splits == 1 and nb * M * N
                and np.isfinite(A).all() and np.isfinite(B).all()):
            out = np.empty((nb, M, N), np.float32)
            for n in range(nb):
                out[n] = self.matmul(A[n], B[n])
            return out
        C = np.broadcast_to(_identity("rne", K), (nb, M, N))
        out = np.empty((nb, M, N), np.float32)
        L, F, out_f, e_zero, emin_a, emin_b = self.tc
        run_kernel(_ak.tc_bmm, A, B, C, out, L, F, out_f, e_zero, emin_a, emin_b,
                   self.block, inputs=3)
        if self.out_fmt != self.acc_fmt:
            out = quantize(out, self.out_fmt)
        return out


def _plan(in_fmt, acc_fmt="fp32", out_fmt=None, model="sequential", block=128,
          inner="sequential", rounding="rne", subnormals=True, overflow=None, seed=None,
          fname="matmul", splitk=1) -> Plan:
    """The :class:`Plan` of these arguments (the checks raise here)."""
    fmt_a, fmt_b = _in_formats(in_fmt, fname)
    cast = Cast.of(acc_fmt, rounding, subnormals, overflow)
    acc_fmt = cast.fmt
    out_fmt = acc_fmt if out_fmt is None else as_format(out_fmt)
    model = resolve_model(model, fname)
    if model == "blocked":
        if not (isinstance(block, (int, np.integer)) and not isinstance(block, bool)
                and block >= 1):
            raise FpemuValueError(f"{fname}(): block must be an int >= 1, got {block!r}")
        model = resolve_model(inner, fname)
        if model == "blocked":
            raise FpemuValueError(f"{fname}(): inner must be a model other than 'blocked'")
        block = int(block)
    else:
        block = 0
    key, _ = cast.seed_key(seed)
    tc = _NO_TC
    if isinstance(model, TensorCore):
        if acc_fmt.name != "fp32":
            raise FpemuValueError(f"{fname}(): tensor-core models accumulate in fp32; got "
                                  f"acc_fmt={acc_fmt.name!r}")
        for f in (fmt_a, fmt_b):
            if f.precision > 12:
                raise FpemuValueError(
                    f"{fname}(): tensor-core models take inputs of at most 12 significant bits "
                    f"(fp16, bf16, tf32, fp8, fp6, fp4); {f.name} has {f.precision}")
        tc = _TC(model.terms, model.fraction_bits, model.out_fraction_bits, model.e_zero,
                 fmt_a.emin, fmt_b.emin)
        kind = _ak.TC
    else:
        kind = _ak.MODELS[model]
    splitk = SplitK.of(splitk, fname)
    if splitk.splits > 1 and acc_fmt.name != "fp32":
        raise FpemuValueError(f"{fname}(): a split K adds its partial sums in fp32, as cuBLASLt "
                              f"does; got acc_fmt={acc_fmt.name!r}: pass acc_fmt='fp32' or "
                              "splitk=1")
    if splitk.splits > 1 and cast.rounding is Rounding.SR:
        raise FpemuValueError(f"{fname}(): stochastic rounding with a split K is not modelled "
                              "(each part would draw the same random bits at the same index); "
                              "pass splitk=1 or another rounding")
    return Plan(fmt_a, fmt_b, cast, out_fmt, kind, block, tc, key, splitk)


def _run(plan: Plan, A, BT, C, paired, fname="matmul", check=True):
    """out[i, j] = dot(A[i], BT[j]) (or out[i] = dot(A[i], BT[i]) if paired)
    under ``plan``: float64 A (M, K), BT (N, K) and C, the accumulator's
    start, of the output's shape."""
    if plan.splitk.splits > 1:
        plan.splitk.check(A.shape[1], fname)
    if check:
        _check_operand(A, plan.fmt_a, "a", fname)
        _check_operand(BT, plan.fmt_b, "b", fname)
        _check_operand(C, plan.acc_fmt, "c", fname)
    kind = plan.kind
    special = None
    if kind in (_ak.TC, _ak.EXACT):
        finite = np.isfinite(A).all() and np.isfinite(BT).all() and np.isfinite(C).all()
        if not finite:
            with np.errstate(all="ignore"):
                if paired:
                    special = np.einsum("ik,ik->i", A, BT)[:, None] + C
                else:
                    special = A @ BT.T + C
            rows = ~np.isfinite(A).all(axis=1)
            cols = ~np.isfinite(BT).all(axis=1)
            mask = (rows[:, None] | (cols[:, None] if paired else cols[None, :])
                    | ~np.isfinite(C))
            A = np.where(np.isfinite(A), A, 0.0)
            BT = np.where(np.isfinite(BT), BT, 0.0)
            C = np.where(np.isfinite(C), C, 0.0)
    if plan.splitk.splits > 1:
        out = _split_accumulate(plan, A, BT, C.shape, paired)
    else:
        out = _accumulate(plan, A, BT, C, paired)
    if special is not None:
        with np.errstate(all="ignore"):
            special = special.astype(np.float32)
        if kind == _ak.TC:                  # a tensor core writes its one NaN
            special = np.where(np.isnan(special), CANONICAL_NAN32, special)
        out = np.where(mask, special, out)
    if plan.out_fmt != plan.acc_fmt:
        out = quantize(out, plan.out_fmt)
    return out


def _accumulate(plan: Plan, A, BT, C, paired):
    """The finite accumulation of :func:`_run`, one chain schedule over all of K."""
    kind, block, cast = plan.kind, plan.block, plan.cast
    native = (kind == _ak.SEQUENTIAL and block == 0 and plan.acc_fmt.name == "fp32"
              and cast.rounding is Rounding.RNE and cast.subnormals
              and int(cast.overflow) == 0 and not paired)
    out = np.empty(C.shape, np.float32)
    if out.size and kind == _ak.TC:
        out = _tc_matmul(A, BT, C, plan.tc, block, paired)
    elif out.size:
        kernel = _ak.dot_kernel(kind, int(cast.rounding), cast.flags, block, native, paired)
        run_kernel(kernel, A, BT, C, out, cast.params, tuple(plan.tc), plan.key, inputs=3)
    return out


def _split_accumulate(plan: Plan, A, BT, shape, paired):
    """:func:`_accumulate` under ``plan.splitk``: each split's K range from
    +0, the partial sums added in fp32 in split order (:class:`SplitK`).
    The empty splits are the last ones; the first adds +0 (a -0 sum becomes
    +0), every further one adds +0 to a sum that is no -0: nothing, so the
    loop stops there."""
    zero = np.zeros(shape)
    total = None
    for k0, k1 in plan.splitk.parts(A.shape[1]):
        if k1 > k0:
            part = _accumulate(plan, np.ascontiguousarray(A[:, k0:k1]),
                               np.ascontiguousarray(BT[:, k0:k1]), zero, paired)
        else:
            part = np.zeros(shape, np.float32)          # an empty split: +0
        with np.errstate(all="ignore"):                   # inf - inf: NaN, as IEEE
            total = part if total is None else total + part   # binary32, round to nearest
        if k1 == k0:
            break
    return total


def _exponents(X, emin):
    """floor(log2|x|), at least emin; the kernels' ZERO_EXPONENT for zeros."""
    with np.errstate(divide="ignore"):
        _, e = np.frexp(X)
    e = np.maximum(e.astype(np.int64) - 1, emin)
    return np.where(X == 0, _ak.ZERO_EXPONENT, e)


def _tc_matmul(A, BT, C, tc, block, paired=False):
    """The tensor-core model over whole matrices (``paired``: row-wise dot
    products), one row routine for both; with block > 0, per block of K and
    promoted into fp32 in between."""
    L, F, out_f, e_zero, emin_a, emin_b = tc
    if not paired:
        out = np.empty((1,) + C.shape, np.float32)
        run_kernel(_ak.tc_bmm, A[None], np.ascontiguousarray(BT.T)[None], C[None], out,
                   L, F, out_f, e_zero, emin_a, emin_b, block, inputs=3)
        return out[0]
    EA, EB = _exponents(A, emin_a), _exponents(BT, emin_b)
    K = A.shape[1]

    def run(k0, k1, c):
        out = np.empty(c.shape, np.float32)
        run_kernel(_ak.tc_dot_rows, np.ascontiguousarray(A[:, k0:k1]),
                   np.ascontiguousarray(EA[:, k0:k1]), np.ascontiguousarray(BT[:, k0:k1]),
                   np.ascontiguousarray(EB[:, k0:k1]), c, out, L, F, out_f, e_zero, inputs=5)
        return out

    if block == 0:
        return run(0, K, C)
    total = C.astype(np.float32)
    zero = np.zeros(C.shape)
    for k0 in range(0, K, block):
        total = total + run(k0, min(k0 + block, K), zero)  # binary32, round to nearest even
    return total


def _identity(rounding, K):
    """The accumulator's start when no c is given: the zero that leaves every
    sum's sign as IEEE 754 makes it (-0 + x = x; under "rdn" +0 is that zero).
    An empty sum is +0."""
    return np.float64(0.0 if K == 0 or parse_rounding(rounding) is Rounding.RDN else -0.0)


def _as_matrix(x, fname, label):
    flat, shape = real_array(x, fname)
    return flat.astype(np.float64, copy=False).reshape(shape)


def matmul(a, b, in_fmt, acc_fmt="fp32", out_fmt=None, *, model="sequential", block=128,
           inner="sequential", c=None, rounding="rne", subnormals=True, overflow=None,
           seed=None, splitk=1):
    """a @ b (2-D) under an accumulation model; float32 values of out_fmt.

    Parameters
    ----------
    a, b : array_like, shapes (M, K) and (K, N)
        Values of ``in_fmt``.
    in_fmt, acc_fmt, out_fmt : str or Format
        Input, accumulator and output formats (out_fmt None: acc_fmt);
        ``in_fmt`` may be a pair (format of a, format of b), as an e5m2 x
        e4m3 fp8 GEMM (a tensor-core model aligns each subnormal input
        with its own format's emin).
    model : str or TensorCore
        One of :data:`MODELS` or a :class:`TensorCore` (see the module text).
    block, inner : int, str
        For ``model="blocked"``: the block length and the model inside blocks.
    c : array_like, optional
        Initial accumulator (values of acc_fmt), broadcast to (M, N).
    rounding, subnormals, overflow, seed
        For the roundings into acc_fmt, as in :func:`fpemu.quantize`.
    splitk : int or SplitK
        Split K into this many parts (:class:`SplitK`: 128-wide k-tiles, each
        part accumulated from +0, the parts added in fp32), as cuBLASLt's
        split-K kernels do; 1 (default): one reduction over all of K.
        :func:`fpemu.cublaslt.splitk_decision` gives cuBLASLt's own choice.
        A split GEMM takes no ``c`` (cuBLASLt adds C after the split's
        reduction: add it to the result).

    Examples
    --------
    >>> import numpy as np, fpemu
    >>> from fpemu import accumulate
    >>> a = np.array([[1.0, 2.0**-24, 2.0**-24]]); b = np.ones((3, 1))
    >>> accumulate.matmul(a, b, "fp32", model="sequential").item()   # each 2**-24 lost
    1.0
    >>> accumulate.matmul(a, b, "fp32", model="exact").item() == 1 + 2**-23
    True

    A split K adds the parts' sums at the end: here 1 + 2**-24 + 2**-24, exact.

    >>> a = np.zeros((1, 256)); a[0, 0] = 1.0; a[0, 128:130] = 2.0**-24
    >>> accumulate.matmul(a, np.ones((256, 1)), "fp32").item()
    1.0
    >>> accumulate.matmul(a, np.ones((256, 1)), "fp32", splitk=2).item() == 1 + 2**-23
    True
    """
    A = _as_matrix(a, "matmul", "a")
    B = _as_matrix(b, "matmul", "b")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise FpemuValueError(f"matmul(): needs shapes (M, K) and (K, N); got {A.shape} and "
                              f"{B.shape}")
    plan = _plan(in_fmt, acc_fmt, out_fmt, model, block, inner, rounding, subnormals, overflow,
                 seed, "matmul", splitk)
    _no_c_when_split(plan, c, "matmul")
    C = _identity(rounding, A.shape[1]) if c is None else _as_matrix(c, "matmul", "c")
    C = np.ascontiguousarray(np.broadcast_to(C, (A.shape[0], B.shape[1])))
    return _run(plan, np.ascontiguousarray(A), np.ascontiguousarray(B.T), C, False)


def _no_c_when_split(plan, c, fname):
    if c is not None and plan.splitk.splits > 1:
        raise FpemuValueError(
            f"{fname}(): c with splitk={plan.splitk.splits}: a split GEMM accumulates each part "
            "from +0 and cuBLASLt adds C only after the parts are reduced; pass c=None and add "
            "c to the result (or splitk=1 to start the one chain from c)")


def dot(a, b, in_fmt, acc_fmt="fp32", out_fmt=None, *, model="sequential", block=128,
        inner="sequential", c=None, rounding="rne", subnormals=True, overflow=None, seed=None,
        splitk=1):
    """Dot products along the last axis (leading axes broadcast); ``c``, the
    initial accumulator (values of acc_fmt), broadcasts to the result's shape.
    The other arguments are those of :func:`matmul`.

    Examples
    --------
    >>> import fpemu
    >>> from fpemu import accumulate
    >>> x = [2.0**20, 1.0, -(2.0**20)]
    >>> accumulate.dot(x, [1.0, 1.0, 1.0], "fp32", "fp16", model="sequential").item()  # inf - inf
    nan
    >>> accumulate.dot(x, [1.0, 1.0, 1.0], "fp32", "fp16", model="exact").item()
    1.0
    """
    A = _as_matrix(a, "dot", "a")
    B = _as_matrix(b, "dot", "b")
    if A.ndim == 0 or B.ndim == 0 or A.shape[-1] != B.shape[-1]:
        raise FpemuValueError(
            f"dot(): needs arrays whose last axes have the same length; got {A.shape} and "
            f"{B.shape}"
        )
    lead = np.broadcast_shapes(A.shape[:-1], B.shape[:-1])
    K = A.shape[-1]
    rows = int(np.prod(lead, dtype=np.int64))
    A2 = np.ascontiguousarray(np.broadcast_to(A, lead + (K,))).reshape(rows, K)
    B2 = np.ascontiguousarray(np.broadcast_to(B, lead + (K,))).reshape(rows, K)
    plan = _plan(in_fmt, acc_fmt, out_fmt, model, block, inner, rounding, subnormals,
                 overflow, seed, "dot", splitk)
    _no_c_when_split(plan, c, "dot")
    C = _identity(rounding, K) if c is None else _as_matrix(c, "dot", "c")
    C = np.ascontiguousarray(np.broadcast_to(C, lead)).reshape(-1, 1)
    out = _run(plan, A2, B2, C, True, "dot")
    return out.reshape(lead)


def sum(x, in_fmt, acc_fmt="fp32", out_fmt=None, *, axis=-1, model="sequential", block=128,
        inner="sequential", rounding="rne", subnormals=True, overflow=None, seed=None,
        splitk=1):
    """Sum along one axis (default the last; None: all) under a model.

    Examples
    --------
    >>> import fpemu
    >>> from fpemu import accumulate
    >>> x = [1.0] + [2.0**-11] * 1000           # fp16: 1 + 2**-11 is a tie, to 1
    >>> accumulate.sum(x, "fp16", "fp16").item()
    1.0
    >>> accumulate.sum(x, "fp16", "fp16", model="pairwise").item()
    1.48828125
    """
    X = _as_matrix(x, "sum", "x")
    if axis is None:
        X = X.reshape(-1)
        axis = 0
    if X.ndim == 0:
        raise FpemuValueError("sum(): needs an array with at least one axis")
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        hint = int(axis) if isinstance(axis, float) and axis.is_integer() else -1
        raise FpemuTypeError(f"sum(): axis must be an int or None, got {type(axis).__name__} "
                             f"{axis!r}; pass e.g. axis={hint}")
    if not -X.ndim <= axis < X.ndim:
        raise FpemuValueError(f"sum(): axis {axis} is out of range for an array of shape "
                              f"{X.shape}; pass an axis in {-X.ndim} .. {X.ndim - 1}, or None "
                              "for all")
    X = np.moveaxis(X, axis, -1)
    return dot(X, np.ones(X.shape[-1]), in_fmt, acc_fmt, out_fmt, model=model, block=block,
               inner=inner, rounding=rounding, subnormals=subnormals, overflow=overflow,
               seed=seed, splitk=splitk)


# ------------------------------------------------------ block-scaled GEMMs
@dataclasses.dataclass(frozen=True)
class BlockScaledCore:
    """A block-scaled tensor-core instruction (MMA-Sim, Xie et al. 2025).

    ``k`` products per instruction, chained through the fp32 accumulator.
    With ``group == 0`` (``kind::mxf8f6f4``) every product ``a b`` times its
    two power-of-two scales is a term whose exponent is ``e(a) + e(b) +
    e(scale_a) + e(scale_b)``, as in :class:`TensorCore`. With ``group > 0``
    (``kind::mxf4nvf4``) each run of ``group`` products is summed exactly
    and multiplied by the two scales; the term's exponent is that of the
    scales alone. The terms and the accumulator are truncated toward zero to
    ``fraction_bits`` below the largest exponent, summed, and the sum
    normalised and truncated to fp32.
    """

    name: str
    k: int
    group: int
    fraction_bits: int
    e_zero: int
    elems: tuple
    blocks: tuple
    source: str = ""


#: Blackwell's block-scaled tensor-core instructions (``tcgen05.mma``), with
#: MMA-Sim 2.1.1's parameters.
BLOCK_SCALED_CORES = {
    "b200-mxf8f6f4": BlockScaledCore(
        "b200-mxf8f6f4", 32, 0, 25, -133, ("e4m3fn", "e5m2", "e2m3", "e3m2", "e2m1"),
        ((32, "e8m0"),),
        "Blackwell tcgen05.mma kind::mxf8f6f4 (block32, ue8m0): 32 products per "
        "instruction, F = 25, truncation to fp32 (MMA-Sim's MMA_ST_FDPA)"),
    "b200-mxf4nvf4": BlockScaledCore(
        "b200-mxf4nvf4", 64, 16, 35, -139, ("e2m1",),
        ((16, "e4m3fn"), (16, "e8m0"), (32, "e8m0")),
        "Blackwell tcgen05.mma kind::mxf4nvf4: 64 products per instruction in groups of "
        "16 summed exactly and scaled, fused with F = 35, truncation to fp32 (MMA-Sim's "
        "MMA_GST_FDPA); NVFP4 is block16 with ue4m3 scales"),
}


def _scale_split(codes, fmt):
    """(significand, exponent) of scale codes as MMA-Sim normalises them:
    1 <= s < 2 (below the format's smallest normal: its emin and s < 1); a
    zero has s = 0; NaN has s = NaN. An e4m3fn scale is read as unsigned
    (UE4M3: the sign bit is ignored, as the hardware does)."""
    if fmt.name == "e4m3fn":
        codes = codes & np.uint8(0x7F)
    v = decode(codes, fmt).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, ex = np.frexp(np.where(np.isfinite(v) & (v > 0), v, 1.0))
    e = np.maximum(ex.astype(np.int64) - 1, fmt.emin if fmt.has_subnormals else -10**6)
    s = np.where(v > 0, np.ldexp(v, -e), v)
    return np.ascontiguousarray(s), np.ascontiguousarray(e)


def scaled_matmul(a_codes, a_scales, b_codes, b_scales, a_fmt, b_fmt=None, scale_fmt="e8m0",
                  *, block=32, model=None, c=None, alpha=None):
    """A block-scaled GEMM from codes: ``sum_k a[i,k] sa[i,k/block] b[k,j]
    sb[k/block,j]`` (plus ``c``), accumulated as ``model`` does, then times
    ``alpha`` (one float32 rounding, as a GEMM epilogue; NVFP4's product of
    tensor scales). Returns float32 (M, N).

    Parameters
    ----------
    a_codes, b_codes : integer arrays (M, K) and (K, N)
        Element codes of ``a_fmt`` / ``b_fmt`` (``fpemu.encode`` or
        :func:`fpemu.block.quantize_blocks`' codes; B blocked along K).
    a_scales, b_scales : integer arrays (M, K / block) and (K / block, N)
        Scale codes of ``scale_fmt``.
    model : {"b200-mxf8f6f4", "b200-mxf4nvf4", "exact"} or BlockScaledCore
        Default: ``b200-mxf4nvf4`` for e2m1 x e2m1 in blocks of 16, else
        ``b200-mxf8f6f4``. ``"exact"``: the exact sum, rounded once to fp32.
    c : array_like, optional
        Initial fp32 accumulator (broadcast to (M, N)).

    A K that is not a multiple of the instruction's is padded with zeros,
    as GEMM libraries do. NaN results are the canonical 0x7FFFFFFF.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import accumulate, block
    >>> rng = np.random.default_rng(0)
    >>> a = rng.standard_normal((2, 64)).astype(np.float32)
    >>> b = rng.standard_normal((64, 3)).astype(np.float32)
    >>> qa, qb = block.quantize_blocks(a, "mxfp8"), block.quantize_blocks(b, "mxfp8", axis=0)
    >>> y = accumulate.scaled_matmul(*qa, *qb, "e4m3fn", block=32)
    >>> y.shape, y.dtype
    ((2, 3), dtype('float32'))
    >>> exact = accumulate.scaled_matmul(*qa, *qb, "e4m3fn", block=32, model="exact")
    >>> bool(np.all(np.abs(y - exact) <= np.abs(exact) * 2.0**-20))
    True
    """
    a_fmt = as_format(a_fmt)
    b_fmt = a_fmt if b_fmt is None else as_format(b_fmt)
    scale_fmt = as_format(scale_fmt)
    Ac, Bc = np.asarray(a_codes), np.asarray(b_codes)
    As, Bs = np.asarray(a_scales), np.asarray(b_scales)
    for name, arr in (("a_codes", Ac), ("b_codes", Bc), ("a_scales", As), ("b_scales", Bs)):
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise FpemuValueError(f"scaled_matmul(): {name} must be a 2-D array of integer "
                                  f"codes; got {arr.dtype} of shape {arr.shape} (encode values "
                                  "with fpemu.encode or fpemu.block.quantize_blocks)")
    M, K = Ac.shape
    N = Bc.shape[1]
    if not (isinstance(block, (int, np.integer)) and block >= 1):
        raise FpemuValueError(f"scaled_matmul(): block must be an int >= 1, got {block!r}")
    nb = -(-K // block)
    if Bc.shape[0] != K or As.shape != (M, nb) or Bs.shape != (nb, N):
        raise FpemuValueError(
            f"scaled_matmul(): shapes do not agree: a_codes {Ac.shape}, a_scales {As.shape}, "
            f"b_codes {Bc.shape}, b_scales {Bs.shape}; expected (M, K), (M, ceil(K/block)), "
            f"(K, N), (ceil(K/block), N) with block={block}")
    if model is None:
        model = ("b200-mxf4nvf4" if a_fmt.name == b_fmt.name == "e2m1" and block == 16
                 else "b200-mxf8f6f4")
    if isinstance(model, str):
        if model.lower() == "exact":
            core = None
        elif model.lower() in BLOCK_SCALED_CORES:
            core = BLOCK_SCALED_CORES[model.lower()]
        else:
            raise FpemuValueError(f"scaled_matmul(): unknown model {model!r}; choose one of "
                                  f"{', '.join(BLOCK_SCALED_CORES)}, exact")
    elif isinstance(model, BlockScaledCore):
        core = model
    else:
        raise FpemuTypeError(f"scaled_matmul(): model must be a name or a BlockScaledCore, got "
                             f"{type(model).__name__}")
    if core is not None:
        if a_fmt.name not in core.elems or b_fmt.name not in core.elems:
            raise FpemuValueError(f"scaled_matmul(): {core.name} takes elements in "
                                  f"{', '.join(core.elems)}; got {a_fmt.name} x {b_fmt.name}")
        if (block, scale_fmt.name) not in core.blocks:
            ok = ", ".join(f"block={b} with {f}" for b, f in core.blocks)
            raise FpemuValueError(f"scaled_matmul(): {core.name} takes {ok}; got block={block} "
                                  f"with {scale_fmt.name}")
    A = decode(Ac, a_fmt).astype(np.float64)
    B = decode(Bc, b_fmt).astype(np.float64)
    sa_s, sa_e = _scale_split(As, scale_fmt)
    sb_s, sb_e = _scale_split(Bs, scale_fmt)
    C = np.zeros((M, N)) if c is None else np.broadcast_to(
        np.asarray(c, np.float32).astype(np.float64), (M, N))
    C = np.ascontiguousarray(C)
    full_a = np.repeat(sa_s * np.exp2(sa_e.astype(np.float64)), block, axis=1)[:, :K]
    full_b = np.repeat(sb_s * np.exp2(sb_e.astype(np.float64)), block, axis=0)[:K]
    As_v, Bs_v = A * full_a, B * full_b                       # exact: powers of two, e4m3
    finite = np.isfinite(As_v).all() and np.isfinite(Bs_v).all() and np.isfinite(C).all()
    special = None
    if not finite:
        with np.errstate(all="ignore"):
            special = As_v @ Bs_v + C
        bad = (~np.isfinite(As_v).all(axis=1))[:, None] | (~np.isfinite(Bs_v).all(axis=0))[None]
        bad |= ~np.isfinite(C)
        As_v = np.where(np.isfinite(As_v), As_v, 0.0)
        Bs_v = np.where(np.isfinite(Bs_v), Bs_v, 0.0)
        A = np.where(np.isfinite(A), A, 0.0)
        B = np.where(np.isfinite(B), B, 0.0)
        C = np.where(np.isfinite(C), C, 0.0)
    if core is None:
        out = _run(_plan("fp32", model="exact", fname="scaled_matmul"), As_v,
                   np.ascontiguousarray(Bs_v.T), C, False, check=False) if K else \
            C.astype(np.float32)
    else:
        Kp = -(-K // core.k) * core.k if K else 0
        out = np.empty((M, N), np.float32)
        if Kp == 0:
            out[:] = C
        elif core.group == 0:
            pad = Kp - K
            Ap = np.pad(As_v, ((0, 0), (0, pad)))
            Bp = np.pad(Bs_v, ((0, pad), (0, 0)))
            EA = _exponents(A, a_fmt.emin) + np.repeat(sa_e, block, axis=1)[:, :K]
            EB = _exponents(B, b_fmt.emin) + np.repeat(sb_e, block, axis=0)[:K]
            EA = np.pad(np.where(As_v == 0, _ak.ZERO_EXPONENT, EA), ((0, 0), (0, pad)),
                        constant_values=_ak.ZERO_EXPONENT)
            EB = np.pad(np.where(Bs_v == 0, _ak.ZERO_EXPONENT, EB), ((0, pad), (0, 0)),
                        constant_values=_ak.ZERO_EXPONENT)
            run_kernel(_ak.tc_matmul, np.ascontiguousarray(Ap), np.ascontiguousarray(EA),
                       np.ascontiguousarray(Bp), np.ascontiguousarray(EB), C, out, core.k,
                       core.fraction_bits, 23, core.e_zero, inputs=5)
        else:
            pad = Kp - K
            nbp = Kp // block
            Ap = np.ascontiguousarray(np.pad(A, ((0, 0), (0, pad))))
            Bp = np.ascontiguousarray(np.pad(B, ((0, pad), (0, 0))))

            def padded(s, e, axis):
                width = [(0, 0), (0, 0)]
                width[axis] = (0, nbp - s.shape[axis])
                return (np.ascontiguousarray(np.pad(s, width, constant_values=1.0)),
                        np.ascontiguousarray(np.pad(e, width)))

            SAs, SAe = padded(sa_s, sa_e, 1)
            SBs, SBe = padded(sb_s, sb_e, 0)
            run_kernel(_ak.gst_matmul, Ap, Bp, SAs, SAe, SBs, SBe, C, out, core.group,
                       core.k, core.fraction_bits, core.e_zero, block, inputs=7)
    if special is not None:
        out = np.where(bad, special.astype(np.float32), out)
    if alpha is not None:
        with np.errstate(all="ignore"):
            out = (out * np.float32(alpha)).astype(np.float32)
    nan = np.isnan(out)
    if nan.any():
        out = out.copy()
        out.view(np.uint32)[nan] = np.uint32(0x7FFFFFFF)
    return out


def bmm_fp32_sequential(A, B):
    """``A @ B`` for float32 batches A (batch, M, K) and B (batch, K, N) under
    the ``"sequential"`` model in fp32 (each product and each sum rounded to
    float32 in index order, starting from -0; an empty sum is +0), with no
    argument checks: the batched kernel behind ``fpemu.autograd``'s matmul.
    Equal to ``matmul(a, b, "fp32")`` of each batch element. B must be
    C-contiguous; A may also be the transposed view of a C-contiguous
    (batch, K, M) array (``g.swapaxes(1, 2)``), which is read in place.
    float64 batches (both) give the same order in float64."""
    dt = np.float64 if A.dtype == np.float64 and B.dtype == np.float64 else np.float32
    out = np.empty((A.shape[0], A.shape[1], B.shape[2]), dt)
    if out.size:
        At = A.swapaxes(1, 2)
        trans_a = not A.flags.c_contiguous and At.flags.c_contiguous
        run_kernel(_ak.bmm_sequential, At if trans_a else A, B, out, trans_a, inputs=2)
    return out
