"""The ops of fpemu.autograd, by kind: ``elementwise``, ``reduce``,
``shape`` (views and indexing), ``scatter`` (writes at indices), ``search``
(searching and counting), ``linalg`` (matrix products), ``einsum``,
``distance`` (cdist), ``composite`` (ops torch composes from others),
``creation`` (factories) and ``inplace`` (writes into storage)."""

from .creation import (  # noqa: F401
    arange, as_tensor, bernoulli, empty, empty_like, eye, from_numpy, full, full_like,
    is_floating_point, is_tensor, linspace, multinomial, normal, numel, ones, ones_like, rand,
    logspace, rand_like, randint, randint_like, randn, randn_like, randperm, zeros, zeros_like,
)
from .composite import (  # noqa: F401
    broadcast_shapes, combinations, copysign, diag_embed, diff, dist, kthvalue, median,
    nanmean, nanmedian, nanquantile, nansum, quantile, rot90, std_mean, tile, var_mean,
)
from .distance import cdist  # noqa: F401
from .einsum import einsum  # noqa: F401
from .elementwise import (  # noqa: F401
    abs, add, addcdiv, addcmul, allclose, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, ceil,
    clamp, clamp_max, clamp_min, clip, clone, cos, div, eq, equal, erf, erfc, exp, expm1, fix,
    floor, floor_divide, frac, ge, gelu, gt, isclose, isfinite, isinf, isnan, le, lerp, log, log1p,
    logical_and, logical_not, logical_or, lt, masked_fill, maximum, minimum, mul, nan_to_num, ne,
    neg, pow, reciprocal, relu, remainder, round, rsqrt, rsub, sigmoid, sign, silu, sin, sqrt,
    square, sub, tanh, trunc, where,
)
from .linalg import (  # noqa: F401
    addmm, baddbmm, bmm, dot, ger, linear, matmul, matmul_model, mm, mv, outer, set_matmul_model,
)
from .reduce import (  # noqa: F401
    all, amax, amin, any, argmax, argmin, argsort, count_nonzero, cumprod, cumsum, logsumexp,
    max, mean, min, norm, prod, sort, std, sum, topk, var,
)
from .scatter import index_add, scatter, scatter_add  # noqa: F401
from .search import (  # noqa: F401
    bucketize, histc, histogram, searchsorted, unique, unique_consecutive,
)
from .shape import (  # noqa: F401
    broadcast_tensors, broadcast_to, cat, chunk, concat, concatenate, contiguous, diag, diagonal,
    expand, expand_as, flatten, flip, gather, getitem, index_put, index_select, masked_select,
    meshgrid, movedim, narrow, nonzero, permute, repeat, repeat_interleave, reshape, roll, select,
    split, squeeze, stack, swapaxes, swapdims, t, tensor_split, trace, transpose, tril, triu,
    unbind, unflatten, unsqueeze, view, view_as,
)
