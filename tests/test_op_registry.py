"""Every op of fpemu.autograd against torch CPU, from one registry
(tests/op_registry.py): values and gradients on each op's samples, and a
check that no function of ``ops/`` or ``nn.functional`` is left out."""

from __future__ import annotations

import inspect
import os
import sys

import numpy as np
import pytest

import fpemu.autograd as ft
from fpemu.autograd import ops as fops
from op_registry import METHOD_KINDS, METHOD_OPS, OPS

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
    # torch.nn.functional's names, wherever under nn they are defined (F gathers them)
    names += [f"nn.functional.{n}" for n, v in vars(F).items()
              if inspect.isfunction(v) and not n.startswith("_")
              and v.__module__.startswith("fpemu.autograd.nn")]
    names += [f"linalg.{n}" for n, v in vars(ft.linalg).items()
              if inspect.isfunction(v) and not n.startswith("_")
              and v.__module__ == ft.linalg.__name__]
    names.append("ops.scaled_mm._scaled_mm")           # torch._scaled_mm: torch's own name
    return names


def _registry_names_of_functions():
    """id(function) -> its registry name, for every function the registry
    names (the modules of ops, nn.functional's gathered names, linalg)."""
    import importlib

    import fpemu.autograd.nn.functional as F
    out = {}
    for name in BY_NAME:
        parts = name.split(".")
        if parts[0] == "ops":
            mod = importlib.import_module(f"fpemu.autograd.ops.{parts[1]}")
        elif parts[0] == "nn":
            mod = F
        elif parts[0] == "linalg":
            mod = ft.linalg
        else:
            continue
        fn = getattr(mod, parts[-1], None)
        if callable(fn):
            out.setdefault(id(fn), name)
    return out


def test_every_tensor_method_runs_a_registry_op():
    """Each Tensor method (``fpemu/autograd/_methods.py``) is a method of
    torch.Tensor, and runs an op of the registry: the op function bound as
    it is, the one its wrapper names in ``__wrapped__``, or the one
    ``METHOD_OPS`` gives (with the Python protocols, the dtype conversions
    and the in-place draws named as such). A method added without its op in
    the registry, or a stale ``METHOD_OPS`` key, fails here."""
    from fpemu.autograd._methods import _METHODS
    known = _registry_names_of_functions()
    unresolved, wrong = [], []
    for name, fn in _METHODS.items():
        assert hasattr(torch.Tensor, name), f"Tensor.{name} is not a torch.Tensor method"
        target = known.get(id(getattr(fn, "__wrapped__", fn)))
        listed = METHOD_OPS.get(name)
        if target is None and listed is None:
            unresolved.append(name)
        elif target is not None and listed is not None and listed != target:
            wrong.append(f"{name}: METHOD_OPS says {listed}, the method runs {target}")
        got = target or listed
        assert got in BY_NAME or got in METHOD_KINDS, f"Tensor.{name} runs {got}, not listed"
    assert not unresolved, f"Tensor methods with no registry op: {unresolved}"
    assert not wrong, "\n".join(wrong)
    stale = sorted(set(METHOD_OPS) - set(_METHODS))
    assert not stale, f"METHOD_OPS names methods that do not exist: {stale}"
    assert len(_METHODS) > 250


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
    for args, kwargs in op.draw():
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
    for args, kwargs in op.draw():
        targs = [torch.tensor(a).bfloat16() if isinstance(a, np.ndarray) else a for a in args]
        with ft.use_profile(CPU):
            fargs = [ft.tensor(a).to(ft.bfloat16) if isinstance(a, np.ndarray) else a
                     for a in args]
            got = op.run(ft, *fargs, **kwargs)
        want = op.run(torch, *targs, **kwargs)
        assert str(got.dtype) == str(want.dtype) == "torch.bfloat16", op.name
        np.testing.assert_allclose(_np(got), _np(want), rtol=2.0**-7, atol=2.0**-126,
                                   err_msg=op.name)


