"""What a run starts from: ``CONFIG.MODEL.PRETRAINED`` (published weights) or ``LOAD`` + ``PRETRAINED_PATH`` (a local
file in any supported format, or a Hugging Face checkpoint: :mod:`trainer.weights.hf_checkpoint`), the normalisation
those weights expect, and loading them into the model."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from trainer.config import ConfigError
from trainer.hf_models import hf_family
from trainer.weights import hf_checkpoint, zoo
from trainer.weights.formats import WeightsError, WeightsFile, read_weights
from trainer.weights.loading import LoadReport, load_weights

if TYPE_CHECKING:
    from trainer.config import Config

log = logging.getLogger("trainer")

# The input normalisation each format's weights were trained with (torchvision's: per model, from its zoo entry).
FORMAT_NORMALISATION = {
    "pyslowfast": zoo.KINETICS, "caffe2": zoo.KINETICS, "pytorchvideo": zoo.KINETICS, "gluoncv": zoo.IMAGENET,
}


@dataclass(frozen=True)
class InitialWeights:
    path: Path
    origin: str  # for logs: "the gluoncv Kinetics-400 weights" or "CONFIG.MODEL.PRETRAINED_PATH"
    mean: tuple[float, ...]
    std: tuple[float, ...]
    checkpoint: hf_checkpoint.HfCheckpoint | None = None  # a Hugging Face checkpoint, read


def pretrained_file(cfg: Config) -> Path:
    """The local file of the published weights of MODEL.NAME: PRETRAINED_PATH if set, else the cache; verified."""
    model = cfg.CONFIG.MODEL
    entry = zoo.entry_for(model.NAME)
    path = Path(model.PRETRAINED_PATH) if model.PRETRAINED_PATH else zoo.cached_path(entry)
    if not path.is_file():
        raise WeightsError(
            f"CONFIG.MODEL.PRETRAINED: the {entry.source} weights of {model.NAME} are not at {path}; fetch them once "
            f"with 'python -m trainer fetch-weights {model.NAME}' (training never downloads)"
        )
    zoo.verify(entry, path, model.NAME)
    return path


def _normalisation(cfg: Config, source: WeightsFile) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if source.format == "vidcluster" and source.inference.get("clip"):
        clip = source.inference["clip"]
        return tuple(clip["mean"]), tuple(clip["std"])
    if source.format in FORMAT_NORMALISATION:
        return FORMAT_NORMALISATION[source.format]
    if source.format == "torchvision":
        try:
            entry = zoo.entry_for(cfg.CONFIG.MODEL.NAME)
            return entry.mean, entry.std
        except WeightsError:
            pass  # torchvision-named weights for a model torchvision publishes none for: ImageNet, as default
    return zoo.IMAGENET


def check_clip(cfg: Config, entry: zoo.ZooEntry) -> None:
    """ConfigError naming every DATA key whose clip differs from the one ``entry``'s weights were trained on, unless
    MODEL.ALLOW_OTHER_CLIP (a SlowFast 8x8 fed 16 frames gives its Slow pathway 2 frames where it learnt from 4)."""
    data, trained = cfg.CONFIG.DATA, entry.clip
    keys = [key for key in ("CLIP_LEN", "FRAME_RATE", "CROP_SIZE") if getattr(data, key) != getattr(trained, key)]
    if not keys or cfg.CONFIG.MODEL.ALLOW_OTHER_CLIP:
        return
    ours = ", ".join(f"{key} {getattr(data, key)}" for key in keys)
    theirs = ", ".join(f"{key}: {getattr(trained, key)}" for key in ("CLIP_LEN", "FRAME_RATE", "CROP_SIZE"))
    raise ConfigError(
        f"CONFIG.DATA.{ours}: the {entry.source} weights of {cfg.CONFIG.MODEL.NAME} (MODEL.PRETRAINED) were trained "
        f"on {theirs}; train on that clip, or set CONFIG.MODEL.ALLOW_OTHER_CLIP: True to train on another"
    )


def initial_weights(cfg: Config) -> InitialWeights | None:
    """What MODEL.PRETRAINED / LOAD ask the run to start from (checked to exist and, for zoo files, verified; the
    clip of the published weights or of a transformers model's Hugging Face checkpoint checked against the config's);
    None for a random initialisation."""
    model = cfg.CONFIG.MODEL
    if model.PRETRAINED:
        entry = zoo.entry_for(model.NAME)
        check_clip(cfg, entry)
        return InitialWeights(pretrained_file(cfg), f"the {entry.source} Kinetics-400 weights", entry.mean, entry.std)
    if model.LOAD and hf_family(model.NAME) is not None and hf_checkpoint.is_hf_checkpoint(model.PRETRAINED_PATH):
        checkpoint = hf_checkpoint.read_checkpoint(model.PRETRAINED_PATH, model.NAME)
        hf_checkpoint.check_clip(cfg, checkpoint)
        return InitialWeights(checkpoint.folder, "the Hugging Face checkpoint CONFIG.MODEL.PRETRAINED_PATH",
                              checkpoint.mean, checkpoint.std, checkpoint)
    if model.LOAD:
        source = read_weights(model.PRETRAINED_PATH)
        mean, std = _normalisation(cfg, source)
        return InitialWeights(source.path, "CONFIG.MODEL.PRETRAINED_PATH", mean, std)
    return None


def resolve_normalisation(cfg: Config, init: InitialWeights | None) -> None:
    """Fill DATA.MEAN / DATA.STD left empty with what the initial weights expect (ImageNet's without weights)."""
    data = cfg.CONFIG.DATA
    mean, std = (init.mean, init.std) if init is not None else zoo.IMAGENET
    if not data.MEAN:
        data.MEAN = [float(v) for v in mean]
    if not data.STD:
        data.STD = [float(v) for v in std]


def load_initial(model: nn.Module, cfg: Config, init: InitialWeights) -> LoadReport:
    """Load ``init`` into ``model``: all of it, or an error unless MODEL.PARTIAL_LOAD."""
    name, partial = cfg.CONFIG.MODEL.NAME, cfg.CONFIG.MODEL.PARTIAL_LOAD
    if init.checkpoint is not None:
        return hf_checkpoint.load_checkpoint(model, init.checkpoint, allow_partial=partial, model_name=name)
    return load_weights(model, init.path, allow_partial=partial, model_name=name)


def initialise(model: nn.Module, cfg: Config, init: InitialWeights) -> LoadReport:
    """Load ``init`` into ``model`` (:func:`load_initial`) and log what happened in one line."""
    report = load_initial(model, cfg, init)
    log.log(logging.INFO if report.complete else logging.WARNING, "initialised from %s: %s", init.origin,
            report.summary())
    return report
