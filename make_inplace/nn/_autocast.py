"""The dtypes torch.autocast gives the modules' ops, so that they keep torch's
results under it: in place where the input already has that dtype, a new tensor
(as from torch's module) where it does not."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

_ELIGIBLE = (torch.float32, torch.float16, torch.bfloat16)  # autocast leaves float64 alone


def autocast_on(x: torch.Tensor) -> bool:
    """Whether torch.autocast is active on x's device (the any-autocast test
    first: without autocast it takes a fifth of the time of the device's test)."""
    return torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(x.device.type)


def linear_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype of ``F.linear(x, ...)`` under the autocast active on x's device;
    None where autocast is off there or leaves x alone."""
    if not autocast_on(x) or x.dtype not in _ELIGIBLE:
        return None
    return torch.get_autocast_dtype(x.device.type)


def layer_norm_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype of ``F.layer_norm(x, ...)`` under autocast (float32 on CUDA); None without."""
    amp = linear_dtype(x)
    return None if amp is None else _probe("layer_norm", x.device.type, x.dtype, amp)


def softmax_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype of ``torch.softmax(x, dim)`` under autocast (float32 on CUDA); None without."""
    amp = linear_dtype(x)
    return None if amp is None else _probe("softmax", x.device.type, x.dtype, amp)


@functools.lru_cache(maxsize=None)
def _probe(op: str, device_type: str, dtype: torch.dtype, amp: torch.dtype) -> torch.dtype:
    # Read from an empty call under the active autocast (amp is part of the key only).
    x = torch.empty(0, 1, device=device_type, dtype=dtype)
    if op == "layer_norm":
        return F.layer_norm(x, (1,), torch.ones(1, device=device_type)).dtype
    return torch.softmax(x, -1).dtype
