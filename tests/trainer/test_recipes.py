"""Configs mean what they say: GluonCV's shipped configs keep GluonCV's schedule and have every key honoured or
refused; PySlowFast-style recipes keep PySlowFast's; fine-tuning controls (BatchNorm policies, frozen backbone, head
learning rate, dropout) do what GluonCV's keys promise."""

from __future__ import annotations

import bisect
import functools
import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from tests.ports import free_port
from tests.trainer.test_config import leaves, typed
from trainer.config import Config, ConfigError, config_to_dict, load_config, parse_yaml
from trainer.config.messages import _schema_keys
from trainer.config.section import _Section
from trainer.distributed import launch, single_process_context
from trainer.model_setup import (
    FrozenStatsBatchNorm,
    apply_training_controls,
    build_model_from_config,
    head_parameter_names,
)
from trainer.models import build_model
from trainer.precise_bn import update_precise_bn
from trainer.reporting import read_metrics, setup_logging
from trainer.solver import build_optimizer, build_scheduler
from trainer.test import test_worker as multiview_test_worker
from trainer.train import train_worker

REPO = Path(__file__).resolve().parents[2]
GLUONCV = {path.stem: path for path in sorted((REPO / "configs" / "gluoncv").glob("*.yaml"))}
TINY_MODEL = "i3d_tiny"  # stands in for each config's model: what is tested here does not depend on it


# ---------------------------------------------------------------------------------------------------------------------
# GluonCV's schedule, from its own code


def gluoncv_lr(train: dict[str, Any], epoch: int) -> float:
    """The LR GluonCV trains epoch ``epoch`` (from 0) with, per dmlc/gluon-cv scripts/action-recognition/
    train_ddp_pytorch.py: SGD at LR; CosineAnnealingLR(T_max=EPOCH_NUM - WARMUP_EPOCHS, eta_min=0) or
    MultiStepLR(LR_MILESTONE, gamma=STEP); with USE_WARMUP wrapped in gluoncv/torch/utils/lr_policy.py
    GradualWarmupScheduler(multiplier=1.0, total_epoch=WARMUP_EPOCHS); one scheduler.step() after each epoch.

    GradualWarmupScheduler.get_lr at last_epoch t <= total_epoch is base_lr * t / total_epoch; past it, it hands
    over to the after-scheduler, first read at its own last_epoch 0 and stepped once per epoch after that.
    """
    lr = train["LR"]
    if train.get("USE_WARMUP", False):
        warmup = train["WARMUP_EPOCHS"]
        if epoch <= warmup:
            return lr * epoch / warmup
        after = epoch - warmup - 1
    else:
        after = epoch
    if train["LR_POLICY"] == "Cosine":
        t_max = train["EPOCH_NUM"] - train.get("WARMUP_EPOCHS", 0)
        return lr * (1 + math.cos(math.pi * after / t_max)) / 2  # CosineAnnealingLR's closed form
    return lr * train.get("STEP", 0.1) ** bisect.bisect_right(train.get("LR_MILESTONE", [40, 80]), after)


