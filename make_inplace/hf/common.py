"""What the family converters share: reading activations and norms off transformers' modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import Norm

ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")


def activation_name(act: object) -> str | None:
    """The block activation equal to transformers' activation module ``act``, or None."""
    kind = type(act).__name__
    if kind == "GELUActivation":
        return "gelu"  # F.gelu, or the erf formula written out: the same function
    if kind in ("NewGELUActivation", "GELUTanh", "FastGELUActivation"):
        return "gelu_tanh"  # the tanh approximation (written out or fused)
    if kind in ("SiLUActivation",) or isinstance(act, nn.SiLU):
        return "silu"
    if type(act) is nn.ReLU:
        return "relu"
    if isinstance(act, nn.GELU):
        return "gelu" if act.approximate == "none" else "gelu_tanh"
    if act is F.gelu:
        return "gelu"
    if act is F.relu or act is torch.relu:
        return "relu"
    if act is F.silu:
        return "silu"
    return None


# A converted layer reads a few dozen submodules and parameters per call. As attributes each
# costs ~0.4 us (nn.Module.__getattr__ runs only after the normal lookup has failed and raised),
# a tenth of a tiny model's layer; these read the dicts that __getattr__ reads.


def child(module: nn.Module, name: str) -> nn.Module:
    """``module.<name>``, read from the submodule dict when it is there."""
    modules = module._modules
    return modules[name] if name in modules else getattr(module, name)


def param(module: nn.Module, name: str) -> torch.Tensor | None:
    """``module.<name>`` for a parameter; one a parametrization replaced (a property) as the attribute."""
    params = module._parameters
    return params[name] if name in params else getattr(module, name)


def linear_params(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of an ``nn.Linear`` or transformers' ``Conv1D``."""
    return param(module, "weight"), param(module, "bias")


def layer_norm(module: nn.LayerNorm) -> Norm:
    if len(module.normalized_shape) != 1:
        raise ValueError("only a LayerNorm over the last dimension is supported")
    return Norm.layer(param(module, "weight"), param(module, "bias"), module.eps)


def rms_norm(module: nn.Module) -> Norm:
    """transformers' ``*RMSNorm`` (``weight``, ``variance_epsilon``) as a Norm."""
    return Norm.rms(param(module, "weight"), module.variance_epsilon)


def hooked(*modules: nn.Module) -> nn.Module | None:
    """The first module with hooks of its own (which an in-place block would not call), or None."""
    for m in modules:
        for sub in m.modules():
            if sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks or sub._backward_pre_hooks:
                return sub
    return None


def attention_implementation_obstacle(config) -> str | None:
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ATTENTION_IMPLEMENTATIONS:
        return f"attention implementation {impl!r}: the in-place block reads sdpa/eager masks only (use attn_implementation='sdpa')"
    return None


def cache_for(past_key_values):
    """The self-attention cache inside an encoder-decoder cache, else the cache itself."""
    inner = getattr(past_key_values, "self_attention_cache", None)
    return inner if inner is not None else past_key_values


def kv_update_for(past_key_values, layer_idx: int, crop_to: int | None):
    """kv_update for residual_attention_: the cache's update; cropped to ``crop_to`` keys when set.

    transformers' sdpa path, given no mask and several queries with more keys
    than queries (an empty static cache), attends to the first ``q_len`` keys
    with upper-left causal masking; cropping reproduces that.
    """
    if past_key_values is None:
        return None
    cache = cache_for(past_key_values)

    def update(k: torch.Tensor, v: torch.Tensor):
        k_all, v_all = cache.update(k, v, layer_idx)
        if crop_to is not None and k_all.shape[2] > crop_to:
            k_all, v_all = k_all[:, :, :crop_to], v_all[:, :, :crop_to]
        return k_all, v_all

    return update


def attention_mode(attention_mask, q_len: int, module_is_causal: bool) -> tuple[bool, torch.Tensor | None, int | None]:
    """(causal, mask, crop_to) as transformers' sdpa integration decides them for this call."""
    if attention_mask is not None:
        return False, attention_mask, None
    causal = module_is_causal and q_len > 1
    return causal, None, (q_len if causal else None)
