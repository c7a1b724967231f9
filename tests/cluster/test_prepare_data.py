"""playbooks/prepare-data.yml (roles/prepare_data, trainer/data/prepare.py): a Kinetics-style dataset from its raw
download, made by the nodes.

The raw download is real: videos of different sizes, codecs and containers made here with ffmpeg (720p and 360p,
H.264, VP9 and MPEG-4, in mp4, webm, avi and mkv; trimmed clips named as the downloaders name them and whole videos to
trim), one listed clip missing, one file broken, one video too short for its clip, one row listed twice, and one
"clip" that is a live HLS playlist whose segments are a private file (tests/trainer/playlists.py). On the
3-node private-home cluster the SSH mesh tests use (private_cluster): the source is a folder on the controller the
nodes cannot read (the controller sends each node its share), the destination node0's home (the other nodes send
their clips there over the SSH mesh). A second run changes nothing, and a short training run reads the result. A
destination all nodes share, a source on one node, and an interrupted play: the slow lane's test.
Run: .venv/bin/python -m pytest -n 0 tests/cluster/test_prepare_data.py  (root; a few minutes on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import REPO, VENV_BIN, LocalCluster, changed_total, flat, playbook_env
from tests.trainer.playlists import live_playlist
from tests.trainer.test_train import run_trainer, write_config
from trainer.data import manifest
from trainer.data.annotations import read_annotations, read_class_index
from trainer.reporting import read_metrics

# The asked output, away from the defaults so that each is seen to be honoured.
SHORT_SIDE, FPS, KEYINT = 128, 15, 8
OPTIONS = {"prepare_data_short_side": SHORT_SIDE, "prepare_data_fps": FPS, "prepare_data_keyframe_interval": KEYINT,
           "prepare_data_preset": "ultrafast", "prepare_data_poll_seconds": 0.5, "prepare_data_report_seconds": 1}
CODECS = {"h264": ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"],
          "vp9": ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"],
          "mpeg4": ["-c:v", "mpeg4", "-q:v", "5"]}
# label, youtube_id, time_start, time_end, split; then how its source is made: (file name, codec, size, seconds),
# None for a clip missing from the source, "broken" for a file of random bytes, "playlist" for a live HLS playlist.
ROWS: list[tuple[str, str, int, int, str, Any]] = [
    ("air drumming", "aaaaaaaaaaa", 0, 3, "train", ("train/aaaaaaaaaaa_000000_000003.mp4", "h264", "1280x720", 3)),
    ("air drumming", "bbbbbbbbbbb", 2, 5, "train", ("train/bbbbbbbbbbb.webm", "vp9", "640x360", 6)),
    ("juggling balls", "ccccccccccc", 1, 4, "train", ("ccccccccccc.avi", "mpeg4", "360x640", 6)),
    ("juggling balls", "ddddddddddd", 0, 3, "train", None),
    ("zumba", "eeeeeeeeeee", 0, 3, "train", "broken"),
    ("zumba", "fffffffffff", 5, 8, "train", ("fffffffffff.mkv", "h264", "640x360", 4)),
    ("zumba", "ggggggggggg", 0, 3, "train", ("x/ggggggggggg_000000_000003.mp4", "h264", "480x360", 3)),
    ("air drumming", "hhhhhhhhhhh", 0, 3, "val", ("val/hhhhhhhhhhh_000000_000003.mp4", "h264", "640x360", 3)),
    ("zumba", "iiiiiiiiiii", 1, 4, "val", ("val/iiiiiiiiiii.mkv", "vp9", "640x360", 5)),
    ("zumba", "jjjjjjjjjjj", 0, 3, "val", "playlist"),
]
MADE = {"train": ["aaaaaaaaaaa", "bbbbbbbbbbb", "ccccccccccc", "ggggggggggg"], "val": ["hhhhhhhhhhh", "iiiiiiiiiii"]}
CLASSES = ["air drumming", "juggling balls", "zumba"]


def make_source(root: Path) -> tuple[Path, list[Path]]:
    """The raw download in root/src and its CSVs (Kinetics' train and validate files, with their is_cc column)."""
    src = root / "src"
    for *_, made in ROWS:
        if made is None:
            continue
        if made == "broken":
            (src / "eeeeeeeeeee_000000_000003.mp4").write_bytes(os.urandom(20_000))
            continue
        if made == "playlist":
            live_playlist(src / "val" / "jjjjjjjjjjj_000000_000003.mp4", root / "private")
            continue
        name, codec, size, seconds = made
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                        f"testsrc2=size={size}:rate=25:duration={seconds}", "-f", "lavfi", "-i",
                        f"sine=frequency=440:duration={seconds}", *CODECS[codec], "-shortest", str(src / name)],
                       check=True, capture_output=True)
    csvs = []
    for split, file in (("train", "kinetics_train.csv"), ("val", "kinetics_validate.csv")):
        rows = [f"{label},{yid},{start},{end},{s},0" for label, yid, start, end, s, _ in ROWS if s == split]
        if split == "train":
            rows.append(rows[0])  # listed twice
        (root / file).write_text("label,youtube_id,time_start,time_end,split,is_cc\n" + "\n".join(rows) + "\n")
        csvs.append(root / file)
    return src, csvs


