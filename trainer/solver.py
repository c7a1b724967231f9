"""Optimizer and learning-rate schedule.

The schedule is a pure function of the optimizer step, wrapped in a ``LambdaLR`` that is stepped once per optimizer
step. Its state (the step counter) is saved in checkpoints, so a resumed run continues exactly where an
uninterrupted one would be.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from trainer.config import Config


def effective_lr(cfg: Config, global_batch: int) -> float:
    """Base LR, linearly scaled by global batch / BASE_BATCH_SIZE when SCALE_LR is on (Goyal et al.)."""
    train = cfg.CONFIG.TRAIN
    if train.SCALE_LR:
        return train.LR * global_batch / train.BASE_BATCH_SIZE
    return train.LR


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    # No weight decay on norm layers and biases: the usual recipe for ResNets and transformers alike.
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    train = cfg.CONFIG.TRAIN
    groups = _param_groups(model, train.W_DECAY)
    if train.OPTIMIZER == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, betas=(train.MOMENTUM, train.ADAM_BETA2), eps=train.ADAM_EPS)
    return torch.optim.SGD(groups, lr=lr, momentum=train.MOMENTUM, nesterov=train.NESTEROV)


def lr_factor(cfg: Config, base_lr: float, steps_per_epoch: int) -> Callable[[int], float]:
    """Multiplier of ``base_lr`` at a given optimizer step: linear warmup, then step or cosine decay."""
    train = cfg.CONFIG.TRAIN
    total = max(1, train.EPOCH_NUM * steps_per_epoch)
    warmup = train.WARMUP_EPOCHS * steps_per_epoch if train.USE_WARMUP else 0
    start = train.WARMUP_START_LR / base_lr if base_lr > 0 else 0.0

    def policy(step: int) -> float:
        if train.LR_POLICY.lower() == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
        epoch = step / steps_per_epoch
        return train.STEP ** sum(epoch >= milestone for milestone in train.LR_MILESTONE)

    def factor(step: int) -> float:
        if step < warmup:
            # Ramp from WARMUP_START_LR to where the policy will be at the end of the warmup (PySlowFast).
            alpha = step / warmup
            return start + alpha * (policy(warmup) - start)
        return policy(step)

    return factor


def build_scheduler(
    cfg: Config, optimizer: torch.optim.Optimizer, base_lr: float, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, base_lr, steps_per_epoch))
