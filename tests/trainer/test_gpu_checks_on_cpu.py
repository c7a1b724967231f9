"""The GPU checks' look inside the trainer (tests/trainer/_gpu_checks.py), on the CPU: that the engine's training
forward computes in the AMP dtype, and that SYNC_BN's model has SyncBatchNorm layers. The results the GPU tests
compare cannot show either (float32 meets their tolerances; one GPU trains as well without SyncBatchNorm), so these
show that deleting the engine's autocast or train.py's convert_sync_batchnorm would fail the GPU checks.

On the CPU the trainer's AMP is float32 (trainer.accel.amp_dtype), so the engine's autocast is given CPU bf16 here
(torch autocasts convolutions and linear layers to bf16 on the CPU): the engine's forward must run under it."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from tests.trainer import _gpu_checks as checks
from trainer import engine
from trainer.distributed import single_process_context
from trainer.models import build_model

CPU = torch.device("cpu")


def tiny_batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 8, 32, 32, generator=gen), torch.randint(0, 5, (2,), generator=gen)


def test_the_engines_forward_computes_in_bf16_under_its_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[Any, str]] = []

    def cpu_bf16(ctx: Any, amp: str) -> contextlib.AbstractContextManager[Any]:
        asked.append((ctx.device, amp))
        return torch.autocast("cpu", dtype=torch.bfloat16)

    monkeypatch.setattr(engine, "autocast", cpu_bf16)
    cfg = checks.amp_config("bf16")
    model = build_model("i3d_tiny", 5, dropout=0.0)
    dtypes = checks.engine_forward_dtypes(model, *tiny_batch(), cfg, single_process_context(cfg))
    assert asked == [(CPU, "bf16")]  # the engine asked for the config's AMP
    assert dtypes == {"Conv3d": ["bfloat16"], "Linear": ["bfloat16"]}
    assert checks.compute_dtype_problem(dtypes, torch.bfloat16) is None


def test_a_forward_without_autocast_is_named_as_float32() -> None:
    """What the GPU check would see if the engine's autocast were deleted: every layer in float32, a failure."""
    model = build_model("i3d_tiny", 5, dropout=0.0)
    clip, _ = tiny_batch()
    dtypes = checks.activation_dtypes(model, lambda: model(clip))
    assert dtypes == {"Conv3d": ["float32"], "Linear": ["float32"]}
    assert checks.compute_dtype_problem(dtypes, torch.bfloat16) == (
        "layers computed in {'Conv3d': ['float32'], 'Linear': ['float32']}, not bfloat16 (is autocast missing?)")
    assert checks.compute_dtype_problem({}, torch.float16) == "no convolution or linear layer ran"


def test_the_trainers_sync_bn_model_has_only_syncbatchnorm() -> None:
    kinds = checks.batchnorm_kinds(checks.sync_bn_model(CPU))
    assert set(kinds) == {"SyncBatchNorm"} and kinds["SyncBatchNorm"] > 0, kinds
    # What the check would see without the conversion: BatchNorm3d, a failure.
    assert set(checks.batchnorm_kinds(build_model("i3d_tiny", 5))) == {"BatchNorm3d"}
