"""VideoClipDataset: decoded clips for train, val and multi-view test.

Videos are decoded by CONFIG.DATA.DECODER through trainer.data.decoders: decord (default), torchcodec, or auto
(decord, and torchcodec for a video decord cannot open). The reader is opened inside `__getitem__`, so it lives in
whichever DataLoader worker runs the item and is never pickled or shared between processes. Each clip is one
batched read of sorted unique frame indices. The decoder resizes frames to NEW_WIDTH x NEW_HEIGHT when
KEEP_ASPECT_RATIO is False (GluonCV's behaviour); with KEEP_ASPECT_RATIO True frames are decoded at their native
size, or at the largest short side the split's crops need when the video is larger (SHORT_SIDE_SIZE x the top of
SCALE_JITTER in training), and the transforms do the short-side resize.

Training randomness comes from a generator keyed by (TRAIN.SEED, epoch, index): a sample gets the same clip
and crop whichever worker or rank loads it, with any NUM_WORKERS, and again after a resume. The training
sampler hands the epoch in with each index (see loader.EpochDistributedSampler); a plain integer key means
epoch 0. Under TRAIN.REPEATED_AUG the later copies of an index carry keys past any epoch (loader.RepeatedAugSampler),
so each copy is augmented differently. Under multigrid training the key also carries the batch's Grid (frames,
stride, crop; multigrid.py).

An item's 'video' is the uint8 [C, T, s, s] region of the decoded frames that becomes its crop (a view: the worker
touches no pixel after decoding), 'crop' is (crop size, flip). Where the model trains on a GPU (crop_on_device), the
crop is made there, after the batch has crossed the worker boundary: resized, flipped, normalised with the spec's
mean/std (transforms.ClipNormalizer); on a CPU-only node the worker makes it (uint8, make_crop) and the training
process only normalises.

A video that is missing, empty or cannot be decoded yields `{'bad': (path, reason), 'index': i}` instead of a
clip. A clip that `auto` decoded with torchcodec carries `'fallback': (path, why decord could not open it)`.

A video whose decoding ran out of time (DATA.DECODE_TIME_LIMIT: "decoding took longer than N s") would hang again:
the dataset remembers it in memory its DataLoader workers share, and every later item of it (another view, the next
epoch, in any worker) is that bad video at once. The training process tells it the ones other ranks found, and the
ones a resumed run's checkpoint names (`skip_timed_out`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer.data.annotations import VideoRecord, read_annotations
from trainer.data.decoders import NATIVE, BadVideo, ClipDecoder, DecoderChoice, DecodeTimeout
from trainer.data.multigrid import Grid
from trainer.data.sampling import temporal_view_positions, train_indices, val_indices, view_indices
from trainer.data.timelimit import exceeded_reason, is_exceeded
from trainer.data.transforms import IMAGENET_MEAN, IMAGENET_STD, crop_positions, eval_crop, make_crop, train_crop

if TYPE_CHECKING:
    from trainer.config import Config

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")


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
    # Defaults for checkpoints whose recorded clip settings predate DECODER: decord was then the only decoder.
    decoder: DecoderChoice = "decord"
    decoder_device: str = "cpu"
    decode_time_limit: float = 0.0  # seconds per clip (0: none; and for checkpoints that predate the limit)

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
            decoder=data.DECODER,
            decoder_device=data.DECODER_DEVICE,
            decode_time_limit=data.DECODE_TIME_LIMIT,
        )

    @property
    def decode_size(self) -> tuple[int, int]:
        """(width, height) the decoder resizes to; NATIVE keeps the video's size (but see ClipDecoder.clip's
        short_side: a video larger than the crops need is decoded smaller)."""
        return NATIVE if self.keep_aspect_ratio else (self.new_width, self.new_height)

    @property
    def eval_short_side(self) -> int:
        """The largest short side validation and test frames are resized to."""
        return max(self.short_side, self.crop_size, self.test_crop_size)


class VideoClipDataset(Dataset):
    """Clips of annotated videos for one split; a test split has one item per (video, temporal view, crop)."""

    def __init__(
        self, records: list[VideoRecord], split: Split, spec: ClipSpec, seed: int = 0, gpu: int = 0,
        crop_on_device: bool = False,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.records = records
        self.split = split
        self.spec = spec
        self.seed = seed
        self.crop_positions = crop_positions(spec.test_num_crop)
        self.crop_on_device = crop_on_device  # else the crop is made here, as uint8 (make_crop)
        self.decoder = ClipDecoder(spec.decoder, spec.decode_size, spec.decoder_device, gpu, spec.decode_time_limit)
        # 1 for each video whose decoding ran out of time, in memory the DataLoader workers (forked later) share
        self._timed_out = torch.zeros(len(records), dtype=torch.uint8).share_memory_()

    @property
    def views_per_video(self) -> int:
        return self.spec.test_num_segment * self.spec.test_num_crop if self.split == "test" else 1

    def __len__(self) -> int:
        return len(self.records) * self.views_per_video

    def __getitem__(self, key: int | tuple[int, int] | tuple[int, int, Grid]) -> dict[str, Any]:
        """Item ``index``; a training key may add the epoch (augmentation) and a multigrid Grid (the clip's shape)."""
        index, epoch, grid = (key, 0, None) if isinstance(key, int) else (*key, None)[:3]
        video_index, view = divmod(index, self.views_per_video)
        record = self.records[video_index]
        if self._timed_out[video_index]:
            return {"bad": (record.path, exceeded_reason(self.spec.decode_time_limit)), "index": index}
        try:
            item = self._load(record, view, epoch, index, grid)
        except BadVideo as exc:
            if isinstance(exc, DecodeTimeout):
                self._timed_out[video_index] = 1
            return {"bad": (record.path, str(exc)), "index": index}
        if self.split == "test":
            item["video_index"] = video_index
        return item

    def skip_timed_out(self, bad: list[tuple[str, str]]) -> None:
        """Of these (path, reason) bad videos, the ones whose decoding ran out of time are not decoded again."""
        paths = {path for path, reason in bad if is_exceeded(reason)}
        if not paths:
            return
        for video_index, record in enumerate(self.records):
            if record.path in paths:
                self._timed_out[video_index] = 1

    def _load(self, record: VideoRecord, view: int, epoch: int, index: int, grid: Grid | None) -> dict[str, Any]:
        spec = self.spec
        clip = (spec.clip_len, spec.frame_rate, spec.num_segment)
        if self.split == "train":
            crop_size, short_side = spec.crop_size, spec.short_side
            if grid is not None:
                clip = (grid.clip_len, grid.frame_rate, spec.num_segment)
                crop_size, short_side = grid.crop_size, grid.short_side
            rng = np.random.default_rng((self.seed, epoch, index))
            # the default grid's: a video's decode size must not depend on which multigrid grid saw it first
            largest = max(math.ceil(spec.short_side * spec.scale_jitter[1]), spec.crop_size)
            frames, fallback = self.decoder.clip(record.path, lambda n: train_indices(n, *clip, rng), largest)
            crop = train_crop(frames, crop_size, short_side, spec.scale_jitter, spec.random_flip, rng)
        elif self.split == "val":
            frames, fallback = self.decoder.clip(record.path, lambda n: val_indices(n, *clip), spec.eval_short_side)
            crop = eval_crop(frames, spec.crop_size, spec.short_side, 0.5)
        else:
            temporal, spatial = divmod(view, spec.test_num_crop)
            start = spec.test_positions[temporal]
            frames, fallback = self.decoder.clip(record.path, lambda n: view_indices(n, *clip, start),
                                                 spec.eval_short_side)
            position = self.crop_positions[spatial]
            crop = eval_crop(frames, spec.test_crop_size, spec.short_side, position)
        if not self.crop_on_device:
            crop = make_crop(crop)
        item = {"video": crop.region, "crop": (crop.size, crop.flip), "label": record.label, "index": index}
        if fallback is not None:
            item["fallback"] = (record.path, fallback)
        return item


def build_dataset(cfg: Config, split: Split) -> VideoClipDataset:
    """The dataset of a split from cfg.CONFIG.DATA; the test split reads the VAL lists, as in GluonCV."""
    data = cfg.CONFIG.DATA
    if split == "train":
        anno, root = data.TRAIN_ANNO_PATH, data.TRAIN_DATA_PATH
    else:
        anno, root = data.VAL_ANNO_PATH, data.VAL_DATA_PATH
    records = read_annotations(anno, root, num_classes=data.NUM_CLASSES)
    spec = ClipSpec.from_config(cfg)
    return VideoClipDataset(records, split, spec, seed=cfg.CONFIG.TRAIN.SEED, gpu=cfg.DDP_CONFIG.GPU,
                            crop_on_device=torch.cuda.is_available())  # where the model trains
