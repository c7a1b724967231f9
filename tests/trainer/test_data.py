"""trainer.data on real H.264 videos made by ffmpeg and decoded by decord: lists, sampling, transforms,
loaders, bad-video handling and the dataset check."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import decord
import numpy as np
import pytest
import torch

from tests.trainer.test_train import REPO, run_trainer
from trainer.__main__ import main as trainer_cli
from trainer.data import build_dataset, build_loader, check_dataset, write_annotations_from_tree
from trainer.data.annotations import AnnotationError, read_annotations, read_class_index
from trainer.data.loader import set_loader_epoch
from trainer.data.sampling import temporal_view_positions, train_indices, val_indices, view_indices
from trainer.data.synthetic import make_synthetic_dataset
from trainer.data.transforms import IMAGENET_MEAN, IMAGENET_STD, Crop, eval_crop, normalize, train_crop
from trainer.distributed import DistContext

SIZE, FRAMES = 32, 16

DATA_DEFAULTS: dict[str, Any] = {
    "CLIP_LEN": 4, "FRAME_RATE": 2, "NUM_SEGMENT": 1, "NUM_CROP": 1,
    "TEST_NUM_SEGMENT": 1, "TEST_NUM_CROP": 1, "TEST_CROP_SIZE": 24,
    "CROP_SIZE": 24, "SHORT_SIDE_SIZE": 32, "NEW_HEIGHT": 32, "NEW_WIDTH": 40, "KEEP_ASPECT_RATIO": False,
    "NUM_WORKERS": 0, "PREFETCH_FACTOR": 2, "SCALE_JITTER": (1.0, 1.25), "RANDOM_FLIP": False, "MEAN": [], "STD": [],
    "DECODER": "decord", "DECODER_DEVICE": "cpu", "DECODE_TIME_LIMIT": 60.0,
}  # fmt: skip


def make_cfg(data: dict[str, Any], batch_size: int = 4, recipe: str = "gluoncv", **overrides: Any) -> SimpleNamespace:
    """The cfg.CONFIG.{RECIPE,DATA,TRAIN,VAL} and cfg.DDP_CONFIG.GPU attribute paths the data package reads, as
    plain objects."""
    return SimpleNamespace(
        DDP_CONFIG=SimpleNamespace(GPU=0),
        CONFIG=SimpleNamespace(
            RECIPE=recipe,
            DATA=SimpleNamespace(**{**DATA_DEFAULTS, **data, **overrides}),
            TRAIN=SimpleNamespace(BATCH_SIZE=batch_size, SEED=3, DROP_LAST=False, REPEATED_AUG=1,
                                  MULTIGRID=SimpleNamespace(USE_SHORT_CYCLE=False, USE_LONG_CYCLE=False)),
            VAL=SimpleNamespace(BATCH_SIZE=batch_size),
        )
    )


def rank_ctx(rank: int, world_size: int) -> DistContext:
    return DistContext(
        rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size, node_rank=0,
        num_nodes=1, device=torch.device("cpu"), backend="gloo", distributed=True, dist_url="tcp://127.0.0.1:1",
    )  # fmt: skip


def write_list(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def with_bad_videos(data: dict[str, Any], tmp: Path) -> tuple[dict[str, Any], set[str]]:
    """The val list plus a missing, an empty (0 bytes), a truncated (half) and an undecodable video."""
    good = next(Path(data["VAL_DATA_PATH"]).glob("val/left/*.mp4")).read_bytes()
    (tmp / "empty.mp4").write_bytes(b"")
    (tmp / "truncated.mp4").write_bytes(good[: len(good) // 2])
    (tmp / "random.mp4").write_bytes(np.random.default_rng(0).bytes(4096))
    bad = {str(tmp / name) for name in ("missing.mp4", "empty.mp4", "truncated.mp4", "random.mp4")}
    lines = Path(data["VAL_ANNO_PATH"]).read_text().splitlines() + [
        f"{path} {FRAMES} 1" for path in sorted(bad)
    ]
    return {**data, "VAL_ANNO_PATH": str(write_list(tmp / "val_bad.txt", lines))}, bad


def motion(frames: np.ndarray) -> tuple[int, int]:
    """(dy, dx) shift of the bright square between two frames, robust to its wrapping around the edges."""
    masks = frames.astype(int).sum(-1) > 550
    shifts = [(dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)]
    return min(shifts, key=lambda s: int((np.roll(masks[0], s, axis=(0, 1)) != masks[1]).sum()))


# ----------------------------------------------------------------------------------------------------
# Synthetic dataset


def test_synthetic_videos_decode_with_right_shape_length_and_motion(
    synthetic_dataset: dict[str, Any],
) -> None:
    records = read_annotations(synthetic_dataset["TRAIN_ANNO_PATH"], synthetic_dataset["TRAIN_DATA_PATH"], 2)
    val = read_annotations(synthetic_dataset["VAL_ANNO_PATH"], synthetic_dataset["VAL_DATA_PATH"], 2)
    assert len(records) == 24 and len(val) == 12
    assert read_class_index(synthetic_dataset["CLASS_INDEX"]) == ["left", "right"]
    for record in records[::5]:
        reader = decord.VideoReader(record.path, num_threads=1)
        assert len(reader) == record.num_frames == FRAMES
        assert reader.get_avg_fps() == pytest.approx(8.0)
        frames = reader.get_batch([3, 4]).asnumpy()
        assert frames.shape == (2, SIZE, SIZE, 3)
        dy, dx = motion(frames)
        assert dy == 0 and (dx < 0 if record.label == 0 else dx > 0), record.path


def test_a_synthetic_dataset_of_hundreds_of_videos_is_made_each_its_own_video(tmp_path: Path) -> None:
    # One ffmpeg encodes them all and cuts at each video's first frame; the cut expression once grew with the count
    # and failed near 130 videos.
    made = make_synthetic_dataset(tmp_path / "many", videos_per_class=(150, 1), size=16, frames=6)
    records = read_annotations(made["TRAIN_ANNO_PATH"], made["TRAIN_DATA_PATH"], 2)
    assert len(records) == 300
    for record in (records[0], records[149], records[-1]):
        reader = decord.VideoReader(record.path, num_threads=1)
        assert len(reader) == 6 and list(reader.get_key_indices()) == [0], record.path


# ----------------------------------------------------------------------------------------------------
# Annotation lists


def test_gluoncv_and_pyslowfast_lists_space_and_comma(tmp_path: Path) -> None:
    anno = write_list(
        tmp_path / "list.txt",
        ["# comment", "a/x.mp4 300 2", "", "b/y.mp4 1", "c/z.mp4,0", " d/w.mp4 , 7 , 3 ", "/abs/v.avi 4"],
    )
    records = read_annotations(anno, tmp_path / "root")
    assert [(Path(r.path), r.num_frames, r.label) for r in records] == [
        (tmp_path / "root/a/x.mp4", 300, 2),
        (tmp_path / "root/b/y.mp4", None, 1),
        (tmp_path / "root/c/z.mp4", None, 0),
        (tmp_path / "root/d/w.mp4", 7, 3),
        (Path("/abs/v.avi"), None, 4),
    ]


def test_paths_with_spaces_parse_in_both_formats(tmp_path: Path) -> None:
    lines = ["air drumming/a b.mp4 300 5", "air drumming/c.mp4 4", "/abs/ice skating/d e.avi 120 0", "x 1 2 3"]
    records = read_annotations(write_list(tmp_path / "list.txt", lines), tmp_path / "root")
    assert [(Path(r.path), r.num_frames, r.label) for r in records] == [
        (tmp_path / "root/air drumming/a b.mp4", 300, 5),
        (tmp_path / "root/air drumming/c.mp4", None, 4),
        (Path("/abs/ice skating/d e.avi"), 120, 0),
        (tmp_path / "root/x 1", 2, 3),  # read from the right: label, then a frame count, the rest is the path
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("only_a_path.mp4", "expected 'path label'"),
        ("a.mp4,1,2,3", "expected 'path label'"),
        ("a.mp4 cat", "label must be an integer, got 'cat'"),
        ("a.mp4, x, 1", "num_frames must be an integer"),
        ("a.mp4 -1", "label must be >= 0"),
        ("a.mp4 5", "label 5 out of range for NUM_CLASSES=5"),
    ],
)
def test_malformed_list_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    anno = write_list(tmp_path / "list.txt", ["ok.mp4 0", "", line])
    with pytest.raises(AnnotationError, match=rf"list\.txt:3: {message}"):
        read_annotations(anno, tmp_path, num_classes=5)


def test_class_index_plain_and_ucf101_forms(tmp_path: Path) -> None:
    plain = write_list(tmp_path / "plain.txt", ["playing guitar", "abseiling"])
    ucf = write_list(tmp_path / "classInd.txt", ["2 Archery", "1 ApplyEyeMakeup"])
    assert read_class_index(plain) == ["playing guitar", "abseiling"]
    assert read_class_index(ucf) == ["ApplyEyeMakeup", "Archery"]


def test_make_annotations_lists_a_class_folder_tree(
    synthetic_dataset: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m trainer make-annotations`` (its main): class folders and videos with spaces in their names, as
    Kinetics has ("air drumming"), are named verbatim and load back; a non-video is ignored, an unreadable video
    named."""
    source = Path(synthetic_dataset["TRAIN_DATA_PATH"]) / "train"
    root, out = tmp_path / "tree", tmp_path / "lists"
    classes = ["moving left", "moving right"]
    for name in ("right", "left"):
        shutil.copytree(source / name, root / f"moving {name}")
    shutil.copy(source / "left" / "left_000.mp4", root / "moving left" / "first take.mp4")
    (root / "moving left" / "notes.txt").write_text("not a video")
    (root / "moving right" / "broken.mp4").write_bytes(b"\x00" * 100)
    assert trainer_cli(["make-annotations", str(root), "--out", str(out), "--val-fraction", "0.25", "--seed", "1"]) == 0
    skipped, summary = capsys.readouterr().out.splitlines()
    assert skipped.startswith(f"skipped {root / 'moving right' / 'broken.mp4'}: ")
    assert summary == f"2 classes -> {out / 'train.txt'}, {out / 'val.txt'}, {out / 'classInd.txt'}"
    assert (out / "classInd.txt").read_text() == "moving left\nmoving right\n"
    listed = (out / "train.txt").read_text() + (out / "val.txt").read_text()
    assert f"moving left/first take.mp4 {FRAMES} 0\n" in listed and f"moving right/right_011.mp4 {FRAMES} 1\n" in listed
    train, val = read_annotations(out / "train.txt", root, 2), read_annotations(out / "val.txt", root, 2)
    assert sorted(r.label for r in val) == [0, 0, 0, 1, 1, 1]  # a quarter of each class: round(13 / 4) videos
    assert len(train) == 19 and {r.num_frames for r in train + val} == {FRAMES}
    assert all(Path(r.path).parent.name == classes[r.label] and Path(r.path).is_file() for r in train + val)
    assert not {r.path for r in train} & {r.path for r in val}
    again = write_annotations_from_tree(root, tmp_path / "again", val_fraction=0.25, seed=1)
    assert again.val.read_text() == (out / "val.txt").read_text()


