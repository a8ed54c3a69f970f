"""residual_attention_: x <- x + Attention(norm(x)) W_o^T (pre-norm) or norm(x + ...) (post-norm), by row panels."""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from . import linear
from .checks import check_operands, check_stream, wants_grad
from .norm import Norm
from .panels import AttentionPlan, FlashSplitKV, attention_plan, check_workspace_bytes
from .rotary import apply_rotary_, check_rotary, rotary_rows

_FN = "residual_attention_"


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


KVUpdate = Callable[[torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


def residual_attention_(
    x: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    o_weight: torch.Tensor,
    q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
    v_bias: torch.Tensor | None = None,
    o_bias: torch.Tensor | None = None,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    norm: Norm | None = None,
    post_norm: Norm | None = None,
    causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    scale: float | None = None,
    weight_layout: str = "linear",
    kv_update: KVUpdate | None = None,
    workspace_bytes: int | None = None,
) -> torch.Tensor:
    """Adds a self-attention block's output to the residual stream x, written over x by row panels.

    K and V are made whole for a group of sequences (attention needs all keys
    of a sequence); queries are made and consumed by panels: ``q_P`` ->
    ``scaled_dot_product_attention(q_P, K, V)`` (flash / memory-efficient
    kernels where the device has them; scores are never stored) -> ``x_P +=
    o_P W_o^T`` in one GEMM accumulating into x_P, ``+ b_o`` (on CUDA with
    ``b_o``: ``o_P W_o^T + b_o`` over the spent ``q_P``, then added), then
    ``post_norm`` over x_P in place. K and V come from ``norm(x)`` (pre-norm)
    or x itself, before any row of their sequences is written.

    Args:
        x: (batch, seq_len, d), contiguous, float16/bfloat16/float32/float64. Overwritten.
        q_weight, k_weight, v_weight: projections to ``num_heads * head_dim``
            (q) and ``num_kv_heads * head_dim`` (k, v) features; (out, d) in
            ``"linear"`` layout, (d, out) in ``"conv1d"`` layout. Views such as
            column slices of a fused QKV weight are read without a copy.
        o_weight: the output projection, (d, num_heads * head_dim) linear.
        q_bias, k_bias, v_bias, o_bias: optional biases.
        num_heads: query heads; ``head_dim`` is q's features / num_heads.
        num_kv_heads: key/value heads (grouped-query attention); default num_heads.
        norm, post_norm: pre-norm of the block's input / post-norm of the sum (:class:`Norm`).
        causal: query i (of the seq_len new ones) sees keys up to position
            ``kv_len - seq_len + i`` (lower-right alignment; ``kv_len`` is
            seq_len without a cache). Not with ``attn_mask``.
        attn_mask: bool (True = attend) or additive float mask of shape
            (1|batch, 1|num_heads, 1|seq_len, kv_len), as
            ``scaled_dot_product_attention`` takes it.
        rotary: (cos, sin) of shape (1|batch, seq_len, head_dim), applied in
            place to q and k (rotate-half convention).
        scale: softmax scale; default ``head_dim ** -0.5``.
        weight_layout: ``"linear"`` or ``"conv1d"`` for all four weights.
        kv_update: a KV cache: called once with this call's keys and values,
            each (batch, num_kv_heads, seq_len, head_dim) after rotary, and
            returns the keys and values to attend to, (batch, num_kv_heads,
            kv_len, head_dim) (for example ``lambda k, v: cache.update(k, v,
            layer_idx)`` of transformers). It is called before x is written.
        workspace_bytes: bound on the temporaries besides what the cache
            keeps, the attention kernel's own scratch included (on CUDA,
            FlashAttention's split-KV accumulators of panels with few query
            rows: see ``panels.FlashSplitKV``). ``None``: x's size, at least
            8192 query rows' worth, at most 1 GiB. An explicit bound below one
            sequence's K and V plus one query row (and the kernel's scratch for
            it) is an error.

    Returns:
        x, holding the result, when nothing requires grad or grad mode is off.
        Under grad mode with an input requiring grad the block is computed the
        standard way, out of place, and x is left unchanged. Always use the
        returned tensor.

    Example::

        >>> x = torch.randn(2, 6, 16)
        >>> wq, wk, wv, wo = (torch.randn(16, 16) / 4 for _ in range(4))
        >>> q, k, v = ((x @ w.T).view(2, 6, 4, 4).transpose(1, 2) for w in (wq, wk, wv))
        >>> o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> expected = x + o.transpose(1, 2).reshape(2, 6, 16) @ wo.T
        >>> y = make_inplace.blocks.residual_attention_(x, wq, wk, wv, wo, num_heads=4, causal=True)
        >>> y is x and torch.allclose(y, expected, atol=1e-5)
        True
    """
    shapes = _check(x, q_weight, k_weight, v_weight, o_weight, q_bias, k_bias, v_bias, o_bias,
                    num_heads, num_kv_heads, norm, post_norm, causal, attn_mask, rotary, scale, weight_layout,
                    kv_update, workspace_bytes)
    heads, kv_heads, head_dim = shapes
    scale = head_dim ** -0.5 if scale is None else float(scale)
    block = _Block(x, (q_weight, k_weight, v_weight, o_weight), (q_bias, k_bias, v_bias, o_bias),
                   heads, kv_heads, head_dim, norm, post_norm, causal, attn_mask, rotary, scale, weight_layout)
    if torch.is_grad_enabled():  # (gathering the tensors costs ~1 us, on every call otherwise)
        params = (q_weight, k_weight, v_weight, o_weight, q_bias, k_bias, v_bias, o_bias)
        norm_params = tuple(t for n in (norm, post_norm) if n is not None for t in (n.weight, n.bias))
        if wants_grad(x, *params, *norm_params, *(rotary or ()), attn_mask):
            return block.reference(kv_update)
    if x.numel() == 0:
        return x
    return block.run_(kv_update, workspace_bytes)


def _check(x, q_weight, k_weight, v_weight, o_weight, q_bias, k_bias, v_bias, o_bias, num_heads, num_kv_heads,
           norm, post_norm, causal, attn_mask, rotary, scale, layout, kv_update, workspace_bytes) -> tuple[int, int, int]:
    check_stream(_FN, x, min_dim=3, max_dim=3)
    linear.check_layout(_FN, layout)
    check_workspace_bytes(_FN, workspace_bytes)
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"{_FN}: num_heads must be a positive int, got {num_heads!r}")
    kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or num_heads % kv_heads:
        raise ValueError(f"{_FN}: num_kv_heads must be a positive int dividing num_heads={num_heads}, got {num_kv_heads!r}")
    d = x.shape[-1]
    if not isinstance(q_weight, torch.Tensor) or q_weight.dim() != 2:
        raise TypeError(f"{_FN}: q_weight must be a 2-D torch.Tensor, got {type(q_weight).__name__}")
    q_features = linear.out_features(q_weight, layout)
    if q_features % num_heads:
        raise ValueError(f"{_FN}: q_weight's {q_features} output features are not a multiple of num_heads={num_heads}")
    head_dim = q_features // num_heads
    kv_features = kv_heads * head_dim
    kv_shape = linear.shape(layout, d, kv_features)
    check_operands(_FN, x, (
        ("q_weight", q_weight, linear.shape(layout, d, q_features), False),
        ("k_weight", k_weight, kv_shape, False),
        ("v_weight", v_weight, kv_shape, False),
        ("o_weight", o_weight, linear.shape(layout, q_features, d), False),
        ("q_bias", q_bias, (q_features,), True),
        ("k_bias", k_bias, (kv_features,), True),
        ("v_bias", v_bias, (kv_features,), True),
        ("o_bias", o_bias, (d,), True),
    ))
    for name, n in (("norm", norm), ("post_norm", post_norm)):
        if n is not None:
            Norm.check(n, _FN, name, x)
    if rotary is not None:
        check_rotary(_FN, rotary, x, head_dim)
    if causal and attn_mask is not None:
        raise ValueError(f"{_FN}: pass causal=True or attn_mask, not both (fold the causal pattern into the mask)")
    if attn_mask is not None:
        _check_mask(attn_mask, x, num_heads)
        if kv_update is None and attn_mask.shape[3] != x.shape[1]:
            raise ValueError(f"{_FN}: attn_mask's last dimension must be seq_len={x.shape[1]} without a cache, got {attn_mask.shape[3]}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"{_FN}: scale must be a float or None, got {type(scale).__name__}")
    if kv_update is not None and not callable(kv_update):
        raise TypeError(f"{_FN}: kv_update must be callable or None, got {type(kv_update).__name__}")
    return num_heads, kv_heads, head_dim


def _check_mask(mask: object, x: torch.Tensor, heads: int) -> None:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{_FN}: attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.device != x.device:
        raise ValueError(f"{_FN}: attn_mask is on {mask.device} but x is on {x.device}")
    if mask.dtype != torch.bool and mask.dtype != x.dtype:
        raise TypeError(f"{_FN}: attn_mask must be bool or x's dtype {x.dtype}, got {mask.dtype}")
    batch, seq_len = x.shape[0], x.shape[1]
    if mask.dim() != 4 or mask.shape[0] not in (1, batch) or mask.shape[1] not in (1, heads) or mask.shape[2] not in (1, seq_len):
        raise ValueError(
            f"{_FN}: attn_mask must have shape (1|{batch}, 1|{heads}, 1|{seq_len}, kv_len), got {tuple(mask.shape)}"
        )


class _Block:
    """One call's operands and the two ways to compute it (panels in place, or the reference)."""

    def __init__(self, x, weights, biases, heads, kv_heads, head_dim, norm, post_norm, causal, mask, rotary, scale, layout):
        self.x = x
        self.wq, self.wk, self.wv, self.wo = weights
        self.bq, self.bk, self.bv, self.bo = biases
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm, self.post_norm = norm, post_norm
        self.causal, self.mask, self.rotary, self.scale = causal, mask, rotary, scale
        self.layout = layout
        self.batch, self.seq_len, self.d = x.shape
        self._rotary_panel = (None, None)

    # -- shared pieces -------------------------------------------------------

    def _normed(self, rows: torch.Tensor) -> torch.Tensor:
        return self.norm(rows) if self.norm is not None else rows

    def _kv_into(self, h: torch.Tensor, k_out: torch.Tensor, v_out: torch.Tensor, b0: int, b1: int, s0: int, s1: int) -> None:
        """K and V of rows h (sequences [b0, b1), positions [s0, s1)) into k_out / v_out (2-D), rotary on K."""
        k = linear.project(h, self.wk, self.bk, self.layout, out=k_out)
        linear.project(h, self.wv, self.bv, self.layout, out=v_out)
        if self.rotary is not None:
            apply_rotary_(k.view(b1 - b0, s1 - s0, self.kv_heads, self.head_dim), *self._rotary_rows(b0, b1, s0, s1))

    def _q(self, h: torch.Tensor, out: torch.Tensor, b0: int, b1: int, s0: int, s1: int) -> torch.Tensor:
        """Queries of rows h as (g, heads, p, head_dim), rotary applied."""
        q = linear.project(h, self.wq, self.bq, self.layout, out=out).view(b1 - b0, s1 - s0, self.heads, self.head_dim)
        if self.rotary is not None:
            apply_rotary_(q, *self._rotary_rows(b0, b1, s0, s1))
        return q.transpose(1, 2)

    def _rotary_rows(self, b0: int, b1: int, s0: int, s1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The panel's cos and signed sin (rotary.rotary_rows), made once for its K and its queries."""
        if self._rotary_panel[0] != (b0, b1, s0, s1):
            self._rotary_panel = ((b0, b1, s0, s1), rotary_rows(self.rotary, b0, b1, s0, s1))
        return self._rotary_panel[1]

    def _mask_rows(self, b0: int, b1: int, s0: int, s1: int) -> torch.Tensor | None:
        m = self.mask
        if m is None:
            return None
        if m.shape[0] > 1:
            m = m[b0:b1]
        if m.shape[2] > 1:
            m = m[:, :, s0:s1]
        return m

    def _attend(self, q, k, v, b0, b1, s0, s1, kv_len) -> torch.Tensor:
        """SDPA of q (g, H, p, hd) over k, v (g, Hkv, kv_len, hd): queries at positions kv_len - S + [s0, s1)."""
        p = s1 - s0
        mask = self._mask_rows(b0, b1, s0, s1)
        grouped = self.kv_heads != self.heads
        if mask is not None:
            if grouped:
                # As transformers does: with a mask the fused kernels take equal head counts.
                k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
                v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        if self.causal:
            visible = kv_len - self.seq_len + s1
            k, v = k[:, :, :visible], v[:, :, :visible]
            if p == visible:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=grouped)
            if p > 1:
                if q.device.type == "cpu" and not _needs_grad(q, k, v):
                    return self._lower_right_cpu(q, k, v, visible - p)
                bias = causal_lower_right(p, visible)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale, enable_gqa=grouped)
        return F.scaled_dot_product_attention(q, k, v, scale=self.scale, enable_gqa=grouped)

    def _lower_right_cpu(self, q, k, v, offset: int) -> torch.Tensor:
        """Query i of q (p rows) over keys [0, offset + i]: lower-right causal without a (p, kv_len) mask.

        torch's ``causal_lower_right`` has no fused CPU kernel: SDPA materializes the
        bias (a bool (p, kv_len) mask, then its float copy), and the CausalBias object
        is itself a float32 tensor of shape (2, p, kv_len). Instead: the keys before
        the panel without a mask and the panel's own (square) block with ``is_causal``,
        each through the fused CPU kernel, which also returns its log-sum-exp; the
        softmax over all keys is their log-sum-exp-weighted mix,
        ``o = o1 + (o2 - o1) * sigmoid(lse2 - lse1)``.
        """
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        o, lse = flash(q, k[:, :, :offset], v[:, :, :offset], 0.0, False, scale=self.scale)
        o2, lse2 = flash(q, k[:, :, offset:], v[:, :, offset:], 0.0, True, scale=self.scale)
        weight = lse2.sub_(lse).sigmoid_().unsqueeze(-1)
        del lse
        return o.lerp_(o2, weight.to(o.dtype))

    def _finish_(self, xp: torch.Tensor, o: torch.Tensor, q_rows: torch.Tensor) -> None:
        """x_P += o W_o^T + b_o, then the post-norm; o is (g, H, p, hd), q_rows the panel's spent queries."""
        o2 = o.transpose(1, 2).reshape(xp.shape[0], self.heads * self.head_dim)
        linear.add_projection_(xp, o2, self.wo, self.bo, self.layout, scratch=q_rows)
        if self.post_norm is not None:
            self.post_norm.apply_(xp)

    # -- the in-place path ---------------------------------------------------

    def _plan(self, kv_len: int, kv_in_workspace: bool, workspace_bytes: int | None, attends: bool = True) -> AttentionPlan:
        """Panels within the bound; ``attends=False``: panels that only make K and V (no attention kernel)."""
        size = self.x.element_size()
        q_features, kv_features = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_sequence = 2 * self.seq_len * kv_features if kv_in_workspace else 0
        if self.mask is not None and self.kv_heads != self.heads:
            per_sequence += 2 * kv_len * q_features  # the head-expanded K and V
        per_row = (self.d if self.norm is not None else 0) + 2 * q_features
        if self.rotary is not None:
            # The rotated copy of q (or k); the panel's signed sin (head_dim per row) fits in the
            # attention output's share, which does not exist yet while rotary runs.
            per_row += q_features
        per_row *= size
        lse_size = 8 if self.x.dtype == torch.float64 else 4
        if self.x.is_cuda:
            per_row += self.heads * lse_size  # the fused kernels' log-sum-exp per query row and head
        else:
            # Lower-right causal panels: a second partial output, two log-sum-exps and the merge weights
            # (_lower_right_cpu); whole-panel calls hold less.
            per_row += q_features * size + self.heads * (2 * lse_size + size)
        return attention_plan(
            _FN,
            batch=self.batch,
            seq_len=self.seq_len,
            per_sequence_bytes=per_sequence * size,
            per_row_bytes=per_row,
            x_bytes=self.x.numel() * size,
            workspace_bytes=workspace_bytes,
            kernel_bytes=self._kernel_bytes(kv_len) if attends else None,
        )

    def _kernel_bytes(self, kv_len: int) -> FlashSplitKV | None:
        """The attention kernel's own scratch per panel: FlashAttention-2's split-KV accumulators on CUDA.

        Half types without a mask run the flash kernel (or cuDNN, which the count then
        over-estimates); a panel of few query rows launches too few CTAs to fill the GPU
        and the kernel splits the keys into float32 partial outputs (panels.FlashSplitKV).
        """
        if not self.x.is_cuda or torch.version.hip is not None:
            return None
        if self.x.dtype not in (torch.float16, torch.bfloat16) or self.mask is not None:
            return None
        return FlashSplitKV(heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim, seq_len=self.seq_len,
                            kv_len=kv_len, causal=self.causal, sm_count=_sm_count(self.x.device))

    def _panels(self, plan: AttentionPlan):
        """(b0, b1, s0, s1) for every panel, in row order."""
        for b0 in range(0, self.batch, plan.group):
            b1 = min(b0 + plan.group, self.batch)
            for s0 in range(0, self.seq_len, plan.q_rows):
                yield b0, b1, s0, min(s0 + plan.q_rows, self.seq_len)

    def _rows(self, b0: int, b1: int, s0: int, s1: int) -> torch.Tensor:
        x2d = self.x.view(-1, self.d)
        if b1 - b0 == 1:
            return x2d[b0 * self.seq_len + s0 : b0 * self.seq_len + s1]
        return x2d[b0 * self.seq_len : b1 * self.seq_len]  # whole sequences

    def run_(self, kv_update: KVUpdate | None, workspace_bytes: int | None) -> torch.Tensor:
        if kv_update is not None:
            return self._run_cached_(kv_update, workspace_bytes)
        plan = self._plan(self.seq_len, True, workspace_bytes)
        kv_features = self.kv_heads * self.head_dim
        rows = plan.group * plan.q_rows
        q_buf = self.x.new_empty(rows, self.heads * self.head_dim)
        kv_rows = plan.group * self.seq_len
        k_buf = self.x.new_empty(kv_rows, kv_features)
        v_buf = self.x.new_empty(kv_rows, kv_features)
        for b0 in range(0, self.batch, plan.group):
            b1 = min(b0 + plan.group, self.batch)
            g, S = b1 - b0, self.seq_len
            k2, v2 = k_buf[: g * S], v_buf[: g * S]
            if not plan.splits_sequences:
                xp = self._rows(b0, b1, 0, S)
                h = self._normed(xp)
                self._kv_into(h, k2, v2, b0, b1, 0, S)
                q = self._q(h, q_buf[: g * S], b0, b1, 0, S)
                del h
                o = self._attend(q, *self._heads_view(k2, v2, g, S), b0, b1, 0, S, S)
                del q
                self._finish_(xp, o, q_buf[: g * S])
                del o
                continue
            # One sequence at a time: K and V first (by panels of rows), then its query panels.
            for s0 in range(0, S, plan.q_rows):
                s1 = min(s0 + plan.q_rows, S)
                h = self._normed(self._rows(b0, b1, s0, s1))
                self._kv_into(h, k2[s0:s1], v2[s0:s1], b0, b1, s0, s1)
                del h
            k, v = self._heads_view(k2, v2, g, S)
            self._query_panels_(plan, b0, b1, q_buf, k, v, S)
        return self.x

    def _heads_view(self, k2: torch.Tensor, v2: torch.Tensor, g: int, kv_len: int):
        shape = (g, kv_len, self.kv_heads, self.head_dim)
        return k2.view(shape).transpose(1, 2), v2.view(shape).transpose(1, 2)

    def _query_panels_(self, plan, b0, b1, q_buf, k, v, kv_len) -> None:
        for s0 in range(0, self.seq_len, plan.q_rows):
            s1 = min(s0 + plan.q_rows, self.seq_len)
            xp = self._rows(b0, b1, s0, s1)
            h = self._normed(xp)
            q_rows = q_buf[: (b1 - b0) * (s1 - s0)]
            q = self._q(h, q_rows, b0, b1, s0, s1)
            del h
            o = self._attend(q, k, v, b0, b1, s0, s1, kv_len)
            del q
            self._finish_(xp, o, q_rows)
            del o

    def _run_cached_(self, kv_update: KVUpdate, workspace_bytes: int | None) -> torch.Tensor:
        """K and V of every sequence go to the cache first; queries then attend to what it returns."""
        B, S = self.batch, self.seq_len
        kv_features = self.kv_heads * self.head_dim
        k_new = self.x.new_empty(B * S, kv_features)
        v_new = self.x.new_empty(B * S, kv_features)
        plan = self._plan(S, False, workspace_bytes, attends=False)
        for b0, b1, s0, s1 in self._panels(plan):
            r0 = b0 * S + s0
            r1 = r0 + (b1 - b0) * (s1 - s0)
            h = self._normed(self._rows(b0, b1, s0, s1))
            self._kv_into(h, k_new[r0:r1], v_new[r0:r1], b0, b1, s0, s1)
            del h
        k_all, v_all = kv_update(*self._heads_view(k_new, v_new, B, S))
        del k_new, v_new
        kv_len = k_all.shape[2]
        expected = (B, self.kv_heads, kv_len, self.head_dim)
        if tuple(k_all.shape) != expected or tuple(v_all.shape) != expected or kv_len < S:
            raise ValueError(
                f"{_FN}: kv_update must return keys and values of shape (batch, num_kv_heads, kv_len >= seq_len, "
                f"head_dim) = {expected}, got {tuple(k_all.shape)} and {tuple(v_all.shape)}; x is unchanged"
            )
        if self.mask is not None and self.mask.shape[3] != kv_len:
            raise ValueError(f"{_FN}: attn_mask's last dimension must be kv_len={kv_len}, got {self.mask.shape[3]}; x is unchanged")
        plan = self._plan(kv_len, False, workspace_bytes)
        q_buf = self.x.new_empty(plan.group * plan.q_rows, self.heads * self.head_dim)
        for b0 in range(0, B, plan.group):
            b1 = min(b0 + plan.group, B)
            self._query_panels_(plan, b0, b1, q_buf, k_all[b0:b1], v_all[b0:b1], kv_len)
        return self.x

    # -- the reference path (autograd) ----------------------------------------

    def reference(self, kv_update: KVUpdate | None) -> torch.Tensor:
        """The block computed the standard way, out of place."""
        B, S = self.batch, self.seq_len
        x2d = self.x.reshape(B * S, self.d)
        h = self._normed(x2d)
        q = linear.project(h, self.wq, self.bq, self.layout).view(B, S, self.heads, self.head_dim)
        k = linear.project(h, self.wk, self.bk, self.layout).view(B, S, self.kv_heads, self.head_dim)
        v = linear.project(h, self.wv, self.bv, self.layout).view(B, S, self.kv_heads, self.head_dim)
        if self.rotary is not None:
            cos, sin = (t.unsqueeze(2) for t in self.rotary)
            q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if kv_update is not None:
            k, v = kv_update(k, v)
        o = self._attend(q, k, v, 0, B, 0, S, k.shape[2])
        y = x2d + linear.project(o.transpose(1, 2).reshape(B * S, -1), self.wo, self.bo, self.layout)
        if self.post_norm is not None:
            y = self.post_norm(y)
        return y.view(B, S, self.d)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _rotated(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rotated * sin
