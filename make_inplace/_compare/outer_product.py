"""The main job's rows: outer_product forward and backward into caller buffers vs plain torch."""

from __future__ import annotations

import torch

import make_inplace

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _torch_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., :, None] * b[..., None, :]


def _torch_backward(grad_out, a, b):
    return torch.bmm(grad_out, b[..., None]).squeeze(-1), torch.bmm(a[:, None, :], grad_out).squeeze(1)


def rows(device: torch.device) -> list[Row]:
    cuda = device.type == "cuda"
    batch, n, m = (512, 1024, 1024) if cuda else (16, 256, 256)
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = f"B={batch} n={n} m={m}"

    fresh_cuda_memory()
    a = torch.randn(batch, n, dtype=dtype, device=device)
    b = torch.randn(batch, m, dtype=dtype, device=device)
    grad_out = torch.randn(batch, n, m, dtype=dtype, device=device)
    out = torch.empty(batch, n, m, dtype=dtype, device=device)
    grad_a, grad_b = torch.empty_like(a), torch.empty_like(b)

    def ours_fwd():
        return make_inplace.outer_product(a, b, out=out)

    def ours_bwd():
        return make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b)

    ours_fwd()  # first call outside the measurement: library start-up, not the op
    mem = {
        "ours_fwd": peak_extra(ours_fwd, device).reserved,
        "torch_fwd": peak_extra(lambda: _torch_forward(a, b), device).reserved,
        "ours_bwd": peak_extra(ours_bwd, device).reserved,
        "torch_bwd": peak_extra(lambda: _torch_backward(grad_out, a, b), device).reserved,
    }

    ours_fwd()
    fwd_error = relative_error(out, _torch_forward(a.double(), b.double()))
    ours_bwd()
    ref_a, ref_b = _torch_backward(grad_out.double(), a.double(), b.double())
    bwd_error = max(relative_error(grad_a, ref_a), relative_error(grad_b, ref_b))

    compile_fwd = compiled_ms(_torch_forward, (a, b), device)
    compile_bwd = compiled_ms(_torch_backward, (grad_out, a, b), device)
    return [
        Row(
            op="outer_product(out=)",
            device=device.type,
            dtype=str(dtype).removeprefix("torch."),
            shape=shape,
            ours_ms=time_ms(ours_fwd, device),
            torch_ms=time_ms(lambda: _torch_forward(a, b), device),
            rel_error=fwd_error,
            ours_bytes=mem["ours_fwd"],
            torch_bytes=mem["torch_fwd"],
            notes="torch: a[..., :, None] * b[..., None, :]",
            compile_ms=compile_fwd,
        ),
        Row(
            op="outer_product_backward",
            device=device.type,
            dtype=str(dtype).removeprefix("torch."),
            shape=shape,
            ours_ms=time_ms(ours_bwd, device),
            torch_ms=time_ms(lambda: _torch_backward(grad_out, a, b), device),
            rel_error=bwd_error,
            ours_bytes=mem["ours_bwd"],
            torch_bytes=mem["torch_bwd"],
            notes="grad_a and grad_b into caller buffers; torch: two bmm",
            compile_ms=compile_bwd,
        ),
    ]
