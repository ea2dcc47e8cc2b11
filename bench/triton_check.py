"""fpemu.torch's Triton kernels on a GPU: bit-exactness, then speed against
torchao, torch's casts and the memory bandwidth (issue 70).

``make gpu-check`` runs this as its ``triton`` step; alone::

    python bench/triton_check.py --out DIR [--small] [--repeats N] [--torchao-compile MODE]

It writes ``DIR/triton_check.json`` and prints each measurement with its
target and whether it is met; the last lines are a summary.

1. **Bits.** ``fpemu.torch.quantize`` / ``encode`` / ``decode`` of CUDA tensors
   (the fused Triton kernels) against ``fpemu``'s Numba kernels on the host,
   every format, to nearest, toward zero and stochastically (Philox), on
   the edge sets of ``fpemu.testing.strategies.edge_inputs`` and random bit
   patterns; ``quantize_blocks`` of every preset (nearest and srN), and the
   Philox draws of srN against the host's. Mismatches are counted.
2. **Block quantization** of an 8192 x 8192 float32 tensor (rows of
   magnitudes 2**-20 to 2**20), four configurations:

   * MXFP8: ``quantize_blocks(X, "mxfp8")`` (1-D blocks of 32), against
     torchao's ``to_mx(X, float8_e4m3fn, 32, FLOOR)``;
   * NVFP4: ``quantize_blocks(X, "nvfp4")`` (1-D blocks of 16), against
     torchao's ``nvfp4_quantize(X, 16, per_tensor_amax_to_scale(amax))``;
   * NVFP4 after the random Hadamard transform (TransformerEngine's RHT):
     ``quantize_blocks(hadamard(X), "nvfp4")`` with
     ``fpemu.torch._emulate.hadamard`` (TE's signs), against ``X`` times
     torchao's ``get_rht_matrix`` (TE's signs; a float32 matmul: its fused
     RHT kernel needs sm100) then ``nvfp4_quantize``;
   * NVFP4 2-D 16 x 16 weight tiles: ``quantize_blocks(X, "nvfp4",
     block=(16, 16))``, against torchao's 1-D ``nvfp4_quantize`` of the
     same tensor (torchao's 2-D cast needs sm100; the bytes are the same).

   Each: the median time (CUDA events); the share of the GPU's peak memory
   bandwidth, ``(bytes read + bytes written) / time / peak``, with the bytes
   those of the input and of what is returned (codes, scales, per-block
   clip flags; the RHT's intermediate tensor not counted, so its extra pass
   shows as a lower share); torchao's time and the ratio ``torchao time /
   fpemu time``, eager and, on a GPU, under ``torch.compile`` (both judged;
   ``--torchao-compile off`` skips the compiled one); and the codes, scales
   and clip flags of the device equal to the host's
   (``fpemu.block.quantize_blocks`` of ``X.cpu().numpy()``, after
   ``fpemu.block.hadamard`` for the RHT), mismatches counted. Targets:
   **>= 70 %** of the peak bandwidth, **>= 0.8x** torchao's speed.
3. **Element casts**, 2**26 float32: ``quantize`` / ``encode`` to nearest
   and stochastically in bf16, fp16, e4m3fn, e5m2, e2m1, e8m0 against
   torch's ``.to(torch.bfloat16)``; target: ``quantize`` to nearest **>=
   0.8x** ``.to(torch.bfloat16)`` (stochastic rounding and ``encode`` are
   recorded, without a target).
4. **A GPT-2-small block step** (pre-norm attention and 4x GELU MLP; d 768,
   12 heads, seq 1024, batch 8; forward, backward, AdamW), two settings:

   * float32 parameters under bf16 autocast: plain, and under
     ``fpemu.torch.emulate(model, "nvfp4")`` and ``"mxfp8"``;
   * bf16 parameters and input, no autocast (the setting torchao's MXFP8
     training takes: its wrapped weights are cast by ``to_mx`` outside
     autocast and its matmul wants both operands in one dtype): plain, under
     ``emulate(model, "mxfp8")``, and under torchao's emulated MXFP8 training
     (``quantize_(model, MXFP8TrainingOpConfig.from_recipe(
     MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL))``: every Linear's operands cast
     by ``to_mx`` and multiplied in high precision).

   Target: the NVFP4 step **<= 1.3x** the bf16 autocast step; the MXFP8
   ratios (to the plain steps, and torchao's time / fpemu's) are recorded
   without a target.

The peak bandwidth is ``2 * memory_clock_rate (kHz) * 1000 *
memory_bus_width / 8`` from ``torch.cuda.get_device_properties(0)``; a torch
without those attributes falls back to the vendor's figure by device name
(:data:`PEAK_BANDWIDTH_BY_NAME`), and the JSON says which was used.

``quantize_blocks`` runs fpemu's fused Triton block kernels
(``fpemu.torch._triton_blocks``); where that module does not import, the
block driver's torch code, and the JSON (``"quantize_blocks runs"``) says so.

torchao is optional: each of its calls that cannot run (not installed, a
kernel or a device it lacks) is recorded as ``"unavailable: reason"`` and
the script goes on.

Without a GPU (the dry run of ``make test``, ``gpu_check.py --host``) the same
code runs on small CPU tensors routed to the kernels under Triton's
interpreter (``TRITON_INTERPRET=1``): it checks that the script works, and
its bits; its timings mean nothing (the targets are judged all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"        # before fpemu's kernels are defined

import numpy as np  # noqa: E402

import fpemu  # noqa: E402
import fpemu.torch as ft  # noqa: E402
from fpemu import block  # noqa: E402
from fpemu.formats import FORMATS  # noqa: E402
from fpemu.testing.strategies import edge_inputs  # noqa: E402
from fpemu.torch import _blocks, _quantize  # noqa: E402
from fpemu.torch._emulate import hadamard  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
MODES = ({}, {"rounding": "rna"}, {"rounding": "rtz"}, {"rounding": "rup"},
         {"rounding": "rdn"}, {"rounding": "rto"}, {"rounding": "sr", "seed": (5, 9)},
         {"rounding": "sr", "seed": (5, 9), "rng": "philox"})
SPEED_FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1", "e8m0")
# issue 70's targets
BANDWIDTH_TARGET = 0.70          # quantize_blocks: share of the peak memory bandwidth
TORCHAO_TARGET = 0.8             # quantize_blocks: torchao time / fpemu time
ELEMENT_TARGET = 0.8             # quantize to nearest: .to(bfloat16) time / fpemu time
STEP_TARGET = 1.3                # emulated NVFP4 GPT-2 block step / bf16 autocast step
# the vendors' peak memory bandwidths (bytes/s), for a torch whose device
# properties lack memory_clock_rate / memory_bus_width: first substring match
PEAK_BANDWIDTH_BY_NAME = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12),
                          ("H100", 3.35e12), ("GH200", 4.0e12), ("B200", 8.0e12),
                          ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12),
                          ("A100", 1.555e12), ("L40S", 0.864e12))


def _route_cpu_to_triton():
    """Without a GPU: CPU tensors go to the Triton kernels (interpreter)."""
    if not CUDA:
        _quantize.CPU_KERNELS = False
        _quantize.TRITON_DEVICES = ("cuda", "cpu")


def _block_kernels():
    """Which code ``quantize_blocks`` runs on the device: fpemu's fused Triton
    block kernels (``fpemu.torch._triton_blocks``), or, where that module does
    not import, the block driver's torch code (said so in the JSON)."""
    try:
        from fpemu.torch import _triton_blocks  # noqa: F401
    except ImportError as err:
        _blocks._triton_blocks_for = lambda t: None
        return f"the block driver's torch code (fpemu.torch._triton_blocks: {err})"
    return "fpemu.torch._triton_blocks (fused Triton kernels)"