@pytest.mark.parametrize("name", sorted(GLUONCV))
def test_gluoncv_configs_train_with_gluoncvs_learning_rate_and_weight_decay(name: str) -> None:
    cfg = load_config(GLUONCV[name], ["CONFIG.MODEL.NAME", TINY_MODEL])
    train = parse_yaml(GLUONCV[name].read_text())["CONFIG"]["TRAIN"]
    assert cfg.CONFIG.RECIPE == "gluoncv"
    model = build_model_from_config(cfg)
    steps_per_epoch = 3
    optimizer = build_optimizer(cfg, model, cfg.CONFIG.TRAIN.LR)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
    # GluonCV's torch.optim.SGD(model.parameters(), weight_decay=W_DECAY): every parameter decays, BatchNorm too.
    assert {g["weight_decay"] for g in optimizer.param_groups} == {train["W_DECAY"]}
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    for step in range(train["EPOCH_NUM"] * steps_per_epoch):
        expected = gluoncv_lr(train, step // steps_per_epoch)
        for group in optimizer.param_groups:
            assert group["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15), (step, expected)
        optimizer.step()  # no gradients: nothing moves, only the schedule
        scheduler.step()


# ---------------------------------------------------------------------------------------------------------------------
# Every key of GluonCV's shipped configs is used by a real run, or any other value of it is refused by name

# Computed by the launcher and never read from the file (GluonCV's spawn_workers overwrites them the same way).
LAUNCH_COMPUTED = {"DDP_CONFIG.GPU_WORLD_SIZE", "DDP_CONFIG.GPU_WORLD_RANK", "DDP_CONFIG.GPU"}


@contextmanager
def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Every dotted config key the code reads (attribute access on a config section) while the block runs."""
    prefixes = {Config: ""} | {sub: f"{key}." for key, sub in _schema_keys(Config).items() if sub is not None}
    seen: set[str] = set()

    def record(self: _Section, name: str) -> Any:
        cls = object.__getattribute__(self, "__class__")
        if name in cls.model_fields:
            seen.add(prefixes[cls] + name)
        return object.__getattribute__(self, name)

    monkeypatch.setattr(_Section, "__getattribute__", record)
    yield seen
    monkeypatch.undo()


def other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, list):
        return [*value, 1]
    return f"{value}x"


@pytest.mark.parametrize("name", sorted(GLUONCV))
def test_every_key_of_gluoncvs_configs_is_used_or_refused(
    name: str, synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = leaves(parse_yaml(GLUONCV[name].read_text()))
    # The same keys, their values made small and local: a tiny model on the synthetic videos, 2 epochs, gloo.
    small = {
        "DDP_CONFIG.DIST_URL": f"tcp://127.0.0.1:{free_port()}", "DDP_CONFIG.WOLRD_URLS": ["127.0.0.1"],
        "DDP_CONFIG.DIST_BACKEND": "gloo", "CONFIG.MODEL.NAME": TINY_MODEL, "CONFIG.MODEL.PRETRAINED": False,
        "CONFIG.TRAIN.EPOCH_NUM": 2, "CONFIG.TRAIN.BATCH_SIZE": 12, "CONFIG.VAL.BATCH_SIZE": 12,
        "CONFIG.DATA.NUM_CLASSES": 2, "CONFIG.DATA.CLIP_LEN": 8, "CONFIG.DATA.FRAME_RATE": 1,
        "CONFIG.DATA.CROP_SIZE": 32, "CONFIG.DATA.SHORT_SIDE_SIZE": 32, "CONFIG.DATA.NEW_HEIGHT": 32,
        "CONFIG.DATA.NEW_WIDTH": 32, "CONFIG.DATA.TEST_NUM_SEGMENT": 2, "CONFIG.DATA.TEST_NUM_CROP": 1,
        "CONFIG.LOG.BASE_PATH": str(tmp_path / "run"), "CONFIG.LOG.EXP_NAME": "",
        "CONFIG.LOG.EVAL_DIR": str(tmp_path / "eval"),
        "CONFIG.TRAIN.PRECISE_BN": True,  # not in GluonCV's files: runs the precise-BN path in a real epoch loop
        **{f"CONFIG.DATA.{k}": v for k, v in synthetic_dataset.items() if k != "CLASS_INDEX"},
    }  # fmt: skip
    if written.get("CONFIG.TRAIN.USE_WARMUP"):
        small["CONFIG.TRAIN.WARMUP_EPOCHS"] = 1
    overrides = [str(item) for key, value in small.items() for item in (key, value)]
    cfg = load_config(GLUONCV[name], overrides)
    loaded = leaves(config_to_dict(cfg))
    for key, value in written.items():
        if key not in small:
            assert typed(loaded[key]) == typed(value), key  # value and type as written

    with recorded_reads(monkeypatch) as seen:
        launch(train_worker, cfg)
        launch(functools.partial(multiview_test_worker, ckpt=None), cfg)
    unread = set(written) - seen - LAUNCH_COMPUTED
    assert "CONFIG.TRAIN.ADAM_EPS" not in seen  # the recorder sees reads, not dumps: SGD never reads Adam's eps
    for key in sorted(unread):
        with pytest.raises(ConfigError, match=rf"{key.replace('.', '[.]')}: "):
            load_config(GLUONCV[name], [*overrides, key, str(other_value(written[key]))])

    epochs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = {**parse_yaml(GLUONCV[name].read_text())["CONFIG"]["TRAIN"], "EPOCH_NUM": 2}
    train |= {"WARMUP_EPOCHS": 1} if train.get("USE_WARMUP") else {}
    assert [e["lr"] for e in epochs] == pytest.approx([gluoncv_lr(train, e) for e in range(2)])
    log_text = (tmp_path / "run" / "log.txt").read_text()
    assert "precise BatchNorm statistics from 2 batches over 1 rank(s)" in log_text
    assert log_text.count(" iteration ") == 4 // cfg.CONFIG.LOG.DISPLAY_FREQ  # 2 epochs x 2 steps, GluonCV's display
    tested = json.loads((tmp_path / "eval" / "test_results.json").read_text())  # LOG.EVAL_DIR, not the run dir
    assert tested["videos"] == 12 and not (tmp_path / "run" / "test_results.json").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Fine-tuning controls


def tiny_cfg(model: str = "slowfast_tiny", **model_keys: Any) -> Config:
    from trainer.config import validate_config

    return validate_config({"CONFIG": {"DATA": {"NUM_CLASSES": 3}, "MODEL": {"NAME": model, **model_keys}}})


def batchnorms(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm | FrozenStatsBatchNorm)}


def one_sgd_step(model: nn.Module, cfg: Config) -> dict[str, torch.Tensor]:
    """State before one training step on a random clip (weights and BatchNorm buffers)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    optimizer = build_optimizer(cfg, model, 0.5)
    model(torch.randn(2, 3, 8, 16, 16) * 3 + 1).sum().backward()
    optimizer.step()
    return before


@pytest.mark.parametrize(
    ("key", "affine_moves", "first_bn_live"),
    [("BN_EVAL", True, False), ("BN_FROZEN", False, False), ("PARTIAL_BN", False, True),
     ("FREEZE_BACKBONE", False, False)],
)
def test_batchnorm_policies_do_what_gluoncv_says(key: str, affine_moves: bool, first_bn_live: bool) -> None:
    torch.manual_seed(0)
    cfg = tiny_cfg(**{key: True})
    model = build_model_from_config(cfg)
    for bn in batchnorms(model).values():  # as trained weights would be (the zero-init final BNs block gradients)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.uniform_(bn.bias, -0.5, 0.5)
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    summary = apply_training_controls(model, cfg)
    assert f"MODEL.{key}" in summary
    before = one_sgd_step(model, cfg)
    after = model.state_dict()
    assert after.keys() == plain.keys()  # same names: checkpoints load into the plain model
    first, *rest = batchnorms(model)
    for name in rest:
        moved = {t: not torch.equal(before[f"{name}.{t}"], after[f"{name}.{t}"]) for t in
                 ("running_mean", "weight", "bias")}
        assert not moved["running_mean"], name  # frozen statistics, in train mode too
        assert moved["weight"] is affine_moves and moved["bias"] is affine_moves, name
    first_moved = not torch.equal(before[f"{first}.running_mean"], after[f"{first}.running_mean"])
    assert first_moved is first_bn_live
    head = head_parameter_names(model, 3)
    assert head == ["head.fc.weight", "head.fc.bias"]
    convs = [k for k, v in after.items() if v.ndim == 5]
    assert all(not torch.equal(before[k], after[k]) for k in head)  # the head always trains
    assert any(torch.equal(before[k], after[k]) for k in convs) is (key == "FREEZE_BACKBONE")


def test_head_lr_multiplier_and_recipe_weight_decay_groups() -> None:
    from trainer.config import validate_config

    for recipe, norm_decay in (("gluoncv", 1e-4), ("pyslowfast", 0.0)):
        cfg = validate_config({"CONFIG": {"RECIPE": recipe, "DATA": {"NUM_CLASSES": 3},
                                          "TRAIN": {"HEAD_LR_MULT": 10.0}, "MODEL": {"NAME": "i3d_tiny"}}})
        model = build_model_from_config(cfg)
        optimizer = build_optimizer(cfg, model, 0.1)
        by_param = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        named = dict(model.named_parameters())
        assert by_param[id(named["head.fc.weight"])]["lr"] == pytest.approx(1.0)
        assert by_param[id(named["head.fc.bias"])]["weight_decay"] == 1e-4  # PySlowFast decays biases too
        assert by_param[id(named["stem.conv.weight"])]["lr"] == pytest.approx(0.1)
        assert by_param[id(named["stem.bn.weight"])]["weight_decay"] == norm_decay


def test_dropout_rate_reaches_the_model_and_bad_model_options_name_their_key() -> None:
    model = build_model_from_config(tiny_cfg(DROPOUT_RATE=0.2))
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.2]
    with pytest.raises(ConfigError, match=r"CONFIG\.MODEL\.DROPOUT_RATE: model r3d_18 has no dropout setting"):
        build_model_from_config(tiny_cfg("r3d_18", DROPOUT_RATE=0.2))
    with pytest.raises(ConfigError, match=r"CONFIG\.MODEL\.NAME: unknown model 'slowfast_tinny'.*slowfast_tiny"):
        build_model_from_config(tiny_cfg("slowfast_tinny"))
    with pytest.raises(ConfigError, match=r"CONFIG\.MODEL\.BN_EVAL: model swin3d_t has no BatchNorm"):
        model = build_model_from_config(tiny_cfg("swin3d_t", BN_EVAL=True))
        apply_training_controls(model, tiny_cfg("swin3d_t", BN_EVAL=True))


def test_precise_bn_leaves_frozen_batchnorms_alone() -> None:
    cfg = tiny_cfg()
    model = nn.Sequential(nn.BatchNorm3d(3), FrozenStatsBatchNorm(nn.BatchNorm3d(3), train_affine=False))
    clips = torch.randn(4, 3, 2, 4, 4) + 2
    used = update_precise_bn(model, [{"video": clips, "label": torch.zeros(4)}] * 2, single_process_context(cfg), cfg)
    assert used == 2
    torch.testing.assert_close(model[0].running_mean, clips.mean(dim=(0, 2, 3, 4)))
    assert model[1].running_mean.eq(0).all() and model[1].running_var.eq(1).all()


# ---------------------------------------------------------------------------------------------------------------------
# PySlowFast's recipe: configs/slowfast.yaml and the fine-tuning recipe

# facebookresearch/SlowFast configs/Kinetics/SLOWFAST_8x8_R50.yaml (with slowfast/config/defaults.py for NESTEROV and
# BN.WEIGHT_DECAY), as our keys: the global batch is 8 GPUs x BATCH_SIZE, at which LR applies unscaled.
PYSLOWFAST_SLOWFAST_8X8_R50 = {
    "CONFIG.TRAIN.LR": 0.1, "CONFIG.TRAIN.EPOCH_NUM": 196, "CONFIG.TRAIN.WARMUP_EPOCHS": 34,
    "CONFIG.TRAIN.WARMUP_START_LR": 0.01, "CONFIG.TRAIN.W_DECAY": 1e-4, "CONFIG.TRAIN.MOMENTUM": 0.9,
    "CONFIG.TRAIN.NESTEROV": True, "CONFIG.TRAIN.LR_POLICY": "Cosine", "CONFIG.TRAIN.PRECISE_BN": True,
    "CONFIG.TRAIN.PRECISE_BN_BATCHES": 200, "CONFIG.TRAIN.DROP_LAST": True, "CONFIG.TRAIN.BASE_BATCH_SIZE": 64,
    "CONFIG.VAL.FREQ": 10, "CONFIG.LOG.SAVE_FREQ": 1, "CONFIG.DATA.CLIP_LEN": 32, "CONFIG.DATA.FRAME_RATE": 2,
    "CONFIG.DATA.CROP_SIZE": 224, "CONFIG.DATA.TEST_CROP_SIZE": 256, "CONFIG.DATA.TEST_NUM_SEGMENT": 10,
    "CONFIG.DATA.TEST_NUM_CROP": 3, "CONFIG.MODEL.DROPOUT_RATE": 0.5, "CONFIG.DATA.NUM_CLASSES": 400,
}  # fmt: skip


def pyslowfast_lr(train: dict[str, Any], epoch: float) -> float:
    """slowfast/utils/lr_policy.py get_lr_at_epoch with lr_func_cosine (COSINE_END_LR 0, COSINE_AFTER_WARMUP False)."""
    def cosine(e: float) -> float:
        return train["LR"] * (math.cos(math.pi * e / train["EPOCH_NUM"]) + 1.0) * 0.5

    if epoch < train["WARMUP_EPOCHS"]:
        start, end = train["WARMUP_START_LR"], cosine(train["WARMUP_EPOCHS"])
        return epoch * (end - start) / train["WARMUP_EPOCHS"] + start
    return cosine(epoch)


def test_slowfast_yaml_is_pyslowfasts_slowfast_8x8_r50() -> None:
    cfg = load_config(REPO / "configs" / "slowfast.yaml", ["CONFIG.MODEL.NAME", TINY_MODEL])
    resolved = leaves(config_to_dict(cfg))
    for key, value in PYSLOWFAST_SLOWFAST_8X8_R50.items():
        assert typed(resolved[key]) == typed(value), key
    assert cfg.CONFIG.RECIPE == "pyslowfast" and cfg.CONFIG.DATA.SHORT_SIDE_SIZE * 1.25 == 320  # jitter 256-320
    assert 8 * cfg.CONFIG.TRAIN.BATCH_SIZE == 64  # PySlowFast's TRAIN.BATCH_SIZE over 8 GPUs
    model = build_model_from_config(cfg)
    optimizer = build_optimizer(cfg, model, cfg.CONFIG.TRAIN.LR)
    named = dict(model.named_parameters())
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert decay[id(named["stem.bn.weight"])] == 0.0 and decay[id(named["head.fc.bias"])] == 1e-4
    steps_per_epoch = 4
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
    train = {k.rsplit(".", 1)[-1]: v for k, v in resolved.items() if k.startswith("CONFIG.TRAIN.")}
    for step in range(196 * steps_per_epoch):
        expected = pyslowfast_lr(train, step / steps_per_epoch)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15), step
        optimizer.step()
        scheduler.step()


