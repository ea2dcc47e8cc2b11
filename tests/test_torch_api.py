"""The wider torch API of fpemu.autograd against torch CPU: convolution,
pooling, losses, embedding padding, the attention backends, data loading,
save / load (including a real torch checkpoint) and the names programs use."""

import io
import math

import ml_dtypes
import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): these tests compare with it
TF = torch.nn.functional
FF = ft.nn.functional


def pair(shape, seed, scale=1.0):
    a = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    return (torch.tensor(a, requires_grad=True), ft.tensor(a, requires_grad=True))


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(b.detach().double().numpy(), a.detach().double().numpy(),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1),
                                                            (1, "same", 2, 1), (1, 1, 1, 2)])
def test_conv2d_forward_and_backward(stride, padding, dilation, groups):
    xt, xf = pair((2, 4, 7, 6), 1)
    wt, wf = pair((6, 4 // groups, 3, 3), 2)
    bt, bf = pair((6,), 3)
    yt = TF.conv2d(xt, wt, bt, stride, padding, dilation, groups)
    ft.backends.cudnn.allow_tf32 = False      # on by default, as on the GPU; torch CPU has none
    try:
        yf = FF.conv2d(xf, wf, bf, stride, padding, dilation, groups)
    finally:
        ft.backends.cudnn.allow_tf32 = True
    close(yt, yf)
    g = np.random.default_rng(4).standard_normal(yt.shape).astype(np.float32)
    (yt * torch.tensor(g)).sum().backward()
    ft.backends.cudnn.allow_tf32 = False
    try:
        (yf * ft.tensor(g)).sum().backward()
    finally:
        ft.backends.cudnn.allow_tf32 = True
    for a, b in ((xt, xf), (wt, wf), (bt, bf)):
        close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_pools_forward_and_backward():
    for fn_t, fn_f, kw in ((TF.max_pool2d, FF.max_pool2d, dict(kernel_size=2)),
                           (TF.max_pool2d, FF.max_pool2d, dict(kernel_size=3, stride=2,
                                                               padding=1)),
                           (TF.avg_pool2d, FF.avg_pool2d, dict(kernel_size=2)),
                           (TF.avg_pool2d, FF.avg_pool2d, dict(kernel_size=3, stride=1,
                                                               padding=1,
                                                               count_include_pad=False))):
        xt, xf = pair((2, 3, 6, 6), 5)
        yt, yf = fn_t(xt, **kw), fn_f(xf, **kw)
        close(yt, yf)
        yt.square().sum().backward()
        yf.square().sum().backward()
        close(xt.grad, xf.grad)


def test_losses_with_weights_and_spatial_targets():
    xt, xf = pair((3, 4, 2, 2), 6)
    tgt = np.random.default_rng(7).integers(0, 4, (3, 2, 2))
    tgt[0, 0, 0] = -100
    w = np.array([0.5, 1.0, 2.0, 0.25], np.float32)
    for red in ("mean", "sum", "none"):
        a = TF.cross_entropy(xt, torch.tensor(tgt), weight=torch.tensor(w), reduction=red,
                             label_smoothing=0.1)
        b = FF.cross_entropy(xf, ft.tensor(tgt), weight=ft.tensor(w), reduction=red,
                             label_smoothing=0.1)
        close(a, b)
    a = TF.nll_loss(TF.log_softmax(xt, 1), torch.tensor(tgt), weight=torch.tensor(w))
    b = FF.nll_loss(FF.log_softmax(xf, 1), ft.tensor(tgt), weight=ft.tensor(w))
    close(a, b)
    a.backward()
    b.backward()
    close(xt.grad, xf.grad)
    pt, pf = pair((5, 3), 8)
    qt, qf = pair((5, 3), 9)
    for name in ("l1_loss", "smooth_l1_loss", "mse_loss"):
        close(getattr(TF, name)(pt, qt), getattr(FF, name)(pf, qf))


def test_embedding_padding_idx_gets_no_gradient():
    torch.manual_seed(0)
    ft.manual_seed(0)
    et, ef = torch.nn.Embedding(6, 3, padding_idx=2), ft.nn.Embedding(6, 3, padding_idx=2)
    with torch.no_grad():
        et.weight.copy_(torch.arange(18.0).reshape(6, 3))
    with ft.no_grad():
        ef.weight.copy_(ft.arange(18.0).reshape(6, 3))
    idx = [[2, 1, 2], [0, 5, 2]]
    et(torch.tensor(idx)).sum().backward()
    ef(ft.tensor(idx)).sum().backward()
    close(et.weight.grad, ef.weight.grad)
    assert not ef.weight.grad.numpy()[2].any()


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_sdpa_flash_model_keeps_scores_fp32_and_rounds_p():
    """Independent oracle: float64 numpy with the rounding points of the
    flash model (scores exact in fp32 here: small integers; P rounded to bf16)."""
    rng = np.random.default_rng(10)
    q, k, v = (rng.integers(-3, 4, (2, 3, 5, 8)).astype(np.float32) / 4 for _ in range(3))
    out = FF.scaled_dot_product_attention(*(ft.tensor(a, dtype=ft.bfloat16) for a in (q, k, v)),
                                          is_causal=True)
    assert out.dtype is ft.bfloat16
    s = np.einsum("bhld,bhsd->bhls", q, k).astype(np.float64) * np.float32(8 ** -0.5)
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)).astype(np.float32).astype(np.float64)
    l_ = p.sum(-1, keepdims=True).astype(np.float32)
    o = (np.einsum("bhls,bhsd->bhld", _bf16(p), v.astype(np.float64)).astype(np.float32)
         / l_).astype(np.float32)
    np.testing.assert_array_equal(out.float().numpy(), _bf16(o).astype(np.float32))
    # the old model rounded q k^T to bf16 first: a different result
    with ft.nn.functional.sdpa_kernel(ft.nn.functional.SDPBackend.MATH):
        math = FF.scaled_dot_product_attention(*(ft.tensor(a, dtype=ft.bfloat16)
                                                 for a in (q, k, v)), is_causal=True)
    assert math.dtype is ft.bfloat16