def _unavailable(err):
    return f"unavailable: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def check_bits(small):
    """{check: mismatch count} of the kernels against the host."""
    bad = {}
    rng = np.random.default_rng(0)
    # three modes (each configuration compiles a kernel, about a second on a GPU);
    # tests/test_triton_kernels.py checks every one on the CPU, under the interpreter
    modes = (MODES[0], MODES[2], MODES[-1])
    for fmt in FORMATS:
        x = np.concatenate([edge_inputs(fmt, per_kind=16 if small else 4096),
                            rng.integers(0, 1 << 32, 1 << (10 if small else 20),
                                         dtype=np.uint64).astype(np.uint32).view(np.float32)])
        if not fmt.has_nan:
            x = x[~np.isnan(x)]
        t = torch.from_numpy(x).to(DEVICE)
        for kw in modes:
            name = f"{fmt.name} {kw.get('rounding', 'rne')}{'/philox' if 'rng' in kw else ''}"
            q = ft.quantize(t, fmt, **kw).cpu().numpy().view(np.uint32)
            c = ft.encode(t, fmt, **kw)
            want = fpemu.quantize(x, fmt, **kw).view(np.uint32)
            wc = fpemu.encode(x, fmt, **kw)
            bad[f"quantize {name}"] = int((q != want).sum())
            bad[f"encode {name}"] = int((c.cpu().numpy() != wc).sum())
            d = ft.decode(c, fmt).cpu().numpy().view(np.uint32)
            bad[f"decode {name}"] = int((d != fpemu.decode(wc, fmt).view(np.uint32)).sum())
    x = (rng.standard_normal((64, 256) if small else (1024, 4096)) * 4).astype(np.float32)
    for preset in sorted(block.PRESETS):
        for kw in ({}, {"rounding": "sr8", "seed": 3}):
            want = block.quantize_blocks(x, preset, **kw)
            got = ft.quantize_blocks(torch.from_numpy(x).to(DEVICE), preset, **kw)
            bad[f"quantize_blocks {preset} {kw.get('rounding', 'rne')}"] = int(
                (got.codes.cpu().numpy() != want.codes).sum()
                + (got.scales.cpu().numpy() != want.scales).sum())
    return bad


