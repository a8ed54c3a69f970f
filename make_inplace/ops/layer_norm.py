"""layer_norm_: x <- layer_norm(x, normalized_shape, weight, bias, eps), written over x."""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _loader
from ._common import check_devices, is_compiling, validate_call

_loader.load()
_op = torch.ops.make_inplace.layer_norm_
_op_default = _op.default
_eager = _loader.eager_entries().get("layer_norm_")
_stats_op = torch.ops.make_inplace.layer_norm_stats_
_backward_op = torch.ops.make_inplace.layer_norm_backward


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("make_inplace::layer_norm_")
def _(x, normalized_shape, weight=None, bias=None, eps=1e-05):
    check_devices("layer_norm_", ("x", x), ("weight", weight), ("bias", bias))
    return None


@torch.library.register_fake("make_inplace::layer_norm_stats_")
def _(x, normalized_shape, weight=None, bias=None, eps=1e-05):
    check_devices("layer_norm_stats_", ("x", x), ("weight", weight), ("bias", bias))
    batch = x.shape[: x.dim() - len(normalized_shape)]
    dtype = _stat_dtype(x.dtype)
    return x.new_empty(batch, dtype=dtype), x.new_empty(batch, dtype=dtype)


@torch.library.register_fake("make_inplace::layer_norm_backward")
def _(grad_output, output, normalized_shape, weight, bias, rstd, output_mask):
    check_devices("layer_norm_backward", ("grad_output", grad_output), ("output", output),
                  ("weight", weight), ("bias", bias), ("rstd", rstd))
    grad_input = torch.empty_like(output) if output_mask[0] else None
    grad_weight = torch.empty_like(weight) if output_mask[1] and weight is not None else None
    grad_bias = torch.empty_like(bias) if output_mask[2] and bias is not None else None
    return grad_input, grad_weight, grad_bias


class _LayerNorm(torch.autograd.Function):
    """Saves the output y, weight, bias and the per-row rstd; no copy of x.

    The backward rebuilds x_hat = (y - bias) / weight, with |weight| clamped up
    to 1e-5 (see ``layer_norm_``), and returns grads for x, weight and bias.
    """

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps):
        _mean, rstd = _stats_op(x, normalized_shape, weight, bias, eps)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, weight, bias, rstd)
        ctx.normalized_shape = normalized_shape
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        y, weight, bias, rstd = ctx.saved_tensors
        mask = [
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[2] and weight is not None,
            ctx.needs_input_grad[3] and bias is not None,
        ]
        # autograd may hand an expanded or strided grad; the kernel reads rows.
        grad_x, grad_w, grad_b = _backward_op(
            grad_y.contiguous(), y, ctx.normalized_shape, weight, bias, rstd, mask
        )
        return grad_x, None, grad_w, grad_b, None


def layer_norm_(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Computes ``torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps)`` into x.

    Args:
        x: (..., *normalized_shape), contiguous, float16/bfloat16/float32/float64.
            Overwritten. Half types compute in float32.
        normalized_shape: the trailing dim(s) to normalize over (an int or a sequence).
        weight, bias: optional, of shape normalized_shape, same dtype/device as x,
            contiguous and not sharing memory with x.
        eps: added to the (biased) variance.

    Returns:
        x, holding the result. Its autograd version counter is bumped.

    Without autograd (no input requires grad, or under ``torch.no_grad()``) this
    allocates nothing at all. With autograd it saves the output, weight, bias
    and a per-row rstd (float32; float64 for float64 x) - no copy of x. The
    backward rebuilds ``x_hat = (y - bias) / weight`` from the output. Where
    ``|weight| < 1e-5`` it divides by ``±1e-5`` instead (sign of the weight,
    ``+`` for 0), as apex's memory-efficient layer norm does, so x_hat stays
    finite: for those features grad_weight and grad_input are approximate (a
    weight of exactly 0 gets grad_weight 0 there, and that feature's
    grad_input lacks its x_hat term); every other feature is exact up to
    the rounding of y, which the division amplifies by ``1/|weight|`` - in
    float16/bfloat16, features with small weights get visibly less accurate
    gradients than torch's (which keeps x). Grads flow to x, weight and bias.

    Example::

        >>> x = torch.randn(4, 16)
        >>> w, b = torch.randn(16), torch.randn(16)
        >>> expected = torch.nn.functional.layer_norm(x, (16,), w, b)
        >>> y = make_inplace.layer_norm_(x, 16, w, b)
        >>> y is x and torch.allclose(y, expected, atol=1e-5)
        True
    """
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    if _eager is not None and not is_compiling() and _eager(x, shape, weight, bias, eps):
        return x
    validate_call("layer_norm_", in_place=(("x", x),), inputs=(("weight", weight), ("bias", bias)))
    if torch.is_grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return _LayerNorm.apply(x, shape, weight, bias, eps)
    _op_default(x, shape, weight, bias, eps)
    return x
