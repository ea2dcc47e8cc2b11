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

import pytest  # noqa: E402

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


# make test runs two pytest-xdist workers. The files below each go to one
# worker whole (the tests of other files are dealt one at a time). Their tests
# compile the same kernels (one per mode and format family: two workers
# compiled the same ones side by side, about 145 s of the suite's 1650), share
# a module fixture (test_gpu_check's 40 s dry run ran once in each worker;
# test_readme's scratch folder, where the python blocks write the files that
# the command lines read) or start the same gloo processes (test_collectives).
# pytest-xdist's own xdist_group mark does not reach its scheduler under
# pytest 9: xdist renames item._nodeid, which pytest 9 no longer reads
# (pytest-dev/pytest-xdist issue 1386, open as of xdist 3.8.0). Hence this
# hook: it replaces the scheduler of --dist loadgroup, which make test passes,
# by LoadScope scheduling on these groups; the largest groups are dealt first.
# The hook is optional: plain pytest without pytest-xdist (`python -m pytest
# tests/test_reference.py`) does not know it, and would stop at start-up.
WHOLE_FILES = ("tests/test_arith.py", "tests/test_quantize.py", "tests/test_explain_stats.py",
               "tests/test_collectives.py", "tests/test_accumulate.py",
               "tests/test_torch_quantize.py", "tests/test_fast_paths.py",
               "tests/test_cuda_casts.py", "tests/test_gpu_check.py", "tests/test_readme.py")


def scope_of(nodeid):
    """The unit of work a test travels to a worker in: its whole file for the
    files above, else the test alone."""
    path = nodeid.split("::", 1)[0]
    return path if path in WHOLE_FILES else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WholeFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return scope_of(nodeid)

    return WholeFiles(config, log)
