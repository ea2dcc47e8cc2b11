"""fpemu.loss_scaling against the frameworks' own scalers, step by step.

* Megatron-core's ``DynamicGradScaler`` is the real class of megatron-core
  0.16.1 (the ``dev`` extra installs it), its module loaded from the
  installed file alone (not megatron.core's package, which imports far more)
  and run on the CPU: the module's ``torch`` is torch with ``device="cuda"``
  dropped from ``torch.tensor``.
* APEX amp's ``LossScaler`` is transcribed below from ``apex/amp/scaler.py``
  (``update_scale``, NVIDIA/apex master); APEX itself needs CUDA to build.

The overflow patterns are seeded random sequences with bursts (runs of
overflows longer than the hysteresis, long clean runs that reach the growth
interval) and the settings cover non-power-of-two factors, where Megatron's
float32 products round.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import types

import numpy as np
import pytest

from fpemu.errors import FpemuTypeError, FpemuValueError
from fpemu.loss_scaling import ApexLossScaler, MegatronGradScaler

torch = pytest.importorskip("torch")


def _megatron_module():
    """megatron/core/optimizer/grad_scaler.py of the installed megatron-core,
    with its tensors on the CPU."""
    try:
        dist = importlib.metadata.distribution("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("megatron-core is not installed: make venv installs the dev extra "
                    "(megatron-core==0.16.1)")
    path = dist.locate_file("megatron/core/optimizer/grad_scaler.py")
    spec = importlib.util.spec_from_file_location("_megatron_grad_scaler", path)
    mod = importlib.util.module_from_spec(spec)
    shim = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                    if not k.startswith("__")})

    def tensor(data, *args, device=None, **kwargs):
        assert device in (None, "cuda")            # Megatron puts its scalars on the GPU
        return torch.tensor(data, *args, **kwargs)
    shim.tensor = tensor
    mod.torch = shim
    spec.loader.exec_module(mod)
    mod.torch = shim               # (exec_module's `import torch` rebinds it)
    return mod, dist.version


def _patterns(seed, n=400):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        kind = rng.integers(0, 4)
        if kind == 0:
            out += [True] * int(rng.integers(1, 6))          # a burst of overflows
        elif kind == 1:
            out += [False] * int(rng.integers(20, 60))        # a clean run
        else:
            out += list(rng.random(int(rng.integers(5, 20))) < 0.3)
    return [bool(v) for v in out[:n]]


MEGATRON_SETTINGS = [
    dict(initial_scale=2.0 ** 32, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
         growth_interval=1000, hysteresis=2),                        # Megatron's defaults
    dict(initial_scale=2.0 ** 16, min_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5,
         growth_interval=7, hysteresis=1),
    dict(initial_scale=65536.0, min_scale=3.0, growth_factor=1.7, backoff_factor=0.3,
         growth_interval=5, hysteresis=3),                           # float32 products round
    dict(initial_scale=1000.0, min_scale=1e-3, growth_factor=1.1, backoff_factor=0.9,
         growth_interval=3, hysteresis=2),
]


@pytest.mark.parametrize("settings", MEGATRON_SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_megatron_scaler_equals_megatron_cores_dynamic_grad_scaler(settings, seed):
    mod, version = _megatron_module()
    assert version == "0.16.1"
    real = mod.DynamicGradScaler(**settings)
    ours = MegatronGradScaler(**settings)
    changed = 0
    for i, found_inf in enumerate(_patterns(seed)):
        before = ours.scale
        real.update(found_inf)
        skip = ours.update(found_inf)
        assert skip == found_inf
        want = real.scale.numpy().view(np.uint32)[0]
        got = np.float32(ours.scale).view(np.uint32)
        assert got == want, (i, ours.scale, float(real.scale))
        assert (ours._growth_tracker, ours._hysteresis_tracker) == (
            real._growth_tracker, real._hysteresis_tracker), i
        assert np.float32(ours.inv_scale).view(np.uint32) == \
            real.inv_scale.numpy().view(np.uint32)[0]
        changed += ours.scale != before
    assert changed >= 3                     # the pattern moved the scale both ways


def _apex_transcription(loss_scale="dynamic", init_scale=2.0 ** 16, scale_window=2000,
                        min_loss_scale=None, max_loss_scale=2.0 ** 24):
    """apex/amp/scaler.py's LossScaler state and update_scale(), transcribed
    (its overflow flag set by the unscale step before)."""
    st = {"dynamic": loss_scale == "dynamic",
          "scale": min(max_loss_scale, init_scale) if loss_scale == "dynamic" else loss_scale,
          "unskipped": 0}

    def update_scale(has_overflow):
        if has_overflow and st["dynamic"]:
            should_skip = True
            if min_loss_scale:
                st["scale"] = max(min_loss_scale, st["scale"] / 2.)
            else:
                st["scale"] = st["scale"] / 2.
            st["unskipped"] = 0
        else:
            should_skip = False
            st["unskipped"] += 1
        if st["unskipped"] == scale_window and st["dynamic"]:
            st["scale"] = min(max_loss_scale, st["scale"] * 2.)
            st["unskipped"] = 0
        return should_skip
    return st, update_scale


APEX_SETTINGS = [
    dict(),                                                   # amp's defaults
    dict(init_scale=2.0 ** 20, scale_window=9, max_loss_scale=2.0 ** 21),
    dict(init_scale=2.0 ** 3, scale_window=40, min_loss_scale=0.25),
    dict(init_scale=2.0 ** 3, scale_window=40, min_loss_scale=0),     # 0: no floor
    dict(loss_scale=128.0, scale_window=5),                   # static
    dict(init_scale=2.0 ** 30, scale_window=7),               # starts at max_loss_scale, 2**24
]


@pytest.mark.parametrize("settings", APEX_SETTINGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_apex_scaler_equals_a_transcription_of_apex_amp(settings, seed):
    st, update_scale = _apex_transcription(**settings)
    ours = ApexLossScaler(**settings)
    for i, found_inf in enumerate(_patterns(seed)):
        want_skip = update_scale(found_inf)
        assert ours.update(found_inf) == want_skip, i
        assert ours.scale == st["scale"] and ours._unskipped == st["unskipped"], i


def test_the_scalers_differ_where_a_run_overflows():
    """Two overflows in a row, then clean steps: APEX halves twice, Megatron
    (hysteresis 2) once; both skip both steps."""
    apex, meg = ApexLossScaler(init_scale=2.0 ** 16), MegatronGradScaler(initial_scale=2.0 ** 16)
    assert [apex.update(True), apex.update(True)] == [True, True]
    assert [meg.update(True), meg.update(True)] == [True, True]
    assert (apex.scale, meg.scale) == (2.0 ** 14, 2.0 ** 15)
    # APEX's floor: none unless given; Megatron's: its minimum
    low = ApexLossScaler(init_scale=1.0)
    for _ in range(200):
        low.update(True)
    assert 0 < low.scale < 1e-50
    m = MegatronGradScaler(initial_scale=4.0, min_scale=1.0, hysteresis=1)
    for _ in range(5):
        assert m.update(True)
    assert m.scale == 1.0
    # APEX's static scale skips nothing, even an overflow
    assert ApexLossScaler(loss_scale=8.0).update(True) is False


def test_state_dicts_round_trip():
    for cls, kw in ((MegatronGradScaler, dict(growth_interval=3)),
                    (ApexLossScaler, dict(scale_window=3))):
        a = cls(**kw)
        for v in (True, False, False, True, False):
            a.update(v)
        b = cls(**kw)
        b.load_state_dict(a.state_dict())
        for v in (False, False, False, True, False, False, False):
            assert a.update(v) == b.update(v) and a.scale == b.scale


def test_bad_settings_are_named():
    with pytest.raises(FpemuValueError, match=r"min_scale must be > 0 and <= initial_scale"):
        MegatronGradScaler(initial_scale=1.0, min_scale=2.0)
    with pytest.raises(FpemuValueError, match=r"growth_factor must be > 1, got 1.0"):
        MegatronGradScaler(growth_factor=1.0)
    with pytest.raises(FpemuValueError, match=r"backoff_factor must be in \(0, 1\)"):
        MegatronGradScaler(backoff_factor=1.5)
    with pytest.raises(FpemuValueError, match=r"hysteresis must be an int >= 1, got 0"):
        MegatronGradScaler(hysteresis=0)
    with pytest.raises(FpemuTypeError, match=r"init_scale must be a number, got str"):
        ApexLossScaler(init_scale="big")
    with pytest.raises(FpemuValueError, match=r"the scale must be > 0"):
        ApexLossScaler(loss_scale=0.0)
    with pytest.raises(FpemuValueError, match=r"init_scale must be finite"):
        ApexLossScaler(init_scale=float("inf"))
    with pytest.raises(FpemuValueError, match=r"max_loss_scale must be > 0, got 0.0"):
        ApexLossScaler(max_loss_scale=0)
    with pytest.raises(FpemuValueError, match=r"min_loss_scale must be >= 0 .* got -1.0"):
        ApexLossScaler(min_loss_scale=-1)
    with pytest.raises(FpemuValueError, match=r"min_loss_scale=1024.0 is above the starting "
                                              r"scale 8.0"):
        ApexLossScaler(init_scale=8.0, min_loss_scale=1024.0)
    with pytest.raises(FpemuValueError, match=r"the scale must be > 0, got init_scale=-2.0"):
        ApexLossScaler(init_scale=-2.0)


def test_apex_starts_at_the_smaller_of_init_and_max_scale():
    # apex/amp/scaler.py: self._loss_scale = min(max_loss_scale, init_scale)
    assert ApexLossScaler(init_scale=2.0 ** 30).scale == 2.0 ** 24
    assert ApexLossScaler(init_scale=2.0 ** 30, max_loss_scale=2.0 ** 10).scale == 2.0 ** 10
    assert ApexLossScaler(init_scale=2.0 ** 5).scale == 2.0 ** 5
