"""The loops: train one epoch, evaluate, multi-view test. Nothing else lives here.

Every rank runs every loop; statistics are sums (loss, correct, count) reduced with one all-reduce, so a
2-process evaluation reports exactly what a 1-process one does (the eval shard does not pad).

Loaders hand over uint8 clips; each loop turns them into model input on its device (accel.clip_normalizer: a
non-blocking copy from pinned memory, then conversion and normalisation there). The training step never waits for
the device: loss and top-1 are summed on it and read once per LOG.DISPLAY_FREQ iterations (and at the epoch's end).
What an epoch has counted so far is an EpochTally, which a mid-epoch checkpoint saves and a resume hands back, and
after each optimizer step the loop calls its caller back (trainer.train: checkpoints, stops, status).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer import heartbeat
from trainer.accel import autocast, clip_normalizer, ddp_module
from trainer.config import Config
from trainer.data.mixup import BatchMixer
from trainer.data.transforms import ClipNormalizer
from trainer.distributed import DistContext, all_gather_object, all_reduce_sum, any_rank
from trainer.elastic import Accumulation
from trainer.pace import StepClock
from trainer.reporting import Reporter, progress
from trainer.runtime.watch.messages import COLLECTIVE, COMPUTE, DATA, EVALUATE, VALIDATE
from trainer.sharding import is_sharded
from trainer.solver import schedule_lr

log = logging.getLogger("trainer")

METRICS = COLLECTIVE + "metrics"  # a validation's sums over every rank (its heartbeat says a rank waits there)


@dataclass
class TrainState:
    """What the epoch loop mutates: optimizer, schedule, AMP scaler, the global optimizer step, and the step clock
    (what the steps spend their time on: trainer.pace)."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    step: int = 0
    clock: StepClock = field(default_factory=lambda: StepClock(None, start_step=0, checkpoint_every_s=0.0))
    fallback_reported: set[str] = field(default_factory=set)  # named in the log already (once per video)


@dataclass
class EpochTally:
    """What an epoch's training pass has counted so far on this rank."""

    sums: torch.Tensor  # loss sum, top-1 correct (float64, on the device: the step never waits to read them)
    clips: int = 0  # trained clips
    batches: int = 0  # micro-batches consumed (a resumed pass skips these)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (path, reason) of skipped videos
    fallback: list[tuple[str, str]] = field(default_factory=list)  # DECODER auto: read with torchcodec
    step_samples: list[int] = field(default_factory=list)  # LOG.SAMPLE_LOG: what the step in progress trained

    @classmethod
    def start(cls, device: torch.device) -> EpochTally:
        return cls(torch.zeros(2, device=device, dtype=torch.float64))

    def record(self) -> dict[str, Any]:
        """Plain values (exact: the sums as float64 numbers), for a checkpoint."""
        return {"sums": self.sums.tolist(), "clips": self.clips, "batches": self.batches,
                "bad": [list(b) for b in self.bad], "fallback": [list(f) for f in self.fallback]}

    @classmethod
    def from_record(cls, record: dict[str, Any], device: torch.device) -> EpochTally:
        return cls(torch.tensor(record["sums"], device=device, dtype=torch.float64), record["clips"],
                   record["batches"], [tuple(b) for b in record["bad"]], [tuple(f) for f in record["fallback"]])


# After each optimizer step: (tally, clips trained in the step on this rank, whether the step ends the epoch).
StepCallback = Callable[[EpochTally, int, bool], None]


def topk_correct(logits: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.shape[1])
    top = logits.topk(k, dim=1).indices
    return (top == labels[:, None]).any(dim=1).sum()