def test_sdpa_math_backend_matches_torch_cpu_math():
    qt, qf = pair((2, 2, 6, 4), 11)
    kt, kf = pair((2, 2, 6, 4), 12)
    vt, vf = pair((2, 2, 6, 4), 13)
    mask = np.random.default_rng(14).random((6, 6)) > 0.3
    np.fill_diagonal(mask, True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        a = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=torch.tensor(mask))
    with FF.sdpa_kernel(FF.SDPBackend.MATH):
        b = FF.scaled_dot_product_attention(qf, kf, vf, attn_mask=ft.tensor(mask))
    close(a, b)
    a.sum().backward()
    b.sum().backward()
    for x, y in ((qt, qf), (kt, kf), (vt, vf)):
        close(x.grad, y.grad, rtol=1e-4, atol=1e-5)
    # the default (online-softmax) model agrees with it in float32 to rounding
    c = FF.scaled_dot_product_attention(ft.tensor(qf.numpy(force=True)),
                                        ft.tensor(kf.numpy(force=True)),
                                        ft.tensor(vf.numpy(force=True)),
                                        attn_mask=ft.tensor(mask))
    close(a, c, rtol=1e-5, atol=1e-6)


def test_manual_attention_under_bf16_autocast_keeps_its_cuda_meaning():
    q = ft.randn(2, 4, 8)
    with ft.autocast("cuda", dtype=ft.bfloat16):
        att = q @ q.transpose(-2, -1)
        p = FF.softmax(att, dim=-1)
        y = p @ q
    assert (att.dtype, p.dtype, y.dtype) == (ft.bfloat16, ft.float32, ft.bfloat16)


def test_dataloader_batches_and_shuffles_as_torch():
    data = np.arange(20, dtype=np.float32).reshape(10, 2)
    lab = np.arange(10)
    torch.manual_seed(3)
    ft.manual_seed(3)
    lt = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.tensor(data), torch.tensor(lab)), batch_size=4, shuffle=True, drop_last=True)
    lf = ft.utils.data.DataLoader(ft.utils.data.TensorDataset(
        ft.tensor(data), ft.tensor(lab)), batch_size=4, shuffle=True, drop_last=True)
    bt, bf = list(lt), list(lf)
    assert len(bt) == len(bf) == 2
    for (xa, ya), (xb, yb) in zip(bt, bf):
        assert ya.tolist() == yb.tolist()
        np.testing.assert_array_equal(xa.numpy(), xb.numpy())


def test_save_load_and_a_real_torch_checkpoint(tmp_path):
    m = ft.nn.Linear(3, 2)
    opt = ft.optim.AdamW(m.parameters(), lr=1e-3)
    m(ft.ones(1, 3)).sum().backward()
    opt.step()
    ft.save({"model": m.state_dict(), "opt": opt.state_dict(), "iter": 3}, tmp_path / "c.pt")
    ck = ft.load(tmp_path / "c.pt")
    m2 = ft.nn.Linear(3, 2)
    m2.load_state_dict(ck["model"])
    np.testing.assert_array_equal(m2.weight.numpy(force=True), m.weight.numpy(force=True))
    assert ck["iter"] == 3
    tm = torch.nn.Linear(3, 2).to(torch.bfloat16)
    buf = io.BytesIO()
    torch.save({"model": tm.state_dict()}, buf)
    (tmp_path / "t.pt").write_bytes(buf.getvalue())
    loaded = ft.load(tmp_path / "t.pt")["model"]
    assert loaded["weight"].dtype is ft.bfloat16
    np.testing.assert_array_equal(loaded["weight"].float().numpy(),
                                  tm.weight.detach().float().numpy())


