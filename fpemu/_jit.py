"""The one jit decorator of the package, and bit casts between floats and ints.

Every kernel is compiled with ``cache=True`` and never with fastmath: the
emulator's results depend on IEEE arithmetic. ``error_model="numpy"`` keeps
Python's division checks out of the loops so LLVM can vectorise them.

Threading layer. Numba's default order (tbb, omp, workqueue) takes GNU
OpenMP where TBB is not installed, and a process that used GNU OpenMP cannot
``fork`` (multiprocessing's default on Linux, DataLoader workers): the child
is killed. Unless the user chose a layer (``NUMBA_THREADING_LAYER`` or
``NUMBA_THREADING_LAYER_PRIORITY``, or ``numba.config`` before importing
fpemu), fpemu asks for tbb, then workqueue, then omp: both of the first two
are fork-safe (Numba's threading-layer documentation). fpemu depends on the
``tbb`` wheel on Linux x86-64, where one exists; a virtual
environment does not put the wheel's ``libtbb.so.12`` on the loader's path,
so on Linux it is loaded here by its full path before Numba looks for it.
workqueue is not thread-safe, so while it is the layer :func:`run_kernel`
launches one parallel kernel at a time; each kernel still uses every core.

Small inputs. Starting a parallel loop costs about 6 us with tbb and about
100 us with workqueue (measured with a 1024-element loop on this project's
2-core test machine), more than the loop itself on a few thousand elements,
and the autograd engine makes hundreds of such calls per training step. So
:func:`run_kernel` runs a serial twin of a parallel kernel (the same Python
function compiled without ``parallel=True``, cached under its own name) when
its largest array is smaller than :data:`SERIAL_BELOW` elements.
Both compile from one body and give the same bits: every element is
computed on its own.

Many processes, one cache. Numba's on-disk cache file
(``numba.core.caching.IndexDataCacheFile``) saves a new signature by reading
the function's index, taking the first unused data-file number, writing the
index back and then the data, with no lock. Two processes that compile two
signatures of one kernel at once (two pytest-xdist workers, two ranks of a
torchrun job, ``fpemu warmup``'s processes) can both take the number 1: one
index entry is lost, and the surviving entry can point at the other
signature's machine code, which a later process loads as its own. fpemu's
kernels save and load their cache entries under an inter-process lock on
``fpemu-cache.lock`` in the cache directory (:class:`_LockedCacheFile`), so
each save sees the index as the last one left it.

One kernel, several files. Numba's cache entry of a function is valid while
the file that defines it is unchanged (its modification time and size); the
functions it calls are compiled into it, and an edit of the file of one of
those leaves the entry stale. A group of modules whose kernels call each
other's functions (:mod:`fpemu._kernels`, which also runs the code of
:mod:`fpemu._elemround`) is declared with :func:`cache_unit`: their entries
are valid while every file of the group is unchanged, as they were when
the group was one file.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import types as types_mod

import weakref

import numba
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core.caching import IndexDataCacheFile
from numba.extending import intrinsic, overload

try:
    import fcntl
except ImportError:                              # Windows: Numba's unlocked cache
    fcntl = None


def _load_tbb_wheel():
    """Make the tbb wheel's library visible to Numba (see the module note)."""
    if not sys.platform.startswith("linux"):
        return
    path = os.path.join(sys.prefix, "lib", "libtbb.so.12")
    if os.path.exists(path):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:                    # a broken install: Numba falls back
            pass


def _prefer_fork_safe_layers():
    if ("NUMBA_THREADING_LAYER" in os.environ or "NUMBA_THREADING_LAYER_PRIORITY" in os.environ
            or numba.config.THREADING_LAYER != "default"):
        return                                       # the user's choice stands
    numba.config.THREADING_LAYER_PRIORITY = ["tbb", "workqueue", "omp"]


_load_tbb_wheel()
_prefer_fork_safe_layers()


