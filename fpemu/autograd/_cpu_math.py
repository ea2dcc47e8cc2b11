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
kernels call (expf / exp, expm1f / expm1, logf / log (u10), log1pf /
log1p, tanhf / tanh: the same operations in the same order, ``fma32`` /
``fma`` where SLEEF's FMA build fuses, the double-float / double-double
helpers of ``df.h`` / ``dd.h``), ATen's own float erf, oneDNN's AVX-512
gelu_erf (torch hands a contiguous float32 gelu to oneDNN), calls of the
process's libm for the scalar tails (the glibc torch's own process calls),
the model of which elements of a row take the vector body
(:func:`vector_mask`), and the kernels of the ops modelled (glu, softmax,
log_softmax, sigmoid, silu, gelu, elu / selu / celu, softplus, mish,
log_sigmoid, hardswish, hardsigmoid). Every function here computes lane by
lane: a SIMD lane depends only on its own element. The kernels modelled are
all registered with ``ALSO_REGISTER_AVX512_DISPATCH`` (or, log_sigmoid, run
every element through the vector code), so the profile's vector width is
the one they run with.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .._jit import (
    f32_from_ubits, f32_ubits, f64_bits, f64_from_bits, fma, fma32, fma_any, jit, run_kernel,
)
from ._cuda_reduce import reorder_dims
from ._profile import GRAIN_SIZE, get_profile

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


@jit
def _one32(x):
    return _f(1)


@jit
def _one64(x):
    return 1.0


# ------------------------------------------- SLEEF, float: double-float pairs
# SLEEF's ``df.h`` / ``dd.h`` carry a float32 / float64 value as an
# unevaluated sum (hi, lo); each helper below follows its namesake's
# operations (FMA build: vfmapn is fma(x, y, -z), vfmanp fma(-x, y, z), vrec
# 1 / x), on float32 (``df*_vf2``) or float64 (``dd*_vd2``) alike.
@jit
def _df_add2_f2f(xh, xl, y):
    """dfadd2_vf2_vf2_vf"""
    s = xh + y
    v = s - xh
    t = (xh - (s - v)) + (y - v)
    return s, t + xl


@jit
def _df_add2_f2f2(xh, xl, yh, yl):
    """dfadd2_vf2_vf2_vf2"""
    s = xh + yh
    v = s - xh
    t = (xh - (s - v)) + (yh - v)
    return s, t + (xl + yl)


@jit
def _df_add2_ff(x, y):
    """dfadd2_vf2_vf_vf"""
    s = x + y
    v = s - x
    return s, (x - (s - v)) + (y - v)


@jit
def _df_add_ff(x, y):
    """dfadd_vf2_vf_vf (|x| >= |y|)"""
    s = x + y
    return s, (x - s) + y


@jit
def _df_add_ff2(x, yh, yl):
    """dfadd_vf2_vf_vf2"""
    s = x + yh
    return s, ((x - s) + yh) + yl


@jit
def _df_add_f2f(xh, xl, y):
    """dfadd_vf2_vf2_vf"""
    s = xh + y
    return s, ((xh - s) + y) + xl


@jit
def _df_add_f2f2(xh, xl, yh, yl):
    """dfadd_vf2_vf2_vf2"""
    s = xh + yh
    return s, (((xh - s) + yh) + xl) + yl


@jit
def _df_mul_f2f(xh, xl, y):
    """dfmul_vf2_vf2_vf"""
    s = xh * y
    return s, fma_any(xl, y, fma_any(xh, y, -s))


@jit
def _df_mul_f2f2(xh, xl, yh, yl):
    """dfmul_vf2_vf2_vf2"""
    s = xh * yh
    return s, fma_any(xh, yl, fma_any(xl, yh, fma_any(xh, yh, -s)))


@jit
def _df_squ(xh, xl):
    """dfsqu_vf2_vf2"""
    s = xh * xh
    return s, fma_any(xh + xh, xl, fma_any(xh, xh, -s))


@jit
def _df_rec_f2(dh, dl):
    """dfrec_vf2_vf2"""
    one = _one(dh)
    s = one / dh
    return s, s * fma_any(-dl, s, fma_any(-dh, s, one))


@jit
def _df_div(nh, nl, dh, dl):
    """dfdiv_vf2_vf2_vf2"""
    one = _one(dh)
    t = one / dh
    s = nh * t
    u = fma_any(t, nh, -s)
    v = fma_any(-dl, t, fma_any(-dh, t, one))
    return s, fma_any(s, v, fma_any(nl, t, u))


@jit
def _ilogb2k_f(d):
    """vilogb2k_vi2_vf: the biased exponent field minus 127."""
    return np.int32((f32_ubits(d) >> np.uint32(23)) & np.uint32(0xFF)) - np.int32(0x7F)


@jit
def _ldexp3_f(d, q):
    """vldexp3_vf_vf_vi2: q added to the exponent field."""
    return f32_from_ubits(np.uint32((np.int64(f32_ubits(d)) + (np.int64(q) << 23))
                                    & 0xFFFFFFFF))


@jit
def _expk2f(xh, xl):
    """SLEEF's expk2f: exp of a double-float, as a double-float."""
    u = (xh + xl) * _R_LN2F
    q = _rint_i32(u)
    qf = _f(q)
    sh, sl = _df_add2_f2f(xh, xl, qf * -_L2UF)
    sh, sl = _df_add2_f2f(sh, sl, qf * -_L2LF)
    u = _f(0.1980960224e-3)
    u = fma32(u, sh, _f(0.1394256484e-2))
    u = fma32(u, sh, _f(0.8333456703e-2))
    u = fma32(u, sh, _f(0.4166637361e-1))
    th, tl = _df_mul_f2f(sh, sl, u)
    th, tl = _df_add2_f2f(th, tl, _f(0.166666659414234244790680580464e+0))
    th, tl = _df_mul_f2f2(sh, sl, th, tl)
    th, tl = _df_add2_f2f(th, tl, _f(0.5))
    ah, al = _df_squ(sh, sl)
    ah, al = _df_mul_f2f2(ah, al, th, tl)
    th, tl = _df_add2_f2f2(sh, sl, ah, al)
    th, tl = _df_add_ff2(_f(1), th, tl)
    th = _ldexp2_f(th, q)
    tl = _ldexp2_f(tl, q)
    if xh < _f(-104):
        th = _f(0)
        tl = _f(0)
    return th, tl


@jit
def sleef_expm1f(a):
    """``Sleef_expm1f16_u10`` / ``Sleef_expm1f8_u10`` (SLEEF's xexpm1f)."""
    eh, el = _expk2f(a, _f(0))
    dh, dl = _df_add2_f2f(eh, el, _f(-1))
    x = dh + dl
    if a > _f(88.72283172607421875):
        x = _INF32
    if a < _f(-16.635532333438687426013570):
        x = _f(-1)
    if f32_ubits(a) == np.uint32(0x80000000):
        x = _f(-0.0)
    if a != a:
        x = a
    return x


