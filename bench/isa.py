"""Run a command as if this CPU had AVX2 but no AVX-512.

Masking AVX-512 takes one setting per library, each of which picks its own
vector code:

* Numba (LLVM): ``NUMBA_CPU_NAME=haswell`` alone is not enough, because
  Numba still passes the host's feature string to LLVM and the features win
  over the CPU name; ``NUMBA_CPU_FEATURES`` must list the host's features with
  every ``avx512*`` (and AMX, AVX10) turned off;
* numpy: ``NPY_DISABLE_CPU_FEATURES`` with its AVX-512 dispatch targets;
* torch (ATen): ``ATEN_CPU_CAPABILITY=avx2``; MKL: ``MKL_ENABLE_INSTRUCTIONS=AVX2``;
  oneDNN (torch's contiguous float32 gelu, convolutions, ...), whose JIT
  picks its code from the CPU's features, not from ATen's capability:
  ``ONEDNN_MAX_CPU_ISA=AVX2``.

Numba keys its on-disk cache by CPU name and features, so the masked kernels
are compiled into a cache directory of their own (``NUMBA_CACHE_DIR``).

    python bench/isa.py avx2 -- python bench/bench_quantize.py
    python bench/isa.py avx2 --print        # the variables, as shell assignments
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile


def numpy_avx512_targets() -> str:
    """numpy's AVX-512 dispatch targets in this build (numpy 2.x: X86_V4,
    AVX512_ICL, AVX512_SPR; numpy 1.x: AVX512F, AVX512_SKX, ...). numpy
    refuses to disable a name that is not one of its dispatch targets."""
    import numpy as np
    try:
        dispatch = np._core._multiarray_umath.__cpu_dispatch__
    except AttributeError:                                    # numpy 1.x
        dispatch = np.core._multiarray_umath.__cpu_dispatch__
    return " ".join(t for t in dispatch if "AVX512" in t or t == "X86_V4")


def host_features() -> str:
    """LLVM's feature string of this CPU (``+avx2,-avx512f,...``)."""
    from llvmlite import binding
    return binding.get_host_cpu_features().flatten()


def _masked(features: str) -> str:
    out = []
    for f in features.split(","):
        name = f[1:]
        if name.startswith(("avx512", "amx", "avx10", "evex512")):
            out.append("-" + name)
        else:
            out.append(f)
    return ",".join(out)


def avx2_env(base=None) -> dict:
    """A copy of ``base`` (default ``os.environ``) with AVX-512 masked in
    Numba, numpy, ATen, MKL and oneDNN (module note)."""
    env = dict(os.environ if base is None else base)
    env.update({
        "NUMBA_CPU_NAME": "haswell",
        "NUMBA_CPU_FEATURES": _masked(host_features()),
        "NPY_DISABLE_CPU_FEATURES": numpy_avx512_targets(),
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "NUMBA_CACHE_DIR": os.path.join(tempfile.gettempdir(), "fpemu-numba-avx2"),
    })
    return env


def has_avx512() -> bool:
    return "+avx512f" in host_features().split(",")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("isa", choices=["avx2"])
    ap.add_argument("--print", action="store_true", help="print the variables and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    env = avx2_env()
    if args.command == ["--print"]:             # REMAINDER takes a flag after the ISA too
        args.print, args.command = True, []
    if args.print:
        for k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NPY_DISABLE_CPU_FEATURES",
                  "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
                  "NUMBA_CACHE_DIR"):
            print(f"export {k}={shlex.quote(env[k])}")
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give a command after --, for example: -- python bench/bench_quantize.py")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
