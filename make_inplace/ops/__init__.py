"""The functional API: one thin typed function per op."""

from .layer_norm import layer_norm_
from .outer_product import outer_product, outer_product_backward
from .rms_norm import rms_norm_
from .softmax import softmax_
from .square_matmul import square_matmul_
from .trilinear import trilinear_interpolation, trilinear_interpolation_backward

__all__ = [
    "square_matmul_",
    "softmax_",
    "layer_norm_",
    "rms_norm_",
    "trilinear_interpolation",
    "trilinear_interpolation_backward",
    "outer_product",
    "outer_product_backward",
]
