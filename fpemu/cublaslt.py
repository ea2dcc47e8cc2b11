"""Which split of K cuBLASLt picks for an fp8 GEMM: recorded facts.

cuBLASLt's heuristic (``cublasLtMatmulAlgoGetHeuristic``) may run a GEMM as
a split-K kernel: K cut into parts, each accumulated separately, the partial
sums added at the end (:class:`fpemu.accumulate.SplitK`). The choice depends
on the GPU, its SM count, the cuBLASLt version, the workspace the caller
allows, the operand and output dtypes and fast or slow accumulation; it is
not a function of the shape alone, and no rule written from the shape
reproduces it. So fpemu reads it from a recorded table: the heuristic's
answers on an **NVIDIA H100 PCIe** (114 SMs, driver 570.148.08, cuBLASLt
12.8.3.14, torch 2.7.1's ``_scaled_mm`` descriptor) for 28,018 shapes under
each of the 28 fp8 settings, recorded by mmaemu 0.1.0's authors (the
``heur_h100pcie_lt12.8.3.14`` table of the ``mmaemu`` package; fpemu ships the
decisions as data, ``scripts/export_cublaslt_splitk.py``).

The decision for a GEMM comes, in order, from

1. the workspace: without one (``workspace=0``) cuBLASLt never splits;
2. the table, when it holds the shape (``source="table"``);
3. its sweep's envelope: above a bound ``B(setting, K)`` on ``M * N`` no
   split was ever seen for 1,024 <= K <= 4,194,304 (``source="envelope"``;
   held out and validated at 1 MiB, not at 32 MiB);
4. otherwise nothing is known: ``S = 1`` with ``source="unrecorded"``, and
   the note says so (a GPU run of ``make gpu-check`` records the truth).

For example, 64x128x8192 splits three ways, 5000x5000x4000 is above the bound:

>>> from fpemu import cublaslt
>>> d = cublaslt.splitk_decision(64, 128, 8192, "e4m3fn", "e4m3fn", "bfloat16", fast=True)
>>> d.splits, d.source
(3, 'table')
>>> cublaslt.splitk_decision(5000, 5000, 4000, "e4m3fn", "e4m3fn", "bfloat16").source
'envelope'
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources

import numpy as np

from .accumulate import SplitK
from .errors import FpemuTypeError, FpemuValueError

__all__ = ["SplitDecision", "UnrecordedSplitWarning", "splitk_decision", "TABLE", "WORKSPACES",
           "gemm16_decision", "GEMM16_SPLITS", "GEMM16_UNSPLIT_UP_TO", "tf32_decision",
           "TF32_SPLITS"]


class UnrecordedSplitWarning(UserWarning):
    """A GEMM ran unsplit because cuBLASLt's split of its shape is not
    recorded (``splitk_decision(...).source == "unrecorded"``): the GPU may
    split it, and then its last bits differ. Pass ``splitk=`` an int to choose,
    or silence it with ``warnings.simplefilter("ignore", UnrecordedSplitWarning)``."""


#: Where the decisions were recorded (the table's own metadata).
TABLE = "H100 PCIe (114 SMs), driver 570.148.08, cuBLASLt 12.8.3.14, torch 2.7.1+cu128"

#: The workspaces recorded: torch's default (1 MiB in torch 2.7) and
#: TransformerEngine's (32 MiB); 0 never splits.
WORKSPACES = (0, 1 << 20, 32 << 20)

_FMTS = {"e4m3fn": 0, "float8_e4m3fn": 0, "e4m3": 0, "e5m2": 1, "float8_e5m2": 1}
_OUTS = {"float32": 0, "fp32": 0, "bfloat16": 1, "bf16": 1, "float16": 2, "fp16": 2,
         "half": 2, "float8_e4m3fn": 3, "e4m3fn": 3, "float8_e5m2": 4, "e5m2": 4}
_OUT_NAMES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
_FMT_NAMES = ("float8_e4m3fn", "float8_e5m2")


@dataclasses.dataclass(frozen=True)
class SplitDecision:
    """cuBLASLt's split of one GEMM: ``splits`` parts, where the answer came
    from (``"workspace0"``, ``"table"``, ``"envelope"``, ``"unrecorded"``)
    and a note saying why."""

    splits: int
    source: str
    note: str
    tile: int = 128

    @property
    def splitk(self) -> SplitK:
        """The :class:`fpemu.accumulate.SplitK` to pass as ``splitk=``."""
        return SplitK(self.splits, self.tile)


@functools.lru_cache(maxsize=1)
def _table():
    with resources.files("fpemu").joinpath("data/cublaslt_splitk_h100pcie.npz").open("rb") as f:
        z = np.load(f)
        t = {k: z[k] for k in z.files}
    t["about"] = json.loads(str(t["about"]))
    s = t["settings"].astype(np.int64)
    t["setting_codes"] = ((s[:, 0] * 2 + s[:, 1]) * 5 + s[:, 2]) * 2 + s[:, 3]
    sh = t["shapes"].astype(np.int64)
    t["shape_keys"] = (sh[:, 0] << 42) | (sh[:, 1] << 21) | sh[:, 2]
    return t


def _dtype_name(x, what, names):
    s = str(getattr(x, "name", x)).split(".")[-1].lower()
    if s not in names:
        raise FpemuValueError(f"splitk_decision(): {what} must be one of "
                              f"{', '.join(sorted(set(names)))}; got {x!r}")
    return names[s]


#: The largest GEMM dimension: torch's sizes (and cuBLASLt's layouts) are int64.
DIM_MAX = 2 ** 63 - 1


def _dim(v, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise FpemuTypeError(f"splitk_decision(): {what} must be an int >= 0, got {v!r} "
                             f"({type(v).__name__})")
    if not 0 <= v <= DIM_MAX:
        raise FpemuValueError(f"splitk_decision(): {what} must be an int in [0, 2**63 - 1] "
                              f"(a tensor size), got {v!r}")
    return int(v)


def splitk_decision(M, N, K, a_dtype="float8_e4m3fn", b_dtype="float8_e4m3fn",
                    out_dtype=None, *, fast=False, workspace=1 << 20) -> SplitDecision:
    """The split-K cuBLASLt 12.8.3.14 picks on an H100 PCIe for
    ``torch._scaled_mm(a, b)`` with ``a`` (M, K) and ``b`` (K, N) (module text).

    Parameters
    ----------
    M, N, K : int
        The GEMM's shape.
    a_dtype, b_dtype : str
        ``float8_e4m3fn`` / ``e4m3fn`` or ``float8_e5m2`` / ``e5m2`` (or torch
        dtypes).
    out_dtype : str, optional
        float32, bfloat16, float16 or an fp8 dtype; None: ``a_dtype``, as torch.
    fast : bool
        ``use_fast_accum``.
    workspace : int
        cuBLASLt's workspace in bytes: 0, 1 MiB (torch's default at the
        recording) or 32 MiB (TransformerEngine's).

    Examples
    --------
    >>> from fpemu import cublaslt
    >>> cublaslt.splitk_decision(16, 64, 8192, out_dtype="float32").splits
    3
    >>> cublaslt.splitk_decision(16, 64, 8192, out_dtype="float32", workspace=0).source
    'workspace0'
    """
    M, N, K = _dim(M, "M"), _dim(N, "N"), _dim(K, "K")
    if not isinstance(fast, (bool, np.bool_)):
        raise FpemuTypeError(f"splitk_decision(): fast must be a bool (use_fast_accum), got "
                             f"{type(fast).__name__} {fast!r}")
    fa = _dtype_name(a_dtype, "a_dtype", _FMTS)
    fb = _dtype_name(b_dtype, "b_dtype", _FMTS)
    out = fa + 3 if out_dtype is None else _dtype_name(out_dtype, "out_dtype", _OUTS)
    if workspace not in WORKSPACES:
        raise FpemuValueError(f"splitk_decision(): workspace must be one of {WORKSPACES} bytes "
                              f"(the ones recorded), got {workspace!r}")
    t = _table()
    if workspace == 0:
        return SplitDecision(1, "workspace0", t["about"]["workspace0"])
    if min(M, N, K) == 0:
        return SplitDecision(1, "table", "an empty GEMM accumulates nothing")
    setting = ((fa * 2 + fb) * 5 + out) * 2 + int(bool(fast))
    name = (f"{_FMT_NAMES[fa]} x {_FMT_NAMES[fb]} -> {_OUT_NAMES[out]}, "
            f"{'fast' if fast else 'slow'} accumulation, workspace {workspace} B")
    col = np.searchsorted(t["setting_codes"], setting)
    if col >= len(t["setting_codes"]) or t["setting_codes"][col] != setting:
        return SplitDecision(1, "unrecorded",
                             f"cuBLASLt returned no algorithm for {name} on the {TABLE} "
                             "(CUBLAS_STATUS_NOT_SUPPORTED); nothing is known of its split")
    if max(M, N, K) < 1 << 21:
        key = (M << 42) | (N << 21) | K
        row = np.searchsorted(t["shape_keys"], key)
        if row < len(t["shape_keys"]) and t["shape_keys"][row] == key:
            S = int(t[f"splits_{workspace}"][row, col])
            return SplitDecision(S, "table", f"recorded on the {TABLE}: numSplitsK {S} for "
                                             f"{M}x{N}x{K}, {name}")
    env = t["about"]["envelope"]
    if env["K_min"] <= K <= env["K_max"]:
        i = int(np.searchsorted(t["envelope_k"], K, side="left"))
        B = int(t[f"bounds_{workspace}"][col, i])
        if B >= 0 and M * N > B:
            status = env["validation"][str(workspace)]
            return SplitDecision(1, "envelope", f"M*N = {M * N} is above the bound {B} at grid K = "
                                                f"{int(t['envelope_k'][i])} of {name}, where the "
                                                f"sweep saw no split ({status} on held-out shapes)")
    return SplitDecision(1, "unrecorded", f"{M}x{N}x{K} ({name}) is neither in the table of the "
                                          f"{TABLE} nor above its no-split bound: unsplit assumed, "
                                          "the GPU may split it")


# ------------------------------------------------------------ bf16 / fp16 GEMMs
#: bf16 / fp16 GEMMs with fp32 accumulation (``torch.mm``) on an NVIDIA H200,
#: torch 2.11.0+cu130 (cuBLAS of CUDA 13.0): the splits of K its probes showed
#: (bench/gpu_check/nvidia-h200-torch2.11.0, ``tests/test_gpu_probes.py``), keyed
#: by (M, N, K). The parts are whole 128-wide k-tiles, as in the fp8 split.
GEMM16_SPLITS = {(16, 16, 4096): 3, (16, 16, 8192): 6}

#: No probe of K up to this ran split: 16x2048x16 (one output tile, the shape
#: most likely to split) ran unsplit, and a larger output has more tiles to
#: share the SMs, so cuBLAS has less reason to split it.
GEMM16_UNSPLIT_UP_TO = 2048

GEMM16_TABLE = "NVIDIA H200 (132 SMs), torch 2.11.0+cu130, driver 580.159.04"


def gemm16_decision(M, N, K, dtype="bfloat16") -> SplitDecision:
    """The split of K cuBLAS makes for a bf16 / fp16 GEMM ``(M, K) @ (K, N)``
    with fp32 accumulation, as far as the H200 probes know it: a recorded
    shape gives its split (``source="table"``); K up to
    :data:`GEMM16_UNSPLIT_UP_TO` runs unsplit (``"observed"``); a longer K
    not recorded is assumed unsplit (``"unrecorded"``: the GPU may split it).

    >>> from fpemu import cublaslt
    >>> cublaslt.gemm16_decision(16, 16, 8192).splits
    6
    >>> cublaslt.gemm16_decision(64, 64, 512).source
    'observed'
    """
    M, N, K = _dim(M, "M"), _dim(N, "N"), _dim(K, "K")
    name = str(getattr(dtype, "name", dtype)).split(".")[-1].lower()
    if name not in ("bfloat16", "bf16", "float16", "fp16", "half"):
        raise FpemuValueError(f"gemm16_decision(): dtype must be bfloat16 or float16, got "
                              f"{dtype!r}; fp8 GEMMs are splitk_decision()'s")
    if (M, N, K) in GEMM16_SPLITS:
        S = GEMM16_SPLITS[(M, N, K)]
        return SplitDecision(S, "table", f"recorded on the {GEMM16_TABLE}: {S} parts for "
                                         f"{M}x{N}x{K}")
    if K <= GEMM16_UNSPLIT_UP_TO or min(M, N) == 0:
        return SplitDecision(1, "observed", f"K = {K} <= {GEMM16_UNSPLIT_UP_TO}: no probe on the "
                                            f"{GEMM16_TABLE} that short ran split")
    return SplitDecision(1, "unrecorded", f"{M}x{N}x{K} is not among the probes of the "
                                          f"{GEMM16_TABLE}: unsplit assumed, the GPU may split it")


# ------------------------------------------------------------------ TF32 GEMMs
#: float32 GEMMs with ``allow_tf32`` on the same H200 (``tests/test_gpu_probes_tf32.py``,
#: fitted by ``bench/fit_tf32.py``): the split of K its cuBLAS made, as (parts,
#: k-tile width), keyed by (M, N, K). The parts are contiguous runs of 32-wide
#: k-tiles, each accumulated from +0 (``accumulate.SplitK(S, tile=32)``).
TF32_SPLITS = {
    (16, 16, 16): (4, 4), (8, 8, 32): (1, 32), (16, 16, 32): (1, 32), (64, 64, 32): (1, 32),
    (128, 32, 32): (1, 32), (128, 64, 32): (1, 32), (64, 10, 64): (1, 32),
    (10, 64, 64): (2, 32), (16, 16, 64): (2, 32), (64, 32, 64): (2, 32), (128, 32, 64): (2, 32),
    (16, 16, 128): (4, 32), (32, 32, 128): (4, 32), (64, 32, 128): (4, 32),
    (16, 16, 256): (8, 32), (16, 16, 512): (16, 32), (16, 16, 1024): (16, 32),
    (16, 16, 2048): (22, 32), (16, 16, 4096): (22, 32), (16, 16, 8192): (52, 32),
}

#: Up to this K (a multiple of 32), 12 of the 13 recorded shapes with K from 64
#: on ran one 32-wide k-tile per part (64x10 at K = 64 ran unsplit): the rule
#: fpemu follows for a shape not recorded.
TF32_ONE_TILE_UP_TO = 512


def tf32_decision(M, N, K) -> SplitDecision:
    """The split of K cuBLAS makes for a float32 GEMM ``(M, K) @ (K, N)`` run
    on TF32 tensor cores, as far as the H200 probes know it: a recorded shape
    gives its split (``"table"``); an unrecorded K up to
    :data:`TF32_ONE_TILE_UP_TO` that is a multiple of 32 one 32-wide k-tile
    per part (``"rule"``: what 12 of 13 recorded shapes did); any other K
    (below 32 too: 16x16x16 ran as four runs of 4) is assumed unsplit
    (``"unrecorded"``).

    >>> from fpemu import cublaslt
    >>> d = cublaslt.tf32_decision(16, 16, 2048)
    >>> d.splits, d.tile, d.source
    (22, 32, 'table')
    >>> cublaslt.tf32_decision(48, 48, 96).splits
    3
    """
    M, N, K = _dim(M, "M"), _dim(N, "N"), _dim(K, "K")
    if (M, N, K) in TF32_SPLITS:
        S, tile = TF32_SPLITS[(M, N, K)]
        return SplitDecision(S, "table", f"recorded on the {GEMM16_TABLE}: {S} parts of "
                                         f"{tile}-wide k-tiles for {M}x{N}x{K}", tile)
    if min(M, N) == 0 or K <= 4 or K == 32:
        return SplitDecision(1, "rule", f"K = {K}: one chain (K = 32 ran so on every recorded "
                                        "shape; 4 or fewer products cannot be split)", 32)
    if K <= TF32_ONE_TILE_UP_TO and K % 32 == 0:
        return SplitDecision(K // 32, "rule", f"{M}x{N}x{K} is not recorded: one 32-wide "
                                              f"k-tile per part, as 12 of the 13 recorded "
                                              f"shapes with 64 <= K <= 512 ran", 32)
    return SplitDecision(1, "unrecorded", f"{M}x{N}x{K} is not among the TF32 probes of the "
                                          f"{GEMM16_TABLE}: unsplit assumed, the GPU may "
                                          "split it", 32)
