"""fpemu.autograd against PyTorch's own op tests: every sample of every OpInfo
in ``torch.testing._internal.common_methods_invocations.op_db`` whose op
fpemu has, float32 and float64, forward and backward, under the CPU profile
against torch CPU; and every ``error_input`` raising torch's exception class.

The rules (those of tests/op_registry.py):

* values: bit for bit for the ops both libraries round once from the exact
  result or only move, select or draw (the registry's ``EXACT``); others to a
  few ulps of the result's scale (torch's SIMD exp / log and blocked sums
  against fpemu's correctly rounded or index-order ones); shapes, dtypes and
  ``requires_grad`` always exactly;
* random ops draw after the same seed on both sides: exact where fpemu
  reproduces torch's stream (the registry's draws), else shape and dtype;
* gradients: of the outputs against one fixed random cotangent, to ten times
  the values' tolerance (they chain several roundings);
* a warning fpemu gives where torch gives none is a failure (fpemu's
  warnings of torch's deprecations come with torch's own);
* a sample torch refuses is not run; one fpemu refuses with its own error
  (an op or argument it does not emulate) is counted as not emulated, and the
  coverage page docs/opinfo-coverage.md (``python tests/test_opinfo.py
  --table > docs/opinfo-coverage.md``) lists those and the ops fpemu lacks,
  with their sample counts.

Every sample and error input of every op fpemu has passes; the ops it lacks
are listed in the coverage table.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import os
import re
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")          # torch.testing._internal imports it

import fpemu.autograd as ft                                      # noqa: E402
from fpemu.errors import FpemuError                              # noqa: E402
from op_registry import EXACT                                    # noqa: E402

from torch.testing._internal.common_methods_invocations import op_db   # noqa: E402

CPU = ft.Profile("cpu", "2.13.0", cpu_threads=torch.get_num_threads(),
                 cpu_capability=torch.backends.cpu.get_cpu_capability())
DTYPES = ("float32", "float64")
#: relative tolerance of inexact values, per dtype (gradients: ten times)
RTOL = {"float32": 3e-6, "float64": 1e-13}
#: float64's absolute floor (float32 takes torch's own float32 noise instead:
#: ``_gradient_noise``): a gradient that is the rounding noise of a cancellation
ATOL64 = 1e-13

#: draws fpemu reproduces bit for bit from torch's seeded stream
DRAWS = {"rand", "randint", "randperm", "randint_like"}
#: normals: torch's stream, but torch's vectorised log / sin / cos for blocks
#: of 16 (the module doc of fpemu/autograd/_rng.py): to the values' tolerance
NEAR_DRAWS = {"randn", "randn_like", "normal"}
#: dropout masks follow torch's law, not its numbers (torch CPU draws them
#: through MKL on Intel processors): values only where no element is dropped
DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "nn.functional.dropout",
            "nn.functional.dropout2d", "nn.functional.dropout3d"}
RANDOM = DRAWS | NEAR_DRAWS | DROPOUTS | {
                  "rand_like", "bernoulli", "multinomial",
                  "empty", "empty_like", "new_empty", "empty_strided",
                  "nn.functional.feature_alpha_dropout", "nn.functional.alpha_dropout",
                  "uniform", "exponential", "geometric", "log_normal", "cauchy"}


#: ops with a dropout inside: random where the sample drops (else as EXACT says)
DROPS = {"nn.functional.scaled_dot_product_attention":
         lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
         "nn.functional.multi_head_attention_forward":
         lambda s: s.args[9] > 0 and s.kwargs.get("training", True)}


def _exactness(op, sample):
    """True: bit for bit; False: to the tolerance; None: shape and dtype
    (and no gradient check: a random result)."""
    name, short = op.name, op.name.rsplit(".", 1)[-1]
    if name in DROPS and DROPS[name](sample):
        return None
    if name in DROPOUTS:
        p = sample.kwargs.get("p", sample.args[0] if sample.args else 0.5)
        return True if not sample.kwargs.get("training", True) or p == 0 else None
    if name in DRAWS:
        return True
    if name in NEAR_DRAWS:
        return False
    if name in RANDOM:
        return None
    return short in EXACT or _key(op) in HELD


def _seeded(fn):
    """fpemu's side of torch's ``wrapper_set_seed``: the draw after seed 42."""
    def call(*args, **kwargs):
        ft.manual_seed(42)
        return fn(*args, **kwargs)
    return call


_F = ft.nn.functional


def _max_pool2d_backward(x, kernel_size=(), stride=(), padding=(0,), dilation=(1,),
                         ceil_mode=False, **kwargs):
    """The OpInfo's ``max_pool2d_backward``: ATen's backward kernel on a
    gradient of ones, with fpemu's pooling and its backward op."""
    from fpemu.autograd.nn import _pooling
    out, idx = _F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode,
                             return_indices=True)
    return _pooling.max_pool_backward(ft.ones_like(out), x, idx, 2)