# ----------------------------------------------------------------------------------------------------
# Clip sampling


def test_train_indices_stay_in_each_segment_with_fixed_stride() -> None:
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(50):
        idx = train_indices(100, 4, 2, 2, rng).reshape(2, 4)
        assert (np.diff(idx, axis=1) == 2).all()
        assert idx[0, 0] >= 0 and idx[0, -1] < 50 and idx[1, 0] >= 50 and idx[1, -1] < 100
        starts.add(int(idx[0, 0]))
    assert len(starts) > 10  # the start really is random


def test_val_clip_is_centred_and_test_views_follow_the_recipe() -> None:
    assert val_indices(20, 4, 2, 1).tolist() == [7, 9, 11, 13]  # span 7: starts 0..13, centre int(0.5 * 14)
    one = temporal_view_positions(1, "gluoncv")[0]
    assert view_indices(20, 4, 2, 1, one).tolist() == val_indices(20, 4, 2, 1).tolist()
    # 100 frames, span 7: starts 0..93. GluonCV spreads 4 views from the first to the last start, v / 3;
    # PySlowFast starts view v at v / 4 of the way (get_start_end_idx: delta * v / num_clips), a single one at 0.
    gluoncv = [int(view_indices(100, 4, 2, 1, p)[0]) for p in temporal_view_positions(4, "gluoncv")]
    pyslowfast = [int(view_indices(100, 4, 2, 1, p)[0]) for p in temporal_view_positions(4, "pyslowfast")]
    assert gluoncv == [0, 31, 62, 93] and pyslowfast == [0, 23, 47, 70]
    assert temporal_view_positions(1, "pyslowfast") == [0.0]
    two = val_indices(40, 2, 3, 2)
    assert two.tolist() == [8, 11, 28, 31]  # centred in [0, 20) and [20, 40)


