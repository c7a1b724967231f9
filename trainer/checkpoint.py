"""Checkpoints, in one place: what a checkpoint holds, its files, which processes write them, atomic writes in the
background, keep-last-K plus best, and loading trained weights for evaluation and prediction. Choosing the one to
resume from, and resuming mid-epoch, is trainer.resume's job.

Files, in the run's checkpoint dir, named so that they sort by global optimizer step:

* ``epoch_0003.pth``: after epoch 3 (zero-padded); the newest TRAIN.KEEP_LAST are kept, and ``best.pth``;
* ``epoch_0003_step_00001234.pth``: mid-epoch, in epoch 4 after global optimizer step 1234 (TRAIN.CHECKPOINT_MINUTES,
  or a stop on a signal); the two newest are kept (MID_EPOCH_KEPT).

Under DDP_CONFIG.SHARDING fsdp2 the same names end in ``.dcp`` (and ``best.dcp``): folders, see "FSDP2 checkpoints"
below.

A checkpoint is a plain dict of tensors, numbers and strings, so it loads with ``torch.load(weights_only=True)``:

* ``model``, ``optimizer``, ``scheduler``, ``scaler``: state dicts (the unwrapped model's);
* ``epoch`` (epochs completed), ``step``, ``best_top1``, ``metrics``: where the run is;
* ``config``: rank 0's resolved config as YAML text;
* ``inference``: what predicting needs on any machine with only this file (:func:`inference_info`);
* ``bad_videos``: [[path, reason], ...], the run's bad videos so far (trainer.bad_videos);
* ``progress``, mid-epoch only: where the epoch stands (trainer.resume.EpochProgress: batches done, every rank's RNG
  states and partial sums).

Writing: ``CheckpointWriter.submit`` copies the state into CPU memory (the only time the training loop waits, unless
the previous write is still going) and a background thread writes it through a temp file, fsync and rename, so a
crash never leaves half a file. One write at a time; ``wait`` joins it and raises its error.

Two copies: on a multi-node job, global rank 0 and the first process of node 1 each write into their own node's run
directory (LOG.BASE_PATH as that node's config says), so the newest checkpoint survives the loss of either node.
Where the two see the same directory (shared storage, found as roles/shared_fs finds shared homes: rank 0 leaves a
marker with a random token, the other looks for it), only rank 0 writes.

FSDP2 checkpoints (DDP_CONFIG.SHARDING fsdp2, trainer.sharding): a folder written by torch.distributed.checkpoint
(DCP), every rank writing its shards of ``model`` and ``optimizer`` (their state dicts keyed by parameter name, as
``get_state_dict`` gives them) into one folder, which rank 0 renames into place once all are written; rank 0 adds
TRAINER_STATE_FILE, the rest of the dict above (``scheduler``, ``scaler``, ``epoch`` ... ``progress``) plus
``sharding: fsdp2``. DCP reshards on loading, so such a checkpoint resumes on any number of processes (an epoch's
end; mid-epoch ones need the same number, as ever). Every rank writes, synchronously, into a folder every rank sees:
one node, or LOG.BASE_PATH on shared storage (trainer.sharding.require_one_checkpoint_dir). For evaluation and
prediction :func:`read_checkpoint` (and trainer.weights' ``read_weights``) read such a folder whole, as the plain
dict.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.config import Config
from trainer.data.annotations import read_class_index
from trainer.data.dataset import ClipSpec
from trainer.distributed import DistContext, barrier, broadcast_object
from trainer.runtime import atomic
from trainer.runtime.contract import copy_rank
from trainer.weights import LoadReport, WeightsFile, load_weights
from trainer.weights.formats import TRAINER_STATE_FILE, read_sharded_checkpoint, read_torch_file

log = logging.getLogger("trainer")

_CHECKPOINT_FILE = re.compile(r"^epoch_(\d+)(?:_step_(\d+))?\.(?:pth|dcp)$")
BEST_NAME = "best.pth"
SHARDED_SUFFIX = ".dcp"  # an FSDP2 checkpoint folder
# A mid-epoch checkpoint goes once a newer one is surely on both nodes. A writer knows that of the previous one when it
# writes the next (each waits for its own write before the next): were the job killed while the newest was written, one
# node might hold it and the other not, and the one before is then the newest on both (not an epoch checkpoint).
MID_EPOCH_KEPT = 2


def checkpoint_name(epoch: int, step: int | None = None, suffix: str = ".pth") -> str:
    """The file of the checkpoint after ``epoch`` epochs, or mid-epoch after global optimizer ``step`` (``suffix``
    SHARDED_SUFFIX: the folder of an FSDP2 one)."""
    return f"epoch_{epoch:04d}{suffix}" if step is None else f"epoch_{epoch:04d}_step_{step:08d}{suffix}"


def checkpoint_order(name: str) -> tuple[int, int] | None:
    """Where a checkpoint file name sorts, by global step: (epochs complete, -1 for the epoch's end or the step of
    a mid-epoch one); None for any other file."""
    match = _CHECKPOINT_FILE.match(name)
    if match is None:
        return None
    return int(match.group(1)), -1 if match.group(2) is None else int(match.group(2))


def is_mid_epoch(name: str) -> bool:
    order = checkpoint_order(name)
    return order is not None and order[1] >= 0


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
    inference: dict[str, Any], bad_videos: list[list[str]], progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The checkpoint dict (``state``: the run's trainer.engine.TrainState; ``bad_videos``: the run's record up to
    the last epoch, trainer.bad_videos; ``progress``: a mid-epoch checkpoint's trainer.resume.EpochProgress record).
    It refers to the live tensors: ``cpu_copy`` it before training goes on."""
    ckpt = {
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
        "bad_videos": bad_videos,
    }
    if progress is not None:
        ckpt["progress"] = progress
    return ckpt


