"""DistributedDataParallel's gradient all-reduce: buckets, the
communication hooks (fp16 / bf16 compression, PowerSGD)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..checks import as_format
from ..errors import FpemuNotImplementedError, FpemuValueError
from ..quantize import quantize
from ._grads import _div_, _in_the_name_of, _rank_grads, _unflatten
from .primitives import all_reduce


# ---------------------------------------------------------------------- DDP
#: DDP's bucket sizes when bucket_cap_mb is not passed: the first bucket after
#: the rebuild, then every other (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
#: and 25 MiB)
DDP_FIRST_BUCKET_BYTES = 1 << 20
DDP_BUCKET_BYTES = 25 << 20
#: DDP's communication hooks of torch.distributed.algorithms.ddp_comm_hooks
#: (the wire format of the compression hooks; PowerSGD keeps float32)
DDP_HOOKS = {None: None, "fp16_compress": "fp16", "bf16_compress": "bf16", "powerSGD": None}


class PowerSGDState:
    """The state of torch's ``powerSGD_hook`` (Vogels, Karimireddy and Jaggi,
    "PowerSGD: Practical low-rank gradient compression for distributed
    optimization", NeurIPS 2019), as
    ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState``
    holds it (torch 2.13), for :func:`ddp_all_reduce` ``(hook="powerSGD",
    state=...)``. The arguments are torch's, with its defaults.

    Per bucket and iteration from ``start_powerSGD_iter`` on (before it, the
    bucket is divided by the world size and all-reduced): each rank adds its
    error from the previous iteration (``use_error_feedback``); each gradient
    of two or more dimensions, seen as a matrix M (its first dimension by the
    rest), is compressed where ``(n + m) * rank * min_compression_rate < n * m``;
    the others are concatenated, summed and divided by the world size. For
    the compressed ones: P = M Q (Q from the previous iteration,
    ``warm_start``, else random draws), P summed over the ranks and
    orthogonalized, Q = Mᵀ P summed and divided by the world size, and M
    replaced by P Qᵀ; each rank's new error is what it had less what it gets.
    Orthogonalization: Gram-Schmidt for ranks up to 2, else a QR
    factorization (LAPACK's, in NumPy). The first Q matrices are
    ``torch.randn`` draws after ``torch.manual_seed`` of a NumPy
    ``RandomState(random_seed)`` draw, as torch makes them: PyTorch makes them
    here too (it must be installed for that).

    The products, norms and factorizations are float32 in NumPy (its BLAS and
    LAPACK), not in the order of torch's MKL, so the result follows torch's
    within float32 rounding, not bit for bit; the all-reduces are
    :func:`all_reduce`'s (``algorithm=`` of :func:`ddp_all_reduce`)."""

    def __init__(self, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                 min_compression_rate=2, use_error_feedback=True, warm_start=True,
                 orthogonalization_epsilon=0, random_seed=0):
        fname = "PowerSGDState"
        for name, v in (("matrix_approximation_rank", matrix_approximation_rank),
                        ("start_powerSGD_iter", start_powerSGD_iter),
                        ("random_seed", random_seed)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
                raise FpemuValueError(f"{fname}(): {name} must be an int >= 0, got {v!r}")
        if matrix_approximation_rank < 1:
            raise FpemuValueError(f"{fname}(): matrix_approximation_rank must be >= 1, got "
                                  f"{matrix_approximation_rank}")
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise FpemuValueError(
                f"{fname}(): start_powerSGD_iter must be > 1 with use_error_feedback or "
                f"warm_start (torch's rule: PowerSGD starts after DDP's first two iterations, "
                f"which rebuild the buckets); got {start_powerSGD_iter}")
        self.matrix_approximation_rank = int(matrix_approximation_rank)
        self.start_powerSGD_iter = int(start_powerSGD_iter)
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.iter = 0
        self.error = {}          # bucket index -> (world, n) float32, each rank's error
        self.p_memory = {}
        self.q_memory = {}

    def _random_qs(self, shapes):
        """torch's first Q matrices: ``torch.randn`` of each shape in turn
        after ``torch.manual_seed(rng.randint(1_000_000_000))``, on the CPU."""
        seed = self.rng.randint(1_000_000_000)
        try:
            import torch            # local: torch is optional, needed for these draws only
        except ImportError as err:
            raise ImportError(
                "PowerSGDState: the first Q matrices are torch.randn draws (torch.manual_seed of "
                "a NumPy RandomState draw); emulating them needs PyTorch: pip install torch"
            ) from err
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return [torch.randn(*s, dtype=torch.float32).numpy() for s in shapes]


def _orthogonalize(m, epsilon):
    """torch's ``_orthogonalize`` of one float32 matrix (n x rank), in place:
    Gram-Schmidt for rank <= 2, else the Q of a QR factorization."""
    rank = m.shape[1]
    if rank > 2:
        m[:] = np.linalg.qr(m)[0]
        return
    for i in range(rank):
        col = m[:, i:i + 1]
        norm = np.float32(np.sqrt(np.sum(col.astype(np.float64) ** 2)))
        with np.errstate(divide="ignore", invalid="ignore"):
            col /= norm + np.float32(epsilon) if epsilon else norm
        if not epsilon and norm == 0:
            col[:] = 0                                 # torch fills a zero column with 0
        if i + 1 < rank:
            rest = m[:, i + 1:]
            rest -= np.sum(col * rest, axis=0, keepdims=True, dtype=np.float32) * col


def _powersgd_bucket(state, index, flat, shapes, algorithm, params):
    """One bucket through ``powerSGD_hook``: ``flat`` (world, n) float32, the
    ranks' bucket buffers (gradients of ``shapes``, end to end). Returns the
    reduced buffer (the same on every rank)."""
    world = flat.shape[0]
    if state.iter < state.start_powerSGD_iter:           # default.allreduce_hook
        return all_reduce(_div_(flat, world, "fp32").reshape(world, -1), "fp32", "sum",
                          algorithm, **params)[0]
    flat = flat.astype(np.float32)
    if state.use_error_feedback:
        if index in state.error:
            flat = (flat + state.error[index]).astype(np.float32)
        else:
            state.error[index] = np.zeros_like(flat)
    local = flat.copy()
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in shapes])
    compress, plain = [], []
    for i, s in enumerate(shapes):
        n = s[0] if len(s) else 1
        m = int(np.prod(s)) // n if n else 0
        r = min(n, m, state.matrix_approximation_rank)
        (compress if (n + m) * r * state.min_compression_rate < n * m else plain).append(
            (i, n, m, r))
    # the uncompressed gradients: concatenated, summed, divided
    if plain:
        cat = np.concatenate([flat[:, offsets[i]:offsets[i + 1]] for i, *_ in plain], axis=1)
        avg = _div_(all_reduce(cat, "fp32", "sum", algorithm, **params)[0], world, "fp32")
        at = 0
        for i, *_ in plain:
            k = offsets[i + 1] - offsets[i]
            flat[:, offsets[i]:offsets[i + 1]] = avg[at:at + k]
            at += k
    # the compressed ones grouped by shape, in the order torch's dict of shapes takes them
    groups = {}
    for c in compress:
        groups.setdefault((c[1], c[2]), []).append(c)
    compress = [c for g in groups.values() for c in g]
    if compress:
        fresh = not state.warm_start or index not in state.q_memory
        if fresh:
            qs = state._random_qs([(1, m, r) for _, _, m, r in compress])
            qs = [q[0].astype(np.float32) for q in qs]
        else:
            qs = state.q_memory[index]
        for q in qs:
            _orthogonalize(q, state.orthogonalization_epsilon)
        mats = [flat[:, offsets[i]:offsets[i + 1]].reshape(world, n, m)
                for i, n, m, _ in compress]
        ps = np.concatenate([np.stack([mt[r] @ q for r in range(world)]).reshape(world, -1)
                             for mt, q in zip(mats, qs)], axis=1)
        p_sum = all_reduce(ps, "fp32", "sum", algorithm, **params)[0]
        p_list, at = [], 0
        for _, n, _, r in compress:
            p = np.array(p_sum[at:at + n * r], np.float32).reshape(n, r)
            _orthogonalize(p, state.orthogonalization_epsilon)
            p_list.append(p)
            at += n * r
        qs_local = np.concatenate([np.stack([mt[r].T @ p for r in range(world)]).reshape(world, -1)
                                   for mt, p in zip(mats, p_list)], axis=1)
        q_avg = _div_(all_reduce(qs_local, "fp32", "sum", algorithm, **params)[0], world,
                      "fp32")
        q_list, at = [], 0
        for (i, n, m, r), p in zip(compress, p_list):
            q = np.array(q_avg[at:at + m * r], np.float32).reshape(m, r)
            q_list.append(q)
            at += m * r
            flat[:, offsets[i]:offsets[i + 1]] = (p @ q.T).reshape(-1)
        state.q_memory[index] = [q.copy() for q in q_list]
    if state.use_error_feedback:
        state.error[index] = (local - flat).astype(np.float32)
    if not state.warm_start:
        state.q_memory.clear()
    return flat[0]


