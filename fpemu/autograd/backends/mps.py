"""``torch.backends.mps``: not there (fpemu emulates one CUDA device)."""


def is_available():
    return False


def is_built():
    return False
