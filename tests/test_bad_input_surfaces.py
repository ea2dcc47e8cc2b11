"""Bad input on the newer surfaces: block formats, the monitor, the lessons'
helpers and the CLI's file commands.

Each case either gives the right result (checked against an independent
computation: the same values in another container, the padded array, the
mirrored input) or one clear error naming what was expected and the fix.
No case may mutate its input, print a traceback, or leave a numpy warning.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import tracemalloc
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fpemu
from fpemu import block, cli, lessons
from fpemu.errors import FpemuError

torch = pytest.importorskip("torch")

PRESETS = sorted(block.PRESETS)
F32MAX = np.float32(np.finfo(np.float32).max)
#: The presets of one level: a small-float scale (a rule of kind "fp4") with no
#: tensor scale above it, so that their top is the element maximum times the
#: scale format's (nvfp4-cudnn: 6 * 448); the other presets reach float32's.
ONE_LEVEL_TOP = {name: fpemu.format(p.elem).max * fpemu.format(p.scale_fmt).max
                 for name, p in block.PRESETS.items()
                 if block.SCALE_RULES[p.scale_rule].kind == "fp4"
                 and p.scale_rule not in block.TENSOR_SCALE_RULES}


def sample(shape=(4, 64), seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float32)


def one_line(err):
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def same(q, r):
    np.testing.assert_array_equal(q.codes, r.codes)
    np.testing.assert_array_equal(q.scales, r.scales)


# ------------------------------------------------------------- block: inputs
#: (case, input, the float32 array it must quantize exactly like)
EQUIVALENT = [
    ("list", lambda x: x.tolist(), lambda x: x),
    ("tuple-rows", lambda x: tuple(map(tuple, x.tolist())), lambda x: x),
    ("float16", lambda x: x.astype(np.float16), lambda x: x.astype(np.float16).astype(np.float32)),
    ("float64-exact", lambda x: x.astype(np.float64), lambda x: x),
    ("bf16-torch", lambda x: torch.tensor(x).bfloat16(),
     lambda x: torch.tensor(x).bfloat16().float().numpy()),
    ("f32-torch", lambda x: torch.tensor(x), lambda x: x),
    # (integers have no -0: the reference goes through the integer too)
    ("int64", lambda x: np.round(x * 8).astype(np.int64),
     lambda x: np.round(x * 8).astype(np.int64).astype(np.float32)),
    ("int8", lambda x: np.clip(np.round(x * 8), -128, 127).astype(np.int8),
     lambda x: np.clip(np.round(x * 8), -128, 127).astype(np.int8).astype(np.float32)),
    ("fortran", np.asfortranarray, lambda x: x),
    ("strided", lambda x: np.repeat(x, 2, axis=1)[:, ::2], lambda x: x),
    ("read-only", lambda x: _read_only(x), lambda x: x),
]


def _read_only(x):
    y = x.copy()
    y.setflags(write=False)
    return y


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("case,make,ref", EQUIVALENT, ids=[c[0] for c in EQUIVALENT])
def test_block_inputs_in_any_container_quantize_as_their_float32_values(preset, case, make, ref):
    x = sample((32, 64))
    given_x = make(x)
    before = np.array(given_x, copy=True) if not torch.is_tensor(given_x) else given_x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q = block.quantize_blocks(given_x, preset)
    same(q, block.quantize_blocks(ref(x), preset))
    if torch.is_tensor(given_x):
        assert torch.equal(before, given_x)
    else:
        np.testing.assert_array_equal(np.asarray(given_x), before)


@pytest.mark.parametrize("preset", PRESETS)
def test_block_tails_shorter_than_a_block_are_zero_padded(preset):
    """A length that is not a multiple of the block quantizes as the
    zero-padded array, cropped (both 1-D blocks and 2-D tiles)."""
    x = sample((150, 200), 1)
    spec = block.PRESETS[preset]
    by = spec.block if isinstance(spec.block, tuple) else (1, spec.block)
    pad = np.zeros((-(-150 // by[0]) * by[0], -(-200 // by[1]) * by[1]), np.float32)
    pad[:150, :200] = x
    q, p = block.quantize_blocks(x, preset), block.quantize_blocks(pad, preset)
    np.testing.assert_array_equal(q.codes, p.codes[:150, :200])
    np.testing.assert_array_equal(q.scales, p.scales)
    np.testing.assert_array_equal(q.values, p.values[:150, :200])


@pytest.mark.parametrize("preset", [p for p in PRESETS
                                    if not isinstance(block.PRESETS[p].block, tuple)])
def test_block_axis_negative_or_positive_and_out_of_range(preset):
    x = sample((3, 40, 48), 2)
    same(block.quantize_blocks(x, preset, axis=-2), block.quantize_blocks(x, preset, axis=1))
    moved = block.quantize_blocks(np.moveaxis(x, 1, -1), preset)
    np.testing.assert_array_equal(block.quantize_blocks(x, preset, axis=1).codes,
                                  np.moveaxis(moved.codes, -1, 1))
    for bad in (3, -4):
        with pytest.raises(ValueError, match=rf"axis {bad} is out of range for shape "
                                             r"\(3, 40, 48\) \(use -3 \.\. 2\)") as e:
            block.quantize_blocks(x, preset, axis=bad)
        one_line(e.value)
    with pytest.raises(TypeError, match="axis must be an int, got 1.5"):
        block.quantize_blocks(x, preset, axis=1.5)


@pytest.mark.parametrize("preset", PRESETS)
def test_block_special_tensors(preset):
    spec = block.PRESETS[preset]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # all zeros: every value 0
        z = block.quantize_blocks(np.zeros((32, 64), np.float32), preset)
        assert (z.values == 0).all() or preset == "nvfp4-torchao"
        # the largest float32 values, both signs: finite, at the format's top, signs kept
        big = np.full((32, 64), F32MAX, np.float32)
        big[1::2] *= -1
        v = block.quantize_blocks(big, preset).values
        # (the values may exceed FLT_MAX a little: a rounded-up scale times the
        # element maximum, e.g. 256 * 2**120 under rceil: exact, in float64)
        assert np.isfinite(v).all() and (np.sign(v) == np.sign(big)).all()
        assert (np.abs(v) == np.abs(v).flat[0]).all()
        assert np.abs(v).flat[0] == ONE_LEVEL_TOP[preset] if preset in ONE_LEVEL_TOP else \
            np.abs(v).flat[0] >= F32MAX / 2
        # a NaN: its block (and only its block) is NaN, or its element is the NaN
        x = sample((32, 64), 3)
        x[5, 7] = np.nan
        v = block.quantize_blocks(x, preset).values
        assert np.isnan(v[5, 7])
        by = spec.block if isinstance(spec.block, tuple) else (1, spec.block)
        far = np.ones(v.shape, bool)
        far[(5 // by[0]) * by[0]:(5 // by[0] + 1) * by[0], (7 // by[1]) * by[1]:
            (7 // by[1] + 1) * by[1]] = False
        if spec.scale_rule not in block.TENSOR_SCALE_RULES:
            assert not np.isnan(v[far]).any()
        # an infinity: never a silent number where the rule says NaN, never a crash
        y = sample((32, 64), 4)
        y[2, 9] = -np.inf
        w = block.quantize_blocks(y, preset).values
        assert np.isnan(w[2, 9]) or w[2, 9] < 0


def test_block_zero_d_and_empty():
    for preset in PRESETS:
        with pytest.raises(ValueError, match="needs an array with at least one axis, got a 0-d "
                                             r"value; pass np.atleast_1d\(x\)") as e:
            block.quantize_blocks(np.float32(1.5), preset)
        one_line(e.value)
        q = block.quantize_blocks(np.zeros((0, 64), np.float32), preset)
        assert q.codes.shape == (0, 64) and q.values.shape == (0, 64)


@pytest.mark.parametrize("x,match", [
    (np.array([[1 + 2j] * 32]), "complex"),
    (np.array([["1.0"] * 32]), "dtype <U3"),
    (np.array([[1.0, None] * 16], dtype=object), "Python object"),
    (np.full((2, 32), 0.1), r"not float32 values \(the first: 0.1\).*fpemu.quantize\(x, 'fp32'\)"),
])
def test_block_refuses_what_is_not_float32(x, match):
    for fn in (lambda a: block.quantize_blocks(a, "mxfp8"), lambda a: block.error_table(a)):
        with pytest.raises((TypeError, ValueError), match=match) as e:
            fn(x)
        one_line(e.value)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(elem="mxfp9"), ValueError, "unknown format 'mxfp9'"),
    (dict(scale_rule="round"), ValueError, "unknown scale_rule 'round'; choose one of floor"),
    (dict(scale_rule="nvfp4"), ValueError, "scale_rule 'nvfp4' needs a small float scale"),
    (dict(block=0), ValueError, "block must be >= 1, got 0"),
    (dict(block=-32), ValueError, "block must be >= 1, got -32"),
    (dict(block=2.5), TypeError, "block must be an int"),
    (dict(block=True), TypeError, "block must be an int"),
    (dict(block=(16,)), TypeError, r"or a pair \(rows, cols\)"),
    (dict(block=2**40), ValueError, r"block=1099511627776 is far longer than the array .* "
                                    "Pass a block no longer than the blocked axis"),
    (dict(block=(2**20, 2**20)), ValueError, "is far longer than the array"),
    (dict(rounding="sr8"), ValueError, r"rounding='sr8' needs seed="),
    (dict(rounding="sr40", seed=1), ValueError, "'srN' takes N in 1..32"),
    (dict(rounding="up"), ValueError, "unknown rounding mode 'up'"),
    (dict(inf_block="clip"), ValueError, "inf_block must be one of 'saturate', 'nan'"),
    (dict(elem="nvfp4-torchao", tensor_amax=-1.0), ValueError,
     r"tensor_amax is an absolute maximum and cannot be negative, got -1.0; pass abs\(x\).max"),
    (dict(elem="nvfp4", tensor_amax=[1.0, 2.0]), ValueError, "tensor_amax must be one real"),
    (dict(elem="nvfp4", tensor_amax="3"), ValueError, "tensor_amax must be one real"),
    (dict(elem="mxfp8", tensor_amax=3.0), ValueError, "scale_rule 'floor' has no tensor scale: "
                                                      "drop tensor_amax"),
])
def test_block_bad_arguments_are_named(kwargs, exc, match):
    kw = {"elem": "mxfp8", **kwargs}
    x = sample((4, 64))
    before = x.copy()
    with pytest.raises(exc, match=match) as e:
        block.quantize_blocks(x, **kw)
    one_line(e.value)
    assert isinstance(e.value, FpemuError)
    np.testing.assert_array_equal(x, before)


def test_block_tensor_amax_accepts_numbers_of_any_kind():
    x = sample((4, 64))
    want = block.quantize_blocks(x, "nvfp4", tensor_amax=8.0)
    for t in (8, np.float64(8), np.array([8.0], np.float32), torch.tensor(8.0)):
        same(block.quantize_blocks(x, "nvfp4", tensor_amax=t), want)


def test_dequantize_blocks_checks_what_it_is_given():
    x = sample((32, 64), 5)
    q = block.quantize_blocks(x, "mxfp8")
    kw = dict(elem="e4m3fn", scale_fmt="e8m0", block=32)
    np.testing.assert_array_equal(block.dequantize_blocks(q.codes, q.scales, **kw), q.values)
    np.testing.assert_array_equal(block.dequantize_blocks(q.codes, q.scales, axis=-1, **kw),
                                  q.values)
    cases = [
        (dict(scales=q.scales[:, :1]), ValueError,
         r"codes of shape \(32, 64\) in blocks of 32 along axis 1 need scales of shape "
         r"\(32, 2\), got \(32, 1\)"),
        (dict(scales=q.scales.T), ValueError, r"need scales of shape \(32, 2\), got \(2, 32\)"),
        (dict(axis=2), ValueError, r"axis 2 is out of range for shape \(32, 64\)"),
        (dict(axis=-3), ValueError, "axis -3 is out of range"),
        (dict(codes=np.uint8(3), scales=np.uint8(127)), ValueError,
         "codes must have at least one axis"),
        (dict(codes=q.codes.astype(np.float32)), TypeError, "codes must be integer codes"),
        (dict(tensor_scale="x"), ValueError, "tensor_scale must be one real number"),
        (dict(scales=None), ValueError, "pass a BlockQuantized, or codes with scales="),
    ]
    for over, exc, match in cases:
        args = {"codes": q.codes, "scales": q.scales, **kw, **over}
        codes = args.pop("codes")
        with pytest.raises(exc, match=match) as e:
            block.dequantize_blocks(codes, **args)
        one_line(e.value)
    with pytest.raises(ValueError, match="2-D tiles"):
        block.dequantize_blocks(np.zeros(16, np.uint8), np.zeros(1, np.uint8), elem="e2m1",
                                scale_fmt="e4m3fn", block=(16, 16))


def test_error_table_names_an_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'mxfp3'; choose from mxfp8"):
        block.error_table(sample(), ["mxfp3"])


# ------------------------------------------------------- block: invariants
finite32 = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 70)),
                      elements=st.floats(-2.0**100, 2.0**100, width=32, allow_subnormal=False))


#: A planted value that makes the NVFP4 tensor scale exactly 1 (448 * 6 / amax,
#: 256 * 6 for 4over6), so that dequantized values are float32 numbers.
UNIT_TENSOR_SCALE = {"nvfp4": 2688.0, "nvfp4-2d": 2688.0, "nvfp4-torchao": 2688.0,
                     "nvfp4-4over6": 1536.0}


def test_every_preset_with_a_tensor_scale_has_its_planted_amax():
    missing = [name for name, p in block.PRESETS.items()
               if p.scale_rule in block.TENSOR_SCALE_RULES and name not in UNIT_TENSOR_SCALE]
    assert not missing, (f"add the amax that makes the tensor scale of {missing} exactly 1 to "
                         "UNIT_TENSOR_SCALE in tests/test_bad_input_surfaces.py")


small32 = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 70)),
                     elements=st.floats(-1000, 1000, width=32, allow_subnormal=False))


@settings(max_examples=40, deadline=None)
@given(x=finite32, small=small32, preset=st.sampled_from(PRESETS))
def test_quantizing_the_dequantized_values_again_changes_nothing(x, small, preset):
    """Idempotence, every preset. Power-of-two scales give float32 values
    outright; the NVFP4 presets get a planted amax that makes their tensor
    scale 1 (otherwise the values carry the fp32 tensor scale's 24 bits
    and are not float32 numbers)."""
    if isinstance(block.PRESETS[preset].block, tuple) and x.ndim < 2:
        return
    if preset in UNIT_TENSOR_SCALE:
        x = small.copy()
        x.flat[0] = UNIT_TENSOR_SCALE[preset]
    q = block.quantize_blocks(x, preset)
    v = q.values
    v32 = v.astype(np.float32)
    assert (v32.astype(np.float64) == v).all()
    np.testing.assert_array_equal(block.quantize_blocks(v32, preset).values, v)


@settings(max_examples=60, deadline=None)
@given(x=finite32, preset=st.sampled_from(PRESETS))
def test_nearest_rules_are_sign_symmetric(x, preset):
    """-x gives the same scales and the element codes with the sign bit flipped."""
    if isinstance(block.PRESETS[preset].block, tuple) and x.ndim < 2:
        return
    q, m = block.quantize_blocks(x, preset), block.quantize_blocks(-x, preset)
    np.testing.assert_array_equal(q.scales, m.scales)
    sign = 1 << (q.elem.bits - 1)
    np.testing.assert_array_equal(m.codes, q.codes ^ sign)
    np.testing.assert_array_equal(m.values, -q.values)


@settings(max_examples=80, deadline=None)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 70)),
                    elements=st.one_of(st.just(0.0),
                                       st.floats(2.0**-60, 2.0**60, width=32).flatmap(
                                           lambda a: st.sampled_from([a, -a])))),
       k=st.integers(-40, 40), elem=st.sampled_from(["mxfp8", "mxfp8-e5m2", "mxfp6-e2m3",
                                                     "mxfp6-e3m2", "mxfp4"]))
def test_mx_floor_commutes_with_power_of_two_scaling(x, k, elem):
    """Inside the range (no float32 subnormal, no scale clamped at 2**-127 or
    2**127) multiplying by 2**k scales the dequantized values by 2**k."""
    assume(np.any(x != 0))
    y = np.ldexp(x, k).astype(np.float32)
    a = block.quantize_blocks(x, elem)
    b = block.quantize_blocks(y, elem)
    nz = a.scales != 0          # an all-zero block keeps the smallest scale either way
    assert (b.scales.astype(int)[nz] == a.scales.astype(int)[nz] + k).all()
    np.testing.assert_array_equal(b.values, np.ldexp(a.values, k))


# ------------------------------------------------------------ block: load
def test_block_peak_memory_is_at_most_three_times_the_input():
    """2**22 values here (the closing note measures 2**26): numpy's
    allocations are traced; fpemu's kernels write into numpy arrays."""
    x = sample((4096, 1024), 6)
    for preset in PRESETS:
        block.quantize_blocks(x[:32], preset)
        tracemalloc.start()
        try:
            q = block.quantize_blocks(x, preset)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        del q
        assert peak <= 3 * x.nbytes, f"{preset}: peak {peak / x.nbytes:.2f}x the input"


