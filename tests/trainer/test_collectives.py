"""trainer.distributed.collectives.send_state on four real gloo processes: the donor's optimizer state reaches the
joiners exactly, tensor by tensor (dtypes, shapes, a CPU step count, the small values), while a rank that takes no
part goes on to the next collective."""

from __future__ import annotations

import pickle
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.distributed import send_state

DONOR, JOINERS, BYSTANDER = 1, (0, 2), 3


def state() -> dict:
    """An Adam-like state dict: tensors of several dtypes and shapes, a step count, nested lists and small values."""
    generator = torch.Generator().manual_seed(3)
    return {"state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(4, 3, generator=generator),
                          "exp_avg_sq": torch.rand(4, 3, generator=generator).to(torch.bfloat16)},
                      1: {"step": torch.tensor(7.0), "exp_avg": torch.randn(5, generator=generator),
                          "momentum": torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1]}},  # not contiguous
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}]}


def rank_main(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4,
                            timeout=timedelta(seconds=60))
    received = None
    if rank == DONOR:
        send_state(state(), DONOR, JOINERS, torch.device("cpu"))
    elif rank in JOINERS:
        received = send_state(None, DONOR, JOINERS, torch.device("cpu"))
    dist.barrier()  # the bystander is here at once
    Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(received))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> list[dict | None]:
    folder = tmp_path_factory.mktemp("send-state")
    mp.start_processes(rank_main, args=(str(folder / "store"), str(folder)), nprocs=4, start_method="fork")
    return [pickle.loads((folder / f"{rank}.pkl").read_bytes()) for rank in range(4)]


def test_every_joiner_receives_the_donors_state_exactly(received: list[dict | None]) -> None:
    sent = state()
    for joiner in JOINERS:
        got = received[joiner]
        assert got is not None and got["param_groups"] == sent["param_groups"]
        assert got["state"].keys() == sent["state"].keys()
        for index, tensors in sent["state"].items():
            assert got["state"][index].keys() == tensors.keys()
            for name, tensor in tensors.items():
                mine = got["state"][index][name]
                assert mine.dtype == tensor.dtype and mine.shape == tensor.shape and mine.device.type == "cpu"
                assert torch.equal(mine, tensor), (joiner, index, name)


def test_a_rank_that_takes_no_part_is_not_waited_for(received: list[dict | None]) -> None:
    # It went to the barrier without calling send_state, and every rank got through it (within the group's timeout).
    assert len(received) == 4 and received[BYSTANDER] is None
