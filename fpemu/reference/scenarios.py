"""The fidelity scenarios, each written once and run on both backends.

A scenario is a function ``run(env, config, inputs)`` that uses only the API
that ``torch`` and ``fpemu.autograd`` share (through ``env.T``) and returns
named arrays (a :class:`Trace`). Its inputs are made at record time, by
``make_inputs(env, config)`` with NumPy (and, for the optimizer replays, a small
model trained with real PyTorch), and saved with the trace, so a replay
feeds fpemu exactly what PyTorch was fed.

Each scenario also states the tier of each of its arrays under a profile
(``tiers(config, profile)``): bit-exact where ``docs/pytorch-numerics.md`` §6 says
the result is determined, a tolerance with its reason elsewhere.

Inputs made with NumPy are bit-reproducible on any CPU: seeded generators,
integers, ``ldexp`` and single correctly rounded operations (+ - * / sqrt, and
NumPy's pairwise sums, whose order is fixed in its source), never libm
(``exp``, ``log``: NumPy's SIMD versions differ in the last bit between AVX2
and AVX-512) and never BLAS. What PyTorch computes may depend on the CPU
(MKL's GEMM kernels and thread count, ATen's vector width): each scenario
lists those arrays in ``host_dependent`` with the reason, and only the other
arrays of a fresh recording must equal the committed trace.

Nothing here imports Numba: recording needs only NumPy and PyTorch.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import contextlib

import numpy as np

from ..formats import format as _format
from ._env import DTYPE_NAMES, LOW_PRECISION, Env
from .compare import EXACT, Tier

_f32 = np.float32


class Trace:
    """Named arrays, appended to step by step or set once, with their dtypes."""

    def __init__(self, env: Env):
        self.env = env
        self._rows: dict[str, list] = {}
        self._once: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, str] = {}

    def _conv(self, value, dtype):
        if hasattr(value, "detach"):
            return self.env.array(value), self.env.dtype_name(value.dtype)
        a = np.asarray(value)
        if dtype is None:
            dtype = {"f": "float64" if a.dtype == np.float64 else "float32", "b": "int64",
                     "i": "int64", "u": "int64"}[a.dtype.kind]
        return a.astype({"float64": np.float64, "float32": np.float32}.get(dtype, np.int64)), dtype

    def add(self, name, value, dtype=None):
        """Append one step's value of ``name``."""
        a, dt = self._conv(value, dtype)
        self._rows.setdefault(name, []).append(a)
        self.dtypes[name] = dt

    def set(self, name, value, dtype=None):
        a, dt = self._conv(value, dtype)
        self._once[name] = a
        self.dtypes[name] = dt

    def arrays(self):
        out = {k: np.stack(v) for k, v in self._rows.items()}
        out.update(self._once)
        return out


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    group: str
    run: Callable
    config: dict
    make_inputs: Callable
    tiers: Callable = None
    description: str = ""
    #: recorded arrays (``in.x``, ``out.p``; ``out.*`` for all outputs) whose bits
    #: may differ between recording machines, each with the reason
    host_dependent: dict = dataclasses.field(default_factory=dict)

    def depends_on_host(self, key):
        """The reason why recorded array ``key`` may differ between CPUs, or None."""
        kind = key.split(".", 1)[0]
        return self.host_dependent.get(key, self.host_dependent.get(f"{kind}.*"))

    def tier_of(self, array, profile):
        table = self.tiers(self.config, profile) if self.tiers else {}
        if array in table:
            return table[array]
        return table.get("*", EXACT)


SCENARIOS: dict[str, Scenario] = {}


def _register(name, group, run, config, make_inputs, tiers=None, description="",
              host_dependent=None):
    if name in SCENARIOS:
        raise ValueError(f"scenario {name!r} registered twice")
    SCENARIOS[name] = Scenario(name, group, run, dict(config), make_inputs, tiers, description,
                               dict(host_dependent or {}))


# ===================================================================== casts
def _grid(fmt):
    """Every positive finite value of a format (these formats have ≤ 2^15)."""
    p = fmt.precision
    frac = np.arange(2 ** (p - 1), dtype=np.float64) / 2 ** (p - 1)
    vals = [frac[1:] * 2.0 ** fmt.emin]                        # subnormals
    for e in range(fmt.emin, fmt.emax + 1):
        vals.append((1 + frac) * 2.0 ** e)
    g = np.concatenate(vals)
    return g[g <= fmt.max]


def _cast_values_f32(rng):
    v = [0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 500, 464, 465, 480, 448, 449, 247, 248, 240,
         61439, 61440, 57344, 65504, 65519, 65520, 65536, -1e-8, 1e-8, 1.5 * 2.0**-9,
         2.0**-10, 2.0**-25, 3 * 2.0**-25, 2.0**-24, 1 + 2.0**-8, 1 + 3 * 2.0**-8,
         float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max), 2.0**-133,
         2.0**-134, 3 * 2.0**-135, 2.0**-149, 2.0**-126, 0.1, 1 / 3, np.pi]
    out = [np.array(v, np.float64).astype(np.float32),
           np.array([0x00018000, 0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001],
                    np.uint32).view(np.float32)]
    for name in LOW_PRECISION:
        fmt = _format(name)
        g = _grid(fmt)
        nxt = np.append(g[1:], fmt.max + 2.0 ** (fmt.emax - fmt.precision + 1))
        mids = (g + nxt) / 2                                    # ties, exact in float32
        pick = np.unique(np.concatenate([rng.choice(len(g), 48, replace=False),
                                         np.arange(4), np.arange(len(g) - 4, len(g)),
                                         np.flatnonzero(g == fmt.min_normal)]))
        m = mids[pick].astype(np.float32)
        with np.errstate(over="ignore"):                        # 2 * bf16 max is inf
            edges = np.array([fmt.max, fmt.min_normal, fmt.min_subnormal,
                              fmt.min_subnormal / 2, 1.5 * fmt.min_subnormal, 2 * fmt.max],
                             np.float64).astype(np.float32)
        both = np.concatenate([m, edges])
        near = np.concatenate([both, np.nextafter(both, np.float32(np.inf)),
                               np.nextafter(both, np.float32(0))])
        out.append(near)
        out.append(-near)
    bits = rng.integers(0, 2**32, 2048, dtype=np.uint64).astype(np.uint32)
    out.append(bits.view(np.float32))
    return np.concatenate(out).astype(np.float32)


def _cast_values_f64(rng):
    v = [1 + 2.0**-8 + 2.0**-30, 1 + 2.0**-11 + 2.0**-30, 1 + 2.0**-4 + 2.0**-30, 1e39, -1e39,
         1e-50, 2.0**-150, 3 * 2.0**-151, 2.0**-150 * (1 + 2.0**-40), np.inf, -np.inf, np.nan,
         0.0, -0.0, 65519.99999, 65520.0 - 2.0**-20, 0.1, 1 / 3]
    out = [np.array(v, np.float64)]
    for name in LOW_PRECISION:
        fmt = _format(name)
        g = _grid(fmt)
        pick = rng.choice(len(g) - 1, 48, replace=False)
        mids = (g[pick] + g[pick + 1]) / 2                      # target ties
        rel = np.ldexp(1.0, np.frexp(mids)[1] - 30)             # far below a float32 ulp
        out += [mids + rel, mids - rel, -(mids + rel)]
    f32 = rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f32 = f32[np.isfinite(f32)].astype(np.float64)
    half_ulp = np.spacing(f32.astype(np.float32)).astype(np.float64) / 2
    out += [f32 + half_ulp, f32 - half_ulp / 3]                 # float32 ties, near-ties
    # wide magnitudes, 2^-173 .. 2^130, built exactly (ldexp and one correctly rounded
    # product): numpy's SIMD exp differs in the last bit between AVX2 and AVX-512
    out.append(rng.standard_normal(256) * np.ldexp(1.0 + rng.random(256),
                                                   rng.integers(-173, 130, 256)))
    return np.concatenate(out)


