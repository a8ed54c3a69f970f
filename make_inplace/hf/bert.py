"""BERT / RoBERTa encoders: post-norm layers and the word + token-type + position embeddings, in place."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import residual_attention_, residual_mlp_
from ..blocks.panels import DEFAULT_MIN_ROWS
from ..ops.layer_norm import layer_norm_
from . import common
from .scope import inference_only, writable
from .swap import class_for_pickle

SOURCES = {
    "Bert": "transformers.models.bert.modeling_bert",
    "Roberta": "transformers.models.roberta.modeling_roberta",
}


class LayerMixin:
    """``x <- LN(x + attn(x)); x <- LN(x + mlp(x))`` in place (the layer norms over each panel)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        **kwargs,
    ) -> torch.Tensor:
        attention = common.child(self, "attention")
        sa = common.child(attention, "self")
        wq, bq = common.linear_params(common.child(sa, "query"))
        if (
            not inference_only(self, hidden_states)
            or encoder_hidden_states is not None
            or past_key_values is not None
            or kwargs.get("output_attentions")
            or hidden_states.dtype != wq.dtype
            or hidden_states.device != wq.device
        ):
            return super().forward(
                hidden_states,
                attention_mask,
                encoder_hidden_states,
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                **kwargs,
            )
        x = writable(self, hidden_states)
        causal, mask, _ = common.attention_mode(attention_mask, x.shape[1], sa.is_causal)
        out = common.child(attention, "output")
        wk, bk = common.linear_params(common.child(sa, "key"))
        wv, bv = common.linear_params(common.child(sa, "value"))
        wo, bo = common.linear_params(common.child(out, "dense"))
        residual_attention_(
            x, wq, wk, wv, wo, bq, bk, bv, bo,
            num_heads=sa.num_attention_heads,
            post_norm=common.layer_norm(common.child(out, "LayerNorm")),
            causal=causal,
            attn_mask=mask,
            scale=sa.scaling,
        )
        intermediate, output = common.child(self, "intermediate"), common.child(self, "output")
        w1, b1 = common.linear_params(common.child(intermediate, "dense"))
        w2, b2 = common.linear_params(common.child(output, "dense"))
        residual_mlp_(
            x, w1, w2, b1, b2,
            activation=common.activation_name(common.child(intermediate, "intermediate_act_fn")),
            post_norm=common.layer_norm(common.child(output, "LayerNorm")),
        )
        return x


class EmbeddingsMixin:
    """word (+ token type) (+ position) embeddings summed into one tensor, then its LayerNorm in place."""

    def _position_ids(self, input_ids, inputs_embeds, past_key_values_length: int, seq_len: int) -> torch.Tensor:
        if hasattr(self, "create_position_ids_from_input_ids"):  # RoBERTa: positions skip the padding
            if input_ids is not None:
                return self.create_position_ids_from_input_ids(input_ids, self.padding_idx, past_key_values_length)
            return self.create_position_ids_from_inputs_embeds(inputs_embeds, self.padding_idx)
        return self.position_ids[:, past_key_values_length : seq_len + past_key_values_length]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        past_key_values_length: int = 0,
    ) -> torch.Tensor:
        if not inference_only(self, inputs_embeds, input_ids) or (input_ids is None) == (inputs_embeds is None):
            return super().forward(input_ids, token_type_ids, position_ids, inputs_embeds, past_key_values_length)
        batch, seq_len = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        if position_ids is None:
            position_ids = self._position_ids(input_ids, inputs_embeds, past_key_values_length, seq_len)
        if token_type_ids is None:
            if hasattr(self, "token_type_ids"):
                # As transformers does: the all-zero buffer, read at the position ids.
                buffered = self.token_type_ids.to(position_ids.device).expand(position_ids.shape[0], -1)
                token_type_ids = torch.gather(buffered, dim=1, index=position_ids).expand(batch, seq_len)
            else:
                token_type_ids = torch.zeros((batch, seq_len), dtype=torch.long, device=self.position_ids.device)
        if inputs_embeds is None:
            x = self.word_embeddings(input_ids)
        else:
            x = inputs_embeds.clone(memory_format=torch.contiguous_format)
        d = x.shape[-1]
        x2d = x.view(-1, d)
        rows = x2d.shape[0]
        types = token_type_ids.expand(batch, seq_len).reshape(rows)
        positions = position_ids.expand(batch, seq_len).reshape(rows)
        # Added a panel of rows at a time, in transformers' order (token type, then position).
        for r0 in range(0, rows, DEFAULT_MIN_ROWS):
            part = x2d[r0 : r0 + DEFAULT_MIN_ROWS]
            part.add_(F.embedding(types[r0 : r0 + DEFAULT_MIN_ROWS], self.token_type_embeddings.weight))
            part.add_(F.embedding(positions[r0 : r0 + DEFAULT_MIN_ROWS], self.position_embeddings.weight))
        norm = self.LayerNorm
        layer_norm_(x2d, d, norm.weight, norm.bias, norm.eps)
        return x


def layer_obstacle(layer: nn.Module) -> str | None:
    prefix = type(layer).__name__[: -len("Layer")]
    if getattr(layer, "is_decoder", False) or getattr(layer.attention.self, "is_causal", False):
        return "is_decoder=True: only encoder layers are converted"
    if getattr(layer, "add_cross_attention", False) or hasattr(layer, "crossattention"):
        return "add_cross_attention=True: cross-attention layers are not supported"
    names = {
        "attention.self": prefix + "SelfAttention",
        "attention.output": prefix + "SelfOutput",
        "intermediate": prefix + "Intermediate",
        "output": prefix + "Output",
    }
    for path, expected in names.items():
        if type(layer.get_submodule(path)).__name__ != expected:
            return f"{path} is not a {expected}"
    for path in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                 "intermediate.dense", "output.dense"):
        if type(layer.get_submodule(path)) is not nn.Linear:
            return f"{path} is not an nn.Linear"
    for path in ("attention.output.LayerNorm", "output.LayerNorm"):
        norm = layer.get_submodule(path)
        if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1:
            return f"{path} is not an nn.LayerNorm over the last dimension"
    if common.activation_name(layer.intermediate.intermediate_act_fn) is None:
        return f"activation {type(layer.intermediate.intermediate_act_fn).__name__} has no in-place form"
    reason = common.attention_implementation_obstacle(layer.attention.self.config)
    if reason:
        return reason
    if common.hooked(layer) is not None:
        return "it or a submodule has hooks, which the in-place block would not call"
    return None


def embeddings_obstacle(emb: nn.Module) -> str | None:
    if type(emb).__name__ not in ("BertEmbeddings", "RobertaEmbeddings"):
        return f"{type(emb).__name__} is not BertEmbeddings/RobertaEmbeddings"
    for name in ("word_embeddings", "token_type_embeddings", "position_embeddings"):
        if type(getattr(emb, name, None)) is not nn.Embedding:
            return f"{name} is not an nn.Embedding"
    norm = emb.LayerNorm
    if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1:
        return "LayerNorm is not an nn.LayerNorm over the last dimension"
    if common.hooked(emb) is not None:
        return "it or a submodule has hooks, which the in-place version would not call"
    return None


def _originals() -> dict[str, tuple[str, type]]:
    out = {}
    for prefix, source in SOURCES.items():
        out[prefix + "Layer"] = (source, LayerMixin)
        out[prefix + "Embeddings"] = (source, EmbeddingsMixin)
    return out


def __getattr__(name: str) -> type:
    return class_for_pickle(__name__, name, _originals())
