"""square_matmul_: x <- x @ weight (+ bias), written over x."""

from __future__ import annotations

import torch

from .. import _loader
from ._common import check_devices, fail, is_compiling, validate_call

_loader.load()
_op_default = torch.ops.make_inplace.square_matmul_.default
_eager = _loader.eager_entries().get("square_matmul_")


@torch.library.register_fake("make_inplace::square_matmul_")
def _(x, weight, bias=None, transpose=False, workspace_bytes=None):
    check_devices("square_matmul_", ("x", x), ("weight", weight), ("bias", bias))
    return None


class _SquareMatmul(torch.autograd.Function):
    """Differentiable in x and bias; the weight must be frozen (x is gone)."""

    @staticmethod
    def forward(ctx, x, weight, bias, transpose, workspace_bytes):
        _op_default(x, weight, bias, transpose, workspace_bytes)
        ctx.mark_dirty(x)
        ctx.save_for_backward(weight)
        ctx.transpose = transpose
        return x

    @staticmethod
    def backward(ctx, grad_y):
        (weight,) = ctx.saved_tensors
        grad_x = grad_bias = None
        if ctx.needs_input_grad[0]:
            # y = x @ W  -> dx = dy @ W.T;  y = x @ W.T -> dx = dy @ W
            grad_x = grad_y @ (weight if ctx.transpose else weight.t())
        if ctx.needs_input_grad[2]:
            grad_bias = grad_y.reshape(-1, grad_y.shape[-1]).sum(0)
        return grad_x, None, grad_bias, None, None


def square_matmul_(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    transpose: bool = False,
    workspace_bytes: int | None = None,
) -> torch.Tensor:
    """Computes ``x @ weight + bias`` (or ``x @ weight.T + bias``) into x's own memory.

    Args:
        x: (..., n), contiguous, float16/bfloat16/float32/float64. Overwritten.
        weight: (n, n), same dtype and device as x. Contiguous or the transpose
            of a contiguous matrix; never copied.
        bias: optional (n,) of the same dtype and device.
        transpose: use ``weight.T`` (the ``nn.Linear`` weight layout).
        workspace_bytes: bound on extra device memory. ``None`` picks at most
            1/16 of x's size and at most 64 MiB; ``0`` uses none at all.

    Returns:
        x, holding the result. Its autograd version counter is bumped.

    Autograd flows to x and bias (dx = dy @ W.T). A weight that requires grad
    under grad mode is an error: x is overwritten, so dW = x.T @ dy cannot be
    formed; train it with ``torch.matmul`` / ``nn.Linear`` instead.

    Example::

        >>> x = torch.randn(4, 8)
        >>> w = torch.randn(8, 8)
        >>> expected = x @ w
        >>> y = make_inplace.square_matmul_(x, w)
        >>> y is x and torch.allclose(y, expected, atol=1e-5)
        True
    """
    if _eager is not None and not is_compiling() and _eager(x, weight, bias, transpose, workspace_bytes):
        return x
    validate_call("square_matmul_", in_place=(("x", x),), inputs=(("weight", weight), ("bias", bias)))
    if torch.is_grad_enabled():
        if weight.requires_grad:
            fail("square_matmul_", "weight requires grad, but x is overwritten in place, so "
                 "dW = x^T @ dy cannot be formed. Freeze the weight "
                 "(weight.requires_grad_(False)) or use torch.matmul / nn.Linear to train it.")
        if x.requires_grad or (bias is not None and bias.requires_grad):
            return _SquareMatmul.apply(x, weight, bias, transpose, workspace_bytes)
    # Positional (keywords cost ~0.4 us each), and only as many as are set.
    if transpose or workspace_bytes is not None:
        _op_default(x, weight, bias, transpose, workspace_bytes)
    else:
        _op_default(x, weight, bias)
    return x