def _casts_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    x = _cast_values_f64(rng) if cfg["source"] == "float64" else _cast_values_f32(rng)
    return {"x": x}


def _casts_run(env, cfg, inputs):
    tr = Trace(env)
    x = env.tensor(inputs["x"])
    targets = list(LOW_PRECISION) + (["float32"] if cfg["source"] == "float64" else [])
    for name in targets:
        if env.has_dtype(name):
            tr.set(name, x.to(env.dtype(name)))
    return tr


def _casts_lowp_run(env, cfg, inputs):
    """float32 -> bfloat16 / float16, then on to every other format."""
    tr = Trace(env)
    x = env.tensor(inputs["x"])
    for src in ("bfloat16", "float16"):
        xs = x.to(env.dtype(src))
        for name in LOW_PRECISION:
            if name != src and env.has_dtype(name):
                tr.set(f"{src}->{name}", xs.to(env.dtype(name)))
    return tr


_register("casts-f32", "casts", _casts_run, dict(source="float32", seed=1), _casts_inputs,
          description="float32 ties, subnormals, overflow edges, specials, random bits → "
                      "every low-precision dtype")
_register("casts-f64", "casts", _casts_run, dict(source="float64", seed=2), _casts_inputs,
          description="float64 double-rounding traps, float32 ties, out-of-range values → "
                      "float32 and every low-precision dtype (through float32)")
_register("casts-lowp", "casts", _casts_lowp_run, dict(source="float32", seed=3),
          _casts_inputs, description="bfloat16 / float16 → the other low-precision dtypes")


# ================================================================ GradScaler
SCALER_CASES = {
    "pattern": dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                    growth_interval=3, pattern="ok ok ok inf ok nan ok ok ok ok ok ok ok"),
    "flt-max-guard": dict(init_scale=2.0**127, growth_factor=2.0, backoff_factor=0.5,
                          growth_interval=1, pattern="ok ok ok ok ok inf ok ok"),
    "backoff-to-zero": dict(init_scale=2.0**-140, growth_factor=2.0, backoff_factor=0.5,
                            growth_interval=2000, pattern=" ".join(["inf"] * 12 + ["ok"] * 3)),
    "growth-1.001": dict(init_scale=1000.0, growth_factor=1.001, backoff_factor=0.5,
                         growth_interval=1, pattern=" ".join(["ok"] * 20 + ["-inf"] + ["ok"] * 5)),
    "odd-factors": dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.3,
                        growth_interval=2, pattern="random", steps=40),
}


def _scaler_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    pattern = cfg["pattern"].split()
    if pattern == ["random"]:
        pattern = list(rng.choice(["ok", "ok", "ok", "inf", "nan", "-inf"], cfg["steps"]))
    code = {"ok": 0, "inf": 1, "-inf": 2, "nan": 3}
    return {"pattern": np.array([code[p] for p in pattern], np.int64),
            "grad": rng.standard_normal((len(pattern), 6)).astype(np.float32),
            "p0": rng.standard_normal(6).astype(np.float32)}


def _scaler_run(env, cfg, inputs):
    T = env.T
    tr = Trace(env)
    p = env.tensor(inputs["p0"], requires_grad=True)
    opt = T.optim.SGD([p], lr=0.25, foreach=True)
    scaler = T.amp.GradScaler(env.device, init_scale=cfg["init_scale"],
                              growth_factor=cfg["growth_factor"],
                              backoff_factor=cfg["backoff_factor"],
                              growth_interval=cfg["growth_interval"])
    bad = {1: np.inf, 2: -np.inf, 3: np.nan}
    for k, kind in enumerate(inputs["pattern"]):
        tr.add("scaled_one", scaler.scale(env.tensor(np.float32(1.0))))
        g = inputs["grad"][k] * _f32(scaler.get_scale())        # the scaled backward
        if kind:
            g[k % g.size] = bad[int(kind)]
        p.grad = env.tensor(g.astype(np.float32))
        scaler.step(opt)
        scaler.update()
        tr.add("grad", p.grad)
        tr.add("p", p)
        tr.add("scale", _f32(scaler.get_scale()))
        tr.add("tracker", np.int64(scaler._get_growth_tracker()))
    return tr


for _case, _cfg in SCALER_CASES.items():
    _register(f"scaler-{_case}", "scaler", _scaler_run, dict(_cfg, seed=10), _scaler_inputs,
              description="GradScaler state machine driven by injected inf/NaN gradients")


# =================================================================== unscale
UNSCALE_SCALES = (1.0, 65536.0, 2.0**24, 1000.0, 3.0)


def _unscale_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    e3 = np.array([1e-8, 3e-8, 1e-7, 1e-5, 7e4], np.float32)
    mags = np.ldexp(1.0 + rng.random(251), rng.integers(-34, 17, 251))  # 6e-11 .. 1.3e5, no libm
    signs = rng.choice([-1.0, 1.0], 251)
    g = np.concatenate([e3, [0.0, -0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 65504, 65520],
                        signs * mags]).astype(np.float32)
    return {"g": g}


def _unscale_run(env, cfg, inputs):
    """fp16 gradients of an fp32 parameter (the autocast case), scaled by the
    loss scale, widened to the float32 .grad, then unscaled; bfloat16
    gradients of a bfloat16 parameter unscaled in place, through a second
    optimizer. CUDA's unscale kernel has no bfloat16: there the second
    ``unscale_`` raises, ``bf16_unscale_raises`` records it and the bfloat16
    parameter is left alone."""
    T = env.T
    tr = Trace(env)
    s = cfg["scale"]
    g = env.tensor(inputs["g"])
    tr.set("fp16_unscaled", g.to(env.dtype("float16")))         # underflow without a scale
    g16 = (g * s).to(env.dtype("float16"))
    tr.set("fp16_scaled", g16)
    p = env.tensor(np.zeros(g.shape, np.float32), requires_grad=True)
    pb = env.tensor(np.zeros(g.shape, np.float32), dtype="bfloat16", requires_grad=True)
    opt = T.optim.SGD([p], lr=1.0, foreach=True)
    opt_b = T.optim.SGD([pb], lr=1.0, foreach=True)
    scaler = T.amp.GradScaler(env.device, init_scale=s)
    scaler.scale(env.tensor(np.float32(1.0)))
    p.grad = g16.float()
    pb.grad = (g * s).to(env.dtype("bfloat16"))
    scaler.unscale_(opt)
    tr.set("grad_fp32", p.grad)
    try:
        scaler.unscale_(opt_b)
        raised = False
    except NotImplementedError:
        raised = True
    tr.set("bf16_unscale_raises", np.int64(raised))
    if not raised:
        tr.set("grad_bf16", pb.grad)
    scaler.step(opt)
    if not raised:
        scaler.step(opt_b)
    scaler.update()
    tr.set("p_fp32", p)
    if not raised:
        tr.set("p_bf16", pb)
    tr.set("scale_after", _f32(scaler.get_scale()))
    return tr


