"""InplaceLinear: a square nn.Linear that writes its result over its input."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.square_matmul import square_matmul_
from ._autocast import linear_dtype


def linear_maybe_inplace(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, workspace_bytes: int | None = None
) -> tuple[torch.Tensor, bool]:
    """``x @ weight.T + bias`` over x's memory when autograd and autocast allow it.

    Returns (result, done_in_place). Out of place when the weight requires grad
    under grad mode (dW = x^T @ dy needs the x that an in-place product
    destroys), and under torch.autocast when x is not in the autocast dtype
    (``F.linear`` would return a new tensor in that dtype). Under autocast with
    x in its dtype, the weight and bias are cast to it, as autocast casts them
    for ``F.linear``. ``workspace_bytes`` goes to ``square_matmul_`` (None: its
    default bound).
    """
    if torch.is_grad_enabled() and weight.requires_grad:
        return F.linear(x, weight, bias), False
    dtype = linear_dtype(x)
    if dtype is not None:
        if x.dtype != dtype:
            return F.linear(x, weight, bias), False
        weight = weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    return square_matmul_(x, weight, bias, transpose=True, workspace_bytes=workspace_bytes), True


class InplaceLinear(nn.Linear):
    """``nn.Linear(n, n)`` whose forward overwrites its input with the result.

    Same parameters, initialization and ``state_dict`` keys as
    ``torch.nn.Linear(n, n, bias)``, so checkpoints load either way. The
    forward computes ``x @ weight.T + bias`` into x's own memory through
    ``make_inplace.square_matmul_`` and returns x: no output buffer is
    allocated. The caller's tensor is overwritten, so use it only where the
    input is not read again.

    x must be contiguous with last dim n (an error otherwise, never a silent
    copy). Autograd flows to x and bias. Where the weight requires grad under
    grad mode (training the weight), the in-place product would destroy the x
    that dW needs, so the layer computes out of place like ``nn.Linear`` and
    warns once per module; freeze the weight or run under ``torch.no_grad()``
    to get the in-place path.

    Under ``torch.autocast`` the result has ``nn.Linear``'s dtype: an input
    already in the autocast dtype is overwritten (the weight and bias cast to
    it, as autocast casts them); an input in another dtype is left alone and
    the result is a new tensor, as from ``nn.Linear``.

    Example::

        >>> layer = make_inplace.nn.InplaceLinear(8)
        >>> x = torch.randn(4, 8)
        >>> with torch.no_grad():
        ...     expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        ...     y = layer(x)
        >>> y.data_ptr() == x.data_ptr() and torch.allclose(y, expected, atol=1e-5)
        True
    """

    def __init__(self, n: int, bias: bool = True, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(n, n, bias=bias, device=device, dtype=dtype)
        self._warned_out_of_place = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, in_place = linear_maybe_inplace(x, self.weight, self.bias)
        if not in_place and torch.is_grad_enabled() and self.weight.requires_grad and not self._warned_out_of_place:
            self._warned_out_of_place = True
            warnings.warn(
                "InplaceLinear: weight requires grad under grad mode, so the product is computed "
                "out of place (dW = x^T @ dy needs x); freeze the weight or use torch.no_grad() "
                "for the in-place path. This warning is shown once per module.",
                stacklevel=2,
            )
        return y
