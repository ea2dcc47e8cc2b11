"""The cost of fpemu.torch.monitor on a real torch model: step time with and without it.

The 10.5 M-parameter MLP of ``mlp_step.py`` (784 -> 2048 -> 2048 -> 2048 -> 10,
ReLU) trains with Adam on random data, batch 256, on the CPU. Each
configuration runs a warm-up step, then the mean of timed steps is reported,
and the ratio to the unmonitored step, timed before and after in the same run
(the ratio uses their mean). Issue 32's target: a monitored step (four
formats, every tensor kind, every element) at most 2x an unmonitored one.
"""

from __future__ import annotations

import argparse

from mlp_step import mean_time, mlp_step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args(argv)
    import torch

    import fpemu.torch as ft
    step, model, opt, nparams = mlp_step(args.batch, args.width)
    before = mean_time(step, args.steps, warmup=2)
    rows = []
    configs = [
        ("4 formats, every tensor, every element", dict()),
        ("4 formats, sample=65536 per tensor", dict(sample=65536)),
        ("4 formats, every 10th step (amortised)", dict(every=10)),
        ("1 format (fp16), every element", dict(formats=("fp16",))),
        ("4 formats, gradients only", dict(kinds=("activation_grad", "weight_grad"))),
    ]
    for label, kw in configs:
        with ft.monitor(model, opt, **kw):
            # one untimed step compiles the kernels
            n = args.steps * (10 if kw.get("every") else 1)
            rows.append((label, mean_time(step, n, warmup=1)))
    after = mean_time(step, args.steps)
    base = (before + after) / 2
    print(f"model: {nparams / 1e6:.1f} M parameters, batch {args.batch}, Adam; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'configuration':56s} {'step (s)':>9s} {'x plain':>8s}")
    print(f"{'no monitor (before / after)':56s} {base:9.3f} {1.0:8.2f}"
          f"   ({before:.3f} / {after:.3f})")
    for label, t in rows:
        print(f"{label:56s} {t:9.3f} {t / base:8.2f}")


if __name__ == "__main__":
    main()
