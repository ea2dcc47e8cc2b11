"""``torch.backends.cpu``: the ATen CPU capability of the active profile."""
from .._profile import get_profile


def get_cpu_capability():
    return get_profile().cpu_capability