@jit
def sleef_tanhf(x):
    """``Sleef_tanhf16_u10`` / ``Sleef_tanhf8_u10`` (SLEEF's xtanhf)."""
    y = abs(x)
    dh, dl = _expk2f(y, _f(0))
    eh, el = _df_rec_f2(dh, dl)
    nh, nl = _df_add_f2f2(dh, dl, -eh, -el)
    mh, ml = _df_add_f2f2(dh, dl, eh, el)
    dh, dl = _df_div(nh, nl, mh, ml)
    y = dh + dl
    if abs(x) > _f(8.664339742) or y != y:
        y = _f(1)
    if f32_ubits(x) & np.uint32(0x80000000):
        y = -y
    if x != x:
        y = x
    return y


_LN2F_HI = _f(0.69314718246459960938)
_LN2F_LO = _f(-1.904654323148236017e-09)


@jit
def _logf_core(e, xh, xl):
    """The tail of xlogf_u1 / xlog1pf: e * ln2 + 2 atanh(x), x a double-float."""
    x2 = xh * xh
    t = _f(+0.3027294874e+0)
    t = fma32(t, x2, _f(+0.3996108174e+0))
    t = fma32(t, x2, _f(+0.6666694880e+0))
    sh, sl = _df_mul_f2f(_LN2F_HI, _LN2F_LO, e)
    sh, sl = _df_add_f2f2(sh, sl, xh * _f(2), xl * _f(2))
    sh, sl = _df_add_f2f(sh, sl, (x2 * xh) * t)
    return sh + sl


@jit
def sleef_logf(d):
    """``Sleef_logf16_u10`` / ``Sleef_logf8_u10`` (SLEEF's xlogf_u1; the
    AVX2 build's scaling of subnormals and the AVX512 build's getexp /
    getmant give the same exponent and mantissa)."""
    if not (d > _f(0)) or d == _INF32:
        if d != d or d < _f(0):
            return _f(np.nan)
        if d == _f(0):
            return -_INF32
        return _INF32
    e = np.int32(0)
    if d < _f(1.1754943508222875e-38):
        d = d * _f(18446744073709551616.0)
        e = np.int32(-64)
    k = _ilogb2k_f(d * _f(1.0 / 0.75))
    m = _ldexp3_f(d, -k)
    e = e + k
    ah, al = _df_add2_ff(_f(-1), m)
    bh, bl = _df_add2_ff(_f(1), m)
    xh, xl = _df_div(ah, al, bh, bl)
    return _logf_core(_f(e), xh, xl)


_LOG1PF_BOUND = _f(1.0e+38)


@jit
def sleef_log1pf(d):
    """``Sleef_log1pf16_u10`` / ``Sleef_log1pf8_u10`` (SLEEF's xlog1pf)."""
    dp1 = d + _f(1)
    e = np.int32(0)
    if dp1 < _f(1.1754943508222875e-38):
        dp1 = dp1 * _f(18446744073709551616.0)
        e = np.int32(-64)
    k = _ilogb2k_f(dp1 * _f(1.0 / 0.75))
    t = _ldexp3_f(_f(1), -k)
    m = fma32(d, t, t - _f(1))
    e = e + k
    bh, bl = _df_add_ff(_f(2), m)
    xh, xl = _df_div(m, _f(0), bh, bl)
    r = _logf_core(_f(e), xh, xl)
    if not (d <= _LOG1PF_BOUND):
        r = sleef_logf(d)
    if _f(-1) > d or d != d:
        r = _f(np.nan)
    if d == _f(-1):
        r = -_INF32
    if f32_ubits(d) == np.uint32(0x80000000):
        r = _f(-0.0)
    return r


@jit
def aten_erff(x):
    """``Vectorized<float>::erf`` (vec512_float.h / vec256_float.h): ATen's
    own rational approximation (Abramowitz and Stegun 7.1.26) with SLEEF's
    expf, FMA where the header calls ``_mm*_fmadd_ps``."""
    neg = np.uint32(f32_ubits(x) & np.uint32(0x80000000))
    a = abs(x)
    t = _f(1) / fma32(_f(0.3275911), a, _f(1))
    r = fma32(_f(1.061405429), t, _f(-1.453152027))
    r = fma32(r, t, _f(1.421413741))
    r = fma32(r, t, _f(-0.284496736))
    r = fma32(r, t, _f(0.254829592))
    e = -sleef_expf(-(x * x))
    y = fma32(e * t, r, _f(1))
    return f32_from_ubits(np.uint32(f32_ubits(y) ^ neg))


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


@jit
def _poly2(x, c1, c0):
    return fma(x, c1, c0)


@jit
def _poly4(x, x2, c3, c2, c1, c0):
    return fma(x2, fma(x, c3, c2), fma(x, c1, c0))


@jit
def _expk2(xh, xl):
    """SLEEF's expk2: exp of a double-double, as a double-double (its
    polynomial by Estrin's scheme, POLY10)."""
    u = (xh + xl) * _R_LN2
    dq = np.rint(u)
    q = np.int64(dq) if abs(dq) < 2147483648.0 else np.int64(-2147483648)
    sh, sl = _df_add2_f2f(xh, xl, dq * -_L2U)
    sh, sl = _df_add2_f2f(sh, sl, dq * -_L2L)
    s2h, s2l = _df_squ(sh, sl)
    s4h, s4l = _df_squ(s2h, s2l)
    s8 = s4h * s4h
    x, x2, x4 = sh, s2h, s4h
    u = fma(s8, _poly2(x, +0.1602472219709932072e-9, +0.2092255183563157007e-8),
            fma(x4, _poly4(x, x2, +0.2505230023782644465e-7, +0.2755724800902135303e-6,
                           +0.2755731892386044373e-5, +0.2480158735605815065e-4),
                _poly4(x, x2, +0.1984126984148071858e-3, +0.1388888888886763255e-2,
                       +0.8333333333333347095e-2, +0.4166666666666669905e-1)))
    th, tl = _df_mul_f2f(sh, sl, +0.1666666666666666574e+0)
    th, tl = _df_add_ff2(0.5, th, tl)
    th, tl = _df_mul_f2f2(th, tl, sh, sl)
    th, tl = _df_add_ff2(1.0, th, tl)
    th, tl = _df_mul_f2f2(th, tl, sh, sl)
    th, tl = _df_add_ff2(1.0, th, tl)
    ah, al = _df_mul_f2f(s4h, s4l, u)
    th, tl = _df_add_f2f2(th, tl, ah, al)
    th = _ldexp2_d(th, q)
    tl = _ldexp2_d(tl, q)
    if xh < -1000.0:
        th = 0.0
        tl = 0.0
    return th, tl


@jit
def sleef_expm1(a):
    """``Sleef_expm1d8_u10`` / ``Sleef_expm1d4_u10`` (SLEEF's xexpm1)."""
    eh, el = _expk2(a, 0.0)
    dh, dl = _df_add2_f2f(eh, el, -1.0)
    x = dh + dl
    if a > 709.782712893383996732223:
        x = np.inf
    if a < -36.736800569677101399113302437:
        x = -1.0
    if f64_bits(a) == np.int64(-9223372036854775808):
        x = -0.0
    if a != a:
        x = a
    return x