def test_names_programs_use():
    assert ft.compile(ft.nn.Linear(2, 2)).__class__.__name__ == "Linear"
    assert ft.device("cuda:0").type == "cuda" and str(ft.device("cuda", 0)) == "cuda:0"
    assert isinstance(ft.ones(2), ft.FloatTensor) and ft.LongTensor([1, 2]).dtype is ft.int64
    assert ft.cuda.is_available() and ft.cuda.device_count() == 1
    ft.cuda.set_device(0)
    ft.cuda.synchronize()
    ft.cuda.empty_cache()
    ft.cuda.manual_seed_all(1)
    assert ft.cuda.max_memory_allocated() == 0
    ft.backends.cuda.matmul.allow_tf32 = True
    try:
        a = ft.tensor([[1 + 2 ** -12]])
        assert (a @ a).item() == 1.0           # operands read as tf32 (10 fraction bits)
    finally:
        ft.backends.cuda.matmul.allow_tf32 = False
    assert (ft.tensor([[1 + 2 ** -12]]) @ ft.tensor([[1 + 2 ** -12]])).item() > 1.0
    with ft.inference_mode():
        assert not ft.is_grad_enabled()
    from fpemu.autograd.nn.parallel import DistributedDataParallel
    from fpemu.autograd.nn.modules import Linear  # noqa: F401
    with pytest.raises(NotImplementedError, match="one device"):
        DistributedDataParallel(ft.nn.Linear(1, 1))
    from fpemu.autograd.distributed import init_process_group
    with pytest.raises(NotImplementedError, match="single device"):
        init_process_group("nccl")
    s = ft.cuda.amp.GradScaler(enabled=False)
    assert not s.is_enabled()
    with ft.cuda.amp.autocast(dtype=ft.bfloat16):
        assert (ft.ones(2, 2) @ ft.ones(2, 2)).dtype is ft.bfloat16


def _lr_trace(lib, make, steps=40, opt="sgd"):
    p = lib.nn.Parameter(lib.ones(2))
    o = (lib.optim.SGD([p], lr=0.1, momentum=0.9) if opt == "sgd"
         else lib.optim.AdamW([p], lr=0.1))
    sched = make(lib, o)
    out = []
    for _ in range(steps):
        o.step()
        sched.step()
        g = o.param_groups[0]
        out.append((g["lr"], g.get("momentum"), g.get("betas")))
    return out


@pytest.mark.parametrize("make,opt", [
    (lambda lib, o: lib.optim.lr_scheduler.StepLR(o, 7, gamma=0.3), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.MultiStepLR(o, [5, 9, 9, 20]), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.LambdaLR(o, lambda e: 0.95 ** e), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.ExponentialLR(o, 0.9), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.ConstantLR(o, 0.5, 4), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, 10), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.CosineAnnealingLR(o, 13, 1e-4), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.SequentialLR(
        o, [lib.optim.lr_scheduler.LinearLR(o, 0.01, total_iters=5),
            lib.optim.lr_scheduler.CosineAnnealingLR(o, 30)], milestones=[5]), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.OneCycleLR(o, 0.5, total_steps=40), "sgd"),
    (lambda lib, o: lib.optim.lr_scheduler.OneCycleLR(
        o, 0.5, total_steps=40, three_phase=True, anneal_strategy="linear"), "adam"),
])
def test_lr_schedulers_give_torch_doubles(make, opt):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = _lr_trace(torch, make, opt=opt)
    b = _lr_trace(ft, make, opt=opt)
    assert a == b                       # the same Python floats, step for step


def test_optimizer_default_implementation_follows_the_device():
    """foreach=None: torch runs the single-tensor loop for CPU tensors and the
    foreach kernels for CUDA ones; under the CPU profile fpemu's default
    AdamW gives torch CPU's bf16 parameters bit for bit."""
    p0 = (np.random.default_rng(20).standard_normal(40) * 0.1).astype(np.float32)
    g0 = (np.random.default_rng(21).standard_normal((5, 40)) * 1e-3).astype(np.float32)
    pt = torch.nn.Parameter(torch.tensor(p0).bfloat16())
    ot = torch.optim.AdamW([pt], lr=1e-2)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        pf = ft.nn.Parameter(ft.tensor(p0).bfloat16())
        of = ft.optim.AdamW([pf], lr=1e-2)
        assert of.impl == "single"
        for g in g0:
            pt.grad = torch.tensor(g).bfloat16()
            pf.grad = ft.tensor(g).bfloat16()
            ot.step()
            of.step()
    np.testing.assert_array_equal(pf.detach().float().numpy(), pt.detach().float().numpy())
    assert of.impl == "foreach"                     # the CUDA profile again