def _time(fn, repeats):
    """Median seconds of ``fn`` (CUDA events on a GPU, after one call to warm
    up; the dry run's timings mean nothing: no warm-up there, to save time)."""
    if CUDA:
        fn()
    times = []
    for _ in range(repeats):
        if CUDA:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def peak_bandwidth():
    """(bytes/s, how it was found) of device 0's memory; (None, why) without one."""
    if not CUDA:
        return None, "no GPU (CPU dry run)"
    p = torch.cuda.get_device_properties(0)
    clock, bus = getattr(p, "memory_clock_rate", None), getattr(p, "memory_bus_width", None)
    if clock and bus:
        return (2 * clock * 1e3 * bus / 8,
                f"2 * memory_clock_rate {clock} kHz * memory_bus_width {bus} bits / 8")
    missing = "memory_clock_rate / memory_bus_width absent from this torch's device properties"
    for name, bw in PEAK_BANDWIDTH_BY_NAME:
        if name in p.name:
            return bw, f"{missing}: the vendor's figure for {name}"
    return None, f"{missing}, and {p.name!r} is not in PEAK_BANDWIDTH_BY_NAME"


def _nbytes(out):
    """Bytes of a tensor, or of the tensors of a tuple / TensorBlocks."""
    if isinstance(out, torch.Tensor):
        return out.nbytes
    if isinstance(out, (tuple, list)):
        return sum(_nbytes(o) for o in out if o is not None)
    return out.codes.nbytes + out.scales.nbytes + out.clipped.nbytes


