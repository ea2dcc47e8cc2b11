"""fpemu.torch's Triton kernels on a GPU: bit-exactness, then speed (issue 50).

``make gpu-check`` runs this as its ``triton`` step; alone::

    python bench/triton_check.py --out DIR [--small]

1. **Bits.** ``fpemu.torch.quantize`` / ``encode`` / ``decode`` of CUDA tensors
   (the fused Triton kernels) against ``fpemu``'s Numba kernels on the host,
   every format, to nearest, toward zero and stochastically (Philox), on
   the edge sets of ``fpemu.testing.strategies.edge_inputs`` and random bit
   patterns; ``quantize_blocks`` of every preset (nearest and srN), and the
   Philox draws of srN against the host's. Mismatches are counted.
2. **Speed**, 2**26 float32 (CUDA events, medians): ``quantize`` / ``encode``
   to nearest and stochastic in bf16, fp16, e4m3fn, e5m2, e2m1, e8m0 against
   torch's ``.to(torch.bfloat16)``, with GB/s beside the GPU's bandwidth;
   ``quantize_blocks`` MXFP8 and NVFP4 against torchao's casts of the same
   tensor; an emulated NVFP4 step of a GPT-2-small-shaped block (d 768, 12
   heads, seq 1024, batch 8) against a plain bf16 autocast step. The targets:
   >= 0.5x (nearest), >= 0.4x (stochastic), >= 0.5x torchao, <= 1.5x.

Without a GPU (the dry run of ``make test``, ``gpu_check.py --host``) the same
code runs on small CPU tensors routed to the kernels under Triton's
interpreter (``TRITON_INTERPRET=1``): it checks that the script works, and
its bits; its timings mean nothing.
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
from fpemu.torch import _quantize  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
MODES = ({}, {"rounding": "rna"}, {"rounding": "rtz"}, {"rounding": "rup"},
         {"rounding": "rdn"}, {"rounding": "rto"}, {"rounding": "sr", "seed": (5, 9)},
         {"rounding": "sr", "seed": (5, 9), "rng": "philox"})
SPEED_FORMATS = ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1", "e8m0")


def _route_cpu_to_triton():
    """Without a GPU: CPU tensors go to the Triton kernels (interpreter)."""
    if not CUDA:
        _quantize.CPU_KERNELS = False
        _quantize.TRITON_DEVICES = ("cuda", "cpu")


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
    """Median seconds of ``fn`` (CUDA events on a GPU)."""
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


def speed(small, repeats):
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
    X = x.reshape(-1, 1024)
    if not CUDA:
        return n, rows                          # (the dry run: the blocks are checked above)
    rows["quantize_blocks mxfp8"] = _time(lambda: ft.quantize_blocks(X, "mxfp8"), repeats)
    rows["quantize_blocks nvfp4"] = _time(lambda: ft.quantize_blocks(X, "nvfp4"), repeats)
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode as M
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import (
            nvfp4_quantize,
            per_tensor_amax_to_scale,
        )
        rows["torchao to_mx mxfp8"] = _time(
            lambda: to_mx(X, torch.float8_e4m3fn, 32, M.FLOOR), repeats)
        rows["torchao nvfp4_quantize"] = _time(
            lambda: nvfp4_quantize(X, 16, per_tensor_amax_to_scale(X.abs().max())), repeats)
    except ImportError as err:
        rows["torchao"] = f"not installed ({err})"
    return n, rows


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


def block_step(small, repeats):
    d, heads, seq, batch = ((32, 2, 16, 1) if not CUDA else (64, 4, 64, 2)) if small else (
        768, 12, 1024, 8)
    torch.manual_seed(0)
    model = Gpt2Block(d, heads).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, d, device=DEVICE)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    plain = _time(step, repeats)
    with ft.emulate(model, "nvfp4"):
        emulated = _time(step, repeats)
    return {"shape": [batch, seq, d, heads], "plain bf16 autocast s": plain,
            "emulated nvfp4 s": emulated, "ratio": emulated / plain}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "triton_check"))
    ap.add_argument("--small", action="store_true", help="small sizes (always without a GPU)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    small = args.small or not CUDA
    repeats = 1 if not CUDA else args.repeats
    _route_cpu_to_triton()
    os.makedirs(args.out, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(0) if CUDA else "cpu (Triton interpreter)",
           "torch": torch.__version__, "small": small}
    t0 = time.monotonic()
    res["bits"] = check_bits(small)
    wrong = {k: v for k, v in res["bits"].items() if v}
    print(f"bits: {len(res['bits'])} checks, {len(wrong)} with mismatches "
          f"({time.monotonic() - t0:.0f} s){': ' + str(wrong) if wrong else ''}")
    n, rows = speed(small, repeats)
    res["speed"] = {"elements": n, "seconds": rows}
    base = rows["torch .to(bfloat16)"]
    lines = [f"{k:34s} {v * 1e3:9.3f} ms {base / v:6.2f}x  {n * 8 / v / 1e9:7.1f} GB/s"
             for k, v in rows.items() if isinstance(v, float)]
    print("\n".join(lines))
    res["block_step"] = block_step(small, max(1, repeats // 4))
    print(f"GPT-2 block step {res['block_step']['shape']}: plain bf16 autocast "
          f"{res['block_step']['plain bf16 autocast s'] * 1e3:.1f} ms, emulated nvfp4 "
          f"{res['block_step']['emulated nvfp4 s'] * 1e3:.1f} ms "
          f"({res['block_step']['ratio']:.2f}x; target <= 1.5x)")
    with open(os.path.join(args.out, "triton_check.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
