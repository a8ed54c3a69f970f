"""The functional API: one thin typed function per op."""

from .outer_product import outer_product, outer_product_backward
from .square_matmul import square_matmul_
from .trilinear import trilinear_interpolation, trilinear_interpolation_backward

__all__ = [
    "outer_product",
    "outer_product_backward",
    "square_matmul_",
    "trilinear_interpolation",
    "trilinear_interpolation_backward",
]