# ------------------------------------------------------------ block quantization
def _torchao_casts():
    """{config: (label, function of X)} of torchao's casts, each or the whole a
    reason string where torchao cannot give it."""
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import (
            nvfp4_quantize,
            per_tensor_amax_to_scale,
        )
    except Exception as err:         # not installed, or its import fails on this machine
        return _unavailable(err)

    def mx(X):
        return to_mx(X, torch.float8_e4m3fn, 32, ScaleCalculationMode.FLOOR)

    def nv(X):
        return nvfp4_quantize(X, 16, per_tensor_amax_to_scale(X.abs().amax()))

    casts = {"mxfp8": ("to_mx(X, float8_e4m3fn, 32, FLOOR)", mx),
             "nvfp4": ("nvfp4_quantize(X, 16, per-tensor scale)", nv),
             "nvfp4 2-D": ("nvfp4_quantize(X, 16, per-tensor scale), 1-D: torchao's 2-D "
                           "cast needs sm100", nv)}
    try:
        from torchao.prototype.moe_training.nvfp4_training.hadamard_utils import get_rht_matrix
        R = get_rht_matrix(tuple(int(s) for s in block.TE_SIGNS), torch.device(DEVICE),
                           torch.float32, 16)

        def nv_rht(X):
            return nv((X.reshape(-1, 16) @ R).reshape(X.shape))
        casts["nvfp4 RHT"] = ("X @ get_rht_matrix(TE signs) (float32 matmul), then "
                              "nvfp4_quantize: its fused RHT kernel needs sm100", nv_rht)
    except Exception as err:
        casts["nvfp4 RHT"] = _unavailable(err)
    return casts


BLOCK_CONFIGS = (
    # name, torchao cast, fpemu on the device, fpemu on the host
    ("mxfp8 1-D 32", "mxfp8", lambda X: ft.quantize_blocks(X, "mxfp8"),
     lambda x: block.quantize_blocks(x, "mxfp8")),
    ("nvfp4 1-D 16", "nvfp4", lambda X: ft.quantize_blocks(X, "nvfp4"),
     lambda x: block.quantize_blocks(x, "nvfp4")),
    ("nvfp4 1-D 16 + RHT", "nvfp4 RHT", lambda X: ft.quantize_blocks(hadamard(X), "nvfp4"),
     lambda x: block.quantize_blocks(block.hadamard(x, 16, axis=1, signs="te"), "nvfp4")),
    ("nvfp4 2-D 16x16", "nvfp4 2-D", lambda X: ft.quantize_blocks(X, "nvfp4", block=(16, 16)),
     lambda x: block.quantize_blocks(x, "nvfp4", block=(16, 16))),
)


def _mismatches(got, want):
    """{field: count} of a TensorBlocks against the host's BlockQuantized."""
    out = {"codes": int((got.codes.cpu().numpy() != want.codes).sum()),
           "scales": int((got.scales.cpu().numpy() != want.scales).sum())}
    if want.clipped is not None:
        out["clipped"] = int((got.clipped.cpu().numpy() != want.clipped).sum())
    return out


