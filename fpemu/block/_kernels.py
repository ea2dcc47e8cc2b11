"""The block formats' own Numba kernel: elements times their block scales.

:func:`fpemu.block.host.scaled_values` calls it; ``fpemu.torch``'s emulated
GEMMs take their operands' values from it on the CPU, in one pass over the
codes where decoding and scaling took three.
"""

from __future__ import annotations

from numba import prange

from .._jit import pjit


@pjit
def scaled_values(codes, table, scales, rows, cols, by, bx, out):
    """``out[r, c] = table[codes[r, c]] * scales[r // by, c // bx]`` in
    float32 over a (rows, cols) array flattened row-major (``scales``
    flattened too, ``ceil(cols / bx)`` per row of blocks): one product of two
    float32 numbers per element, as torch's or NumPy's float32 product."""
    nc = (cols + bx - 1) // bx
    for r in prange(rows):
        base = r * cols
        srow = (r // by) * nc
        if bx == 1:                             # blocks down the columns: a scale each
            for c in range(cols):
                out[base + c] = table[codes[base + c]] * scales[srow + c]
        else:                                   # runs of bx elements share a scale
            for cb in range(nc):
                s = scales[srow + cb]
                for c in range(cb * bx, min(cb * bx + bx, cols)):
                    out[base + c] = table[codes[base + c]] * s
