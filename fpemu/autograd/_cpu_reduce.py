"""ATen's CPU reductions in their order: sums as ``cascade_sum`` makes them,
products, norms, variances and ``cdist`` as their kernels do.

torch CPU sums a float32 tensor in float32 (float64 in float64), not once in a
wider type: ``aten/src/ATen/native/cpu/SumKernel.cpp`` (``cascade_sum``) adds in
an order fixed by the TensorIterator's shape and strides, the vector width of
the kernel's instruction set and the thread count. This module computes that
order and adds in it (``docs/pytorch-numerics.md`` §6.2 states it in words);
further down, the other reductions on the same walk: :func:`cpu_prod`
(``binary_kernel_reduce_vec``), :func:`cpu_norm`, :func:`cpu_var` and
:func:`cpu_cdist`.

The model, step by step (torch 2.13; paths under ``aten/src/ATen/``):

* **The iterator** (``TensorIterator.cpp`` ``reorder_dimensions``,
  ``coalesce_dimensions``): reduced dims first, sorted by the input's
  strides; kept dims by the (contiguous) output's; neighbours merged where
  the strides allow (:func:`fpemu.autograd._cuda_reduce.geometry`, shared
  with the CUDA model).
* **The threads** (``TensorIteratorReduce.cpp`` ``parallel_reduce``): under
  ``GRAIN_SIZE`` = 32768 input elements, or with one thread, one serial walk.
  Otherwise a full reduction (one output) is ``two_pass_reduction``: the
  walk's linear range is cut into ``ceil(numel / threads)`` pieces (OpenMP's
  ``at::parallel_for``), each summed into its own buffer row, and the rows
  are then summed by the same kernel. Other reductions are
  ``parallel_dim_reduction``: the outermost kept dim at least as long as the
  thread count (else the longest) is cut into ``ceil(cols / threads)``
  columns per thread, rounded down to 128-byte multiples when the columns are
  adjacent in memory.
* **The walk** (``TensorIteratorInternal.h`` ``serial_for_each`` and
  ``DimCounter``): the 2-d loop is called on blocks of the two fastest dims,
  the first and last block of a range possibly partial.
* **The 2-d loop** (``SumKernel.cpp`` ``cascade_sum``): with the reduced dim
  first, a contiguous inner reduction takes vectors (``vectorized_inner_sum``:
  per row a vector ``row_sum`` of the whole vectors, then the leftover
  elements into a scalar, then the vector's lanes in order), a contiguous
  outer reduction takes 4 vectors of outputs at a time, then single vectors,
  then single columns (``vectorized_outer_sum``), and strided ones the scalar
  twins (``scalar_inner_sum``, ``scalar_outer_sum``). Each result is added
  to the output (``CastStoreAccumulate``: ``out += sum``; the output starts
  at +0).
* **The cascade** (``multi_row_sum``): four levels of accumulators; every
  ``2**p`` elements (``p = max(4, ceil(log2(n)) / 4)``) level 0 is added into
  level 1, and so on up while the count is a multiple of the next power;
  the levels are added at the end. ``row_sum`` runs it over 4 interleaved
  accumulators (``ilp_factor``), adds the elements left over into the first,
  then the other three into it.

Vector widths: ``SumKernel.cpp`` registers its kernels with
``REGISTER_DISPATCH``, which in the AVX512 build of a kernel file registers
nothing (``native/DispatchStub.h``): on an AVX512 CPU the AVX2 kernel runs.
So the sum takes 8 float32 / 4 float64 lanes under AVX512, AVX2 and the
default build (``Vectorized``'s 32-byte base) alike (:func:`lanes_of`);
measured with FPRev on torch 2.13 under AVX512 and AVX2. ``nansum`` is the
same kernel with NaN loaded as 0 (``ignore_nan``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from .._jit import fma_any, jit, run_kernel
from ..errors import FpemuValueError
from ._cpu_math import _lane_sum, c_pow2, c_powf, vexp
from ._cuda_reduce import geometry
from ._profile import GRAIN_SIZE, cpu_vector_lanes

#: ``multi_row_sum``'s levels and ``row_sum``'s interleave
NUM_LEVELS = 4
ILP = 4


@jit
def _ceil_log2(x):
    """``utils::CeilLog2`` (cpu/utils.h): 1 for x <= 2, else ceil(log2(x))."""
    if x <= 2:
        return 1
    n = 0
    v = x - 1
    while v > 0:
        v >>= 1
        n += 1
    return n


@jit
def _load(X, i, nan, zero, pair):
    """One lane's load: ``X[i]`` (0 for NaN under nansum); with ``pair`` the
    16-bit vector loads' ``X[i] + X[i + pair]`` (``InnerSumCastLoadPolicy``:
    the two float halves of a bfloat16 / float16 vector added)."""
    v = X[i]
    if nan and v != v:
        v = zero
    if pair:
        w = X[i + pair]
        if nan and w != w:
            w = zero
        v = v + w
    return v


@jit
def _round16(v, kind):
    """float32 ``v`` rounded to bfloat16 (kind 1) or float16 (kind 2), to
    nearest even, as a float32 (kind 0: unchanged)."""
    if kind == 0 or v != v or v == 0 or math.isinf(v):
        return v
    p, emin, top = (8, -126, 3.3895313892515355e38) if kind == 1 else (11, -14, 65504.0)
    m, ex = math.frexp(np.float64(v))
    e = ex - 1
    if e < emin:
        e = emin
    q = math.ldexp(1.0, e - (p - 1))
    r = np.rint(np.float64(v) / q) * q
    if abs(r) > top:
        r = math.copysign(math.inf, r)
    return np.float32(r)


@jit
def _store(Y, i, s, kind):
    """``CastStoreAccumulate``: ``out += s`` in the output's dtype."""
    Y[i] = _round16(Y[i] + s, kind)


