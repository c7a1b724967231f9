"""Preparing a dataset (playbooks/prepare-data.yml, trainer/data/prepare.py): what it buys and how it scales.

    .venv/bin/python -m bench.prepare_data [--decode-only] [--nodes 1 2 4] [--clips 24]   (root for the nodes part)

1. Clip decode time of prepared videos against their raw sources, the same clips with the same decoder in one run:
   raw-like sources (10 s at 30 frames/s, H.264 with a keyframe every 5 s as YouTube serves it, 1280x720 and 640x360,
   with sensor-like noise) are made with ffmpeg, prepared with prepare.py's own transcode (its defaults: 256 px short
   side, 30 frames/s, a keyframe every 16 frames), and the dataset's clip reads (trainer.data.decoders.ClipDecoder
   with decord, 32 frames at stride 2 at random places, decoded at the short side the training crops need, 320 px:
   configs/slowfast.yaml) are timed on both, clip by clip in turn.
2. Preparation throughput on independent local clusters of 1, 2 and 4 nodes (root): the same raw download (whole
   videos, so every clip is trimmed too) in a folder every node sees, prepared into a folder every node shares, one
   ffmpeg per node (prepare_data_jobs=1, so that a node stands for a core); clips per second of the whole play, and
   of a rerun that has nothing to make. The nodes of a local cluster share this machine's cores: past its core count
   more nodes cannot make clips faster, whatever the plan does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.loader import interleaved_rates
from bench.local import NEEDS_ROOT, build, inventory, playbook
from trainer.data.decoders import ClipDecoder
from trainer.data.sampling import train_indices
from trainer.data.transcode import Options, ffmpeg_argv

CLIP_LEN, STRIDE, NEEDED_SHORT_SIDE = 32, 2, 320  # configs/slowfast.yaml: 256 px short side x SCALE_JITTER 1.25
SOURCES = (("1280x720", 0), ("640x360", 1), ("1280x720", 2), ("640x360", 3))


def raw_video(path: Path, size: str, seed: int, seconds: int = 10) -> None:
    """A raw-download-like video: H.264, 30 frames/s, a keyframe every 5 s, moving content with noise, audio."""
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                    f"testsrc2=size={size}:rate=30:duration={seconds},noise=alls=12:allf=t+u:all_seed={seed}",
                    "-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}", "-c:v", "libx264",
                    "-preset", "veryfast", "-g", "150", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(path)],
                   check=True, capture_output=True)


def decode_speed(clips: int, rounds: int) -> dict[str, Any]:
    """Clips/s of the dataset's clip read on the raw sources and on their prepared versions, in one run."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        raw, prepared = [], []
        for size, seed in SOURCES:
            raw.append(root / f"raw_{seed}.mp4")
            raw_video(raw[-1], size, seed)
            prepared.append(root / f"prepared_{seed}.mp4")
            subprocess.run(ffmpeg_argv(str(raw[-1]), str(prepared[-1]), None, Options()), check=True,
                           capture_output=True)
        decoder = ClipDecoder("decord")

        def read(paths: list[Path]) -> Any:
            def clip(index: int) -> Any:
                rng = np.random.default_rng((0, index))  # the same place in both versions of a video
                path = str(paths[index % len(paths)])
                return decoder.clip(path, lambda n: train_indices(n, CLIP_LEN, STRIDE, 1, rng), NEEDED_SHORT_SIDE)

            return clip

        rates = interleaved_rates({"raw": read(raw), "prepared": read(prepared)}, clips, rounds)
        sizes = {"raw": sum(p.stat().st_size for p in raw), "prepared": sum(p.stat().st_size for p in prepared)}
    return {"rates": rates, "bytes": sizes, "videos": len(SOURCES)}


def raw_download(root: Path, clips: int) -> tuple[Path, Path]:
    """``clips`` whole 640x360 videos of 6 s and a CSV asking for 4 s of each (trimmed), in a folder every node
    reads."""
    src = root / "raw"
    src.mkdir(parents=True)
    rows = []
    for i in range(clips):
        youtube_id = f"bench{i:06d}"
        raw_video(src / f"{youtube_id}.mp4", "640x360", i, seconds=6)
        rows.append(f"class{i % 4},{youtube_id},1,5,train,0")
    csv = root / "train.csv"
    csv.write_text("label,youtube_id,time_start,time_end,split,is_cc\n" + "\n".join(rows) + "\n")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return src, csv


def prepare_rate(nodes: int, src: Path, csv: Path, dest: Path, clips: int) -> dict[str, float]:
    name = f"bprep{nodes}"
    build(name, nodes)
    try:
        settings = json.dumps({"src": str(src), "csv": [str(csv)], "dest": str(dest), "prepare_data_jobs": 1})
        timings = []
        for _ in range(2):  # the preparation, then a rerun with nothing to make
            start = time.monotonic()
            playbook("-i", str(inventory(name)), "playbooks/prepare-data.yml", "-e", settings)
            timings.append(time.monotonic() - start)
        made = len((dest / "train.txt").read_text().splitlines())
        if made != clips:
            raise RuntimeError(f"{nodes} node(s) made {made} of {clips} clips")
        return {"nodes": nodes, "seconds": timings[0], "rerun": timings[1], "clips_per_s": clips / timings[0]}
    finally:
        playbook("playbooks/local-cluster.yml", "-e", f"cluster_name={name}", "-e", "state=absent", check=False)
        shutil.rmtree(dest, ignore_errors=True)


def throughput(node_counts: list[int], clips: int) -> list[dict[str, float]]:
    if os.geteuid() != 0:
        raise RuntimeError(NEEDS_ROOT)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # a folder the nodes' user can reach
        root = Path(tmp)
        root.chmod(0o755)
        src, csv = raw_download(root, clips)
        rows = []
        for nodes in node_counts:
            dest = root / f"prepared{nodes}"
            dest.mkdir()
            shutil.chown(dest, "vctrain", "vctrain")
            rows.append(prepare_rate(nodes, src, csv, dest, clips))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode-only", action="store_true", help="only part 1 (no root needed)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--clips", type=int, default=24, help="clips prepared at each cluster size")
    parser.add_argument("--decode-clips", type=int, default=40)
    args = parser.parse_args()
    decode = decode_speed(args.decode_clips, 2)
    rates, sizes = decode["rates"], decode["bytes"]
    print("| videos | raw clips/s | prepared clips/s | speed-up | raw MB | prepared MB |")
    print("|---|---|---|---|---|---|")
    print(f"| {decode['videos']} (720p, 360p) | {rates['raw']:.1f} | {rates['prepared']:.1f} | "
          f"{rates['prepared'] / rates['raw']:.2f}x | {sizes['raw'] / 1e6:.1f} | {sizes['prepared'] / 1e6:.1f} |")
    if args.decode_only:
        return 0
    rows = throughput(args.nodes, args.clips)
    base = rows[0]["clips_per_s"]
    print("\n| nodes | clips | wall s | clips/s | vs 1 node | rerun s (nothing to make) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['nodes']} | {args.clips} | {row['seconds']:.1f} | {row['clips_per_s']:.2f} | "
              f"{row['clips_per_s'] / base:.2f}x | {row['rerun']:.1f} |")
    print(f"\n{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
