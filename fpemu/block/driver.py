"""The driver of the block quantizers, written once for every array library.

:func:`fpemu.block.quantize_blocks` (NumPy arrays, on the host) and
:func:`fpemu.torch.quantize_blocks` (torch tensors, on their device) run the
steps below with the array namespace of :mod:`fpemu.block._xp` (``xp``: how
the library spells an operation) and a rounding backend (``ops``, an
:class:`Ops`: fpemu's Numba quantizers on the host, :mod:`fpemu.torch`'s on a
device):

1. **layout** (:func:`to_blocks`): the float32 input as
   ``(..., nblocks, block_len)``, zero padded at the end of the blocked axis
   (1-D blocks) or of the last two axes (2-D tiles); or, asked for where the
   rule needs neither the block order nor each block along the last axis
   (``in_place``), a view of the input in its own layout with the blocked
   axis split in two (tiles: ``(..., tile rows, rows, tile columns,
   columns)``), so that a transposed operand's blocks are read where they lie;
2. **amaxes**: each block's ``max |x|`` (NaN propagates), and the tensor
   amax of the two-level rules, the largest of them (zero padding changes no
   maximum), a NaN as the canonical ``0x7fc00000``;
3. **draws** of ``"srN"`` rounding, by element index of the block layout,
   made by the backend where the data lies (:meth:`Ops.srn_draws`);
4. **the scale rule** of :mod:`fpemu.block.rules` (a ``chunked`` rule a
   chunk of blocks at a time where the namespace asks for it:
   ``xp.chunk_elements``): per block, its scale code, the factor of its
   elements, whether it clipped and whether it is NaN;
5. **the element step** (:meth:`Ops.scale_round`): each element times its
   block's factor (:func:`fpemu.block.rules.scale_elements`), rounded to
   codes (:func:`round_elements`: the backend's encode with overflow
   saturating, or ``"srN"``, :func:`round_srn`); a **NaN block** decodes
   to NaN whatever its codes, which keep only the inputs' signs (a zero of
   each sign), so that ``-x`` mirrors ``x``. A backend may run this step,
   and the amaxes of step 2, as fused kernels (one read of the elements
   each: :mod:`fpemu.block.fused` on the CPU, Triton's on CUDA) where it
   gives the same bits;
6. the codes, scales and clip flags back in the input's layout.

``"srN"`` with ``N`` random bits (``cvt.rs``'s rounding) rounds ``|v|`` at
its quantum ``u = 2**(max(floor(log2 |v|), emin) - M)``: with ``t = |v| /
u`` (exact, a power-of-two scaling), ``k = floor(t)`` and ``r`` the ``N``
bits of ``t - k`` below the point, the magnitude is ``(k + [r + R >=
2**N]) * u`` for the element's draw ``R``, at most the format's largest. Each
operation is exact in float64 (the input holds float32 values), and in
float32 where every value is finite and at most the format's largest, the
format's smallest step ``2**(emin - M)`` is a normal float32 and ``N <= 23``
(then ``t`` is a power-of-two scaling of a float32 and ``k``, ``r`` and
``r + R`` are integers below ``2**24``): the driver takes float32 there
(faster, the same bits).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from . import checks
from .rules import SCALE_RULES, TENSOR_SCALE_RULES, Job, Scaled, scale_elements

__all__ = ["Ops", "Config", "configure", "run", "to_blocks", "amax_dims", "scale_round",
           "block_values", "round_elements", "round_srn"]


class Ops:
    """A driver's rounding backend, as the driver and the rules
    (``job.ops``) call it. A backend gives ``cast(v, fmt, rounding)``
    (float32 values of ``fmt``), ``encode(v, fmt, **kw)`` (codes; ``kw``:
    ``rounding``, ``overflow``, ``seed``, ``rng`` of :func:`fpemu.encode`),
    ``decode(codes, fmt)``, ``srn_draws(n, seed, like, rng)`` (the ``"srN"``
    bits in ``like``'s shape, where ``like`` lies) and ``within(v, fmt)``
    (whether every value is finite and at most ``fmt``'s largest in
    magnitude); :meth:`round_elements`, :meth:`block_amax` and
    :meth:`scale_round` are the driver's, which a backend with fused
    kernels overrides where they give the same bits."""

    @staticmethod
    def round_elements(V, job, has_nan=True):
        return round_elements(V, job, has_nan)

    @staticmethod
    def block_amax(Bk, dims, xp):
        """Each block's ``max |x|`` over ``dims`` of the block layout
        (float32; NaN propagates)."""
        return xp.block_amax(Bk, dims)

    @staticmethod
    def scale_round(job, factor, divide, block_nan, has_nan, dq=None):
        """The element step (module text, step 5): the codes (block layout)
        of ``job.Bk`` times (or over) each block's ``factor``, the blocks
        marked in ``block_nan`` (``has_nan``: some are) given signed zeros;
        with ``dq`` (each block's scale value, float32) ``(codes, values)``,
        the values each code's times its block's, in float32
        (:func:`block_values`)."""
        codes = scale_round(job, factor, divide, block_nan, has_nan)
        return codes if dq is None else (codes, block_values(job, codes, dq))


class Config(NamedTuple):
    """The checked arguments of a ``quantize_blocks`` call."""

    elem: Any
    scale_fmt: Any
    block: Any
    rule: str
    rounding: str
    seed: Optional[int]
    n_sr: Optional[int]
    rng: Optional[str]
    tensor_amax: Optional[np.float32]
    inf_block: str


def configure(elem, scale_fmt, block, scale_rule, rounding, seed, rng, tensor_amax, inf_block):
    """The arguments of ``quantize_blocks`` resolved (a preset's settings
    under those given) and checked: a :class:`Config`."""
    elem, scale_fmt, block, rule = checks.resolve_args(elem, scale_fmt, block, scale_rule)
    block = checks.check_block(block, "quantize_blocks")
    checks.check_inf_block(inf_block)
    n_sr = checks.srn_bits(rounding, seed)
    rng = checks.block_rng(rounding, rng)
    amax = checks.check_tensor_amax(tensor_amax, rule)
    return Config(elem, scale_fmt, block, rule, rounding, seed, n_sr, rng, amax, inf_block)


class Result(NamedTuple):
    """What :func:`run` gives its caller, in the input's layout: element
    codes (integers, any width), scale codes, clip flags per block, the fp32
    decode tensor scale (two-level rules), the tensor amax they used and,
    when asked for, each element's value times its block scale (float32,
    without the tensor scale)."""

    codes: Any
    scodes: Any
    clipped: Any
    tensor_scale: Optional[np.float32]
    tensor_amax: Optional[np.float32]
    values: Any = None


# ------------------------------------------------------------------ layout
def to_blocks(X, block, axis, xp, in_place=False):
    """X in blocks (module text, step 1): the blocks, the function taking an
    array of their layout back to X's, the shape of the scales and the
    function ordering them like X's axes, and ``ex`` (an array with one value
    per block -> one per element, broadcasting)."""
    shape = tuple(X.shape)
    if isinstance(block, int):
        n = shape[axis]
        nb = -(-n // block)
        if in_place:
            P = xp.pad_end(X, shape[:axis] + (nb * block,) + shape[axis + 1:])
            Bk = P.reshape(shape[:axis] + (nb, block) + shape[axis + 1:])

            def back_in_place(A):
                A = A.reshape(shape[:axis] + (nb * block,) + shape[axis + 1:])
                return A[(slice(None),) * axis + (slice(0, n),)]

            def ex_axis(t):
                return t[(slice(None),) * (axis + 1) + (None,)]

            return Bk, back_in_place, shape[:axis] + (nb,) + shape[axis + 1:], \
                (lambda S: S), ex_axis
        Xm = xp.moveaxis(X, axis, -1)
        lead = tuple(Xm.shape[:-1])
        Bk = xp.pad_end(Xm, lead + (nb * block,)).reshape(lead + (nb, block))

        def back(A):
            return xp.moveaxis(A.reshape(lead + (nb * block,))[..., :n], -1, axis)

        return Bk, back, lead + (nb,), (lambda S: xp.moveaxis(S, -1, axis)), _ex_last
    ty, tx = block
    lead = shape[:-2]
    R, C = shape[-2:]
    nr, nc = -(-R // ty), -(-C // tx)
    P = xp.pad_end(X, lead + (nr * ty, nc * tx))
    k = len(lead)

    def back_tiles(A):
        return A.reshape(lead + (nr * ty, nc * tx))[..., :R, :C]

    if in_place:
        # the tiles as a view (lead, nr, ty, nc, tx): no copy into the block layout
        return P.reshape(lead + (nr, ty, nc, tx)), back_tiles, lead + (nr, nc), \
            (lambda S: S), _ex_tiles
    Bk = xp.moveaxis(P.reshape(lead + (nr, ty, nc, tx)), k + 1, k + 2)
    Bk = Bk.reshape(lead + (nr, nc, ty * tx))

    def back(A):
        return back_tiles(xp.moveaxis(A.reshape(lead + (nr, nc, ty, tx)), k + 2, k + 1))

    return Bk, back, lead + (nr, nc), (lambda S: S), _ex_last


def _ex_last(t):
    return t[..., None]


def _ex_tiles(t):
    return t[..., None, :, None]


def amax_dims(block, axis, in_place):
    """The axes of the layout of :func:`to_blocks` that a block spans."""
    if not in_place:
        return -1
    return (-3, -1) if isinstance(block, tuple) else axis + 1


# ------------------------------------------------------------ element rounding
def scale_round(job, factor, divide, block_nan, has_nan):
    """The element step written with ``job.xp`` (:meth:`Ops.scale_round`)."""
    codes = round_elements(scale_elements(job, factor, divide), job, has_nan)
    return nan_blocks(job, codes, block_nan) if has_nan else codes


def block_values(job, codes, dq):
    """Each code's float32 value times its block's scale value ``dq``
    (float32), one float32 product (block layout; one that overflows is
    inf)."""
    with job.xp.errstate():
        return job.ops.decode(codes, job.elem) * job.ex(dq)


def nan_blocks(job, codes, block_nan):
    """``codes`` with those of the blocks in ``block_nan`` replaced by a
    zero of each input's sign."""
    xp = job.xp
    signed0 = xp.to_int64(xp.signbit(job.Bk)) << (job.elem.bits - 1)
    return xp.where(job.ex(block_nan), signed0, codes)