@jit
def _multi_row_sum(X, base, row_stride, cols, size, nan, zero, acc, res, pair=0):
    """``multi_row_sum``: len(cols) accumulators over ``size`` rows (row i of
    accumulator k at ``base + i * row_stride + cols[k]``); ``acc`` a (4, K)
    scratch; the sums into ``res[:K]``."""
    K = cols.shape[0]
    for j in range(NUM_LEVELS):
        for k in range(K):
            acc[j, k] = zero
    power = _ceil_log2(size) // NUM_LEVELS
    if power < 4:
        power = 4
    step = 1 << power
    mask = step - 1
    i = 0
    while i + step <= size:
        for _ in range(step):
            b = base + i * row_stride
            for k in range(K):
                acc[0, k] += _load(X, b + cols[k], nan, zero, pair)
            i += 1
        for j in range(1, NUM_LEVELS):
            for k in range(K):
                acc[j, k] += acc[j - 1, k]
                acc[j - 1, k] = zero
            if (i & (mask << (j * power))) != 0:
                break
    while i < size:
        b = base + i * row_stride
        for k in range(K):
            acc[0, k] += _load(X, b + cols[k], nan, zero, pair)
        i += 1
    for j in range(1, NUM_LEVELS):
        for k in range(K):
            acc[0, k] += acc[j, k]
    for k in range(K):
        res[k] = acc[0, k]


@jit
def _row_sum(X, base, stride, size, lanes, nan, zero, acc, res, pair=0):
    """``row_sum``: the cascade over ``ILP`` interleaved accumulators of
    ``L = len(lanes)`` lanes each (element i, lane l at ``base + i * stride +
    lanes[l]``), the leftover rows into the first, then the others into it;
    the L sums into ``res[:L]``."""
    L = lanes.shape[0]
    cols = np.empty(ILP * L, np.int64)
    for r in range(ILP):
        for lane in range(L):
            cols[r * L + lane] = r * stride + lanes[lane]
    size_ilp = size // ILP
    part = np.empty(ILP * L, res.dtype)
    _multi_row_sum(X, base, stride * ILP, cols, size_ilp, nan, zero, acc, part, pair)
    for i in range(size_ilp * ILP, size):
        for lane in range(L):
            part[lane] += _load(X, base + i * stride + lanes[lane], nan, zero, pair)
    for r in range(1, ILP):
        for lane in range(L):
            part[lane] += part[r * L + lane]
    for lane in range(L):
        res[lane] = part[lane]


@jit
def _loop2d(X, xo, si0, si1, Y, oo, so0, so1, size0, size1, L, vmin, half, nan, zero, kind):
    """``cascade_sum``'s 2-d loop on a block of ``size0 x size1`` elements
    (strides in elements; ``so`` the output's, 0 on a reduced dim). ``L``:
    the accumulator's lanes; ``vmin``: the input vector's (``vec_t::size()``,
    which decides the vector paths); ``half``: the 16-bit input's layout in a
    vector load (0: a float32 / float64 input; 1: lane l adds elements l and
    l + L, the bfloat16 / float16 specialisations; 2: lane l adds elements 2l
    and 2l + 1, the generic ``load_reduce_vec``); ``kind``: the output's
    rounding (:func:`_round16`)."""
    if so0 != 0 and so1 == 0:                       # the reduced dim first
        si0, si1 = si1, si0
        so0, so1 = so1, so0
        size0, size1 = size1, size0
    if so0 != 0 and so1 != 0:                       # not a reduction: out += in
        for j in range(size1):
            for i in range(size0):
                a = Y[oo + j * so1 + i * so0]
                b = X[xo + j * si1 + i * si0]
                if nan:
                    if a != a:
                        a = zero
                    if b != b:
                        b = zero
                Y[oo + j * so1 + i * so0] = _round16(a + b, kind)
        return
    acc = np.empty((NUM_LEVELS, ILP * 4 * L), Y.dtype)
    res = np.empty(4 * L, Y.dtype)
    one = np.zeros(1, np.int64)
    lanes = np.arange(L)
    if si0 == 1 and size0 >= vmin:                  # vectorized_inner_sum
        pair = 0
        width = L
        if half == 1:
            pair, width = L, 2 * L
        elif half == 2:
            pair, width = 1, 2 * L
            lanes = lanes * 2
        nvec = size0 // width
        for j in range(size1):
            row = xo + j * si1
            _row_sum(X, row, width, nvec, lanes, nan, zero, acc, res, pair)
            s = zero
            for k in range(nvec * width, size0):
                s += _load(X, row + k, nan, zero, 0)
            for lane in range(L):
                s += res[lane]
            _store(Y, oo + j * so1, s, kind)
    elif si1 == 1 and size1 >= vmin:                # vectorized_outer_sum
        cols = np.arange(4 * L)
        j = 0
        while j + 4 * L <= size1:
            _multi_row_sum(X, xo + j, si0, cols, size0, nan, zero, acc, res)
            for k in range(4 * L):
                _store(Y, oo + (j + k) * so1, res[k], kind)
            j += 4 * L
        while j + L <= size1:
            _row_sum(X, xo + j, si0, size0, lanes, nan, zero, acc, res)
            for k in range(L):
                _store(Y, oo + (j + k) * so1, res[k], kind)
            j += L
        while j < size1:
            _row_sum(X, xo + j, si0, size0, one, nan, zero, acc, res)
            _store(Y, oo + j * so1, res[0], kind)
            j += 1
    elif si0 < si1:                                 # scalar_inner_sum
        for j in range(size1):
            _row_sum(X, xo + j * si1, si0, size0, one, nan, zero, acc, res)
            _store(Y, oo + j * so1, res[0], kind)
    else:                                           # scalar_outer_sum
        cols = np.arange(4) * si1
        j = 0
        while j + 3 < size1:
            _multi_row_sum(X, xo + j * si1, si0, cols, size0, nan, zero, acc, res)
            for k in range(4):
                _store(Y, oo + (j + k) * so1, res[k], kind)
            j += 4
        while j < size1:
            _row_sum(X, xo + j * si1, si0, size0, one, nan, zero, acc, res)
            _store(Y, oo + j * so1, res[0], kind)
            j += 1


