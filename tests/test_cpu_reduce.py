"""ATen's CPU sum in its order (fpemu/autograd/_cpu_reduce.py) against torch
CPU, bit for bit: every path of ``cascade_sum`` (contiguous and strided,
inner and outer reductions, vector and scalar twins, sizes around the vector
width and the cascade's level steps), the threads' splits above GRAIN_SIZE,
16-bit inputs with their per-store rounding, nansum; and the order itself,
revealed from both sides with FPRev's crafted inputs (bench/fprev.py).

The model takes the capability and thread count torch reports, so the same
tests hold on an AVX2 machine (``python bench/isa.py avx2 -- pytest ...``).
"""

from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu.autograd as ft                                      # noqa: E402
from fpemu.autograd._cpu_reduce import (  # noqa: E402
    GRAIN_SIZE, cpu_cdist, cpu_norm, cpu_prod, cpu_sum, cpu_var,
)
from fpemu.errors import FpemuValueError                         # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from fprev import canonical, count_from_sum, reveal, unit_and_big  # noqa: E402

CAP = torch.backends.cpu.get_cpu_capability()
THREADS = torch.get_num_threads()
R = np.random.default_rng(68)


def _values(shape, dtype=np.float32):
    """Signs and magnitudes over six decades: every order rounds otherwise."""
    return (R.standard_normal(shape) * 10.0 ** R.uniform(-3, 3, shape)).astype(dtype)


def _model(x, dims=None, nan=False, dtype=None):
    return cpu_sum(x, dims, threads=THREADS, capability=CAP, nan=nan, dtype=dtype)


def _codes(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32).reshape(-1)


def _torch(x, dims=None, nan=False):
    fn = torch.nansum if nan else torch.sum
    return fn(x, dim=dims) if dims is not None else fn(x)


