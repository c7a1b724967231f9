"""Where a run resumes from, and how it picks up exactly where it stopped.

Choosing (CONFIG.TRAIN.RESUME ``auto``): the first process of every node lists its run's checkpoints (named so that
they sort by global step: trainer.checkpoint). The job resumes from the newest checkpoint that counts:

* one held by two nodes (checkpoint.writes_checkpoints: rank 0 and node 1 each keep a copy; on shared storage every
  node sees the same files), or
* the one this run last resumed from (its name is kept beside the checkpoints, in ``last_resume.json``), or
* when a single node holds checkpoints (a one-node job, or the node with the other copies was replaced by an empty
  spare), that node's newest.

A newer checkpoint held by one node only, while another node holds checkpoints too, does not count: its twin was
never written (a node failed while writing). When checkpoints exist and none counts, the run stops with an error that
says what each node holds (a restart could not decide better). A path in RESUME names the file itself.

Every process of a node that holds the chosen checkpoint reads it itself; the first holder, which need not be rank 0
(the rank-0 node may be a spare that holds nothing), sends it to the processes of nodes without a copy, and sends its
metrics.jsonl records up to the checkpoint to everyone; every metrics writer (checkpoint writers) rewrites its
metrics.jsonl with them, so no epoch record is duplicated or missing after a resume, wherever it runs. Records
without an "epoch" (attempts: reporting.attempt_record) are history and stay.

Exactness: a mid-epoch checkpoint carries an EpochProgress (the batches trained in the epoch, the epoch's starting LR,
every rank's RNG states and partial sums). The resumed epoch's pass starts at the next batch (the keys of the ones
before are skipped, nothing is decoded: data.loader.skip_batches), each rank gets its own RNG states and sums back,
the optimizer, LR schedule and AMP scaler continue from their saved states, and augmentation is keyed by (SEED,
epoch, index) (data.dataset). So the final weights and the metrics.jsonl records are those of an uninterrupted run
(tests/trainer/test_resume.py).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.checkpoint import checkpoint_order, list_checkpoints, read_checkpoint, read_trainer_state
from trainer.distributed import DistContext, all_gather_object, broadcast_object
from trainer.engine import EpochTally
from trainer.errors import CheckpointError, UserError, first_line
from trainer.reporting import read_records, write_json_atomic, write_records

log = logging.getLogger("trainer")

LAST_RESUME_FILE = "last_resume.json"


# ---------------------------------------------------------------------------------------------------------------------
# Random number generators


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states (torch CPU, the device's CUDA generator, numpy, random) as plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "random": random.getstate(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["gauss"]))
    random.setstate(state["random"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


# ---------------------------------------------------------------------------------------------------------------------
# Where an epoch stands


@dataclass
class EpochProgress:
    """What a mid-epoch checkpoint adds to an epoch one: where the epoch stands on every rank."""

    epoch: int  # the epoch in progress, 0-based
    batches: int  # micro-batches every rank has trained in it
    lr: float  # the LR it started with (its metrics.jsonl record's "lr")
    ranks: list[dict[str, Any]]  # every rank's {"tally": EpochTally.record(), "rng": rng_state()}, in rank order

    @classmethod
    def capture(cls, ctx: DistContext, epoch: int, lr: float, tally: EpochTally) -> EpochProgress:
        """Every rank's part, gathered (every process calls it, at the same step)."""
        ranks = all_gather_object({"tally": tally.record(), "rng": rng_state(ctx.device)})
        return cls(epoch, tally.batches, lr, ranks)

    def record(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches, "lr": self.lr, "ranks": self.ranks}

    @classmethod
    def of(cls, ckpt: dict[str, Any], ctx: DistContext, elastic: bool = False) -> EpochProgress | None:
        """A checkpoint's progress (None at an epoch's end); one written by another number of processes is refused
        (the epoch's shards, and so the rest of it, would differ) unless ``elastic``: the checkpoint records its
        job's recipe, and the rest of the epoch is dealt out again (trainer.elastic)."""
        record = ckpt.get("progress")
        if record is None:
            return None
        progress = cls(**record)
        if len(progress.ranks) != ctx.world_size and not elastic:
            raise CheckpointError(
                f"{ckpt['path']} was saved mid-epoch by {len(progress.ranks)} processes and this job has "
                f"{ctx.world_size}, so the rest of the epoch cannot be what it was; run it with {len(progress.ranks)} "
                "processes, or set CONFIG.TRAIN.RESUME to an epoch checkpoint (epoch_NNNN.pth)"
            )
        return progress

    def merged_tally(self, ctx: DistContext) -> EpochTally:
        """In another world: rank 0 counts what every rank had counted (the epoch's sums are all-reduced at its end,
        so its record is the same); the others start from zero."""
        tally = EpochTally.start(ctx.device)
        if ctx.rank == 0:
            for part in (EpochTally.from_record(rank["tally"], ctx.device) for rank in self.ranks):
                tally.sums += part.sums
                tally.clips += part.clips
                tally.bad.extend(part.bad)
                tally.fallback.extend(part.fallback)
        return tally


# ---------------------------------------------------------------------------------------------------------------------
# Which checkpoint


