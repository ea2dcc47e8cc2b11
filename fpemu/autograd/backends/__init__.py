"""``torch.backends``: ``cuda`` and ``cudnn`` (whose TF32 switches change
fpemu's float32 matmuls and convolutions under the CUDA profile, as they
change the GPU's), ``mps``, ``cpu`` and ``mha``. Each is a module, so
``import torch.backends.cudnn as cudnn`` works; the other switches are
there so that programs that set them run (``benchmark`` and
``deterministic`` change nothing: fpemu is deterministic)."""

from . import cpu, cuda, cudnn, mha, mps  # noqa: F401
