"""Every operation of a training step, recorded with PyTorch and replayed op by
op in fpemu: ``fpemu record --ops`` and ``fpemu parity --first-difference``.

An end-to-end scenario's trace holds what a run ends with (the losses, the
loss scale, the zero fractions); when fpemu's run parts from PyTorch's it
does not say where. The op stream does. While chosen steps of a scenario run
in PyTorch, a ``TorchDispatchMode`` sees every ATen call the step makes: the
forward's, the autograd engine's (each op's gradient) and the optimizer's
and the GradScaler's (``_foreach_*``, ``_amp_*``). For each call it stores the
operator, its arguments (tensors by value, as they were when the call
began: in-place ops change them) and its outputs (for in-place ops, the
tensors it wrote), each tensor once however often it appears. Views, copies
and tensor creation (``view``, ``t``, ``detach``, ``zeros_like``, ...) carry
no arithmetic and are left out.

The replay runs each recorded op alone in fpemu, on the *recorded* inputs,
under the profile of the trace folder, and compares its outputs bit for bit
with the recorded ones. An op is therefore judged on its own: a difference
upstream cannot leak into it, and the first op whose output differs is the
first place where fpemu computes otherwise than the device. The gradient ops
replay through fpemu's autograd (the forward op on the recorded inputs, then
``backward`` with the recorded output gradient); those that take the
forward's *output* rather than its input (softmax, log_softmax) or its saved
statistics (layer_norm) find the forward op they belong to through the
tensor they share with it.

The files: ``<trace folder>/ops/<scenario>.npz``, holding ``index`` (JSON:
the ops, their arguments and outputs as references to tensors) and one array
``t<k>`` per tensor (16- and 8-bit floats as their bit codes). Only
scenarios that mark their steps (``env.step(i)``: the end-to-end ones) can
be recorded this way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os

import numpy as np

from ..checks import flatten
from ..errors import FpemuValueError
from ._env import Env
from .parity import load_meta, profile_of
from .record import META, _machine, _read_meta, _torch_for, device_name, select, trace_dir_name
from .scenarios import SCENARIOS

OPS_DIR = "ops"

#: ATen ops that do no arithmetic: views, copies, creation, bookkeeping
SKIP = frozenset("""
detach view _unsafe_view t transpose expand unsqueeze squeeze permute alias lift_fresh
_local_scalar_dense slice select as_strided clone copy_ zeros_like ones_like empty_like full
full_like zeros ones empty new_empty new_zeros new_ones new_full fill_ zero_ _to_copy_noop
is_nonzero item _reshape_alias reshape contiguous split split_with_sizes unbind chunk
_has_compatible_shallow_copy_type set_ resize_ record_stream lift
""".split())

#: torch's fp8 dtypes as fpemu's formats
_FP8 = {"float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2", "float8_e4m3fnuz": "e4m3fnuz",
        "float8_e5m2fnuz": "e5m2fnuz"}

#: bit-code dtypes of the stored tensors
_BITS = {"bfloat16": np.uint16, "float16": np.uint16, "float8_e4m3fn": np.uint8,
         "float8_e5m2": np.uint8, "float8_e4m3fnuz": np.uint8, "float8_e5m2fnuz": np.uint8}


def _short(func):
    """'aten.mm.default' -> 'mm'."""
    return str(func).split(".")[1] if str(func).count(".") >= 2 else str(func)


# ------------------------------------------------------------------ recording
class _Store:
    """Tensors by content: each distinct (dtype, shape, bytes) is kept once."""

    def __init__(self):
        self.arrays = []
        self.meta = []
        self._seen = {}

    def add(self, torch, t):
        name = str(t.dtype).replace("torch.", "")
        x = t.detach().cpu().contiguous()
        if name in _BITS:
            a = x.view(getattr(torch, "uint16" if _BITS[name] is np.uint16 else "uint8")).numpy()
        else:
            a = x.numpy()
        a = np.array(a, copy=True)
        key = (name, a.shape, hashlib.sha1(a.tobytes()).hexdigest())
        k = self._seen.get(key)
        if k is None:
            k = self._seen[key] = len(self.arrays)
            self.arrays.append(a)
            self.meta.append({"dtype": name, "shape": list(a.shape)})
        return k


class OpCapture:
    """Records the ATen calls made inside ``env.step(i)`` for i in ``steps``
    (a PyTorch ``Env``'s ``capture``)."""

    def __init__(self, torch, steps):
        self.torch = torch
        self.steps = set(int(s) for s in steps)
        self.store = _Store()
        self.ops = []
        self._producer = {}           # live tensor identity -> (op index, output index)
        self._paused = 0

    def _key(self, t):
        return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype))

    @contextlib.contextmanager
    def step(self, i):
        if int(i) not in self.steps:
            yield
            return
        self._step = int(i)
        self._backward_seen = False
        self._producer.clear()             # a backward op links to its own step's forward
        mode = _dispatch_mode(self.torch)(self)
        with mode:
            yield

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _encode(self, x, device=None):
        torch = self.torch
        if isinstance(x, torch.Tensor) and device not in (None, "cpu") and x.dim() == 0 \
                and x.device.type == "cpu":
            # a Python number the op was given: torch wraps it as a 0-d CPU
            # tensor, and its kernels read it as a number (docs/pytorch-numerics.md)
            v = x.item()
            return {"f": repr(float(v))} if x.is_floating_point() else {"v": v}
        if isinstance(x, torch.Tensor):
            src = self._producer.get(self._key(x))
            d = {"t": self.store.add(torch, x)}
            if src is not None:
                d["from"] = list(src)
            return d
        if isinstance(x, (list, tuple)):
            return {"list": [self._encode(v, device) for v in x]}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).replace("torch.", "")}
        if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
            return {"v": x}
        if isinstance(x, float):
            return {"f": repr(x)}
        return {"other": str(x)}

    def call(self, func, args, kwargs):
        torch = self.torch
        name = _short(func)
        if self._paused or name in SKIP or str(func).startswith("profiler."):
            return func(*args, **kwargs)
        in_backward = torch._C._current_graph_task_id() != -1
        device = next((a.device.type for a in flatten(args) if isinstance(a, torch.Tensor)
                       and a.device.type != "cpu"), "cpu")
        enc_args = [self._encode(a, device) for a in args]
        enc_kwargs = {k: self._encode(v, device) for k, v in kwargs.items()
                      if k not in ("device", "layout", "pin_memory", "memory_format",
                                   "non_blocking")}
        out = func(*args, **kwargs)
        written = []
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = args[i] if i < len(args) else kwargs.get(a.name)
                if v is not None:
                    written.append(v)
        # the arguments it wrote, then every return that is a new tensor (not
        # an alias of an argument: an in-place op returns self)
        returns = (list(out) if isinstance(out, tuple) else [out]
                   if isinstance(out, (torch.Tensor, list)) else [])
        fresh = [r for r, spec in zip(returns, func._schema.returns) if spec.alias_info is None]
        outs = written + fresh
        index = len(self.ops)
        enc_outs = []
        for j, o in enumerate(outs):
            if isinstance(o, (list, tuple)):
                enc_outs.append({"list": [{"t": self.store.add(torch, t)} for t in o]})
                for jj, t in enumerate(o):
                    self._producer[self._key(t)] = (index, j, jj)
            elif isinstance(o, torch.Tensor):
                enc_outs.append({"t": self.store.add(torch, o)})
                self._producer[self._key(o)] = (index, j)
            else:
                enc_outs.append({"v": None})
        if in_backward:
            self._backward_seen = True
        # after the step's backward every op is the optimizer's or the
        # GradScaler's (unscaling, the step, the scale's update)
        optimizer = self._backward_seen or name.startswith(("_foreach", "_amp_", "_fused"))
        phase = "backward" if in_backward else "optimizer" if optimizer else "forward"
        self.ops.append({"op": str(func), "step": self._step, "phase": phase,
                         "args": enc_args, "kwargs": enc_kwargs, "outs": enc_outs})
        return out

    def save(self, path, scenario, device_name):
        payload = {f"t{k}": a for k, a in enumerate(self.store.arrays)}
        payload["index"] = np.array(json.dumps({
            "scenario": scenario, "device_name": device_name, "steps": sorted(self.steps),
            "tensors": self.store.meta, "ops": self.ops}))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez_compressed(path, **payload)


