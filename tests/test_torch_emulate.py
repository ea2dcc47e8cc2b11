"""fpemu.torch.emulate: a real torch model trained under an fpemu recipe.

Oracles: fpemu.autograd's own fp8 recipes (NumPy, fpemu's kernels) for the
quantized operands of every GEMM, compared bit for bit; the exact product of
those operands (float64) for the device GEMM, within float32 accumulation's
bound; real DDP and FSDP2 (gloo, two spawned processes) for composition.
"""

import copy
import gc
import io
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fpemu  # noqa: E402
import fpemu.autograd as ft  # noqa: E402
import fpemu.torch  # noqa: E402
from fpemu.autograd import fp8  # noqa: E402
from fpemu.autograd import nn as fnn  # noqa: E402
from fpemu.errors import FpemuTypeError, FpemuValueError  # noqa: E402
from fpemu.torch import _emulate  # noqa: E402

ROLES = ("input", "weight", "grad_output", "weight_t", "grad_output_t", "input_t")

RECIPES = {
    "delayed": fp8.DelayedScaling,
    "current": lambda: fp8.Float8CurrentScaling(power_2_scale=True),
    "current-e4m3": lambda: fp8.Float8CurrentScaling(fp8_format=fp8.Format.E4M3),
    "fp8-block": fp8.Float8BlockScaling,
    "mxfp8": fp8.MXFP8BlockScaling,
    "mxfp8-floor-2d": lambda: fp8.MXFP8BlockScaling(scale_rule="floor", block_2d_weights=True),
    "mxfp8-nearest": lambda: fp8.MXFP8BlockScaling(scale_rule="nearest"),
    "nvfp4": fp8.NVFP4BlockScaling,
    "nvfp4-4over6": lambda: fp8.NVFP4BlockScaling(scale_rule="4over6", seed=3),
}


def _data(shape_w, rows, seed=0):
    rng = np.random.default_rng(seed)
    W = (rng.standard_normal(shape_w) * 0.1).astype(np.float32)
    b = rng.standard_normal(shape_w[0]).astype(np.float32)
    # three steps whose inputs and output gradients move by decades (delayed
    # scaling's history then matters), with one planted large value
    xs = [(rng.standard_normal((rows, shape_w[1])) * 10.0**k).astype(np.float32)
          for k in (0, 1, -2)]
    xs[1][3, 5] = 3e4
    gs = [(rng.standard_normal((rows, shape_w[0])) * 10.0**k).astype(np.float32)
          for k in (-3, 0, 2)]
    return W, b, xs, gs


def _host(recipe, W, b, xs, gs):
    """Every operand fpemu.autograd's recipe quantizes, by role, in order, and
    the layer's outputs and gradients, for loss = sum(y * g) (so that the
    output gradient is g exactly)."""
    seen = {}
    quantize, transpose = recipe.quantize, recipe.transpose

    def q(X, fmt, role, state=None):
        r = quantize(X, fmt, role, state)
        seen.setdefault(role, []).append(r)
        return r

    def t(X, qq, fmt, role, state=None):
        r = transpose(X, qq, fmt, role, state)
        if not seen.get(role + "_t") or seen[role + "_t"][-1] is not r:
            seen.setdefault(role + "_t", []).append(r)
        return r
    recipe.quantize, recipe.transpose = q, t
    layer = fnn.Linear(W.shape[1], W.shape[0])
    layer.weight = fnn.Parameter(ft.tensor(W))
    layer.bias = fnn.Parameter(ft.tensor(b))
    outs = []
    for x, g in zip(xs, gs):
        xt = ft.tensor(x, requires_grad=True)
        with fp8.fp8_autocast(fp8_recipe=recipe):
            y = layer(xt)
        (y * ft.tensor(g)).sum().backward()
        outs.append((y.detach().numpy(), xt.grad.numpy(), layer.weight.grad.numpy()))
        layer.weight.grad = layer.bias.grad = None
    return seen, outs


