"""Checking the files a user names before fpemu reads or writes them: a
missing, unreadable, special (FIFO, device) or directory path, an array
file that is empty, truncated, holds Python objects or declares more values
than it stores, an output place that cannot be written. Each gets one line
saying what is wrong and what to pass instead, before any work starts."""

from __future__ import annotations

import os
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
    except OSError as err:
        raise FpemuValueError(f"cannot create the {what} {name}: {_why(err)}; pass a folder "
                              f"you can write to") from None
    import shutil
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
