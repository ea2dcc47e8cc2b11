"""``fpemu.autograd.distributions`` against ``torch.distributions``: the
formulas made of + - * / log (``log_prob`` of every distribution, the normal
and uniform entropies, Categorical from probabilities) bit for bit (the
normal's each against one float32 formula fed its own library's log, where
torch CPU's SIMD logf is an ulp off the rounded logarithm); the ones
where torch CPU runs its own SIMD exp / log1p (a softmax or logsumexp over
logits, binary_cross_entropy_with_logits) or sums in an order that follows
the CPU's vector width (entropies, gradients) within a stated number of
ulps, counted on the codes; the shapes of the samples; torch's validation
errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): the reference behaviour

# Each test draws from its own generator: pytest-xdist deals the tests of this
# file to its workers one at a time, so a generator shared by the module gave
# each test other inputs in every run.
_RNG = np.random.default_rng(0)
P = _RNG.random((3, 5)).astype(np.float32)
L = _RNG.standard_normal((3, 5)).astype(np.float32)


def _same(a, b, ulps=0):
    """float32 codes equal, or at most ``ulps`` apart (same sign)."""
    a, b = a.detach().numpy(), b.detach().numpy()
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    if not ulps:
        np.testing.assert_array_equal(b.view(np.uint32), a.view(np.uint32))
        return
    assert (np.signbit(a) == np.signbit(b)).all()
    dist = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))
    assert dist.max() <= ulps, dist.max()


def _same_to_row_scale(a, b, ulps):
    """float32 values at most ``ulps`` ulps of their row's largest magnitude apart."""
    a, b = a.detach().numpy(), b.detach().numpy()
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    unit = np.spacing(np.abs(a).max(axis=-1, keepdims=True))
    dist = np.abs(a.astype(np.float64) - b.astype(np.float64)) / unit
    assert dist.max() <= ulps, dist.max()


@pytest.mark.parametrize("kw", ["probs", "logits"])
def test_categorical(kw):
    arr = P if kw == "probs" else L
    tp, fp = torch.from_numpy(arr).requires_grad_(), ft.tensor(arr, requires_grad=True)
    td = torch.distributions.Categorical(**{kw: tp})
    fd = ft.distributions.Categorical(**{kw: fp})
    v = np.array([0, 4, 2])
    tl, fl = td.log_prob(torch.from_numpy(v)), fd.log_prob(ft.tensor(v))
    _same(tl, fl, ulps=0 if kw == "probs" else 2)     # logits: logsumexp's exp / log
    _same(td.entropy(), fd.entropy(), ulps=4)          # a sum over the 5 categories
    (tl.sum() + td.entropy().sum()).backward()
    (fl.sum() + fd.entropy().sum()).backward()
    # the gradient goes through torch's sums, whose order follows the CPU's vector
    # width (AVX2, AVX-512 and torch's scalar code differ), and from logits through
    # softmax's exp: their rounding errors are those of the row's largest terms,
    # so the gradients are compared in ulps of each row's largest gradient (a
    # small gradient left by cancellation was 73 of its own ulps off under
    # ATEN_CPU_CAPABILITY=default, 1 ulp of its row's largest); from probs, no
    # exp and no cancellation: 2 of each gradient's own ulps
    if kw == "probs":
        _same(tp.grad, fp.grad, ulps=2)
    else:
        _same_to_row_scale(tp.grad, fp.grad, ulps=2)
    _same(td.probs, fd.probs, ulps=0 if kw == "probs" else 2)    # logits: softmax's exp
    assert fd.mode.tolist() == td.mode.tolist()
    s = fd.sample((4,))
    assert tuple(s.shape) == tuple(td.sample((4,)).shape) == (4, 3)
    assert s.dtype == ft.int64 and bool(((s >= 0) & (s < 5)).all())
    assert tuple(fd.batch_shape) == (3,) and tuple(fd.event_shape) == ()


def _normal_oracle(x, loc, scale, log_scale):
    """torch.distributions.Normal's log_prob and entropy written out in
    float32 NumPy, one rounding per operation (torch's Python scalars become
    float32 before the operation), with ``log(scale)`` given."""
    f32 = np.float32
    d = x - loc
    log_prob = (-(d * d)) / (f32(2) * (scale * scale)) - log_scale \
        - f32(math.log(math.sqrt(2 * math.pi)))
    return log_prob, f32(0.5 + 0.5 * math.log(2 * math.pi)) + log_scale


