"""Reading tensor files, and checking the files a user names before fpemu
reads or writes them.

The readers (``.npy``, ``.npz``, ``.pt`` / ``.pth`` / ``.bin`` through
torch, ``.safetensors``): :func:`load_npy` (memory-mapped),
:func:`npz_arrays`, :func:`named_tensors` (every floating-point tensor, by
name), :func:`value_chunks` (every value, a chunk at a time). The checks: a
missing, unreadable, special (FIFO, device) or directory path, an array file
that is empty, truncated, holds Python objects or declares more values than
it stores, an output place that cannot be written. Each gets one line
saying what is wrong and what to pass instead, before any work starts."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import zipfile

import numpy as np

from .errors import FpemuValueError


def _why(err: OSError) -> str:
    return (err.strerror or str(err)).lower()


def check_input(path, what: str = "input") -> str:
    """``path`` as text, or FpemuValueError: it must be a readable, non-empty
    regular file (a FIFO or device would block or read nothing)."""
    name = os.fsdecode(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise FpemuValueError(f"cannot read the {what} {name}: {_why(err)}") from None
    if stat.S_ISDIR(mode):
        raise FpemuValueError(f"the {what} {name} is a directory; pass a file")
    if not stat.S_ISREG(mode):
        kind = "FIFO" if stat.S_ISFIFO(mode) else "device or socket"
        raise FpemuValueError(f"the {what} {name} is a {kind}, not a regular file; save the "
                              f"data to a file first")
    if not os.access(path, os.R_OK):
        raise FpemuValueError(f"cannot read the {what} {name}: permission denied; check its "
                              f"permissions (chmod u+r)")
    if os.path.getsize(path) == 0:
        raise FpemuValueError(f"the {what} {name} is empty")
    return name


def check_output_file(path, what: str = "output file") -> str:
    """``path`` as text, or FpemuValueError: a file fpemu may create or
    overwrite (not a directory; its folder exists and is writable)."""
    name = os.fsdecode(path)
    if os.path.isdir(path):
        raise FpemuValueError(f"the {what} {name} is a directory; pass a file name")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise FpemuValueError(f"cannot write the {what} {name}: permission denied")
        return name
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FpemuValueError(f"cannot write the {what} {name}: the folder {parent} does not "
                              f"exist; create it first")
    if not os.access(parent, os.W_OK):
        raise FpemuValueError(f"cannot write the {what} {name}: the folder {parent} is not "
                              f"writable")
    return name


def check_output_dir(path, what: str = "output folder") -> str:
    """``path`` as text, or FpemuValueError: a folder that exists and is
    writable, or that can be created (tried, then removed again)."""
    name = os.fsdecode(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise FpemuValueError(f"the {what} {name} is a file, not a folder; pass a folder "
                                  f"name (it is created if missing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise FpemuValueError(f"cannot write into the {what} {name}: permission denied")
        return name
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise FpemuValueError(f"cannot create the {what} {name}: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FpemuValueError(f"cannot create the {what} {name}: {parent} is not writable")
    # some places refuse even where access() says yes (/proc): try, and leave
    # nothing behind (the folder is made when the output is written)
    top = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(top)):
        top = os.path.dirname(top)
    try:
        os.makedirs(path)
    except FileExistsError:
        if os.path.isdir(path):
            # made meanwhile by another process checking it too (the ranks of a
            # torchrun job): it can be created; the other process removes it again
            return name
        raise FpemuValueError(f"the {what} {name} is a file, not a folder; pass a folder "
                              f"name (it is created if missing)") from None
    except OSError as err:
        raise FpemuValueError(f"cannot create the {what} {name}: {_why(err)}; pass a folder "
                              f"you can write to") from None
    shutil.rmtree(top, ignore_errors=True)
    return name


def _member_header(zf, info):
    """(shape, dtype, header bytes) of one .npy member of a zip archive."""
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        return shape, dtype, fh.tell()


def npz_arrays(path):
    """(name, array) of each member of a .npz archive, each checked before
    it is read: real dtype, no Python objects, and no more values declared
    than the member stores (a damaged or hostile header cannot make fpemu
    allocate 2**40 values)."""
    name = check_input(path, ".npz file")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise FpemuValueError(f"cannot read {name} as a .npz archive: {err}; save it with "
                              f"numpy.savez") from None
    with zf:
        members = [i for i in zf.infolist() if i.filename.endswith(".npy")]
        if not members:
            raise FpemuValueError(f"{name} holds no .npy arrays")
        for info in members:
            key = info.filename[:-4]
            try:
                shape, dtype, header = _member_header(zf, info)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
                raise FpemuValueError(f"{name}: the array {key!r} is damaged ({err})") from None
            if dtype.hasobject:
                raise FpemuValueError(f"{name}: the array {key!r} holds Python objects, which "
                                      f"fpemu never unpickles; save real numbers")
            count = int(np.prod(shape, dtype=object))
            if header + count * dtype.itemsize > info.file_size:
                raise FpemuValueError(
                    f"{name}: the array {key!r} declares {count} values of {dtype} "
                    f"({count * dtype.itemsize} bytes) but stores {info.file_size - header}: "
                    f"the file is truncated or damaged")
            try:
                with zf.open(info) as fh:
                    arr = np.lib.format.read_array(fh, allow_pickle=False)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
                raise FpemuValueError(f"{name}: cannot read the array {key!r} ({err})") from None
            yield key, arr


# ---------------------------------------------------------------- readers
def load_npy(path, fname=None):
    """A .npy file memory-mapped (a truncated or lying header is an error,
    not an allocation), or an FpemuValueError saying what the file is;
    ``fname`` prefixes the message with the function's name."""
    pre = f"{fname}(): " if fname else ""
    name = os.fsdecode(path) if not isinstance(path, str) else path
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        raise FpemuValueError(f"{pre}cannot read {name}: "
                              f"{(err.strerror or str(err)).lower()}") from None
    if not stat.S_ISREG(mode):
        raise FpemuValueError(f"{pre}cannot read {name}: it is not a regular file (a "
                              "device, FIFO or directory); save the array with numpy.save and "
                              "pass that .npy file")
    if not os.access(path, os.R_OK):
        raise FpemuValueError(f"{pre}cannot read {name}: permission denied; check "
                              f"its permissions (chmod u+r)")
    with open(path, "rb") as fh:
        head = fh.read(6)
    try:
        if head != b"\x93NUMPY":
            raise FpemuValueError("it is empty" if not head else
                                  "it does not start with the .npy signature")
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        detail = str(err) if head != b"\x93NUMPY" else (
            "it holds Python objects, which fpemu never unpickles"
            if "pickle" in str(err) or "objects" in str(err) else f"unreadable header: {err}")
        raise FpemuValueError(f"{pre}cannot read {name} as a .npy array ({detail}); "
                              "save the array with numpy.save(path, array)") from None
    if not isinstance(arr, np.ndarray):
        raise FpemuValueError(f"{pre}{name} is a .npz archive, not one array; pass "
                              "np.load(path)[name] or one of its arrays saved with numpy.save")
    return arr