for _s in UNSCALE_SCALES:
    _register(f"unscale-{_s:g}", "unscale", _unscale_run, dict(scale=_s, seed=20),
              _unscale_inputs, description="loss scaling of fp16 / bf16 gradients, unscale_, "
                                           "skip on overflow")


# ========================================================= optimizer replays
REPLAY_STEPS = 200
REAL_COLUMNS = 40


def _synthetic_columns(steps, rng):
    """Edge-case gradient streams, one per column."""
    t = np.arange(steps)
    alt = np.where(t % 2 == 0, 1.0, -1.0)
    cols = [
        np.zeros(steps),                                       # always zero
        np.full(steps, 2.0**-24),                              # fp16 smallest subnormal
        np.full(steps, 2.0**-25),                              # rounds to 0 in fp16
        np.full(steps, 3 * 2.0**-26) * alt,
        np.full(steps, 5.4588e-3),                             # fp16 Adam eps cliff (E5a)
        np.full(steps, 5.47e-3),
        np.full(steps, 1e-8),
        np.full(steps, 2.0**-133),                             # bf16 smallest subnormal
        np.full(steps, 1e-40) * alt,                           # float32 subnormal
        np.full(steps, 7e4),                                   # overflows fp16
        np.full(steps, 3e38) * alt,                            # near FLT_MAX
        np.where(t % 50 == 49, 1e5, 1e-3),                     # rare spikes
        1e-3 * alt,
        np.full(steps, 1.0),
        np.ldexp(2.0 - (t % 7) / 7, -(t // 7)),                # decays into underflow
        np.where(t < steps // 2, 1e-2, 0.0),                   # stops
    ]
    return np.stack(cols, axis=1)


def _real_grads(env, steps, n, seed):
    """Gradients of a small MLP trained with SGD on a toy problem, in real
    PyTorch (the record-time backend): the first layer's weight gradient,
    ``n`` of its entries per step."""
    T = env.T
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((256, 8)).astype(np.float32)
    y = (X[:, :4].sum(1) > 0).astype(np.int64) + 2 * (X[:, 4] > 0).astype(np.int64)
    w1 = env.tensor((rng.standard_normal((16, 8)) / np.sqrt(8)).astype(np.float32),
                    requires_grad=True)
    b1 = env.tensor(np.zeros(16, np.float32), requires_grad=True)
    w2 = env.tensor((rng.standard_normal((4, 16)) / 4).astype(np.float32), requires_grad=True)
    opt = T.optim.SGD([w1, b1, w2], lr=0.1)
    out = []
    for k in range(steps):
        idx = rng.choice(256, 32, replace=False)
        xb, yb = env.tensor(X[idx]), env.tensor(y[idx])
        loss = T.nn.functional.cross_entropy(
            T.nn.functional.linear(T.relu(T.nn.functional.linear(xb, w1, b1)), w2), yb)
        opt.zero_grad()
        loss.backward()
        out.append(env.array(w1.grad).reshape(-1)[:n])
        opt.step()
    return np.stack(out).astype(np.float32)


def _replay_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    real = _real_grads(env, REPLAY_STEPS, REAL_COLUMNS, cfg["seed"])
    g = np.concatenate([real, _synthetic_columns(REPLAY_STEPS, rng)], axis=1)
    p0 = np.concatenate([rng.standard_normal(REAL_COLUMNS) * 0.1,
                         rng.choice([1.0, -1.0, 0.5, 1e-3, 0.0], g.shape[1] - REAL_COLUMNS)])
    return {"grads": g.astype(np.float32), "p0": p0.astype(np.float32)}


_REPLAY_HOST = {
    "in.grads": "the first 40 columns are gradients of an MLP trained with real PyTorch: "
                "its matmuls run in MKL / oneDNN, whose kernels and sum order depend on the "
                "CPU's instruction set and thread count",
    "out.*": "computed from in.grads (and, for 16-bit parameters on the CPU, by ATen kernels "
             "whose vector body / scalar tail split depends on the CPU's vector width)",
}

OPTIMIZERS = {
    "adam": ("Adam", dict(lr=1e-3)),
    "adamw": ("AdamW", dict(lr=1e-3, weight_decay=1e-2)),
    "sgd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4)),
}
IMPLS = {"foreach": dict(foreach=True), "single": dict(foreach=False), "fused": dict(fused=True)}
PARAMS = ("fp32", "master", "bf16", "fp16")


def _replay_run(env, cfg, inputs):
    """Feed recorded gradients to an optimizer for every step; record the
    parameter and the optimizer state after each. ``master``: a float32 master
    copy stepped by the optimizer, the bfloat16 model parameter recast from it
    after every step, the bfloat16 gradient widened into the master's .grad."""
    T = env.T
    tr = Trace(env)
    cls, kw = OPTIMIZERS[cfg["optimizer"]]
    kw = dict(kw, **IMPLS[cfg["impl"]])
    mode = cfg["params"]
    D = {"fp32": "float32", "master": "float32", "bf16": "bfloat16", "fp16": "float16"}[mode]
    p = env.tensor(inputs["p0"], dtype=D, requires_grad=True)
    model = p.detach().to(env.dtype("bfloat16")) if mode == "master" else None
    opt = getattr(T.optim, cls)([p], **kw)
    state_names = ("momentum_buffer",) if cls == "SGD" else ("exp_avg", "exp_avg_sq")
    for g in inputs["grads"]:
        if mode == "master":
            p.grad = env.tensor(g, dtype="bfloat16").float()
        else:
            p.grad = env.tensor(g, dtype=D)
        opt.step()
        tr.add("p", p)
        st = opt.state[p]
        for s in state_names:
            tr.add(s, st[s])
        if mode == "master":
            model = p.detach().to(env.dtype("bfloat16"))
            tr.add("model", model)
    return tr


def _replay_tiers(cfg, profile):
    impl, opt, params = cfg["impl"], cfg["optimizer"], cfg["params"]
    fp32_state = params in ("fp32", "master")
    if profile.cpu:
        if impl == "fused" and opt == "sgd" and not fp32_state:
            r = ("torch 2.13's CPU fused SGD kernel (FusedSGDKernel.cpp) is broken for 16-bit "
                 "parameters: its vector body never stores the parameter and loads the "
                 "momentum buffer as float32; fpemu computes what the scalar tail does")
            return {"*": Tier("none", 0, r)}
        if impl != "fused" and opt != "sgd" and fp32_state:
            r = ("CPU torch's float32 sqrt is MKL VML, not correctly rounded, and MKL's "
                 "code for it depends on the CPU (docs/pytorch-numerics.md §7.1; every "
                 "recorded p is fpemu's step with the sqrt at most an ulp off); fpemu "
                 "computes the IEEE sqrt. One sqrt ulp moves an update by "
                 "≤ lr·2^-23 and p does not feed back into m, v, so after 200 steps "
                 "|Δp| ≤ 200·lr·2^-22 ≈ 5e-8, plus one rounding of |p| ≤ 1 (≤ 1.2e-7)")
            return {"p": Tier("abs", 2.5e-7, r), "model": Tier("ulps", 1, r)}
        return {}
    # CUDA: every optimizer is bit-exact, fused ones included (CUDA's powf in
    # fused Adam's bias corrections is emulated bit for bit, fused SGD's float32
    # contractions were measured: torch 2.11 on an H200)
    return {}


for _o in OPTIMIZERS:
    for _i in IMPLS:
        for _p in PARAMS:
            _register(f"optim-{_o}-{_i}-{_p}", "optim", _replay_run,
                      dict(optimizer=_o, impl=_i, params=_p, seed=30), _replay_inputs,
                      _replay_tiers, description=f"{OPTIMIZERS[_o][0]} ({_i}) replayed on "
                                                 f"{_p} parameters for {REPLAY_STEPS} steps",
                      host_dependent=_REPLAY_HOST)


# ============================================ fused optimizers, other options
# What the 200-step replays do not reach: dampening, nesterov, maximize, L2
# weight decay, amsgrad, a GradScaler's grad_scale, 16-bit parameters with
# those, and a size that is not a multiple of 4 (CUDA's fused kernels load 4
# elements at a time and nvcc contracts the lanes differently).
FUSED_N = 1024
FUSED_STEPS = 4
FUSED_CONFIGS = {   # name: (optimizer, arguments, parameter dtype, size, loss scale)
    "sgd-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-4),
                 "float32", FUSED_N, None),
    "sgd-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
                     "float32", FUSED_N, None),
    "sgd-nomomentum": ("SGD", dict(lr=1e-2, weight_decay=1e-4), "float32", FUSED_N, None),
    "sgd-maximize": ("SGD", dict(lr=1e-2, momentum=0.9, maximize=True), "float32", FUSED_N,
                     None),
    "sgd-maximize-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1,
                                      weight_decay=1e-4, maximize=True),
                          "float32", FUSED_N, None),
    "sgd-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                FUSED_N - 1, None),
    "sgd-scaled": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                   FUSED_N, 3.0),
    "sgd-scaled-nomom": ("SGD", dict(lr=1e-2, weight_decay=1e-4), "float32", FUSED_N, 3.0),
    "sgd-scaled-nesterov": ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True,
                                        weight_decay=1e-4), "float32", FUSED_N, 3.0),
    "sgd-scaled-odd": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float32",
                       FUSED_N - 1, 3.0),
    "sgd-scaled-fp16": ("SGD", dict(lr=1e-2, momentum=0.9, weight_decay=1e-4), "float16",
                        FUSED_N, 3.0),
    "sgd-nowd": ("SGD", dict(lr=1e-2, momentum=0.9), "float32", FUSED_N, None),
    "sgd-nowd-damp": ("SGD", dict(lr=1e-2, momentum=0.9, dampening=0.1), "float32", FUSED_N,
                      None),
    "adam-l2": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N, None),
    "adam-l2-odd": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N - 1, None),
    "adam-l2-bf16": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "bfloat16", FUSED_N, None),
    "adam-l2-scaled": ("Adam", dict(lr=1e-3, weight_decay=1e-2), "float32", FUSED_N, 3.0),
    "adam-l2-maximize": ("Adam", dict(lr=1e-3, weight_decay=1e-2, maximize=True), "float32",
                         FUSED_N, None),
    "adam-l2-maximize-odd": ("Adam", dict(lr=1e-3, weight_decay=1e-2, maximize=True),
                             "float32", FUSED_N - 1, None),
    "adam-amsgrad": ("Adam", dict(lr=1e-3, amsgrad=True), "float32", FUSED_N, None),
    "adam-maximize": ("Adam", dict(lr=1e-3, maximize=True), "float32", FUSED_N, None),
    "adam-scaled": ("Adam", dict(lr=1e-3), "float32", FUSED_N, 3.0),
    "adam-odd": ("Adam", dict(lr=1e-3), "float32", FUSED_N - 1, None),
    "adamw-gpt": ("AdamW", dict(lr=3e-4, betas=[0.9, 0.95], weight_decay=0.1), "float32",
                  FUSED_N, None),
}