def test_normal_and_uniform():
    rng = np.random.default_rng(1)
    loc = rng.standard_normal(64).astype(np.float32)
    sc = (rng.random(64) + 0.1).astype(np.float32)
    x = rng.standard_normal(64).astype(np.float32)
    tl, ts = torch.from_numpy(loc).requires_grad_(), torch.from_numpy(sc).requires_grad_()
    fl, fs = ft.tensor(loc, requires_grad=True), ft.tensor(sc, requires_grad=True)
    td, fd = torch.distributions.Normal(tl, ts), ft.distributions.Normal(fl, fs)
    # Both formulas hold a log(scale). fpemu's is the float64 logarithm rounded
    # once to float32 (for the oracle, libm's, one element at a time); torch
    # CPU's is Sleef's SIMD logf, within an ulp and not always the rounded one
    # (7 of these 64 scales here, a count that follows the CPU's vector path).
    # So each library is held bit for bit to the same float32 formula fed its
    # own log, and the two logs to an ulp of each other.
    exact_log = np.array([math.log(float(s)) for s in sc]).astype(np.float32)
    torch_log = torch.from_numpy(sc).log().numpy()
    _same(torch.from_numpy(exact_log), torch.from_numpy(torch_log), ulps=1)
    xt, xf = torch.from_numpy(x), ft.tensor(x)
    for dist, value, log_scale in ((td, xt, torch_log), (fd, xf, exact_log)):
        log_prob, entropy = _normal_oracle(x, loc, sc, log_scale)
        _same(dist.log_prob(value), torch.from_numpy(log_prob))
        _same(dist.entropy(), torch.from_numpy(entropy))
    td.log_prob(xt).sum().backward()
    fd.log_prob(xf).sum().backward()
    _same(tl.grad, fl.grad)
    _same(ts.grad, fs.grad)
    r = fd.rsample((2,))
    assert tuple(r.shape) == (2, 64) and r.requires_grad
    assert not fd.sample((2,)).requires_grad
    _same(td.variance, fd.variance)
    lo, hi = [0.0, -1.0], [2.0, 3.0]
    tu = torch.distributions.Uniform(torch.tensor(lo), torch.tensor(hi))
    fu = ft.distributions.Uniform(ft.tensor(lo), ft.tensor(hi))
    _same(tu.log_prob(torch.tensor([1.0, 2.5])), fu.log_prob(ft.tensor([1.0, 2.5])))
    _same(tu.entropy(), fu.entropy())
    u = fu.sample((1000,)).numpy()
    assert u.shape == (1000, 2) and (u >= np.array(lo)).all() and (u < np.array(hi)).all()


@pytest.mark.parametrize("kw", ["probs", "logits"])
def test_bernoulli(kw):
    rng = np.random.default_rng(2)
    arr = rng.random(6).astype(np.float32) if kw == "probs" else \
        rng.standard_normal(6).astype(np.float32)
    x = (rng.random(6) > 0.5).astype(np.float32)
    td = torch.distributions.Bernoulli(**{kw: torch.from_numpy(arr)})
    fd = ft.distributions.Bernoulli(**{kw: ft.tensor(arr)})
    # binary_cross_entropy_with_logits: torch CPU's kernel (its SIMD exp / log1p,
    # which differ between CPUs) against fpemu's CUDA formula: a few ulps apart
    _same(td.log_prob(torch.from_numpy(x)), fd.log_prob(ft.tensor(x)), ulps=8)
    _same(td.entropy(), fd.entropy(), ulps=8)
    s = fd.sample((5,)).numpy()
    assert s.shape == (5, 6) and set(np.unique(s)) <= {0.0, 1.0}


@pytest.mark.parametrize("lib", [torch, ft], ids=["torch", "fpemu"])
def test_validation_errors_are_torchs(lib, monkeypatch):
    D = lib.distributions
    # torch's default (validation on, ``__debug__``); the first torch.compile
    # in a process turns it off for good (torch._dynamo's TorchPatcher calls
    # Distribution.set_default_validate_args(False)), and a compile test may
    # have run earlier in this worker
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", True)
    with pytest.raises(ValueError, match=r"Expected parameter scale \(Tensor of shape \(1,\)\) "
                                         "of distribution Normal.* GreaterThan"):
        D.Normal(lib.tensor([0.0]), lib.tensor([-1.0]))
    with pytest.raises(ValueError, match="Either `probs` or `logits` must be specified"):
        D.Categorical()
    with pytest.raises(ValueError, match=r"to be within the support \(IntegerInterval"):
        D.Categorical(probs=lib.tensor([0.5, 0.5])).log_prob(lib.tensor(3))
    with pytest.raises(ValueError, match=r"within the support \(Boolean\(\)\)"):
        D.Bernoulli(probs=lib.tensor([0.5])).log_prob(lib.tensor([0.5]))
    D.Normal(lib.tensor([0.0]), lib.tensor([-1.0]), validate_args=False)   # not checked


def test_reinforce_as_pytorch_examples_writes_it():
    """The policy-gradient step of pytorch/examples' reinforce.py: sample an
    action, keep its log-probability, and step on -log_prob * return."""
    ft.manual_seed(0)
    policy = ft.nn.Sequential(ft.nn.Linear(4, 16), ft.nn.ReLU(), ft.nn.Linear(16, 2))
    opt = ft.optim.Adam(policy.parameters(), lr=1e-2)
    log_probs = []
    for _ in range(5):
        probs = ft.nn.functional.softmax(policy(ft.randn(1, 4)), dim=1)
        m = ft.distributions.Categorical(probs)
        action = m.sample()
        log_probs.append(m.log_prob(action))
    loss = ft.cat([-lp * 1.0 for lp in log_probs]).sum()
    opt.zero_grad()
    loss.backward()
    assert all(p.grad is not None and np.isfinite(p.grad.numpy()).all()
               for p in policy.parameters())
    opt.step()
