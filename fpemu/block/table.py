"""How well each block format represents a tensor: :func:`error_table`."""

from __future__ import annotations

import numpy as np

from ..errors import FpemuValueError
from .checks import float32_input
from .host import quantize_blocks
from .spec import PRESETS

__all__ = ["TABLE_PRESETS", "error_table", "error_shares"]

#: The presets :func:`error_table` compares by default.
TABLE_PRESETS = ("mxfp8", "mxfp8-te", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "mxfp4-rceil",
                 "nvfp4", "nvfp4-2d", "nvfp4-torchao", "nvfp4-4over6", "nvfp4-cudnn")


def error_table(x, presets=TABLE_PRESETS, axis=-1):
    """How well each block format represents ``x`` (float32 values): one row
    per preset with ``bits`` (per value: element bits plus the scale's share),
    ``mse``, ``sqnr_db`` (10 log10 of sum x**2 over the sum of squared errors,
    both exact), ``clipped`` (the share of blocks with a scaled value that
    the clamp to the element maximum, not rounding, brought down) and
    ``flushed`` (the share of nonzero values that became zero); and the
    counts behind them (``values``, ``blocks``, ``clipped_blocks``,
    ``nonzero``, ``flushed_values``, ``sse``: the sum of squared errors,
    ``power``: the sum of squares), so that rows of several tensors add up.
    ``"mxfp4-rceil"`` is MXFP4 with the scale rounded up.

    Examples
    --------
    >>> import numpy as np
    >>> from fpemu import block
    >>> x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    >>> rows = block.error_table(x, ["mxfp8", "nvfp4"])
    >>> [(r["preset"], r["bits"], round(r["sqnr_db"], 1)) for r in rows]
    [('mxfp8', 8.25, 30.3), ('nvfp4', 4.5, 20.5)]
    """
    x = float32_input(x, "error_table")
    ref = x.astype(np.float64)
    power = float(np.sum(ref ** 2))
    rows = []
    for name in presets:
        key, rule = (name, None)
        if name == "mxfp4-rceil":
            key, rule = "mxfp4", "rceil"
        if key not in PRESETS:
            raise FpemuValueError(f"error_table(): unknown preset {name!r}; choose from "
                                  f"{', '.join(PRESETS)} or mxfp4-rceil")
        p = PRESETS[key]
        q = quantize_blocks(x, key, axis=axis, scale_rule=rule)
        v = q.values
        err = float(np.sum((ref - v) ** 2))
        nblock = int(np.prod(p.block)) if isinstance(p.block, tuple) else p.block
        nz = ref != 0
        counts = {"values": int(x.size), "blocks": int(q.clipped.size),
                  "clipped_blocks": int(q.clipped.sum()), "nonzero": int(nz.sum()),
                  "flushed_values": int(np.sum(v[nz] == 0)), "sse": err, "power": power}
        rows.append({
            "preset": name, "elem": q.elem.name, "scale": q.scale_fmt.name, **counts,
            "block": "x".join(map(str, p.block)) if isinstance(p.block, tuple) else p.block,
            "rule": q.scale_rule,
            "bits": q.elem.bits + q.scale_fmt.bits / nblock,
            "mse": err / max(x.size, 1),
            **error_shares(counts),
        })
    return rows


def error_shares(c):
    """``sqnr_db``, ``clipped`` and ``flushed`` from the counts of
    :func:`error_table` (of one tensor, or summed over several)."""
    err = c["sse"]
    return {"sqnr_db": float(10 * np.log10(c["power"] / err)) if err > 0 else float("inf"),
            "clipped": c["clipped_blocks"] / c["blocks"] if c["blocks"] else 0.0,
            "flushed": c["flushed_values"] / c["nonzero"] if c["nonzero"] else 0.0}
