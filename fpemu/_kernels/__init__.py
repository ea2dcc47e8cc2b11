"""Numba kernels: rounding on integer bit patterns.

Contract shared by every kernel here: 1-D contiguous arrays and integers in,
arrays out; no Python objects; no exceptions (the callers in
:mod:`fpemu.quantize` check the input first). A format reaches a kernel as the
tuple ``p`` and the int ``flags`` of a :class:`fpemu.quantize.Cast`
(``Cast.params``, ``Cast.flags``)::

    p[0]  M        mantissa bits              p[4]  maxmag   code of max (no sign)
    p[1]  emin     exponent of min normal     p[5]  infmag   code of inf, or -1
    p[2]  emax     exponent of max            p[6]  nancode  canonical NaN code
    p[3]  bias                                 p[7]  sign_shift  E + M

    flags: bits 0-1 overflow policy (0 inf, 1 saturate, 2 nan), then one bit
    each for FLUSH (subnormal results -> 0), FNUZ (no -0; NaN there),
    UNSIGNED (no sign bit), NO_ZERO (field 0 is a normal binade: e8m0) and
    NORMALIZE (binades below 2**-126: normalise float32 subnormal inputs).

``mode`` and ``flags`` are compile-time constants: :func:`rounding_kernel`
builds one loop per combination, which LLVM vectorises. The numbers are
those of :mod:`fpemu._elemround`, the rounding of float32 elements written
once for Numba, torch and Triton, whose module note draws the rounding.

The modules, by concept:

* ``draws``: stochastic rounding's random bits (splitmix64, Philox4x32-10);
* ``round32``: float32 input in int32 lanes, :mod:`fpemu._elemround` bound
  to Numba;
* ``round64``: float64 input in int64 lanes, and the float64 value of a
  code (which :mod:`fpemu.arith` and :mod:`fpemu.accumulate` reuse);
* ``loops``: the element-wise loops of quantize, encode and decode;
* ``fast``: the fast paths of float32 into IEEE-style formats;
* ``stats``: the counting loops of :mod:`fpemu.stats`.

Their kernels call each other's functions, so they form one cache unit
(:func:`fpemu._jit.cache_unit`): an edit of any of their files, or of
:mod:`fpemu._elemround`, recompiles all of them.
"""

import os

from .. import _elemround
from .._jit import cache_unit

#: The source files of the cache unit: this package's and fpemu/_elemround.py
#: (a module whose kernels call the package's functions can join the unit by
#: passing these to :func:`fpemu._jit.cache_unit` under its own name).
SOURCES = tuple([os.path.join(os.path.dirname(__file__), name)
                 for name in sorted(os.listdir(os.path.dirname(__file__)))
                 if name.endswith(".py")] + [_elemround.__file__])
cache_unit(__name__, SOURCES)

# (after cache_unit: each module below defines kernels of the unit)
from .._elemround import (FLUSH, FNUZ, NO_ZERO, NORMALIZE, OVF_INF, OVF_NAN,  # noqa: E402
                          OVF_SATURATE, POLICY_MASK, RDN, RNA, RNE, RTO, RTZ, RUP, SR,
                          SR_PHILOX, UNSIGNED)
from .draws import random63_kernel  # noqa: E402
from .fast import _encode_rne_ieee_one, _rne_ieee_one, directed_kernel, rne_kernel  # noqa: E402
from .loops import LANES, decode_kernel, rounding_kernel  # noqa: E402
# the element rounding of one float32, for the kernels of other modules that
# inline it (fpemu.block._kernels' fused block step)
from .round32 import _encode32  # noqa: E402
# the float64 rounding, on which fpemu._arith_kernels and fpemu._accum_kernels build
from .round64 import _finish, _mag_value, _quantize_one, _round, _split_f64  # noqa: E402
from .stats import (S_FLUSHED, S_HIST, S_INF, S_NAN, S_NORMAL, S_OVERFLOW,  # noqa: E402
                    S_SATURATED, S_SUBNORMAL, S_TO_INF, S_TO_NAN, S_ZERO, S_ZERO_BIN,
                    stats32_fast, stats32_fast4, stats32_kernel, stats_kernel)

__all__ = ["RNE", "RNA", "RTZ", "RUP", "RDN", "RTO", "SR", "SR_PHILOX", "OVF_INF",
           "OVF_SATURATE", "OVF_NAN", "POLICY_MASK", "FLUSH", "FNUZ", "UNSIGNED", "NO_ZERO",
           "NORMALIZE", "LANES", "random63_kernel", "rounding_kernel",
           "decode_kernel", "rne_kernel", "directed_kernel", "stats_kernel", "stats32_kernel",
           "stats32_fast", "stats32_fast4", "S_NAN", "S_INF", "S_ZERO", "S_FLUSHED",
           "S_SUBNORMAL", "S_NORMAL", "S_OVERFLOW", "S_TO_INF", "S_TO_NAN", "S_SATURATED",
           "S_ZERO_BIN", "S_HIST", "_rne_ieee_one", "_encode_rne_ieee_one", "_encode32",
           "_finish", "_mag_value", "_quantize_one",
           "_round", "_split_f64"]