def ddp_buckets(sizes, element_bytes, iteration, ready_order=None,
                bucket_cap_bytes=DDP_BUCKET_BYTES, first_bucket_bytes=DDP_FIRST_BUCKET_BYTES):
    """DDP's buckets: lists of parameter indices, in bucket order.

    ``sizes``: the parameters' element counts, in registration order. The
    first iteration that all-reduces (``iteration=0``) puts every parameter
    in one bucket in registration order (torch 2.13 starts with one bucket
    where ``find_unused_parameters`` is off). From the next on, the buckets
    are rebuilt in the order the gradients became ready in that first
    backward (``ready_order``, default the reverse of registration, which is
    the order of a chain of layers): parameters join the current bucket until
    it holds at least ``first_bucket_bytes`` (the first bucket) or
    ``bucket_cap_bytes`` (the others)."""
    n = len(sizes)
    if iteration == 0:
        return [list(range(n))]
    order = list(range(n))[::-1] if ready_order is None else list(ready_order)
    if sorted(order) != list(range(n)):
        raise FpemuValueError(f"ddp_buckets(): ready_order must be an order of the parameters "
                              f"0 .. {n - 1} (each once), got {ready_order!r}")
    buckets, cur, size = [], [], 0
    for i in order:
        cur.append(i)
        size += int(sizes[i]) * element_bytes
        if size >= (first_bucket_bytes if not buckets else bucket_cap_bytes):
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