def test_block_threads_give_the_serial_result():
    xs = [sample((64, 256), s) for s in range(8)]
    jobs = [(xs[i], PRESETS[i % len(PRESETS)]) for i in range(8)] * 2
    serial = [block.quantize_blocks(x, p) for x, p in jobs]
    start = threading.Barrier(8)

    def run(job):
        start.wait(timeout=60)
        return block.quantize_blocks(*job)
    with ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(run, jobs[:8])) + list(pool.map(run, jobs[8:]))
    for s, p in zip(serial, parallel):
        same(s, p)


def _child(conn, x):
    q = block.quantize_blocks(x, "nvfp4")
    conn.send((q.codes, q.scales))
    conn.close()


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_block_works_in_a_process_forked_after_a_call():
    import multiprocessing as mp
    x = sample((64, 256), 9)
    want = block.quantize_blocks(x, "nvfp4")
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    with warnings.catch_warnings():    # Python warns about fork with threads alive
        warnings.simplefilter("ignore", DeprecationWarning)
        proc = ctx.Process(target=_child, args=(child, x))
        proc.start()
    try:
        assert parent.poll(120), "the forked process did not answer in 120 s"
        codes, scales = parent.recv()
        proc.join(30)
        assert proc.exitcode == 0
    finally:                            # never leave a child behind
        if proc.is_alive():
            proc.kill()
            proc.join(10)
        parent.close()
    np.testing.assert_array_equal(codes, want.codes)
    np.testing.assert_array_equal(scales, want.scales)


