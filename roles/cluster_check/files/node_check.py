"""How fast is this node at what a job does? Run on every node (roles/cluster_check starts it with the training
environment's Python; it imports torch, decord or torchcodec and the standard library, nothing of the trainer):

    python node_check.py --node NAME --data-path DIR --decoder decord|torchcodec|auto [--clip-len 8]
                         [--frame-rate 1] [--height 112] [--width 112] [--seconds 2]

Three figures, each measured for about --seconds and reported with the seconds it took:
- matmul: float32 matrix multiplies (bfloat16 on a GPU, as mixed precision trains), TFLOP/s: on every GPU, the
  slowest GPU being the node's figure (DDP waits for it), else on the CPU with torch's threads;
- decode: clips/s, each clip --clip-len frames --frame-rate apart at --height x --width, decoded with the config's
  decoder (auto: decord, as the dataset tries first) from the videos under --data-path (the staged dataset), in turn;
- read: MB/s of reading those videos from the disk, each file's cached pages dropped first (posix_fadvise DONTNEED)
  so the disk is read and not the page cache.
Prints one JSON object: {"node", "matmul", "decode", "read"}, each {"value", "unit", "seconds", "detail"} or {"error"}.
Exit status 0 whatever it found; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".webm", ".mov"}
READ_CHUNK = 1 << 20


def timed(seconds: float, step: Callable[[int], float]) -> tuple[float, float]:
    """Run ``step(i)`` (it returns the amount of work it did) until ``seconds`` passed, at least twice (the first is a
    warm-up, not counted). Returns (work, seconds) of the counted steps."""
    step(0)
    work, start, i = 0.0, time.perf_counter(), 1
    while True:
        work += step(i)
        i += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return work, elapsed


def matmul(seconds: float) -> dict[str, Any]:
    import torch

    def on(device: str, dtype: Any, n: int) -> tuple[float, float]:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)

        def step(_: int) -> float:
            torch.matmul(a, b)
            if device != "cpu":
                torch.cuda.synchronize(device)
            return 2.0 * n**3

        flops, elapsed = timed(seconds, step)
        return flops / elapsed / 1e12, elapsed

    if torch.cuda.is_available():
        gpus = [on(f"cuda:{i}", torch.bfloat16, 8192) for i in range(torch.cuda.device_count())]
        return {"value": min(g for g, _ in gpus), "unit": "TFLOP/s", "seconds": sum(s for _, s in gpus),
                "detail": f"slowest of {len(gpus)} GPU(s), bf16 8192x8192: " + ", ".join(f"{g:.1f}" for g, _ in gpus)}
    value, elapsed = on("cpu", torch.float32, 512)
    return {"value": value, "unit": "TFLOP/s", "seconds": elapsed,
            "detail": f"CPU, {torch.get_num_threads()} thread(s), fp32 512x512"}


def videos(data_path: Path) -> list[Path]:
    found = sorted(p for p in data_path.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file())
    if not found:
        raise FileNotFoundError(f"no video under {data_path} (is the dataset staged? playbooks/stage-data.yml)")
    return found


def clip_reader(decoder: str, height: int, width: int) -> Callable[[Path, int, int], int]:
    """A function decoding ``clip_len`` frames ``frame_rate`` apart from the start of a video at height x width; it
    returns how many frames it decoded."""
    if decoder in ("decord", "auto"):
        import decord

        def with_decord(path: Path, clip_len: int, frame_rate: int) -> int:
            reader = decord.VideoReader(str(path), ctx=decord.cpu(0), width=width, height=height, num_threads=1)
            indices = [(i * frame_rate) % len(reader) for i in range(clip_len)]
            return int(reader.get_batch(sorted(indices)).shape[0])

        return with_decord
    import torch.nn.functional as F
    from torchcodec.decoders import VideoDecoder

    def with_torchcodec(path: Path, clip_len: int, frame_rate: int) -> int:
        reader = VideoDecoder(str(path), dimension_order="NHWC")
        count = reader.metadata.num_frames or 1
        frames = reader.get_frames_at([(i * frame_rate) % count for i in range(clip_len)]).data
        F.interpolate(frames.permute(0, 3, 1, 2).float(), size=(height, width), mode="bilinear")
        return int(frames.shape[0])

    return with_torchcodec


def decode(data_path: Path, decoder: str, clip_len: int, frame_rate: int, height: int, width: int,
           seconds: float) -> dict[str, Any]:
    files = videos(data_path)
    read_clip = clip_reader(decoder, height, width)

    def step(i: int) -> float:
        read_clip(files[i % len(files)], clip_len, frame_rate)
        return 1.0

    clips, elapsed = timed(seconds, step)
    return {"value": clips / elapsed, "unit": "clips/s", "seconds": elapsed,
            "detail": f"{decoder}, {clip_len} frames x{frame_rate} at {height}x{width}, {len(files)} video(s)"}


def read_cold(path: Path) -> float:
    """Bytes read from the file after dropping its cached pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        total = 0
        while chunk := os.read(fd, READ_CHUNK):
            total += len(chunk)
        return float(total)
    finally:
        os.close(fd)


def read(data_path: Path, seconds: float) -> dict[str, Any]:
    files = videos(data_path)

    def step(i: int) -> float:
        return read_cold(files[i % len(files)])

    done, elapsed = timed(seconds, step)
    return {"value": done / elapsed / 1e6, "unit": "MB/s", "seconds": elapsed,
            "detail": f"{done / 1e6:.0f} MB from {len(files)} file(s) under {data_path}, page cache dropped per file"}


def measured(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A figure, or the one line saying why there is none."""
    try:
        return measure()
    except Exception as exc:  # any failure is this node's figure missing, reported by name
        text = str(exc).strip().splitlines()
        return {"error": f"{type(exc).__name__}: {text[0] if text else ''}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node", required=True)
    parser.add_argument("--data-path", required=True, type=Path)
    parser.add_argument("--decoder", required=True, choices=("decord", "torchcodec", "auto"))
    parser.add_argument("--clip-len", type=int, default=8)
    parser.add_argument("--frame-rate", type=int, default=1)
    parser.add_argument("--height", type=int, default=112)
    parser.add_argument("--width", type=int, default=112)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    data_path = args.data_path.expanduser()
    print(json.dumps({
        "node": args.node,
        "matmul": measured(lambda: matmul(args.seconds)),
        "decode": measured(lambda: decode(data_path, args.decoder, args.clip_len, args.frame_rate, args.height,
                                          args.width, args.seconds)),
        "read": measured(lambda: read(data_path, args.seconds)),
    }))


if __name__ == "__main__":
    main()
