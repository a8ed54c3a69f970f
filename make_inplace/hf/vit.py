"""ViT: pre-norm encoder layers and the patch + class-token + position embeddings, in place."""

from __future__ import annotations

import torch
from torch import nn

from ..blocks import residual_attention_, residual_mlp_
from ..blocks.panels import DEFAULT_MIN_ROWS
from . import common
from .scope import inference_only, writable
from .swap import class_for_pickle

SOURCE = "transformers.models.vit.modeling_vit"


class LayerMixin:
    """``x <- x + attn(ln_before(x)); x <- x + mlp(ln_after(x))`` in place."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        attn = self.attention
        if (
            not inference_only(self, hidden_states)
            or kwargs.get("output_attentions")
            or hidden_states.dtype != attn.q_proj.weight.dtype
            or hidden_states.device != attn.q_proj.weight.device
        ):
            return super().forward(hidden_states, attention_mask, **kwargs)
        x = writable(self, hidden_states)
        causal, mask, _ = common.attention_mode(attention_mask, x.shape[1], attn.is_causal)
        head_dim = attn.head_dim
        residual_attention_(
            x,
            attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight,
            attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias, attn.o_proj.bias,
            num_heads=attn.q_proj.out_features // head_dim,
            norm=common.layer_norm(self.layernorm_before),
            causal=causal,
            attn_mask=mask,
            scale=attn.scaling,
        )
        mlp = self.mlp
        residual_mlp_(
            x,
            mlp.fc1.weight, mlp.fc2.weight, mlp.fc1.bias, mlp.fc2.bias,
            activation=common.activation_name(mlp.activation_fn),
            norm=common.layer_norm(self.layernorm_after),
        )
        return x


class EmbeddingsMixin:
    """[CLS, patches] + positions written into one tensor; the patch convolution runs by groups of images."""

    def forward(
        self,
        pixel_values: torch.Tensor,
        bool_masked_pos: torch.BoolTensor | None = None,
        interpolate_pos_encoding: bool = False,
    ) -> torch.Tensor:
        proj = self.patch_embeddings.projection
        if (
            not inference_only(self, pixel_values)
            or bool_masked_pos is not None
            or pixel_values.dtype != proj.weight.dtype
            or pixel_values.device != proj.weight.device
        ):
            return super().forward(pixel_values, bool_masked_pos=bool_masked_pos, interpolate_pos_encoding=interpolate_pos_encoding)
        batch, channels, height, width = pixel_values.shape
        if channels != self.patch_embeddings.num_channels:
            raise ValueError(
                "Make sure that the channel dimension of the pixel values match with the one set in the configuration."
                f" Expected {self.patch_embeddings.num_channels} but got {channels}."
            )
        if not interpolate_pos_encoding and (height != self.image_size[0] or width != self.image_size[1]):
            raise ValueError(
                f"Input image size ({height}*{width}) doesn't match model ({self.image_size[0]}*{self.image_size[1]})."
            )
        ph, pw = proj.stride
        patches = (height // ph) * (width // pw)
        d = self.cls_token.shape[-1]
        x = pixel_values.new_empty(batch, patches + 1, d, dtype=self.cls_token.dtype)
        x[:, 0] = self.cls_token[0, 0]
        per_group = max(1, DEFAULT_MIN_ROWS // max(1, patches))
        for b0 in range(0, batch, per_group):
            x[b0 : b0 + per_group, 1:] = proj(pixel_values[b0 : b0 + per_group]).flatten(2).transpose(1, 2)
        positions = self.interpolate_pos_encoding(x, height, width) if interpolate_pos_encoding else self.position_embeddings
        x.add_(positions)
        return x


def layer_obstacle(layer: nn.Module) -> str | None:
    attn, mlp = getattr(layer, "attention", None), getattr(layer, "mlp", None)
    if type(attn).__name__ != "ViTAttention" or type(mlp).__name__ != "ViTMLP":
        return "attention/mlp are not ViTAttention/ViTMLP"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if type(getattr(attn, name, None)) is not nn.Linear:
            return f"attention.{name} is not an nn.Linear"
    for name in ("fc1", "fc2"):
        if type(getattr(mlp, name, None)) is not nn.Linear:
            return f"mlp.{name} is not an nn.Linear"
    for name in ("layernorm_before", "layernorm_after"):
        norm = getattr(layer, name)
        if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1:
            return f"{name} is not an nn.LayerNorm over the last dimension"
    if common.activation_name(mlp.activation_fn) is None:
        return f"activation {type(mlp.activation_fn).__name__} has no in-place form"
    reason = common.attention_implementation_obstacle(attn.config)
    if reason:
        return reason
    if common.hooked(layer) is not None:
        return "it or a submodule has hooks, which the in-place block would not call"
    return None


def embeddings_obstacle(emb: nn.Module) -> str | None:
    if type(emb).__name__ != "ViTEmbeddings":
        return f"{type(emb).__name__} is not ViTEmbeddings"
    if type(getattr(emb.patch_embeddings, "projection", None)) is not nn.Conv2d:
        return "patch_embeddings.projection is not an nn.Conv2d"
    proj = emb.patch_embeddings.projection
    if tuple(proj.stride) != tuple(proj.kernel_size) or proj.padding not in ((0, 0), "valid") or proj.groups != 1:
        return "the patch convolution is not a non-overlapping patchify (stride == kernel, no padding)"
    if common.hooked(emb) is not None:
        return "it or a submodule has hooks, which the in-place version would not call"
    return None


def _originals() -> dict[str, tuple[str, type]]:
    return {"ViTLayer": (SOURCE, LayerMixin), "ViTEmbeddings": (SOURCE, EmbeddingsMixin)}


def __getattr__(name: str) -> type:
    return class_for_pickle(__name__, name, _originals())
