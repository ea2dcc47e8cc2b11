"""``torch.utils.data``: datasets (``dataset``), samplers (``sampler``) and
the loader (``dataloader``), laid out as torch's."""

from . import dataloader, dataset, sampler  # noqa: F401
from .dataloader import (  # noqa: F401
    DataLoader, default_collate, default_convert, get_worker_info,
)
from .dataset import (  # noqa: F401
    ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset, Subset,
    TensorDataset, random_split,
)
from .sampler import (  # noqa: F401
    BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler,
    WeightedRandomSampler,
)

from ..._missing import module_getattr as _module_getattr  # noqa: E402

__getattr__ = _module_getattr('fpemu.autograd.utils.data (torch.utils.data)')
