"""Where a run goes on from after a restart: what a process that restarts in place keeps across attempts (``Kept``:
its model, its loaders while its rank and world stay, and its ``Memory`` of the last completed optimizer step), whether
the ranks of the next attempt that hold a memory hold the same step, or one step apart (``shared_memory``: then no
checkpoint is read, and a rank that holds none, a process new to the job, or one a step behind, receives it from a
peer), and where an epoch stands when a run goes on mid-epoch (``Continuation``), from memory or from a checkpoint,
in the launch's world or in another (trainer.elastic). trainer.train builds the run from these."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import Config
from trainer.distributed import DistContext, all_gather_object, broadcast_object, send_state
from trainer.elastic import Accumulation, Recipe, continuation_seed, epoch_seed, step_in_epoch
from trainer.engine import EpochTally, TrainState
from trainer.resume import EpochProgress, rng_state, seed_everything, set_rng_state
from trainer.sharding import is_sharded
from trainer.timeline import PROCESS

log = logging.getLogger("trainer")

RECIPE_WORLD_KEY = "recipe_world"  # a checkpoint's: the processes the job was launched with (trainer.elastic)
MemoryKey = tuple[int, int, int, bool, int]  # Position.key: (attempt, step, epoch, epoch not begun, world)


@dataclass
class Continuation:
    """Where the start epoch stands when a run goes on mid-epoch: its starting LR, this rank's tally, the micro-batches
    of this rank's pass to skip, and its RNG states (None: set from the run's history, trainer.elastic)."""

    lr: float
    tally: EpochTally
    batches: int
    rng: dict[str, Any] | None

    def start(self, ctx: DistContext, cfg: Config, epoch: int, step: int) -> EpochTally:
        seed = cfg.CONFIG.TRAIN.SEED
        if self.rng is not None:
            set_rng_state(self.rng, ctx.device)
        elif self.batches == 0:  # no step of the epoch done: what its start set, not the step before's reseed
            seed_everything(epoch_seed(seed, epoch, ctx.rank))
        else:
            seed_everything(continuation_seed(seed, epoch, step, ctx.rank))
        self.tally.batches = self.batches  # the pass counts its micro-batches from there
        return self.tally


@dataclass
class Position:
    """Where training stands after an optimizer step: the attempt it was taken in (-1 outside a job's runtime), the
    epoch, its starting LR (None: not begun), and this rank's number and world size, tally, RNG states and model
    buffers then (copies: the step in progress adds to the tally, and its forward pass moves BatchNorm's running
    statistics before a lost peer fails it)."""

    attempt: int
    step: int
    epoch: int
    lr: float | None
    rank: int
    world: int
    tally: EpochTally
    rng: dict[str, Any]
    buffers: list[torch.Tensor]

    @classmethod
    def after(cls, ctx: DistContext, step: int, epoch: int, lr: float | None, tally: EpochTally, model: nn.Module
              ) -> Position:
        copy = EpochTally(tally.sums.clone(), tally.clips, tally.batches, list(tally.bad), list(tally.fallback))
        buffers = [buffer.detach().clone() for buffer in model.buffers()]
        attempt = PROCESS.attempt if PROCESS.attempt is not None else -1
        return cls(attempt, step, epoch, lr, ctx.rank, ctx.world_size, copy, rng_state(ctx.device), buffers)

    def key(self) -> MemoryKey:
        """What the ranks' memories are compared by, its attempt first (``shared_memory``)."""
        return self.attempt, self.step, self.epoch, self.lr is None, self.world

    def portable(self) -> Position:
        """A copy to send to a peer: its tensors on the CPU, without the buffers (they go with the weights:
        ``recall_buffers``)."""
        return dataclasses.replace(self, tally=EpochTally.from_record(self.tally.record(), torch.device("cpu")),
                                   buffers=[])


@dataclass
class Memory:
    """A rank's training state after its last completed optimizer step, kept across a restart in place: the next
    attempt goes on from it when every rank that holds one holds the same step, or one step apart
    (``shared_memory``)."""

    position: Position
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    scaler: dict[str, Any]
    best_top1: float
    bad_videos: list[tuple[str, str]]
    recipe: Recipe

    @classmethod
    def of(cls, position: Position | None, state: TrainState, model: nn.Module, best_top1: float,
           bad_videos: list[tuple[str, str]], recipe: Recipe) -> Memory | None:
        """None when ``position`` is not that of the last step (a step was completing), or ``model`` is sharded."""
        if position is None or position.step != state.step or is_sharded(model):
            return None
        return cls(position, state.optimizer.state_dict(), state.scheduler.state_dict(), state.scaler.state_dict(),
                   best_top1, bad_videos, recipe)

    def portable(self) -> Memory:
        """A copy to pickle to a peer: its small tensors on the CPU, without the optimizer's state (sent tensor by
        tensor: ``shared_memory``)."""
        return dataclasses.replace(self, position=self.position.portable(), optimizer={})


@dataclass(frozen=True)
class SharedMemory:
    """The memory an attempt goes on from, on each rank: its own, or, on a rank that holds none (a spare, a node back
    in the world, a process new to the job: ``joiners``), the donor's, received."""

    memory: Memory
    donor: int  # the lowest rank that holds it
    joiners: tuple[int, ...]  # the ranks that received it (the same on every rank)


@dataclass
class Kept:
    """What a process that restarts in place keeps from one attempt to the next (trainer.inplace): its model (not
    its weights, unless every rank of the next attempt holds the same step in memory, or one apart: then it goes on
    from its ``memory``) and, while its rank and the world size stay, its data loaders and their workers."""

    rank: int
    world_size: int
    model: nn.Module  # unwrapped, on the device
    loaders: tuple[object, object, object]  # train, val, precise BN
    memory: Memory | None  # its training state, when it is that of its last completed step

    def loaders_for(self, ctx: DistContext) -> tuple[object, object, object] | None:
        return self.loaders if (self.rank, self.world_size) == (ctx.rank, ctx.world_size) else None


def shared_memory(ctx: DistContext, kept: Kept | None) -> SharedMemory | None:
    """Every rank: the memory the attempt goes on from, when the ranks that hold one from the latest attempt any of
    them trained in (those that restarted in place) hold the same step (and epoch, and world): a rank that holds none
    receives the lowest such rank's, so a node that joins the world (a spare, a node back) starts from its peers' step,
    not from a checkpoint. A memory from an earlier attempt is stale (its rank was out of the world while the others
    trained on: a node back whose trainer parked) and its rank receives too, as does one a step behind
    (``newest_step``). Else None on every rank (none holds one, or they differ otherwise): the checkpoint every rank
    agrees on is loaded (trainer.resume)."""
    memory = kept.memory if kept is not None else None
    keys = all_gather_object(memory.position.key() if memory is not None else None)
    latest = max((key[0] for key in keys if key is not None), default=None)
    newest = newest_step([key for key in keys if key is not None and key[0] == latest])
    if newest is None:
        return None
    keys = [key if key == newest else None for key in keys]
    if keys[ctx.rank] is None:
        memory = None  # none, stale, or a step behind
    donor = keys.index(newest)
    joiners = tuple(rank for rank, key in enumerate(keys) if key is None)
    if memory is None:  # a joiner
        small, optimizer = send_state(None, donor, joiners, ctx.device)
        memory = dataclasses.replace(small, optimizer=optimizer)
    elif ctx.rank == donor and joiners:  # its optimizer's state tensor by tensor on the device, the rest pickled
        send_state((memory.portable(), memory.optimizer), donor, joiners, ctx.device)
    return SharedMemory(memory, donor, joiners)


def newest_step(keys: list[MemoryKey]) -> MemoryKey | None:
    """Of the memories of one attempt (``Position.key``), the one to go on from: the newest, when the others are the
    same or one optimizer step behind it in the same epoch and world; else None. A peer lost in the middle of a step's
    gradient all-reduce can leave the survivors a step apart: the one whose all-reduce completed (the lost peer had
    sent it all it needed) took the step every rank would have taken, the one whose all-reduce failed did not."""
    if not keys:
        return None
    newest = max(keys, key=lambda key: key[1])
    rest = newest[:1] + newest[2:]
    return newest if all(key[:1] + key[2:] == rest and newest[1] - key[1] <= 1 for key in keys) else None


def recall_buffers(model: nn.Module, ctx: DistContext, shared: SharedMemory) -> None:
    """Every rank, before DDP wraps the model: its buffers as they were after the step it goes on from (a rank that
    holds the memory: a step in progress moved them); when ranks joined, the donor's weights and buffers on every rank
    (a joiner's model is a fresh one, or holds another step's; DDP's own broadcast at wrapping is rank 0's, which may
    be a joiner)."""
    if ctx.rank not in shared.joiners:
        for buffer, value in zip(model.buffers(), shared.memory.position.buffers, strict=True):
            buffer.copy_(value)
    if shared.joiners:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=shared.donor)


