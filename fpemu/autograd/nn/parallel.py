"""``torch.nn.parallel``: single-device wrappers."""

from ...errors import FpemuNotImplementedError


class DistributedDataParallel:
    def __init__(self, *args, **kwargs):
        raise FpemuNotImplementedError("fpemu emulates one device in one process; "
                                       "DistributedDataParallel is not emulated. Use the model "
                                       "itself.")


class DataParallel:
    def __new__(cls, module, *args, **kwargs):
        return module
