"""Printing of tensors, character for character as torch prints them.

``repr(t)`` and ``str(t)`` follow the rules of torch's ``torch/_tensor_str.py``
(PyTorch 2.x), re-implemented here on the tensor's NumPy storage:

* Every element is formatted from its exact value as a Python float (a
  float16, bfloat16 or float8 value widened exactly, as ``tolist()`` gives it).
* One layout serves the whole tensor. Integer and bool tensors print their
  values as Python does. A float tensor whose finite nonzero values are all
  whole prints them as ``1.`` ("int mode"); scientific notation (``1.0000e-05``)
  is used when the largest finite nonzero magnitude is over 1000 times the
  smallest, over 1e8, or the smallest is under 1e-4; otherwise fixed notation
  with ``precision`` decimals. Zeros, infinities and NaNs take no part in that
  choice. Each element is right-aligned to the widest formatted finite
  nonzero element.
* Rows hold as many elements as fit in ``linewidth`` after the indent; a
  tensor of more than ``threshold`` elements shows only ``edgeitems``
  elements at each end of every dimension, with ``...`` between.
* Suffixes: ``size=`` for an empty tensor that is not 1-D, ``dtype=`` unless
  the dtype is float32, int64 or bool (an empty tensor shows any dtype but
  float32), ``grad_fn=<...>`` or ``requires_grad=True``; a suffix that would
  pass ``linewidth`` starts a new line.

Not printed: ``device=``. torch prints it for a tensor that is not on the
default device (a CUDA tensor, when CPU is the default); fpemu tensors carry
no device of their own (they all live on the one emulated device), so every
tensor prints as a tensor on the default device.

:func:`set_printoptions` (``torch.set_printoptions``), :func:`get_printoptions`
and the :func:`printoptions` context manager change the options.

>>> import fpemu.autograd as torch
>>> torch.tensor([0.375, 2.0])
tensor([0.3750, 2.0000])
>>> torch.tensor([1e-5, 1.0])
tensor([1.0000e-05, 1.0000e+00])
>>> torch.tensor([1.0, -2.0], dtype=torch.float16, requires_grad=True) * 2
tensor([ 2., -4.], dtype=torch.float16, grad_fn=<MulBackward0>)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers

import numpy as np

# dtypes that print no ``dtype=`` suffix (torch: the default dtype, int64, bool)
_UNMARKED = ("torch.float32", "torch.int64", "torch.bool")


@dataclasses.dataclass
class _PrintOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: bool | None = None


_OPTIONS = _PrintOptions()

# profile -> (precision, threshold, edgeitems, linewidth), torch's three
_PROFILES = {
    "default": (4, 1000, 3, 80),
    "short": (2, 1000, 2, 80),
    "full": (4, math.inf, 3, 80),
}


def _check_count(name, value, smallest):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"set_printoptions: {name} must be an int, got "
                        f"{type(value).__name__} ({value!r}); pass a whole number such as "
                        f"{getattr(_PrintOptions, name)}")
    if value < smallest:
        raise ValueError(f"set_printoptions: {name} must be at least {smallest}, got {value}")
    return int(value)


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None):
    """Set how tensors print (``torch.set_printoptions``).

    Parameters
    ----------
    precision : int, optional
        Digits after the decimal point (default 4).
    threshold : int or float, optional
        Tensors of more elements than this print summarized (default 1000;
        ``math.inf`` never summarizes).
    edgeitems : int, optional
        Elements shown at each end of each dimension of a summarized tensor
        (default 3).
    linewidth : int, optional
        Characters per line before a row wraps (default 80).
    profile : {"default", "short", "full"}, optional
        Sets the four options above first: ``"default"`` (4, 1000, 3, 80),
        ``"short"`` (2, 1000, 2, 80), ``"full"`` (4, inf, 3, 80).
    sci_mode : bool or None, optional
        True or False forces scientific or fixed notation; None (the
        default) lets each tensor's values decide. As in torch, every call
        sets it, so a call that leaves it out turns it back to None.

    Raises
    ------
    TypeError
        An option of the wrong type.
    ValueError
        An unknown profile or a negative count. (torch ignores an unknown
        profile; fpemu names it.)

    Examples
    --------
    >>> import fpemu.autograd as torch
    >>> torch.set_printoptions(precision=2)
    >>> torch.tensor([1.12345])
    tensor([1.12])
    >>> torch.set_printoptions(profile="default")
    >>> torch.tensor([1.12345])
    tensor([1.1235])
    """
    if profile is not None:
        if profile not in _PROFILES:
            raise ValueError(f"set_printoptions: unknown profile {profile!r}; expected one of "
                             f"{', '.join(map(repr, _PROFILES))}")
        (_OPTIONS.precision, _OPTIONS.threshold, _OPTIONS.edgeitems,
         _OPTIONS.linewidth) = _PROFILES[profile]
    if precision is not None:
        _OPTIONS.precision = _check_count("precision", precision, 0)
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise TypeError(f"set_printoptions: threshold must be a number, got "
                            f"{type(threshold).__name__} ({threshold!r}); pass an element "
                            f"count such as 1000, or math.inf never to summarize")
        _OPTIONS.threshold = threshold
    if edgeitems is not None:
        _OPTIONS.edgeitems = _check_count("edgeitems", edgeitems, 0)
    if linewidth is not None:
        _OPTIONS.linewidth = _check_count("linewidth", linewidth, 0)
    if sci_mode is not None and not isinstance(sci_mode, (bool, np.bool_)):
        raise TypeError(f"set_printoptions: sci_mode must be True, False or None, got "
                        f"{type(sci_mode).__name__} ({sci_mode!r})")
    _OPTIONS.sci_mode = None if sci_mode is None else bool(sci_mode)


def get_printoptions() -> dict:
    """The print options, as keyword arguments for :func:`set_printoptions`.

    Returns
    -------
    dict
        ``precision``, ``threshold``, ``edgeitems``, ``linewidth``, ``sci_mode``.
    """
    return dataclasses.asdict(_OPTIONS)


@contextlib.contextmanager
def printoptions(**kwargs):
    """Print with other options inside a ``with`` block
    (``torch._tensor_str.printoptions``); the keywords of
    :func:`set_printoptions`."""
    saved = get_printoptions()
    set_printoptions(**kwargs)
    try:
        yield
    finally:
        set_printoptions(**saved)


# ------------------------------------------------------------------ formatting
class _Layout:
    """How every element of one tensor is written: fixed, int or scientific
    mode, and the width each element is right-aligned to."""

    def __init__(self, values, floating, opts):
        self.floating = floating
        self.precision = opts.precision
        self.int_mode = True
        self.sci_mode = False
        self.width = 1
        flat = values.reshape(-1)
        if not floating:
            for v in flat.tolist():
                self.width = max(self.width, len(str(v)))
            return
        keep = flat[np.isfinite(flat) & (flat != 0)]
        if keep.size == 0:
            return
        mags = np.abs(keep)
        small, large = float(mags.min()), float(mags.max())
        self.int_mode = bool(np.all(keep == np.ceil(keep)))
        if opts.sci_mode is None:
            self.sci_mode = large / small > 1000.0 or large > 1.0e8 or small < 1.0e-4
        else:
            self.sci_mode = opts.sci_mode
        p = self.precision
        if self.sci_mode:
            lengths = (len(f"{v:.{p}e}") for v in keep.tolist())
        elif self.int_mode:
            lengths = (len(f"{v:.0f}") + 1 for v in keep.tolist())   # + 1: the point
        else:
            lengths = (len(f"{v:.{p}f}") for v in keep.tolist())
        self.width = max(self.width, max(lengths))

    def format(self, v):
        if not self.floating:
            text = str(v)
        elif self.sci_mode:
            text = f"{v:{self.width}.{self.precision}e}"
        elif self.int_mode:
            text = f"{v:.0f}"
            if math.isfinite(v):
                text += "."
        else:
            text = f"{v:.{self.precision}f}"
        return text.rjust(self.width)


def _summarized(a, edge):
    """The elements a summarized print shows (the layout is chosen from
    these only), flattened."""
    if a.ndim <= 1:
        if a.ndim == 1 and a.shape[0] > 2 * edge:
            # as torch: with edgeitems 0, a[-0:] is the whole vector
            return np.concatenate((a[:edge], a[-edge:]))
        return a.reshape(-1)
    if not edge:
        return a[:0].reshape(-1)
    n = a.shape[0]
    rows = list(range(edge)) + list(range(n - edge, n)) if n > 2 * edge else range(n)
    parts = [_summarized(a[i], edge) for i in rows]
    return np.concatenate(parts) if parts else a[:0].reshape(-1)


def _vector_str(a, indent, summarize, layout, opts):
    per_line = max(1, math.floor((opts.linewidth - indent) / (layout.width + 2)))
    edge = opts.edgeitems
    if summarize and not edge:
        items = ["..."]
    elif summarize and a.shape[0] > 2 * edge:
        items = ([layout.format(v) for v in a[:edge].tolist()] + [" ..."]
                 + [layout.format(v) for v in a[-edge:].tolist()])
    else:
        items = [layout.format(v) for v in a.tolist()]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(a, indent, summarize, layout, opts):
    if a.ndim == 0:
        return layout.format(a.item())
    if a.ndim == 1:
        return _vector_str(a, indent, summarize, layout, opts)
    edge, n = opts.edgeitems, a.shape[0]
    if summarize and n > 2 * edge:
        parts = ([_nested_str(a[i], indent + 1, summarize, layout, opts) for i in range(edge)]
                 + ["..."]
                 + [_nested_str(a[i], indent + 1, summarize, layout, opts)
                    for i in range(n - edge, n)])
    else:
        parts = [_nested_str(a[i], indent + 1, summarize, layout, opts) for i in range(n)]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _values_str(arr, floating, indent, opts):
    """The bracketed values of one array (``[1., 2.]``), torch's layout."""
    if arr.size == 0:
        return "[]"
    if floating:
        arr = arr.astype(np.float64)          # exact for every float dtype fpemu stores
    summarize = arr.size > opts.threshold
    layout = _Layout(_summarized(arr, opts.edgeitems) if summarize else arr, floating, opts)
    return _nested_str(arr, indent, summarize, layout, opts)