def _fused_inputs(env, cfg):
    """p0 and the gradients: random signs and significands in [1, 2) times
    powers of two (p0 2^-12 .. 2^-3, gradients 2^-18 .. 2^-9), float32; the
    gradients multiplied by the loss scale where there is one, as a scaled
    backward gives them."""
    rng = np.random.default_rng(cfg["seed"])
    n = cfg["n"]

    def draw(lo, hi, shape):
        sig = 1 + rng.integers(0, 2**23, shape) / 2**23
        return (rng.choice([-1.0, 1.0], shape) * np.ldexp(sig, rng.integers(lo, hi, shape)))

    p0 = draw(-12, -2, n).astype(np.float32)
    grads = draw(-18, -8, (FUSED_STEPS, n)).astype(np.float32)
    if cfg["scale"] is not None:
        grads = (grads * np.float32(cfg["scale"])).astype(np.float32)
    return {"p0": p0, "grads": grads}


def _fused_run(env, cfg, inputs):
    """The fused optimizer for FUSED_STEPS steps (through a GradScaler where
    there is a loss scale); p and every state after each step."""
    T = env.T
    tr = Trace(env)
    cls, kw = cfg["optimizer"], dict(cfg["kwargs"])
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    D = cfg["dtype"]
    p = env.tensor(inputs["p0"], dtype=D, requires_grad=True)
    opt = getattr(T.optim, cls)([p], fused=True, **kw)
    scaler = None
    if cfg["scale"] is not None:
        scaler = T.amp.GradScaler(env.device, init_scale=cfg["scale"])
        scaler.scale(env.tensor(np.float32(1.0)))
    for g in inputs["grads"]:
        p.grad = env.tensor(g, dtype=D)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        tr.add("p", p)
        for name in sorted(k for k in opt.state[p] if k != "step"):
            tr.add(name, opt.state[p][name])
    return tr


def _fused_tiers(cfg, profile):
    if profile.cpu and cfg["optimizer"] == "SGD" and cfg["dtype"] != "float32":
        r = ("torch 2.13's CPU fused SGD kernel (FusedSGDKernel.cpp) is broken for 16-bit "
             "parameters: its vector body never stores the parameter and loads the "
             "momentum buffer as float32; fpemu computes what the scalar tail does")
        return {"*": Tier("none", 0, r)}
    return {}


for _name, (_cls, _kw, _dt, _n, _scale) in FUSED_CONFIGS.items():
    _register(f"fused-{_name}", "fused", _fused_run,
              dict(optimizer=_cls, kwargs=_kw, dtype=_dt, n=_n, scale=_scale, seed=60),
              _fused_inputs, _fused_tiers,
              description=f"fused {_cls} {_kw}, {_dt}, {_n} elements"
                          + (f", GradScaler({_scale})" if _scale else "")
                          + f", {FUSED_STEPS} steps")


