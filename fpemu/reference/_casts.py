"""Scenarios of the casts: float32 and float64 values (ties, subnormals,
overflow edges, specials, random bits) to every low-precision dtype, and
bfloat16 / float16 on to the others."""

from __future__ import annotations

import numpy as np

from ..formats import format as _format
from ._env import LOW_PRECISION
from ._registry import Trace, _register


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
