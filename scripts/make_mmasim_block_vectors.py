"""Write tests/data/mmasim_block_vectors.npz: block-scaled dot products
computed by MMA-Sim.

MMA-Sim (Xie et al. 2025, ``pip install mmasim``, version 2.1.1 here) models
Blackwell's block-scaled ``tcgen05.mma`` instructions bit for bit. This
script takes the arithmetic it assigns to them (``nv_ptx.sim
.TCGen05MMABlockScale``: ``MMA_ST_FDPA`` for ``kind::mxf8f6f4``,
``MMA_GST_FDPA`` for ``kind::mxf4nvf4``) and runs it on random element
codes, random scales (E8M0 over its whole range, UE4M3 including
subnormals and zero), zeros and accumulators with cancellation. Every case
holds at least 10**4 instructions (``N`` dot products of ``K / k`` chained
instructions). The tests compare ``fpemu.accumulate.scaled_matmul`` with
the stored results; CI needs neither torch nor mmasim.

    python scripts/make_mmasim_block_vectors.py   # needs torch and mmasim
"""

import pathlib

import numpy as np
import torch
from mmasim.nv_ptx.sim import TCGen05MMABlockScale

# element format: (ptx name, code bits, exponent bits, mantissa bits, bias)
ELEMS = {"e4m3fn": ("e4m3", 8, 4, 3, 7), "e5m2": ("e5m2", 8, 5, 2, 15),
         "e2m3": ("e2m3", 6, 2, 3, 1), "e3m2": ("e3m2", 6, 3, 2, 3), "e2m1": ("e2m1", 4, 2, 1, 1)}
# case: (a elem, b elem, scale format, block, K, N)
CASES = {
    "mxf8f6f4-e4m3-e4m3": ("e4m3fn", "e4m3fn", "e8m0", 32, 160, 800),
    "mxf8f6f4-e5m2-e4m3": ("e5m2", "e4m3fn", "e8m0", 32, 160, 500),
    "mxf8f6f4-e2m3-e3m2": ("e2m3", "e3m2", "e8m0", 32, 160, 400),
    "mxf8f6f4-e2m1-e2m1": ("e2m1", "e2m1", "e8m0", 32, 160, 400),
    "mxf4nvf4-ue4m3-16": ("e2m1", "e2m1", "e4m3fn", 16, 320, 2000),
    "mxf4nvf4-ue8m0-16": ("e2m1", "e2m1", "e8m0", 16, 320, 1000),
    "mxf4nvf4-ue8m0-32": ("e2m1", "e2m1", "e8m0", 32, 320, 1000),
}


def finite_codes(elem, shape, rng):
    """Random codes of an element format without inf / NaN codes."""
    ptx, bits, E, M, bias = ELEMS[elem]
    codes = rng.integers(0, 2**bits, shape)
    if elem == "e4m3fn":
        codes = np.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    if elem == "e5m2":
        codes = np.where((codes & 0x7C) == 0x7C, codes & 0xF3, codes)
    codes[rng.random(shape) < 0.1] = 0
    return codes.astype(np.uint8)


def decode(codes, elem):
    """Element values (float64) by the field definitions."""
    ptx, bits, E, M, bias = ELEMS[elem]
    c = codes.astype(np.int64)
    sign = (c >> (bits - 1)) & 1
    e = (c >> M) & (2**E - 1)
    m = c & (2**M - 1)
    mag = np.where(e == 0, m * 2.0 ** (1 - bias - M), (2**M + m) * 2.0 ** (e - bias - M))
    return np.where(sign == 1, -mag, mag)


def torch_operand(codes, elem):
    if elem in ("e4m3fn", "e5m2"):
        dt = torch.float8_e4m3fn if elem == "e4m3fn" else torch.float8_e5m2
        return torch.from_numpy(codes).view(dt)
    if elem == "e2m1":
        return torch.from_numpy(codes << 2)           # fp4 in bits 5:2
    return torch.from_numpy(codes)                    # fp6 in bits 5:0


def scales(fmt, shape, rng):
    if fmt == "e8m0":
        return rng.integers(127 - 12, 127 + 12, shape).astype(np.uint8)
    s = rng.integers(0, 0x7F, shape).astype(np.uint8)      # UE4M3: no NaN, zero included
    s[rng.random(shape) < 0.02] = 0
    return s


def torch_scales(s, fmt):
    dt = torch.float8_e8m0fnu if fmt == "e8m0" else torch.float8_e4m3fn
    return torch.from_numpy(s).view(dt)


def main():
    rng = np.random.default_rng(20261124)
    out = {}
    for name, (ea, eb, sf, blk, K, N) in CASES.items():
        kind = "mxf8f6f4" if name.startswith("mxf8f6f4") else "mxf4nvf4"
        k = 32 if kind == "mxf8f6f4" else 64
        st = f"ue{sf[1:]}" if sf == "e8m0" else "ue4m3"
        pa, pb = ELEMS[ea][0], ELEMS[eb][0]
        shape = (f"m128n8k{k}.kind::{kind}.block{blk}.f32.{pa}.{pb}.{st}")
        op = TCGen05MMABlockScale("Blackwell", shape).arithmetic_op
        a = finite_codes(ea, (N, K), rng)
        b = finite_codes(eb, (N, K), rng)
        wide = rng.random(N) < 0.3
        sa = scales(sf, (N, K // blk), rng)
        sb = scales(sf, (N, K // blk), rng)
        if sf == "e8m0":
            # rows whose scales sit anywhere in E8M0's range: the products
            # reach fp32's subnormals and overflow to inf
            nw = int(wide.sum())
            for s in (sa, sb):
                centre = rng.integers(0, 255, (nw, 1))
                s[wide] = np.clip(centre + rng.integers(-6, 7, (nw, K // blk)), 0, 254)
        c = (rng.standard_normal(N) * np.exp2(rng.integers(-20, 20, N))).astype(np.float32)
        c[: N // 10] = 0.0
        exact = (decode(a, ea) * decode(b, eb)
                 * np.repeat(torch_scales(sa, sf).double().numpy(), blk, axis=1)
                 * np.repeat(torch_scales(sb, sf).double().numpy(), blk, axis=1)).sum(-1)
        cancel = -exact[N // 10: N // 5]
        c[N // 10: N // 5] = np.where(np.abs(cancel) < 2.0**127, cancel, 0.0).astype(np.float32)
        c[wide] = 0.0
        ct = torch.from_numpy(c)
        ta, tb = torch_operand(a, ea), torch_operand(b, eb)
        if kind == "mxf8f6f4":
            d = ct
            for i in range(0, K, k):
                d = op.dpa(ta[:, i:i + k], tb[:, i:i + k], d,
                           torch_scales(sa, sf)[:, i // blk:i // blk + 1],
                           torch_scales(sb, sf)[:, i // blk:i // blk + 1])
        else:
            va = torch.from_numpy(decode(a, ea)).float()
            vb = torch.from_numpy(decode(b, eb)).float()
            d = op.dpa(va, vb, ct, torch_scales(sa, sf), torch_scales(sb, sf))
        for key, v in (("a", a), ("b", b), ("sa", sa), ("sb", sb), ("c", c),
                       ("d", d.numpy())):
            out[f"{name}/{key}"] = v
        print(f"{name}: {N} dot products x {K // k} instructions")
    path = (pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"
            / "mmasim_block_vectors.npz")
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