# ================================================================== autocast
def _autocast_ops(env):
    T, F = env.T, env.T.nn.functional
    return {
        "matmul": lambda x, w, y: x @ w,
        "linear": lambda x, w, y: F.linear(x, w),
        "softmax": lambda x, w, y: T.softmax(x, dim=1),
        "log_softmax": lambda x, w, y: T.log_softmax(x, dim=1),
        "layer_norm": lambda x, w, y: F.layer_norm(x, (x.shape[1],)),
        "exp": lambda x, w, y: T.exp(x),
        "log": lambda x, w, y: T.log(x),
        "pow": lambda x, w, y: T.pow(x, 2),
        "sqrt": lambda x, w, y: T.sqrt(x),
        "reciprocal": lambda x, w, y: T.reciprocal(x),
        "sum": lambda x, w, y: x.sum(),
        "mean": lambda x, w, y: x.mean(),
        "relu": lambda x, w, y: T.relu(x),
        "gelu": lambda x, w, y: F.gelu(x),
        "tanh": lambda x, w, y: T.tanh(x),
        "sigmoid": lambda x, w, y: T.sigmoid(x),
        "add": lambda x, w, y: x + x,
        "add_fp32": lambda x, w, y: x + y,
        "mul_scalar": lambda x, w, y: x * 2.0,
        "cross_entropy": lambda x, w, y: F.cross_entropy(x, env.tensor(np.array([0, 1, 2, 3]))),
        "mse_loss": lambda x, w, y: F.mse_loss(x, y),
        "matmul_fp32_in_lower": lambda x, w, y: (x @ w) @ y.T,
    }


def _autocast_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    return {"x": (rng.random((4, 4)) + 0.5).astype(np.float32),
            "w": rng.standard_normal((4, 4)).astype(np.float32),
            "y": rng.standard_normal((4, 4)).astype(np.float32)}


def _autocast_run(env, cfg, inputs):
    """The output dtype of each op under autocast, for each input dtype
    (index into DTYPE_NAMES); -1 where the op raises."""
    T = env.T
    tr = Trace(env)
    ops = _autocast_ops(env)
    ins = ("float32", "bfloat16", "float16")
    codes = np.full((len(ops), len(ins)), -1, np.int64)
    y = env.tensor(inputs["y"])
    for j, name in enumerate(ins):
        x = env.tensor(inputs["x"], dtype=name)
        w = env.tensor(inputs["w"], dtype=name)
        with T.autocast(device_type=env.device, dtype=env.dtype(cfg["dtype"])):
            for i, fn in enumerate(ops.values()):
                try:
                    out = fn(x, w, y)
                except RuntimeError:
                    continue
                codes[i, j] = DTYPE_NAMES.index(env.dtype_name(out.dtype))
    tr.set("out_dtype", codes)
    return tr


for _dt in ("bfloat16", "float16"):
    _register(f"autocast-{_dt}", "autocast", _autocast_run, dict(dtype=_dt, seed=40),
              _autocast_inputs, description="output dtype of each op under autocast "
                                            "(ops × input dtype float32/bfloat16/float16)")


# ================================================================ end to end
E2E_STEPS = 100
# a loss weight that puts the gradients (~1e-3 unweighted) where fp16 underflows
# (below 2^-24): without a large enough loss scale many fp16 gradients are zero;
# Adam's update barely depends on the gradients' scale (eps aside)
LOSS_WEIGHT = 2.0**-14


