"""FP8 recipes, observers, and a plain PyTorch training loop run on fpemu."""

import numpy as np
import pytest

import fpemu
import fpemu.autograd as ft
from fpemu.autograd import fp8, nn

FLT_MAX = np.float32(np.finfo(np.float32).max)


def test_delayed_scaling_update_rule():
    r = fp8.DelayedScaling(amax_history_len=4, margin=1)
    st = fp8.DelayedState.new(r, 448.0)
    st.record(2.0)
    st.update()                                   # scale = 448 * 2**-1 / 2
    assert st.scale == np.float32(112.0) and st.scale_inv == np.float32(1 / 112)
    assert st.history.tolist() == [0, 0, 0, 2.0]  # slot 0 zeroed, newest at the end
    st.record(1.0)
    st.update()                                   # max over the window keeps 2.0
    assert st.scale == np.float32(112.0) and st.history.tolist() == [0, 0, 2.0, 1.0]
    for bad in (0.0, np.inf, np.nan):             # keep the old scale (history all <= 2)
        s2 = fp8.DelayedState.new(fp8.DelayedScaling(amax_history_len=1), 448.0)
        s2.scale = np.float32(7.0)
        s2.record(bad)
        s2.update()
        assert s2.scale == np.float32(7.0), bad
    tiny = fp8.DelayedState.new(fp8.DelayedScaling(amax_history_len=1), 448.0)
    tiny.record(1e-45)
    tiny.update()
    assert tiny.scale == FLT_MAX                  # inf scale -> FLT_MAX
    recent = fp8.DelayedState.new(fp8.DelayedScaling(amax_history_len=3,
                                                     amax_compute_algo="most_recent"), 448.0)
    for a in (8.0, 1.0):
        recent.record(a)
        recent.update()
    assert recent.scale == np.float32(448.0)      # the most recent amax, 1.0
    with pytest.raises(ValueError, match="Pure E5M2"):
        fp8.DelayedScaling(fp8_format=fp8.Format.E5M2)


def test_current_scaling_helper():
    assert fp8.scale_from_amax(2.0, 448.0) == np.float32(224.0)
    assert fp8.scale_from_amax(3.0, 448.0, power_2_scale=True) == np.float32(128.0)
    for bad in (0.0, np.inf, np.nan):
        assert fp8.scale_from_amax(bad, 448.0) == 1.0
    assert fp8.scale_from_amax(1e-45, 448.0) == FLT_MAX
    assert fp8.scale_from_amax(1e-9, 448.0, epsilon=1e-3) == np.float32(448.0 / np.float32(1e-3))


def test_mx_scale_conventions():
    e4 = fpemu.e4m3fn
    amax = np.array([448.0, 449.0, 500.0, 700.0, 1.0])
    down = fp8.mx_scale_exponent(amax, e4, "down")    # floor(log2 amax) - 8
    up = fp8.mx_scale_exponent(amax, e4, "up")        # ceil(log2(amax / 448))
    near = fp8.mx_scale_exponent(amax, e4, "nearest")  # nearest power of two to amax / 448
    assert down.tolist() == [0, 0, 0, 1, -8]
    assert up.tolist() == [0, 1, 1, 1, -8]
    assert near.tolist() == [0, 0, 0, 1, -9]
    # with "down", 500 / 2**0 saturates to 448; "up" never saturates
    x = np.full((1, 32), 1.0)
    x[0, 0] = 500.0
    q = fp8.quantize_operand(x, e4, fp8.MXFP8BlockScaling(scale_rule="floor"), "input")
    assert q.values[0, 0] == 448.0
    q = fp8.quantize_operand(x, e4, fp8.MXFP8BlockScaling(), "input")
    assert q.values[0, 0] == 512.0 and q.scale_values[0, 0] == 2.0
    q = fp8.quantize_operand(x, e4, fp8.MXFP8BlockScaling(scale_rule="nearest"), "input")
    assert q.scale_values[0, 0] == 1.0 and q.values[0, 0] == 448.0    # 500/448 -> 2**0


def test_block_scaling_blocks_and_power_of_two_scales():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 300)).astype(np.float32)
    x[1, 130] = 1000.0
    bq = fp8.quantize_operand(x, fpemu.e4m3fn, fp8.Float8BlockScaling(), "input")
    q, sinv = fpemu.decode(bq.codes, "e4m3fn"), bq.scale_values
    assert bq.block == 128 and sinv.shape == (3, 3)
    assert np.all(np.log2(sinv) == np.round(np.log2(sinv)))        # powers of two
    assert sinv[1, 1] > sinv[1, 0]                                 # the big value's block only
    w = rng.standard_normal((130, 130)).astype(np.float32)
    sw = fp8.quantize_operand(w, fpemu.e4m3fn, fp8.Float8BlockScaling(), "weight").scale_values
    assert np.all(sw[:128, 0] == sw[0, 0])                         # 128x128 tiles
    deq = q * np.repeat(sinv, 128, axis=1)[:, :300]
    rel = np.abs(deq - x) / np.maximum(np.abs(x), 0.05)
    rel[1, 128:256] = 0                   # the block of the 1000: small values lose bits
    assert np.max(rel) <= 2.0**-4         # E4M3's half-ulp, every other block