def gather_bad(bad: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Every rank's (path, reason) pairs (skipped or fallback videos), deduplicated (a padded sample can be the same
    bad file twice)."""
    merged = {tuple(item) for part in all_gather_object(bad) for item in part}
    return sorted(merged)


def _micro_batches(
    model: nn.Module, loader: Any, accum: int, ctx: DistContext, desc: str, done: int = 0
) -> Iterator[tuple[dict[str, Any], bool, bool, contextlib.AbstractContextManager[Any]]]:
    """Yield (batch, is_last_micro_batch, ends_the_epoch, grad-sync context): gradients all-reduce only on the last
    micro-batch of an optimizer step. ``done``: micro-batches of the epoch consumed before this pass (a resumed
    pass; a multiple of ``accum``, as checkpoints follow optimizer steps)."""
    total = done + len(loader)
    ddp = ddp_module(model)
    for i, batch in enumerate(progress(ctx, loader, total - done, desc), start=done):
        end = i + 1 == total
        last = (i + 1) % accum == 0 or end
        # Per the DDP docs, the forward must run inside no_sync() too, not just the backward.
        sync = ddp.no_sync() if isinstance(ddp, DistributedDataParallel) and not last else contextlib.nullcontext()
        yield batch, last, end, sync


def _placeholder_input(cfg: Config, normalizer: ClipNormalizer) -> torch.Tensor:
    data = cfg.CONFIG.DATA
    return normalizer(torch.zeros(1, 3, data.CLIP_LEN * data.NUM_SEGMENT, data.CROP_SIZE, data.CROP_SIZE,
                                  dtype=torch.uint8))


# Clips and labels of a batch -> (the clips the model sees, the targets the loss sees): TRAIN.MIXUP's mix.
BatchMix = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _forward_loss(
    model: nn.Module, batch: dict[str, Any], criterion: nn.Module, cfg: Config, ctx: DistContext,
    normalizer: ClipNormalizer, placeholder: bool, mix: BatchMix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(loss, logits, labels on the device) of a batch, mixed by ``mix`` if given, or with ``placeholder`` (a batch
    whose every video was bad) a zero-loss forward/backward in eval mode: DDP needs each rank to take part in every
    gradient all-reduce, or the others would wait forever."""
    if placeholder:
        model.eval()  # keep BatchNorm running stats clean of the placeholder
        loss = model(_placeholder_input(cfg, normalizer)).sum() * 0.0
        model.train()
        return loss, None, None
    video = normalizer(batch["video"], batch.get("crops"))
    labels = batch["label"].to(ctx.device, non_blocking=True)
    video, targets = mix(video, labels) if mix is not None else (video, labels)
    with autocast(ctx, cfg.CONFIG.TRAIN.AMP):
        logits = model(video)
        return criterion(logits, targets), logits, labels


