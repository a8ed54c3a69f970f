"""The main job's rows for rms_norm_ against torch.nn.functional.rms_norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _row(device: torch.device, rows: int, n: int, dtype: torch.dtype) -> Row:
    from make_inplace import rms_norm_

    fresh_cuda_memory()
    x = torch.randn(rows, n, device=device, dtype=dtype) * 2 + 1
    w = 1 + 0.1 * torch.randn(n, device=device, dtype=dtype)
    expected = F.rms_norm(x.double(), (n,), w.double(), eps=torch.finfo(dtype).eps)
    ours_bytes = peak_extra(lambda: rms_norm_(x, n, w), device).reserved
    error = relative_error(x, expected)
    fresh_cuda_memory()
    torch_bytes = peak_extra(lambda: F.rms_norm(x, (n,), w), device).reserved
    # Weights near 1: repeated application in place stays finite and nonzero.
    ours_ms = time_ms(lambda: rms_norm_(x, n, w), device)
    torch_ms = time_ms(lambda: F.rms_norm(x, (n,), w), device)
    compile_ms = compiled_ms(lambda t: F.rms_norm(t, (n,), w), (x,), device)
    gbps = 2 * x.nbytes / (ours_ms * 1e-3) / 1e9
    return Row(
        op="rms_norm_",
        device=device.type,
        dtype=str(dtype).replace("torch.", ""),
        shape=f"({rows}, {n})",
        ours_ms=ours_ms,
        torch_ms=torch_ms,
        rel_error=error,
        ours_bytes=ours_bytes,
        torch_bytes=torch_bytes,
        notes=f"{gbps:.0f} GB/s (read + write)",
        compile_ms=compile_ms,
    )


def rows(device: torch.device) -> list[Row]:
    if device.type == "cuda":
        cases = [(4096, 4096, torch.bfloat16), (1024, 65536, torch.bfloat16)]
    else:
        cases = [(512, 1024, torch.float32)]
    return [_row(device, *case) for case in cases]
