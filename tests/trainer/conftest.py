"""Shared fixtures of the trainer tests."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.data import make_synthetic_dataset


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Motion-only classes 'left'/'right': 12 train + 6 val H.264 videos each, 32x32, 16 frames at 8 fps.

    The value holds CONFIG.DATA settings (TRAIN/VAL_ANNO_PATH, TRAIN/VAL_DATA_PATH, CLASS_INDEX, NUM_CLASSES).
    """
    root = tmp_path_factory.mktemp("synthetic")
    return make_synthetic_dataset(root, ("left", "right"), (12, 6), size=32, frames=16, fps=8, seed=0)
