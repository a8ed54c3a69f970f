"""InplaceLayerNorm: nn.LayerNorm that writes over its input."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.layer_norm import layer_norm_
from ._autocast import layer_norm_dtype


def layer_norm_module_(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """``norm(x)`` over x's memory. Under torch.autocast, torch's dtype: in place
    where x already has the dtype autocast gives layer norm (its parameters cast
    to it), otherwise a new tensor from ``F.layer_norm``."""
    weight, bias = norm.weight, norm.bias
    dtype = layer_norm_dtype(x)
    if dtype is not None:
        if x.dtype != dtype:
            return F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)
        weight = weight.to(dtype) if weight is not None else None
        bias = bias.to(dtype) if bias is not None else None
    return layer_norm_(x, norm.normalized_shape, weight, bias, norm.eps)


class InplaceLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed with :func:`make_inplace.layer_norm_`: the input is overwritten.

    Same constructor, parameters (``weight``, ``bias``) and state_dict keys as
    ``torch.nn.LayerNorm``, so weights load across in either direction. The
    input must be contiguous and must not be needed afterwards. Without
    autograd the forward allocates nothing; with it, only a per-row rstd is
    saved beside the output (see :func:`make_inplace.layer_norm_` for how the
    backward rebuilds x_hat and clamps small weights). Under ``torch.autocast``
    the result has ``nn.LayerNorm``'s dtype: a new tensor where autocast runs
    layer norm in another dtype than the input's (float32 on CUDA).

    Example::

        >>> ref = torch.nn.LayerNorm(8)
        >>> m = InplaceLayerNorm(8)
        >>> m.load_state_dict(ref.state_dict())
        <All keys matched successfully>
        >>> x = torch.randn(3, 8)
        >>> expected = ref(x)
        >>> torch.allclose(m(x), expected, atol=1e-5)
        True
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return layer_norm_module_(input, self)