def _device(recipe, W, b, xs, gs, **kw):
    lin = torch.nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(W))
        lin.bias.copy_(torch.from_numpy(b))
    seen, outs = {}, []
    with fpemu.torch.emulate(lin, recipe, keep_operands=True, **kw) as emu:
        for x, g in zip(xs, gs):
            xt = torch.from_numpy(x).requires_grad_()
            y = lin(xt)
            (y * torch.from_numpy(g)).sum().backward()
            for role, q in emu.operands("").items():
                seen.setdefault(role, []).append(q)
            outs.append((y.detach().numpy(), xt.grad.numpy(), lin.weight.grad.numpy()))
            lin.weight.grad = lin.bias.grad = None
    assert "forward" not in lin.__dict__, "the layer's own forward is back"
    return seen, outs


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_operand_of_three_steps_is_the_host_recipes_bit_for_bit(name):
    """Codes and scales of the six operands (fprop: input, weight; dgrad:
    grad_output, weight transposed; wgrad: grad_output and input transposed)
    of three forward/backward steps, one of them 40 wide (a tail shorter than
    a 32- or 128-block)."""
    for shape in ((48, 64), (24, 40)):
        W, b, xs, gs = _data(shape, 32, seed=shape[1])
        want, _ = _host(RECIPES[name](), W, b, xs, gs)
        got, _ = _device(RECIPES[name](), W, b, xs, gs)
        assert sorted(got) == sorted(want) == sorted(ROLES)
        for role in ROLES:
            assert len(got[role]) == len(want[role]) == 3
            for step, (a, c) in enumerate(zip(want[role], got[role])):
                h = c.numpy()
                what = (name, shape, role, step)
                assert h.codes.dtype == a.codes.dtype and h.scales.dtype == a.scales.dtype, what
                np.testing.assert_array_equal(h.codes, a.codes, err_msg=str(what))
                np.testing.assert_array_equal(h.scales, a.scales, err_msg=str(what))
                assert (h.block, h.axis) == (a.block, a.axis), what
                if a.tensor_amax is not None:
                    assert np.float32(h.tensor_amax) == np.float32(a.tensor_amax), what


def test_the_hadamard_transform_on_the_device_is_the_hosts_exact_one():
    """Runs of 16 whose values span up to 2**60 (the float64 product is then
    inexact and the run goes to the host), float32 subnormals, zeros, inf and
    NaN: every output bit equals fpemu.block.hadamard's."""
    from fpemu import block
    rng = np.random.default_rng(12)
    X = (rng.standard_normal((64, 64)) * np.exp2(rng.integers(-30, 30, (64, 64)))).astype(
        np.float32)
    X[:8] *= np.float32(2.0**-120)                     # float32 subnormals among normals
    X[8, :16] = 0
    X[9, 3], X[10, 17], X[11, 40] = np.inf, np.nan, -np.inf
    X[12, :16] = np.float32(2.0**-149) * np.arange(16)
    X[13, :16] = [1.0, 2.0**-26] * 8                   # a spread of 26: to the host
    X[14, :16] = [1.0, 2.0**-25] * 8                   # 25: exact on the device
    sent = []
    real = block.hadamard

    def host(runs, *a, **k):
        sent.append(runs.copy())
        return real(runs, *a, **k)

    block.hadamard = host
    try:
        got = _emulate.hadamard(torch.from_numpy(X)).numpy()
    finally:
        block.hadamard = real
    want = block.hadamard(X, 16, axis=1, signs="te")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # the runs sent to the host: those with inf or NaN, or whose nonzero values'
    # binades (a float32 subnormal's taken as -126) span more than 25
    runs = X.reshape(-1, 16)
    hard = []
    for r in runs:
        nz = np.abs(r[r != 0]).astype(np.float64)
        if not np.isfinite(r).all():
            hard.append(True)
            continue
        e = np.maximum(np.frexp(nz)[1] - 1, -126) if nz.size else np.zeros(1)
        hard.append(e.max() - e.min() > 25)
    hard = np.array(hard)
    assert hard[13 * 4] and not hard[14 * 4] and not hard[8 * 4] and not hard[12 * 4]
    assert 0 < hard.sum() < len(hard)
    np.testing.assert_array_equal(np.concatenate(sent).view(np.uint32),
                                  runs[hard].view(np.uint32))


