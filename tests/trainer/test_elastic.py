"""The recipe kept across a change of world (trainer/elastic.py): the pure rules, and the training loader that deals an
epoch out over another world (trainer.data.loader.ElasticBatches)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from torch.utils.data import BatchSampler
from torch.utils.data.distributed import DistributedSampler

from trainer.data.loader import ElasticBatches, ResumableBatches
from trainer.elastic import Recipe, epoch_order, epoch_steps, rank_micro_batches


def recipe_micro_batches(length: int, seed: int, epoch: int, world: int, batch: int, drop_last: bool
                         ) -> list[list[list[int]]]:
    """Each rank's micro-batches as the recipe's own loader draws them (torch's DistributedSampler, BatchSampler)."""
    ranks = []
    for rank in range(world):
        sampler = DistributedSampler(range(length), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        ranks.append(list(BatchSampler(sampler, batch, drop_last)))
    return ranks


@pytest.mark.parametrize(("length", "world", "batch", "accum", "drop_last"),
                         [(24, 3, 2, 1, False), (25, 3, 2, 2, False), (25, 3, 2, 1, True), (7, 4, 1, 3, False)])
def test_in_the_recipes_world_the_rule_deals_what_the_recipes_loader_draws(
    length: int, world: int, batch: int, accum: int, drop_last: bool
) -> None:
    recipe = Recipe(world, batch, accum)
    order = epoch_order(length, 5, 2, world, batch, drop_last)
    drawn = recipe_micro_batches(length, 5, 2, world, batch, drop_last)
    for rank in range(world):
        dealt = [b for b in rank_micro_batches(order, recipe, world, rank) if b]
        assert dealt == drawn[rank], rank
    assert epoch_steps(len(order), recipe.global_batch) == -(-len(drawn[0]) // accum)


@pytest.mark.parametrize(("world", "accum"), [(2, 2), (1, 3), (4, 1), (5, 1), (6, 1)])
def test_a_step_trains_the_same_samples_in_any_world(world: int, accum: int) -> None:
    """Recipe: 3 ranks x batch 2 x accumulation 1 = 6 a step; the shrunk (or grown) worlds' micro-batch counts."""
    recipe = Recipe(3, 2, 1)
    order = epoch_order(24, 11, 0, 3, 2, False)
    assert recipe.micro_batches(world) == accum
    dealt = [rank_micro_batches(order, recipe, world, rank) for rank in range(world)]
    for step in range(epoch_steps(len(order), recipe.global_batch)):
        trained = [i for rank in dealt for batch in rank[step * accum : (step + 1) * accum] for i in batch]
        assert sorted(trained) == sorted(order[step * 6 : (step + 1) * 6]), step
        assert all(len(batch) <= recipe.batch for rank in dealt for batch in rank)


def test_the_rest_of_an_epoch_goes_to_the_new_world_and_each_sample_is_trained_once() -> None:
    """Steps 0-1 on 3 ranks, the rest on 2: the epoch's samples (a permutation of 24) each once."""
    recipe = Recipe(3, 2, 1)
    order = epoch_order(24, 11, 0, 3, 2, False)
    before = [i for rank in range(3) for batch in rank_micro_batches(order, recipe, 3, rank)[:2] for i in batch]
    parts = recipe.micro_batches(2)
    after = [i for rank in range(2) for batch in rank_micro_batches(order, recipe, 2, rank)[2 * parts :]
             for i in batch]
    assert Counter(before + after) == Counter(range(24))


def test_in_any_world_each_micro_batch_is_one_the_recipes_world_trains() -> None:
    """BatchNorm normalises each forward over the same clips as in the recipe's world: its micro-batches are dealt
    whole (a share split anew would leave one clip alone in a micro-batch)."""
    six = Recipe(3, 2, 1)  # the recipe's micro-batches of a step of 6: [0, 3], [1, 4], [2, 5]
    assert [rank_micro_batches(list(range(6)), six, 2, rank) for rank in range(2)] == [[[0, 3], [2, 5]],
                                                                                        [[1, 4], []]]
    assert [rank_micro_batches(list(range(6)), six, 4, rank) for rank in range(4)] == [[[0, 3]], [[1, 4]], [[2, 5]],
                                                                                        [[]]]
    three = Recipe(3, 1, 1)  # 3 over 2 ranks of batch 1: 2 micro-batches each, rank 1's second one empty
    assert [rank_micro_batches(list(range(3)), three, 2, rank) for rank in range(2)] == [[[0], [2]], [[1], []]]
    accumulated = Recipe(2, 2, 2)  # rank r's share r, r + 2, ... in batches of 2: [0, 2], [1, 3], [4, 6], [5, 7]
    assert [rank_micro_batches(list(range(8)), accumulated, 3, rank) for rank in range(3)] == [
        [[0, 2], [5, 7]], [[1, 3], []], [[4, 6], []]]


def test_each_sample_weighs_one_over_the_global_batch_and_the_recipes_own_rule_is_kept() -> None:
    """DDP's mean over the ranks of the weighted losses is the mean over the step's samples."""
    recipe = Recipe(3, 2, 3)
    own, shrunk = recipe.accumulation(3), recipe.accumulation(2)
    loss = torch.tensor(0.7)
    assert own.micro_batches == 3 and torch.equal(own.scale(loss, 2), loss / 3)  # bit for bit as before
    assert shrunk.micro_batches == 5  # the recipe's 9 micro-batches of 2 over 2 ranks: 5 and 4 (and an empty one)
    per_rank = [sum(float(shrunk.scale(torch.tensor(1.0), n)) for n in sizes) for sizes in ([2] * 5, [2] * 4 + [0])]
    assert sum(per_rank) / 2 == pytest.approx(1.0)  # DDP's mean over 2 ranks of each rank's weighted mean-of-ones


def test_in_a_world_larger_than_the_recipes_micro_batches_a_rank_left_without_one_has_an_empty_micro_batch() -> None:
    recipe = Recipe(3, 2, 1)
    assert recipe.micro_batches(7) == 1
    dealt = [rank_micro_batches(list(range(6)), recipe, 7, rank) for rank in range(7)]
    assert dealt == [[[0, 3]], [[1, 4]], [[2, 5]], [[]], [[]], [[]], [[]]]
    assert float(recipe.accumulation(7).scale(torch.tensor(1.0), 0)) == 0.0


def test_the_loader_deals_the_rest_of_the_epoch_from_the_step_where_it_stopped() -> None:
    """ResumableBatches over ElasticBatches: the pass starts at the micro-batch after the steps done, with the epoch's
    keys; the next pass (epoch 2) is a different order, whole."""
    recipe = Recipe(3, 2, 1)
    batches = ResumableBatches(ElasticBatches(24, 11, recipe, 2, 1, drop_last=False))
    batches.set_epoch(0)
    parts = recipe.micro_batches(2)
    whole = list(batches)
    batches.skip_next(2 * parts)
    assert len(batches) == len(whole) - 2 * parts and list(batches) == whole[2 * parts :]
    assert all(epoch == 0 for batch in whole for _, epoch in batch)
    batches.set_epoch(1)
    later = list(batches)
    assert len(later) == len(whole) and later != whole
    expected = rank_micro_batches(epoch_order(24, 11, 1, 3, 2, False), recipe, 2, 1)
    assert [[i for i, _ in batch] for batch in later] == expected
    assert list(itertools.chain.from_iterable(expected))  # not empty
