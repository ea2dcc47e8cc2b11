"""ATen's CUDA reductions in their order: float32 adds in the order a launch fixes.

CUDA torch reduces a tensor with one kernel, ``aten/src/ATen/native/cuda/Reduce.cuh``
(``gpu_reduce_kernel``), whose order of additions follows from the launch
configuration that ``setReduceConfig`` derives from the shape, the strides and the
device's SM count. This module computes that configuration (:func:`reduce_config`)
and sums in exactly that order with float32 (float64 for float64 tensors)
additions, the accumulator rounded once to the output dtype at the end
(``docs/pytorch-numerics.md`` §6.1 states the order in words).

The model, step by step (file paths are torch 2.11's, under
``aten/src/ATen/native/``):

* **The iterator** (``TensorIterator.cpp``, ``reorder_dimensions`` and
  ``coalesce_dimensions``): reduced dims first, then the kept ones; the reduced
  dims sorted by the input's strides (smallest first), the kept ones by the
  output's (contiguous) strides; neighbouring dims merged where the strides
  allow. Size-1 dims are dropped first (they merge into any neighbour).
* **The launch** (``cuda/Reduce.cuh``, ``setReduceConfig``): the reduction runs
  along the block's x dimension when it is the fastest-moving one, with
  vectorized loads of ``input_vec_size = 4`` elements when the reduced dim is
  contiguous and longer than 128; otherwise x spans outputs (vectorized along
  the output by 4, 2 or 1). ``set_block_dimension`` takes powers of two under 512
  threads; warps split the input when each thread would keep 16 values or more,
  and blocks split it (``ctas_per_output``) when a thread would keep 256 or more
  and the grid is smaller than ``SMs * (2048 / threads)`` blocks.
* **A thread** (``thread_reduce_impl``): values ``idx, idx + step, ...`` go
  round-robin into ``vt0 = 4`` accumulators, combined at the end as
  ``((a0 + a1) + a2) + a3``. Vectorized (``input_vectorized_thread_reduce_impl``):
  the unaligned head (``shift`` elements before a 16-byte boundary, taken by
  lanes ``shift..3`` of warp 0 of block 0), then 4-element vectors with element
  ``i`` into accumulator ``i``, then the tail (lanes of warp 0 of block 0).
* **A block**: ``block_y_reduce`` (shared-memory tree, offsets ``by/2, ..., 1``),
  then ``block_x_reduce`` (shared-memory tree down to 32 lanes, then
  ``WARP_SHFL_DOWN`` with offsets 1, 2, 4, 8, 16: neighbours first).
* **The grid** (``global_reduce``): each block's value goes to a staging buffer;
  the last block to finish reads them, thread ``t`` taking blocks ``t, t + T,
  ...``, and reduces them with ``block_y_reduce`` and ``block_x_reduce`` again.

The ops (``cuda/ReduceSumProdKernel.cu``, ``cuda/ReduceMomentKernel.cu``,
``cuda/ReduceNormKernel.cu``, ``cuda/SharedReduceOps.h``): sum is ``acc + x``;
mean is the sum times ``factor = float(outputs) / numel`` (``MeanOps.project``);
the 2-norm accumulates ``acc + x * x`` (nvcc contracts it to ``fma(x, x, acc)``)
and projects ``sqrt``; the 1-norm accumulates ``acc + |x|``. bfloat16 and float16
inputs accumulate in float32.

The softmax, log_softmax, layer_norm and nll_loss kernels have reductions of their
own; they are modelled further down in this module, and so is FlashAttention-2's
``dot_do_o``, the row sums of its backward (:func:`dot_do_o`, for
``fpemu.autograd._fused_attention``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import prange

from .._jit import fma32, fma_any, jit, pjit, run_kernel
from ..errors import FpemuValueError
from ._dtypes import _store
from ._profile import get_profile

#: ``cudaDeviceProp.maxThreadsPerMultiProcessor`` of the modelled GPUs (Hopper
#: and Ampere A100: 2048)
MAX_THREADS_PER_SM = 2048
#: ``ReduceConfig``'s ``mnt_wrapper<T>::MAX_NUM_THREADS`` (real types)
MAX_NUM_THREADS = 512
WARP_SIZE = 32
VT0 = 4
INPUT_VEC_SIZE = 4

#: accumulation ops: sum (acc + x), sum of squares (fma(x, x, acc)), sum of |x|
OP_SUM, OP_SQUARES, OP_ABS = 0, 1, 2


def _div_up(a, b):
    return (a + b - 1) // b


def _last_pow2(n):
    """Reduce.cuh ``last_pow2``: the largest power of two <= n (1 for n < 1)."""
    n = int(n)
    for s in (1, 2, 4, 8, 16):
        n |= n >> s
    n &= 0xFFFFFFFF
    return max(1, n - (n >> 1))


# ------------------------------------------------------------- the iterator
@dataclasses.dataclass(frozen=True)
class Geometry:
    """A reduction's TensorIterator after ``reorder_dimensions`` and
    ``coalesce_dimensions`` (fastest dim first, reduced dims first), and the
    original axes in the orders the kernel walks them."""
    shape: tuple            # coalesced iterator shape
    in_strides: tuple       # input strides (elements) per coalesced dim
    out_strides: tuple      # output strides (elements; 0 on reduced dims)
    num_reduce_dims: int
    red_axes: tuple         # original reduced axes, fastest first
    out_axes: tuple         # original kept axes, fastest first
    num_outputs: int
    num_inputs: int


def reorder_dims(shape, operands, dims=None):
    """TensorIterator.cpp ``reorder_dimensions``: the order of ``dims`` (all
    by default), fastest first. ``operands``: (strides, is_output) per
    operand, strides indexable by dim, 0 on a broadcast (or reduced) dim. A
    reduction's output moves its reduced dims first; then the first operand
    whose strides differ decides (the smaller stride first; equal strides:
    the smaller dim first); broadcast dims are skipped. An insertion sort
    from the slowest dim, as ATen's."""
    dims = list(range(len(shape))) if dims is None else list(dims)

    def should_swap(d0, d1):
        for st, is_output in operands:
            s0, s1 = st[d0], st[d1]
            if is_output and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(reversed(dims))
    for i in range(1, len(perm)):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            c = should_swap(perm[dim0], perm[dim1])
            if c > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif c < 0:
                break
    return perm