def _dispatch_mode(torch):
    from torch.utils._python_dispatch import TorchDispatchMode  # optional dependency

    class _Mode(TorchDispatchMode):
        def __init__(self, capture):
            super().__init__()
            self.capture = capture

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return self.capture.call(func, args, kwargs or {})
    return _Mode


def stepped(name):
    """Whether a scenario marks its steps (only those can be recorded op by op)."""
    return SCENARIOS[name].group == "e2e"


def record_ops(torch, env, folder, names, steps=(0, 10), log=print):
    """Record the op stream of ``steps`` of each scenario in ``names`` (those
    that mark their steps) into ``<folder>/ops/``; returns the paths."""
    paths, failed = [], {}
    for name in names:
        if not stepped(name):
            continue
        sc = SCENARIOS[name]
        torch.manual_seed(0)
        cap = OpCapture(torch, steps)
        env.capture = cap
        try:
            inputs = sc.make_inputs(env, sc.config)
            sc.run(env, sc.config, inputs)
            env.sync()
        except Exception as exc:            # record the rest; report this one at the end
            failed[name] = f"{type(exc).__name__}: {exc}"
            log(f"FAILED   {name:<32} {failed[name]}")
            continue
        finally:
            env.capture = None
        path = os.path.join(folder, OPS_DIR, f"{name}.npz")
        cap.save(path, name, device_name(torch, env.device))
        log(f"recorded {name:<32} {len(cap.ops)} ops, {len(cap.store.arrays)} tensors "
            f"(steps {', '.join(map(str, sorted(cap.steps)))})")
        paths.append(path)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(names)} op streams raised in PyTorch and were "
                           "not recorded (the others are in " + os.path.join(folder, OPS_DIR)
                           + "): " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    return paths