def _exact_gemm(qa, qb):
    """The exact a @ b.T of two host operands, and the sum of the magnitudes
    of its products (float64; both exact to 2**-50 relative)."""
    A, B = qa.values, qb.values
    return A @ B.T, np.abs(A) @ np.abs(B).T


@pytest.mark.parametrize("name", ["current", "fp8-block", "mxfp8", "nvfp4"])
def test_the_device_gemm_is_within_float32_accumulations_bound_of_the_exact_product(name):
    """Any order of float32 accumulation of K exact products errs by at most
    K u sum|a_k b_k| (u = 2**-24; Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., §3.1); the per-block scales (fp8-block: K/128 blocks)
    and NVFP4's alpha each add a rounding of at most u times the result's
    magnitude, counted in the 3 + 3 * blocks term."""
    rng = np.random.default_rng(4)
    X = (rng.standard_normal((32, 384)) * np.exp2(rng.integers(-8, 8, (32, 1)))).astype(
        np.float32)
    W = (rng.standard_normal((40, 384)) * 0.05).astype(np.float32)
    recipe = RECIPES[name]()
    fmt = recipe.formats()[0]
    qa = _emulate.quantize_operand(recipe, torch.from_numpy(X), fmt, "input")
    qb = _emulate.quantize_operand(recipe, torch.from_numpy(W), fmt, "weight")
    got = _emulate.gemm(recipe, qa, qb).numpy().astype(np.float64)
    exact, mag = _exact_gemm(qa.numpy(), qb.numpy())
    if qa.tensor_amax is not None:           # NVFP4: values carry the tensor scales already
        pass
    K, nk = X.shape[1], -(-X.shape[1] // 128)
    bound = (K + 3 + 3 * nk) * 2.0**-24 * mag
    err = np.abs(got - exact)
    assert np.all(err <= bound), (name, float(np.max(err / np.maximum(bound, 1e-300))))
    assert np.any(got != 0)
    # the host recipe's own GEMM (a tensor-core model) is a different summation of the
    # same products: within the same bound plus the model's truncation
    host = recipe.gemm(qa.numpy(), qb.numpy(), recipe.split_accumulator[0]).astype(np.float64)
    assert np.max(np.abs(host - exact) / np.maximum(mag, 1e-300)) < 2.0**-8


def test_the_layers_outputs_and_gradients_follow_the_host_layer():
    """Forward, input and weight gradients of the emulated torch layer
    against fpemu.autograd's fp8 layer: the same operands (above), GEMMs
    summed in another order, so within a relative 1e-3 for fp8 (the host
    models H100's fp8 truncation) and 1e-6 for MX and NVFP4."""
    W, b, xs, gs = _data((48, 64), 32, seed=9)
    for name, tol in (("current", 1e-3), ("mxfp8", 1e-6), ("nvfp4", 1e-6)):
        _, want = _host(RECIPES[name](), W, b, xs, gs)
        _, got = _device(RECIPES[name](), W, b, xs, gs)
        for a, c in zip(want, got):
            for h, d in zip(a, c):
                assert np.max(np.abs(h - d)) <= tol * np.max(np.abs(h)), name


def test_accumulation_runs_the_host_model_and_gives_the_host_layers_bits():
    W, b, xs, gs = _data((24, 64), 32, seed=10)
    _, want = _host(fp8.MXFP8BlockScaling(), W, b, xs, gs)
    _, got = _device(fp8.MXFP8BlockScaling(), W, b, xs, gs, accumulation="b200-mxf8f6f4")
    for a, c in zip(want, got):
        np.testing.assert_array_equal(c[0], a[0])      # y: host GEMM, bias added in fp32
        np.testing.assert_array_equal(c[2], a[2])      # weight gradient


def _mlp(seed=0, widths=(64, 96, 96, 10)):
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1])