OPTS = [("RMSprop", dict(lr=1e-2)),
        ("RMSprop", dict(lr=1e-2, momentum=0.9, centered=True, weight_decay=0.1)),
        ("Adagrad", dict(lr=1e-1, lr_decay=0.01, weight_decay=0.1)),
        ("Adadelta", dict(lr=1.0, weight_decay=0.05))]


@pytest.mark.parametrize("name,kw", OPTS)
@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rmsprop_adagrad_adadelta_follow_torch_cpu(name, kw, foreach, dtype):
    """Under the CPU profile: bfloat16 parameters equal torch CPU's bit for
    bit; float32 ones within the 1-ulp MKL sqrt of the CPU build (fpemu's
    sqrt is IEEE, docs/pytorch-numerics.md §7)."""
    rng = np.random.default_rng(30)
    p0 = (rng.standard_normal(70) * 0.5).astype(np.float32)
    grads = (rng.standard_normal((6, 70)) * 0.1).astype(np.float32)
    pt = torch.nn.Parameter(torch.tensor(p0).to(getattr(torch, dtype)))
    ot = getattr(torch.optim, name)([pt], foreach=foreach, **kw)
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        pf = ft.nn.Parameter(ft.tensor(p0).to(getattr(ft, dtype)))
        of = getattr(ft.optim, name)([pf], foreach=foreach, **kw)
        for g in grads:
            pt.grad = torch.tensor(g).to(pt.dtype)
            pf.grad = ft.tensor(g).to(pf.dtype)
            ot.step()
            of.step()
    a, b = pt.detach().double().numpy(), pf.detach().double().numpy()
    if dtype == "bfloat16":
        np.testing.assert_array_equal(b, a)
    else:
        np.testing.assert_allclose(b, a, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("cls,kw", [("LSTM", dict(num_layers=2, batch_first=True)),
                                    ("GRU", dict(bidirectional=True)),
                                    ("RNN", dict(nonlinearity="relu", num_layers=2)),
                                    ("LSTM", dict(bidirectional=True, bias=False))])
def test_recurrent_layers_match_torch_from_the_same_seed(cls, kw):
    torch.manual_seed(4)
    ft.manual_seed(4)
    mt, mf = getattr(torch.nn, cls)(5, 7, **kw), getattr(ft.nn, cls)(5, 7, **kw)
    assert [n for n, _ in mt.named_parameters()] == [n for n, _ in mf.named_parameters()]
    for (_, a), (_, b) in zip(mt.named_parameters(), mf.named_parameters()):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    xt, xf = pair((3, 4, 5), 40)
    yt, st = mt(xt)
    yf, sf = mf(xf)
    close(yt, yf)
    (yt.square().sum() + (st[0] if cls == "LSTM" else st).sum()).backward()
    (yf.square().sum() + (sf[0] if cls == "LSTM" else sf).sum()).backward()
    close(xt.grad, xf.grad, rtol=1e-5, atol=1e-6)
    for (_, a), (_, b) in zip(mt.named_parameters(), mf.named_parameters()):
        close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_lstm_under_autocast_runs_in_bf16_with_fp32_gate_math():
    """cuDNN's RNN is on autocast's lower-precision list: input, states and
    output in bf16; the gates are computed in fp32 inside the cell."""
    m = ft.nn.LSTM(4, 6)
    x = ft.randn(3, 2, 4)
    with ft.autocast("cuda", dtype=ft.bfloat16):
        y, (h, c) = m(x)
    assert (y.dtype, h.dtype, c.dtype) == (ft.bfloat16,) * 3
    y32, _ = m(x)
    np.testing.assert_allclose(y.detach().float().numpy(), y32.detach().numpy(), atol=2e-2)


def test_a_missing_name_says_what_fpemu_emulates():
    assert hasattr(ft.nn.functional, "scaled_dot_product_attention")   # nanoGPT's probe
    assert not hasattr(ft, "fft")
    import fpemu.autograd.distributed as fdist
    for get in (lambda: ft.fft, lambda: ft.nn.Bilinear, lambda: ft.nn.functional.ctc_loss,
                lambda: ft.optim.SparseAdam, lambda: ft.ones(2).stft,
                lambda: ft.autograd.forward_ad, lambda: ft.cuda.Stream, lambda: ft.amp.foo,
                lambda: ft.onnx.dynamo_export, lambda: fdist.no_such_collective):
        with pytest.raises(AttributeError, match="fpemu.autograd emulates .*API coverage"):
            get()


def test_addmm_and_baddbmm_match_torch():
    for beta, alpha in ((1, 1), (0.5, 2.0), (0, 1)):
        it, i_f = pair((1, 4, 6), 50)
        at, af = pair((3, 4, 5), 51)
        bt, bf = pair((3, 5, 6), 52)
        yt, yf = (torch.baddbmm(it, at, bt, beta=beta, alpha=alpha),
                  ft.baddbmm(i_f, af, bf, beta=beta, alpha=alpha))
        close(yt, yf)
        (yt * yt).sum().backward()
        (yf * yf).sum().backward()
        for a, b in ((it, i_f), (at, af), (bt, bf)):
            close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    it, i_f = pair((6,), 53)
    at, af = pair((4, 5), 54)
    bt, bf = pair((5, 6), 55)
    close(torch.addmm(it, at, bt), ft.addmm(i_f, af, bf))
    close(it.addmm(at, bt, beta=2), i_f.addmm(af, bf, beta=2))


def _same_init(kind, **kw):
    """torch's and fpemu's module built from the same seed: same names, same
    bits (uniform draws); normal draws (bias_k, bias_v) within the 5e-7 of
    docs/pytorch-numerics.md §10, torch's vectorised log / sin / cos."""
    torch.manual_seed(7)
    ft.manual_seed(7)
    mt, mf = getattr(torch.nn, kind)(**kw), getattr(ft.nn, kind)(**kw)
    assert [n for n, _ in mt.named_parameters()] == [n for n, _ in mf.named_parameters()]
    for (n, a), (_, b) in zip(mt.named_parameters(), mf.named_parameters()):
        if n in ("bias_k", "bias_v"):
            np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=5e-7)
        else:
            np.testing.assert_array_equal(b.detach().numpy(), a.detach().numpy())
    return mt, mf


