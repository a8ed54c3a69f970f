"""Swapping a module's class for an in-place subclass, keeping its children, parameters and state_dict.

The new class is ``Inplace<Original>`` (the mixin's ``class_prefix``), with the family's mixin first in the
MRO, so ``super().forward`` is transformers' own forward (used whenever the
in-place path does not apply) and ``isinstance`` checks keep holding. The
class lives in the mixin's module under that name, so pickle finds it; a
family module's ``__getattr__`` recreates it in a fresh process.
"""

from __future__ import annotations

import importlib
import sys

from torch import nn

from .scope import Token

_CLASSES: dict[tuple[type, type], type] = {}


def inplace_class(original: type, mixin: type) -> type:
    """``Inplace<original>``: mixin's methods over the original class (made once per pair)."""
    key = (original, mixin)
    cls = _CLASSES.get(key)
    if cls is None:
        name = f"{getattr(mixin, 'class_prefix', 'Inplace')}{original.__name__}"
        cls = type(name, (mixin, original), {"__module__": mixin.__module__, "__qualname__": name})
        setattr(sys.modules[mixin.__module__], name, cls)
        _CLASSES[key] = cls
    return cls


def swap_(module: nn.Module, mixin: type, token: Token | None) -> str:
    """Makes ``module`` an instance of ``Inplace<its class>``; returns the new class name."""
    cls = inplace_class(type(module), mixin)
    module.__class__ = cls
    module._make_inplace_token = token
    return cls.__name__


def is_swapped(module: nn.Module) -> bool:
    return type(module) in _CLASSES.values()


def class_for_pickle(module_name: str, name: str, originals: dict[str, tuple[str, type]]) -> type:
    """For a family module's ``__getattr__``: rebuild ``<prefix><X>`` from ``originals[X] = (module, mixin)``."""
    for original_name, (source, mixin) in originals.items():
        if name == getattr(mixin, "class_prefix", "Inplace") + original_name:
            return inplace_class(getattr(importlib.import_module(source), original_name), mixin)
    raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
