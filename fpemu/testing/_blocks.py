"""Compare a block quantizer's codes and scales with :mod:`fpemu.block`
(:func:`assert_blocks_equal`), and say which rule it follows instead."""

from __future__ import annotations

import numpy as np

import fpemu
from .. import block
from ..errors import FpemuTypeError, FpemuValueError
from ._assert import _ROUNDINGS, _fmt_expr, _to_numpy

__all__ = ["assert_blocks_equal", "compare_blocks"]

#: What each scale rule of fpemu.block is, in words.
_RULE_WORDS = {
    "floor": "the scale rounded down (floor: OCP MX's rule)",
    "rceil": "the scale rounded up (rceil: TransformerEngine's and cuBLAS's)",
    "ceil": "the scale rounded up from the power of two (ceil)",
    "even": "the scale rounded to nearest (even)",
    "rceil-exact": "the scale rounded up from the exact ratio (rceil-exact)",
    "nvfp4": "TransformerEngine's NVFP4 scale (the per-tensor factor folded in)",
    "nvfp4-div6": "the NVFP4 scale by a division by 6 (TransformerEngine's older rule)",
    "nvfp4-torchao": "torchao's NVFP4 scale",
    "4over6": "Four Over Six block-scale selection",
    "cudnn": "the scale rounded up in e4m3 (cuDNN's one-level rule)",
    "current": "an fp32 scale amax / max (current scaling)",
    "pow2": "an fp32 scale rounded down to a power of two",
}


def _spec(preset, scale_rule):
    """The BlockSpec of ``preset`` (a name of fpemu.block.PRESETS, or a
    BlockSpec of one's own, custom formats included) and the scale rule."""
    if isinstance(preset, block.BlockSpec):
        return preset, scale_rule or preset.scale_rule
    if not isinstance(preset, str) or preset not in block.PRESETS:
        raise FpemuValueError(f"fpemu.testing: preset must be a name of "
                              f"fpemu.block.PRESETS ({', '.join(block.PRESETS)}) or an "
                              f"fpemu.block.BlockSpec, got {preset!r}")
    spec = block.PRESETS[preset]
    return spec, scale_rule or spec.scale_rule


def _quantize(X, preset, spec, **kw):
    """fpemu.block.quantize_blocks for a preset name or a BlockSpec."""
    if isinstance(preset, str):
        return block.quantize_blocks(X, preset, **kw)
    kw.setdefault("scale_rule", spec.scale_rule)
    return block.quantize_blocks(X, spec.elem, spec.scale_fmt, spec.block, **kw)


def _preset_text(preset, spec):
    """The preset's arguments of quantize_blocks, as Python text."""
    if isinstance(preset, str):
        return repr(preset)
    return (f"{_fmt_expr(fpemu.format(spec.elem))}, {_fmt_expr(fpemu.format(spec.scale_fmt))}, "
            f"{spec.block!r}")


def _codes(a, what, fmt_name):
    """Integer codes of ``a``: integers as they are, floats (a torch float8
    or float8_e8m0fnu tensor, an ml_dtypes array, float32 values) encoded
    exactly (a value that is not one of the format's is an error)."""
    arr = _to_numpy(a, what)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    with np.errstate(all="ignore"):
        back = fpemu.quantize(arr, fmt_name, rounding="rtz",
                              overflow="nan" if fpemu.format(fmt_name).has_nan else None)
    ok = (back == arr) | (np.isnan(back) & np.isnan(arr))
    if not ok.all():
        i = int(np.flatnonzero(~ok.reshape(-1))[0])
        raise FpemuValueError(f"fpemu.testing: {what} holds {arr.reshape(-1)[i]!r}, not a "
                              f"value of {fmt_name}; pass the codes, or the values the "
                              "quantizer wrote")
    return fpemu.encode(arr, fmt_name).astype(np.int64)


def _is_nan_code(c, fmt_name):
    """Element-wise: ``c`` is one of the format's NaN codes (codes outside
    the format's range are not)."""
    f = fpemu.format(fmt_name)
    ok = (c >= 0) & (c < (1 << f.bits))
    vals = fpemu.decode(np.where(ok, c, 0).astype(f.code_dtype), f)
    return ok & np.isnan(vals)


def _equal_codes(a, e, fmt_name):
    """Element-wise equality of codes, any NaN code equal to any other."""
    eq = a == e
    if eq.all():
        return eq
    return eq | (_is_nan_code(a, fmt_name) & _is_nan_code(e, fmt_name))


