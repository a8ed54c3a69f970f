"""Norm: which normalization a residual block applies (layer norm or RMS norm) and its parameters."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ops.layer_norm import layer_norm_
from ..ops.rms_norm import rms_norm_
from .checks import check_operands

KINDS = ("layer", "rms")


@dataclass(frozen=True)
class Norm:
    """A normalization over the last dimension: ``kind`` ``"layer"`` or ``"rms"``.

    ``weight``/``bias`` are optional (bias only for layer norm). ``eps``: layer
    norm defaults to 1e-5; RMS norm, as ``F.rms_norm``, to
    ``torch.finfo(x.dtype).eps``.

    Example::

        >>> norm = make_inplace.blocks.Norm.rms(torch.ones(8), eps=1e-6)
        >>> norm(torch.randn(3, 8)).shape
        torch.Size([3, 8])
    """

    kind: str
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float | None = None

    @classmethod
    def layer(cls, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5) -> "Norm":
        return cls("layer", weight, bias, eps)

    @classmethod
    def rms(cls, weight: torch.Tensor | None = None, eps: float | None = None) -> "Norm":
        return cls("rms", weight, None, eps)

    def check(self, fn: str, name: str, x: torch.Tensor) -> None:
        """Kind, eps, and parameters of shape (d,) matching x's dtype and device."""
        if not isinstance(self, Norm):
            raise TypeError(f"{fn}: {name} must be a make_inplace.blocks.Norm or None, got {type(self).__name__}")
        if self.kind not in KINDS:
            raise ValueError(f"{fn}: {name}.kind must be 'layer' or 'rms', got {self.kind!r}")
        if self.kind == "rms" and self.bias is not None:
            raise ValueError(f"{fn}: {name} is an RMS norm, which has no bias")
        if self.eps is not None and not (isinstance(self.eps, (int, float)) and self.eps >= 0):
            raise ValueError(f"{fn}: {name}.eps must be a non-negative number or None, got {self.eps!r}")
        d = x.shape[-1]
        check_operands(fn, x, ((f"{name}.weight", self.weight, (d,), True), (f"{name}.bias", self.bias, (d,), True)))

    def _eps(self, dtype: torch.dtype) -> float:
        if self.eps is not None:
            return float(self.eps)
        return 1e-5 if self.kind == "layer" else torch.finfo(dtype).eps

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """The normalized rows as a new tensor."""
        d = rows.shape[-1]
        if self.kind == "layer":
            return F.layer_norm(rows, (d,), self.weight, self.bias, self._eps(rows.dtype))
        if rows.is_cpu and not torch.is_grad_enabled():
            # torch's CPU rms_norm runs as separate pow/mean/rsqrt/mul ops (31 us for
            # 256 x 64 floats); a copy and rms_norm_'s row kernel is a few us.
            return self.apply_(rows.clone(memory_format=torch.contiguous_format))
        return F.rms_norm(rows, (d,), self.weight, self._eps(rows.dtype))

    def apply_(self, rows: torch.Tensor) -> torch.Tensor:
        """Normalizes contiguous ``rows`` in place, with no copy of them (``layer_norm_`` / ``rms_norm_``)."""
        d = rows.shape[-1]
        if self.kind == "layer":
            return layer_norm_(rows, d, self.weight, self.bias, self._eps(rows.dtype))
        return rms_norm_(rows, d, self.weight, self._eps(rows.dtype))
