"""Llama-style decoders (Llama, Mistral, Qwen2): RMSNorm, SwiGLU, rotary embeddings, GQA, KV cache."""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import residual_attention_, residual_mlp_
from . import common
from .scope import inference_only, writable
from .swap import class_for_pickle

# Family member -> (transformers module, class names of its parts).
MEMBERS = {
    "llama": "transformers.models.llama.modeling_llama",
    "mistral": "transformers.models.mistral.modeling_mistral",
    "qwen2": "transformers.models.qwen2.modeling_qwen2",
}
_PREFIX = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
_PARTS = {"attention": "Attention", "mlp": "MLP", "norm": "RMSNorm"}


def _names(part: str) -> set[str]:
    return {prefix + _PARTS[part] for prefix in _PREFIX.values()}


class DecoderLayerMixin:
    """``x <- x + attn(rms(x)); x <- x + mlp(rms(x))`` over the hidden states, in place."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        attn = common.child(self, "self_attn")
        q_proj = common.child(attn, "q_proj")
        wq, bq = common.linear_params(q_proj)
        if (
            not inference_only(self, hidden_states)
            or position_embeddings is None
            or kwargs.get("output_attentions")
            or hidden_states.dtype != wq.dtype
            or hidden_states.device != wq.device
        ):
            return super().forward(
                hidden_states,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
                **kwargs,
            )
        x = writable(self, hidden_states)
        causal, mask, crop_to = common.attention_mode(attention_mask, x.shape[1], getattr(attn, "is_causal", True))
        head_dim = attn.head_dim
        k_proj = common.child(attn, "k_proj")
        wk, bk = common.linear_params(k_proj)
        wv, bv = common.linear_params(common.child(attn, "v_proj"))
        wo, bo = common.linear_params(common.child(attn, "o_proj"))
        residual_attention_(
            x, wq, wk, wv, wo, bq, bk, bv, bo,
            num_heads=q_proj.out_features // head_dim,
            num_kv_heads=k_proj.out_features // head_dim,
            norm=common.rms_norm(common.child(self, "input_layernorm")),
            causal=causal,
            attn_mask=mask,
            rotary=position_embeddings,
            scale=attn.scaling,
            kv_update=common.kv_update_for(past_key_values, attn.layer_idx, crop_to),
        )
        mlp = common.child(self, "mlp")
        w1, b1 = common.linear_params(common.child(mlp, "up_proj"))
        w2, b2 = common.linear_params(common.child(mlp, "down_proj"))
        wg, bg = common.linear_params(common.child(mlp, "gate_proj"))
        residual_mlp_(
            x, w1, w2, b1, b2,
            activation=common.activation_name(common.child(mlp, "act_fn")),
            gate_weight=wg,
            gate_bias=bg,
            norm=common.rms_norm(common.child(self, "post_attention_layernorm")),
        )
        return x


def layer_obstacle(layer: nn.Module) -> str | None:
    """Why ``layer`` cannot run in place, or None."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or type(attn).__name__ not in _names("attention"):
        return f"self_attn is a {type(attn).__name__}, not a Llama-style attention"
    if mlp is None or type(mlp).__name__ not in _names("mlp"):
        return f"mlp is a {type(mlp).__name__}, not a Llama-style gated MLP"
    for name in ("input_layernorm", "post_attention_layernorm"):
        if type(getattr(layer, name, None)).__name__ not in _names("norm"):
            return f"{name} is not an RMSNorm of this family"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if type(getattr(attn, name, None)) is not nn.Linear:
            return f"self_attn.{name} is not an nn.Linear"
    for name in ("gate_proj", "up_proj", "down_proj"):
        if type(getattr(mlp, name, None)) is not nn.Linear:
            return f"mlp.{name} is not an nn.Linear"
    if common.activation_name(mlp.act_fn) is None:
        return f"activation {type(mlp.act_fn).__name__} has no in-place form (gelu, gelu_tanh, relu, silu)"
    reason = common.attention_implementation_obstacle(attn.config)
    if reason:
        return reason
    if attn.head_dim % 2:
        return f"head_dim {attn.head_dim} is odd: rotary embeddings need an even one"
    sub = common.hooked(layer)
    if sub is not None:
        return "it or a submodule has hooks, which the in-place block would not call"
    return None


def _originals() -> dict[str, tuple[str, type]]:
    out = {}
    for member, source in MEMBERS.items():
        out[_PREFIX[member] + "DecoderLayer"] = (source, DecoderLayerMixin)
    return out


def __getattr__(name: str) -> type:
    return class_for_pickle(__name__, name, _originals())