def test_short_videos_are_padded_with_their_last_frame() -> None:
    assert val_indices(5, 4, 2, 1).tolist() == [0, 2, 4, 4]
    assert train_indices(1, 3, 1, 1, np.random.default_rng(0)).tolist() == [0, 0, 0]
    # Segments shorter than a clip overlap the next one but never run off the end.
    assert view_indices(10, 4, 2, 2, 1.0).tolist() == [0, 2, 4, 6, 3, 5, 7, 9]


# ----------------------------------------------------------------------------------------------------
# Transforms


def test_transforms_output_shape_and_imagenet_normalisation() -> None:
    frames = np.full((5, 30, 50, 3), 128, dtype=np.uint8)
    expected = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    train = normalize(train_crop(frames, 24, 30, (1.0, 1.25), True, np.random.default_rng(0)))
    val = normalize(eval_crop(frames, 24, 30))
    for video in (train, val):
        assert video.shape == (3, 5, 24, 24) and video.dtype == torch.float32
        torch.testing.assert_close(video.mean(dim=(1, 2, 3)), expected)


def test_test_crops_go_left_centre_right_and_flip_is_a_switch() -> None:
    ramp = np.broadcast_to(np.arange(60, dtype=np.uint8)[None, None, :, None] * 4, (2, 20, 60, 3)).copy()
    crops = [normalize(eval_crop(ramp, 20, 20, position))[0].mean().item() for position in (0.0, 0.5, 1.0)]
    assert crops[0] < crops[1] < crops[2]
    left_to_right = [
        normalize(train_crop(ramp, 20, 20, (1.0, 1.0), False, np.random.default_rng(s))) for s in range(8)
    ]
    assert all(bool((v[0, 0, 0, 1:] > v[0, 0, 0, :-1]).all()) for v in left_to_right)
    flipped = [normalize(train_crop(ramp, 20, 20, (1.0, 1.0), True, np.random.default_rng(s))) for s in range(8)]
    assert any(bool((v[0, 0, 0, 1:] < v[0, 0, 0, :-1]).all()) for v in flipped)


