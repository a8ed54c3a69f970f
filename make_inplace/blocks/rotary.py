"""Rotary position embeddings applied in place (the rotate-half convention of GPT-NeoX / Llama)."""

from __future__ import annotations

import torch

from .checks import check_operand


def check_rotary(fn: str, rotary: object, x: torch.Tensor, head_dim: int) -> None:
    """rotary = (cos, sin), each (1 or batch, seq_len, head_dim) with x's dtype and device."""
    if not (isinstance(rotary, (tuple, list)) and len(rotary) == 2):
        raise TypeError(f"{fn}: rotary must be a (cos, sin) pair of tensors or None, got {type(rotary).__name__}")
    if head_dim % 2:
        raise ValueError(f"{fn}: rotary embeddings need an even head_dim, got {head_dim}")
    batch, seq_len = x.shape[0], x.shape[1]
    for name, t in zip(("cos", "sin"), rotary):
        check_operand(fn, f"rotary {name}", t, x, None)
        if t.dim() != 3 or t.shape[0] not in (1, batch) or t.shape[1] != seq_len or t.shape[2] != head_dim:
            raise ValueError(
                f"{fn}: rotary {name} must have shape (1 or {batch}, {seq_len}, {head_dim}), got {tuple(t.shape)}"
            )


def rotary_rows(rotary: tuple[torch.Tensor, torch.Tensor], b0: int, b1: int, s0: int, s1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin for sequences [b0, b1) and positions [s0, s1), shaped to broadcast over (g, p, heads, head_dim)."""
    out = []
    for t in rotary:
        t = t[b0:b1] if t.shape[0] > 1 else t
        out.append(t[:, s0:s1].unsqueeze(2))
    return out[0], out[1]


def apply_rotary_(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t <- t * cos + rotate_half(t) * sin over the last dim, with two half-size temporaries.

    Each product is rounded before the sum, as the out-of-place formula does,
    so results match it bit for bit.
    """
    half = t.shape[-1] // 2
    t1, t2 = t[..., :half], t[..., half:]
    c1, c2 = cos[..., :half], cos[..., half:]
    s1, s2 = sin[..., :half], sin[..., half:]
    t2_s1 = t2 * s1
    t1_s2 = t1 * s2
    t1.mul_(c1).sub_(t2_s1)
    t2.mul_(c2).add_(t1_s2)
    return t