@jit
def sleef_tanh(x):
    """``Sleef_tanhd8_u10`` / ``Sleef_tanhd4_u10`` (SLEEF's xtanh)."""
    y = abs(x)
    dh, dl = _expk2(y, 0.0)
    eh, el = _df_rec_f2(dh, dl)
    nh, nl = _df_add2_f2f2(dh, dl, -eh, -el)
    mh, ml = _df_add2_f2f2(dh, dl, eh, el)
    dh, dl = _df_div(nh, nl, mh, ml)
    y = dh + dl
    if abs(x) > 18.714973875 or y != y:
        y = 1.0
    if x < 0.0 or f64_bits(x) == np.int64(-9223372036854775808):
        y = -y
    if x != x:
        y = x
    return y


@jit
def _ilogb2k_d(d):
    return np.int64((f64_bits(d) >> 52) & 0x7FF) - 0x3FF


@jit
def _ldexp3_d(d, q):
    return f64_from_bits(f64_bits(d) + (np.int64(q) << 52))


@jit
def _log_core(e, xh, xl):
    """The tail of xlog_u1 / xlog1p: e * ln2 + 2 atanh(x), x a double-double
    (POLY7 in x**2)."""
    x2 = xh * xh
    x4 = x2 * x2
    x8 = x4 * x4
    t = fma(x8, fma(x4, 0.1532076988502701353e+0,
                    fma(x2, 0.1525629051003428716e+0, 0.1818605932937785996e+0)),
            _poly4(x2, x4, 0.2222214519839380009e+0, 0.2857142932794299317e+0,
                   0.3999999999635251990e+0, 0.6666666666667333541e+0))
    sh, sl = _df_mul_f2f(0.693147180559945286226764, 2.319046813846299558417771e-17, e)
    sh, sl = _df_add_f2f2(sh, sl, xh * 2.0, xl * 2.0)
    sh, sl = _df_add_f2f(sh, sl, (x2 * xh) * t)
    return sh + sl


@jit
def sleef_log(d):
    """``Sleef_logd8_u10`` / ``Sleef_logd4_u10`` (SLEEF's xlog_u1)."""
    if not (d > 0.0) or d == np.inf:
        if d != d or d < 0.0:
            return np.nan
        if d == 0.0:
            return -np.inf
        return np.inf
    e = np.int64(0)
    if d < 2.2250738585072014e-308:
        d = d * 18446744073709551616.0
        e = np.int64(-64)
    k = _ilogb2k_d(d * (1.0 / 0.75))
    m = _ldexp3_d(d, -k)
    e = e + k
    ah, al = _df_add2_ff(-1.0, m)
    bh, bl = _df_add2_ff(1.0, m)
    xh, xl = _df_div(ah, al, bh, bl)
    return _log_core(np.float64(e), xh, xl)


@jit
def sleef_log1p(d):
    """``Sleef_log1pd8_u10`` / ``Sleef_log1pd4_u10`` (SLEEF's xlog1p)."""
    dp1 = d + 1.0
    e = np.int64(0)
    if dp1 < 2.2250738585072014e-308:
        dp1 = dp1 * 18446744073709551616.0
        e = np.int64(-64)
    k = _ilogb2k_d(dp1 * (1.0 / 0.75))
    t = _ldexp3_d(1.0, -k)
    m = fma(d, t, t - 1.0)
    e = e + k
    bh, bl = _df_add_ff(2.0, m)
    xh, xl = _df_div(m, 0.0, bh, bl)
    r = _log_core(np.float64(e), xh, xl)
    if not (d <= 1.0e+307):
        r = sleef_log(d)
    if d < -1.0 or d != d:
        r = np.nan
    if d == -1.0:
        r = -np.inf
    if f64_bits(d) == np.int64(-9223372036854775808):
        r = -0.0
    return r


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
_one = _generic("_one", _one32, _one64)
vexpm1 = _generic("vexpm1", sleef_expm1f, sleef_expm1)
sexpm1 = _generic("sexpm1", c_expm1f, c_expm1)
vtanh = _generic("vtanh", sleef_tanhf, sleef_tanh)
stanh = _generic("stanh", c_tanhf, c_tanh)
vlog = _generic("vlog", sleef_logf, sleef_log)
slog = _generic("slog", c_logf, c_log)
vlog1p = _generic("vlog1p", sleef_log1pf, sleef_log1p)
slog1p = _generic("slog1p", c_log1pf, c_log1p)
sexp = _generic("sexp", c_expf, c_exp)


# ------------------------------------------------------------------ layout


def _iteration(shape, strides):
    """``TensorIterator``'s dimension order (``reorder_dimensions``: the
    fastest dim first, by the operands' strides, broadcast dims skipped,
    ties to the smaller dim) and its coalesced inner row: (perm, the row's
    length, whether every operand walks the row contiguously or at most one
    input stays put). ``strides``: one tuple of element strides per existing
    operand (an allocated output takes the order and is left out)."""
    nd = len(shape)
    perm = reorder_dims(shape, [(st, False) for st in strides])
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
def _max_and_exps(row):
    """A row's max (``vec::maximum``: a NaN anywhere makes it NaN) and
    SLEEF's ``exp(x - max)`` of each element (``vec::map``, the partial
    vector too): the first steps of both last-dim kernels."""
    m = row[0]
    for j in range(1, row.size):
        v = row[j]
        if v != v or m != m:
            m = v if v != v else m
        elif v > m:
            m = v
    e = np.empty(row.size, row.dtype)
    for j in range(row.size):
        e[j] = vexp(row[j] - m)
    return m, e


@jit
def _softmax_lastdim(x, lanes, tree, out):
    """``_vec_softmax_lastdim`` on rows (SoftMaxKernel.cpp): the max, ``exp(x
    - max)`` by ``vec::map`` (SLEEF for every element, the partial vector
    too), their lane sum, ``x * (1 / sum)``."""
    one = x.dtype.type(1)
    for r in range(x.shape[0]):
        row = x[r]
        _, e = _max_and_exps(row)
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


def _softmax_family(x, dim, lastdim_kernel, inner_kernel, positions):
    """Run a softmax-family kernel of a float32 / float64 array along
    ``dim``: ``lastdim_kernel(rows, lanes, tree, out)`` on the rows of the
    last dim, else ``inner_kernel(x3, vec, out)`` on (outer, dim, inner) with
    ``vec = positions(outer, inner, dim_size, lanes)`` marking the vector
    lanes."""
    lanes = get_profile().cpu_lanes(x.itemsize)
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
        run_kernel(lastdim_kernel, rows, lanes, X.dtype == np.float32, out, inputs=1)
        return out.reshape(x.shape)
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    inner = int(np.prod(shape[dim + 1:], dtype=np.int64))
    X3 = X.reshape(outer, shape[dim], inner)
    vec = np.ascontiguousarray(positions(outer, inner, shape[dim], lanes))
    out = np.empty(X3.shape, X.dtype)
    run_kernel(inner_kernel, X3, vec, out, inputs=2)
    return out.reshape(x.shape)