def _equal(t, dims=None, nan=False):
    """Whether the model's sum of torch tensor ``t`` has torch's bit codes."""
    want = _torch(t, dims, nan)
    if t.dtype in (torch.bfloat16, torch.float16):
        got = _model(t.float().numpy(), dims, nan, str(t.dtype).replace("torch.", ""))
        return np.array_equal(_codes(got), _codes(want.float().numpy()))
    got = _model(t.numpy(), dims, nan)
    return got.shape == tuple(want.shape) and np.array_equal(_codes(got), _codes(want.numpy()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_full_sums_of_every_length_around_the_vectors_and_levels(dtype):
    sizes = list(range(1, 80)) + [127, 128, 129, 255, 256, 257, 511, 1023, 1025, 4096,
                                  4097, 65535, 65536, 65537]
    bad = [n for n in sizes if not _equal(torch.from_numpy(_values(n, dtype)))]
    assert not bad, f"sums of these lengths differ from torch's: {bad}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dim_sums_of_every_layout(dtype):
    """Inner and outer reductions, several dims at once, a transposed and a
    strided view of each shape (the scalar twins and the iterator's order)."""
    bad = []
    for shape in [(3, 5), (17, 33), (9, 64), (64, 9), (5, 130), (130, 5), (2, 3, 4),
                  (7, 40, 9), (33, 17, 3), (4, 65, 66)]:
        x = torch.from_numpy(_values(shape, dtype))
        for view, name in ((x, "contiguous"), (x.transpose(0, -1), "transposed"),
                           (x[..., ::2], "strided")):
            for r in range(1, len(shape) + 1):
                for dims in itertools.combinations(range(len(shape)), r):
                    if not _equal(view, dims):
                        bad.append((shape, name, dims))
    assert not bad, f"{len(bad)} reductions differ from torch's, e.g. {bad[:4]}"


def test_the_threads_splits_above_the_grain_size():
    """Past GRAIN_SIZE elements torch splits a full sum into per-thread
    partials (two_pass_reduction) and a dim sum by columns
    (parallel_dim_reduction, rounded to 128 bytes): both as torch does for
    the thread count it runs with."""
    n = GRAIN_SIZE
    cases = [((3 * n + 5,), None), ((n + 1,), None), ((2, n), (1,)), ((n, 2), (0,)),
             ((300, 250), (0,)), ((250, 300), (1,)), ((3, 200, 100), (1,))]
    bad = [c for c in cases if not _equal(torch.from_numpy(_values(c[0])), c[1])]
    assert not bad, f"threads={THREADS}: these differ from torch's: {bad}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_sums(dtype):
    """bfloat16 / float16: float32 lanes fed by both halves of a 16-bit
    vector, each store rounded to the dtype, the float32 copy where the two
    fastest dims are reduced (should_use_acc_buffer)."""
    bad = []
    for shape, dims in [((37,), None), ((1000,), None), ((5, 40), (1,)), ((40, 5), (0,)),
                        ((3, 50, 7), (1,)), ((64, 70), (0,)), ((70, 64), (1,)),
                        ((6, 7, 8), (0, 1)), ((6, 7, 8), (0, 2)), ((2 * GRAIN_SIZE,), None),
                        ((4, 20000), (1,))]:
        t = torch.from_numpy(_values(shape)).to(dtype)
        if not _equal(t, dims):
            bad.append((shape, dims))
    assert not bad, f"{dtype} sums differ from torch's: {bad}"


def test_nansum():
    x = _values(1000)
    x[::7] = np.nan
    t = torch.from_numpy(x)
    for view, dims in ((t, None), (t.reshape(10, 100), (1,)), (t.reshape(10, 100), (0,)),
                       (t.reshape(100, 10)[:, ::3], (0,))):
        assert _equal(view, dims, nan=True), (tuple(view.shape), dims)


def _tree(fn, n, dtype="float32"):
    u, big = unit_and_big(dtype, n)

    def probe(pairs):
        out = []
        for i, j in pairs:
            x = np.full(n, u, np.float32)
            x[i], x[j] = big, -big
            out.append(count_from_sum(float(fn(x)), u, n))
        return out
    return canonical(reveal(probe, range(n))[0])


@pytest.mark.parametrize("n", [10, 37, 70])
def test_fprev_reveals_the_same_order_in_torch_and_the_model(n):
    """FPRev (arXiv 2411.00442) rebuilds the summation tree from outputs
    alone: torch's tree and the model's are the same tree."""
    want = _tree(lambda x: torch.from_numpy(x).sum().item(), n)
    got = _tree(lambda x: _model(x).item(), n)
    assert got == want


def test_fprev_tree_of_a_bfloat16_sum():
    want = _tree(lambda x: torch.from_numpy(x).to(torch.bfloat16).sum().float().item(), 40,
                 "bfloat16")
    got = _tree(lambda x: _model(x, dtype="bfloat16").item(), 40, "bfloat16")
    assert got == want


def _cpu_profile():
    return ft.Profile("cpu", "2.13.0", cpu_threads=THREADS, cpu_capability=CAP)


def test_sum_mean_and_nansum_of_the_cpu_profile_print_torchs_digits():
    """The issue's example: sin(linspace(-pi, pi, 2000)).sum() is 3.7e-6 in
    torch CPU, not 0.0; and mean / nansum / sum(dim) of fpemu tensors."""
    t = torch.sin(torch.linspace(-math.pi, math.pi, 2000))
    with ft.use_profile(_cpu_profile()):
        f = ft.nn.from_torch(t)
        assert _codes(ft.sum(f).numpy()).tolist() == _codes(t.sum().numpy()).tolist()
        x = torch.from_numpy(_values((33, 70)))
        fx = ft.nn.from_torch(x)
        for got, want in ((ft.mean(fx), x.mean()), (ft.mean(fx, 1), x.mean(1)),
                          (ft.sum(fx, 0), x.sum(0)), (ft.nansum(fx, 1), x.nansum(1)),
                          (fx.sum(dim=(0, 1), keepdim=True), x.sum(dim=(0, 1), keepdim=True)),
                          (ft.mean(fx.bfloat16(), 1), x.bfloat16().mean(1)),
                          (ft.sum(fx.bfloat16(), 0), x.bfloat16().sum(0))):
            g, w = got.float().numpy(), want.float().numpy()
            assert g.shape == w.shape and np.array_equal(_codes(g), _codes(w))


def test_bad_input_gets_a_clear_error():
    with pytest.raises(FpemuValueError, match="float32 or float64"):
        cpu_sum(np.arange(4))
    with pytest.raises(FpemuValueError, match="dtype must be"):
        cpu_sum(np.zeros(4, np.float64), dtype="bfloat16")
    with pytest.raises(FpemuValueError, match="threads"):
        cpu_sum(np.zeros(4, np.float32), threads=0)


def _norm_equal(t, p, dims):
    want = torch.linalg.vector_norm(t, p, dim=dims)
    half = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(t.dtype)
    got = cpu_norm(t.float().numpy() if half else t.numpy(), p, dims, threads=THREADS,
                   capability=CAP, dtype=half)
    w = want.float().numpy() if half else want.numpy()
    return got.shape == w.shape and np.array_equal(_codes(got), _codes(w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
def test_vector_norms_every_p_and_layout(dtype):
    """The 2-norm's vectorized row kernel (8 float / 4 double lanes, the
    tail's squares four at a time, then FMAs), NormOneOps / NormTwoOps /
    NormOps (libm's pow) in the iterator's order elsewhere, the threads'
    partials of a long full norm."""
    bad = []
    for size in list(range(1, 40)) + [100, 1000, GRAIN_SIZE + 3]:
        t = torch.from_numpy(_values(size).astype(np.float64)).to(dtype)
        for p in (1, 2, 3, -1, 1.5, 0.9):
            if not _norm_equal(t, p, None):
                bad.append((size, p))
    for shape in [(3, 5), (9, 64), (64, 9), (2, 3, 4), (7, 40, 9)]:
        t = torch.from_numpy(_values(shape).astype(np.float64)).to(dtype)
        for view in (t, t.transpose(0, -1)):
            for r in range(1, len(shape) + 1):
                for dims in itertools.combinations(range(len(shape)), r):
                    for p in (1, 2, 3):
                        if not _norm_equal(view, p, dims):
                            bad.append((shape, tuple(view.stride()), dims, p))
    assert not bad, f"{len(bad)} norms differ from torch's, e.g. {bad[:4]}"


def test_norm_of_the_cpu_profile_and_its_size_one_cases():
    """fpemu's norm, linalg.vector_norm and the 1 / inf matrix norms under the
    CPU profile; a norm over size-1 dims is abs(), but torch runs the kernel
    for a 0-d tensor with an explicit dim (pow(pow(|x|, 3), 1/3) != |x|)."""
    x = torch.from_numpy(_values((6, 35)))
    s = torch.tensor(-8.478446960449219)
    with ft.use_profile(_cpu_profile()):
        fx, fs = ft.nn.from_torch(x), ft.nn.from_torch(s)
        cases = [(ft.norm(fx), x.norm()), (ft.norm(fx, 3, 1), x.norm(3, 1)),
                 (ft.linalg.vector_norm(fx, 1.5, 0), torch.linalg.vector_norm(x, 1.5, 0)),
                 (ft.linalg.matrix_norm(fx, math.inf), torch.linalg.matrix_norm(x, math.inf)),
                 (ft.linalg.matrix_norm(fx, 1), torch.linalg.matrix_norm(x, 1)),
                 (ft.norm(fs, 3, 0), torch.norm(s, 3, 0)), (ft.norm(fs, 3), torch.norm(s, 3)),
                 (ft.norm(ft.nn.from_torch(x[:, :1]), 3, 1), torch.norm(x[:, :1], 3, 1))]
        for got, want in cases:
            assert np.array_equal(_codes(got.numpy()), _codes(want.numpy())), (got, want)
    assert torch.norm(s, 3, 0).item() != abs(s.item())      # the kernel, not abs()


def _var_equal(t, dims, corr, sqrt, with_mean):
    if with_mean:
        want, want_mu = (torch.std_mean if sqrt else torch.var_mean)(t, dim=dims,
                                                                     correction=corr)
    else:
        want, want_mu = (torch.std if sqrt else torch.var)(t, dim=dims, correction=corr), None
    got, mu = cpu_var(t.numpy(), dims, corr, take_sqrt=sqrt, threads=THREADS,
                      with_mean=with_mean)
    ok = got.shape == tuple(want.shape) and np.array_equal(_codes(got), _codes(want.numpy()))
    return ok and (not with_mean or np.array_equal(_codes(mu), _codes(want_mu.numpy())))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_var_std_and_their_means(dtype):
    """A full var / std: the float mean, then the double sum of squared
    deviations per thread chunk and 2-d block (std_var_all_cpu); dim
    reductions and var_mean / std_mean: Welford in double per output, the
    threads' partials combined for one long output."""
    bad = []
    for size in list(range(2, 30)) + [1000, GRAIN_SIZE + 7, 3 * GRAIN_SIZE]:
        t = torch.from_numpy(_values(size).astype(np.float64) + 3).to(dtype)
        for sqrt, with_mean, corr in itertools.product((False, True), (False, True), (0, 1)):
            if not _var_equal(t, None, corr, sqrt, with_mean):
                bad.append((size, sqrt, with_mean, corr))
    for shape in [(3, 5), (9, 64), (2, 3, 4), (7, 40, 9), (300, 200)]:
        t = torch.from_numpy(_values(shape).astype(np.float64)).to(dtype)
        for view in (t, t.transpose(0, -1)):
            for r in range(1, len(shape) + 1):
                for dims in itertools.combinations(range(len(shape)), r):
                    for sqrt, with_mean in itertools.product((False, True), repeat=2):
                        if not _var_equal(view, dims, 1, sqrt, with_mean):
                            bad.append((shape, tuple(view.stride()), dims, sqrt, with_mean))
    assert not bad, f"{len(bad)} differ from torch's, e.g. {bad[:4]}"


def test_var_mean_of_the_cpu_profile():
    x = torch.from_numpy(_values((5, 5, 5)).astype(np.float64))
    with ft.use_profile(_cpu_profile()):
        fx = ft.nn.from_torch(x)
        for got, want in ((ft.var_mean(fx), torch.var_mean(x)), (ft.std(fx), torch.std(x)),
                          (ft.std_mean(fx, 1), torch.std_mean(x, 1)),
                          (ft.var(fx, (0, 2)), torch.var(x, (0, 2)))):
            for g, w in zip(got if isinstance(got, tuple) else (got,),
                            want if isinstance(want, tuple) else (want,)):
                assert np.array_equal(_codes(g.numpy()), _codes(w.numpy()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cdist_direct_kernel(dtype):
    """torch CPU's own cdist kernel (no more than 25 rows a side for p = 2):
    |a - b| accumulated in the dtype, the 2-norm's squares as the compiled
    loop takes them, libm's pow and a double root for other p."""
    bad = []
    for P, R, M in [(1, 1, 1), (3, 4, 5), (7, 2, 9), (5, 5, 16), (2, 25, 33), (1, 3, 70)]:
        a = torch.from_numpy(_values((2, P, M)).astype(np.float64)).to(dtype)
        b = torch.from_numpy(_values((2, R, M)).astype(np.float64)).to(dtype)
        for p in (1.0, 2.0, 3.0, 0.5, 1.5):
            want = torch.cdist(a, b, p=p).numpy()
            got = cpu_cdist(a.numpy(), b.numpy(), p, CAP)
            if not np.array_equal(_codes(got), _codes(want)):
                bad.append((P, R, M, p))
    assert not bad, f"cdist differs from torch's for {bad}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
def test_prod_in_binary_kernel_reduce_vecs_order(dtype):
    """prod: reduction128's four vectors and lanes for a contiguous reduced
    dim, the column blocks of an outer reduction, the plain loop otherwise;
    16-bit products rounded at every multiplication; the threads' splits."""
    bad = []
    for size in list(range(1, 70)) + [127, 128, 129, 1000, GRAIN_SIZE + 9]:
        t = torch.from_numpy(1 + 0.01 * R.standard_normal(size)).to(dtype)
        bad += [size] if not _prod_equal(t, None) else []
    for shape in [(3, 5), (9, 64), (64, 9), (2, 3, 4), (7, 40, 9), (40, 70)]:
        t = torch.from_numpy(1 + 0.01 * R.standard_normal(shape)).to(dtype)
        for view in (t, t.transpose(0, -1)):
            for d in range(len(shape)):
                bad += [(shape, tuple(view.stride()), d)] if not _prod_equal(view, d) else []
    assert not bad, f"{len(bad)} products differ from torch's, e.g. {bad[:4]}"


def _prod_equal(t, d):
    want = t.prod(d) if d is not None else t.prod()
    half = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(t.dtype)
    got = cpu_prod(t.float().numpy() if half else t.numpy(), None if d is None else (d,),
                   threads=THREADS, capability=CAP, dtype=half)
    w = want.float().numpy() if half else want.numpy()
    return got.shape == w.shape and np.array_equal(_codes(got), _codes(w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_of_the_cpu_profile(dtype):
    """torch's CPU rms_norm: x * x, its cascade mean, + eps, rsqrt's two
    roundings, x * rstd, * weight, each step in the dtype."""
    F = ft.nn.functional
    with ft.use_profile(_cpu_profile()):
        for shape, ns in [((3, 17), (17,)), ((2, 5, 40), (40,)), ((2, 5, 8), (5, 8))]:
            x = torch.from_numpy(_values(shape).astype(np.float64)).to(dtype)
            w = torch.from_numpy(_values(ns).astype(np.float64)).to(dtype)
            for weight, eps in ((None, None), (w, 1e-5)):
                want = torch.nn.functional.rms_norm(x, ns, weight, eps)
                got = F.rms_norm(ft.nn.from_torch(x), ns,
                                 None if weight is None else ft.nn.from_torch(weight), eps)
                assert np.array_equal(_codes(got.detach().numpy()), _codes(want.numpy())), \
                    (shape, ns, eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_softmax_backward_along_the_last_dim(dtype):
    """The gradient's lane sum, then ``g - exp(y) * sum`` as one FMA with
    SLEEF's exp: torch CPU's log_softmax backward, bit for bit."""
    bad = []
    for rows, cols in [(1, 1), (3, 7), (2, 16), (4, 33), (1, 70), (5, 129)]:
        x = torch.from_numpy(_values((rows, cols)).astype(np.float64) / 1e3).to(dtype)
        g = torch.from_numpy(_values((rows, cols)).astype(np.float64)).to(dtype)
        x.requires_grad_(True)
        (want,) = torch.autograd.grad(torch.log_softmax(x, -1), x, g)
        with ft.use_profile(_cpu_profile()):
            fx = ft.nn.from_torch(x.detach()).requires_grad_(True)
            ft.nn.functional.log_softmax(fx, -1).backward(ft.nn.from_torch(g))
        if not np.array_equal(_codes(fx.grad.numpy()), _codes(want.numpy())):
            bad.append((rows, cols))
    assert not bad, f"log_softmax gradients differ from torch's for {bad}"
