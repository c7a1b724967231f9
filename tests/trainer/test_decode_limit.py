"""A bad file never hangs or stops a run: decoding under CONFIG.DATA.DECODE_TIME_LIMIT (trainer.data.timelimit), the
run's bad videos kept job-wide (trainer.bad_videos).

The hanging decoder is tests/trainer/_hanging_decoder.py's: decord's reader, stuck in C code with the GIL held on one
file, as in decord #373. The videos are the synthetic task's real H.264 files.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.trainer import _hanging_decoder
from tests.trainer._hanging_decoder import HANGING_ENV, LOG_ENV, entered, hanging_env
from tests.trainer.playlists import live_playlist
from tests.trainer.test_data import make_cfg, write_list
from tests.trainer.test_resume import assert_same_run, wait_for
from tests.trainer.test_train import REPO, metrics, run_trainer, write_config
from trainer import checkpoint
from trainer.bad_videos import BadVideos
from trainer.checkpoint import list_checkpoints
from trainer.data import build_dataset, check_dataset, timelimit, write_annotations_from_tree
from trainer.data import decoders as decoders_module
from trainer.data.decoders import BadVideo, ClipDecoder, DecodeTimeout
from trainer.data.sampling import val_indices
from trainer.data.timelimit import TimeLimit
from trainer.engine import EpochTally, TrainState
from trainer.resume import EpochProgress, rng_state

LIMIT = 4.0  # seconds: far above a good 32x32 clip's decode on a loaded machine, short for a test to wait out


def clip_indices(n: int) -> np.ndarray:
    return val_indices(n, 8, 1, 1)


@pytest.fixture
def hanging(synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The first training video hangs decord in this process (and the helpers and workers forked from it)."""
    path = str(Path(synthetic_dataset["TRAIN_DATA_PATH"]) / "train" / "left" / "left_000.mp4")
    monkeypatch.setenv(HANGING_ENV, path)
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "entered.log"))
    monkeypatch.setitem(decoders_module.READERS, "decord", _hanging_decoder.HangingReader)
    yield path


