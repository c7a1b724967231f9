"""decord against torchcodec on Kinetics-like clips, measured in the same run on the same clips.

    .venv/bin/python bench/decoders.py [--videos 3] [--clips 60] [--rounds 3]

Videos as the GluonCV Kinetics recipes read them: 340x256 H.264 (High profile, B-frames), 10 s at 30 fps, a key
frame every second. A clip is what the dataset decodes for one training item: open the video, then one batched read
of 32 frames at stride 2 at a random start (trainer/data/sampling.py), at NEW_WIDTH x NEW_HEIGHT = 340x256. Every
decoder decodes the same list of (video, start) clips, clip by clip in turn (so a busy moment on a shared machine
hits them all alike), for a few rounds. Prints clips/s, the ratio to decord, and how far the frames are apart.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data.decoders import ClipDecoder, TorchcodecReader, read_frames
from trainer.data.sampling import clip_indices

WIDTH, HEIGHT, FPS, SECONDS = 340, 256, 30, 10
CLIP_LEN, STRIDE = 32, 2

Sampler = Callable[[int], np.ndarray]
Method = Callable[[str, Sampler], torch.Tensor]


def make_video(path: Path, seed: int) -> None:
    """A moving test pattern with film grain (so the encoder has detail to spend bits on), x264 veryfast."""
    source = f"testsrc2=size={WIDTH}x{HEIGHT}:rate={FPS}:duration={SECONDS},noise=alls=8:allf=t+u:all_seed={seed}"
    cmd = [
        "ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i", source,
        "-c:v", "libx264", "-preset", "veryfast", "-profile:v", "high", "-bf", "3", "-pix_fmt", "yuv420p",
        "-g", str(FPS), "-keyint_min", str(FPS), "-sc_threshold", "0", str(path),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def dataset_way(choice: str) -> Method:
    decoder = ClipDecoder(choice, (WIDTH, HEIGHT))  # type: ignore[arg-type]
    return lambda path, sample: decoder.clip(path, sample).frames


def torchcodec_approximate(path: str, sample: Sampler) -> torch.Tensor:
    """torchcodec trusting the container's index instead of scanning the file (not what the dataset does)."""
    reader = TorchcodecReader(path, (WIDTH, HEIGHT), seek_mode="approximate")
    return read_frames(reader, sample(len(reader)))


def measure(videos: int, clips_per_round: int, rounds: int) -> dict[str, Any]:
    """clips/s of each way to decode, the frames' distance between decord and torchcodec, the videos' size."""
    torch.set_num_threads(1)  # as in a DataLoader worker
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(Path(tmp) / f"kinetics_like_{i}.mp4") for i in range(videos)]
        for seed, path in enumerate(paths):
            make_video(Path(path), seed)
        starts = np.random.default_rng(0).random(clips_per_round)  # where each clip sits in its video
        clips: list[tuple[str, Sampler]] = [
            (paths[i % len(paths)], lambda n, at=at: clip_indices(n, CLIP_LEN, STRIDE, 1, np.array([at])))
            for i, at in enumerate(starts)
        ]
        methods: dict[str, Method] = {
            "decord": dataset_way("decord"),
            "torchcodec (exact seeks, the dataset's)": dataset_way("torchcodec"),
            "torchcodec (approximate seeks)": torchcodec_approximate,
        }
        for method in methods.values():  # warm-up: codec initialisation, page cache
            method(*clips[0])
        seconds = dict.fromkeys(methods, 0.0)
        for _ in range(rounds):
            for path, sample in clips:
                for name, method in methods.items():
                    start = time.perf_counter()
                    method(path, sample)
                    seconds[name] += time.perf_counter() - start
        ours = [methods["decord"](*clip).int() for clip in clips[:10]]
        theirs = [methods["torchcodec (exact seeks, the dataset's)"](*clip).int() for clip in clips[:10]]
        diff = torch.cat([(a - b).abs().flatten() for a, b in zip(ours, theirs, strict=True)]).float()
        size_kb = sum(Path(p).stat().st_size for p in paths) / len(paths) / 1024
    return {"rates": {name: rounds * len(clips) / total for name, total in seconds.items()},
            "max_diff": int(diff.max()), "mean_diff": diff.mean().item(), "size_kb": size_kb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--videos", type=int, default=3, help="distinct 10 s videos")
    parser.add_argument("--clips", type=int, default=60, help="clips per round, spread over the videos")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds over the clips")
    args = parser.parse_args()
    result = measure(args.videos, args.clips, args.rounds)
    print(f"{CLIP_LEN}-frame clips at stride {STRIDE} from {args.videos} {WIDTH}x{HEIGHT} H.264 videos "
          f"({SECONDS} s, {FPS} fps, key frame every second, {result['size_kb']:.0f} KiB each), {args.clips} clips x "
          f"{args.rounds} rounds, interleaved")
    base = result["rates"]["decord"]
    for name, rate in result["rates"].items():
        print(f"  {name:<40} {rate:7.1f} clips/s   {rate / base:.2f}x decord")
    print(f"  frames decord vs torchcodec: max |diff| {result['max_diff']}, mean {result['mean_diff']:.3f} levels")


if __name__ == "__main__":
    main()
