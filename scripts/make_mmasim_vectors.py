"""Write tests/data/mmasim_vectors.npz: dot products computed by MMA-Sim.

MMA-Sim (Xie et al. 2025, ``pip install mmasim``, version 2.1.1 here) models
NVIDIA matrix instructions bit for bit. This script asks its fused
dot-product-accumulate (``fdpa.MMA_T_FDPA``) for the parameters MMA-Sim uses
for Volta/Ampere/Hopper mma and wgmma and Blackwell tcgen05.mma (see its
``nv_ptx/sim.py``), on random inputs with spread exponents, zeros,
subnormals and cancellation. The tests compare fpemu's tensor-core presets
with the stored results; CI needs neither torch nor mmasim.

    python scripts/make_mmasim_vectors.py   # needs torch and mmasim
"""

import pathlib

import numpy as np
import torch
from mmasim.arithmetic import fdpa

# preset: (torch input dtype, ptx type, F, rho, L_max, e_zero) as in MMA-Sim 2.1.1
CASES = {
    "v100": (torch.float16, "f16", 23, "RZ-FP32", 4, -131),
    "a100": (torch.bfloat16, "bf16", 24, "RZ-FP32", 8, -132),
    "h100": (torch.bfloat16, "bf16", 25, "RZ-FP32", 16, -133),
    "h100-fp16": (torch.float16, "f16", 25, "RZ-FP32", 16, -133),
    "h100-fp8": (torch.float8_e4m3fn, "e4m3", 13, "RZ-E8M13", 32, -133),
    "h100-fp8-e5m2": (torch.float8_e5m2, "e5m2", 13, "RZ-E8M13", 32, -133),
    "b200-fp8": (torch.float8_e4m3fn, "e4m3", 25, "RZ-FP32", 32, -133),
}
K = 96
N = 200


def inputs(dtype, rng):
    finfo = torch.finfo(dtype)
    lo = np.log2(finfo.smallest_normal) - 3
    hi = np.log2(finfo.max) - 6
    mag = np.exp2(rng.uniform(lo / 3, hi / 2, (N, K)))
    narrow = rng.random(N) < 0.5  # half the rows: exponents within a few binades
    mag[narrow] = np.exp2(rng.uniform(-4, 4, (int(narrow.sum()), K)))
    x = mag * rng.choice([-1.0, 1.0], (N, K))
    x[rng.random((N, K)) < 0.05] = 0.0
    tiny = rng.random((N, K)) < 0.03
    x[tiny] = finfo.smallest_normal * rng.uniform(0, 1, int(tiny.sum()))
    return torch.tensor(x, dtype=torch.float64).to(dtype)


def main():
    rng = np.random.default_rng(20261122)
    out = {}
    for name, (dtype, ptx, F, rho, L, e_zero) in CASES.items():
        a = inputs(dtype, rng)
        b = inputs(dtype, rng)
        c = torch.tensor(rng.standard_normal(N) * np.exp2(rng.integers(-20, 20, N)),
                         dtype=torch.float32)
        c[: N // 10] = 0.0
        # cancellation: c = -(a . b) for some rows
        exact = (a.double() * b.double()).sum(-1)
        c[N // 10: N // 5] = (-exact[N // 10: N // 5]).float()
        op = fdpa.MMA_T_FDPA(F, rho, L, e_zero, ptx, ptx)
        d = op.dpa(a, b, c)
        out[f"{name}/a"] = a.double().numpy()
        out[f"{name}/b"] = b.double().numpy()
        out[f"{name}/c"] = c.numpy()
        out[f"{name}/d"] = d.numpy()
    path = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "mmasim_vectors.npz"
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
