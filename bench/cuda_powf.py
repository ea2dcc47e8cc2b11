"""Tabulate where CUDA's float32 ``powf`` differs from the correctly rounded power.

Fused Adam / AdamW on CUDA compute their bias corrections as
``1 - powf(float32(beta), float32(step))``. CUDA's ``powf`` is not correctly
rounded (the CUDA C++ Programming Guide lists its error in ulps), and NVIDIA
does not publish its algorithm bit for bit, so fpemu cannot compute it. This
script measures it instead, on a GPU, for the betas people use, over every
step at which ``beta**step`` still changes ``1 - beta**step`` in float32 (up to
``beta**step < 2**-26``, beyond which ``1 - powf`` is 1 whatever powf returns).

Run on a machine with a CUDA GPU (needs only torch and numpy)::

    python bench/cuda_powf.py --out fpemu/autograd/cuda_powf.npz

The file holds, per beta, the steps where the GPU's result differs from the
correctly rounded one and the difference in ulps, plus the torch / CUDA
versions and the device name. ``fpemu.autograd.optim`` reads it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

#: betas of Adam / AdamW in common use (torch's defaults, GPT-style, BERT-style,
#: and the slow ones)
BETAS = (0.5, 0.8, 0.85, 0.9, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995, 0.997, 0.998, 0.999,
         0.9995, 0.9999)


def correctly_rounded(b32, steps):
    """float32(b32 ** t), rounded once, and a mask of the steps where the
    float64 power lies too close to a float32 midpoint to be sure of that."""
    p64 = float(b32) ** steps.astype(np.float64)
    p32 = p64.astype(np.float32)
    half = np.spacing(p32).astype(np.float64) / 2
    mid = np.minimum(np.abs(p64 - (p32.astype(np.float64) + half)),
                     np.abs(p64 - (p32.astype(np.float64) - half)))
    return p32, mid <= 4 * np.spacing(p64)


RCP_SRC = r"""
extern "C" __global__ void rcp_vs_rn(unsigned int start, unsigned int n, signed char* delta) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = __uint_as_float(start + i);
    float a;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(a) : "f"(x));
    int d = (int)__float_as_uint(a) - (int)__float_as_uint(__frcp_rn(x));
    delta[i] = (signed char)max(-127, min(127, d));
}
"""
#: powf's logarithm takes the reciprocal (MUFU.RCP, PTX rcp.approx.ftz.f32) of
#: m + 1 with m the significand reduced to [sqrt(1/2), sqrt(2)): these inputs
RCP_LO, RCP_HI = 1.70, 2.43


def rcp_deviations():
    """For every float32 x in [RCP_LO, RCP_HI], in order of its bits: the
    GPU's rcp.approx.ftz.f32 minus the correctly rounded 1/x, in ulps."""
    import cupy
    kern = cupy.RawKernel(RCP_SRC, "rcp_vs_rn")
    lo = int(np.float32(RCP_LO).view(np.uint32))
    hi = int(np.float32(RCP_HI).view(np.uint32))
    n = hi - lo + 1
    delta = cupy.zeros(n, cupy.int8)
    kern(((n + 255) // 256,), (256,), (np.uint32(lo), np.uint32(n), delta))
    return lo, delta.get()


def random_samples(n, seed=0):
    """GPU powf on random positive bases (2**-30 .. 2**30) and exponents
    (integers, halves and arbitrary values in -300 .. 300)."""
    rng = np.random.default_rng(seed)
    base = np.exp2(rng.uniform(-30, 30, n)).astype(np.float32)
    e = rng.uniform(-300, 300, n)
    kind = rng.integers(0, 3, n)
    e = np.where(kind == 0, np.round(e), np.where(kind == 1, np.round(2 * e) / 2, e / 37))
    e = e.astype(np.float32)
    got = torch.pow(torch.from_numpy(base).cuda(), torch.from_numpy(e).cuda()).cpu().numpy()
    return base, e, got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="the .npz to write")
    ap.add_argument("--device", default="cuda", help="cpu only to try the script out")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch: run this on a GPU machine")
    payload = {"torch_version": np.array(torch.__version__),
               "cuda_version": np.array(str(torch.version.cuda)),
               "device_name": np.array(torch.cuda.get_device_name(0) if args.device == "cuda"
                                       else "cpu"),
               "betas": np.array(BETAS, np.float32)}
    for beta in BETAS:
        b32 = np.float32(beta)
        # last step that matters: beta**t >= 2**-26
        last = int(np.ceil(-26 / np.log2(np.float64(b32)))) + 1
        steps = np.arange(1, last + 1, dtype=np.float32)
        got = torch.pow(torch.tensor(b32, device=args.device),
                        torch.from_numpy(steps).to(args.device)).cpu().numpy()
        want, unsure = correctly_rounded(b32, steps)
        diff = got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64)
        idx = np.flatnonzero(diff)
        if unsure[idx].any():
            sys.exit(f"beta {beta}: {int(unsure[idx].sum())} differing steps lie within a "
                     f"float64 ulp of a float32 midpoint; cannot tell the correct rounding")
        if np.abs(diff).max(initial=0) > 127:
            sys.exit(f"beta {beta}: powf is {np.abs(diff).max()} ulps off, beyond int8")
        key = f"{float(b32):.9g}"
        payload[f"steps/{key}"] = steps[idx].astype(np.int32)
        payload[f"ulps/{key}"] = diff[idx].astype(np.int8)
        print(f"beta {beta}: steps 1..{last}, {idx.size} differ "
              f"({100 * idx.size / last:.2f} %, max {np.abs(diff).max(initial=0)} ulp)",
              flush=True)
    if args.device == "cuda":
        lo, delta = rcp_deviations()
        payload["rcp/first_bits"] = np.array(lo, np.uint32)
        payload["rcp/ulps"] = delta
        vals, counts = np.unique(delta, return_counts=True)
        hist = ", ".join(f"{v:+d} ulp: {c}" for v, c in zip(vals.tolist(), counts.tolist()))
        print(f"rcp.approx.ftz.f32 on [{RCP_LO}, {RCP_HI}], {delta.size} inputs, minus the "
              f"correctly rounded 1/x: {hist}", flush=True)
        base, e, got = random_samples(1 << 18)
        payload["samples/base"], payload["samples/exponent"], payload["samples/powf"] = \
            base, e, got
    np.savez_compressed(args.out, **payload)


if __name__ == "__main__":
    main()
