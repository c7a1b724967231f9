"""DataLoaders: a seeded distributed sampler for training, an exact shard for evaluation, a collate that drops
bad videos and reports them.

Training always uses a DistributedSampler (with one replica when not distributed), so the order of an epoch is
a function of (TRAIN.SEED, epoch) alone; call `set_loader_epoch(loader, epoch)` before each epoch. Its batches come
from a ResumableBatches, so a run resumed from a mid-epoch checkpoint starts the epoch's pass at the batch where it
stopped, without decoding the ones before (`skip_batches`). Evaluation gives rank r the items r, r + world,
r + 2 * world, ...: every sample is evaluated exactly once, with no padding duplicates (DistributedSampler pads), at
the cost of shards that may differ in length by one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import math
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import random
import signal
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Sampler, get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
from torch.utils.data.distributed import DistributedSampler

from trainer.config.section import ConfigError
from trainer.data.dataset import Split, VideoClipDataset
from trainer.data.multigrid import MultigridBatchSampler, MultigridSchedule
from trainer.elastic import Recipe, epoch_order, rank_micro_batches
from trainer.runtime.contract import STACKS_SIGNAL

if TYPE_CHECKING:
    from trainer.config import Config
    from trainer.distributed import DistContext


class EpochDistributedSampler(DistributedSampler):
    """DistributedSampler that yields (index, epoch), so the dataset can key its augmentation by epoch inside
    persistent workers, which never see `set_epoch` calls made in the main process."""

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        return ((index, self.epoch) for index in super().__iter__())


class RepeatedAugSampler(EpochDistributedSampler):
    """Repeated augmentation (TRAIN.REPEATED_AUG = k): DeiT's RASampler without its cut of the epoch back to one pass
    over the data, which VideoMAE's k samples per video amount to. Each epoch's shuffled indices are repeated k times
    in a row and dealt to the ranks in turn (so a video's copies go to k ranks when there are as many), padded as
    DistributedSampler pads: every index is drawn k times per epoch (a few k + 1 times, to even out the ranks)."""

    # Copy r > 0 of an index is augmented under epoch key epoch + r * COPY_KEY_STRIDE, beyond any real epoch; copy 0
    # keeps the epoch, so k = 1 draws what EpochDistributedSampler draws.
    COPY_KEY_STRIDE = 2**32

    def __init__(self, dataset: VideoClipDataset, num_replicas: int, rank: int, seed: int, repeats: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.repeats = repeats
        self.num_samples = math.ceil(len(dataset) * repeats / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)  # DistributedSampler's shuffle
        order = torch.randperm(len(self.dataset), generator=generator).tolist()  # type: ignore[arg-type]
        keys = [(index, self.epoch + copy * self.COPY_KEY_STRIDE) for index in order for copy in range(self.repeats)]
        padding = self.total_size - len(keys)
        keys += (keys * math.ceil(padding / len(keys)))[:padding]
        return iter(keys[self.rank : self.total_size : self.num_replicas])


class ElasticBatches(Sampler[list[tuple[int, int]]]):
    """A training epoch's micro-batches of this rank in a world other than the recipe's (trainer.elastic): every
    optimizer step is ``recipe.micro_batches(world)`` of them on every rank (some may be empty), keys as
    EpochDistributedSampler's."""

    def __init__(self, length: int, seed: int, recipe: Recipe, world: int, rank: int, drop_last: bool) -> None:
        self.length, self.seed, self.recipe = length, seed, recipe
        self.world, self.rank, self.drop_last = world, rank, drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        order = epoch_order(self.length, self.seed, self.epoch, self.recipe.world, self.recipe.batch, self.drop_last)
        return rank_micro_batches(order, self.recipe, self.world, self.rank)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return ([(index, self.epoch) for index in batch] for batch in self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class ResumableBatches(Sampler[list[Any]]):
    """A training loader's batches (a BatchSampler, or a MultigridBatchSampler) whose next pass may start part-way
    through the epoch: the keys of the batches before that point are drawn, as the uninterrupted pass draws them, and
    dropped before any worker decodes a clip."""

    def __init__(self, batches: BatchSampler | MultigridBatchSampler | ElasticBatches) -> None:
        self.batches = batches
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        whole = isinstance(self.batches, MultigridBatchSampler | ElasticBatches)
        target = self.batches if whole else self.batches.sampler
        target.set_epoch(epoch)  # type: ignore[union-attr]

    def skip_next(self, count: int) -> None:
        """Start the next pass at batch ``count`` of the epoch (a mid-epoch resume); later passes start at 0."""
        self._skip = count

    def __iter__(self) -> Iterator[list[Any]]:
        # Taken when the pass draws its first batch, not when its iterator is made: a DataLoader with workers makes
        # one iterator it never uses before the one it does.
        skip, self._skip = self._skip, 0
        yield from itertools.islice(self.batches, skip, None)

    def __len__(self) -> int:
        """Batches of the next pass."""
        return max(len(self.batches) - self._skip, 0)


class ShardSampler(Sampler[int]):
    """Indices rank, rank + world_size, ... of a dataset: an exact, non-padding shard."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, length, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def stack_clips(clips: Sequence[torch.Tensor]) -> torch.Tensor:
    """uint8 [C, T, s, s] regions -> [B, C, T, S, S] in channels_last_3d order, S the largest s (a smaller region sits
    top-left, zero-padded): each clip is one copy into the batch. In a DataLoader worker the batch is made in shared
    memory, so sending it to the main process copies nothing more (as torch's default_collate does)."""
    storage_order = [clip.permute(1, 2, 3, 0) for clip in clips]  # [T, s, s, C]
    frames, _, _, channels = storage_order[0].shape
    side = max(clip.shape[1] for clip in storage_order)
    shape = (len(clips), frames, side, side, channels)
    first = storage_order[0]
    if get_worker_info() is not None:
        shared = first.untyped_storage()._new_shared(math.prod(shape) * first.element_size())
        out = first.new_empty(0).set_(shared).view(shape)
    else:
        out = first.new_empty(shape)
    for slot, clip in zip(out, storage_order, strict=True):
        height, width = clip.shape[1:3]
        slot[:, :height, :width].copy_(clip)
        slot[:, height:].zero_()  # the padding is never read, but batches stay comparable
        slot[:, :height, width:].zero_()
    return out.permute(0, 4, 1, 2, 3)


def collate_clips(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack good items; bad ones only add (path, reason) to 'bad'. An all-bad batch has 0-length tensors.
    'crops' holds each clip's transforms.CropPlan (region side, crop size, flip), what ClipNormalizer needs to make
    the crops. 'fallback' lists (path, reason) of the clips DECODER auto read with torchcodec."""
    good = [item for item in items if "bad" not in item]
    batch: dict[str, Any] = {
        "video": stack_clips([item["video"] for item in good]) if good else torch.empty(0),
        "crops": [(item["video"].shape[-1], *item["crop"]) for item in good],
        "label": torch.tensor([item["label"] for item in good], dtype=torch.long),
        "index": torch.tensor([item["index"] for item in good], dtype=torch.long),
        "bad": [item["bad"] for item in items if "bad" in item],
        "fallback": [item["fallback"] for item in good if "fallback" in item],
    }
    if any("video_index" in item for item in items):
        batch["video_index"] = torch.tensor([item["video_index"] for item in good], dtype=torch.long)
    return batch


# The job's stops go to every process of a trainer (trainer.runtime.host.node): they are the training process's to
# act on. Its loader workers, their fork server and multiprocessing's resource tracker would die of them by default.
STOPS = (signal.SIGTERM, signal.SIGUSR1)


def seed_worker(worker_id: int) -> None:
    """Seed numpy, random and torch in a worker from its torch seed (loader generator's base seed + id). A stop
    signal sent to the whole process group is the training process's to act on: the worker ignores it, and ends when
    its process ends it (`end_workers`). STACKS_SIGNAL writes its stacks, as it does its training process's."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # workers run side by side; one thread each avoids oversubscribing the cores


# The loaders this process built, whose persistent workers may still run. The workers ignore SIGTERM (above), which is
# how multiprocessing ends daemonic children at exit before it joins them: left to it, a run that is done would wait
# forever for workers that never got their stop. `end_workers` is that stop.
_built: weakref.WeakSet[DataLoader] = weakref.WeakSet()


def end_workers() -> None:
    """End the worker processes of every loader this process built, and wait for them: told to stop as torch tells
    them, then killed if they have not stopped within torch's grace (5 s: a worker stuck in a decoder), or at once
    when the interpreter is already exiting (torch then no longer tells them). Every command calls it when its run
    ends, fails or is stopped; multiprocessing calls it at exit before it joins this process's children (a command
    that did not)."""
    for loader in list(_built):
        workers = loader._iterator  # persistent workers: the loader keeps its one iterator, and torch has no close()
        if isinstance(workers, _MultiProcessingDataLoaderIter):
            workers._shutdown_workers()
            for process in workers._workers:
                if process.is_alive():
                    process.kill()
                    process.join()
        loader._iterator = None
        _built.discard(loader)


@contextlib.contextmanager
def loader_workers() -> Iterator[None]:
    """A command's run: every loader worker of this process has ended when the block ends, however it ends."""
    try:
        yield
    finally:
        end_workers()


# Before multiprocessing's own exit step (terminate, then join, every daemonic child), in every process: the main one
# (at exit) and multiprocessing's children (spawned trainers), whose exit runs no atexit hook first.
multiprocessing.util.Finalize(None, end_workers, exitpriority=100)


WORKER_SERVER = "trainer.data.worker_server"  # the fork server's preload: the workers' modules, and its life


def worker_context() -> multiprocessing.context.BaseContext:
    """Where loader workers start from: a fork server, a process started afresh (fork, then exec) that forks each
    worker. A worker forked from the training process itself would inherit every lock its other threads (heartbeat,
    gloo, queue feeders, OpenMP) held at that instant, and could hang inside fork() for good: a rank whose first
    validation's worker did so held the job in the metrics' all-reduce until the gloo timeout.

    The server and multiprocessing's resource tracker start with the stops blocked (a signal mask outlives exec), so
    a stop never ends them. The kernel kills the server when the thread that started it ends (trainer.data
    .worker_server): loaders are built in a process's main thread. The tracker ends once the server and the workers
    have."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WORKER_SERVER])
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        multiprocessing.resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # the tracker unblocks SIGTERM on its way out (it ignores it)
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return context


def _rank_and_world(ctx: DistContext | None) -> tuple[int, int]:
    if ctx is None or not ctx.distributed:
        return 0, 1
    return ctx.rank, ctx.world_size


def build_loader(
    dataset: VideoClipDataset, cfg: Config, split: Split, ctx: DistContext | None = None, multigrid: bool = True,
    recipe: Recipe | None = None,
) -> DataLoader:
    """DataLoader of a split for this process; BATCH_SIZE is per process (TRAIN for train, VAL for val/test).
    TRAIN.REPEATED_AUG > 1 draws each training video that many times per epoch (RepeatedAugSampler).
    TRAIN.DROP_LAST drops a training epoch's last incomplete batch on every rank (the shards are equal). A training
    loader batches by the multigrid schedule when CONFIG.TRAIN.MULTIGRID asks for one (and ``multigrid``).

    Workers (DATA.NUM_WORKERS) persist across epochs and each keeps DATA.PREFETCH_FACTOR batches in flight; batches
    are pinned when a GPU trains from CPU-decoded clips, so the copy to it does not block (transforms.ClipNormalizer).
    `ctx` is None or has .distributed, .rank and .world_size (trainer.distributed.DistContext). A training loader in
    a world other than ``recipe``'s (the launch's) deals the epoch out as trainer.elastic says (ElasticBatches).
    """
    rank, world = _rank_and_world(ctx)
    seed = cfg.CONFIG.TRAIN.SEED
    sampler: Sampler[Any]
    if split == "train" and recipe is not None and recipe.world != world:
        batching: dict[str, Any] = {"batch_sampler": ResumableBatches(elastic_batches(dataset, cfg, recipe, world,
                                                                                      rank))}
    elif split == "train":
        repeats = cfg.CONFIG.TRAIN.REPEATED_AUG
        sampler = (RepeatedAugSampler(dataset, world, rank, seed, repeats) if repeats > 1
                   else EpochDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed))
        batch_size, drop_last = cfg.CONFIG.TRAIN.BATCH_SIZE, cfg.CONFIG.TRAIN.DROP_LAST
        schedule = MultigridSchedule.from_config(cfg) if multigrid else None
        batches = (BatchSampler(sampler, batch_size, drop_last) if schedule is None
                   else MultigridBatchSampler(sampler, schedule, drop_last))  # type: ignore[arg-type]
        batching = {"batch_sampler": ResumableBatches(batches)}
    else:
        sampler = ShardSampler(len(dataset), rank, world)
        batching = {"sampler": sampler, "batch_size": cfg.CONFIG.VAL.BATCH_SIZE, "drop_last": False}
    workers = cfg.CONFIG.DATA.NUM_WORKERS
    loader = DataLoader(
        dataset,
        **batching,
        num_workers=workers,
        multiprocessing_context=worker_context() if workers > 0 else None,
        collate_fn=collate_clips,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(seed + rank),
        persistent_workers=workers > 0,
        prefetch_factor=cfg.CONFIG.DATA.PREFETCH_FACTOR if workers > 0 else None,
        pin_memory=torch.cuda.is_available() and dataset.decoder.device == "cpu",  # GPU-decoded clips are there
    )
    _built.add(loader)
    return loader


def elastic_batches(dataset: VideoClipDataset, cfg: Config, recipe: Recipe, world: int, rank: int) -> ElasticBatches:
    """This rank's batches in a world of ``world`` processes where the job was launched with ``recipe.world``; what
    cannot be dealt out again is refused by name (its batches depend on the world)."""
    train = cfg.CONFIG.TRAIN
    refused = [name for name, used in (("CONFIG.TRAIN.REPEATED_AUG", train.REPEATED_AUG > 1),
                                       ("CONFIG.TRAIN.MULTIGRID", MultigridSchedule.from_config(cfg) is not None))
               if used]
    if refused:
        raise ConfigError(f"{refused[0]}: the job was launched on {recipe.world} processes and now has {world}; "
                          "its batches cannot be dealt out over another world (trainer.elastic): turn it off for an "
                          "elastic job, or run it on its launch's world")
    return ElasticBatches(len(dataset), train.SEED, recipe, world, rank, train.DROP_LAST)


def _resumable(loader: Iterable[Any]) -> ResumableBatches:
    batches = getattr(loader, "batch_sampler", None)
    if not isinstance(batches, ResumableBatches):
        raise TypeError("not a training loader (build_loader(..., 'train'))")
    return batches


def set_loader_epoch(loader: Iterable[Any], epoch: int) -> None:
    """Tell a training loader's sampler (through its batches) which epoch comes next."""
    _resumable(loader).set_epoch(epoch)


def skip_batches(loader: Iterable[Any], count: int) -> None:
    """The training loader's next pass starts at batch ``count`` of its epoch; nothing before it is decoded."""
    _resumable(loader).skip_next(count)


def epoch_batches(loader: Iterable[Any], epochs: int) -> list[int]:
    """Batches of each of ``epochs`` epochs of a training loader: the same each, or what the multigrid schedule
    makes of this rank's shard epoch by epoch."""
    batches = _resumable(loader).batches
    if not isinstance(batches, MultigridBatchSampler):
        return [len(batches)] * epochs
    return [batches.schedule.batches_in_epoch(e, len(batches.sampler), batches.drop_last)  # type: ignore[arg-type]
            for e in range(epochs)]
