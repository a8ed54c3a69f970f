"""Rotary position embeddings applied in place (the rotate-half convention of GPT-NeoX / Llama)."""

from __future__ import annotations

import torch

from .checks import check_operands


def check_rotary(fn: str, rotary: object, x: torch.Tensor, head_dim: int) -> None:
    """rotary = (cos, sin), each (1 or batch, seq_len, head_dim) with x's dtype and device."""
    if not (isinstance(rotary, (tuple, list)) and len(rotary) == 2):
        raise TypeError(f"{fn}: rotary must be a (cos, sin) pair of tensors or None, got {type(rotary).__name__}")
    if head_dim % 2:
        raise ValueError(f"{fn}: rotary embeddings need an even head_dim, got {head_dim}")
    batch, seq_len = x.shape[0], x.shape[1]
    for name, t in zip(("cos", "sin"), rotary):
        check_operands(fn, x, ((f"rotary {name}", t, None, False),))
        if t.dim() != 3 or t.shape[0] not in (1, batch) or t.shape[1] != seq_len or t.shape[2] != head_dim:
            raise ValueError(
                f"{fn}: rotary {name} must have shape (1 or {batch}, {seq_len}, {head_dim}), got {tuple(t.shape)}"
            )


def rotary_rows(rotary: tuple[torch.Tensor, torch.Tensor], b0: int, b1: int, s0: int, s1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and the signed sin (``sin`` with its first half negated) for sequences [b0, b1) and
    positions [s0, s1), shaped to broadcast over (g, p, heads, head_dim): :func:`apply_rotary_`'s operands."""
    cos, sin = rotary
    if cos.shape[0] > 1:
        cos = cos[b0:b1]
    if sin.shape[0] > 1:
        sin = sin[b0:b1]
    signed = sin[:, s0:s1].clone(memory_format=torch.contiguous_format)
    signed[..., : signed.shape[-1] // 2].neg_()
    return cos[:, s0:s1].unsqueeze(2), signed.unsqueeze(2)


def apply_rotary_(t: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """t <- t * cos + rotate_half(t) * sin over the last dim, with one temporary of t's size.

    ``signed_sin`` is sin with its first half negated (:func:`rotary_rows`), so that
    ``rotate_half(t) * sin = [t2, t1] * signed_sin`` is one copy and one product over
    full rows (half-width strided products cost ~4x more on the CPU). Negation is
    exact, so each element is the same rounded product and sum as the out-of-place
    formula's: results match it bit for bit.
    """
    half = t.shape[-1] // 2
    rotated = torch.cat((t[..., half:], t[..., :half]), dim=-1).mul_(signed_sin)
    return t.mul_(cos).add_(rotated)
