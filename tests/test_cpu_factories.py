"""Under ``Profile("cpu")``, ``arange``, ``linspace`` and ``logspace`` equal
torch 2.13 CPU bit for bit (``fpemu/autograd/_cpu_factories.py``): every
dtype the CPU kernels take, numbers and 0-d tensors for the endpoints,
lengths 0..200 and a few above ATen's parallel grain (32768), where the
per-thread chunks restart ``arange``'s vector body. The profile takes the
thread count and the instruction set from torch (run this file under
``bench/isa.py avx2`` for AVX2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): the reference

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())

FLOATS = [(torch.float64, ft.float64), (torch.float32, ft.float32),
          (torch.bfloat16, ft.bfloat16), (torch.float16, ft.float16)]
INTS = [(torch.int64, ft.int64), (torch.int32, ft.int32), (torch.int16, ft.int16),
        (torch.int8, ft.int8), (torch.uint8, ft.uint8)]
IDS_F = ["f64", "f32", "bf16", "f16"]
IDS_I = ["i64", "i32", "i16", "i8", "u8"]


def _codes(t):
    """Bit codes of a torch or fpemu tensor (16-bit floats through float32,
    which holds them exactly; NaNs keep their sign and payload)."""
    a = t.detach().numpy() if isinstance(t, torch.Tensor) and t.dtype not in (
        torch.bfloat16, torch.float16) else (
        t.detach().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t._data))
    if a.dtype == np.float64:
        return a.view(np.uint64)
    if a.dtype == np.float32:
        return a.view(np.uint32)
    return a


def _same(t, f, what):
    assert f.dtype == dict(FLOATS + INTS)[t.dtype], what
    a, b = _codes(t), _codes(f)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    bad = np.flatnonzero(a != b)
    assert bad.size == 0, (what, bad[:5], a[bad[:5]], b[bad[:5]])


def _both(fn_t, fn_f, what):
    t = fn_t()
    with ft.use_profile(CPU):
        f = fn_f()
    _same(t, f, what)


def _float_ranges(rng, n):
    """(start, end, step) giving about ``n`` elements, random signs and
    scales, ``end`` short of the last step by a random fraction."""
    scale = float(10.0 ** rng.uniform(-3, 2))
    start = float(rng.uniform(-5, 5)) * scale
    step = float(rng.uniform(0.01, 2)) * scale * (1 if rng.random() < 0.7 else -1)
    if n == 0:
        return start, start, step
    end = start + step * (n - 1) + step * float(rng.uniform(0.05, 1))
    return start, end, step


@pytest.mark.parametrize("dts", FLOATS, ids=IDS_F)
def test_arange_floats(dts):
    td, fd = dts
    rng = np.random.default_rng(0)
    for n in range(0, 201):
        s, e, st = _float_ranges(rng, n)
        _both(lambda: torch.arange(s, e, st, dtype=td),
              lambda: ft.arange(s, e, st, dtype=fd), (n, s, e, st))


def test_arange_crafted():
    # the lead's probe: the vector lanes' base is fma(step, 12, start), lane
    # 2 fma(2, step, base) (4 doubles a vector: the AVX2 build, also on AVX512)
    with ft.use_profile(CPU):
        v = ft.arange(0.123, 1.673, 0.1, dtype=ft.float64)
    assert float(v[14].item()) == torch.arange(0.123, 1.673, 0.1, dtype=torch.float64)[14]
    cases = [(0, 10, 1), (0.5, 10, 2), (1, 0, -0.1), (-3.3, 7.7, 0.7), (0, 1, 1 / 3),
             (0, 100, 0.1), (1e-7, 1e-5, 3e-8), (2 ** 24 - 40, 2 ** 24 + 40, 1.0),
             (-0.0, 5, 0.25), (0, 2000, 1.5)]
    for s, e, st in cases:
        for td, fd in FLOATS:
            _both(lambda: torch.arange(s, e, st, dtype=td),
                  lambda: ft.arange(s, e, st, dtype=fd), (s, e, st, td))
    # default dtypes: float32 when any argument is a float, else int64
    _both(lambda: torch.arange(0.1, 3.7, 0.3), lambda: ft.arange(0.1, 3.7, 0.3), "f32")
    _both(lambda: torch.arange(17), lambda: ft.arange(17), "i64")
    _both(lambda: torch.arange(2.5), lambda: ft.arange(2.5), "end only")


def test_arange_tensor_arguments():
    for s, e, st in [(0.123, 5.0, 0.37), (-2.0, 3.0, 0.1)]:
        for td, fd in FLOATS[:2]:
            _both(lambda: torch.arange(torch.tensor(s, dtype=td), torch.tensor(e), st, dtype=td),
                  lambda: ft.arange(ft.tensor(s, dtype=fd), ft.tensor(e), st, dtype=fd),
                  (s, e, st))


@pytest.mark.parametrize("dts", INTS, ids=IDS_I)
def test_arange_ints(dts):
    td, fd = dts
    rng = np.random.default_rng(1)
    for n in range(0, 201):
        s = int(rng.integers(-60, 60))
        st = int(rng.integers(1, 9)) * (1 if rng.random() < 0.7 else -1)
        e = s + st * n - (st // abs(st)) * int(rng.integers(0, abs(st)))
        _both(lambda: torch.arange(s, e, st, dtype=td),
              lambda: ft.arange(s, e, st, dtype=fd), (n, s, e, st))
    # float arguments truncated toward zero, the size counted in double;
    # results wrap in the narrow types
    for s, e, st in [(0, 10, 2.5), (0.5, 10, 2), (-7.9, 20, 3.2), (0, 300, 7), (250, -20, -3)]:
        _both(lambda: torch.arange(s, e, st, dtype=td),
              lambda: ft.arange(s, e, st, dtype=fd), (s, e, st))


@pytest.mark.parametrize("dts", FLOATS + INTS, ids=IDS_F + IDS_I)
def test_arange_parallel_chunks(dts):
    """Above 32768 elements each thread's chunk starts its own vector body
    and scalar tail (with one thread the same lengths run as one loop)."""
    td, fd = dts
    rng = np.random.default_rng(2)
    for n in (32767, 32768, 32769, 32770, 40001, 65569, 100003):
        if td.is_floating_point:
            s = float(rng.uniform(-1, 1))
            st = float(rng.uniform(1e-4, 1e-3)) * (100 if td is torch.float16 else 1)
            e = s + st * n - st / 3
        else:
            s, st = int(rng.integers(-100, 100)), int(rng.integers(1, 3))
            e = s + st * n
        _both(lambda: torch.arange(s, e, st, dtype=td),
              lambda: ft.arange(s, e, st, dtype=fd), (n, s, st))


def _ends(rng, integer):
    if integer:
        return int(rng.integers(-100, 100)), int(rng.integers(-100, 100))
    scale = float(10.0 ** rng.uniform(-2, 3))
    return float(rng.uniform(-1, 1)) * scale, float(rng.uniform(-1, 1)) * scale


@pytest.mark.parametrize("dts", FLOATS + INTS, ids=IDS_F + IDS_I)
def test_linspace(dts):
    td, fd = dts
    integer = not td.is_floating_point
    rng = np.random.default_rng(3)
    for n in range(0, 201):
        a, b = _ends(rng, integer)
        if td is torch.uint8:
            a, b = abs(a) % 256, abs(b) % 256
        elif td is torch.int8:
            a, b = a // 2 + 10, b // 2 - 10
        _both(lambda: torch.linspace(a, b, n, dtype=td),
              lambda: ft.linspace(a, b, n, dtype=fd), (n, a, b))
        # the tensor overload: 0-d tensors for the endpoints
        src_t = torch.float64 if not integer else torch.int64
        src_f = ft.float64 if not integer else ft.int64
        _both(lambda: torch.linspace(torch.tensor(a, dtype=src_t), torch.tensor(b, dtype=src_t),
                                     n, dtype=td),
              lambda: ft.linspace(ft.tensor(a, dtype=src_f), ft.tensor(b, dtype=src_f), n,
                                  dtype=fd), ("tensor", n, a, b))


def test_linspace_crafted():
    for td, fd in FLOATS:
        for a, b, n in [(-math.pi, math.pi, 2000), (0, 1, 7), (1, 0, 1000), (-1, 1, 33000),
                        (0.1, 0.3, 40001), (5, 5, 9), (0, 1, 1), (3.5, 9, 0), (0, 1e-30, 5)]:
            _both(lambda: torch.linspace(a, b, n, dtype=td),
                  lambda: ft.linspace(a, b, n, dtype=fd), (td, a, b, n))
    # integer endpoints with the default dtype; uint8 takes -255..-1 wrapped
    _both(lambda: torch.linspace(-3, 17, 11), lambda: ft.linspace(-3, 17, 11), "default")
    _both(lambda: torch.linspace(-10, 20, 5, dtype=torch.uint8),
          lambda: ft.linspace(-10, 20, 5, dtype=ft.uint8), "uint8 wrap")
    _both(lambda: torch.linspace(0, float("inf"), 4), lambda: ft.linspace(0, math.inf, 4),
          "inf")


@pytest.mark.parametrize("dts", FLOATS + INTS, ids=IDS_F + IDS_I)
def test_logspace(dts):
    td, fd = dts
    integer = not td.is_floating_point
    rng = np.random.default_rng(4)
    for n in range(0, 201):
        base = float(rng.choice([10.0, 2.0, 2.5, 0.7, math.e]))
        if integer:
            a, b = int(rng.integers(0, 6)), int(rng.integers(0, 6))
            base = float(rng.choice([2.0, 3.0, 1.5]))
        else:
            a, b = float(rng.uniform(-4, 4)), float(rng.uniform(-4, 4))
        _both(lambda: torch.logspace(a, b, n, base=base, dtype=td),
              lambda: ft.logspace(a, b, n, base=base, dtype=fd), (n, a, b, base))
        src_t, src_f = (torch.int64, ft.int64) if integer else (torch.float32, ft.float32)
        _both(lambda: torch.logspace(torch.tensor(a, dtype=src_t), torch.tensor(b, dtype=src_t),
                                     n, base=base, dtype=td),
              lambda: ft.logspace(ft.tensor(a, dtype=src_f), ft.tensor(b, dtype=src_f), n,
                                  base=base, dtype=fd), ("tensor", n, a, b, base))


def test_logspace_crafted():
    for td, fd in FLOATS:
        for a, b, n, base in [(0, 1, 1, 10.0), (0.3, 2, 1, 2.0), (-300, 300, 50, 10.0),
                              (0, 40, 7, 10.0), (0, 1, 40001, 10.0), (2, -3, 9, -2.0),
                              (-2, 3, 6, 0.0)]:
            _both(lambda: torch.logspace(a, b, n, base=base, dtype=td),
                  lambda: ft.logspace(a, b, n, base=base, dtype=fd), (td, a, b, n, base))
    _both(lambda: torch.logspace(0, 10, 4, base=2, dtype=torch.uint8),
          lambda: ft.logspace(0, 10, 4, base=2, dtype=ft.uint8), "uint8 wraps")


def test_errors_as_torch():
    with ft.use_profile(CPU):
        with pytest.raises(RuntimeError, match="int8_t without overflow"):
            ft.linspace(0, 300, 3, dtype=ft.int8)
        with pytest.raises(RuntimeError, match="float without overflow"):
            ft.linspace(0, 1e39, 3)
        with pytest.raises(RuntimeError, match="c10::Half without overflow"):
            ft.logspace(0, 70000, 3, dtype=ft.float16)
        with pytest.raises(RuntimeError, match="uint8_t without overflow"):
            ft.linspace(-1.0, 3, 3, dtype=ft.uint8)
        with pytest.raises(NotImplementedError, match="arange_cpu"):
            ft.arange(0, 5, dtype=ft.bool_)
    for fn in (lambda: torch.linspace(0, 300, 3, dtype=torch.int8),
               lambda: torch.linspace(0, 1e39, 3),
               lambda: torch.logspace(0, 70000, 3, dtype=torch.float16),
               lambda: torch.linspace(-1.0, 3, 3, dtype=torch.uint8)):
        with pytest.raises(RuntimeError, match="without overflow"):
            fn()


def test_cuda_profile_unchanged():
    """The CUDA profile keeps numpy's values: linspace in float64 rounded
    once, arange from numpy."""
    v = ft.linspace(-1.0, 1.0, 7, dtype=ft.float32)
    assert np.array_equal(np.asarray(v._data), np.linspace(-1.0, 1.0, 7).astype(np.float32))
    a = ft.arange(0.123, 1.673, 0.1, dtype=ft.float64)
    assert np.array_equal(np.asarray(a._data), np.arange(0.123, 1.673, 0.1))
