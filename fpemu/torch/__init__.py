"""What a low-precision format would do to a real PyTorch model, layer by layer.

``fpemu.torch`` watches a real ``torch.nn.Module`` training loop (on CPU or
CUDA, with no other change to the loop) and counts, exactly, what each what-if
format would do to each module's tensors at each step:

>>> import torch, fpemu.torch
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
>>> opt = torch.optim.Adam(model.parameters())
>>> with fpemu.torch.monitor(model, opt, formats=("fp16", "e4m3fn")) as mon:
...     for _ in range(2):
...         opt.zero_grad()
...         model(torch.randn(8, 4)).square().mean().backward()
...         opt.step()
>>> sorted({r["kind"] for r in mon.rows()})
['activation', 'activation_grad', 'exp_avg', 'exp_avg_sq', 'weight', 'weight_grad']

The tensors go to the host chunk by chunk and through :func:`fpemu.stats`, so
each count is bit-exact; ``sample=`` counts a seeded uniform sample of each
large tensor instead. See ``docs/monitor.md``.

``fpemu.torch.quantize``, ``encode`` and ``decode`` round a tensor where it
lives (CPU or CUDA) with torch integer operations, bit for bit
:func:`fpemu.quantize`'s (``fpemu/torch/_quantize.py``).

PyTorch is imported only when a monitor starts or a quantizer is first used;
it is an optional dependency (``pip install fpemu[torch]``).
"""

from ._import import torch_module as require_torch
from ._monitor import (
    KINDS, SCALINGS, FirstOverflow, Monitor, monitor, run_script, watch,
)


def __getattr__(name):
    # the quantizers import torch when first asked for (the monitor does at its start)
    if name in ("quantize", "encode", "decode"):
        from . import _quantize  # imports torch
        return getattr(_quantize, name)
    if name in ("quantize_blocks", "dequantize_blocks", "TensorBlocks"):
        from . import _blocks  # imports torch
        return getattr(_blocks, name)
    if name == "stats":
        from ._stats import stats  # imports torch and Numba
        return stats
    if name in ("emulate", "Emulation", "GemmRounding", "RECIPES"):
        from . import _emulate  # imports torch
        return getattr(_emulate, name)
    if name == "run_emulated_script":
        from ._emulate import run_script as run_emulated_script  # imports torch
        return run_emulated_script
    raise AttributeError(f"module 'fpemu.torch' has no attribute {name!r}")


__all__ = ["monitor", "Monitor", "FirstOverflow", "watch", "run_script", "KINDS", "SCALINGS",
           "quantize", "encode", "decode", "quantize_blocks", "dequantize_blocks", "TensorBlocks",
           "emulate", "Emulation", "GemmRounding", "RECIPES", "stats", "require_torch",
           "run_emulated_script"]
