"""fpemu.autograd ops: backward against central differences (float64),
forward roundings against independent references (ml_dtypes, numpy, torch)."""

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fpemu.autograd as ft
from fpemu.autograd import nn

F = nn.functional
SETTINGS = settings(max_examples=25, deadline=None)


def _numeric_grad(fn, arrays, i, h=1e-6):
    base = [a.copy() for a in arrays]
    g = np.zeros_like(base[i])
    for idx in np.ndindex(base[i].shape):
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[i][idx] += h
        minus[i][idx] -= h
        g[idx] = (fn(*plus) - fn(*minus)) / (2 * h)
    return g


def check_grad(op, *arrays, rtol=1e-5, atol=1e-7, seed=None):
    """d(sum(op(x) * w))/dx by backward() against central differences."""
    rng = np.random.default_rng(1)
    out_shape = None

    def value(*arrs):
        if seed is not None:
            ft.manual_seed(seed)
        ts = [ft.tensor(a, dtype=ft.float64) for a in arrs]
        out = op(*ts)
        return float((out.numpy() * w).sum())

    ft.manual_seed(seed or 0)
    probe = op(*[ft.tensor(a, dtype=ft.float64) for a in arrays])
    out_shape = probe.shape
    w = rng.standard_normal(out_shape)
    if seed is not None:
        ft.manual_seed(seed)
    ts = [ft.tensor(a, dtype=ft.float64, requires_grad=True) for a in arrays]
    out = op(*ts)
    assert out.dtype is ft.float64
    (out * ft.tensor(w, dtype=ft.float64)).sum().backward()
    for i, t in enumerate(ts):
        expected = _numeric_grad(value, arrays, i)
        np.testing.assert_allclose(t.grad.numpy(), expected, rtol=rtol, atol=atol)


shapes = st.tuples(st.integers(1, 4), st.integers(1, 5))


def arr(shape, lo=-3.0, hi=3.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape)


@SETTINGS
@given(shapes, st.integers(0, 1000))
def test_binary_ops_backward(shape, seed):
    a, b = arr(shape, seed=seed), arr(shape, 0.5, 3.0, seed + 1)
    check_grad(lambda x, y: x + y, a, b)
    check_grad(lambda x, y: x - y, a, b)
    check_grad(lambda x, y: x * y, a, b)
    check_grad(lambda x, y: x / y, a, b)
    check_grad(lambda x, y: ft.add(x, y, alpha=0.3), a, b)
    check_grad(lambda x, y: x * y[:1], a, b)                  # broadcasting
    check_grad(lambda y: 2.0 / y, b)
    check_grad(lambda x: 3.0 - x * 0.5, a)
    check_grad(lambda y: y ** 2.5, b)
    check_grad(lambda y: y ** -0.5, b)
    check_grad(lambda y, x: y ** (x * 0.1), b, a)


