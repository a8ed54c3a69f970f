"""residual_mlp_: x <- x + MLP(norm(x)) (pre-norm) or x <- norm(x + MLP(x)) (post-norm), by row panels."""

from __future__ import annotations

import torch

from . import linear
from .activation import EPILOGUE_GELU, activate, activate_, check_activation
from .checks import check_operands, check_stream, wants_grad
from .norm import Norm
from .panels import check_workspace_bytes, mlp_panel_rows

_FN = "residual_mlp_"


def residual_mlp_(
    x: torch.Tensor,
    fc1_weight: torch.Tensor,
    fc2_weight: torch.Tensor,
    fc1_bias: torch.Tensor | None = None,
    fc2_bias: torch.Tensor | None = None,
    *,
    activation: str = "gelu",
    gate_weight: torch.Tensor | None = None,
    gate_bias: torch.Tensor | None = None,
    norm: Norm | None = None,
    post_norm: Norm | None = None,
    weight_layout: str = "linear",
    workspace_bytes: int | None = None,
) -> torch.Tensor:
    """Adds an MLP's output to the residual stream x, written over x a row panel at a time.

    Per panel P of rows (tokens): ``h = norm(x_P)`` (or ``x_P`` without
    ``norm``), ``t = act(h W1^T + b1)`` - gated: ``act(h Wg^T + bg) * (h W1^T
    + b1)`` (SwiGLU with ``"silu"``, GeGLU with ``"gelu"``) - then ``x_P +=
    t W2^T`` in one GEMM that accumulates into x_P (beta = 1), ``+ b2``, and
    ``post_norm`` over x_P in place. On CUDA with ``norm`` and ``b2``, ``t W2^T +
    b2`` goes over the spent ``h`` (the bias in the GEMM) and is added to x_P. Only
    one panel's ``h`` and ``t`` exist at a time. On CUDA, ``"relu"`` and
    ``"gelu_tanh"`` after a bias run in fc1's GEMM epilogue (cuBLASLt), so
    ``t`` is written once.

    Args:
        x: (..., d), contiguous, float16/bfloat16/float32/float64. Overwritten.
        fc1_weight: the up projection, (I, d) in ``"linear"`` layout (``nn.Linear``),
            (d, I) in ``"conv1d"`` layout (transformers' ``Conv1D``).
        fc2_weight: the down projection, (d, I) linear / (I, d) conv1d.
        fc1_bias, fc2_bias: optional, (I,) and (d,).
        activation: ``"gelu"`` (exact), ``"gelu_tanh"``, ``"relu"`` or ``"silu"``.
        gate_weight, gate_bias: the gate projection of a gated MLP (shaped as fc1's).
        norm: pre-norm (:class:`Norm`), applied to the MLP's input only.
        post_norm: post-norm, applied in place to the sum.
        weight_layout: ``"linear"`` or ``"conv1d"``, for all three weights.
        workspace_bytes: bound on the panel temporaries. ``None``: x's size,
            at least 8192 rows' worth, at most 1 GiB. An explicit bound below
            one row's temporaries is an error.

    Returns:
        x, holding the result, when nothing requires grad or grad mode is off.
        Under grad mode with an input requiring grad the block is computed the
        standard way, out of place: x is left unchanged and the result is a new
        tensor, with exact gradients. Always use the returned tensor.

    All tensors share x's dtype and device; every check runs before x is written.

    Example::

        >>> x = torch.randn(2, 5, 8)
        >>> w1, w2 = torch.randn(32, 8), torch.randn(8, 32)
        >>> expected = x + torch.nn.functional.gelu(x @ w1.T) @ w2.T
        >>> y = make_inplace.blocks.residual_mlp_(x, w1, w2, activation="gelu")
        >>> y is x and torch.allclose(y, expected, atol=1e-4)
        True
    """
    check_stream(_FN, x, min_dim=2)
    linear.check_layout(_FN, weight_layout)
    check_activation(_FN, activation)
    check_workspace_bytes(_FN, workspace_bytes)
    d = x.shape[-1]
    if not isinstance(fc1_weight, torch.Tensor) or fc1_weight.dim() != 2:
        raise TypeError(f"{_FN}: fc1_weight must be a 2-D torch.Tensor, got {_describe(fc1_weight)}")
    inner = linear.out_features(fc1_weight, weight_layout)
    up_shape = linear.shape(weight_layout, d, inner)
    check_operands(_FN, x, (
        ("fc1_weight", fc1_weight, up_shape, False),
        ("fc2_weight", fc2_weight, linear.shape(weight_layout, inner, d), False),
        ("fc1_bias", fc1_bias, (inner,), True),
        ("fc2_bias", fc2_bias, (d,), True),
        ("gate_weight", gate_weight, up_shape, True),
        ("gate_bias", gate_bias, (inner,), True),
    ))
    if gate_bias is not None and gate_weight is None:
        raise ValueError(f"{_FN}: gate_bias was given without gate_weight")
    for name, n in (("norm", norm), ("post_norm", post_norm)):
        if n is not None:
            Norm.check(n, _FN, name, x)

    if torch.is_grad_enabled():  # (gathering the tensors costs ~1 us, on every call otherwise)
        params = (fc1_weight, fc2_weight, fc1_bias, fc2_bias, gate_weight, gate_bias)
        norm_params = tuple(t for n in (norm, post_norm) if n is not None for t in (n.weight, n.bias))
        if wants_grad(x, *params, *norm_params):
            return _reference(x, *params, activation, norm, post_norm, weight_layout)

    rows_total = x.numel() // d if d else 0
    if rows_total == 0 or d == 0:
        return x
    gated = gate_weight is not None
    row_bytes = x.element_size() * ((d if norm is not None else 0) + inner * (2 if gated else 1))
    rows = mlp_panel_rows(_FN, rows_total, row_bytes, x.numel() * x.element_size(), workspace_bytes)

    # The activation in fc1's epilogue: t is written once instead of written, read and written again.
    # float64 keeps the separate op: an epilogue's gelu need not be float64-exact.
    fused = not gated and fc1_bias is not None and x.is_cuda and x.dtype != torch.float64 and activation in EPILOGUE_GELU
    x2d = x.view(rows_total, d)
    t_buf = x.new_empty(rows, inner)
    g_buf = x.new_empty(rows, inner) if gated else None
    for r0 in range(0, rows_total, rows):
        xp = x2d[r0 : r0 + rows]
        p = xp.shape[0]
        h = norm(xp) if norm is not None else xp
        if fused:
            t = linear.project_activated(h, fc1_weight, fc1_bias, weight_layout, gelu=EPILOGUE_GELU[activation], out=t_buf[:p])
        else:
            t = linear.project(h, fc1_weight, fc1_bias, weight_layout, out=t_buf[:p])
            if gated:
                g = linear.project(h, gate_weight, gate_bias, weight_layout, out=g_buf[:p])
                t.mul_(activate_(g, activation))
            else:
                activate_(t, activation)
        # h is spent; without a norm it is x_P itself, no scratch.
        linear.add_projection_(xp, t, fc2_weight, fc2_bias, weight_layout, scratch=h if norm is not None else None)
        del h
        if post_norm is not None:
            post_norm.apply_(xp)
    return x


def _reference(x, fc1_weight, fc2_weight, fc1_bias, fc2_bias, gate_weight, gate_bias, activation, norm, post_norm, layout):
    """The block computed the standard way, out of place (autograd records it)."""
    h = norm(x) if norm is not None else x
    shape = h.shape
    h2 = h.reshape(-1, shape[-1])
    t = activate(linear.project(h2, gate_weight if gate_weight is not None else fc1_weight,
                                gate_bias if gate_weight is not None else fc1_bias, layout), activation)
    if gate_weight is not None:
        t = t * linear.project(h2, fc1_weight, fc1_bias, layout)
    y = x + linear.project(t, fc2_weight, fc2_bias, layout).reshape(x.shape)
    return post_norm(y) if post_norm is not None else y


def _describe(t: object) -> str:
    return f"a {t.dim()}-D tensor" if isinstance(t, torch.Tensor) else type(t).__name__
