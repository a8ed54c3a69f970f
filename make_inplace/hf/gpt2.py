"""GPT-2: pre-norm blocks with Conv1D weights and a fused QKV projection, KV cache, final LayerNorm."""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import residual_attention_, residual_mlp_
from . import common
from .scope import inference_only, writable
from .swap import class_for_pickle

SOURCE = "transformers.models.gpt2.modeling_gpt2"


class BlockMixin:
    """``x <- x + attn(ln_1(x)); x <- x + mlp(ln_2(x))`` in place; q, k, v are column slices of c_attn."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = False,
        **kwargs,
    ) -> torch.Tensor:
        attn = common.child(self, "attn")
        w, b = common.linear_params(common.child(attn, "c_attn"))  # (d, 3d), (3d,): [q | k | v] columns
        if (
            not inference_only(self, hidden_states)
            or encoder_hidden_states is not None
            or kwargs.get("output_attentions")
            or hidden_states.dtype != w.dtype
            or hidden_states.device != w.device
        ):
            return super().forward(
                hidden_states,
                past_key_values,
                attention_mask,
                encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                use_cache=use_cache,
                **kwargs,
            )
        x = writable(self, hidden_states)
        d = attn.embed_dim
        wo, bo = common.linear_params(common.child(attn, "c_proj"))
        causal, mask, crop_to = common.attention_mode(attention_mask, x.shape[1], attn.is_causal)
        residual_attention_(
            x,
            w[:, :d], w[:, d : 2 * d], w[:, 2 * d :], wo,
            b[:d], b[d : 2 * d], b[2 * d :], bo,
            num_heads=attn.num_heads,
            norm=common.layer_norm(common.child(self, "ln_1")),
            causal=causal,
            attn_mask=mask,
            scale=attn.scaling,
            weight_layout="conv1d",
            kv_update=common.kv_update_for(past_key_values, attn.layer_idx, crop_to),
        )
        mlp = common.child(self, "mlp")
        w1, b1 = common.linear_params(common.child(mlp, "c_fc"))
        w2, b2 = common.linear_params(common.child(mlp, "c_proj"))
        residual_mlp_(
            x, w1, w2, b1, b2,
            activation=common.activation_name(common.child(mlp, "act")),
            norm=common.layer_norm(common.child(self, "ln_2")),
            weight_layout="conv1d",
        )
        return x


def layer_obstacle(block: nn.Module) -> str | None:
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    if type(attn).__name__ != "GPT2Attention" or type(mlp).__name__ != "GPT2MLP":
        return "attn/mlp are not GPT2Attention/GPT2MLP"
    if hasattr(block, "crossattention"):
        return "add_cross_attention=True: cross-attention blocks are not supported"
    if attn.is_cross_attention:
        return "a cross-attention block"
    for name in ("ln_1", "ln_2"):
        if type(getattr(block, name)) is not nn.LayerNorm:
            return f"{name} is not an nn.LayerNorm"
    for part in (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj):
        if type(part).__name__ != "Conv1D":
            return f"{type(part).__name__} where a Conv1D was expected"
    if common.activation_name(mlp.act) is None:
        return f"activation {type(mlp.act).__name__} has no in-place form (gelu, gelu_tanh, relu, silu)"
    reason = common.attention_implementation_obstacle(attn.config)
    if reason:
        return reason
    if common.hooked(block) is not None:
        return "it or a submodule has hooks, which the in-place block would not call"
    return None


def _originals() -> dict[str, tuple[str, type]]:
    return {"GPT2Block": (SOURCE, BlockMixin)}


def __getattr__(name: str) -> type:
    return class_for_pickle(__name__, name, _originals())
