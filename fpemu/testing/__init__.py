"""fpemu as the oracle in other projects' tests.

- :mod:`fpemu.testing.strategies`: hypothesis strategies for the inputs a
  format's rules are about (class edges, midpoints and their neighbours,
  overflow and flush thresholds, powers of two); needs hypothesis.
- :func:`assert_quantized_equal`: compares a conversion's result with
  :func:`fpemu.quantize` bit for bit and, on a mismatch, says which rule the
  conversion follows instead, with the first mismatches and reproducers.
- :func:`assert_blocks_equal`: the same for a block quantizer's codes and
  scales against :func:`fpemu.block.quantize_blocks` (the scale rule, the
  RHT, an unclamped scale named).
- :func:`exhaustive`: a conversion over every input of a 16-bit or 8-bit
  source, or all 2**32 float32 inputs in chunks.
- A pytest plugin (loaded by pytest through the package's ``pytest11`` entry
  point): the fixture ``fpemu_oracle`` and the marker ``fpemu_exhaustive``.

See "Test your own kernels" in the documentation.
"""

import fpemu
from ._assert import Report, assert_quantized_equal, compare
from ._blocks import BlocksReport, assert_blocks_equal, compare_blocks
from ._exhaustive import SOURCES, exhaustive

__all__ = ["assert_quantized_equal", "compare", "Report", "assert_blocks_equal", "compare_blocks",
           "BlocksReport", "exhaustive", "SOURCES", "Oracle"]


class Oracle:
    """What the ``fpemu_oracle`` fixture gives: fpemu's conversions and the
    assertions of this package, in one object.

    Examples
    --------
    >>> o = Oracle()
    >>> float(o.quantize(0.1, "bf16"))
    0.10009765625
    """

    def __init__(self):
        self.quantize, self.encode, self.decode = fpemu.quantize, fpemu.encode, fpemu.decode
        self.explain = fpemu.explain
        self.assert_quantized_equal = assert_quantized_equal
        self.assert_blocks_equal = assert_blocks_equal
        self.compare = compare
        self.exhaustive = exhaustive

    @property
    def strategies(self):
        """:mod:`fpemu.testing.strategies` (imported on first use: it needs hypothesis)."""
        from . import strategies  # needs hypothesis, an optional dependency
        return strategies