def block_speed(small, repeats, peak, compile_torchao):
    """{config: measurements} of quantize_blocks against torchao and the bandwidth."""
    R, K = (64, 512) if small else (8192, 8192)
    g = torch.Generator().manual_seed(70)
    X = (torch.randn(R, K, generator=g)
         * torch.exp2(torch.randint(-20, 21, (R, 1), generator=g).float())).to(DEVICE)
    x = X.cpu().numpy()
    casts = _torchao_casts()
    compiled = {}
    out = {"shape": [R, K], "torchao": casts if isinstance(casts, str) else "imported"}
    for name, cast, run, host in BLOCK_CONFIGS:
        t0 = time.monotonic()
        q = run(X)
        rec = {"bits mismatches": _mismatches(q, host(x))}
        rec["fpemu s"] = t = _time(lambda: run(X), repeats)
        rec["bytes"] = nbytes = X.nbytes + _nbytes(q)
        rec["GB/s"] = nbytes / t / 1e9
        rec["bandwidth share"] = nbytes / t / peak if peak else None
        peer = casts if isinstance(casts, str) else casts[cast]
        if isinstance(peer, str):
            rec["torchao"] = peer
        else:
            rec["torchao"], fn = peer
            try:
                rec["torchao bytes"] = X.nbytes + _nbytes(fn(X))
                rec["torchao s"] = ta = _time(lambda: fn(X), repeats)
                rec["torchao / fpemu"] = ta / t
            except Exception as err:
                rec["torchao s"] = _unavailable(err)
            if compile_torchao:
                try:
                    if fn not in compiled:
                        compiled[fn] = torch.compile(fn)
                    rec["torchao compiled s"] = tc = _time(lambda: compiled[fn](X), repeats)
                    rec["torchao compiled / fpemu"] = tc / t
                except Exception as err:
                    rec["torchao compiled s"] = _unavailable(err)
            else:
                rec["torchao compiled s"] = "not run (" + (
                    "CPU dry run" if not CUDA else "--torchao-compile off") + ")"
        rec["wall s"] = time.monotonic() - t0
        out[name] = rec
    return out


# ------------------------------------------------------------ element casts
def element_speed(small, repeats):
    n = 1 << (14 if small else 26)
    x = torch.randn(n, device=DEVICE, generator=None) * 30
    rows = {"torch .to(bfloat16)": _time(lambda: x.to(torch.bfloat16), repeats),
            "torch .to(float8_e4m3fn)": _time(lambda: x.to(torch.float8_e4m3fn), repeats)}
    for fmt in SPEED_FORMATS if CUDA else SPEED_FORMATS[:1]:
        for kw in ({}, {"rounding": "sr", "seed": 1},
                   {"rounding": "sr", "seed": 1, "rng": "philox"}):
            tag = kw.get("rounding", "rne") + ("/philox" if "rng" in kw else "")
            rows[f"quantize {fmt} {tag}"] = _time(lambda: ft.quantize(x, fmt, **kw), repeats)
            rows[f"encode {fmt} {tag}"] = _time(lambda: ft.encode(x, fmt, **kw), repeats)
    return n, rows


# ------------------------------------------------------------ GPT-2 block step
class Gpt2Block(torch.nn.Module):
    """A GPT-2 block (pre-norm attention and a 4x GELU MLP) of nn.Linear layers."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, D // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def _stepper(model, x, autocast):
    """One training step of ``model`` on ``x`` (AdamW), under bf16 autocast or not."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def block_step(small, repeats):
    """Seconds of a GPT-2 block's training step: float32 parameters under bf16
    autocast (plain, fpemu NVFP4, fpemu MXFP8), and bf16 parameters without
    autocast, the setting torchao's MXFP8 training takes (its wrapped weights
    are cast by ``to_mx`` outside autocast, and its matmul wants both
    operands' dtypes equal): plain, fpemu MXFP8, torchao's emulated MXFP8."""
    # (torchao casts dim 1 of the activations in blocks of 32: batch * seq a multiple of 32)
    d, heads, seq, batch = ((32, 2, 32, 1) if not CUDA else (64, 4, 64, 2)) if small else (
        768, 12, 1024, 8)

    def fresh(dtype):
        torch.manual_seed(0)
        return Gpt2Block(d, heads).to(DEVICE, dtype)

    x = torch.randn(batch, seq, d, device=DEVICE)
    res = {"shape [batch, seq, d, heads]": [batch, seq, d, heads]}
    res["bf16 autocast s"] = _time(_stepper(fresh(torch.float32), x, True), repeats)
    for recipe in ("nvfp4", "mxfp8"):
        model = fresh(torch.float32)
        step = _stepper(model, x, True)
        with ft.emulate(model, recipe):
            res[f"fpemu {recipe} (autocast) s"] = _time(step, repeats)
    xb = x.to(torch.bfloat16)
    res["bf16 params s"] = _time(_stepper(fresh(torch.bfloat16), xb, False), repeats)
    model = fresh(torch.bfloat16)
    step = _stepper(model, xb, False)
    with ft.emulate(model, "mxfp8"):
        res["fpemu mxfp8 (bf16 params) s"] = _time(step, repeats)
    try:
        from torchao.prototype.moe_training.config import (
            MXFP8TrainingOpConfig,
            MXFP8TrainingRecipe,
        )
        from torchao.quantization import quantize_
        model = fresh(torch.bfloat16)
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(
            MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL))
        res["torchao mxfp8"] = ("quantize_(model, MXFP8TrainingOpConfig.from_recipe("
                                "MXFP8_EMULATED_RCEIL))")
        res["torchao mxfp8 emulated (bf16 params) s"] = _time(_stepper(model, xb, False),
                                                              repeats)
    except Exception as err:
        res["torchao mxfp8 emulated (bf16 params) s"] = _unavailable(err)
    plain, bf = res["bf16 autocast s"], res["bf16 params s"]
    for k in list(res):
        if k.startswith("fpemu") or k.startswith("torchao mxfp8 emulated"):
            if isinstance(res[k], float):
                res[k[:-2] + " / plain"] = res[k] / (plain if "autocast" in k else bf)
    tao = res["torchao mxfp8 emulated (bf16 params) s"]
    if isinstance(tao, float):
        res["torchao mxfp8 / fpemu mxfp8 (bf16 params)"] = tao / res[
            "fpemu mxfp8 (bf16 params) s"]
    return res