@SETTINGS
@given(shapes, st.integers(0, 1000))
def test_unary_ops_backward(shape, seed):
    a, pos = arr(shape, seed=seed), arr(shape, 0.2, 4.0, seed + 1)
    a = np.where(np.abs(a) < 1e-3, 0.5, a)                    # relu's kink
    for op in (ft.exp, ft.tanh, ft.sigmoid, ft.relu, ft.gelu,
               lambda x: ft.gelu(x, approximate="tanh"), ft.neg):
        check_grad(op, a)
    for op in (ft.log, ft.sqrt, ft.reciprocal):
        check_grad(op, pos)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gelu_of_every_16_bit_value(dtype):
    """bf16 and fp16 GELU look their values and gradient factors up in tables
    of all 2**16 codes (autograd/_special.py). Every finite value, through the
    autograd op, must give the float64 formula of docs/pytorch-numerics.md
    (libm's erf and exp, here from Python's math module), rounded to float32
    and then to the dtype; infinities and NaN take the element loops."""
    import math
    codes = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        vals = ((codes << np.uint32(16)).view(np.float32) if dtype == "bfloat16"
                else codes.astype(np.uint16).view(np.float16).astype(np.float32))
    vals = vals[np.isfinite(vals)]
    rng = np.random.default_rng(3)
    g = ft.tensor(rng.standard_normal(vals.size), dtype=getattr(ft, dtype))
    x = ft.tensor(vals, dtype=getattr(ft, dtype), requires_grad=True)
    y = ft.gelu(x)
    y.backward(g)
    r1, inv = 0.7071067811865476, 0.3989422804014327
    want_y = np.array([0.5 * v * (1.0 + math.erf(v * r1)) for v in vals.astype(float)])
    gv = g.float().numpy().astype(float)
    want_g = np.array([gi * (0.5 * (1.0 + math.erf(v * r1)) + v * math.exp(-0.5 * v * v) * inv)
                       for gi, v in zip(gv, vals.astype(float))])
    rounded = [ft.tensor(w.astype(np.float32), dtype=getattr(ft, dtype)).float().numpy()
               for w in (want_y, want_g)]
    np.testing.assert_array_equal(y.detach().float().numpy().view(np.uint32),
                                  rounded[0].view(np.uint32))
    np.testing.assert_array_equal(x.grad.float().numpy().view(np.uint32),
                                  rounded[1].view(np.uint32))
    special = ft.tensor([np.inf, -np.inf, np.nan, 1.0], dtype=getattr(ft, dtype))
    out = ft.gelu(special).float().numpy()
    # storage that is not the dtype's (never met through a tensor of it) and
    # infinities leave the tables for the element loops
    from fpemu.autograd import _special
    name = x.dtype.name
    for odd in ([1.0, 1.0 + 2.0 ** -20], [1.0, np.inf], [2.0 ** -140, 1.0], [np.nan]):
        assert _special.codes16(np.array(odd, np.float32), name) is None, odd
    codes = _special.codes16(np.array([[1.0, -0.0], [-2.0, 0.5]], np.float32), name)
    want = {"bf16": [0x3F80, 0x8000, 0xC000, 0x3F00], "fp16": [0x3C00, 0x8000, 0xC000, 0x3800]}
    assert codes.tolist() == want[name]
    assert out[0] == np.inf and np.isnan(out[1]) and np.isnan(out[2])
    assert abs(out[3] - 0.8413) < 0.01


@SETTINGS
@given(st.tuples(st.integers(1, 4), st.integers(2, 6)), st.integers(0, 1000))
def test_reductions_softmax_norms_backward(shape, seed):
    a = arr(shape, seed=seed)
    w, b = arr(shape[-1:], seed=seed + 1), arr(shape[-1:], seed=seed + 2)
    check_grad(lambda x: x.sum(), a)
    check_grad(lambda x: x.sum(dim=0), a)
    check_grad(lambda x: x.mean(dim=1, keepdim=True), a)
    check_grad(lambda x: ft.softmax(x, dim=-1), a)
    check_grad(lambda x: ft.log_softmax(x, dim=0), a)
    check_grad(lambda x, w, b: F.layer_norm(x, (shape[-1],), w, b), a, w, b, rtol=1e-4)
    check_grad(lambda x, w: F.rms_norm(x, (shape[-1],), w, eps=1e-6), a, w, rtol=1e-4)
    check_grad(lambda x: x.amax(dim=1), a)


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.integers(0, 1000))
def test_matmul_linear_shapes_backward(m, k, n, seed):
    a, b, c = arr((m, k), seed=seed), arr((k, n), seed=seed + 1), arr((n,), seed=seed + 2)
    check_grad(lambda x, y: x @ y, a, b)
    check_grad(lambda x, y, z: F.linear(x, y.T, z), a, b, c)
    check_grad(lambda x, y: ft.matmul(x[None].reshape(1, m, k), y), a, b)
    check_grad(lambda x: x.reshape(k, m).transpose(0, 1), a)
    check_grad(lambda x: x.T, a)
    check_grad(lambda x, y: ft.cat([x, y.T], dim=1), a, arr((n, m), seed=seed + 3))
    check_grad(lambda x: ft.stack([x, x * 2.0], dim=0), a)
    check_grad(lambda x: x[:, ::-1][0], a)
    check_grad(lambda x: x.masked_fill(ft.tensor(a > 0), 0.0), a)
    check_grad(lambda x: x.unsqueeze(0).squeeze(0).flatten(), a)


