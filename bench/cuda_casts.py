"""Other libraries' GPU conversions checked with fpemu.testing.

Run where a CUDA GPU is (needs torch, numpy, fpemu; Triton and nvcc where
installed)::

    python bench/cuda_casts.py --out DIR [--sweep-seconds 240]

The conversions (``KERNELS``):

- torch's ``.to(dtype)`` on CUDA: bfloat16, float16, the four float8 types
  and float8_e8m0fnu;
- CUDA's own conversion functions (bench/cuda_casts.cu, built here with
  nvcc): ``__float2bfloat16_rn/rz/rd/ru``, ``__float2half_rn/rz/rd/ru``,
  ``__nv_cvt_float_to_fp8`` (e4m3 and e5m2, saturating and not),
  ``__nv_cvt_float_to_e8m0``, ``__nv_cvt_float_to_fp4`` and ``_fp6``;
- Triton's ``x.to(dtype, fp_downcast_rounding=...)`` to bf16, fp16 and its
  two fp8 types, "rtne" and "rtz".

Each is given the rounding fpemu is asked to check it against (``claim``):
what its documentation says, or the library's own name for it. Three checks
per conversion, all through fpemu.testing:

1. every edge input of the format (``strategies.edge_inputs``: class edges,
   every midpoint and its neighbours, the overflow and flush thresholds,
   powers of two, NaN patterns); where the claim fails, every rounding mode,
   overflow policy and subnormal handling is tried and the ones that pass
   are listed;
2. every bf16 and every fp16 input (``exhaustive``);
3. all 2**32 float32 inputs: (a) on the GPU, in chunks of 2**26, against
   ``fpemu.torch.quantize`` there (fast: about a second a conversion on an
   H100), with the claim or, where the edges refuted it, the first setting
   that passed them (``--sweep-failing``: the claim anyway, to count its
   mismatches); a sample of the mismatches goes to fpemu.testing for the
   message; (b) through ``exhaustive`` with fpemu's host kernels as the
   oracle (about 90 s a conversion on 16 cores), conversion after
   conversion while ``--sweep-seconds`` last.

Written to DIR: ``cuda_casts.json`` (versions, and per conversion each
check's result, with fpemu.testing's message where it fails) and
``cuda_casts.npz`` (the inputs of ``edge_inputs(fmt, per_kind=1024)`` per
format and each conversion's codes for them: the committed data of
tests/test_cuda_casts.py). ``--summary`` merges reports into the committed
counts (tests/data/cuda_casts_*.json). ``--host`` runs torch's CPU casts and
the CUDA library's host code path on the CPU (no GPU needed: a check of this
script).

The committed data came from three runs on an H100 (2026-11-27)::

    python bench/cuda_casts.py --out r1 --sweep-seconds 180
    python bench/cuda_casts.py --out r2 --sweep-seconds 0
    python bench/cuda_casts.py --out r3 --sweep-seconds 0 --sweep-failing \
        --only "e8m0,float8e5 rtne"
    python bench/cuda_casts.py --out . --summary r1/cuda_casts.json \
        r2/cuda_casts.json r3/cuda_casts.json     # + r2/cuda_casts.npz
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import fpemu  # noqa: E402
from fpemu.testing import compare, exhaustive  # noqa: E402
from fpemu.testing.strategies import edge_inputs  # noqa: E402
from gpu_check import nvidia_driver  # noqa: E402  (bench/, beside this script)

HERE = os.path.dirname(os.path.abspath(__file__))
ROUNDINGS = ("rne", "rna", "rtz", "rup", "rdn", "rto")
OVERFLOWS = ("inf", "saturate", "nan")


@dataclasses.dataclass
class Kernel:
    name: str
    fmt: str
    claim: dict          # rounding / overflow / subnormals for fpemu.testing
    run: object          # float32 CUDA tensor -> result tensor (values or codes)
    note: str = ""


# --------------------------------------------------------------------------- torch's casts

def _torch_kernels(torch):
    def cast(dtype):
        return lambda x: x.to(dtype)
    t = torch
    out = [Kernel("torch bfloat16", "bf16", {}, cast(t.bfloat16)),
           Kernel("torch float16", "fp16", {}, cast(t.float16)),
           # torch < 2.12 gives NaN past 448 (docs/pytorch-numerics.md 1.1); later saturate
           Kernel("torch float8_e4m3fn", "e4m3fn", {"overflow": "nan"}, cast(t.float8_e4m3fn)),
           Kernel("torch float8_e5m2", "e5m2", {}, cast(t.float8_e5m2)),
           Kernel("torch float8_e4m3fnuz", "e4m3fnuz", {}, cast(t.float8_e4m3fnuz)),
           Kernel("torch float8_e5m2fnuz", "e5m2fnuz", {}, cast(t.float8_e5m2fnuz))]
    if hasattr(t, "float8_e8m0fnu"):
        out.append(Kernel("torch float8_e8m0fnu", "e8m0", {"rounding": "rne"},
                          lambda x: x.to(t.float8_e8m0fnu).view(t.uint8)))
    return out


# --------------------------------------------------------------------------- CUDA's functions

# op code of bench/cuda_casts.cu: (name, fpemu format, claim)
CUDA_OPS = [
    ("__float2bfloat16_rn", "bf16", {}),
    ("__float2bfloat16_rz", "bf16", {"rounding": "rtz"}),
    ("__float2bfloat16_rd", "bf16", {"rounding": "rdn"}),
    ("__float2bfloat16_ru", "bf16", {"rounding": "rup"}),
    ("__float2half_rn", "fp16", {}),
    ("__float2half_rz", "fp16", {"rounding": "rtz"}),
    ("__float2half_rd", "fp16", {"rounding": "rdn"}),
    ("__float2half_ru", "fp16", {"rounding": "rup"}),
    ("__nv_cvt_float_to_fp8 E4M3 SATFINITE", "e4m3fn", {"overflow": "saturate"}),
    ("__nv_cvt_float_to_fp8 E4M3 NOSAT", "e4m3fn", {"overflow": "nan"}),
    ("__nv_cvt_float_to_fp8 E5M2 SATFINITE", "e5m2", {"overflow": "saturate"}),
    ("__nv_cvt_float_to_fp8 E5M2 NOSAT", "e5m2", {"overflow": "inf"}),
    ("__nv_cvt_float_to_e8m0 SATFINITE RoundZero", "e8m0",
     {"rounding": "rtz", "overflow": "saturate"}),
    ("__nv_cvt_float_to_e8m0 SATFINITE RoundPosInf", "e8m0",
     {"rounding": "rup", "overflow": "saturate"}),
    ("__nv_cvt_float_to_e8m0 NOSAT RoundPosInf", "e8m0", {"rounding": "rup", "overflow": "nan"}),
    ("__nv_cvt_float_to_fp4 E2M1 RoundNearest", "e2m1", {}),
    ("__nv_cvt_float_to_fp4 E2M1 RoundZero", "e2m1", {"rounding": "rtz"}),
    ("__nv_cvt_float_to_fp6 E2M3 RoundNearest", "e2m3", {}),
    ("__nv_cvt_float_to_fp6 E3M2 RoundNearest", "e3m2", {}),
    ("__nv_cvt_float_to_fp6 E3M2 RoundZero", "e3m2", {"rounding": "rtz"}),
]


def _build_cuda_lib(where):
    so = os.path.join(where, "cuda_casts.so")
    cmd = ["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
           os.path.join(HERE, "cuda_casts.cu"), "-o", so]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    lib = ctypes.CDLL(so)
    for fn in (lib.fpemu_cast_cuda, lib.fpemu_cast_host):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.fpemu_cuda_error.argtypes = [ctypes.c_int]
    lib.fpemu_cuda_error.restype = ctypes.c_char_p
    assert lib.fpemu_n_ops() == len(CUDA_OPS), "CUDA_OPS and cuda_casts.cu disagree"
    return lib


def _cuda_kernels(torch, lib, host):
    out = []
    for op, (name, fmt, claim) in enumerate(CUDA_OPS):
        wide = op < 8

        def run(x, op=op, wide=wide):
            if host:
                xc = np.ascontiguousarray(x.cpu().numpy() if hasattr(x, "cpu") else x,
                                          dtype=np.float32)
                y = np.empty(xc.shape, np.uint16 if wide else np.uint8)
                lib.fpemu_cast_host(xc.ctypes.data, y.ctypes.data, xc.size, op)
                return torch.from_numpy(y.view(np.int16) if wide else y)
            x = x.contiguous()
            y = torch.empty(x.shape, dtype=torch.int16 if wide else torch.uint8,
                            device=x.device)
            err = lib.fpemu_cast_cuda(x.data_ptr(), y.data_ptr(), x.numel(), op)
            if err:
                raise RuntimeError(f"{name}: CUDA error {err} "
                                   f"({lib.fpemu_cuda_error(err).decode()})")
            return y
        out.append(Kernel(name, fmt, claim, run, "host code path" if host else ""))
    return out


# --------------------------------------------------------------------------- Triton's casts

def _triton_kernels(torch):
    import triton
    import triton.language as tl

    # one kernel per rounding mode, each with the mode as a literal: these are the kernels
    # that ran on the H100 (the committed data); a rounding passed as a constexpr string
    # was not tried there
    @triton.jit
    def _rtne(x_ptr, y_ptr, n, DT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, x.to(DT, fp_downcast_rounding="rtne"), mask=m)

    @triton.jit
    def _rtz(x_ptr, y_ptr, n, DT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, x.to(DT, fp_downcast_rounding="rtz"), mask=m)

    def make(kernel, tl_dt, torch_dt):
        def run(x):
            x = x.contiguous()
            y = torch.empty(x.shape, dtype=torch_dt, device=x.device)
            n = x.numel()
            kernel[(triton.cdiv(n, 1024),)](x, y, n, DT=tl_dt, BLOCK=1024)
            return y
        return run

    out = []
    for fmt, tl_dt, torch_dt, tname in [("bf16", tl.bfloat16, torch.bfloat16, "bfloat16"),
                                        ("fp16", tl.float16, torch.float16, "float16"),
                                        ("e4m3fn", tl.float8e4nv, torch.float8_e4m3fn,
                                         "float8e4nv"),
                                        ("e5m2", tl.float8e5, torch.float8_e5m2, "float8e5")]:
        out.append(Kernel(f"triton {tname} rtne", fmt, {}, make(_rtne, tl_dt, torch_dt),
                          f"triton {triton.__version__}"))
        out.append(Kernel(f"triton {tname} rtz", fmt, {"rounding": "rtz"},
                          make(_rtz, tl_dt, torch_dt), f"triton {triton.__version__}"))
    return out


# --------------------------------------------------------------------------- the checks

def _configs(fmt):
    f = fpemu.format(fmt)
    for r in ROUNDINGS:
        for o in OVERFLOWS:
            for s in (True, False):
                try:
                    fpemu.quantize(np.zeros(1, np.float32), f, rounding=r, overflow=o,
                                   subnormals=s)
                except Exception:
                    continue
                yield {"rounding": r, "overflow": o, "subnormals": s}


def _edge_x(fmt):
    x = edge_inputs(fmt, per_kind=None)
    if not fpemu.format(fmt).signed:              # e8m0: the negatives too
        x = np.concatenate([x, -x])
    if not fpemu.format(fmt).has_nan:             # no rule for NaN inputs
        x = x[~np.isnan(x)]
    return x


def _result(y):
    """A result as NumPy (values) or codes, for fpemu.testing."""
    if isinstance(y, np.ndarray):
        return y
    import torch
    y = y.cpu()
    if y.dtype == torch.int16:                               # 16-bit codes
        return y.numpy().view(np.uint16)
    return y


def _bits(y):
    """A result's bit patterns (the format's codes), as NumPy."""
    if isinstance(y, np.ndarray):
        return y
    import torch
    y = y.cpu()
    if y.dtype.is_floating_point:
        y = y.view(torch.uint8 if y.element_size() == 1 else torch.int16)
    a = y.numpy()
    return a.view(np.uint16) if a.dtype == np.int16 else a


def check_edges(k, to_device):
    x = _edge_x(k.fmt)
    y = _result(k.run(to_device(x)))
    rep = compare(y, x, k.fmt, **k.claim)
    res = {"inputs": int(x.size), "mismatches": int(rep.mismatches)}
    if rep.mismatches:
        res["message"] = rep.message()
        # every rounding / overflow / subnormal setting, on a sample of the edges
        pick = np.unique(np.linspace(0, x.size - 1, min(x.size, 20000)).astype(np.int64))
        ys, xs = _bits(y)[pick], x[pick]
        res["passing_configs"] = [c for c in _configs(k.fmt)
                                  if compare(ys, xs, k.fmt, **c).mismatches == 0]
    return res, y, x


def sweep(k, to_device, source):
    t0 = time.perf_counter()
    res = {}
    try:
        rep = exhaustive(lambda x: _result(k.run(to_device(x))), k.fmt, source,
                         progress=False, **k.claim)
        res = {"compared": rep.compared, "skipped_nan": rep.skipped_nan, "mismatches": 0}
    except AssertionError as err:
        res = {"failed": True, "message": str(err)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def device_sweep(k, claim, dev, chunk=1 << 26, start=0, stop=1 << 32):
    """All float32 inputs (``start:stop`` by bit pattern) on the device,
    against fpemu.torch.quantize there (itself equal to fpemu's host kernels
    on all 2**32 inputs, bench/torch_cuda_checks.py); a sample of the
    mismatches (up to 64 a chunk) goes to fpemu.testing.compare on the host
    for the message."""
    import torch
    import fpemu.torch as ft
    f = fpemu.format(k.fmt)
    tables = {}
    t0 = time.perf_counter()
    bad_x, n_bad, n_nan, compared = [], 0, 0, 0
    for s in range(start, stop, chunk):
        bits = torch.arange(s, min(s + chunk, stop), dtype=torch.int64, device=dev)
        x = bits.to(torch.int32).view(torch.float32)
        y = k.run(x)
        if not y.dtype.is_floating_point:                       # codes: decode on the device
            bits_y = f.bits
            if bits_y not in tables:
                codes = np.arange(1 << bits_y, dtype=np.uint64).astype(f.code_dtype)
                tables[bits_y] = torch.from_numpy(
                    fpemu.decode(codes, f).astype(np.float32)).to(dev)
            y = tables[bits_y][y.to(torch.int64) & ((1 << bits_y) - 1)]
        else:
            y = y.float()
        nan_in = torch.isnan(x)
        if not f.has_nan:
            n_nan += int(nan_in.sum())
            x = torch.where(nan_in, torch.zeros_like(x), x)
        e = ft.quantize(x, f, **claim)
        same = ((y == e) & (torch.signbit(y) == torch.signbit(e))) | (torch.isnan(y)
                                                                      & torch.isnan(e))
        if not f.has_nan:
            same |= nan_in
        compared += x.numel() - (0 if f.has_nan else int(nan_in.sum()))
        wrong = ~same
        nb = int(wrong.sum())
        if nb:
            n_bad += nb
            pick = torch.linspace(0, nb - 1, min(nb, 64), dtype=torch.float64, device=dev)
            bad_x.append(x[wrong][pick.long()].cpu().numpy())   # spread over the sweep
    res = {"compared": compared, "mismatches": n_bad, "skipped_nan": n_nan,
           "seconds": round(time.perf_counter() - t0, 1), "oracle": "fpemu.torch.quantize"}
    if n_bad:
        xb = np.concatenate(bad_x)
        res["message"] = compare(_result(k.run(torch.from_numpy(xb).to(dev))), xb, k.fmt,
                                 **claim).message()
    return res


def summary(reports):
    """The committed summary (tests/data/cuda_casts_*.json) of one or more
    reports of this script, later ones overriding earlier ones per
    conversion and check: no messages (the tests make them again from the
    codes), the counts."""
    out = {"meta": reports[0]["meta"], "kernels": {}}
    for rep in reports:
        for name, e in rep["kernels"].items():
            k = out["kernels"].setdefault(name, {"fmt": e["fmt"], "note": e["note"]})
            for check in ("edges", "every_bf16", "every_fp16", "every_float32", "device_sweep"):
                v = e.get(check)
                if not isinstance(v, dict) or "error" in v:
                    continue
                got = {key: v[key] for key in ("inputs", "compared", "mismatches", "skipped_nan",
                                               "passing_configs", "config", "oracle", "seconds")
                       if key in v}
                if v.get("failed"):                  # "fpemu.testing: N of M values differ"
                    got["mismatches"] = int(v["message"].split()[1])
                    got["compared"] = int(v["message"].split()[3])
                if check == "device_sweep":          # one per configuration swept
                    sweeps = [d for d in k.get("device_sweeps", []) if d["config"] != got["config"]]
                    k["device_sweeps"] = sweeps + [got]
                    continue
                k[check] = got
                if check == "edges":
                    k["claim"] = e["claim"]
            if e.get("error"):
                k["error"] = e["error"].strip().splitlines()[-1]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", nargs="+", metavar="REPORT",
                    help="only merge these cuda_casts.json reports into OUT/cuda_casts_summary"
                         ".json (the committed form)")
    ap.add_argument("--sweep-seconds", type=float, default=240.0)
    ap.add_argument("--host", action="store_true",
                    help="the CUDA library's host code path only (no GPU)")
    ap.add_argument("--only", default="", help="run only conversions whose name holds one of "
                    "these comma-separated words")
    ap.add_argument("--sweep-failing", action="store_true",
                    help="sweep a conversion against its claim even where the edges refute it "
                         "(counts its mismatches over all inputs)")
    ap.add_argument("--device-sweep-stop", type=int, default=1 << 32,
                    help="the float32 bit patterns 0:N of the device sweep (default all)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.summary:
        reports = [json.load(open(f)) for f in args.summary]
        with open(os.path.join(args.out, "cuda_casts_summary.json"), "w") as fh:
            json.dump(summary(reports), fh, indent=1, sort_keys=True)
        return
    import torch

    meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "cuda": torch.version.cuda, "numpy": np.__version__, "fpemu": fpemu.__version__,
            "python": platform.python_version()}
    if not args.host:
        meta["device_name"] = torch.cuda.get_device_name()
        meta["capability"] = list(torch.cuda.get_device_capability())
        meta["driver"] = nvidia_driver()
    try:
        meta["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                      timeout=60).stdout.strip().splitlines()[-1]
    except Exception as err:                                   # noqa: BLE001
        meta["nvcc"] = f"unknown ({err})"
    report = {"meta": meta, "errors": [], "kernels": {}}

    def save():
        with open(os.path.join(args.out, "cuda_casts.json"), "w") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)

    kernels = []
    dev = "cpu" if args.host else "cuda"

    def to_device(x):
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(dev)

    kernels += _torch_kernels(torch)              # on the CPU with --host
    try:
        lib = _build_cuda_lib(tempfile.mkdtemp())
        kernels += _cuda_kernels(torch, lib, args.host)
    except Exception:                                          # noqa: BLE001
        report["errors"].append("CUDA library: " + traceback.format_exc()[-3000:])
    if not args.host:
        try:
            kernels += _triton_kernels(torch)
            meta["triton"] = __import__("triton").__version__
        except Exception:                                      # noqa: BLE001
            report["errors"].append("Triton: " + traceback.format_exc()[-3000:])
    kernels = [k for k in kernels if any(w in k.name for w in args.only.split(","))]
    save()

    data = {}
    for k in kernels:                                   # 1 and 2: edges, bf16 and fp16 inputs
        t0 = time.perf_counter()
        entry = report["kernels"][k.name] = {"fmt": k.fmt, "claim": k.claim, "note": k.note}
        try:
            entry["edges"], y, x = check_edges(k, to_device)
            small = edge_inputs(k.fmt, per_kind=1024)
            if not fpemu.format(k.fmt).signed:
                small = np.concatenate([small, -small])
            if not fpemu.format(k.fmt).has_nan:
                small = small[~np.isnan(small)]
            ys = _bits(k.run(to_device(small)))
            data[f"x/{k.fmt}"] = small.view(np.uint32)
            data[f"y/{k.name}"] = ys
            for source in ("bf16", "fp16"):
                entry[f"every_{source}"] = sweep(k, to_device, source)
        except Exception:                                      # noqa: BLE001
            entry["error"] = traceback.format_exc()[-3000:]
        entry["seconds_edges"] = round(time.perf_counter() - t0, 1)
        print(f"{k.name}: edges {entry.get('edges', {}).get('mismatches', 'error')} off, "
              f"{entry['seconds_edges']} s", flush=True)
        save()
    np.savez_compressed(os.path.join(args.out, "cuda_casts.npz"), **data)

    for k in kernels:              # 3a: all float32 inputs on the device, fpemu.torch oracle
        entry = report["kernels"][k.name]
        edges = entry.get("edges", {})
        claim = (k.claim if edges.get("mismatches", 1) == 0 or args.sweep_failing else
                 (edges.get("passing_configs") or [None])[0])
        if claim is None:
            continue
        try:
            entry["device_sweep"] = device_sweep(k, claim, dev, stop=args.device_sweep_stop)
            entry["device_sweep"]["config"] = claim
        except Exception:                                      # noqa: BLE001
            entry["device_sweep"] = {"error": traceback.format_exc()[-3000:]}
        print(f"{k.name}: device sweep {entry['device_sweep'].get('mismatches', 'error')} off, "
              f"{entry['device_sweep'].get('seconds')} s", flush=True)
        save()

    # 3b: all 2**32 float32 inputs through fpemu.testing.exhaustive (host oracle; slow)
    deadline = time.perf_counter() + (0 if args.host else args.sweep_seconds)
    for k in kernels:
        entry = report["kernels"][k.name]
        if entry.get("edges", {}).get("mismatches", 1):
            continue                                       # its claim is already wrong
        if time.perf_counter() > deadline:
            entry["every_float32"] = "not run (out of --sweep-seconds)"
            continue
        entry["every_float32"] = sweep(k, to_device, "float32")
        print(f"{k.name}: all float32 {entry['every_float32'].get('mismatches', 'failed')} "
              f"off, {entry['every_float32']['seconds']} s", flush=True)
        save()
    save()
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