def record_op_streams(device="cpu", out="tests/reference", only=None, steps=(0, 10), log=print):
    """``fpemu record --ops``: the op streams of ``steps`` of the end-to-end
    scenarios among ``only`` into
    ``<trace folder>/ops/``; the folder's meta.json gains the machine's
    description if it has none. Returns the trace folder."""
    torch = _torch_for(device)
    names = [n for n in select(only) if stepped(n)]
    if not names:
        raise FpemuValueError(f"--ops records the end-to-end scenarios' steps; none of "
                              f"{', '.join(select(only))} is one: pass --only 'e2e-*'")
    folder = os.path.join(out, trace_dir_name(torch, device))
    os.makedirs(folder, exist_ok=True)
    meta_path = os.path.join(folder, META)
    meta = _read_meta(meta_path)
    if "device" not in meta:
        meta.update(_machine(torch, device))
        meta.setdefault("scenarios", {})
        with open(meta_path, "w") as fh:
            json.dump(meta, fh, indent=1, sort_keys=True)
    record_ops(torch, Env(torch, device, "torch"), folder, names, steps, log)
    return folder


# ------------------------------------------------------------------ loading
class OpStream:
    """A recorded op stream: ``ops`` (dicts), ``tensor(k)`` the k-th tensor
    as float32 / float64 / int64 / bool values and its dtype name."""

    def __init__(self, path):
        try:
            with open(path, "rb") as fh, np.load(fh) as z:
                self.index = json.loads(str(z["index"]))
                self._arrays = {k: z[k] for k in z.files if k != "index"}
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} is missing: record the scenario's op stream with `fpemu record --ops "
                f"--only SCENARIO` (a GPU run records it with `make gpu-check`)") from None
        except (ValueError, OSError, KeyError) as err:
            raise FpemuValueError(f"{path} is not an op stream `fpemu record --ops` writes "
                                  f"({type(err).__name__}: {err}); record it again") from None
        self.path = path
        self.ops = self.index["ops"]

    def dtype(self, k):
        return self.index["tensors"][k]["dtype"]

    def values(self, k):
        """The k-th tensor's values, widened exactly: 16- and 8-bit floats to
        float32."""
        a = self._arrays[f"t{k}"]
        name = self.dtype(k)
        if name == "bfloat16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if name == "float16":
            return a.view(np.float16).astype(np.float32)
        if name in _BITS:
            from ..quantize import decode  # needs Numba; recording runs without it
            fmt = _FP8[name]
            return decode(a, fmt).astype(np.float32)
        return a


