"""How the launcher's plugins (filters, actions) import the trainer: ``trainer_module("runtime.report")``.

The trainer package sits in the repository this collection belongs to, not in the controller's Python environment
(its code ships to the nodes from here). It is registered under its own name from that folder, once per process, so
its modules import each other as they do anywhere; nothing is added to ``sys.path``, so a ``trainer`` folder in the
current directory is never picked up instead.

A filter plugin imports the trainer where a filter runs, not at its own top (``trainer_module`` inside the function,
``trainer_function`` for a filter that is a trainer function): Ansible loads every filter plugin in each process it
forks for a task, so a trainer import at a plugin's top costs every task, not just the ones that use it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

# collections/ansible_collections/vidcluster/launcher/plugins/plugin_utils/trainer.py -> the repository's trainer/
PACKAGE = Path(__file__).resolve().parents[6] / "trainer"


def trainer_module(name: str) -> ModuleType:
    """The module ``trainer.<name>`` of this repository's trainer (ImportError when another one is loaded)."""
    package = sys.modules.get("trainer")
    if package is None:
        spec = importlib.util.spec_from_file_location("trainer", PACKAGE / "__init__.py",
                                                      submodule_search_locations=[str(PACKAGE)])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["trainer"] = package
        spec.loader.exec_module(package)
    elif Path(str(package.__file__)).resolve().parent != PACKAGE:
        raise ImportError(f"another trainer package is loaded ({package.__file__}), not this repository's ({PACKAGE})")
    return importlib.import_module(f"trainer.{name}")


def trainer_function(name: str, function: str) -> Callable[..., Any]:
    """``trainer.<name>.<function>``, imported at its first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(trainer_module(name), function)(*args, **kwargs)

    call.__name__ = call.__qualname__ = function
    return call