#: OpInfos (by name, or name.variant) whose ``op`` is a lambda around the
#: function (reordered arguments, a Tensor method, a fixed seed): fpemu's call
CALLS = {
    "where": lambda self, condition, other: ft.where(condition, self, other),
    "einsum": lambda tensors, equation: ft.einsum(equation, tensors),
    "contiguous": lambda x, *args, **kwargs: x.contiguous(*args, **kwargs),
    "expand": lambda self, shape: self.expand(shape),
    "expand_as": lambda self, other: self.expand_as(other),
    "view": lambda x, shape: x.view(shape),
    "view_as": lambda x, other: x.view_as(other),
    "repeat": lambda x, dims: x.repeat(dims),
    "nn.functional.embedding": lambda weight, idx, **kw: _F.embedding(idx, weight, **kw),
    "randn": _seeded(ft.randn),
    "randn_like": _seeded(ft.randn_like),
    "rand_like": _seeded(ft.randn_like),        # (torch's OpInfo calls randn_like too)
    "randint": _seeded(ft.randint),
    "randint_like": _seeded(ft.randint_like),
    "multinomial": _seeded(ft.multinomial),
    "normal": _seeded(ft.normal),
    "normal.number_mean": lambda std, mean, *args, **kw: _seeded(ft.normal)(
        mean, std, *args, **kw),
    "normal.in_place": _seeded(lambda inp, *args, **kw: inp.normal_(*args, **kw)),
    "bernoulli": _seeded(ft.bernoulli),
    "nn.functional.dropout": _seeded(_F.dropout),
    "nn.functional.dropout2d": _seeded(_F.dropout2d),
    "nn.functional.dropout3d": _seeded(_F.dropout3d),
    "nn.functional.scaled_dot_product_attention": _seeded(_F.scaled_dot_product_attention),
    "nn.functional.multi_head_attention_forward": _seeded(_F.multi_head_attention_forward),
    "max_pool2d_with_indices_backward": _max_pool2d_backward,
    "zero_": lambda x: ft.zero_(x.clone()),
}


@contextlib.contextmanager
def _torch_quiet():
    """torch's own warnings (its samples' beta-feature notes, its deprecations)
    are torch's business here; fpemu's calls stay under pytest's filter."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _key(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _lookup(name):
    """fpemu.autograd's function of that dotted name, or None."""
    obj = ft
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if callable(obj) else None


def _method(name):
    """fpemu's Tensor method or property of that name, called as the OpInfo
    calls it (``x.float(*args)``, ``x.T``), or None."""
    attr = inspect.getattr_static(ft.Tensor, name, None)
    if attr is None:
        return None
    if isinstance(attr, property):
        return lambda x: getattr(x, name)
    return getattr(ft.Tensor, name)         # as the OpInfo calls torch.Tensor.<name>(x, ...)


def _call(op):
    return CALLS.get(_key(op), CALLS.get(op.name))


def _wrapped(op):
    """The OpInfo calls its op through a lambda that reorders or fixes
    arguments, and CALLS has no counterpart of it."""
    return _call(op) is None and getattr(op.op, "__name__", "") == "<lambda>"


def _resolve(op):
    """fpemu's callable for the OpInfo: CALLS, else the function of that name
    (unless the OpInfo wraps it in a lambda), else the Tensor method or
    property of that name (the OpInfos of methods call them on the input)."""
    if _call(op) is not None:
        return _call(op)
    fn = None if _wrapped(op) else _lookup(op.name)
    return fn if fn is not None else _method(op.name)


_DTYPES = {getattr(torch, n): getattr(ft, n) for n in
           ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
            "uint8", "bool")}


class _NotEmulated(Exception):
    """A sample argument fpemu has no counterpart for (sparse CSR layouts,
    complex dtypes)."""


