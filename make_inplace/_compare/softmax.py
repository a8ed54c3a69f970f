"""The main job's rows for softmax_ against torch.softmax."""

from __future__ import annotations

import torch

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _row(device: torch.device, shape: tuple[int, ...], dtype: torch.dtype, scale: float | None, causal: bool) -> Row:
    from make_inplace import softmax_

    def reference(t: torch.Tensor) -> torch.Tensor:
        v = t * scale if scale is not None else t
        if causal:
            cut = torch.ones(shape[-2], shape[-1], dtype=torch.bool, device=t.device).triu(1)
            v = v.masked_fill(cut, float("-inf"))
        return torch.softmax(v, -1)

    fresh_cuda_memory()
    x = torch.randn(shape, device=device, dtype=dtype)
    expected = reference(x.double())
    ours_bytes = peak_extra(lambda: softmax_(x, -1, scale=scale, causal=causal), device).reserved
    error = relative_error(x, expected)
    fresh_cuda_memory()
    torch_bytes = peak_extra(lambda: reference(x), device).reserved
    # Repeated application keeps x a finite probability vector: safe to time in place.
    ours_ms = time_ms(lambda: softmax_(x, -1, scale=scale, causal=causal), device)
    torch_ms = time_ms(lambda: reference(x), device)
    compile_ms = compiled_ms(reference, (x,), device)
    gbps = 2 * x.nbytes / (ours_ms * 1e-3) / 1e9
    extras = (f" scale={scale}" if scale is not None else "") + (" causal" if causal else "")
    return Row(
        op="softmax_",
        device=device.type,
        dtype=str(dtype).replace("torch.", ""),
        shape=str(tuple(shape)) + extras,
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
        cases = [((4096, 4096), torch.bfloat16, None, False), ((262144, 1024), torch.bfloat16, None, False),
                 ((8, 16, 1024, 1024), torch.bfloat16, 0.125, True)]
    else:
        cases = [((512, 1024), torch.float32, None, False), ((4, 4, 128, 128), torch.float32, 0.125, True)]
    return [_row(device, *case) for case in cases]
