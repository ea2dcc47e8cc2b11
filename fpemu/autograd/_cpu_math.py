"""ATen's CPU elementwise math, bit for bit (the CPU profile).

ATen's CPU kernels (``aten/src/ATen/native/cpu/*.cpp``) run an elementwise
op through ``cpu_kernel_vec`` (``native/cpu/Loops.h``): along each contiguous
row of the ``TensorIterator`` the body takes two ``Vectorized`` values a step
(2 x 16 floats or 2 x 8 doubles under AVX512, 2 x 8 / 2 x 4 under AVX2) and
computes with the ``Vectorized`` functions, which call SLEEF
(``Sleef_expf16_u10`` ...: ``src/libm/sleefsimdsp.c`` / ``sleefsimddp.c`` of
shibatch/sleef, built with FMA for AVX2 and AVX512) or ATen's own formulas
(``cpu/vec/vec512/vec512_float.h``: ``erf``, ``exp_u20``); the leftover
elements of a row (the tail) run the scalar lambda, whose ``std::exp`` etc.
are glibc's ``expf`` / ``exp``.

This module holds per-lane Numba models of the SLEEF functions the modelled
kernels call (the same operations in the same order, ``fma32`` / ``fma``
where SLEEF's ``vmla`` is an FMA), calls of the process's libm for the
scalar tails (the glibc torch's own process calls), the model of which
elements of a row take the vector body (:func:`vector_mask`), and the
kernels of the ops modelled (``activation`` below). Every function here
computes lane by lane: a SIMD lane depends only on its own element.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._jit import (
    f32_from_ubits, f64_from_bits, fma, fma32, jit, run_kernel,
)
from ._profile import get_profile

_f = np.float32


# ------------------------------------------------------------------- libm
def _libm(name, ty):
    """A call of the C library's ``name`` (``expf``, ``exp`` ...) on a
    float32 / float64 value: the function ATen's scalar lambdas reach through
    ``std::exp`` etc. (glibc's, loaded in this process as in torch's)."""
    @intrinsic
    def call(typingctx, x):
        if x != ty:
            return None

        def codegen(context, builder, signature, args):
            llty = ir.FloatType() if ty == types.float32 else ir.DoubleType()
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(llty, [llty]), name)
            return builder.call(fn, args)
        return ty(ty), codegen
    return call


c_expf = _libm("expf", types.float32)
c_exp = _libm("exp", types.float64)
c_erff = _libm("erff", types.float32)
c_erf = _libm("erf", types.float64)
c_tanhf = _libm("tanhf", types.float32)
c_tanh = _libm("tanh", types.float64)
c_log1pf = _libm("log1pf", types.float32)
c_log1p = _libm("log1p", types.float64)
c_logf = _libm("logf", types.float32)
c_log = _libm("log", types.float64)
c_expm1f = _libm("expm1f", types.float32)
c_expm1 = _libm("expm1", types.float64)


# ------------------------------------------------------------ SLEEF, float
_R_LN2F = _f(1.442695040888963407359924681001892137426645954152985934135449406931)
_L2UF = _f(0.693145751953125)
_L2LF = _f(1.428606765330187045e-06)
_INF32 = _f(np.inf)


@jit
def _rint_i32(x):
    """``_mm512_cvtps_epi32``: to nearest even; NaN and out of range give
    INT_MIN."""
    if not (abs(x) < _f(2147483648.0)):
        return np.int32(-2147483648)
    return np.int32(np.rint(x))


@jit
def _pow2i_f(q):
    """2**q as a float32 from its exponent bits (SLEEF's vpow2i_vf_vi2)."""
    return f32_from_ubits(np.uint32(((q + 0x7F) & 0x1FF) << 23))


@jit
def _ldexp2_f(d, e):
    """SLEEF's vldexp2_vf_vf_vi2: d * 2**(e >> 1) * 2**(e - (e >> 1))."""
    h = e >> 1
    return (d * _pow2i_f(h)) * _pow2i_f(e - h)


@jit
def sleef_expf(d):
    """``Sleef_expf16_u10`` / ``Sleef_expf8_u10`` (SLEEF's xexpf, FMA)."""
    q = _rint_i32(d * _R_LN2F)
    qf = _f(q)
    s = fma32(qf, -_L2UF, d)
    s = fma32(qf, -_L2LF, s)
    u = _f(0.000198527617612853646278381)
    u = fma32(u, s, _f(0.00139304355252534151077271))
    u = fma32(u, s, _f(0.00833336077630519866943359))
    u = fma32(u, s, _f(0.0416664853692054748535156))
    u = fma32(u, s, _f(0.166666671633720397949219))
    u = fma32(u, s, _f(0.5))
    u = _f(1) + fma32(s * s, u, s)
    u = _ldexp2_f(u, q)
    if d < _f(-104):
        u = _f(0)
    if _f(100) < d:
        u = _INF32
    if d != d:
        u = d
    return u


# ----------------------------------------------------------- SLEEF, double
_R_LN2 = 1.442695040888963407359924681001892137426645954152985934135449406931
_L2U = .69314718055966295651160180568695068359375
_L2L = .28235290563031577122588448175013436025525412068e-12


@jit
def _pow2i_d(q):
    """2**q as a float64 from its exponent bits (SLEEF's vpow2i_vd_vi)."""
    return f64_from_bits(np.int64((q + 0x3FF) & 0x7FF) << 52)


@jit
def _ldexp2_d(d, e):
    h = e >> 1
    return (d * _pow2i_d(h)) * _pow2i_d(e - h)


@jit
def sleef_exp(d):
    """``Sleef_expd8_u10`` / ``Sleef_expd4_u10`` (SLEEF's xexp, FMA; its
    polynomial by Estrin's scheme, POLY10)."""
    u = np.rint(d * _R_LN2)
    q = np.int64(u) if abs(u) < 2147483648.0 else np.int64(-2147483648)
    s = fma(u, -_L2U, d)
    s = fma(u, -_L2L, s)
    s2 = s * s
    s4 = s2 * s2
    s8 = s4 * s4
    p98 = fma(s, +0.2081276378237164457e-8, +0.2511210703042288022e-7)
    p76 = fma(s, +0.2755762628169491192e-6, +0.2755723402025388239e-5)
    p54 = fma(s, +0.2480158687479686264e-4, +0.1984126989855865850e-3)
    p32 = fma(s, +0.1388888888914497797e-2, +0.8333333333314938210e-2)
    p10 = fma(s, +0.4166666666666602598e-1, +0.1666666666666669072e+0)
    p8 = fma(s4, fma(s2, p76, p54), fma(s2, p32, p10))
    u = fma(s8, p98, p8)
    u = fma(u, s, 0.5)
    u = fma(u, s, 1.0)
    u = fma(u, s, 1.0)
    u = _ldexp2_d(u, q)
    if d > 709.78271289338399678773454114191:
        u = np.inf
    if d < -1000.0:
        u = 0.0
    if d != d:
        u = d
    return u


# ------------------------------------------- one name for float32 and float64
def _generic(name, f32, f64):
    """A function of one float that calls ``f32`` on a float32 and ``f64`` on
    a float64, in Python and inside Numba code (resolved when a kernel is
    compiled for its dtype)."""
    def fn(x):
        return f32(x) if isinstance(x, np.float32) else f64(x)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``{f32.__name__}`` on a float32, ``{f64.__name__}`` on a float64."

    @overload(fn, jit_options={"cache": True})
    def _typed(x):
        if x == types.float32:
            return lambda x: f32(x)
        if x == types.float64:
            return lambda x: f64(x)
        return None
    return fn


vexp = _generic("vexp", sleef_expf, sleef_exp)
sexp = _generic("sexp", c_expf, c_exp)


# ------------------------------------------------------------------ layout
GRAIN_SIZE = 32768          # at::internal::GRAIN_SIZE


def _iteration(shape, strides):
    """``TensorIterator``'s dimension order (``reorder_dimensions``: the
    fastest dim first, by the operands' strides, broadcast dims skipped,
    ties to the smaller dim) and its coalesced inner row: (perm, the row's
    length, whether every operand walks the row contiguously or at most one
    input stays put). ``strides``: one tuple of element strides per existing
    operand (an allocated output takes the order and is left out)."""
    nd = len(shape)
    perm = list(range(nd - 1, -1, -1))

    def should_swap(d0, d1):
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0
    for i in range(1, nd):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            c = should_swap(perm[d0], perm[d1])
            if c > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif c < 0:
                break
    # the output, allocated in this order: its strides
    out = [0] * nd
    acc = 1
    for d in perm:
        out[d] = acc
        acc *= shape[d]
    ops = [out] + [list(s) for s in strides]
    row, inner = _coalesced_row(shape, perm, ops)
    contiguous = all(s == 1 for s in inner) or (
        inner[0] == 1 and sum(s == 0 for s in inner[1:]) == 1
        and all(s in (0, 1) for s in inner[1:]))
    return perm, row, contiguous


def _coalesced_row(shape, perm, ops):
    """The length of the innermost dim after ``coalesce_dimensions``, and
    the operands' strides along it."""
    nd = len(shape)
    if nd == 0:
        return 1, [1] * len(ops)
    cur = perm[0]
    size = shape[cur]
    strides = [st[cur] for st in ops]
    for k in range(1, nd):
        d = perm[k]
        n = shape[d]
        if size == 1:
            size, strides = n, [st[d] for st in ops]
        elif n == 1:
            continue
        elif all(s * size == st[d] for s, st in zip(strides, ops)):
            size *= n
        else:
            break
    return size, strides


def vector_mask(shape, strides, lanes2, threads, grain=GRAIN_SIZE):
    """Which elements (a bool array of ``shape``) an ATen CPU elementwise
    kernel computes in its vector body (``cpu_kernel_vec``, Loops.h's
    ``vectorized_loop``: ``lanes2`` elements a step from the start of each
    contiguous row segment; the leftover of a segment, and every element of
    a row that is not contiguous, take the scalar lambda). ``strides``: the
    element strides of the inputs (an output the kernel allocates follows
    their order). ``TensorIterator::for_each`` splits the elements among
    ``threads`` when there are at least ``grain`` of them
    (``at::parallel_for``, OpenMP: ``ceil(n / tasks)`` a task), each task's
    range cut into row segments."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return np.zeros(shape, bool)
    perm, row, contiguous = _iteration(tuple(shape), [tuple(s) for s in strides])
    if not contiguous:
        return np.zeros(shape, bool)
    if n < grain or threads <= 1:
        bounds = [(0, n)]
    else:
        tasks = min(threads, -(-n // grain))
        chunk = -(-n // tasks)
        bounds = [(b, min(n, b + chunk)) for b in range(0, n, chunk)]
    it = np.zeros(n, bool)
    for begin, end in bounds:
        pos = begin
        while pos < end:
            seg_end = min(end, (pos // row + 1) * row)
            body = (seg_end - pos) // lanes2 * lanes2
            it[pos:pos + body] = True
            pos = seg_end
    order = np.arange(n).reshape(shape).transpose(perm[::-1]).reshape(-1)
    mask = np.empty(n, bool)
    mask[order] = it
    return mask.reshape(shape)


def elementwise_mask(shape, arrays, itemsize, grain=GRAIN_SIZE):
    """:func:`vector_mask` for the numpy inputs ``arrays`` (broadcast to
    ``shape``; their strides stand for the torch tensors'), under the
    active profile's vector width and thread count."""
    prof = get_profile()
    strides = []
    for a in arrays:
        a = np.asarray(a)
        b = np.broadcast_to(a, shape)
        strides.append(tuple(s // a.itemsize for s in b.strides))
    return vector_mask(shape, strides, 2 * prof.cpu_lanes(itemsize), prof.cpu_threads, grain)


# ----------------------------------------------------------------- kernels
@jit
def _glu(a, b, vec, out):
    one = out.dtype.type(1)
    for i in range(out.size):
        e = vexp(-b[i]) if vec[i] else sexp(-b[i])
        out[i] = a[i] * (one / (one + e))


def _run(kernel, shape, dtype, *arrays, mask):
    flat = [np.ascontiguousarray(np.broadcast_to(a, shape), dtype).reshape(-1) for a in arrays]
    out = np.empty(int(np.prod(shape, dtype=np.int64)), dtype)
    run_kernel(kernel, *flat, np.ascontiguousarray(mask).reshape(-1), out,
               inputs=len(flat) + 1)
    return out.reshape(shape)


def glu(a, b):
    """``glu_kernel`` (Activation.cpp): ``a * (1 / (1 + exp(-b)))`` in the
    dtype (float32 / float64 arrays ``a``, ``b``: the halves as views of the
    input, their strides deciding the vector rows)."""
    mask = elementwise_mask(a.shape, (a, b), a.itemsize)
    return _run(_glu, a.shape, a.dtype, a, b, mask=mask)


# ----------------------------------------------------------------- softmax
@jit
def _lane_sum(e, lanes, tree):
    """``vec::reduce_all`` / ``map_reduce_all`` with ``+`` over a row
    (functional_base.h): under ``lanes`` elements the lane-0 sum in order;
    else ``lanes`` accumulators (element j into lane j % lanes, the last
    partial vector into its first lanes), then ``VecReduceAllSIMD``: for
    float32 the butterfly (lane i plus lane i ^ k, k = lanes / 2 ... 1), for
    float64 lane 0 plus lanes 1, 2, ... in order."""
    n = e.size
    if n < lanes:
        s = e[0]
        for j in range(1, n):
            s = s + e[j]
        return s
    acc = e[:lanes].copy()
    for j in range(lanes, n):
        acc[j % lanes] = acc[j % lanes] + e[j]
    if tree:
        k = lanes // 2
        while k >= 1:
            nxt = acc.copy()
            for i in range(lanes):
                nxt[i] = acc[i] + acc[i ^ k]
            acc = nxt
            k //= 2
        return acc[0]
    s = acc[0]
    for i in range(1, lanes):
        s = s + acc[i]
    return s


@jit
def _softmax_lastdim(x, lanes, tree, out):
    """``_vec_softmax_lastdim`` on rows (SoftMaxKernel.cpp): the max, ``exp(x
    - max)`` by ``vec::map`` (SLEEF for every element, the partial vector
    too), their lane sum, ``x * (1 / sum)``."""
    one = x.dtype.type(1)
    for r in range(x.shape[0]):
        row = x[r]
        m = row[0]
        for j in range(1, row.size):
            v = row[j]
            if v != v or m != m:
                m = v if v != v else m
            elif v > m:
                m = v
        e = np.empty(row.size, x.dtype)
        for j in range(row.size):
            e[j] = vexp(row[j] - m)
        inv = one / _lane_sum(e, lanes, tree)
        for j in range(row.size):
            out[r, j] = e[j] * inv


@jit
def _softmax_inner(x, vec, out):
    """``_vec_softmax`` (a dim that is not the last; x: outer, dim, inner):
    per (outer, inner) position the max over the dim, ``exp(x - max)`` (SLEEF
    where ``vec`` marks the position as a vector lane, else libm), their sum
    from 0 in order, ``e / sum``."""
    zero = x.dtype.type(0)
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            m = x[o, 0, i]
            for d in range(1, x.shape[1]):
                v = x[o, d, i]
                if v != v or m != m:
                    m = v if v != v else m
                elif v > m:
                    m = v
            s = zero
            for d in range(x.shape[1]):
                e = vexp(x[o, d, i] - m) if vec[o, i] else sexp(x[o, d, i] - m)
                out[o, d, i] = e
                s = s + e
            for d in range(x.shape[1]):
                out[o, d, i] = out[o, d, i] / s


def _softmax_vector_positions(outer, inner, dim_size, lanes, threads):
    """Which (outer, inner) positions ``_vec_softmax`` runs as vector lanes:
    ``parallel_for`` over the outer * inner positions, in a task's range a
    position starts a vector of ``lanes`` when the vector stays inside its
    row of inner positions and inside the range, else the rest of the row
    (or of the range) is scalar. Measured on torch 2.13 (one and two
    threads): the range is cut into ``threads`` equal tasks whatever its
    size (the source's grain, ``GRAIN_SIZE / dim_size``, does not keep a
    small softmax on one thread); ``dim_size`` is kept for that grain."""
    n = outer * inner
    vec = np.zeros(n, bool)
    if threads > 1 and n > 1:
        tasks = min(threads, n)
        chunk = -(-n // tasks)
        bounds = [(b, min(n, b + chunk)) for b in range(0, n, chunk)]
    else:
        bounds = [(0, n)]
    for begin, end in bounds:
        idx = begin
        while idx < end:
            col = idx % inner
            if col + lanes <= inner and idx + lanes <= end:
                vec[idx:idx + lanes] = True
                idx += lanes
            else:
                idx += (end - idx) if idx + lanes > end else (inner - col)
    return vec.reshape(outer, inner)


def softmax(x, dim):
    """ATen's CPU softmax of a float32 / float64 array along ``dim``
    (``softmax_lastdim_kernel_impl`` / ``softmax_kernel_impl``)."""
    prof = get_profile()
    lanes = prof.cpu_lanes(x.itemsize)
    X = np.ascontiguousarray(x)
    if X.ndim == 0:
        X = X.reshape(1)
        dim = 0
    if X.size == 0:
        return np.empty(x.shape, x.dtype)
    shape = X.shape
    if dim == X.ndim - 1:
        rows = X.reshape(-1, shape[-1])
        out = np.empty(rows.shape, X.dtype)
        run_kernel(_softmax_lastdim, rows, lanes, X.dtype == np.float32, out, inputs=1)
        return out.reshape(x.shape)
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64))
    X3 = X.reshape(outer, shape[dim], inner)
    vec = _softmax_vector_positions(outer, inner, shape[dim], lanes, prof.cpu_threads)
    out = np.empty(X3.shape, X.dtype)
    run_kernel(_softmax_inner, X3, vec, out, inputs=2)
    return out.reshape(x.shape)


# ------------------------------------------------------------- activations
def hardsigmoid(x):
    """``hardsigmoid_kernel``: ``min(max(x + 3, 0), 6) / 6``, each step in
    the dtype (the same in the vector body and the tail)."""
    t = x.dtype.type
    return np.minimum(np.maximum(x + t(3), t(0)), t(6)) / t(6)


def hardswish(x):
    """``hardswish_kernel``: ``x * min(max(x + 3, 0), 6) / 6``, each step in
    the dtype, left to right."""
    t = x.dtype.type
    return x * np.minimum(np.maximum(x + t(3), t(0)), t(6)) / t(6)
