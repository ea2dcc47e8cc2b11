"""Scenarios of autocast: the output dtype of each op under
``autocast(dtype=bfloat16 / float16)``, for each input dtype."""

from __future__ import annotations

import numpy as np

from ._env import DTYPE_NAMES
from ._registry import Trace, _register


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
