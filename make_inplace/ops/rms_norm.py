"""rms_norm_: x <- rms_norm(x, normalized_shape, weight, eps), written over x."""

from __future__ import annotations

from typing import Sequence

import torch

from .. import _loader
from ._common import check_devices, is_compiling, validate_call

_loader.load()
_op_default = torch.ops.make_inplace.rms_norm_.default
_eager = _loader.eager_entries().get("rms_norm_")
_stats_op = torch.ops.make_inplace.rms_norm_stats_
_backward_op = torch.ops.make_inplace.rms_norm_backward


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("make_inplace::rms_norm_")
def _(x, normalized_shape, weight=None, eps=None):
    check_devices("rms_norm_", ("x", x), ("weight", weight))
    return None


@torch.library.register_fake("make_inplace::rms_norm_stats_")
def _(x, normalized_shape, weight=None, eps=None):
    check_devices("rms_norm_stats_", ("x", x), ("weight", weight))
    return x.new_empty(x.shape[: x.dim() - len(normalized_shape)], dtype=_stat_dtype(x.dtype))


@torch.library.register_fake("make_inplace::rms_norm_backward")
def _(grad_output, output, normalized_shape, weight, rstd, output_mask):
    check_devices("rms_norm_backward", ("grad_output", grad_output), ("output", output),
                  ("weight", weight), ("rstd", rstd))
    grad_input = torch.empty_like(output) if output_mask[0] else None
    grad_weight = torch.empty_like(weight) if output_mask[1] and weight is not None else None
    return grad_input, grad_weight


class _RmsNorm(torch.autograd.Function):
    """Saves the output y, the weight and the per-row rstd; no copy of x.

    The backward rebuilds x_hat = y / weight, with |weight| clamped up to 1e-5
    (see ``rms_norm_``), and returns grads for x and weight.
    """

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):
        rstd = _stats_op(x, normalized_shape, weight, eps)
        ctx.mark_dirty(x)
        ctx.save_for_backward(x, weight, rstd)
        ctx.normalized_shape = normalized_shape
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        y, weight, rstd = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[2] and weight is not None]
        # autograd may hand an expanded or strided grad; the kernel reads rows.
        grad_x, grad_w = _backward_op(grad_y.contiguous(), y, ctx.normalized_shape, weight, rstd, mask)
        return grad_x, None, grad_w, None


def rms_norm_(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """Computes ``torch.nn.functional.rms_norm(x, normalized_shape, weight, eps)`` into x.

    ``x * rsqrt(mean(x^2) + eps) * weight`` over the trailing dims.

    Args:
        x: (..., *normalized_shape), contiguous, float16/bfloat16/float32/float64.
            Overwritten. Half types compute in float32.
        normalized_shape: the trailing dim(s) to normalize over (an int or a sequence).
        weight: optional, of shape normalized_shape, same dtype/device as x,
            contiguous and not sharing memory with x.
        eps: added to the mean square; ``None`` uses ``torch.finfo(x.dtype).eps``
            as ``F.rms_norm`` does.

    Returns:
        x, holding the result. Its autograd version counter is bumped.

    Without autograd this allocates nothing. With autograd it saves the
    output, the weight and a per-row rstd (float32; float64 for float64 x) -
    no copy of x - and the backward rebuilds ``x_hat = y / weight`` from the
    output. Where ``|weight| < 1e-5`` it divides by ``±1e-5`` instead (sign
    of the weight, ``+`` for 0), as ``layer_norm_`` does: for those features
    grad_weight and grad_input are approximate; every other feature is exact
    up to the rounding of y. Grads flow to x and weight.

    Example::

        >>> x = torch.randn(4, 16)
        >>> w = torch.randn(16)
        >>> expected = torch.nn.functional.rms_norm(x, (16,), w)
        >>> y = make_inplace.rms_norm_(x, 16, w)
        >>> y is x and torch.allclose(y, expected, atol=1e-5)
        True
    """
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    if _eager is not None and not is_compiling() and _eager(x, shape, weight, eps):
        return x
    validate_call("rms_norm_", in_place=(("x", x),), inputs=(("weight", weight),))
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return _RmsNorm.apply(x, shape, weight, eps)
    _op_default(x, shape, weight, eps)
    return x