@SETTINGS
@given(st.integers(1, 5), st.integers(2, 5), st.integers(0, 1000))
def test_losses_backward(n, c, seed):
    logits = arr((n, c), seed=seed)
    target = ft.tensor(np.random.default_rng(seed).integers(0, c, n))
    check_grad(lambda x: F.cross_entropy(x, target), logits)
    check_grad(lambda x: F.cross_entropy(x, target, reduction="sum"), logits)
    check_grad(lambda x: F.cross_entropy(x, target, label_smoothing=0.1), logits)
    check_grad(lambda x: F.nll_loss(ft.log_softmax(x, dim=1), target, reduction="none"),
               logits)
    other = arr((n, c), seed=seed + 1)
    check_grad(lambda x, y: F.mse_loss(x, y), logits, other)
    check_grad(lambda x, y: F.mse_loss(x, y, reduction="none"), logits, other)


def test_attention_embedding_dropout_backward():
    q, k, v = arr((2, 3, 4), seed=1), arr((2, 3, 4), seed=2), arr((2, 3, 4), seed=3)
    check_grad(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
               q, k, v, rtol=1e-4)
    idx = ft.tensor([[0, 2, 2], [1, 0, 3]])
    check_grad(lambda w: F.embedding(idx, w), arr((4, 3), seed=4))
    check_grad(lambda x: F.dropout(x, 0.4), arr((3, 5), seed=5), seed=7)


def test_ignore_index_and_errors():
    logits = ft.tensor([[1.0, 2.0], [0.5, 0.1]], requires_grad=True)
    loss = F.cross_entropy(logits, ft.tensor([1, -100]))
    expected = -np.log(np.exp(2.0) / (np.exp(1.0) + np.exp(2.0)))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert np.all(logits.grad.numpy()[1] == 0)
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but "
                       "got Float"):                         # torch's wording
        F.cross_entropy(logits, ft.tensor([1.0, 0.0]))
    with pytest.raises(IndexError, match="Target 2 is out of bounds"):
        F.cross_entropy(logits, ft.tensor([2, 0]))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        ft.ones(2, 3) @ ft.ones(2, 3)
    with pytest.raises(RuntimeError, match="does not require grad"):
        ft.ones(2).sum().backward()
    with pytest.raises(TypeError, match="float8"):
        ft.ones(2, dtype=ft.float8_e4m3fn) + ft.ones(2, dtype=ft.bfloat16)
    with pytest.raises(TypeError, match="fp8_autocast"):
        ft.ones(2, 2, dtype=ft.float8_e4m3fn) @ ft.ones(2, 2, dtype=ft.float8_e4m3fn)


