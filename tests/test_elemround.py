"""fpemu._elemround: the element rounding written once, and its bindings.

The Numba kernels, the torch code and the Triton kernels run one source,
each over primitives of its own; tests/test_fast_paths.py,
tests/test_torch_quantize.py and tests/test_triton_kernels.py check each
backend's bits (against independent oracles, and against the Numba
kernels). Here, what the single source adds:

* the module run as it reads, on Python ints (its own primitives, one
  element per call), gives the Numba kernels' codes and values for every
  format and mode on every class of float32 input: the bindings' primitives
  mean the same thing (this checks the bindings, not the algorithm: both
  sides run the same source);
* the mode and flag numbers are fpemu's;
* :func:`fpemu._elemround.bind` gives a module whose functions read as this
  file (Triton reads their source) and refuses a missing primitive;
* the Triton kernels compile for a GPU (Triton ships ``ptxas``: no GPU
  needed), as the interpreter of tests/test_triton_kernels.py does not;
* an edit of fpemu/_elemround.py recompiles the Numba kernels that run it
  (its functions are compiled into every kernel, whose own file does not
  change): :func:`fpemu._jit.cache_unit`.
"""

import inspect
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fpemu
from fpemu import _elemround
from fpemu.formats import FORMATS, Format
from fpemu.quantize import Cast, stochastic_bits
from fpemu.rounding import Overflow, Rounding
from fpemu.testing.strategies import edge_inputs

MODES = ("rne", "rna", "rtz", "rup", "rdn", "rto", "sr")
#: custom formats with the flags and ranges no named format has
CUSTOM = tuple(Format.custom(*eb_mb, **kw) for eb_mb, kw in (
    ((8, 3), dict(bias=136, has_subnormals=False, name="e8m3low")),   # normals to 2**-136
    ((4, 2), dict(bias=140, nan_encoding="fn")),                      # binades below float32's
    ((5, 1), dict(signed=False, has_subnormals=False, name="ue5m1")),
    ((3, 0), dict(nan_encoding="none", name="e3m0")),
    ((4, 3), dict(bias=11, nan_encoding="fnuz"))))
SEED = (5, 40)


def _inputs(fmt):
    """Every kind of value of the format (both signs, the midpoints and the
    neighbours of its edges), float32's specials and 64 random bit patterns;
    no NaN into a format without one."""
    bits = np.random.default_rng(sum(fmt.name.encode())).integers(0, 1 << 32, 64,
                                                                  dtype=np.uint64)
    x = np.concatenate([edge_inputs(fmt, per_kind=6), bits.astype(np.uint32).view(np.float32),
                        np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45])])
    return x if fmt.has_nan else x[~np.isnan(x)]


@pytest.mark.parametrize("fmt", tuple(FORMATS) + CUSTOM, ids=lambda f: f.name)
def test_the_module_on_python_ints_gives_the_numba_kernels_bits(fmt):
    x = _inputs(fmt)
    u = x.view(np.int32)
    configs = [(m, True, None) for m in MODES] + [("rne", False, None), ("sr", True, "philox")]
    for mode, subnormals, rng in configs:
        if not subnormals and not fmt.has_subnormals:
            continue
        cast = Cast.of(fmt, mode, subnormals, None, rng)
        L = cast.layout
        key, offset = cast.seed_key(SEED)
        draws = stochastic_bits(SEED, x.size, rng=rng)
        python = _elemround.bind("tests.python_ints", dict(
            {k: getattr(_elemround, k) for k in _elemround.PRIMITIVES},
            draw63=lambda key_, index, mode_: int(draws[index - offset])))
        codes, values = [], []
        for i, ui in enumerate(u.tolist()):
            mag, negative, nan = python.rounded(ui, L.mantissa_bits, L.emin, L.emax, L.bias,
                                                L.max_code, L.inf_code, cast.flags,
                                                cast.kernel_mode, key, offset + i)
            codes.append(python.code(mag, negative, nan, L.sign_shift,
                                     _elemround.i32(L.nan_code)) & 0xFFFFFFFF)
            values.append(python.value_bits(mag, negative, nan, L.mantissa_bits, L.emin,
                                            L.bias, L.inf_code, cast.flags))
        want_codes = fpemu.encode(x, fmt, rounding=mode, subnormals=subnormals, seed=SEED,
                                  rng=rng)
        want_values = fpemu.quantize(x, fmt, rounding=mode, subnormals=subnormals, seed=SEED,
                                     rng=rng)
        np.testing.assert_array_equal(np.array(codes, np.uint64), want_codes.astype(np.uint64),
                                      err_msg=f"{fmt.name} {mode} {subnormals} {rng} codes")
        np.testing.assert_array_equal(np.array(values, np.int64).astype(np.int32),
                                      want_values.view(np.int32),
                                      err_msg=f"{fmt.name} {mode} {subnormals} {rng} values")


@pytest.mark.parametrize("fmt", tuple(FORMATS) + CUSTOM, ids=lambda f: f.name)
def test_decoding_on_python_ints_gives_fpemu_decode(fmt):
    cast = Cast.of(fmt)
    L = cast.layout
    codes = fpemu.encode(_inputs(fmt), fmt)
    got = []
    for c in codes.tolist():
        mag, negative, nan = _elemround.decoded(_elemround.i32(c), L.mantissa_bits, L.emin,
                                                L.bias, L.max_code, L.inf_code, L.sign_shift,
                                                cast.flags)
        got.append(_elemround.value_bits(mag, negative, nan, L.mantissa_bits, L.emin, L.bias,
                                         L.inf_code, cast.flags))
    np.testing.assert_array_equal(np.array(got, np.int64).astype(np.int32),
                                  fpemu.decode(codes, fmt).view(np.int32), err_msg=fmt.name)


