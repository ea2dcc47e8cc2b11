"""The cost of fpemu.torch.monitor on a real torch model: step time with and without it.

A 10.5 M-parameter MLP (784 -> 2048 -> 2048 -> 2048 -> 10, ReLU) trains with Adam
on random data, batch 256, on the CPU. Each configuration runs warm-up steps,
then the mean of timed steps is reported, and the ratio to the unmonitored
step. The target of the design is a monitored step (four formats, every
tensor kind) at most 5x an unmonitored one.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args(argv)
    import torch

    import fpemu.torch as ft
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(784, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                torch.nn.Linear(w, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, 784)
    y = torch.randint(0, 10, (args.batch,))
    nparams = sum(p.numel() for p in model.parameters())

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def timed(n):
        out = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            out.append(time.perf_counter() - t)
        return statistics.mean(out)

    step()
    step()
    base = timed(args.steps)
    print(f"model: {nparams / 1e6:.1f} M parameters, batch {args.batch}, Adam; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'configuration':56s} {'step (s)':>9s} {'x plain':>8s}")
    print(f"{'no monitor':56s} {base:9.3f} {1.0:8.2f}")
    configs = [
        ("4 formats, every tensor, every element", dict()),
        ("4 formats, sample=65536 per tensor", dict(sample=65536)),
        ("4 formats, every 10th step (amortised)", dict(every=10)),
        ("1 format (fp16), every element", dict(formats=("fp16",))),
        ("4 formats, gradients only", dict(kinds=("activation_grad", "weight_grad"))),
    ]
    for label, kw in configs:
        with ft.monitor(model, opt, **kw):
            step()                                   # compile the kernels out of the timing
            n = args.steps * (10 if kw.get("every") else 1)
            t = timed(n)
        print(f"{label:56s} {t:9.3f} {t / base:8.2f}")


if __name__ == "__main__":
    main()
