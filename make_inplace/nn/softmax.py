"""InplaceSoftmax: nn.Softmax that writes over its input."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.softmax import softmax_


class InplaceSoftmax(nn.Softmax):
    """``nn.Softmax(dim)`` computed with :func:`make_inplace.softmax_`: the input is overwritten.

    The input must be contiguous and must not be needed afterwards (autograd
    saves only the output). ``dim`` is required (no implicit-dim legacy).

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
        return softmax_(input, self.dim)
