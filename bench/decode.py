"""Clip decoding: what the dataset does against the obvious alternatives, measured in the same run.

    .venv/bin/python bench/decode.py [--size 320x240] [--frames 96] [--clips 40]

The dataset (trainer/data/dataset.py, with DECODER decord) decodes one clip with a single sorted ``get_batch`` and
lets decord resize while decoding. Baselines: one ``reader[i]`` call per frame, and full-size decode followed by a
torch resize. Prints clips/s of each and the speed-up of the dataset's way over each baseline. (decord against
torchcodec: bench/decoders.py.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import decord
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data.decoders import ClipDecoder
from trainer.data.sampling import val_indices
from trainer.data.synthetic import encode_mp4s, render_video

CLIP_LEN, FRAME_RATE, OUT = 16, 2, 128


def make_video(path: Path, width: int, height: int, frames: int) -> None:
    rng = np.random.default_rng(0)
    square = render_video((0, 1), max(width, height), frames, rng)[:, :height, :width]
    encode_mp4s([np.ascontiguousarray(square)], [path], fps=25)


def open_decord(path: str, width: int = -1, height: int = -1) -> decord.VideoReader:
    return decord.VideoReader(path, ctx=decord.cpu(0), width=width, height=height, num_threads=1)


def dataset_way(path: str, start: int) -> torch.Tensor:
    decoder = ClipDecoder("decord", (OUT, OUT))
    return decoder.clip(path, lambda n: (val_indices(n, CLIP_LEN, FRAME_RATE, 1) + start) % n).frames


def per_frame(path: str, start: int) -> torch.Tensor:
    reader = open_decord(path, OUT, OUT)
    idx = val_indices(len(reader), CLIP_LEN, FRAME_RATE, 1) + start
    return torch.stack([torch.from_numpy(reader[int(i) % len(reader)].asnumpy()) for i in idx])


def resize_after(path: str, start: int) -> torch.Tensor:
    reader = open_decord(path)
    idx = val_indices(len(reader), CLIP_LEN, FRAME_RATE, 1) + start
    frames = torch.from_numpy(reader.get_batch(sorted(idx % len(reader))).asnumpy())
    resized = F.interpolate(frames.permute(0, 3, 1, 2).float(), size=(OUT, OUT), mode="bilinear")
    return resized.permute(0, 2, 3, 1).to(torch.uint8)


def clips_per_second(fn: Callable[[str, int], torch.Tensor], path: str, clips: int) -> float:
    fn(path, 0)  # warm-up: first open pays for codec initialisation
    start = time.perf_counter()
    for i in range(clips):
        fn(path, i % 7)
    return clips / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="320x240", help="video WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=96, help="frames in the test video")
    parser.add_argument("--clips", type=int, default=40, help="clips decoded per method")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.mp4"
        make_video(path, width, height, args.frames)
        ours = clips_per_second(dataset_way, str(path), args.clips)
        baselines = {"per-frame reader[i]": per_frame, "full decode + torch resize": resize_after}
        print(f"{CLIP_LEN}x{FRAME_RATE} clips from a {width}x{height} H.264 video, resized to {OUT}x{OUT}")
        print(f"  dataset (get_batch, decoder resize): {ours:8.1f} clips/s")
        for name, fn in baselines.items():
            rate = clips_per_second(fn, str(path), args.clips)
            print(f"  {name:<35} {rate:8.1f} clips/s   dataset is {ours / rate:.2f}x")


if __name__ == "__main__":
    main()
