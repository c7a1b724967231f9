"""How fast is this node at what a job does? Run on every node (roles/cluster_check starts it with the training
environment's Python; it imports torch, decord or torchcodec and the standard library, nothing of the trainer):

    python node_check.py --node NAME --data-path DIR --decoder decord|torchcodec|auto [--clip-len 8]
                         [--frame-rate 1] [--height 112] [--width 112] [--seconds 2] [--time-limit 60]

Three figures, each measured for about --seconds and reported with the seconds it took:
- matmul: float32 matrix multiplies (bfloat16 on a GPU, as mixed precision trains), TFLOP/s: on every GPU, the
  slowest GPU being the node's figure (DDP waits for it), else on the CPU with torch's threads;
- decode: clips/s, each clip --clip-len frames --frame-rate apart at --height x --width, decoded with the config's
  decoder (auto: decord, as the dataset tries first) from the videos under --data-path (the staged dataset), in turn;
  in a forked process, each clip by --time-limit seconds (the config's DECODE_TIME_LIMIT; 0: none): a video that
  hangs the decoder (a live HLS playlist named like a video waits for ever) ends the figure with an error naming
  it. A text file named like a video (a playlist: the decoder would read what it names) is refused unread: decord
  and torchcodec take no list of allowed demuxers (trainer/data/decoders.py's check_file, of which this is a copy:
  this file runs without the trainer);
- read: MB/s of reading those videos from the disk, each file's cached pages dropped first (posix_fadvise DONTNEED)
  so the disk is read and not the page cache.
Prints one JSON object: {"node", "matmul", "decode", "read"}, each {"value", "unit", "seconds", "detail"} or {"error"}.
Exit status 0 whatever it found; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".webm", ".mov"}
READ_CHUNK = 1 << 20
SNIFF_BYTES = 4096
BINARY_BYTES = bytes([*range(0, 9), *range(14, 32), 127])  # no text has them; every video container's start does


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


def refuse_text(path: Path) -> None:
    """ValueError naming a text file (a playlist, a concat list) named like a video."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if head.translate(None, BINARY_BYTES) == head:
        raise ValueError(f"{path}: a text file (a playlist?), not a video: refused unread")


def decode(data_path: Path, decoder: str, clip_len: int, frame_rate: int, height: int, width: int,
           seconds: float, started: Callable[[str], None]) -> dict[str, Any]:
    """The decode figure; ``started(path)`` before each clip."""
    files = videos(data_path)
    read_clip = clip_reader(decoder, height, width)

    def step(i: int) -> float:
        path = files[i % len(files)]
        started(str(path))
        refuse_text(path)
        read_clip(path, clip_len, frame_rate)
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


def within(limit: float, measure: Callable[[Callable[[str], None]], dict[str, Any]]) -> dict[str, Any]:
    """``measured(measure(started))`` in a forked process that calls ``started(what)`` before each step: a step not
    done within ``limit`` seconds (0: none) kills it, and the figure is an error naming the step. A decoder hung in C
    with the GIL held (decord #373) cannot be stopped from inside its own process."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its lines are JSON, {"step": what} then {"result": figure}
        os.close(read_end)
        try:
            if "torch" in sys.modules:  # a forked process must not enter its parent's OpenMP pool (it hangs there)
                sys.modules["torch"].set_num_threads(1)

            def say(message: dict[str, Any]) -> None:
                os.write(write_end, (json.dumps(message) + "\n").encode())

            say({"result": measured(lambda: measure(lambda what: say({"step": what})))})
        finally:
            os._exit(0)
    os.close(write_end)
    step, pending = "starting", b""
    try:
        while True:
            if b"\n" not in pending:
                if not select.select([read_end], [], [], limit or None)[0]:
                    return {"error": f"TimeoutError: {step}: decoding took longer than {limit:g} s"}
                chunk = os.read(read_end, 65536)
                if not chunk:
                    return {"error": f"ChildProcessError: {step}: the decoding process died"}
                pending += chunk
                continue
            line, pending = pending.split(b"\n", 1)
            message = json.loads(line)
            if "result" in message:
                return message["result"]
            step = message["step"]
    finally:
        os.close(read_end)
        if os.waitpid(pid, os.WNOHANG)[0] == 0:  # still running (hung)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


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
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    data_path = args.data_path.expanduser()
    print(json.dumps({
        "node": args.node,
        "matmul": measured(lambda: matmul(args.seconds)),
        "decode": within(args.time_limit, lambda started: decode(data_path, args.decoder, args.clip_len,
                                                                 args.frame_rate, args.height, args.width,
                                                                 args.seconds, started)),
        "read": measured(lambda: read(data_path, args.seconds)),
    }))


if __name__ == "__main__":
    main()