def restore_buffers(model: nn.Module, ctx: DistContext, position: Position) -> None:
    """Every rank, going on from its own memory (no rank joined), once DDP gave every rank rank 0's: the buffers
    (BatchNorm statistics, each rank's own during an epoch) of the rank of its number in the attempt before (ranks
    may have been handed out anew), so the run goes on as uninterrupted; in another world, those of the lowest rank
    left (the nearest to rank 0's, which the epoch's end gives every rank)."""
    own = position.buffers
    holders = all_gather_object(position.rank)
    same_world = position.world == ctx.world_size  # the same on every rank: shared_memory
    wanted = range(ctx.world_size) if same_world else [min(holders)]
    for old in wanted:
        src = holders.index(old)
        sent = broadcast_object([buffer.cpu() for buffer in own] if ctx.rank == src else None, src=src)
        if ctx.rank == old or not same_world:
            for buffer, value in zip(model.buffers(), sent, strict=True):
                buffer.copy_(value)


def run_recipe(cfg: Config, ctx: DistContext, memory: Memory | None, resume: dict[str, Any] | None) -> Recipe:
    """The job's recipe: its world is the launch's, as the memory the attempt goes on from keeps it, or as the
    checkpoint records it (``recipe_world``; one written before it was recorded: the world it is resumed on), or this
    attempt's own."""
    train = cfg.CONFIG.TRAIN
    world = ctx.world_size
    if memory is not None:
        world = memory.recipe.world
    elif resume is not None:
        world = resume.get(RECIPE_WORLD_KEY, ctx.world_size)
    return Recipe(world, train.BATCH_SIZE, train.ACCUM_STEPS)


