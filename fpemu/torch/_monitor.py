"""The monitor: hooks on a real torch model, exact counts per module, kind, format, step.

:class:`Monitor` is made of its settings (here), its hooks
(:mod:`._monitor_hooks`), its counting (:mod:`._monitor_count`, with the
scalings of :mod:`._monitor_scaling`) and its results
(:mod:`._monitor_results`); the records are :mod:`._monitor_records`.
:func:`run_script` runs a training script under it (:mod:`._hooked_script`).
"""

from __future__ import annotations

import math
import warnings

from ..errors import FpemuTypeError, FpemuValueError
from ..checks import as_format
from ..tensorfiles import check_output_dir
from ._hooked_script import _check_script, run_hooked
from ._import import torch_module
from ._monitor_count import _Counting
from ._monitor_hooks import _Hooks
from ._monitor_records import (  # noqa: F401  (re-exported)
    KINDS, FirstOverflow, Record, _merge_ranks, _policy,
)
from ._monitor_results import _Results
from ._monitor_scaling import SCALINGS

DEFAULT_FORMATS = ("fp16", "bf16", "e4m3fn", "e5m2")
_CHUNK = 1 << 22


def _check_choice(name, value, allowed):
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values:
        raise FpemuValueError(f"monitor(): {name} is empty; pass one or more of "
                              f"{', '.join(allowed)}")
    for v in values:
        if v not in allowed:
            raise FpemuValueError(f"monitor(): unknown {name[:-1] if name.endswith('s') else name}"
                                  f" {v!r}; choose from {', '.join(allowed)}")
    return values


class Monitor(_Hooks, _Counting, _Results):
    """Counts what each what-if format does to a torch model's tensors, step by step.

    Parameters
    ----------
    model : torch.nn.Module
        The model; every leaf module and every module with parameters of its
        own is watched.
    optimizer : torch.optim.Optimizer, optional
        Its state (Adam's ``exp_avg`` and ``exp_avg_sq``) is counted after
        each step.
    formats : sequence of str
        The what-if formats.
    scaling : str or sequence of str
        ``"none"`` (the values as they are); ``"loss_scale"`` (gradients
        times the scaler's scale, or ``loss_scale``); ``"current"`` (per tensor,
        ``max / amax / 2**margin`` in float32, TransformerEngine's current
        scaling); ``"delayed"`` (the same from the largest amax of the last
        ``history`` steps, TransformerEngine's delayed scaling, scale 1 at the
        first step); ``"mx"`` (one power-of-two E8M0 scale per ``block``
        values along the last dimension, OCP MX's rule
        ``2**(floor(log2 amax) - emax)``); ``"nvfp4"`` (TransformerEngine's
        NVFP4 rule with the format's maximum in place of E2M1's 6: an fp32
        tensor scale ``448 * max / amax``, then an E4M3 scale per 16 values
        of the last dimension; for ``e2m1`` this is NVFP4 as
        :mod:`fpemu.block` computes it, before the clamp to ±6; infinities
        and NaNs set no scale).
    every : int
        Count every ``every``-th step.
    sample : int, optional
        Count a seeded uniform sample of this many elements of each larger
        tensor (the rows say so); exact counts of the sample.
    scaler : torch.amp.GradScaler, optional
        Gradients captured during a scaled backward pass are unscaled by its
        scale (exact: a power of two) and ``"loss_scale"`` reads it.
    kinds : sequence of str
        A subset of :data:`KINDS`.
    count_on : str
        Where the counting runs: ``"auto"`` (the default: on the tensor's
        device for GPU tensors, with :func:`fpemu.torch.stats`, so that only
        the count vectors come back; on the host, with fpemu's kernels, for
        CPU tensors, where those are faster), ``"device"`` or ``"host"``.
        The counts are the same either way.

    A step is one training iteration: it ends when the next forward pass of
    ``model`` starts after a backward pass. Use it as a context manager
    (:func:`monitor`), or call :meth:`start` and :meth:`stop`.

    Under ``torch.distributed`` each rank counts its own tensors (a DDP
    model is watched through its ``module``; a DTensor parameter, gradient
    or optimizer moment of FSDP2 as its local shard) and :meth:`gather` /
    :meth:`report` merge the ranks' counts on rank 0. The only collective
    within the steps is for a sharded tensor under a scaling that needs its
    amax (``current``, ``delayed``, ``nvfp4``) or a sample: one MAX
    all-reduce of a scalar per tensor and recorded step, so that the shard
    is scaled by the whole tensor's amax.
    """

    def __init__(self, model, optimizer=None, formats=DEFAULT_FORMATS, scaling="none", every=1,
                 sample=None, seed=0, scaler=None, loss_scale=None, margin=0, history=16,
                 block=32, kinds=KINDS, chunk=_CHUNK, count_on="auto"):
        torch = torch_module()
        if not isinstance(model, torch.nn.Module):
            raise FpemuTypeError(f"monitor(): model must be a torch.nn.Module, got "
                                 f"{type(model).__name__}; pass the model you train")
        ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
        if ddp is not None and isinstance(model, ddp):
            model = model.module    # DDP's wrapper: the layers (and their names) are its module's
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise FpemuTypeError(f"monitor(): optimizer must be a torch.optim.Optimizer, got "
                                 f"{type(optimizer).__name__}")
        if isinstance(formats, str):
            formats = (formats,)
        self.formats = tuple(as_format(f).name for f in formats)
        if not self.formats:
            raise FpemuValueError("monitor(): formats is empty; pass e.g. ('fp16', 'bf16')")
        self.scalings = _check_choice("scaling", scaling, SCALINGS)
        self.kinds = _check_choice("kinds", kinds, KINDS)
        for name, v, lo in (("every", every, 1), ("history", history, 1), ("block", block, 1),
                            ("chunk", chunk, 1), ("margin", margin, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise FpemuValueError(f"monitor(): {name} must be an int >= {lo}, got {v!r}")
        if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)
                                   or sample < 1):
            raise FpemuValueError(f"monitor(): sample must be None or an int >= 1, got "
                                  f"{sample!r}")
        if "loss_scale" in self.scalings and scaler is None and loss_scale is None:
            raise FpemuValueError("monitor(): scaling='loss_scale' needs the scale: pass "
                                  "scaler=your GradScaler or loss_scale=2.0**16")
        if loss_scale is not None and not (isinstance(loss_scale, (int, float))
                                           and loss_scale > 0 and math.isfinite(loss_scale)):
            raise FpemuValueError(f"monitor(): loss_scale must be a finite number > 0, got "
                                  f"{loss_scale!r}")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.every, self.sample, self.seed = every, sample, seed
        self.loss_scale, self.margin, self.history, self.block = loss_scale, margin, history, block
        self.chunk = chunk
        if count_on not in ("auto", "device", "host"):
            raise FpemuValueError(f"monitor(): count_on must be 'auto', 'device' or 'host', "
                                  f"got {count_on!r}")
        self.count_on = count_on
        self.records = []          # this rank's; after gather() on rank 0, the whole job's
        self._own = self.records
        self.rank, self.world = 0, 1
        self.rank_records = None   # after gather() on rank 0: {rank: that rank's records}
        self.step = 0
        self._seq = 0
        self._saw_backward = False
        self._handles = []
        self._trace = {}                     # step -> [(phase, module)] in execution order
        self._amax_hist = {}                 # (module, kind, format) -> deque of amaxes
        self._names = {}
        self._owner = {}
        self._running = False
        self._warned_meta = False
        self.script_error = None
        self.script_exit = None
        self.report_path = None     # where run_script's report went (None on ranks > 0)