def test_the_numbers_of_modes_and_flags_are_fpemus():
    E = _elemround
    assert [int(m) for m in Rounding] == [E.RNE, E.RNA, E.RTZ, E.RUP, E.RDN, E.RTO, E.SR]
    assert Cast.of("bf16", "sr", rng="philox").kernel_mode == E.SR_PHILOX
    assert [int(p) for p in (Overflow.INF, Overflow.SATURATE, Overflow.NAN)] == \
        [E.OVF_INF, E.OVF_SATURATE, E.OVF_NAN]
    assert (Cast.FLUSH, Cast.FNUZ, Cast.UNSIGNED, Cast.NO_ZERO, Cast.NORMALIZE) == \
        (E.FLUSH, E.FNUZ, E.UNSIGNED, E.NO_ZERO, E.NORMALIZE)
    assert max(int(p) for p in Overflow) <= E.POLICY_MASK < E.FLUSH


def test_bind_gives_a_module_of_this_files_functions():
    prims = {k: getattr(_elemround, k) for k in _elemround.PRIMITIVES}
    mod = _elemround.bind("tests.bound", dict(prims, shl=lambda a, s: 0))
    assert sys.modules["tests.bound"] is mod
    for name in _elemround.ALGORITHM:
        f = getattr(mod, name)
        assert f.__globals__ is vars(mod)
        assert inspect.getsource(f) == inspect.getsource(getattr(_elemround, name))
    assert mod.shl(1, 3) == 0 and _elemround.shl(1, 3) == 8
    assert mod.RNE == _elemround.RNE
    with pytest.raises(ValueError, match=r"no primitive \['draw63'\]"):
        _elemround.bind("tests.partial", {k: v for k, v in prims.items() if k != "draw63"})


COMPILE = textwrap.dedent("""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fpemu.quantize import Cast
    from fpemu.torch import _triton

    target = GPUTarget("cuda", 90, 32)
    dtypes = {1: "*u8", 2: "*u16", 4: "*u32"}
    for fmt, mode, rng, sub, encode in (("e4m3fn", "rne", None, True, False),
                                        ("e8m0", "sr", None, True, True),
                                        ("fp32", "rup", None, True, True),
                                        ("e2m1", "sr", "philox", True, False),
                                        ("fp16", "rtz", None, False, False)):
        cast = Cast.of(fmt, mode, sub, None, rng)
        L = cast.layout
        const = dict(M=L.mantissa_bits, EMIN=L.emin, EMAX=L.emax, BIAS=L.bias,
                     MAXMAG=L.max_code, INFMAG=L.inf_code, NANCODE=_triton._int32(L.nan_code),
                     SIGN_SHIFT=L.sign_shift, FLAGS=cast.flags, MODE=cast.kernel_mode,
                     ENCODE=encode, WIDE=cast.fmt.code_dtype.itemsize == 4, BLOCK=1024)
        sig = dict(x_ptr="*i32", out_ptr=dtypes[cast.fmt.code_dtype.itemsize] if encode
                   else "*i32", n="i64", key="i64", offset="i64")
        sig.update(dict.fromkeys(const, "constexpr"))
        assert "cubin" in triton.compile(ASTSource(_triton._round_kernel, sig, const),
                                         target=target).asm
    L = Cast.of("e8m0").layout
    const = dict(M=L.mantissa_bits, EMIN=L.emin, BIAS=L.bias, MAXMAG=L.max_code,
                 INFMAG=L.inf_code, SIGN_SHIFT=L.sign_shift, FLAGS=Cast.of("e8m0").flags,
                 BLOCK=1024)
    sig = dict(c_ptr="*u8", out_ptr="*i32", n="i64", **dict.fromkeys(const, "constexpr"))
    assert "cubin" in triton.compile(ASTSource(_triton._decode_kernel, sig, const),
                                     target=target).asm
    print("compiled")
""")


def test_the_triton_kernels_compile_for_a_gpu(tmp_path):
    """Compiled (not interpreted), the kernels read fpemu._elemround's
    constants as tl.constexpr and its functions through a module: quantize
    and encode in several modes and families, and decode, to a cubin for
    sm_90, in a process without TRITON_INTERPRET."""
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    res = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                         text=True, timeout=600)
    if res.returncode and "ptxas" in res.stderr and "not found" in res.stderr:
        pytest.skip("this Triton build ships no ptxas")
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.strip() == "compiled"


RUN = textwrap.dedent("""
    import json
    import numba.core.event as ev
    with ev.install_recorder("numba:compile") as rec:
        import numpy as np
        import fpemu
        fpemu.decode(np.arange(16, dtype=np.uint8), "e2m1")
    print(json.dumps(sorted({e.data["dispatcher"].py_func.__qualname__
                             for _, e in rec.buffer if e.is_start})))
""")


def test_an_edit_of_the_element_rounding_recompiles_the_kernels_that_run_it(tmp_path):
    """In a copy of the package: a second process loads the decode kernel
    from the cache; after fpemu/_elemround.py changes (its modification
    time, as Numba's own check of a kernel's file), the next one compiles
    it again."""
    import json
    src = os.path.dirname(fpemu.__file__)
    shutil.copytree(src, tmp_path / "fpemu", ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def compiled():
        res = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True,
                             text=True, timeout=600, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-4000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    assert "decode_kernel.<locals>.decode_serial" in compiled()
    assert compiled() == []
    path = tmp_path / "fpemu" / "_elemround.py"
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert "decode_kernel.<locals>.decode_serial" in compiled()
