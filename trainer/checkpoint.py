"""Checkpoints: atomic save on rank 0, keep-last-K plus best, resume on every rank.

Files are ``epoch_0003.pth`` (zero-padded, so names sort by epoch) and ``best.pth`` in the run's checkpoint dir. A
checkpoint is a plain dict: the unwrapped model's state_dict, optimizer, scheduler, scaler, epoch, best accuracy,
RNG states and the resolved config as a YAML string (never a pickled config object).
"""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.distributed import DistContext, broadcast_object

_EPOCH_FILE = re.compile(r"^epoch_(\d+)\.pth$")
BEST_NAME = "best.pth"


def epoch_path(ckpt_dir: Path, epoch: int) -> Path:
    return ckpt_dir / f"epoch_{epoch:04d}.pth"


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


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


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


def load_resume_state(ctx: DistContext, resume: str, ckpt_dir: Path) -> dict[str, Any] | None:
    """Rank 0 reads the checkpoint; the others receive it through a broadcast, so they need no copy of the file."""
    state = None
    if ctx.is_main:
        path = resolve_resume_path(resume, ckpt_dir)
        if path is not None:
            state = torch.load(path, map_location="cpu", weights_only=False)
            state["path"] = str(path)
    return broadcast_object(state)


def load_model_weights(model: torch.nn.Module, path: Path) -> dict[str, Any]:
    """Strictly load a trained checkpoint (ours, or a bare state_dict) for evaluation or prediction."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state.get("model", state))
    return state


def find_eval_checkpoint(ckpt_dir: Path) -> Path:
    """best.pth if validation ran, else the newest epoch checkpoint."""
    best = ckpt_dir / BEST_NAME
    if best.is_file():
        return best
    found = list_checkpoints(ckpt_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: train first or pass --checkpoint")
    return found[-1]