def _grads_close(mt, mf, rtol=1e-5, atol=1e-5, scaled_atol=0.0):
    """Each parameter's gradient close to torch's; ``scaled_atol``: an
    absolute tolerance of that fraction of the gradient's largest magnitude
    too (float32 sums in another order than this CPU's BLAS: an element that
    cancels keeps the rounding error of its largest terms)."""
    for (n, a), (_, b) in zip(mt.named_parameters(), mf.named_parameters()):
        top = float(a.grad.detach().abs().max()) if a.grad.numel() else 0.0
        close(a.grad, b.grad, rtol=rtol, atol=max(atol, scaled_atol * top))


@pytest.mark.parametrize("kw", [dict(embed_dim=16, num_heads=4),
                                dict(embed_dim=16, num_heads=2, batch_first=True,
                                     add_bias_kv=True, add_zero_attn=True),
                                dict(embed_dim=16, num_heads=4, kdim=8, vdim=12, bias=False)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_matches_torch(kw, need_weights):
    """Packed and separate projections, bias_kv, zero attention, a boolean
    key-padding mask merged with a boolean attention mask; the explicit path
    (weights returned) and the SDPA path."""
    mt, mf = _same_init("MultiheadAttention", **kw)
    L, S, N, bf = 5, 7, 3, kw.get("batch_first", False)
    shape = (lambda n, e: (N, n, e)) if bf else (lambda n, e: (n, N, e))
    (qt, qf), (kt, kf), (vt, vf) = (pair(shape(L, 16), 60), pair(shape(S, kw.get("kdim", 16)), 61),
                                    pair(shape(S, kw.get("vdim", 16)), 62))
    kpm = np.zeros((N, S), bool)
    kpm[0, -2:] = True
    am = np.triu(np.ones((L, S), bool), 3)
    ot, wt = mt(qt, kt, vt, key_padding_mask=torch.tensor(kpm), attn_mask=torch.tensor(am),
                need_weights=need_weights)
    of, wf = mf(qf, kf, vf, key_padding_mask=ft.tensor(kpm), attn_mask=ft.tensor(am),
                need_weights=need_weights)
    close(ot, of)
    if need_weights:
        close(wt, wf)
    else:
        assert wf is None
    g = np.random.default_rng(63).standard_normal(ot.shape).astype(np.float32)
    (ot * torch.tensor(g)).sum().backward()
    (of * ft.tensor(g)).sum().backward()
    for a, b in ((qt, qf), (kt, kf), (vt, vf)):
        close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    _grads_close(mt, mf)


@pytest.mark.parametrize("batch_first,norm_first,activation", [
    (False, False, "relu"), (True, True, "gelu"), (True, False, "relu")])
def test_transformer_encoder_matches_torch(batch_first, norm_first, activation):
    """Two deep-copied layers and a final norm; the causal float mask is
    detected as causal (SDPA's is_causal path), as torch does."""
    kw = dict(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=batch_first,
              norm_first=norm_first, activation=activation)
    lt, lf = _same_init("TransformerEncoderLayer", **kw)
    et = torch.nn.TransformerEncoder(lt, 2, norm=torch.nn.LayerNorm(16),
                                     enable_nested_tensor=False)
    ef = ft.nn.TransformerEncoder(lf, 2, norm=ft.nn.LayerNorm(16), enable_nested_tensor=False)
    assert ef.layers[0].linear1.weight is not ef.layers[1].linear1.weight
    xt, xf = pair((3, 6, 16) if batch_first else (6, 3, 16), 70)
    yt = et(xt, mask=torch.nn.Transformer.generate_square_subsequent_mask(6))
    yf = ef(xf, mask=ft.nn.Transformer.generate_square_subsequent_mask(6))
    close(yt, yf)
    g = np.random.default_rng(71).standard_normal(yt.shape).astype(np.float32)
    (yt * torch.tensor(g)).sum().backward()
    (yf * ft.tensor(g)).sum().backward()
    close(xt.grad, xf.grad, rtol=1e-5, atol=1e-6)
    _grads_close(et, ef)


def test_transformer_matches_torch_from_the_same_seed():
    """nn.Transformer re-initialises its matrices with xavier_uniform_: the
    same seed gives torch's bits; encoder-decoder forward and backward agree."""
    kw = dict(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
              dim_feedforward=32, dropout=0.0, batch_first=True)
    mt, mf = _same_init("Transformer", **kw)
    (st, sf), (tt, tf_) = pair((2, 7, 16), 80), pair((2, 5, 16), 81)
    kpm = np.zeros((2, 7), bool)
    kpm[1, 5:] = True
    yt = mt(st, tt, tgt_mask=mt.generate_square_subsequent_mask(5), tgt_is_causal=True,
            src_key_padding_mask=torch.tensor(kpm), memory_key_padding_mask=torch.tensor(kpm))
    yf = mf(sf, tf_, tgt_mask=mf.generate_square_subsequent_mask(5), tgt_is_causal=True,
            src_key_padding_mask=ft.tensor(kpm), memory_key_padding_mask=ft.tensor(kpm))
    close(yt, yf)
    g = np.random.default_rng(82).standard_normal(yt.shape).astype(np.float32)
    (yt * torch.tensor(g)).sum().backward()
    (yf * ft.tensor(g)).sum().backward()
    # (an element of a decoder weight's gradient cancels to 2.6e-3 from terms
    # near 10: 1.5e-6 apart on an Intel Xeon, whose BLAS sums in its own order)
    _grads_close(mt, mf, rtol=1e-4, atol=1e-6, scaled_atol=1e-6)


def test_transformer_encoder_eval_zeroes_padding_and_warns_as_torch():
    """torch's eval path runs the layers on a nested tensor: the padded
    positions come back as zeros. A layer that path refuses gets torch's warning."""
    kw = dict(d_model=16, nhead=4, dim_feedforward=32, batch_first=True)
    lt, lf = _same_init("TransformerEncoderLayer", **kw)
    et, ef = torch.nn.TransformerEncoder(lt, 2), ft.nn.TransformerEncoder(lf, 2)
    et.eval()
    ef.eval()
    kpm = np.zeros((3, 6), bool)
    kpm[1, 4:] = kpm[2, 2:] = True
    x = np.random.default_rng(90).standard_normal((3, 6, 16)).astype(np.float32)
    with torch.no_grad(), pytest.warns(UserWarning, match="nested tensors is in prototype"):
        yt = et(torch.tensor(x), src_key_padding_mask=torch.tensor(kpm))
    with ft.no_grad():
        yf = ef(ft.tensor(x), src_key_padding_mask=ft.tensor(kpm))
    close(yt, yf)
    assert not yf.numpy()[2, 2:].any() and yf.numpy()[2, :2].all()
    et.train()
    ef.train()                          # training: no nested tensor, padded rows computed
    yf = ef(ft.tensor(x), src_key_padding_mask=ft.tensor(kpm))
    assert yf.detach().numpy()[2, 2:].all()
    msgs = []
    for lib in (torch, ft):
        layer = lib.nn.TransformerEncoderLayer(16, 4, 32)          # batch_first=False
        with pytest.warns(UserWarning) as rec:
            lib.nn.TransformerEncoder(layer, 1)
        msgs.append(str(rec[0].message))
    assert msgs[0] == msgs[1]


def test_multihead_attention_under_bf16_autocast():
    """Projections and the attention run in bf16 under autocast, as on the GPU."""
    m = ft.nn.MultiheadAttention(16, 4, batch_first=True)
    x = ft.randn(2, 5, 16)
    with ft.autocast("cuda", dtype=ft.bfloat16):
        y, w = m(x, x, x, need_weights=False)
    assert y.dtype is ft.bfloat16 and w is None
    y32, _ = m(x, x, x, need_weights=False)
    y16 = y.detach().float().numpy()
    assert not np.array_equal(y16, y32.detach().numpy())       # it did run in bf16 ...
    np.testing.assert_array_equal(y16, y16.astype(ml_dtypes.bfloat16).astype(np.float32))
    # ... and stays near the fp32 result (bf16 keeps 8 bits: no bit claim here)
    np.testing.assert_allclose(y16, y32.detach().numpy(), atol=3e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.1, lr_decay=0.01),
                                dict(maximize=True, eps=1e-3)])
