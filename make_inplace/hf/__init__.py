"""In-place inference for Hugging Face transformers models (imported only when transformers is).

``make_inplace.convert_(model)`` calls :func:`convert_known` on every module
of a model: BERT/RoBERTa encoders, GPT-2, Llama-style decoders (Llama,
Mistral, Qwen2) and ViT get their layers, embeddings and final norms swapped
for in-place versions that keep their children, parameters and state_dict.
One file per family; ``registry`` says which classes are known.
"""

from .registry import BASE_MODELS, FAMILIES, LAYERS, convert_known

__all__ = ["convert_known", "FAMILIES", "BASE_MODELS", "LAYERS"]
