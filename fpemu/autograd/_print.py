"""``repr`` of a tensor, in torch's layout."""

import numpy as np

_DEFAULT = ("fp32", "int64", "bool")


def tensor_repr(t) -> str:
    arr = t._data
    if arr.dtype == np.float32 and t.dtype.name != "fp32":
        arr = arr.astype(np.float32)
    body = np.array2string(arr, separator=", ", precision=4, prefix="tensor(",
                           max_line_width=80, threshold=1000)
    extra = ""
    if getattr(t.dtype, "name", "") not in _DEFAULT:
        extra = f", dtype={t.dtype}"
    if t.grad_fn is not None:
        extra += f", grad_fn=<{t.grad_fn.name()}>"
    elif t.requires_grad:
        extra += ", requires_grad=True"
    return f"tensor({body}{extra})"
