"""Time fpemu.block and the block-scaled GEMM against their peers, in one run.

Quantization: a 2048 x 4096 float32 tensor (standard normal, rows scaled over
2**-20 .. 2**20) to MXFP8 / MXFP4 (floor and rceil scales) and NVFP4, by
``fpemu.block.quantize_blocks`` and by torchao's eager CPU code (``to_mx``,
``nvfp4_quantize``), which give the same codes. GEMM: NVFP4 (M, K, N) =
(64, 1024, 64) and MXFP8 (64, 1024, 64) on Blackwell's block-scaled models, by
``fpemu.accumulate.scaled_matmul`` and by MMA-Sim's ``tcgen05.mma`` model,
bit-identical results. Median of the repeats, million elements (or
multiply-adds) per second, and the ratio fpemu / peer.

    python bench/bench_block.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
from bench_quantize import timed  # this folder is on sys.path when run as a script


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    import numba
    import torch

    from fpemu import accumulate, block
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    print(f"threads: numba {numba.get_num_threads()}, torch {torch.get_num_threads()}")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2048, 4096)) * np.exp2(rng.integers(-20, 20, (2048, 1)))).astype(
        np.float32)
    n = x.size
    rows = []
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode as M
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import (
            nvfp4_quantize,
            per_tensor_amax_to_scale,
        )
        t = torch.tensor(x)
        peers = {
            ("mxfp8", "floor"): lambda: to_mx(t, torch.float8_e4m3fn, 32, M.FLOOR),
            ("mxfp8", "rceil"): lambda: to_mx(t, torch.float8_e4m3fn, 32, M.RCEIL),
            ("mxfp4", "floor"): lambda: to_mx(t, torch.float4_e2m1fn_x2, 32, M.FLOOR),
            ("nvfp4-torchao", None): lambda: nvfp4_quantize(
                t, 16, per_tensor_amax_to_scale(t.abs().max())),
        }
    except ImportError as err:
        print(f"torchao not installed ({err}): fpemu timed alone")
        peers = {}
    cases = [("mxfp8", "floor"), ("mxfp8", "rceil"), ("mxfp4", "floor"), ("nvfp4", None),
             ("nvfp4-torchao", None), ("nvfp4-4over6", None)]
    print(f"\nblock quantization of {x.shape[0]} x {x.shape[1]} float32 values (M/s)")
    print(f"{'preset':16s} {'rule':7s} {'fpemu':>8s} {'torchao':>8s} {'ratio':>6s}")
    for preset, rule in cases:
        s = timed(lambda: block.quantize_blocks(x, preset, scale_rule=rule), args.repeats)
        f = n / s / 1e6
        p = peers.get((preset, rule))
        tp = n / timed(p, args.repeats) / 1e6 if p else None
        rows.append((preset, rule, f, tp))
        print(f"{preset:16s} {rule or '':7s} {f:8.1f} "
              + (f"{tp:8.1f} {f / tp:6.2f}" if tp else f"{'-':>8s} {'-':>6s}"))
    M_, K, N = 64, 1024, 64
    a = rng.standard_normal((M_, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    print(f"\nblock-scaled GEMM ({M_}, {K}, {N}), million multiply-adds per second")
    print(f"{'model':16s} {'fpemu':>8s} {'MMA-Sim':>8s} {'ratio':>6s}")
    for model, preset, fmt, sf, bk in (("b200-mxf4nvf4", "nvfp4", "e2m1", "e4m3fn", 16),
                                       ("b200-mxf8f6f4", "mxfp8", "e4m3fn", "e8m0", 32)):
        qa = block.quantize_blocks(a, preset)
        qb = block.quantize_blocks(b, preset, axis=0)
        fp = timed(lambda: accumulate.scaled_matmul(*qa, *qb, fmt, scale_fmt=sf, block=bk,
                                                    model=model), args.repeats)
        ops = M_ * K * N / 1e6
        line = f"{model:16s} {ops / fp:8.1f}"
        try:
            from mmasim.nv_ptx.sim import TCGen05MMABlockScale
            kind = "mxf4nvf4" if fmt == "e2m1" else "mxf8f6f4"
            k = 64 if kind == "mxf4nvf4" else 32
            st = "ue4m3" if sf == "e4m3fn" else "ue8m0"
            pt = "e2m1" if fmt == "e2m1" else "e4m3"
            op = TCGen05MMABlockScale(
                "Blackwell", f"m128n8k{k}.kind::{kind}.block{bk}.f32.{pt}.{pt}.{st}")
            av = torch.tensor(qa.values / np.repeat(qa.scale_values, bk, 1)
                              / (qa.tensor_scale or 1)).float()
            bv = torch.tensor(qb.values / np.repeat(qb.scale_values, bk, 0)
                              / (qb.tensor_scale or 1)).float()
            sdt = torch.float8_e4m3fn if sf == "e4m3fn" else torch.float8_e8m0fnu
            sa = torch.from_numpy(qa.scales).view(sdt)
            sb = torch.from_numpy(qb.scales).view(sdt)
            if kind == "mxf8f6f4":
                av, bv = av.to(torch.float8_e4m3fn), bv.to(torch.float8_e4m3fn)

            def sim():
                c = torch.zeros(M_, N)
                if kind == "mxf4nvf4":
                    return op.arithmetic_op(av, bv, c, sa, sb)
                for i in range(0, K, k):
                    c = op.arithmetic_op(av[:, i:i + k], bv[i:i + k], c, sa[:, i // k:i // k + 1],
                                         sb[i // k:i // k + 1])
                return c
            ms = timed(sim, max(1, args.repeats // 2))
            line += f" {ops / ms:8.2f} {ms / fp:6.0f}"
        except ImportError:
            line += f" {'-':>8s} {'-':>6s}"
        print(line)


if __name__ == "__main__":
    main()