def _compiling_inlined(dispatcher):
    """Wrap the dispatcher's ``compile``, which Numba calls when a call meets
    a new signature (to compile, or to load from the cache), in
    :class:`inlining`: calls of a compiled signature go straight to Numba's
    C dispatcher, with nothing of fpemu's in between."""
    compile_ = dispatcher.compile

    @functools.wraps(compile_)
    def compile(sig):
        with inlining():
            return compile_(sig)
    dispatcher.compile = compile
    return dispatcher


#: the lock file's name, in each cache directory
CACHE_LOCK = "fpemu-cache.lock"
_THREAD_CACHE_LOCK = threading.RLock()


@contextlib.contextmanager
def _cache_locked(directory):
    """Hold the cache directory's inter-process lock (module note). Where the
    lock file cannot be made (a read-only directory: Numba then only loads)
    or the platform has no ``flock``, only this process's threads are
    serialised."""
    with _THREAD_CACHE_LOCK:
        fd = None
        if fcntl is not None:
            try:
                fd = os.open(os.path.join(directory, CACHE_LOCK), os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:
                fd = None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            if fd is not None:
                os.close(fd)                     # closing releases the lock


class _LockedCacheFile(IndexDataCacheFile):
    """Numba's index-and-data cache file whose save (read the index, pick a
    data file, write both) and load (read the index, then the data it names)
    each run whole under :func:`_cache_locked`."""

    def save(self, key, data):
        with _cache_locked(self._cache_path):
            super().save(key, data)

    def load(self, key):
        with _cache_locked(self._cache_path):
            return super().load(key)

    def flush(self):
        with _cache_locked(self._cache_path):
            super().flush()


#: module name -> the stamps of the files of its cache unit (:func:`cache_unit`)
_CACHE_UNITS = {}


def _stamp(path):
    """What Numba's cache compares to tell whether a source file changed."""
    st = os.stat(path)
    return st.st_mtime, st.st_size


def cache_unit(prefix, files):
    """Make the cached kernels of the module ``prefix`` and the modules under
    it (``prefix.*``, a package's) valid only while ``files`` (paths) are as
    they are now, besides their own source file (module note). Call it
    before the first kernel of the group is defined."""
    _CACHE_UNITS[prefix] = tuple(_stamp(f) for f in sorted(files))


def _unit_stamp(module):
    for prefix, stamps in _CACHE_UNITS.items():
        if module == prefix or module.startswith(prefix + "."):
            return stamps
    return None


#: every dispatcher fpemu's :func:`jit` / :func:`pjit` made (tests/test_cache.py
#: checks that each carries the locked cache file; Numba's own dispatchers, such
#: as those of ``@overload`` implementations, are not fpemu's and carry none)
MADE = weakref.WeakSet()


def _locked_cache(dispatcher):
    MADE.add(dispatcher)
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if type(cache_file) is IndexDataCacheFile:
        cache_file.__class__ = _LockedCacheFile
        unit = _unit_stamp(getattr(dispatcher.py_func, "__module__", None) or "")
        if unit is not None:
            # the index is read back only if its stamp equals this one
            cache_file._source_stamp = (cache_file._source_stamp, unit)
    return dispatcher


def jit(fn):
    """fpemu's jit: cached (under the lock of the module note), no GIL,
    numpy's error model (module note)."""
    return _compiling_inlined(_locked_cache(
        numba.njit(cache=True, nogil=True, error_model="numpy")(fn)))


def pjit(fn):
    """:func:`jit` with ``parallel=True`` (``prange`` loops)."""
    return _compiling_inlined(_locked_cache(
        numba.njit(cache=True, nogil=True, error_model="numpy", parallel=True)(fn)))


def _bitcast(src, dst, llvm_dst):
    @intrinsic
    def cast(typingctx, x):
        if x != src:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], llvm_dst)

        return dst(src), codegen

    return cast


