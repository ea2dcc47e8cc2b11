"""fpemu.autograd against real torch (CPU) on the semantics a program relies
on: storage and views, in-place writes through aliases, version counters,
tied weights in state_dict, Module attribute rules, Python conversions,
backward twice, and the random generator. Each case runs the same code on
both and compares what it observes."""

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): these tests compare with it


def both(fn):
    """fn(lib) on torch and on fpemu; the results as numpy / Python values."""
    def plain(v):
        if isinstance(v, (list, tuple)):
            return type(v)(plain(x) for x in v)
        if isinstance(v, torch.Tensor):
            return v.detach().double().numpy()
        if isinstance(v, ft.Tensor):
            return v.detach().double().numpy()
        return v
    return plain(fn(torch)), plain(fn(ft))


def same(fn):
    a, b = both(fn)
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ---------------------------------------------------------- in-place through aliases
def _data_add(lib):
    p = lib.ones(3, requires_grad=True)
    p.data.add_(lib.tensor([1.0, 2.0, 3.0]))
    return p


def _view_mul(lib):
    x = lib.arange(4.0)
    x.view(2, 2).mul_(10)
    return x


def _detach_add(lib):
    x = lib.arange(3.0)
    x.detach().add_(1)
    return x


def _state_dict_copy(lib):
    m = lib.nn.Linear(2, 2)
    with lib.no_grad():
        m.state_dict()["weight"].copy_(lib.full((2, 2), 0.5))
    return m.weight


def _isub_no_grad(lib):
    p = lib.ones(3, requires_grad=True)
    (p * p).sum().backward()
    with lib.no_grad():
        p -= 0.1 * p.grad
    return p


def _transpose_slice(lib):
    x = lib.arange(6.0).reshape(2, 3)
    y = x.t()
    y[1:, 0] = -1.0
    x[0, 0] += 5
    return x, y


def _setitem_mask(lib):
    x = lib.arange(6.0)
    x[x > 2] = -float("inf")
    x[lib.tensor([0, 1])] = lib.tensor([7.0, 8.0])
    return x


@pytest.mark.parametrize("fn", [_data_add, _view_mul, _detach_add, _state_dict_copy,
                                _isub_no_grad, _transpose_slice, _setitem_mask])
def test_in_place_updates_reach_every_alias(fn):
    same(fn)


def test_regression_that_updates_p_data_trains():
    def run(lib):
        x = lib.arange(8.0).reshape(8, 1) / 8
        y = 3 * x + 1
        w = lib.zeros(1, 1, requires_grad=True)
        b = lib.zeros(1, requires_grad=True)
        for _ in range(50):
            loss = ((x @ w + b - y) ** 2).mean()
            w.grad = None
            b.grad = None
            loss.backward()
            w.data.add_(w.grad, alpha=-0.5)
            b.data -= 0.5 * b.grad
        return loss
    a, b = both(run)
    assert a < 0.1
    # a trained loss, not one kernel: torch CPU's matmul and mean sum in their
    # SIMD order (docs/pytorch-numerics.md §7), so agreement, not equal bits
    np.testing.assert_allclose(b, a, rtol=1e-5)


# --------------------------------------------------------------- version counters
def test_in_place_change_to_a_saved_tensor_raises_as_torch():
    for lib in (torch, ft):
        x = lib.ones(3, requires_grad=True)
        y = x.exp()
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        z = x * 2                      # mul by a number saves nothing of x
        w = z.clone()
        z.add_(1)
        (w.sum() + z.sum()).backward()
        np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0, 4.0])


def test_versions_count_in_place_writes_and_views_share_them():
    def run(lib):
        x = lib.zeros(4)
        v = x.view(2, 2)
        d = x.detach()
        x.add_(1)
        v.mul_(2)
        d[0] = 3
        return [x._version, v._version, d._version, x.data._version]
    a, b = both(run)
    assert a[:3] == b[:3]


