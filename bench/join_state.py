"""A joiner's optimizer state from its donor (a node back in the world, a spare: trainer.continuation): sent tensor
by tensor (trainer.distributed.send_state, what the trainer does) against pickled whole through
``torch.distributed.broadcast_object_list`` (what it did before), in the same run. The state is an AdamW's for a
model the size of VideoMAE-B (86M parameters: two moments, 690 MB), on two gloo processes.

Measured per way: the joiner's wait (from the donor's start to the state in the joiner's hands), and each process's
peak resident size above its size once the state was built (the donor) or before receiving (the joiner), so what the
transfer itself holds. Workers run with MALLOC_MMAP_THRESHOLD_ at 64 KiB so freed blocks go back to the system and
the peak follows the live buffers (bench/fsdp.py does the same). The goal: the donor holds at most 0.1x the state
more, and the joiner no more than the state and a tenth.

    .venv/bin/python -m bench.join_state [--params 86]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.distributed import send_state
from trainer.runtime.host.ports import free_port

WAYS = ("pickled", "tensor by tensor")
TENSOR_PARAMS = 590_000  # a VideoMAE-B linear layer's weight (768 x 768) or so
DONOR_GOAL, JOINER_GOAL = 0.1, 1.1  # extra held, as a share of the state


def _resident() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_since_reset() -> int:
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


def adamw_state(params: int) -> dict[str, Any]:
    """An AdamW state dict for ``params`` parameters in tensors of about a linear layer's size."""
    count = max(1, params // TENSOR_PARAMS)
    state = {i: {"step": torch.tensor(1000.0), "exp_avg": torch.randn(TENSOR_PARAMS),
                 "exp_avg_sq": torch.rand(TENSOR_PARAMS)} for i in range(count)}
    return {"state": state, "param_groups": [{"lr": 1e-4, "weight_decay": 0.05, "params": list(range(count))}]}


def _worker(rank: int, port: int, way: str, params: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(minutes=5))
    torch.manual_seed(0)
    state = adamw_state(params) if rank == 0 else None
    dist.barrier()
    before = _resident()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident size starts again from here
    start = time.perf_counter()
    if way == "pickled":
        box = [state]
        dist.broadcast_object_list(box, src=0)
        received = box[0]
    else:
        received = send_state(state, 0, [1], torch.device("cpu"))
    waited = time.perf_counter() - start
    peak = _peak_since_reset() - before
    moments = [t for entry in received["state"].values() for t in entry.values()]
    exact = True
    if rank == 1:  # the donor's state, drawn again from its seed
        torch.manual_seed(0)
        sent = [t for entry in adamw_state(params)["state"].values() for t in entry.values()]
        exact = all(torch.equal(a, b) for a, b in zip(moments, sent, strict=True))
    Path(out, f"{way}-{rank}.json").write_text(json.dumps({
        "wait_s": waited, "peak_b": peak, "state_b": sum(t.numel() * t.element_size() for t in moments),
        "exact": exact}))
    dist.destroy_process_group()


def run(params_m: float = 86.0) -> dict[str, dict[str, float]]:
    """Each way in a pair of fresh processes: the joiner's wait and both processes' extra peak, in bytes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by the spawned interpreters' glibc
    found: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as out:
        for way in WAYS:
            mp.spawn(_worker, args=(free_port(), way, int(params_m * 1e6), out), nprocs=2, join=True)
            donor, joiner = (json.loads(Path(out, f"{way}-{rank}.json").read_text()) for rank in (0, 1))
            found[way] = {"wait_s": joiner["wait_s"], "donor_b": donor["peak_b"], "joiner_b": joiner["peak_b"],
                          "state_b": donor["state_b"], "exact": joiner["exact"]}
    return found


def goals(found: dict[str, dict[str, float]]) -> dict[str, bool]:
    """Each goal of the way the trainer sends a state, by what it is about: the donor, the joiner, the state."""
    ours = found["tensor by tensor"]
    return {"donor": ours["donor_b"] <= DONOR_GOAL * ours["state_b"],
            "joiner": ours["joiner_b"] <= JOINER_GOAL * ours["state_b"], "exact": bool(ours["exact"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=86.0, help="the model's parameters, millions")
    found = run(parser.parse_args().params)
    mib = 2**20
    print("| way | joiner's wait, s | donor's extra peak, MiB | joiner's extra peak, MiB | state, MiB |")
    print("|---|---|---|---|---|")
    for way, r in found.items():
        print(f"| {way} | {r['wait_s']:.2f} | {r['donor_b'] / mib:.0f} | {r['joiner_b'] / mib:.0f} | "
              f"{r['state_b'] / mib:.0f} |")
    met = goals(found)
    print(f"the donor holds at most {DONOR_GOAL}x the state more: {met['donor']}; the joiner at most {JOINER_GOAL}x "
          f"the state: {met['joiner']}; the state arrives exactly: {met['exact']}")


if __name__ == "__main__":
    main()
