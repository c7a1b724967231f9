"""Entry point for tests/trainer/test_distributed.py: launch() a worker that records what it saw.

Run like the trainer (``python tests/trainer/_dist_entry.py --config-file X.yaml [KEY VALUE ...]``, under torchrun,
or with ``--local_rank N``). Each worker writes ``rank<global rank>.json`` into the run directory
(CONFIG.LOG.BASE_PATH with EXP_NAME ''). A worker whose rank is in $VCT_FAIL_RANK raises instead. Each worker also
updates precise BatchNorm statistics on its own batches (``precise_bn_batches``), so every launch mode checks that
they are averaged over all ranks.

Under torchrun, the worker whose RANK is $VCT_DIE_RANK dies (SIGKILL's status, no exception) after its first
collective in the first attempt, and comes 3 s late to the group of every later attempt: its peers read the
rendezvous store before it writes anything there. A UserError (a PeerError: a rendezvous that timed out) ends it
as it ends the trainer: one line and its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import Config, load_config, run_dir
from trainer.distributed import DistContext, add_launcher_args, all_gather_object, all_reduce_sum, barrier, launch
from trainer.distributed import broadcast_object as bcast
from trainer.errors import report_user_errors
from trainer.precise_bn import update_precise_bn

# What torchrun exports to each worker, and launch() too, whichever way the worker started.
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def precise_bn_batches(rank: int) -> list[dict[str, torch.Tensor]]:
    """Three batches of 4 clips, different on every rank; rank 1's second batch lost all its videos."""
    generator = torch.Generator().manual_seed(rank)
    batches = [{"video": torch.randn(4, 3, 2, 4, 4, generator=generator) * (rank + 1) + rank,
                "label": torch.zeros(4, dtype=torch.long)} for _ in range(3)]
    if rank == 1:
        batches[1] = {"video": torch.empty(0), "label": torch.zeros(0, dtype=torch.long)}
    return batches


def precise_bn(ctx: DistContext, cfg: Config) -> dict[str, object]:
    model = nn.Sequential(nn.BatchNorm3d(3))
    used = update_precise_bn(model, precise_bn_batches(ctx.rank), ctx, cfg)
    return {"used": used, "mean": model[0].running_mean.tolist(), "var": model[0].running_var.tolist()}


def record(ctx: DistContext, cfg: Config) -> None:
    torch.set_num_threads(1)
    if str(ctx.rank) == os.environ.get("VCT_FAIL_RANK"):
        raise ValueError(f"worker with rank {ctx.rank} fails on purpose")
    total = all_reduce_sum(torch.tensor([float(ctx.rank + 1)]))
    if _dies_now(ctx.rank):
        os._exit(9)
    result = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "node_rank": ctx.node_rank,
        "num_nodes": ctx.num_nodes,
        "device": str(ctx.device),
        "distributed": ctx.distributed,
        "group_initialized": dist.is_initialized(),
        "sum": total.item(),
        "gathered": all_gather_object(ctx.rank),
        "broadcast": bcast(f"from rank {ctx.rank}"),
        "gpu_world_rank": cfg.DDP_CONFIG.GPU_WORLD_RANK,
        "gpu_world_size": cfg.DDP_CONFIG.GPU_WORLD_SIZE,
        "gpu": cfg.DDP_CONFIG.GPU,
        "world_rank": cfg.DDP_CONFIG.WORLD_RANK,
        "dist_url": ctx.dist_url,
        "precise_bn": precise_bn(ctx, cfg),
        "pid": os.getpid(),
        "env": {name: os.environ.get(name) for name in TORCHRUN_ENV},
        "attempt": _attempt(),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    barrier(ctx)
    (run_dir(cfg) / f"rank{ctx.rank}.json").write_text(json.dumps(result))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _dies_now(rank: int) -> bool:
    return str(rank) == os.environ.get("VCT_DIE_RANK") and _attempt() == 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-file", required=True)
    add_launcher_args(parser)
    parser.add_argument("opts", nargs="*", default=[])
    args = parser.parse_args()
    if os.environ.get("RANK") == os.environ.get("VCT_DIE_RANK") and _attempt() > 0:
        time.sleep(3)
    report_user_errors(lambda: launch(record, load_config(args.config_file, args.opts), local_rank=args.local_rank))


if __name__ == "__main__":
    main()