# ------------------------------------------------------------ targets
def _judge(check, value, op, target, unit):
    """One row of the targets table: met is None where the value is missing or
    there is no target (op None)."""
    if not isinstance(value, float) or op is None:
        met = None
    else:
        met = bool(value >= target if op == ">=" else value <= target)
    return {"check": check, "value": value, "target": f"{op} {target}" if op else None,
            "unit": unit, "met": met}


def targets(res):
    """Every judged ratio and share, with its target (None: issue 70 sets none)."""
    rows = []
    for name, rec in res["blocks"].items():
        if not isinstance(rec, dict):
            continue
        rows.append(_judge(f"quantize_blocks {name}: share of peak bandwidth",
                           rec["bandwidth share"], ">=", BANDWIDTH_TARGET, "share"))
        rows.append(_judge(f"quantize_blocks {name}: torchao time / fpemu time",
                           rec.get("torchao / fpemu", rec.get("torchao s", rec["torchao"])),
                           ">=", TORCHAO_TARGET, "x"))
        rows.append(_judge(f"quantize_blocks {name}: torchao compiled / fpemu",
                           rec.get("torchao compiled / fpemu", rec.get("torchao compiled s")),
                           ">=", TORCHAO_TARGET, "x"))
    sec = res["elements"]["seconds"]
    base = sec["torch .to(bfloat16)"]
    for k, v in sec.items():
        if k.startswith("quantize ") and k.endswith(" rne"):
            rows.append(_judge(f"{k}: .to(bfloat16) time / fpemu time", base / v,
                               ">=", ELEMENT_TARGET, "x"))
    st = res["block_step"]
    rows.append(_judge("GPT-2 block step: fpemu nvfp4 / bf16 autocast",
                       st["fpemu nvfp4 (autocast) / plain"], "<=", STEP_TARGET, "x"))
    rows.append(_judge("GPT-2 block step: fpemu mxfp8 / bf16 autocast",
                       st["fpemu mxfp8 (autocast) / plain"], None, None, "x"))
    rows.append(_judge("GPT-2 block step, bf16 params: fpemu mxfp8 / plain",
                       st["fpemu mxfp8 (bf16 params) / plain"], None, None, "x"))
    rows.append(_judge("GPT-2 block step, bf16 params: torchao mxfp8 / plain",
                       st.get("torchao mxfp8 emulated (bf16 params) / plain",
                              st["torchao mxfp8 emulated (bf16 params) s"]), None, None, "x"))
    rows.append(_judge("GPT-2 block step, bf16 params: torchao mxfp8 / fpemu mxfp8",
                       st.get("torchao mxfp8 / fpemu mxfp8 (bf16 params)",
                              st["torchao mxfp8 emulated (bf16 params) s"]), None, None, "x"))
    return rows


