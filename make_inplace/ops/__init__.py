"""The functional API: one thin typed function per op."""

from .layer_norm import layer_norm_
from .softmax import softmax_
from .square_matmul import square_matmul_

__all__ = ["square_matmul_", "softmax_", "layer_norm_"]