def test_fused_adagrad_is_torch_cpu_bit_for_bit(dtype, kw):
    """FusedAdagradKernel on the CPU: 16-bit parameters read the constants in
    their own dtype in the vector body and as float32 in each chunk's tail
    (1000 elements: two chunks, each with a tail); a GradScaler's scale is
    applied inside the kernel."""
    from fpemu.autograd import Profile, get_profile, set_profile
    old = get_profile()
    set_profile(Profile("cpu"))
    try:
        rng = np.random.default_rng(len(kw) + len(dtype))
        p0 = rng.standard_normal(1000).astype(np.float32)
        tp = torch.nn.Parameter(torch.tensor(p0).to(getattr(torch, dtype)))
        fp = ft.nn.Parameter(ft.tensor(p0).to(getattr(ft, dtype)))
        to = torch.optim.Adagrad([tp], lr=0.05, fused=True, **kw)
        fo = ft.optim.Adagrad([fp], lr=0.05, fused=True, **kw)
        for _ in range(4):
            g = rng.standard_normal(1000).astype(np.float32)
            tp.grad, fp.grad = torch.tensor(g).to(tp.dtype), ft.tensor(g).to(fp.dtype)
            to.step()
            fo.step()
        for a, b in ((tp, fp), (to.state[tp]["sum"], fo.state[fp]["sum"])):
            np.testing.assert_array_equal(b.detach().float().numpy().view(np.uint32),
                                          a.detach().float().numpy().view(np.uint32))
        ts, fs = torch.amp.GradScaler("cpu", init_scale=8.0), ft.amp.GradScaler(
            "cpu", init_scale=8.0)
        ts.scale(torch.tensor(1.0))
        fs.scale(ft.tensor(1.0))
        g = rng.standard_normal(1000).astype(np.float32)
        tp.grad, fp.grad = (torch.tensor(g * 8).to(tp.dtype), ft.tensor(g * 8).to(fp.dtype))
        ts.step(to)
        fs.step(fo)
        np.testing.assert_array_equal(fp.detach().float().numpy().view(np.uint32),
                                      tp.detach().float().numpy().view(np.uint32))
    finally:
        set_profile(old)


