"""Start-up cost: the first calls of fpemu's kernels in a fresh process.

Each figure comes from a new Python process, first with an empty Numba cache
(a temporary NUMBA_CACHE_DIR), then again with the cache that the first
process left (warm). Printed: import time, the first kernel, each further
(op, format, mode) and the README's MLP training step (autocast bf16,
AdamW, GradScaler), in seconds. The targets of issue 15 are printed beside.

    python bench/bench_startup.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t = time.perf_counter()
import numpy as np
import fpemu
out = {"import fpemu": time.perf_counter() - t}
x = np.linspace(-300.0, 300.0, 1000, dtype=np.float32)
steps = [("quantize", "bf16", "rne"), ("encode", "e4m3fn", "rne"), ("quantize", "e4m3fn", "rtz"),
         ("encode", "fp16", "sr"), ("quantize", "e5m2", "rna"), ("encode", "e2m1", "rne")]
for op, fmt, mode in steps:
    t = time.perf_counter()
    getattr(fpemu, op)(x, fmt, rounding=mode, seed=1)
    out[f"{op} {fmt} {mode}"] = time.perf_counter() - t
t = time.perf_counter()
fpemu.stats(x, "fp16")
out["stats fp16"] = time.perf_counter() - t
t = time.perf_counter()
import fpemu.autograd as torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda")
xb, yb = torch.randn(256, 784), torch.randint(0, 10, (256,))
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
out["README MLP, first step"] = time.perf_counter() - t
print(json.dumps(out))
"""


def run(cache):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    with tempfile.TemporaryDirectory() as cache:
        cold = run(cache)
        warm = run(cache)
    print("start-up, seconds, each from a fresh process (Numba cache empty / warm)")
    print(f"{'call':28s} {'empty':>8s} {'warm':>8s}   target (empty / warm)")
    first = True
    for key in cold:
        if key == "import fpemu":
            target = ""
        elif key.startswith("README"):
            target = "<= 3 s empty"
        elif first:
            target, first = "<= 1.5 / <= 0.15", False
        else:
            target = "<= 0.5 / <= 0.15"
        print(f"{key:28s} {cold[key]:8.3f} {warm[key]:8.3f}   {target}")


if __name__ == "__main__":
    main()