# ----------------------------------------------------------------------------------------------------
# Dataset and loaders


@pytest.mark.parametrize(("segments", "crops"), [(1, 1), (2, 3)])
def test_test_split_has_one_item_per_view(
    synthetic_dataset: dict[str, Any], segments: int, crops: int
) -> None:
    cfg = make_cfg(synthetic_dataset, TEST_NUM_SEGMENT=segments, TEST_NUM_CROP=crops)
    dataset = build_dataset(cfg, "test")
    views = segments * crops
    assert len(dataset) == 12 * views
    items = [dataset[i] for i in range(views, 2 * views)]  # every view of the second video
    assert [item["video_index"] for item in items] == [1] * views
    assert [item["index"] for item in items] == list(range(views, 2 * views))
    assert all(item["video"].shape == (3, 4, 24, 24) and item["label"] == 0 for item in items)
    distinct = {tuple(item["video"].flatten()[::97].tolist()) for item in items}
    assert len(distinct) == views


def test_test_views_take_test_crop_size_and_validation_takes_crop_size(synthetic_dataset: dict[str, Any]) -> None:
    cfg = make_cfg(synthetic_dataset, TEST_CROP_SIZE=32, TEST_NUM_CROP=3)  # the whole 32 px short side
    assert build_dataset(cfg, "test")[1]["video"].shape == (3, 4, 32, 32)
    assert build_dataset(cfg, "val")[1]["video"].shape == (3, 4, 24, 24)


def test_multi_segment_clips_concatenate_along_time(synthetic_dataset: dict[str, Any]) -> None:
    cfg = make_cfg(synthetic_dataset, NUM_SEGMENT=2, KEEP_ASPECT_RATIO=True)
    for split in ("train", "val"):
        item = build_dataset(cfg, split)[5]
        crop = normalize(Crop(item["video"], *item["crop"]))
        assert crop.shape == (3, 8, 24, 24) and item["index"] == 5


def test_decoder_resize_sizes_decord_mishandles_still_load(synthetic_dataset: dict[str, Any]) -> None:
    # decord 0.6 fails get_batch at width 48 (dmlc/decord#336); such a size must not turn good videos bad.
    cfg = make_cfg(synthetic_dataset, NEW_WIDTH=48, NEW_HEIGHT=32)
    item = build_dataset(cfg, "val")[0]
    assert "bad" not in item and item["video"].shape == (3, 4, 24, 24)