def test_fused_flags_follow_torch():
    """RMSprop and Adadelta have no ``fused`` argument; Adagrad's fused kernel
    is CPU-only, so the CUDA profile refuses it with the alternatives."""
    for lib in (torch, ft):
        p = [lib.nn.Parameter(lib.ones(3))]
        for cls in (lib.optim.RMSprop, lib.optim.Adadelta):
            with pytest.raises(TypeError, match="fused"):
                cls(p, fused=True)
    with pytest.raises(RuntimeError, match="CPU only.*foreach=True"):
        ft.optim.Adagrad([ft.nn.Parameter(ft.ones(3))], fused=True)


@pytest.mark.parametrize("shape", [(5, 3), (3, 7), (4, 2, 3)])
def test_orthogonal_init_follows_torch(shape):
    """Same normals (to their last bits, docs/pytorch-numerics.md §10), same
    Householder QR and sign fix: torch's matrix within 1e-6; and orthogonal."""
    torch.manual_seed(3)
    ft.manual_seed(3)
    a, b = torch.empty(shape), ft.empty(*shape)
    torch.nn.init.orthogonal_(a, gain=2.0)
    ft.nn.init.orthogonal_(b, gain=2.0)
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0, atol=1e-6)
    m = b.numpy().reshape(shape[0], -1).astype(np.float64) / 2.0
    gram = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    np.testing.assert_allclose(gram, np.eye(len(gram)), atol=1e-6)