TENSOR_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".bin", ".safetensors")


def _unknown_file_type(path):
    """The error for a file whose suffix is none of ``TENSOR_SUFFIXES``."""
    return FpemuValueError(f"{path}: unknown file type; expected .npy, .npz, .pt / .pth / .bin "
                           "(torch) or .safetensors")


def check_tensor_file(path):
    """``path`` if its suffix is one fpemu reads and the file is there and
    readable, else an FpemuValueError naming which."""
    if not path.lower().endswith(TENSOR_SUFFIXES):
        raise _unknown_file_type(path)
    check_input(path, "tensor file")
    return path


def value_chunks(path):
    """(total elements or None, an iterable of arrays of real numbers) read
    lazily from a tensor file, one chunk in memory at a time (``fpemu hist``)."""
    check_input(path, "tensor file")
    low = path.lower()
    if low.endswith(".npy"):
        arr = load_npy(path)
        _real(path, "", arr)
        return arr.size, [arr]
    if low.endswith(".npz"):
        return None, (_real(path, k, a) for k, a in npz_arrays(path))
    if low.endswith((".pt", ".pth", ".bin")):
        tensors = [t for _, t in torch_tensors(torch_load(path))]
        if not tensors:
            raise FpemuValueError(f"{path} holds no floating-point tensors")
        return sum(t.numel() for t in tensors), (c for t in tensors for c in torch_chunks(t))
    if low.endswith(".safetensors"):
        try:
            from safetensors import safe_open  # optional dependency
        except ImportError:
            raise FpemuValueError(f"{path} is a safetensors file; reading it needs the safetensors "
                                  "package: pip install safetensors") from None
        return None, safetensors_arrays(path, safe_open)
    raise _unknown_file_type(path)