def test_finetune_recipe_keeps_loaded_batchnorm_and_trains_the_head_faster(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    torch.manual_seed(1)
    source = build_model("slowfast_tiny", 5)  # stands in for Kinetics weights: another head, trained statistics
    for bn in batchnorms(source).values():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    torch.save({"model": source.state_dict()}, tmp_path / "kinetics.pth")
    small = {
        "DDP_CONFIG.DISTRIBUTED": False, "CONFIG.MODEL.NAME": "slowfast_tiny", "CONFIG.MODEL.PRETRAINED": False,
        "CONFIG.MODEL.LOAD": True, "CONFIG.MODEL.PRETRAINED_PATH": str(tmp_path / "kinetics.pth"),
        "CONFIG.TRAIN.EPOCH_NUM": 2, "CONFIG.TRAIN.WARMUP_EPOCHS": 1, "CONFIG.TRAIN.BATCH_SIZE": 5,
        "CONFIG.VAL.BATCH_SIZE": 12, "CONFIG.DATA.CLIP_LEN": 8, "CONFIG.DATA.FRAME_RATE": 1,
        "CONFIG.DATA.CROP_SIZE": 32, "CONFIG.DATA.SHORT_SIDE_SIZE": 32, "CONFIG.DATA.NUM_WORKERS": 0,
        "CONFIG.DATA.RANDOM_FLIP": False, "CONFIG.LOG.BASE_PATH": str(tmp_path / "run"),
        **{f"CONFIG.DATA.{k}": v for k, v in synthetic_dataset.items()},
    }  # fmt: skip
    cfg = load_config(REPO / "configs" / "slowfast_finetune.yaml", [str(i) for kv in small.items() for i in kv])
    launch(train_worker, cfg)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "epoch_0002.pth", weights_only=False)
    tuned, loaded = saved["model"], source.state_dict()
    for name in batchnorms(source):  # statistics, weight and bias of every BatchNorm as loaded
        for tensor in ("running_mean", "running_var", "weight", "bias"):
            assert torch.equal(tuned[f"{name}.{tensor}"], loaded[f"{name}.{tensor}"]), f"{name}.{tensor}"
    assert tuned["head.fc.weight"].shape[0] == 2
    assert not torch.equal(tuned["slow_stem.conv.weight"], loaded["slow_stem.conv.weight"])  # the backbone tunes
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 2
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["step"] == 2 * 4  # 24 videos in batches of 5: DROP_LAST leaves 4 steps per epoch, not 5
    base, head = sorted({g["initial_lr"] for g in saved["optimizer"]["param_groups"]})
    assert head == pytest.approx(10 * base)


def test_log_level_decides_what_rank_0_writes(tmp_path: Path) -> None:
    ctx, log = single_process_context(tiny_cfg()), logging.getLogger("trainer")
    for level in ("WARNING", "DEBUG"):
        setup_logging(ctx, tmp_path / f"{level}.txt", level)
        log.debug("detail")
        log.info("progress")
        log.warning("trouble")
    warnings_only = (tmp_path / "WARNING.txt").read_text()
    assert warnings_only.count("\n") == 1 and "trouble" in warnings_only
    assert all(word in (tmp_path / "DEBUG.txt").read_text() for word in ("detail", "progress", "trouble"))