def geometry(shape, strides, axes):
    """The iterator of a reduction of a tensor of ``shape`` and ``strides`` (in
    elements) over ``axes`` (TensorIterator.cpp ``reorder_dimensions``,
    ``coalesce_dimensions``; the output is allocated contiguous, as the
    structured reductions' ``resize_reduction`` does)."""
    shape = tuple(int(n) for n in shape)
    strides = tuple(int(s) for s in strides)
    ndim = len(shape)
    red = set(int(a) for a in axes)
    out_stride = {}
    s = 1
    for d in reversed(range(ndim)):
        if d in red:
            out_stride[d] = 0
        else:
            out_stride[d] = s
            s *= shape[d]
    dims = [d for d in range(ndim) if shape[d] != 1]
    perm = reorder_dims(shape, ((out_stride, True), (dict(enumerate(strides)), False)), dims)
    cshape = [shape[d] for d in perm]
    cin = [strides[d] for d in perm]
    cout = [out_stride[d] for d in perm]
    if len(cshape) > 1:
        prev = 0
        for dim in range(1, len(cshape)):
            ok = (cshape[prev] == 1 or cshape[dim] == 1
                  or (cshape[prev] * cin[prev] == cin[dim]
                      and cshape[prev] * cout[prev] == cout[dim]))
            if ok:
                if cshape[prev] == 1:
                    cin[prev], cout[prev] = cin[dim], cout[dim]
                cshape[prev] *= cshape[dim]
            else:
                prev += 1
                if prev != dim:
                    cin[prev], cout[prev], cshape[prev] = cin[dim], cout[dim], cshape[dim]
        del cshape[prev + 1:], cin[prev + 1:], cout[prev + 1:]
    nout = 1
    for d in range(ndim):
        if d not in red:
            nout *= shape[d]
    numel = 1
    for n in shape:
        numel *= n
    return Geometry(tuple(cshape), tuple(cin), tuple(cout), sum(1 for s in cout if s == 0),
                    tuple(d for d in perm if d in red), tuple(d for d in perm if d not in red),
                    nout, numel // nout if nout else 0)


# ---------------------------------------------------------------- the launch
@dataclasses.dataclass(frozen=True)
class ReduceConfig:
    """``setReduceConfig``'s result (Reduce.cuh ``struct ReduceConfig``)."""
    num_outputs: int
    num_inputs: int
    block_width: int
    block_height: int
    grid_x: int
    ctas_per_output: int
    vectorize_input: bool
    output_vec_size: int
    input_mult: tuple
    output_mult: tuple
    step_input: int
    step_output: int

    @property
    def block(self):
        return (self.block_width, self.block_height)

    @property
    def grid(self):
        return (self.grid_x, self.ctas_per_output)

    @property
    def num_threads(self):
        return self.block_width * self.block_height

    @property
    def values_per_thread(self):
        return _div_up(self.num_inputs, self.step_input)


def _output_vec_size(geo, base):
    """Reduce.cuh ``get_output_vec_size``: 4, halved until it divides the
    input's base address (in elements), the output dim's size and every other
    input stride."""
    vec = 4

    def update(n):
        nonlocal vec
        while n % vec:
            vec //= 2
    update(base)
    k = geo.num_reduce_dims
    update(geo.shape[k])
    for j, s in enumerate(geo.in_strides):
        if j != k:
            update(s)
    return vec


def reduce_config(shape, strides, axes, sm_count, storage_offset=0):
    """The launch configuration ``setReduceConfig`` (Reduce.cuh) chooses for a
    reduction over ``axes`` of a tensor of ``shape`` and ``strides`` (elements)
    whose data starts ``storage_offset`` elements past an aligned allocation,
    on a GPU with ``sm_count`` SMs. Returns (:class:`ReduceConfig`,
    :class:`Geometry`)."""
    geo = geometry(shape, strides, axes)
    return _config(geo, sm_count, storage_offset), geo


def _config(geo, sm_count, storage_offset=0):
    nout, nin = geo.num_outputs, geo.num_inputs
    ndim, k = len(geo.shape), geo.num_reduce_dims
    if ndim > 0:
        fastest = k == ndim or geo.in_strides[0] < geo.in_strides[k]
        if fastest:
            dim0, dim1, fms = nin, nout, geo.in_strides[0]
        else:
            dim0, dim1, fms = nout, nin, geo.in_strides[k]
    else:
        fastest, dim0, dim1, fms = True, 1, 1, 1
    vectorize, ovs = False, 1
    if fms == 1:
        if fastest and dim0 > 128 and k == 1 and VT0 >= INPUT_VEC_SIZE:
            vectorize = True
            dim0 //= INPUT_VEC_SIZE
        elif not fastest:
            ovs = _output_vec_size(geo, storage_offset)
            dim0 //= ovs
    mnt = MAX_NUM_THREADS // ovs
    d0 = _last_pow2(dim0) if dim0 < mnt else mnt
    d1 = _last_pow2(dim1) if dim1 < mnt else mnt
    bw = min(d0, WARP_SIZE)
    bh = min(d1, mnt // bw)
    bw = min(d0, mnt // bh)
    step_in, step_out = 1, 1
    im, om = [0, 0, 0], [0, 0]
    if ndim == 0 or fastest:
        im[0], step_in = step_in, step_in * bw
    else:
        om[0], step_out = step_out, step_out * bw
    vpt = _div_up(nin, step_in)
    if vpt >= min(bh * 16, 256):
        im[1], step_in = step_in, step_in * bh
    else:
        om[1], step_out = step_out, step_out * bh
    threads = bw * bh
    target = sm_count * (MAX_THREADS_PER_SM // threads)
    grid_x = _div_up(nout // ovs, step_out)
    ctas = 1
    vpt = _div_up(nin, step_in)
    if im[1] != 0 and vpt >= 256 and grid_x <= target:
        ctas = max(min(_div_up(target, grid_x), _div_up(vpt, 16)), _div_up(vpt, 256))
        if ctas > 1:
            im[2], step_in = step_in, step_in * ctas
    return ReduceConfig(nout, nin, bw, bh, grid_x, ctas, vectorize, ovs, tuple(im), tuple(om),
                        step_in, step_out)


# ------------------------------------------------------------------ kernels


@jit
def _acc_add(op, acc, v):
    """``ops.reduce``: SumOps / MeanOps ``acc + x``, NormTwoOps ``acc + x * x``
    (contracted by nvcc to ``fma(x, x, acc)``), NormOneOps ``acc + |x|``."""
    if op == OP_SQUARES:
        return fma_any(v, v, acc)
    if op == OP_ABS:
        return acc + abs(v)
    return acc + v


@jit
def _tree(p, base, n, warp):
    """Reduce.cuh's in-block trees on ``p[base : base + n]`` (n a power of two):
    with ``warp`` False ``block_y_reduce`` (offsets n/2, ..., 1); with ``warp``
    True ``block_x_reduce`` (offsets n/2, ..., 32 through shared memory, then
    warp shuffles down by 1, 2, 4, 8, 16). The result is ``p[base]``."""
    if not warp:
        off = n // 2
        while off > 0:
            for t in range(off):
                p[base + t] = p[base + t] + p[base + t + off]
            off //= 2
        return p[base]
    dim_x = n
    if n > 32:
        off = n // 2
        while off >= 32:
            for t in range(off):
                p[base + t] = p[base + t] + p[base + t + off]
            off //= 2
        dim_x = 32
    off = 1
    while off < dim_x:
        for t in range(0, dim_x, 2 * off):
            p[base + t] = p[base + t] + p[base + t + off]
        off *= 2
    return p[base]


@jit
def _thread(V, o, x, y, c, shift, n, vec, im0, im1, im2, step, op, zero):
    """``thread_reduce`` of thread (x, y) of block c for output row o."""
    a0 = zero
    a1 = zero
    a2 = zero
    a3 = zero
    idx = x * im0 + y * im1 + c * im2
    if vec:
        base = 0
        end = n
        if shift > 0:
            end = n + shift - 4
            base = 4 - shift
        first = y == 0 and c == 0              # should_reduce_tail
        if shift > 0 and first and x >= shift and x < 4:
            a0 = _acc_add(op, a0, V[o, x - shift])
        while idx * 4 + 3 < end:
            j = base + idx * 4
            a0 = _acc_add(op, a0, V[o, j])
            a1 = _acc_add(op, a1, V[o, j + 1])
            a2 = _acc_add(op, a2, V[o, j + 2])
            a3 = _acc_add(op, a3, V[o, j + 3])
            idx += step
        if first:
            t = end - end % 4 + x
            if t < end:
                a0 = _acc_add(op, a0, V[o, base + t])
    else:
        k = 0
        while idx < n:
            v = V[o, idx]
            r = k & 3
            if r == 0:
                a0 = _acc_add(op, a0, v)
            elif r == 1:
                a1 = _acc_add(op, a1, v)
            elif r == 2:
                a2 = _acc_add(op, a2, v)
            else:
                a3 = _acc_add(op, a3, v)
            idx += step
            k += 1
    return ((a0 + a1) + a2) + a3


@jit
def _reduce_one(V, o, shift, vec, bx, by, ctas, xsplit, ysplit, im0, im1, im2, step, op,
                zero, p, q, r):
    """One output of Reduce.cuh's kernel: the threads that split its input
    (x when ``xsplit``, y when ``ysplit``, the ``ctas`` blocks), the block
    trees, then the global reduction. ``p``, ``q``, ``r``: scratch."""
    n = V.shape[1]
    nx = bx if xsplit else 1
    ny = by if ysplit else 1
    for c in range(ctas):
        for y in range(ny):
            for x in range(nx):
                p[y * nx + x] = _thread(V, o, x, y, c, shift, n, vec, im0, im1, im2, step,
                                        op, zero)
        if ysplit:                              # block_y_reduce, column by column
            for x in range(nx):
                for y in range(ny):
                    q[y] = p[y * nx + x]
                p[x] = _tree(q, 0, ny, False)
        if xsplit:                              # block_x_reduce
            _tree(p, 0, nx, True)
        r[c] = p[0]
    if ctas == 1:
        return r[0]
    # global_reduce: the last block's thread t = x + y * bx takes the staged
    # values of blocks t, t + T, ... (t = y when x spans outputs), then
    # block_y_reduce and block_x_reduce
    nthr = bx * by if xsplit else by
    for t in range(nthr):
        acc = zero
        c = t
        while c < ctas:
            acc = acc + r[c]
            c += nthr
        p[t] = acc
    if xsplit:
        for x in range(bx):
            for y in range(by):
                q[y] = p[y * bx + x]
            p[x] = _tree(q, 0, by, False)
        return _tree(p, 0, bx, True)
    for y in range(by):
        q[y] = p[y]
    return _tree(q, 0, by, False)


@pjit
def _reduce_rows(V, shifts, vec, bx, by, ctas, xsplit, ysplit, im0, im1, im2, step, op, zero,
                 out):
    size = bx * by + 1
    for o in prange(V.shape[0]):
        p = np.empty(size, V.dtype)
        q = np.empty(size, V.dtype)
        r = np.empty(ctas, V.dtype)
        out[o] = _reduce_one(V, o, shifts[o], vec, bx, by, ctas, xsplit, ysplit, im0, im1, im2,
                             step, op, zero, p, q, r)


# ------------------------------------------------------------------ drivers
def _storage_offset(a):
    """Where ``a``'s first element lies in its storage, in elements (the
    numpy base chain stands for torch's storage; 0 when unknown)."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is a or root.itemsize != a.itemsize:
        return 0
    d = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return d // a.itemsize if d >= 0 and d % a.itemsize == 0 else 0


def _sm_count():
    return get_profile().sm_count


def _norm_axes(ndim, axes):
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, (int, np.integer)):
        axes = (axes,)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or not -max(ndim, 1) <= a < max(ndim, 1):
            raise FpemuValueError(f"cuda_sum: axes must be ints in [-{ndim}, {ndim}) for a "
                                  f"{ndim}-d array, got {axes!r}; pass the dims to reduce")
        out.append(int(a) % max(ndim, 1))
    return tuple(sorted(set(out))) if ndim else ()


def reduce_acc(array, axes=None, keepdims=False, op=OP_SUM, sm_count=None):
    """The accumulator of Reduce.cuh's kernel (float32; float64 for float64
    input) for a reduction over ``axes`` of ``array`` (float32 or float64
    values, the tensor's layout: strides and storage offset are read from the
    numpy array), before ``project``. ``op``: :data:`OP_SUM`,
    :data:`OP_SQUARES` or :data:`OP_ABS`."""
    a = np.asarray(array)
    if a.dtype not in (np.float32, np.float64):
        raise FpemuValueError(f"cuda reduction: expected a float32 or float64 array (the "
                              f"values of a floating tensor), got {a.dtype}; convert it first")
    acc = a.dtype.type
    ndim = a.ndim
    axes = _norm_axes(ndim, axes)
    if any(s < 0 or s % a.itemsize for s in a.strides):
        a = np.ascontiguousarray(a)
    strides = tuple(s // a.itemsize for s in a.strides)
    shape = a.shape
    kept_shape = tuple(shape[d] for d in range(ndim) if d not in axes)
    final_shape = tuple(1 if d in axes else shape[d] for d in range(ndim)) if keepdims \
        else kept_shape
    geo = geometry(shape, strides, axes)
    if geo.num_outputs == 0 or geo.num_inputs == 0:
        return np.zeros(final_shape, acc)
    cfg = _config(geo, _sm_count() if sm_count is None else sm_count, _storage_offset(a))
    slow_out = list(reversed(geo.out_axes))
    slow_red = list(reversed(geo.red_axes))
    ones = [d for d in range(ndim) if shape[d] == 1]
    V = np.ascontiguousarray(a.transpose(ones + slow_out + slow_red)).reshape(
        geo.num_outputs, geo.num_inputs)
    if cfg.vectorize_input:
        off = np.asarray(_storage_offset(a), np.int64)
        for d in slow_out:
            off = off[..., None] + np.arange(shape[d], dtype=np.int64) * strides[d]
        shifts = np.ascontiguousarray(off.reshape(-1) % INPUT_VEC_SIZE)
    else:
        shifts = np.zeros(geo.num_outputs, np.int64)
    out = np.empty(geo.num_outputs, acc)
    im = cfg.input_mult
    run_kernel(_reduce_rows, V, shifts, cfg.vectorize_input, cfg.block_width, cfg.block_height,
               cfg.ctas_per_output, im[0] != 0, im[1] != 0, im[0], im[1], im[2],
               cfg.step_input, op, acc(0), out, inputs=2)
    R = out.reshape([shape[d] for d in slow_out])
    R = R.transpose(np.argsort(slow_out)) if slow_out else R
    return np.ascontiguousarray(R).reshape(final_shape)


def cuda_sum(array, axes=None, keepdims=False, dtype=None):
    """``torch.sum`` on CUDA (Reduce.cuh's order, :func:`reduce_acc`):
    ``array`` holds a tensor's values (float32 storage for float32, bfloat16
    and float16 tensors; float64 for float64), ``axes`` the dims to reduce
    (None: all), ``dtype`` the output dtype to round the accumulator to once
    (an fpemu dtype / Format or ``float64``; None keeps the accumulator).
    Returns a float32 array (float64 for a float64 input or ``dtype``)."""
    acc = reduce_acc(array, axes, keepdims, OP_SUM)
    return acc if dtype is None else _round_to(acc, dtype)


def cuda_mean(array, axes=None, keepdims=False, dtype=None):
    """``torch.mean`` on CUDA: the sum in Reduce.cuh's order times
    ``factor = float(outputs) / numel`` (ReduceMomentKernel.cu
    ``mean_kernel_impl``, SharedReduceOps.h ``MeanOps.project``); an empty
    reduction is NaN."""
    a = np.asarray(array)
    acc = reduce_acc(a, axes, keepdims, OP_SUM)
    t = acc.dtype.type
    numel = a.size
    nout = acc.size
    with np.errstate(all="ignore"):
        if numel == 0:
            res = np.full(acc.shape, np.nan, acc.dtype)
        else:
            factor = t(t(nout) / t(numel))
            res = (acc * factor).astype(acc.dtype)
    return res if dtype is None else _round_to(res, dtype)


def cuda_norm(array, p, axes=None, keepdims=False, dtype=None):
    """``linalg.vector_norm`` on CUDA for p = 1 and 2 (ReduceNormKernel.cu:
    NormOneOps ``acc + |x|``; NormTwoOps ``fma(x, x, acc)`` and ``sqrt`` in
    ``project``), in Reduce.cuh's order."""
    if p not in (1, 2):
        raise FpemuValueError(f"cuda_norm: models p = 1 and p = 2, got p = {p!r}; other "
                              f"orders are computed elsewhere")
    acc = reduce_acc(array, axes, keepdims, OP_ABS if p == 1 else OP_SQUARES)
    res = acc if p == 1 else np.sqrt(acc)
    return res if dtype is None else _round_to(res, dtype)


def _round_to(acc, dtype):
    return _store(acc, dtype)


# ------------------------------------------------------------------ softmax
# aten/src/ATen/native/cuda/PersistentSoftmax.cuh (softmax_warp_forward,
# softmax_warp_backward), dispatched by cuda/SoftMax.cu host_softmax when the
# softmax runs along the last dim (inner size 1) and dim_size <= 1024 with
# dim_size * sizeof(scalar_t) <= 4096. One warp of W = min(next_pow2(n), 32)
# lanes per row (WARP_BATCH rows per warp do not mix); lane l holds elements
# l, l + W, ... (WARP_ITERATIONS of them, -inf / 0 past the end); a lane adds
# its values in that order from 0, then warp_reduce combines the lanes with a
# butterfly (WARP_SHFL_XOR by W/2, ..., 1): every lane ends with the same sum.

def persistent_softmax_applies(n, inner, itemsize):
    """host_softmax's test for the persistent warp kernel."""
    return inner == 1 and 0 < n <= 1024 and n * itemsize <= 4096


@jit
def _warp_width(n):
    p = 1
    while p < n:
        p *= 2
    return min(p, 32), p


@jit
def _warp_sum(v, w, iters):
    """A row's sum as the persistent softmax kernel takes it: lane l adds
    elements l, l + w, ... in float32 from 0, then the lanes' XOR butterfly."""
    n = v.shape[0]
    s = np.zeros(w, np.float32)
    for lane in range(w):
        acc = np.float32(0)
        for it in range(iters):
            j = lane + it * w
            if j < n:
                acc = np.float32(acc + v[j])
        s[lane] = acc
    return _butterfly(s, w)


@jit
def _butterfly(s, w):
    """warp_reduce<Add>: for offset = w/2 .. 1, s[l] = s[l] + s[l ^ offset]."""
    off = w // 2
    t = np.empty_like(s)
    while off > 0:
        for lane in range(w):
            t[lane] = s[lane] + s[lane ^ off]
        for lane in range(w):
            s[lane] = t[lane]
        off //= 2
    return s[0]


@jit
def _exp32(v):
    """expf, as the correctly rounded float32 value (CUDA's expf is not
    correctly rounded; not modelled)."""
    return np.float32(np.exp(np.float64(v)))


@pjit
def _softmax_fwd_rows(X, log, out):
    rows, n = X.shape
    w, p2 = _warp_width(n)
    iters = p2 // w
    for r in prange(rows):
        m = np.float32(-np.inf)
        for j in range(n):                       # lanes' max, then the max butterfly
            v = X[r, j]
            if not (m > v):
                m = v
        e = np.empty(n, np.float32)
        for j in range(n):
            e[j] = _exp32(np.float32(X[r, j] - m))
        total = _warp_sum(e, w, iters)
        if log:
            ls = np.float32(np.log(np.float64(total)))
            for j in range(n):
                out[r, j] = np.float32(np.float32(X[r, j] - m) - ls)
        else:
            for j in range(n):
                if total == 0:
                    out[r, j] = np.nan
                else:
                    e = _exp32(np.float32(X[r, j] - m))
                    out[r, j] = np.float32(np.float64(e) / np.float64(total))


@pjit
def _softmax_bwd_rows(T, Y, log, out):
    """``T``: grad * output rounded to the dtype (softmax; SoftMax.cu
    softmax_backward_cuda_out's ``tmp``) or the grad (log_softmax)."""
    rows, n = T.shape
    w, p2 = _warp_width(n)
    iters = p2 // w
    for r in prange(rows):
        total = _warp_sum(T[r], w, iters)
        for j in range(n):
            y = Y[r, j]
            if log:
                y = _exp32(y)
            out[r, j] = fma32(-y, total, T[r, j])     # nvcc: t - y * sum as one fma


def cuda_softmax_forward(X, log):
    """softmax (``log`` False) or log_softmax of the rows of ``X`` (float32
    values, rows along the last axis, n <= 1024), PersistentSoftmax.cuh's
    order; float32 results (the caller rounds to the dtype)."""
    X = np.ascontiguousarray(X, np.float32)
    out = np.empty_like(X)
    run_kernel(_softmax_fwd_rows, X, bool(log), out, inputs=1)
    return out


def cuda_softmax_backward(T, Y, log):
    """softmax_warp_backward on rows: ``T - Y * sum(T)`` (softmax, T = grad *
    output in the dtype) or ``T - expf(Y) * sum(T)`` (log_softmax, T = grad),
    contracted to one fma; float32 results."""
    T = np.ascontiguousarray(T, np.float32)
    Y = np.ascontiguousarray(Y, np.float32)
    out = np.empty_like(T)
    run_kernel(_softmax_bwd_rows, T, Y, bool(log), out, inputs=2)
    return out


# ------------------------------------------------------------------ nll_loss
def nll_loss_threads(nframe):
    """Loss.cu ``nll_loss_threads``: ``clamp(1 << round(log2(nframe / 16)),
    32, 1024)`` (integer division; std::round rounds halves away from 0)."""
    q = int(nframe) // 16
    if q < 1:
        return 32
    k = math.floor(math.log2(q) + 0.5)
    return int(min(max(1 << k, 32), 1024))


@jit
def _nll_threads(x, w, keep, fused, sh, aw):
    """nll_loss_forward_reduce_cuda_kernel_2d's block of T = len(sh) threads:
    thread t takes frames t, t + T, ...; ``sh[t] -= x * w`` (float32 weights:
    nvcc's fma(-x, w, sh); the caller passes x * w rounded to a 16-bit dtype,
    or x without weights, with ``fused`` False) and ``aw[t] += w``; then the
    shared-memory tree, strides T/2, ..., 1."""
    n = x.shape[0]
    T = sh.shape[0]
    for i in range(n):
        t = i % T
        if keep[i]:
            if fused:
                sh[t] = fma32(-x[i], w[i], sh[t])
            else:
                sh[t] = sh[t] - x[i]
            aw[t] = aw[t] + w[i]
    stride = T // 2
    while stride > 0:
        for t in range(stride):
            sh[t] = sh[t] + sh[t + stride]
            aw[t] = aw[t] + aw[t + stride]
        stride //= 2
    return sh[0], aw[0]


def cuda_nll_loss_2d(picked, weights, keep, mean, dtype, weighted):
    """The "sum" / "mean" nll_loss of an (N, C) input on CUDA (Loss.cu
    ``nll_loss_forward_reduce_cuda_kernel_2d``, one block of
    :func:`nll_loss_threads` threads): ``picked`` the float32 values
    ``input[i, target[i]]``, ``weights`` their class weights (values of the
    dtype), ``keep`` the frames whose target is not ``ignore_index``. Returns
    (loss, total_weight) as float32 values, the loss ``sum / total_weight``
    for "mean"; the caller rounds to the dtype."""
    x = np.ascontiguousarray(picked, np.float32)
    w = np.ascontiguousarray(weights, np.float32) if weighted else np.ones_like(x)
    # without weights sh -= x * 1 is sh - x; float32 weights: fma(-x, w, sh);
    # 16-bit weights: c10's operator* rounds x * w to the dtype first
    fused = bool(weighted) and dtype.name == "fp32"
    if weighted and not fused:
        x = np.ascontiguousarray(_store(x.astype(np.float64) * w, dtype), np.float32)
    T = nll_loss_threads(x.shape[0])
    sh = np.zeros(T, np.float32)
    aw = np.zeros(T, np.float32)
    out, tot = _nll_threads(x, w, np.ascontiguousarray(keep, np.bool_), fused, sh, aw)
    out, tot = np.float32(out), np.float32(tot)
    if mean:
        with np.errstate(all="ignore"):
            out = np.float32(out / tot)
    return out, tot


# ---------------------------------------------------------------- layer_norm
# aten/src/ATen/native/cuda/layer_norm_kernel.cu, vectorized_layer_norm_kernel
# (float, half and bfloat16 rows whose length N is a multiple of vec_size = 4,
# aligned buffers): one block of 32 x 8 threads per row (num_threads() = 256);
# thread t = x + 32 y takes the 4-element vectors t, t + 256, ... and feeds
# their elements in order to cuWelfordOnlineSum; the lanes combine with
# WARP_SHFL_DOWN by 16, 8, 4, 2, 1 (cuWelfordCombine), the warps through
# shared memory (offsets 4, 2, 1); var = sigma2 / float(N); rstd =
# rsqrt(var + eps); y = gamma * (rstd * (x - mean)) + beta. nvcc's
# contractions of the Welford formulas are taken as LLVM's DAG combiner
# forms them (a product that feeds an add becomes an fma, the first operand
# of the add first); they are read from the source, not yet measured.

@jit
def _rcp(v):
    """1.f / v, IEEE division (nvcc's default -prec-div=true)."""
    return np.float32(1.0 / np.float64(v))


@jit
def _welford_online(val, mean, s2, cnt):
    """cuWelfordOnlineSum: delta = val - mean; count + 1; mean + delta *
    (1 / count) and sigma2 + delta * (val - new_mean), each an fma."""
    delta = np.float32(val - mean)
    nc = np.float32(cnt + np.float32(1))
    nm = fma32(delta, _rcp(nc), mean)
    ns = fma32(delta, np.float32(val - nm), s2)
    return nm, ns, nc


@jit
def _welford_combine(bm, bs, bc, am, as_, ac):
    """cuWelfordCombine(dataB, dataA)."""
    delta = np.float32(bm - am)
    count = np.float32(ac + bc)
    if count > 0:
        coef = _rcp(count)
        na = np.float32(ac * coef)
        nb = np.float32(bc * coef)
        mean = fma32(na, am, np.float32(nb * bm))
        s2 = fma32(np.float32(np.float32(delta * delta) * ac), nb, np.float32(as_ + bs))
        return mean, s2, count
    return np.float32(0), np.float32(0), count


@pjit
def _layer_norm_rows(X, gamma, beta, has_gamma, has_beta, eps, out, stats):
    M, N = X.shape
    nvec = N // 4
    for r in prange(M):
        wm = np.zeros(256, np.float32)
        ws = np.zeros(256, np.float32)
        wc = np.zeros(256, np.float32)
        for t in range(256):
            m = np.float32(0)
            s = np.float32(0)
            c = np.float32(0)
            i = t
            while i < nvec:
                for ii in range(4):
                    m, s, c = _welford_online(X[r, 4 * i + ii], m, s, c)
                i += 256
            wm[t] = m
            ws[t] = s
            wc[t] = c
        for y in range(8):                       # intra-warp: shuffle down 16 .. 1
            b = 32 * y
            off = 16
            while off > 0:
                for lane in range(off):
                    wm[b + lane], ws[b + lane], wc[b + lane] = _welford_combine(
                        wm[b + lane], ws[b + lane], wc[b + lane],
                        wm[b + lane + off], ws[b + lane + off], wc[b + lane + off])
                off //= 2
        off = 4                                  # inter-warp: offsets 4, 2, 1
        while off > 0:
            for y in range(off):
                a = 32 * y
                b = 32 * (y + off)
                wm[a], ws[a], wc[a] = _welford_combine(wm[a], ws[a], wc[a],
                                                       wm[b], ws[b], wc[b])
            off //= 2
        mean = wm[0]
        var = np.float32(np.float64(ws[0]) / np.float64(np.float32(N)))
        rstd = np.float32(1.0 / np.sqrt(np.float64(np.float32(var + eps))))
        stats[r, 0] = mean
        stats[r, 1] = rstd
        for j in range(N):
            xh = np.float32(rstd * np.float32(X[r, j] - mean))
            if has_gamma and has_beta:
                out[r, j] = fma32(gamma[j], xh, beta[j])
            elif has_gamma:
                out[r, j] = np.float32(gamma[j] * xh)
            elif has_beta:
                out[r, j] = fma32(rstd, np.float32(X[r, j] - mean), beta[j])
            else:
                out[r, j] = xh


def vectorized_layer_norm_applies(N, storage_offset, dtype_is_float64):
    """layer_norm_kernel.cu's test for vectorized_layer_norm_kernel (float,
    half, bfloat16; N a multiple of 4 up to 2**24; aligned rows)."""
    return (not dtype_is_float64 and N % 4 == 0 and 0 < N <= 1 << 24
            and storage_offset % 4 == 0)


def cuda_layer_norm(X, gamma, beta, eps):
    """vectorized_layer_norm_kernel on the rows of ``X`` (M, N) (float32
    values): returns (y, mean, rstd) as float32 (y before the cast to the
    dtype). ``gamma`` / ``beta``: the (N,) values or None. rstd takes the
    correctly rounded 1 / sqrt (CUDA's rsqrtf is not correctly rounded: not
    modelled)."""
    X = np.ascontiguousarray(X, np.float32)
    M, N = X.shape
    g = np.ascontiguousarray(gamma if gamma is not None else np.ones(N), np.float32).reshape(-1)
    b = np.ascontiguousarray(beta if beta is not None else np.zeros(N), np.float32).reshape(-1)
    out = np.empty_like(X)
    stats = np.empty((M, 2), np.float32)
    run_kernel(_layer_norm_rows, X, g, b, gamma is not None, beta is not None,
               np.float32(eps), out, stats, inputs=3)
    return out, stats[:, 0], stats[:, 1]


# ------------------------------------------------- FlashAttention's dot_do_o
@pjit
def _dot_do_o(dO, Out, fmad, out):
    n, E = dO.shape
    per = E // 8
    for r in prange(n):
        part = np.empty(8, np.float32)
        for t in range(8):
            j0 = t * per
            s = dO[r, j0] * Out[r, j0]
            for j in range(j0 + 1, j0 + per):
                if fmad:
                    s = fma32(dO[r, j], Out[r, j], s)
                else:
                    s = s + dO[r, j] * Out[r, j]
            part[t] = s
        for off in (4, 2, 1):                   # Allreduce<8>: xor 4, then 2, then 1
            nxt = np.empty(8, np.float32)
            for t in range(8):
                nxt[t] = part[t] + part[t ^ off]
            part = nxt
        out[r] = part[0]


def dot_do_o(dO, Out, fmad=True):
    """D = rowsum(dO ∘ Out) (float32 (n, E) arrays, E >= 8) as
    FlashAttention-2's ``dot_do_o`` sums it for head dim 64: 8 threads a
    row, thread t over the columns ``t E/8 .. (t+1) E/8 - 1`` (the first
    product rounded to float32, then float32 fused multiply-adds when
    ``fmad``, else a rounded product and a rounded add each), the 8 partial
    sums added by a butterfly ``((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7))``."""
    dO = np.ascontiguousarray(dO, np.float32)
    Out = np.ascontiguousarray(Out, np.float32)
    if dO.ndim != 2 or dO.shape != Out.shape or dO.shape[1] < 8:
        raise FpemuValueError(f"dot_do_o(): dO and Out are (rows, head dim >= 8) arrays of "
                              f"one shape; got {dO.shape} and {Out.shape}")
    out = np.empty(dO.shape[0], np.float32)
    run_kernel(_dot_do_o, dO, Out, bool(fmad), out, inputs=2)
    return out
