"""Helpers of the GPU tests (the ``gpus`` fixture is in conftest): a skip, with its reason, where too few GPUs are
visible, and the environment that shows a process these GPUs. Shared by test_gpu and test_in_place's nccl test (a
module of its own: each of those imports the other's tests)."""

from __future__ import annotations

import pytest


def visible_env(devices: list[str]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}


def needs(gpus: list[str], count: int) -> list[str]:
    if len(gpus) < count:
        pytest.skip(f"needs {count} GPUs, {len(gpus)} visible")
    return gpus[:count]
