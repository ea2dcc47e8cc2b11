"""Autocast: which dtype each op runs in, per PyTorch's CUDA op lists.

A :class:`Policy` sorts op names into categories; :class:`autocast` makes a
policy active in a region. ``TORCH_CUDA`` holds the CUDA lists of torch 2.13
(``docs/pytorch-numerics.md`` §5, from ``ATen/autocast_mode.h``):

* ``lower``: every eligible input (floating point, not float64) is cast to
  the autocast dtype; the op runs and returns in it;
* ``fp32``: eligible inputs are cast to float32;
* ``fp32_set_opt_dtype``: the op runs with ``dtype=float32`` (sum, softmax,
  log_softmax, ...), so it reads a low-precision input widened and returns
  float32;
* ``promote``: eligible inputs are cast to the widest of them;
* any other op runs in its input dtypes under ordinary type promotion.

Casts of leaf tensors that require grad (parameters) are cached inside the
region, so a weight used twice is cast once and its gradient contributions
are summed in the low-precision copy, as on the GPU. The casts are ordinary
graph nodes, so the backward pass runs in the dtypes of the forward pass.
"""

from __future__ import annotations

import dataclasses

from ._core import Tensor, _widest_float, as_dtype, float16, float32, float64, is_float, to_dtype
from ._state import State
from ._core import bfloat16  # noqa: F401  (re-exported for policies)

LOWER = "lower"
FP32 = "fp32"
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
PROMOTE = "promote"


@dataclasses.dataclass(frozen=True)
class Policy:
    """Op names per autocast category; ops not named run in their input dtype."""

    name: str
    lower: frozenset
    fp32: frozenset
    fp32_set_opt_dtype: frozenset = frozenset()
    promote: frozenset = frozenset()
    banned: frozenset = frozenset()

    def category(self, op: str):
        for cat, ops in ((LOWER, self.lower), (FP32, self.fp32),
                         (FP32_SET_OPT_DTYPE, self.fp32_set_opt_dtype),
                         (PROMOTE, self.promote)):
            if op in ops:
                return cat
        return None


TORCH_CUDA = Policy(
    "torch_cuda",
    lower=frozenset("""_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d conv_transpose3d convolution prelu addmm addmv addr matmul einsum
        mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
        _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell
        rnn_relu_cell _scaled_dot_product_flash_attention
        scaled_dot_product_attention""".split()),
    fp32=frozenset("""acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt
        sinh tan pow softplus layer_norm native_layer_norm rms_norm group_norm
        frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss
        cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
        smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
        soft_margin_loss triplet_margin_loss multi_margin_loss
        binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
        upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d
        upsample_bilinear2d upsample_trilinear3d upsample_bicubic2d""".split()),
    fp32_set_opt_dtype=frozenset("""prod softmax log_softmax cumprod cumsum
        linalg_vector_norm linalg_matrix_norm sum""".split()),
    promote=frozenset("""addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler
        index_put tensordot scatter_add""".split()),
    banned=frozenset({"binary_cross_entropy"}),
)

# AutocastCPU's lists (``aten/src/ATen/autocast_mode.cpp``, TORCH_LIBRARY_IMPL(aten,
# AutocastCPU)): fewer ops run in float32 than on CUDA (softmax, layer_norm, exp,
# pow and sum are not listed); the default dtype is bfloat16.
TORCH_CPU = Policy(
    "torch_cpu",
    lower=frozenset("""conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm
        _addmm_activation addbmm linear _convolution matmul conv_tbc mkldnn_rnn_layer
        conv_transpose1d conv_transpose2d conv_transpose3d prelu scaled_dot_product_attention
        _native_multi_head_attention""".split()),
    fp32=frozenset("""avg_pool3d binary_cross_entropy grid_sampler polar prod quantile
        nanquantile stft cdist grid_sampler_2d grid_sampler_3d trace view_as_complex cholesky
        cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d
        max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d
        replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss
        nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss
        cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss
        triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss
        binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn
        fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft
        fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
        linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv
        linalg_tensorsolve fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd
        triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
        multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig
        linalg_eigh linalg_lstsq linalg_inv_ex""".split()),
    promote=frozenset("stack cat index_copy".split()),
)