def test_in_place_on_a_leaf_raises_and_relu_inplace_is_recorded():
    for lib in (torch, ft):
        w = lib.ones(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            w.add_(1)
        with pytest.raises(RuntimeError, match="view of a leaf Variable"):
            w[:1].mul_(2)
        h = lib.tensor([1.0, -2.0], requires_grad=True) * 2
        lib.nn.functional.relu(h, inplace=True)         # relu saves its output ...
        h += 1                                          # ... which this changes
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()
    same(_relu_inplace)


def _relu_inplace(lib):
    w = lib.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    h = w * 2
    lib.nn.functional.relu(h, inplace=True)
    (h * h).sum().backward()
    return h, w.grad


def _view_writes(case):
    """In-place ops on views of graph tensors (torch's CopySlices), then a
    weighted sum's backward: values and gradients."""
    def run(lib):
        a = lib.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) / 7, requires_grad=True)
        b = lib.tensor([-1.0, 0.25, 0.5], requires_grad=True)
        if case == "column":
            out = a * 2
            out[:, 0].mul_(3)
        elif case == "buffer":                      # a buffer becomes part of the graph
            out = lib.zeros(6, 3)
            out[1:5].copy_(a)
            out[0].add_(b)
        elif case == "transposed":
            out = a.sin()
            v = out.t()
            v[0].add_(b.sum())
            v[1].mul_(b[1])
        elif case == "noncontiguous":               # a base laid out column-major
            out = a.t() * 1.5
            out[1].mul_(3)
            out[:, 0].add_(b[:3].sum())
        elif case == "filled":                      # zero_ / fill_ cut the history
            out = a * 2
            out[2:].fill_(0.5)
            out[0].zero_()
            out = out + b
        elif case == "strided":
            out = a * 1
            out.view(-1)[::2].zero_()
            out[out > 0.5] = 0
            out[1:][:, 1:] = b[1:] * 2
        w = lib.tensor(np.random.default_rng(len(case)).standard_normal(
            tuple(out.shape)).astype(np.float32))
        (out * w).sum().backward()
        return out, a.grad, b.grad if case != "column" else b.grad is None
    return run


@pytest.mark.parametrize("case", ["column", "buffer", "transposed", "noncontiguous", "filled",
                                  "strided"])
def test_in_place_on_views_of_graph_tensors_rebases_as_torch(case):
    """Within a few float32 ulps: torch's vectorised sin / cos and its
    reduction order for the gradient of a broadcast scalar."""
    got_torch, got_fpemu = both(_view_writes(case))
    for x, y in zip(got_torch, got_fpemu):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-6, atol=1e-7)
    y = ft.ones(3, requires_grad=True) * 2
    y[1:].mul_(2)
    assert y.grad_fn.name() == "CopySlicesBackward0"


def test_in_place_on_a_view_of_a_saved_tensor_raises_as_torch():
    for lib in (torch, ft):
        x = lib.ones(2, 3, requires_grad=True)
        y = x.exp()                                     # exp saves its output
        y[0].zero_()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


# ---------------------------------------------------------------- backward twice
def test_backward_twice_raises_without_retain_graph():
    for lib in (torch, ft):
        x = lib.tensor([1.0, 2.0], requires_grad=True)
        y = (x * x).sum()
        y.backward(retain_graph=True)
        y.backward()
        np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()


def test_autograd_grad_returns_without_accumulating():
    def run(lib):
        x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        (g,) = lib.autograd.grad((x ** 3).sum(), x)
        return g, x.grad is None
    a, b = both(run)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] and b[1]


