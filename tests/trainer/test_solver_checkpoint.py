"""LR schedule and checkpoint files, in-process."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from torch import nn

from trainer import checkpoint
from trainer.config import validate_config
from trainer.distributed import single_process_context
from trainer.errors import CheckpointError
from trainer.resume import choose_checkpoint, load_resume_state, node_checkpoints
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


def group_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [group["lr"] for group in optimizer.param_groups]


@pytest.mark.parametrize("recipe", ["gluoncv", "pyslowfast"])
def test_restored_scheduler_continues_the_same_schedule(recipe: str) -> None:
    """Interrupted mid-epoch, in the warmup, and restored as train_worker does from the checkpoint's state dicts
    (through a file): every later step trains each parameter group at the uninterrupted run's learning rate."""
    cfg = validate_config({"CONFIG": {"RECIPE": recipe, "DATA": {"NUM_CLASSES": 3}, "TRAIN": {
        "LR": 0.1, "LR_POLICY": "Cosine", "EPOCH_NUM": 6, "USE_WARMUP": True, "WARMUP_EPOCHS": 2,
        "HEAD_LR_MULT": 10.0}}})  # fmt: skip
    steps_per_epoch, stop, total = 4, 6, 24

    def fresh() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))  # decay, no-decay and head groups
        optimizer = build_optimizer(cfg, model, 0.1)
        return optimizer, build_scheduler(cfg, optimizer, steps_per_epoch)

    def train(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
              steps: int) -> list[list[float]]:
        used = []
        for _ in range(steps):
            used.append(group_lrs(optimizer))  # what the step below trains with
            optimizer.step()
            scheduler.step()
        return used

    uninterrupted = train(*fresh(), total)
    optimizer, scheduler = fresh()
    assert train(optimizer, scheduler, stop) == uninterrupted[:stop]
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    optimizer, scheduler = fresh()
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    resumed = train(optimizer, scheduler, total - stop)
    assert len({tuple(lrs) for lrs in uninterrupted[stop:]}) >= 3  # the rest of the schedule changes the LR
    assert {round(lr / resumed[0][0], 9) for lr in resumed[0]} == {1.0, 10.0}  # the head's group too
    for step, (got, expected) in enumerate(zip(resumed, uninterrupted[stop:], strict=True), start=stop):
        assert got == pytest.approx(expected, rel=1e-12), step


def test_checkpoints_keep_last_k_plus_best(tmp_path: Path) -> None:
    for epoch in range(1, 6):
        checkpoint.save_checkpoint({"epoch": epoch}, tmp_path, epoch, is_best=epoch == 2, keep_last=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["epoch_0004.pth", "epoch_0005.pth"]
    assert torch.load(tmp_path / "best.pth")["epoch"] == 2
    assert choose_checkpoint([node_checkpoints(tmp_path)]) == ("epoch_0005.pth", 0)
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
    ctx = single_process_context(make_config())
    assert load_resume_state(ctx, "", tmp_path, tmp_path / "metrics.jsonl", writer=True) is None
    with pytest.raises(CheckpointError, match=r"CONFIG\.TRAIN\.RESUME: checkpoint .*nope\.pth does not exist"):
        load_resume_state(ctx, str(tmp_path / "nope.pth"), tmp_path, tmp_path / "metrics.jsonl", writer=True)
