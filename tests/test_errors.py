"""Bad input gets a clear error naming what was expected, what came, the fix."""

from __future__ import annotations

import numpy as np
import pytest

import fpemu


@pytest.mark.parametrize("fn", [fpemu.quantize, fpemu.encode])
@pytest.mark.parametrize("bad,kind", [
    (np.array([1 + 2j]), "complex"),
    (np.array(["1.0"]), "dtype <U3"),
    (np.array([1.0, None], dtype=object), "Python object"),
    ("1.0", "dtype <U3"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), "datetime64"),
])
def test_non_real_input_is_a_type_error(fn, bad, kind):
    with pytest.raises(TypeError, match=kind) as e:
        fn(bad, "bf16")
    assert "pass real numbers" in str(e.value) or "pass real values" in str(e.value)


def test_unknown_names():
    with pytest.raises(ValueError, match=r"unknown format 'bf17'.*bf16.*float8_e4m3fn"):
        fpemu.quantize(1.0, "bf17")
    with pytest.raises(ValueError,
                       match=r"unknown rounding mode 'nearest'; expected rne, rna, rtz"):
        fpemu.quantize(1.0, "bf16", rounding="nearest")
    with pytest.raises(ValueError,
                       match=r"unknown overflow policy 'clip'; expected inf, saturate, nan"):
        fpemu.quantize(1.0, "bf16", overflow="clip")
    with pytest.raises(TypeError, match="fmt must be a format name"):
        fpemu.quantize(1.0, 16)
    with pytest.raises(TypeError, match="subnormals must be True or False"):
        fpemu.quantize(1.0, "bf16", subnormals="no")


def test_policies_the_format_cannot_hold():
    with pytest.raises(ValueError, match="float8_e4m3fn has no infinity; pass overflow='saturate'"):
        fpemu.quantize(500.0, "e4m3fn", overflow="inf")
    with pytest.raises(ValueError, match="float4_e2m1fn has no NaN"):
        fpemu.quantize(7.0, "e2m1", overflow="nan")


def test_nan_into_a_format_without_nan():
    with pytest.raises(ValueError, match=r"float6_e2m3fn has no NaN.*1 NaN value.*index 2"):
        fpemu.quantize([1.0, 2.0, np.nan], "e2m3")
    assert float(fpemu.quantize(np.inf, "e2m1")) == 6.0  # inf saturates: not an error


def test_wide_inputs_are_rounded_once_not_refused():
    # float64 cannot hold these; they are rounded once from the exact value
    # (refusing them was a defect: they are exactly representable integers)
    up = float(np.nextafter(np.float32(2.0**53), np.float32(np.inf)))
    assert float(fpemu.quantize(np.array([2**53 + 1], dtype=np.int64), "fp32",
                                rounding="rup")[0]) == up
    if np.finfo(np.longdouble).nmant > 52:
        x = np.longdouble(1) + np.longdouble(2.0**-60)
        assert float(fpemu.quantize(x, "bf16", rounding="rup")) == 1.0078125


