"""Entry point of test_sync_bn.py: an epoch of engine.train_one_epoch with TRAIN.SYNC_BN on every rank of a gloo
job, with a SyncBatchNorm that runs on the CPU, where rank 1's second batch lost all its videos (and of test_gpu.py:
the same with torch's SyncBatchNorm on two GPUs over nccl).

    python -m tests.trainer._sync_bn_entry --config-file X.yaml

Each rank writes ``rank<N>.json`` into the run directory (CONFIG.LOG.BASE_PATH, EXP_NAME ''): how many collectives
it had issued in the job's group after each optimizer step (the group's sequence number), the clips trained, its
weights. (TORCH_DISTRIBUTED_DEBUG=DETAIL, which would compare every collective across ranks, crashes this torch's DDP
on gloo; a rank that ran other collectives than its peer makes gloo abort on the mismatched sizes, or hang where the
sizes agree, and its counts differ.)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.accel import wrap_ddp
from trainer.config import Config, load_config, run_dir
from trainer.distributed import DistContext, launch
from trainer.engine import EpochTally, TrainState, train_one_epoch
from trainer.reporting import Reporter


class SumOverRanks(torch.autograd.Function):
    """An all-reduce (sum) in the forward, and of the gradient in the backward."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CpuSyncBatchNorm(nn.BatchNorm3d):
    """SyncBatchNorm's pattern of collectives on the CPU (torch's own, and DDP around it, run on GPUs only, so the
    trainer refuses SYNC_BN on CPUs): a training forward all-reduces the batch's per-channel sums over every rank,
    and its backward all-reduces their gradients, as SyncBatchNorm gathers statistics and reduces gradients; eval
    mode runs none (BatchNorm's path)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        count = torch.full((self.num_features,), float(x.numel() // self.num_features))
        total, squares, n = SumOverRanks.apply(torch.stack([x.sum(dims), (x * x).sum(dims), count])).unbind()
        mean, var = total / n, squares / n - (total / n) ** 2
        with torch.no_grad():
            self.running_mean.lerp_(mean, self.momentum or 0.1)
            self.running_var.lerp_(var * n / (n - 1), self.momentum or 0.1)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return (x - mean.view(shape)) / (var.view(shape) + self.eps).sqrt() * self.weight.view(shape) \
            + self.bias.view(shape)


def batches(rank: int) -> list[dict[str, Any]]:
    """Three batches of 4 clips; rank 1's second lost all its videos (what the loader hands over then)."""
    generator = torch.Generator().manual_seed(rank)
    made = [{"video": torch.randn(4, 3, 2, 8, 8, generator=generator), "label": torch.tensor([0, 1, 0, 1]),
             "bad": [], "fallback": []} for _ in range(3)]
    if rank == 1:
        made[1] = {"video": torch.empty(0, 3, 2, 8, 8), "label": torch.zeros(0, dtype=torch.long),
                   "bad": [("lost.mp4", "missing file")] * 4, "fallback": []}
    return made


def worker(ctx: DistContext, cfg: Config) -> None:
    torch.manual_seed(0)
    norm = nn.SyncBatchNorm(4) if ctx.device.type == "cuda" else CpuSyncBatchNorm(4)  # torch's on GPUs (test_gpu)
    model = nn.Sequential(nn.Conv3d(3, 4, 1), norm, nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                          nn.Linear(4, 2)).to(ctx.device)
    ddp = wrap_ddp(model, ctx, cfg)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    state = TrainState(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                       torch.amp.GradScaler("cpu", enabled=False))
    out = run_dir(cfg)
    reporter = Reporter(ctx, out, out / "tb", 1, 3, writes_metrics=False)
    # SYNC_BN as train.py would have it (its conversion needs GPUs: launch's runtime check refuses it here).
    train = cfg.CONFIG.model_copy(update={"TRAIN": cfg.CONFIG.TRAIN.model_copy(update={"SYNC_BN": True})})
    group = dist.distributed_c10d._get_default_group()
    issued: list[int] = []
    metrics = train_one_epoch(ddp, batches(ctx.rank), state, ctx, cfg.model_copy(update={"CONFIG": train}), 0,
                              reporter, EpochTally.start(ctx.device),
                              lambda *_: issued.append(group._get_sequence_number_for_group()))
    (out / f"rank{ctx.rank}.json").write_text(json.dumps({
        "collectives": issued, "train_clips": metrics["train_clips"],
        "weights": [p.detach().flatten().tolist() for p in model.parameters()]}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config-file", required=True)
    launch(worker, load_config(parser.parse_args().config_file))


if __name__ == "__main__":
    main()