def _e2e_inputs(env, cfg):
    rng = np.random.default_rng(cfg["seed"])
    if cfg["model"] == "mlp":
        d_in, hidden, classes = 32, 64, 10
        X = rng.standard_normal((512, d_in)).astype(np.float32)
        proj = rng.standard_normal((d_in, classes))
        logits = 0.5 * rng.standard_normal((512, classes))
        for j in range(d_in):            # in index order: BLAS's order depends on the CPU
            logits = logits + X[:, j:j + 1].astype(np.float64) * proj[j]
        y = np.argmax(logits, 1)
        return {"X": X, "y": y.astype(np.int64),
                "w1": (rng.standard_normal((hidden, d_in)) / np.sqrt(d_in)).astype(np.float32),
                "b1": np.zeros(hidden, np.float32),
                "w2": (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(
                    np.float32),
                "b2": np.zeros(classes, np.float32)}
    # the SDPA transformer: one head of 64 (the head dim of the fused kernels'
    # fitted launches, docs/pytorch-numerics.md §11) over 16 tokens
    d, t, classes = (64, 16, 4) if cfg["model"] == "sdpa" else (32, 8, 4)
    X = rng.standard_normal((128, t, d)).astype(np.float32)
    y = (X[:, :, 0].mean(1) > 0).astype(np.int64) + 2 * (X[:, -1, 1] > 0).astype(np.int64)
    w = {}
    for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                        ("w1", (2 * d, d)), ("w2", (d, 2 * d)), ("wh", (classes, d))):
        w[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    for name, n in (("ln1_w", d), ("ln2_w", d)):
        w[name] = np.ones(n, np.float32)
    for name, n in (("ln1_b", d), ("ln2_b", d), ("b1", 2 * d), ("b2", d), ("bh", classes)):
        w[name] = np.zeros(n, np.float32)
    return dict(w, X=X, y=y)


def _mlp_loss(env, P, xb, yb):
    F = env.T.nn.functional
    h = env.T.relu(F.linear(xb, P["w1"], P["b1"]))
    return F.cross_entropy(F.linear(h, P["w2"], P["b2"]), yb)


def _transformer_loss(env, P, xb, yb):
    T, F = env.T, env.T.nn.functional
    B, L, d = xb.shape
    heads, hd = 2, d // 2
    h = F.layer_norm(xb, (d,), P["ln1_w"], P["ln1_b"])

    def split(z):
        return z.reshape(B, L, heads, hd).transpose(1, 2)
    q, k, v = (split(F.linear(h, P[n])) for n in ("wq", "wk", "wv"))
    att = T.softmax((q @ k.transpose(-2, -1)) * (1.0 / hd ** 0.5), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, L, d)
    x = xb + F.linear(y, P["wo"])
    h2 = F.layer_norm(x, (d,), P["ln2_w"], P["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h2, P["w1"], P["b1"])), P["w2"], P["b2"])
    return F.cross_entropy(F.linear(x.mean(1), P["wh"], P["bh"]), yb)


def _flash_only(env):
    """Attention restricted to the flash kernel where the device has it (CUDA,
    16-bit inputs); the CPU runs what torch picks for these shapes (its own
    flash kernel)."""
    if env.device != "cuda":
        return contextlib.nullcontext()
    if env.backend == "torch":
        from torch.nn.attention import SDPBackend, sdpa_kernel
    else:
        SDPBackend, sdpa_kernel = env.T.nn.functional.SDPBackend, env.T.nn.functional.sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _sdpa_loss(env, P, xb, yb):
    """The transformer block of :func:`_transformer_loss` with one head of 64
    and its attention through ``scaled_dot_product_attention`` (flash)."""
    F = env.T.nn.functional
    B, L, d = xb.shape
    h = F.layer_norm(xb, (d,), P["ln1_w"], P["ln1_b"])
    q, k, v = (F.linear(h, P[n]).reshape(B, 1, L, d) for n in ("wq", "wk", "wv"))
    with _flash_only(env):
        y = F.scaled_dot_product_attention(q, k, v).reshape(B, L, d)
    x = xb + F.linear(y, P["wo"])
    h2 = F.layer_norm(x, (d,), P["ln2_w"], P["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h2, P["w1"], P["b1"])), P["w2"], P["b2"])
    return F.cross_entropy(F.linear(x.mean(1), P["wh"], P["bh"]), yb)


def _e2e_run(env, cfg, inputs):
    """Train for E2E_STEPS steps with AdamW (foreach): fp32, bf16 autocast, or
    fp16 autocast with a GradScaler; record the loss, the loss scale and the
    fraction of gradient entries that are exactly zero (after backward, before
    unscaling)."""
    T = env.T
    tr = Trace(env)
    P = {k: env.tensor(v, requires_grad=True) for k, v in inputs.items() if k not in ("X", "y")}
    opt = T.optim.AdamW(list(P.values()), lr=3e-3, foreach=True)
    mode = cfg["precision"]
    # the scale starts at 1 so that fp16 gradients underflow at first and the
    # zero fraction falls as the scale grows (x2 every 10 clean steps)
    scaler = (T.amp.GradScaler(env.device, init_scale=1.0, growth_interval=10)
              if mode == "fp16" else None)
    loss_fn = {"mlp": _mlp_loss, "transformer": _transformer_loss,
               "sdpa": _sdpa_loss}[cfg["model"]]
    X, y = inputs["X"], inputs["y"]
    batch = 64 if cfg["model"] == "mlp" else 16
    for step in range(E2E_STEPS):
        lo = (step * batch) % len(X)
        xb, yb = env.tensor(X[lo:lo + batch]), env.tensor(y[lo:lo + batch])
        with env.step(step):                 # (fpemu record --ops records chosen steps)
            opt.zero_grad()
            if mode == "fp32":
                loss = loss_fn(env, P, xb, yb)
            else:
                with T.autocast(device_type=env.device, dtype=env.dtype(
                        "bfloat16" if mode == "bf16" else "float16")):
                    loss = loss_fn(env, P, xb, yb)
            weighted = loss * LOSS_WEIGHT
            (scaler.scale(weighted) if scaler else weighted).backward()
            grads = [env.array(p.grad) for p in P.values()]
            tr.add("zero_grad_fraction", np.float64(
                sum(int((g == 0).sum()) for g in grads) / sum(g.size for g in grads)))
            tr.add("loss", loss.float())
            if scaler:
                scaler.step(opt)
                scaler.update()
                tr.add("scale", _f32(scaler.get_scale()))
            else:
                opt.step()
    return tr


def _e2e_tiers(cfg, profile):
    why = ("matmuls accumulate in cuBLAS / MKL order (fpemu: the GPU's tensor-core model for "
           "bf16 / fp16 on CUDA, fp32 adds in index order otherwise), "
           "reductions have their own order, and exp / log / tanh / erf come from the "
           "device's library (docs/pytorch-numerics.md §6 E10-E12); the differences feed back "
           "through 100 steps of training")
    # bounds: about 4x the largest deviation measured against torch 2.13 CPU over
    # the 100 steps (absolute loss difference, MLP / transformer: fp32 2.4e-7 /
    # 2.4e-7, bf16 6.5e-4 / 2.5e-3, fp16 8.5e-5 / 4.9e-3; zero fraction 2.5e-3).
    # Absolute, because the losses fall to 0.01 where relative errors balloon.
    loss_bound = {"fp32": 1e-6, "bf16": 1e-2, "fp16": 2e-2}[cfg["precision"]]
    return {"loss": Tier("abs", loss_bound, why),
            "zero_grad_fraction": Tier("abs", 0.01, why),
            "scale": Tier("rel", 1.0, why + "; the loss scale halves on an overflow that one "
                                            "ulp can decide, so one factor of 2 is allowed")}


for _m in ("mlp", "transformer"):
    for _prec in ("fp32", "bf16", "fp16"):
        _register(f"e2e-{_m}-{_prec}", "e2e", _e2e_run,
                  dict(model=_m, precision=_prec, seed=50), _e2e_inputs,
                  _e2e_tiers, description=f"{_m} trained {E2E_STEPS} steps, {_prec}",
                  host_dependent={"out.*": "training runs PyTorch's matmuls (MKL / oneDNN), "
                                           "reductions and exp / log / tanh / erf, whose bits "
                                           "depend on the CPU and the thread count"})
# the transformer with its attention in scaled_dot_product_attention: flash on
# the GPU, in bf16 (the flash kernel takes no float32; an fp16 run with a loss
# scale starting at 1 sits at fp16's underflow, where its zero fraction moved by
# 0.06 against torch's CPU: a judge of chaos, not of the attention kernel)
for _prec in ("bf16",):
    _register(f"e2e-sdpa-{_prec}", "e2e", _e2e_run,
              dict(model="sdpa", precision=_prec, seed=51), _e2e_inputs, _e2e_tiers,
              description=f"SDPA transformer (flash attention on CUDA) trained {E2E_STEPS} "
                          f"steps, {_prec}",
              host_dependent={"out.*": "training runs PyTorch's matmuls (MKL / oneDNN), "
                                       "reductions, its CPU attention kernel and exp / log / "
                                       "erf, whose bits depend on the CPU and the thread "
                                       "count"})


# ================================================================ collectives
# Real torch.distributed collectives, gloo backend, `world` processes on this
# CPU (fpemu/reference/_gloo.py), against fpemu.collectives' gloo model. The
# inputs are exact values of the dtype (integer significands scaled by powers
# of two) with zeros of both signs, infinities, NaNs on some ranks and, in
# fp16, sums that overflow; the sizes reach every remainder of gloo's ring
# segments (the many-segment case, over 2 * world MiB, runs live in
# tests/test_collectives.py instead of being committed).
COLLECTIVE_OPS = ("all_reduce.sum", "all_reduce.max", "all_reduce.min", "reduce_scatter.sum",
                  "all_gather")
_WIRE = {"float32": ("fp32", 24), "bfloat16": ("bf16", 8), "float16": ("fp16", 11)}


def _collective_inputs(env, cfg):
    world = cfg["world"]
    fmt, p = _WIRE[cfg["dtype"]]
    rng = np.random.default_rng(cfg["seed"])
    out = {}
    for n in (1, 7, 100, 999, world * 250):
        m = rng.integers(-(2 ** p - 1), 2 ** p, size=(world, n))
        e = rng.integers(-10, 11, size=(world, n)) - p
        x = np.ldexp(m.astype(np.float64), e).astype(_f32)
        if n >= 100:
            flat = x.reshape(-1)
            pos = rng.choice(flat.size, size=24, replace=False)
            flat[pos[:4]] = np.nan
            flat[pos[4:8]] = np.inf
            flat[pos[8:12]] = -np.inf
            flat[pos[12:16]] = -0.0
            flat[pos[16:20]] = 0.0
            if fmt == "fp16":
                flat[pos[20:24]] = 60000.0            # two of them in one sum overflow
            x[:, 0] = -0.0                          # -0 on every rank: the sum is -0
            x[0, 1], x[1:, 1] = -0.0, 0.0
            x[0, 2] = np.nan                         # on rank 0 only
        out[f"n{n}"] = x
    return out


def _collective_run(env, cfg, inputs):
    tr = Trace(env)
    world = cfg["world"]
    if env.backend == "torch":
        from . import _gloo
        got = _gloo.run(inputs, cfg["dtype"], COLLECTIVE_OPS, world)
    else:
        from .. import collectives
        fmt = _WIRE[cfg["dtype"]][0]
        got = {}
        for key, x in inputs.items():
            for name in COLLECTIVE_OPS:
                kind, _, op = name.partition(".")
                if kind == "reduce_scatter" and x.shape[1] % world:
                    continue
                fn = getattr(collectives, kind)
                got[f"{name}.{key}"] = fn(list(x), fmt, op) if op else fn(list(x), fmt)
    for key in sorted(got):
        tr.set(key, np.stack(got[key]), "float32")
    return tr


for _dt, _worlds in (("bfloat16", (2, 3, 4, 8)), ("float16", (3, 4)), ("float32", (4,))):
    for _w in _worlds:
        _register(f"collectives-gloo-{_dt}-w{_w}", "collectives", _collective_run,
                  dict(dtype=_dt, world=_w, seed=60 + _w), _collective_inputs,
                  description=f"gloo all_reduce / reduce_scatter_tensor / "
                              f"all_gather_into_tensor of {_dt} over {_w} processes")


# ======================================================================= DDP
# Real DistributedDataParallel, gloo, on this CPU (fpemu/reference/_gloo.py):
# an MLP, each rank its own batch, for three iterations (the first all-reduce
# runs one bucket in registration order, the later ones the rebuilt buckets).
# Inputs: each rank's local gradients (DDP's no_sync); outputs: the gradients
# DDP leaves, which fpemu.collectives.ddp_all_reduce computes from those inputs.
# Small bucket caps split these small models into several buckets.
DDP_CASES = {
    "ddp-gloo-fp32-w3": dict(dtype="float32", world=3, hook=None, bucket_cap_mb=0.01),
    "ddp-gloo-fp32-w2-cap25": dict(dtype="float32", world=2, hook=None, bucket_cap_mb=25),
    "ddp-gloo-bf16-w3": dict(dtype="bfloat16", world=3, hook=None, bucket_cap_mb=0.004),
    "ddp-gloo-fp32-w4-fp16-compress": dict(dtype="float32", world=4, hook="fp16_compress",
                                           bucket_cap_mb=0.01),
    # PowerSGD from the third iteration on: rank 1 (Gram-Schmidt) and rank 4 (QR); one
    # bucket, as torch's hook over gloo aborts with several (the buckets' collectives
    # interleave: "Received data size doesn't match expected size", torch 2.13)
    "ddp-gloo-fp32-w3-powersgd-r1": dict(dtype="float32", world=3, hook="powerSGD",
                                         bucket_cap_mb=25, iterations=5,
                                         powersgd=dict(matrix_approximation_rank=1,
                                                       start_powerSGD_iter=2)),
    "ddp-gloo-fp32-w4-powersgd-r4": dict(dtype="float32", world=4, hook="powerSGD",
                                         bucket_cap_mb=25, iterations=5,
                                         powersgd=dict(matrix_approximation_rank=4,
                                                       start_powerSGD_iter=2)),
}
_DDP_MODEL = dict(widths=[40, 64, 64, 8], batch=8, iterations=3, seed=70)


def _ddp_inputs(env, cfg):
    from . import _gloo
    got = _gloo.run_ddp(cfg, cfg["world"])
    _DDP_RECORDED[cfg["name"]] = got
    return {k: np.stack(v) for k, v in got.items() if k.startswith("local.")}


#: the torch side of a DDP scenario, from the run that made its inputs
_DDP_RECORDED = {}


def _ddp_run(env, cfg, inputs):
    tr = Trace(env)
    n = sum(1 for k in inputs if k.startswith("local.0."))
    if env.backend == "torch":
        got = _DDP_RECORDED.pop(cfg["name"], None)
        if got is None:
            from . import _gloo
            got = _gloo.run_ddp(cfg, cfg["world"])
        for key in sorted(got):
            if key.startswith("reduced."):
                tr.set(key, np.stack(got[key]), "float32")
        return tr
    from .. import collectives
    fmt = {"float32": "fp32", "bfloat16": "bf16"}[cfg["dtype"]]
    state = collectives.PowerSGDState(**cfg["powersgd"]) if cfg["hook"] == "powerSGD" else None
    for it in range(cfg["iterations"]):
        grads = [[inputs[f"local.{it}.{i}"][r] for i in range(n)] for r in range(cfg["world"])]
        red = collectives.ddp_all_reduce(grads, fmt, "gloo", iteration=min(it, 1),
                                         hook=cfg["hook"], bucket_cap_mb=cfg["bucket_cap_mb"],
                                         state=state)
        for i in range(n):
            tr.set(f"reduced.{it}.{i}", np.stack([red[i]] * cfg["world"]), "float32")
    return tr


def _powersgd_tiers(cfg, profile):
    """PowerSGD's compressed iterations: within float32 rounding of torch's."""
    why = ("PowerSGD's products M·Q, Mᵀ·P and P·Qᵀ, its norms and its QR run in float32 in "
           "torch's MKL and LAPACK and in fpemu's NumPy, in different orders; on the recorded "
           "steps the reduced gradients agree to 1e-7 to 7e-7 normwise (max |Δ| 1.9e-8 for "
           "gradients up to 0.08), the error feedback carrying the differences from step to "
           "step. Bound: 1e-7 absolute (5x the largest seen). The iterations before "
           "start_powerSGD_iter and the gradients PowerSGD leaves uncompressed are bit-exact")
    n = 2 * (len(cfg["widths"]) - 1)
    return {f"reduced.{it}.{i}": Tier("abs", 1e-7, why)
            for it in range(cfg["powersgd"]["start_powerSGD_iter"], cfg["iterations"])
            for i in range(n)}


_MKL_GRADS = ("the local gradients come from PyTorch's matmuls (MKL), whose bits depend on the "
              "CPU and the thread count")
for _name, _cfg in DDP_CASES.items():
    _psgd = _cfg["hook"] == "powerSGD"
    _register(_name, "ddp", _ddp_run, dict(_DDP_MODEL, name=_name, **_cfg), _ddp_inputs,
              tiers=_powersgd_tiers if _psgd else None,
              description=f"DistributedDataParallel over {_cfg['world']} gloo processes, "
                          f"{_cfg['dtype']}, hook {_cfg['hook']}, bucket_cap_mb "
                          f"{_cfg['bucket_cap_mb']}"
                          + (f", PowerSGD {_cfg['powersgd']}" if _psgd else ""),
              host_dependent=dict({"in.*": _MKL_GRADS}, **(
                  {"out.*": "PowerSGD's products run in MKL in torch"} if _psgd else {})))


# ===================================================================== FSDP
# Real FSDP2 (fully_shard with a MixedPrecisionPolicy) and FSDP1
# (FullyShardedDataParallel with MixedPrecision), gloo, on this CPU: one
# backward of an MLP whose first dimensions do not divide by the world (padded
# shards). Inputs: each rank's unsharded local gradients, computed in the
# recording process as FSDP2 computes them (parameters and inputs cast to
# param_dtype); outputs: the reduced gradients FSDP2 leaves, gathered whole.
FSDP_CASES = {
    "fsdp2-gloo-bf16-reduce-fp32-w3": dict(param_dtype="bfloat16", reduce_dtype="float32",
                                           world=3),
    "fsdp2-gloo-bf16-reduce-bf16-w3": dict(param_dtype="bfloat16", reduce_dtype="bfloat16",
                                           world=3),
    "fsdp2-gloo-bf16-reduce-fp16-w4": dict(param_dtype="bfloat16", reduce_dtype="float16",
                                           world=4),
    "fsdp1-gloo-bf16-reduce-fp32-w3": dict(param_dtype="bfloat16", reduce_dtype="float32",
                                           world=3, flavor="fsdp1"),
    "fsdp1-gloo-bf16-reduce-bf16-w4": dict(param_dtype="bfloat16", reduce_dtype="bfloat16",
                                           world=4, flavor="fsdp1"),
}
_FSDP_MODEL = dict(widths=[40, 64, 64, 8], batch=8, seed=80)


def _local_inputs(cfg, dtype_name):
    """The ranks' local gradients as inputs, ``local.<param>``: rank x shape."""
    from . import _gloo
    local = _gloo.local_grads(cfg, cfg["world"], dtype_name)
    return {f"local.{i}": np.stack([local[r][i] for r in range(cfg["world"])])
            for i in range(len(local[0]))}


def _one_step_run(env, cfg, inputs, run_torch, reduce):
    """One backward's reduced gradients: recorded from ``run_torch(cfg)`` (the
    real processes), replayed with ``reduce(grads)`` from the local ones."""
    tr = Trace(env)
    if env.backend == "torch":
        got = run_torch(cfg)
        for key in sorted(got):
            tr.set(key, np.stack(got[key]), "float32")
        return tr
    n = len(inputs)
    red = reduce([[inputs[f"local.{i}"][r] for i in range(n)] for r in range(cfg["world"])])
    for i in range(n):
        tr.set(f"reduced.{i}", np.stack([red[i]] * cfg["world"]), "float32")
    return tr


def _fsdp_inputs(env, cfg):
    return _local_inputs(cfg, cfg["param_dtype"])


def _fsdp_run(env, cfg, inputs):
    from .. import collectives
    from . import _gloo
    fmt = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[cfg["reduce_dtype"]]
    reduce = (collectives.fsdp1_reduce_scatter if cfg.get("flavor") == "fsdp1"
              else collectives.fsdp_reduce_scatter)
    return _one_step_run(env, cfg, inputs, lambda c: _gloo.run_fsdp(c, c["world"]),
                         lambda grads: reduce(grads, fmt, "gloo"))


for _name, _cfg in FSDP_CASES.items():
    _register(_name, "fsdp", _fsdp_run, dict(_FSDP_MODEL, **_cfg), _fsdp_inputs,
              description=f"{_cfg.get('flavor', 'fsdp2').upper()} over {_cfg['world']} gloo "
                          f"processes, param_dtype {_cfg['param_dtype']}, reduce_dtype "
                          f"{_cfg['reduce_dtype']}",
              host_dependent={"in.*": "the local gradients come from PyTorch's bf16 matmuls "
                                      "(oneDNN / MKL), whose bits depend on the CPU"})


# ====================================================================== ZeRO
# Real DeepSpeed ZeRO (0.19.8, its CPU accelerator, gloo) on this CPU: one
# backward of the MLP of the FSDP cases in bf16. Recording needs DeepSpeed
# (pip install deepspeed==0.19.8); the replay does not. Inputs: the ranks'
# local bf16 gradients, computed in the recording process; outputs: the
# gradients ZeRO leaves, gathered whole.
_ZERO_BASE = {"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
              "zero_allow_untested_optimizer": True}
ZERO_CASES = {
    "zero-gloo-stage1-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 1})),
    "zero-gloo-stage2-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 2})),
    "zero-gloo-stage2-bf16-comm-fp32-w4": dict(world=4, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 2}, communication_data_type="fp32")),
    "zero-gloo-stage3-bf16-w3": dict(world=3, ds_config=dict(_ZERO_BASE,
                                                             zero_optimization={"stage": 3})),
    # three buckets: [b3, w3, b2], [w2], [b1, w1] in the order the gradients become ready
    "zero-gloo-stage3-bf16-buckets-w3": dict(world=3, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3, "reduce_bucket_size": 3000})),
    "zero-gloo-stage3-bf16-comm-fp32-w4": dict(world=4, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3}, communication_data_type="fp32")),
}


