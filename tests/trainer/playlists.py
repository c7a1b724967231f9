"""HLS playlists that pose as videos, made by ffmpeg itself (``-f hls``), for the tests of every path that probes or
decodes a dataset's files (trainer/data/prepare.py, check-data, the readiness check's node_check.py).

A *live* playlist is ffmpeg's, its end mark (#EXT-X-ENDLIST) taken out and one more segment listed that is not there
yet: a reader that follows it waits for that segment, reloading the playlist for ever. Its segments name a private
file by its absolute ``file://`` address, as a crafted source would pull another local file into a dataset.
"""

from __future__ import annotations

from pathlib import Path

from tests.trainer.conftest import ffmpeg


def live_playlist(path: Path, private: Path) -> Path:
    """A live HLS playlist at ``path`` (any name: a clip's, ".mp4") whose segments are in the folder ``private``."""
    private.mkdir(parents=True, exist_ok=True)
    made = private / "index.m3u8"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=64x48:rate=25:duration=4", "-c:v", "libx264", "-preset", "ultrafast",
           "-pix_fmt", "yuv420p", "-g", "25", "-f", "hls", "-hls_time", "2", "-hls_list_size", "0",
           "-hls_segment_filename", str(private / "clip%d.ts"), str(made))  # fmt: skip
    lines = []
    for line in made.read_text().splitlines():
        if line == "#EXT-X-ENDLIST":
            continue
        lines.append(f"file://{private / line}" if line.endswith(".ts") else line)
    lines += ["#EXTINF:2.0,", f"file://{private / 'clip-not-yet.ts'}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
