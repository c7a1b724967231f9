"""Video models: a name registry and the model files that fill it (weights loading: :mod:`trainer.weights`).

Every module in this package is imported here, so a new model is one new ``.py`` file whose builder carries
``@register_model("name", "alias", ...)``; nothing else needs editing.
"""

import importlib
import pkgutil

from .registry import build_model, list_models, register_model

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["build_model", "list_models", "register_model"]