def _real(path, name, a):
    """``a`` if it holds real numbers (floats or integers), else an FpemuValueError."""
    if a.dtype.kind not in "fiu":
        what = f"{path}: the array {name!r}" if name else path
        raise FpemuValueError(f"{what} holds {a.dtype} values; fpemu counts real numbers "
                              f"(floats or integers): save those instead (for complex data, "
                              f".real and .imag)")
    return a


def torch_load(path):
    """A PyTorch file's object (tensors on the CPU, memory-mapped, weights only),
    or an FpemuValueError."""
    try:
        import torch  # optional dependency
    except ImportError:
        raise FpemuValueError(f"{path} is a PyTorch file; reading it needs torch: "
                              "pip install torch (or save the tensors with numpy.save)") from None
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:   # torch raises many kinds for a bad file
        raise FpemuValueError(f"cannot read {path} with torch.load: {err}") from None


def torch_tensors(obj, prefix=""):
    """(dotted name, tensor) of every floating-point tensor in nested dicts / lists."""
    import torch  # optional dependency
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield prefix or "tensor", obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from torch_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from torch_tensors(v, f"{prefix}.{i}" if prefix else str(i))


def torch_chunks(t, chunk=1 << 22):
    """A torch tensor as float32 / float64 numpy chunks (16-bit and fp8 values widen
    exactly); only one chunk is in memory at a time."""
    flat = t.detach().reshape(-1)
    for i in range(0, flat.numel(), chunk):
        yield widened(flat[i:i + chunk])


def widened(t):
    """A torch tensor as a float32 / float64 numpy array (16-bit and fp8 values
    widen exactly)."""
    import torch  # optional dependency
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    return t.detach().numpy()


def safetensors_arrays(path, safe_open):
    """The floating-point tensors of a safetensors file, one at a time: through torch
    when it is installed (bf16 and fp8 tensors need it), else through numpy."""
    framework = "pt" if importlib.util.find_spec("torch") is not None else "numpy"
    try:
        fh = safe_open(path, framework=framework)
    except Exception as err:       # safetensors raises its own error types for a bad file
        raise FpemuValueError(f"cannot read {path} as safetensors: {err}") from None
    with fh:
        for k in fh.keys():
            try:
                t = fh.get_tensor(k)
            except (TypeError, ValueError) as err:
                raise FpemuValueError(f"{path}: tensor {k!r} cannot be read without torch ({err}); "
                                      "pip install torch") from None
            if framework == "pt":
                if t.is_floating_point():
                    yield from torch_chunks(t)
            elif t.dtype.kind == "f":
                yield t


def named_tensors(path):
    """(name, float32 array) for each floating-point tensor of a file, with its
    shape: .npy (named by the file), .npz, .pt / .pth / .bin, .safetensors.
    bfloat16 and fp8 tensors widen exactly; float64 ones must hold float32 values."""
    check_input(path, "tensor file")
    low = path.lower()
    if low.endswith((".npy", ".npz")):
        items = [(os.path.basename(path), load_npy(path))] if low.endswith(".npy") else \
            npz_arrays(path)
        for name, a in items:
            if a.dtype.kind == "f":
                yield name, a
        return
    if low.endswith(".safetensors"):
        try:
            from safetensors.torch import load_file  # optional dependency
        except ImportError:
            raise FpemuValueError(f"{path} is a safetensors file; reading it needs torch and the "
                                  "safetensors package: pip install torch safetensors") from None
        try:
            obj = load_file(path)
        except Exception as err:   # safetensors raises its own error types
            raise FpemuValueError(f"cannot read {path} as safetensors: {err}") from None
    elif low.endswith((".pt", ".pth", ".bin")):
        obj = torch_load(path)
    else:
        obj = None
    if obj is not None:
        for name, t in torch_tensors(obj):
            yield name, widened(t)
        return
    raise _unknown_file_type(path)
