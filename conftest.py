"""Settings for every test run from the repository root.

The lesson notebooks run headless under pytest (nbmake): their widgets show
static output (see fpemu.lessons.interactive), as on the documentation site.
"""

import os
import sys

os.environ["FPEMU_STATIC"] = "1"
# fpemu.torch's Triton kernels run on CPU tensors under Triton's interpreter in the
# tests (tests/test_triton_kernels.py); the doctest collection imports their module,
# so the interpreter is chosen before anything defines them
os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist the workers share the machine's cores: torch's own thread pool,
# spinning between operations, starved Numba's threads in the same worker and the
# other worker's (tests/test_torch_quantize.py took 49 s on 2 cores, 18 s with one
# torch thread per worker). No test depends on torch's thread count.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:                  # (imported already by a plugin)
        sys.modules["torch"].set_num_threads(1)

import importlib.util  # noqa: E402

# fpemu.autograd.utils.tensorboard passes through to torch's SummaryWriter and
# raises ImportError (with the fix) where tensorboard is not installed, as
# torch.utils.tensorboard does: the doctest collection cannot import it there.
#
# tests/programs/ holds real PyTorch training scripts that tests/test_programs.py
# runs as __main__ under torch and under fpemu: importing them for doctests
# would train them at collection time.
collect_ignore_glob = ["tests/programs/*"]
if importlib.util.find_spec("tensorboard") is None:
    collect_ignore_glob.append("fpemu/autograd/utils/tensorboard/*")

# tests/test_testing.py runs a project's test file in this process
pytest_plugins = ["pytester"]
