"""``torch.backends``: the TF32 switches, which change fpemu's float32
matmuls and convolutions under the CUDA profile (operands read as tf32), as
they change the GPU's; the other names are there so that programs that set
them run."""

from ._state import State


class _MatmulFlags:
    @property
    def allow_tf32(self):
        return State.matmul.allow_tf32

    @allow_tf32.setter
    def allow_tf32(self, flag):
        State.matmul.allow_tf32 = bool(flag)

    allow_fp16_reduced_precision_reduction = True
    allow_bf16_reduced_precision_reduction = True


class _Cuda:
    matmul = _MatmulFlags()

    @staticmethod
    def is_built():
        return True

    @staticmethod
    def flash_sdp_enabled():
        return True

    @staticmethod
    def enable_flash_sdp(flag):
        return None

    @staticmethod
    def enable_mem_efficient_sdp(flag):
        return None

    @staticmethod
    def enable_math_sdp(flag):
        return None


class _Cudnn:
    enabled = True
    benchmark = False
    deterministic = False

    @property
    def allow_tf32(self):
        return State.matmul.cudnn_allow_tf32

    @allow_tf32.setter
    def allow_tf32(self, flag):
        State.matmul.cudnn_allow_tf32 = bool(flag)

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def version():
        return 91000


class _Mps:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def is_built():
        return False


class _Cpu:
    @staticmethod
    def get_cpu_capability():
        from ._profile import get_profile
        return get_profile().cpu_capability


class _Mha:
    """``torch.backends.mha``: the fast-path switch. fpemu runs the op-by-op
    path either way (the fast path computes the same operations)."""
    _enabled = True

    def get_fastpath_enabled(self):
        return self._enabled

    def set_fastpath_enabled(self, value):
        type(self)._enabled = bool(value)


cuda = _Cuda()
mha = _Mha()
cudnn = _Cudnn()
mps = _Mps()
cpu = _Cpu()
