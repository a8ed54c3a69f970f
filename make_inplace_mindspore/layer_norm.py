"""Layer norm as MindSpore ops: y = (x - mean) * rstd * weight + bias.

The same kernels as ``make_inplace.layer_norm_`` and ``layer_norm_backward``:
the forward also returns the per-row mean and rstd (float32; float64 for
float64 input), and the backward rebuilds x_hat from y as the PyTorch op
does (see csrc/include/make_inplace/kernels/layer_norm.h for where that is
approximate: |weight| < 1e-5). The bridge sees x as (rows, n), n the product
of normalized_shape (the wrapper reshapes), and eps as a (1,) float64 input.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import mindspore as ms
import numpy as np
from mindspore import ops

from ._library import check_float, check_same_dtype, custom, library_path

_NAME = "layer_norm"
_KINDS = {ms.float16: 0, ms.bfloat16: 1, ms.float32: 2, ms.float64: 3}


def _suffix(has_weight: bool, has_bias: bool) -> str:
    return ("Weight" if has_weight else "") + ("Bias" if has_bias else "")


def _acc(dtype):
    return ms.float64 if dtype == ms.float64 else ms.float32


def _element(dtype):
    return dtype.element_type() if hasattr(dtype, "element_type") else dtype


def _check_affine(x, has_weight: bool, has_bias: bool, params) -> None:
    n = x[1]
    for name, present, shape in zip(("weight", "bias"), (has_weight, has_bias), params):
        if present and tuple(shape) != (n,):
            raise ValueError(f"{_NAME}: {name} must have shape ({n},) (normalized_shape flattened), got {tuple(shape)}")


def _forward_infer(has_weight: bool, has_bias: bool):
    def shape(x, *rest):
        if len(x) != 2:
            raise ValueError(f"{_NAME}: x must be 2-D (rows, n) here (the wrapper flattens it), got {tuple(x)}")
        params = iter(rest[:-1])
        _check_affine(x, has_weight, has_bias, [next(params) if has_weight else None, next(params) if has_bias else None])
        if tuple(rest[-1]) != (1,):
            raise ValueError(f"{_NAME}: eps must have shape (1,), got {tuple(rest[-1])}")
        return x, [x[0]], [x[0]]

    def dtype(x, *rest):
        check_float(_NAME, "x", x)
        for name, d in zip([n for n, p in (("weight", has_weight), ("bias", has_bias)) if p], rest[:-1]):
            check_same_dtype(_NAME, name, d, "x", x)
        if _element(rest[-1]) != ms.float64:
            raise TypeError(f"{_NAME}: eps must be float64, got {_element(rest[-1])}")
        return x, _acc(_element(x)), _acc(_element(x))

    return shape, dtype


def workspace_bytes(dtype, rows: int, n: int, weight_or_bias: bool) -> int:
    """Bytes of device workspace the backward needs (0 on the CPU)."""
    fn = ctypes.CDLL(library_path()).MakeInplaceLayerNormBackwardWorkspace
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    return int(fn(_KINDS[_element(dtype)], rows, n, int(weight_or_bias)))


def layer_norm_backward_op(has_weight: bool = True, has_bias: bool = True) -> ops.Custom:
    """``(grad_output, y, [weight], [bias], rstd) -> (grad_input, [grad_weight], [grad_bias], workspace)``."""
    name = "MakeInplaceLayerNormBackward" + _suffix(has_weight, has_bias)

    def shape(grad_output, y, *rest):
        if len(y) != 2 or tuple(grad_output) != tuple(y):
            raise ValueError(f"{_NAME}: grad_output must have the 2-D shape of y {tuple(y)}, got {tuple(grad_output)}")
        _check_affine(y, has_weight, has_bias, [rest[0] if has_weight else None, rest[int(has_weight)] if has_bias else None])
        if tuple(rest[-1]) != (y[0],):
            raise ValueError(f"{_NAME}: rstd must have shape ({y[0]},), got {tuple(rest[-1])}")
        grads = [y] + [[y[1]]] * (int(has_weight) + int(has_bias))
        # The workspace's size depends on the dtype as well; the largest (the
        # float64 accumulator) is asked for, as the shape function gets no dtypes.
        return (*grads, [workspace_bytes(ms.float64, y[0], y[1], has_weight or has_bias)])

    def dtype(grad_output, y, *rest):
        check_float(_NAME, "y", y)
        check_same_dtype(_NAME, "grad_output", grad_output, "y", y)
        return (y,) * (1 + int(has_weight) + int(has_bias)) + (ms.uint8,)

    return custom(name, shape, dtype)


def layer_norm_op(has_weight: bool = True, has_bias: bool = True) -> ops.Custom:
    """The Custom op ``(x (rows, n), [weight (n,)], [bias (n,)], eps (1,) float64) -> (y, mean, rstd)``.

    Its bprop uses the gradient of y only (mean and rstd are for the backward).

    Example:
        >>> y, mean, rstd = layer_norm_op()(x2d, w, b, ms.Tensor([1e-5], ms.float64))
    """
    backward = layer_norm_backward_op(has_weight, has_bias)
    zeros_like = ops.ZerosLike()
    shape, dtype = _forward_infer(has_weight, has_bias)

    if has_weight and has_bias:

        def bprop(x, weight, bias, eps, out, dout):
            gx, gw, gb, _ = backward(dout[0], out[0], weight, bias, out[2])
            return gx, gw, gb, zeros_like(eps)

    elif has_weight:

        def bprop(x, weight, eps, out, dout):
            gx, gw, _ = backward(dout[0], out[0], weight, out[2])
            return gx, gw, zeros_like(eps)

    elif has_bias:

        def bprop(x, bias, eps, out, dout):
            gx, gb, _ = backward(dout[0], out[0], bias, out[2])
            return gx, gb, zeros_like(eps)

    else:

        def bprop(x, eps, out, dout):
            gx, _ = backward(dout[0], out[0], out[2])
            return gx, zeros_like(eps)

    return custom("MakeInplaceLayerNorm" + _suffix(has_weight, has_bias), shape, dtype, bprop)


def layer_norm(
    x: ms.Tensor,
    normalized_shape: Sequence[int],
    weight: ms.Tensor | None = None,
    bias: ms.Tensor | None = None,
    eps: float = 1e-5,
) -> ms.Tensor:
    """Layer norm over the trailing `normalized_shape` dims of x (PYNATIVE helper).

    Example:
        >>> y = layer_norm(x, (64,), w, b)  # x: (..., 64)
    """
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or len(x.shape) < k or tuple(x.shape[len(x.shape) - k :]) != normalized_shape:
        raise ValueError(f"{_NAME}: x's trailing dims must equal normalized_shape {normalized_shape}, got {tuple(x.shape)}")
    n = int(np.prod(normalized_shape))
    op = layer_norm_op(weight is not None, bias is not None)
    rows = int(np.prod(x.shape[: len(x.shape) - k]))
    args = [ops.reshape(x, (rows, n))]
    args += [ops.reshape(t, (n,)) for t in (weight, bias) if t is not None]
    args.append(ms.Tensor([eps], ms.float64))
    y, _, _ = op(*args)
    return ops.reshape(y, x.shape)