# ------------------------------------------------------------------ modules
def test_tied_weights_keep_both_keys_and_share_storage():
    def run(lib):
        torch_nn = lib.nn

        class Tied(torch_nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch_nn.Embedding(5, 3)
                self.head = torch_nn.Linear(3, 5, bias=False)
                self.emb.weight = self.head.weight
                self.register_buffer("mask", lib.ones(2))
                self.register_buffer("tmp", lib.zeros(1), persistent=False)
        m = Tied()
        sd = m.state_dict()
        with lib.no_grad():
            sd["emb.weight"].fill_(0.25)
        return (list(sd), [n for n, _ in m.named_parameters()],
                [n for n, _ in m.named_buffers()], m.head.weight.detach()[0, 0].item())
    a, b = both(run)
    assert a == b


def test_load_state_dict_reports_missing_and_unexpected_keys_as_torch():
    msgs = []
    for lib in (torch, ft):
        m = lib.nn.Sequential(lib.nn.Linear(2, 2), lib.nn.ReLU(), lib.nn.Linear(2, 1))
        sd = m.state_dict()
        sd.pop("2.bias")
        sd["extra"] = lib.zeros(1)
        with pytest.raises(RuntimeError) as err:
            m.load_state_dict(sd)
        msgs.append(str(err.value))
        res = m.load_state_dict(sd, strict=False)
        assert list(res.missing_keys) == ["2.bias"] and list(res.unexpected_keys) == ["extra"]
    assert msgs[0] == msgs[1]


def test_module_setattr_follows_torch_rules():
    for lib in (torch, ft):
        lin = lib.nn.Linear(2, 2)
        with pytest.raises(TypeError, match="cannot assign .* as parameter 'weight'"):
            lin.weight = lib.ones(2, 2)
        lin.weight = lib.nn.Parameter(lib.ones(2, 2))
        assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
        assert next(lin.parameters()).detach().sum().item() == 4.0
        lin.bias = None
        assert [n for n, _ in lin.named_parameters()] == ["weight"]
        seq = lib.nn.Sequential(lib.nn.ReLU())
        with pytest.raises(TypeError, match="cannot assign .* as child module '0'"):
            setattr(seq, "0", 3)


def test_linear_init_draws_torch_numbers_from_the_same_seed():
    torch.manual_seed(123)
    ft.manual_seed(123)
    a, b = torch.nn.Linear(7, 5), ft.nn.Linear(7, 5)
    np.testing.assert_array_equal(a.weight.detach().numpy(), b.weight.numpy(force=True))
    np.testing.assert_array_equal(a.bias.detach().numpy(), b.bias.numpy(force=True))


# --------------------------------------------------------------- conversions
def test_python_conversions_and_comparisons():
    def run(lib):
        t = lib.tensor([False])
        best = 1e9
        loss = lib.tensor(2.5)
        out = [bool(t), bool(lib.tensor(3)), float(loss), int(lib.tensor(7)),
               f"{loss:.3f}", [10, 20, 30][lib.tensor(1)], (2 ** lib.tensor([1.0, 3.0])).tolist()]
        if loss < best:
            out.append("better")
        x = lib.ones(2)
        x *= 3
        x /= 2
        x += 1
        out.append(x.tolist())
        return out
    a, b = both(run)
    assert a == b
    for lib in (torch, ft):
        with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
            bool(lib.ones(2))


# --------------------------------------------------------------- random numbers
def test_generator_matches_torch_cpu():
    for seed in (0, 1337, 2 ** 40 + 5):
        torch.manual_seed(seed)
        ft.manual_seed(seed)
        pairs = [
            (torch.randint(2, (10,)), ft.randint(2, (10,))),
            (torch.randint(3, 9, (4, 5)), ft.randint(3, 9, (4, 5))),
            (torch.randint(10 ** 12, (6,)), ft.randint(10 ** 12, (6,))),
            (torch.rand(33), ft.rand(33)),
            (torch.rand(5, dtype=torch.float64), ft.rand(5, dtype=ft.float64)),
            (torch.randperm(50), ft.randperm(50)),
            (torch.randn(5), ft.randn(5)),
            (torch.randn(7, dtype=torch.float64), ft.randn(7, dtype=ft.float64)),
            (torch.empty(100).uniform_(-0.3, 0.7), ft.empty(100).uniform_(-0.3, 0.7)),
            (torch.empty(40, dtype=torch.float16).uniform_(-1, 1),
             ft.empty(40, dtype=ft.float16).uniform_(-1, 1)),
        ]
        for a, b in pairs:
            assert a.dtype.is_floating_point == b.is_floating_point()
            np.testing.assert_array_equal(a.double().numpy(), b.double().numpy())
        # blocks of 16 float32 normals: same draws; torch's float32 log / sin / cos
        # (its vector library) move the last bits, up to 5e-7 measured; the stream
        # stays aligned
        a, b = torch.randn(4000), ft.randn(4000)
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6)
        assert np.mean(b.numpy() == a.numpy()) > 0.6
        assert torch.randint(1000, (3,)).tolist() == ft.randint(1000, (3,)).tolist()
        # float64 blocks of 16 (normal_fill<double>): 53-bit uniforms, Box-Muller
        # in double; glibc's log / cos against numpy's: within 2 ulps (codes)
        for n in (16, 37, 4000):
            a = torch.randn(n, dtype=torch.float64).numpy()
            b = ft.randn(n, dtype=ft.float64).numpy()
            ulps = np.abs(a.view(np.int64) - b.view(np.int64))
            assert ulps.max() <= 2 and np.mean(ulps == 0) > 0.99, (n, ulps.max())
            assert torch.randint(1000, (3,)).tolist() == ft.randint(1000, (3,)).tolist()
    assert len(ft.randint(2, (10,))) == 10 and set(ft.randint(2, (100,)).tolist()) == {0, 1}
