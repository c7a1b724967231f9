"""The readiness check's node measurement (roles/cluster_check/files/node_check.py) never hangs on a file: each clip
is decoded by --time-limit in a forked process, and a text file named like a video (a live HLS playlist, which the
decoder would wait on for ever) is refused unread. Main lane: node_check.py run here, as a node runs it.

The hang is decord #373's (stuck in C with the GIL held), put into node_check's own decord by a sitecustomize on
PYTHONPATH (node_check imports nothing of the trainer, so tests/trainer/_hanging_decoder.py cannot reach it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.cluster.test_check_cluster import NODE_CHECK
from tests.trainer.playlists import live_playlist
from trainer.data.synthetic import encode_mp4s, render_video

HANGS = '''import ctypes, os
import decord
Reader = decord.VideoReader
class Hanging(Reader):
    def __init__(self, path, *args, **kwargs):
        if path == os.environ["VCT_NODE_CHECK_HANGS"]:
            ctypes.PyDLL(None).sleep(3600)  # in C, with the GIL held
        super().__init__(path, *args, **kwargs)
decord.VideoReader = Hanging
'''
LIMIT = 3.0


def videos(root: Path, count: int) -> list[Path]:
    paths = [root / f"class{i}" / "v.mp4" for i in range(count)]
    for path in paths:
        path.parent.mkdir(parents=True)
    encode_mp4s([render_video((0, 1), 64, 32, np.random.default_rng(i)) for i in range(count)], paths, fps=25)
    return paths


def node_check(data: Path, **env: str) -> tuple[dict[str, Any], float]:
    """node_check.py's figures and how long it ran."""
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(NODE_CHECK), "--node", "n0", "--data-path", str(data), "--decoder",
                          "decord", "--height", "32", "--width", "32", "--seconds", "0.3", "--time-limit", str(LIMIT)],
                         capture_output=True, text=True, check=True, timeout=300, env={**os.environ, **env})
    return json.loads(out.stdout), time.monotonic() - started


def test_a_live_playlist_named_like_a_video_is_refused_unread(tmp_path: Path) -> None:
    videos(tmp_path / "data", 1)
    playlist = live_playlist(tmp_path / "data" / "class1" / "live.mp4", tmp_path / "private")
    found, _ = node_check(tmp_path / "data")
    assert found["decode"] == {"error": f"ValueError: {playlist}: a text file (a playlist?), not a video: refused "
                                        "unread"}
    assert found["matmul"]["value"] > 0 and found["read"]["value"] > 0


def test_a_video_that_hangs_the_decoder_ends_the_figure_by_the_time_limit_naming_it(tmp_path: Path) -> None:
    first, hanging = videos(tmp_path / "data", 2)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANGS)
    found, took = node_check(tmp_path / "data", PYTHONPATH=str(site), VCT_NODE_CHECK_HANGS=str(hanging))
    assert found["decode"] == {"error": f"TimeoutError: {hanging}: decoding took longer than {LIMIT:g} s"}
    assert found["read"]["value"] > 0  # the check went on
    assert took < LIMIT + 120
    calm, _ = node_check(tmp_path / "data", PYTHONPATH=str(site), VCT_NODE_CHECK_HANGS=str(first.parent / "none"))
    assert calm["decode"]["value"] > 0 and calm["decode"]["detail"] == "decord, 8 frames x1 at 32x32, 2 video(s)"
