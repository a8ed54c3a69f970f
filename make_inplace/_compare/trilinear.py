"""The main job's rows: trilinear_interpolation forward and backward into caller buffers vs plain torch."""

from __future__ import annotations

import torch

import make_inplace

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _weights(points: torch.Tensor) -> torch.Tensor:
    u = (points + 1) / 2
    wu = torch.stack([1 - u, u], dim=-1)
    return (wu[:, 0, :, None, None] * wu[:, 1, None, :, None] * wu[:, 2, None, None, :]).reshape(-1, 8)


def _torch_forward(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    return (_weights(points)[:, :, None] * feats).sum(1)


def _torch_backward(feats, points, grad_out):
    return _with_backward(_torch_forward)(feats, points, grad_out)


def _with_backward(forward):
    """The eager backward's autograd call around a (compiled) forward."""

    def run(feats, points, grad_out):
        f, p = feats.detach().requires_grad_(), points.detach().requires_grad_()
        return torch.autograd.grad(forward(f, p), (f, p), grad_out)

    return run


def rows(device: torch.device) -> list[Row]:
    cuda = device.type == "cuda"
    n, f = (262144, 64) if cuda else (4096, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = f"N={n} F={f}"

    def inputs():
        feats = torch.randn(n, 8, f, dtype=dtype, device=device)
        points = (torch.rand(n, 3, device=device) * 2 - 1).to(dtype)
        grad_out = torch.randn(n, f, dtype=dtype, device=device)
        return feats, points, grad_out

    fresh_cuda_memory()
    feats, points, grad_out = inputs()
    out = torch.empty(n, f, dtype=dtype, device=device)
    grad_feats = torch.empty_like(feats)
    grad_points = torch.empty_like(points)

    def ours_fwd():
        return make_inplace.trilinear_interpolation(feats, points, out=out)

    def ours_bwd():
        return make_inplace.trilinear_interpolation_backward(
            grad_out, points, feats, grad_feats=grad_feats, grad_points=grad_points
        )

    ours_fwd()  # first call outside the measurement: library start-up, not the op
    mem = {
        "ours_fwd": peak_extra(ours_fwd, device).reserved,
        "torch_fwd": peak_extra(lambda: _torch_forward(feats, points), device).reserved,
        "ours_bwd": peak_extra(ours_bwd, device).reserved,
        "torch_bwd": peak_extra(lambda: _torch_backward(feats, points, grad_out), device).reserved,
    }

    ours_fwd()
    ref_out = _torch_forward(feats.double(), points.double())
    ours_bwd()
    ref_feats, ref_points = _torch_backward(feats.double(), points.double(), grad_out.double())
    bwd_error = max(relative_error(grad_feats, ref_feats), relative_error(grad_points, ref_points))

    compile_fwd = compiled_ms(_torch_forward, (feats, points), device)
    # Compiled forward, then autograd through its compiled backward (what training runs).
    compile_bwd = compiled_ms(
        _torch_forward, (feats, points), device, call=lambda fwd: lambda: _with_backward(fwd)(feats, points, grad_out)
    )
    return [
        Row(
            op="trilinear_interpolation(out=)",
            device=device.type,
            dtype=str(dtype).removeprefix("torch."),
            shape=shape,
            ours_ms=time_ms(ours_fwd, device),
            torch_ms=time_ms(lambda: _torch_forward(feats, points), device),
            rel_error=relative_error(out, ref_out),
            ours_bytes=mem["ours_fwd"],
            torch_bytes=mem["torch_fwd"],
            notes="torch: the weight formula, eager",
            compile_ms=compile_fwd,
        ),
        Row(
            op="trilinear_interpolation_backward",
            device=device.type,
            dtype=str(dtype).removeprefix("torch."),
            shape=shape,
            ours_ms=time_ms(ours_bwd, device),
            torch_ms=time_ms(lambda: _torch_backward(feats, points, grad_out), device),
            rel_error=bwd_error,
            ours_bytes=mem["ours_bwd"],
            torch_bytes=mem["torch_bwd"],
            notes="grad_feats and grad_points into caller buffers; torch: autograd fwd+bwd",
            compile_ms=compile_bwd,
        ),
    ]
