"""The main job's rows for square_matmul_ against torch.matmul."""

from __future__ import annotations

import torch

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _row(device: torch.device, rows: int, n: int, dtype: torch.dtype, workspace_bytes, label: str, compiled: dict) -> Row:
    from make_inplace import square_matmul_

    fresh_cuda_memory()
    x = torch.randn(rows, n, device=device, dtype=dtype)
    # Scaled so that repeated in-place application in the timing loop stays finite.
    w = (torch.randn(n, n, device=device, dtype=dtype) / n**0.5).to(dtype)
    expected = torch.matmul(x.double(), w.double())
    # cuBLAS handles and workspaces are created once per stream on first use:
    # warm them outside the measurement (the panel route calls mm).
    torch.matmul(x[:2], w)
    fresh_cuda_memory()
    ours_bytes = peak_extra(lambda: square_matmul_(x, w, workspace_bytes=workspace_bytes), device).reserved
    error = relative_error(x, expected)
    fresh_cuda_memory()
    torch_bytes = peak_extra(lambda: torch.matmul(x, w), device).reserved
    ours_ms = time_ms(lambda: square_matmul_(x, w, workspace_bytes=workspace_bytes), device)
    torch_ms = time_ms(lambda: torch.matmul(x, w), device)
    # One compile per shape: both workspace rows share the reference.
    if (rows, n, dtype) not in compiled:
        compiled[(rows, n, dtype)] = compiled_ms(torch.matmul, (x, w), device)
    tflops = 2 * rows * n * n / (ours_ms * 1e-3) / 1e12
    return Row(
        op=f"square_matmul_{label}",
        device=device.type,
        dtype=str(dtype).replace("torch.", ""),
        shape=f"({rows}, {n})",
        ours_ms=ours_ms,
        torch_ms=torch_ms,
        rel_error=error,
        ours_bytes=ours_bytes,
        torch_bytes=torch_bytes,
        notes=f"{tflops:.1f} TFLOP/s",
        compile_ms=compiled[(rows, n, dtype)],
    )


def rows(device: torch.device) -> list[Row]:
    if device.type == "cuda":
        shapes = [(16384, 4096, torch.bfloat16), (65536, 768, torch.bfloat16), (40000, 1024, torch.float32)]
    else:
        shapes = [(4096, 512, torch.float32)]
    out, compiled = [], {}
    for rows_, n, dtype in shapes:
        out.append(_row(device, rows_, n, dtype, None, "", compiled))
        out.append(_row(device, rows_, n, dtype, 0, "(ws=0)", compiled))
    return out
