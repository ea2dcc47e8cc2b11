"""``torch.backends.mha``: the fast-path switch. fpemu runs the op-by-op
path either way (the fast path computes the same operations)."""

_enabled = [True]


def get_fastpath_enabled():
    return _enabled[0]


def set_fastpath_enabled(value):
    _enabled[0] = bool(value)