def _fmt(v, unit="x", scale=1.0, spec=".2f"):
    """A number as the tables show it; '-' for a missing one."""
    if not isinstance(v, float):
        return "-"
    if unit == "share":
        return f"{v * 100:.1f} %"
    return f"{v * scale:{spec}}{unit}"


def _verdict(met):
    return {True: "met", False: "NOT MET", None: "-"}[met]


def print_blocks(blocks, seconds):
    print(f"\nquantize_blocks of {blocks['shape']} float32 ({seconds:.0f} s); targets: "
          f">= {BANDWIDTH_TARGET:.0%} of peak bandwidth, torchao time / fpemu time >= "
          f"{TORCHAO_TARGET}x:")
    print(f"  {'config':20s} {'fpemu ms':>10s} {'GB/s':>7s} {'of peak':>8s} {'torchao ms':>10s} "
          f"{'ta/fpemu':>8s} {'compiled ms':>11s} {'tc/fpemu':>8s} {'bits':>5s}")
    for name, rec in blocks.items():
        if not isinstance(rec, dict):
            continue
        share = rec["bandwidth share"]
        print(f"  {name:20s} {_fmt(rec['fpemu s'], '', 1e3, '.3f'):>10s} {rec['GB/s']:7.1f} "
              f"{_fmt(share, 'share'):>8s} {_fmt(rec.get('torchao s'), '', 1e3, '.3f'):>10s} "
              f"{_fmt(rec.get('torchao / fpemu')):>8s} "
              f"{_fmt(rec.get('torchao compiled s'), '', 1e3, '.3f'):>11s} "
              f"{_fmt(rec.get('torchao compiled / fpemu')):>8s} "
              f"{sum(rec['bits mismatches'].values()):5d}")
    for name, rec in blocks.items():
        if isinstance(rec, dict):
            print(f"    {name}: torchao {rec['torchao']}")
            for k in ("torchao s", "torchao compiled s"):
                if isinstance(rec.get(k), str):
                    print(f"    {name}: {k[:-2]}: {rec[k]}")
    if blocks["torchao"] != "imported":
        print(f"    torchao: {blocks['torchao']}")


def print_elements(n, rows, peak):
    base = rows["torch .to(bfloat16)"]
    print(f"\nelement casts of {n} float32 (bytes: 4 read, the output's written); target: "
          f"quantize to nearest >= {ELEMENT_TARGET}x .to(bfloat16), the others none:")
    for k, v in rows.items():
        out_bytes = 2 if "bfloat16" in k else 1 if "float8" in k else 4 if "quantize" in k else (
            ft.encode(torch.zeros(1, device=DEVICE), k.split()[1]).element_size())
        gbs = n * (4 + out_bytes) / v / 1e9
        judged = k.startswith("quantize ") and k.endswith(" rne")
        met = _verdict(base / v >= ELEMENT_TARGET) if judged else "-"
        print(f"  {k:30s} {v * 1e3:9.3f} ms {base / v:6.2f}x {gbs:7.1f} GB/s"
              + (f" {gbs * 1e9 / peak:6.1%} of peak" if peak else "") + f"  {met}")


def print_step(st):
    print(f"\nGPT-2 block step, [batch, seq, d, heads] = {st['shape [batch, seq, d, heads]']}; "
          f"target: fpemu nvfp4 <= {STEP_TARGET}x the bf16 autocast step, the others none:")
    for k, v in st.items():
        if k.endswith(" s"):
            ratio = st.get(k[:-2] + " / plain")
            print(f"  {k[:-2]:38s} " + (f"{v * 1e3:9.1f} ms" if isinstance(v, float) else v)
                  + (f"  {ratio:5.2f}x plain" if ratio else ""))
    if "torchao mxfp8" in st:
        print(f"    torchao mxfp8: {st['torchao mxfp8']}")


