"""InplaceSoftmax: nn.Softmax that writes over its input."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.softmax import softmax_
from ._autocast import softmax_dtype


class InplaceSoftmax(nn.Softmax):
    """``nn.Softmax(dim)`` computed with :func:`make_inplace.softmax_`: the input is overwritten.

    The input must be contiguous and must not be needed afterwards (autograd
    saves only the output). ``dim`` is required (no implicit-dim legacy).
    Under ``torch.autocast`` the result has ``nn.Softmax``'s dtype: a new
    tensor where autocast runs softmax in another dtype than the input's
    (float32 on CUDA).

    Example::

        >>> m = InplaceSoftmax(dim=-1)
        >>> x = torch.randn(2, 5)
        >>> expected = torch.softmax(x, -1)
        >>> torch.allclose(m(x), expected)
        True
    """

    def __init__(self, dim: int) -> None:
        super().__init__(dim=dim)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dtype = softmax_dtype(input)
        if dtype is not None and dtype != input.dtype:
            return torch.softmax(input, self.dim)
        return softmax_(input, self.dim)