@_in_the_name_of("ddp_all_reduce")
def ddp_all_reduce(grads, fmt, algorithm="gloo", *, iteration=1, hook=None, ready_order=None,
                   bucket_cap_mb=None, state=None, **params):
    """The gradients every rank holds after DDP's backward: ``grads[r][i]`` is
    rank ``r``'s local gradient of parameter ``i`` (registration order), of
    the parameters' dtype ``fmt`` (fp32, bf16 or fp16).

    Without a hook, DDP multiplies each gradient by 1 / world as it copies it
    into its bucket (a float32 product, then the gradient's dtype) and sums
    each bucket with an all-reduce. With ``hook="fp16_compress"`` or
    ``"bf16_compress"`` (torch's ``default_hooks``) it casts the bucket to that
    dtype, divides by the world size there (float32 division, then that
    dtype), sums it in that dtype and casts back. With ``hook="powerSGD"``
    (float32 gradients) ``state`` is a :class:`PowerSGDState` that carries
    each rank's error and the Q matrices from one call (one backward) to the
    next. Buckets: :func:`ddp_buckets` (``iteration=0`` is the first
    all-reducing backward). ``bucket_cap_mb`` as DDP takes it: ``None`` (not
    passed) gives buckets of 25 MiB after a first one of 1 MiB; a number,
    even 25, makes every bucket that size, the first too. ``params`` go to
    the all-reduce (``algorithm`` and its parameters, see :func:`all_reduce`).

    Returns the reduced gradients, one float32 array per parameter.
    """
    fname = "ddp_all_reduce"
    fmt = as_format(fmt)
    if fmt.name not in ("fp32", "bf16", "fp16"):
        raise FpemuValueError(f"{fname}(): DDP's gradients are fp32, bf16 or fp16 tensors, "
                              f"got {fmt.name}")
    if hook not in DDP_HOOKS:
        raise FpemuValueError(f"{fname}(): unknown hook {hook!r}; the hooks are "
                              f"{', '.join(map(repr, DDP_HOOKS))}")
    world, ranks, shapes = _rank_grads(grads, fname)
    if isinstance(iteration, bool) or not isinstance(iteration, numbers.Integral) or iteration < 0:
        raise FpemuValueError(f"{fname}(): iteration must be an int >= 0, got {iteration!r}")
    if bucket_cap_mb is None:           # DDP's default: 25 MiB after a first bucket of 1 MiB
        cap, first = DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES
    elif (isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, numbers.Real)
          or not 0 < bucket_cap_mb < math.inf):
        raise FpemuValueError(f"{fname}(): bucket_cap_mb must be a number > 0 (or None, DDP's "
                              f"default), got {bucket_cap_mb!r}")
    else:                               # passed, even as 25: the first bucket too
        cap = first = int(bucket_cap_mb * (1 << 20))
    elem = fmt.bits // 8
    buckets = ddp_buckets([int(np.prod(s)) for s in shapes], elem, iteration, ready_order,
                          cap, first)
    if (hook == "powerSGD") != isinstance(state, PowerSGDState):
        raise FpemuValueError(
            f"{fname}(): hook='powerSGD' takes state=PowerSGDState(...) (and only it takes a "
            f"state); got hook={hook!r}, state={type(state).__name__}")
    if hook == "powerSGD" and fmt.name != "fp32":
        raise FpemuNotImplementedError(f"{fname}(): PowerSGD is modelled for float32 gradients, "
                                       f"got {fmt.name}")
    wire = DDP_HOOKS[hook]
    out = [None] * len(shapes)
    if hook == "powerSGD":
        for index, b in enumerate(buckets):
            flat = np.stack([np.concatenate([quantize(ranks[r][i].reshape(-1), fmt) for i in b])
                             for r in range(world)])
            _unflatten(_powersgd_bucket(state, index, flat, [shapes[i] for i in b], algorithm,
                                        params), b, shapes, out)
        state.iter += 1
        return out
    for b in buckets:
        flat = np.stack([np.concatenate([quantize(ranks[r][i].reshape(-1), fmt) for i in b])
                         for r in range(world)])
        if wire is None:
            inv = np.float64(np.float32(1.0 / world))
            flat = quantize(quantize(flat.astype(np.float64) * inv, "fp32"), fmt)
            summed = all_reduce(flat.reshape(world, -1), fmt, "sum", algorithm, **params)[0]
        else:
            c = quantize(flat, wire).astype(np.float64)
            c = _div_(c, world, wire)
            summed = quantize(all_reduce(c.reshape(world, -1), wire, "sum", algorithm,
                                         **params)[0], fmt)
        _unflatten(summed, b, shapes, out)
    return out
