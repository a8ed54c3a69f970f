"""softmax_: x <- softmax(x * scale + mask, dim), written over x."""

from __future__ import annotations

import torch

from .. import _loader
from ._common import check_devices, fail, is_compiling, validate_call

_loader.load()
_op_default = torch.ops.make_inplace.softmax_.default
_eager = _loader.eager_entries().get("softmax_")
_backward_op = torch.ops.make_inplace.softmax_backward
_backward_inplace_op = torch.ops.make_inplace.softmax_backward_


@torch.library.register_fake("make_inplace::softmax_")
def _(x, dim=-1, scale=None, causal=False, mask=None):
    check_devices("softmax_", ("x", x), ("mask", mask))
    return None


@torch.library.register_fake("make_inplace::softmax_backward")
def _(grad_output, output, dim, scale):
    check_devices("softmax_backward", ("grad_output", grad_output), ("output", output))
    return torch.empty_like(output)


@torch.library.register_fake("make_inplace::softmax_backward_")
def _(grad, output, dim, scale):
    check_devices("softmax_backward_", ("grad", grad), ("output", output))
    return None


def _grad_of_values(grad_y: torch.Tensor, y: torch.Tensor, dim: int, scale: float) -> torch.Tensor:
    """scale * y * (dy - sum(dy * y, dim)) without ever writing into autograd's grad_y.

    A non-contiguous grad_y (e.g. the expanded ones of ``loss = y.sum()``) must be
    copied for the kernel anyway; that copy is ours, so the result is written
    over it instead of into a second buffer.
    """
    if grad_y.is_contiguous():
        return _backward_op(grad_y, y, dim, scale)
    grad = grad_y.contiguous()
    _backward_inplace_op(grad, y, dim, scale)
    return grad


class _Softmax(torch.autograd.Function):
    """Saves only the output y: dx = scale * y * (dy - sum(dy * y, dim))."""

    @staticmethod
    def forward(ctx, x, dim, scale, causal, mask):
        _op_default(x, dim, scale, causal, mask)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.dim = dim
        ctx.scale = 1.0 if scale is None else float(scale)
        ctx.mask_shape = None if mask is None else mask.shape
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        grad_x = grad_mask = None
        if ctx.needs_input_grad[4]:
            # d/dmask is the gradient w.r.t. the pre-softmax value v = x*scale + mask,
            # summed over the dims the mask was broadcast along.
            grad_v = _grad_of_values(grad_y, y, ctx.dim, 1.0)
            grad_mask = grad_v.sum_to_size(ctx.mask_shape)
            if ctx.needs_input_grad[0]:
                # sum_to_size returns grad_v itself when the mask has x's shape. Decided
                # by shape: torch.compile cannot trace a data-pointer comparison.
                shared = tuple(ctx.mask_shape) == tuple(grad_v.shape)
                grad_x = grad_v * ctx.scale if shared else grad_v.mul_(ctx.scale)
        elif ctx.needs_input_grad[0]:
            grad_x = _grad_of_values(grad_y, y, ctx.dim, ctx.scale)
        return grad_x, None, None, None, grad_mask


def softmax_(
    x: torch.Tensor,
    dim: int = -1,
    *,
    scale: float | None = None,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Computes ``torch.softmax(x * scale + mask, dim)`` into x's own memory.

    Args:
        x: any shape, contiguous, float16/bfloat16/float32/float64. Overwritten.
            Half types compute in float32.
        dim: the dim to normalize over, any dim (a middle dim is handled in
            place through its stride, with no copy).
        scale: multiplies x before the softmax; ``None`` means 1.
        causal: mask element ``[..., i, j]`` out (it becomes 0) when ``j > i``,
            the top-left alignment of ``scaled_dot_product_attention(is_causal=True)``.
            Needs ``x.dim() >= 2`` and ``dim`` the last dim.
        mask: optional additive mask of x's dtype, broadcastable to x (e.g.
            ``(L, S)`` for scores ``(B, H, L, S)``); read through its broadcast
            strides, never expanded in memory. ``-inf`` entries mask out.

    Returns:
        x, holding the result. Its autograd version counter is bumped. A row
        whose values are all ``-inf`` becomes NaN, as in torch.

    Autograd saves only the output (no copy of x): ``dx = scale * y * (dy -
    sum(dy * y, dim))``; masked positions get 0. The mask, if it requires grad,
    gets the gradient of the pre-softmax values summed to its shape.

    Example::

        >>> x = torch.randn(2, 4, 4)
        >>> expected = torch.softmax(x * 0.5, dim=-1)
        >>> y = make_inplace.softmax_(x, -1, scale=0.5)
        >>> y is x and torch.allclose(y, expected, atol=1e-6)
        True
    """
    if not isinstance(dim, int):
        fail("softmax_", f"dim must be an int, got {type(dim).__name__}", TypeError)
    if _eager is not None and not is_compiling() and _eager(x, dim, scale, causal, mask):
        return x
    validate_call("softmax_", in_place=(("x", x),), inputs=(("mask", mask),))
    if torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)):
        return _Softmax.apply(x, dim, scale, causal, mask)
    # Positional (keywords cost ~0.4 us each), and only as many as are set.
    if causal or mask is not None:
        _op_default(x, dim, scale, causal, mask)
    elif scale is not None:
        _op_default(x, dim, scale)  # (attention's scores)
    else:
        _op_default(x, dim)
    return x