def test_fpemu_profile_picks_the_profile_without_editing_the_program():
    """A program meant for the CPU device runs under the CPU profile with
    FPEMU_PROFILE=cpu: no TF32 convolutions, and cuda.is_available() is False
    so it takes its CPU branches."""
    import os
    import subprocess
    import sys
    prog = ("import fpemu.autograd as torch\n"
            "p = torch.get_profile()\n"
            "print(p.device, p.torch_version, p.e4m3_overflow, torch.cuda.is_available())\n")

    def run(value):
        env = dict(os.environ)
        env.pop("FPEMU_PROFILE", None)
        if value is not None:
            env["FPEMU_PROFILE"] = value
        return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                              env=env, timeout=120)
    assert run(None).stdout.split() == ["cuda", "2.13.0", "saturate", "True"]
    assert run("cpu").stdout.split() == ["cpu", "2.13.0", "saturate", "False"]
    assert run("CUDA-2.11").stdout.split() == ["cuda", "2.11.0", "nan", "True"]
    assert run("cpu-torch2.12.0").stdout.split() == ["cpu", "2.12.0", "saturate", "False"]
    bad = run("gpu")
    assert bad.returncode != 0
    assert "FPEMU_PROFILE must be 'cpu' or 'cuda'" in bad.stderr and "'gpu'" in bad.stderr
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        assert not ft.cuda.is_available()
    assert ft.cuda.is_available()


def test_the_names_real_programs_reach_for():
    """torch.diag / diagonal / trace (values and gradients as torch's), the
    constants, torch.version, device predicates, cuda.Event timing and the
    memory queries: each as torch answers for one CUDA device."""
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    for k in (0, 2, -1, 9):
        np.testing.assert_array_equal(ft.diag(ft.tensor(x), k).numpy(),
                                      torch.diag(torch.from_numpy(x), k).numpy())
    v = x[0]
    tv, fv = torch.from_numpy(v).requires_grad_(), ft.tensor(v, requires_grad=True)
    g = np.arange(49, dtype=np.float32).reshape(7, 7)
    torch.diag(tv, 2).backward(torch.from_numpy(g))
    ft.diag(fv, 2).backward(ft.tensor(g))
    np.testing.assert_array_equal(fv.grad.numpy(), tv.grad.numpy())
    y = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(ft.tensor(y).diagonal(-1, 2, 0).numpy(),
                                  torch.from_numpy(y).diagonal(-1, 2, 0).numpy())
    assert ft.trace(ft.tensor(np.eye(3, dtype=np.float32) * 2)).item() == 6.0
    with pytest.raises(RuntimeError, match="Supports 1D or 2D tensors. Got 3D"):
        ft.diag(ft.tensor(y))
    assert (ft.inf, ft.pi, ft.e, ft.newaxis) == (math.inf, math.pi, math.e, None)
    assert math.isnan(ft.nan) and ft.ones(3)[ft.newaxis].shape == (1, 3)
    assert ft.version.cuda == "13.0" and ft.version.__version__ == ft.__version__
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        assert ft.version.cuda is None
    t = ft.ones(2)
    assert not (t.is_xpu or t.is_mps or t.is_meta or t.is_quantized) and t.is_cuda
    start, end = ft.cuda.Event(enable_timing=True), ft.cuda.Event(enable_timing=True)
    start.record()
    ft.ones(100, 100).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        ft.cuda.Event().elapsed_time(end)
    assert ft.cuda.memory_reserved() == ft.cuda.max_memory_reserved() == 0


def test_set_num_threads_takes_torchs_arguments():
    """``torch.set_num_threads(2)`` ran into this module's own ``min`` (the
    tensor reduction) and failed; bad values fail as torch's do."""
    import numba
    before = ft.get_num_threads()
    try:
        ft.set_num_threads(1)
        assert ft.get_num_threads() == 1
        ft.set_num_threads(10_000)          # more than there are: Numba's maximum
        assert ft.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    finally:
        ft.set_num_threads(before)
    for bad, says in ((0, "positive integer, got 0"), (-2, "positive integer, got -2"),
                      (2.5, "an int, but got float"), (True, "an int, but got bool")):
        with pytest.raises(RuntimeError, match=says):
            ft.set_num_threads(bad)
        with pytest.raises(RuntimeError):
            torch.set_num_threads(bad)      # torch refuses the same values
