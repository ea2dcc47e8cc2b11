"""``fpemu.autograd.nn`` against torch CPU: every class at torch's module
path, torch's reprs, the same initial weights from the same seed, and the
layers' forward and backward passes (float64 inside, one rounding: within
a few float32 ulps of torch CPU's kernels, tier 2 of docs/autograd.md)."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): these tests compare with it

FN, TN = ft.nn, torch.nn
OWN = {"MultiheadSelfAttention", "TinyTransformer", "TransformerBlock"}   # fpemu's models


def test_every_layer_sits_at_torchs_path():
    names = [n for n in FN.modules.__all__ if n not in OWN]
    assert len(names) >= 70
    for name in names:
        ours, theirs = getattr(FN, name), getattr(TN, name)
        family = theirs.__module__.rsplit(".", 1)[-1]
        assert ours.__module__ == f"fpemu.autograd.nn.modules.{family}", name
        assert getattr(getattr(FN.modules, family), name) is ours
    assert FN.Parameter.__module__ == "fpemu.autograd.nn.parameter"
    assert FN.modules.module.Module is FN.Module


REPRS = [
    ("LayerNorm", (8,), {}), ("LayerNorm", ((4, 8),), dict(eps=1e-6, bias=False)),
    ("BatchNorm2d", (3,), {}), ("BatchNorm1d", (5,), dict(momentum=None, affine=False)),
    ("GroupNorm", (2, 4), {}), ("InstanceNorm2d", (3,), {}), ("RMSNorm", (4,), {}),
    ("Dropout2d", (0.2,), {}), ("Dropout", (), {}), ("LeakyReLU", (0.2, True), {}),
    ("ELU", (), {}), ("Hardtanh", (-2.0, 2.0), {}), ("ReLU6", (True,), {}),
    ("PReLU", (3,), {}), ("Softplus", (), dict(beta=2.0)), ("GELU", ("tanh",), {}),
    ("Softmax", (), dict(dim=1)), ("LogSoftmax", (), dict(dim=-1)), ("ReLU", (True,), {}),
    ("ConvTranspose2d", (3, 4, 3), dict(stride=2, padding=1, output_padding=1)),
    ("Conv2d", (3, 4, 3), dict(padding="same", bias=False)), ("Conv1d", (2, 4, 5), {}),
    ("LSTMCell", (3, 4), {}), ("GRUCell", (3, 4), dict(bias=False)),
    ("RNNCell", (3, 4), dict(nonlinearity="relu")), ("PixelShuffle", (2,), {}),
    ("BCELoss", (), {}), ("Embedding", (10, 3), dict(padding_idx=0)),
    ("MaxPool2d", (2,), {}), ("AvgPool1d", (3,), {}), ("AdaptiveAvgPool2d", ((1, 1),), {}),
    ("Flatten", (), {}), ("Unflatten", (1, (2, 3)), {}),
    ("LSTM", (3, 4, 2), dict(batch_first=True, bidirectional=True, dropout=0.1)),
    ("GRU", (3, 4), {}), ("Linear", (2, 3), dict(bias=False)), ("Identity", (), {}),
    ("Sequential", None, {}), ("ModuleList", None, {}), ("ParameterList", None, {}),
    ("TransformerEncoderLayer", (8, 2, 16), {}),
    ("Conv3d", (2, 4, (3, 2, 3)), dict(stride=2, groups=2)),
    ("AdaptiveAvgPool3d", ((1, 2, 3),), {}), ("MaxPool3d", (2,), dict(ceil_mode=True)),
    ("AvgPool3d", ((2, 1, 2),), dict(stride=1)), ("MaxUnpool2d", (2,), {}),
    ("MaxUnpool3d", ((2, 1, 2),), dict(padding=1)), ("MaxUnpool1d", (3,), dict(stride=2)),
    ("Upsample", (), dict(scale_factor=2, mode="bilinear")), ("Upsample", ((4, 5),), {}),
    ("UpsamplingNearest2d", (), dict(scale_factor=3)), ("CosineSimilarity", (), dict(dim=-1)),
    ("Unfold", ((2, 3),), dict(stride=2)), ("Fold", ((4, 5), 2), {}),
    ("GaussianNLLLoss", (), dict(full=True)), ("PoissonNLLLoss", (), dict(log_input=False)),
    ("MarginRankingLoss", (0.5,), {}), ("HingeEmbeddingLoss", (), dict(reduction="sum")),
]


def _build(nn, name, args, kwargs):
    if name == "Sequential":
        return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Tanh()))
    if name == "ModuleList":
        return nn.ModuleList([nn.Linear(2, 2) for _ in range(3)] + [nn.ReLU(), None][:1])
    if name == "ParameterList":
        lib = torch if nn is TN else ft
        return nn.ParameterList([nn.Parameter(lib.ones(2, 3)), nn.Parameter(lib.ones(1))])
    return getattr(nn, name)(*args, **kwargs)


@pytest.mark.parametrize("name,args,kwargs", REPRS, ids=[r[0] for r in REPRS])
def test_repr_is_torchs(name, args, kwargs):
    theirs = repr(_build(TN, name, args, kwargs))
    ours = repr(_build(FN, name, args, kwargs))
    if name == "ParameterList":          # torch CPU's parameters print no device;
        ours = ours.replace(" (cuda:0)", "")   # fpemu's live on its emulated GPU
    assert ours == theirs


def test_dtypes_print_as_torchs():
    for name in ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float64",
                 "int64", "bool", "uint8"):
        assert str(getattr(ft, name)) == str(getattr(torch, name)) == f"torch.{name}"
        assert repr(getattr(ft, name)) == repr(getattr(torch, name))
    assert "dtype=torch.bfloat16" in repr(ft.ones(2, dtype=ft.bfloat16))


# ------------------------------------------------------------------ numerics
@pytest.fixture(autouse=True)
def _cpu_profile(request):
    """The numerics tests compare with torch's CPU build: compute as it does
    (no TF32 convolutions, CPU scalar rules)."""
    if request.node.name.startswith(("test_repr", "test_every", "test_dtypes")):
        yield
        return
    with ft.use_profile(ft.Profile("cpu", "2.13.0")):
        yield


def _same_weights(mt, mf):
    st, sf = mt.state_dict(), mf.state_dict()
    assert list(st) == list(sf)
    for k in st:
        a, b = st[k].detach().numpy(), sf[k].detach().numpy()
        assert a.shape == b.shape and a.dtype == b.dtype, k
        # every initialisation these layers use is uniform (or constant):
        # torch's generator, torch's bits
        np.testing.assert_array_equal(np.atleast_1d(b).view(np.uint8),
                                      np.atleast_1d(a).view(np.uint8), err_msg=k)


def _inputs(shape, seed, scale=1.0, low=None):
    a = np.random.default_rng(seed).standard_normal(shape) * scale
    if low is not None:
        a = np.random.default_rng(seed).uniform(low, 1 - low, shape)
    a = a.astype(np.float32)
    return torch.tensor(a, requires_grad=True), ft.tensor(a, requires_grad=True)


def _close(a, b, rtol=1e-5, atol=1e-6, what=""):
    """Layers against torch CPU to float32 rounding, not bit for bit: its
    convolutions, matrix products and reductions add in the blocked / SIMD
    orders of oneDNN and MKL, fpemu in index order (the bit-exact tiers are
    pinned elsewhere: test_cpu_kernels, test_op_registry, the traces)."""
    np.testing.assert_allclose(np.asarray(b.detach().double().numpy()),
                               np.asarray(a.detach().double().numpy()), rtol=rtol, atol=atol,
                               err_msg=what)


LAYERS = [  # (name, args, kwargs, input shape, train mode)
    ("BatchNorm1d", (5,), {}, (8, 5), True), ("BatchNorm1d", (4,), {}, (6, 4, 3), True),
    ("BatchNorm2d", (3,), {}, (4, 3, 5, 5), True), ("BatchNorm2d", (3,), {}, (4, 3, 5, 5), False),
    ("BatchNorm2d", (3,), dict(momentum=None), (4, 3, 2, 2), True),
    ("BatchNorm2d", (3,), dict(affine=False, track_running_stats=False), (2, 3, 4, 4), True),
    ("GroupNorm", (2, 6), {}, (3, 6, 4, 4), True), ("InstanceNorm2d", (3,), dict(affine=True),
                                                    (2, 3, 5, 5), True),
    ("ConvTranspose2d", (3, 4, 3), {}, (2, 3, 5, 5), True),
    ("ConvTranspose2d", (4, 2, 4), dict(stride=2, padding=1), (2, 4, 4, 4), True),
    ("ConvTranspose2d", (4, 6, 3), dict(stride=2, padding=1, output_padding=1, groups=2,
                                        bias=False), (2, 4, 3, 5), True),
    ("ConvTranspose2d", (2, 2, 3), dict(dilation=2, stride=3, padding=2), (1, 2, 4, 4), True),
    ("Conv1d", (3, 5, 3), dict(padding=1, stride=2), (2, 3, 9), True),
    ("Conv3d", (2, 4, 3), dict(padding=1, stride=(1, 2, 1)), (2, 2, 4, 5, 4), True),
    ("Upsample", (), dict(scale_factor=2, mode="bilinear"), (2, 3, 4, 5), True),
    ("AdaptiveAvgPool3d", ((2, 3, 1),), {}, (2, 3, 5, 7, 4), True),
    ("MaxPool2d", (3,), dict(stride=2, padding=1, dilation=2, ceil_mode=True), (2, 3, 9, 8),
     True),
    ("MaxPool3d", (2,), dict(ceil_mode=True), (2, 3, 5, 4, 5), True),
    ("AvgPool3d", ((2, 3, 2),),
     dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False), (2, 3, 5, 6, 5), True),
    ("AvgPool2d", (3,), dict(stride=2, padding=1, ceil_mode=True, divisor_override=5),
     (2, 3, 8, 7), True),
    ("LeakyReLU", (0.2,), {}, (4, 7), True), ("ELU", (0.7,), {}, (4, 7), True),
    ("SELU", (), {}, (4, 7), True), ("CELU", (1.3,), {}, (4, 7), True),
    ("Mish", (), {}, (4, 7), True), ("Hardtanh", (-0.5, 0.8), {}, (4, 7), True),
    ("ReLU6", (), {}, (4, 7), True, 4.0), ("Hardswish", (), {}, (4, 7), True, 3.0),
    ("Hardsigmoid", (), {}, (4, 7), True, 3.0), ("LogSigmoid", (), {}, (4, 7), True),
    ("Softsign", (), {}, (4, 7), True), ("Tanhshrink", (), {}, (4, 7), True),
    ("Softplus", (2.0,), {}, (4, 7), True), ("GLU", (), {}, (4, 8), True),
    ("PReLU", (3,), {}, (2, 3, 4), True), ("Softmin", (), dict(dim=1), (3, 5), True),
    ("LogSoftmax", (), dict(dim=1), (3, 5), True), ("PixelShuffle", (2,), {}, (2, 8, 3, 3),
                                                    True),
    ("PixelUnshuffle", (2,), {}, (2, 2, 4, 6), True), ("MaxPool1d", (3,), dict(stride=2),
                                                       (2, 3, 9), True),
    ("AvgPool1d", (2,), {}, (2, 3, 8), True), ("AdaptiveAvgPool1d", (2,), {}, (2, 3, 8), True),
    ("Unflatten", (1, (2, 4)), {}, (3, 8), True),
]


@pytest.mark.parametrize("spec", LAYERS, ids=[f"{s[0]}-{i}" for i, s in enumerate(LAYERS)])
def test_layer_matches_torch(spec):
    name, args, kwargs, shape, train = spec[:5]
    scale = spec[5] if len(spec) > 5 else 1.0
    torch.manual_seed(3)
    mt = getattr(TN, name)(*args, **kwargs)
    ft.manual_seed(3)
    mf = getattr(FN, name)(*args, **kwargs)
    _same_weights(mt, mf)
    mt.train(train)
    mf.train(train)
    xt, xf = _inputs(shape, 7, scale)
    yt, yf = mt(xt), mf(xf)
    assert tuple(yf.shape) == tuple(yt.shape) and str(yf.dtype) == str(yt.dtype)
    _close(yt, yf, what="forward")
    g = np.random.default_rng(8).standard_normal(tuple(yt.shape)).astype(np.float32)
    (yt * torch.tensor(g)).sum().backward()
    (yf * ft.tensor(g)).sum().backward()
    _close(xt.grad, xf.grad, rtol=1e-4, atol=1e-5, what="input gradient")
    for (k, pt), (_, pf) in zip(mt.named_parameters(), mf.named_parameters()):
        _close(pt.grad, pf.grad, rtol=1e-4, atol=1e-5, what=f"gradient of {k}")
    for (k, bt), (_, bf) in zip(mt.named_buffers(), mf.named_buffers()):
        _close(bt, bf, what=f"buffer {k}")


def test_batchnorm_running_statistics_over_steps_and_eval():
    torch.manual_seed(0)
    mt = TN.BatchNorm2d(3, momentum=0.3)
    ft.manual_seed(0)
    mf = FN.BatchNorm2d(3, momentum=0.3)
    for step in range(4):
        xt, xf = _inputs((5, 3, 2, 3), step, scale=1 + step)
        mt(xt), mf(xf)
    for k in ("running_mean", "running_var"):
        _close(getattr(mt, k), getattr(mf, k), rtol=2e-7, atol=0, what=k)
    assert mf.num_batches_tracked.item() == 4 and str(mf.num_batches_tracked.dtype) == \
        "torch.int64"
    mt.eval(), mf.eval()
    xt, xf = _inputs((2, 3, 2, 2), 9)
    _close(mt(xt), mf(xf))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when "
                                         "training"):
        FN.BatchNorm1d(3)(ft.ones(1, 3))
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):
        FN.BatchNorm2d(3)(ft.ones(2, 3, 4))


@pytest.mark.parametrize("cls", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_match_torch_over_steps(cls):
    torch.manual_seed(1)
    ct = getattr(TN, cls)(3, 5)
    ft.manual_seed(1)
    cf = getattr(FN, cls)(3, 5)
    _same_weights(ct, cf)
    xt, xf = _inputs((4, 6, 3), 2)
    ht = hf = None
    outs_t, outs_f = [], []
    for t in range(6):
        ht = ct(xt[:, t], ht)
        hf = cf(xf[:, t], hf)
        outs_t.append(ht[0] if cls == "LSTMCell" else ht)
        outs_f.append(hf[0] if cls == "LSTMCell" else hf)
    lt = torch.stack(outs_t).pow(2).sum()
    lf = ft.stack(outs_f).pow(2).sum()
    _close(lt, lf)
    lt.backward()
    lf.backward()
    _close(xt.grad, xf.grad, rtol=1e-4, atol=1e-5)
    for (k, pt), (_, pf) in zip(ct.named_parameters(), cf.named_parameters()):
        _close(pt.grad, pf.grad, rtol=1e-4, atol=1e-5, what=k)
    # one unbatched step
    x1 = np.ones(3, np.float32)
    out_t, out_f = ct(torch.tensor(x1)), cf(ft.tensor(x1))
    for a, b in zip(out_t if cls == "LSTMCell" else [out_t],
                    out_f if cls == "LSTMCell" else [out_f]):
        _close(a, b)


def test_losses_with_weights_match_torch():
    TF, FF = torch.nn.functional, ft.nn.functional
    pt, pf = _inputs((4, 3), 1, low=0.02)
    yt, yf = _inputs((4, 3), 2, low=0.0)
    wt, wf = _inputs((3,), 3)
    cases = [
        (lambda p, y, w, F: F.binary_cross_entropy(p, (y > 0.5).float(),
                                                   weight=w.detach().abs())),
        (lambda p, y, w, F: F.binary_cross_entropy(p, y.detach(), reduction="sum")),
        (lambda p, y, w, F: F.binary_cross_entropy_with_logits(
            p * 4 - 2, y.detach(), weight=w.detach().abs(), pos_weight=w.detach().abs() + 0.5)),
        (lambda p, y, w, F: F.binary_cross_entropy_with_logits(p * 4 - 2, y, reduction="none")),
        (lambda p, y, w, F: F.kl_div(p.log(), y.detach().softmax(1), reduction="batchmean")),
        (lambda p, y, w, F: F.kl_div(p.log(), y.detach().log(), log_target=True,
                                     reduction="sum")),
    ]
    for i, case in enumerate(cases):
        for t in (pt, pf, yt, yf):
            t.grad = None
        lt, lf = case(pt, yt, wt, TF), case(pf, yf, wf, FF)
        _close(lt, lf, what=f"loss {i}")
        lt.sum().backward()
        lf.sum().backward()
        _close(pt.grad, pf.grad, rtol=1e-4, atol=1e-6, what=f"input gradient {i}")
        if yt.grad is not None:
            _close(yt.grad, yf.grad, rtol=1e-4, atol=1e-6, what=f"target gradient {i}")
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        FF.binary_cross_entropy(ft.tensor([1.5]), ft.tensor([1.0]))
    with pytest.raises(ValueError, match="Using a target size"):
        FN.BCELoss()(ft.ones(4, 1) * 0.5, ft.ones(4))


def test_pixel_shuffle_is_exact_and_invertible():
    x = ft.arange(2 * 8 * 3 * 3, dtype=ft.float32).reshape(2, 8, 3, 3)
    t = torch.arange(2 * 8 * 3 * 3, dtype=torch.float32).reshape(2, 8, 3, 3)
    np.testing.assert_array_equal(FN.PixelShuffle(2)(x).numpy(), TN.PixelShuffle(2)(t).numpy())
    np.testing.assert_array_equal(FN.PixelUnshuffle(2)(FN.PixelShuffle(2)(x)).numpy(),
                                  x.numpy())


def test_dropout2d_zeroes_whole_channels():
    ft.manual_seed(0)
    x = ft.ones(64, 16, 3, 3)
    y = FN.Dropout2d(0.25)(x).numpy()
    per_channel = y.reshape(64, 16, 9)
    assert np.all((per_channel == 0).all(-1) | (per_channel == np.float32(1 / 0.75)).all(-1))
    dropped = (per_channel == 0).all(-1).mean()
    assert 0.2 < dropped < 0.3                          # 1024 channels, p = 0.25
    np.testing.assert_array_equal(FN.Dropout2d(0.25).eval()(x).numpy(), x.numpy())


# -------------------------------------------------------------- packed sequences
def test_pack_and_pad_match_torch():
    from torch.nn.utils import rnn as trnn
    from fpemu.autograd.nn.utils import rnn as frnn
    lengths = [3, 5, 2, 5, 1]
    xt, xf = _inputs((5, 5, 2), 4)
    for sorted_ in (False, True):
        lens = sorted(lengths, reverse=True) if sorted_ else lengths
        pt = trnn.pack_padded_sequence(xt, lens, batch_first=True, enforce_sorted=sorted_)
        pf = frnn.pack_padded_sequence(xf, lens, batch_first=True, enforce_sorted=sorted_)
        np.testing.assert_array_equal(pf.data.detach().numpy(), pt.data.detach().numpy())
        np.testing.assert_array_equal(pf.batch_sizes.numpy(), pt.batch_sizes.numpy())
        for a, b in ((pt.sorted_indices, pf.sorted_indices),
                     (pt.unsorted_indices, pf.unsorted_indices)):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_array_equal(b.numpy(), a.numpy())
        out_t, len_t = trnn.pad_packed_sequence(pt, batch_first=True, total_length=6)
        out_f, len_f = frnn.pad_packed_sequence(pf, batch_first=True, total_length=6)
        np.testing.assert_array_equal(out_f.detach().numpy(), out_t.detach().numpy())
        np.testing.assert_array_equal(len_f.numpy(), len_t.numpy())
    seqs = [np.arange(n * 2, dtype=np.float32).reshape(n, 2) for n in lengths]
    for side in ("right", "left"):
        a = trnn.pad_sequence([torch.tensor(s) for s in seqs], padding_value=-1.0,
                              padding_side=side)
        b = frnn.pad_sequence([ft.tensor(s) for s in seqs], padding_value=-1.0,
                              padding_side=side)
        np.testing.assert_array_equal(b.numpy(), a.numpy())
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        frnn.pack_padded_sequence(xf, lengths, batch_first=True)


@pytest.mark.parametrize("cls,bidir", [("LSTM", True), ("GRU", False), ("RNN", True)])
def test_recurrent_layers_on_packed_input_match_torch(cls, bidir):
    from torch.nn.utils import rnn as trnn
    from fpemu.autograd.nn.utils import rnn as frnn
    torch.manual_seed(2)
    mt = getattr(TN, cls)(3, 4, num_layers=2, bidirectional=bidir)
    ft.manual_seed(2)
    mf = getattr(FN, cls)(3, 4, num_layers=2, bidirectional=bidir)
    _same_weights(mt, mf)
    lengths = [4, 6, 2, 6, 3]
    xt, xf = _inputs((6, 5, 3), 5)
    ot, ht = mt(trnn.pack_padded_sequence(xt, lengths, enforce_sorted=False))
    of, hf = mf(frnn.pack_padded_sequence(xf, lengths, enforce_sorted=False))
    _close(ot.data, of.data, what="packed output")
    for a, b in zip(ht if cls == "LSTM" else [ht], hf if cls == "LSTM" else [hf]):
        _close(a, b, what="final states")
    pad_t, _ = trnn.pad_packed_sequence(ot)
    pad_f, _ = frnn.pad_packed_sequence(of)
    lt = pad_t.pow(2).sum() + (ht[0] if cls == "LSTM" else ht).sum()
    lf = pad_f.pow(2).sum() + (hf[0] if cls == "LSTM" else hf).sum()
    lt.backward()
    lf.backward()
    _close(xt.grad, xf.grad, rtol=1e-4, atol=1e-5)
    for (k, pt), (_, pf) in zip(mt.named_parameters(), mf.named_parameters()):
        _close(pt.grad, pf.grad, rtol=1e-4, atol=1e-5, what=k)


def test_clip_grad_norm_foreach_and_nonfinite():
    torch.manual_seed(0)
    mt = TN.Sequential(TN.Linear(4, 5), TN.Linear(5, 2))
    ft.manual_seed(0)
    mf = FN.Sequential(FN.Linear(4, 5), FN.Linear(5, 2))
    xt, xf = _inputs((3, 4), 1, scale=10.0)
    mt(xt).sum().backward()
    mf(xf).sum().backward()
    for foreach in (None, True, False):
        nt = TN.utils.clip_grad_norm_(mt.parameters(), 1.0, foreach=foreach)
        nf = FN.utils.clip_grad_norm_(mf.parameters(), 1.0, foreach=foreach)
        _close(nt, nf, rtol=2e-7, atol=0)
    for pt, pf in zip(mt.parameters(), mf.parameters()):
        _close(pt.grad, pf.grad, rtol=1e-6, atol=1e-7)
    p = FN.Parameter(ft.ones(2))
    p.grad = ft.tensor([float("inf"), 1.0])
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        FN.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    with pytest.warns(UserWarning, match="empty generator"):
        FN.utils.clip_grad_norm_((q for q in []), 1.0)


def test_rnnbase_with_a_mode_is_that_layer():
    """RNNBase(mode, ...) builds the mode's parameters and cell (the same
    numbers as the subclass from the same seed); an unknown mode is refused
    with torch's message."""
    import fpemu.autograd as fta
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    for mode, cls, kw in (("LSTM", fta.nn.LSTM, {}), ("GRU", fta.nn.GRU, {}),
                          ("RNN_RELU", fta.nn.RNN, {"nonlinearity": "relu"})):
        fta.manual_seed(0)
        a = fta.nn.RNNBase(mode, 3, 4)
        fta.manual_seed(0)
        b = cls(3, 4, **kw)
        np.testing.assert_array_equal(a(fta.tensor(x))[0].detach().numpy(),
                                      b(fta.tensor(x))[0].detach().numpy())
    with pytest.raises(ValueError, match="Unrecognized RNN mode: XX"):
        fta.nn.RNNBase("XX", 3, 4)


