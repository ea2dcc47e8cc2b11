"""Write fpemu/data/cublaslt_splitk_h100pcie.npz: which split-K cuBLASLt picks
for ``torch._scaled_mm`` on an H100 PCIe, as recorded by mmaemu.

mmaemu 0.1.0 (``pip install mmaemu==0.1.0``) ships the heuristic table its
authors recorded on an NVIDIA H100 PCIe (114 SMs, driver 570.148.08,
cuBLASLt 12.8.3.14, torch 2.7.1+cu128's ``scaled_gemm`` descriptor): for
28,018 shapes (M, N, K) and each of the 28 settings (operand formats, output
dtype, fast or slow accumulation) the ``numSplitsK`` that
``cublasLtMatmulAlgoGetHeuristic`` returned, at the workspaces 0, 1 MiB
(torch's default there) and 32 MiB (TransformerEngine's), and the K-grid
bound above which its split-K sweep saw no split (M * N > B(K): S = 1). This
script reads that data (recorded facts; none of mmaemu's code is copied) and
stores what fpemu's ``cublaslt.splitk_decision`` needs, so that fpemu does not
need mmaemu at run time. The tests check the decisions against
``mmaemu.platform.resolve_splitk``.

    python scripts/export_cublaslt_splitk.py     # needs mmaemu (the dev extras)
"""

import hashlib
import json
import pathlib

import numpy as np
from mmaemu.platform import splitk_table as st

TABLE = "heur_h100pcie_lt12.8.3.14"
WORKSPACES = (1 << 20, 32 << 20)
OUT_NAMES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
FMT_NAMES = ("e4m3", "e5m2")


def main():
    data = pathlib.Path(st.__file__).parent / "data"
    meta = json.loads((data / f"{TABLE}.json").read_text())
    raw = (data / f"{TABLE}.npz").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == meta["npz_sha256"]
    z = np.load(data / f"{TABLE}.npz")
    cols = {k: z[k] for k in z.files}
    ws_codes = list(meta["codes"]["ws"])
    split_scheme = set(meta["codes"]["custom -> scheme"].values())
    assert split_scheme == {"contiguous"}
    assert meta["codes"]["custom -> scheme, unlisted"] == "contiguous"

    fa = cols["fa"].astype(np.int64)
    setting = ((fa * 2 + cols["fb"]) * 5 + cols["out"]) * 2 + cols["fast"]
    shape = ((cols["M"].astype(np.int64) << 42) | (cols["N"].astype(np.int64) << 21)
             | cols["K"].astype(np.int64))
    first = cols["ws"] == ws_codes.index(WORKSPACES[0])
    settings = np.unique(setting[first])
    shapes = np.unique(shape[first])
    out = {"settings": np.stack([settings // 20, settings // 10 % 2, settings // 2 % 5,
                                 settings % 2], axis=1).astype(np.uint8),
           "shapes": np.stack([shapes >> 42, (shapes >> 21) & ((1 << 21) - 1),
                               shapes & ((1 << 21) - 1)], axis=1).astype(np.int32)}
    env = meta["envelope"]
    out["envelope_k"] = np.asarray(env["K_grid"], np.int64)
    for ws in WORKSPACES:
        m = cols["ws"] == ws_codes.index(ws)
        S = np.zeros((len(shapes), len(settings)), np.uint8)
        rows, where = np.searchsorted(shapes, shape[m]), np.searchsorted(settings, setting[m])
        S[rows, where] = cols["splitK"][m]
        assert (S > 0).all(), f"workspace {ws}: the table is not every shape under every setting"
        out[f"splits_{ws}"] = S
        B = np.full((len(settings), len(env["K_grid"])), -1, np.int64)
        for b in env["bounds"]:
            if int(b["ws"]) != ws:
                continue
            code = (((FMT_NAMES.index(b["fmt_a"]) * 2 + FMT_NAMES.index(b["fmt_b"])) * 5
                     + OUT_NAMES.index(b["out"])) * 2 + int(b["fast"]))
            row = np.searchsorted(settings, code)
            if row == len(settings) or settings[row] != code:
                continue        # a setting cuBLASLt rejected (no row in the table)
            B[row] = [-1 if v is None else int(v) for v in b["B"]]
        out[f"bounds_{ws}"] = B
    about = {
        "source": f"mmaemu 0.1.0, table {TABLE} (npz sha256 {meta['npz_sha256']})",
        "device": meta["profile_device"],
        "descriptor": meta["descriptor"],
        "split_rule": meta["split_rule"],
        "envelope": {"claim": env["claim"], "K_min": env["K_min"], "K_max": env["K_max"],
                     "validation": {w: v["status"] for w, v in env["validation"].items()},
                     "note": env["note"]},
        "workspace0": meta["workspace0_note"],
        "rejects": meta["rejects"],
    }
    out["about"] = np.array(json.dumps(about, sort_keys=True))
    path = pathlib.Path(__file__).resolve().parents[1] / "fpemu" / "data" / \
        "cublaslt_splitk_h100pcie.npz"
    path.parent.mkdir(exist_ok=True)
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({path.stat().st_size:,} bytes): {len(shapes):,} shapes x "
          f"{len(settings)} settings, workspaces {WORKSPACES}")


if __name__ == "__main__":
    main()
