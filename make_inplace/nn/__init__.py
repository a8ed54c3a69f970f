"""Modules built on make_inplace's ops: drop-in, in-place versions of torch.nn layers."""

from .attention import InplaceMultiheadAttention
from .encoder import InplaceTransformerEncoderLayer
from .layer_norm import InplaceLayerNorm
from .linear import InplaceLinear
from .softmax import InplaceSoftmax

__all__ = ["InplaceLayerNorm", "InplaceSoftmax", "InplaceLinear", "InplaceMultiheadAttention", "InplaceTransformerEncoderLayer"]