# -------------------------------------------------------------- monitor
import fpemu.torch as ft  # noqa: E402


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 2)).to(dtype)


def step(model, opt=True, backward=True, x=None, **kw):
    params = list(model.parameters())
    o = torch.optim.SGD(params, lr=0.1) if opt and params else None
    dtype = params[0].dtype if params else torch.float32
    with ft.monitor(model, o, formats=("fp16", "e4m3fn"), **kw) as mon:
        out = model(torch.ones(3, 4, dtype=dtype) if x is None else x)
        if backward:
            out.float().sum().backward()
        if o:
            o.step()
    return mon


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(formats=("fp17",)), ValueError, "unknown format 'fp17'; valid names are"),
    (dict(formats=()), ValueError, "formats is empty"),
    (dict(every=0), ValueError, "every must be an int >= 1, got 0"),
    (dict(every=True), ValueError, "every must be an int >= 1, got True"),
    (dict(sample=-1), ValueError, "sample must be None or an int >= 1, got -1"),
    (dict(sample=2.5), ValueError, "sample must be None or an int >= 1, got 2.5"),
    (dict(scaling="mxfp"), ValueError, "unknown scaling 'mxfp'; choose from"),
])
def test_monitor_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match) as e:
        ft.monitor(mlp(), **kwargs)
    one_line(e.value)


