"""Which hidden states a converted block may overwrite.

A converted base model (``BertModel``, ``LlamaModel``, ...) runs its forward
inside a scope that records the storages of every tensor its caller passed.
Inside that scope, a hidden-states tensor that is none of the caller's was
made by the model's own code for the next block, which is the only reader in
the model families converted here: blocks overwrite it. Anything else (a
caller's ``inputs_embeds``, a block called on its own, a forward whose hidden
states transformers is recording) is first copied once.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ..nn._autocast import autocast_on


class Token:
    """Marks a converted base model and the modules converted inside it."""


@dataclass(frozen=True)
class _Scope:
    token: Token
    caller_storages: frozenset


_ACTIVE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("make_inplace_hf_scope", default=None)


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def _caller_storages(args: tuple, kwargs: dict) -> frozenset:
    keys = set()

    def visit(value, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            keys.add(_storage_key(value))
        elif depth < 3 and isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)
        elif depth < 3 and isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)

    visit(args, 0)
    visit(kwargs, 0)
    return frozenset(keys)


class ScopedForward:
    """The instance-level ``forward`` of a converted base model: its class's forward inside a scope."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args, **kwargs):
        scope = _Scope(self.module._make_inplace_token, _caller_storages(args, kwargs))
        reset = _ACTIVE.set(scope)
        try:
            return type(self.module).forward(self.module, *args, **kwargs)
        finally:
            _ACTIVE.reset(reset)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(type(self.module).forward.__get__(self.module))


def install_scope(base: nn.Module, token: Token) -> None:
    """Gives ``base`` the token of its converted modules and a scoped forward (once)."""
    if getattr(base, "_make_inplace_token", None) is None:
        base._make_inplace_token = token
        base.forward = ScopedForward(base)


@functools.cache
def _active_collector() -> contextvars.ContextVar | None:
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


def recording() -> bool:
    """Whether transformers is collecting hidden states or attentions of this forward."""
    collector = _active_collector()
    if collector is None:  # other versions: assume it might
        return True
    return bool(collector.get())


def owned(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``module`` may overwrite ``x``: inside its base model's scope, made by the model itself."""
    scope = _ACTIVE.get()
    return (
        scope is not None
        and scope.token is getattr(module, "_make_inplace_token", None)
        and x.is_contiguous()
        and _storage_key(x) not in scope.caller_storages
    )


def writable(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x itself when ``module`` owns it, else a contiguous copy to overwrite."""
    return x if owned(module, x) else x.clone(memory_format=torch.contiguous_format)


def inference_only(module: nn.Module, *tensors: torch.Tensor | None) -> bool:
    """The in-place path applies: eval mode, nothing recorded by autograd or by
    transformers, and no torch.autocast on the tensors' devices (there
    transformers' forward runs, whose ops autocast casts one by one; the blocks
    take one dtype throughout)."""
    if module.training or recording():
        return False
    if any(t is not None and autocast_on(t) for t in tensors):
        return False
    if torch.is_grad_enabled():
        if any(t is not None and t.requires_grad for t in tensors):
            return False
        if any(p.requires_grad for p in module.parameters()):
            return False
    return True
