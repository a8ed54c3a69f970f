"""Batched outer product as MindSpore ops: ``out[..., i, j] = a[..., i] * b[..., j]``.

The same kernels as ``make_inplace.outer_product`` and its backward
(``grad_a = sum_j grad_out[..., :, j] b[..., j]``, ``grad_b`` likewise).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ._library import check_float, check_same_dtype, custom

_NAME = "outer_product"


def _check_ab(a, b) -> None:
    if len(a) < 1:
        raise ValueError(f"{_NAME}: a must have shape (..., n), got a 0-dim tensor")
    if len(b) < 1:
        raise ValueError(f"{_NAME}: b must have shape (..., m), got a 0-dim tensor")
    if tuple(a[:-1]) != tuple(b[:-1]):
        raise ValueError(f"{_NAME}: a and b must have the same leading dimensions, got {tuple(a)} and {tuple(b)}")


def _forward_shape(a, b):
    _check_ab(a, b)
    return [*a, b[-1]]


def _forward_dtype(a, b):
    check_float(_NAME, "a", a)
    check_same_dtype(_NAME, "b", b, "a", a)
    return a


def _backward_shape(grad_out, a, b):
    _check_ab(a, b)
    if tuple(grad_out) != (*a, b[-1]):
        raise ValueError(f"{_NAME}: grad_out must have shape {(*a, b[-1])}, got {tuple(grad_out)}")
    return a, b


def _backward_dtype(grad_out, a, b):
    check_float(_NAME, "a", a)
    check_same_dtype(_NAME, "b", b, "a", a)
    check_same_dtype(_NAME, "grad_out", grad_out, "a", a)
    return a, a


def outer_product_backward_op() -> ops.Custom:
    """``(grad_out, a, b) -> (grad_a, grad_b)`` (no bprop of its own)."""
    return custom("MakeInplaceOuterProductBackward", _backward_shape, _backward_dtype)


def outer_product_op() -> ops.Custom:
    """The Custom op ``(a (..., n), b (..., m)) -> out (..., n, m)``, with its bprop.

    Example:
        >>> out = outer_product_op()(a, b)
    """
    backward = outer_product_backward_op()

    def bprop(a, b, out, dout):
        return backward(dout, a, b)

    return custom("MakeInplaceOuterProduct", _forward_shape, _forward_dtype, bprop)


def outer_product(a: ms.Tensor, b: ms.Tensor) -> ms.Tensor:
    """``a[..., :, None] * b[..., None, :]`` (PYNATIVE helper; see the op form).

    Example:
        >>> outer_product(ms.Tensor(np.ones((2, 3), np.float32)), ms.Tensor(np.ones((2, 4), np.float32))).shape
        (2, 3, 4)
    """
    return outer_product_op()(a, b)