def _train(model, recipe, steps=30, seed=1, **kw):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(64, 64, generator=g)
    T = torch.randn(64, 10, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    ctx = fpemu.torch.emulate(model, recipe, **kw) if recipe else None
    try:
        for _ in range(steps):
            opt.zero_grad()
            loss = ((model(X) - T) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        if ctx is not None:
            ctx.stop()
    return losses


def test_an_mlp_trains_under_every_recipe_and_the_gemm_sees_nvfp4_weights():
    base = _train(_mlp(), None)
    for name in ("delayed", "current", "fp8-block", "mxfp8", "nvfp4", "bf16", "fp16"):
        losses = _train(_mlp(), name)
        assert losses[-1] < 0.8 * losses[0], name
        assert abs(losses[-1] - base[-1]) < 0.5 * base[0], name
    model = _mlp()
    x = torch.randn(16, 64)
    with fpemu.torch.emulate(model, fp8.NVFP4BlockScaling(), keep_operands=True) as emu:
        model(x).square().mean().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
        q = emu.operands("0")["weight"]
    assert emu.layers == ["0", "2", "4"]
    assert q.elem.name == "e2m1" and q.scale_fmt.name == "e4m3fn" and q.block == (16, 16)
    vals = q.values.numpy()
    grid = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}
    scales = fpemu.decode(q.numpy().scales, "e4m3fn").astype(np.float64)
    elems = vals / np.repeat(np.repeat(scales, 16, 0), 16, 1)[:vals.shape[0], :vals.shape[1]]
    elems /= np.float64(q.tensor_scale)
    assert set(np.unique(np.abs(elems[np.isfinite(elems)]))) <= grid


def test_gemm_rounding_rounds_operands_and_outputs_once():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((8, 40)).astype(np.float32)
    lin = torch.nn.Linear(40, 12)
    with fpemu.torch.emulate(lin, "bf16"):
        y = lin(torch.from_numpy(X)).detach().numpy()
    Xq = fpemu.quantize(X, "bf16").astype(np.float64)
    Wq = fpemu.quantize(lin.weight.detach().numpy(), "bf16").astype(np.float64)
    exact = Xq @ Wq.T + lin.bias.detach().numpy()
    assert np.array_equal(fpemu.quantize(y, "bf16"), y), "outputs are bf16 values"
    # float32 accumulation then one rounding: the nearest bf16 of exact, or its neighbour
    ulp = fpemu.ulp(exact, "bf16").astype(np.float64)
    assert np.all(np.abs(y - exact) <= ulp)
    assert np.mean(y == fpemu.quantize(exact, "bf16")) > 0.95


def test_state_dict_round_trip_continues_delayed_scaling_and_nvfp4s_draws():
    """A second emulation loaded with the first's state quantizes the next
    step as the first does; one that was not loaded does not (delayed
    scales still 1, NVFP4's stochastic draws from call 1)."""
    for recipe in (fp8.DelayedScaling(amax_history_len=4), fp8.NVFP4BlockScaling()):
        x = torch.randn(16, 64)
        a = _mlp(2)
        ea = fpemu.torch.emulate(a, copy.deepcopy(recipe), keep_operands=True)
        for _ in range(2):
            a(x * 3).sum().backward()
        sd = ea.state_dict()
        runs = []
        for load in (True, False):
            b = _mlp(2)
            b.load_state_dict(a.state_dict())
            eb = fpemu.torch.emulate(b, copy.deepcopy(recipe), keep_operands=True)
            if load:
                eb.load_state_dict(sd)
            b(x).sum().backward()
            runs.append(eb)
            eb.stop()
        a.zero_grad()
        a(x).sum().backward()
        ea.stop()
        for eb, same in zip(runs, (True, False)):
            equal = []
            for name in ea.layers:
                assert sorted(ea.operands(name)) == sorted(eb.operands(name))
                for role, qa in ea.operands(name).items():
                    qb = eb.operands(name)[role]
                    equal.append(torch.equal(qa.codes, qb.codes)
                                 and torch.equal(qa.scales, qb.scales))
            assert all(equal) if same else not all(equal), (type(recipe).__name__, same)
        if isinstance(recipe, fp8.DelayedScaling):
            assert sd["layers"]["0"]["input"]["amax_history"].shape == (4,)
        else:
            assert sd["calls"] == 2 * (5 + 6 + 6)   # per step: no dgrad for the first layer
    with pytest.raises(FpemuValueError, match="state is of a DelayedScaling recipe"):
        with fpemu.torch.emulate(_mlp(), "mxfp8") as e:
            e.load_state_dict({"recipe": "DelayedScaling", "layers": {}})


def test_it_composes_with_autocast_grad_scaler_and_compile():
    # autocast: the layer's output in the autocast dtype, its GEMMs still the recipe's
    model = _mlp(3)
    x = torch.randn(16, 64)
    with fpemu.torch.emulate(model, "mxfp8", keep_operands=True) as emu:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        assert y.dtype == torch.bfloat16
        y.float().square().mean().backward()
        assert all(p.grad is not None and p.grad.dtype == torch.float32
                   for p in model.parameters())
        assert emu.operands("0")["input"].scale_fmt.name == "e8m0"
    # GradScaler: the scaled loss's gradients unscaled by the optimizer step
    model = _mlp(4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with fpemu.torch.emulate(model, "current"):
        scaler.scale(model(x).square().mean()).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 2.0**10
    # torch.compile: the compiled model gives the eager emulation's bits
    m1, m2 = _mlp(5), _mlp(5)
    with fpemu.torch.emulate(m1, "nvfp4"), fpemu.torch.emulate(m2, "nvfp4"):
        eager = m1(x)
        compiled = torch.compile(m2)(x)
        eager.sum().backward()
        compiled.sum().backward()
    assert torch.equal(eager, compiled)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_the_emulation_keeps_no_model_alive():
    """An emulated model is freed by reference counting alone (no cycle through
    it: a DDP model kept to the interpreter's end takes its process group
    along), and the emulation works while only the model holds it."""
    x = torch.randn(8, 64)
    gc.disable()
    try:
        model = _mlp(4)
        emu = fpemu.torch.emulate(model, "mxfp8")
        model(x).sum().backward()
        assert emu.model is model
        ref = weakref.ref(model)
        del model
        assert ref() is None and emu.model is None
        emu.stop()                                   # nothing left to restore: no error
        # the returned object dropped at once: the model still runs emulated
        kept, dropped = _mlp(5), _mlp(5)
        fpemu.torch.emulate(dropped, "nvfp4")
        with fpemu.torch.emulate(kept, "nvfp4"):
            want = kept(x)
        assert torch.equal(dropped(x), want) and not torch.equal(kept(x), want)
        # a deep copy (an EMA model, say) runs emulated on its own weights
        twin = copy.deepcopy(dropped)
        with torch.no_grad():
            for p in twin.parameters():
                p.mul_(2)
        assert twin[0].forward.ref() is twin[0] and not torch.equal(twin(x), want)
        ref2 = _mlp(5)
        with torch.no_grad():
            for p, q in zip(ref2.parameters(), twin.parameters()):
                p.copy_(q)
        with fpemu.torch.emulate(ref2, "nvfp4"):
            assert torch.equal(twin(x), ref2(x))
        # and a saved whole model loads emulated, with its own recipe state
        buf = io.BytesIO()
        torch.save(twin, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        assert back[0].forward.ref() is back[0] and torch.equal(back(x), twin(x))
    finally:
        gc.enable()


def test_an_emulated_linear_returns_no_view():
    """Like nn.Linear's: FSDP2 warns of a module whose output is a view."""
    model, other = _mlp(6), _mlp(6)
    with fpemu.torch.emulate(model, "nvfp4"), fpemu.torch.emulate(other, "bf16"):
        for x in (torch.randn(16, 64), torch.randn(2, 16, 64)):
            for m in (model, other):
                out = m(x)
                assert not out._is_view() and out.shape == (*x.shape[:-1], 10)


def _spawn_cfg(**kw):
    cfg = {"seed": 7, "widths": [32, 48, 16], "batch": 16, "dtype": "float32",
           "iterations": 1, "bucket_cap_mb": 25, "hook": None}
    cfg.update(kw)
    return cfg


def _local(cfg, world, recipe):
    """Each rank's emulated gradients, computed here in one process."""
    from fpemu.reference import _gloo
    out = []
    for rank in range(world):
        model = _gloo._mlp(torch, cfg)
        x, y = _gloo._batch(torch, cfg, 0, rank)
        with fpemu.torch.emulate(model, recipe):
            ((model(x).float() - y) ** 2).mean().backward()
        out.append([p.grad.numpy().copy() for p in model.parameters()])
    return out


def test_ddp_over_gloo_averages_each_ranks_emulated_gradients():
    """Two processes, DDP, every Linear under MXFP8: each rank's local
    gradients are this process's emulation of its batch, bit for bit, and
    DDP's are their average (each divided by 2, then summed: exact)."""
    from fpemu.reference import _gloo
    cfg = _spawn_cfg(emulate="mxfp8")
    res = _gloo.run_ddp(cfg, 2, timeout=120)
    local = _local(cfg, 2, "mxfp8")
    for i in range(len(local[0])):
        for r in range(2):
            np.testing.assert_array_equal(res[f"local.0.{i}"][r], local[r][i])
            want = (local[0][i] / np.float32(2)) + (local[1][i] / np.float32(2))
            np.testing.assert_array_equal(res[f"reduced.0.{i}"][r], want)


@pytest.mark.parametrize("recipe", ["nvfp4", "current"])
def test_fsdp2_over_gloo_reduces_each_ranks_emulated_gradients(recipe):
    """Two processes, fully_shard, every Linear under NVFP4 (RHT, stochastic
    rounding of the gradients, a tensor scale) or per-tensor current scaling:
    the whole gradients gathered are the sum of this process's emulated
    per-rank gradients of the unsharded model, divided by 2. The per-tensor
    amaxes are the whole weights' (FSDP2 gathers a weight before the emulated
    layer quantizes it): a shard's amax would change the bits."""
    from fpemu.reference import _gloo
    cfg = _spawn_cfg(emulate=recipe, param_dtype="float32", reduce_dtype="float32")
    res = _gloo.run_fsdp(cfg, 2, timeout=120)
    local = _local(cfg, 2, recipe)
    for i in range(len(local[0])):
        want = (local[0][i] + local[1][i]) / np.float32(2)
        for r in range(2):
            np.testing.assert_array_equal(res[f"reduced.{i}"][r], want)


def test_bad_input_names_what_was_expected_and_the_fix():
    with pytest.raises(FpemuValueError, match="no nn.Linear to emulate.*Conv1d"):
        fpemu.torch.emulate(torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3)), "nvfp4")
    with pytest.raises(FpemuTypeError, match="torch.nn.Module"):
        fpemu.torch.emulate(ft.nn.Linear(2, 2), "nvfp4")
    with pytest.raises(FpemuValueError, match="unknown recipe 'fp4'.*nvfp4"):
        fpemu.torch.emulate(_mlp(), "fp4")
    with pytest.raises(FpemuTypeError, match="recipe must be one of"):
        fpemu.torch.emulate(_mlp(), 3)
    with pytest.raises(FpemuValueError, match="accumulation"):
        fpemu.torch.emulate(_mlp(), "nvfp4", accumulation="h100-fast")
    m = _mlp()
    with fpemu.torch.emulate(m, "nvfp4"):
        with pytest.raises(FpemuValueError, match="already has its own forward"):
            fpemu.torch.emulate(m, "mxfp8")
        # NVFP4's Hadamard transform needs the token count to be a multiple of 16
        with pytest.raises(ValueError, match="multiple of 16.*disable_rht=True"):
            m(torch.randn(10, 64)).sum().backward()
    with fpemu.torch.emulate(m, fp8.NVFP4BlockScaling(disable_rht=True)):
        m(torch.randn(10, 64)).sum().backward()          # padded blocks, as TE pads them
    # high-precision modules are left alone; a model left with none is refused
    first = m[0]
    e = fpemu.torch.emulate(m, fp8.MXFP8BlockScaling(high_precision_modules=(first,)))
    assert e.layers == ["2", "4"]
    e.stop()
    with pytest.raises(FpemuValueError, match="high_precision_modules"):
        fpemu.torch.emulate(first, fp8.MXFP8BlockScaling(high_precision_modules=(first,)))


EMULATED_SCRIPT = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.Adam(model.parameters(), lr=float(sys.argv[1]))
x, t = torch.randn(16, 32), torch.randn(16, 8)
for step in range(3):
    opt.zero_grad()
    loss = ((model(x) - t) ** 2).mean()
    loss.backward()
    opt.step()
    print("loss", loss.item(), "emulated", "forward" in model[0].__dict__)
"""


def test_cli_runs_an_unchanged_script_under_a_recipe(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(EMULATED_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "emulate", "--recipe", "nvfp4",
                           str(script), "0.01"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith("loss")]
    assert len(lines) == 3 and all(ln[3] == "True" for ln in lines)
    assert "2 nn.Linear layers ran under NVFP4BlockScaling" in proc.stderr


def test_cli_reports_scripts_that_fail_exit_or_have_no_model(tmp_path, capsys):
    from fpemu import cli
    cases = {"raises.py": EMULATED_SCRIPT + "\nraise RuntimeError('diverged')\n",
             "exits.py": EMULATED_SCRIPT + "\nsys.exit(3)\n",
             "none.py": "print('no model here')\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert cli.main(["emulate", "--recipe", "mxfp8", str(tmp_path / "raises.py"), "0.1"]) == 1
    assert "the script raised RuntimeError: diverged" in capsys.readouterr().err
    assert cli.main(["emulate", "--recipe", "bf16", str(tmp_path / "exits.py"), "0.1"]) == 3
    assert cli.main(["emulate", str(tmp_path / "none.py")]) == 2
    assert "created no optimizer" in capsys.readouterr().err
    assert cli.main(["emulate", "--recipe", "fp4", str(tmp_path / "exits.py")]) == 2
    assert "--recipe expects one of delayed, current" in capsys.readouterr().err


def test_cli_shows_a_script_that_fails_before_its_optimizer(tmp_path, capsys):
    """As ``python X.py`` would: the script's own error and status, not "created
    no optimizer"; a bad --accumulation is refused before the script runs."""
    from fpemu import cli
    cases = {"raises.py": "import torch\nraise ValueError('bad config')\n",
             "syntax.py": "def f(:\n",
             "imports.py": "import no_such_module_here\n",
             "exits.py": "import sys\nsys.exit(3)\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert cli.main(["emulate", str(tmp_path / "raises.py")]) == 1
    err = capsys.readouterr().err
    assert "ValueError: bad config" in err and "before it created an optimizer" in err
    assert "created no optimizer" not in err
    assert cli.main(["emulate", str(tmp_path / "syntax.py")]) == 1
    assert "SyntaxError" in capsys.readouterr().err
    assert cli.main(["emulate", str(tmp_path / "imports.py")]) == 1
    assert "no_such_module_here" in capsys.readouterr().err
    assert cli.main(["emulate", str(tmp_path / "exits.py")]) == 3
    assert "exited with status 3 before it created an optimizer" in capsys.readouterr().err
    script = tmp_path / "train.py"
    script.write_text(EMULATED_SCRIPT)
    assert cli.main(["emulate", "--accumulation", "bogus", str(script), "0.1"]) == 2
    out, err = capsys.readouterr()
    assert "names a model of fpemu.accumulate" in err and "'bogus'" in err
    assert "loss" not in out                       # refused before the script ran


RANKS_SCRIPT = '''
import argparse
import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--recipe", default=None, help="emulate inside the script (else the CLI does)")
ap.add_argument("--save", default=None)
ap.add_argument("--save-after", type=int, default=2)
ap.add_argument("--load", default=None)
args = ap.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
emu = None
if args.recipe:
    import fpemu.torch
    emu = fpemu.torch.emulate(model, args.recipe)
start = 0
if args.load:
    ck = torch.load(f"{args.load}/rank{rank}.pt")
    model.module.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    emu.load_state_dict(ck["emu"])
    start = ck["step"]
for step in range(start, args.steps):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item().hex()} emulated "
          f"{'forward' in model.module[0].__dict__}", flush=True)
    if args.save and step + 1 == args.save_after:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "emu": emu.state_dict(), "step": step + 1}, f"{args.save}/rank{rank}.pt")
dist.destroy_process_group()
'''


def _losses(out):
    """{(rank, step): (loss as float.hex, emulated)} of the job's lines (the
    ranks share torchrun's stdout: a line's newline can land after another's)."""
    import re
    return {(int(r), int(s)): (h, e) for r, s, h, e in re.findall(
        r"rank (\d+) step (\d+) loss (-?0x[0-9a-f.]+p[+-]\d+) emulated (True|False)", out)}


def test_delayed_scaling_state_saves_and_resumes_per_rank_under_torchrun(tmp_path):
    """Two DDP ranks under ``torchrun``, every Linear under delayed scaling
    (each rank's amax histories its own): a job saved after two steps (the
    model, Adam and ``emu.state_dict()`` per rank) and resumed in a new job
    takes the third step bit for bit as the uninterrupted job on each rank."""
    from torchrun_jobs import torchrun
    script = tmp_path / "train.py"
    script.write_text(RANKS_SCRIPT)
    (tmp_path / "ck").mkdir()
    whole = _losses(torchrun(2, [str(script), "--recipe", "delayed", "--save", "ck"],
                             tmp_path))
    assert len(whole) == 6 and all(e == "True" for _, e in whole.values())
    assert whole[(0, 2)] != whole[(1, 2)]                  # the ranks' own batches
    states = [torch.load(tmp_path / "ck" / f"rank{r}.pt")["emu"] for r in (0, 1)]
    assert set(states[0]["layers"]) == {"0", "2"}          # the model's names, not DDP's
    h = [s["layers"]["0"]["input"]["amax_history"] for s in states]
    assert not torch.equal(h[0], h[1])                     # a state per rank
    resumed = _losses(torchrun(2, [str(script), "--recipe", "delayed", "--load", "ck"],
                               tmp_path))
    assert set(resumed) == {(0, 2), (1, 2)}
    for key, got in resumed.items():
        assert got == whole[key], key


def test_fpemu_emulate_under_torchrun_emulates_each_ranks_model(tmp_path):
    """``torchrun --no-python fpemu emulate --recipe mxfp8 train.py``, 2 DDP
    ranks: each rank's model runs emulated, rank 0's first loss is this
    process's emulation of its batch, bit for bit, and every rank exits (rank
    0 once hung at exit freeing the script's DDP model: see
    ``test_a_scripts_objects_live_until_the_next_script``)."""
    from torchrun_jobs import fpemu_cli, torchrun
    script = tmp_path / "train.py"
    script.write_text(RANKS_SCRIPT)
    got = _losses(torchrun(2, ["--no-python", *fpemu_cli(), "emulate", "--recipe", "mxfp8",
                               str(script), "--steps", "1"], tmp_path))
    assert set(got) == {(0, 0), (1, 0)} and all(e == "True" for _, e in got.values())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 8))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    with fpemu.torch.emulate(model, "mxfp8"):
        loss = ((model(x) - y) ** 2).mean()
    assert got[(0, 0)][0] == loss.item().hex()


