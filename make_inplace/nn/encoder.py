"""InplaceTransformerEncoderLayer: nn.TransformerEncoderLayer with in-place steps."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._autocast import linear_dtype
from .attention import InplaceMultiheadAttention
from .layer_norm import layer_norm_module_


def _activation_kind(activation: Callable) -> tuple[str, str]:
    """('relu' | 'gelu' | 'other', gelu approximation) for the in-place activation."""
    if activation is F.relu or activation is torch.relu or isinstance(activation, nn.ReLU):
        return "relu", "none"
    if activation is F.gelu:
        return "gelu", "none"
    if isinstance(activation, nn.GELU):
        return "gelu", activation.approximate
    return "other", "none"


def _resolve_activation(activation: str | Callable) -> Callable:
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise RuntimeError(f"InplaceTransformerEncoderLayer: activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise TypeError(f"InplaceTransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable, got {type(activation).__name__}")
    return activation


def _add_residual_(branch: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """branch + x in branch's buffer (a fresh one the layer made), or a new tensor
    where the sum is wider than branch (a float32 x plus an autocast branch), as
    torch's layer adds them."""
    if branch.dtype == x.dtype or torch.result_type(branch, x) == branch.dtype:
        return branch.add_(x)
    return branch + x


class InplaceTransformerEncoderLayer(nn.Module):
    """``nn.TransformerEncoderLayer(batch_first=True)`` with in-place steps.

    Same constructor arguments, submodule names, parameters and ``state_dict``
    as ``torch.nn.TransformerEncoderLayer`` (``self_attn``, ``linear1``,
    ``linear2``, ``norm1``, ``norm2``, dropouts, ``activation``); checkpoints
    load either way. ``batch_first`` defaults to True; False is refused.
    ``activation`` is ``"relu"``, ``"gelu"`` or a callable (``F.relu``,
    ``F.gelu``, ``nn.ReLU()``, ``nn.GELU(approximate=...)`` run in place; any
    other callable runs as given, out of place).

    The forward never writes over ``src``; it reuses the buffers it made:

    * attention: :class:`InplaceMultiheadAttention` without weights (SDPA core,
      output projection in place);
    * residual adds in place into the branch output;
    * post-norm (``norm_first=False``): both layer norms in place over the
      residual sum with ``make_inplace.layer_norm_``, which saves only its
      output for autograd (torch saves the sum as well). Pre-norm layer norms
      run out of place: their input is still needed for the residual;
    * activation and dropouts in place where autograd allows (relu always;
      gelu and dropout only without a graph, since their backward would read
      the overwritten values);
    * under ``torch.autocast``, torch's dtypes: a residual sum wider than its
      branch (float32 ``src`` plus an autocast branch) and a layer norm whose
      autocast dtype differs from its input's are new tensors, as in torch's
      layer; the rest stays in place;
    * on CUDA without a graph, ``linear1`` and ReLU as one GEMM with a bias +
      ReLU epilogue (``torch._addmm_activation``, as torch's fast path runs
      it): the feed-forward activation is written once, not written and then
      read and written again.

    Training with autograd works and matches torch's gradients. Nested
    tensors are refused: inside ``nn.TransformerEncoder`` set
    ``use_nested_tensor = False`` (``make_inplace.convert_`` does), and padded
    positions then hold computed values where torch's nested path returns zeros.

    Example::

        >>> layer = make_inplace.nn.InplaceTransformerEncoderLayer(64, 4, dim_feedforward=128).eval()
        >>> x = torch.randn(2, 10, 64)
        >>> with torch.no_grad():
        ...     y = layer(x)
        >>> y.shape
        torch.Size([2, 10, 64])
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[torch.Tensor], torch.Tensor] = F.relu,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = True,
        norm_first: bool = False,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not batch_first:
            raise ValueError(
                "InplaceTransformerEncoderLayer: batch_first must be True (inputs (N, L, E)), got False; "
                "keep torch.nn.TransformerEncoderLayer for (L, N, E) inputs"
            )
        factory = {"device": device, "dtype": dtype}
        super().__init__()
        # Same construction order as torch's layer: equal seeds give equal weights.
        self.self_attn = InplaceMultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=True, **factory)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = _resolve_activation(activation)

    @property
    def batch_first(self) -> bool:
        return True

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "InplaceTransformerEncoderLayer":
        """The in-place version of ``layer``, adopting its submodules (no weight copy).

        Parameters stay the same objects (optimizers keep working); dropout
        probabilities, activation, norm_first and train/eval mode carry over.
        """
        if not layer.self_attn.batch_first:
            raise ValueError("InplaceTransformerEncoderLayer.from_torch: layer.self_attn.batch_first must be True, got False")
        new = cls(
            layer.linear1.in_features,
            layer.self_attn.num_heads,
            dim_feedforward=layer.linear1.out_features,
            dropout=layer.dropout.p,
            activation=layer.activation,
            layer_norm_eps=layer.norm1.eps,
            norm_first=layer.norm_first,
            bias=layer.linear1.bias is not None,
            device="meta",
        )
        new.self_attn = InplaceMultiheadAttention.from_torch(layer.self_attn)
        for name in ("linear1", "dropout", "linear2", "norm1", "norm2", "dropout1", "dropout2"):
            setattr(new, name, getattr(layer, name))
        new.train(layer.training)
        return new

    def forward(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        src_key_padding_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        if src.is_nested:
            raise ValueError("InplaceTransformerEncoderLayer: nested tensors are not supported; pass a padded batch and src_key_padding_mask")
        x = src
        if self.norm_first:
            h = self._sa_block(F.layer_norm(x, self.norm1.normalized_shape, self.norm1.weight, self.norm1.bias, self.norm1.eps), src_mask, src_key_padding_mask, is_causal)
            x = _add_residual_(h, x)  # x is ours from here on
            y = self._ff_block(F.layer_norm(x, self.norm2.normalized_shape, self.norm2.weight, self.norm2.bias, self.norm2.eps))
            return _add_residual_(y, x)
        h = self._sa_block(x, src_mask, src_key_padding_mask, is_causal)
        x = layer_norm_module_(_add_residual_(h, x), self.norm1)
        y = self._ff_block(x)
        return layer_norm_module_(_add_residual_(y, x), self.norm2)

    def _dropout_(self, x: torch.Tensor, module: nn.Dropout, *, saved_by_backward: bool) -> torch.Tensor:
        if not self.training or module.p == 0.0:
            return x
        inplace = not (torch.is_grad_enabled() and x.requires_grad and saved_by_backward)
        return F.dropout(x, module.p, training=True, inplace=inplace)

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        h = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal)[0]
        # The attention output is a fresh buffer no backward reads.
        return self._dropout_(h, self.dropout1, saved_by_backward=False)

    def _ff_block(self, x):
        kind, approximate = _activation_kind(self.activation)
        if kind == "relu" and self._fused_relu_applies(x):
            # cuBLASLt's bias + ReLU epilogue: the activation is written once,
            # where linear1 then relu_ would read and write it again.
            w, b = self.linear1.weight, self.linear1.bias
            h = torch._addmm_activation(b, x.reshape(-1, x.shape[-1]), w.t()).view(*x.shape[:-1], w.shape[0])
            return self._ff_tail(h, kind)
        h = self.linear1(x)
        grad = torch.is_grad_enabled() and h.requires_grad
        if kind == "relu":
            h = torch.relu_(h)  # relu's backward reads its output, which is this buffer
        elif kind == "gelu" and not grad:
            h = torch.ops.aten.gelu_(h, approximate=approximate)
        else:
            h = self.activation(h)
        return self._ff_tail(h, kind)

    def _fused_relu_applies(self, x: torch.Tensor) -> bool:
        """Whether linear1 + ReLU can run as one GEMM with an epilogue: on CUDA,
        with a bias, outside autocast (the fused op is not on its list) and with
        no graph to record (the fused op has no backward)."""
        w, b = self.linear1.weight, self.linear1.bias
        if not x.is_cuda or b is None or x.dtype != w.dtype or linear_dtype(x) is not None:
            return False
        return not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or b.requires_grad))

    def _ff_tail(self, h: torch.Tensor, kind: str) -> torch.Tensor:
        # relu_ saved h for its backward, gelu its input; another callable may have saved either.
        h = self._dropout_(h, self.dropout, saved_by_backward=kind != "gelu")
        h = self.linear2(h)
        return self._dropout_(h, self.dropout2, saved_by_backward=False)