def round_elements(V, job, has_nan=True):
    """V (float32, the block layout of ``job``) rounded to ``job.elem``: codes
    in V's layout. With ``has_nan`` (some block has a NaN scale; its codes
    are replaced) NaNs round as 0."""
    xp, ops, elem = job.xp, job.ops, job.elem
    safe = xp.where(xp.isnan(V), xp.f32(0), V) if has_nan else V
    n = checks.srn_bits(job.rounding, job.seed)
    if n is not None:
        draws = job.draws
        if draws is None:
            draws = ops.srn_draws(n, job.seed, V, checks.block_rng(job.rounding, job.rng))
        if not (n <= 23 and elem.emin - elem.mantissa_bits >= -126
                and ops.within(safe, elem)):
            safe = xp.to_f64(safe)
        return ops.encode(round_srn(safe, elem, n, draws, xp), elem)
    kw = {"seed": (job.seed, job.offset) if job.seed is not None else None,
          "rng": job.rng} if job.rounding == "sr" else {}
    return ops.encode(safe, elem, rounding=job.rounding, overflow="saturate", **kw)


def round_srn(v, elem, n, draws, xp):
    """``"srN"`` rounding of v (float32 or float64 holding float32 values;
    module text) with ``n`` random bits, ``draws`` one per element of v."""
    a = xp.abs(v)
    M = elem.mantissa_bits
    bits = xp.float_bits(a)
    # floor(log2 a) from the exponent field (0 and float32 subnormals: below emin)
    e = (bits >> 52) - 1023 if xp.is_f64(a) else (bits >> 23) - 127
    e = xp.maximum(e, elem.emin)
    field = e + (1023 - M) if xp.is_f64(a) else e + (127 - M)
    u = xp.from_float_bits(field << (52 if xp.is_f64(a) else 23), a)    # 2**(e - M)
    t = a / u
    k = xp.floor(t)
    r = xp.floor((t - k) * float(2**n))
    up = xp.astype_like(r + xp.astype_like(draws, a) >= float(2**n), a)
    mag = xp.minimum((k + up) * u, float(elem.max))
    return xp.copysign(mag, v)