_POLICY = {"cuda": TORCH_CUDA, "cpu": TORCH_CPU}
_DEFAULT_DTYPE = {"cuda": float16, "cpu": bfloat16}


def get_autocast_dtype(device_type="cuda"):
    """The dtype autocast uses when none is given: float16 on "cuda", bfloat16
    on "cpu"."""
    if device_type not in _DEFAULT_DTYPE:
        raise ValueError(f"autocast device_type must be 'cuda' or 'cpu', got {device_type!r}")
    return _DEFAULT_DTYPE[device_type]


def is_autocast_enabled(device_type="cuda"):
    return bool(State.autocast) and State.autocast[-1].enabled


class autocast:
    """``with autocast(device_type="cuda", dtype=bfloat16):`` as in torch.

    ``device_type`` picks the op lists: :data:`TORCH_CUDA` for "cuda",
    :data:`TORCH_CPU` for "cpu". ``policy`` (fpemu only) plugs in other op
    lists. Regions nest; the innermost one decides.
    """

    def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=True,
                 policy=None):
        if device_type not in _POLICY:
            raise ValueError(f"autocast device_type must be 'cuda' or 'cpu' (the two op "
                             f"lists fpemu has), got {device_type!r}")
        self.device_type = device_type
        self.dtype = (get_autocast_dtype(device_type) if dtype is None
                      else as_dtype(dtype, "autocast"))
        if not is_float(self.dtype) or self.dtype is float64:
            raise ValueError(f"autocast dtype must be a floating format other than float64, "
                             f"got {self.dtype}")
        self.enabled = bool(enabled)
        self.cache_enabled = bool(cache_enabled)
        self.policy = _POLICY[device_type] if policy is None else policy
        if not isinstance(self.policy, Policy):
            raise TypeError(f"autocast(policy=...) expects an fpemu.autograd.amp.Policy, got "
                            f"{type(self.policy).__name__}")
        self._cache = {}

    def __enter__(self):
        State.autocast.append(self)
        return self

    def __exit__(self, *exc):
        State.autocast.pop()
        self._cache.clear()
        return False

    def __call__(self, fn):
        def wrapped(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        wrapped.__wrapped__ = fn
        return wrapped


def _eligible(x):
    return isinstance(x, Tensor) and is_float(x.dtype) and x.dtype is not float64


def _cast(region, x, dtype):
    if x.dtype == dtype:
        return x
    cacheable = (region.cache_enabled and x.requires_grad and x.is_leaf)
    if cacheable:
        key = (id(x), dtype)
        hit = region._cache.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
    out = to_dtype(x, dtype)
    if cacheable:
        region._cache[key] = (x, out)
    return out


def cast_inputs(op, *args):
    """The op's tensor arguments as the active autocast region casts them."""
    if not State.autocast or not State.autocast[-1].enabled:
        return args
    region = State.autocast[-1]
    policy = region.policy
    if op in policy.banned:
        raise RuntimeError(f"{op} is unsafe to autocast; use the *_with_logits form, which "
                           f"combines the sigmoid and the loss")
    cat = policy.category(op)
    if cat is None:
        return args
    if cat == LOWER:
        target = region.dtype
    elif cat in (FP32, FP32_SET_OPT_DTYPE):
        target = float32
    else:
        elig = [a for a in args if _eligible(a)]
        if not elig:
            return args
        target = _widest_float([a.dtype for a in elig])
    if cat == FP32_SET_OPT_DTYPE:
        first = args[0]
        return ((_cast(region, first, target) if _eligible(first) else first),) + args[1:]
    return tuple(_cast(region, a, target) if _eligible(a) else a for a in args)