def _is_floating(t):
    kind = t._data.dtype.kind
    return kind == "f"


def _add_suffixes(text, suffixes, indent, force_newline, linewidth):
    out = [text]
    # torch counts the last line so (two more than its length)
    last = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if force_newline or last + len(suffix) + 2 > linewidth:
            out.append(",\n" + " " * indent + suffix)
            last = indent + len(suffix)
            force_newline = False
        else:
            out.append(", " + suffix)
            last += len(suffix) + 2
    out.append(")")
    return "".join(out)


def _is_fpemu_class(cls):
    return cls.__module__.startswith("fpemu.autograd")


def tensor_repr(t) -> str:
    """``repr(t)`` of an fpemu tensor, as torch writes it (module docstring).

    Parameters
    ----------
    t : fpemu.autograd.Tensor
        The tensor (or a Parameter; its ``Parameter containing:`` line is
        added by ``Parameter.__repr__``).

    Returns
    -------
    str
        The text ``torch`` prints for the same tensor on its default device.
    """
    opts = _OPTIONS
    cls = type(t)
    plain = _is_fpemu_class(cls)
    prefix = "tensor(" if plain else f"{cls.__name__}("
    indent = len(prefix)
    arr = t._data
    dtype = str(t.dtype)
    floating = _is_floating(t)
    suffixes = []
    sparse = bool(getattr(t, "_sparse", False))
    if sparse:
        # fpemu keeps a sparse tensor dense: its coalesced nonzeros are printed
        where = np.nonzero(arr)
        suffixes.append(f"size={tuple(arr.shape)}")
        suffixes.append(f"nnz={len(where[0]) if where else 0}")
        if dtype not in _UNMARKED:
            suffixes.append(f"dtype={dtype}")
        idx = np.stack(where).astype(np.int64) if where else np.zeros((0, 0), np.int64)
        vals = arr[where]
        head, tail = "indices=tensor(", "values=tensor("
        idx_str = _values_str(idx, False, indent + len(head), opts)
        if idx.size == 0:
            idx_str += f", size={tuple(idx.shape)}"
        val_str = _values_str(vals, floating, indent + len(tail), opts)
        if vals.size == 0:
            val_str += f", size={tuple(vals.shape)}"
        body = f"{head}{idx_str}),\n{' ' * indent}{tail}{val_str})"
    elif arr.size == 0:
        if arr.ndim != 1:
            suffixes.append(f"size={tuple(arr.shape)}")
        if dtype != "torch.float32":
            suffixes.append(f"dtype={dtype}")
        body = "[]"
    else:
        if not opts.edgeitems:
            suffixes.append(f"size={tuple(arr.shape)}")
        if dtype not in _UNMARKED:
            suffixes.append(f"dtype={dtype}")
        body = _values_str(arr, floating, indent, opts)
    if sparse:
        suffixes.append(f"layout={t.layout}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    text = _add_suffixes(prefix + body, suffixes, indent, sparse, opts.linewidth)
    if not plain and any(c.__name__ == "Parameter" and _is_fpemu_class(c) for c in cls.__mro__):
        text = f"Parameter({text})"
    return text
