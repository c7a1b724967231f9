"""Initial weights from a Hugging Face checkpoint: ``CONFIG.MODEL.LOAD: True`` with ``PRETRAINED_PATH`` a folder saved
by ``save_pretrained`` (``config.json``, ``model.safetensors`` or its shards, and the processor's
``preprocessor_config.json`` or ``video_preprocessor_config.json``) or a hub id (``MCG-NJU/videomae-base``) already
in the site's Hugging Face cache (``$HF_HOME``): read offline, never fetched at run time. A launch resolves a hub id
on the controller (:func:`fetch_hub`, ``python -m trainer fetch-weights OWNER/NAME``), refuses a checkpoint of
another family or size than MODEL.NAME (:func:`check_hub_model`), and gives every node a copy of the snapshot, which
the node's config names (:mod:`trainer.node_config`, roles/ddp_launch/tasks/weights.yml).

The library reads the tensors (its ``from_pretrained``, which also renames a checkpoint's older tensor names to its
current ones); what it reports missing, mismatched or unexpected is then judged by the zoo's strict rules
(:mod:`trainer.weights.loading`): only a classifier of another size is re-initialised. The checkpoint's clip
(frames, image size: its config.json; mean and std: its processor) is the one the run must train on, refused by name
otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from trainer.config import ConfigError
from trainer.hf_models import FAMILIES, HF_MODELS, HUB_ID, HfFamily, hf_family
from trainer.weights.formats import WeightsError
from trainer.weights.loading import LoadReport, check_complete, classifier_names

if TYPE_CHECKING:
    from trainer.config import Config

FORMAT = "huggingface"
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")


@dataclass(frozen=True)
class HfCheckpoint:
    folder: Path
    config: dict[str, Any]  # its config.json
    frames: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def is_hf_checkpoint(path: str) -> bool:
    """A folder, or a hub id (owner/name) that is not a local file."""
    return Path(path).is_dir() or (not Path(path).exists() and HUB_ID.fullmatch(path) is not None)


def checkpoint_folder(path: str) -> Path:
    """The folder itself, or the hub id's snapshot in the Hugging Face cache, looked up offline."""
    if Path(path).is_dir():
        return Path(path)
    # a node never downloads: local_files_only makes no request; HF_HUB_OFFLINE keeps the library offline too (where
    # it is imported after this point)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(path, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        cache = os.environ.get("HF_HOME", "~/.cache/huggingface")
        raise WeightsError(
            f"CONFIG.MODEL.PRETRAINED_PATH: {path} is not a folder, and the Hugging Face cache ($HF_HOME {cache}) has "
            f"no copy of the hub's {path}; download it once where the hub is reachable ('hf download {path}') or "
            "name a local checkpoint folder (training never downloads)"
        ) from None


