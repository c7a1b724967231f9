"""Video data: annotation lists, clip sampling, transforms, decoders (decord, torchcodec), the dataset, loaders,
checks, synthetic videos."""

from trainer.data.annotations import write_annotations_from_tree
from trainer.data.check import check_dataset
from trainer.data.dataset import VideoClipDataset, build_dataset
from trainer.data.loader import build_loader, loader_workers
from trainer.data.synthetic import make_synthetic_dataset

__all__ = [
    "VideoClipDataset",
    "build_dataset",
    "build_loader",
    "check_dataset",
    "loader_workers",
    "make_synthetic_dataset",
    "write_annotations_from_tree",
]
