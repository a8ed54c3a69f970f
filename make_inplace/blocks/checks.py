"""Argument checks shared by the residual blocks: everything is checked before x is written."""

from __future__ import annotations

from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_stream(fn: str, x: object, *, min_dim: int, max_dim: int | None = None) -> None:
    """x: a contiguous floating tensor with min_dim..max_dim dimensions."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.dim() < min_dim or (max_dim is not None and x.dim() > max_dim):
        want = f"{min_dim}" if max_dim == min_dim else f"at least {min_dim}" if max_dim is None else f"{min_dim} to {max_dim}"
        raise ValueError(f"{fn}: x must have {want} dimensions, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{fn}: x must be contiguous (it is overwritten row panel by row panel), got strides {x.stride()}")
    if x.is_nested:
        raise ValueError(f"{fn}: x must not be a nested tensor")


def check_operand(fn: str, name: str, t: object, x: torch.Tensor, shape: Sequence[int] | None, *, optional: bool = False) -> None:
    """A weight, bias or table: x's dtype and device, the given shape, no memory shared with x."""
    if t is None:
        if optional:
            return
        raise TypeError(f"{fn}: {name} is required, got None")
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.device != x.device:
        raise ValueError(f"{fn}: x is on {x.device} but {name} is on {t.device}; put x on the weights' device")
    if t.dtype != x.dtype:
        raise TypeError(f"{fn}: x has dtype {x.dtype} but {name} has dtype {t.dtype}; they must match")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.numel() and x.numel() and _overlaps(t, x):
        raise ValueError(f"{fn}: {name} shares memory with x, which is overwritten; pass a separate tensor")


def check_operands(fn: str, x: torch.Tensor, operands: Sequence[tuple[str, object, Sequence[int] | None, bool]]) -> None:
    """:func:`check_operand` of each ``(name, t, shape, optional)``, in order.

    The common case (a tensor of x's dtype and device, of the given shape, in
    another storage) is one test, with x's attributes read once: these checks
    run on every block call, ~14 per layer. Anything else takes check_operand,
    which raises its error or passes (an empty tensor, a disjoint part of x's storage).
    """
    dtype, device = x.dtype, x.device
    storage = x.untyped_storage().data_ptr()
    for name, t, shape, optional in operands:
        if t is None and optional:
            continue
        if not (
            isinstance(t, torch.Tensor)
            and t.dtype == dtype
            and t.device == device
            and (shape is None or t.shape == shape)
            and t.untyped_storage().data_ptr() != storage
        ):
            check_operand(fn, name, t, x, shape, optional=optional)


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, a1 = _byte_span(a)
    b0, b1 = _byte_span(b)
    return a0 < b1 and b0 < a1


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record this call: grad mode on and some input requiring grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