def test_train_clips_depend_on_seed_epoch_index_not_on_workers(synthetic_dataset: dict[str, Any]) -> None:
    batches = {}
    for workers in (0, 2):
        cfg = make_cfg(synthetic_dataset, batch_size=6, NUM_WORKERS=workers, RANDOM_FLIP=True)
        loader = build_loader(build_dataset(cfg, "train"), cfg, "train", None)
        set_loader_epoch(loader, 1)
        batches[workers] = list(loader)
    assert len(batches[0]) == 4
    for a, b in zip(batches[0], batches[2], strict=True):
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["video"], b["video"])
    dataset = build_dataset(make_cfg(synthetic_dataset), "train")
    assert torch.equal(dataset[(3, 1)]["video"], dataset[(3, 1)]["video"])
    assert not torch.equal(dataset[(3, 1)]["video"], dataset[(3, 2)]["video"])


# A training process with another thread holding a lock that its after-fork hook takes, as a native library's can
# (found mid-run: a first validation's worker hung inside fork() for good, its rank holding the job in an all-reduce).
HELD_LOCK_THEN_AN_EPOCH = """
import json, os, sys, threading, time
from tests.trainer.test_data import make_cfg
from trainer.data import build_dataset, build_loader, loader_workers

held, taken = threading.Lock(), threading.Event()

def hold() -> None:
    with held:
        taken.set()
        time.sleep(3600)

threading.Thread(target=hold, daemon=True).start()
taken.wait()
os.register_at_fork(after_in_child=held.acquire)
cfg = make_cfg(json.loads(sys.argv[1]), batch_size=2, NUM_WORKERS=2)
with loader_workers():
    print(sum(len(batch["label"]) for batch in build_loader(build_dataset(cfg, "val"), cfg, "val")))
"""


def test_workers_start_clear_of_the_locks_the_training_processs_other_threads_hold(
    synthetic_dataset: dict[str, Any]
) -> None:
    """Loader workers start from a fork server, not from the training process: what its other threads held when a
    worker started is not the worker's (forked from the training process, each worker here waits for the lock forever
    and the epoch never loads)."""
    run = subprocess.Popen([sys.executable, "-c", HELD_LOCK_THEN_AN_EPOCH, json.dumps(synthetic_dataset)], cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)  # its stuck workers too
        run.communicate()
        pytest.fail("the validation epoch did not load within 120 s: a worker is stuck on a lock it inherited")
    assert run.returncode == 0, err
    assert int(out) == len(Path(synthetic_dataset["VAL_ANNO_PATH"]).read_text().splitlines())


def family(root: int) -> list[int]:
    """The live processes under ``root``: its children, theirs, and so on."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for a reaper that a container may not have); test_decode_limit's
    ``alive`` counts a zombie as alive, for it asserts a kill and a reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# A training process's stops, as its node's supervisor sends them: to every process of the trainer but itself (here the
# whole family under it), twice; each pass's labels, then whether every one of those processes lived through them.
STOPPED_BETWEEN_TWO_PASSES = """
import json, os, signal, sys, time
from tests.trainer.test_data import family, make_cfg
from trainer.data import build_dataset, build_loader, loader_workers

for sig in (signal.SIGTERM, signal.SIGUSR1):
    signal.signal(sig, lambda *_: None)  # the training process's own (a handler, which exec does not pass on)