def test_monitor_models_without_parameters_optimizer_or_backward():
    assert {r["kind"] for r in step(torch.nn.ReLU(), backward=False).rows()} == {"activation"}
    kinds = {r["kind"] for r in step(mlp(), opt=False).rows()}
    assert {"activation", "activation_grad", "weight", "weight_grad"} <= kinds
    assert "exp_avg" not in kinds
    assert {r["kind"] for r in step(mlp(), backward=False).rows()} == {"activation"}


def test_monitor_a_forward_that_raises_removes_its_hooks():
    class Raises(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Raises())
    with pytest.raises(RuntimeError, match="boom"):
        step(model, backward=False)
    assert all(not m._forward_hooks for m in model.modules())
    assert all(not p._backward_hooks for p in model.parameters())


def test_monitor_counts_nan_outputs_as_nan():
    mon = step(mlp(), x=torch.full((3, 4), float("nan")), backward=False)
    act = [r for r in mon.rows() if r["kind"] == "activation" and r["format"] == "fp16"]
    assert act and all(r["nan"] == r["numel"] for r in act)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_monitor_half_and_bf16_models(dtype):
    rows = step(mlp(dtype)).rows()
    w = [r for r in rows if r["kind"] == "weight" and r["module"] == "0.weight"
         and r["format"] == "fp16"]
    assert w and w[0]["numel"] == 32


