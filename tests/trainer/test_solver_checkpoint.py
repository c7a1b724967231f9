"""LR schedule and checkpoint files, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainer import checkpoint
from trainer.config import validate_config
from trainer.solver import build_optimizer, build_scheduler, effective_lr


def make_config(recipe: str = "auto", **train: object):
    return validate_config({"CONFIG": {"RECIPE": recipe, "TRAIN": train}})


def lrs(cfg, steps: int, steps_per_epoch: int = 10) -> list[float]:
    optimizer = build_optimizer(cfg, nn.Linear(2, 2), cfg.CONFIG.TRAIN.LR)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_warmup_ramps_linearly_into_the_step_policy() -> None:
    cfg = make_config(LR=0.1, LR_POLICY="Step", LR_MILESTONE=[3], STEP=0.1, USE_WARMUP=True, WARMUP_EPOCHS=2,
                      WARMUP_START_LR=0.01, EPOCH_NUM=5)
    values = lrs(cfg, 50)
    assert values[0] == pytest.approx(0.01)
    assert values[10] == pytest.approx(0.01 + 0.5 * (0.1 - 0.01))  # half way through the warmup
    assert values[20] == pytest.approx(0.1) and values[29] == pytest.approx(0.1)
    assert values[30] == pytest.approx(0.01)  # milestone at epoch 3


def test_pyslowfast_cosine_decays_to_zero_each_iteration_and_sgd_options_apply() -> None:
    cfg = make_config("pyslowfast", LR=0.2, LR_POLICY="Cosine", EPOCH_NUM=4, NESTEROV=True)
    values = lrs(cfg, 40)
    assert values[0] == pytest.approx(0.2) and values[20] == pytest.approx(0.1)
    assert values == sorted(values, reverse=True) and values[-1] < 0.001 and len(set(values)) == 40
    optimizer = build_optimizer(cfg, nn.Conv3d(1, 2, 1), 0.2)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["nesterov"]


def test_adamw_and_linear_lr_scaling() -> None:
    cfg = make_config(OPTIMIZER="AdamW", LR=0.001, SCALE_LR=True, BASE_BATCH_SIZE=64)
    assert effective_lr(cfg, 128) == pytest.approx(0.002)
    assert isinstance(build_optimizer(cfg, nn.Linear(2, 2), 0.002), torch.optim.AdamW)


def test_restored_scheduler_continues_the_same_schedule() -> None:
    cfg = make_config(LR=0.1, LR_POLICY="Cosine", EPOCH_NUM=3, USE_WARMUP=True, WARMUP_EPOCHS=1)
    full = lrs(cfg, 30)
    model = nn.Linear(2, 2)
    optimizer = build_optimizer(cfg, model, 0.1)
    scheduler = build_scheduler(cfg, optimizer, 10)
    for _ in range(13):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    optimizer2 = build_optimizer(cfg, model, 0.1)
    scheduler2 = build_scheduler(cfg, optimizer2, 10)
    scheduler2.load_state_dict(state)
    assert scheduler2.get_last_lr()[0] == pytest.approx(full[13])


def test_checkpoints_keep_last_k_plus_best(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        checkpoint.save_checkpoint({"epoch": epoch}, tmp_path, epoch, is_best=epoch == 2, keep_last=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["epoch_0004.pth", "epoch_0005.pth"]
    assert torch.load(tmp_path / "best.pth")["epoch"] == 2
    assert checkpoint.resolve_resume_path("auto", tmp_path) == tmp_path / "epoch_0005.pth"
    assert checkpoint.resolve_resume_path("", tmp_path) is None
    assert checkpoint.find_eval_checkpoint(tmp_path) == tmp_path / "best.pth"


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path: Path) -> None:
    checkpoint.save_checkpoint({"epoch": 1}, tmp_path, 1, is_best=False, keep_last=3)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint.save_checkpoint({"epoch": 1, "x": Unpicklable()}, tmp_path, 1, is_best=False, keep_last=3)
    assert torch.load(tmp_path / "epoch_0001.pth")["epoch"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0001.pth"]  # no temp file left behind


def test_resume_from_missing_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"CONFIG\.TRAIN\.RESUME.*nope\.pth"):
        checkpoint.resolve_resume_path(str(tmp_path / "nope.pth"), tmp_path)