def train_one_epoch(
    model: nn.Module, loader: Any, state: TrainState, ctx: DistContext, cfg: Config, epoch: int, reporter: Reporter,
    tally: EpochTally, after_step: StepCallback, accumulation: Accumulation | None = None,
) -> dict[str, float]:
    """Train the rest of an epoch (all of it, unless ``tally`` comes from a mid-epoch checkpoint and the loader skips
    what it counted); returns train_loss and train_top1 (averages over all ranks' clips; top-1 against each clip's
    own label, mixed or not) and train_clips. ``accumulation``: how a step is made of micro-batches in a world other
    than the launch's (trainer.elastic); by default ACCUM_STEPS, each loss divided by it."""
    train = cfg.CONFIG.TRAIN
    if accumulation is None:
        accumulation = Accumulation(train.ACCUM_STEPS, None, 0)
    model.train()
    criterion = nn.CrossEntropyLoss(label_smoothing=train.LABEL_SMOOTHING)
    mixer = BatchMixer.from_config(cfg)
    normalizer = clip_normalizer(cfg, ctx)
    step_clips = 0
    # SYNC_BN's SyncBatchNorm runs collectives in a training forward and none in eval mode (the placeholder's): a
    # batch with no good video on any rank is a placeholder step on every rank, or the others would wait in theirs.
    syncs_batchnorm = ctx.distributed and train.SYNC_BN
    state.optimizer.zero_grad(set_to_none=True)
    clock = state.clock
    clock.epoch_start()
    batches = _micro_batches(model, loader, accumulation.micro_batches, ctx, f"epoch {epoch + 1}", tally.batches)
    heartbeat.at(DATA)
    for batch, last, end, sync in batches:
        clock.batch_ready()
        heartbeat.at(COMPUTE)
        tally.batches += 1
        tally.bad.extend(batch["bad"])
        tally.fallback.extend(batch["fallback"])
        empty = len(batch["label"]) == 0
        placeholder = any_rank(empty, ctx) if syncs_batchnorm else empty
        if placeholder and not empty:
            log.warning("rank %d skips a batch of %d clips: another rank's batch had no video it could read, and "
                        "SyncBatchNorm needs every rank in each step", ctx.rank, len(batch["label"]))
        # keyed by the batch's place in the epoch, so a resumed pass mixes as the uninterrupted one did
        mix = functools.partial(mixer, key=(ctx.rank, epoch, tally.batches)) if mixer is not None else None
        with sync:
            loss, logits, labels = _forward_loss(model, batch, criterion, cfg, ctx, normalizer, placeholder, mix)
            state.scaler.scale(accumulation.scale(loss, 0 if placeholder else len(batch["label"]))).backward()
        clock.backward_done()
        if logits is not None:
            n = len(labels)
            tally.sums += torch.stack([loss.detach().double() * n, topk_correct(logits, labels, 1).double()])
            tally.clips += n
            if cfg.CONFIG.LOG.SAMPLE_LOG:
                tally.step_samples.extend(batch["index"].tolist())
            step_clips += n
        if last:
            lr = schedule_lr(state.optimizer)  # the LR this step used (the scheduler moves on below)
            _optimizer_step(model, state, train.CLIP_GRAD_NORM)
            if ctx.is_main and state.step % cfg.CONFIG.LOG.DISPLAY_FREQ == 0:
                _display(reporter, state.step, epoch, lr, tally)  # the one wait for the device
            after_step(tally, step_clips, end)
            clock.step_done()
            step_clips = 0
            tally.step_samples.clear()
        heartbeat.at(DATA)
    stats = torch.cat([tally.sums, torch.tensor([tally.clips], device=ctx.device, dtype=torch.float64)])
    all_reduce_sum(stats)
    count = max(stats[2].item(), 1.0)
    return {"train_loss": stats[0].item() / count, "train_top1": 100.0 * stats[1].item() / count,
            "train_clips": int(stats[2].item())}


def _display(reporter: Reporter, step: int, epoch: int, lr: float, tally: EpochTally) -> None:
    """GluonCV's every-DISPLAY_FREQ-iterations report: lr and rank 0's running loss and top-1 this epoch."""
    loss_sum, correct = tally.sums.tolist()
    count = max(tally.clips, 1)
    loss, top1 = loss_sum / count, 100.0 * correct / count
    log.info("epoch %d iteration %d: lr %.6g loss %.4f top-1 %.2f%%", epoch + 1, step, lr, loss, top1)
    for tag, value in (("lr", lr), ("loss", loss), ("top1", top1)):
        reporter.scalar(f"iteration/{tag}", value, step)
    reporter.update_status(running={"train_loss": loss, "train_top1": top1, "step": step})


def _optimizer_step(model: nn.Module, state: TrainState, clip_norm: float) -> None:
    if clip_norm > 0:
        state.scaler.unscale_(state.optimizer)  # clip true gradients, not fp16-scaled ones
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.scheduler.step()
    state.step += 1


def _eval_logits(
    model: nn.Module, loader: Any, ctx: DistContext, cfg: Config, desc: str, bad: list[tuple[str, str]],
    fallback: list[tuple[str, str]], each_batch: Callable[[], None],
) -> Iterator[tuple[dict[str, Any], torch.Tensor, torch.Tensor]]:
    """(batch, labels, float logits) of every batch with at least one good video; bad videos go into ``bad``, the
    ones DECODER auto read with torchcodec into ``fallback``; ``each_batch()`` after each batch (trainer.train: the
    supervisor's word).

    A sharded model's forward gathers its parameters from every rank, so each rank runs as many forwards as the rank
    with the most batches (the eval shards may differ in length): a placeholder clip for a batch with no good video,
    and for each batch it has fewer."""
    normalizer = clip_normalizer(cfg, ctx)
    sharded = is_sharded(model)
    missing = max(all_gather_object(len(loader))) - len(loader) if sharded else 0
    heartbeat.at(VALIDATE)
    for batch in progress(ctx, loader, len(loader), desc):
        bad.extend(batch["bad"])
        fallback.extend(batch["fallback"])
        if len(batch["label"]) == 0:
            missing += sharded
        else:
            with autocast(ctx, cfg.CONFIG.TRAIN.AMP):
                logits = model(normalizer(batch["video"], batch.get("crops"))).float()
            yield batch, batch["label"].to(ctx.device, non_blocking=True), logits
        heartbeat.validated()
        each_batch()
    for _ in range(missing):
        model(_placeholder_input(cfg, normalizer))


