"""Trilinear interpolation as MindSpore ops, differentiable in feats and points.

``out[p, c] = sum_k w_k(points[p]) * feats[p, k, c]`` with ``(u, v, w) =
(points + 1) / 2`` and corner ``k = 4i + 2j + l`` weighted
``(i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w)``; the same kernels as
``make_inplace.trilinear_interpolation`` and its backward.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ._library import check_float, check_same_dtype, custom

_NAME = "trilinear_interpolation"


def _check_shapes(feats, points) -> None:
    if len(feats) != 3 or feats[1] != 8:
        raise ValueError(f"{_NAME}: feats must have shape (N, 8, F), got {tuple(feats)}")
    if tuple(points) != (feats[0], 3):
        raise ValueError(f"{_NAME}: points must have shape ({feats[0]}, 3) to match feats, got {tuple(points)}")


def _forward_shape(feats, points):
    _check_shapes(feats, points)
    return [feats[0], feats[2]]


def _forward_dtype(feats, points):
    check_float(_NAME, "feats", feats)
    check_same_dtype(_NAME, "points", points, "feats", feats)
    return feats


def _backward_shape(grad_out, points, feats):
    _check_shapes(feats, points)
    if tuple(grad_out) != (feats[0], feats[2]):
        raise ValueError(f"{_NAME}: grad_out must have shape ({feats[0]}, {feats[2]}), got {tuple(grad_out)}")
    return feats, points


def _backward_dtype(grad_out, points, feats):
    check_float(_NAME, "feats", feats)
    check_same_dtype(_NAME, "points", points, "feats", feats)
    check_same_dtype(_NAME, "grad_out", grad_out, "feats", feats)
    return feats, feats


def trilinear_backward_op() -> ops.Custom:
    """``(grad_out, points, feats) -> (grad_feats, grad_points)`` (no bprop of its own)."""
    return custom("MakeInplaceTrilinearBackward", _backward_shape, _backward_dtype)


def trilinear_interpolation_op() -> ops.Custom:
    """The Custom op ``(feats (N, 8, F), points (N, 3)) -> out (N, F)``, with its bprop.

    Example:
        >>> out = trilinear_interpolation_op()(feats, points)
    """
    backward = trilinear_backward_op()

    def bprop(feats, points, out, dout):
        return backward(dout, points, feats)

    return custom("MakeInplaceTrilinear", _forward_shape, _forward_dtype, bprop)


def trilinear_interpolation(feats: ms.Tensor, points: ms.Tensor) -> ms.Tensor:
    """Trilinear blend of per-point corner features (PYNATIVE helper; see the op form).

    Example:
        >>> feats = ms.Tensor(np.random.randn(4, 8, 16).astype(np.float32))
        >>> points = ms.Tensor(np.random.uniform(-1, 1, (4, 3)).astype(np.float32))
        >>> trilinear_interpolation(feats, points).shape
        (4, 16)
    """
    return trilinear_interpolation_op()(feats, points)
