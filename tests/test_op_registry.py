"""Every op of fpemu.autograd against torch CPU, from one registry
(tests/op_registry.py): values and gradients on each op's samples, and a
check that no function of ``ops/`` or ``nn.functional`` is left out."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import fpemu.autograd as ft
from fpemu.autograd import ops as fops
from op_registry import OPS

torch = pytest.importorskip("torch")

# which columns and elements ATen's CPU kernels run as vectors depends on its
# thread count and its instruction set (AVX512 or AVX2): the profile reads both
CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
BY_NAME = {op.name: op for op in OPS}


def _public_functions():
    import fpemu.autograd.nn.functional as F
    names = []
    for mod in ("creation", "elementwise", "linalg", "reduce", "shape", "inplace", "scatter",
                "einsum", "search", "distance", "composite"):
        m = getattr(fops, mod)
        names += [f"ops.{mod}.{n}" for n, v in vars(m).items()
                  if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == m.__name__]
    names += [f"nn.functional.{n}" for n, v in vars(F).items()
              if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == F.__name__]
    return names


def test_every_op_is_in_the_registry_once():
    listed = [op.name for op in OPS]
    dups = {n for n in listed if listed.count(n) > 1}
    assert not dups, f"listed twice: {sorted(dups)}"
    missing = sorted(set(_public_functions()) - set(listed))
    assert not missing, f"not in tests/op_registry.py: {missing}"
    for op in OPS:
        if op.compare == "internal":
            assert op.via in BY_NAME and BY_NAME[op.via].compare != "internal", op.name


def _both(value, grad):
    """(torch tensor, fpemu tensor) of a sample argument, or the value twice."""
    if isinstance(value, np.ndarray):
        t, f = torch.tensor(value), ft.tensor(value)
        if grad and value.dtype.kind == "f":
            t.requires_grad_(True)
            f.requires_grad_(True)
        return t, f
    return value, value


def _np(x):
    if hasattr(x, "detach"):
        x = x.detach()
        return np.asarray(x.float().numpy() if x.dtype.is_floating_point else x.numpy())
    return np.asarray(x)


def _compare(op, got, want, what, grad=False):
    """Values of the exact ops bit for bit (float32 codes; NaN as NaN); the
    others, and every gradient, to a few float32 ulps (ten times that for
    gradients: they chain several roundings and sum over broadcast axes, in
    torch's SIMD order or fpemu's index order)."""
    if op.exact and not grad:
        if got.dtype.kind == "f":
            g32, w32 = got.astype(np.float32), want.astype(np.float32)
            nan = np.isnan(w32)
            np.testing.assert_array_equal(np.isnan(g32), nan, err_msg=what)
            np.testing.assert_array_equal(g32[~nan].view(np.uint32), w32[~nan].view(np.uint32),
                                          err_msg=what)
        else:
            np.testing.assert_array_equal(got, want, err_msg=what)
        return
    k = 10 if grad else 1
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=op.rtol * k, atol=op.atol * k, equal_nan=True, err_msg=what)


CASES = [op for op in OPS if op.compare != "internal"]


@pytest.mark.parametrize("op", CASES, ids=[op.name for op in CASES])
def test_op_against_torch(op):
    for args, kwargs in op.samples():
        pairs = [_both(a, op.grad) for a in args]
        targs = [p[0] for p in pairs]
        fargs = [p[1] for p in pairs]
        want = op.run(torch, *targs, **kwargs)
        with ft.use_profile(CPU):
            got = op.run(ft, *fargs, **kwargs)
        w, g = _np(want), _np(got)
        assert tuple(g.shape) == tuple(w.shape), (op.name, g.shape, w.shape)
        if op.compare == "shape":
            continue
        assert str(got.dtype).replace("torch.", "") == str(want.dtype).replace("torch.", ""), \
            (op.name, got.dtype, want.dtype)
        _compare(op, g, w, op.name)
        if not (op.grad and getattr(want, "requires_grad", False)):
            continue
        cot = np.random.default_rng(7).standard_normal(tuple(w.shape)).astype(np.float32)
        want.backward(torch.tensor(cot))
        with ft.use_profile(CPU):
            got.backward(ft.tensor(cot))
        for (t, f) in pairs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                assert (t.grad is None) == (f.grad is None), op.name
                if t.grad is not None:
                    _compare(op, _np(f.grad), _np(t.grad), f"{op.name} grad", grad=True)


BF16 = [op for op in OPS if op.bf16]


@pytest.mark.parametrize("op", BF16, ids=[op.name for op in BF16])
def test_op_in_bfloat16_against_torch(op):
    """The same samples as bfloat16 tensors: both round the float32 opmath
    result once to bfloat16; torch's SIMD exp / log / sin may sit one bf16
    ulp away from the correctly rounded value fpemu computes."""
    for args, kwargs in op.samples():
        targs = [torch.tensor(a).bfloat16() if isinstance(a, np.ndarray) else a for a in args]
        with ft.use_profile(CPU):
            fargs = [ft.tensor(a).to(ft.bfloat16) if isinstance(a, np.ndarray) else a
                     for a in args]
            got = op.run(ft, *fargs, **kwargs)
        want = op.run(torch, *targs, **kwargs)
        assert str(got.dtype) == str(want.dtype) == "torch.bfloat16", op.name
        np.testing.assert_allclose(_np(got), _np(want), rtol=2.0**-7, atol=2.0**-126,
                                   err_msg=op.name)
