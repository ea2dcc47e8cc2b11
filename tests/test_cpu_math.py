"""fpemu.autograd._cpu_math: under the CPU profile glu, softmax / softmin /
log_softmax (last dim and inner dims, ``dtype=``), hardswish, hardsigmoid,
sigmoid, silu, elu / selu / celu, softplus, mish, logsigmoid and gelu give
torch CPU's float32 / float64 bit codes: lengths 1..70 put elements in the
vector bodies (2 x 16 / 2 x 8 floats, 2 x 8 / 2 x 4 doubles) and in the
scalar tails, with inf, -inf, NaN and -0 among them. The profile takes the
machine's vector width and thread count from torch, so the tests also hold
under ``bench/isa.py avx2``."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.autograd as ft                                      # noqa: E402
from fpemu.autograd import _cpu_math                             # noqa: E402

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
F = torch.nn.functional
DTYPES = (np.float32, np.float64)


def _values(shape, dt, seed):
    x = (np.random.default_rng(seed).standard_normal(shape) * 6).astype(dt)
    flat = x.reshape(-1)
    specials = np.array([np.inf, -np.inf, -0.0, 0.0, 30.0, -120.0], dt)
    k = min(flat.size // 7, specials.size)
    flat[3:3 + 7 * k:7] = specials[:k]
    return x


def _same(got, want):
    got = np.asarray(got._data if isinstance(got, ft.Tensor) else got)
    want = want.detach().numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    codes = np.uint32 if got.dtype == np.float32 else np.uint64
    a, b = got.view(codes), want.view(codes)
    both_nan = np.isnan(got) & np.isnan(want)
    bad = np.flatnonzero((a != b) & ~both_nan)
    assert bad.size == 0, f"{bad.size} of {a.size} differ, first at {bad[:5]}"


def _run(fn_ft, fn_torch, x):
    with ft.use_profile(CPU):
        got = fn_ft(ft.nn.from_torch(torch.from_numpy(x)))
    _same(got, fn_torch(torch.from_numpy(x)))


@pytest.mark.parametrize("dt", DTYPES)
def test_glu_rows_of_every_length(dt):
    for n in range(1, 71):
        x = _values((3, 2 * n), dt, n)
        _run(lambda t: ft.nn.functional.glu(t, -1), lambda t: F.glu(t, -1), x)


GLU_CASES = [((6, 5, 7), 0), ((4, 6, 9), 1), ((2, 8, 4, 8), 2), ((40, 34), 0), ((1, 2), 1),
             ((300, 230), 0)]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape, dim", GLU_CASES)
def test_glu_along_other_dims(dt, shape, dim):
    _run(lambda t: ft.nn.functional.glu(t, dim), lambda t: F.glu(t, dim),
         _values(shape, dt, 7))


@pytest.mark.parametrize("dt", DTYPES)
def test_softmax_last_dim_of_every_length(dt):
    for n in range(1, 71):
        x = _values((2, n), dt, n)
        _run(lambda t: ft.nn.functional.softmax(t, -1), lambda t: F.softmax(t, -1), x)
        _run(lambda t: ft.nn.functional.softmin(t, -1), lambda t: F.softmin(t, -1), x)


SOFTMAX_CASES = [((4, 5, 6), 0), ((3, 7, 40), 1), ((1, 50, 17), 1), ((2, 3, 4, 33), 1),
                 ((5, 3), 0), ((1, 9), 0), ((40, 700), 0)]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape, dim", SOFTMAX_CASES)
def test_softmax_inner_dims(dt, shape, dim):
    x = _values(shape, dt, 3)
    _run(lambda t: ft.nn.functional.softmax(t, dim), lambda t: F.softmax(t, dim), x)
    _run(lambda t: ft.nn.functional.softmin(t, dim), lambda t: F.softmin(t, dim), x)


def test_softmax_with_dtype_and_edge_shapes():
    x = _values((3, 21), np.float32, 5)
    _run(lambda t: ft.nn.functional.softmax(t, 1, dtype=ft.float64),
         lambda t: F.softmax(t, 1, dtype=torch.float64), x)
    _run(lambda t: ft.nn.functional.softmax(t, 0), lambda t: F.softmax(t, 0),
         np.array(2.5, np.float32))
    _run(lambda t: ft.nn.functional.softmax(t, 1), lambda t: F.softmax(t, 1),
         np.zeros((0, 4), np.float32))
    nan = np.array([[1.0, np.nan, 2.0], [np.inf, 1.0, 0.0]], np.float32)
    _run(lambda t: ft.nn.functional.softmax(t, 1), lambda t: F.softmax(t, 1), nan)


@pytest.mark.parametrize("dt", DTYPES)
def test_hardswish_hardsigmoid(dt):
    for n in (1, 15, 16, 33, 70):
        x = _values((n,), dt, n)
        _run(ft.nn.functional.hardswish, F.hardswish, x)
        _run(ft.nn.functional.hardsigmoid, F.hardsigmoid, x)


def test_vector_rows_follow_the_iterator():
    """A row's leftover after its last two-vector step, and a row the
    iterator cannot walk contiguously, run the scalar lambda."""
    mask = _cpu_math.vector_mask((3, 40), [(80, 1), (80, 1)], 32, 1)
    assert mask[:, :32].all() and not mask[:, 32:].any()
    assert not _cpu_math.vector_mask((40, 4), [(2, 80)], 32, 1).any()
    # a transposed input: the iterator walks it in memory order
    assert _cpu_math.vector_mask((40, 4), [(1, 80)], 32, 1)[:32].all()


ACTIVATIONS = [
    ("sigmoid", ft.sigmoid, torch.sigmoid),
    ("silu", ft.nn.functional.silu, F.silu),
    ("elu", lambda t: ft.nn.functional.elu(t, 0.7), lambda t: F.elu(t, 0.7)),
    ("selu", ft.nn.functional.selu, F.selu),
    ("celu", lambda t: ft.nn.functional.celu(t, 1.3), lambda t: F.celu(t, 1.3)),
    ("softplus", ft.nn.functional.softplus, F.softplus),
    ("softplus_beta", lambda t: ft.nn.functional.softplus(t, 2.0, 5.0),
     lambda t: F.softplus(t, 2.0, 5.0)),
    ("mish", ft.nn.functional.mish, F.mish),
    ("logsigmoid", ft.nn.functional.logsigmoid, F.logsigmoid),
    ("gelu_tanh", lambda t: ft.nn.functional.gelu(t, approximate="tanh"),
     lambda t: F.gelu(t, approximate="tanh")),
]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name, fn_ft, fn_torch", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_exp_log_tanh_activations(dt, name, fn_ft, fn_torch):
    """SLEEF's exp / expm1 / log1p / tanh in the vector bodies, libm's in the
    tails: rows of every length 1..70 (contiguous, and transposed: all
    tail), with inf, NaN, -0, large and tiny values among them."""
    for n in range(1, 71):
        x = _values((2, n), dt, n)
        _run(fn_ft, fn_torch, x)
    x = _values((37, 5), dt, 1)
    _run(lambda t: fn_ft(t.t()), lambda t: fn_torch(t.t()), x)


def test_gelu_erf_float32():
    """gelu's erf form on float32: ATen's kernel (``Vectorized<float>::erf``,
    libm's erff) for a one-element or non-contiguous tensor; oneDNN's
    gelu_erf for a contiguous one (AVX-512 only: the profile leaves AVX2's
    to the float64 formula)."""
    g, gt = ft.nn.functional.gelu, F.gelu
    for n in range(2, 71):                     # (2, n) transposed: not contiguous
        x = _values((n, 2), np.float32, n)
        _run(lambda t: g(t.t()), lambda t: gt(t.t()), x)
    _run(g, gt, np.array([1.7], np.float32))
    if CPU.cpu_capability.upper().startswith("AVX512"):
        for n in (2, 15, 16, 17, 33, 1000):
            _run(g, gt, _values((n,), np.float32, n) / np.float32(2))


LOG_SOFTMAX_CASES = [((4, 5, 6), 0), ((3, 7, 40), 1), ((1, 50, 17), 1), ((2, 3, 4, 33), 1),
                     ((5, 3), 0), ((2, 3000, 40), 1)]


@pytest.mark.parametrize("dt", DTYPES)
def test_log_softmax(dt):
    for n in range(1, 71):
        x = _values((2, n), dt, n)
        _run(lambda t: ft.nn.functional.log_softmax(t, -1), lambda t: F.log_softmax(t, -1), x)
    for shape, dim in LOG_SOFTMAX_CASES:
        x = _values(shape, dt, 3)
        _run(lambda t: ft.nn.functional.log_softmax(t, dim),
             lambda t: F.log_softmax(t, dim), x)
