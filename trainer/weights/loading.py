"""Load a weights file of any supported format into one of our models, all of it or an error.

Every tensor of the model must come from the file, and every tensor of the file must find a place in the model,
with one exception: the classifier (the model's last linear or conv layer) may differ in shape (another number of
classes) or be absent; it then keeps its fresh initialisation and the report says so. Anything else is a
:class:`WeightsError` listing what did not load, unless partial loading is explicitly allowed
(``CONFIG.MODEL.PARTIAL_LOAD``), in which case whatever fits is loaded and the rest is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trainer.weights.formats import WeightsError, WeightsFile, read_weights
from trainer.weights.mapping import UnsupportedModel, source_names_for

SHOWN = 12  # names listed in a one-line error before "+N more"


@dataclass
class LoadReport:
    path: Path
    format: str
    loaded: list[str] = field(default_factory=list)  # our names
    head_reinitialised: dict[str, str] = field(default_factory=dict)  # our name -> why
    missing: list[str] = field(default_factory=list)  # source names the model needs and the file lacks
    mismatched: dict[str, str] = field(default_factory=dict)  # source name -> "file (..) vs model (..)"
    unexpected: list[str] = field(default_factory=list)  # source tensors the model has no place for

    @property
    def complete(self) -> bool:
        return not (self.missing or self.mismatched or self.unexpected)

    def problems(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} tensor(s) missing from the file: {_names(self.missing)}")
        if self.mismatched:
            shown = [f"{name} {why}" for name, why in sorted(self.mismatched.items())]
            parts.append(f"{len(self.mismatched)} of another shape: {_names(shown)}")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} in the file with no place in the model: {_names(self.unexpected)}")
        return "; ".join(parts)

    def summary(self) -> str:
        text = f"loaded {len(self.loaded)} tensors from {self.path} ({self.format} format)"
        if self.head_reinitialised:
            heads = ", ".join(f"{name} ({why})" for name, why in sorted(self.head_reinitialised.items()))
            text += f"; classifier re-initialised: {heads}"
        if not self.complete:
            text += f"; NOT loaded (partial load allowed): {self.problems()}"
        return text


def _names(names: list[str]) -> str:
    names = sorted(names)
    more = f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def classifier_names(model: nn.Module) -> set[str]:
    """State-dict names of the model's classifier: its last linear or conv layer (the head, in every model we build
    and in torchvision's video models)."""
    last = ""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Conv3d):
            last = name
    return {f"{last}.{tensor}" for tensor, _ in model.get_submodule(last).named_parameters(recurse=False)}


def _drop_aliases(source: WeightsFile) -> dict[str, torch.Tensor]:
    tensors = dict(source.tensors)
    if source.format == "gluoncv":
        # GluonCV's I3D registers its fc twice (as fc and as head.1): the same tensors under two names
        for tensor in ("weight", "bias"):
            if f"fc.{tensor}" in tensors:
                tensors.pop(f"head.1.{tensor}", None)
    return tensors


def _label(model: nn.Module, model_name: str) -> str:
    return f"model {model_name}" if model_name else f"the {type(model).__name__} model"


def match_weights(
    model: nn.Module, source: WeightsFile, *, allow_new_head: bool = True, model_name: str = ""
) -> tuple[LoadReport, dict[str, torch.Tensor]]:
    """Where each tensor of ``source`` goes in ``model``, copying nothing: the report, and the tensors that fit under
    our names. Needs only names and shapes, so the model and the file may live on the meta device (the zoo's tests
    check whole published layouts that way)."""
    tensors = _drop_aliases(source)
    try:
        mapping = source_names_for(model, source.format, set(tensors))
    except UnsupportedModel:
        raise WeightsError(
            f"{source.path}: {source.format} weights cannot be mapped onto {_label(model, model_name)}, which is not a "
            "3D ResNet; only files with its own tensor names load into it"
        ) from None
    target = model.state_dict()
    heads = classifier_names(model) if allow_new_head else set()
    report = LoadReport(source.path, source.format)
    converted: dict[str, torch.Tensor] = {}
    for ours, theirs in mapping.items():
        value = tensors.get(theirs)
        expected = tuple(target[ours].shape)
        if value is None:
            if ours in heads:
                report.head_reinitialised[ours] = "not in the file"
            elif not ours.endswith("num_batches_tracked"):
                report.missing.append(theirs)
        elif tuple(value.shape) != expected:
            if ours in heads:
                report.head_reinitialised[ours] = f"{tuple(value.shape)} in the file, {expected} in the model"
            else:
                report.mismatched[theirs] = f"(file {tuple(value.shape)} vs model {expected})"
        else:
            converted[ours] = value
    report.unexpected = sorted(set(tensors) - set(mapping.values()))
    return report, converted


def check_complete(report: LoadReport, model: nn.Module, *, allow_partial: bool, allow_new_head: bool = True,
                   model_name: str = "") -> None:
    """WeightsError listing what ``report`` could not load into ``model``, unless everything loaded or
    ``allow_partial``."""
    if report.complete or allow_partial:
        return
    # PARTIAL_LOAD is for initial weights only: a trained model is evaluated whole or not at all
    partial = ", or set CONFIG.MODEL.PARTIAL_LOAD: True to load only what fits" if allow_new_head else ""
    raise WeightsError(
        f"{report.path} ({report.format} weights) does not fit {_label(model, model_name)}: {report.problems()}; "
        f"fix the file or the model name{partial}"
    )


def load_weights(
    model: nn.Module,
    weights: str | Path | WeightsFile,
    *,
    allow_partial: bool = False,
    allow_new_head: bool = True,
    model_name: str = "",
) -> LoadReport:
    """Copy the weights of ``weights`` (a path or an already read file) into ``model``; see the module doc.

    ``allow_new_head`` False (evaluating a trained model) makes a missing or differently shaped classifier an error
    like any other tensor."""
    source = weights if isinstance(weights, WeightsFile) else read_weights(weights)
    report, converted = match_weights(model, source, allow_new_head=allow_new_head, model_name=model_name)
    check_complete(report, model, allow_partial=allow_partial, allow_new_head=allow_new_head, model_name=model_name)
    model.load_state_dict(converted, strict=False)
    report.loaded = sorted(converted)
    return report
