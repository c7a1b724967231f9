"""trainer.continuation.shared_memory on three real gloo ranks: which memory an attempt goes on from when a rank holds
a stale one (its node was out of the world while the others trained on, and its trainer parked: a node back), when
the ranks of the latest attempt are a step apart (a lost peer's all-reduce completed on one survivor and failed on the
other), and when they disagree otherwise."""

from __future__ import annotations

import pickle
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trainer.continuation import Kept, Memory, Position, shared_memory
from trainer.distributed import DistContext
from trainer.elastic import Recipe
from trainer.engine import EpochTally
from trainer.resume import rng_state

CPU = torch.device("cpu")
# (attempt, step) of each rank's memory, per case; None: it holds none (a standby)
CASES = {
    "a node back": [(1, 40), (1, 40), (0, 31)],  # ranks 0 and 1 trained on in attempt 1 while rank 2 was out
    "a standby and a node back": [(1, 40), None, (0, 31)],
    "the latest attempt's ranks are a step apart": [(1, 40), (1, 41), (0, 31)],
    "the latest attempt's ranks disagree": [(1, 40), (1, 42), (0, 31)],  # more than one collective could leave
}


def memory(attempt: int, step: int, rank: int) -> Memory:
    """A memory of ``step``, taken in ``attempt``: an SGD state whose momentum says which step it is."""
    position = Position(attempt, step, 2, 0.1, rank, 3, EpochTally.start(CPU), rng_state(CPU), [])
    optimizer = {"state": {0: {"momentum_buffer": torch.full((3,), float(step))}},
                 "param_groups": [{"lr": 0.1, "params": [0]}]}
    return Memory(position, optimizer, {"last_epoch": step}, {}, 0.0, [], Recipe(3, 4, 1))


def rank_main(rank: int, store: str, case: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=3,
                            timeout=timedelta(seconds=60))
    ctx = DistContext(rank, 3, 0, 1, rank, 3, CPU, "gloo", True, "")
    held = CASES[case][rank]
    kept = Kept(rank, 3, nn.Linear(3, 1), (None, None, None), memory(*held, rank) if held is not None else None)
    shared = shared_memory(ctx, kept)
    found = None if shared is None else {
        "donor": shared.donor, "joiners": shared.joiners, "step": shared.memory.position.step,
        "momentum": shared.memory.optimizer["state"][0]["momentum_buffer"].tolist()}
    Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(found))
    dist.destroy_process_group()


def went_on(case: str, folder: Path) -> list[dict | None]:
    mp.start_processes(rank_main, args=(str(folder / "store"), case, str(folder)), nprocs=3, start_method="fork")
    return [pickle.loads((folder / f"{rank}.pkl").read_bytes()) for rank in range(3)]


@pytest.mark.parametrize("case", ["a node back", "a standby and a node back"])
def test_a_stale_memory_is_dropped_and_its_rank_receives_the_latest(case: str, tmp_path: Path) -> None:
    found = went_on(case, tmp_path)
    joiners = tuple(rank for rank, held in enumerate(CASES[case]) if held is None or held[0] == 0)
    for rank in range(3):  # every rank goes on from step 40, rank 0's, none from a checkpoint
        assert found[rank] == {"donor": 0, "joiners": joiners, "step": 40, "momentum": [40.0] * 3}, (rank, found)


def test_a_rank_a_step_behind_receives_the_step_of_the_rank_ahead(tmp_path: Path) -> None:
    """Rank 1 took step 41, rank 0's all-reduce of it failed: every rank goes on from step 41, rank 0 and the node back
    (rank 2) receive it, none reads a checkpoint."""
    found = went_on("the latest attempt's ranks are a step apart", tmp_path)
    for rank in range(3):
        assert found[rank] == {"donor": 1, "joiners": (0, 2), "step": 41, "momentum": [41.0] * 3}, (rank, found)


def test_when_the_latest_attempts_ranks_disagree_every_rank_reads_the_checkpoint(tmp_path: Path) -> None:
    assert went_on("the latest attempt's ranks disagree", tmp_path) == [None, None, None]
