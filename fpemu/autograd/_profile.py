"""Which PyTorch build fpemu.autograd computes like: a *profile*.

PyTorch's numbers depend on the device and, in a few places, on the version
(``docs/pytorch-numerics.md`` §1.1, §3.8). A :class:`Profile` names a device and a
torch version and answers the questions that differ:

* ``device="cuda"`` (the default): the CUDA formulas of §3.2. A tensor divided
  by a Python number multiplies by the float32 reciprocal; Python numbers and
  ``alpha`` enter float32 opmath unrounded; ``addcmul``/``addcdiv`` with a value
  are ``fma(v, r(t1*t2), self)`` / ``fma(v, r(t1/t2), self)``.
* ``device="cpu"``: the CPU formulas of §3.8, measured on the 2.13 CPU build.
  True division by a Python number; for bfloat16/float16 tensors a Python
  number added and ``alpha`` are first rounded to the tensor's dtype;
  ``addcmul`` is ``fma(r(v*t1), t2, self)`` and ``addcdiv`` is
  ``r(self + r(r(v*t1)/t2))``. Two CPU behaviours are *not* modelled, and the
  fidelity tiers say so where they matter: float32 ``sqrt`` goes through MKL
  VML (not correctly rounded, about 1 ulp; fpemu computes the IEEE square
  root), and the CPU fused optimizers' vector body and scalar tail compute in
  different precisions.
* ``cpu_capability``: the ATen CPU kernels' instruction set ("AVX512",
  "AVX2", ...; ``torch.backends.cpu.get_cpu_capability()``). CPU elementwise
  kernels run full vectors in float32 opmath and the leftover tail element by
  element in the tensor's own arithmetic; for ``add(a, b, alpha)`` on 16-bit
  dtypes the tail computes ``L(a + L(alpha*b))`` (c10::BFloat16 / Half
  operators round each result), the body ``L(fma(alpha, b, a))``. Measured on
  2.13: the body steps by 32 sixteen-bit elements under both AVX512 and AVX2
  (:meth:`Profile.cpu_binary_body`). Modelled for tensors of one parallel
  chunk (under 32768 elements).
* ``cpu_threads``: ``torch.get_num_threads()`` of the recording. The CPU
  fused optimizers split a tensor into per-thread chunks of whole cache lines
  and run each chunk's vector body and scalar tail separately, so which
  elements take the tail depends on it.
* ``gpu`` (CUDA profile; default ``"h100"``): which GPU's kernels. It sets
  the tensor-core models of bf16 / fp16 and of TF32 matrix products
  (:data:`GPUS`; the Hopper models reproduced every bf16 / fp16 and TF32
  ``torch.mm`` probe an H200 wrote, ``tests/test_gpu_probes.py`` and
  ``tests/test_gpu_probes_tf32.py``), whether cuBLAS's recorded splits of K
  apply (Hopper's), and the streaming-multiprocessor count from which ATen's
  CUDA reductions choose their launch. ``"h200"`` is a Hopper with the H100
  SXM's SM count, ``"h100-pcie"`` one with 114; ``"a100"`` is Ampere
  (published model, no probes of ours yet; TF32 then adds in index order).
* ``e4m3_overflow``: float8_e4m3fn saturates to ±448 from torch 2.12 on
  (PR #178817, merged 2026-04-17); earlier versions give NaN. Derived from the
  version unless given.

>>> from fpemu.autograd import Profile
>>> Profile("cpu", "2.13.0").e4m3_overflow
'saturate'
>>> Profile("cuda", "2.11.0").e4m3_overflow
'nan'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re

from ._state import State

DEVICES = ("cuda", "cpu")


@dataclasses.dataclass(frozen=True)
class Gpu:
    """What fpemu needs to know of a GPU: the accumulation model of its bf16 /
    fp16 tensor cores and of its TF32 ones (names of
    :data:`fpemu.accumulate.TENSOR_CORES`; None: not known, TF32 products then
    add in fp32 in index order) and its number of streaming multiprocessors
    (``cudaDeviceProp.multiProcessorCount``, which ATen's reductions read when
    they choose a launch)."""

    name: str
    arch: str
    tensor_core: str
    sm_count: int
    source: str
    tf32_core: str | None = None


#: the GPUs a CUDA profile can name. SM counts: NVIDIA's data sheets (H100 SXM5
#: 132, A100 108); the H200 wrote 132 in our gpu-check run
#: (bench/gpu_check/nvidia-h200-torch2.11.0/env.json).
GPUS = {
    "h100": Gpu("h100", "hopper", "h100", 132,
                "Hopper (sm_90), H100 SXM5; tensor-core model fitted to an H200's probes",
                "h100-tf32"),
    "h200": Gpu("h200", "hopper", "h100", 132,
                "Hopper (sm_90); its probes are the ones the model was fitted to",
                "h100-tf32"),
    "h100-pcie": Gpu("h100-pcie", "hopper", "h100", 114,
                     "Hopper (sm_90), H100 PCIe: the H100's models, 114 SMs", "h100-tf32"),
    "a100": Gpu("a100", "ampere", "a100", 108,
                "Ampere (sm_80); the published tensor-core model, not yet probed here"),
}
DEFAULT_GPU = "h100"
E4M3_SATURATES_FROM = (2, 12)


def _version_tuple(version: str):
    m = re.match(r"^(\d+)\.(\d+)", str(version))
    if not m:
        raise ValueError(f"torch version must look like '2.13.0', got {version!r}")
    return int(m.group(1)), int(m.group(2))


@dataclasses.dataclass(frozen=True)
class Profile:
    """``Profile(device="cuda", torch_version="2.13.0", e4m3_overflow=None,
    cpu_capability="AVX512", cpu_threads=1, gpu="h100")``."""

    device: str = "cuda"
    torch_version: str = "2.13.0"
    e4m3_overflow: str | None = None
    cpu_capability: str = "AVX512"
    cpu_threads: int = 1
    gpu: str = DEFAULT_GPU

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"Profile: device must be one of {DEVICES}, got {self.device!r}")
        if self.gpu not in GPUS:
            raise ValueError(f"Profile: gpu must be one of {tuple(GPUS)}, got {self.gpu!r}; "
                             f"Profile('cuda', gpu='h100') is Hopper, the default")
        vt = _version_tuple(self.torch_version)
        if self.e4m3_overflow is None:
            rule = "saturate" if vt >= E4M3_SATURATES_FROM else "nan"
            object.__setattr__(self, "e4m3_overflow", rule)
        elif self.e4m3_overflow not in ("saturate", "nan"):
            raise ValueError(f"Profile: e4m3_overflow must be 'saturate' or 'nan', got "
                             f"{self.e4m3_overflow!r}")

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def gpu_spec(self) -> Gpu:
        """The :class:`Gpu` a CUDA profile computes like."""
        return GPUS[self.gpu]

    @property
    def sm_count(self) -> int:
        """The GPU's streaming-multiprocessor count (ATen's reduction launch)."""
        return GPUS[self.gpu].sm_count

    def cpu_fused_parts(self, n: int, itemsize: int, lanes: int):
        """Index ranges (body_start, body_end, tail_end) of the chunks a CPU
        fused optimizer kernel cuts ``n`` elements into: at::parallel_for
        over 64-byte units, ``ceil(units / threads)`` units per chunk."""
        unit = 64 // itemsize
        units = -(-n // unit)
        threads = self.cpu_threads if units > 1 else 1
        per = -(-units // max(threads, 1))
        parts = []
        for start_unit in range(0, units, per):
            lo = start_unit * unit
            hi = min((start_unit + per) * unit, n)
            size = hi - lo
            parts.append((lo, lo + size - size % lanes, hi))
        return parts

    def cpu_lanes(self, itemsize: int, avx512_build: bool = True) -> int:
        """Elements per ATen CPU vector for an element of ``itemsize`` bytes
        in the build of the kernel that runs (:func:`cpu_vector_lanes`)."""
        return cpu_vector_lanes(self.cpu_capability, itemsize, avx512_build)

    def cpu_binary_body(self, itemsize: int) -> int:
        """Elements per step of the vector body of an ATen CPU binary kernel
        on ``itemsize``-byte elements. ATen's vectorized loop takes two
        vectors a step: 2 x 16 bfloat16 lanes under AVX2 (32 elements). Under
        AVX512 the body also steps by 32 sixteen-bit elements: both measured
        with torch 2.13's ``add(alpha)`` on bfloat16, every length 1..139
        (``ATEN_CPU_CAPABILITY=avx2`` on an AVX512 machine for AVX2)."""
        if itemsize == 2 and self.cpu_capability.upper() in ("AVX2", "AVX512"):
            return 32
        return 2 * self.cpu_lanes(itemsize)

    @property
    def name(self) -> str:
        return f"{self.device}-torch{self.torch_version}"


CUDA = Profile("cuda", "2.13.0")

#: ``at::internal::GRAIN_SIZE``: ATen's CPU loops and reductions run on one
#: thread below this many elements
GRAIN_SIZE = 32768


def cpu_vector_lanes(capability: str, itemsize: int, avx512_build: bool = True) -> int:
    """Elements of one ATen ``Vectorized`` of ``itemsize``-byte values in the
    build of a CPU kernel that runs under ``capability``: 64 bytes under
    AVX512 for a kernel with an AVX512 build (``avx512_build``: its file
    registers it with ``ALSO_REGISTER_AVX512_DISPATCH``), else 32. A kernel
    registered with plain ``REGISTER_DISPATCH`` has no AVX512 entry
    (``native/DispatchStub.h``), so an AVX512 CPU runs its AVX2 build (the
    sums, norms, products, layer_norm's statistics, arange / linspace:
    measured); the default build's vectors are 32 bytes too."""
    avx512 = str(capability).upper().startswith("AVX512") and avx512_build
    return (64 if avx512 else 32) // itemsize