# ----------------------------------------------------------- forward roundings
def _bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def test_elementwise_bf16_is_fp32_op_then_one_rounding():
    rng = np.random.default_rng(3)
    a = _bf16(rng.standard_normal(4000) * 10)
    b = _bf16(rng.standard_normal(4000) * 10)
    ta, tb = ft.tensor(a, dtype=ft.bfloat16), ft.tensor(b, dtype=ft.bfloat16)
    for got, ref in ((ta + tb, a + b), (ta * tb, a * b), (ta / tb, a / b),
                     (ta - tb, a - b), (ft.sqrt(ft.tensor(np.abs(a), dtype=ft.bfloat16)),
                                        np.sqrt(np.abs(a)))):
        assert got.dtype is ft.bfloat16
        np.testing.assert_array_equal(got.numpy().view(np.uint32), _bf16(ref).view(np.uint32))
    # a Python number is converted once to float32, then the fp32 result rounded once
    np.testing.assert_array_equal((ta + 0.1).numpy(), _bf16(a + np.float32(0.1)))
    # tensor / number multiplies by the reciprocal taken in double, rounded to
    # float32 (torch 2.11 on an H200): for sqrt(0.001) that is 31.622776, where
    # the float32 reciprocal of float32(sqrt(0.001)) would be 31.622778
    np.testing.assert_array_equal((ta / 3.0).numpy(), _bf16(a * np.float32(1 / 3.0)))
    s = 0.001 ** 0.5
    t32 = ft.tensor(a, dtype=ft.float32)
    want = (a * np.float32(1 / s)).astype(np.float32)
    assert np.float32(1 / s) != np.float32(1) / np.float32(s)
    np.testing.assert_array_equal((t32 / s).numpy().view(np.uint32), want.view(np.uint32))


def test_add_alpha_is_an_exact_fma():
    a = ft.tensor([1.0], dtype=ft.float32)
    b = ft.tensor([1 + 2.0**-23], dtype=ft.float32)
    # exact: 1 + (1 + 2**-23) * (1 + 2**-23) = 2 + 2**-22 + 2**-46 -> rounds up to 2 + 2**-22 + ...
    out = ft.add(a, b, alpha=1 + 2.0**-23).item()
    from fractions import Fraction
    exact = 1 + Fraction(1 + 2.0**-23) ** 2
    assert abs(Fraction(out) - exact) <= Fraction(2.0**-22) / 2
    assert out == 2 + 2.0**-22                       # a separate multiply would give the same;
    c = ft.tensor([-(1 + 2.0**-22)], dtype=ft.float32)   # here it does not:
    assert ft.add(c, b, alpha=1 + 2.0**-23).item() == 2.0**-46


def test_casts_match_torch_cpu():
    torch = pytest.importorskip("torch")
    vals = np.array([500, 464, 465, 480, 248, 247, 61439, 61440, 65519, 65520, np.inf, -np.inf,
                     -1e-8, 1.5 * 2.0**-9, 0.0, -0.0, 3e-39, 1 / 3, -7.25e-5], np.float32)
    pairs = [(ft.bfloat16, torch.bfloat16), (ft.float16, torch.float16),
             (ft.float8_e4m3fn, torch.float8_e4m3fn), (ft.float8_e5m2, torch.float8_e5m2),
             (ft.float8_e4m3fnuz, torch.float8_e4m3fnuz),
             (ft.float8_e5m2fnuz, torch.float8_e5m2fnuz)]
    for ours, theirs in pairs:
        got = ft.tensor(vals).to(ours).numpy()
        ref = torch.tensor(vals).to(theirs).float().numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(ref)
        np.testing.assert_array_equal(got[ok].view(np.uint32), ref[ok].view(np.uint32),
                                      err_msg=str(ours))
    # Python doubles reach 16-bit types through float32 (two roundings), as in torch
    for v, ours, theirs in ((1 + 2**-8 + 2**-30, ft.bfloat16, torch.bfloat16),
                            (1 + 2**-11 + 2**-30, ft.float16, torch.float16),
                            (1 + 2**-4 + 2**-30, ft.float8_e4m3fn, torch.float8_e4m3fn)):
        assert ft.tensor(v, dtype=ours).item() == torch.tensor(v, dtype=theirs).item() == 1.0


