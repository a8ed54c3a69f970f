"""The functional API: one thin typed function per op."""

from .square_matmul import square_matmul_

__all__ = ["square_matmul_"]
