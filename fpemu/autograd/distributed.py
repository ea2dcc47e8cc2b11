"""``torch.distributed``: fpemu emulates one device in one process. The names
exist so that programs which only *test* for a distributed run work; starting
one raises."""

from ..errors import FpemuNotImplementedError


def is_available():
    return False


def is_initialized():
    return False


def get_rank():
    return 0


def get_world_size():
    return 1


def init_process_group(*args, **kwargs):
    raise FpemuNotImplementedError("fpemu emulates a single device in one process; "
                                   "distributed training (init_process_group) is not emulated. "
                                   "Run the program without torchrun / RANK set.")


def destroy_process_group(*args, **kwargs):
    return None


def barrier(*args, **kwargs):
    return None


def all_reduce(tensor, *args, **kwargs):
    return tensor
