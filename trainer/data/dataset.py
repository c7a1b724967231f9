"""VideoClipDataset: decord clips for train, val and multi-view test.

The decord `VideoReader` is opened inside `__getitem__`, so it lives in whichever DataLoader worker runs the
item and is never pickled or shared between processes. Each clip is one `get_batch` of sorted unique frame
indices. The decoder resizes frames to NEW_WIDTH x NEW_HEIGHT when KEEP_ASPECT_RATIO is False (GluonCV's
behaviour); with KEEP_ASPECT_RATIO True frames are decoded at their native size and the transforms do the
short-side resize.

Training randomness comes from a generator keyed by (TRAIN.SEED, epoch, index): a sample gets the same clip
and crop whichever worker or rank loads it, with any NUM_WORKERS, and again after a resume. The training
sampler hands the epoch in with each index (see loader.EpochDistributedSampler); a plain integer key means
epoch 0.

A video that is missing, empty or cannot be decoded yields `{'bad': (path, reason), 'index': i}` instead of a
clip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import decord
import numpy as np
from torch.utils.data import Dataset

from trainer.data.annotations import VideoRecord, read_annotations
from trainer.data.sampling import temporal_view_positions, train_indices, val_indices, view_indices
from trainer.data.transforms import IMAGENET_MEAN, IMAGENET_STD, crop_positions, eval_transform, train_transform
from trainer.errors import first_line

if TYPE_CHECKING:
    from trainer.config import Config

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")

# We name bad videos ourselves; without this, FFmpeg prints a block of errors for each one.
decord.logging.set_level(decord.logging.QUIET)


class BadVideo(Exception):
    """A video that cannot give a clip; the message is the reason reported to the user."""


@dataclass(frozen=True)
class ClipSpec:
    """The CONFIG.DATA settings a clip depends on, as plain values (cheap to pickle to workers)."""

    clip_len: int
    frame_rate: int
    num_segment: int
    crop_size: int
    short_side: int
    scale_jitter: tuple[float, float]
    random_flip: bool
    new_height: int
    new_width: int
    keep_aspect_ratio: bool
    test_num_segment: int
    test_num_crop: int
    test_crop_size: int
    test_positions: tuple[float, ...]  # where each temporal test view starts (sampling.temporal_view_positions)
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @classmethod
    def from_config(cls, cfg: Config) -> ClipSpec:
        data = cfg.CONFIG.DATA
        return cls(
            clip_len=data.CLIP_LEN,
            frame_rate=data.FRAME_RATE,
            num_segment=data.NUM_SEGMENT,
            crop_size=data.CROP_SIZE,
            short_side=data.SHORT_SIDE_SIZE,
            scale_jitter=(float(data.SCALE_JITTER[0]), float(data.SCALE_JITTER[1])),
            random_flip=data.RANDOM_FLIP,
            new_height=data.NEW_HEIGHT,
            new_width=data.NEW_WIDTH,
            keep_aspect_ratio=data.KEEP_ASPECT_RATIO,
            test_num_segment=data.TEST_NUM_SEGMENT,
            test_num_crop=data.TEST_NUM_CROP,
            test_crop_size=data.TEST_CROP_SIZE,
            test_positions=tuple(temporal_view_positions(data.TEST_NUM_SEGMENT, cfg.CONFIG.RECIPE)),
            # [] until the trainer resolves it from the initial weights; no weights means ImageNet's
            mean=tuple(data.MEAN) or IMAGENET_MEAN,
            std=tuple(data.STD) or IMAGENET_STD,
        )

    @property
    def decode_size(self) -> tuple[int, int]:
        """(width, height) for VideoReader; -1 keeps the native size."""
        return (-1, -1) if self.keep_aspect_ratio else (self.new_width, self.new_height)


def open_video(path: str, width: int = -1, height: int = -1) -> decord.VideoReader:
    """Open a video with one decoder thread (workers already run in parallel); BadVideo says why not."""
    file = Path(path)
    if not file.is_file():
        raise BadVideo("missing file")
    if file.stat().st_size == 0:
        raise BadVideo("empty file (0 bytes)")
    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0), width=width, height=height, num_threads=1)
    except Exception as exc:  # decord raises RuntimeError or DECORDError (not a RuntimeError) for bad input
        raise BadVideo(f"cannot open: {first_line(exc)}") from exc
    if len(reader) == 0:
        raise BadVideo("no video frames")
    return reader


def read_frames(reader: decord.VideoReader, indices: np.ndarray) -> np.ndarray:
    """Frames [len(indices), H, W, 3] uint8 from one get_batch over the sorted unique indices."""
    unique, inverse = np.unique(indices, return_inverse=True)
    try:
        frames = reader.get_batch(unique.tolist()).asnumpy()
    except Exception as exc:  # a truncated file can open and then fail on the missing frames
        raise BadVideo(f"cannot decode frames: {first_line(exc)}") from exc
    return frames[inverse.reshape(-1), ..., :3]  # decord can hand back RGBA for some small frames


def decode_clip(
    path: str, sample: Callable[[int], np.ndarray], width: int = -1, height: int = -1
) -> np.ndarray:
    """Frames at the indices `sample(num_frames)` picks, resized by the decoder to width x height if given."""
    reader = open_video(path, width, height)
    indices = sample(len(reader))
    try:
        return read_frames(reader, indices)
    except BadVideo:
        if (width, height) == (-1, -1):
            raise
    # decord mis-sizes some resized outputs (dmlc/decord#336, e.g. width 48); the native size always works
    # and the transforms resize anyway, so retry before calling the video bad.
    return read_frames(open_video(path), indices)


class VideoClipDataset(Dataset):
    """Clips of annotated videos for one split; a test split has one item per (video, temporal view, crop)."""

    def __init__(self, records: list[VideoRecord], split: Split, spec: ClipSpec, seed: int = 0) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.records = records
        self.split = split
        self.spec = spec
        self.seed = seed
        self.crop_positions = crop_positions(spec.test_num_crop)

    @property
    def views_per_video(self) -> int:
        return self.spec.test_num_segment * self.spec.test_num_crop if self.split == "test" else 1

    def __len__(self) -> int:
        return len(self.records) * self.views_per_video

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        video_index, view = divmod(index, self.views_per_video)
        record = self.records[video_index]
        try:
            item = self._load(record, view, epoch, index)
        except BadVideo as exc:
            return {"bad": (record.path, str(exc)), "index": index}
        if self.split == "test":
            item["video_index"] = video_index
        return item

    def _load(self, record: VideoRecord, view: int, epoch: int, index: int) -> dict[str, Any]:
        spec = self.spec
        clip = (spec.clip_len, spec.frame_rate, spec.num_segment)
        if self.split == "train":
            rng = np.random.default_rng((self.seed, epoch, index))
            frames = decode_clip(record.path, lambda n: train_indices(n, *clip, rng), *spec.decode_size)
            video = train_transform(
                frames, spec.crop_size, spec.short_side, spec.scale_jitter, spec.random_flip, rng, spec.mean, spec.std
            )
        elif self.split == "val":
            frames = decode_clip(record.path, lambda n: val_indices(n, *clip), *spec.decode_size)
            video = eval_transform(frames, spec.crop_size, spec.short_side, 0.5, spec.mean, spec.std)
        else:
            temporal, spatial = divmod(view, spec.test_num_crop)
            start = spec.test_positions[temporal]
            frames = decode_clip(record.path, lambda n: view_indices(n, *clip, start), *spec.decode_size)
            position = self.crop_positions[spatial]
            video = eval_transform(frames, spec.test_crop_size, spec.short_side, position, spec.mean, spec.std)
        return {"video": video, "label": record.label, "index": index}


def build_dataset(cfg: Config, split: Split) -> VideoClipDataset:
    """The dataset of a split from cfg.CONFIG.DATA; the test split reads the VAL lists, as in GluonCV."""
    data = cfg.CONFIG.DATA
    if split == "train":
        anno, root = data.TRAIN_ANNO_PATH, data.TRAIN_DATA_PATH
    else:
        anno, root = data.VAL_ANNO_PATH, data.VAL_DATA_PATH
    records = read_annotations(anno, root, num_classes=data.NUM_CLASSES)
    return VideoClipDataset(records, split, ClipSpec.from_config(cfg), seed=cfg.CONFIG.TRAIN.SEED)