def _zero_inputs(env, cfg):
    return _local_inputs(cfg, "bfloat16")


def _zero_run(env, cfg, inputs):
    from .. import collectives
    from . import _gloo
    return _one_step_run(env, cfg, inputs, lambda c: _gloo.run_zero(c, c["world"]),
                         lambda grads: collectives.zero_reduce(grads, cfg["ds_config"], "gloo"))


# DeepSpeed ZeRO training steps (torch's SGD on the fp32 masters), replayed by
# fpemu.autograd's EmulatedZeRO from the initial weights and the batches: the
# ranks' local bf16 gradients are fpemu's own here, not recorded.
ZERO_TRAIN_CASES = {
    "zero-train-stage2-bf16-w3": dict(world=3, steps=3, lr=0.5, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 2})),
    "zero-train-stage3-bf16-w3": dict(world=3, steps=3, lr=0.5, ds_config=dict(
        _ZERO_BASE, zero_optimization={"stage": 3})),
}


def _zero_train_inputs(env, cfg):
    """The MLP's initial float32 weights (``w.<param>``) and every step's
    batches (``x.<step>``, ``y.<step>``: rank x batch), made with torch as the
    recording processes make them."""
    import torch

    from . import _gloo
    out = {f"w.{i}": p.detach().numpy().copy()
           for i, p in enumerate(_gloo._mlp(torch, cfg).parameters())}
    for it in range(cfg["steps"]):
        xs, ys = zip(*(_gloo._batch(torch, cfg, it, r) for r in range(cfg["world"])))
        out[f"x.{it}"] = np.stack([x.numpy() for x in xs])
        out[f"y.{it}"] = np.stack([y.numpy() for y in ys])
    return out