def cpu_copy(obj: Any, buffers: dict[str, torch.Tensor] | None = None) -> Any:
    """``obj`` with every tensor copied into CPU memory (containers rebuilt, other values shared): a snapshot that
    training can no longer change. ``buffers`` (by place in ``obj``) are reused where a tensor of the same shape and
    type was copied before, and the new ones kept there: copying into memory already mapped is faster, and no
    allocation grows with every checkpoint. A GPU tensor goes into pinned memory, all copies in flight at once."""
    buffers = {} if buffers is None else buffers
    snapshot = _copy_into(obj, buffers, "")
    if torch.cuda.is_available() and any(buffer.is_pinned() for buffer in buffers.values()):
        torch.cuda.synchronize()  # the non-blocking copies from the GPU have landed
    return snapshot


def _copy_into(obj: Any, buffers: dict[str, torch.Tensor], place: str) -> Any:
    if isinstance(obj, torch.Tensor):
        buffer = buffers.get(place)
        if buffer is None or buffer.shape != obj.shape or buffer.dtype != obj.dtype:
            buffer = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=obj.is_cuda)
            buffers[place] = buffer
        return buffer.copy_(obj.detach(), non_blocking=obj.is_cuda)
    if isinstance(obj, dict):
        return {key: _copy_into(value, buffers, f"{place}/{key}") for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_copy_into(value, buffers, f"{place}/{i}") for i, value in enumerate(obj))
    return obj