def _sum_over_ranks(*tensors: torch.Tensor) -> None:
    """A validation's or test's sums over every rank, in place: meanwhile this rank's heartbeat says it waits in them
    (METRICS), so that a peer stuck in a batch is named hung; then it is at its epoch's end (EVALUATE) again."""
    heartbeat.at(METRICS)
    for tensor in tensors:
        all_reduce_sum(tensor)
    heartbeat.at(EVALUATE)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any, ctx: DistContext, cfg: Config, desc: str = "val",
             each_batch: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Loss, top-1 and top-5 over the whole split; ``model`` is the unwrapped module (shards may differ in length,
    and a DDP forward would then wait on a buffer broadcast that never comes); ``each_batch()`` after each batch."""
    model.eval()
    criterion = nn.CrossEntropyLoss(reduction="sum")
    stats = torch.zeros(4, device=ctx.device, dtype=torch.float64)  # loss sum, top-1, top-5, clips
    bad: list[tuple[str, str]] = []
    fallback: list[tuple[str, str]] = []
    for _, labels, logits in _eval_logits(model, loader, ctx, cfg, desc, bad, fallback, each_batch):
        stats += torch.stack([criterion(logits, labels).double(), topk_correct(logits, labels, 1).double(),
                              topk_correct(logits, labels, 5).double(),
                              torch.tensor(len(labels), device=ctx.device, dtype=torch.float64)])
    _sum_over_ranks(stats)
    count = max(stats[3].item(), 1.0)
    return {
        "loss": stats[0].item() / count,
        "top1": 100.0 * stats[1].item() / count,
        "top5": 100.0 * stats[2].item() / count,
        "count": int(stats[3].item()),
        "bad": gather_bad(bad),
        "fallback": gather_bad(fallback),
    }


@torch.no_grad()
def test_multiview(
    model: nn.Module, loader: Any, ctx: DistContext, cfg: Config, num_videos: int, num_classes: int
) -> dict[str, Any]:
    """Average the softmax of every view of each video, wherever its views ran, then score each video once."""
    model.eval()
    probs = torch.zeros(num_videos, num_classes, device=ctx.device, dtype=torch.float64)
    views = torch.zeros(num_videos, device=ctx.device, dtype=torch.float64)
    label_sum = torch.zeros(num_videos, device=ctx.device, dtype=torch.float64)
    bad: list[tuple[str, str]] = []
    fallback: list[tuple[str, str]] = []
    for batch, labels, logits in _eval_logits(model, loader, ctx, cfg, "test", bad, fallback, lambda: None):
        vidx = batch["video_index"].to(ctx.device)
        probs.index_add_(0, vidx, logits.softmax(dim=1).double())
        views.index_add_(0, vidx, torch.ones_like(vidx, dtype=torch.float64))
        label_sum.index_add_(0, vidx, labels.double())
    _sum_over_ranks(probs, views, label_sum)
    seen = views > 0  # a video all of whose views were bad is not scored
    labels = (label_sum[seen] / views[seen]).round().long()  # every view carries its video's label
    scores = probs[seen]
    count = int(seen.sum().item())
    return {
        "top1": 100.0 * topk_correct(scores, labels, 1).item() / max(count, 1),
        "top5": 100.0 * topk_correct(scores, labels, 5).item() / max(count, 1),
        "videos": count,
        "views_per_video": cfg.CONFIG.DATA.TEST_NUM_SEGMENT * cfg.CONFIG.DATA.TEST_NUM_CROP,
        "bad": gather_bad(bad),
        "fallback": gather_bad(fallback),
        "predictions": (scores / views[seen, None]).cpu(),
        "labels": labels.cpu(),
    }
