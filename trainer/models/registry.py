"""Model registry: every video model is built by name from ``CONFIG.MODEL.NAME``.

Adding a model is one new ``.py`` file in ``trainer/models/`` with a decorated builder; the package imports
every module in it, so the decorator runs and the name becomes buildable.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Protocol

from torch import nn


class ModelBuilder(Protocol):
    """The call contract of a registered builder: ``fn(num_classes, **kwargs) -> nn.Module``."""

    def __call__(self, num_classes: int, **kwargs: object) -> nn.Module: ...


_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(name: str, *aliases: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register a model builder under ``name`` and any ``aliases`` (e.g. the GluonCV model-zoo name).

    The decorated function is called as ``fn(num_classes: int, **kwargs) -> nn.Module``: ``num_classes``
    sets the classifier head, ``kwargs`` are builder-specific options (e.g. dropout). The returned module
    maps a float clip ``[B, 3, T, H, W]`` to logits ``[B, num_classes]``. Names are case-insensitive;
    registering a name twice is an error, so two files cannot silently shadow each other.
    """

    def decorator(fn: ModelBuilder) -> ModelBuilder:
        for key in (name, *aliases):
            key = key.lower()
            if key in _REGISTRY:
                raise ValueError(f"model name {key!r} is already registered")
            _REGISTRY[key] = fn
        return fn

    return decorator


def list_models() -> list[str]:
    """Every buildable name (canonical names and aliases), sorted."""
    return sorted(_REGISTRY)


def build_model(name: str, num_classes: int, **kwargs: object) -> nn.Module:
    """Build the model registered as ``name`` with a ``num_classes``-way head.

    The result always carries ``needs_unused_parameters: bool`` (False unless the model sets it), which tells
    the DDP wrapper whether ``find_unused_parameters`` is required.
    """
    key = name.lower()
    if key not in _REGISTRY:
        near = difflib.get_close_matches(key, _REGISTRY, n=3, cutoff=0.5)
        hint = f"; nearest registered names: {', '.join(near)}" if near else ""
        raise ValueError(f"unknown model {name!r}{hint} (list_models() gives all {len(_REGISTRY)})")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    model = _REGISTRY[key](num_classes, **kwargs)
    model.needs_unused_parameters = bool(getattr(model, "needs_unused_parameters", False))
    return model
