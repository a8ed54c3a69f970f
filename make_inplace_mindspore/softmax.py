"""Softmax as MindSpore ops: y = softmax(x (* scale) + mask) over the last axis.

The same kernels as ``make_inplace.softmax_`` and ``softmax_backward``. The
bridge takes no attributes (MindSpore's AOT attribute channel is a C++ class
across its old-ABI boundary), so ``scale`` is applied by multiplying x in
MindSpore before the op, and other axes are moved last with a transpose; the
causal flag and the presence of a mask are separate entry points.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ._library import check_float, check_same_dtype, custom, widen

_NAME = "softmax"


def _entry(causal: bool, has_mask: bool) -> str:
    return "MakeInplaceSoftmax" + ("Causal" if causal else "") + ("Mask" if has_mask else "")


def _forward_shape(causal: bool):
    def shape(x, mask=None):
        if len(x) < 1:
            raise ValueError(f"{_NAME}: x must have at least one dimension, got a 0-dim tensor")
        if causal and len(x) < 2:
            raise ValueError(f"{_NAME}: causal softmax needs x with at least 2 dims (..., L, S), got {tuple(x)}")
        if mask is not None and (len(mask) != len(x) or any(m not in (d, 1) for m, d in zip(mask, x))):
            raise ValueError(f"{_NAME}: mask must have x's rank with each dim equal to x's or 1 (x {tuple(x)}), got {tuple(mask)}")
        return x

    return shape


def _forward_dtype(x, mask=None):
    check_float(_NAME, "x", x)
    if mask is not None:
        check_same_dtype(_NAME, "mask", mask, "x", x)
    return x


def _backward_shape(grad_output, y):
    if tuple(grad_output) != tuple(y):
        raise ValueError(f"{_NAME}: grad_output must have the shape of y {tuple(y)}, got {tuple(grad_output)}")
    return y


def _backward_dtype(grad_output, y):
    check_float(_NAME, "y", y)
    check_same_dtype(_NAME, "grad_output", grad_output, "y", y)
    return y


def softmax_backward_op() -> ops.Custom:
    """``(grad_output, y) -> y * (grad_output - sum(grad_output * y, -1))`` (no bprop)."""
    return custom("MakeInplaceSoftmaxBackward", _backward_shape, _backward_dtype)


def softmax_op(causal: bool = False, has_mask: bool = False) -> ops.Custom:
    """The Custom op ``(x[, mask]) -> softmax(x + mask)`` over the last axis, with its bprop.

    causal masks element j of row r out when j > r (rows counted along axis
    -2, top-left aligned). The mask has x's rank, each dim x's or 1; its
    gradient is the input gradient summed over the broadcast dims.

    Example:
        >>> y = softmax_op(causal=True)(scores)  # scores: (batch, heads, L, L)
    """
    backward = softmax_backward_op()
    if has_mask:

        def bprop(x, mask, out, dout):
            dz = backward(dout, out)
            return dz, ops.cast(widen(dz).sum_to_size(mask.shape), mask.dtype)

    else:

        def bprop(x, out, dout):
            return (backward(dout, out),)

    return custom(_entry(causal, has_mask), _forward_shape(causal), _forward_dtype, bprop)


def softmax(
    x: ms.Tensor, axis: int = -1, *, scale: float | None = None, causal: bool = False, mask: ms.Tensor | None = None
) -> ms.Tensor:
    """softmax(x * scale + mask) along `axis` (PYNATIVE helper; see the op form).

    Example:
        >>> y = softmax(scores, scale=0.125, causal=True)
    """
    axis = axis % len(x.shape) if len(x.shape) else axis
    last = len(x.shape) - 1
    if causal and axis != last:
        raise ValueError(f"{_NAME}: causal=True needs axis to be the last axis, got axis={axis} of {len(x.shape)}")
    if scale is not None:
        x = x * ops.cast(ms.Tensor(scale), x.dtype)
    op = softmax_op(causal, mask is not None)
    if axis != last:
        x = ops.swapaxes(x, axis, -1)
        mask = None if mask is None else ops.swapaxes(mask, axis, -1)
    y = op(x) if mask is None else op(x, mask)
    return ops.swapaxes(y, axis, -1) if axis != last else y