@dataclass(frozen=True)
class NodeCheckpoints:
    """What one node's first process finds in its checkpoint dir."""

    names: tuple[str, ...]  # checkpoint files, oldest first
    last_resumed: str | None  # the checkpoint this run last resumed from, as recorded there


def node_checkpoints(ckpt_dir: Path) -> NodeCheckpoints:
    record = ckpt_dir / LAST_RESUME_FILE
    last = json.loads(record.read_text())["name"] if record.is_file() else None
    return NodeCheckpoints(tuple(p.name for p in list_checkpoints(ckpt_dir, mid_epoch=True)), last)


def choose_checkpoint(listings: list[NodeCheckpoints | None]) -> tuple[str, int] | None:
    """(name, rank of the first process that holds it) of the newest checkpoint that counts, from every process's
    listing (None for a process that is not its node's first); None when no node holds any checkpoint."""
    holders: dict[str, list[int]] = {}
    for rank, listing in enumerate(listings):
        for name in listing.names if listing is not None else ():
            holders.setdefault(name, []).append(rank)
    if not holders:
        return None
    last_resumed = {listing.last_resumed for listing in listings if listing is not None}
    lone_holder = len({rank for ranks in holders.values() for rank in ranks}) == 1
    counting = [name for name, ranks in holders.items() if len(ranks) >= 2 or name in last_resumed or lone_holder]
    if not counting:
        held = "; ".join(f"rank {rank}: {', '.join(listing.names)}" for rank, listing in enumerate(listings)
                         if listing is not None and listing.names)
        raise CheckpointError(
            f"CONFIG.TRAIN.RESUME auto: no checkpoint is held by two nodes ({held}); set CONFIG.TRAIN.RESUME to the "
            "path of the one to resume from"
        )
    newest = max(counting, key=lambda name: checkpoint_order(name) or (-1, -1))
    return newest, holders[newest][0]


def _choose_path(listings: list[bool | None], path: str) -> tuple[str, int]:
    """The first process that holds the file a RESUME path names."""
    holders = [rank for rank, has in enumerate(listings) if has]
    if not holders:
        raise CheckpointError(f"CONFIG.TRAIN.RESUME: checkpoint {path} does not exist")
    return path, holders[0]


def _read(path: Path) -> dict[str, Any] | str:
    """The checkpoint (with its "path"), or the one line that says why it cannot be read; of an FSDP2 checkpoint
    folder, its trainer state only (each rank loads its shards when its model is sharded: trainer.train)."""
    try:
        ckpt = read_trainer_state(path) if path.is_dir() else read_checkpoint(path)
    except UserError as exc:  # it names the file already
        return str(exc)
    except (OSError, RuntimeError, ValueError) as exc:
        return f"CONFIG.TRAIN.RESUME {path}: cannot load it ({type(exc).__name__}: {first_line(exc)})"
    ckpt["path"] = str(path)
    return ckpt


def load_resume_state(
    ctx: DistContext, resume: str, ckpt_dir: Path, metrics_path: Path, writer: bool
) -> dict[str, Any] | None:
    """The checkpoint every process resumes from (with its "path" on the node that read it), None for a fresh start.
    Every process calls it, at the same point; ``writer``: this process writes checkpoints and metrics.jsonl.

    Every process of a node that holds the checkpoint reads it itself; the others get it from the first holder, which
    also sends its metrics.jsonl records up to the checkpoint. A process that cannot read it says why, and every
    process raises that, so none waits for the others."""
    if not resume:
        return None
    auto = resume == "auto"
    first = ctx.local_rank == 0
    if auto:
        listing: Any = node_checkpoints(ckpt_dir) if first else None
        listings = all_gather_object(listing)
        choice = choose_checkpoint(listings)
        held = {rank for rank, node in enumerate(listings) if node is not None and choice and choice[0] in node.names}
    else:
        listing = Path(resume).expanduser().exists() if first else None
        listings = all_gather_object(listing)
        choice = _choose_path(listings, resume)
        held = {rank for rank, has in enumerate(listings) if has}
    if choice is None:
        return None
    name, holder = choice
    path = ckpt_dir / name if auto else Path(resume).expanduser()
    node_first = ctx.rank - ctx.local_rank
    got = _read(path) if node_first in held else None
    errors = [error for error in all_gather_object(got if isinstance(got, str) else None) if error]
    if errors:
        raise CheckpointError(errors[0])
    if len(held) * ctx.local_world_size < ctx.world_size:  # a node without a copy: the first holder sends it
        sent = broadcast_object(got if ctx.rank == holder else None, src=holder)
        got = got if got is not None else sent
    assert isinstance(got, dict)
    records = None
    if auto and ctx.rank == holder and metrics_path.is_file():
        records = [r for r in read_records(metrics_path) if r.get("epoch", 0) <= got["epoch"]]
    records = broadcast_object(records, src=holder)
    if writer and auto:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(ckpt_dir / LAST_RESUME_FILE, {"name": name, "step": got["step"]})
        if records is not None:
            write_records(metrics_path, records)
    if holder != 0:
        log.info("rank 0 holds no copy of %s: read by rank %d", Path(got["path"]).name, holder)
    return got