cfg = make_cfg(json.loads(sys.argv[1]), batch_size=2, NUM_WORKERS=2)
with loader_workers():
    loader = build_loader(build_dataset(cfg, "val"), cfg, "val")
    passes = [[batch["label"].tolist() for batch in loader]]
    others = family(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        for pid in others:
            os.kill(pid, sig)
    time.sleep(1.0)
    alive = sorted(family(os.getpid())) == sorted(others)
    passes.append([batch["label"].tolist() for batch in loader])
print(json.dumps({"others": len(others), "alive": alive, "passes": passes}))
"""


def test_the_jobs_stops_leave_the_workers_their_fork_server_and_its_resource_tracker_running(
    synthetic_dataset: dict[str, Any]
) -> None:
    """SIGTERM and SIGUSR1 to every process under a training process (its two workers, their fork server,
    multiprocessing's resource tracker) end none of them: the next pass is the same."""
    out = run_trainer("-c", STOPPED_BETWEEN_TWO_PASSES, json.dumps(synthetic_dataset))
    found = json.loads(out.stdout)
    assert found["others"] >= 4 and found["alive"], found  # the server, the tracker, two workers (and their helpers)
    assert found["passes"][0] == found["passes"][1] and found["passes"][0], found


# A training process that read a pass, said which processes it has under it, and waits to be killed.
A_PASS_THEN_WAIT = """
import json, os, sys, time
from tests.trainer.test_data import family, make_cfg
from trainer.data import build_dataset, build_loader

cfg = make_cfg(json.loads(sys.argv[1]), batch_size=2, NUM_WORKERS=2)
loader = build_loader(build_dataset(cfg, "val"), cfg, "val")
assert list(loader)
print(json.dumps(family(os.getpid())), flush=True)
time.sleep(3600)
"""


def test_a_training_process_killed_outright_leaves_no_worker_behind(synthetic_dataset: dict[str, Any]) -> None:
    """SIGKILL to a training process: the kernel kills its workers' fork server, the workers then see their parent
    gone and end, and the resource tracker ends after them: nothing is left 20 s later (torch's status check is
    every 5 s)."""
    run = subprocess.Popen([sys.executable, "-c", A_PASS_THEN_WAIT, json.dumps(synthetic_dataset)], cwd=REPO,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert run.stdout is not None
    under = json.loads(run.stdout.readline())
    try:
        assert len(under) >= 4  # the server, the tracker, two workers
        run.kill()
        run.wait()
        deadline = time.monotonic() + 20
        while any(map(running, under)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in under if running(pid)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # what is left of its session (a pid alone may be another's by now)


def test_two_ranks_evaluate_every_sample_exactly_once(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    odd = Path(synthetic_dataset["VAL_ANNO_PATH"]).read_text().splitlines()[:11]
    data = {**synthetic_dataset, "VAL_ANNO_PATH": str(write_list(tmp_path / "val11.txt", odd))}
    cfg = make_cfg(data, batch_size=4, TEST_NUM_SEGMENT=1, TEST_NUM_CROP=3)
    for split, total in (("val", 11), ("test", 33)):
        dataset = build_dataset(cfg, split)
        seen = [
            i for rank in (0, 1) for batch in build_loader(dataset, cfg, split, rank_ctx(rank, 2))
            for i in batch["index"].tolist()
        ]  # fmt: skip
        assert sorted(seen) == list(range(total))
    train = build_dataset(cfg, "train")
    shards = [build_loader(train, cfg, "train", rank_ctx(rank, 2)).batch_sampler.batches.sampler for rank in (0, 1)]
    for sampler in shards:
        sampler.set_epoch(4)
    assert sorted(i for sampler in shards for i, epoch in sampler if epoch == 4) == list(range(24))


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_videos_are_skipped_and_reported(
    synthetic_dataset: dict[str, Any], tmp_path: Path, workers: int
) -> None:
    data, bad = with_bad_videos(synthetic_dataset, tmp_path)
    cfg = make_cfg(data, batch_size=5, NUM_WORKERS=workers)
    loader = build_loader(build_dataset(cfg, "val"), cfg, "val", None)
    batches = list(loader)
    reported = dict(item for batch in batches for item in batch["bad"])
    assert set(reported) == bad
    assert reported[str(tmp_path / "missing.mp4")] == "missing file"
    assert reported[str(tmp_path / "empty.mp4")] == "empty file (0 bytes)"
    assert reported[str(tmp_path / "random.mp4")].startswith("cannot ")
    assert sum(len(batch["label"]) for batch in batches) == 12
    assert all(batch["video"].shape[0] == len(batch["label"]) for batch in batches)


def test_all_bad_batch_is_empty_but_well_formed(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    data, bad = with_bad_videos(synthetic_dataset, tmp_path)
    only_bad = [
        line for line in Path(data["VAL_ANNO_PATH"]).read_text().splitlines() if str(tmp_path) in line
    ]
    cfg = make_cfg({**data, "VAL_ANNO_PATH": str(write_list(tmp_path / "bad.txt", only_bad))}, batch_size=8)
    (batch,) = list(build_loader(build_dataset(cfg, "test"), cfg, "test", None))
    assert len(batch["label"]) == 0 and len(batch["index"]) == 0 and {p for p, _ in batch["bad"]} == bad


def test_check_dataset_lists_exactly_the_bad_files(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    data, bad = with_bad_videos(synthetic_dataset, tmp_path)
    found = check_dataset(data["VAL_ANNO_PATH"], data["VAL_DATA_PATH"])
    assert {path for path, _ in found} == bad and len(found) == len(bad)
    assert all(reason for _, reason in found)
    assert check_dataset(synthetic_dataset["TRAIN_ANNO_PATH"], synthetic_dataset["TRAIN_DATA_PATH"]) == []