def good_videos(data: dict[str, Any], count: int) -> list[str]:
    root = Path(data["TRAIN_DATA_PATH"])
    return [str(p) for p in sorted(root.glob("train/right/*.mp4"))[:count]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------------
# The decoder


@pytest.mark.parametrize("choice", ["decord", "auto"])
def test_clips_decoded_in_the_helper_are_the_decoders_own(synthetic_dataset: dict[str, Any], choice: str) -> None:
    """Frames that come back through the helper's shared memory equal those decoded in this process, at the native
    size, at a decode size, and at a short side fitted to a smaller one (a second decode in the same deadline)."""
    video = good_videos(synthetic_dataset, 1)[0]
    for size, short_side in (((-1, -1), None), ((24, 16), None), ((-1, -1), 20)):
        here = ClipDecoder(choice, size)  # type: ignore[arg-type]
        limited = ClipDecoder(choice, size, time_limit=30.0)  # type: ignore[arg-type]
        assert limited.time_limit is not None and here.time_limit is None
        expected = here.clip(video, clip_indices, short_side)
        got = limited.clip(video, clip_indices, short_side)
        assert got.frames.shape == expected.frames.shape and torch.equal(got.frames, expected.frames), size
    assert ClipDecoder("decord", time_limit=0.0).time_limit is None


def test_a_decoder_hung_with_the_gil_held_is_abandoned_and_the_next_video_decodes(
    hanging: str, synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    decoder = ClipDecoder("decord", time_limit=LIMIT)
    good = good_videos(synthetic_dataset, 1)[0]
    decoder.clip(good, clip_indices)
    assert decoder.time_limit is not None
    first_helper = decoder.time_limit.helper().pid
    started = time.monotonic()
    with pytest.raises(DecodeTimeout) as caught:
        decoder.clip(hanging, clip_indices)
    waited = time.monotonic() - started
    assert str(caught.value) == "decoding took longer than 4 s"
    assert LIMIT - 0.5 <= waited < LIMIT + 60, waited  # it waited for the limit, not for the hung decoder
    assert entered(tmp_path / "entered.log") == 1
    assert not alive(first_helper)  # killed and reaped
    again = decoder.clip(good, clip_indices).frames  # a new helper
    assert decoder.time_limit.helper().pid != first_helper
    assert torch.equal(again, ClipDecoder("decord").clip(good, clip_indices).frames)


class CrashingReader(decoders_module.DecordReader):
    def __init__(self, path: str, size: tuple[int, int], device: str = "cpu") -> None:
        os.kill(os.getpid(), signal.SIGSEGV)  # as a decoder that crashes on a file


def test_a_decoder_that_crashes_makes_the_video_bad_not_the_process(
    synthetic_dataset: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(decoders_module.READERS, "decord", CrashingReader)
    decoder = ClipDecoder("decord", time_limit=30.0)
    with pytest.raises(BadVideo) as caught:
        decoder.clip(good_videos(synthetic_dataset, 1)[0], clip_indices)
    assert str(caught.value) == "cannot open: the decoder's process died (killed by SIGSEGV)"
    assert not isinstance(caught.value, DecodeTimeout)


def test_a_helper_stuck_before_it_is_ready_is_forked_again_and_its_start_is_not_charged_to_the_clip(
    synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper forked while another thread of its parent held a lock it needs never says it is ready (here the first
    one forked sleeps instead): it is killed after FORK_LIMIT and another forked, and the clip decodes, its deadline
    (shorter than the stuck start) counted from the ready helper."""
    stuck = tmp_path / "stuck-pid"
    become_helper = timelimit._become_helper

    def first_one_stuck(parent: int) -> None:
        if not stuck.exists():
            stuck.write_text(str(os.getpid()))
            time.sleep(3600)
        become_helper(parent)

    monkeypatch.setattr(timelimit, "_become_helper", first_one_stuck)
    monkeypatch.setattr(timelimit, "FORK_LIMIT", 3.0)
    good = good_videos(synthetic_dataset, 1)[0]
    decoder = ClipDecoder("decord", time_limit=2.0)
    assert torch.equal(decoder.clip(good, clip_indices).frames, ClipDecoder("decord").clip(good, clip_indices).frames)
    first = int(stuck.read_text())
    assert decoder.time_limit is not None and decoder.time_limit.helper().pid != first and not alive(first)


# Two passes of a validation loader with two workers: each batch's bad videos and its number of clips, per pass.
TWO_PASSES = """
import json, sys
from tests.trainer.test_data import make_cfg
from trainer.data import build_dataset, build_loader, loader_workers

cfg = make_cfg(json.loads(sys.argv[1]), batch_size=2, NUM_WORKERS=2, DECODE_TIME_LIMIT=float(sys.argv[2]))
with loader_workers():
    loader = build_loader(build_dataset(cfg, "val"), cfg, "val")
    print(json.dumps([[[batch["bad"], len(batch["label"])] for batch in loader] for _ in range(2)]))
"""


def test_dataloader_workers_share_what_ran_out_of_time(
    hanging: str, synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """Two workers, two passes over a list with the hanging video: both passes name it with the same reason, and only
    the first waits for it (the second pass, in whichever worker, knows it). The workers start from a fork server
    (trainer.data.loader.worker_context): the loader runs in a process whose every interpreter reads with the hanging
    decoder (hanging_env)."""
    videos = [hanging, *good_videos(synthetic_dataset, 5)]
    listing = write_list(tmp_path / "val.txt", [f"{path} 16 0" for path in videos])
    data = {**synthetic_dataset, "VAL_ANNO_PATH": str(listing)}
    out = run_trainer("-c", TWO_PASSES, json.dumps(data), str(LIMIT), **hanging_env(hanging, tmp_path / "entered.log"))
    for batches in json.loads(out.stdout):
        assert [tuple(item) for bad, _ in batches for item in bad] == [(hanging, "decoding took longer than 4 s")]
        assert sum(clips for _, clips in batches) == 5
    assert entered(tmp_path / "entered.log") == 1
    dataset = build_dataset(make_cfg(data, DECODE_TIME_LIMIT=LIMIT), "val")
    dataset.skip_timed_out([(videos[1], "cannot open: no video stream")])  # only a timeout is skipped
    assert "bad" not in dataset[1]


def test_a_mid_epoch_checkpoint_knows_the_runs_bad_videos_and_every_ranks_so_far(tmp_path: Path) -> None:
    """The run's record up to the last epoch, then each rank's tally of the epoch in progress, as a checkpoint file
    holds them: all come back, each video with the first reason it was reported with (the record's, then rank 0's)."""
    hung, missing, twice = "/v/hung.mp4", "/v/missing.mp4", "/v/twice.mp4"
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                       torch.amp.GradScaler("cpu", enabled=False))
    tallies = [EpochTally.start(torch.device("cpu")) for _ in range(2)]
    tallies[0].bad = [(twice, "decoding took longer than 4 s")]
    tallies[1].bad = [(missing, "cannot open: no video stream"), (twice, "cannot open: the decoder's process died"),
                      (hung, "cannot open: no video stream")]
    ranks = [{"tally": tally.record(), "rng": rng_state(torch.device("cpu"))} for tally in tallies]
    ckpt = checkpoint.build_checkpoint(model, state, epoch=1, best_top1=0.5, config_yaml="", metrics={}, inference={},
                                       bad_videos=[[hung, "decoding took longer than 4 s"]],
                                       progress=EpochProgress(1, 3, 0.1, ranks).record())
    torch.save(ckpt, tmp_path / "epoch_0001_step_00000009.pth")
    known = BadVideos.from_checkpoint(torch.load(tmp_path / "epoch_0001_step_00000009.pth", weights_only=True))
    assert known.record() == [[hung, "decoding took longer than 4 s"], [missing, "cannot open: no video stream"],
                              [twice, "decoding took longer than 4 s"]]
    assert BadVideos.from_checkpoint(None).record() == []  # a fresh start knows none


def test_a_decoder_in_a_spawned_helper_as_gpu_decoding_uses_gives_the_same_frames_and_the_same_deadline(
    synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU decoding's helper is a fresh interpreter (CUDA does not survive a fork); here on the CPU, the hanging
    decoder installed in it by hanging_site's sitecustomize (the spawned helper reads the environment, not this
    process's READERS). Its start is not charged to the clip."""
    good = good_videos(synthetic_dataset, 1)[0]
    video = str(Path(synthetic_dataset["TRAIN_DATA_PATH"]) / "train" / "left" / "left_000.mp4")
    for key, value in hanging_env(video, tmp_path / "entered.log").items():
        monkeypatch.setenv(key, value)
    decoder = ClipDecoder("decord", time_limit=LIMIT)
    decoder.time_limit = TimeLimit(LIMIT, spawn=decoders_module.__name__)  # what a GPU device chooses
    assert torch.equal(decoder.clip(good, clip_indices).frames, ClipDecoder("decord").clip(good, clip_indices).frames)
    helper = decoder.time_limit.helper().pid
    started = time.monotonic()
    with pytest.raises(DecodeTimeout, match=r"^decoding took longer than 4 s$"):
        decoder.clip(video, clip_indices)
    assert LIMIT - 0.5 <= time.monotonic() - started < LIMIT + 60
    assert entered(tmp_path / "entered.log") == 1 and not alive(helper)
    assert torch.equal(decoder.clip(good, clip_indices).frames, ClipDecoder("decord").clip(good, clip_indices).frames)


def test_check_data_decodes_each_video_by_the_time_limit_and_names_the_one_that_ran_out(
    hanging: str, synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """The hung video is bad with its reason, and not given to the other decoder (it would wait as long again)."""
    videos = [hanging, *good_videos(synthetic_dataset, 3)]
    listing = write_list(tmp_path / "val.txt", [f"{path} 16 0" for path in videos])
    started = time.monotonic()
    bad = check_dataset(listing, synthetic_dataset["TRAIN_DATA_PATH"], "decord", LIMIT)
    assert bad == [(hanging, "decoding took longer than 4 s")]
    assert time.monotonic() - started < LIMIT + 60 and entered(tmp_path / "entered.log") == 1


def test_check_data_refuses_a_live_playlist_unread(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    """A live HLS playlist named like a video, its segments a private file: decord would wait for its next segment
    for ever (here until the time limit). check-data names it unread."""
    playlist = str(live_playlist(tmp_path / "videos" / "live.mp4", tmp_path / "private"))
    good = good_videos(synthetic_dataset, 2)
    listing = write_list(tmp_path / "val.txt", [f"{path} 16 0" for path in [good[0], playlist, good[1]]])
    for decoder in ("decord", "torchcodec", "auto"):
        assert check_dataset(listing, synthetic_dataset["TRAIN_DATA_PATH"], decoder, LIMIT) == [  # type: ignore[arg-type]
            (playlist, "an HLS playlist, not a video: refused unread (a playlist or stream description would make the "
                       "decoder read the files or streams it names)")]
    text = tmp_path / "videos" / "notes.mp4"
    text.write_text("ffconcat version 1.0\nfile 'private.mp4'\n")
    with pytest.raises(BadVideo, match=r"^a text file, not a video: refused unread"):
        ClipDecoder("auto").clip(str(text), clip_indices)


class HangingOpen(decoders_module.DecordReader):
    """decord stuck in C while opening one file (the hanging decoder's file), with the GIL held."""

    def __init__(self, path: str, size: tuple[int, int], device: str = "cpu") -> None:
        if path == os.environ[HANGING_ENV]:
            ctypes.PyDLL(None).sleep(3600)
        super().__init__(path, size, device)


def test_make_annotations_opens_each_video_by_the_time_limit(
    hanging: str, synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(decoders_module.READERS, "decord", HangingOpen)
    root = tmp_path / "tree"
    (root / "left").mkdir(parents=True)
    for video in [hanging, *good_videos(synthetic_dataset, 2)]:
        os.symlink(video, root / "left" / Path(video).name)
    monkeypatch.setenv(HANGING_ENV, str(root / "left" / Path(hanging).name))  # as the tree names it
    made = write_annotations_from_tree(root, tmp_path / "lists", val_fraction=0.0, time_limit=LIMIT)
    assert made.skipped == [(os.environ[HANGING_ENV], "decoding took longer than 4 s")]
    assert len(made.train.read_text().splitlines()) == 2


def test_check_data_runs_under_the_configs_time_limit(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    """python -m trainer check-data: the config's DECODE_TIME_LIMIT bounds each video."""
    cfg, env = hanging_run(synthetic_dataset, tmp_path, "check", workers=1, epochs=1, loader_workers=0)
    out = run_trainer("-m", "trainer", "check-data", "--config-file", cfg, check=False, **env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout.splitlines() == [f"BAD {env[HANGING_ENV]}: decoding took longer than 4 s", "1 bad video(s)"]
    assert entered(Path(env[LOG_ENV])) == 1


# ---------------------------------------------------------------------------------------------------------------------
# Whole runs


def hanging_run(data: dict[str, Any], tmp: Path, name: str, workers: int, epochs: int, loader_workers: int,
                minutes: float = 0.0) -> tuple[Path, dict[str, str]]:
    """A config whose first training video hangs the decoder, and the environment that makes it so."""
    video = str(Path(data["TRAIN_DATA_PATH"]) / "train" / "left" / "left_000.mp4")
    cfg = write_config(tmp / f"{name}.yaml", data, tmp / name, workers=workers,
                       TRAIN={"EPOCH_NUM": epochs, "CHECKPOINT_MINUTES": minutes},
                       DATA={"NUM_WORKERS": loader_workers, "DECODE_TIME_LIMIT": LIMIT}, LOG={"DISPLAY_FREQ": 1})
    return cfg, hanging_env(video, tmp / f"{name}.entered")


def test_a_run_goes_on_past_a_hung_decoder_and_reports_the_file(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """One process, one DataLoader worker, two epochs: the hung file costs the time limit once, is skipped in the
    second epoch without decoding, and is named with its reason in bad_videos.json, the checkpoints and the end of
    the log."""
    cfg, env = hanging_run(synthetic_dataset, tmp_path, "run", workers=1, epochs=2, loader_workers=1)
    out = run_trainer("-m", "trainer.train", "--config-file", cfg, **env)
    run_dir, video = tmp_path / "run", env[HANGING_ENV]
    assert [(r["epoch"], r["bad_videos"]) for r in metrics(run_dir)] == [(1, 1), (2, 1)]
    assert entered(Path(env[LOG_ENV])) == 1
    expected = [[video, "decoding took longer than 4 s"]]
    assert json.loads((run_dir / "bad_videos.json").read_text()) == {
        "count": 1, "videos": [{"path": video, "reason": "decoding took longer than 4 s"}]}
    assert torch.load(run_dir / "checkpoints" / "epoch_0002.pth", weights_only=True)["bad_videos"] == expected
    assert json.loads((run_dir / "status.json").read_text())["bad_videos"] == 1
    assert "1 bad video(s) in this run, not trained or evaluated on:" in out.stdout
    assert f"  {video}: decoding took longer than 4 s" in out.stdout


def test_a_resumed_run_knows_what_ran_out_of_time_from_its_checkpoint(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """One process trains an epoch past the hung file; the run, given a second epoch, resumes from that epoch's
    checkpoint and never decodes the file again, in training or evaluation, and still names it."""
    cfg, env = hanging_run(synthetic_dataset, tmp_path, "run", workers=1, epochs=1, loader_workers=1)
    run_trainer("-m", "trainer.train", "--config-file", cfg, **env)
    assert entered(Path(env[LOG_ENV])) == 1
    cfg, env = hanging_run(synthetic_dataset, tmp_path, "run", workers=1, epochs=2, loader_workers=1)
    out = run_trainer("-m", "trainer.train", "--config-file", cfg, **env)
    assert f"resumed from {tmp_path / 'run' / 'checkpoints' / 'epoch_0001.pth'} at epoch 1" in out.stdout, out.stdout
    assert entered(Path(env[LOG_ENV])) == 1  # known from the checkpoint: never decoded again
    assert [(r["epoch"], r["bad_videos"]) for r in metrics(tmp_path / "run")] == [(1, 1), (2, 1)]
    assert json.loads((tmp_path / "run" / "bad_videos.json").read_text())["videos"] == [
        {"path": env[HANGING_ENV], "reason": "decoding took longer than 4 s"}]

@pytest.mark.slow
def test_a_run_with_a_hung_decoder_is_the_same_on_a_rerun_and_on_a_resume(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """Two processes with a DataLoader worker each: the run, the same run again, and the run killed mid-epoch after
    the hang and resumed end with the same weights and records; the resumed run knows the file from its checkpoint
    and never decodes it again."""
    runs = {}
    for name in ("first", "rerun"):
        cfg, env = hanging_run(synthetic_dataset, tmp_path, name, workers=2, epochs=3, loader_workers=1)
        run_trainer("-m", "trainer.train", "--config-file", cfg, **env)
        assert entered(Path(env[LOG_ENV])) == 1
        runs[name] = tmp_path / name
    assert_same_run(runs["rerun"], runs["first"])

    cfg, env = hanging_run(synthetic_dataset, tmp_path, "resumed", workers=2, epochs=3, loader_workers=1,
                           minutes=1e-6)
    ckpts, log = tmp_path / "resumed" / "checkpoints", Path(env[LOG_ENV])
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", "--config-file", str(cfg)],
                            cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    looked: dict[Path, bool] = {}

    def a_checkpoint_knows_the_file() -> bool:  # each mid-epoch checkpoint is read once
        for path in sorted(ckpts.glob("epoch_*_step_*.pth")):
            if path not in looked:
                try:
                    known = BadVideos.from_checkpoint(torch.load(path, weights_only=True)).reasons
                except FileNotFoundError:
                    continue  # listed, then removed as a newer one came (the two newest stay)
                looked[path] = known.get(env[HANGING_ENV]) == "decoding took longer than 4 s"
        return any(knows and path.exists() for path, knows in looked.items())

    try:
        wait_for(a_checkpoint_knows_the_file, [proc], "a mid-epoch checkpoint after the hang")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    looked.clear()
    a_checkpoint_knows_the_file()  # what the kill left
    newest = max(path for path, knows in looked.items() if knows)
    for newer in list_checkpoints(ckpts, mid_epoch=True):  # as if the kill had come right after that checkpoint
        if checkpoint.checkpoint_order(newer.name) > checkpoint.checkpoint_order(newest.name):
            newer.unlink()
    out = run_trainer("-m", "trainer.train", "--config-file", cfg, **env)
    assert f"resumed from {newest} at epoch" in out.stdout and "(mid-epoch: " in out.stdout, out.stdout[-3000:]
    assert entered(log) == 1  # known from the checkpoint: never decoded again
    assert_same_run(tmp_path / "resumed", runs["first"])
