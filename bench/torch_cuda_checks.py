"""fpemu.torch's quantizers on CUDA: the same bits as on the host, and their speed.

Run where a GPU is (``python bench/torch_cuda_checks.py --out DIR``); CI has
none, so tests/test_torch_quantize.py runs the same code on the CPU. Three
checks, then timings, written to ``DIR/torch_cuda_checks.json``:

1. every format of tests/test_torch_quantize.py (the named ones and six
   custom ones) on its boundary sample (grid, midpoints, neighbours, class
   edges, every float32 exponent around every rounding boundary) and random
   bits, in every rounding mode and, to nearest / up / to odd, every overflow
   policy with subnormals kept and flushed: ``quantize`` and ``encode`` on
   CUDA against the same functions on the CPU (bit for bit; the CPU ones are
   checked against fpemu's Numba kernels by the tests), and, where Numba
   runs, against ``fpemu.quantize`` / ``fpemu.encode`` directly in the
   default configuration;
2. the same inside a function compiled by ``torch.compile`` for bf16, e4m3fn
   with stochastic rounding, and e2m1 codes (the quantizers run between its
   graphs);
3. all 2**32 float32 inputs for bf16, fp16, e4m3fn, e5m2 and e2m1 (nearest
   even, default policy) on CUDA against fpemu's Numba kernels, chunked,
   within a time budget (``--exhaustive-seconds``);
4. timings (CUDA events): quantize to bf16 against ``.to(torch.bfloat16)``,
   the generic path (e4m3fn), stochastic rounding, called directly and from a
   compiled function.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fpemu  # noqa: E402
import fpemu.torch  # noqa: E402
from test_fast_paths import _sample  # noqa: E402
from test_torch_quantize import ALL, MODES, _grid_sample, _inputs, _policies  # noqa: E402


def _u32(t):
    return t.cpu().numpy().view(np.uint32) if t.dtype == torch.float32 else \
        t.cpu().to(torch.int64).numpy()


def _differ(a, b):
    return int(np.count_nonzero(_u32(a) != _u32(b)))


def check_against_cpu(log):
    """Check 1: CUDA against CPU (and fpemu's Numba kernels by default)."""
    rng = np.random.default_rng(0)
    rows, bad = [], 0
    numba_ok = True
    for fmt in ALL:
        x = np.concatenate([_grid_sample(fmt), _sample(),
                            rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64)
                            .astype(np.uint32).view(np.float32)])
        x = _inputs(fmt, x)
        tc, tg = torch.from_numpy(x), torch.from_numpy(x).cuda()
        configs = [{"rounding": m, "seed": 11} for m in MODES]
        configs += [dict(kw, rounding=m) for kw in _policies(fmt) for m in ("rne", "rup", "rto")]
        n = 0
        for kw in configs:
            for op in (fpemu.torch.quantize, fpemu.torch.encode):
                d = _differ(op(tc, fmt, **kw), op(tg, fmt, **kw))
                n += d
                if d:
                    log(f"  MISMATCH {fmt.name} {op.__name__} {kw}: {d} elements")
        if numba_ok:
            try:
                d = _differ(fpemu.torch.quantize(tg, fmt),
                            torch.from_numpy(fpemu.quantize(x, fmt)))
                d += int(np.count_nonzero(fpemu.torch.encode(tg, fmt).cpu().numpy()
                                          != fpemu.encode(x, fmt)))
                n += d
            except Exception as err:                    # Numba missing or too old here
                numba_ok = False
                log(f"  fpemu's Numba kernels do not run here ({err!r}); CPU torch is the oracle")
        rows.append({"format": fmt.name, "inputs": int(x.size), "configs": len(configs),
                     "mismatches": n})
        bad += n
        log(f"{fmt.name:>14}: {x.size} inputs x {len(configs)} configurations x 2 ops: "
            f"{n} mismatches")
    return {"rows": rows, "mismatches": bad, "numba_oracle": numba_ok}


def check_compiled(log):
    """Check 2: a compiled function gives the same bits."""
    def f(x):
        return (fpemu.torch.quantize(x, "bf16"),
                fpemu.torch.quantize(x, "e4m3fn", rounding="sr", seed=(7, 3)),
                fpemu.torch.decode(fpemu.torch.encode(x, "e2m1"), "e2m1"))

    x = _inputs(fpemu.format("e2m1"), _sample())
    xg = torch.from_numpy(x).cuda()
    t0 = time.perf_counter()
    got = torch.compile(f)(xg)
    secs = time.perf_counter() - t0
    want = f(torch.from_numpy(x))
    bad = sum(_differ(g, w) for g, w in zip(got, want))
    log(f"torch.compile on CUDA ({secs:.1f} s to compile): {bad} mismatches on {x.size} inputs")
    return {"mismatches": bad, "inputs": int(x.size), "compile_seconds": round(secs, 1)}