def fetch_hub(hub: str) -> Path:
    """On the controller: the snapshot of hub id ``hub`` in the site's Hugging Face cache, downloaded into it first
    if it is not there. huggingface_hub decides where and whence: $HF_HOME or $HF_HUB_CACHE, $HF_ENDPOINT (a mirror),
    $HF_HUB_OFFLINE (the cache only). Only what loading reads: the configs and the tensors (safetensors, else the
    older pytorch_model*.bin)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # the launch shows this command's stderr as its reason when it fails: one line
    try:
        folder = Path(snapshot_download(hub, allow_patterns=["*.json", "*.safetensors"]))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(hub, allow_patterns=["*.json", "pytorch_model*.bin"]))
    except LocalEntryNotFoundError:  # offline, or the hub unreachable, and not in the cache
        from huggingface_hub import constants

        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} cannot be reached"
        raise WeightsError(f"{hub}: not in the Hugging Face cache {constants.HF_HUB_CACHE}, and {why}; download it "
                           f"once where the hub is reachable ('hf download {hub}')") from None
    except (HFValidationError, OSError) as exc:  # the hub's refusals (no such repository, gated) are OSErrors too
        first = (str(exc).splitlines() or [""])[0]
        raise WeightsError(f"{hub}: cannot be had from the Hugging Face hub: {type(exc).__name__}: {first}") from None
    if not (folder / "config.json").is_file():
        raise WeightsError(f"{hub}: no config.json in its snapshot {folder}: not a transformers checkpoint")
    return folder


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{path}: not a readable JSON file ({type(exc).__name__}: {exc})") from None


def _square(value: Any, folder: Path, key: str) -> int:
    sizes = set(value if isinstance(value, list) else [value])
    if len(sizes) != 1:
        raise WeightsError(f"{folder}/config.json: {key} {value} is not square; only square clips train here")
    return int(sizes.pop())


def _normalisation(folder: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    for name in PROCESSOR_FILES:
        if (folder / name).is_file():
            processor = _json(folder / name)
            return tuple(processor["image_mean"]), tuple(processor["image_std"])
    raise WeightsError(f"{folder}: no {' or '.join(PROCESSOR_FILES)}: the mean and std its clips were normalised "
                       "with are unknown; save the model's processor with it")


def read_checkpoint(path: str, model_name: str) -> HfCheckpoint:
    """The checkpoint at ``path`` (folder or hub id) for the transformers model ``model_name``; WeightsError naming
    what is missing or of another model family."""
    family = _family(model_name)
    folder = checkpoint_folder(path)
    config = _json(folder / "config.json")
    _check_family(config, f"{folder}/config.json", family, model_name)
    mean, std = _normalisation(folder)
    return HfCheckpoint(folder, config, int(config[family.frames_key]),
                        _square(config[family.size_key], folder, family.size_key), mean, std)


def _family(model_name: str) -> HfFamily:
    family = hf_family(model_name)
    if family is None:
        raise WeightsError(f"CONFIG.MODEL.PRETRAINED_PATH: a Hugging Face checkpoint, but MODEL.NAME {model_name} is "
                           "not a transformers model; name a weights file")
    return family


def _check_family(config: dict[str, Any], where: str, family: HfFamily, model_name: str) -> None:
    if config.get("model_type") != family.model_type:
        raise WeightsError(f"{where}: model_type {config.get('model_type')!r}, but MODEL.NAME {model_name} is a "
                           f"{family.model_type} model")


def _size(config: dict[str, Any], family: HfFamily) -> str:
    return ", ".join(f"{key} {config.get(key)!r}" for key in family.size_keys)


def _same_size(theirs: dict[str, Any], ours: dict[str, Any], family: HfFamily) -> bool:
    return all(key not in theirs or _same([float(ours.get(key, "nan"))], (float(theirs[key]),))
               for key in family.size_keys)


def _library_config(name: str) -> dict[str, Any]:
    """The config ``build_hf_model`` gives MODEL.NAME ``name`` (the library's default, then the size's values)."""
    import transformers

    spec = HF_MODELS[name]
    return {**getattr(transformers, _family(name).config_class)().to_dict(), **spec.config}


def _check_size(config: dict[str, Any], where: str, ours: dict[str, Any], model_name: str) -> None:
    """WeightsError naming both when the checkpoint is of another size than MODEL.NAME (what its config says, and
    the size's name when it is one of ours)."""
    family = _family(model_name)
    if _same_size(config, ours, family):
        return
    names = [name for name, spec in HF_MODELS.items()
             if FAMILIES[spec.family] is family and _same_size(config, _library_config(name), family)]
    theirs = f"a {' / '.join(names)} checkpoint" if names else f"a {family.model_type} checkpoint of no size here"
    advice = f"set MODEL.NAME to {names[0]}" if names else "name a checkpoint of this size"
    raise WeightsError(f"{where}: {theirs} ({_size(config, family)}), but MODEL.NAME {model_name} is "
                       f"{_size(ours, family)}; {advice}")


def check_hub_model(folder: Path, hub: str, model_name: str) -> None:
    """On the controller, before a node gets the snapshot ``folder`` of ``hub``: WeightsError naming both when its
    config.json is of another family or size than MODEL.NAME ``model_name``."""
    config = _json(folder / "config.json")
    _check_family(config, hub, _family(model_name), model_name)
    _check_size(config, hub, _library_config(model_name), model_name)


def check_architecture(model: nn.Module, checkpoint: HfCheckpoint, model_name: str) -> None:
    """WeightsError naming the checkpoint's size and the model's when they differ, or each config.json value that
    computes otherwise than ``model`` with the same tensors (but the head's, in a self-supervised checkpoint)."""
    family = _family(model_name)
    ours = model.config.to_dict()
    _check_size(checkpoint.config, f"{checkpoint.folder}/config.json", ours, model_name)
    pretrained = family.pretraining_class in checkpoint.config.get("architectures", [])
    keys = [key for key in family.arch_keys if not (pretrained and key in family.head_keys)]
    differ = [f"{key} {checkpoint.config[key]!r} (the model's {ours.get(key)!r})" for key in keys
              if key in checkpoint.config and checkpoint.config[key] != ours.get(key)]
    if differ:
        raise WeightsError(f"{checkpoint.folder}/config.json does not describe model {model_name}: "
                           f"{', '.join(differ)}")


def _same(ours: list[float], theirs: tuple[float, ...]) -> bool:
    return len(ours) == len(theirs) and all(abs(a - b) <= 1e-6 for a, b in zip(ours, theirs, strict=True))


def check_clip(cfg: Config, checkpoint: HfCheckpoint) -> None:
    """ConfigError naming every DATA key whose value differs from the clip the checkpoint expects."""
    data = cfg.CONFIG.DATA
    expected = {"CLIP_LEN": checkpoint.frames, "CROP_SIZE": checkpoint.size}
    wrong = [f"{key} {getattr(data, key)}" for key, value in expected.items() if getattr(data, key) != value]
    for key, value in (("MEAN", checkpoint.mean), ("STD", checkpoint.std)):
        if getattr(data, key) and not _same(getattr(data, key), value):
            wrong.append(f"{key} {getattr(data, key)}")
            expected[key] = list(value)
    if wrong:
        theirs = ", ".join(f"{key}: {value}" for key, value in expected.items())
        raise ConfigError(f"CONFIG.DATA.{', '.join(wrong)}: the checkpoint {checkpoint.folder} "
                          f"(MODEL.PRETRAINED_PATH) expects {theirs} (its config.json and processor); train on that "
                          "clip")


@contextlib.contextmanager
def _quiet_library() -> Iterator[None]:
    """The library's own load table and progress bars off: the run logs one line of its own (the report)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()


def load_checkpoint(model: nn.Module, checkpoint: HfCheckpoint, *, allow_partial: bool, model_name: str) -> LoadReport:
    """Copy the checkpoint's tensors into ``model`` (built by :mod:`trainer.models.hf_video`): all of them, or a
    WeightsError naming each tensor missing, of another shape or with no place, unless ``allow_partial``; a
    classifier of another size keeps its fresh initialisation and the report says so."""
    check_architecture(model, checkpoint, model_name)
    with _quiet_library():
        read, info = type(model).from_pretrained(checkpoint.folder, config=model.config, output_loading_info=True,
                                                 ignore_mismatched_sizes=True, local_files_only=True)
    heads = classifier_names(model)
    report = LoadReport(checkpoint.folder, FORMAT, unexpected=sorted(info["unexpected_keys"]))
    for name in info["missing_keys"]:
        if name in heads:
            report.head_reinitialised[name] = "not in the file"
        else:
            report.missing.append(name)
    for name, theirs, ours in info["mismatched_keys"]:
        if name in heads:
            report.head_reinitialised[name] = f"{tuple(theirs)} in the file, {tuple(ours)} in the model"
        else:
            report.mismatched[name] = f"(file {tuple(theirs)} vs model {tuple(ours)})"
    check_complete(report, model, allow_partial=allow_partial, model_name=model_name)
    fresh = {*report.missing, *report.mismatched, *report.head_reinitialised}
    tensors = {name: value for name, value in read.state_dict().items() if name not in fresh}
    model.load_state_dict(tensors, strict=False)
    report.loaded = sorted(tensors)
    return report
