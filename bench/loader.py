"""The training loader against decoding alone, on the same Kinetics-like clips, measured in the same run.

Clips as configs/slowfast.yaml trains them: 32 frames at stride 2 from 340x256 H.264 videos (bench/decoders.py
makes them), 224 px crops of 256-320 px short sides, random flips. Rows:

* decode-only: decord opens the video and ``get_batch``es the clip's 32 frames, nothing else (the floor);
* the dataset item on a GPU node (decode, pick the crop's region and flip; the crop is made on the GPU), and on a
  CPU-only node (the worker makes the crop, uint8);
* the same item the way it was before (resized, flipped and normalised to float32 in the worker), for reference;
* what making a batch's crops costs on this CPU, per clip (on a GPU: microseconds);
* the DataLoader with N workers (batches of 8, pinned as on a GPU node, persistent workers) against N decode-only
  loops running side by side in N processes.

Also: what antialiasing costs and buys when a region is shrunk (3x), against an area-averaged reference.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import decord
import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

from bench.decoders import CLIP_LEN, STRIDE, make_video
from trainer.config import validate_config
from trainer.data import build_dataset, build_loader
from trainer.data.loader import collate_clips
from trainer.data.sampling import clip_indices
from trainer.data.transforms import ClipNormalizer, Crop, normalize

BATCH = 8


def kinetics_like(root: Path, videos: int) -> list[str]:
    paths = [str(root / f"kinetics_like_{i}.mp4") for i in range(videos)]
    for seed, path in enumerate(paths):
        make_video(Path(path), seed)
    return paths


def loader_config(root: Path, paths: list[str], clips: int, workers: int) -> Any:
    """configs/slowfast.yaml's clip settings over a list of ``clips`` items, item i from video i % len(paths)."""
    (root / "train.txt").write_text("".join(f"{paths[i % len(paths)]} 300 0\n" for i in range(clips)))
    return validate_config({"CONFIG": {
        "TRAIN": {"BATCH_SIZE": BATCH, "SEED": 0},
        "DATA": {"TRAIN_ANNO_PATH": str(root / "train.txt"), "VAL_ANNO_PATH": str(root / "train.txt"),
                 "NUM_CLASSES": 1, "CLIP_LEN": CLIP_LEN, "FRAME_RATE": STRIDE, "CROP_SIZE": 224,
                 "SHORT_SIDE_SIZE": 256, "SCALE_JITTER": [1.0, 1.25], "RANDOM_FLIP": True, "KEEP_ASPECT_RATIO": True,
                 "NUM_WORKERS": workers, "MEAN": [0.45] * 3, "STD": [0.225] * 3}}})


def decode_only(path: str, index: int, epoch: int = 0) -> Any:
    """What the dataset item decodes, and nothing else: the same clip of the same video (same seeded start)."""
    rng = np.random.default_rng((0, epoch, index))
    reader = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)
    return reader.get_batch(clip_indices(len(reader), CLIP_LEN, STRIDE, 1, rng.random(1)).tolist())


def _decode_loop(args: tuple[list[str], list[int]]) -> int:
    paths, indices = args
    torch.set_num_threads(1)
    for index in indices:
        decode_only(paths[index % len(paths)], index)
    return len(indices)


def interleaved_rates(methods: dict[str, Callable[[int], Any]], clips: int, rounds: int) -> dict[str, float]:
    """clips/s of each method over the same clip indices, clip by clip in turn (a busy moment hits them alike)."""
    for method in methods.values():
        method(0)
    seconds = dict.fromkeys(methods, 0.0)
    for _ in range(rounds):
        for index in range(clips):
            for name, method in methods.items():
                start = time.perf_counter()
                method(index)
                seconds[name] += time.perf_counter() - start
    return {name: rounds * clips / total for name, total in seconds.items()}


def gpu_node_dataset(cfg: Any) -> Any:
    """The training dataset as a node with a GPU builds it: crops made on the GPU, not in the workers."""
    dataset = build_dataset(cfg, "train")
    dataset.crop_on_device = True
    return dataset


def loader_rate(cfg: Any, batches: int) -> float:
    """clips/s of a GPU node's training DataLoader over ``batches`` batches after its first (workers started)."""
    loader = build_loader(gpu_node_dataset(cfg), cfg, "train", None)  # pinned only with a GPU
    iterator = iter(loader)
    next(iterator)
    start, clips = time.perf_counter(), 0
    for _ in range(batches):
        clips += len(next(iterator)["label"])
    return clips / (time.perf_counter() - start)


