"""The model a config describes: built by name with its dropout, then readied for training as CONFIG.MODEL says.

Training controls (GluonCV's keys, the meanings its model docstrings give them):

- ``BN_EVAL``: every BatchNorm normalises with its running statistics and never updates them ("set BN layers to
  eval mode, namely, freeze running stats"); weight and bias still train.
- ``BN_FROZEN``: every BatchNorm is frozen, statistics and weight and bias ("freeze weight and bias of BN layers").
- ``PARTIAL_BN``: TSN's partial BN, every BatchNorm but the first one (in module order) frozen ("freeze all batch
  normalization layers during training except the first one").
- ``FREEZE_BACKBONE``: only the classifier head trains; every BatchNorm is frozen too, so the features stay those of
  the loaded weights.
- ``ATTENTIVE_PROBE`` (V-JEPA 2): its attentive probe (pooler and classifier) trains over the frozen encoder, which
  stays in eval mode (:mod:`trainer.models.hf_video`).

A frozen BatchNorm becomes a ``FrozenStatsBatchNorm`` with the same tensors under the same names, so checkpoints
load into the plain model and back; it is not a ``_BatchNorm``, so SyncBatchNorm conversion and precise BN leave it
alone. An unknown model name or an option the model does not take is a ConfigError naming the key.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase

from trainer.config import Config, ConfigError
from trainer.models import build_model, list_models


class FrozenStatsBatchNorm(_NormBase):
    """A BatchNorm that always normalises with its running statistics and never changes them, in train mode too;
    ``train_affine`` says whether its weight and bias still learn."""

    def __init__(self, bn: _BatchNorm, train_affine: bool) -> None:
        super().__init__(bn.num_features, bn.eps, bn.momentum, bn.affine, track_running_stats=True,
                         device=bn.running_mean.device, dtype=bn.running_mean.dtype)
        self.load_state_dict(bn.state_dict())
        for param in self.parameters():
            param.requires_grad_(train_affine)

    def _check_input_dim(self, input: Tensor) -> None:
        pass  # whatever the BatchNorm it replaces accepted

    def forward(self, input: Tensor) -> Tensor:
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


def build_model_from_config(cfg: Config) -> nn.Module:
    """CONFIG.MODEL.NAME with a NUM_CLASSES head and, when set, DROPOUT_RATE and DROP_PATH_RATE (the config refuses
    the latter for a model without it); weights as the builder initialises."""
    model_cfg, num_classes = cfg.CONFIG.MODEL, cfg.CONFIG.DATA.NUM_CLASSES
    if model_cfg.NAME.lower() not in list_models():
        try:
            build_model(model_cfg.NAME, num_classes)  # raises with the nearest registered names
        except ValueError as exc:
            raise ConfigError(f"CONFIG.MODEL.NAME: {exc}") from None
    options: dict[str, Any] = {} if model_cfg.DROPOUT_RATE is None else {"dropout": model_cfg.DROPOUT_RATE}
    options.update(model_cfg.HF_CONFIG)  # the config refuses it for the zoo's models
    if model_cfg.DROP_PATH_RATE > 0:
        options["drop_path_rate"] = model_cfg.DROP_PATH_RATE  # transformers' config key
    try:
        model = build_model(model_cfg.NAME, num_classes, **options)
    except TypeError as exc:
        if model_cfg.HF_CONFIG and "not in transformers'" in str(exc):
            raise ConfigError(f"CONFIG.MODEL.HF_CONFIG: {exc}") from None
        if "dropout" not in str(exc):
            raise
        raise ConfigError(
            f"CONFIG.MODEL.DROPOUT_RATE: model {model_cfg.NAME} has no dropout setting; remove DROPOUT_RATE"
        ) from None
    check_takes_clip(model, cfg)
    return model


def check_takes_clip(model: nn.Module, cfg: Config, crop_key: str = "CROP_SIZE") -> None:
    """ConfigError naming the DATA keys of a clip ``model`` cannot take (a transformer whose position embeddings fix
    its frames and size: ``takes_clip()``); models without ``takes_clip`` take any clip. ``crop_key``: the crop in
    question, CROP_SIZE (training, validation) or TEST_CROP_SIZE (multi-view test)."""
    takes = getattr(model, "takes_clip", None)
    clip = takes() if takes is not None else None
    data = cfg.CONFIG.DATA
    if clip is None:
        return
    wrong = [f"{key} {getattr(data, key)}" for key, value in zip(("CLIP_LEN", crop_key), clip, strict=True)
             if getattr(data, key) != value]
    if wrong:
        raise ConfigError(f"CONFIG.DATA.{', '.join(wrong)}: model {cfg.CONFIG.MODEL.NAME} takes only clips of "
                          f"CLIP_LEN: {clip[0]}, {crop_key}: {clip[1]} (its position embeddings are fixed)")


def head_parameter_names(model: nn.Module, num_classes: int) -> list[str]:
    """The classifier head: the parameters of the last Linear or Conv module with ``num_classes`` outputs."""
    head = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.modules.conv._ConvNd) and module.weight.shape[0] == num_classes:
            head = name, module
    if head is None:
        name = type(model).__name__
        raise ConfigError(f"CONFIG.MODEL.NAME: found no classifier with {num_classes} outputs in {name}")
    prefix, module = head
    return [f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters()]


def _frozen_batchnorms(model: nn.Module, cfg: Config) -> tuple[list[str], bool, str | None]:
    """(names of the BatchNorms to freeze, whether their weight and bias still train, the key that asks for it)."""
    model_cfg = cfg.CONFIG.MODEL
    names = [name for name, module in model.named_modules() if isinstance(module, _BatchNorm)]
    if model_cfg.FREEZE_BACKBONE:
        return names, False, "FREEZE_BACKBONE"
    if model_cfg.BN_FROZEN:
        return names, False, "BN_FROZEN"
    if model_cfg.BN_EVAL:
        return names, True, "BN_EVAL"
    if model_cfg.PARTIAL_BN:
        return names[1:], False, "PARTIAL_BN"
    return [], True, None


def _replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def apply_training_controls(model: nn.Module, cfg: Config) -> str:
    """Freeze what CONFIG.MODEL asks (BatchNorm policy, backbone) in place; returns a one-line summary for the log."""
    names, train_affine, key = _frozen_batchnorms(model, cfg)
    if key is not None and key != "FREEZE_BACKBONE" and not names:
        raise ConfigError(f"CONFIG.MODEL.{key}: model {cfg.CONFIG.MODEL.NAME} has no BatchNorm layers to freeze")
    for name in names:
        _replace_module(model, name, FrozenStatsBatchNorm(model.get_submodule(name), train_affine))
    if cfg.CONFIG.MODEL.FREEZE_BACKBONE:
        head = set(head_parameter_names(model, cfg.CONFIG.DATA.NUM_CLASSES))
        for name, param in model.named_parameters():
            param.requires_grad_(name in head)
    if cfg.CONFIG.MODEL.ATTENTIVE_PROBE:
        model.probe_only()  # V-JEPA 2's (trainer.models.hf_video); the config refuses the key for other models
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    frozen = f"{len(names)} BatchNorm layer(s) frozen by MODEL.{key}" if key else "no BatchNorm frozen"
    if cfg.CONFIG.MODEL.ATTENTIVE_PROBE:
        frozen += "; the encoder frozen for the attentive probe (MODEL.ATTENTIVE_PROBE)"
    return f"{frozen}; {trainable:,} of {total:,} parameters train"