# ------------------------------------------------------------------ replay
@dataclasses.dataclass
class OpResult:
    """One replayed op: ``status`` "equal", "differs" or "not replayed"."""

    position: int
    op: str
    step: int
    phase: str
    status: str
    inputs: str = ""
    detail: str = ""
    outputs: list = dataclasses.field(default_factory=list)   # (label, n_diff, size, max_ulps)

    def line(self):
        head = f"#{self.position:<4} step {self.step} {self.phase:<9} {self.op}"
        if self.status == "not replayed":
            return f"{head}: not replayed ({self.detail})"
        parts = [(f"{lab}: {n} of {size} differ, max {u} ulp" if u else
                  f"{lab}: {n} of {size} differ in the sign of zero") if n else f"{lab}: equal"
                 for lab, n, size, u in self.outputs]
        return f"{head}({self.inputs}) -> " + "; ".join(parts)


def _ordered(values, dtype):
    """Integers in the order of the dtype's values (adjacent values differ by
    1), from values widened to float32 / float64."""
    v = np.asarray(values)
    if dtype == "float64":
        b = v.astype(np.float64).view(np.int64)
        return np.where(b < 0, -(b & 0x7FFFFFFFFFFFFFFF), b)
    b = v.astype(np.float32).view(np.int32).astype(np.int64)
    if dtype == "bfloat16":
        b = b >> 16
        return np.where(b < 0, -(b & 0x7FFF), b)
    if dtype == "float16":
        h = v.astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(h < 0, -(h & 0x7FFF), h)
    return np.where(b < 0, -(b & 0x7FFFFFFF), b)


def compare_values(got, want, dtype):
    """``(n_diff, max_ulps)`` of two arrays of one dtype's values: bit for
    bit (NaN equals NaN; +0 and -0 differ)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise FpemuValueError(f"fpemu's output has shape {list(got.shape)}, the recorded one "
                              f"{list(want.shape)}")
    if dtype in _FP8:                   # distances in the format's own codes
        from ..quantize import encode  # needs Numba; recording runs without it
        fmt = _FP8[dtype]
        g, w = encode(got.astype(np.float32), fmt), encode(want.astype(np.float32), fmt)
        gn, wn = np.isnan(got), np.isnan(want)
        diff = (g != w) & ~(gn & wn)
        if not diff.any():
            return 0, 0
        if (gn ^ wn)[diff].any():
            return int(diff.sum()), float("inf")
        order = [np.where(c & 0x80, -(c.astype(np.int64) & 0x7F), c.astype(np.int64))
                 for c in (g, w)]
        return int(diff.sum()), int(np.abs(order[0] - order[1])[diff].max())
    if dtype in ("int64", "int32", "bool", "uint8", "int8", "int16"):
        d = got.astype(np.int64) != want.astype(np.int64)
        return int(d.sum()), (int(np.abs(got.astype(np.int64) - want.astype(np.int64)).max())
                              if d.any() else 0)
    wide = np.float64 if dtype == "float64" else np.float32
    g, w = got.astype(wide), want.astype(wide)
    both_nan = np.isnan(g) & np.isnan(w)
    ibits = np.int64 if wide is np.float64 else np.int32
    diff = (g.view(ibits) != w.view(ibits)) & ~both_nan
    if not diff.any():
        return 0, 0
    one_nan = np.isnan(g) ^ np.isnan(w)
    if one_nan[diff].any():
        return int(diff.sum()), float("inf")
    u = np.abs(_ordered(g, dtype) - _ordered(w, dtype))[diff]
    return int(diff.sum()), int(u.max())


class _Replayer:
    """Decodes a recorded op's arguments into fpemu values and runs it."""

    def __init__(self, stream):
        import fpemu.autograd as ft  # needs Numba; recording runs without it
        self.ft = ft
        self.s = stream

    def tensor(self, spec, grad=False):
        ft = self.ft
        k = spec["t"]
        name = self.s.dtype(k)
        vals = self.s.values(k)
        if name in ("int64", "int32", "bool", "uint8", "int8", "int16"):
            t = ft.tensor(vals)
        else:
            t = ft.tensor(vals).to(getattr(ft, name))
        if grad:
            t.requires_grad_(True)
        return t

    def value(self, spec, grad=False):
        if "t" in spec:
            return self.tensor(spec, grad)
        if "list" in spec:
            return [self.value(v, grad) for v in spec["list"]]
        if "dtype" in spec:
            return getattr(self.ft, spec["dtype"])
        if "f" in spec:
            return float(spec["f"])
        if "v" in spec:
            return spec["v"]
        return None

    def forward_of(self, spec):
        """The recorded op whose output the argument ``spec`` is."""
        src = spec.get("from")
        return None if src is None else self.s.ops[src[0]]


