"""Multigrid training (Wu et al., "A Multigrid Method for Efficiently Training Video Models", CVPR 2020), driven by
GluonCV's keys CONFIG.TRAIN.MULTIGRID.{USE_LONG_CYCLE, USE_SHORT_CYCLE, LONG_CYCLE_EPOCH}.

A grid is the shape one batch trains at: frames per clip, crop size and batch size. Coarser grids hold fewer pixels
per clip and proportionally more clips per batch, so every iteration costs about the same and an epoch (every clip
once) costs less.

* Long cycle, per epoch stage (GluonCV's multiGridHelper.long_cycle): (T/2, S/sqrt2) at 4x the batch, then
  (T/2, S) at 2x, then (T, S) at 1x. Half the frames at twice the stride cover the same time span. The run moves to
  the next stage after each epoch listed in LONG_CYCLE_EPOCH (0-based, as GluonCV's ``epoch in LONG_CYCLE_EPOCH``
  after training that epoch) and, as GluonCV, wraps around after the last stage; the config refuses milestones
  that would end training on a coarse grid. The learning rate of a stage is multiplied by its batch factor (the
  linear scaling rule, as PySlowFast's long-cycle LRS), and the schedule runs in fractional epochs, so epochs of
  fewer, larger batches keep their place in it (solver.EpochClock).
* Short cycle, per iteration (PySlowFast's ShortCycleBatchSampler): crops of S/2, S/sqrt2 and the stage's own S, in
  turn, with the batch scaled by the square of the size ratio (4x, 2x, 1x at the full stage). The learning rate is not
  scaled per iteration. At a stage whose S is already S/sqrt2 the cycle is S/2 (2x), S/sqrt2, S/sqrt2.
  The spatial field of view stays: a smaller crop comes from a proportionally smaller short side.

Everything is a function of (epoch, iteration): every rank computes the same grids and, since the training sampler
gives every rank an equally long shard, the same number of batches of the same sizes; a run resumed at an epoch
boundary replays exactly. Validation, test and prediction always use the full grid.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch.utils.data import Sampler

if TYPE_CHECKING:
    from trainer.config import Config

SQRT2 = math.sqrt(2.0)
# (temporal, spatial) divisors of each long-cycle stage, coarse to fine (GluonCV's long_cycle, reversed)
LONG_CYCLE: tuple[tuple[float, float], ...] = ((2.0, SQRT2), (2.0, 1.0), (1.0, 1.0))
SHORT_CYCLE: tuple[float, ...] = (2.0, SQRT2)  # spatial divisors of the default S before the stage's own S


@dataclass(frozen=True)
class Grid:
    """The shape of one training batch: clip_len frames frame_rate apart, crop_size crops of frames whose short
    side is short_side, batch_size clips per process."""

    clip_len: int
    frame_rate: int
    crop_size: int
    short_side: int
    batch_size: int


@dataclass(frozen=True)
class MultigridSchedule:
    """The grids of each epoch, from the default shape (CLIP_LEN, FRAME_RATE, CROP_SIZE, SHORT_SIDE_SIZE,
    TRAIN.BATCH_SIZE) and the cycles switched on."""

    default: Grid
    short_cycle: bool
    long_cycle: bool
    long_cycle_epochs: tuple[int, ...]

    @classmethod
    def from_config(cls, cfg: Config) -> MultigridSchedule | None:
        """The schedule CONFIG.TRAIN.MULTIGRID asks for, or None when both cycles are off."""
        multigrid, data = cfg.CONFIG.TRAIN.MULTIGRID, cfg.CONFIG.DATA
        if not (multigrid.USE_SHORT_CYCLE or multigrid.USE_LONG_CYCLE):
            return None
        default = Grid(data.CLIP_LEN, data.FRAME_RATE, data.CROP_SIZE, data.SHORT_SIDE_SIZE,
                       cfg.CONFIG.TRAIN.BATCH_SIZE)
        return cls(default, multigrid.USE_SHORT_CYCLE, multigrid.USE_LONG_CYCLE,
                   tuple(multigrid.LONG_CYCLE_EPOCH) if multigrid.USE_LONG_CYCLE else ())

    def stage(self, epoch: int) -> int:
        """The long-cycle stage (0 = coarsest) of 0-based ``epoch``; the full one without a long cycle."""
        if not self.long_cycle:
            return len(LONG_CYCLE) - 1
        return sum(milestone < epoch for milestone in self.long_cycle_epochs) % len(LONG_CYCLE)

    def lr_scale(self, epoch: int) -> float:
        """Learning-rate multiplier of an epoch: the batch factor of its long-cycle stage."""
        t_div, s_div = LONG_CYCLE[self.stage(epoch)]
        return float(round(t_div * s_div**2))

    def grids(self, epoch: int) -> list[Grid]:
        """The grids of an epoch's iterations, in turn (one without a short cycle)."""
        base = self.default
        t_div, s_div = LONG_CYCLE[self.stage(epoch)]
        clip_len = max(1, round(base.clip_len / t_div))
        frame_rate = base.frame_rate * base.clip_len // clip_len  # the same time span
        stage_crop = round(base.crop_size / s_div)
        stage_batch = base.batch_size * round(t_div * s_div**2)
        crops = [stage_crop]
        if self.short_cycle:
            crops = [min(round(base.crop_size / d), stage_crop) for d in SHORT_CYCLE] + crops
        return [
            Grid(clip_len, frame_rate, crop, max(1, round(base.short_side * crop / base.crop_size)),
                 stage_batch * round((stage_crop / crop) ** 2))
            for crop in crops
        ]

    def batches_in_epoch(self, epoch: int, samples: int, drop_last: bool) -> int:
        """How many batches ``samples`` clips (one rank's shard) make in ``epoch``."""
        sizes = [grid.batch_size for grid in self.grids(epoch)]
        full_cycles, left = divmod(samples, sum(sizes))
        count = full_cycles * len(sizes)
        for size in sizes:
            if left <= 0 or (left < size and drop_last):
                break
            count += 1
            left -= size
        return count


class MultigridBatchSampler(Sampler[list[tuple[int, int, Grid]]]):
    """Batches of (index, epoch, grid) keys from an EpochDistributedSampler, sized by the schedule's grids for the
    sampler's current epoch (set with ``set_epoch``, which this forwards)."""

    def __init__(self, sampler: Sampler[tuple[int, int]], schedule: MultigridSchedule, drop_last: bool) -> None:
        self.sampler = sampler
        self.schedule = schedule
        self.drop_last = drop_last

    @property
    def epoch(self) -> int:
        return self.sampler.epoch  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[list[tuple[int, int, Grid]]]:
        grids = self.schedule.grids(self.epoch)
        batch: list[tuple[int, int, Grid]] = []
        turn = 0
        for index, epoch in self.sampler:
            batch.append((index, epoch, grids[turn % len(grids)]))
            if len(batch) == grids[turn % len(grids)].batch_size:
                yield batch
                batch, turn = [], turn + 1
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        return self.schedule.batches_in_epoch(self.epoch, len(self.sampler), self.drop_last)  # type: ignore[arg-type]
