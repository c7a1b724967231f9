"""Optimizer and learning-rate schedule, each as CONFIG.RECIPE's source defines it.

| | gluoncv (GluonCV ``train_ddp_pytorch.py``) | pyslowfast (PySlowFast ``lr_policy.py``, ``optimizer.py``) |
|---|---|---|
| LR changes | once per epoch | every iteration (fractional epoch) |
| warmup | 0 -> LR over WARMUP_EPOCHS (epoch e at LR * e / W) | WARMUP_START_LR -> the policy's LR at WARMUP_EPOCHS |
| cosine | over the EPOCH_NUM - WARMUP_EPOCHS epochs after it | over all EPOCH_NUM epochs |
| weight decay | every parameter | every parameter but BatchNorm's (BN.WEIGHT_DECAY 0) |

The schedule is a pure function of the optimizer step, wrapped in a ``LambdaLR`` that is stepped once per optimizer
step; its state (the step counter) is saved in checkpoints, so a resumed run continues exactly where an
uninterrupted one would be. The classifier head's parameter group runs at LR x TRAIN.HEAD_LR_MULT throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from trainer.config import Config, TrainConfig
from trainer.model_setup import head_parameter_names


def effective_lr(cfg: Config, global_batch: int) -> float:
    """Base LR, linearly scaled by global batch / BASE_BATCH_SIZE when SCALE_LR is on (Goyal et al.)."""
    train = cfg.CONFIG.TRAIN
    if train.SCALE_LR:
        return train.LR * global_batch / train.BASE_BATCH_SIZE
    return train.LR


def param_groups(cfg: Config, model: nn.Module, lr: float) -> list[dict]:
    """Trainable parameters grouped by (weight decay, learning rate): the recipe's decay rule, the head's LR."""
    train = cfg.CONFIG.TRAIN
    head = set(head_parameter_names(model, cfg.CONFIG.DATA.NUM_CLASSES)) if train.HEAD_LR_MULT != 1 else set()
    decay_norms = cfg.CONFIG.RECIPE == "gluoncv"
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            name = f"{module_name}.{param_name}" if module_name else param_name
            decay = decay_norms or not isinstance(module, _NormBase)
            groups.setdefault((decay, name in head), []).append(param)
    return [
        {"params": params, "weight_decay": train.W_DECAY if decay else 0.0,
         "lr": lr * train.HEAD_LR_MULT if is_head else lr}
        for (decay, is_head), params in sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1]))
    ]


def build_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    train = cfg.CONFIG.TRAIN
    groups = param_groups(cfg, model, lr)
    if train.OPTIMIZER == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, betas=(train.MOMENTUM, train.ADAM_BETA2), eps=train.ADAM_EPS)
    return torch.optim.SGD(groups, lr=lr, momentum=train.MOMENTUM, nesterov=train.NESTEROV)


def _gluoncv_factor(train: TrainConfig, steps_per_epoch: int) -> Callable[[int], float]:
    """GluonCV steps its scheduler once per epoch. GradualWarmupScheduler(multiplier=1) gives epoch e <= W the LR
    LR * e / W (epoch 0 trains at 0); then the after-scheduler starts at its own step 0 in epoch W + 1:
    CosineAnnealingLR(T_max = EPOCH_NUM - WARMUP_EPOCHS) or MultiStepLR(LR_MILESTONE, STEP)."""
    warmup = train.WARMUP_EPOCHS if train.USE_WARMUP else 0
    span = train.EPOCH_NUM - train.WARMUP_EPOCHS

    def factor(step: int) -> float:
        epoch = step // steps_per_epoch
        if train.USE_WARMUP and epoch <= warmup:
            return epoch / warmup
        after = epoch - warmup - 1 if train.USE_WARMUP else epoch
        if train.LR_POLICY == "Cosine":
            return 0.5 * (1.0 + math.cos(math.pi * after / span))
        return train.STEP ** sum(after >= milestone for milestone in train.LR_MILESTONE)

    return factor


def _pyslowfast_factor(train: TrainConfig, steps_per_epoch: int) -> Callable[[int], float]:
    """PySlowFast's get_lr_at_epoch at the fractional epoch: linear warmup from WARMUP_START_LR to where the policy
    is at WARMUP_EPOCHS, cosine over all EPOCH_NUM epochs (to 0), Step at LR_MILESTONE epochs. WARMUP_START_LR
    scales with LR under SCALE_LR, as PySlowFast scales both with the number of shards."""
    total = max(1, train.EPOCH_NUM * steps_per_epoch)
    warmup = train.WARMUP_EPOCHS * steps_per_epoch if train.USE_WARMUP else 0
    start = train.WARMUP_START_LR / train.LR

    def policy(step: int) -> float:
        if train.LR_POLICY == "Cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))
        epoch = step / steps_per_epoch
        return train.STEP ** sum(epoch >= milestone for milestone in train.LR_MILESTONE)

    def factor(step: int) -> float:
        if step < warmup:
            alpha = step / warmup
            return start + alpha * (policy(warmup) - start)
        return policy(step)

    return factor


def lr_factor(cfg: Config, steps_per_epoch: int) -> Callable[[int], float]:
    """Multiplier of each group's LR at a given optimizer step, as CONFIG.RECIPE's source computes it."""
    if cfg.CONFIG.RECIPE == "gluoncv":
        return _gluoncv_factor(cfg.CONFIG.TRAIN, steps_per_epoch)
    return _pyslowfast_factor(cfg.CONFIG.TRAIN, steps_per_epoch)


def build_scheduler(
    cfg: Config, optimizer: torch.optim.Optimizer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps_per_epoch))