def softmax(x, dim):
    """ATen's CPU softmax of a float32 / float64 array along ``dim``
    (``softmax_lastdim_kernel_impl`` / ``softmax_kernel_impl``)."""
    threads = get_profile().cpu_threads
    return _softmax_family(x, dim, _softmax_lastdim, _softmax_inner,
                           lambda o, i, n, lanes: _softmax_vector_positions(o, i, n, lanes,
                                                                            threads))


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


# ------------------------------------------------- sigmoid, silu, gelu
@jit
def _sigmoid(x, vec, out):
    one = out.dtype.type(1)
    zero = out.dtype.type(0)
    for i in range(out.size):
        e = vexp(zero - x[i]) if vec[i] else sexp(-x[i])
        out[i] = one / (one + e)


@jit
def _silu(x, vec, out):
    one = out.dtype.type(1)
    for i in range(out.size):
        e = vexp(-x[i]) if vec[i] else sexp(-x[i])
        out[i] = x[i] / (one + e)


def _unary_kernel(kernel, x, *extra):
    """``kernel`` over the float32 / float64 array ``x`` (any strides) with
    the vector-body mask of ``x``'s iteration."""
    mask = elementwise_mask(x.shape, (x,), x.itemsize)
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, x.dtype)
    run_kernel(kernel, flat, np.ascontiguousarray(mask).reshape(-1), *extra, out, inputs=2)
    return out.reshape(x.shape)


def sigmoid(x):
    """``sigmoid_kernel`` (UnaryOpsKernel.cpp, ALSO_REGISTER_AVX512_DISPATCH):
    the vector body ``1 / (1 + exp(0 - x))`` with SLEEF's exp, the tail
    ``1 / (1 + std::exp(-x))``."""
    return _unary_kernel(_sigmoid, x)


def silu(x):
    """``silu_kernel`` (Activation.cpp, ALSO_REGISTER_AVX512_DISPATCH):
    ``x / (1 + exp(-x))``, SLEEF's exp in the vector body, libm's in the
    tail."""
    return _unary_kernel(_silu, x)


@jit
def _gelu_erf32(x, vec, out):
    alpha = _f(0.70710678118654752440)
    half = _f(0.5)
    one = _f(1)
    for i in range(out.size):
        v = x[i]
        e = aten_erff(v * alpha) if vec[i] else c_erff(v * alpha)
        out[i] = v * half * (one + e)


def gelu(x):
    """``GeluKernelImpl`` (Activation.cpp, ALSO_REGISTER_AVX512_DISPATCH) with
    ``approximate='none'``: ``vectorized_gelu`` / ``scalar_gelu`` of
    native/cpu/Gelu.h, ``x * 0.5 * (1 + erf(x * M_SQRT1_2))`` with ATen's
    ``Vectorized<float>::erf`` in the vector body and libm's ``erff`` in the
    tail."""
    if x.dtype != np.float32:
        raise TypeError("gelu: the CPU model takes float32")
    return _unary_kernel(_gelu_erf32, x)


# --------------------------------------------------- oneDNN's gelu (erf)
# torch's CPU gelu (aten/src/ATen/native/Activation.cpp, gelu_out_cpu) hands
# a contiguous float32 tensor of more than one element to oneDNN
# (``use_mkldnn``: ideep's eltwise_gelu_erf); oneDNN's JIT injector
# (src/cpu/x64/injectors/jit_uni_eltwise_injector.cpp,
# ``gelu_erf_minimax_approx_compute_vector_fwd``) on AVX-512 evaluates
# erf(x / sqrt 2) as one of 25 degree-5 polynomials in |x|, picked by the
# exponent and two leading mantissa bits of |x| (the coefficient table
# ``gelu_erf_minimax_polynomial``, bit patterns below, degree 0 first).
_GELU_MINIMAX = np.array([
    [0xa6f2cb94, 0x32827792, 0x3381cc0c, 0x34523d4a, 0x351ac44d, 0x35f36d88, 0x36ee8229,
     0x37b8a3bb, 0x3867a213, 0x3940033b, 0x3a2a5a1d, 0x3ae35863, 0x3b7828f2, 0x3c08b14b,
     0x3c515ed3, 0xbb503236, 0xbd8d8e5e, 0xbe8abcd9, 0xbf0c19a2, 0xbeccb328, 0x3e176ced,
     0x3f470d99, 0x3f7abb28, 0x3f800000, 0x00000000],
    [0x3f4c422a, 0x3f4c421f, 0x3f4c4207, 0x3f4c41cb, 0x3f4c413b, 0x3f4c3fad, 0x3f4c3a2f,
     0x3f4c2d40, 0x3f4c146a, 0x3f4bc341, 0x3f4ad08c, 0x3f48f8cf, 0x3f45fac7, 0x3f404e07,
     0x3f3b980f, 0x3f48dff3, 0x3f78b21b, 0x3fbb0704, 0x40019c32, 0x3fe536d6, 0x3f81331e,
     0x3e6c8684, 0x3c98f936, 0x00000000, 0x3f800000],
    [0xb62173f4, 0x3735e4cf, 0x37f2ff89, 0x388c23be, 0x3917535c, 0x39ab2ab0, 0x3a60fadb,
     0x3af9b960, 0x3b6e5491, 0x3c0a4ec5, 0x3ca5aa8c, 0x3d2138d9, 0x3d8737d4, 0x3ddfb660,
     0x3e0f27ab, 0x3d94004b, 0xbe0efdeb, 0xbf1d96c3, 0xbf89db58, 0xbf6d9897, 0xbef69fb8,
     0xbdc4f8a8, 0xbbde6422, 0x00000000, 0x00000000],
    [0xbe081a19, 0xbe084570, 0xbe08639b, 0xbe089837, 0xbe08f409, 0xbe09ab95, 0xbe0b66d0,
     0xbe0e400a, 0xbe124df8, 0xbe1bde02, 0xbe2f19c9, 0xbe4931bf, 0xbe685fbc, 0xbe89c95f,
     0xbe96cbca, 0xbe8044aa, 0xbe0550f2, 0x3dcfd6a1, 0x3e94c826, 0x3e79345f, 0x3decec91,
     0x3ca46568, 0x3aa1e00a, 0x00000000, 0x00000000],
    [0xba3d61db, 0x39f097a3, 0x3a5845dc, 0x3ab1fa35, 0x3b0cefb8, 0x3b653ab6, 0x3bcae527,
     0x3c221712, 0x3c6c5840, 0x3cc0a703, 0x3d1dcc19, 0x3d63656d, 0x3d955907, 0x3dbf9910,
     0x3dd53f69, 0x3db7dcef, 0x3d639ebe, 0xba6ede48, 0xbd22be69, 0xbd041cf1, 0xbc64f5ab,
     0xbb097a32, 0xb8ebf380, 0x00000000, 0x00000000],
    [0x3cb7d80c, 0x3c9b6050, 0x3c978d11, 0x3c92e850, 0x3c8d058b, 0x3c848454, 0x3c6cd623,
     0x3c4c824b, 0x3c2a7935, 0x3be0b390, 0x3b0651ac, 0xbb232f53, 0xbbd42fa0, 0xbc2c5366,
     0xbc492c9e, 0xbc2a7aa6, 0xbbd55d04, 0xba823a76, 0x3b102aa8, 0x3ae25a7e, 0x3a31f792,
     0x38b84375, 0x3689bb5a, 0x00000000, 0x00000000]
], np.uint32).view(np.float32)
_GELU_IDX_BIAS = 0xC21FFFFF
_GELU_RBOUND = np.array([0x40B15CEE], np.uint32).view(np.float32)[0]


