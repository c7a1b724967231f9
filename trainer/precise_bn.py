"""Precise BatchNorm statistics (PySlowFast's BN.USE_PRECISE_STATS, after fvcore's update_bn_stats).

Training leaves each BatchNorm with an exponential moving average of its batches' statistics, weighted towards the
last ones. Before a validation or checkpoint, TRAIN.PRECISE_BN replaces them with the plain average over up to
PRECISE_BN_BATCHES training batches, computed with the current weights. Under DDP every rank averages its own
batches, then the ranks' sums are added and divided by the total batch count, so every rank ends with the same
statistics. Frozen BatchNorms (``model_setup.FrozenStatsBatchNorm``) are not ``_BatchNorm`` and keep theirs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from trainer.accel import autocast, clip_normalizer
from trainer.config import Config
from trainer.distributed import DistContext, all_reduce_sum, any_rank


def _live_batchnorms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


@torch.no_grad()
def update_precise_bn(model: nn.Module, loader: Any, ctx: DistContext, cfg: Config) -> int:
    """Set every live BatchNorm's running mean and variance to the average over up to PRECISE_BN_BATCHES batches
    of ``loader`` per rank, averaged over the ranks; returns the number of batches used in all."""
    batchnorms = _live_batchnorms(model)
    if not batchnorms:
        return 0
    limit = cfg.CONFIG.TRAIN.PRECISE_BN_BATCHES
    momenta = [bn.momentum for bn in batchnorms]
    sums = torch.zeros(sum(2 * bn.num_features for bn in batchnorms) + 1, dtype=torch.float64, device=ctx.device)
    was_training = model.training
    normalizer = clip_normalizer(cfg, ctx)
    model.train()
    for bn in batchnorms:
        bn.momentum = 1.0  # a forward sets the running statistics to exactly this batch's
    try:
        for i, batch in enumerate(loader):
            if i == limit:
                break
            # Every rank runs the same forwards (SyncBatchNorm gathers in each): a batch whose videos were all bad on
            # any rank is skipped on all of them.
            if any_rank(len(batch["label"]) == 0, ctx):
                continue
            with autocast(ctx, cfg.CONFIG.TRAIN.AMP):
                model(normalizer(batch["video"], batch.get("crops")))
            stats = [t.double() for bn in batchnorms for t in (bn.running_mean, bn.running_var)]
            sums += torch.cat([*stats, torch.ones(1, dtype=torch.float64, device=ctx.device)])
    finally:
        for bn, momentum in zip(batchnorms, momenta, strict=True):
            bn.momentum = momentum
        model.train(was_training)
    all_reduce_sum(sums)
    count = int(sums[-1].item())
    if count:
        averages = iter((sums[:-1] / count).split([bn.num_features for bn in batchnorms for _ in range(2)]))
        for bn in batchnorms:
            bn.running_mean.copy_(next(averages))
            bn.running_var.copy_(next(averages))
    return count