def prepare(cluster: LocalCluster, src: str, csvs: list[Path], dest: str, check: bool = True,
            **extra: Any) -> subprocess.CompletedProcess[str]:
    settings = {"src": src, "csv": [str(p) for p in csvs], "dest": dest, **OPTIONS, **extra}
    return cluster.playbook("playbooks/prepare-data.yml", "-e", json.dumps(settings), check=check)


def probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries",
                          "stream=codec_type,codec_name,width,height,r_frame_rate:format=duration", "-of", "json",
                          str(path)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def keyframes(path: Path) -> list[int]:
    """Indices (display order) of the key frames."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries",
                          "frame=key_frame,pts", "-of", "csv=p=0", str(path)], capture_output=True, text=True,
                         check=True).stdout
    frames = sorted((int(pts), key == "1") for key, pts in (line.split(",")[:2] for line in out.split()))
    return [i for i, (_, key) in enumerate(frames) if key]


@pytest.fixture(scope="module")
def cluster(private_cluster: tuple[LocalCluster, str]) -> LocalCluster:
    return private_cluster[0]


@pytest.fixture(scope="module")
def prepared(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The raw download in a controller folder no node can read (pytest's, mode 0700), prepared into node0's home."""
    root = tmp_path_factory.mktemp("prepare")
    src, csvs = make_source(root)
    dest = "data/k400-prepared"
    first = prepare(cluster, str(src), csvs, dest)
    yield {"src": src, "csvs": csvs, "dest": dest, "out": cluster.nodes[0].home / dest, "first": first}
    for node in cluster.nodes:
        shutil.rmtree(node.home / "data" / "k400-prepared", ignore_errors=True)
        shutil.rmtree(node.home / "vidcluster" / "prepare", ignore_errors=True)


def test_the_lists_and_class_index_are_the_csvs_and_every_clip_is_as_asked(
        cluster: LocalCluster, prepared: dict[str, Any]) -> None:
    out = prepared["out"]
    assert read_class_index(out / "classInd.txt") == CLASSES
    label = {yid: CLASSES.index(lab) for lab, yid, *_ in ROWS}
    for split, made in MADE.items():
        records = read_annotations(out / f"{split}.txt", out, num_classes=len(CLASSES))
        names = [Path(r.path).name.split("_")[0] for r in records]
        assert sorted(names) == made, split
        for record, name in zip(records, names, strict=True):
            row = next(r for r in ROWS if r[1] == name)
            assert record.label == label[name]
            assert record.path == str(out / split / row[0] / f"{name}_{row[2]:06d}_{row[3]:06d}.mp4")
            info = probe(Path(record.path))
            (video,) = [s for s in info["streams"] if s["codec_type"] == "video"]
            assert [s["codec_type"] for s in info["streams"]] == ["video"], record.path  # no audio
            assert video["codec_name"] == "h264" and min(video["width"], video["height"]) == SHORT_SIDE
            assert Fraction(video["r_frame_rate"]) == FPS
            length = row[3] - row[2]
            assert abs(float(info["format"]["duration"]) - length) < 0.2, (record.path, info["format"])
            assert record.num_frames == round(length * FPS)
            assert keyframes(Path(record.path)) == list(range(0, record.num_frames, KEYINT)), record.path
    portrait = probe(out / "train/juggling balls/ccccccccccc_000001_000004.mp4")["streams"][0]
    assert (portrait["width"], portrait["height"]) == (SHORT_SIDE, 228)  # 360x640, aspect kept, even