def test_type_promotion_matches_torch():
    torch = pytest.importorskip("torch")
    kinds = {"f32": (ft.float32, torch.float32), "f16": (ft.float16, torch.float16),
             "bf16": (ft.bfloat16, torch.bfloat16), "f64": (ft.float64, torch.float64),
             "i64": (ft.int64, torch.int64)}
    for (na, (fa, ta)) in kinds.items():
        for (nb, (fb, tb)) in kinds.items():
            for dims in ((2, 2), (0, 2), (2, 0), (0, 0)):
                x = ft.zeros((2,) * dims[0], dtype=fa)
                y = ft.zeros((2,) * dims[1], dtype=fb)
                tx = torch.zeros((2,) * dims[0], dtype=ta)
                ty = torch.zeros((2,) * dims[1], dtype=tb)
                assert str((x + y).dtype) == str(kinds_name(torch.result_type(tx, ty), kinds)), \
                    (na, nb, dims)
            for scalar in (1, 2.5):
                got = ft.result_type(ft.zeros(2, dtype=fa), scalar)
                ref = torch.result_type(torch.zeros(2, dtype=ta), scalar)
                assert str(got) == str(kinds_name(ref, kinds))


def kinds_name(tdtype, kinds):
    for ours, theirs in kinds.values():
        if theirs == tdtype:
            return ours
    raise AssertionError(tdtype)


def test_gradients_of_low_precision_tensors_are_low_precision():
    w = ft.randn(4, 3, requires_grad=True)
    x = ft.randn(5, 3).bfloat16()
    y = F.linear(x, w.bfloat16())
    assert y.dtype is ft.bfloat16
    y.float().sum().backward()
    assert w.grad.dtype is ft.float32
    # the weight's gradient went through bf16 (the cast's backward casts back)
    np.testing.assert_array_equal(w.grad.numpy(), _bf16(w.grad.numpy()))


