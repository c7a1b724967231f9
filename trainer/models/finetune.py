"""Fine-tuning: initialise a model from a checkpoint file, reusing every tensor whose name and shape match.

Accepted files: our training checkpoints (``{'model': state_dict, ...}``), PySlowFast (``model_state``),
GluonCV/mmaction-style (``state_dict``) and raw state dicts; ``module.`` prefixes from DDP-wrapped saves are
stripped. Tensors that do not fit (typically a classifier head of another size) keep the model's fresh
initialisation and are reported with the reason.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

STATE_DICT_KEYS = ("model", "model_state", "state_dict")
DDP_PREFIX = "module."


@dataclass
class FinetuneReport:
    loaded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # checkpoint tensor name -> reason
    not_in_checkpoint: list[str] = field(default_factory=list)  # model tensors left as initialised

    def summary(self) -> str:
        lines = [
            f"fine-tune: loaded {len(self.loaded)} tensors, skipped {len(self.skipped)}, "
            f"{len(self.not_in_checkpoint)} model tensors not in the checkpoint"
        ]
        lines += [f"  skipped {name}: {reason}" for name, reason in sorted(self.skipped.items())]
        lines += [f"  kept initialisation: {name}" for name in self.not_in_checkpoint]
        return "\n".join(lines)


def read_state_dict(path: str | Path) -> dict[str, object]:
    """Load ``path`` and return its model state dict with ``module.`` prefixes removed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fine-tune checkpoint not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # Training checkpoints can hold numpy RNG state, which the safe loader refuses. The path is a local
        # file the user named for this run, trusted like the config itself.
        obj = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{path}: expected a state dict or a checkpoint dict, got {type(obj).__name__}")
    for key in STATE_DICT_KEYS:
        if isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    return {name.removeprefix(DDP_PREFIX): value for name, value in obj.items()}


def load_finetune(model: nn.Module, path: str | Path) -> FinetuneReport:
    """Copy every checkpoint tensor whose name and shape match into ``model``; report the rest."""
    source = read_state_dict(path)
    target = model.state_dict()
    report = FinetuneReport()
    matched: dict[str, torch.Tensor] = {}
    for name, value in source.items():
        if name not in target:
            report.skipped[name] = "missing in model"
        elif not isinstance(value, torch.Tensor):
            report.skipped[name] = f"not a tensor ({type(value).__name__})"
        elif value.shape != target[name].shape:
            report.skipped[name] = f"shape {tuple(value.shape)} vs {tuple(target[name].shape)}"
        else:
            matched[name] = value
    model.load_state_dict(matched, strict=False)
    report.loaded = sorted(matched)
    report.not_in_checkpoint = sorted(set(target) - set(matched))
    return report