def test_monitor_meta_device_warns_once_and_counts_nothing():
    model = mlp().to("meta")
    with pytest.warns(UserWarning, match="on the meta device") as rec:
        mon = step(model, opt=False, backward=False, x=torch.ones(3, 4, device="meta"))
    assert len(rec) == 1 and mon.rows() == []


def test_monitor_dict_outputs_and_a_module_called_twice():
    class DictOut(torch.nn.Module):          # a leaf with its own parameter
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 2))

        def forward(self, x):
            return {"a": x @ self.w, "b": [x @ self.w * 2], "note": "text"}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.d = DictOut()
            self.twice = torch.nn.Linear(2, 2)

        def forward(self, x):
            out = self.d(x)
            return self.twice(self.twice(out["a"] + out["b"][0]))
    torch.manual_seed(0)
    rows = step(Model(), backward=False).rows()
    acts = [r for r in rows if r["kind"] == "activation" and r["format"] == "fp16"]
    by = {}
    for r in acts:
        by.setdefault(r["module"], []).append(r["numel"])
    assert by["d[a]"] == [6] and by["d[b.0]"] == [6]   # each tensor in the dict, by key
    assert by["twice"] == [6, 6]                        # one row per call


def test_monitor_report_places():
    mon = step(mlp(), backward=False)
    with pytest.raises(ValueError, match="is a file, not a folder") as e:
        mon.report(__file__)
    one_line(e.value)
    for bad in ("/proc/fpemu-report", "/dev/null/report"):
        with pytest.raises(ValueError, match="cannot create the report folder") as e:
            mon.report(bad)
        one_line(e.value)


def test_monitor_report_to_a_missing_folder_creates_it(tmp_path):
    mon = step(mlp(), backward=False)
    path = mon.report(tmp_path / "a" / "b")
    assert os.path.exists(path)


