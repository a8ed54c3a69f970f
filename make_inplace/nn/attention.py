"""InplaceMultiheadAttention: nn.MultiheadAttention that reuses its big buffers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.softmax import softmax_
from ._autocast import softmax_dtype
from .linear import linear_maybe_inplace

# Which attention core runs when the caller does not need the weights.
CORES = ("auto", "materialized")


def _check_mask_dtype(mask: torch.Tensor, name: str) -> None:
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"InplaceMultiheadAttention: {name} must be bool or floating point, got {mask.dtype}")


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool 'True = masked out' mask as an additive float mask (-inf where masked)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


class InplaceMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention(batch_first=True)`` that writes over its own buffers.

    Same constructor arguments, parameters (``in_proj_weight``/``in_proj_bias``
    or ``q/k/v_proj_weight``, ``out_proj``), initialization and ``state_dict``
    as ``torch.nn.MultiheadAttention``; it is a subclass, so isinstance checks
    keep working. Inputs are batch first: ``batch_first`` defaults to True and
    False is refused, as are ``add_bias_kv`` and ``add_zero_attn``.

    Forward has torch's signature and outputs. Where memory goes:

    * ``need_weights=True`` (or ``core="materialized"``): the scores
      ``q @ k^T`` are the one (N, H, L, S) buffer; ``make_inplace.softmax_``
      turns them into probabilities in place (scale, masks and causal fused),
      where torch keeps scores and probabilities side by side. The returned
      per-head weights are that buffer; averaged weights are its head mean.
    * ``need_weights=False`` with ``core="auto"`` (default): nothing of size
      L x S is materialized; ``torch.nn.functional.scaled_dot_product_attention``
      runs (flash / memory-efficient kernels on CUDA), the lowest-memory exact
      core torch has.
    * the output projection runs in place over the attention output through
      ``make_inplace.square_matmul_`` when autograd allows it (no grad, or a
      frozen ``out_proj.weight`` with a buffer no backward reads), with a
      workspace of one activation carved from the memory q, k, v and the
      scores leave behind (so it runs as whole cuBLAS panels without raising
      the layer's peak); otherwise out of place, as torch does.

    Masks: ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or
    (N * num_heads, L, S), bool (True = masked out) or float (added). As in
    torch, ``is_causal`` is a hint that ``attn_mask`` is the causal mask; it
    is then applied as a causal flag rather than read from the mask. Unlike
    torch, ``is_causal=True`` with no ``attn_mask`` applies the causal mask
    (top-left aligned, as in ``scaled_dot_product_attention``) instead of
    raising. A query row with every key masked gives NaN, as in torch.

    Example::

        >>> mha = make_inplace.nn.InplaceMultiheadAttention(64, 4)
        >>> x = torch.randn(2, 10, 64)
        >>> with torch.no_grad():
        ...     out, weights = mha(x, x, x)
        >>> out.shape, weights.shape
        (torch.Size([2, 10, 64]), torch.Size([2, 10, 10]))
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        core: str = "auto",
    ) -> None:
        if not batch_first:
            raise ValueError(
                "InplaceMultiheadAttention: batch_first must be True (inputs (N, L, E)), got False; "
                "transpose (L, N, E) inputs to (N, L, E) or keep torch.nn.MultiheadAttention"
            )
        if add_bias_kv:
            raise ValueError("InplaceMultiheadAttention: add_bias_kv=True is not supported; keep torch.nn.MultiheadAttention")
        if add_zero_attn:
            raise ValueError("InplaceMultiheadAttention: add_zero_attn=True is not supported; keep torch.nn.MultiheadAttention")
        super().__init__(embed_dim, num_heads, dropout, bias, False, False, kdim, vdim, True, device, dtype)
        self.core = core

    @property
    def core(self) -> str:
        """``"auto"``: SDPA when no weights are asked for; ``"materialized"``: always scores + softmax_ in place."""
        return self._core

    @core.setter
    def core(self, value: str) -> None:
        if value not in CORES:
            raise ValueError(f"InplaceMultiheadAttention: core must be one of {CORES}, got {value!r}")
        self._core = value

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> "InplaceMultiheadAttention":
        """The in-place version of ``mha``, sharing its Parameter objects (no copy).

        Optimizers holding mha's parameters keep working; train/eval mode is kept.
        """
        if not mha.batch_first:
            raise ValueError("InplaceMultiheadAttention.from_torch: mha.batch_first must be True, got False")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("InplaceMultiheadAttention.from_torch: add_bias_kv / add_zero_attn are not supported")
        new = cls(
            mha.embed_dim,
            mha.num_heads,
            dropout=mha.dropout,
            bias=mha.in_proj_bias is not None,
            kdim=mha.kdim,
            vdim=mha.vdim,
            device="meta",
        )
        for name, param in mha._parameters.items():
            new.register_parameter(name, param)
        new.out_proj = mha.out_proj
        new.train(mha.training)
        return new

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if query.is_nested or key.is_nested or value.is_nested:
            raise ValueError("InplaceMultiheadAttention: nested tensors are not supported; pass a padded batch and key_padding_mask")
        if query.dim() not in (2, 3):
            raise ValueError(f"InplaceMultiheadAttention: query must be (N, L, E) or unbatched (L, E), got shape {tuple(query.shape)}")
        batched = query.dim() == 3
        if not batched:
            # Keep the `is` relations that select the packed projections.
            same_qk, same_kv = query is key, key is value
            query = query.unsqueeze(0)
            key = query if same_qk else key.unsqueeze(0)
            value = key if same_kv else value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if key.dim() != 3 or value.dim() != 3:
            raise ValueError(
                f"InplaceMultiheadAttention: key and value must have query's rank; got query {tuple(query.shape)}, "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        n, tgt_len, e = query.shape
        src_len = key.shape[1]
        if e != self.embed_dim:
            raise ValueError(f"InplaceMultiheadAttention: query's last dim must be embed_dim={self.embed_dim}, got {e}")
        if key.shape[:2] != (n, src_len) or value.shape[:2] != (n, src_len):
            raise ValueError(
                f"InplaceMultiheadAttention: key and value must be (N, S, .) with query's N={n}; got key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        head_dim = self.head_dim

        materialize = need_weights or self.core == "materialized"
        w_in, b_in = self.in_proj_weight, self.in_proj_bias
        # CPU, materialized self-attention without a graph: torch's own fused
        # op (no autograd) adds the bias, scales q and lays q, k, v out as the
        # contiguous (N, H, L, D) heads CPU BLAS needs, so each product is one
        # batched GEMM over the folded (N, H) dim. CUDA reads the projection in
        # place instead (per-batch strided GEMMs): there the heads' copy would
        # sit beside the projection's cached segment, two activations more
        # reserved at the peak.
        fused = (
            materialize
            and not query.is_cuda
            and query is key
            and key is value
            and w_in is not None
            and b_in is not None
            and not (torch.is_grad_enabled() and (query.requires_grad or w_in.requires_grad or b_in.requires_grad))
        )
        if fused:
            proj = F.linear(query, w_in)
            q, k, v = torch._transform_bias_rescale_qkv(proj, b_in, self.num_heads)
            del proj
        else:
            q, k, v = self._project(query, key, value, n, tgt_len, src_len)
        causal, additive, sdpa_mask = self._masks(
            attn_mask, key_padding_mask, is_causal, n, tgt_len, src_len, q.dtype, q.device, materialize
        )
        dropout_p = self.dropout if self.training else 0.0

        weights = None
        if fused:
            heads, folded = self.num_heads, (-1, tgt_len, head_dim)
            scores = torch.bmm(q.view(folded), k.view(folded).transpose(1, 2)).view(n, heads, tgt_len, tgt_len)
            probs = softmax_(scores, -1, scale=1.0, causal=causal, mask=additive)  # q came scaled
            del scores
            if dropout_p > 0.0:
                probs = F.dropout(probs, dropout_p, training=True, inplace=True)
            # q and k are dead: q's memory takes probs @ v, k's the (N, L, H, D)
            # layout the output projection reads, so nothing new is allocated.
            torch.bmm(probs.view(-1, tgt_len, tgt_len), v.view(folded), out=q.view(folded))
            attn = k.view(n, tgt_len, heads, head_dim).copy_(q.view(n, heads, tgt_len, head_dim).transpose(1, 2))
            attn = attn.view(n, tgt_len, e)
            if need_weights:
                weights = _attention_weights(probs, average_attn_weights)
            del probs, q, k, v
            owned = True
        elif materialize:
            graph = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            # Per-batch strided GEMMs (no copies of q, k, v) on CUDA; CPU BLAS is
            # slow on these strides, so CPU takes copies instead.
            strided = not graph and q.is_cuda
            if not strided and q.shape == k.shape == v.shape:
                # One copy of all three in (N, H, L, D) layout (where torch.matmul would make a copy
                # of each, k's transposed), then GEMMs on contiguous heads, which CPU BLAS runs faster.
                q, k, v = torch.stack((q, k, v)).unbind(0)
            scores = _batched_matmul(q, k.transpose(-2, -1), strided)  # (N, H, L, S): the one big buffer
            del q, k
            probs = softmax_(scores, -1, scale=1.0 / math.sqrt(head_dim), causal=causal, mask=additive)
            del scores
            if dropout_p > 0.0:
                # Out of place under autograd: softmax_ saved the probabilities for its backward.
                probs = F.dropout(probs, dropout_p, training=True, inplace=not (torch.is_grad_enabled() and probs.requires_grad))
            attn = _weighted_values(probs, v, strided)
            if need_weights:
                weights = _attention_weights(probs, average_attn_weights)
            del probs, v
            owned = True  # matmul's backward reads its inputs, never its output
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, dropout_p=dropout_p, is_causal=causal)
            del q, k, v
            # SDPA's backward reads its output: overwrite it only when no graph is kept.
            owned = not (torch.is_grad_enabled() and out.requires_grad)
            # contiguous, not reshape: with head_dim 1 reshape returns a strided view,
            # which the in-place projection refuses.
            attn = out.transpose(1, 2).contiguous().view(n, tgt_len, e)
            del out
        if owned:
            # q (attn's size; with the packed projection, k and v beside it) and
            # the scores are dead by now, and their memory is cached by the
            # allocator: a workspace of attn's size is carved from it, so the
            # in-place projection runs as whole cuBLAS panels instead of the
            # slower zero-workspace kernel, and the layer's peak (the scores, or
            # q, k, v and the core's output together) does not move.
            attn, _ = linear_maybe_inplace(attn, self.out_proj.weight, self.out_proj.bias, workspace_bytes=attn.nbytes)
        else:
            attn = F.linear(attn, self.out_proj.weight, self.out_proj.bias)
        if not batched:
            attn = attn.squeeze(0)
            if weights is not None:
                weights = weights.squeeze(0)
        return attn, weights

    def _project(self, query, key, value, n, tgt_len, src_len):
        """q (N, H, L, D), k and v (N, H, S, D) as views of the projections."""
        e, heads, head_dim = self.embed_dim, self.num_heads, self.head_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            if query is key and key is value:
                proj = F.linear(query, w, b).view(n, tgt_len, 3, heads, head_dim)
                q, k, v = proj.unbind(2)
            elif key is value:
                q = F.linear(query, w[:e], bq).view(n, tgt_len, heads, head_dim)
                k, v = F.linear(key, w[e:], None if b is None else b[e:]).view(n, src_len, 2, heads, head_dim).unbind(2)
            else:
                q = F.linear(query, w[:e], bq).view(n, tgt_len, heads, head_dim)
                k = F.linear(key, w[e : 2 * e], bk).view(n, src_len, heads, head_dim)
                v = F.linear(value, w[2 * e :], bv).view(n, src_len, heads, head_dim)
        else:
            q = F.linear(query, self.q_proj_weight, bq).view(n, tgt_len, heads, head_dim)
            k = F.linear(key, self.k_proj_weight, bk).view(n, src_len, heads, head_dim)
            v = F.linear(value, self.v_proj_weight, bv).view(n, src_len, heads, head_dim)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _masks(self, attn_mask, key_padding_mask, is_causal, n, tgt_len, src_len, dtype, device, materialize):
        """(causal flag, additive mask for softmax_, mask for SDPA), broadcastable to (N, H, L, S).

        Masks are never expanded to the full scores shape: a 2-D attn_mask stays
        (L, S) and a key padding mask (N, 1, 1, S); only both together make an
        (N, 1 or H, L, S) sum, as torch also does.
        """
        heads = self.num_heads
        if attn_mask is not None:
            _check_mask_dtype(attn_mask, "attn_mask")
            if attn_mask.dim() == 2:
                if attn_mask.shape != (tgt_len, src_len):
                    raise ValueError(f"InplaceMultiheadAttention: 2-D attn_mask must be (L, S)=({tgt_len}, {src_len}), got {tuple(attn_mask.shape)}")
            elif attn_mask.dim() == 3:
                if attn_mask.shape != (n * heads, tgt_len, src_len):
                    raise ValueError(
                        f"InplaceMultiheadAttention: 3-D attn_mask must be (N*num_heads, L, S)=({n * heads}, {tgt_len}, {src_len}), "
                        f"got {tuple(attn_mask.shape)}"
                    )
                attn_mask = attn_mask.view(n, heads, tgt_len, src_len)
            else:
                raise ValueError(f"InplaceMultiheadAttention: attn_mask must be 2-D or 3-D, got {attn_mask.dim()}-D")
        if key_padding_mask is not None:
            _check_mask_dtype(key_padding_mask, "key_padding_mask")
            if key_padding_mask.shape != (n, src_len):
                raise ValueError(f"InplaceMultiheadAttention: key_padding_mask must be (N, S)=({n}, {src_len}), got {tuple(key_padding_mask.shape)}")
            key_padding_mask = key_padding_mask.view(n, 1, 1, src_len)

        causal = bool(is_causal)
        if causal:
            # The hint says attn_mask is the causal mask: apply it as a flag, unread.
            attn_mask = None
        if materialize:
            masks = [_additive(m, dtype) for m in (attn_mask, key_padding_mask) if m is not None]
            additive = masks[0] if len(masks) == 1 else (masks[0] + masks[1] if masks else None)
            return causal, additive, None
        if causal and key_padding_mask is not None:
            # SDPA takes a causal flag or a mask, not both: spell the causal part out.
            attn_mask = torch.ones(tgt_len, src_len, dtype=torch.bool, device=device).triu_(1)
            causal = False
        masks = [m for m in (attn_mask, key_padding_mask) if m is not None]
        if not masks:
            return causal, None, None
        if all(m.dtype == torch.bool for m in masks):
            blocked = masks[0] if len(masks) == 1 else masks[0] | masks[1]
            return causal, None, ~blocked  # SDPA's bool masks mark the allowed positions
        masks = [_additive(m, dtype) for m in masks]
        return causal, None, masks[0] if len(masks) == 1 else masks[0] + masks[1]


def _bmm_per_batch_(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, heads_last: bool) -> None:
    """out[i] = a[i] @ b[i] for each entry i of the leading dim: one strided-batched
    GEMM per entry, written straight into out's memory (no copy of a, b or the product).

    ``heads_last``: out is (N, L, H, D) and entry i's (H, L, D) product goes to
    ``out[i].transpose(0, 1)``, a strided view cuBLAS writes as it is.
    """
    for i in range(a.shape[0]):
        torch.bmm(a[i], b[i], out=out[i].transpose(0, 1) if heads_last else out[i])


# The same as an opaque op for torch.compile: dynamo refuses torch.bmm with a
# non-contiguous out= (the heads-last view), and would turn a contiguous one into
# a product plus a copy. Traced as one op that writes into ``out`` (which inductor
# keeps in place), the compiled layer makes the same writes into the same buffers
# as eager. Eager calls the function directly (no dispatch overhead).
_bmm_per_batch_op = torch.library.custom_op("make_inplace::_attention_bmm_per_batch_", mutates_args=("out",))(
    _bmm_per_batch_
)


@_bmm_per_batch_op.register_fake
def _(a, b, out, heads_last):
    return None


def _bmm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, heads_last: bool) -> None:
    if torch.compiler.is_compiling():
        _bmm_per_batch_op(a, b, out, heads_last)
    else:
        _bmm_per_batch_(a, b, out, heads_last)


def _batched_matmul(a: torch.Tensor, b: torch.Tensor, strided: bool) -> torch.Tensor:
    """a @ b over (N, H) batches of views.

    torch.matmul folds (N, H) into one batch dim, which copies views whose N
    and H strides do not chain (q, k and v are views of the packed
    projection). With ``strided`` (no autograd graph: ``out=`` is refused
    under one), one strided-batched GEMM per batch entry writes straight into
    the result instead, with no copy of a or b.
    """
    if not strided:
        # bmm over the folded (N, H) dim: torch.matmul's own folding, with less dispatch.
        return torch.bmm(a.reshape(-1, a.shape[2], a.shape[3]), b.reshape(-1, b.shape[2], b.shape[3])).view(
            a.shape[0], a.shape[1], a.shape[2], b.shape[3]
        )
    out = a.new_empty(a.shape[0], a.shape[1], a.shape[2], b.shape[3])
    _bmm_into(a, b, out, heads_last=False)
    return out


def _weighted_values(probs: torch.Tensor, v: torch.Tensor, strided: bool) -> torch.Tensor:
    """probs (N, H, L, S) @ v (N, H, S, D) as the (N, L, H * D) input of the output projection.

    With ``strided``, each batch entry's GEMM writes straight into the
    (N, L, H, D) layout; otherwise torch.matmul and a transposing copy.
    """
    n, heads, tgt_len, _ = probs.shape
    head_dim = v.shape[-1]
    if not strided:
        # contiguous, not reshape: with head_dim 1 reshape returns a strided view.
        heads_out = _batched_matmul(probs, v, strided=False)
        return heads_out.transpose(1, 2).contiguous().view(n, tgt_len, heads * head_dim)
    out = probs.new_empty(n, tgt_len, heads, head_dim)
    _bmm_into(probs, v, out, heads_last=True)
    return out.view(n, tgt_len, heads * head_dim)


def _attention_weights(probs: torch.Tensor, average: bool) -> torch.Tensor:
    """The weights returned, in the dtype of torch's softmax (float32 under CUDA
    autocast, where the probabilities themselves stay in the scores' dtype)."""
    dtype = softmax_dtype(probs)
    if dtype is not None and dtype != probs.dtype:
        probs = probs.to(dtype)
    return probs.mean(dim=1) if average else probs
