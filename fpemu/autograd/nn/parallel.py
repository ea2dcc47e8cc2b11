"""``torch.nn.parallel``: single-device wrappers."""

from ...errors import FpemuNotImplementedError


class DistributedDataParallel:
    def __init__(self, *args, **kwargs):
        raise FpemuNotImplementedError("fpemu emulates one device in one process, so "
                                       "DistributedDataParallel cannot wrap a process group here; "
                                       "to emulate N data-parallel ranks, use "
                                       "fpemu.autograd.distributed.EmulatedDDP(model, "
                                       "world_size=N), or use the model itself.")


class DataParallel:
    def __new__(cls, module, *args, **kwargs):
        return module