@pytest.mark.parametrize("recipe", [fp8.DelayedScaling(), fp8.Float8CurrentScaling(),
                                    fp8.Float8BlockScaling(), fp8.MXFP8BlockScaling()])
def test_fp8_linear_forward_backward(recipe):
    ft.manual_seed(1)
    layer = nn.Linear(64, 16)
    x = ft.randn(8, 64, requires_grad=True)
    ref = nn.functional.linear(x, layer.weight, layer.bias)
    with fp8.fp8_autocast(fp8_recipe=recipe):
        y = layer(x)
        y = layer(x) if isinstance(recipe, fp8.DelayedScaling) else y   # scales now set
    assert y.dtype is ft.float32
    yr = ref.detach().numpy()
    rel = np.abs(y.detach().numpy() - yr).max() / np.abs(yr).max()
    assert 0 < rel < 0.1
    y.sum().backward()
    assert layer.weight.grad.shape == (16, 64) and x.grad.shape == (8, 64)
    assert np.all(np.isfinite(layer.weight.grad.numpy()))
    # every GEMM operand was fp8: the weight gradient is a sum of products of fp8 values
    g_ref = np.ones((8, 16), np.float32).T @ x.detach().numpy()
    assert np.abs(layer.weight.grad.numpy() - g_ref).max() / np.abs(g_ref).max() < 0.1


def test_fp8_gemm_is_the_manual_per_tensor_computation():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((4, 40)).astype(np.float32)
    W = rng.standard_normal((5, 40)).astype(np.float32)
    recipe = fp8.Float8CurrentScaling()
    bx = fp8.quantize_operand(X, fpemu.e4m3fn, recipe, "input")
    bw = fp8.quantize_operand(W, fpemu.e4m3fn, recipe, "weight")
    qx, sx = fpemu.decode(bx.codes, "e4m3fn"), bx.scale_values.astype(np.float32)
    qw, sw = fpemu.decode(bw.codes, "e4m3fn"), bw.scale_values.astype(np.float32)
    sxs = np.float32(448) / np.float32(np.abs(X).max())
    np.testing.assert_array_equal(qx, fpemu.quantize(X * sxs, "e4m3fn", overflow="saturate"))
    got = fp8.scaled_gemm(qx, sx, qw, sw, bx.block, fpemu.e4m3fn, fpemu.e4m3fn, "h100-fp8",
                          False)
    np.testing.assert_array_equal(recipe.gemm(bx, bw, False), got)
    acc = fpemu.accumulate.matmul(qx, qw.T, "e4m3fn", model="h100-fp8")
    np.testing.assert_array_equal(got, acc * (sx[0, 0] * sw[0, 0]).astype(np.float32))


def test_observer_counts_underflow():
    ft.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = ft.optim.Adam(model.parameters())
    obs = ft.Observer(model, opt, fmt="fp16", scale=1e-6)
    x = ft.randn(16, 8)
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(x), ft.tensor([0, 1] * 8))
        opt.zero_grad()
        loss.backward()
        opt.step()
        obs.step()
    kinds = {r.kind for r in obs.records}
    assert kinds == set(ft.Observer.KINDS)
    acts = obs.select("activation", name="0", step=1)[0]
    assert acts.counts.total == 16 * 8
    ref = fpemu.stats(model[0](x).detach().numpy(), "fp16", scale=1e-6)
    assert ref.counts["subnormal"] + ref.counts["flushed"] > 0
    grads = obs.select("activation_grad", step=0)
    assert {r.name for r in grads} == {"0", "1", "2"}
    states = {r.name for r in obs.select("optimizer_state", step=1)}
    assert "0.weight.exp_avg_sq" in states
    assert obs.total("weight_grad", step=0).total == 8 * 8 + 8 + 2 * 8 + 2
    obs.remove()
    before = len(obs.records)
    model(x)
    assert len(obs.records) == before


PLAIN_LOOP = '''
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(64, 20)
y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
losses = []
for step in range(30):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
'''


def test_plain_pytorch_loop_runs_with_the_import_changed():
    scope = {"torch": ft}
    exec(PLAIN_LOOP, scope)
    losses = scope["losses"]
    assert losses[-1] < 0.5 * losses[0]
    assert scope["logits"].dtype is ft.bfloat16 and scope["loss"].dtype is ft.float32


def test_tiny_transformer_trains_under_bf16_autocast():
    ft.manual_seed(0)
    model = nn.TinyTransformer(vocab=11, d_model=16, n_heads=2, n_layers=1, max_len=8)
    opt = ft.optim.AdamW(model.parameters(), lr=3e-3)
    seq = ft.tensor(np.tile(np.arange(8) % 11, (4, 1)))
    losses = []
    for _ in range(15):
        with ft.autocast("cuda", dtype=ft.bfloat16):
            logits = model(seq[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, 11), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    sd = model.state_dict()
    other = nn.TinyTransformer(vocab=11, d_model=16, n_heads=2, n_layers=1, max_len=8)
    other.load_state_dict(sd)
    np.testing.assert_array_equal(other.head.weight.detach().numpy(),
                                  model.head.weight.detach().numpy())
    model.eval()
    assert not model.blocks[0].attn.drop.training
