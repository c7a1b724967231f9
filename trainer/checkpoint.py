"""Checkpoints, in one place: what a checkpoint holds, atomic save on rank 0, keep-last-K plus best, resume on every
rank, and loading trained weights for evaluation and prediction.

Files are ``epoch_0003.pth`` (zero-padded, so names sort by epoch) and ``best.pth`` in the run's checkpoint dir. A
checkpoint is a plain dict of tensors, numbers and strings, so it loads with ``torch.load(weights_only=True)``:

* ``model``, ``optimizer``, ``scheduler``, ``scaler``: state dicts (the unwrapped model's);
* ``epoch``, ``step``, ``best_top1``, ``metrics``: where the run is;
* ``config``: the resolved config as YAML text;
* ``inference``: what predicting needs on any machine with only this file (:func:`inference_info`).

No RNG state is saved: every epoch re-seeds from (TRAIN.SEED, epoch, rank), so a resumed run replays exactly without it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.config import Config
from trainer.data.annotations import read_class_index
from trainer.data.dataset import ClipSpec
from trainer.distributed import DistContext, broadcast_object
from trainer.weights import LoadReport, WeightsFile, load_weights
from trainer.weights.formats import read_torch_file

_EPOCH_FILE = re.compile(r"^epoch_(\d+)\.pth$")
BEST_NAME = "best.pth"


def epoch_path(ckpt_dir: Path, epoch: int) -> Path:
    return ckpt_dir / f"epoch_{epoch:04d}.pth"


def class_names(cfg: Config) -> list[str]:
    """DATA.CLASS_INDEX's names in label order, or the label numbers when there is no class index."""
    data = cfg.CONFIG.DATA
    return read_class_index(data.CLASS_INDEX) if data.CLASS_INDEX else [str(i) for i in range(data.NUM_CLASSES)]


def inference_info(cfg: Config, names: list[str]) -> dict[str, Any]:
    """Model, classes and clip settings (sampling, resize, crop, mean/std, test views) of a trained model."""
    clip = dataclasses.asdict(ClipSpec.from_config(cfg))
    return {"model": cfg.CONFIG.MODEL.NAME, "num_classes": cfg.CONFIG.DATA.NUM_CLASSES, "class_names": names,
            "clip": {key: list(value) if isinstance(value, tuple) else value for key, value in clip.items()}}


def clip_spec(inference: dict[str, Any]) -> ClipSpec:
    """The ClipSpec a checkpoint's ``inference`` recorded."""
    return ClipSpec(**{key: tuple(value) if isinstance(value, list) else value
                       for key, value in inference["clip"].items()})


def build_checkpoint(
    model: nn.Module, state: Any, *, epoch: int, best_top1: float, config_yaml: str, metrics: dict[str, Any],
    inference: dict[str, Any],
) -> dict[str, Any]:
    """The checkpoint dict of an epoch (``state``: the run's trainer.engine.TrainState)."""
    return {
        "model": model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),
        "epoch": epoch,
        "step": state.step,
        "best_top1": best_top1,
        "config": config_yaml,
        "metrics": metrics,
        "inference": inference,
    }


def _atomic_write(write: Any, dest: Path) -> None:
    """Write through a temp file in the same directory, fsync, then rename: a crash never leaves half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(state: dict[str, Any], ckpt_dir: Path, epoch: int, is_best: bool, keep_last: int) -> Path:
    """Save ``state`` as this epoch's checkpoint (and as best), then prune all but the newest ``keep_last``."""
    path = epoch_path(ckpt_dir, epoch)
    _atomic_write(lambda handle: torch.save(state, handle), path)
    if is_best:
        _atomic_write(lambda handle: handle.write(path.read_bytes()), ckpt_dir / BEST_NAME)
    for old in list_checkpoints(ckpt_dir)[:-keep_last] if keep_last > 0 else []:
        old.unlink()
    return path


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Epoch checkpoints, oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _EPOCH_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


def resolve_resume_path(resume: str, ckpt_dir: Path) -> Path | None:
    """'auto' -> newest checkpoint in the run (None on a fresh run); a path -> that file, which must exist."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(ckpt_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"CONFIG.TRAIN.RESUME: checkpoint {path} does not exist")
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint dict, read with ``weights_only=True`` (WeightsError naming the file if it is not one)."""
    return read_torch_file(path)


def load_resume_state(ctx: DistContext, resume: str, ckpt_dir: Path) -> dict[str, Any] | None:
    """Rank 0 reads the checkpoint; the others receive it through a broadcast, so they need no copy of the file."""
    state = None
    if ctx.is_main:
        path = resolve_resume_path(resume, ckpt_dir)
        if path is not None:
            state = read_checkpoint(path)
            state["path"] = str(path)
    return broadcast_object(state)


def load_model_weights(model: nn.Module, weights: Path | WeightsFile, model_name: str = "") -> LoadReport:
    """Load a trained model (a file, or one already read) for evaluation or prediction: every tensor, the classifier
    included, must fit."""
    return load_weights(model, weights, allow_new_head=False, model_name=model_name)


def find_eval_checkpoint(ckpt_dir: Path) -> Path:
    """best.pth if validation ran, else the newest epoch checkpoint."""
    best = ckpt_dir / BEST_NAME
    if best.is_file():
        return best
    found = list_checkpoints(ckpt_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: train first or pass --checkpoint")
    return found[-1]