# ------------------------------------------------------------------- driver
def _run_chunked(rule, job):
    """A ``chunked`` rule run on ``xp.chunk_elements`` elements at a time."""
    xp = job.xp
    blen = job.Bk.shape[-1]
    B, a = job.Bk.reshape(-1, blen), job.amax_b.reshape(-1)
    draws = None if job.draws is None else job.draws.reshape(B.shape)
    step = max(1, xp.chunk_elements // blen)
    parts = []
    for lo in range(0, xp.size(a), step):
        hi = min(xp.size(a), lo + step)
        sub = Job(B[lo:hi], a[lo:hi], job.elem, job.scale_fmt, job.rule, job.rounding,
                  job.seed, job.tensor_amax, job.inf_block, job.ex, xp, job.ops,
                  draws=None if draws is None else draws[lo:hi], offset=lo * blen, rng=job.rng)
        parts.append(rule(sub))
    if not parts:
        return rule(job)

    def cat(k, shape):
        return None if parts[0][k] is None else xp.concat([p[k] for p in parts]).reshape(shape)

    return Scaled(cat(0, job.amax_b.shape), cat(1, job.amax_b.shape), cat(2, job.Bk.shape),
                  cat(3, job.amax_b.shape), cat(4, job.amax_b.shape), parts[0].tensor_scale,
                  parts[0].divide)


def run(X, cfg, axis, xp, ops, allow_in_place=False, values=False):
    """Quantize the float32 array X (its blocked axis ``axis``, checked) as
    ``cfg`` says, with the namespace ``xp`` and the backend ``ops``: a
    :class:`Result` (module text). ``allow_in_place``: the blocks may be a
    view of X in its own layout where the rule and rounding allow it.
    ``values``: also each element's value times its block's scale value,
    in float32 (exact where every such product is a float32 number: every
    MX and NVFP4 pairing), written by the element step where the backend
    fuses it."""
    block, rule = cfg.block, cfg.rule
    stochastic = cfg.rounding == "sr" or cfg.n_sr is not None
    in_place = allow_in_place and rule != "4over6" and not stochastic and (
        isinstance(block, tuple) or axis != len(X.shape) - 1)
    Bk, back, sshape, sback, ex = to_blocks(X, block, axis, xp, in_place)
    dims = amax_dims(block, axis, in_place)
    amax_b = ops.block_amax(Bk, dims, xp)
    tensor_amax = cfg.tensor_amax
    if tensor_amax is None and rule in TENSOR_SCALE_RULES:
        tensor_amax = xp.max_f32(amax_b) if xp.size(X) else np.float32(0)
        if np.isnan(tensor_amax):
            tensor_amax = np.float32(np.nan)        # canonical, whatever the device's max wrote
    draws = None if cfg.n_sr is None else ops.srn_draws(cfg.n_sr, cfg.seed, Bk, cfg.rng)
    job = Job(Bk, amax_b, cfg.elem, cfg.scale_fmt, rule, cfg.rounding, cfg.seed, tensor_amax,
              cfg.inf_block, ex, xp, ops, draws=draws, rng=cfg.rng, dims=dims)
    r = SCALE_RULES[rule]
    res = _run_chunked(r, job) if r.chunked and xp.chunk_elements else r(job)
    has_nan = xp.any(res.block_nan)
    dq = ops.decode(res.scodes, cfg.scale_fmt) if values else None
    vals = None
    if res.codes is None:
        codes = ops.scale_round(job, res.factor, res.divide, res.block_nan, has_nan, dq)
        if values:
            codes, vals = codes
    else:
        codes = nan_blocks(job, res.codes, res.block_nan) if has_nan else res.codes
        if values:
            vals = block_values(job, codes, dq)
    return Result(back(codes), sback(xp.reshape(res.scodes, sshape)),
                  sback(xp.reshape(res.clipped, sshape)), res.tensor_scale,
                  tensor_amax if rule in TENSOR_SCALE_RULES else None,
                  None if vals is None else back(vals))
