"""Optimizer and learning-rate schedule, each as CONFIG.RECIPE's source defines it.

| | gluoncv (GluonCV ``train_ddp_pytorch.py``) | pyslowfast (PySlowFast ``lr_policy.py``, ``optimizer.py``) |
|---|---|---|
| LR changes | once per epoch | every iteration (fractional epoch) |
| warmup | 0 -> LR over WARMUP_EPOCHS (epoch e at LR * e / W) | WARMUP_START_LR -> the policy's LR at WARMUP_EPOCHS |
| cosine | over the EPOCH_NUM - WARMUP_EPOCHS epochs after it | over all EPOCH_NUM epochs |
| weight decay | every parameter | every parameter but BatchNorm's (BN.WEIGHT_DECAY 0) |

The schedule is a pure function of the optimizer step, wrapped in a ``LambdaLR`` that is stepped once per optimizer
step; its state (the step counter) is saved in checkpoints, so a resumed run continues exactly where an
uninterrupted one would be. The classifier head's parameter group runs at LR x TRAIN.HEAD_LR_MULT throughout, and
with TRAIN.LAYER_DECAY a ViT's layers at their depth's scale of it.

Epochs may differ in steps (multigrid's long cycle trains some epochs at larger batches): an ``EpochClock`` turns a
step into its (fractional) epoch, in which both recipes' schedules are defined, and a long-cycle stage multiplies
the LR by its batch factor (trainer/data/multigrid.py).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from trainer.config import Config, ConfigError, TrainConfig
from trainer.data.multigrid import MultigridSchedule
from trainer.model_setup import head_parameter_names


def effective_lr(cfg: Config, global_batch: int) -> float:
    """Base LR, linearly scaled by global batch / BASE_BATCH_SIZE when SCALE_LR is on (Goyal et al.)."""
    train = cfg.CONFIG.TRAIN
    if train.SCALE_LR:
        return train.LR * global_batch / train.BASE_BATCH_SIZE
    return train.LR


def param_groups(cfg: Config, model: nn.Module, lr: float) -> list[dict]:
    """Trainable parameters grouped by (weight decay, LR scale): the recipe's decay rule and ZERO_WD_1D_PARAM, the
    head's LR multiplier, the layer-wise LR decay. Each group's ``lr_scale`` is its LR over the schedule's."""
    train = cfg.CONFIG.TRAIN
    head = set(head_parameter_names(model, cfg.CONFIG.DATA.NUM_CLASSES)) if train.HEAD_LR_MULT != 1 else set()
    layer_scale = _layer_scale(cfg, model)
    groups: dict[tuple[bool, float], list[nn.Parameter]] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            name = f"{module_name}.{param_name}" if module_name else param_name
            scale = layer_scale(name) * (train.HEAD_LR_MULT if name in head else 1.0)
            groups.setdefault((_decays(cfg, module, param), scale), []).append(param)
    # Decayed groups first, and in each the unscaled one first: the order checkpoints of before the layer decay have.
    order = sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1] != 1.0, -item[0][1]))
    return [{"params": params, "weight_decay": train.W_DECAY if decay else 0.0, "lr": lr * scale, "lr_scale": scale}
            for (decay, scale), params in order]


# The layers whose weights are decayed under ZERO_WD_1D_PARAM; a parameter of any other module is a token or a
# position embedding (a ViT's cls_token, position_embeddings), which VideoMAE's no_weight_decay() exempts.
_WEIGHT_LAYERS = (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding)


def _decays(cfg: Config, module: nn.Module, param: nn.Parameter) -> bool:
    if cfg.CONFIG.RECIPE == "pyslowfast" and isinstance(module, _NormBase):
        return False
    return not (cfg.CONFIG.TRAIN.ZERO_WD_1D_PARAM and (param.ndim <= 1 or not isinstance(module, _WEIGHT_LAYERS)))


def _layer_scale(cfg: Config, model: nn.Module) -> Callable[[str], float]:
    """LR scale of a parameter by its depth in a ViT (TRAIN.LAYER_DECAY, BEiT's and VideoMAE's rule): decay^(L + 1 -
    depth), depth 0 the embeddings, L + 1 what follows the L encoder layers (scale 1)."""
    decay = cfg.CONFIG.TRAIN.LAYER_DECAY
    if decay == 1:
        return lambda name: 1.0
    vit_layer = getattr(model, "vit_layer", None)
    if vit_layer is None:
        raise ConfigError(f"CONFIG.TRAIN.LAYER_DECAY: model {cfg.CONFIG.MODEL.NAME} has no ViT encoder layers to "
                          "decay the LR by; remove it or set 1")
    depth = model.config.num_hidden_layers
    return lambda name: decay ** (depth + 1 - vit_layer(name))


