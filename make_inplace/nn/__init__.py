"""Modules: drop-in, in-place versions of torch.nn layers."""

from .attention import InplaceMultiheadAttention
from .encoder import InplaceTransformerEncoderLayer
from .linear import InplaceLinear

__all__ = ["InplaceLinear", "InplaceMultiheadAttention", "InplaceTransformerEncoderLayer"]