# ------------------------------------------------------------------ autocast
def _autocast_names():
    """registry name -> the autocast op names (``cast_inputs(name, ...)``)
    its samples pass through, recorded by an autocast region whose policy
    writes down every name it is asked about (and casts nothing)."""
    from fpemu.autograd.amp import Policy
    seen = []

    class Recorder(Policy):
        def category(self, op):
            seen.append(op)
            return None

    recorder = Recorder("recorder", frozenset(), frozenset())
    out = {}
    for op in CASES:
        seen.clear()
        with ft.use_profile(CPU), ft.autocast("cpu", policy=recorder):
            for args, kwargs in op.draw():
                op.run(ft, *[_both(a, False)[1] for a in args], **kwargs)
        out[op.name] = tuple(dict.fromkeys(seen))
    return out


def _policy_names():
    from fpemu.autograd.amp import TORCH_CPU, TORCH_CUDA
    names = set()
    for policy in (TORCH_CUDA, TORCH_CPU):
        for field in ("lower", "fp32", "fp32_set_opt_dtype", "promote", "banned"):
            names |= getattr(policy, field)
    return names


def test_every_name_on_the_autocast_lists_is_an_op_or_declared_absent():
    """The autocast lists (``fpemu/autograd/_autocast.py``, torch's CUDA and
    CPU lists) name ATen ops; each is the autocast name of an op of the
    registry (recorded from its samples) or in ``AUTOCAST_ABSENT`` (torch
    ops fpemu does not have), and no absent name is an op's: adding an op
    without its autocast name, or leaving its name on the absent list,
    fails here. The committed table docs/autocast-coverage.md is current."""
    from op_registry import AUTOCAST_ABSENT
    names = _autocast_names()
    used = {n for ns in names.values() for n in ns}
    listed = _policy_names()
    missing = sorted(listed - used - AUTOCAST_ABSENT)
    assert not missing, f"on torch's autocast lists, no registry op, not declared absent: " \
                        f"{missing}"
    present = sorted(AUTOCAST_ABSENT & used)
    assert not present, f"declared absent but an op of fpemu uses the name: {present}"
    stale = sorted(AUTOCAST_ABSENT - listed)
    assert not stale, f"AUTOCAST_ABSENT names that are on no autocast list: {stale}"
    with open(os.path.join(os.path.dirname(__file__), "..", "docs",
                           "autocast-coverage.md")) as fh:
        assert fh.read() == _autocast_page(names), \
            "regenerate: python tests/test_op_registry.py --autocast > docs/autocast-coverage.md"


def _autocast_page(names):
    from op_registry import AUTOCAST_ABSENT

    from fpemu.autograd.amp import TORCH_CPU, TORCH_CUDA

    def cat(policy, n):
        return "banned" if n in policy.banned else (policy.category(n) or "-")

    rows = []
    for op in sorted(names):
        for n in names[op]:
            if n in TORCH_CUDA.banned or TORCH_CUDA.category(n) or TORCH_CPU.category(n) \
                    or n in TORCH_CPU.banned:
                rows.append(f"| `{op}` | `{n}` | {cat(TORCH_CUDA, n)} | {cat(TORCH_CPU, n)} |")
    absent = ", ".join(f"`{n}`" for n in sorted(AUTOCAST_ABSENT))
    return f"""# Autocast categories, op by op

What each op of `fpemu.autograd` does inside `autocast`: the ATen name it
looks up (recorded from its samples in `tests/op_registry.py`) and that name's
category on torch's CUDA and CPU lists (`fpemu/autograd/_autocast.py`;
[pytorch-numerics.md](pytorch-numerics.md) §5 says what the categories do:
`lower` runs in the autocast dtype, `fp32` in float32, `fp32_set_opt_dtype`
with `dtype=float32`, `promote` in the widest input dtype, `-` in the inputs'
dtypes). Ops that look up no listed name are not shown. Written by `python
tests/test_op_registry.py --autocast > docs/autocast-coverage.md`; the tests
check that it is current.

| op | autocast name | CUDA | CPU |
|---|---|---|---|
{chr(10).join(rows)}

Names on torch's lists that no op of fpemu has: {absent}.
"""


if __name__ == "__main__" and "--autocast" in sys.argv:
    print(_autocast_page(_autocast_names()), end="")