def _convert(x, leaves):
    """A sample argument as fpemu's: tensors exactly (``nn.from_torch``, the
    same ``requires_grad``), dtypes and sizes by name, containers recursively."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided or x.is_complex():
            raise _NotEmulated(f"{x.layout} {x.dtype} tensors")     # fpemu refuses them
        f = ft.nn.from_torch(x.detach())
        if x.requires_grad:
            f.requires_grad_(True)
        leaves.append((x, f))
        return f
    if isinstance(x, torch.dtype):
        return _DTYPES[x]
    if isinstance(x, torch.memory_format):
        return getattr(ft, str(x).replace("torch.", ""))
    if isinstance(x, torch.device):
        return ft.device(str(x))
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_convert(v, leaves) for v in x)
    if isinstance(x, dict):
        return {k: _convert(v, leaves) for k, v in x.items()}
    return x


def _flat(o):
    if isinstance(o, (list, tuple)):
        return [y for v in o for y in _flat(v)]
    return [o]


def _np(t):
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.layout != torch.strided:
            t = t.to_dense()            # (fpemu's sparse tensors give their dense values)
        return t.float().numpy() if t.dtype in (torch.bfloat16, torch.float16) else t.numpy()
    return np.asarray(t.detach().numpy())


def _dtype_name(d):
    return str(d).replace("torch.", "").replace("fpemu.", "")


def _differ(got, want, exact, rtol, what, noise=None):
    """Why fpemu's result is not torch's, or None. ``noise``: per result, how
    far torch's own result is from the same computation in float64 (fpemu
    may be four times as far: where a gradient is the rounding noise of a
    cancellation, both libraries return noise)."""
    gs, ws = _flat(got), _flat(want)
    if len(gs) != len(ws):
        return f"{what}: {len(gs)} results, torch {len(ws)}"
    for i, (g, w) in enumerate(zip(gs, ws)):
        if not isinstance(w, torch.Tensor):
            gv = g.item() if hasattr(g, "item") else g
            if gv != w and not (isinstance(w, float) and np.isnan(w) and np.isnan(gv)):
                return f"{what}[{i}]: {gv!r}, torch {w!r}"
            continue
        if not hasattr(g, "shape") or not hasattr(g, "dtype"):
            return f"{what}[{i}]: a {type(g).__name__}, torch a tensor"
        if tuple(g.shape) != tuple(w.shape) or _dtype_name(g.dtype) != _dtype_name(w.dtype):
            return (f"{what}[{i}]: {tuple(g.shape)} {_dtype_name(g.dtype)}, torch "
                    f"{tuple(w.shape)} {_dtype_name(w.dtype)}")
        if exact is None:
            continue                                        # shape and dtype only
        a, b = _np(g), _np(w)
        if a.dtype.kind != "f":
            if not np.array_equal(a, b):
                return f"{what}[{i}]: {np.count_nonzero(a != b)} elements differ"
            continue
        nan = np.isnan(b)
        if not np.array_equal(np.isnan(a), nan):
            return f"{what}[{i}]: NaN at other places ({np.isnan(a).sum()} vs {nan.sum()})"
        a, b = a[~nan], b[~nan]
        if exact:
            ua = a.view(np.uint64 if a.dtype == np.float64 else np.uint32)
            ub = b.view(ua.dtype)
            if not np.array_equal(ua, ub):
                return f"{what}[{i}]: {np.count_nonzero(ua != ub)} of {ua.size} codes differ"
            continue
        inf = np.isinf(b)
        if not np.array_equal(a[inf], b[inf]) or np.isinf(a[~inf]).any():
            return f"{what}[{i}]: infinities differ"
        a, b = a[~inf].astype(np.float64), b[~inf].astype(np.float64)
        if a.size:
            scale = max(float(np.max(np.abs(b))), np.finfo(np.float64).tiny)
            err = float(np.max(np.abs(a - b)))
            bound = rtol * scale + (4 * noise[i] if noise is not None else 0.0) + (
                ATOL64 if w.dtype == torch.float64 else 0.0)
            if err > bound:
                return (f"{what}[{i}]: off by {err:.3g} where the results reach {scale:.3g} "
                        f"(tolerance {bound:.3g})")
    return None


def _cotangents(outs, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(w.shape, generator=g, dtype=torch.float64).to(w.dtype) + 0.5
            for w in outs]


def _not_emulated(err):
    """fpemu's refusal of an op, argument or option it does not emulate (its
    FpemuNotImplementedError, or an error that says "not emulated")."""
    return isinstance(err, NotImplementedError) or "emulated" in str(err)


def _codes_equal(got, want):
    """(equal, total): how many floating-point elements of the outputs carry
    the same bit code as torch's (every NaN equal to every NaN; a result of
    another shape or dtype counts none of its elements equal)."""
    equal = total = 0
    for g, w in zip(_flat(got), _flat(want)):
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            continue
        b = _np(w)
        total += b.size
        if not hasattr(g, "shape") or tuple(g.shape) != tuple(w.shape) or \
                _dtype_name(g.dtype) != _dtype_name(w.dtype):
            continue
        a = _np(g)
        ua = a.view(np.uint64 if a.dtype == np.float64 else np.uint32)
        ub = b.view(ua.dtype)
        equal += int(np.count_nonzero((ua == ub) | (np.isnan(a) & np.isnan(b))))
    return equal, total


def _run_sample(op, fn, sample, dtype, tally=None):
    """None when fpemu agrees (or torch refuses the sample), "not emulated"
    when fpemu refuses it with its own error, else what is wrong. ``tally``
    (a Counter), where given, gains the forward outputs' ``equal`` and
    ``total`` floating-point elements (:func:`_codes_equal`) of the samples
    whose values are compared."""
    name = op.name
    exact = _exactness(op, sample)
    rtol = RTOL[dtype]
    with ft.use_profile(CPU):
        torch.manual_seed(0)
        try:
            with warnings.catch_warnings(record=True) as torch_warned:
                warnings.simplefilter("always")
                want = op(sample.input, *sample.args, **sample.kwargs)
        except Exception:                                        # noqa: BLE001
            return None
        leaves = []
        try:
            args = _convert((sample.input,) + tuple(sample.args), leaves)
            kwargs = _convert(dict(sample.kwargs), leaves)
        except _NotEmulated:
            return "not emulated"
        ft.manual_seed(0)
        try:
            with warnings.catch_warnings(record=True) as fpemu_warned:
                warnings.simplefilter("always")
                got = fn(*args, **kwargs)
        except FpemuError as err:
            if _not_emulated(err):
                return "not emulated"
            return f"refused: {type(err).__name__}: {str(err)[:160]}"
        except Exception as err:                                 # noqa: BLE001
            return f"crash: {type(err).__name__}: {str(err)[:160]}"
        extra = ({type(w.message).__name__ for w in fpemu_warned}
                 - {type(w.message).__name__ for w in torch_warned})
        if extra:
            return f"warning: fpemu warns ({', '.join(sorted(extra))}) where torch does not"
        if tally is not None and exact is not None:
            equal, total = _codes_equal(got, want)
            tally["equal"] += equal
            tally["total"] += total
        why = _differ(got, want, exact, rtol, "values")
        if why:
            return why
        if not op.supports_autograd or name in RANDOM or exact is None:
            return None
        touts = [w for w in _flat(want) if isinstance(w, torch.Tensor) and w.requires_grad]
        fouts = [g for g in _flat(got) if getattr(g, "requires_grad", False)]
        if len(touts) != len(fouts):
            return f"requires_grad: {len(fouts)} outputs need a gradient, torch {len(touts)}"
        tin = [t for t, _ in leaves if t.requires_grad]
        if not touts or not tin:
            return None
        cots = _cotangents(touts, 1)
        try:
            with _torch_quiet():
                tgrads = torch.autograd.grad(touts, tin, cots, allow_unused=True)
        except Exception:                                        # noqa: BLE001
            return None
        fin = [f for t, f in leaves if t.requires_grad]
        try:
            ft.autograd.backward(fouts, [ft.nn.from_torch(c) for c in cots])
        except Exception as err:                                 # noqa: BLE001
            return f"backward crash: {type(err).__name__}: {str(err)[:160]}"
        noise = _gradient_noise(op, sample, tgrads, cots) if dtype == "float32" else None
        for i, (f, t) in enumerate(zip(fin, tgrads)):
            if t is None:
                continue
            if f.grad is None:
                return f"gradient {i}: None, torch a tensor"
            why = _differ(f.grad, t, False, 10 * rtol, f"gradient {i}",
                          None if noise is None else [noise[i]])
            if why:
                return why
    return None


def _double(x, leaves):
    if isinstance(x, torch.Tensor):
        d = x.detach().double() if x.dtype == torch.float32 else x.detach().clone()
        if x.requires_grad:
            d.requires_grad_(True)
            leaves.append(d)
        return d
    if isinstance(x, (list, tuple)):
        return type(x)(_double(v, leaves) for v in x)
    if isinstance(x, dict):
        return {k: _double(v, leaves) for k, v in x.items()}
    return x


def _gradient_noise(op, sample, tgrads, cots):
    """Per input gradient, how far torch's float32 gradient is from torch's
    float64 one on the same inputs and cotangent (0 where that fails)."""
    leaves = []
    args = _double((sample.input,) + tuple(sample.args), leaves)
    kwargs = _double(dict(sample.kwargs), leaves)
    try:
        with _torch_quiet():
            outs = [w for w in _flat(op(*args, **kwargs)) if isinstance(w, torch.Tensor)
                    and w.requires_grad]
            g64 = torch.autograd.grad(outs, leaves, [c.double() for c in cots],
                                      allow_unused=True)
    except Exception:                                            # noqa: BLE001
        return [0.0] * len(tgrads)
    return [0.0 if a is None or b is None or a.shape != b.shape else
            float((a.double() - b).abs().max()) if a.numel() else 0.0
            for a, b in zip(tgrads, g64)]


@contextlib.contextmanager
def _harness_stack_walks_off():
    """Two costs of torch's test harness that check nothing here, taken out
    (two thirds of this file's time, the samples unchanged):

    * the sample iterators look up the stack for a ``unittest.TestCase``
      with ``inspect.stack()``, which reads the source of every frame; these
      tests are pytest functions, so the search ends in None: it returns
      None at once;
    * ``torch.manual_seed``, called before every sample, also queues a
      seeding of CUDA, XPU and MTIA for their lazy initialisation, each with
      a formatted stack trace; on a machine with none of them it seeds the
      CPU generator alone, as it does there in the end.
    """
    import torch.random
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core
    mp = pytest.MonkeyPatch()
    for module in (common_utils, core):
        mp.setattr(module, "extract_test_fn", lambda: None)
    others = [getattr(torch, name, None) for name in ("cuda", "xpu", "mtia")]
    if not any(m is not None and m.is_available() for m in others):
        mp.setattr(torch.random, "_manual_seed_impl",
                   lambda seed: torch.default_generator.manual_seed(int(seed)))
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(autouse=True, scope="module")
def _without_the_harness_stack_walks():
    with _harness_stack_walks_off():
        yield


def _ops():
    for op in op_db:
        if _resolve(op) is not None:
            yield op


def _case(op, dtype):
    return pytest.param(op, dtype, id=f"{_key(op)}-{dtype}")


@pytest.mark.parametrize("op, dtype", [_case(op, d) for op in _ops() for d in DTYPES
                                       if getattr(torch, d) in op.supported_dtypes("cpu")])
def test_opinfo_samples(op, dtype):
    dt = getattr(torch, dtype)
    fn = _resolve(op)
    wrong = collections.Counter()
    first = {}
    with _torch_quiet():
        samples = list(op.sample_inputs("cpu", dt, requires_grad=op.supports_autograd))
    for sample in samples:
        why = _run_sample(op, fn, sample, dtype)
        if why and why != "not emulated":
            kind = why.split(":")[0]
            wrong[kind] += 1
            first.setdefault(kind, f"{why} (input {tuple(getattr(sample.input, 'shape', ()))}, "
                                   f"{len(sample.args)} args, kwargs {sorted(sample.kwargs)})")
    assert not wrong, "; ".join(f"{n} x {first[k]}" for k, n in wrong.items())


@pytest.mark.parametrize("op, dtype", [_case(op, "float32") for op in _ops()
                                       if op.error_inputs_func is not None])
def test_opinfo_error_inputs(op, dtype):
    """Each input torch refuses, fpemu refuses with an exception of the same
    class (fpemu's errors derive from ValueError, TypeError, RuntimeError...)."""
    fn = _resolve(op)
    bad = []
    with _torch_quiet():
        error_inputs = list(op.error_inputs("cpu"))
    for ei in error_inputs:
        s = ei.sample_input
        if _aliases(s):
            continue            # out= shares memory with an input: the copies cannot
        if not _torch_refuses(op, s):
            continue            # an error input torch itself accepts on the CPU
        leaves = []
        try:
            args = _convert((s.input,) + tuple(s.args), leaves)
            kwargs = _convert(dict(s.kwargs), leaves)
        except _NotEmulated:
            continue
        except ValueError:
            continue                 # past numpy's 64 dimensions: no fpemu tensor to make
        with ft.use_profile(CPU):
            try:
                fn(*args, **kwargs)
            except ei.error_type:
                continue
            except FpemuError as err:
                if _not_emulated(err):
                    continue    # refused as not emulated (the samples test counts those)
                bad.append(f"{type(err).__name__} where torch raises "
                           f"{ei.error_type.__name__} ({str(err)[:80]})")
                continue
            except Exception as err:                             # noqa: BLE001
                bad.append(f"{type(err).__name__} where torch raises "
                           f"{ei.error_type.__name__} ({str(err)[:80]})")
                continue
        bad.append(f"accepted where torch raises {ei.error_type.__name__} "
                   f"({ei.error_regex[:60]!r})")
    assert not bad, f"{len(bad)}: " + "; ".join(bad[:3])


def _torch_refuses(op, sample):
    """Whether torch CPU raises on the error input (a few of op_db's are
    refused only on other devices or builds)."""
    try:
        with _torch_quiet():
            op(sample.input, *sample.args, **sample.kwargs)
    except Exception:                                            # noqa: BLE001
        return True
    return False


def _aliases(sample):
    """Whether a sample's ``out=`` (a tensor or a tuple of them) shares
    memory with one of its inputs, another out or itself (the error torch
    raises for that cannot be asked of converted copies)."""
    outs = [t for t in _flat([sample.kwargs.get("out")]) if isinstance(t, torch.Tensor)]
    ins = [t for t in _flat([sample.input, list(sample.args)]) if isinstance(t, torch.Tensor)]
    for out in outs:
        if 0 in out.stride() and out.numel() > 1:
            return True         # an expanded out: its elements share memory
        ptr = out.untyped_storage().data_ptr()
        others = ins + [t for t in outs if t is not out]     # an input may be the out itself
        if any(t.untyped_storage().data_ptr() == ptr for t in others):
            return True
    return False


def coverage_table():
    """The ops of op_db fpemu lacks, and those whose samples it refuses in
    part, with sample counts (float32): markdown for docs/autograd.md."""
    lacking, partly, wrapped = (collections.Counter() for _ in range(3))
    total = collections.Counter()
    for op in op_db:
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        with _torch_quiet():
            samples = list(op.sample_inputs("cpu", torch.float32))
        fn = _resolve(op)
        if fn is None:
            (wrapped if _lookup(op.name) else lacking)[_key(op)] += len(samples)
            continue
        for s in samples:
            total[_key(op)] += 1
            if _run_sample(op, fn, s, "float32") == "not emulated":
                partly[_key(op)] += 1
    lines = ["| op (OpInfo) | float32 samples | fpemu |", "|---|---|---|"]
    for k, n in sorted(partly.items(), key=lambda kv: -kv[1]):
        lines.append(f"| `{k}` | {total[k]} | {n} refused as not emulated |")
    for k, n in sorted(wrapped.items(), key=lambda kv: -kv[1]):
        lines.append(f"| `{k}` | {n} | in fpemu; the OpInfo calls it through a wrapper "
                     f"(not run) |")
    for k, n in sorted(lacking.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| `{k}` | {n} | not in fpemu |")
    return (f"{len(total)} OpInfo entries run, {sum(total.values())} float32 samples "
            f"({sum(partly.values())} of them refused as not emulated); "
            f"{len(wrapped)} entries fpemu has but cannot be called as the OpInfo calls "
            f"them; {len(lacking)} entries fpemu lacks ({sum(lacking.values())} samples).\n\n"
            + "\n".join(lines))


#: the OpInfo entries whose values are products of BLAS / LAPACK (MKL) or
#: oneDNN kernels on torch CPU: their summation order is the library's, held
#: to a few ulps (the summation-order tier of docs/autograd.md)
PRODUCTS = {
    "matmul", "mm", "bmm", "addmm", "addmv", "addbmm", "baddbmm", "addr", "mv", "dot", "vdot",
    "inner", "outer", "tensordot", "einsum", "chain_matmul", "linalg.multi_dot",
    "linalg.matmul", "linalg.vecdot", "__rmatmul__", "nn.functional.linear",
    "nn.functional.bilinear", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.conv3d", "nn.functional.conv_transpose1d",
    "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d",
    "nn.functional.scaled_dot_product_attention",
    "nn.functional.multi_head_attention_forward", "cdist", "nn.functional.pairwise_distance",
    "linalg.lu_factor", "linalg.lu_factor_ex", "linalg.lu", "linalg.lu_solve", "linalg.solve",
    "linalg.solve_ex", "linalg.solve_triangular", "triangular_solve", "linalg.inv",
    "linalg.inv_ex", "inverse", "linalg.det", "det", "linalg.slogdet", "logdet",
    "linalg.cholesky", "linalg.cholesky_ex", "cholesky", "cholesky_solve", "cholesky_inverse",
    "linalg.eigh", "linalg.eigvalsh", "linalg.matrix_power", "linalg.tensorsolve",
    "linalg.tensorinv", "linalg.cond", "linalg.matrix_norm", "linalg.norm", "norm.nuc",
}

#: where tests/test_opinfo.py --table writes the per-entry shares
COVERAGE_PAGE = os.path.join(os.path.dirname(__file__), "..", "docs", "opinfo-coverage.md")


def _is_product(key):
    return key in PRODUCTS or key.rsplit(".", 1)[0] in PRODUCTS


def exact_share(dtypes=DTYPES):
    """Per OpInfo entry fpemu runs and dtype, how many floating-point
    elements of the forward outputs (over every sample whose values are
    compared) carry torch CPU's bit code: {key: {dtype: (equal, total)}}."""
    share = collections.defaultdict(dict)
    for op in _ops():
        fn = _resolve(op)
        for dtype in dtypes:
            dt = getattr(torch, dtype)
            if dt not in op.supported_dtypes("cpu"):
                continue
            tally = collections.Counter()
            with _torch_quiet():
                samples = list(op.sample_inputs("cpu", dt, requires_grad=False))
            for sample in samples:
                _run_sample(op, fn, sample, dtype, tally)
            share[_key(op)][dtype] = (tally["equal"], tally["total"])
    return share


def _pct(equal, total):
    return f"{100 * equal / total:.2f} %" if total else "-"


def _other_isa_share():
    """The shares under AVX2 (``bench/isa.py avx2``: ATen, MKL, oneDNN,
    numpy and Numba as on an AVX2-only CPU), from a child process; None on a
    CPU without AVX-512 (its own run is the AVX2 one)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None
    import json
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "..", "bench", "isa.py"), "avx2",
                          "--", sys.executable, os.path.abspath(__file__), "--exact-json"],
                         capture_output=True, text=True, cwd=here, timeout=3600, check=True)
    return {k: {d: tuple(v) for d, v in dv.items()}
            for k, dv in json.loads(out.stdout.splitlines()[-1]).items()}


def exact_share_table(shares):
    """Markdown: the totals (every entry; those outside the products) per
    instruction set, then one row per entry (the most differing float32
    elements first) with its share under each instruction set and its tier.
    ``shares``: {isa name: exact_share() run under it}."""
    isas = list(shares)

    def total(share, dtype, keep):
        e = sum(v[dtype][0] for k, v in share.items() if dtype in v and keep(k))
        t = sum(v[dtype][1] for k, v in share.items() if dtype in v and keep(k))
        return e, t

    head = "".join(f" float32 {i} | float64 {i} |" for i in isas)
    lines = [f"| |{head}", "|---|" + "---|---|" * len(isas)]
    for what, keep in (("every entry", lambda k: True),
                       ("outside the BLAS / LAPACK / oneDNN products",
                        lambda k: not _is_product(k))):
        cells = "".join(f" {_pct(*total(shares[i], 'float32', keep))} | "
                        f"{_pct(*total(shares[i], 'float64', keep))} |" for i in isas)
        lines.append(f"| {what} |{cells}")
    first = shares[isas[0]]
    lines += ["", "Per entry: the share in % of its float32 / float64 elements.", "",
              "| op (OpInfo) | elements |" + "".join(f" {i} |" for i in isas) + " tier |",
              "|---|---|" + "---|" * len(isas) + "---|"]

    def missing(key):
        return -sum(v[0][1] - v[0][0] + v[1][1] - v[1][0] for v in (
            (shares[i][key].get("float32", (0, 0)), shares[i][key].get("float64", (0, 0)))
            for i in isas)), key

    def pair(share):
        return " / ".join(_pct(*share.get(d, (0, 0))).replace(" %", "") for d in DTYPES)
    names = {_key(op): op.name.rsplit(".", 1)[-1] for op in op_db}
    for key in sorted(first, key=missing):
        cells = "".join(f" {pair(shares[i][key])} |" for i in isas)
        exact = all(e == t for i in isas for e, t in shares[i][key].values())
        tier = ("product" if _is_product(key) else
                "bit for bit" if names.get(key) in EXACT or exact else "ulps")
        sizes = " / ".join(str(first[key].get(d, (0, 0))[1]) for d in DTYPES)
        lines.append(f"| `{key}` | {sizes} |{cells} {tier} |")
    return "\n".join(lines)


def _held_bit_for_bit():
    """The entries the coverage page's share table holds bit for bit (every
    float32 and float64 element equal under every instruction set measured):
    their values are compared by bit code (the tier tightens as an op becomes
    exact). Only on AVX2 / AVX-512 CPUs, the instruction sets measured."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return frozenset()
    try:
        with open(COVERAGE_PAGE) as fh:
            page = fh.read()
    except OSError:
        return frozenset()
    return frozenset(re.findall(r"^\| `([^`]+)` \|[^\n]*\| bit for bit \|$", page, re.M))


HELD = _held_bit_for_bit()


def test_the_coverage_page_lists_the_ops_fpemu_lacks():
    """docs/opinfo-coverage.md (written by ``python tests/test_opinfo.py
    --table``) names every OpInfo entry fpemu lacks, and no other."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs",
                           "opinfo-coverage.md")) as fh:
        page = fh.read()
    listed = set(re.findall(r"^\| `([^`]+)` \| \d+ \| not in fpemu \|$", page, re.M))
    lacking = {_key(op) for op in op_db if torch.float32 in op.supported_dtypes("cpu")
               and _resolve(op) is None and not _lookup(op.name)}
    assert listed == lacking, (f"docs/opinfo-coverage.md is out of date: listed but now in "
                               f"fpemu {sorted(listed - lacking)[:5]}, missing "
                               f"{sorted(lacking - listed)[:5]}; regenerate it with `python "
                               "tests/test_opinfo.py --table > docs/opinfo-coverage.md` "
                               "(about two minutes)")


def test_the_coverage_page_counts_tensor_methods_and_properties():
    """An OpInfo of a Tensor method or property (``T``, ``mT``, ``float``,
    ``to``, ``item``, ``new_zeros``, ``__radd__``...) runs on fpemu's method:
    the page lists none of them as "not in fpemu"."""
    with open(os.path.join(os.path.dirname(__file__), "..", "docs",
                           "opinfo-coverage.md")) as fh:
        page = fh.read()
    listed = re.findall(r"^\| `([^`]+)` \| \d+ \| not in fpemu \|$", page, re.M)
    names = {_key(op): op.name for op in op_db}
    present = [k for k in listed if inspect.getattr_static(ft.Tensor, names[k], None)
               is not None or _lookup(names[k]) is not None]
    assert not present, (f"docs/opinfo-coverage.md lists as not in fpemu what fpemu has: "
                         f"{present}; regenerate it with `python tests/test_opinfo.py --table "
                         "> docs/opinfo-coverage.md`")
    for name in ("T", "mT", "float", "to", "item", "new_zeros", "__radd__", "zero_"):
        assert any(_resolve(op) is not None for op in op_db if op.name == name), name


if __name__ == "__main__" and "--exact-json" in sys.argv:
    # the shares as JSON on the last line (the AVX2 child of --table)
    import json
    with _harness_stack_walks_off():
        print(json.dumps(exact_share()))
elif __name__ == "__main__" and "--exact" in sys.argv:
    # the bit-exact share under this CPU's instruction set alone (about 20 s)
    with _harness_stack_walks_off():
        print(exact_share_table({torch.backends.cpu.get_cpu_capability(): exact_share()}))

if __name__ == "__main__" and "--table" in sys.argv:
    # the page, both tables (about two minutes: the AVX2 shares in a child)
    with _harness_stack_walks_off():
        _shares = {torch.backends.cpu.get_cpu_capability(): exact_share()}
        _avx2 = _other_isa_share()
        if _avx2 is not None:
            _shares["AVX2"] = _avx2
        _coverage = coverage_table()
    print(f"""# Coverage by PyTorch's op tests

Which entries of PyTorch's op database (`op_db`, torch 2.13) `fpemu.autograd`
runs in `tests/test_opinfo.py` (see [autograd.md](autograd.md)),
which samples it refuses as not emulated, and which ops it does not have,
with their float32 sample counts; then how many of their forward output
elements carry torch CPU's bit code under the CPU profile. Written by
`python tests/test_opinfo.py --table > docs/opinfo-coverage.md`, which a
change that adds an op must run: the tests fail until the list of ops fpemu
lacks is current, and hold every entry the second table marks "bit for bit"
to torch's bit codes.

{_coverage}

## Bit for bit with torch CPU

The share of the float32 and float64 forward output elements of every
sample (whose values are compared: not the random draws) that carry torch
CPU's bit code, under the CPU profile (`Profile("cpu", cpu_capability=...,
cpu_threads=torch.get_num_threads())`), on this machine's instruction set and
as torch runs on an AVX2-only CPU (`python bench/isa.py avx2`). Tiers: "bit for
bit", every element equal under both; "product", a BLAS / LAPACK (MKL) or
oneDNN product, whose summation order is the library's (held to a few ulps);
"ulps", the rest (held to a few ulps). `python tests/test_opinfo.py --exact`
prints the share under this CPU's instruction set alone (about 20 s).

{exact_share_table(_shares)}""")
