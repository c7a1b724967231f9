"""The recipe kept when the world changes (elastic jobs): the global batch, the LR per optimizer step, every sample
once per epoch. Pure functions; trainer.train and trainer.data.loader use them.

The recipe's world is the number of processes the job was launched with (its first attempt's world): it is carried
from attempt to attempt in memory (trainer.continuation.Kept) and in every checkpoint (``recipe_world``), because a
later attempt's config no longer says it (the runtime's overrides shrink DDP_CONFIG.WOLRD_URLS). The global batch is
BATCH_SIZE x ACCUM_STEPS x that world.

The epoch's global order is what the recipe's DistributedSampler deals out: the seeded permutation of the epoch,
padded to a multiple of the recipe's world (and cut to whole batches under DROP_LAST). The recipe's rank r trains
positions r, r + W, ... of it, so its optimizer step s trains exactly positions [s * G, (s + 1) * G) (G the global
batch): after k steps of an epoch, whatever the worlds they ran on, the consumed part is the prefix of k * G
positions. In a world of another size, step s's micro-batches are the recipe's own (its W x ACCUM_STEPS batches of
BATCH_SIZE: ``recipe_micro_batches``), dealt to the new world's ranks in turn (rank r takes r, r + W', ...). So the
order depends only on the seed, who trains which sample only on the world history, and every forward pass normalises
over the clips it would have in the recipe's world (BatchNorm's statistics are those of the same micro-batches).

The rule when those micro-batches do not divide evenly over the new world: uneven shares (a rank one micro-batch more
than another; the others do an empty one, a placeholder forward of weight 0, as does a rank left without any in a
world larger than the recipe's micro-batches), each sample's loss weighted by W' / G (``Accumulation.scale``): DDP
averages the W' ranks' gradients, so the step's gradient is the mean over the G samples, as in the recipe. Refusing
such a world instead would stop a job that can go on, and a larger per-rank batch would change the memory a rank
needs and BatchNorm's statistics: accumulation keeps BATCH_SIZE, so what fits on a GPU still fits.

The epoch's last step, when the order is not a multiple of G, trains fewer samples; under another world each weighs
1 / G (the recipe's own divides each micro-batch's mean by ACCUM_STEPS: the same for full micro-batches).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Recipe:
    """What the job was launched with: its world, BATCH_SIZE (per process) and ACCUM_STEPS."""

    world: int
    batch: int
    accum: int

    @property
    def global_batch(self) -> int:
        return self.world * self.batch * self.accum

    def micro_batches(self, world: int) -> int:
        """Micro-batches per rank and optimizer step in a world of ``world`` processes, the global batch kept: the
        recipe's world * ACCUM_STEPS micro-batches of a step dealt over ``world`` ranks (a rank dealt fewer has empty
        ones; in a world larger than the recipe's micro-batches some ranks have one empty micro-batch)."""
        return math.ceil(self.world * self.accum / world)

    def accumulation(self, world: int) -> Accumulation:
        if world == self.world:
            return Accumulation(self.accum, None, self.global_batch)
        return Accumulation(self.micro_batches(world), world, self.global_batch)


@dataclass(frozen=True)
class Accumulation:
    """How an optimizer step is made of micro-batches on this rank: ``micro_batches`` of them, each loss scaled by
    ``scale``. ``world`` None: the recipe's own world, whose rule is today's (each micro-batch's mean loss divided by
    ACCUM_STEPS, bit for bit); else each sample weighs ``world`` / ``global_batch`` (see the module docstring)."""

    micro_batches: int
    world: int | None
    global_batch: int

    def scale(self, loss: torch.Tensor, clips: int) -> torch.Tensor:
        """``loss``: the mean over a micro-batch of ``clips`` clips."""
        if self.world is None:
            return loss / self.micro_batches
        return loss * (clips * self.world / self.global_batch)


def epoch_order(length: int, seed: int, epoch: int, world: int, batch: int, drop_last: bool) -> list[int]:
    """The epoch's global order under a recipe world of ``world`` (what torch's DistributedSampler deals out, shuffled
    by seed + epoch and padded, then cut to whole per-rank batches under ``drop_last``)."""
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(length, generator=generator).tolist()
    total = math.ceil(length / world) * world
    padding = total - length
    order += (order * math.ceil(padding / length))[:padding]
    if drop_last:
        order = order[: world * batch * (total // world // batch)]
    return order


def epoch_steps(order_length: int, global_batch: int) -> int:
    """Optimizer steps of an epoch (the recipe's, in any world)."""
    return math.ceil(order_length / global_batch)


def recipe_micro_batches(step: list[int], recipe: Recipe) -> list[list[int]]:
    """The micro-batches the recipe's own world trains for ``step`` (its positions of the epoch's order): rank r's
    share is positions r, r + W, ... (DistributedSampler's deal), cut into batches of BATCH_SIZE in turn; listed
    micro-batch by micro-batch, rank by rank (the first micro-batch of every rank, then the second...)."""
    shares = [step[rank :: recipe.world] for rank in range(recipe.world)]
    return [share[start : start + recipe.batch] for start in range(0, max(map(len, shares)), recipe.batch)
            for share in shares if share[start : start + recipe.batch]]


def rank_micro_batches(order: list[int], recipe: Recipe, world: int, rank: int) -> list[list[int]]:
    """Rank ``rank``'s micro-batches of a whole epoch in a world of ``world`` processes: for each optimizer step, the
    recipe's micro-batches of the step dealt to the world's ranks in turn (rank r takes r, r + W', ...), padded with
    empty ones to ``recipe.micro_batches(world)``. In any world each micro-batch is one the recipe's world trains:
    BatchNorm normalises over the same clips (a share split anew would put one clip alone in a micro-batch: the
    statistics of one clip, trained on, cost BatchNorm models 5 to 27 points of top-1 in bench/elastic.py --recipe)."""
    parts = recipe.micro_batches(world)
    batches: list[list[int]] = []
    for start in range(0, len(order), recipe.global_batch):
        mine = recipe_micro_batches(order[start : start + recipe.global_batch], recipe)[rank::world]
        batches.extend(mine + [[] for _ in range(parts - len(mine))])
    return batches


def step_in_epoch(step: int, steps_per_epoch: list[int], epoch: int) -> int:
    """Optimizer steps of ``epoch`` done when the run's step count is ``step``."""
    return step - sum(steps_per_epoch[:epoch])


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The RNG seed of rank ``rank`` as ``epoch`` begins (trainer.train.run_epoch): the epoch's randomness depends only
    on (seed, epoch, rank), so a resumed run replays it exactly."""
    return seed + 1_000_003 * (epoch + 1) + rank


def continuation_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """The RNG seed of rank ``rank`` after optimizer step ``step`` (of ``epoch``): every rank reseeds after each step
    (trainer.train.after_step), so what a rank draws next depends only on the run's history, and a rank that goes on
    at ``step`` in another world, or joins the job there, draws what the rank of its number would have drawn."""
    return seed + 1_000_003 * (epoch + 1) + 7919 * (step + 1) + rank
