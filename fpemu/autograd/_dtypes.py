"""The dtypes of fpemu.autograd: torch's float dtypes as :class:`fpemu.Format`
objects (``TorchFormat``), the integer and bool dtypes (:class:`DType`),
their lookup by name, opmath, the widest-dtype rules of type promotion and
:func:`_store`, the rounding of an opmath result to a storage dtype.
(:mod:`fpemu.autograd._core` re-exports every name.)"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..formats import Format, format as _lookup
from ..formats import bf16, e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, fp16, fp32
from ..quantize import Cast, quantize
from ._profile import get_profile


# ---------------------------------------------------------------------- dtypes
@dataclasses.dataclass(frozen=True)
class DType:
    """A dtype that is not an fpemu Format: float64 and the integer types.
    Printed as torch prints its dtypes (``torch.int64``)."""

    name: str
    np_dtype: str
    is_floating_point: bool

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


_FORMAT_FIELDS = tuple(f.name for f in dataclasses.fields(Format) if f.compare)


class TorchFormat(Format):
    """An fpemu :class:`~fpemu.Format` under its torch name.

    ``fpemu.autograd.bfloat16`` has bf16's fields, so it is equal to
    ``fpemu.formats.bf16``, hashes alike and works wherever a Format does
    (``fpemu.quantize(x, torch.bfloat16)``); it prints as torch prints the
    dtype (``torch.bfloat16``) and pickles by name. Tensors always hold these
    objects for the formats torch has, so ``dtype is float16`` holds.
    """

    def __str__(self) -> str:
        return f"torch.{self.long_name}"

    __repr__ = __str__

    def __eq__(self, other):
        if other is self:
            return True
        if not isinstance(other, Format):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _FORMAT_FIELDS)

    __hash__ = Format.__hash__

    def __reduce__(self):
        return (_dtype_by_name, (self.long_name,))

    @property
    def is_floating_point(self) -> bool:
        return True

    @property
    def itemsize(self) -> int:
        return (self.bits + 7) // 8


def _torch_format(fmt):
    return TorchFormat(**{f.name: getattr(fmt, f.name) for f in dataclasses.fields(Format)})


float64 = DType("float64", "float64", True)
int64 = DType("int64", "int64", False)
int32 = DType("int32", "int32", False)
int16 = DType("int16", "int16", False)
int8 = DType("int8", "int8", False)
uint8 = DType("uint8", "uint8", False)
bool_ = DType("bool", "bool", False)

float32 = _torch_format(fp32)
float16 = _torch_format(fp16)
bfloat16 = _torch_format(bf16)
float8_e4m3fn = _torch_format(e4m3fn)
float8_e5m2 = _torch_format(e5m2)
float8_e4m3fnuz = _torch_format(e4m3fnuz)
float8_e5m2fnuz = _torch_format(e5m2fnuz)

_TORCH_FORMATS = (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz,
                  float8_e5m2fnuz)
_CANON = {f: f for f in _TORCH_FORMATS}              # any Format equal to one -> it
_CANON_ID = {id(core): t for core, t in zip(
    (fp32, fp16, bf16, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), _TORCH_FORMATS)}
_CANON_ID.update({id(t): t for t in _TORCH_FORMATS})


def canonical(dtype):
    """The dtype object tensors hold for ``dtype``: a Format equal to one of
    torch's dtypes becomes that dtype (``fpemu.formats.bf16`` ->
    ``bfloat16``); anything else is returned as it is."""
    t = _CANON_ID.get(id(dtype))
    if t is not None:
        return t
    if isinstance(dtype, Format):
        return _CANON.get(dtype, dtype)
    return dtype


def _dtype_by_name(name):
    """Unpickling: a dtype from its name (``"bfloat16"``, ``"int64"``)."""
    return as_dtype(name)


_BY_NAME = {"float64": float64, "double": float64, "int64": int64, "long": int64,
            "int32": int32, "int": int32, "int16": int16, "short": int16, "int8": int8,
            "uint8": uint8, "bool": bool_}


def as_dtype(dtype, what="dtype"):
    """A dtype from a dtype object, a Format, or a name (``"bfloat16"``)."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, Format):
        return canonical(dtype)
    if isinstance(dtype, str):
        if dtype in _BY_NAME:
            return _BY_NAME[dtype]
        try:
            return canonical(_lookup(dtype))
        except ValueError as err:
            raise ValueError(f"{what}: unknown dtype {dtype!r}; pass one of "
                             f"fpemu.autograd.float32, bfloat16, float16, float8_e4m3fn, "
                             f"float8_e5m2, float64, int64, ... ({err})") from None
    if dtype is float:
        return float64
    if dtype is int:
        return int64
    if dtype is bool:
        return bool_
    try:                               # numpy and ml_dtypes dtypes: np.float16, "<f4", ...
        npdt = np.dtype(dtype)
    except TypeError:
        npdt = None
    if npdt is not None:
        name = {"float16": "fp16", "float32": "fp32"}.get(npdt.name, npdt.name)
        if name in _BY_NAME:
            return _BY_NAME[name]
        try:
            return canonical(_lookup(name))
        except ValueError:
            pass
    raise TypeError(f"{what}: expected a dtype (fpemu.autograd.float32, bfloat16, ... or a "
                    f"fpemu Format), got {dtype!r}")


def is_float(dtype) -> bool:
    return isinstance(dtype, Format) or dtype is float64


def np_dtype(dtype):
    """The numpy dtype a tensor of ``dtype`` stores its values in."""
    if isinstance(dtype, Format):
        return np.float32
    return np.dtype(dtype.np_dtype)


def opmath(dtype):
    """The numpy dtype ops compute in: float64 for float64, else float32."""
    return np.float64 if dtype is float64 else np.float32


def _store(x, dtype):
    """Round an opmath result once to ``dtype`` (float64 -> float32 -> format,
    as c10's casts do: float64 results reach a 16-bit type through float32)."""
    if dtype is float64:
        return np.asarray(x, np.float64)
    if not isinstance(dtype, Format):
        return np.asarray(x).astype(dtype.np_dtype)
    x32 = np.asarray(x, np.float32)
    if dtype is fp32 or dtype.name == "fp32":
        return x32
    if dtype.name == "e4m3fn":        # version-dependent (docs/pytorch-numerics.md §1.1)
        return quantize(x32, dtype, overflow=get_profile().e4m3_overflow)
    cast = Cast.default(dtype)
    if cast.fast is not None:         # bf16, fp16, e5m2: quantize's own fast path, called
        src = x32 if x32.flags.c_contiguous else np.ascontiguousarray(x32)
        return cast.round_float32(src)                   # (without its argument checks)
    return quantize(x32, dtype)


def _category(dtype) -> int:
    return 2 if is_float(dtype) else (0 if dtype is bool_ else 1)


def _widest_float(dtypes):
    ds = list(dict.fromkeys(dtypes))
    if len(ds) == 1:
        return ds[0]
    if float64 in ds:
        return float64
    eight = [d for d in ds if isinstance(d, Format) and d.bits <= 8]
    if eight:
        raise TypeError(f"type promotion between {', '.join(map(str, ds))} is not defined "
                        f"(PyTorch has none for float8 types); cast with .to(dtype) first")
    return fp32


_INT_RANK = {bool_: 0, uint8: 1, int8: 1, int16: 2, int32: 3, int64: 4}


def _widest_int(dtypes):
    ds = set(dtypes)
    if uint8 in ds and int8 in ds and not ds & {int16, int32, int64}:
        return int16                   # torch: uint8 with int8 promotes to int16
    return max(ds, key=lambda d: (_INT_RANK[d], d is not uint8))
