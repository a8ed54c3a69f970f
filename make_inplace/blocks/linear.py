"""Weights in ``nn.Linear`` layout (out, in) or transformers' ``Conv1D`` layout (in, out)."""

from __future__ import annotations

import torch

LAYOUTS = ("linear", "conv1d")


def check_layout(fn: str, layout: object) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"{fn}: weight_layout must be 'linear' (out, in) or 'conv1d' (in, out), got {layout!r}")


def shape(layout: str, in_features: int, out_features: int) -> tuple[int, int]:
    """The weight's shape for a map from in_features to out_features."""
    return (out_features, in_features) if layout == "linear" else (in_features, out_features)


def out_features(weight: torch.Tensor, layout: str) -> int:
    return weight.shape[0] if layout == "linear" else weight.shape[1]


def in_features(weight: torch.Tensor, layout: str) -> int:
    return weight.shape[1] if layout == "linear" else weight.shape[0]


def _rhs(weight: torch.Tensor, layout: str) -> torch.Tensor:
    # A transposed view, never a copy: cuBLAS reads either orientation.
    return weight.t() if layout == "linear" else weight


def project(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """rows @ W^T (+ bias), into ``out`` when given (rows: 2-D)."""
    rhs = _rhs(weight, layout)
    if out is None:
        return torch.mm(rows, rhs) if bias is None else torch.addmm(bias, rows, rhs)
    if bias is None:
        return torch.mm(rows, rhs, out=out)
    return torch.addmm(bias, rows, rhs, out=out)


def project_activated(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, layout: str, *, gelu: bool, out: torch.Tensor) -> torch.Tensor:
    """relu (or tanh-gelu) of rows @ W^T + bias into ``out``, CUDA only: cuBLASLt
    applies both in the GEMM's epilogue. (On the CPU torch's op applies exact gelu.)"""
    return torch._addmm_activation(bias, rows, _rhs(weight, layout), use_gelu=gelu, out=out)


def add_projection_(target: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    layout: str, *, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """target += rows @ W^T (+ bias). On CUDA, with a bias and ``scratch`` (spent rows of at least target's
    elements, aliasing neither target nor rows), ``rows @ W^T + bias`` goes over scratch with the bias in the
    GEMM's epilogue and is then added: there a separate broadcast add runs at a third of the copy bandwidth.
    Otherwise one GEMM accumulating into target (beta = 1; rows and W must not alias it), then the bias: on
    the CPU the extra whole-tensor add costs more than the broadcast add it saves."""
    if bias is not None and target.is_cuda and scratch is not None and scratch.numel() >= target.numel():
        y = scratch.view(-1)[: target.numel()].view(target.shape)
        return target.add_(project(rows, weight, bias, layout, out=y))
    target.addmm_(rows, _rhs(weight, layout))
    if bias is not None:
        target.add_(bias)
    return target