@jit
def _onednn_gelu_erf512(x, table, out):
    """oneDNN's AVX-512 gelu_erf per element: the polynomial's index is
    ``(bits(|x|) + 0xc21fffff) >> 21`` (int32 wrap, arithmetic shift) kept
    in [1, 24], 23 beyond ``rbound``; Horner in |x| with FMA; the sign put
    back; ``(x * (1 + p)) * 0.5``."""
    for i in range(out.size):
        v = x[i]
        a = abs(v)
        b = np.int64(f32_ubits(a)) + _GELU_IDX_BIAS
        b = b & 0xFFFFFFFF
        if b >= 0x80000000:
            b -= 0x100000000
        k = b >> 21
        k = min(max(k, 1), 24)
        if _GELU_RBOUND < a:
            k = 23
        p = table[5, k]
        for d in range(4, -1, -1):
            p = fma32(p, a, table[d, k])
        if f32_ubits(v) & np.uint32(0x80000000):
            p = -p
        p = p + _f(1)
        out[i] = (v * p) * _f(0.5)


def onednn_gelu(x):
    """torch's CPU gelu (erf form) of a contiguous float32 array of two or
    more elements: oneDNN's eltwise_gelu_erf (AVX-512 build, every element
    through the same vector code)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, np.float32)
    run_kernel(_onednn_gelu_erf512, flat, _GELU_MINIMAX, out, inputs=2)
    return out.reshape(x.shape)


_GELU_BETA = 1.41421356237309504880 * 1.12837916709551257390 * 0.5   # M_SQRT2 * M_2_SQRTPI * 0.5


@jit
def _gelu_tanh(x, vec, beta, kappa, out):
    half = out.dtype.type(0.5)
    one = out.dtype.type(1)
    for i in range(out.size):
        v = x[i]
        inner = beta * fma_any(kappa, v * v * v, v)
        t = vtanh(inner) if vec[i] else stanh(inner)
        out[i] = half * v * (one + t)


def gelu_model(x, approximate):
    """The model of torch CPU's gelu for the float32 / float64 array ``x``
    under the active profile, or None where fpemu has none:

    * ``'none'``, float32, C-contiguous, two or more elements: oneDNN's
      gelu_erf (:func:`onednn_gelu`; its AVX-512 code only: on an AVX2 CPU
      oneDNN takes another approximation, not modelled);
    * ``'none'``, float32 otherwise: ATen's kernel (:func:`gelu`);
    * ``'tanh'``: ``vectorized_gelu_approximated_with_tanh`` /
      ``scalar_gelu_approximated_with_tanh`` (Gelu.h), ``x * x * x``,
      ``kBeta * (x + kKappa * cube)`` with the sum and product contracted
      into one FMA (GCC, in the vector body and in the tail: measured),
      SLEEF's tanhf / tanh in the vector body, libm's in the tail;
    * ``'none'``, float64: None (SLEEF's double erf is not modelled)."""
    if approximate == "tanh":
        t = x.dtype.type
        return lambda v: _unary_kernel(_gelu_tanh, v, t(_GELU_BETA), t(0.044715))
    if x.dtype != np.float32:
        return None
    if x.flags.c_contiguous and x.size > 1:
        if not get_profile().cpu_capability.upper().startswith("AVX512"):
            return None
        return onednn_gelu
    return gelu


# ------------------------------------------------------- elu, softplus, mish
@jit
def _elu(x, vec, negcoef, poscoef, negipt, out):
    zero = out.dtype.type(0)
    for i in range(out.size):
        a = x[i]
        if vec[i]:
            out[i] = vexpm1(a * negipt) * negcoef if not (a >= zero) else a * poscoef
        else:
            out[i] = sexpm1(a * negipt) * negcoef if a < zero else a * poscoef


def elu(x, alpha, scale, input_scale):
    """``elu_kernel`` (Activation.cpp with native/cpu/Elu.h,
    ALSO_REGISTER_AVX512_DISPATCH) on a float32 / float64 array: with
    ``negcoef = alpha * scale`` (in the dtype), ``poscoef = scale``,
    ``negiptcoef = input_scale``, the tail takes ``expm1(x * negiptcoef) *
    negcoef`` where ``x < 0`` (libm's expm1), the vector body where not ``x
    >= 0`` (SLEEF's expm1), else ``x * poscoef``."""
    t = x.dtype.type
    return _unary_kernel(_elu, x, t(t(alpha) * t(scale)), t(scale), t(input_scale))


@jit
def _softplus(x, vec, beta, threshold, out):
    for i in range(out.size):
        a = x[i]
        ab = a * beta
        if ab > threshold:
            out[i] = a
        elif vec[i]:
            out[i] = vlog1p(vexp(ab)) / beta
        else:
            out[i] = slog1p(sexp(ab)) / beta


def softplus(x, beta, threshold):
    """``softplus_kernel`` (Activation.cpp, ALSO_REGISTER_AVX512_DISPATCH):
    ``x`` where ``x * beta > threshold``, else ``log1p(exp(x * beta)) /
    beta``: SLEEF's exp and log1p in the vector body, libm's in the tail
    (beta and threshold in the dtype)."""
    t = x.dtype.type
    return _unary_kernel(_softplus, x, t(beta), t(threshold))


@jit
def _mish(x, vec, out):
    for i in range(out.size):
        a = x[i]
        if vec[i]:
            out[i] = a * vtanh(vlog1p(vexp(a)))
        else:
            out[i] = a * stanh(slog1p(sexp(a)))


def mish(x):
    """``mish_kernel`` (Activation.cpp, ALSO_REGISTER_AVX512_DISPATCH):
    ``x * tanh(log1p(exp(x)))``, SLEEF's functions in the vector body,
    libm's in the tail."""
    return _unary_kernel(_mish, x)


@jit
def _log_sigmoid(x, out):
    zero = out.dtype.type(0)
    for i in range(out.size):
        a = x[i]
        m = a if a < zero or a != a else zero
        out[i] = m - vlog1p(vexp(-abs(a)))


def log_sigmoid(x):
    """``log_sigmoid_cpu_kernel`` (Activation.cpp): ``vec::minimum(x, 0) -
    log1p(exp(-|x|))`` for every element through the vector code (its
    leftover vector is loaded partially, not run by a scalar loop), SLEEF's
    exp and log1p; ``minimum`` keeps NaN and gives +0 for -0."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, x.dtype)
    run_kernel(_log_sigmoid, flat, out, inputs=1)
    return out.reshape(x.shape)


# ------------------------------------------------------------- log_softmax
@jit
def _log_softmax_lastdim(x, lanes, tree, out):
    """``serial_vec_log_softmax_lastdim_range`` (LogSoftmaxKernelImpl.h) on
    rows: the max (``vec::reduce_all`` of ``maximum``, NaN kept), the lane
    sum of SLEEF's ``exp(x - max)`` (``map_reduce_all``), SLEEF's log of it
    (``vec::map``, the partial vector too), ``x - max - log``."""
    for r in range(x.shape[0]):
        row = x[r]
        m, e = _max_and_exps(row)
        lg = vlog(_lane_sum(e, lanes, tree))
        for j in range(row.size):
            out[r, j] = row[j] - m - lg


@jit
def _log_softmax_inner(x, vec, out):
    """``serial_vec_logsoftmax_range`` (x: outer, dim, inner): per position
    the max over the dim (``data > max`` picks, NaN never), the sum from 0
    in dim order of ``exp(x - max)`` (SLEEF where ``vec`` marks the position
    a vector lane, else libm), SLEEF's log of the sum, ``x - max - log``."""
    for o in range(x.shape[0]):
        for i in range(x.shape[2]):
            m = -np.inf
            m = x.dtype.type(m)
            for d in range(x.shape[1]):
                v = x[o, d, i]
                if v > m:
                    m = v
            s = x.dtype.type(0)
            for d in range(x.shape[1]):
                s = s + (vexp(x[o, d, i] - m) if vec[o, i] else sexp(x[o, d, i] - m))
            lg = vlog(s)
            for d in range(x.shape[1]):
                out[o, d, i] = x[o, d, i] - m - lg


def _log_softmax_vector_positions(outer, inner, dim_size, itemsize, lanes):
    """Which inner positions ``serial_vec_logsoftmax_range`` runs as vector
    lanes: the inner dim cut into chunks of ``min(inner, max(128 KiB /
    dim_size / itemsize, lanes) rounded down to lanes)`` positions, each
    chunk's leading whole vectors (the chunking does not depend on the
    threads)."""
    chunk = max(128 * 1024 // dim_size // itemsize, lanes) // lanes * lanes
    chunk = min(chunk, inner)
    vec = np.zeros(inner, bool)
    for b in range(0, inner, chunk):
        size = min(chunk, inner - b)
        vec[b:b + size - size % lanes] = True
    return np.broadcast_to(vec, (outer, inner))


def log_softmax(x, dim):
    """ATen's CPU log_softmax of a float32 / float64 array along ``dim``
    (``log_softmax_lastdim_kernel_impl`` / ``log_softmax_kernel_impl``,
    LogSoftmaxKernelImpl.h)."""
    return _softmax_family(x, dim, _log_softmax_lastdim, _log_softmax_inner,
                           lambda o, i, n, lanes: _log_softmax_vector_positions(
                               o, i, n, x.itemsize, lanes))


# ------------------------------------------------- expm1, log1p (vml.h)
@jit
def _expm1_all(x, out):
    for i in range(out.size):
        out[i] = vexpm1(x[i])


@jit
def _log1p_all(x, out):
    for i in range(out.size):
        out[i] = vlog1p(x[i])


def _every_element(kernel, x):
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(flat.size, x.dtype)
    run_kernel(kernel, flat, out, inputs=1)
    return out.reshape(x.shape)


def expm1(x):
    """``expm1_kernel`` (UnaryOpsKernel.cpp's ``IMPLEMENT_FLOAT_KERNEL``):
    ``at::vml::vexpm1`` over the iterator's (buffered) rows, which is
    ``vec::map`` of ``Vectorized::expm1`` (MKL's Expm1 is not used, vml.h):
    the last partial vector is loaded partially, so every element, in any
    layout, takes SLEEF's expm1f / expm1 (measured against torch 2.13)."""
    return _every_element(_expm1_all, x)


def log1p(x):
    """``log1p_kernel``: as :func:`expm1`, ``vec::map`` of
    ``Vectorized::log1p`` (MKL's Log1p is not used, vml.h): SLEEF's log1pf
    / log1p for every element."""
    return _every_element(_log1p_all, x)


# ------------------------------------------------------------ loss kernels
@jit
def _bce(x, t, out):
    one = out.dtype.type(1)
    floor = out.dtype.type(-100)
    for i in range(out.size):
        a = slog1p(-x[i])
        b = slog(x[i])
        a = floor if a < floor else a          # std::max(v, -100): NaN stays
        b = floor if b < floor else b
        out[i] = (t[i] - one) * a - t[i] * b


def binary_cross_entropy(x, t):
    """The elementwise loss of ``binary_cross_entropy_out_cpu`` (Loss.cpp),
    a scalar ``cpu_kernel``: ``(t - 1) * max(log1p(-x), -100) - t *
    max(log(x), -100)`` with glibc's log1pf / logf (log1p / log), every
    operation rounded to the dtype and no FMA (Loss.cpp is compiled once,
    for the baseline ISA, not per capability: measured, a fused product
    misses 16 % of the elements). ``x``, ``t``: float32 / float64 arrays of
    one shape."""
    X = np.ascontiguousarray(x).reshape(-1)
    T = np.ascontiguousarray(t, x.dtype).reshape(-1)
    out = np.empty(X.size, x.dtype)
    run_kernel(_bce, X, T, out, inputs=2)
    return out.reshape(x.shape)


@jit
def _xlogy(x, y, out):
    zero = out.dtype.type(0)
    for i in range(out.size):
        if y[i] != y[i]:
            out[i] = y[i]
        elif x[i] == zero:
            out[i] = zero
        else:
            out[i] = x[i] * slog(y[i])


def xlogy(x, y):
    """``xlogy_kernel`` (BinaryOpsKernel.cpp, a scalar ``cpu_kernel``): NaN
    where y is NaN, 0 where x is 0, else ``x * std::log(y)`` (glibc's logf /
    log) in the dtype. ``x``, ``y``: float arrays of one shape."""
    X = np.ascontiguousarray(x).reshape(-1)
    Y = np.ascontiguousarray(y, x.dtype).reshape(-1)
    out = np.empty(X.size, x.dtype)
    run_kernel(_xlogy, X, Y, out, inputs=2)
    return out.reshape(x.shape)


# -------------------------------------------------------------------- pow
# ``pow_tensor_scalar_kernel`` / ``pow_tensor_tensor_kernel``
# (aten/src/ATen/native/cpu/PowKernel.cpp, registered with
# ALSO_REGISTER_AVX512_DISPATCH): the vector body is ``Vectorized::pow``,
# SLEEF's ``Sleef_powf16_u10`` / ``Sleef_powd8_u10`` (AVX512) or
# ``Sleef_powf8_u10`` / ``Sleef_powd4_u10`` (AVX2): xpowf / xpow of
# sleefsimdsp.c / sleefsimddp.c with their logkf / logk and expkf / expk
# helpers (FMA builds); the tail is the C library's pow.
_F32_MIN = _f(1.1754943508222875e-38)
_R_075F = _f(1) / _f(0.75)
_NAN32_ONES = np.uint32(0xFFFFFFFF)


@jit
def _getexp(v):
    """``vgetexp`` (AVX512 getexp) of a positive finite value: floor(log2 v)
    as an integer (0, whose result the callers replace, gives -1)."""
    m, e = math.frexp(v)
    return e - 1


@jit
def _getmant_f(d):
    """``vgetmant_vf_vf`` (_MM_MANT_NORM_p75_1p5): the significand of a
    positive finite float32 d scaled into [0.75, 1.5)."""
    mm, e = math.frexp(d)
    m = _f(mm + mm)
    if m >= _f(1.5):
        m = m * _f(0.5)
    return m


@jit
def _logkf(d, avx512):
    """SLEEF's logkf: log of a positive float32 as a double-float (the
    AVX512 build takes getexp / getmant, the AVX2 build scales subnormals
    and reads the exponent field)."""
    if avx512:
        v = d * _R_075F
        ef = _f(128) if v == _INF32 else _f(_getexp(v))
        m = _getmant_f(d)
    else:
        o = d < _F32_MIN
        if o:
            d = d * _f(18446744073709551616.0)
        e = _ilogb2k_f(d * _R_075F)
        m = _ldexp3_f(d, -e)
        if o:
            e = e - np.int32(64)
        ef = _f(e)
    ah, al = _df_add2_ff(_f(-1), m)
    bh, bl = _df_add2_ff(_f(1), m)
    xh, xl = _df_div(ah, al, bh, bl)
    x2h, x2l = _df_squ(xh, xl)
    t = _f(0.240320354700088500976562)
    t = fma32(t, x2h, _f(0.285112679004669189453125))
    t = fma32(t, x2h, _f(0.400007992982864379882812))
    sh, sl = _df_mul_f2f(_LN2F_HI, _LN2F_LO, ef)
    sh, sl = _df_add_f2f2(sh, sl, xh * _f(2), xl * _f(2))
    ph, pl = _df_mul_f2f(x2h, x2l, t)
    ph, pl = _df_add2_f2f2(ph, pl, _f(0.66666662693023681640625), _f(3.69183861259614332084311e-09))
    qh, ql = _df_mul_f2f2(x2h, x2l, xh, xl)
    qh, ql = _df_mul_f2f2(qh, ql, ph, pl)
    return _df_add_f2f2(sh, sl, qh, ql)


@jit
def _i32(v):
    """int64 -> int32 with wrap-around."""
    return np.int32(((np.int64(v) + 2147483648) & 0xFFFFFFFF) - 2147483648)


@jit
def _ldexp_f(x, q):
    """SLEEF's vldexp_vf_vf_vi2 (int32 lanes, wrapping)."""
    m = q >> 31
    m = _i32((_i32((_i32(m + q)) >> 6) - m) << 4)
    q = _i32(q - _i32(m << 2))
    m = _i32(m + 0x7F)
    if not (m > 0):
        m = np.int32(0)
    if m > 0xFF:
        m = np.int32(0xFF)
    u = f32_from_ubits(np.uint32(np.int64(m) << 23))
    x = ((x * u) * u) * u * u
    u = f32_from_ubits(np.uint32((np.int64(_i32(q + 0x7F)) << 23) & 0xFFFFFFFF))
    return x * u


@jit
def _expkf(dh, dl):
    """SLEEF's expkf: exp of a double-float, as a float32."""
    q = _rint_i32((dh + dl) * _R_LN2F)
    qf = _f(q)
    sh, sl = _df_add2_f2f(dh, dl, qf * -_L2UF)
    sh, sl = _df_add2_f2f(sh, sl, qf * -_L2LF)
    s = sh + sl
    sl = (sh - s) + sl
    sh = s
    u = _f(0.00136324646882712841033936)
    u = fma32(u, sh, _f(0.00836596917361021041870117))
    u = fma32(u, sh, _f(0.0416710823774337768554688))
    u = fma32(u, sh, _f(0.166665524244308471679688))
    u = fma32(u, sh, _f(0.499999850988388061523438))
    ah, al = _df_squ(sh, sl)
    ah, al = _df_mul_f2f(ah, al, u)
    th, tl = _df_add_f2f2(sh, sl, ah, al)
    th, tl = _df_add_ff2(_f(1), th, tl)
    u = _ldexp_f(th + tl, q)
    if dh < _f(-104):
        u = _f(0)
    return u


@jit
def _pow_fix(x, y, result, yisint, yisodd):
    """The special cases xpowf / xpow apply after expk (same order)."""
    one = _one(x)
    zero = one - one
    if x > zero:
        sgn = one
    elif yisint:
        sgn = -one if yisodd else one
    else:
        sgn = one * np.nan
    result = result * sgn
    efx = abs(x) - one
    if np.signbit(y):
        efx = -efx
    if np.isinf(y):
        if efx < zero:
            result = zero
        elif efx == zero:
            result = one
        else:
            result = one * np.inf
    if np.isinf(x) or x == zero:
        r = zero if (np.signbit(y) != (x == zero)) else one * np.inf
        s = x if yisodd else one
        if np.signbit(s):
            r = -r
        result = r
    return result


@jit
def sleef_powf(x, y, avx512):
    """``Sleef_powf16_u10`` / ``Sleef_powf8_u10`` (SLEEF's xpowf)."""
    yisint = np.trunc(y) == y or abs(y) > _f(16777216)
    yisodd = False
    if abs(y) < _f(16777216):
        yisodd = yisint and (np.int32(y) & 1) == 1
    lh, ll = _logkf(abs(x), avx512)
    dh, dl = _df_mul_f2f(lh, ll, y)
    result = _expkf(dh, dl)
    if result != result:
        result = _INF32
    result = _pow_fix(x, y, result, yisint, yisodd)
    if x != x or y != y:
        result = f32_from_ubits(_NAN32_ONES)
    if y == _f(0) or x == _f(1):
        result = _f(1)
    return result


_LN2_HI = 0.693147180559945286226764
_LN2_LO = 2.319046813846299558417771e-17
_R_075 = 1.0 / 0.75
_LOG_DBL_MAX = 709.782712893383973096


@jit
def _getmant_d(d):
    """``vgetmant_vd_vd`` (_MM_MANT_NORM_p75_1p5) of a positive finite d."""
    mm, e = math.frexp(d)
    m = mm + mm
    if m >= 1.5:
        m = m * 0.5
    return m


@jit
def _logk(d, avx512):
    """SLEEF's logk: log of a positive float64 as a double-double (its
    polynomial by Estrin's scheme, POLY9)."""
    if avx512:
        v = d * _R_075
        ef = 1024.0 if v == np.inf else float(_getexp(v))
        m = _getmant_d(d)
    else:
        o = d < 2.2250738585072014e-308
        if o:
            d = d * 18446744073709551616.0
        e = np.int64((f64_bits(d * _R_075) >> 52) & 0x7FF) - 0x3FF
        m = f64_from_bits(f64_bits(d) - (e << 52))
        if o:
            e = e - 64
        ef = float(e)
    ah, al = _df_add2_ff(-1.0, m)
    bh, bl = _df_add2_ff(1.0, m)
    xh, xl = _df_div(ah, al, bh, bl)
    x2h, x2l = _df_squ(xh, xl)
    x2 = x2h
    x4 = x2 * x2
    x8 = x4 * x4
    x16 = x8 * x8
    t = fma(x16, 0.116255524079935043668677,
            fma(x8, _poly4(x2, x4, 0.103239680901072952701192, 0.117754809412463995466069,
                           0.13332981086846273921509, 0.153846227114512262845736),
                _poly4(x2, x4, 0.181818180850050775676507, 0.222222222230083560345903,
                       0.285714285714249172087875, 0.400000000000000077715612)))
    sh, sl = _df_mul_f2f(_LN2_HI, _LN2_LO, ef)
    sh, sl = _df_add_f2f2(sh, sl, xh * 2.0, xl * 2.0)
    yh, yl = _df_mul_f2f2(x2h, x2l, xh, xl)
    ph, pl = _df_mul_f2f2(yh, yl, 0.666666666666666629659233, 3.80554962542412056336616e-17)
    sh, sl = _df_add_f2f2(sh, sl, ph, pl)
    yh, yl = _df_mul_f2f2(x2h, x2l, yh, yl)
    ph, pl = _df_mul_f2f(yh, yl, t)
    return _df_add_f2f2(sh, sl, ph, pl)


@jit
def _expk(dh, dl):
    """SLEEF's expk: exp of a double-double, as a float64 (POLY10)."""
    dq = np.rint((dh + dl) * _R_LN2)
    q = np.int64(dq) if abs(dq) < 2147483648.0 else np.int64(-2147483648)
    sh, sl = _df_add2_f2f(dh, dl, dq * -_L2U)
    sh, sl = _df_add2_f2f(sh, sl, dq * -_L2L)
    s = sh + sl
    sl = (sh - s) + sl
    sh = s
    s2 = sh * sh
    s4 = s2 * s2
    s8 = s4 * s4
    u = fma(s8, _poly2(sh, 2.51069683420950419527139e-08, 2.76286166770270649116855e-07),
            fma(s4, _poly4(sh, s2, 2.75572496725023574143864e-06, 2.48014973989819794114153e-05,
                           0.000198412698809069797676111, 0.0013888888939977128960529),
                _poly4(sh, s2, 0.00833333333332371417601081, 0.0416666666665409524128449,
                       0.166666666666666740681535, 0.500000000000000999200722)))
    th, tl = _df_add_ff2(1.0, sh, sl)
    ah, al = _df_squ(sh, sl)
    ah, al = _df_mul_f2f(ah, al, u)
    th, tl = _df_add_f2f2(th, tl, ah, al)
    u = _ldexp2_d(th + tl, q)
    if dh < -1000.0:
        u = 0.0
    return u


@jit
def sleef_pow(x, y, avx512):
    """``Sleef_powd8_u10`` / ``Sleef_powd4_u10`` (SLEEF's xpow)."""
    yisint = np.rint(y) == y
    yisodd = yisint and np.rint(y * 0.5) != y * 0.5
    lh, ll = _logk(abs(x), avx512)
    dh, dl = _df_mul_f2f(lh, ll, y)
    result = _expk(dh, dl)
    if dh > _LOG_DBL_MAX:
        result = np.inf
    result = _pow_fix(x, y, result, yisint, yisodd)
    if x != x or y != y:
        result = f64_from_bits(np.int64(-1))
    if y == 0.0 or x == 1.0:
        result = 1.0
    return result


def _libm2(name, ty):
    """A call of the C library's two-argument ``name`` (``powf`` / ``pow``,
    glibc's, the one ATen's scalar ``std::pow`` reaches)."""
    @intrinsic
    def call(typingctx, x, y):
        if x != ty or y != ty:
            return None

        def codegen(context, builder, signature, args):
            llty = ir.FloatType() if ty == types.float32 else ir.DoubleType()
            fn = cgutils.get_or_insert_function(builder.module,
                                                ir.FunctionType(llty, [llty, llty]), name)
            return builder.call(fn, args)
        return ty(ty, ty), codegen
    return call


c_powf = _libm2("powf", types.float32)
c_pow2 = _libm2("pow", types.float64)


@jit
def _pow_tt(x, y, vec, avx512, out):
    for i in range(out.size):
        if vec[i]:
            out[i] = sleef_powf(x[i], y[i], avx512)
        else:
            out[i] = c_powf(x[i], y[i])


@jit
def _pow_tt_d(x, y, vec, avx512, out):
    for i in range(out.size):
        if vec[i]:
            out[i] = sleef_pow(x[i], y[i], avx512)
        else:
            out[i] = c_pow2(x[i], y[i])


@jit
def _pow_ts(x, vec, y, e, avx512, out):
    for i in range(out.size):
        if vec[i]:
            out[i] = sleef_powf(x[i], y, avx512)
        else:
            out[i] = np.float32(c_pow2(np.float64(x[i]), e))


@jit
def _pow_ts_d(x, vec, y, e, avx512, out):
    for i in range(out.size):
        out[i] = sleef_pow(x[i], y, avx512) if vec[i] else c_pow2(x[i], e)


def pow_model(x, y):
    """``pow_tensor_tensor_kernel`` (``y`` an array) or the general case of
    ``pow_tensor_scalar_kernel`` (``y`` a Python number; the exponents the
    kernel special-cases are the caller's) on float32 / float64 arrays:
    SLEEF's pow in the vector body (:func:`sleef_powf` / :func:`sleef_pow`;
    a scalar exponent as the dtype), the C library's pow in the tail (for a
    scalar exponent ``std::pow(base, double exponent)``: a float32 base
    widened, the power rounded to float32)."""
    avx512 = get_profile().cpu_lanes(4) == 16
    dt = x.dtype
    if isinstance(y, np.ndarray):
        shape = np.broadcast_shapes(x.shape, y.shape)
        mask = elementwise_mask(shape, (x, y), dt.itemsize)
        flat = [np.ascontiguousarray(np.broadcast_to(a, shape), dt).reshape(-1) for a in (x, y)]
        out = np.empty(flat[0].size, dt)
        run_kernel(_pow_tt if dt == np.float32 else _pow_tt_d, *flat,
                   np.ascontiguousarray(mask).reshape(-1), avx512, out, inputs=3)
        return out.reshape(shape)
    e = float(y)
    return _unary_kernel(_pow_ts if dt == np.float32 else _pow_ts_d, x, dt.type(e), e, avx512)
