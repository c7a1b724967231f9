"""The fast paths give the results of the plain ones: uint8 clips normalised on the device equal the float clips the
references' transforms make (computed here from the videos), the GPU options (channels_last_3d, torch.compile)
leave a model's outputs unchanged on CPU, and multigrid training keeps every rank in step and resumes exactly. Speed
itself is measured by ``python -m bench``."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import decord
import numpy as np
import pytest
import torch
from torch import nn
from torchvision.transforms.v2 import functional as TF

from tests.trainer.test_data import make_cfg
from tests.trainer.test_train import write_config
from trainer.accel import ddp_module, prepare_model, wrap_ddp
from trainer.config import load_config, validate_config
from trainer.data import build_dataset, build_loader
from trainer.data.dataset import VideoClipDataset
from trainer.data.loader import EpochDistributedSampler, epoch_batches
from trainer.data.multigrid import Grid, MultigridBatchSampler, MultigridSchedule
from trainer.data.sampling import train_indices, val_indices
from trainer.data.transforms import ClipNormalizer, Crop, normalize, resize_region
from trainer.distributed import launch, single_process_context
from trainer.models import build_model
from trainer.reporting import read_metrics
from trainer.solver import lr_factor
from trainer.train import train_worker

MEAN, STD = (0.45, 0.4, 0.35), (0.225, 0.25, 0.2)


def clip_as_the_references_make_it(dataset: VideoClipDataset, key: int | tuple[int, int]) -> torch.Tensor:
    """The float clip GluonCV's and PySlowFast's transforms define, computed here from the video alone (not from the
    dataset's item): frames decoded at NEW_WIDTH x NEW_HEIGHT; the square region of a frame that becomes the crop once
    the short side is resized to S (training: SHORT_SIDE_SIZE x U(SCALE_JITTER), at least CROP_SIZE; evaluation:
    SHORT_SIDE_SIZE), placed at (fy, fx) of the room left (training: U(0, 1) each; validation: the centre; test: the
    crop's place along the long side); resized bilinear with antialiasing, mirrored with probability 1/2 in
    training, normalised. Training draws come from numpy's generator keyed (SEED, epoch, index), in this order:
    the clip's start, the scale, (fy, fx), the flip."""
    spec = dataset.spec
    index, epoch = key if isinstance(key, tuple) else (key, 0)
    video, view = divmod(index, dataset.views_per_video)
    reader = decord.VideoReader(dataset.records[video].path, width=spec.new_width, height=spec.new_height)
    clip = (len(reader), spec.clip_len, spec.frame_rate, spec.num_segment)
    if dataset.split == "train":
        rng = np.random.default_rng((dataset.seed, epoch, index))
        indices = train_indices(*clip, rng)
        crop, short = spec.crop_size, max(spec.short_side * rng.uniform(*spec.scale_jitter), spec.crop_size)
        fy, fx = rng.random(2)
        flip = spec.random_flip and rng.random() < 0.5
    else:  # one temporal view: the centred clip; the frames are wider than high
        indices = val_indices(*clip)
        crop = spec.crop_size if dataset.split == "val" else spec.test_crop_size
        short, fy, flip = spec.short_side, 0.5, False
        fx = 0.5 if dataset.split == "val" else np.linspace(0, 1, spec.test_num_crop)[view % spec.test_num_crop]
    frames = torch.from_numpy(reader.get_batch(list(indices)).asnumpy())  # [T, H, W, C]
    height, width = frames.shape[1:3]
    side = min(round(crop * min(height, width) / short), height, width)
    top, left = round((height - side) * fy), round((width - side) * fx)
    region = frames[:, top : top + side, left : left + side].permute(0, 3, 1, 2)  # [T, C, s, s]
    if side != crop:
        region = TF.resize(region, [crop, crop], antialias=True)
    if flip:
        region = TF.horizontal_flip(region)
    mean = torch.tensor(MEAN, dtype=torch.float32).view(-1, 1, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(-1, 1, 1, 1)
    return region.permute(1, 0, 2, 3).to(torch.float32).mul_(1.0 / (255.0 * std)).sub_(mean / std).contiguous()


@pytest.mark.parametrize("crop_on_device", [True, False], ids=["gpu-node", "cpu-node"])
@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_uint8_batches_cropped_and_normalised_on_the_device_equal_the_references_float_clips(
    synthetic_dataset: dict[str, Any], split: str, crop_on_device: bool
) -> None:
    cfg = make_cfg(synthetic_dataset, batch_size=3, NUM_WORKERS=2, RANDOM_FLIP=True, TEST_NUM_CROP=3,
                   MEAN=list(MEAN), STD=list(STD))  # 40x32 frames: test crops along the width
    dataset = build_dataset(cfg, split)
    dataset.crop_on_device = crop_on_device  # as build_dataset sets it on a node with (True) or without a GPU
    loader = build_loader(dataset, cfg, split, None)
    batch = next(iter(loader))  # made in a worker process, in shared memory
    video, plans = batch["video"], batch["crops"]
    side = max(region for region, _, _ in plans)
    assert video.dtype == torch.uint8 and video.shape == (3, 3, 4, side, side)
    assert video.is_contiguous(memory_format=torch.channels_last_3d)  # each clip one copy of its storage
    if split == "train" and crop_on_device:  # scale jitter: regions of 19-24 px to be enlarged to 24, some flipped
        assert len({region for region, _, _ in plans}) > 1 or any(flip for _, _, flip in plans)
    else:
        assert all(plan == (24, 24, False) for plan in plans)  # crops already
    keys = [(int(i), 0) for i in batch["index"]] if split == "train" else [int(i) for i in batch["index"]]
    expected = torch.stack([clip_as_the_references_make_it(dataset, key) for key in keys])
    for memory_format in (torch.contiguous_format, torch.channels_last_3d):
        normalised = ClipNormalizer(MEAN, STD, "cpu", memory_format)(video, plans)
        assert normalised.dtype == torch.float32 and normalised.is_contiguous(memory_format=memory_format)
        torch.testing.assert_close(normalised, expected, rtol=0, atol=1e-6)
    float_input = torch.randn(2, 3, 4, 8, 8)
    assert ClipNormalizer(MEAN, STD)(float_input) is float_input  # already model input: passed on as it is


def test_the_gpus_float_resize_matches_the_cpus_uint8_one() -> None:
    region = torch.randint(0, 256, (4, 19, 19, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    region = region.permute(3, 0, 1, 2)  # [C, T, s, s] view of [T, s, s, C] storage, as regions are
    on_cpu = resize_region(region, 24)
    in_float = resize_region(region.float(), 24)  # what a GPU computes
    assert on_cpu.dtype == torch.uint8 and in_float.shape == on_cpu.shape == (3, 4, 24, 24)
    # within a level: torch's uint8 kernel rounds its fixed-point weights and its output, the float one does not
    torch.testing.assert_close(in_float, on_cpu.float(), rtol=0, atol=1.0)


def test_videos_larger_than_the_crops_need_are_decoded_smaller_the_same_way_every_time(
    synthetic_dataset: dict[str, Any]
) -> None:
    # 32 px videos, short side 16 at most 1.25x in training: decoded at 20 px (train) and 16 px (val), not 32.
    cfg = make_cfg(synthetic_dataset, KEEP_ASPECT_RATIO=True, SHORT_SIDE_SIZE=16, CROP_SIZE=12, TEST_CROP_SIZE=12)
    for split, side in (("train", 20), ("val", 16)):
        dataset = build_dataset(cfg, split)
        key = (5, 2) if split == "train" else 5
        first = dataset[key]  # decoded at 32 px, found too large, decoded again at `side`
        assert dataset.decoder._fitted[dataset.records[5].path] == (side, side)
        again = dataset[key]  # straight at `side`
        assert first["crop"] == again["crop"] and torch.equal(first["video"], again["video"])
        assert normalize(Crop(first["video"], *first["crop"])).shape == (3, 4, 12, 12)
    assert "bad" not in build_dataset(make_cfg(synthetic_dataset, KEEP_ASPECT_RATIO=True), "train")[0]


def test_channels_last_leaves_outputs_and_gradients_unchanged_on_cpu() -> None:
    torch.manual_seed(0)
    model = build_model("slowfast_tiny", num_classes=3, dropout=0.0)  # train mode: batch statistics, no dropout
    clip = torch.randn(2, 3, 8, 16, 16)
    expected = model(clip)
    expected.sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    cfg = validate_config({"CONFIG": {"TRAIN": {"CHANNELS_LAST": True}}})
    fast = prepare_model(model, cfg)
    assert next(p for p in fast.parameters() if p.dim() == 5).is_contiguous(memory_format=torch.channels_last_3d)
    out = fast(clip.contiguous(memory_format=torch.channels_last_3d))  # what ClipNormalizer hands it
    out.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for name, p in fast.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-3, atol=1e-5, msg=name)


def test_compile_leaves_outputs_unchanged_on_cpu() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(4, 3))
    clip = torch.randn(2, 3, 4, 8, 8)
    cfg = validate_config({"CONFIG": {"TRAIN": {"COMPILE": True}}})
    compiled = wrap_ddp(model, single_process_context(cfg), cfg)
    assert compiled is not model and ddp_module(compiled) is model
    with torch.no_grad():
        torch.testing.assert_close(compiled(clip), model(clip), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------------
# Multigrid


def schedule(short: bool, long: bool, epochs: tuple[int, ...] = (0, 1)) -> MultigridSchedule:
    return MultigridSchedule(Grid(16, 2, 224, 256, 8), short, long, epochs)


def test_multigrid_grids_follow_gluoncv_and_pyslowfast() -> None:
    both = schedule(short=True, long=True)
    # Long cycle: (T/2, S/sqrt2) x4, (T/2, S) x2, (T, S); short cycle S/2, S/sqrt2, S with the batch x (S/s)^2.
    assert [both.stage(e) for e in range(5)] == [0, 1, 2, 2, 2]
    assert [both.lr_scale(e) for e in range(3)] == [4.0, 2.0, 1.0]
    assert both.grids(0) == [Grid(8, 4, 112, 128, 64), Grid(8, 4, 158, 181, 32), Grid(8, 4, 158, 181, 32)]
    assert both.grids(1) == [Grid(8, 4, 112, 128, 64), Grid(8, 4, 158, 181, 32), Grid(8, 4, 224, 256, 16)]
    assert both.grids(2) == [Grid(16, 2, 112, 128, 32), Grid(16, 2, 158, 181, 16), Grid(16, 2, 224, 256, 8)]
    assert schedule(short=False, long=True).grids(2) == [Grid(16, 2, 224, 256, 8)]
    wraps = schedule(short=False, long=True, epochs=(0, 1, 2))  # GluonCV's wrap-around after the last stage
    assert [wraps.stage(e) for e in range(5)] == [0, 1, 2, 0, 0]


@pytest.mark.parametrize("drop_last", [False, True])
def test_multigrid_ranks_stay_in_step_and_cover_the_epoch(drop_last: bool) -> None:
    sched = dataclasses.replace(schedule(short=True, long=True), default=Grid(4, 2, 32, 32, 2))
    dataset = list(range(45))  # 23 per rank, one padded
    seen: list[list[tuple[int, Grid]]] = []
    for rank in (0, 1):
        shard = EpochDistributedSampler(dataset, 2, rank, seed=3)
        sampler = MultigridBatchSampler(shard, sched, drop_last)
        sampler.set_epoch(1)
        batches = list(sampler)
        assert len(batches) == len(sampler) == sched.batches_in_epoch(1, 23, drop_last)
        assert all(len({grid for _, _, grid in batch}) == 1 and {e for _, e, _ in batch} == {1} for batch in batches)
        taken = sorted(i for batch in batches for i, _, _ in batch)
        everything = sorted(i for i, _ in shard)
        assert taken == everything if not drop_last else set(taken) < set(everything)
        seen.append([(len(batch), batch[0][2]) for batch in batches])
    assert seen[0] == seen[1]  # the same batch sizes and grids on every rank, iteration by iteration


def test_multigrid_learning_rate_runs_in_fractional_epochs_and_scales_with_the_long_cycle() -> None:
    cfg = validate_config({"CONFIG": {"RECIPE": "pyslowfast", "TRAIN": {
        "EPOCH_NUM": 3, "LR_POLICY": "Cosine", "MULTIGRID": {"USE_LONG_CYCLE": True, "LONG_CYCLE_EPOCH": [0, 1]}}}})
    steps = [2, 4, 8]  # the coarse epochs take fewer, larger batches
    factor = lr_factor(cfg, steps)
    cosine = [0.5 * (1 + np.cos(np.pi * e / 3)) for e in (0, 0.5, 1, 1.25, 2, 2 + 7 / 8)]
    assert [factor(s) for s in (0, 1, 2, 3, 6, 13)] == pytest.approx(
        [4 * cosine[0], 4 * cosine[1], 2 * cosine[2], 2 * cosine[3], cosine[4], cosine[5]])


def multigrid_config(data: dict[str, Any], tmp: Path, run: Path, **train: Any) -> Any:
    path = write_config(tmp / "cfg.yaml", data, run, workers=2, TRAIN={
        "EPOCH_NUM": 3, "BATCH_SIZE": 1, "LR": 0.05, "USE_WARMUP": False, "WARMUP_EPOCHS": 0,
        "MULTIGRID": {"USE_SHORT_CYCLE": True, "USE_LONG_CYCLE": True, "LONG_CYCLE_EPOCH": [0, 1]},
        "PRECISE_BN": True, "PRECISE_BN_BATCHES": 2, **train},
        DATA={"MULTIGRID": True}, VAL={"FREQ": 3}, MODEL={"NAME": "slowfast_tiny"})
    return load_config(path)


def test_multigrid_training_keeps_ranks_in_step_and_resumes_exactly(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    full = tmp_path / "full"
    cfg = multigrid_config(synthetic_dataset, tmp_path, full)
    launch(train_worker, cfg)
    digest = json.loads((full / "weights_digest.json").read_text())
    assert digest["world_size"] == 2 and digest["identical"]  # same grids and batch counts, or DDP would hang
    # 12 clips per rank and epoch in batches of [8, 4, 4] (coarse), [8, 4, 2] (middle), [4, 2, 1] (full) clips
    status = json.loads((full / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 2 + 2 + 5
    lrs = [r["lr"] / cfg.CONFIG.TRAIN.LR for r in read_metrics(full / "metrics.jsonl")]
    assert lrs == pytest.approx([4 * 1.0, 2 * 0.75, 0.25])  # batch factor x cosine at epochs 0, 1, 2

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy(full / "checkpoints" / "epoch_0002.pth", resumed / "checkpoints" / "epoch_0002.pth")
    launch(train_worker, multigrid_config(synthetic_dataset, tmp_path, resumed))
    # It resumed: it trained epoch 3 alone (training is seeded per epoch, so a restart would end the same)
    assert [r["epoch"] for r in read_metrics(resumed / "metrics.jsonl")] == [3]
    reference = torch.load(full / "checkpoints" / "epoch_0003.pth", weights_only=True)["model"]
    final = torch.load(resumed / "checkpoints" / "epoch_0003.pth", weights_only=True)["model"]
    for name, tensor in reference.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    loader = build_loader(build_dataset(cfg, "train"), cfg, "train", None)  # one process: all 24 clips
    counts = []
    for epoch in range(3):
        loader.batch_sampler.set_epoch(epoch)
        counts.append(len(list(loader.batch_sampler)))
    assert epoch_batches(loader, 3) == counts == [4, 5, 10]
