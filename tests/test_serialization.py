"""``torch.serialization`` in fpemu.autograd: weights-only loading by default
and its allowlist, side by side with torch 2.13's own behaviour."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

import fpemu
import fpemu.autograd as ft

import torch  # installed by `make` (the dev extras): the reference behaviour

FN = ft.nn


class TinyNet(FN.Module):
    def __init__(self):
        super().__init__()
        self.emb = FN.Embedding(7, 4)
        self.rnn = FN.GRU(4, 4, batch_first=True)
        self.head = FN.ModuleList([FN.Linear(4, 3)])

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head[0](h)


class TorchTinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(7, 4)
        self.rnn = torch.nn.GRU(4, 4, batch_first=True)
        self.head = torch.nn.ModuleList([torch.nn.Linear(4, 3)])


def _saved(lib, obj):
    buf = io.BytesIO()
    lib.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.fixture(autouse=True)
def _clean_allowlist():
    before = ft.serialization.get_safe_globals()
    yield
    ft.serialization.clear_safe_globals()
    ft.serialization.add_safe_globals(before)


def test_checkpoint_dict_round_trip_bit_for_bit():
    ft.manual_seed(0)
    model = TinyNet()
    opt = ft.optim.AdamW(model.parameters(), lr=1e-2)
    sched = ft.optim.lr_scheduler.StepLR(opt, 2)
    scaler = ft.amp.GradScaler("cuda")
    model(ft.tensor([[1, 2, 3]])).sum().backward()
    opt.step()
    sched.step()
    odd = ft.tensor([1.0, -0.0, float("nan"), 3.0], dtype=ft.bfloat16)
    custom = ft.tensor([0.25, 1.5]).to(fpemu.Format.custom(3, 2, bias=5))
    ck = {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
          "scaler": scaler.state_dict(), "epoch": 3, "odd": odd, "scalar": ft.tensor(2.5),
          "custom": custom, "size": ft.Size([2, 3]), "dev": ft.device("cuda", 0),
          "dtype": ft.float8_e4m3fn, "set": {1, 2}, "ints": ft.arange(5)}
    back = ft.load(_saved(ft, ck))                           # weights_only=True, the default
    for k, v in model.state_dict().items():
        assert back["model"][k].dtype is v.dtype
        np.testing.assert_array_equal(back["model"][k].numpy().view(np.uint32),
                                      v.numpy().view(np.uint32))
    state = back["opt"]["state"][0]
    assert state["step"].ndim == 0 and state["step"].item() == 1.0
    assert back["odd"].dtype is ft.bfloat16
    np.testing.assert_array_equal(back["odd"].numpy().view(np.uint32),
                                  odd.numpy().view(np.uint32))          # -0 and NaN kept
    assert back["scalar"].ndim == 0 and back["scalar"].item() == 2.5
    assert back["custom"].dtype == custom.dtype and back["custom"].tolist() == [0.25, 1.5]
    assert back["size"] == ft.Size([2, 3]) and back["dev"] == ft.device("cuda", 0)
    assert back["dtype"] is ft.float8_e4m3fn and back["set"] == {1, 2}
    assert back["ints"].dtype is ft.int64 and back["ints"].tolist() == [0, 1, 2, 3, 4]
    assert back["sched"] == sched.state_dict() and back["scaler"] == scaler.state_dict()


def test_parameters_stay_parameters_and_lose_their_grad():
    p = FN.Parameter(ft.ones(3))
    p.grad = ft.ones(3)
    q = ft.load(_saved(ft, p))
    assert isinstance(q, FN.Parameter) and q.requires_grad and q.grad is None
    t = torch.nn.Parameter(torch.ones(3))
    t.grad = torch.ones(3)
    assert torch.load(_saved(torch, t)).grad is None                 # as torch


def test_a_whole_module_needs_its_classes_allowlisted_as_in_torch():
    for lib, net in ((torch, TorchTinyNet), (ft, TinyNet)):
        buf = _saved(lib, net())
        with pytest.raises(pickle.UnpicklingError) as err:
            lib.load(buf)
        text = str(err.value)
        assert "Weights only load failed" in text
        assert f"Unsupported global: GLOBAL {__name__}.{net.__name__} was not an allowed " \
               f"global by default" in text
        assert "add_safe_globals" in text and "`weights_only`" in text
    # what torch needs, fpemu needs: the same list, spelled through the library
    for lib, net in ((torch, TorchTinyNet), (ft, TinyNet)):
        buf = _saved(lib, net())
        names = [net, lib.nn.modules.sparse.Embedding, lib.nn.modules.rnn.GRU,
                 lib.nn.modules.container.ModuleList, lib.nn.modules.linear.Linear]
        assert sorted(g.rsplit(".", 1)[-1] for g in
                      lib.serialization.get_unsafe_globals_in_checkpoint(buf)) == \
            sorted(n.__name__ for n in names)
        buf.seek(0)
        with lib.serialization.safe_globals(names):
            loaded = lib.load(buf)
        assert type(loaded) is net
        assert net not in lib.serialization.get_safe_globals()
    buf = _saved(ft, TinyNet())
    ft.serialization.add_safe_globals([TinyNet, FN.Embedding, FN.GRU, FN.ModuleList, FN.Linear])
    assert isinstance(ft.load(buf), TinyNet)
    ft.serialization.clear_safe_globals()
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        ft.load(buf)
    buf.seek(0)
    assert isinstance(ft.load(buf, weights_only=False), TinyNet)


def test_a_loaded_module_computes_the_same_bits():
    ft.manual_seed(4)
    m = TinyNet()
    x = ft.tensor([[1, 5, 2, 6]])
    with ft.serialization.safe_globals([TinyNet, FN.Embedding, FN.GRU, FN.ModuleList,
                                        FN.Linear]):
        m2 = ft.load(_saved(ft, m))
    np.testing.assert_array_equal(m2(x).detach().numpy(), m(x).detach().numpy())


def test_blocked_modules_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            import os
            return (os.system, (f"touch {marker}",))
    data = pickle.dumps({"w": Evil()}, protocol=2)
    import os
    ft.serialization.add_safe_globals([os.system])       # even allowlisted: blocked
    with pytest.raises(pickle.UnpicklingError, match=r"module (posix|os|nt) is blocked"):
        ft.load(io.BytesIO(data))
    with pytest.raises(pickle.UnpicklingError, match="GLOBAL eval was not an allowed"):
        ft.load(io.BytesIO(pickle.dumps(_Call(eval, ("1+1",)), protocol=2)))
    assert not marker.exists()


class _Call:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_tuple_entries_bad_entries_and_arguments():
    ft.serialization.add_safe_globals([(TinyNet, f"{__name__}.TinyNet")])
    assert (TinyNet, f"{__name__}.TinyNet") in ft.serialization.get_safe_globals()
    with pytest.raises(ValueError, match="Expected tuple of length 2"):
        ft.serialization.add_safe_globals([(TinyNet,)])
    with pytest.raises(TypeError, match="has no __module__"):
        ft.serialization.add_safe_globals([3])
    with pytest.raises(RuntimeError, match="Can not safely load weights when explicit "
                                           "pickle_module is specified"):
        ft.load(_saved(ft, {"a": 1}), pickle_module=pickle, weights_only=True)
    assert ft.load(_saved(ft, {"a": 1}), pickle_module=pickle, weights_only=False) == {"a": 1}
    with pytest.raises(TypeError, match="text mode"):
        ft.load(io.StringIO("x"))


def test_environment_forces_as_in_torch(monkeypatch):
    buf = _saved(ft, TinyNet())
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="forcing weights_only=False"):
        assert isinstance(ft.load(buf), TinyNet)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):      # an explicit argument wins
        ft.load(buf, weights_only=True)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    buf.seek(0)
    with pytest.raises(RuntimeError, match="Only one of"):
        ft.load(buf)
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        ft.load(buf, weights_only=False)


def test_real_torch_checkpoints(tmp_path):
    torch.manual_seed(0)
    tm = TorchTinyNet()
    torch.save({"model": tm.state_dict(), "p": torch.nn.Parameter(torch.ones(2))},
               tmp_path / "sd.pt")
    sd = ft.load(tmp_path / "sd.pt")
    assert isinstance(sd["p"], FN.Parameter)
    m = TinyNet()
    m.load_state_dict(sd["model"])
    np.testing.assert_array_equal(m.emb.weight.detach().numpy(), tm.emb.weight.detach().numpy())
    torch.save(tm, tmp_path / "whole.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ft.load(tmp_path / "whole.pt")                     # torch's own check, under torch
    with pytest.raises(TypeError, match="holds a whole torch module.*state_dict"):
        ft.load(tmp_path / "whole.pt", weights_only=False)


def test_files_from_earlier_fpemu_releases():
    """Earlier releases pickled tensors through numpy: refused by a weights-only
    load with the way out, read with weights_only=False."""
    from fpemu.autograd import _core
    legacy = _core._rebuild(np.array([1.0, 2.0], np.float32), "bf16", False, None)
    data = pickle.dumps(_Call(_core._rebuild, (np.array([1.0, 2.0], np.float32), "bf16",
                                               False, None)), protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="earlier fpemu release.*save it again"):
        ft.load(io.BytesIO(data))
    back = ft.load(io.BytesIO(data), weights_only=False)
    assert back.dtype is ft.bfloat16 and back.tolist() == legacy.tolist()


def test_damaged_tensor_bytes_are_refused():
    from fpemu.autograd import _core
    with pytest.raises(ValueError, match="needs 12 bytes, the file holds 8: the file is "
                                         "damaged"):
        _core._rebuild_tensor(b"\0" * 8, "<f4", (3,), "fp32", False)
    with pytest.raises(ValueError, match="bool, integer and float values only"):
        _core._rebuild_tensor(b"\0" * 8, "|O", (1,), "fp32", False)


def test_a_truncated_or_empty_checkpoint_says_so_not_weights_only(tmp_path):
    import pickle
    p = tmp_path / "m.pt"
    ft.save({"w": ft.ones(3)}, str(p))
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises((pickle.UnpicklingError, RuntimeError), match="truncated") as e:
        ft.load(str(p))
    assert "weights_only=False" not in str(e.value)
    p.write_bytes(b"")
    with pytest.raises(EOFError, match="truncated or empty"):
        ft.load(str(p))
    p.write_bytes(b"PK\x03\x04" + data[4:40])               # a zip cut before its directory
    with pytest.raises(RuntimeError, match="failed finding central directory"):
        ft.load(str(p))


def test_allowlisting_a_name_as_text_is_refused_with_the_fix():
    from fpemu.errors import FpemuTypeError
    for call in (lambda: ft.serialization.add_safe_globals("os.system"),
                 lambda: ft.serialization.safe_globals("collections.OrderedDict")):
        with pytest.raises(FpemuTypeError, match="expects a list of classes or functions .* "
                                                 "got str 'o|got str 'c"):
            call()
