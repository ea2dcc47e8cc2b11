"""The functional forms, as ``torch.nn.functional``."""

from .._ops import (  # noqa: F401
    cross_entropy, dropout, embedding, gelu, layer_norm, linear, log_softmax, mse_loss,
    nll_loss, relu, rms_norm, scaled_dot_product_attention, sigmoid, softmax, tanh,
)
