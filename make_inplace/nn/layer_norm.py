"""InplaceLayerNorm: nn.LayerNorm that writes over its input."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import layer_norm_


class InplaceLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed with :func:`make_inplace.layer_norm_`: the input is overwritten.

    Same constructor, parameters (``weight``, ``bias``) and state_dict keys as
    ``torch.nn.LayerNorm``, so weights load across in either direction. The
    input must be contiguous and must not be needed afterwards. Without
    autograd the forward allocates nothing; with it, only a per-row rstd is
    saved beside the output (see :func:`make_inplace.layer_norm_` for how the
    backward rebuilds x_hat and clamps small weights).

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
        return layer_norm_(input, self.normalized_shape, self.weight, self.bias, self.eps)
