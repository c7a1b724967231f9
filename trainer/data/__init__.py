"""Video data: annotation lists, clip sampling, transforms, decoders (decord, torchcodec), the dataset, loaders,
checks, synthetic videos, and preparing a dataset from its raw download.

The names below load their modules when first used, so the package's standard-library modules (manifest, prepare)
run on a controller without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.data.annotations import write_annotations_from_tree
    from trainer.data.check import check_dataset
    from trainer.data.dataset import VideoClipDataset, build_dataset
    from trainer.data.loader import build_loader, loader_workers
    from trainer.data.synthetic import make_synthetic_dataset

_MODULES = {
    "VideoClipDataset": "dataset",
    "build_dataset": "dataset",
    "build_loader": "loader",
    "check_dataset": "check",
    "loader_workers": "loader",
    "make_synthetic_dataset": "synthetic",
    "write_annotations_from_tree": "annotations",
}
__all__ = [
    "VideoClipDataset",
    "build_dataset",
    "build_loader",
    "check_dataset",
    "loader_workers",
    "make_synthetic_dataset",
    "write_annotations_from_tree",
]


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
