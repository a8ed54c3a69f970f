"""A model's last norm, in place over the hidden states the model made (GPT-2's ln_f, Llama's norm, ViT's layernorm)."""

from __future__ import annotations

import torch
from torch import nn

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

    def _norm(self):
        raise NotImplementedError

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if (
            not inference_only(self, hidden_states)
            or not owned(self, hidden_states)
            or hidden_states.dtype != self.weight.dtype
            or hidden_states.device != self.weight.device
        ):
            return super().forward(hidden_states)
        self._norm().apply_(hidden_states.view(-1, hidden_states.shape[-1]))
        return hidden_states


class FinalLayerNormMixin(_FinalNorm):
    def _norm(self):
        return common.layer_norm(self)


class FinalRMSNormMixin(_FinalNorm):
    def _norm(self):
        return common.rms_norm(self)


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