def print_targets(rows):
    print(f"\ntargets (issue 70){'' if CUDA else ', CPU dry run: timings mean nothing'}:")
    for r in rows:
        if r["target"] is None:
            target = "none"
        elif r["unit"] == "share":
            target = f"{r['target'][:2]} {float(r['target'][3:]):.0%}"
        else:
            target = r["target"] + "x"
        value = _fmt(r["value"], r["unit"]) if isinstance(r["value"], float) else "not measured"
        print(f"  {r['check']:62s} {value:>9s}  {target:8s} {_verdict(r['met'])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "triton_check"))
    ap.add_argument("--small", action="store_true", help="small sizes (always without a GPU)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--torchao-compile", choices=("auto", "on", "off"), default="auto",
                    help="time torchao's casts under torch.compile too (auto: on a GPU only)")
    args = ap.parse_args(argv)
    small = args.small or not CUDA
    repeats = 1 if not CUDA else args.repeats
    compile_torchao = args.torchao_compile == "on" or (args.torchao_compile == "auto" and CUDA)
    _route_cpu_to_triton()
    os.makedirs(args.out, exist_ok=True)
    peak, peak_how = peak_bandwidth()
    res = {"device": torch.cuda.get_device_name(0) if CUDA else "cpu (Triton interpreter)",
           "torch": torch.__version__, "small": small, "repeats": repeats,
           "peak bandwidth B/s": peak, "peak bandwidth from": peak_how,
           "quantize_blocks runs": _block_kernels()}
    try:
        import torchao
        res["torchao"] = torchao.__version__
    except Exception as err:
        res["torchao"] = _unavailable(err)
    print(f"{res['device']}, torch {res['torch']}, torchao {res['torchao']}")
    print(f"peak bandwidth: {_fmt(peak, ' GB/s', 1e-9, '.0f')} ({peak_how})")
    print(f"quantize_blocks runs {res['quantize_blocks runs']}"
          + ("" if CUDA else "\ndry run: the timings mean nothing"))

    t0 = time.monotonic()
    res["bits"] = check_bits(small)
    wrong = {k: v for k, v in res["bits"].items() if v}
    print(f"bits: {len(res['bits'])} checks, {len(wrong)} with mismatches "
          f"({time.monotonic() - t0:.0f} s){': ' + str(wrong) if wrong else ''}")

    t0 = time.monotonic()
    res["blocks"] = blocks = block_speed(small, repeats, peak, compile_torchao)
    print_blocks(blocks, time.monotonic() - t0)
    for name, rec in blocks.items():
        if isinstance(rec, dict):
            wrong.update({f"quantize_blocks {name}, {blocks['shape']}: {k}": v
                          for k, v in rec["bits mismatches"].items() if v})

    n, rows = element_speed(small, repeats)
    res["elements"] = {"elements": n, "seconds": rows}
    print_elements(n, rows, peak)

    res["block_step"] = st = block_step(small, max(1, repeats // 4))
    print_step(st)

    res["targets"] = rows = targets(res)
    print_targets(rows)
    met = sum(r["met"] is True for r in rows)
    missed = sum(r["met"] is False for r in rows)
    judged = sum(r["target"] is not None for r in rows)
    res["bits mismatches"] = wrong
    res["summary"] = summary = (
        f"targets: {met} met, {missed} not met, {judged - met - missed} not measured "
        f"(of {judged}){'' if CUDA else ' (CPU dry run: timings mean nothing)'}; bits: "
        f"{len(wrong)} checks with mismatches")
    with open(os.path.join(args.out, "triton_check.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(summary)
    # (gpu_check.py shows the last lines of stdout + stderr: torchao's import warnings
    # go to stderr, so the summary goes there too)
    print(summary, file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
