"""``torch.onnx``: exporting needs torch's tracer, which cannot see fpemu's
tensors; the names exist so that programs importing ``torch.onnx`` at the
top run, and ``export`` says what to do instead."""

from __future__ import annotations

from ..errors import FpemuNotImplementedError


def export(model, args=(), f=None, *extra, **kwargs):
    raise FpemuNotImplementedError(
        "torch.onnx.export traces a real torch model; fpemu.autograd models are not torch "
        "models. Save the weights with fpemu.autograd.save(model.state_dict(), path), load "
        "them into the same model built with torch (torch.load(path, weights_only=False) "
        "gives the tensors) and export from torch.")


def is_in_onnx_export():
    """False: fpemu never runs inside an ONNX export."""
    return False


from ._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr("fpemu.autograd.onnx (torch.onnx)")