def _grads(out, grad, *xs):
    out.backward(grad)
    return [None if x is None else x.grad for x in xs]


#: the overloads fpemu.autograd's foreach functions take (a number, or one per
#: tensor; a tensor only as _foreach_add_'s step counter)
_FOREACH_REPLAYED = frozenset(
    [f"_foreach_{n}.{o}" for n in ("add_", "mul_", "div_", "addcmul_", "addcdiv_")
     for o in ("Scalar", "ScalarList")]
    + ["_foreach_add_.Tensor", "_foreach_lerp_.Scalar", "_foreach_sqrt.default",
       "_amp_foreach_non_finite_check_and_unscale_.default", "_amp_update_scale_.default"])


def _replay_foreach(r, op, args, kwargs):
    """``_foreach_*`` and ``_amp_*`` ops through fpemu.autograd's own
    (torch's names, ``fpemu/autograd/ops/foreach.py``), on fresh tensors
    holding the recorded inputs; the outputs are the tensors they wrote."""
    ft = r.ft
    name = _short(op["op"])
    if op["op"].split(".", 1)[1] not in _FOREACH_REPLAYED:
        return None
    fn = getattr(ft, name)
    vals = [r.value(a) for a in args]
    kw = {k: r.value(v) for k, v in kwargs.items()}
    if name.startswith("_amp_"):        # both write their first two arguments
        fn(*vals, **kw)
        return [vals[0], vals[1]]
    out = fn(*vals, **kw)
    return [out] if out is not None else [vals[0]]


#: the fused attention ops: (backend, index of is_causal in the forward's and
#: the backward's arguments, how many outputs the forward has, index of
#: dropout_p in the forward's and the backward's arguments)
_SDPA = {"flash_attention_for_cpu": ("FLASH_ATTENTION", 4, 7, 2, 3, 6),
         "flash_attention": ("FLASH_ATTENTION", 4, 11, 9, 3, 10),
         "efficient_attention": ("EFFICIENT_ATTENTION", 6, 11, 4, 5, 9)}


def _sdpa(r, name, A, K, grad):
    """``scaled_dot_product_attention``'s fused kernels: the forward's output
    (the log-sum-exp and the RNG state are not compared), or with ``grad``
    the gradients of q, k and v through fpemu's backward."""
    ft = r.ft
    F = ft.nn.functional
    kind = name[len("_scaled_dot_product_"):]
    kind = kind[:-len("_backward")] if grad is not None else kind
    if kind not in _SDPA:
        return None
    backend, causal_fwd, causal_bwd, n_out, drop_fwd, drop_bwd = _SDPA[kind]
    first = 1 if grad is not None else 0
    q, k, v = (r.tensor(A[first + i], grad=grad is not None) for i in range(3))
    c = causal_bwd if grad is not None else causal_fwd
    causal = bool(r.value(A[c] if len(A) > c else K.get("is_causal", {"v": False})))
    scale = r.value(K["scale"]) if "scale" in K else None
    if kind == "efficient_attention" and "t" in A[3 + first]:
        return None                                   # an attention bias: not replayed
    if "t" in K.get("attn_mask", {}):
        return None                                   # a mask: not replayed
    d = drop_bwd if grad is not None else drop_fwd
    if len(A) > d and r.value(A[d]):
        return None                                   # dropout's random draws: not replayed
    with F.sdpa_kernel([getattr(F.SDPBackend, backend)]):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    if grad is None:
        return [y] + [None] * (n_out - 1)
    out = _grads(y, grad, q, k, v)
    return out + [None] * (1 if kind == "efficient_attention" else 0)


