"""One training step of fpemu.autograd against torch on the CPU.

Step = forward, backward, AdamW, GradScaler (scale / step / update).
fpemu runs under bf16 autocast (emulated CUDA); torch runs the same model in
fp32 on the CPU, in the same process. Printed: median ms per step and the
ratio fpemu / torch (target: at most 5x).

    python bench/bench_autograd.py [--repeats 20]
"""

from __future__ import annotations

import argparse

import numpy as np

from bench_quantize import timed  # the same timing rule as the other benches


def mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(784, 512), lib.nn.ReLU(), lib.nn.Linear(512, 10))


def block(lib):
    if lib.__name__ == "torch":
        return lib.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation="gelu",
                                              batch_first=True, norm_first=True)
    return lib.nn.TransformerBlock(64, 4, causal=False)


def make_step(lib, model, x, y, autocast):
    opt = lib.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = lib.amp.GradScaler("cuda" if autocast else "cpu")

    def step():
        if autocast:
            with lib.autocast(device_type="cuda", dtype=lib.bfloat16):
                out = model(x)
                loss = lib.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        else:
            out = model(x)
            loss = lib.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import torch
    import fpemu.autograd as ft
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    cases = {
        "MLP 784-512-10, batch 256": (mlp, rng.standard_normal((256, 784)),
                                      rng.integers(0, 10, 256)),
        "transformer block d=64 h=4, 8x32 tokens": (block, rng.standard_normal((8, 32, 64)),
                                                     rng.integers(0, 64, 256)),
    }
    print(f"{'one training step':44s} {'torch fp32 ms':>14s} {'fpemu bf16 ms':>14s} "
          f"{'ratio':>7s}")
    for name, (build, xs, ys) in cases.items():
        ft.manual_seed(0)
        torch.manual_seed(0)
        t_torch = timed(make_step(torch, build(torch), torch.tensor(xs, dtype=torch.float32),
                                  torch.tensor(ys), False), args.repeats)
        t_ours = timed(make_step(ft, build(ft), ft.tensor(xs.astype(np.float32)),
                                 ft.tensor(ys), True), args.repeats)
        print(f"{name:44s} {t_torch * 1e3:14.2f} {t_ours * 1e3:14.2f} "
              f"{t_ours / t_torch:6.1f}x")


if __name__ == "__main__":
    main()
