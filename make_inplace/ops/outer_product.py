"""outer_product: batched a[..., :, None] * b[..., None, :], into caller buffers."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import _loader
from ._common import check_devices, fail, is_compiling, validate_call

_loader.load()
_forward = torch.ops.make_inplace.outer_product
_backward = torch.ops.make_inplace.outer_product_backward
_eager = _loader.eager_entries().get("outer_product")


@torch.library.register_fake("make_inplace::outer_product")
def _(a, b, *, out):
    check_devices("outer_product", ("a", a), ("b", b), ("out", out))
    return None


@torch.library.register_fake("make_inplace::outer_product_backward")
def _(grad_out, a, b, accumulate, *, grad_a, grad_b):
    check_devices("outer_product_backward", ("grad_out", grad_out), ("a", a), ("b", b),
                  ("grad_a", grad_a), ("grad_b", grad_b))
    return None


def _result_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    # Only what is needed to size the buffer; the C++ checks cover the rest.
    for t, name, dim in ((a, "a", "n"), (b, "b", "m")):
        if t.dim() < 1:
            fail("outer_product", f"{name} must have shape (..., {dim}), got a 0-dim tensor", ValueError)
    return (*a.shape, b.shape[-1])


class _OuterProduct(torch.autograd.Function):
    """Differentiable in a and b through the backward kernel."""

    @staticmethod
    def forward(ctx, a, b):
        out = a.new_empty(_result_shape(a, b))
        _forward(a, b, out=out)
        ctx.save_for_backward(a, b)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        grad_a = a.new_empty(a.shape) if need_a else None
        grad_b = b.new_empty(b.shape) if need_b else None
        _backward(grad_out, a, b, False, grad_a=grad_a, grad_b=grad_b)
        return grad_a, grad_b


def outer_product(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Batched outer product: ``out[..., i, j] = a[..., i] * b[..., j]``.

    Args:
        a: (..., n), float16/bfloat16/float32/float64; any strides.
        b: (..., m), same leading dims, dtype and device as a; any strides.
            Any n and m, any number of batches (including 0).
        out: optional contiguous (..., n, m) buffer of a's dtype and device that
            receives the result with no other allocation. Not allowed while a
            or b requires grad under grad mode (as in torch).

    Returns:
        The (..., n, m) result (``out`` itself when given). Differentiable in a
        and b when no ``out`` is given.

    Example::

        >>> a, b = torch.randn(2, 3), torch.randn(2, 5)
        >>> out = torch.empty(2, 3, 5)
        >>> make_inplace.outer_product(a, b, out=out) is out
        True
        >>> torch.allclose(out, a[..., :, None] * b[..., None, :])
        True
    """
    if out is not None and _eager is not None and not is_compiling() and _eager(a, b, out):
        return out
    validate_call("outer_product", inputs=(("a", a), ("b", b)), buffers=(("out", out),))
    if out is not None:
        _forward(a, b, out=out)
        return out
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _OuterProduct.apply(a, b)
    result = a.new_empty(_result_shape(a, b))
    _forward(a, b, out=result)
    return result


def outer_product_backward(
    grad_out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    grad_a: torch.Tensor | None = None,
    grad_b: torch.Tensor | None = None,
    accumulate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`outer_product`: ``grad_a = grad_out @ b``, ``grad_b = a @ grad_out``.

    ``grad_a[..., i] = sum_j grad_out[..., i, j] * b[..., j]`` and
    ``grad_b[..., j] = sum_i grad_out[..., i, j] * a[..., i]``.

    Args:
        grad_out: (..., n, m), any strides; never written.
        a: (..., n); b: (..., m); same dtype and device.
        grad_a, grad_b: optional contiguous buffers shaped like a and b;
            allocated if None.
        accumulate: add into the buffers instead of overwriting them (for
            gradient accumulation). Buffers allocated here start at zero.

    Returns:
        ``(grad_a, grad_b)``.

    Example::

        >>> a, b = torch.randn(2, 3), torch.randn(2, 5)
        >>> grad_a, grad_b = make_inplace.outer_product_backward(torch.ones(2, 3, 5), a, b)
        >>> torch.allclose(grad_a, b.sum(-1, keepdim=True).expand(2, 3))
        True
    """
    validate_call(
        "outer_product_backward",
        inputs=(("grad_out", grad_out), ("a", a), ("b", b)),
        buffers=(("grad_a", grad_a), ("grad_b", grad_b)),
        differentiable=False,
    )
    alloc = a.new_zeros if accumulate else a.new_empty
    if grad_a is None:
        grad_a = alloc(a.shape)
    if grad_b is None:
        grad_b = alloc(b.shape)
    _backward(grad_out, a, b, accumulate, grad_a=grad_a, grad_b=grad_b)
    return grad_a, grad_b