def test_a_scripts_objects_live_until_the_next_script(tmp_path, monkeypatch):
    """``fpemu emulate`` and ``fpemu monitor`` keep a script's globals after it
    returns, exits or raises, as ``python script.py`` keeps them until the
    interpreter exits: freeing a DDP model right after the script deadlocked
    torch 2.13 (its Reducer joins gloo's worker threads holding the GIL while
    a worker waits for the GIL). The next script's run frees them."""
    import gc

    from fpemu.torch._monitor import run_hooked
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "holder.py").write_text("refs = []\n")
    body = ("import sys, weakref, holder\nclass Box:\n    pass\nbox = Box()\n"
            "holder.refs.append(weakref.ref(box))\n")
    endings = {"returns": "", "exits": "sys.exit(3)\n", "raises": "raise ValueError('x')\n"}
    import holder
    for i, (name, ending) in enumerate(endings.items()):
        script = tmp_path / f"{name}.py"
        script.write_text(body + ending)
        error, code = run_hooked(str(script), [], lambda m, o: None, lambda: True)
        assert (code, type(error).__name__) == {
            "returns": (None, "NoneType"), "exits": (3, "NoneType"),
            "raises": (None, "ValueError")}[name]
        del error
        gc.collect()
        assert holder.refs[i]() is not None, f"the script that {name} lost its objects"
        if i:
            assert holder.refs[i - 1]() is None, "the previous script's objects were kept"
