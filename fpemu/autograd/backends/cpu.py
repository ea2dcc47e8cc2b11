"""``torch.backends.cpu``: the ATen CPU capability of the active profile."""


def get_cpu_capability():
    from .._profile import get_profile
    return get_profile().cpu_capability