#: float64 -> int64 with the same bits
f64_bits = _bitcast(types.float64, types.int64, ir.IntType(64))
#: float32 -> int32 with the same bits
f32_bits = _bitcast(types.float32, types.int32, ir.IntType(32))
#: int64 -> float64 with the same bits
f64_from_bits = _bitcast(types.int64, types.float64, ir.DoubleType())
#: float32 -> uint32 with the same bits, and back
f32_ubits = _bitcast(types.float32, types.uint32, ir.IntType(32))
f32_from_ubits = _bitcast(types.uint32, types.float32, ir.FloatType())


def _shift(method, ty):
    @intrinsic
    def shift(typingctx, a, s):
        if not (a == ty and s == ty):
            return None

        def codegen(context, builder, signature, args):
            return getattr(builder, method)(args[0], args[1])

        return ty(ty, ty), codegen

    return shift


#: 32-bit shifts of int32 by int32 (uint32 by uint32 for ``lshr32``). Numba
#: widens ``a << s`` on 32-bit integers to 64 bits, and LLVM cannot narrow a
#: variable shift back, so a loop of them fits half as many lanes per vector.
#: As in LLVM, a shift count outside 0..31 gives an undefined result: the
#: callers clamp it.
shl32 = _shift("shl", types.int32)
ashr32 = _shift("ashr", types.int32)
lshr32 = _shift("lshr", types.uint32)


