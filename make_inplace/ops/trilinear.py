"""trilinear_interpolation: blend each point's 8 cell-corner features, into caller buffers."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .. import _loader
from ._common import check_devices, fail, is_compiling, validate_call

_loader.load()
_forward = torch.ops.make_inplace.trilinear_interpolation
_backward = torch.ops.make_inplace.trilinear_interpolation_backward
_eager = _loader.eager_entries().get("trilinear_interpolation")


@torch.library.register_fake("make_inplace::trilinear_interpolation")
def _(feats, points, *, out):
    check_devices("trilinear_interpolation", ("feats", feats), ("points", points), ("out", out))
    return None


@torch.library.register_fake("make_inplace::trilinear_interpolation_backward")
def _(grad_out, points, feats, accumulate, *, grad_feats, grad_points):
    check_devices("trilinear_interpolation_backward", ("grad_out", grad_out), ("points", points),
                  ("feats", feats), ("grad_feats", grad_feats), ("grad_points", grad_points))
    return None


def _check_rank(op: str, t: torch.Tensor, name: str, rank: int, shape: str) -> None:
    # Only what is needed to size a buffer; the C++ checks cover the rest.
    if t.dim() != rank:
        fail(op, f"{name} must have shape {shape}, got {tuple(t.shape)}", ValueError)


class _Trilinear(torch.autograd.Function):
    """Differentiable in feats and points through the backward kernel."""

    @staticmethod
    def forward(ctx, feats, points):
        out = feats.new_empty((feats.shape[0], feats.shape[2]))
        _forward(feats, points, out=out)
        ctx.save_for_backward(feats, points)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        feats, points = ctx.saved_tensors
        need_feats, need_points = ctx.needs_input_grad
        # The op always writes grad_feats; the points gradient (and its read
        # of feats) only runs when points need it.
        grad_feats = feats.new_empty(feats.shape)
        grad_points = points.new_empty(points.shape) if need_points else None
        _backward(
            grad_out,
            points,
            feats if need_points else None,
            False,
            grad_feats=grad_feats,
            grad_points=grad_points,
        )
        return (grad_feats if need_feats else None), grad_points


def trilinear_interpolation(
    feats: torch.Tensor, points: torch.Tensor, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Trilinear blend of per-point corner features: ``out[p, c] = sum_k w_k(points[p]) feats[p, k, c]``.

    With ``(u, v, w) = (points + 1) / 2``, corner ``k = 4i + 2j + l`` (i, j, l in
    {0, 1}) has weight ``(i ? u : 1-u) * (j ? v : 1-v) * (l ? w : 1-w)``.
    Points are local coordinates in [-1, 1]; points outside that range are
    *extrapolated* with the same polynomial (no clamping), so weights can be
    negative or exceed 1 there, exactly as the formula says.

    Args:
        feats: (N, 8, F) corner features, float16/bfloat16/float32/float64.
            May be non-contiguous (read through its strides, never copied).
        points: (N, 3) local coordinates, same dtype and device as feats.
        out: optional contiguous (N, F) buffer of feats' dtype and device that
            receives the result with no other allocation. Not allowed while
            feats or points requires grad under grad mode (as in torch).

    Returns:
        The (N, F) result (``out`` itself when given). Differentiable in feats
        and points when no ``out`` is given; half types accumulate in float32.

    Example::

        >>> feats = torch.randn(4, 8, 16)
        >>> points = torch.rand(4, 3) * 2 - 1
        >>> out = torch.empty(4, 16)
        >>> make_inplace.trilinear_interpolation(feats, points, out=out) is out
        True
    """
    if out is not None and _eager is not None and not is_compiling() and _eager(feats, points, out):
        return out
    validate_call("trilinear_interpolation", inputs=(("feats", feats), ("points", points)), buffers=(("out", out),))
    if out is not None:
        _forward(feats, points, out=out)
        return out
    _check_rank("trilinear_interpolation", feats, "feats", 3, "(N, 8, F)")
    if torch.is_grad_enabled() and (feats.requires_grad or points.requires_grad):
        return _Trilinear.apply(feats, points)
    result = feats.new_empty((feats.shape[0], feats.shape[2]))
    _forward(feats, points, out=result)
    return result


def trilinear_interpolation_backward(
    grad_out: torch.Tensor,
    points: torch.Tensor,
    feats: torch.Tensor | None = None,
    *,
    grad_feats: torch.Tensor | None = None,
    grad_points: torch.Tensor | None = None,
    accumulate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of :func:`trilinear_interpolation` for a given ``grad_out``.

    ``grad_feats[p, k, c] = w_k(points[p]) * grad_out[p, c]`` always;
    ``grad_points[p] = sum_c grad_out[p, c] * d out[p, c] / d points[p]`` when
    feats is given (the gradient through the weights).

    Args:
        grad_out: (N, F), any strides; never written.
        points: (N, 3), same dtype and device.
        feats: optional (N, 8, F) corner features; needed for grad_points.
        grad_feats: optional contiguous (N, 8, F) buffer; allocated if None.
        grad_points: optional contiguous (N, 3) buffer (needs feats); allocated
            if None and feats is given.
        accumulate: add into the buffers instead of overwriting them (for
            gradient accumulation). Buffers allocated here start at zero.

    Returns:
        ``(grad_feats, grad_points)``; grad_points is None without feats.

    Example::

        >>> grad_out = torch.randn(4, 16)
        >>> points = torch.rand(4, 3) * 2 - 1
        >>> feats = torch.randn(4, 8, 16)
        >>> gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
        >>> gf.shape, gp.shape
        (torch.Size([4, 8, 16]), torch.Size([4, 3]))
    """
    validate_call(
        "trilinear_interpolation_backward",
        inputs=(("grad_out", grad_out), ("points", points), ("feats", feats)),
        buffers=(("grad_feats", grad_feats), ("grad_points", grad_points)),
        differentiable=False,
    )
    _check_rank("trilinear_interpolation_backward", grad_out, "grad_out", 2, "(N, F)")
    n, f = grad_out.shape
    alloc = grad_out.new_zeros if accumulate else grad_out.new_empty
    if grad_feats is None:
        grad_feats = alloc((n, 8, f))
    if grad_points is None and feats is not None:
        grad_points = alloc((n, 3))
    _backward(grad_out, points, feats, accumulate, grad_feats=grad_feats, grad_points=grad_points)
    return grad_feats, grad_points
