"""A model's last norm, in place over the hidden states the model made (GPT-2's ln_f, Llama's norm, ViT's layernorm)."""

from __future__ import annotations

import torch
from torch import nn

from ..ops.layer_norm import layer_norm_
from ..ops.rms_norm import rms_norm_
from . import common
from .scope import inference_only, owned
from .swap import class_for_pickle

RMS_NORMS = {
    "LlamaRMSNorm": "transformers.models.llama.modeling_llama",
    "MistralRMSNorm": "transformers.models.mistral.modeling_mistral",
    "Qwen2RMSNorm": "transformers.models.qwen2.modeling_qwen2",
}


class _FinalNorm:
    class_prefix = "InplaceFinal"

    def _apply_(self, rows: torch.Tensor, weight: torch.Tensor) -> None:
        raise NotImplementedError

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = common.param(self, "weight")
        if (
            not inference_only(self, hidden_states)
            or not owned(self, hidden_states)
            or hidden_states.dtype != weight.dtype
            or hidden_states.device != weight.device
        ):
            return super().forward(hidden_states)
        self._apply_(hidden_states.view(-1, hidden_states.shape[-1]), weight)
        return hidden_states


class FinalLayerNormMixin(_FinalNorm):
    def _apply_(self, rows, weight):
        layer_norm_(rows, rows.shape[-1], weight, common.param(self, "bias"), self.eps)


class FinalRMSNormMixin(_FinalNorm):
    def _apply_(self, rows, weight):
        rms_norm_(rows, rows.shape[-1], weight, self.variance_epsilon)


def layer_norm_obstacle(norm: nn.Module) -> str | None:
    if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1 or norm.weight is None:
        return f"{type(norm).__name__} is not an affine nn.LayerNorm over the last dimension"
    if common.hooked(norm) is not None:
        return "it has hooks, which the in-place norm would not call"
    return None


def rms_norm_obstacle(norm: nn.Module) -> str | None:
    if type(norm).__name__ not in RMS_NORMS:
        return f"{type(norm).__name__} is not a Llama-style RMSNorm"
    if common.hooked(norm) is not None:
        return "it has hooks, which the in-place norm would not call"
    return None


def _originals() -> dict[str, tuple[str, type]]:
    out = {name: (source, FinalRMSNormMixin) for name, source in RMS_NORMS.items()}
    out["LayerNorm"] = ("torch.nn", FinalLayerNormMixin)
    return out


def __getattr__(name: str) -> type:
    return class_for_pickle(__name__, name, _originals())