def _replay(r, op):
    """fpemu's outputs of one recorded op (a list, one entry per recorded
    output: an array, a tensor, a list of them, or None: not compared), or
    None when fpemu has no replay of the op."""
    ft = r.ft
    F = ft.nn.functional
    name = _short(op["op"])
    A, K = op["args"], op["kwargs"]
    if name.startswith(("_foreach", "_amp_")):
        return _replay_foreach(r, op, A, K)
    args = [r.value(a) for a in A]
    kw = {k: r.value(v) for k, v in K.items()}
    red = {0: "none", 1: "mean", 2: "sum"}
    if name == "mm":
        return [ft.mm(*args)]
    if name == "bmm":
        return [ft.bmm(*args)]
    if name == "addmm":
        return [ft.addmm(*args[:3], beta=kw.get("beta", 1), alpha=kw.get("alpha", 1))]
    if name in ("add", "sub") and len(args) >= 2:
        alpha = args[2] if len(args) > 2 else kw.get("alpha", 1)     # .Scalar: positional
        return [getattr(ft, name)(args[0], args[1], alpha=alpha)]
    if name in ("mul", "div") and len(args) == 2 and not kw:
        return [getattr(ft, name)(*args)]
    if name in ("sum", "mean"):
        dims = args[1] if len(args) > 1 else kw.get("dim")
        keepdim = args[2] if len(args) > 2 else kw.get("keepdim", False)
        if dims is None or dims == []:            # over every element
            dims = list(range(args[0].ndim)) if keepdim else None
        fn = getattr(ft, name)
        return [fn(args[0], dims, keepdim, dtype=kw.get("dtype")) if dims is not None
                else fn(args[0], dtype=kw.get("dtype"))]
    if name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "reciprocal", "neg",
                "abs", "square"):
        return [getattr(ft, name)(args[0])]
    if name == "gelu":
        return [F.gelu(args[0], approximate=kw.get("approximate", "none"))]
    if name in ("_softmax", "_log_softmax"):
        fn = ft.softmax if name == "_softmax" else F.log_softmax
        return [fn(args[0], args[1], dtype=ft.float32 if args[2] else None)]
    if name == "native_layer_norm":
        x, shape, w, b, eps = args
        return [F.layer_norm(x, tuple(shape), w, b, eps), None, None]
    if name == "nll_loss_forward":
        x, target, weight, reduction, ignore = args
        return [F.nll_loss(x, target, weight, reduction=red[reduction], ignore_index=ignore),
                None]
    if name == "_to_copy" and "dtype" in kw:
        return [args[0].to(kw["dtype"])]
    if name.startswith("_scaled_dot_product_") and not name.endswith("_backward"):
        return _sdpa(r, name, A, K, None)
    # -- gradients
    if name.startswith("_scaled_dot_product_") and name.endswith("_backward"):
        return _sdpa(r, name, A, K, args[0])
    if name == "threshold_backward" and args[2] == 0:
        x = r.tensor(A[1], grad=True)
        return _grads(ft.relu(x), args[0], x)
    if name == "gelu_backward":
        x = r.tensor(A[1], grad=True)
        return _grads(F.gelu(x, approximate=kw.get("approximate", args[2] if len(args) > 2
                                                   else "none")), args[0], x)
    if name in ("_softmax_backward_data", "_log_softmax_backward_data"):
        fwd = r.forward_of(A[1])
        if fwd is None or _short(fwd["op"]) not in ("_softmax", "_log_softmax"):
            return None
        x = r.tensor(fwd["args"][0], grad=True)
        fn = ft.softmax if _short(fwd["op"]) == "_softmax" else F.log_softmax
        y = fn(x, r.value(fwd["args"][1]), dtype=ft.float32 if r.value(fwd["args"][2]) else None)
        return _grads(y, args[0], x)
    if name == "native_layer_norm_backward":
        g, _x, shape, _mean, rstd_spec, _w, _b, mask = A
        fwd = r.forward_of(rstd_spec)
        if fwd is None or _short(fwd["op"]) != "native_layer_norm":
            return None
        x = r.tensor(A[1], grad=bool(args[7][0]))
        w = r.tensor(A[5], grad=bool(args[7][1])) if "t" in A[5] else None
        b = r.tensor(A[6], grad=bool(args[7][2])) if "t" in A[6] else None
        y = F.layer_norm(x, tuple(args[2]), w, b, r.value(fwd["args"][4]))
        grads = _grads(y, args[0], x, w, b)
        return [gr if m else None for gr, m in zip(grads, args[7])]
    if name == "nll_loss_backward":
        go, _x, target, weight, reduction, ignore, _tw = args
        x = r.tensor(A[1], grad=True)
        return _grads(F.nll_loss(x, target, weight, reduction=red[reduction],
                                 ignore_index=ignore), go, x)
    return None


def _as_values(x):
    """An fpemu output as (values widened to float32 / float64, dtype name)."""
    import fpemu.autograd as ft  # needs Numba; recording runs without it
    if isinstance(x, np.ndarray):
        return x, None
    env = Env(ft, "cpu", "fpemu")
    return env.array(x), env.dtype_name(x.dtype)