def parallel_decode_rate(paths: list[str], workers: int, clips_each: int) -> float:
    """Total clips/s of ``workers`` decode-only loops, one per process, side by side."""
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_decode_loop, [(paths, [0])] * workers)  # started and warm
        start = time.perf_counter()
        done = sum(pool.map(_decode_loop, [(paths, list(range(w, w + clips_each))) for w in range(workers)]))
        return done / (time.perf_counter() - start)


def antialias_rows() -> dict[str, float]:
    """A 3x shrink of a 672 px region to 224 px (a 720p video's crop), 32 frames of fine-textured uint8 video: time
    ratio of antialiased to plain bilinear, and each one's mean abs error against the 3x3 area average (levels)."""
    gen = torch.Generator().manual_seed(0)
    smooth = TF.resize(torch.randint(0, 256, (32, 3, 168, 168), generator=gen, dtype=torch.uint8), [672, 672])
    frames = (smooth.int() + torch.randint(-20, 21, smooth.shape, generator=gen)).clamp(0, 255).to(torch.uint8)
    frames = frames.contiguous(memory_format=torch.channels_last)
    reference = torch.nn.functional.avg_pool2d(frames.float(), 3)
    times = dict.fromkeys((True, False), 0.0)
    errors = {aa: (TF.resize(frames, [224, 224], antialias=aa).float() - reference).abs().mean().item()
              for aa in (True, False)}
    for _ in range(10):  # in turn, so a busy moment hits both
        for aa in (True, False):
            start = time.perf_counter()
            TF.resize(frames, [224, 224], antialias=aa)
            times[aa] += time.perf_counter() - start
    return {"time": times[True] / times[False], "error_aa": errors[True], "error_plain": errors[False]}


def made_in_the_worker(item: dict[str, Any], mean: Any, std: Any) -> torch.Tensor:
    """The clip as the workers used to make it: the region resized on uint8 (torch's kernel), flipped, normalised."""
    size, flip = item["crop"]
    frames = TF.resize(item["video"].permute(1, 0, 2, 3), [size, size], antialias=True)  # [T, C, size, size]
    frames = TF.horizontal_flip(frames) if flip else frames
    return normalize(Crop(frames.permute(1, 0, 2, 3), size), mean, std)


def device_step_ms(dataset: Any, clips: int) -> float:
    """Milliseconds per clip of making a batch's crops (ClipNormalizer) on this CPU: the work a GPU node's workers no
    longer do (on a GPU it takes microseconds)."""
    items = [dataset[(i, 0)] for i in range(BATCH)]
    batch = collate_clips(items)
    normalizer = ClipNormalizer(dataset.spec.mean, dataset.spec.std)
    start = time.perf_counter()
    for _ in range(max(1, clips // BATCH)):
        normalizer(batch["video"], batch["crops"])
    return 1000 * (time.perf_counter() - start) / (max(1, clips // BATCH) * BATCH)


def run(quick: bool, workers: int = 2) -> dict[str, Any]:
    torch.set_num_threads(1)  # as in a DataLoader worker
    clips, rounds = (12, 1) if quick else (30, 2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = kinetics_like(root, 2 if quick else 3)
        cfg = loader_config(root, paths, clips, 0)
        dataset, cpu_node = gpu_node_dataset(cfg), build_dataset(cfg, "train")
        cpu_node.crop_on_device = False
        cfg.CONFIG.DATA.DECODE_TIME_LIMIT = 0.0  # decoded in this process, not in its helper
        unlimited = gpu_node_dataset(cfg)
        spec = dataset.spec
        rates = interleaved_rates({
            "decode": lambda i: decode_only(paths[i % len(paths)], i),
            "item": lambda i: dataset[(i, 0)],
            "item_no_limit": lambda i: unlimited[(i, 0)],
            "item_cpu_node": lambda i: cpu_node[(i, 0)],
            "item_before": lambda i: made_in_the_worker(dataset[(i, 0)], spec.mean, spec.std),
        }, clips, rounds)
        batches = 8 if quick else 16
        loader_cfg = loader_config(root, paths, (batches + 1) * BATCH, workers)
        parallel = loader = 0.0
        for _ in range(rounds):  # in turn, so a busy moment of the shared machine hits both
            parallel += parallel_decode_rate(paths, workers, clips) / rounds
            loader += loader_rate(loader_cfg, batches) / rounds
        device_ms = device_step_ms(dataset, clips)
    return {**rates, "parallel_decode": parallel, "loader": loader, "workers": workers, "device_ms": device_ms,
            "antialias": antialias_rows()}