def schedule_lr(optimizer: torch.optim.Optimizer) -> float:
    """The schedule's LR now (what logs and metrics report), whatever scale the first group has (layer decay); a
    checkpoint saved before groups had ``lr_scale`` restores groups whose first is unscaled."""
    group = optimizer.param_groups[0]
    return group["lr"] / group.get("lr_scale", 1.0)


def build_optimizer(cfg: Config, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    train = cfg.CONFIG.TRAIN
    groups = param_groups(cfg, model, lr)
    if train.OPTIMIZER == "AdamW":
        return torch.optim.AdamW(groups, lr=lr, betas=(train.MOMENTUM, train.ADAM_BETA2), eps=train.ADAM_EPS)
    return torch.optim.SGD(groups, lr=lr, momentum=train.MOMENTUM, nesterov=train.NESTEROV)


class EpochClock:
    """Where an optimizer step falls in the run: epoch e has steps_per_epoch[e] steps (past the last epoch, steps
    count on at the last epoch's rate)."""

    def __init__(self, steps_per_epoch: Sequence[int]) -> None:
        self.steps = [max(1, n) for n in steps_per_epoch]
        self.starts = list(itertools.accumulate(self.steps, initial=0))

    def epoch(self, step: int) -> int:
        """The 0-based epoch a step belongs to."""
        return min(bisect.bisect_right(self.starts, step) - 1, len(self.steps) - 1)

    def fractional(self, step: int) -> float:
        """Epochs done when ``step`` starts: its epoch plus the fraction of that epoch's steps before it."""
        epoch = self.epoch(step)
        return epoch + (step - self.starts[epoch]) / self.steps[epoch]


def _gluoncv_factor(train: TrainConfig, clock: EpochClock) -> Callable[[int], float]:
    """GluonCV steps its scheduler once per epoch. GradualWarmupScheduler(multiplier=1) gives epoch e <= W the LR
    LR * e / W (epoch 0 trains at 0); then the after-scheduler starts at its own step 0 in epoch W + 1:
    CosineAnnealingLR(T_max = EPOCH_NUM - WARMUP_EPOCHS) or MultiStepLR(LR_MILESTONE, STEP)."""
    warmup = train.WARMUP_EPOCHS if train.USE_WARMUP else 0
    span = train.EPOCH_NUM - train.WARMUP_EPOCHS

    def factor(step: int) -> float:
        epoch = clock.epoch(step)
        if train.USE_WARMUP and epoch <= warmup:
            return epoch / warmup
        after = epoch - warmup - 1 if train.USE_WARMUP else epoch
        if train.LR_POLICY == "Cosine":
            return 0.5 * (1.0 + math.cos(math.pi * after / span))
        return train.STEP ** sum(after >= milestone for milestone in train.LR_MILESTONE)

    return factor


def _pyslowfast_factor(train: TrainConfig, clock: EpochClock) -> Callable[[int], float]:
    """PySlowFast's get_lr_at_epoch at the fractional epoch: linear warmup from WARMUP_START_LR to where the policy
    is at WARMUP_EPOCHS, cosine over all EPOCH_NUM epochs (to 0), Step at LR_MILESTONE epochs. WARMUP_START_LR
    scales with LR under SCALE_LR, as PySlowFast scales both with the number of shards."""
    warmup = train.WARMUP_EPOCHS if train.USE_WARMUP else 0
    start = train.WARMUP_START_LR / train.LR

    def policy(epoch: float) -> float:
        if train.LR_POLICY == "Cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(epoch, train.EPOCH_NUM) / train.EPOCH_NUM))
        return train.STEP ** sum(epoch >= milestone for milestone in train.LR_MILESTONE)

    def factor(step: int) -> float:
        epoch = clock.fractional(step)
        if epoch < warmup:
            return start + epoch / warmup * (policy(warmup) - start)
        return policy(epoch)

    return factor


def lr_factor(cfg: Config, steps_per_epoch: int | Sequence[int]) -> Callable[[int], float]:
    """Multiplier of each group's LR at a given optimizer step, as CONFIG.RECIPE's source computes it, times the
    multigrid long cycle's batch factor. ``steps_per_epoch``: one count for every epoch, or each epoch's."""
    if isinstance(steps_per_epoch, int):
        steps_per_epoch = [steps_per_epoch] * cfg.CONFIG.TRAIN.EPOCH_NUM
    clock = EpochClock(steps_per_epoch)
    recipe = _gluoncv_factor if cfg.CONFIG.RECIPE == "gluoncv" else _pyslowfast_factor
    factor = recipe(cfg.CONFIG.TRAIN, clock)
    multigrid = MultigridSchedule.from_config(cfg)
    if multigrid is None or not multigrid.long_cycle:
        return factor
    return lambda step: factor(step) * multigrid.lr_scale(clock.epoch(step))


def build_scheduler(
    cfg: Config, optimizer: torch.optim.Optimizer, steps_per_epoch: int | Sequence[int]
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps_per_epoch))
