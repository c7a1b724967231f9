"""Runs that end: every command, in every launch mode, with DataLoader workers, ends within seconds of its last log
line, and a stopped one with its preempted status.

Loader workers ignore SIGTERM (a stop signal sent to the process group is the training process's), which is how
multiprocessing ends daemonic children at exit before joining them: a run whose loaders are still alive at exit
waited for them forever. Whether they are still alive then depends on when Python's cyclic collector last ran (the
run's objects sit in reference cycles), so the runs here are made with the collector off in every process
(a sitecustomize on PYTHONPATH): the case where nothing collected them, every time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.test_train import REPO, write_config

LOADER_WORKERS = 2


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no-cyclic-gc")
    (site / "sitecustomize.py").write_text("import gc\ngc.disable()\n")
    return {**os.environ, "PYTHONPATH": f"{site}:{REPO}", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_to_end(command: list[str], env: dict[str, str], log: Path, limit: float = 300) -> subprocess.CompletedProcess:
    """Run a command (its own process group) to its end; fail if it is still running ``limit`` seconds after its start,
    or ended more than 20 s after its last log line (``log``'s last write)."""
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        last = f"{time.time() - log.stat().st_mtime:.0f} s" if log.exists() else "never"
        pytest.fail(f"{command[1:4]} still ran {limit:.0f} s after its start (its last log line: {last} ago):\n"
                    f"{out[-2000:]}")
    after_last_line = time.time() - log.stat().st_mtime
    assert after_last_line < 20, f"{command[1:4]} ended {after_last_line:.0f} s after its last log line"
    return subprocess.CompletedProcess(command, proc.returncode, out, "")


def train_config(tmp: Path, data: dict[str, Any], workers: int, epochs: int = 1) -> Path:
    """The test trainer's config with loader workers and several batches per epoch (24 videos, 4 per step)."""
    return write_config(tmp / "cfg.yaml", data, tmp / "run", workers=workers,
                        TRAIN={"EPOCH_NUM": epochs, "CHECKPOINT_MINUTES": 0},
                        DATA={"NUM_WORKERS": LOADER_WORKERS, "PREFETCH_FACTOR": 2})


@pytest.mark.parametrize("mode", ["one process", "torchrun"])
def test_training_ends_whatever_the_launch_mode(
    mode: str, synthetic_dataset: dict[str, Any], env: dict[str, str], tmp_path: Path
) -> None:
    cfg = train_config(tmp_path, synthetic_dataset, workers=1 if mode == "one process" else 2)
    launcher = [sys.executable] if mode == "one process" else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = run_to_end([*launcher, "-m", "trainer.train", "--config-file", str(cfg)], env, tmp_path / "run" / "log.txt")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "final weights identical" in (tmp_path / "run" / "log.txt").read_text()


def test_the_trainers_own_workers_then_test_and_predict_end(
    synthetic_dataset: dict[str, Any], env: dict[str, str], tmp_path: Path
) -> None:
    cfg = train_config(tmp_path, synthetic_dataset, workers=2)
    run = tmp_path / "run"
    trained = run_to_end([sys.executable, "-m", "trainer.train", "--config-file", str(cfg)], env, run / "log.txt")
    assert trained.returncode == 0, trained.stdout[-3000:]
    tested = run_to_end([sys.executable, "-m", "trainer.test", "--config-file", str(cfg)], env, run / "log.txt")
    assert tested.returncode == 0, tested.stdout[-3000:]
    assert (run / "test_results.json").is_file()
    video = next(Path(synthetic_dataset["VAL_DATA_PATH"]).glob("val/left/*.mp4"))
    started = time.monotonic()
    predicted = subprocess.run([sys.executable, "-m", "trainer", "predict", str(video), "--config-file", str(cfg),
                                "--checkpoint", str(run / "checkpoints" / "best.pth")], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300, check=False)
    assert predicted.returncode == 0 and predicted.stdout.startswith(f"{video}:"), predicted.stderr[-3000:]
    assert time.monotonic() - started < 120


def test_a_stopped_run_with_loader_workers_ends_with_its_preempted_status(
    synthetic_dataset: dict[str, Any], env: dict[str, str], tmp_path: Path
) -> None:
    # SIGTERM to the whole process group (what a scheduler sends): the loader workers ignore it, the two training
    # processes agree on a step, checkpoint it and end with 75, and their workers end with them. The stop is asked
    # for again and again until the run has ended (a supervisor and a scheduler both signal; the launcher passes each
    # on): a process on its way out must not die of one.
    cfg = train_config(tmp_path, synthetic_dataset, workers=2, epochs=200)
    run = tmp_path / "run"
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trainer.train", "--config-file", str(cfg)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((run / "checkpoints").glob("epoch_0001*.pth")) and time.monotonic() < deadline:
            assert proc.poll() is None, ("the run ended before it was stopped", said(run / "status.json"),
                                         said(stderr)[-3000:])
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.02)
        assert proc.wait(timeout=1) == 75
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "stopped on a signal at step" in (run / "log.txt").read_text()
    assert group_gone(proc.pid, within=20), "a process of the stopped run is still there (a loader worker?)"


def said(path: Path) -> str:
    """A file's text for a failure's message ("" when it was never written)."""
    return path.read_text() if path.exists() else ""


def group_gone(pgid: int, within: float) -> bool:
    """Whether every process of the group has ended within ``within`` seconds (multiprocessing's resource tracker
    ends a moment after the processes it served)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def torchrun_workers(torchrun_pid: int) -> dict[int, int]:
    """{RANK: pid} of the worker processes a torchrun process started (its agent's children)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == torchrun_pid:
                env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
                found[int(env[b"RANK"])] = int(entry.name)
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile, or not a worker
    return found


@pytest.mark.slow
def test_torchrun_restarts_after_a_killed_worker_resume_and_finish_every_time(
    synthetic_dataset: dict[str, Any], env: dict[str, str], tmp_path: Path
) -> None:
    # Four runs, each with one worker SIGKILLed after the first epoch's checkpoint (rank 0, rank 1, rank 0, rank 1):
    # every one resumes from its checkpoint and ends with the uninterrupted run's weights, within the time limit (a
    # restart that waited on its peers would run into it).
    def torchrun(folder: Path) -> subprocess.Popen[str]:
        folder.mkdir()
        cfg = write_config(folder / "cfg.yaml", synthetic_dataset, folder / "run", workers=2,
                           TRAIN={"EPOCH_NUM": 8, "CHECKPOINT_MINUTES": 0},
                           DATA={"NUM_WORKERS": LOADER_WORKERS, "PREFETCH_FACTOR": 2})
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 "2", "--max-restarts", "2", "-m", "trainer.train", "--config-file", str(cfg)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def digest(folder: Path) -> str:
        return json.loads((folder / "run" / "weights_digest.json").read_text())["digests"][0]

    reference = tmp_path / "reference"
    assert torchrun(reference).wait(timeout=300) == 0
    for attempt, victim in enumerate([0, 1, 0, 1]):
        folder = tmp_path / f"killed{attempt}"
        proc = torchrun(folder)
        try:
            deadline = time.monotonic() + 240
            while not (folder / "run" / "checkpoints" / "epoch_0001.pth").exists():
                assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint of epoch 1"
                time.sleep(0.2)
            os.kill(torchrun_workers(proc.pid)[victim], signal.SIGKILL)
            assert proc.wait(timeout=240) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        log = (folder / "run" / "log.txt").read_text()
        assert "resumed from" in log, f"run {attempt} (rank {victim} killed) did not resume"
        assert digest(folder) == digest(reference), f"run {attempt} (rank {victim} killed) ended with other weights"
