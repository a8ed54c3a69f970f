"""The main job's rows for the in-place layers against their torch counterparts (inference)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from . import Row, compiled_ms
from .._measure import fresh_cuda_memory, peak_extra, relative_error, time_ms


def _fast_path(enabled: bool) -> bool:
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    return saved


def _compare(
    device: torch.device,
    op: str,
    dtype: torch.dtype,
    shape: str,
    make_input: Callable[[], torch.Tensor],
    ours: Callable[[torch.Tensor], torch.Tensor],
    reference: Callable[[torch.Tensor], torch.Tensor],
    *,
    torch_fast_path: bool,
    notes: str,
    compiled: dict | None = None,
) -> Row:
    """One row: ours vs reference on fresh inputs; memory from a cold allocator.
    ``compiled`` caches the torch.compile time per reference (rows that differ
    only in torch's eager fast path share one compile)."""
    saved = _fast_path(torch_fast_path)
    try:
        with torch.no_grad():
            small = make_input()[:1]
            ours(small.clone()), reference(small.clone())  # one-time allocations (cuBLAS workspaces)
            del small
            x = make_input()
            expected = reference(x.clone())
            error = relative_error(ours(x.clone()), expected)
            del expected, x
            # Each measurement from an emptied cache, its input made after.
            fresh_cuda_memory()
            x = make_input()
            ours_bytes = peak_extra(lambda: ours(x), device).reserved
            del x
            fresh_cuda_memory()
            x = make_input()
            torch_bytes = peak_extra(lambda: reference(x), device).reserved
            del x
            x = make_input()
            ours_ms = time_ms(lambda: ours(x), device)
            torch_ms = time_ms(lambda: reference(x), device)
            cache = {} if compiled is None else compiled
            if id(reference) not in cache:
                cache[id(reference)] = compiled_ms(reference, (x,), device)
            compile_ms = cache[id(reference)]
    finally:
        _fast_path(saved)
    return Row(
        op=op,
        device=device.type,
        dtype=str(dtype).replace("torch.", ""),
        shape=shape,
        ours_ms=ours_ms,
        torch_ms=torch_ms,
        rel_error=error,
        ours_bytes=ours_bytes,
        torch_bytes=torch_bytes,
        notes=notes,
        compile_ms=compile_ms,
    )


def rows(device: torch.device) -> list[Row]:
    from make_inplace.nn import InplaceLinear, InplaceMultiheadAttention, InplaceTransformerEncoderLayer

    if device.type == "cuda":
        dtype, n, length, d, heads, ff = torch.float16, 8, 1024, 1024, 16, 4096
    else:
        dtype, n, length, d, heads, ff = torch.float32, 2, 128, 128, 4, 512
    factory = {"device": device, "dtype": dtype}
    shape = f"({n}, {length}, {d})"
    make_input = lambda: torch.randn(n, length, d, **factory)  # noqa: E731
    out = []

    torch.manual_seed(0)
    linear = nn.Linear(d, d, **factory)
    with torch.no_grad():
        # Gain ~1, so the timing loop's repeated in-place application stays finite and nonzero.
        linear.weight.copy_(torch.randn(d, d, **factory) / d**0.5)
    inplace_linear = InplaceLinear(d, **factory).requires_grad_(False)
    inplace_linear.load_state_dict(linear.state_dict())
    out.append(
        _compare(device, "InplaceLinear", dtype, shape, make_input, inplace_linear, linear, torch_fast_path=True, notes="vs nn.Linear; output over the input")
    )

    mha = nn.MultiheadAttention(d, heads, batch_first=True, **factory).eval()
    ours_mha = InplaceMultiheadAttention.from_torch(mha)
    for need in (True, False):
        out.append(
            _compare(
                device,
                f"InplaceMultiheadAttention(need_weights={need})",
                dtype,
                shape + f" h={heads}",
                make_input,
                lambda x: ours_mha(x, x, x, need_weights=need, average_attn_weights=False)[0],
                lambda x: mha(x, x, x, need_weights=need, average_attn_weights=False)[0],
                torch_fast_path=True,
                notes="vs nn.MultiheadAttention (eval, its fast path allowed)"
                + ("; probabilities in place of the scores" if need else "; SDPA core, out_proj in place"),
            )
        )

    layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, **factory).eval()
    ours_layer = InplaceTransformerEncoderLayer.from_torch(layer)
    compiled: dict = {}
    for fast in (False, True):
        out.append(
            _compare(
                device,
                "InplaceTransformerEncoderLayer vs " + ("fast path" if fast else "eager"),
                dtype,
                shape + f" h={heads} ff={ff}",
                make_input,
                ours_layer,
                layer,
                torch_fast_path=fast,
                notes="vs nn.TransformerEncoderLayer " + ("native fast path" if fast else "eager (fast path off)"),
                compiled=compiled,
            )
        )
    return out
