"""VideoMAE, TimeSformer and V-JEPA 2 from Hugging Face ``transformers``, built from the library's own classes.

Each model is the library's video classifier (sizes and families in :mod:`trainer.hf_models`) with a ``NUM_CLASSES``
head, taking our clips ``(B, C, T, H, W)`` where the library takes ``(B, T, C, H, W)`` and giving the logits. Its
state-dict names are the library's, so a checkpoint folder it saved loads by name
(:mod:`trainer.weights.hf_checkpoint`). transformers is imported only when one of these models is built: nodes
training the zoo's models need not have it.
"""

from __future__ import annotations

import functools
import importlib
import re
from types import ModuleType
from typing import Any

import torch
from torch import nn

from trainer.hf_models import FAMILIES, HF_MODELS, missing_library

from .registry import register_model


def _transformers(model_name: str) -> ModuleType:
    problem = missing_library(model_name)
    if problem is not None:
        raise ImportError(problem)
    return importlib.import_module("transformers")


@functools.cache
def _clip_class(family_name: str) -> type[nn.Module]:
    """The library's classifier of ``family_name``, taking our clip layout and returning the logits."""
    family = FAMILIES[family_name]
    base = getattr(importlib.import_module("transformers"), family.model_class)

    def forward(self: nn.Module, clip: torch.Tensor) -> torch.Tensor:
        return base.forward(self, **{family.input_name: clip.transpose(1, 2)}).logits

    def takes_clip(self: nn.Module) -> tuple[int, int] | None:
        """(frames, square size) of the only clip the model takes; None when it takes any."""
        config = self.config
        return (getattr(config, family.frames_key), getattr(config, family.size_key)) if family.fixed_clip else None

    prefix = re.escape(base.base_model_prefix)
    embeddings = re.compile(rf"^{prefix}\.(?:encoder\.)?embeddings\.")  # V-JEPA 2 keeps them in its encoder
    block = re.compile(rf"^{prefix}\.encoder\.layer\.(\d+)\.")

    def vit_layer(self: nn.Module, param_name: str) -> int:
        """Depth of a parameter for layer-wise LR decay, as BEiT's and VideoMAE's get_num_layer_for_vit count it: 0
        the embeddings, i + 1 encoder layer i, num_hidden_layers + 1 everything after the encoder (norm, pooler,
        head)."""
        if embeddings.match(param_name):
            return 0
        found = block.match(param_name)
        return int(found.group(1)) + 1 if found else self.config.num_hidden_layers + 1

    def train(self: nn.Module, mode: bool = True) -> nn.Module:
        base.train(self, mode)
        if self.probing:  # the probe's encoder never trains: no dropout, whatever the loop asks
            self.get_submodule(family.probe_encoder).eval()
        return self

    def probe_only(self: nn.Module) -> None:
        """The attentive probe: the encoder frozen (no gradients, so neither the optimizer nor DDP's gradient sync
        holds it) and in eval mode from now on; the pooler and classifier train."""
        if not family.probe_encoder:
            raise ValueError(f"transformers' {family.model_class} has no attentive probe")
        self.get_submodule(family.probe_encoder).requires_grad_(False)
        self.probing = True
        self.needs_unused_parameters = False  # the unused predictor is in the frozen encoder: every trained part runs
        self.train(self.training)

    return type(f"{base.__name__}OnClips", (base,), {"forward": forward, "takes_clip": takes_clip, "train": train,
                                                      "probe_only": probe_only, "probing": False,
                                                      "vit_layer": vit_layer, "hf_family": family_name,
                                                      "__module__": __name__})


def build_hf_model(model_name: str, num_classes: int, **overrides: Any) -> nn.Module:
    """``model_name``'s library classifier with ``num_classes`` outputs, randomly initialised; ``overrides`` set other
    config values of the library's (a tiny test model); a key its config does not have is a TypeError naming it."""
    spec = HF_MODELS[model_name]
    family = FAMILIES[spec.family]
    config_class = getattr(_transformers(model_name), family.config_class)
    known = set(config_class().to_dict())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"{model_name}: unexpected keyword argument(s) {', '.join(map(repr, unknown))} (not in "
                        f"transformers' {family.config_class})")
    config = config_class(**{**spec.config, **overrides, "num_labels": num_classes})
    model = _clip_class(spec.family)(config)
    model.needs_unused_parameters = family.unused_parameters
    return model


def _register(name: str) -> None:
    @register_model(name)
    def build(num_classes: int, **overrides: Any) -> nn.Module:
        return build_hf_model(name, num_classes, **overrides)

    build.__doc__ = f"transformers' {FAMILIES[HF_MODELS[name].family].model_class} ({name})."


for _name in HF_MODELS:
    _register(_name)