def _atomic_write(write: Callable[[Path], Any], dest: Path) -> None:
    """``write`` fills a new file beside ``dest`` that replaces it, synced: a crash never leaves half a file, and the
    new one is on disk once this returns."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic.replacing(dest, durable=True) as tmp:
        write(tmp)


def save_checkpoint(
    state: dict[str, Any], ckpt_dir: Path, epoch: int, is_best: bool, keep_last: int, step: int | None = None
) -> Path:
    """Write ``state`` as the checkpoint after ``epoch`` epochs (mid-epoch after global ``step`` when given), and as
    best.pth when ``is_best``; then prune: all but the newest ``keep_last`` epoch checkpoints and the newest
    MID_EPOCH_KEPT mid-epoch ones."""
    path = ckpt_dir / checkpoint_name(epoch, step)
    # torch.save writes a file it opens itself without holding the GIL for long; through a Python file object it
    # would, and a background write would then slow every training step (bench/checkpoint.py).
    _atomic_write(lambda tmp: torch.save(state, tmp), path)
    if is_best:
        _atomic_write(lambda tmp: shutil.copyfile(path, tmp), ckpt_dir / BEST_NAME)
    prune(ckpt_dir, keep_last)
    return path


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Remove all but the newest ``keep_last`` epoch checkpoints and the newest MID_EPOCH_KEPT mid-epoch ones."""
    stale = list_checkpoints(ckpt_dir)[:-keep_last] if keep_last > 0 else []
    stale += [old for old in list_checkpoints(ckpt_dir, mid_epoch=True) if is_mid_epoch(old.name)][:-MID_EPOCH_KEPT]
    for old in stale:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def list_checkpoints(ckpt_dir: Path, mid_epoch: bool = False) -> list[Path]:
    """Epoch checkpoints (and mid-epoch ones too with ``mid_epoch``), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [(order, p) for p in ckpt_dir.iterdir() if (order := checkpoint_order(p.name)) is not None]
    return [p for order, p in sorted(found) if mid_epoch or order[1] < 0]


class CheckpointWriter:
    """Writes one process's checkpoints into ``ckpt_dir`` in a background thread, one at a time."""

    def __init__(self, ckpt_dir: Path, keep_last: int) -> None:
        self.ckpt_dir = ckpt_dir
        self.keep_last = keep_last
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # the snapshots' memory, reused once their write is done
        self.last_write_s = 0.0  # how long the last write took, from the snapshot to the file on disk

    def submit(self, state: dict[str, Any], epoch: int, is_best: bool = False, step: int | None = None) -> Path:
        """Snapshot ``state`` into CPU memory and start writing it (after the previous write has finished): the
        checkpoint after ``epoch`` epochs, or mid-epoch after global ``step``. Returns the path it will have."""
        self.wait()
        snapshot = cpu_copy(state, self._buffers)
        path = self.ckpt_dir / checkpoint_name(epoch, step)
        # Not a daemon: a process that ends while a checkpoint is being written finishes writing it first.
        self._thread = threading.Thread(target=self._write, args=(snapshot, epoch, is_best, step),
                                        name="vidcluster-checkpoint")
        self._thread.start()
        return path

    def _write(self, snapshot: dict[str, Any], epoch: int, is_best: bool, step: int | None) -> None:
        start = time.perf_counter()
        try:
            path = save_checkpoint(snapshot, self.ckpt_dir, epoch, is_best, self.keep_last, step)
        except BaseException as exc:  # raised again in the training loop, by wait()
            self._error = exc
            return
        self.last_write_s = time.perf_counter() - start
        log.info("saved %s%s in %.2f s", path, " (best)" if is_best else "", self.last_write_s)

    def busy(self) -> bool:
        """Whether a write is still going."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the write in flight, if any, is on disk; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def writer_ranks(ctx: DistContext) -> tuple[int, ...]:
    """Global ranks that may write checkpoints: rank 0 and, on a multi-node job, the first process of the node that
    keeps the second copy (trainer.runtime.contract.COPY_NODE_RANK)."""
    return (0, copy_rank(ctx.local_world_size)) if ctx.num_nodes > 1 else (0,)


def writes_checkpoints(ctx: DistContext, run_dir: Path) -> bool:
    """Whether this process writes checkpoints (and metrics.jsonl) into ``run_dir``. Every process calls it, at the
    same point: on a multi-node job it finds out whether node 1 shares rank 0's run directory."""
    ranks = writer_ranks(ctx)
    if len(ranks) == 1:
        return ctx.rank == 0
    marker = None
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        marker = run_dir / f".vidcluster-marker-{secrets.token_hex(16)}"
        marker.write_text(marker.name)
    name = broadcast_object(marker.name if marker is not None else None)
    shared = False
    if ctx.rank == ranks[1]:
        seen = run_dir / name
        shared = seen.is_file() and seen.read_text() == name
    shared = broadcast_object(shared, src=ranks[1])
    if marker is not None:
        marker.unlink()
        if shared:
            log.info("node 1 sees this run directory (shared storage): rank 0 alone writes the checkpoints")
    return ctx.rank == 0 or (ctx.rank == ranks[1] and not shared)


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint dict, read with ``weights_only=True`` (WeightsError naming the file if it is not one); an FSDP2
    checkpoint folder is read whole, its model and optimizer state keyed by parameter name."""
    return read_sharded_checkpoint(path) if path.is_dir() else read_torch_file(path)


# ---------------------------------------------------------------------------------------------------------------------
# FSDP2 checkpoints


def save_sharded_checkpoint(
    ctx: DistContext, model: nn.Module, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any], ckpt_dir: Path,
    epoch: int, is_best: bool, keep_last: int, step: int | None = None,
) -> Path:
    """Every rank: write the checkpoint dict ``ckpt`` (build_checkpoint's; its model and optimizer are taken from
    ``model`` and ``optimizer`` by parameter name) as the FSDP2 checkpoint folder after ``epoch`` epochs (mid-epoch
    after ``step``), best.dcp too when ``is_best``, then prune as save_checkpoint does. Returns once the folder is in
    place, on every rank."""
    path = ckpt_dir / checkpoint_name(epoch, step, SHARDED_SUFFIX)
    model_state, optimizer_state = get_state_dict(model, optimizer)
    trainer_state = {key: value for key, value in ckpt.items() if key not in ("model", "optimizer")}
    if ctx.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        with atomic.replacing_folder(path, durable=True) as tmp:
            _save_shards(tmp, model_state, optimizer_state)
            _atomic_write(lambda file: torch.save({**trainer_state, "sharding": "fsdp2"}, file),
                          tmp / TRAINER_STATE_FILE)
        if is_best:
            with atomic.replacing_folder(ckpt_dir / f"best{SHARDED_SUFFIX}", durable=True) as tmp:
                shutil.copytree(path, tmp, dirs_exist_ok=True)
        prune(ckpt_dir, keep_last)
    else:
        _save_shards(None, model_state, optimizer_state)
    barrier(ctx)
    return path


def _save_shards(folder: Path | None, model_state: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
    """Every rank writes its shards into rank 0's ``folder`` (None on the others); DCP syncs each file."""
    name = broadcast_object(str(folder) if folder is not None else None)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=name)


def load_sharded_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every rank: ``model`` and ``optimizer`` (sharded as this run shards them) as the FSDP2 checkpoint ``folder``
    holds them, whatever number of processes wrote it."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """An FSDP2 checkpoint folder's trainer state: all of its dict but the model and the optimizer."""
    return read_torch_file(folder / TRAINER_STATE_FILE)


def load_model_weights(model: nn.Module, weights: Path | WeightsFile, model_name: str = "") -> LoadReport:
    """Load a trained model (a file, or one already read) for evaluation or prediction: every tensor, the classifier
    included, must fit."""
    return load_weights(model, weights, allow_new_head=False, model_name=model_name)


def find_eval_checkpoint(ckpt_dir: Path) -> Path:
    """best.pth (best.dcp) if validation ran, else the newest epoch checkpoint."""
    for best in (ckpt_dir / BEST_NAME, ckpt_dir / f"best{SHARDED_SUFFIX}"):
        if best.exists():
            return best
    found = list_checkpoints(ckpt_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: train first or pass --checkpoint")
    return found[-1]
