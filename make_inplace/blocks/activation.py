"""The MLP activations, applied in place over a panel's intermediate."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
# Those cuBLASLt applies in a GEMM's epilogue (value: torch._addmm_activation's use_gelu).
EPILOGUE_GELU = {"relu": False, "gelu_tanh": True}


def check_activation(fn: str, activation: object) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{fn}: activation must be one of {', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")


def activate_(t: torch.Tensor, activation: str) -> torch.Tensor:
    """t <- act(t), no new tensor."""
    if activation == "gelu":
        return torch.ops.aten.gelu_(t)
    if activation == "gelu_tanh":
        return torch.ops.aten.gelu_(t, approximate="tanh")
    if activation == "relu":
        return torch.relu_(t)
    return torch.ops.aten.silu_(t)


def activate(t: torch.Tensor, activation: str) -> torch.Tensor:
    """act(t) as a new tensor (the autograd path)."""
    if activation == "gelu":
        return F.gelu(t)
    if activation == "gelu_tanh":
        return F.gelu(t, approximate="tanh")
    if activation == "relu":
        return F.relu(t)
    return F.silu(t)