def test_tensor_api_basics():
    t = ft.arange(6, dtype=ft.float32).reshape(2, 3)
    assert t.shape == (2, 3) and t.dtype is ft.float32 and t[1, 2].item() == 5.0
    assert ft.tensor([1, 2]).dtype is ft.int64
    assert t.half().dtype is ft.float16 and t.to(ft.bfloat16).dtype is ft.bfloat16
    assert t.to("cuda") is t and t.float() is t
    assert ((t > 2).numpy() == (t.numpy() > 2)).all()
    with ft.no_grad():
        u = ft.ones(2, requires_grad=True) * 2
    assert not u.requires_grad
    with pytest.raises(RuntimeError, match="detach"):
        ft.ones(2, requires_grad=True).numpy()
    x = ft.ones(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.sum().backward()
    assert y.grad.numpy().tolist() == [1.0, 1.0, 1.0]
    assert x.grad.numpy().tolist() == [2.0, 2.0, 2.0]
    z = (x * 3).sum()
    z.backward()
    assert x.grad.numpy().tolist() == [5.0, 5.0, 5.0]       # accumulates


# ------------------------------------------------ torch's errors and semantics
def _outcome(fn):
    try:
        out = fn()
    except Exception as err:  # noqa: BLE001 - the type and text are what is compared
        return type(err).__name__, str(err)
    return "ok", tuple(out.shape) if hasattr(out, "shape") else out


_DIM_CASES = {
    "sum(2)": lambda T: T.ones(2, 3).sum(2),
    "sum(-3)": lambda T: T.ones(2, 3).sum(-3),
    "sum((0, 0))": lambda T: T.ones(2, 3).sum((0, 0)),
    "mean(7)": lambda T: T.ones(2, 3).mean(dim=7),
    "amax((0, 2))": lambda T: T.ones(2, 3).amax(dim=(0, 2)),
    "softmax(2)": lambda T: T.softmax(T.ones(2, 3), dim=2),
    "log_softmax(-3)": lambda T: T.log_softmax(T.ones(2, 3), dim=-3),
    "flatten(0, 5)": lambda T: T.ones(2, 3).flatten(0, 5),
    "flatten(1, 0)": lambda T: T.ones(2, 3, 4).flatten(1, 0),
    "0-d softmax(0)": lambda T: T.softmax(T.tensor(2.0), dim=0),
    "0-d sum(0)": lambda T: T.tensor(2.0).sum(0),
    "0-d sum(-1)": lambda T: T.tensor(2.0).sum(-1),
    "0-d sum(1)": lambda T: T.tensor(2.0).sum(1),
    "0-d flatten": lambda T: T.tensor(2.0).flatten(),
    "0-d log_softmax(0)": lambda T: T.log_softmax(T.tensor(2.0), dim=0),
}


@pytest.mark.parametrize("case", list(_DIM_CASES))
def test_dims_out_of_range_raise_as_torch(case):
    got = _outcome(lambda: _DIM_CASES[case](ft))
    expected = {
        "sum(2)": ("IndexError", "Dimension out of range (expected to be in range of "
                                 "[-2, 1], but got 2)"),
        "sum((0, 0))": ("RuntimeError", "dim 0 appears multiple times in the list of dims"),
        "0-d softmax(0)": ("ok", ()), "0-d sum(0)": ("ok", ()), "0-d flatten": ("ok", (1,)),
        "0-d sum(1)": ("IndexError", "Dimension out of range (expected to be in range of "
                                     "[-1, 0], but got 1)"),
    }
    if case in expected:
        assert got == expected[case]
    try:
        import torch
    except ImportError:
        assert got[0] in ("IndexError", "RuntimeError", "ok")
        return
    assert got == _outcome(lambda: _DIM_CASES[case](torch)), case


def test_0d_softmax_values():
    assert ft.softmax(ft.tensor(2.0), dim=0).item() == 1.0
    assert ft.log_softmax(ft.tensor(2.0), dim=0).item() == 0.0
    x = ft.tensor(3.0, requires_grad=True)
    x.sum(0).backward()
    assert x.grad.item() == 1.0


_MM_CASES = {
    "bf16 @ fp32": lambda T: T.ones(2, 3, dtype=T.bfloat16) @ T.ones(3, 2),
    "fp32 @ fp16": lambda T: T.matmul(T.ones(2, 3), T.ones(3, 2, dtype=T.float16)),
    "linear bf16 x, fp32 w": lambda T: T.nn.functional.linear(T.ones(2, 3, dtype=T.bfloat16),
                                                              T.ones(2, 3)),
    "linear bf16 bias": lambda T: T.nn.functional.linear(T.ones(2, 3), T.ones(2, 3),
                                                         T.ones(2, dtype=T.bfloat16)),
    "f64 @ e4m3fn": lambda T: T.ones(2, 3, dtype=T.float64) @ T.ones(
        3, 2, dtype=T.float8_e4m3fn),
    "cross_entropy batch": lambda T: T.nn.functional.cross_entropy(T.ones(3, 4),
                                                                   T.tensor([0, 1])),
}


@pytest.mark.parametrize("case", list(_MM_CASES))
def test_mixed_dtypes_and_batch_sizes_raise_as_torch(case):
    got = _outcome(lambda: _MM_CASES[case](ft))
    assert got[0] in ("RuntimeError", "ValueError"), got
    if case == "bf16 @ fp32":
        assert got[1] == ("expected m1 and m2 to have the same dtype, but got: "
                          "c10::BFloat16 != float")
    if case == "cross_entropy batch":
        assert got == ("ValueError", "Expected input batch_size (3) to match target "
                                     "batch_size (2).")
    try:
        import torch
    except ImportError:
        return
    assert got == _outcome(lambda: _MM_CASES[case](torch)), case


def test_mixed_dtypes_under_autocast_are_cast():
    with ft.autocast("cuda", dtype=ft.bfloat16):
        assert (ft.ones(2, 3) @ ft.ones(3, 2, dtype=ft.float16)).dtype is ft.bfloat16


def test_numpy_scalars_and_dtypes_are_accepted():
    p = ft.ones(2, requires_grad=True)
    opt = ft.optim.SGD([p], lr=np.float32(0.5))
    p.grad = ft.ones(2)
    opt.step()
    assert p.detach().numpy().tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="Invalid learning rate: -1"):
        ft.optim.SGD([p], lr=np.int64(-1))
    for npdt, dt in ((np.float16, ft.float16), (np.float32, ft.float32),
                     (np.dtype("float64"), ft.float64), (np.int32, ft.int32),
                     (np.bool_, ft.bool)):
        assert ft.tensor([1.0], dtype=npdt).dtype is dt, npdt


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_stored_gradients_need_no_second_rounding(dtype, monkeypatch):
    """Nodes marked ``stored`` (views, transposes, permutes, basic indexing,
    clones, linear, unary ops, attention) hand their parents gradients that
    are values of the parents' dtypes already, so the backward pass skips
    rounding them again. Rounding them anyway must change no bit of any
    leaf's gradient (it would, were a marked node to return float32 sums)."""
    from fpemu.autograd import _core
    rng = np.random.default_rng(4)
    dt = getattr(ft, dtype)
    x0 = rng.standard_normal((2, 6, 8)).astype(np.float32)
    w0 = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
    c0 = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    grads = {}
    for trust in (True, False):
        monkeypatch.setattr(_core, "_TRUST_STORED", trust)
        x = ft.tensor(x0, dtype=dt, requires_grad=True)
        w = ft.tensor(w0, dtype=dt, requires_grad=True)
        h = F.linear(x, w)                                   # addmm
        q = h.view(2, 6, 2, 4).transpose(1, 2)               # view, transpose
        k = h.reshape(2, 6, 2, 4).permute(0, 2, 1, 3).contiguous()   # permute, clone
        v = ft.movedim(h.view(2, 6, 2, 4), 2, 1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = ft.tanh(F.gelu(y[:, :, 1:, :]))                  # select, unary ops
        (y.float() * ft.tensor(c0)).sum().backward()
        grads[trust] = [t.grad.float().numpy().view(np.uint32).copy() for t in (x, w)]
        assert all(g.any() for g in grads[trust])
    for a, b in zip(grads[True], grads[False]):
        np.testing.assert_array_equal(a, b)


def test_embedding_gradient_adds_rows_in_index_order_as_ufunc_at():
    """The embedding backward's row sums (autograd/_special.py add_rows_at)
    against numpy's ``np.add.at`` (float64, index order): the same bits,
    repeated rows, cancellations, infinities and a padding row included."""
    rng = np.random.default_rng(9)
    idx = rng.integers(0, 7, (5, 40))
    w0 = rng.standard_normal((7, 6)).astype(np.float32)
    g = (rng.standard_normal((5, 40, 6)) * 10.0 ** rng.integers(-30, 30, (5, 40, 6)))
    g = g.astype(np.float32)
    g[0, 0, 0], g[1, 3, 2] = np.inf, -np.inf
    for pad in (None, 3):
        w = ft.tensor(w0, requires_grad=True)
        F.embedding(ft.tensor(idx), w, padding_idx=pad).backward(ft.tensor(g))
        want = np.zeros((7, 6))
        np.add.at(want, idx.reshape(-1), g.reshape(-1, 6).astype(np.float64))
        if pad is not None:
            want[pad] = 0.0
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(w.grad.numpy().view(np.uint32),
                                          want.astype(np.float32).view(np.uint32))
    # the order of the adds shows: (1e20 - 1e20) + 1 = 1, but 1 - 1e20 + 1e20 = 0
    w = ft.tensor(np.zeros((3, 1), np.float32), requires_grad=True)
    F.embedding(ft.tensor([[2, 2, 2]]), w).backward(ft.tensor([[[1e20], [-1e20], [1.0]]]))
    assert w.grad.numpy().reshape(-1).tolist() == [0.0, 0.0, 1.0]


def test_out_arguments_of_selections_and_reductions_write_the_result():
    """``out=`` on gather, index_select, masked_select, amax, amin and arange:
    the result written into it and returned; another dtype is torch's
    RuntimeError; another shape is resized to the result's, with torch's
    warning where it held elements (none for an empty one)."""
    x = ft.tensor([[1.0, 2.0], [3.0, 4.0]])
    idx = ft.tensor([[1, 0], [0, 0]])
    out = ft.empty(2, 2)
    assert ft.gather(x, 1, idx, out=out) is out and out.tolist() == [[2.0, 1.0], [3.0, 3.0]]
    out = ft.empty(2)
    assert ft.amax(x, 0, out=out) is out and out.tolist() == [3.0, 4.0]
    assert ft.amin(x, 1, out=out) is out and out.tolist() == [1.0, 3.0]
    assert ft.masked_select(x, x > 2.5, out=out).tolist() == [3.0, 4.0]
    assert ft.index_select(x, 0, ft.tensor([1]), out=ft.empty(1, 2)).tolist() == [[3.0, 4.0]]
    assert ft.arange(3, out=ft.empty(3, dtype=ft.int64)).tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype"):
        ft.gather(x, 1, idx, out=ft.empty(2, 2, dtype=ft.float64))
    torch = pytest.importorskip("torch")
    for lib in (torch, ft):
        out = lib.empty(3)
        with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
            r = lib.amax(lib.tensor([[1.0, 2.0], [3.0, 4.0]]), 0, out=out)
        assert r is out and out.shape == (2,) and out.tolist() == [3.0, 4.0]
        empty = lib.empty(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lib.add(lib.ones(2, 2), 1.0, out=empty)
        assert empty.shape == (2, 2) and empty.tolist() == [[2.0, 2.0], [2.0, 2.0]]
    view = ft.zeros(4)[:3]
    with pytest.raises(RuntimeError, match="pass an out of the result's shape"):
        ft.amax(x, 0, out=view)


def test_sdpa_float_mask_gets_its_gradient():
    """A float attn_mask that requires grad: torch takes the math path and the
    mask gets dS; so does fpemu (within a few float32 ulps of the scale:
    exp and the blocked sums differ)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    m = rng.standard_normal((4, 4)).astype(np.float32)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        tm, fm = torch.tensor(m, requires_grad=True), ft.tensor(m, requires_grad=True)
        torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a) for a in (q, k, v)), attn_mask=tm).sum().backward()
        ft.nn.functional.scaled_dot_product_attention(
            *(ft.tensor(a) for a in (q, k, v)), attn_mask=fm).sum().backward()
    assert fm.grad is not None
    scale = np.abs(tm.grad.numpy()).max()
    assert np.abs(fm.grad.numpy() - tm.grad.numpy()).max() <= 4 * np.spacing(np.float32(scale))


def test_draws_from_parameters_that_need_a_gradient_need_one_too():
    """torch.normal with a tensor mean or std and torch.bernoulli of a tensor of
    probabilities return results that require grad, whose backward gives the
    parameters zeros (torch's derivatives): a program's .backward() runs."""
    torch = pytest.importorskip("torch")
    calls = [lambda lib, t: lib.normal(t, 1.0), lambda lib, t: lib.normal(0.0, t + 1),
             lambda lib, t: lib.bernoulli(t)]
    for call in calls:
        got = []
        for lib in (torch, ft):
            t = lib.full((3,), 0.5, requires_grad=True)
            y = call(lib, t)
            got.append(y.requires_grad)
            y.sum().backward()
            assert t.grad is not None and t.grad.tolist() == [0.0, 0.0, 0.0]
        assert got == [True, True]


def test_scatter_with_reduce_has_torchs_missing_derivative():
    """``scatter(..., reduce=)``: the result needs a gradient (as torch's) and
    its backward raises torch's RuntimeError."""
    torch = pytest.importorskip("torch")
    for lib in (torch, ft):
        x = lib.zeros(3, 4, requires_grad=True)
        with pytest.warns(UserWarning, match="reduce argument of torch.scatter"):
            y = lib.scatter(x, 0, lib.tensor([[0, 1, 2, 0]]), lib.ones(3, 4), reduce="add")
        assert y.requires_grad
        assert y.tolist()[0] == [1.0, 0.0, 0.0, 1.0]
        with pytest.raises(RuntimeError, match="derivative for aten::scatter is not implemented"):
            y.sum().backward()
