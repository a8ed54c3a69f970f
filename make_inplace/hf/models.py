"""Model configurations the benchmark, the main job and the tests build (random weights, nothing downloaded).

Four families at three sizes: ``"reference"`` (the workloads the memory
targets are stated for: BERT-large, GPT-2 medium, a Llama-style 1B with GQA 32/8,
ViT-L/14 at 448 px), ``"small"`` (a fast GPU check) and ``"tiny"`` (2 layers,
d = 64, for CPU tests).

Example::

    >>> model = make_inplace.hf.models.build("llama", "tiny", dtype=torch.float32, device="cpu")
    >>> inputs = make_inplace.hf.models.make_inputs("llama", model, batch=2, seq_len=8, device="cpu")
    >>> sorted(inputs)
    ['input_ids', 'use_cache']
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FAMILIES = ("bert", "gpt2", "llama", "vit")
SIZES = ("tiny", "small", "reference")


@dataclass(frozen=True)
class Shape:
    """Width of a model: hidden size, layers, heads, key/value heads, MLP width."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inner: int


SHAPES = {
    "reference": {
        "bert": Shape(1024, 24, 16, 16, 4096),
        "gpt2": Shape(1024, 24, 16, 16, 4096),
        "llama": Shape(2048, 16, 32, 8, 8192),
        "vit": Shape(1024, 24, 16, 16, 4096),
    },
    "small": {
        "bert": Shape(256, 2, 4, 4, 1024),
        "gpt2": Shape(256, 2, 4, 4, 1024),
        "llama": Shape(256, 2, 4, 2, 704),
        "vit": Shape(256, 2, 4, 4, 1024),
    },
    "tiny": {f: Shape(64, 2, 4, 2 if f == "llama" else 4, 160 if f == "llama" else 128) for f in FAMILIES},
}

# The reference workload per family: batch x sequence (ViT: images of IMAGE_SIZE px, patch PATCH).
REFERENCE_POINTS = {"bert": (8, 4096), "gpt2": (8, 2048), "llama": (4, 8192), "vit": (32, None)}
IMAGE_SIZE = {"reference": 448, "small": 224, "tiny": 32}
PATCH = {"reference": 14, "small": 16, "tiny": 8}
VOCAB = {"reference": 32000, "small": 1000, "tiny": 99}
DESCRIPTIONS = {
    "bert": "BERT-large-like encoder (post-norm)",
    "gpt2": "GPT-2 medium-like decoder (Conv1D, fused QKV)",
    "llama": "Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA)",
    "vit": "ViT-L/14-like image encoder (pre-norm)",
}


def sweeps_batch(family: str) -> bool:
    """ViT's sequence is fixed by the image size; its sweep varies the batch instead."""
    return family == "vit"


def config(family: str, size: str, *, max_positions: int = 512, attn_implementation: str = "sdpa"):
    """The transformers config of ``family`` at ``size`` (dropout 0: inference)."""
    import transformers as tf

    if family not in FAMILIES or size not in SIZES:
        raise ValueError(f"config: family must be one of {FAMILIES} and size one of {SIZES}, got {family!r}, {size!r}")
    s = SHAPES[size][family]
    common = {"attn_implementation": attn_implementation}
    if family == "bert":
        return tf.BertConfig(
            vocab_size=VOCAB[size], hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
            intermediate_size=s.inner, max_position_embeddings=max_positions, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, **common,
        )
    if family == "gpt2":
        return tf.GPT2Config(
            vocab_size=VOCAB[size], n_embd=s.hidden, n_layer=s.layers, n_head=s.heads, n_inner=s.inner,
            n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0, **common,
        )
    if family == "llama":
        return tf.LlamaConfig(
            vocab_size=VOCAB[size], hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads, intermediate_size=s.inner, max_position_embeddings=max_positions,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, **common,
        )
    return tf.ViTConfig(
        hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads, intermediate_size=s.inner,
        image_size=IMAGE_SIZE[size], patch_size=PATCH[size], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, **common,
    )


def base_class(family: str):
    import transformers as tf

    return {"bert": tf.BertModel, "gpt2": tf.GPT2Model, "llama": tf.LlamaModel, "vit": tf.ViTModel}[family]


def build(
    family: str,
    size: str,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    max_positions: int = 512,
    attn_implementation: str = "sdpa",
    seed: int = 0,
) -> nn.Module:
    """The base model (BertModel, GPT2Model, LlamaModel, ViTModel) with seeded random weights, in eval mode."""
    torch.manual_seed(seed)
    cfg = config(family, size, max_positions=max_positions, attn_implementation=attn_implementation)
    with torch.device(device):
        model = base_class(family)(cfg)
    return model.to(dtype).eval()


def make_inputs(family: str, model: nn.Module, *, batch: int, seq_len: int | None, device, seed: int = 1) -> dict:
    """Seeded inputs: token ids (decoders without a cache), or images of the model's size."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    if family == "vit":
        size = cfg.image_size
        pixels = torch.randn(batch, cfg.num_channels, size, size, generator=gen)
        return {"pixel_values": pixels.to(device, next(model.parameters()).dtype)}
    ids = torch.randint(1, cfg.vocab_size, (batch, seq_len), generator=gen).to(device)
    inputs = {"input_ids": ids}
    if family in ("gpt2", "llama"):
        inputs["use_cache"] = False  # activations only: no KV cache kept
    return inputs


def tokens(family: str, size: str, batch: int, seq_len: int | None) -> int:
    """Rows of the residual stream for this input."""
    if family == "vit":
        return batch * ((IMAGE_SIZE[size] // PATCH[size]) ** 2 + 1)
    return batch * seq_len


def output_of(out) -> torch.Tensor:
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
