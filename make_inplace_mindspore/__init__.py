"""make_inplace's kernels as MindSpore custom ops (AOT), with gradients.

The same torch-free CPU and CUDA kernels the PyTorch ops run, called through
MindSpore's ``ops.Custom(..., func_type="aot")`` from the bridge libraries
built by :mod:`make_inplace_mindspore._build`. Importing this package needs
MindSpore, not torch (it is a separate top-level package because importing
``make_inplace`` loads the torch op library).

MindSpore owns every output, so the in-place PyTorch ops are offered here as
out-of-place ops: the bridge copies the input into the output and runs the
in-place kernel there.

Each op comes in two forms: ``*_op(...)`` returns the (cached) Custom
primitive, to be made once outside compiled code and called in a Cell's
``construct`` in GRAPH mode; the plain function makes and calls it (PYNATIVE).

Example:
    >>> import mindspore as ms, numpy as np
    >>> import make_inplace_mindspore as mims
    >>> x = ms.Tensor(np.random.randn(4, 8).astype(np.float32))
    >>> w = ms.Tensor(np.random.randn(8, 8).astype(np.float32))
    >>> y = mims.square_matmul(x, w)  # x @ w
    >>> gx, gw = ms.grad(lambda x, w: mims.square_matmul(x, w).sum(), grad_position=(0, 1))(x, w)
"""

from ._library import last_error, library_path
from .layer_norm import layer_norm, layer_norm_backward_op, layer_norm_op
from .outer_product import outer_product, outer_product_backward_op, outer_product_op
from .softmax import softmax, softmax_backward_op, softmax_op
from .square_matmul import square_matmul, square_matmul_op
from .trilinear import trilinear_backward_op, trilinear_interpolation, trilinear_interpolation_op

__all__ = [
    "last_error",
    "layer_norm",
    "layer_norm_backward_op",
    "layer_norm_op",
    "library_path",
    "outer_product",
    "outer_product_backward_op",
    "outer_product_op",
    "softmax",
    "softmax_backward_op",
    "softmax_op",
    "square_matmul",
    "square_matmul_op",
    "trilinear_backward_op",
    "trilinear_interpolation",
    "trilinear_interpolation_op",
]