class BlocksReport:
    """The mismatches of a block quantizer against fpemu.block; ``message()``
    is what :func:`assert_blocks_equal` raises."""

    def __init__(self, x, preset, kw, expected, codes, scales, rht):
        self.x, self.preset, self.kw, self.rht = x, preset, kw, rht
        self.expected, self.codes, self.scales = expected, codes, scales
        spec, _ = _spec(preset, kw.get("scale_rule"))
        self.spec = spec
        self.bad_scales = ~_equal_codes(scales, expected.scales.astype(np.int64),
                                        spec.scale_fmt)
        self.bad_codes = ~_equal_codes(codes, np.asarray(expected.codes).astype(np.int64),
                                       spec.elem)

    @property
    def mismatches(self):
        return int(self.bad_scales.sum() + self.bad_codes.sum())

    def _call(self):
        kw = "".join(f", {k}={v!r}" for k, v in self.kw.items() if v is not None)
        x = "hadamard(x, 16, signs='te')" if self.rht else "x"
        return f"fpemu.block.quantize_blocks({x}, {_preset_text(self.preset, self.spec)}{kw})"

    def _alternatives(self):
        """[(label, that rule's (codes, scales))]: other scale rules, the RHT
        done otherwise, and the elements rounded toward zero."""
        spec = self.spec
        rule = self.kw.get("scale_rule") or spec.scale_rule
        kinds = block.MX_RULES if rule in block.MX_RULES else (
            block.FP4_RULES if rule in block.FP4_RULES else ("current", "pow2"))
        out = []
        base = {k: v for k, v in self.kw.items() if k != "scale_rule"}
        X = self._input()
        for other in kinds:
            if other == rule:
                continue
            try:
                q = _quantize(X, self.preset, spec, scale_rule=other, **base)
            except (FpemuValueError, FpemuTypeError):
                continue
            out.append((_RULE_WORDS.get(other, other), q))
        if self.rht:
            for signs, label in ((None, "the RHT without TransformerEngine's sign vector "
                                        "(a wrong sign vector)"),
                                 ("none", "no RHT applied")):
                Y = self.x if signs == "none" else block.hadamard(self.x, 16, self.kw.get(
                    "axis", -1), signs=None)
                out.append((label, _quantize(Y, self.preset, spec, **self.kw)))
        else:
            try:
                Y = block.hadamard(self.x, 16, self.kw.get("axis", -1), signs="te")
                out.append(("an RHT applied (TransformerEngine's)",
                            _quantize(Y, self.preset, spec, **self.kw)))
            except FpemuValueError:
                pass
        for mode, words in _ROUNDINGS:           # the elements rounded otherwise
            if mode == self.kw.get("rounding", "rne"):
                continue
            kw = dict(self.kw)
            kw["rounding"] = mode
            try:
                q = _quantize(X, self.preset, spec, **kw)
            except (FpemuValueError, FpemuTypeError):
                continue
            out.append((f"the elements: {words}", q))
        return out

    def _input(self):
        return block.hadamard(self.x, 16, self.kw.get("axis", -1), signs="te") if self.rht \
            else self.x

    def message(self, shown=5):
        spec = self.spec
        e_sc = self.expected.scales.astype(np.int64)
        lines = [f"fpemu.testing: the block quantization differs from {self._call()}"]
        ns, nc = int(self.bad_scales.sum()), int(self.bad_codes.sum())
        where = ""
        if nc:
            in_bad = self._elements_of(self.bad_scales) & self.bad_codes
            where = (f" ({int(in_bad.sum())} in blocks whose scale differs, "
                     f"{nc - int(in_bad.sum())} elsewhere)")
        lines.append(f"scales: {ns} of {self.bad_scales.size} blocks differ; elements: {nc} "
                     f"of {self.bad_codes.size} differ{where}")
        explained = []
        own = self.bad_codes & ~self._elements_of(self.bad_scales)   # under a scale that agrees
        n_own = int(own.sum())
        with np.errstate(all="ignore"):
            for label, q in self._alternatives():
                s_ok = _equal_codes(self.scales, q.scales.astype(np.int64), spec.scale_fmt)
                c_ok = _equal_codes(self.codes, np.asarray(q.codes).astype(np.int64), spec.elem)
                if ns and s_ok[self.bad_scales].all() and (not nc or c_ok[self.bad_codes].all()):
                    explained.append(f"{label} (every mismatch)")
                elif not ns and nc and c_ok[self.bad_codes].all():
                    explained.append(f"{label} (every mismatch)")
                elif ns and s_ok[self.bad_scales].mean() >= 0.5:
                    explained.append(f"{label} ({int(s_ok[self.bad_scales].sum())} of {ns} "
                                     "scales)")
                elif n_own and c_ok[own].mean() >= 0.5:
                    explained.append(f"{label} ({int(c_ok[own].sum())} of the {n_own} elements "
                                     "under a scale that agrees)")
        sf = fpemu.format(spec.scale_fmt)
        top = int(sf.max_code)
        unclamped = self.bad_scales & (e_sc == top)
        if unclamped.any():
            a = self.scales[unclamped]
            vals = fpemu.decode(a.astype(sf.code_dtype), sf)
            if np.all(~np.isfinite(vals) | (vals > sf.max)):
                explained.append(f"the {sf.name} scale not clamped to its largest "
                                 f"({sf.max:g}): NaN or inf instead "
                                 f"({int(unclamped.sum())} blocks)")
        none = ("none of the rules fpemu tried (the other scale rules, the RHT, elements "
                "rounded toward zero, an unclamped scale)")
        lines.append("the quantizer follows: " + ("; ".join(explained) if explained else none))
        for idx in np.argwhere(self.bad_scales)[:shown]:
            idx = tuple(int(i) for i in idx)
            es, as_ = int(e_sc[idx]), int(self.scales[idx])
            w = (sf.bits + 3) // 4
            ev = fpemu.decode(np.array(es).astype(sf.code_dtype), sf)
            av = fpemu.decode(np.array(as_).astype(sf.code_dtype), sf) \
                if 0 <= as_ < (1 << sf.bits) else float("nan")
            blk = self._block_values(idx)
            amax = float(np.nanmax(np.abs(blk))) if np.isfinite(blk).any() else float("nan")
            lines.append(f"  block {idx}: amax {amax!r} (float32 "
                         f"0x{int(np.float32(amax).view(np.uint32)):08X}), expected scale "
                         f"{float(ev)!r} (code 0x{es:0{w}X}), actual {float(av)!r} "
                         f"(code 0x{as_:0{w}X})")
            lines.append("      reproduce: " + self._reproducer(blk))
        if n_own:
            lines += self._element_lines(own, shown)
        return "\n".join(lines)

    def _element_lines(self, own, shown):
        """Element mismatches under a block scale that agrees: by the class
        of fpemu's element, then the first few with their input, both codes
        and values, and (a power-of-two scale) the scaled input and the
        element interval it lies in."""
        spec = self.spec
        ef, sf = fpemu.format(spec.elem), fpemu.format(spec.scale_fmt)
        e_codes = np.asarray(self.expected.codes).astype(np.int64)
        with np.errstate(all="ignore"):
            ev = fpemu.decode(e_codes[own].astype(ef.code_dtype), ef).astype(np.float64)
        ae = np.abs(ev)
        cls = np.full(ev.shape, "normal", dtype=object)
        cls[ae == ef.max] = "max"
        cls[(ae < ef.min_normal) & (ae > 0)] = "subnormal"
        cls[ae == 0] = "zero"
        cls[np.isnan(ev)] = "nan"
        names, counts = np.unique(cls, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        lines = ["elements under a scale that agrees, by fpemu's element: " + ", ".join(
            f"{names[i]} {int(counts[i])}" for i in order)]
        X = self._input()
        w = (ef.bits + 3) // 4
        pow2 = sf.mantissa_bits == 0 and self.expected.tensor_scale is None
        for idx in np.argwhere(own)[:shown]:
            idx = tuple(int(i) for i in idx)
            xv = np.float32(X[idx])
            ec, ac = int(e_codes[idx]), int(self.codes[idx])
            with np.errstate(all="ignore"):
                e_val = float(fpemu.decode(np.array(ec).astype(ef.code_dtype), ef))
                a_val = (float(fpemu.decode(np.array(ac).astype(ef.code_dtype), ef))
                         if 0 <= ac < (1 << ef.bits) else float("nan"))
            bidx = self._block_of(idx)
            scale = float(fpemu.decode(np.array(self.expected.scales[bidx]).astype(
                sf.code_dtype), sf))
            lines.append(f"  element {idx}: x = {float(xv)!r} (float32 "
                         f"0x{int(xv.view(np.uint32)):08X}), block {bidx} scale {scale!r}")
            lines.append(f"      expected {e_val!r} (code 0x{ec:0{w}X}), actual {a_val!r} "
                         f"(code 0x{ac:0{w}X})")
            if pow2 and np.isfinite(xv) and np.isfinite(scale) and scale > 0:
                v = float(xv) / scale                 # exact: a power of two in float64
                with np.errstate(all="ignore"):
                    lo = float(fpemu.quantize(np.float64(v), ef, rounding="rdn",
                                              overflow="saturate"))
                    hi = float(fpemu.quantize(np.float64(v), ef, rounding="rup",
                                              overflow="saturate"))
                mid = ", midpoint " + repr((lo + hi) / 2) if lo != hi else " (exact)"
                lines.append(f"      x / scale = {v!r}, in [{lo!r}, {hi!r}]{mid}")
            rep = self._reproducer(self._block_values(bidx), self._in_block(idx))
            lines.append("      reproduce: " + rep)
        return lines

    def _in_block(self, idx):
        """The flat position of the element at ``idx`` within its block (as
        :meth:`_block_values` lays the block out)."""
        spec = self.spec
        if isinstance(spec.block, tuple):
            ty, tx = spec.block
            return (idx[-2] % ty) * tx + idx[-1] % tx
        return idx[self.kw.get("axis", -1) % len(idx)] % spec.block

    def _block_of(self, idx):
        """The scale index of the element at ``idx``."""
        spec = self.spec
        if isinstance(spec.block, tuple):
            ty, tx = spec.block
            return idx[:-2] + (idx[-2] // ty, idx[-1] // tx)
        ax = self.kw.get("axis", -1) % len(idx)
        return idx[:ax] + (idx[ax] // spec.block,) + idx[ax + 1:]

    def _elements_of(self, per_block):
        """A per-block mask spread over the elements (x's shape)."""
        spec, shape = self.spec, self.codes.shape
        if isinstance(spec.block, tuple):
            ty, tx = spec.block
            m = np.repeat(np.repeat(per_block, ty, axis=-2), tx, axis=-1)
            return m[..., :shape[-2], :shape[-1]]
        ax = self.kw.get("axis", -1) % len(shape)
        return np.take(np.repeat(per_block, spec.block, axis=ax), np.arange(shape[ax]), axis=ax)

    def _block_values(self, idx):
        """The input values of the block at scale index ``idx`` (1-D blocks
        along the axis, or 2-D tiles), as a flat float32 array."""
        x, spec = self._input(), self.spec
        axis = self.kw.get("axis", -1)
        if isinstance(spec.block, tuple):
            ty, tx = spec.block
            lead = idx[:-2]
            r, c = idx[-2], idx[-1]
            return np.asarray(x[lead + (slice(r * ty, (r + 1) * ty), slice(c * tx, (c + 1) * tx))],
                              np.float32).reshape(-1)
        ax = axis % x.ndim
        sl = list(idx)
        b = spec.block
        sl[ax] = slice(idx[ax] * b, (idx[ax] + 1) * b)
        return np.asarray(x[tuple(sl)], np.float32).reshape(-1)

    def _reproducer(self, blk, element=None):
        """A command printing fpemu's scale of the block ``blk`` (or, given
        ``element``, the code of that element of it)."""
        u = blk.view(np.uint32)
        nz = np.flatnonzero(u)
        bits = ", ".join(f"0x{int(v):08X}" for v in u[nz])
        ta = ""
        if (self.kw.get("scale_rule") or self.spec.scale_rule) in block.TENSOR_SCALE_RULES:
            with np.errstate(invalid="ignore"):
                t = self.kw.get("tensor_amax")
                t = float(np.nanmax(np.abs(self._input()))) if t is None else float(t)
            ta = f", tensor_amax={t!r}"
        shape = (1, blk.size) if isinstance(self.spec.block, int) else self.spec.block
        if nz.size * 2 > blk.size:                         # mostly nonzero: every value
            bits = ", ".join(f"0x{int(v):08X}" for v in u)
            make = f"x = np.array([{bits}], np.uint32).view(np.float32).reshape{shape}"
        else:                                               # mostly zero: the others
            at = ", ".join(map(str, nz.tolist()))
            make = (f"x = np.zeros({shape}, np.float32); x.flat[[{at}]] = np.array([{bits}], "
                    "np.uint32).view(np.float32)")
        ta += "".join(f", {k}={self.kw[k]!r}"
                      for k in ("scale_rule", "rounding", "seed", "inf_block") if k in self.kw)
        what = ".scales" if element is None else f".codes.reshape(-1)[{element}]"
        imp = "import numpy as np; " if isinstance(self.preset, str) else \
            "import numpy as np, fpemu; "
        return (f"python -c \"{imp}from fpemu import block; {make}; "
                f"print(block.quantize_blocks(x, {_preset_text(self.preset, self.spec)}{ta})"
                f"{what})\"")


def compare_blocks(codes, scales, x, preset, *, axis=-1, scale_rule=None, rounding="rne",
                   seed=None, tensor_amax=None, inf_block="saturate", rht=False):
    """The :class:`BlocksReport` of a block quantizer's ``codes`` and
    ``scales`` against :func:`fpemu.block.quantize_blocks` (the arguments of
    :func:`assert_blocks_equal`); never raises for a mismatch."""
    spec, _ = _spec(preset, scale_rule)
    x = _to_numpy(x, "x")
    if x.dtype.kind != "f":
        raise FpemuTypeError(f"fpemu.testing: x must hold float32 inputs, got dtype {x.dtype}")
    x = x.astype(np.float32) if x.dtype != np.float64 else x
    kw = dict(axis=axis, scale_rule=scale_rule, rounding=rounding, seed=seed,
              tensor_amax=tensor_amax, inf_block=inf_block)
    defaults = {"axis": -1, "rounding": "rne", "inf_block": "saturate"}
    kw = {k: v for k, v in kw.items() if v is not None and defaults.get(k) != v}
    if not isinstance(preset, str):
        kw["scale_rule"] = scale_rule or spec.scale_rule
    X = block.hadamard(x, 16, axis, signs="te") if rht else x
    expected = _quantize(X, preset, spec, **kw)
    c = _codes(codes, "codes", spec.elem)
    s = _codes(scales, "scales", spec.scale_fmt)
    for name, got, want in (("codes", c, expected.codes.shape),
                            ("scales", s, expected.scales.shape)):
        if got.shape != tuple(want):
            raise FpemuValueError(f"fpemu.testing: {name} have shape {got.shape}; "
                                  f"fpemu.block.quantize_blocks gives {tuple(want)} for x of "
                                  f"shape {x.shape} in {spec.name!r}: pass the quantizer's "
                                  f"{name} in that layout (codes in x's shape, one scale per "
                                  "block, tails padded)")
    return BlocksReport(x, preset, kw, expected, c, s, rht)


def assert_blocks_equal(codes, scales, x, preset, *, axis=-1, scale_rule=None, rounding="rne",
                        seed=None, tensor_amax=None, inf_block="saturate", rht=False, shown=5):
    """Assert that a block quantizer's ``codes`` and ``scales`` are
    :func:`fpemu.block.quantize_blocks`'s for ``x`` and ``preset``, bit for
    bit.

    Parameters
    ----------
    codes, scales : arrays or tensors
        The quantizer's element codes (x's shape) and block scales (one per
        block, in fpemu.block's layout): integers, or values of the element
        and scale formats (a torch float8 or float8_e8m0fnu tensor, an
        ml_dtypes array, float32 values). NaN codes compare as NaN.
    x : array or tensor
        The float32 inputs.
    preset : str or fpemu.block.BlockSpec
        A name of :data:`fpemu.block.PRESETS`, or a BlockSpec of one's own
        (custom element formats too); the other arguments as in
        :func:`fpemu.block.quantize_blocks`.
    rht : bool
        The quantizer applies TransformerEngine's random Hadamard transform
        (16-runs along ``axis``, its sign vector) before quantizing.

    Raises
    ------
    AssertionError
        With how many scales and elements differ, the rules the quantizer
        follows instead (another scale rule, a wrong or missing RHT, an
        unclamped e4m3 scale, elements rounded otherwise, ...), and the
        first blocks with their amax, both scales and a reproducer; element
        mismatches under a scale that agrees by the class of fpemu's element,
        the first with their input, both codes and values, the scaled input
        and its element interval (power-of-two scales) and a reproducer.
    """
    report = compare_blocks(codes, scales, x, preset, axis=axis, scale_rule=scale_rule,
                            rounding=rounding, seed=seed, tensor_amax=tensor_amax,
                            inf_block=inf_block, rht=rht)
    if report.mismatches:
        raise AssertionError(report.message(shown))