def profile_from_env(value):
    """The profile ``FPEMU_PROFILE`` names: ``cpu`` or ``cuda``, optionally
    with a torch version (``cpu-2.13.0``, ``cuda-torch2.11.0``: a profile's
    ``name``); empty gives the default, CUDA with torch 2.13.0."""
    text = (value or "").strip().lower()
    if not text:
        return CUDA
    m = re.fullmatch(r"(cpu|cuda)(?:-(?:torch)?(\d+\.\d+(?:\.\d+)?))?", text)
    if not m:
        raise ValueError(
            f"FPEMU_PROFILE must be 'cpu' or 'cuda', optionally with a torch version "
            f"('cpu-2.13.0', 'cuda-2.11.0'), got {value!r}; unset it for the default "
            "(cuda-2.13.0)")
    version = m.group(2) or CUDA.torch_version
    if version.count(".") == 1:
        version += ".0"
    return Profile(m.group(1), version)


# the default profile: CUDA with torch 2.13, or what FPEMU_PROFILE names (read at
# import, so a program runs under a CPU profile without being edited)
State.profiles[:] = [profile_from_env(os.environ.get("FPEMU_PROFILE"))]
_current = State.profiles


def get_profile() -> Profile:
    """The active profile (CUDA, torch 2.13, unless changed)."""
    return _current[-1]


def set_profile(profile: Profile) -> None:
    """Make ``profile`` the active one for the rest of the program."""
    if not isinstance(profile, Profile):
        raise TypeError(f"set_profile expects an fpemu.autograd.Profile, got "
                        f"{type(profile).__name__}; build one with Profile('cpu', '2.13.0')")
    _current[0] = profile
    del _current[1:]


@contextlib.contextmanager
def use_profile(profile: Profile):
    """``with use_profile(Profile("cpu", "2.13.0")):`` computes like that build."""
    if not isinstance(profile, Profile):
        raise TypeError(f"use_profile expects an fpemu.autograd.Profile, got "
                        f"{type(profile).__name__}; build one with Profile('cpu', '2.13.0')")
    _current.append(profile)
    try:
        yield profile
    finally:
        _current.pop()
