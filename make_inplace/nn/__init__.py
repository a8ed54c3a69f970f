"""Modules built on make_inplace's ops."""

from .layer_norm import InplaceLayerNorm
from .softmax import InplaceSoftmax

__all__ = ["InplaceLayerNorm", "InplaceSoftmax"]