def go_on_from_memory(ctx: DistContext, state: TrainState, shared: SharedMemory, epoch_steps: list[int],
                      accumulation: Accumulation) -> tuple[int, float, Continuation | None]:
    """The training state as it was after the last completed step (its partial gradients are gone with the attempt's
    DDP wrapper: the epoch loop zeroes them): (start epoch, best top-1, where the epoch stands)."""
    memory = shared.memory
    position = memory.position
    state.optimizer.load_state_dict(memory.optimizer)
    state.scheduler.load_state_dict(memory.scheduler)
    state.scaler.load_state_dict(memory.scaler)
    state.step = position.step
    if position.lr is None:  # the epoch had not begun
        return position.epoch, memory.best_top1, None
    own = ctx.rank not in shared.joiners  # a joiner's position is the donor's: its tally counted there
    parts = all_gather_object((position.rank, {"tally": position.tally.record(), "rng": position.rng}) if own else None)
    ranks = [part for _, part in sorted((part for part in parts if part is not None), key=lambda part: part[0])]
    if position.world != ctx.world_size or shared.joiners:  # another world, or a rank's state gone: none is another's
        ranks = [{"tally": part["tally"]} for part in ranks]
    progress = EpochProgress(position.epoch, position.tally.batches, position.lr, ranks)
    return position.epoch, memory.best_top1, continuation(progress, ctx, position.step, epoch_steps, accumulation)


def checkpoint_continuation(resume: dict[str, Any], ctx: DistContext, recipe: Recipe, epoch_steps: list[int],
                            accumulation: Accumulation) -> Continuation | None:
    """Where a mid-epoch checkpoint's epoch stands on this rank (None at an epoch's end). Written by as many processes
    as this attempt has: each rank's own tally and RNG states; else (an elastic job, trainer.elastic) rank 0 takes
    every rank's sums, and the pass starts after the steps done, in this world's micro-batches."""
    progress = EpochProgress.of(resume, ctx, elastic=RECIPE_WORLD_KEY in resume)
    return None if progress is None else continuation(progress, ctx, resume["step"], epoch_steps, accumulation)


def continuation(progress: EpochProgress, ctx: DistContext, step: int, epoch_steps: list[int],
                 accumulation: Accumulation) -> Continuation:
    """This rank's part of where the epoch stood at ``step`` on every rank (a checkpoint's, or the ranks' memory):
    the rank of the same number's tally and RNG states when the world is the same (the run goes on as uninterrupted);
    in another world rank 0 takes every rank's sums, the RNG states are set from the run's history, and the pass
    starts after the steps done, in this world's micro-batches (trainer.elastic)."""
    if len(progress.ranks) == ctx.world_size and "rng" in progress.ranks[ctx.rank]:
        mine = progress.ranks[ctx.rank]
        return Continuation(progress.lr, EpochTally.from_record(mine["tally"], ctx.device), progress.batches,
                            mine["rng"])
    done = step_in_epoch(step, epoch_steps, progress.epoch)
    return Continuation(progress.lr, progress.merged_tally(ctx), done * accumulation.micro_batches, None)


def log_accumulation(ctx: DistContext, recipe: Recipe, kept: Kept | None, memory: Memory | None) -> None:
    """Say so when this attempt's world is not the attempt before's (or, at a resume, the launch's): the accumulation
    before and after, the global batch kept."""
    before = memory.position.world if memory is not None else kept.world_size if kept is not None else recipe.world
    if before == ctx.world_size:
        return
    log.warning("world of %d process(es) (launched on %d, the attempt before had %d): accumulation %d -> %d "
                "micro-batch(es) of at most %d clip(s) per rank and step; global batch %d kept", ctx.world_size,
                recipe.world, before, recipe.accumulation(before).micro_batches,
                recipe.accumulation(ctx.world_size).micro_batches, recipe.batch, recipe.global_batch)
