"""Settings for every test run from the repository root.

The lesson notebooks run headless under pytest (nbmake): their widgets show
static output (see fpemu.lessons.interactive), as on the documentation site.
"""

import os

os.environ["FPEMU_STATIC"] = "1"

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
