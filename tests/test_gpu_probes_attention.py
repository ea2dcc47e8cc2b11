"""fpemu's fused attention against the bits an NVIDIA H200 wrote.

``bench/gpu_check/nvidia-h200-torch2.11.0/attention.{json,npz}`` hold 28
probes of ``F.scaled_dot_product_attention`` and its backward (torch
2.11.0+cu130): the flash and the memory-efficient backend, bf16 and fp16,
16 / 128 / 200 keys, head dim 64, causal or not, and V = identity. Each
probe's inputs are rebuilt from its seed (``bench/gpu_check.py``); fpemu runs
the same call under ``Profile("cuda", "2.11.0", gpu="h200")`` with the
probe's backend, and its output and gradients are compared with the
recorded float32 bit codes.

The kernel-level model (``fpemu/autograd/_fused_attention.py``,
``docs/pytorch-numerics.md`` §11) reproduces the outputs listed in ``EXACT``
bit for bit. In the others a few elements in a thousand differ; the
measurements in §11 trace them to the GPU's ``exp2f`` / ``expf`` / ``__logf``
(not correctly rounded; fpemu computes the correctly rounded values), which
move a probability across a bf16 / fp16 rounding boundary. ``FLOORS`` pins
how many elements of those match, so that a change that loses some fails.
"""

import functools
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402
import fpemu.autograd as ft  # noqa: E402

RUN = os.path.join(ROOT, "bench", "gpu_check", "nvidia-h200-torch2.11.0")
with open(os.path.join(RUN, "attention.json")) as fh:
    ATTN = json.load(fh)
BITS = np.load(os.path.join(RUN, "attention.npz"))
OUTS = ("out", "dq", "dk", "dv")

#: (probe, output) pairs fpemu reproduces bit for bit.
EXACT = {
    "flash-bfloat16-L16-E64": OUTS,
    "flash-bfloat16-L16-E64-causal": OUTS,
    "flash-bfloat16-L64-E64-videntity": OUTS,
    "flash-bfloat16-L128-E64-causal": ("out", "dq", "dk"),
    "flash-bfloat16-L200-E64-causal": ("out",),
    "flash-float16-L16-E64": ("dq", "dk", "dv"),
    "flash-float16-L16-E64-causal": ("dv",),
    "flash-float16-L64-E64-videntity": ("dv",),
    "flash-float16-L128-E64-causal": ("dq", "dk"),
    "efficient-bfloat16-L16-E64": OUTS,
    "efficient-bfloat16-L16-E64-causal": OUTS,
    "efficient-bfloat16-L64-E64-videntity": OUTS,
    "efficient-bfloat16-L128-E64": ("dv",),
    "efficient-float16-L16-E64": ("out", "dk", "dv"),
    "efficient-float16-L16-E64-causal": ("out", "dk", "dv"),
}

#: elements equal (of 2 heads x L x 64) for the outputs not reproduced whole,
#: as measured by ``python bench/fit_attention.py --fpemu``.
FLOORS = {
    "flash-bfloat16-L128-E64": (16376, 16371, 16358, 16380),
    "flash-bfloat16-L128-E64-causal": (None, None, None, 16381),
    "flash-bfloat16-L200-E64": (25570, 25577, 25543, 25578),
    "flash-bfloat16-L200-E64-causal": (None, 25586, 25574, 25598),
    "flash-float16-L16-E64": (2047, None, None, None),
    "flash-float16-L16-E64-causal": (2047, 1977, 1982, None),
    "flash-float16-L64-E64-videntity": (8190, 8172, 8169, None),
    "flash-float16-L128-E64": (16350, 16254, 16128, 16362),
    "flash-float16-L128-E64-causal": (16377, None, None, 16330),
    "flash-float16-L200-E64": (25561, 25469, 25363, 25465),
    "flash-float16-L200-E64-causal": (25546, 25454, 25350, 25572),
    "efficient-bfloat16-L128-E64": (16380, 16364, 16361, None),
    "efficient-bfloat16-L128-E64-causal": (16383, 16372, 16374, 16379),
    "efficient-bfloat16-L200-E64": (25590, 25555, 25525, 25574),
    "efficient-bfloat16-L200-E64-causal": (25593, 25542, 25523, 25585),
    "efficient-float16-L16-E64": (None, 2046, None, None),
    "efficient-float16-L16-E64-causal": (None, 1948, None, None),
    "efficient-float16-L64-E64-videntity": (8189, 8162, 8171, 8171),
    "efficient-float16-L128-E64": (16296, 16103, 15884, 16217),
    "efficient-float16-L128-E64-causal": (16320, 16187, 16127, 16365),
    "efficient-float16-L200-E64": (25464, 25306, 25021, 25422),
    "efficient-float16-L200-E64-causal": (25555, 25413, 25328, 25494),
}


