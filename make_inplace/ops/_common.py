"""Checks that need Python (autograd state), shared by the op wrappers."""

from __future__ import annotations

import torch


def check_leaf_inplace(x: torch.Tensor, name: str) -> None:
    """Refuses, before anything is written, what torch refuses for in-place ops."""
    if torch.is_grad_enabled() and x.requires_grad and x.is_leaf:
        raise RuntimeError(
            f"a leaf Variable that requires grad is being used in an in-place operation "
            f"({name}); clone it first or run under torch.no_grad()"
        )


def check_out_without_grad(op: str, out_name: str, *inputs: torch.Tensor | None) -> None:
    """As in torch: out= under grad mode with an input requiring grad is an error."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs):
        raise RuntimeError(
            f"{op}: {out_name}= arguments don't support automatic differentiation, "
            "but one of the arguments requires grad; drop the buffer or run under torch.no_grad()"
        )
