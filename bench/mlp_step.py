"""The training step that bench_monitor.py and bench_emulate.py time.

A 10.5 M-parameter MLP (784 -> 2048 -> 2048 -> 2048 -> 10, ReLU, at the
default width) trained with Adam on one random batch on the CPU: the step,
and the mean time of ``n`` steps.
"""

from __future__ import annotations

import statistics
import time


def mlp_step(batch=256, width=2048):
    """``(step, model, optimizer, number of parameters)``, seeded."""
    import torch
    torch.manual_seed(0)
    w = width
    model = torch.nn.Sequential(torch.nn.Linear(784, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                torch.nn.Linear(w, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, 784)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step, model, opt, sum(p.numel() for p in model.parameters())


def mean_time(step, n, warmup=0):
    """The mean wall time of ``n`` calls of ``step`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return statistics.mean(out)
