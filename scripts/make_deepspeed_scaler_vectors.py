"""Write tests/data/deepspeed_loss_scaler.json: DeepSpeed's dynamic loss scale, step by step.

DeepSpeed's ``DynamicLossScaler`` (``deepspeed/runtime/fp16/loss_scaler.py``,
0.19.8 here) decides the fp16 loss scale of a ZeRO run from the overflows it
is told of: halve after ``hysteresis`` overflows, double after
``loss_scale_window`` clean steps, never below ``min_loss_scale``. This
script drives DeepSpeed's own class through fixed overflow patterns under
several configurations (a one-process gloo group: the class asks
``deepspeed.comm`` for its rank when it logs) and stores the scale before
each step and whether the step raised at the minimum. The tests replay the
patterns through fpemu's ``DeepSpeedLossScaler``; CI needs neither torch nor
DeepSpeed.

    pip install deepspeed==0.19.8
    DS_ACCELERATOR=cpu python scripts/make_deepspeed_scaler_vectors.py
"""

import json
import os
import pathlib

import numpy as np

# each: the fp16 section of a DeepSpeed JSON, and a pattern of overflows (1) and clean steps (0)
CASES = [
    ({}, "0000011011100000000111"),
    ({"initial_scale_power": 8, "loss_scale_window": 3, "hysteresis": 2}, "0001101000000100010000"),
    ({"initial_scale_power": 4, "loss_scale_window": 2, "hysteresis": 1, "min_loss_scale": 4},
     "011111000011111"),
    ({"initial_scale_power": 10, "loss_scale_window": 4, "hysteresis": 3,
      "consecutive_hysteresis": True}, "1101101110000000011011100"),
    ({"initial_scale_power": 5, "loss_scale_window": 5, "hysteresis": 2, "min_loss_scale": 0.25},
     "".join(np.random.default_rng(1).choice(["0", "1"], 60, p=[0.7, 0.3]))),
]


def main():
    import socket

    import deepspeed
    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo")
    out = []
    for fp16, pattern in CASES:
        scaler = DynamicLossScaler(
            init_scale=2.0 ** fp16.get("initial_scale_power", 16),
            scale_window=fp16.get("loss_scale_window", 1000),
            min_scale=fp16.get("min_loss_scale", 1),
            delayed_shift=fp16.get("hysteresis", 2),
            consecutive_hysteresis=fp16.get("consecutive_hysteresis", False),
            dtype=torch.half)
        scales, raised = [], None
        for i, c in enumerate(pattern):
            scales.append(float(scaler.cur_scale))
            try:
                scaler.update_scale(c == "1")
            except Exception as err:      # DeepSpeed raises a bare Exception at the minimum
                if "minimum" not in str(err):
                    raise
                raised = i
                break
        out.append({"fp16": fp16, "pattern": pattern, "scales": scales, "raised_at": raised})
    deepspeed.comm.destroy_process_group()
    path = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data"
    (path / "deepspeed_loss_scaler.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {len(out)} patterns to {path / 'deepspeed_loss_scaler.json'}")


if __name__ == "__main__":
    main()