def _describe_inputs(stream, op):
    parts = []

    def one(spec):
        if "t" in spec:
            m = stream.index["tensors"][spec["t"]]
            parts.append(f"{m['dtype']}{m['shape']}")
        elif "list" in spec and spec["list"] and "t" in spec["list"][0]:
            m = stream.index["tensors"][spec["list"][0]["t"]]
            parts.append(f"{len(spec['list'])} x {m['dtype']}{m['shape']}...")
    for a in op["args"]:
        one(a)
    return ", ".join(parts)


def replay_ops(path, profile, step=None, log=None, stop_at_first=False):
    """Replay the op stream at ``path`` under ``profile``; returns the
    :class:`OpResult` list (only ``step``'s ops if given)."""
    import fpemu.autograd as ft  # needs Numba; recording runs without it
    stream = OpStream(path)
    r = _Replayer(stream)
    results = []
    with ft.use_profile(profile):
        for pos, op in enumerate(stream.ops):
            if step is not None and op["step"] != step:
                continue
            res = OpResult(pos, op["op"], op["step"], op["phase"], "equal",
                           _describe_inputs(stream, op))
            try:
                with np.errstate(all="ignore"):
                    got = _replay(r, op)
            except Exception as err:            # an op fpemu raises on: say so, go on
                got = f"fpemu raised {type(err).__name__}: {err}"
            if got is None or isinstance(got, str):
                res.status = "not replayed"
                res.detail = got or "fpemu has no replay of this op"
                results.append(res)
                if log:
                    log("  " + res.line())
                continue
            for j, (g, spec) in enumerate(zip(got, op["outs"])):
                if g is None or "v" in spec:
                    continue
                gs = g if isinstance(g, list) else [g]
                ws = spec["list"] if "list" in spec else [spec]
                for jj, (gg, ww) in enumerate(zip(gs, ws)):
                    vals, _ = _as_values(gg)
                    dt = stream.dtype(ww["t"])
                    label = f"out{j}" + (f"[{jj}]" if len(ws) > 1 else "")
                    try:
                        n, u = compare_values(vals, stream.values(ww["t"]), dt)
                    except FpemuValueError as err:          # another shape: all differ
                        label, n, u = f"{label} ({err})", int(np.size(vals)), float("inf")
                    res.outputs.append((f"{label} {dt}{list(np.shape(vals))}", n,
                                        int(np.size(vals)), u))
            if any(n for _, n, _, _ in res.outputs):
                res.status = "differs"
            results.append(res)
            if log:
                log("  " + res.line())
            if stop_at_first and res.status == "differs":
                break
    return results


def first_difference(folder, name, step=None, log=print, show_all=False):
    """Replay ``<folder>/ops/<name>.npz`` under the folder's profile and
    report the first op whose output differs; returns it (an
    :class:`OpResult`) or None when every replayed op is equal.
    ``show_all`` logs every op as it is replayed."""
    meta = load_meta(folder)
    path = os.path.join(folder, OPS_DIR, f"{name}.npz")
    profile = profile_of(meta)
    if step is not None:
        recorded = OpStream(path).index["steps"]
        if step not in recorded:
            raise FpemuValueError(f"--step {step}: {path} holds steps "
                                  f"{', '.join(map(str, recorded))}; pass one of them, or "
                                  f"record step {step} with `fpemu record --ops --steps {step}`")
    results = replay_ops(path, profile, step, log=log if show_all else None)
    equal = sum(r.status == "equal" for r in results)
    skipped = [r for r in results if r.status == "not replayed"]
    first = next((r for r in results if r.status == "differs"), None)
    gpu = f" (gpu {profile.gpu})" if profile.device == "cuda" else ""
    log(f"{path}: {len(results)} ops under the profile {profile.name}{gpu}: "
        f"{equal} equal, "
        f"{sum(r.status == 'differs' for r in results)} differ, {len(skipped)} not replayed")
    if first is None:
        log("no op differs" + (" (some were not replayed)" if skipped else ""))
    else:
        log("first difference:")
        log("  " + first.line())
        before = [r for r in skipped if r.position < first.position]
        if before:
            log(f"  ({len(before)} earlier ops were not replayed: "
                f"{', '.join(sorted({_short(r.op) for r in before}))})")
    return first
