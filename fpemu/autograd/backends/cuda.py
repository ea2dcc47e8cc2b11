"""``torch.backends.cuda``: ``matmul.allow_tf32`` (False by default since
torch 1.12) switches fpemu's float32 matmuls to tf32 operands; the
reduced-precision-reduction flags and the SDPA backend switches are kept."""

from __future__ import annotations

from .._state import State


class _MatmulFlags:
    @property
    def allow_tf32(self):
        return State.matmul.allow_tf32

    @allow_tf32.setter
    def allow_tf32(self, flag):
        State.matmul.allow_tf32 = bool(flag)

    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True
    allow_fp16_accumulation = False


matmul = _MatmulFlags()
_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def is_built():
    return True


def flash_sdp_enabled():
    return _sdp["flash"]


def mem_efficient_sdp_enabled():
    return _sdp["mem_efficient"]


def math_sdp_enabled():
    return _sdp["math"]


def cudnn_sdp_enabled():
    return _sdp["cudnn"]


def enable_flash_sdp(enabled):
    _sdp["flash"] = bool(enabled)


def enable_mem_efficient_sdp(enabled):
    _sdp["mem_efficient"] = bool(enabled)


def enable_math_sdp(enabled):
    _sdp["math"] = bool(enabled)


def enable_cudnn_sdp(enabled):
    _sdp["cudnn"] = bool(enabled)