@jit
def _loop2d_prod(X, xo, si0, si1, Y, oo, so0, so1, size0, size1, L, kind):
    """``binary_kernel_reduce_vec``'s 2-d loop (``native/cpu/Reduce.h``) with
    ``a * b`` (``prod_kernel_impl``): a contiguous reduced dim runs
    ``vectorized_inner_reduction`` (``reduction128`` over 4 vectors of ``L``
    lanes a step, the 4 vectors multiplied ``(v0 * v1) * (v2 * v3)``, the lanes
    in order into the output, then the leftover elements one by one); outputs
    contiguous along dim 1 run ``vectorized_outer_reduction`` (blocks of 4L
    columns down the reduced dim, then the output; the other columns one by
    one); otherwise the plain loop ``out = out * x``. Each product rounded to
    the dtype (``kind``)."""
    if so0 == 0 and si0 == 1:                         # vectorized_inner_reduction
        acc = np.empty(4 * L, Y.dtype)
        for j in range(size1):
            row = xo + j * si1
            o = oo + j * so1
            count = size0 // (4 * L)
            if count > 0:
                for k in range(4 * L):
                    acc[k] = X[row + k]
                for i in range(1, count):
                    for k in range(4 * L):
                        acc[k] = _round16(acc[k] * X[row + i * 4 * L + k], kind)
                for k in range(L):
                    a = _round16(acc[k] * acc[L + k], kind)
                    b = _round16(acc[2 * L + k] * acc[3 * L + k], kind)
                    acc[k] = _round16(a * b, kind)
                b0 = acc[0]
                for k in range(1, L):
                    b0 = _round16(b0 * acc[k], kind)
                Y[o] = _round16(Y[o] * b0, kind)
            for i in range(count * 4 * L, size0):
                Y[o] = _round16(Y[o] * X[row + i], kind)
    elif so0 == 0 and so1 == 1 and si1 == 1:           # vectorized_outer_reduction
        acc = np.empty(4 * L, Y.dtype)
        blocks = size1 // (4 * L)
        for blk in range(blocks):
            c0 = blk * 4 * L
            for k in range(4 * L):
                acc[k] = X[xo + c0 + k]
            for i in range(1, size0):
                for k in range(4 * L):
                    acc[k] = _round16(acc[k] * X[xo + i * si0 + c0 + k], kind)
            for k in range(4 * L):
                Y[oo + c0 + k] = _round16(acc[k] * Y[oo + c0 + k], kind)
        for c in range(blocks * 4 * L, size1):
            for i in range(size0):
                Y[oo + c] = _round16(Y[oo + c] * X[xo + i * si0 + c], kind)
    else:                                             # basic_loop per outer index
        for j in range(size1):
            for i in range(size0):
                o = oo + j * so1 + i * so0
                Y[o] = _round16(Y[o] * X[xo + j * si1 + i * si0], kind)


@jit
def _loop(X, xo, si0, si1, Y, oo, so0, so1, size0, size1, L, vmin, half, nan, zero, kind,
          prod):
    """The 2-d loop of the reduction: cascade_sum's, or prod's."""
    if prod:
        _loop2d_prod(X, xo, si0, si1, Y, oo, so0, so1, size0, size1, L, kind)
    else:
        _loop2d(X, xo, si0, si1, Y, oo, so0, so1, size0, size1, L, vmin, half, nan, zero,
                kind)


