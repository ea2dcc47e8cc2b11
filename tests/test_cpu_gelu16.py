"""gelu of bfloat16 tensors under the CPU profile: torch CPU hands a
contiguous bfloat16 tensor of two or more elements to oneDNN, whose AVX-512
gelu computes in float32; fpemu's model of it, rounded, gives torch's bits."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.autograd as ft                                      # noqa: E402

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())


@pytest.mark.skipif(CPU.cpu_capability != "AVX512",
                    reason="oneDNN's AVX2 gelu is not modelled (docs/pytorch-numerics.md §6.2)")
def test_contiguous_bfloat16_gelu_is_onednns():
    x = torch.from_numpy((np.random.default_rng(0).standard_normal((64, 513)) * 3)
                         .astype(np.float32)).bfloat16()
    want = torch.nn.functional.gelu(x).float().numpy()
    with ft.use_profile(CPU):
        got = ft.nn.functional.gelu(ft.nn.from_torch(x)).float().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