@intrinsic
def clz32(typingctx, a):
    """Leading zero bits of an int32, as an int32 (32 for zero): LLVM's
    ctlz on i32. Numba's ``leading_zeros`` returns a 64-bit integer, which
    puts a loop's lanes through 64-bit arithmetic and halves them."""
    if a != types.int32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.ctlz", [i32],
                                              ir.FunctionType(i32, [i32, ir.IntType(1)]))
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 0)])

    return types.int32(types.int32), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c with one rounding (LLVM's llvm.fma.f64: the FMA instruction,
    or libm's correctly rounded fma where the CPU has none)."""
    if not (a == b == c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """float32 a * b + c with one rounding (llvm.fma.f32)."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


def fma_any(a, b, c):
    """a * b + c with one rounding in the operands' precision (float32:
    :func:`fma32`; float64: :func:`fma`), for kernels written once for
    float32 and float64 tensors."""
    raise NotImplementedError("fma_any is a Numba overload: call it from a @jit function "
                              "(from Python: fpemu._jit.fma32 or fpemu._jit.fma)")


@overload(fma_any)
def _fma_any_impl(a, b, c):
    if a == types.float32:
        return lambda a, b, c: fma32(a, b, c)
    return lambda a, b, c: fma(a, b, c)


class inlining:
    """Let LLVM inline the whole per-element body of a kernel while it compiles.

    Numba leaves LLVM's inliner at its default threshold (225). The rounding
    helpers of a kernel add up to more than that in some modes; a call then
    stays in the loop and blocks vectorisation (``quantize`` with ``rne`` ran
    5x slower). Kernels compile lazily inside their first call with a new
    signature: :func:`jit` and :func:`pjit` wrap each dispatcher's
    ``compile`` in this context, and calls of compiled signatures never enter
    it (setting the option costs tens of microseconds, which the autograd
    engine's many small calls would feel). The option is global to LLVM, so
    it is put back when the outermost compilation ends.
    """

    THRESHOLD = 4000
    DEFAULT = 225  # LLVM's own default
    _depth = 0
    _lock = threading.Lock()

    def __enter__(self):
        # re-entrant: a kernel's helpers compile inside its own compilation
        with inlining._lock:
            if inlining._depth == 0:
                llvm_binding.set_option("fpemu", f"-inline-threshold={self.THRESHOLD}")
            inlining._depth += 1

    def __exit__(self, *exc):
        with inlining._lock:
            inlining._depth -= 1
            if inlining._depth == 0:
                llvm_binding.set_option("fpemu", f"-inline-threshold={self.DEFAULT}")
        return False


_LAUNCH = threading.Lock()
#: Numba's threading layer and whether it is thread-safe (tbb, omp), read
#: once after fpemu's first parallel launch (:func:`_note_layer`): before
#: it, ``numba.threading_layer()`` raises, and asking on every launch cost
#: a raised and caught exception per kernel call (a model whose arrays all
#: run the serial twins never launches a parallel loop)
_layer = None
_threadsafe_layer = False


def _note_layer():
    global _layer, _threadsafe_layer
    try:
        layer = numba.threading_layer()
    except ValueError:                           # the launch did not start the pool
        return
    _layer, _threadsafe_layer = layer, layer in ("tbb", "omp")


#: arrays smaller than this run a kernel's serial twin (module note)
SERIAL_BELOW = {"tbb": 1 << 14, "omp": 1 << 14}
SERIAL_BELOW_DEFAULT = 1 << 17          # workqueue, and before the first launch
_SERIAL = {}

#: :func:`serial_below`'s threshold for kernels that a PyTorch program calls
#: (fpemu.torch on CPU tensors): torch's own thread pool (OpenMP) runs its
#: operations between them. There a tbb launch on a few ten thousand elements
#: cost about a millisecond, not 6 us: the MXFP8 training step of the demo's
#: emulated_training took 298 ms with 1 << 14 against 95 ms with every kernel
#: serial (2 cores, Intel Xeon, after another experiment had started tbb)
TORCH_SERIAL_BELOW = 1 << 17
_scope = threading.local()


@contextlib.contextmanager
def serial_below(n):
    """Within it, this thread's parallel kernels run their serial twins on
    arrays smaller than ``n`` elements (at least :data:`SERIAL_BELOW`'s
    threshold): for callers whose kernels alternate with another library's
    parallel work (:data:`TORCH_SERIAL_BELOW`)."""
    prev = getattr(_scope, "below", 0)
    _scope.below = max(prev, n)
    try:
        yield
    finally:
        _scope.below = prev


def _serial_twin(kernel):
    """The kernel's body compiled without ``parallel`` (prange runs as range),
    under a name of its own so that the two never share a cache entry."""
    twin = _SERIAL.get(id(kernel))
    if twin is None:
        f = kernel.py_func
        g = types_mod.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial",
                                   f.__defaults__, f.__closure__)
        g.__qualname__ = f.__qualname__ + "_serial"
        g.__module__ = f.__module__
        g.__doc__ = f.__doc__
        twin = jit(g)
        _SERIAL[id(kernel)] = twin
    return twin


def _largest(args):
    n = 0
    for a in args:
        if isinstance(a, np.ndarray) and a.size > n:
            n = a.size
    return n


def _readonly(a):
    """``a`` as Numba types a read-only array: a read-only view of it (``a``
    itself when it is read-only already)."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


def run_kernel(kernel, *args, inputs=0):
    """kernel(*args), safely from any number of Python threads (see the
    module's note on the threading layer). A parallel kernel on small arrays
    runs as its serial twin (module note).

    ``inputs``: how many leading arguments are arrays that the kernel only
    reads. They reach it as read-only views. Numba compiles one machine code
    per signature, and an array's signature says whether it is writeable, so
    a kernel fed a writeable array in one call and a read-only one (a
    broadcast, a frozen tensor) in the next compiled twice: the README MLP's
    first training step compiled the batched matmul three times (three mixes
    of read-only and writeable operands, 1.0-1.3 s each).

    """
    if inputs:
        args = (*map(_readonly, args[:inputs]), *args[inputs:])
    entry = _TWINS.get(id(kernel))
    if entry is None or entry[0] is not kernel:
        parallel = getattr(kernel, "targetoptions", {}).get("parallel")
        entry = _TWINS[id(kernel)] = (kernel, _serial_twin(kernel) if parallel else None)
    twin = entry[1]
    if twin is not None:
        if _largest(args) < max(SERIAL_BELOW.get(_layer, SERIAL_BELOW_DEFAULT),
                                getattr(_scope, "below", 0)):
            return twin(*args)
    if _threadsafe_layer:
        return kernel(*args)
    with _LAUNCH:
        result = kernel(*args)
    if _layer is None:
        _note_layer()
    return result


#: id(kernel) -> (kernel, its serial twin or None for a serial kernel)
_TWINS = {}