@jit
def _serial_for_each(X, x0, sin, Y, o0, sout, shape, begin, end, L, vmin, half, nan, zero,
                     kind, prod):
    """``serial_for_each`` over the linear range [begin, end) of the
    iterator (``DimCounter``: blocks of the two fastest dims)."""
    if end <= begin:
        return
    ndim = shape.shape[0]
    if ndim <= 1:
        si0 = sin[0] if ndim == 1 else 0
        so0 = sout[0] if ndim == 1 else 0
        _loop(X, x0 + begin * si0, si0, 0, Y, o0 + begin * so0, so0, 0, end - begin, 1,
              L, vmin, half, nan, zero, kind, prod)
        return
    values = np.zeros(ndim, np.int64)
    linear = begin
    for d in range(ndim):
        if shape[d] > 0:
            values[d] = linear % shape[d]
            linear //= shape[d]
    offset = begin
    while offset < end:
        xo = x0
        oo = o0
        for d in range(ndim):
            xo += values[d] * sin[d]
            oo += values[d] * sout[d]
        step0 = min(shape[0] - values[0], end - offset)
        step1 = 1
        if step0 == shape[0]:
            step1 = min(shape[1] - values[1], (end - offset) // shape[0])
        _loop(X, xo, sin[0], sin[1], Y, oo, sout[0], sout[1], step0, step1, L, vmin, half,
              nan, zero, kind, prod)
        offset += step0 * step1
        overflow = step0
        i = 0
        if step1 != 1:
            i = 1
            overflow = step1
        while i < ndim and overflow > 0:
            v = values[i] + overflow
            if v >= shape[i]:
                overflow = 1
                v -= shape[i]
            else:
                overflow = 0
            values[i] = v
            i += 1


def _layout(a, axes, keepdims):
    """The array with strides the models read (non-negative multiples of the
    item size, else a contiguous copy), the reduced axes sorted (None: all;
    a 0-d array reduces over none), the kept axes and the result's shape."""
    ndim = a.ndim
    if axes is None:
        axes = tuple(range(ndim))
    axes = tuple(sorted({int(d) % max(ndim, 1) for d in axes})) if ndim else ()
    if any(s < 0 or s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    kept_axes = [d for d in range(ndim) if d not in axes]
    final = tuple(1 if d in axes else a.shape[d] for d in range(ndim)) if keepdims else \
        tuple(a.shape[d] for d in kept_axes)
    return a, axes, kept_axes, final


def _div_up(a, b):
    return -(-a // b)


def _flat_storage(a):
    """A 1-d view of the memory from ``a``'s first element to its last (all
    strides non-negative multiples of the item size)."""
    span = 1 + sum((n - 1) * (s // a.itemsize) for n, s in zip(a.shape, a.strides)) \
        if a.size else 0
    return np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,),
                                           writeable=False)


def lanes_of(capability, itemsize):
    """Elements per ``Vectorized`` of the reductions' kernels, which
    ``REGISTER_DISPATCH`` registers: AVX2's 32-byte vectors on AVX512 too
    (:func:`fpemu.autograd._profile.cpu_vector_lanes`)."""
    return cpu_vector_lanes(capability, itemsize, avx512_build=False)


#: the 16-bit dtypes a sum may keep (their values held in float32 arrays)
_KIND = {None: 0, "bfloat16": 1, "float16": 2}


def cpu_prod(array, axes=None, keepdims=False, *, threads=1, capability="AVX512", dtype=None):
    """``torch.prod`` on torch CPU (``ReduceOpsKernel.cpp`` ``prod_kernel_impl``:
    ``binary_kernel_reduce_vec`` with ``a * b``, :func:`_loop2d_prod`; the
    output starts at 1; the same iterator, walk and thread splits as
    :func:`cpu_sum`). ``array``, ``dtype``: as for :func:`cpu_sum` (a 16-bit
    product rounds every multiplication to the dtype)."""
    return _reduce(array, axes, keepdims, threads, capability, False, dtype, True)


def cpu_sum(array, axes=None, keepdims=False, *, threads=1, capability="AVX512", nan=False,
            dtype=None):
    """``torch.sum`` (``nan=True``: ``torch.nansum``) on torch CPU, in
    ``cascade_sum``'s order for the array's layout (its strides are the
    tensor's), ``threads`` (``torch.get_num_threads()``) and ``capability``
    (``torch.backends.cpu.get_cpu_capability()``).

    ``array``: float32 or float64 values; ``dtype`` "bfloat16" / "float16":
    the tensor is of that dtype (its values in a float32 array) and so is the
    sum. Such a sum accumulates in float32 and rounds each store to the dtype
    (``CastStoreAccumulate``), except where the iterator's two fastest dims
    are both reduced: torch then sums a float32 copy and rounds once
    (``ReduceOps.cpp`` ``should_use_acc_buffer``). Returns an array of the
    input's dtype (float32 holding 16-bit values), of the reduced shape."""
    return _reduce(array, axes, keepdims, threads, capability, nan, dtype, False)


def _reduce(array, axes, keepdims, threads, capability, nan, dtype, prod):
    a = np.asarray(array)
    if a.dtype not in (np.float32, np.float64):
        raise FpemuValueError(f"cpu_sum: expected a float32 or float64 array (the values of a "
                              f"floating tensor), got {a.dtype}; convert it first")
    if dtype not in _KIND or (dtype is not None and a.dtype != np.float32):
        raise FpemuValueError(f"cpu_sum: dtype must be None, 'bfloat16' or 'float16' (with "
                              f"the values in a float32 array), got {dtype!r} for a {a.dtype} "
                              "array")
    if threads < 1:
        raise FpemuValueError(f"cpu_sum: threads must be >= 1 (torch.get_num_threads()), got "
                              f"{threads}")
    a, axes, kept_axes, final = _layout(a, axes, keepdims)
    kept = tuple(a.shape[d] for d in kept_axes)
    zero = a.dtype.type(0)
    nout = int(np.prod(kept, dtype=np.int64))
    Y = np.full(nout, 1 if prod else 0, a.dtype)        # fill_(identity)
    if a.size == 0 or nout == 0:
        return Y.reshape(final)
    geo = geometry(a.shape, tuple(s // a.itemsize for s in a.strides), axes)
    kind = _KIND[dtype]
    half = 0
    L = lanes_of(capability, a.itemsize)
    vmin = L
    if kind and prod:
        L = lanes_of(capability, 2)                  # Vectorized<BFloat16 / Half>
    if kind and not prod:
        if len(geo.shape) >= 2 and geo.out_strides[0] == 0 and geo.out_strides[1] == 0:
            # should_use_acc_buffer: a float32 sum, rounded once
            out = cpu_sum(a, axes, keepdims, threads=threads, capability=capability, nan=nan)
            return _round_array(out, kind)
        half = 2 if (nan and kind == 2) else 1
        vmin = lanes_of(capability, 2)
    X = _flat_storage(a)
    shape = np.asarray(geo.shape, np.int64)
    sin = np.asarray(geo.in_strides, np.int64)
    sout = np.asarray(geo.out_strides, np.int64)
    numel = a.size
    common = (L, vmin, half, nan, zero, kind, prod)
    if numel < GRAIN_SIZE or threads == 1:
        run_kernel(_serial_for_each, X, 0, sin, Y, 0, sout, shape, 0, numel, *common,
                   inputs=1)
    elif nout == 1:                                  # two_pass_reduction
        buf = np.full(threads, 1 if prod else 0, a.dtype)
        used = min(threads, _div_up(numel, GRAIN_SIZE))
        chunk = _div_up(numel, used)
        for t in range(used):
            lo = t * chunk
            if lo < numel:
                run_kernel(_serial_for_each, X, 0, sin, buf, t, sout, shape, lo,
                           min(numel, lo + chunk), *common, inputs=1)
        run_kernel(_serial_for_each, buf, 0, np.ones(1, np.int64), Y, 0,
                   np.zeros(1, np.int64), np.asarray([threads], np.int64), 0, threads,
                   *common, inputs=1)
    else:                                            # parallel_dim_reduction
        dim = _split_dim(geo, threads)
        cols = geo.shape[dim]
        used = min(threads, cols)
        chunk = _div_up(cols, used)
        multiple = 128 // a.itemsize
        for t in range(used):
            lo, hi = t * chunk, min(cols, t * chunk + chunk)
            if lo >= cols:
                continue
            if geo.in_strides[dim] == 1:
                lo -= lo % multiple
                if hi != cols:
                    hi -= hi % multiple
            if lo == hi:
                continue
            sub = shape.copy()
            sub[dim] = hi - lo
            run_kernel(_serial_for_each, X, lo * sin[dim], sin, Y, lo * sout[dim], sout, sub,
                       0, int(np.prod(sub)), *common, inputs=1)
    return Y.reshape(final)


@jit
def _round_all(v, kind):
    for i in range(v.shape[0]):
        v[i] = _round16(v[i], kind)


def _round_array(values, kind):
    out = np.array(values, np.float32).reshape(-1)
    run_kernel(_round_all, out, kind)
    return out.reshape(np.shape(values))


def _split_dim(geo, threads):
    """``find_split_dim``: from the outermost dim inwards while not reduced,
    the first at least ``threads`` long, else the longest."""
    best = len(geo.shape) - 1
    for d in range(best, -1, -1):
        if geo.out_strides[d] == 0:
            break
        if geo.shape[d] >= threads:
            return d
        if geo.shape[d] > geo.shape[best]:
            best = d
    return best


# ------------------------------------------------------------------ norms
def c_pow(x, y):
    """``std::pow`` on two float32 or two float64 values (from @jit code)."""
    raise NotImplementedError("c_pow is a Numba overload: call it from a @jit function")


@overload(c_pow)
def _c_pow_impl(x, y):
    if x == types.float32:
        return lambda x, y: c_powf(x, y)
    return lambda x, y: c_pow2(x, y)


@jit
def _norm2_lastdim(X, rows, n, L, halves, contract, kind, out):
    """``norm_kernel_tensor_iterator_impl``'s vectorized 2-norm of each
    contiguous row (``binary_kernel_reduce_lastdim``): ``L`` lane
    accumulators of ``acc + x * x`` (separate multiply and add) over the whole
    vectors (a bfloat16 vector, ``halves`` 2, holds two float vectors: its low
    half's squares go in first, then its high half's), the lanes added in
    order, then the tail. The AVX2 build's compiler (torch 2.13, measured)
    computes the tail four at a time with rounded squares added in order and
    the last ``n % 4`` as FMAs (``contract``; the default build has no FMA);
    the root rounded once (to the 16-bit dtype, ``kind``)."""
    zero = out.dtype.type(0)
    acc = np.empty(L, out.dtype)
    W = halves * L
    for r in range(rows.shape[0]):
        base = rows[r]
        for lane in range(L):
            acc[lane] = zero
        body = n - n % W
        d = 0
        while d < body:
            for h in range(halves):
                for lane in range(L):
                    v = X[base + d + h * L + lane]
                    acc[lane] = acc[lane] + v * v
            d += W
        b = acc[0]
        for lane in range(1, L):
            b = b + acc[lane]
        k = n - body
        m = body + (k // 4) * 4 if contract else n
        for i in range(body, m):
            v = X[base + i]
            b = b + v * v
        for i in range(m, n):
            v = X[base + i]
            b = fma_any(v, v, b)
        out[r] = _round16(np.sqrt(b), kind)


@jit
def _norm_seq(X, offsets, roff, p, out):
    """``binary_kernel_reduce`` with ``NormTwoOps`` (p 2: ``acc + x * x``),
    ``NormOneOps`` (p 1: ``acc + |x|``) or ``NormOps`` (other p: ``acc +
    pow(|x|, p)``, libm's pow in the accumulator's type): each output's
    elements in the iterator's order (``roff``: the reduced elements'
    offsets, fastest dim first) from ``offsets[o]``; the accumulators before
    the root. ``p``: of the accumulator's type."""
    zero = out.dtype.type(0)
    for o in range(offsets.shape[0]):
        a = zero
        for i in range(roff.shape[0]):
            v = X[offsets[o] + roff[i]]
            if p == 2:
                a = a + v * v
            elif p == 1:
                a = a + abs(v)
            else:
                a = a + c_pow(abs(v), p)
        out[o] = a


@jit
def _norm_root(out, p):
    """``NormOps::project``: ``pow(acc, 1 / p)`` (the reciprocal in the
    accumulator's type)."""
    r = out.dtype.type(1) / p
    for i in range(out.shape[0]):
        out[i] = c_pow(out[i], r)


def _offsets(a, axes_in_order):
    """Element offsets (from ``a``'s first element) of every index over
    ``axes_in_order``, the first axis varying fastest."""
    off = np.zeros(1, np.int64)
    for d in axes_in_order:
        step = np.arange(a.shape[d], dtype=np.int64) * (a.strides[d] // a.itemsize)
        off = (step[:, None] + off[None, :]).reshape(-1)
    return off


def cpu_norm(array, p, axes=None, keepdims=False, *, threads=1, capability="AVX512",
             dtype=None, size_one_abs=True):
    """``torch.linalg.vector_norm`` for ``p`` 1 or 2 on torch CPU
    (``native/cpu/ReduceOpsKernel.cpp`` ``norm_kernel_tensor_iterator_impl``),
    in its order: for p = 2 over one contiguous innermost dim of a float32,
    float64 or bfloat16 tensor, the vectorized row kernel
    (:func:`_norm2_lastdim`, 8 float / 4 double lanes: a ``REGISTER_DISPATCH``
    kernel); otherwise ``binary_kernel_reduce`` with ``NormTwoOps`` /
    ``NormOneOps`` (accumulators in float32 for 16-bit tensors): each output's
    elements in the iterator's order, cut into per-thread partials past
    GRAIN_SIZE when there is one output. ``array``, ``dtype``: as for
    :func:`cpu_sum`. A reduction over size-1 dims only is ``abs``
    (``linalg_vector_norm_out``) unless ``size_one_abs`` is False: torch's
    test reads the reduced sizes from ``self.sizes()``, which a 0-d tensor
    with an explicit dim does not have, so that case runs the kernel.
    Returns the norms (float32 holding 16-bit values)."""
    a = np.asarray(array)
    if a.dtype not in (np.float32, np.float64) or dtype not in _KIND or (
            dtype is not None and a.dtype != np.float32):
        raise FpemuValueError(f"cpu_norm: expected float32 / float64 values (16-bit ones in "
                              f"float32 with dtype 'bfloat16' / 'float16'), got a {a.dtype} "
                              f"array with dtype {dtype!r}")
    if not (isinstance(p, (int, float, np.number)) and math.isfinite(p) and p != 0):
        raise FpemuValueError(f"cpu_norm: p must be a finite nonzero number (0 and +-inf "
                              f"count or select, exactly), got {p!r}")
    a, axes, kept_axes, final = _layout(a, axes, keepdims)
    kept = tuple(a.shape[d] for d in kept_axes)
    kind = _KIND[dtype]
    nout = int(np.prod(kept, dtype=np.int64))
    out = np.zeros(nout, a.dtype)
    if nout == 0 or a.size == 0:
        return out.reshape(final)
    if size_one_abs and all(a.shape[d] == 1 for d in axes):
        # linalg_vector_norm_out: a reduction over size-1 dims is abs()
        return np.abs(a).reshape(final)
    geo = geometry(a.shape, tuple(s // a.itemsize for s in a.strides), axes)
    X = _flat_storage(a)
    rows = _offsets(a, list(reversed(kept_axes)))
    contract = not str(capability).upper().startswith("DEFAULT")
    if p == 2 and geo.num_reduce_dims == 1 and geo.in_strides[0] == 1 and kind != 2:
        L = lanes_of(capability, a.itemsize)
        run_kernel(_norm2_lastdim, X, rows, geo.shape[0], L, 2 if kind == 1 else 1, contract,
                   kind, out, inputs=2)
        return out.reshape(final)
    roff = _offsets(a, geo.red_axes)
    numel = roff.shape[0]
    pa = a.dtype.type(p)
    if nout == 1 and numel >= GRAIN_SIZE and threads > 1:
        used = min(threads, _div_up(numel, GRAIN_SIZE))
        chunk = _div_up(numel, used)
        total = a.dtype.type(0)
        part = np.zeros(1, a.dtype)
        for t in range(threads):
            lo = t * chunk
            if t < used and lo < numel:
                run_kernel(_norm_seq, X, rows, np.ascontiguousarray(roff[lo:lo + chunk]),
                           pa, part, inputs=3)
                total = a.dtype.type(total + part[0])
        out[0] = total
    else:
        run_kernel(_norm_seq, X, rows, roff, pa, out, inputs=3)
    if p == 2:
        out = np.sqrt(out)
    elif p != 1:
        run_kernel(_norm_root, out, pa)
    return _round_array(out, kind).reshape(final) if kind else out.reshape(final)


# ---------------------------------------------------- variance and std
@jit
def _welford(X, offsets, roff, lo, hi, mean, m2, nf):
    """``WelfordOps::reduce`` in double (``SharedReduceOps.h``; measured:
    no contraction) over the reduced elements ``roff[lo:hi]`` of each output,
    continuing from the accumulators (mean, m2, count) given."""
    for o in range(offsets.shape[0]):
        mu = mean[o]
        s = m2[o]
        n = nf[o]
        for i in range(lo, hi):
            v = np.float64(X[offsets[o] + roff[i]])
            n += 1.0
            delta = v - mu
            mu = mu + delta / n
            s = s + delta * (v - mu)
        mean[o] = mu
        m2[o] = s
        nf[o] = n


@jit
def _sum_dx2(X, roff, starts, mean):
    """``std_var_all_cpu``'s sum of ``(double(x) - mean)^2``: a local sum per
    2-d block of the walk (block ``b`` is ``roff[starts[b]:starts[b + 1]]``),
    each added to the running total (ReduceOps.cpp, compiled without FMA)."""
    total = 0.0
    for b in range(starts.shape[0] - 1):
        local = 0.0
        for i in range(starts[b], starts[b + 1]):
            d = np.float64(X[roff[i]]) - mean
            local += d * d
        total += local
    return total


def _block_starts(shape, lo, hi):
    """Where ``serial_for_each`` starts a new 2-d block within [lo, hi) of an
    iterator of ``shape`` (``DimCounter.max_2d_step``), and ``hi``."""
    if len(shape) <= 1:
        return [lo, hi]
    starts = []
    offset = lo
    while offset < hi:
        starts.append(offset)
        v0 = offset % shape[0]
        step0 = min(shape[0] - v0, hi - offset)
        step = step0
        if step0 == shape[0]:
            v1 = (offset // shape[0]) % shape[1]
            step = shape[0] * min(shape[1] - v1, (hi - offset) // shape[0])
        offset += step
    return starts + [hi]


def cpu_var(array, axes=None, correction=1, keepdims=False, *, take_sqrt=False, threads=1,
            with_mean=False):
    """``torch.var`` / ``torch.std`` (``take_sqrt``) of a float32 or float64
    array on torch CPU (``ReduceOps.cpp`` ``std_var_out``): a full reduction
    takes ``std_var_all_cpu`` (the float mean ``self.mean()``, then the sum
    of squared deviations in double, per thread chunk and 2-d block); others,
    and ``var_mean`` / ``std_mean`` (``with_mean``: also returns the mean),
    ``WelfordOps`` in double per output (``binary_kernel_reduce``: the
    iterator's order; per-thread partials combined past GRAIN_SIZE for one
    output). The result is rounded once to the input's dtype."""
    a = np.asarray(array)
    if a.dtype not in (np.float32, np.float64):
        raise FpemuValueError(f"cpu_var: expected a float32 or float64 array, got {a.dtype}; "
                              "convert it first")
    a, axes, kept_axes, final = _layout(a, axes, keepdims)
    kept = tuple(a.shape[d] for d in kept_axes)
    nout = int(np.prod(kept, dtype=np.int64))
    geo = geometry(a.shape, tuple(s // a.itemsize for s in a.strides), axes)
    X = _flat_storage(a)
    roff = _offsets(a, geo.red_axes)
    count = roff.shape[0]
    if not with_mean and nout == 1 and count and geo.num_reduce_dims == len(geo.shape):
        mean = float(cpu_sum(a, axes, threads=threads)[()] / a.dtype.type(count))
        parts = [(0, count)]
        if count > GRAIN_SIZE and threads > 1:
            used = min(threads, _div_up(count, GRAIN_SIZE))
            chunk = _div_up(count, used)
            parts = [(lo, min(count, lo + chunk)) for lo in range(0, count, chunk)]
        total = 0.0
        for lo, hi in parts:
            starts = np.asarray(_block_starts(geo.shape, lo, hi), np.int64)
            total = total + run_kernel(_sum_dx2, X, roff, starts, mean, inputs=3)
        with np.errstate(all="ignore"):
            v = np.float64(total) / max(0.0, count - correction)
            v = np.sqrt(v) if take_sqrt else v
        return np.full(final, v, a.dtype), None
    rows = _offsets(a, list(reversed(kept_axes)))
    mean = np.zeros(nout, np.float64)
    m2 = np.zeros(nout, np.float64)
    nf = np.zeros(nout, np.float64)
    if nout == 1 and count >= GRAIN_SIZE and threads > 1:
        used = min(threads, _div_up(count, GRAIN_SIZE))
        chunk = _div_up(count, used)
        acc = (0.0, 0.0, 0.0)
        for lo in range(0, count, chunk):
            pm, ps, pn = np.zeros(1), np.zeros(1), np.zeros(1)
            run_kernel(_welford, X, rows, roff, lo, min(count, lo + chunk), pm, ps, pn,
                       inputs=3)
            acc = _welford_combine(acc, (pm[0], ps[0], pn[0]))
        mean[0], m2[0], nf[0] = acc
    elif nout:
        run_kernel(_welford, X, rows, roff, 0, count, mean, m2, nf, inputs=3)
    with np.errstate(all="ignore"):
        div = np.where(nf > correction, nf - correction, 0.0)
        v = m2 / div
        v = np.sqrt(v) if take_sqrt else v
    res = v.astype(a.dtype).reshape(final)
    return res, (mean.astype(a.dtype).reshape(final) if with_mean else None)


def _welford_combine(a, b):
    """``WelfordOps::combine`` (an empty side returns the other)."""
    (am, a2, an), (bm, b2, bn) = a, b
    if an == 0:
        return b
    if bn == 0:
        return a
    delta = bm - am
    n = an + bn
    nb_over_n = bn / n
    return am + delta * nb_over_n, a2 + b2 + delta * delta * an * nb_over_n, n


# ----------------------------------------------------------------- cdist
@jit
def _cdist_rows(A, B, p, contract, out):
    """``Dist::run_parallel_cdist`` (``native/cpu/DistanceOpsKernel.cpp``):
    for each pair of rows, ``agg = red(agg, map(|a - b|))`` element by
    element in the dtype: p 1 ``agg + d``; p 2 ``agg + d * d``, which the
    AVX2 build's compiler computes as for the 2-norm's tail (squares four at
    a time rounded and added in order, the last ``m % 4`` as FMAs; measured);
    other p ``agg + pow(d, p)`` (libm's pow in the dtype) and the root
    ``pow(double(agg), 1.0 / p)``. A (batch, P, M), B (batch, R, M)."""
    nb, P, M = A.shape
    R = B.shape[1]
    zero = out.dtype.type(0)
    m4 = (M // 4) * 4 if contract else M
    for b in range(nb):
        for i in range(P):
            for j in range(R):
                agg = zero
                for x in range(M):
                    d = abs(A[b, i, x] - B[b, j, x])
                    if p == 1:
                        agg = agg + d
                    elif p == 2:
                        if x < m4:
                            agg = agg + d * d
                        else:
                            agg = fma_any(d, d, agg)
                    else:
                        agg = agg + c_pow(d, p)
                if p == 2:
                    out[b, i, j] = np.sqrt(agg)
                elif p == 1:
                    out[b, i, j] = agg
                else:
                    out[b, i, j] = c_pow(np.float64(agg), 1.0 / np.float64(p))


def cpu_cdist(A, B, p, capability="AVX512"):
    """torch CPU's direct ``cdist`` of float32 / float64 rows (batch, P, M)
    and (batch, R, M) for a finite p > 0 (:func:`_cdist_rows`); the
    distances (batch, P, R) in the dtype."""
    A = np.ascontiguousarray(A)
    B = np.ascontiguousarray(B, A.dtype)
    if A.dtype not in (np.float32, np.float64) or A.ndim != 3 or B.ndim != 3:
        raise FpemuValueError(f"cpu_cdist: expected (batch, P, M) and (batch, R, M) float32 or "
                              f"float64 arrays, got {A.shape} {A.dtype} and {B.shape}")
    if not (math.isfinite(p) and p > 0):
        raise FpemuValueError(f"cpu_cdist: p must be finite and > 0 (0 and inf count or "
                              f"select, exactly), got {p!r}")
    out = np.empty((A.shape[0], A.shape[1], B.shape[1]), A.dtype)
    contract = not str(capability).upper().startswith("DEFAULT")
    run_kernel(_cdist_rows, A, B, A.dtype.type(p), contract, out, inputs=2)
    return out


# ------------------------------------------------- log_softmax's backward
@jit
def _log_softmax_backward_rows(g, y, lanes, tree, out):
    """``_vec_host_softmax_backward_lastdim<log>`` (``native/cpu/SoftMaxKernel.cpp``)
    on rows: the lane sum of the gradient (``vec::reduce_all``: the butterfly
    for float32, the lanes in order for float64), then ``g - exp(y) * sum``
    with SLEEF's exp for every element, which GCC contracts into one FMA
    (measured on torch 2.13: AVX512's 16 / 8 lanes, the kernel's own build)."""
    for r in range(g.shape[0]):
        s = _lane_sum(g[r].copy(), lanes, tree)
        for j in range(g.shape[1]):
            out[r, j] = fma_any(-vexp(y[r, j]), s, g[r, j])


def cpu_log_softmax_backward(g, y, capability="AVX512"):
    """torch CPU's gradient of log_softmax along the last dim of float32 /
    float64 rows ``g`` (the incoming gradient) and ``y`` (the output)."""
    g = np.ascontiguousarray(g)
    y = np.ascontiguousarray(y, g.dtype)
    if g.dtype not in (np.float32, np.float64) or g.shape != y.shape:
        raise FpemuValueError(f"cpu_log_softmax_backward: expected two float32 / float64 "
                              f"arrays of one shape, got {g.dtype} {g.shape} and {y.shape}")
    if g.size == 0:
        return np.empty(g.shape, g.dtype)
    rows = g.reshape(-1, g.shape[-1]) if g.ndim else g.reshape(1, 1)
    out = np.empty(rows.shape, g.dtype)
    lanes = cpu_vector_lanes(capability, g.itemsize)
    run_kernel(_log_softmax_backward_rows, rows, y.reshape(rows.shape), lanes,
               g.dtype == np.float32, out, inputs=2)
    return out.reshape(g.shape)
