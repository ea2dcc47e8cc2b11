"""``torch.nn.modules``: every layer class, each in the file where torch keeps
it (``torch.nn.modules.linear.Linear`` is ``fpemu.autograd.nn.modules.linear.
Linear``, and ``nn.Linear`` is the same object)."""

from .activation import (  # noqa: F401
    CELU, ELU, GELU, GLU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid,
    LogSoftmax, Mish, MultiheadAttention, PReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Softmin,
    Softplus, Softsign, Tanh, Tanhshrink,
)
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d  # noqa: F401
from .container import (  # noqa: F401
    ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential,
)
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose2d  # noqa: F401
from .distance import CosineSimilarity  # noqa: F401
from .dropout import Dropout, Dropout1d, Dropout2d, Dropout3d  # noqa: F401
from .flatten import Flatten, Unflatten  # noqa: F401
from .fold import Fold, Unfold  # noqa: F401
from .instancenorm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d  # noqa: F401
from .linear import Identity, Linear  # noqa: F401
from .loss import (  # noqa: F401
    BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, GaussianNLLLoss, HingeEmbeddingLoss, HuberLoss,
    KLDivLoss, L1Loss, MarginRankingLoss, MSELoss, NLLLoss, PoissonNLLLoss, SmoothL1Loss,
)
from .module import Module  # noqa: F401
from .normalization import GroupNorm, LayerNorm, RMSNorm  # noqa: F401
from .pixelshuffle import PixelShuffle, PixelUnshuffle  # noqa: F401
from .pooling import (  # noqa: F401
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d, AvgPool1d, AvgPool2d, AvgPool3d,
    MaxPool1d, MaxPool2d, MaxPool3d, MaxUnpool1d, MaxUnpool2d, MaxUnpool3d,
)
from .rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNBase, RNNCell, RNNCellBase  # noqa: F401
from .sparse import Embedding  # noqa: F401
from .tiny import MultiheadSelfAttention, TinyTransformer, TransformerBlock  # noqa: F401
from .transformer import (  # noqa: F401
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
    TransformerEncoderLayer,
)
from .upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d  # noqa: F401
from . import (  # noqa: F401
    activation, batchnorm, container, conv, distance, dropout, flatten, fold, instancenorm, linear,
    loss, module, normalization, pixelshuffle, pooling, rnn, sparse, tiny, transformer,
    upsampling, utils,
)

__all__ = sorted(n for n in dir() if n[:1].isupper())