def check_exhaustive(log, budget):
    """Check 3: all 2**32 inputs against fpemu's Numba kernels, while time lasts."""
    out, t0 = {}, time.perf_counter()
    chunk = 1 << 24
    for name in ("bf16", "fp16", "e4m3fn", "e5m2", "e2m1"):
        fmt = fpemu.format(name)
        done, bad = 0, 0
        for s in range(0, 1 << 32, chunk):
            if time.perf_counter() - t0 > budget:
                break
            x = np.arange(s, s + chunk, dtype=np.uint64).astype(np.uint32).view(np.float32)
            x = _inputs(fmt, x)
            g = fpemu.torch.quantize(torch.from_numpy(x).cuda(), fmt)
            w = torch.from_numpy(fpemu.quantize(x, fmt)).cuda()
            bad += int((g.view(torch.int32) != w.view(torch.int32)).sum())
            done += chunk
        out[name] = {"inputs": done, "mismatches": bad, "all": done == 1 << 32}
        log(f"exhaustive {name}: {done} of 2**32 float32 patterns, {bad} mismatches")
    return out


def _time(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def timings(log):
    """Check 4: milliseconds per call on 2**26 float32 values."""
    x = torch.randn(1 << 26, device="cuda")
    out = torch.empty_like(x)
    cq = torch.compile(lambda t: fpemu.torch.quantize(t, "e4m3fn"))
    cb = torch.compile(lambda t: fpemu.torch.quantize(t, "bf16"))
    cs = torch.compile(lambda t: fpemu.torch.quantize(t, "bf16", rounding="sr", seed=1))
    res = {
        "to_bfloat16": _time(lambda: x.to(torch.bfloat16)),
        "to_float8_e4m3fn": _time(lambda: x.to(torch.float8_e4m3fn)),
        "quantize_bf16": _time(lambda: fpemu.torch.quantize(x, "bf16")),
        "quantize_bf16_out": _time(lambda: fpemu.torch.quantize(x, "bf16", out=out)),
        "quantize_e4m3fn": _time(lambda: fpemu.torch.quantize(x, "e4m3fn"), 5),
        "quantize_bf16_sr": _time(lambda: fpemu.torch.quantize(x, "bf16", rounding="sr",
                                                               seed=1), 5),
        "compiled_bf16": _time(lambda: cb(x)),
        "compiled_e4m3fn": _time(lambda: cq(x)),
        "compiled_bf16_sr": _time(lambda: cs(x)),
    }
    res = {k: round(v, 3) for k, v in res.items()}
    for k, v in res.items():
        log(f"{k:>20}: {v:8.3f} ms per 2**26 float32 "
            f"({res['to_bfloat16'] / v:.2f}x the speed of .to(torch.bfloat16))")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--exhaustive-seconds", type=float, default=150.0)
    ap.add_argument("--checks", default="cpu_vs_cuda,compiled,exhaustive,timings_ms",
                    help="which checks to run, comma-separated (default: all four)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("torch_cuda_checks: this PyTorch sees no CUDA device")
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    log(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"{torch.cuda.get_device_name(0)}, numpy {np.__version__}")
    report = {"torch": torch.__version__, "cuda": torch.version.cuda,
              "device": torch.cuda.get_device_name(0)}
    for name, fn in (("cpu_vs_cuda", lambda: check_against_cpu(log)),
                     ("compiled", lambda: check_compiled(log)),
                     ("exhaustive", lambda: check_exhaustive(log, args.exhaustive_seconds)),
                     ("timings_ms", lambda: timings(log))):
        if name not in args.checks.split(","):
            continue
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as err:                       # record it and go on to the next check
            report[name] = {"error": repr(err)}
            log(f"{name}: ERROR {err!r}")
        log(f"[{name}: {time.perf_counter() - t0:.0f} s]")
        with open(os.path.join(args.out, "torch_cuda_checks.json"), "w") as f:
            json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "torch_cuda_checks.log"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