def _zero_train_run(env, cfg, inputs):
    tr = Trace(env)
    if env.backend == "torch":
        from . import _gloo
        got = _gloo.run_zero_training(cfg, cfg["world"])
        for key in sorted(got):
            tr.set(key, np.stack(got[key]), "float32")
        return tr
    from ..autograd.distributed import EmulatedZeRO
    T = env.T
    widths, layers = cfg["widths"], []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [T.nn.Linear(a, b), T.nn.ReLU()]
    model = T.nn.Sequential(*layers[:-1])
    with T.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(T.tensor(inputs[f"w.{i}"]))
    zero = EmulatedZeRO(model, cfg["world"], cfg["ds_config"])
    opt = T.optim.SGD(model.parameters(), lr=cfg["lr"])
    for it in range(cfg["steps"]):
        batches = [(T.tensor(inputs[f"x.{it}"][r]), T.tensor(inputs[f"y.{it}"][r]))
                   for r in range(cfg["world"])]
        zero.backward(lambda m, x, y: ((m(x.to(T.bfloat16)).float() - y) ** 2).mean(), batches)
        zero.step(opt)
        for i, p in enumerate(model.parameters()):
            tr.set(f"master.{it}.{i}", np.stack([p.detach().numpy()] * cfg["world"]),
                   "float32")
    return tr


for _name, _cfg in ZERO_TRAIN_CASES.items():
    _register(_name, "zero", _zero_train_run, dict(_FSDP_MODEL, **_cfg), _zero_train_inputs,
              description=f"DeepSpeed ZeRO training, {_cfg['steps']} SGD steps over "
                          f"{_cfg['world']} gloo processes: {_cfg['ds_config']}")


for _name, _cfg in ZERO_CASES.items():
    _register(_name, "zero", _zero_run, dict(_FSDP_MODEL, **_cfg), _zero_inputs,
              description=f"DeepSpeed ZeRO over {_cfg['world']} gloo processes: "
                          f"{_cfg['ds_config']}",
              host_dependent={"in.*": "the local gradients come from PyTorch's bf16 matmuls "
                                      "(oneDNN / MKL), whose bits depend on the CPU"})
