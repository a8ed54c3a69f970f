"""Which transformers modules convert_ knows, and how a base model is converted part by part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from . import bert, final_norm, gpt2, llama, vit
from .scope import Token, install_scope
from .swap import is_swapped, swap_


@dataclass(frozen=True)
class Part:
    """A converted module: its mixin and the check that says why a given instance cannot be."""

    mixin: type
    obstacle: Callable[[nn.Module], str | None]


@dataclass(frozen=True)
class Family:
    """A base model family: where its layers, embeddings and final norm sit, and their parts."""

    name: str
    layers: str
    layer: Part
    embeddings: tuple[str, Part] | None = None
    final_norm: tuple[str, Part] | None = None


_LAYER_NORM = Part(final_norm.FinalLayerNormMixin, final_norm.layer_norm_obstacle)

FAMILIES = {
    "bert": Family(
        "BERT/RoBERTa encoder", "encoder.layer", Part(bert.LayerMixin, bert.layer_obstacle),
        embeddings=("embeddings", Part(bert.EmbeddingsMixin, bert.embeddings_obstacle)),
    ),
    "gpt2": Family("GPT-2", "h", Part(gpt2.BlockMixin, gpt2.layer_obstacle), final_norm=("ln_f", _LAYER_NORM)),
    "llama": Family(
        "Llama-style decoder", "layers", Part(llama.DecoderLayerMixin, llama.layer_obstacle),
        final_norm=("norm", Part(final_norm.FinalRMSNormMixin, final_norm.rms_norm_obstacle)),
    ),
    "vit": Family(
        "ViT", "layers", Part(vit.LayerMixin, vit.layer_obstacle),
        embeddings=("embeddings", Part(vit.EmbeddingsMixin, vit.embeddings_obstacle)),
        final_norm=("layernorm", _LAYER_NORM),
    ),
}

# Base model class -> family; layer class -> family (layers also convert on their own).
BASE_MODELS = {
    "BertModel": "bert", "RobertaModel": "bert", "GPT2Model": "gpt2",
    "LlamaModel": "llama", "MistralModel": "llama", "Qwen2Model": "llama", "ViTModel": "vit",
}
LAYERS = {
    "BertLayer": "bert", "RobertaLayer": "bert", "GPT2Block": "gpt2",
    "LlamaDecoderLayer": "llama", "MistralDecoderLayer": "llama", "Qwen2DecoderLayer": "llama", "ViTLayer": "vit",
}


def _from_transformers(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformers.")


def _convert_part(module: nn.Module, name: str, part: Part, token, report) -> bool:
    kind = type(module).__name__
    reason = part.obstacle(module)
    if reason is not None:
        report.skipped.append((name, kind, reason))
        return False
    report.replaced.append((name, kind, swap_(module, part.mixin, token)))
    return True


def _qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _convert_base(base: nn.Module, name: str, family: Family, report, decided: set[int]) -> None:
    token = getattr(base, "_make_inplace_token", None) or Token()
    try:
        layers = base.get_submodule(family.layers)
    except AttributeError:
        report.skipped.append((name, type(base).__name__, f"no {family.layers} module list where {family.name} keeps its layers"))
        return
    # In the order the forward runs them: embeddings, layers, final norm.
    parts = [(layer, _qualified(name, f"{family.layers}.{i}"), family.layer) for i, layer in enumerate(layers)]
    for entry, where in ((family.embeddings, 0), (family.final_norm, len(parts) + 1)):
        if entry is not None and getattr(base, entry[0], None) is not None:
            parts.insert(where, (getattr(base, entry[0]), _qualified(name, entry[0]), entry[1]))
    replaced = 0
    for module, qualified, part in parts:
        decided.add(id(module))
        if not is_swapped(module):
            replaced += _convert_part(module, qualified, part, token, report)
    if replaced:
        install_scope(base, token)
        report.notes.append((name, "forward runs in a scope: blocks overwrite the hidden states the model makes, never the caller's tensors"))


def convert_known(module: nn.Module, name: str, report, decided: set[int]) -> bool:
    """Converts ``module`` if transformers' module of a known family; True when ``module`` itself is now in place.

    A base model has its layers, embeddings and final norm converted (and is
    itself kept, so False: the caller walks its other children). A layer met
    outside a known base model converts on its own; it then copies its input
    once per call, not knowing who else reads it.
    """
    if is_swapped(module):
        return True
    if id(module) in decided or not _from_transformers(module):
        return False
    kind = type(module).__name__
    if kind in BASE_MODELS:
        decided.add(id(module))
        _convert_base(module, name, FAMILIES[BASE_MODELS[kind]], report, decided)
        return False
    if kind in LAYERS:
        decided.add(id(module))
        return _convert_part(module, name, FAMILIES[LAYERS[kind]].layer, None, report)
    return False