def test_monitor_report_to_a_read_only_folder(tmp_path, monkeypatch):
    """A folder the user may not write into (simulated: this suite may run as
    root, who writes anywhere; the check reads os.access)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False
                        if os.fspath(p).startswith(str(ro)) else real(p, mode, *a, **k))
    mon = step(mlp(), backward=False)
    for target in (ro, ro / "x"):
        with pytest.raises(ValueError, match="permission denied|not writable") as e:
            mon.report(target)
        one_line(e.value)
    assert not (ro / "x").exists()


# -------------------------------------------------------------- lessons
@pytest.mark.parametrize("value,fmt,want", [
    (2.0**-127, "e8m0", (0.0, 1.5 * 2.0**-127, False, False)),   # all of (0, ..) rounds up
    (0.0, "bf16", (0.0, 2.0**-134, True, True)),                  # zero
    (-0.0, "fp16", (-2.0**-25, -0.0, True, True)),
    (2.0**-133, "bf16", (2.0**-134, 1.5 * 2.0**-133, False, False)),   # smallest subnormal
    (448.0, "e4m3fn", (432.0, math.inf, True, True)),             # max, saturating
    (65504.0, "fp16", (65488.0, 65520.0, False, False)),          # max, overflowing
    (math.inf, "fp16", (65520.0, math.inf, True, True)),
    (6.0, "e2m1", (5.0, math.inf, False, True)),
])
def test_rounding_interval_at_the_edges(value, fmt, want):
    got = lessons.rounding_interval(value, fmt)
    assert got == want
    assert [math.copysign(1, g) for g in got[:2]] == [math.copysign(1, w) for w in want[:2]]


def test_rounding_interval_of_nan_and_of_a_custom_format():
    assert lessons.rounding_interval(float("nan"), "bf16") is None
    import fpemu
    f = fpemu.Format.custom(3, 1, name="e3m1-test")
    lo, hi, _, _ = lessons.rounding_interval(1.0, f)
    assert lo == 0.875 and hi == 1.25
    with pytest.raises(ValueError, match="1.1 is not a value of"):
        lessons.rounding_interval(1.1, f)


def test_bittoggle_reads_text_exactly_and_refuses_what_it_cannot_show():
    assert lessons.BitToggle("bf16", "1.00390625000000000001").value == 1.0078125
    assert lessons.BitToggle("bf16", "1.00390625").value == 1.0            # a tie: to even
    assert lessons.BitToggle("bf16").set_value("1.00390625000000000001").value == 1.0078125
    assert math.copysign(1, lessons.BitToggle("bf16", "-0").value) < 0
    cases = [
        (lambda: lessons.BitToggle("bf16", "abc"), ValueError, "'abc' is not a number"),
        (lambda: lessons.BitToggle("fp16", math.nan).set_format("e2m1"), ValueError,
         "shows NaN and e2m1 has no NaN; set a value first"),
        (lambda: lessons.BitToggle().step(1.5), TypeError, "n counts values and must be an int"),
        (lambda: lessons.BitToggle().flip(16), ValueError, "bit index must be 0 .. 15"),
        (lambda: lessons.BitToggle("e4m3fn", code=256), ValueError, "does not fit"),
        (lambda: lessons.CodeTable("e4m3fn").value(-1), ValueError,
         r"a code of .* is an int in 0 \.\. 255"),
        (lambda: lessons.CodeTable("e4m3fn").cls(256), ValueError, "in 0 .. 255"),
        (lambda: lessons.Slider("a", "b", "a"), TypeError, "min must be a finite real number"),
        (lambda: lessons.Slider(0, 1, math.nan), TypeError, "value must be a finite real"),
        (lambda: lessons.Slider(0, 1, 0.5, step=0), ValueError, "step must be > 0"),
        (lambda: lessons.Slider(2, 1, 1.5), ValueError, "min 2 must not exceed max 1"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match) as e:
            fn()
        one_line(e.value)
    t = lessons.BitToggle("fp16", math.nan).set_format("bf16")
    assert math.isnan(t.value)


# ------------------------------------------------------------------ CLI
def _cli(argv, capsys):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One file of each bad kind, for each suffix the commands read."""
    from safetensors.torch import save_file
    d = tmp_path_factory.mktemp("files")
    p = {}

    def path(name):
        p[name] = str(d / name)
        return p[name]
    good = sample((4, 64), 7)
    np.save(path("good.npy"), good)
    np.save(path("zero_d.npy"), np.float32(1.5))
    np.save(path("int.npy"), np.arange(64))
    np.save(path("complex.npy"), np.ones(300, np.complex64))
    np.save(path("object.npy"), np.array([1.0, None], object), allow_pickle=True)
    np.savez(path("good.npz"), w=good)
    np.savez(path("object.npz"), w=np.array([1.0, None], object))
    np.savez(path("complex.npz"), w=np.ones(300, np.complex64))
    torch.save({"w": torch.tensor(good)}, path("good.pt"))
    torch.save({"w": torch.arange(300)}, path("int.pt"))
    save_file({"w": torch.tensor(good)}, path("good.safetensors"))
    for suffix in ("npy", "npz", "pt", "safetensors"):
        open(path(f"empty.{suffix}"), "wb").close()
        with open(p[f"good.{suffix}"], "rb") as f:
            raw = f.read()
        with open(path(f"truncated.{suffix}"), "wb") as f:
            f.write(raw[:len(raw) // 2])
        os.mkdir(path(f"dir.{suffix}"))
        os.mkfifo(path(f"fifo.{suffix}"))
    with open(path("huge.npy"), "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
        f.write(b"\0" * 64)
    with zipfile.ZipFile(path("huge.npz"), "w") as z:
        z.write(p["huge.npy"], "w.npy")
    return p


BAD_FILES = [
    ("empty", "is empty"), ("truncated", "cannot read|damaged|truncated"),
    ("dir", "is a directory; pass a file"), ("fifo", "is a FIFO, not a regular file"),
]


@pytest.mark.parametrize("cmd", ["hist", "blocks"])
@pytest.mark.parametrize("suffix", ["npy", "npz", "pt", "safetensors"])
@pytest.mark.parametrize("kind,match", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_cli_bad_tensor_files(files, cmd, suffix, kind, match, capsys, tmp_path):
    extra = ["--no-progress", "-o", str(tmp_path / "h.png")] if cmd == "hist" else []
    status, _, err = _cli([cmd, files[f"{kind}.{suffix}"], *extra], capsys)
    assert status == 2
    assert err.count("\n") == 1 and err.startswith(f"fpemu {cmd}: error: ")
    assert __import__("re").search(match, err), err


@pytest.mark.parametrize("cmd", ["hist", "blocks"])
@pytest.mark.parametrize("name,match", [
    ("object.npy", "holds Python objects, which fpemu never unpickles"),
    ("object.npz", "holds Python objects, which fpemu never unpickles"),
    ("huge.npy", "cannot read .*huge.npy"),
    ("huge.npz", "declares 1099511627776 values .* but stores"),
    ("/dev/null", "unknown file type; expected .npy, .npz"),
    ("missing.npy", "no such file or directory"),
])
def test_cli_files_that_are_not_tensors(files, cmd, name, match, capsys, tmp_path):
    extra = ["--no-progress", "-o", str(tmp_path / "h.png")] if cmd == "hist" else []
    status, _, err = _cli([cmd, files.get(name, name), *extra], capsys)
    assert status == 2 and err.count("\n") == 1
    assert __import__("re").search(match, err), err


def test_cli_file_contents_hist_counts_and_blocks_explains(files, capsys, tmp_path):
    png = ["--no-progress", "-o", str(tmp_path / "h.png")]
    assert _cli(["hist", files["zero_d.npy"], *png], capsys)[0] == 0      # one value
    assert _cli(["hist", files["int.npy"], *png], capsys)[0] == 0         # integers count
    status, _, err = _cli(["hist", files["complex.npy"], *png], capsys)
    assert status == 2 and "holds complex64 values; fpemu counts real numbers" in err
    status, _, err = _cli(["hist", files["complex.npz"], *png], capsys)
    assert status == 2 and "the array 'w' holds complex64 values" in err
    for name in ("zero_d.npy", "int.npy", "complex.npy", "int.pt"):
        status, _, err = _cli(["blocks", files[name]], capsys)
        assert status == 2 and "no floating-point tensor of at least 256 values; lower " \
            "--min-size" in err
    assert _cli(["blocks", files["good.npz"], "--min-size", "1"], capsys)[0] == 0


@pytest.mark.parametrize("argv,match", [
    (["run", "--quick", "nosuch"], "unknown experiment 'nosuch'"),
    (["run", "--quick", "underflow", "--batch", "-5"],
     "--batch expects a positive value (default 256), got -5"),
    (["run", "--quick", "underflow", "--batch", "many"], "--batch expects int (default 256)"),
    (["run", "--quick", "underflow", "--batch", "1000000000000"],
     "needs more memory than this machine has; use smaller sizes"),
    (["run", "--quick", "accumulation", "--ks", "0"], "--ks expects a positive value"),
    (["run", "--quick", "underflow", "--lr", "nan"], "--lr expects a finite number, got nan"),
    (["run", "--quick", "underflow", "--nosuch", "3"], "underflow has no parameter --nosuch"),
])
def test_cli_run_refuses_bad_parameters(argv, match, capsys):
    try:
        status, _, err = _cli(argv, capsys)
    except SystemExit as e:                       # argparse's own usage error
        status, err = e.code, capsys.readouterr().err
    assert status == 2 and match in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("cmd", [["run", "--quick", "underflow"], ["demo", "--quick"]])
def test_cli_out_must_be_a_writable_folder(cmd, capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, match in ((afile, "is a file, not a folder"),
                       ("/proc/fpemu-out", "cannot create the report folder")):
        try:
            status, _, err = _cli([cmd[0], "--out", str(out), *cmd[1:]], capsys)
        except SystemExit as e:
            status, err = e.code, capsys.readouterr().err
        assert status == 2 and match in err, err


def test_cli_hist_and_blocks_outputs(files, capsys, tmp_path):
    (tmp_path / "fig.png").mkdir()
    status, _, err = _cli(["hist", files["good.npy"], "--no-progress", "-o",
                           str(tmp_path / "fig.png")], capsys)
    assert status == 2 and "is a directory" in err
    status, _, err = _cli(["hist", files["good.npy"], "--no-progress", "-o",
                           "/proc/nofolder/fig.png"], capsys)
    assert status == 2 and "does not exist" in err
    status, _, err = _cli(["blocks", files["good.npy"], "--json", "/proc/x/rows.json"], capsys)
    assert status == 2 and "cannot write" in err


TRAIN = """
import sys, torch
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    opt.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
print("trained")
"""

SCRIPTS = {                     # the script's end, its exit status, what is printed
    "exit3": (TRAIN + "sys.exit(3)\n", 3, "trained"),
    "exit0": (TRAIN + "sys.exit(0)\n", 0, "trained"),
    "exit-text": (TRAIN + "sys.exit('stopped early')\n", 1, "stopped early"),
    "raises": (TRAIN + "raise ValueError('user bug')\n", 1, "ValueError: user bug"),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_cli_monitor_scripts_that_end_in_every_way(name, tmp_path):
    """The report is written however the script ends, and the command exits
    with the script's own status."""
    import subprocess
    body, code, text = SCRIPTS[name]
    script = tmp_path / "s.py"
    script.write_text(body)
    out = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", "--out", str(out),
                           "--formats", "fp16", str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == code, proc.stderr
    assert text in proc.stdout + proc.stderr
    assert (out / "index.html").exists()
    # the script's own error keeps its traceback, from the script's frames on
    assert ("Traceback" in proc.stderr) == (name == "raises")
    assert "runpy" not in proc.stderr and "Warning" not in proc.stderr


def test_cli_monitor_a_script_without_a_model(tmp_path):
    import subprocess
    script = tmp_path / "s.py"
    script.write_text("x = 1 + 1\n")
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "there was no model to watch" in proc.stderr
    assert not (tmp_path / "fpemu-monitor").exists()      # no report folder left behind
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_monitor_checks_its_output_before_running(tmp_path):
    import subprocess
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "fpemu.cli", "monitor", "--out", str(afile),
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr
    assert not marker.exists()


def test_no_case_above_wrote_to_the_working_directory():
    assert not os.path.exists("h.png") and not any(
        n.startswith("fpemu-") for n in os.listdir("."))


def test_cli_record_and_parity_name_the_bad_folder_or_file(capsys, tmp_path):
    """One-line errors, no traceback: an output that is a file or cannot be
    made, and a trace folder whose meta.json or recorded .npz is damaged."""
    import json
    import shutil
    src = os.path.join(os.path.dirname(__file__), "reference", "cpu-x86-64-torch2.13.0")
    (tmp_path / "file").write_text("x")
    for out, match in ((tmp_path / "file", "is a file, not a folder"),
                       ("/proc/nope", "cannot create the trace folder /proc/nope")):
        status, _, err = _cli(["record", "--out", str(out), "--only", "casts-f32"], capsys)
        assert status == 2 and match in err
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(os.path.join(src, "meta.json"), folder / "meta.json")
    with open(os.path.join(src, "casts-f32.npz"), "rb") as fh:
        data = fh.read()
    (folder / "casts-f32.npz").write_bytes(data[: len(data) // 2])           # truncated
    status, _, err = _cli(["parity", str(folder), "--only", "casts-f32"], capsys)
    assert status == 2 and "casts-f32.npz is damaged" in err and "fpemu record --only" in err
    (folder / "casts-f32.npz").unlink()
    status, _, err = _cli(["parity", str(folder), "--only", "casts-f32"], capsys)
    assert status == 2 and "casts-f32.npz is missing" in err
    (folder / "meta.json").write_text("{not json")
    status, _, err = _cli(["parity", str(folder)], capsys)
    assert status == 2 and "meta.json is not the JSON" in err
    (folder / "meta.json").write_text(json.dumps({"device": "cpu"}))
    status, _, err = _cli(["parity", str(folder)], capsys)
    assert status == 2 and "lacks scenarios, torch_release" in err
