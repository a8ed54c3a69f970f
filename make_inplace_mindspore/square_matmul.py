"""Square matmul as MindSpore ops: y = x @ weight (+ bias), or x @ weight^T.

The PyTorch op ``square_matmul_`` writes over x; here MindSpore owns the
output, so the bridge copies x into y and runs the same row-at-a-time (CPU) or
zero-workspace "waves" (CUDA) kernel on y.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ._library import check_float, check_same_dtype, custom, widen

_NAME = "square_matmul"


def _entry(transpose: bool, has_bias: bool) -> str:
    return "MakeInplaceSquareMatmul" + ("T" if transpose else "") + ("Bias" if has_bias else "")


def _out_shape(x, weight, bias=None):
    if len(x) < 1:
        raise ValueError(f"{_NAME}: x must have at least one dimension (..., n), got a 0-dim tensor")
    n = x[-1]
    if n < 1:
        raise ValueError(f"{_NAME}: x's last dimension n must be at least 1, got shape {tuple(x)}")
    if tuple(weight) != (n, n):
        raise ValueError(f"{_NAME}: weight must have shape ({n}, {n}) to match x's last dimension, got {tuple(weight)}")
    if bias is not None and tuple(bias) != (n,):
        raise ValueError(f"{_NAME}: bias must have shape ({n},), got {tuple(bias)}")
    return x


def _out_dtype(x, weight, bias=None):
    check_float(_NAME, "x", x)
    check_same_dtype(_NAME, "weight", weight, "x", x)
    if bias is not None:
        check_same_dtype(_NAME, "bias", bias, "x", x)
    return x


def _plain(transpose: bool) -> ops.Custom:
    """The forward without a bprop: what the bprops use for grad_x."""
    return custom(_entry(transpose, False), _out_shape, _out_dtype)


def square_matmul_op(transpose: bool = False, has_bias: bool = False) -> ops.Custom:
    """The Custom op ``(x, weight[, bias]) -> y`` with its bprop.

    grad_x = dy @ weight^T (dy @ weight when transposed) runs the bridge
    kernel; grad_weight (x^T dy, or dy^T x) and grad_bias (dy summed over rows)
    are reductions over rows that MindSpore's MatMul/ReduceSum compute (in
    float32 for the half types).
    Gradients are first order only (the bprop's own ops have no bprop).

    Example:
        >>> op = square_matmul_op(transpose=True)
        >>> y = op(x, w)  # x @ w.T
    """
    grad_x_op = _plain(not transpose)
    weight_grad = ops.MatMul(transpose_a=True)

    def rows(t, n):
        return ops.reshape(widen(t), (-1, n))

    if has_bias:

        def bprop(x, weight, bias, out, dout):
            n = weight.shape[0]
            x2, d2 = rows(x, n), rows(dout, n)
            grad_w = weight_grad(d2, x2) if transpose else weight_grad(x2, d2)
            return grad_x_op(dout, weight), ops.cast(grad_w, weight.dtype), ops.cast(d2.sum(axis=0), bias.dtype)

    else:

        def bprop(x, weight, out, dout):
            n = weight.shape[0]
            x2, d2 = rows(x, n), rows(dout, n)
            grad_w = weight_grad(d2, x2) if transpose else weight_grad(x2, d2)
            return grad_x_op(dout, weight), ops.cast(grad_w, weight.dtype)

    return custom(_entry(transpose, has_bias), _out_shape, _out_dtype, bprop)


def square_matmul(x: ms.Tensor, weight: ms.Tensor, bias: ms.Tensor | None = None, transpose: bool = False) -> ms.Tensor:
    """x @ weight (+ bias), or x @ weight^T with transpose=True (PYNATIVE helper).

    In GRAPH mode, make the op once outside the compiled code with
    :func:`square_matmul_op` (or use :class:`make_inplace_mindspore.nn.SquareLinear`).

    Example:
        >>> y = square_matmul(x, w, b)  # x: (..., n), w: (n, n), b: (n,)
    """
    op = square_matmul_op(transpose, bias is not None)
    return op(x, weight) if bias is None else op(x, weight, bias)
