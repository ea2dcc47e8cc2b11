"""``torch.version``: the versions a program reads to see what it runs on.
``cuda`` follows the profile: the CUDA release of the build fpemu emulates
under the CUDA profile, None under a CPU profile (as a CPU build of torch
says)."""

from ._profile import get_profile as _get_profile
from ._missing import missing

__version__ = "2.13.0+fpemu"
git_version = "fpemu"
hip = None
debug = False

#: the CUDA release under the CUDA profile (torch 2.13's default wheels)
CUDA_RELEASE = "13.0"


def __getattr__(name):
    if name == "cuda":
        return None if _get_profile().cpu else CUDA_RELEASE
    raise missing("fpemu.autograd.version (torch.version)", name)