def test_feature_dropout_takes_every_rank_torch_takes():
    """torch 2.13 warns and goes on where dropout2d / dropout3d get other
    ranks (pytorch/examples' mnist_rnn feeds Dropout2d a 2D tensor): dropout2d
    reads (N, C, ...) (2D: one draw per element; 3D: (N, C, L), channels of
    L), dropout3d reads a non-5D input as one sample (whole slices of its
    first dim). The mask shapes are torch's; the draws are fpemu's."""
    ft.manual_seed(1)
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout2d"):
        y = FN.Dropout2d(0.5)(ft.ones(64, 32)).numpy()
    assert set(np.unique(y)) == {0.0, 2.0}
    rows = (y == 0).all(1) | (y == 2).all(1)
    assert not rows.all()                      # not whole rows: elements, as torch's
    with pytest.warns(UserWarning, match="assuming that channel-wise 1D dropout"):
        y = FN.Dropout2d(0.5)(ft.ones(8, 16, 5)).numpy()
    assert ((y == 0).all(-1) | (y == 2).all(-1)).all() and 0 < (y == 0).mean() < 1
    with pytest.warns(UserWarning, match="Received a 3-D input to dropout3d"):
        y = FN.Dropout3d(0.5)(ft.ones(40, 4, 2)).numpy()
    per_slice = y.reshape(40, -1)
    assert ((per_slice == 0).all(1) | (per_slice == 2).all(1)).all()
    assert 0 < (per_slice == 0).all(1).mean() < 1
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received "
                                           "a 4D input"):
        FN.Dropout1d(0.5)(ft.ones(2, 3, 4, 5))
    with pytest.raises(RuntimeError, match="at least 2 dimensions"), \
            pytest.warns(UserWarning, match="Received a 1-D input to dropout2d"):
        FN.Dropout2d(0.5)(ft.ones(5))
    # the torch module itself, on the same shapes, warns alike
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout2d"):
        torch.nn.Dropout2d(0.5)(torch.ones(64, 32))