def monitor(model, optimizer=None, **kwargs) -> Monitor:
    """A :class:`Monitor` for ``with`` blocks: ``with monitor(model, opt) as mon: ...``."""
    return Monitor(model, optimizer, **kwargs)


# -- the CLI's way in: watch(), and the first optimizer of a script ----------------------

_PENDING = {}      # the settings of `fpemu monitor`, while a script runs under it
_ACTIVE = []


def watch(model, optimizer=None, **kwargs) -> Monitor:
    """Start monitoring ``model`` now and return the monitor.

    Under ``fpemu monitor SCRIPT.py`` this is how a script names its model
    (the command's settings apply, and its report is written when the script
    ends); elsewhere it starts a :class:`Monitor` with ``kwargs`` that runs
    until its ``stop()``.
    """
    settings = {**_PENDING.get("settings", {}), **kwargs}
    mon = Monitor(model, optimizer, **settings).start()
    _ACTIVE.append(mon)
    return mon


def run_script(path, argv=(), out="fpemu-monitor", reraise=True, **settings):
    """Run a training script under the monitor and write the report to ``out``.

    The model is the one the script passes to :func:`watch`, or else the module
    that owns the parameters of the first optimizer the script creates (that
    optimizer's state is counted too). Returns the :class:`Monitor` (``None`` if
    the script created neither).
    """
    torch = torch_module()
    _check_script(path, "monitor")
    Monitor(torch.nn.Linear(1, 1), **settings)           # check the settings before running
    check_output_dir(out, "report folder")               # and where the report goes
    _PENDING["settings"] = dict(settings)
    _ACTIVE.clear()
    dist = torch.distributed
    real_destroy = dist.destroy_process_group if dist.is_available() else None

    def destroy(group=None, *args, **kwargs):
        # a torchrun script's last line: merge the ranks' counts while the group lives
        if group is None:
            for m in _ACTIVE:
                try:
                    m.gather()
                except Exception as err:    # reported by report() below
                    warnings.warn(f"fpemu monitor: the ranks' counts could not be merged "
                                  f"({type(err).__name__}: {err})", stacklevel=2)
        return real_destroy(group, *args, **kwargs)

    if real_destroy is not None:
        dist.destroy_process_group = destroy
    try:
        # sys.exit(n), or a run that dies (of a NaN, say): the report is written all the same
        error, exit_code = run_hooked(path, argv, watch, lambda: bool(_ACTIVE))
    finally:
        if real_destroy is not None:
            dist.destroy_process_group = real_destroy
        _PENDING.clear()
        for mon in _ACTIVE:
            mon.stop()
    mon = _ACTIVE[0] if _ACTIVE else None
    if mon is not None:
        mon.script_error = error
        mon.script_exit = exit_code
        # every rank calls it: rank 0 writes the job's report, the others None
        mon.report_path = mon.report(out)
    if error is not None and (reraise or mon is None):
        raise error
    return mon