def test_the_report_names_every_clip_not_made_with_its_reason_and_the_totals(prepared: dict[str, Any]) -> None:
    report = json.loads((prepared["out"] / "report.json").read_text())
    reasons = {row["youtube_id"]: row["reason"] for row in report["bad"] if not row["reason"].startswith("listed")}
    assert reasons["ddddddddddd"] == "missing from the source"
    assert reasons["eeeeeeeeeee"].startswith("cannot open: ") and "Invalid data" in reasons["eeeeeeeeeee"]
    assert reasons["fffffffffff"] == "shorter than the clip (the video ends at 4.0 s, the clip at 8 s)"
    assert reasons["jjjjjjjjjjj"].startswith("cannot open: not a video of a dataset's formats (hls; only mov,mp4,")
    assert len(reasons) == 4
    twice = [row for row in report["bad"] if row["reason"].startswith("listed twice")]
    assert [row["youtube_id"] for row in twice] == ["aaaaaaaaaaa"]
    assert twice[0]["reason"] == f"listed twice (also {prepared['csvs'][0]}:2)"
    assert report["totals"] == {
        "train": {"air drumming": {"listed": 3, "made": 2, "bad": 1}, "juggling balls": {"listed": 2, "made": 1,
                  "bad": 1}, "zumba": {"listed": 3, "made": 1, "bad": 2}},
        "val": {"air drumming": {"listed": 1, "made": 1, "bad": 0}, "zumba": {"listed": 2, "made": 1, "bad": 1}}}


def test_every_node_made_its_share_and_said_so(cluster: LocalCluster, prepared: dict[str, Any]) -> None:
    out = flat(prepared["first"].stdout)
    assert "10 clips listed: 0 made already, 1 missing from the source; 9 to make" in out
    for node in cluster.names:
        assert re.search(rf"{node}: done, \d clip\(s\) made", out), out[-3000:]
    assert "train: 4 of 8 clips made, 4 not; val: 2 of 3 clips made, 1 not; 3 classes." in out
    assert "its manifest: 10 files, 4 hashed now" in out  # the lists, the index and the report; not the clips
    for node in cluster.nodes[1:]:  # what they made went to node0; they keep only their bookkeeping
        assert not (node.home / prepared["dest"] / "train").exists()
        assert not list((node.home / "vidcluster" / "prepare").glob("*/out/**/*.mp4"))


