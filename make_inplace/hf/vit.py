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
        attn = common.child(self, "attention")
        q_proj = common.child(attn, "q_proj")
        wq, bq = common.linear_params(q_proj)
        if (
            not inference_only(self, hidden_states)
            or kwargs.get("output_attentions")
            or hidden_states.dtype != wq.dtype
            or hidden_states.device != wq.device
        ):
            return super().forward(hidden_states, attention_mask, **kwargs)
        x = writable(self, hidden_states)
        causal, mask, _ = common.attention_mode(attention_mask, x.shape[1], attn.is_causal)
        wk, bk = common.linear_params(common.child(attn, "k_proj"))
        wv, bv = common.linear_params(common.child(attn, "v_proj"))
        wo, bo = common.linear_params(common.child(attn, "o_proj"))
        residual_attention_(
            x, wq, wk, wv, wo, bq, bk, bv, bo,
            num_heads=q_proj.out_features // attn.head_dim,
            norm=common.layer_norm(common.child(self, "layernorm_before")),
            causal=causal,
            attn_mask=mask,
            scale=attn.scaling,
        )
        mlp = common.child(self, "mlp")
        w1, b1 = common.linear_params(common.child(mlp, "fc1"))
        w2, b2 = common.linear_params(common.child(mlp, "fc2"))
        residual_mlp_(
            x, w1, w2, b1, b2,
            activation=common.activation_name(common.child(mlp, "activation_fn")),
            norm=common.layer_norm(common.child(self, "layernorm_after")),
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
        patch_embeddings = common.child(self, "patch_embeddings")
        proj = common.child(patch_embeddings, "projection")
        weight = common.param(proj, "weight")
        if (
            not inference_only(self, pixel_values)
            or bool_masked_pos is not None
            or pixel_values.dtype != weight.dtype
            or pixel_values.device != weight.device
        ):
            return super().forward(pixel_values, bool_masked_pos=bool_masked_pos, interpolate_pos_encoding=interpolate_pos_encoding)
        batch, channels, height, width = pixel_values.shape
        if channels != patch_embeddings.num_channels:
            raise ValueError(
                "Make sure that the channel dimension of the pixel values match with the one set in the configuration."
                f" Expected {patch_embeddings.num_channels} but got {channels}."
            )
        if not interpolate_pos_encoding and (height != self.image_size[0] or width != self.image_size[1]):
            raise ValueError(
                f"Input image size ({height}*{width}) doesn't match model ({self.image_size[0]}*{self.image_size[1]})."
            )
        ph, pw = proj.stride
        patches = (height // ph) * (width // pw)
        cls_token = common.param(self, "cls_token")
        d = cls_token.shape[-1]
        x = pixel_values.new_empty(batch, patches + 1, d, dtype=cls_token.dtype)
        x[:, 0] = cls_token[0, 0]
        per_group = max(1, DEFAULT_MIN_ROWS // max(1, patches))
        macs = min(per_group, batch) * patches * channels * ph * pw * d
        small = pixel_values.is_cpu and macs <= _PATCH_GEMM_MAX_MACS and tuple(proj.dilation) == (1, 1)
        patchify = _patch_gemm if small else _patch_conv
        for b0 in range(0, batch, per_group):
            x[b0 : b0 + per_group, 1:] = patchify(proj, weight, pixel_values[b0 : b0 + per_group])
        if interpolate_pos_encoding:
            x.add_(self.interpolate_pos_encoding(x, height, width))
        else:
            x.add_(common.param(self, "position_embeddings"))
        return x


# Multiply-adds of a group of images below which the CPU patch embedding is one GEMM: there
# oneDNN's per-call work dominates the convolution (a tiny model's embeddings took twice as
# long); at ViT-B sizes the convolution is the faster one.
_PATCH_GEMM_MAX_MACS = 1 << 22


def _patch_conv(proj: nn.Conv2d, weight: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """The patch embeddings of ``pixels`` as (images, patches, d)."""
    return proj(pixels).flatten(2).transpose(1, 2)


def _patch_gemm(proj: nn.Conv2d, weight: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """_patch_conv as one GEMM over the patches laid out as rows: the convolution is a
    non-overlapping patchify (stride == kernel, no padding, no dilation)."""
    images, channels, height, width = pixels.shape
    ph, pw = proj.kernel_size
    nh, nw = height // ph, width // pw
    rows = (pixels[:, :, : nh * ph, : nw * pw].reshape(images, channels, nh, ph, nw, pw)
            .permute(0, 2, 4, 1, 3, 5).reshape(images * nh * nw, channels * ph * pw))
    rhs = weight.reshape(weight.shape[0], -1).t()
    bias = common.param(proj, "bias")
    out = torch.mm(rows, rhs) if bias is None else torch.addmm(bias, rows, rhs)
    return out.view(images, nh * nw, -1)


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
