"""convert_: swap a model's attention and encoder layers for the in-place versions."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from torch import nn

from .nn.attention import InplaceMultiheadAttention
from .nn.encoder import InplaceTransformerEncoderLayer
from .nn.layer_norm import InplaceLayerNorm
from .nn.linear import InplaceLinear
from .nn.softmax import InplaceSoftmax

logger = logging.getLogger(__name__)

# Left alone: their in-place versions are only safe where the caller knows the
# input is not read again, which a model's module tree does not tell.
_UNSAFE_ALONE = (nn.Linear, nn.LayerNorm, nn.Softmax)
_OURS = (InplaceMultiheadAttention, InplaceTransformerEncoderLayer, InplaceLinear, InplaceLayerNorm, InplaceSoftmax)


@dataclass
class ConversionReport:
    """What ``convert_`` did: ``replaced`` and ``skipped`` entries, in module order.

    ``replaced``: (qualified name, old type name, new type name).
    ``skipped``: (qualified name, type name, reason). ``notes``: (qualified
    name, other change made there). Names are as in ``model.named_modules()``
    ('' is the model itself).
    """

    replaced: list[tuple[str, str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    # (qualified name, what else was changed there and why).
    notes: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"convert_: replaced {len(self.replaced)}, skipped {len(self.skipped)}"]
        lines += [f"  replaced {name or '<model>'}: {old} -> {new}" for name, old, new in self.replaced]
        lines += [f"  skipped  {name or '<model>'} ({kind}): {why}" for name, kind, why in self.skipped]
        lines += [f"  note     {name or '<model>'}: {what}" for name, what in self.notes]
        return "\n".join(lines)


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def _mha_obstacle(m: nn.MultiheadAttention) -> str | None:
    if type(m) is not nn.MultiheadAttention:
        return f"subclass {type(m).__name__} of nn.MultiheadAttention: its forward may differ"
    if not m.batch_first:
        return "batch_first=False: the in-place version takes (N, L, E) inputs only"
    if m.bias_k is not None:
        return "add_bias_kv=True is not supported"
    if m.add_zero_attn:
        return "add_zero_attn=True is not supported"
    if _hooked(m):
        return "has hooks, which a replacement would drop"
    return None


def _layer_obstacle(m: nn.TransformerEncoderLayer) -> str | None:
    if type(m) is not nn.TransformerEncoderLayer:
        return f"subclass {type(m).__name__} of nn.TransformerEncoderLayer: its forward may differ"
    if not isinstance(m.self_attn, nn.MultiheadAttention):
        return f"self_attn is a {type(m.self_attn).__name__}, not nn.MultiheadAttention"
    reason = _mha_obstacle(m.self_attn)
    if reason is not None:
        return f"self_attn: {reason}"
    if _hooked(m) or any(_hooked(c) for c in m.modules()):
        return "it or a submodule has hooks, which a replacement would drop"
    return None


def _convert_transformers(module: nn.Module, name: str, report: ConversionReport, decided: set[int]) -> bool:
    """transformers' known blocks (make_inplace.hf); True when module itself now runs in place."""
    if "transformers" not in sys.modules:  # no transformers model can be in the tree
        return False
    from .hf import convert_known

    return convert_known(module, name, report, decided)


def _convert(module: nn.Module, name: str, report: ConversionReport, decided: set[int]) -> nn.Module:
    """The module to put at ``name``: a replacement, or module itself with its children converted."""
    kind = type(module).__name__
    if isinstance(module, _OURS):
        return module
    if _convert_transformers(module, name, report, decided):
        return module
    if isinstance(module, nn.TransformerEncoderLayer):
        reason = _layer_obstacle(module)
        if reason is None:
            report.replaced.append((name, kind, InplaceTransformerEncoderLayer.__name__))
            return InplaceTransformerEncoderLayer.from_torch(module)
        report.skipped.append((name, kind, reason))
    elif isinstance(module, nn.MultiheadAttention):
        reason = _mha_obstacle(module)
        if reason is None:
            report.replaced.append((name, kind, InplaceMultiheadAttention.__name__))
            return InplaceMultiheadAttention.from_torch(module)
        report.skipped.append((name, kind, reason))
        return module
    elif isinstance(module, _UNSAFE_ALONE):
        report.skipped.append((name, kind, "left out of place: its input may be read again after the call"))
        return module
    for child_name, child in list(module.named_children()):
        qualified = f"{name}.{child_name}" if name else child_name
        new = _convert(child, qualified, report, decided)
        if new is not child:
            setattr(module, child_name, new)
    if isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False):
        if isinstance(module.layers[0], InplaceTransformerEncoderLayer):
            # Its forward decides on nested tensors from a flag set in __init__,
            # without looking at the layers again; ours take padded batches.
            module.use_nested_tensor = False
            report.notes.append((name, "use_nested_tensor set to False: the in-place layers take padded batches"))
    return module


def convert_(model: nn.Module) -> nn.Module:
    """Replaces, inside ``model``, every ``nn.MultiheadAttention`` and
    ``nn.TransformerEncoderLayer`` with ``batch_first=True`` by
    :class:`~make_inplace.nn.InplaceMultiheadAttention` /
    :class:`~make_inplace.nn.InplaceTransformerEncoderLayer`.

    The replacements adopt the originals' Parameter objects and submodules
    (no copy: same device, dtype and identity, so an optimizer built before
    the call keeps working) and their train/eval mode. Everything else is
    left alone: a bare ``nn.Linear``/``nn.LayerNorm``/``nn.Softmax`` is not
    made in place, because its input may be read again after the call.
    Skipped: ``batch_first=False``, ``add_bias_kv``/``add_zero_attn``,
    subclasses (their forward may differ) and modules with hooks. An
    ``nn.TransformerEncoder`` whose layers were replaced gets
    ``use_nested_tensor = False`` (its nested-tensor fast path would hand the
    new layers nested tensors); padded positions then hold computed values
    where torch's nested path returns zeros.

    Hugging Face transformers models (BERT/RoBERTa encoders, GPT-2, Llama,
    Mistral and Qwen2 decoders, ViT; see :mod:`make_inplace.hf`): their
    layers, embeddings and final norms keep their objects, children,
    parameters and state_dict but get an in-place class (``Inplace<Name>``)
    whose forward overwrites the residual stream by row panels
    (:mod:`make_inplace.blocks`) under ``torch.no_grad()``/inference mode in
    eval mode, and runs transformers' own forward otherwise (grad mode with
    parameters requiring grad, training, ``output_hidden_states`` /
    ``output_attentions``). The base model's forward then runs in a scope
    that lets blocks overwrite only hidden states the model itself made;
    caller tensors (``inputs_embeds``) are copied first. Decoders keep their
    KV cache and ``generate()``. Attention runs through
    ``scaled_dot_product_attention`` for the ``sdpa`` and ``eager``
    implementations; models configured for others are skipped with a reason.

    Returns ``model`` (or, when ``model`` itself is one of the two layer
    types, its replacement). What was replaced and what was skipped and why is
    a :class:`ConversionReport` at ``returned.make_inplace_report``, and is
    logged on the ``make_inplace.convert`` logger (INFO).

    Example::

        >>> layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
        >>> model = make_inplace.convert_(torch.nn.TransformerEncoder(layer, num_layers=2))
        >>> len(model.make_inplace_report.replaced)
        2
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_: model must be a torch.nn.Module, got {type(model).__name__}")
    report = ConversionReport()
    result = _convert(model, "", report, set())
    result.make_inplace_report = report
    logger.info("%s", report)
    return result