def test_the_manifest_is_complete_and_staging_hashes_nothing_again(prepared: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    out = prepared["out"]
    check = manifest.verify(str(out), adopt=False)
    assert check.complete and not check.extra and len(check.manifest.entries) == 6 + 4  # clips, lists, index, report
    built = manifest.build(str(out), str(tmp_path / "staged.json"), "node0:k400")
    assert built["hashed"] == 0 and built["files"] == 10
    fresh = {e.path: e.sha256 for e in manifest.read_manifest(str(tmp_path / "staged.json"))[0].entries}
    assert fresh == {e.path: manifest.sha256_file(os.fsencode(out / e.path)) for e in check.manifest.entries}


def test_a_second_run_makes_and_changes_nothing(cluster: LocalCluster, prepared: dict[str, Any]) -> None:
    before = {p: p.stat().st_mtime_ns for p in prepared["out"].rglob("*") if p.is_file()}
    rerun = prepare(cluster, str(prepared["src"]), prepared["csvs"], prepared["dest"])
    assert changed_total(rerun.stdout, cluster.names) == 0, rerun.stdout[-4000:]
    assert "9 made already, 1 missing from the source; nothing to make." in flat(rerun.stdout)
    assert "its manifest: 10 files, 0 hashed now" in flat(rerun.stdout)
    assert "starting" not in rerun.stdout
    assert {p: p.stat().st_mtime_ns for p in prepared["out"].rglob("*") if p.is_file()} == before


def test_a_short_training_run_reads_the_prepared_dataset(prepared: dict[str, Any], tmp_path: Path) -> None:
    out = prepared["out"]
    data = {"TRAIN_ANNO_PATH": str(out / "train.txt"), "TRAIN_DATA_PATH": str(out),
            "VAL_ANNO_PATH": str(out / "val.txt"), "VAL_DATA_PATH": str(out), "CLASS_INDEX": str(out / "classInd.txt"),
            "NUM_CLASSES": 3, "KEEP_ASPECT_RATIO": True, "SHORT_SIDE_SIZE": 64, "CROP_SIZE": 32}
    cfg = write_config(tmp_path / "cfg.yaml", data, tmp_path / "run", TRAIN={"EPOCH_NUM": 1, "BATCH_SIZE": 2})
    run_trainer("-m", "trainer.train", "--config-file", cfg)
    (record,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert record["train_clips"] == 4 and record["val_count"] == 2 and record["bad_videos"] == 0


# ---------------------------------------------------------------------------------------------------------------------
# The slow lane: a shared destination, a source on a node, an interrupted play


def shared_folder(path: Path, owner: Path) -> Path:
    """A folder outside every home that every node sees (the same filesystem), owned by the cluster user."""
    path.mkdir(parents=True)
    stat = owner.stat()
    os.chown(path, stat.st_uid, stat.st_gid)
    return path


def recorded(dest: Path) -> int:
    """Clips made and recorded in the runs' results, not yet folded into the destination's state."""
    return sum('"ok": true' in line for results in dest.glob(".vidcluster-prepare/results/*.jsonl")
               for line in results.read_text().splitlines())


def stop_runs(cluster: LocalCluster) -> None:
    """Kill every node's run where it stands (as if the nodes went down): each run's lock names its pid."""
    for node in cluster.nodes:
        for lock in (node.home / "vidcluster" / "prepare").glob("*/lock"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(lock.read_text()), signal.SIGTERM)  # the run ends its ffmpeg and rsync with it


@pytest.mark.slow
def test_a_shared_destination_is_written_once_from_a_node_source_and_an_interrupted_play_continues(
        cluster: LocalCluster, prepared: dict[str, Any]) -> None:
    """The raw download on node1 only (its home); the destination a folder all nodes share. node0 and node2 fetch
    their shares from node1 over the mesh and every node writes the destination itself. The first play is stopped,
    and every node's run killed, once a clip is made; the rerun makes only what is left."""
    node1 = cluster.nodes[1]
    raw = node1.home / "raw k400"
    shutil.copytree(prepared["src"], raw)
    for path in [raw, *raw.rglob("*")]:
        os.chown(path, node1.home.stat().st_uid, node1.home.stat().st_gid)
    shared = shared_folder(Path(f"/tmp/vcprepare-{os.getpid()}"), node1.home) / "k400"
    settings = {"src": "node1:raw k400", "csv": [str(p) for p in prepared["csvs"]], "dest": str(shared), **OPTIONS,
                "prepare_data_jobs": 1}
    play = subprocess.Popen([str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory),
                             "playbooks/prepare-data.yml", "-e", json.dumps(settings)], cwd=REPO, env=playbook_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not recorded(shared):
            assert play.poll() is None and time.monotonic() < deadline, "the play ended before a clip was made"
            time.sleep(0.1)
        play.send_signal(signal.SIGINT)
        stop_runs(cluster)
        play.wait(timeout=60)
    finally:
        play.kill()
        play.wait()
    try:
        rerun = prepare(cluster, "node1:raw k400", prepared["csvs"], str(shared), prepare_data_jobs=1)
        out = flat(rerun.stdout)
        made = re.search(r"(\d) made already, 1 missing from the source; (\d) to make", out)
        assert made and int(made[1]) >= 1 and int(made[2]) >= 1 and int(made[1]) + int(made[2]) == 9, out[-3000:]
        assert f"The dest folder ({shared}) is shared by node0, node1, node2" in out
        assert (shared / "train.txt").read_text() == (prepared["out"] / "train.txt").read_text()
        assert (shared / "val.txt").read_text() == (prepared["out"] / "val.txt").read_text()
        assert manifest.verify(str(shared), adopt=False).complete
        assert not [sent for node in cluster.nodes for sent in (node.home / "vidcluster" / "prepare").glob("*/in")]
        again = prepare(cluster, "node1:raw k400", prepared["csvs"], str(shared))
        assert changed_total(again.stdout, cluster.names) == 0, again.stdout[-4000:]
    finally:
        shutil.rmtree(shared.parent, ignore_errors=True)
        shutil.rmtree(raw, ignore_errors=True)