@functools.lru_cache(maxsize=None)
def _fpemu(cid):
    """fpemu's output and gradients for a probe, as float32 bit codes."""
    case = ATTN["cases"][cid]
    F = ft.nn.functional
    ins = gpu_check._attention_inputs(torch, case)
    q, k, v = (ft.nn.from_torch(ins[n]).requires_grad_() for n in ("q", "k", "v"))
    backend = {"flash": F.SDPBackend.FLASH_ATTENTION,
               "efficient": F.SDPBackend.EFFICIENT_ATTENTION}[case["backend"]]
    with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")), F.sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
        o.backward(ft.nn.from_torch(ins["dout"]))
    res = {"out": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    return {n: np.ascontiguousarray(t.float().numpy(), np.float32).view(np.uint32)
            for n, t in res.items()}


def test_the_lists_cover_every_recorded_probe_once():
    """Every (probe, output) is either in EXACT or has a floor, not both."""
    assert sorted(ATTN["cases"]) == sorted(set(EXACT) | set(FLOORS))
    for cid in ATTN["cases"]:
        floors = FLOORS.get(cid, (None,) * 4)
        for k, floor in zip(OUTS, floors):
            assert (k in EXACT.get(cid, ())) != (floor is not None), (cid, k)


@pytest.mark.parametrize("cid,out", [(c, k) for c, ks in EXACT.items() for k in ks])
def test_fused_attention_is_the_h200_bit_for_bit(cid, out):
    """The flash or memory-efficient kernel's output or gradient, every
    element's float32 bit code (bf16 / fp16 values widened)."""
    rec = BITS[f"{cid}.{out}"]
    mine = _fpemu(cid)[out].reshape(rec.shape)
    np.testing.assert_array_equal(mine, rec, err_msg=f"{cid}.{out}")


@pytest.mark.parametrize("cid", sorted(FLOORS))
def test_the_outputs_not_yet_exact_keep_their_measured_matches(cid):
    """The outputs fpemu does not reproduce whole: at least as many
    elements equal as measured when the model was fitted."""
    mine = _fpemu(cid)
    for k, floor in zip(OUTS, FLOORS[cid]):
        if floor is None:
            continue
        rec = BITS[f"{cid}.{k}"]
        equal = int((mine[k].reshape(rec.shape) == rec).sum())
        assert equal >= floor, f"{cid}.{k}: {equal} of {rec.size} equal, {floor} before"


def test_the_two_backends_differ_where_the_gpu_s_do():
    """The flash and memory-efficient kernels' probes share no seed, but the
    same inputs give different bits on the two backends: the efficient
    backward uses P rounded to bf16 in dS and 64-key blocks. fpemu's model
    keeps them apart (the recorded flash probe is not the efficient model's)."""
    cid = "flash-bfloat16-L128-E64"
    case = dict(ATTN["cases"][cid], backend="efficient")
    F = ft.nn.functional
    ins = gpu_check._attention_inputs(torch, case)
    q, k, v = (ft.nn.from_torch(ins[n]).requires_grad_() for n in ("q", "k", "v"))
    with ft.use_profile(ft.Profile("cuda", "2.11.0", gpu="h200")), \
            F.sdpa_kernel([F.SDPBackend.EFFICIENT_ATTENTION]):
        o = F.scaled_dot_product_attention(q, k, v)
        o.backward(ft.nn.from_torch(ins["dout"]))
    rec = BITS[f"{cid}.dq"]
    eff = np.ascontiguousarray(q.grad.float().numpy()).view(np.uint32).reshape(rec.shape)
    assert (eff != rec).mean() > 0.2
    assert (_fpemu(cid)["dq"].reshape(rec.shape) != rec).mean() < 0.01


@pytest.mark.parametrize("fmad", [True, False])
def test_dot_do_o_sums_in_flash_attention_s_order(fmad):
    """The backward's D = rowsum(dO * Out) (a Numba loop) against the order
    written out with NumPy float32 scalars, its fused multiply-adds by the
    float64 TwoSum of the attention model (fpemu.autograd._fused_attention.fma32,
    which shares no code with the kernel's llvm.fma): 8 threads of E/8
    columns, then the xor-4, 2, 1 butterfly; inf, NaN, overflow, signed
    zeros and subnormals among the rows."""
    from fpemu.autograd import _cuda_reduce, _fused_attention
    f32 = np.float32
    rng = np.random.default_rng(4)
    for E in (64, 8, 72):
        dO = (rng.standard_normal((40, E)) * np.exp2(rng.integers(-20, 20, (40, E)))).astype(f32)
        Out = (rng.standard_normal((40, E)) * np.exp2(rng.integers(-20, 20, (40, E)))).astype(f32)
        dO[0, 3], Out[1, 5], dO[2], Out[3] = np.inf, np.nan, f32(1e-42), -0.0
        dO[4, 1] = Out[4, 1] = f32(3e38)
        got = _cuda_reduce.dot_do_o(dO, Out, fmad)
        per = E // 8
        for r in range(40):
            part = []
            with np.errstate(over="ignore", invalid="ignore"):
                for t in range(8):
                    s = f32(dO[r, t * per] * Out[r, t * per])
                    for j in range(t * per + 1, t * per + per):
                        s = _fused_attention.fma32(dO[r, j], Out[r, j], s)[()] if fmad else \
                            f32(s + f32(dO[r, j] * Out[r, j]))
                    part.append(f32(s))
                for off in (4, 2, 1):
                    part = [f32(part[t] + part[t ^ off]) for t in range(8)]
            want = part[0]
            assert (np.isnan(got[r]) and np.isnan(want)) or \
                got[r].tobytes() == want.tobytes(), (E, r, got[r], want)
    with pytest.raises(ValueError, match=r"head dim >= 8.*got \(2, 4\)"):
        _cuda_reduce.dot_do_o(np.ones((2, 4), f32), np.ones((2, 4), f32))