def test_bad_seed_and_out():
    with pytest.raises(ValueError, match="seed must be None, an int >= 0"):
        fpemu.quantize(1.0, "bf16", rounding="sr", seed=-1)
    with pytest.raises(ValueError, match="offset"):
        fpemu.quantize(1.0, "bf16", rounding="sr", seed=(1, -5))
    # a list is not a pair: NumPy would read [1, 2] as entropy, other bits than (1, 2)
    with pytest.raises(TypeError, match=r"got the list \[1, 2\]; .* seed=\(1, 2\)"):
        fpemu.quantize(1.0, "bf16", rounding="sr", seed=[1, 2])
    with pytest.raises(TypeError, match=r"got the list \[7\]; pass one int"):
        fpemu.encode([1.0], "bf16", rounding="sr", seed=[7])
    with pytest.raises(TypeError, match="out must have dtype float32, got float64"):
        fpemu.quantize([1.0, 2.0], "bf16", out=np.empty(2))
    with pytest.raises(ValueError, match=r"out has shape \(3,\), the input has \(2,\)"):
        fpemu.quantize([1.0, 2.0], "bf16", out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        fpemu.quantize(np.ones(3), "bf16", out=np.empty(6, np.float32)[::2])
    with pytest.raises(TypeError, match="out must have dtype uint8"):
        fpemu.encode([1.0], "e5m2", out=np.empty(1, np.uint16))


def test_decode_checks_codes():
    with pytest.raises(ValueError, match=r"e2m1 codes are 4-bit, in 0..15; got 16"):
        fpemu.decode([1, 16], "e2m1")
    with pytest.raises(ValueError, match="got -1"):
        fpemu.decode([-1], "e4m3fn")
    with pytest.raises(TypeError, match=r"integer codes.*codes.astype"):
        fpemu.decode(np.array([1.0, 2.0]), "e4m3fn")


def test_bad_custom_formats():
    with pytest.raises(ValueError, match="exponent_bits must be in 1..8"):
        fpemu.Format.custom(9, 2)
    with pytest.raises(ValueError, match="mantissa_bits must be in 0..23"):
        fpemu.Format.custom(5, 30)
    with pytest.raises(ValueError, match="nan_encoding must be one of ieee, fn, fnuz, none"):
        fpemu.Format.custom(4, 3, nan_encoding="weird")
    with pytest.raises(ValueError, match="do not all fit float32"):
        fpemu.Format.custom(8, 7, bias=100)
    with pytest.raises(ValueError, match="needs mantissa_bits >= 1"):
        fpemu.Format.custom(4, 0)
    with pytest.raises(TypeError, match="exponent_bits must be an int"):
        fpemu.Format("x", 4.0, 3)
    with pytest.raises(ValueError, match="has no infinity, so it cannot default"):
        fpemu.Format.custom(4, 3, nan_encoding="fn", default_overflow="inf")


# ------------------------------------- messages name what was expected, what came, the fix
def test_messages_of_the_reliability_issue():
    with pytest.raises(TypeError, match=r"canonical_nan must be an int code.*got float 1\.5"):
        fpemu.Format("x", 4, 3, nan_encoding="fn", canonical_nan=1.5)
    with pytest.raises(ValueError, match=r"log2_range must be \(lo, hi\), a pair.*got \(1,\)"):
        fpemu.stats([1.0], "fp16", log2_range=(1,))
    with pytest.raises(TypeError, match=r"axis must be an int or None, got float 1\.0; pass "
                                        r"e\.g\. axis=1"):
        fpemu.accumulate.sum(np.ones((2, 2), np.float32), "fp16", "fp32", axis=1.0)
    with pytest.raises(ValueError, match=r"axis 3 is out of range.*pass an axis in -2 \.\. 1"):
        fpemu.accumulate.sum(np.ones((2, 2), np.float32), "fp16", "fp32", axis=3)
    with pytest.raises(TypeError, match=r"explain\(\) takes one real number \(a float, int, "
                                        r"Fraction, Decimal or decimal text.*got NoneType"):
        fpemu.explain(None, "bf16")
    with pytest.raises(ValueError, match="ragged nested sequence.*pass a rectangular array"):
        fpemu.quantize([[1.0, 2.0], [3.0]], "bf16")


@pytest.mark.parametrize("z", [1 + 2j, np.complex64(1), np.array([1j])])
def test_complex_input_to_explain_is_a_type_error(z):
    with pytest.raises(TypeError, match="complex.*x.real and x.imag"):
        fpemu.explain(z, "bf16")


def test_own_checks_raise_fpemu_errors():
    from fpemu.errors import FpemuError
    for call in (lambda: fpemu.quantize(1.0, "bf17"), lambda: fpemu.quantize("1", "bf16"),
                 lambda: fpemu.stats([1.0], "fp16", scale=-1),
                 lambda: fpemu.explain.table("fp16")):
        with pytest.raises(FpemuError):
            call()
