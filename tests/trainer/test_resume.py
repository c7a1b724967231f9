"""Mid-epoch checkpoints, exact resume, a stop at a common step, checkpoints on two nodes, exit statuses.

The runs are real: ``python -m trainer.train`` with two gloo processes on the synthetic H.264 videos, killed or
signalled from outside while they train, then started again. Each interrupted run must end with the weights
(weights_digest.json) and the metrics.jsonl epoch records of one uninterrupted run with the same seed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from tests.ports import free_port
from tests.trainer.test_train import REPO, run_trainer, write_config
from trainer import checkpoint
from trainer.checkpoint import CheckpointWriter, cpu_copy, list_checkpoints, save_checkpoint
from trainer.config import validate_config
from trainer.data import VideoClipDataset, build_dataset, build_loader
from trainer.data.loader import set_loader_epoch, skip_batches
from trainer.errors import UserError
from trainer.reporting import attempt_from_env, attempt_record, read_metrics, read_records
from trainer.resume import NodeCheckpoints, choose_checkpoint
from trainer.runtime.contract import ATTEMPT_ENV, HEARTBEAT_INTERVAL_ENV
from trainer.runtime.job.pace import read_beat

EPOCHS = 3  # 6 optimizer steps each: 12 clips per rank in batches of 2
EVERY_STEP = 1e-6  # CHECKPOINT_MINUTES so short that a checkpoint is due after every step


def config(data: dict[str, Any], tmp: Path, name: str, minutes: float = 0.0) -> Path:
    """The two-process experiment every test here runs, with its own run directory tmp/name."""
    return write_config(tmp / f"{name}.yaml", data, tmp / name, workers=2,
                        TRAIN={"EPOCH_NUM": EPOCHS, "CHECKPOINT_MINUTES": minutes}, LOG={"DISPLAY_FREQ": 1})


def digests(run_dir: Path) -> list[str]:
    return json.loads((run_dir / "weights_digest.json").read_text())["digests"]


def start(cfg: Path, heartbeats: Path | None = None, **env: str) -> subprocess.Popen[str]:
    """``python -m trainer.train`` in its own process group (so a test can freeze or kill all of it)."""
    extra = {"VIDCLUSTER_HEARTBEAT_DIR": str(heartbeats)} if heartbeats is not None else {}
    return subprocess.Popen([sys.executable, "-m", "trainer.train", "--config-file", str(cfg)], cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **extra, **env}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition: Callable[[], bool], procs: list[subprocess.Popen[str]], what: str) -> None:
    """Poll until ``condition`` holds; if a process ends first, or 4 minutes pass, kill them all and fail."""
    deadline = time.monotonic() + 240
    while not condition():
        if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            ends = [(proc.returncode, *(text[-2000:] for text in proc.communicate())) for proc in procs]
            raise AssertionError(f"never saw {what}: {ends}")
        time.sleep(0.01)


@contextlib.contextmanager
def frozen(procs: list[subprocess.Popen[str]]) -> Iterator[None]:
    """Every process group stopped (SIGSTOP) while the block runs: what it does happens at one point of training."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGCONT)


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout} s:\n{out[-3000:]}\n{err[-3000:]}") from None
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def uninterrupted(synthetic_dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the experiment run from start to end, without mid-epoch checkpoints."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    run_trainer("-m", "trainer.train", "--config-file", config(synthetic_dataset, tmp, "run"))
    records = read_metrics(tmp / "run" / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2, 3] and len(set(digests(tmp / "run"))) == 1
    # every video good: a reference that lost one (a decode helper that never answered) fails here, saying why
    assert [r["bad_videos"] for r in records] == [0, 0, 0], (tmp / "run" / "bad_videos.json").read_text()
    return tmp / "run"


def assert_same_run(run_dir: Path, reference: Path, metrics_dir: Path | None = None) -> None:
    """The final weights of every rank and the epoch records are those of the reference run, exactly."""
    assert digests(run_dir) == digests(reference)
    assert read_metrics((metrics_dir or run_dir) / "metrics.jsonl") == read_metrics(reference / "metrics.jsonl")


# ---------------------------------------------------------------------------------------------------------------------
# Whole runs


def test_killed_mid_epoch_resumes_exactly(
    synthetic_dataset: dict[str, Any], uninterrupted: Path, tmp_path: Path
) -> None:
    """SIGKILL of the whole job in its second epoch, a checkpoint after every step: the run started again resumes
    from the newest mid-epoch checkpoint and ends as the uninterrupted run did."""
    cfg = config(synthetic_dataset, tmp_path, "run", minutes=EVERY_STEP)
    ckpts = tmp_path / "run" / "checkpoints"
    proc = start(cfg)
    try:
        wait_for(lambda: any(ckpts.glob("epoch_0001_step_*.pth")), [proc], "a mid-epoch checkpoint in epoch 2")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both workers
        proc.communicate()
    mid = [p for p in list_checkpoints(ckpts, mid_epoch=True) if checkpoint.is_mid_epoch(p.name)][-1]
    for newer in list_checkpoints(ckpts):  # as if the kill had come before any later epoch checkpoint
        if checkpoint.checkpoint_order(newer.name) > checkpoint.checkpoint_order(mid.name):
            newer.unlink()

    out = run_trainer("-m", "trainer.train", "--config-file", cfg)
    assert f"resumed from {mid} at epoch" in out.stdout and "(mid-epoch: " in out.stdout, out.stdout[-3000:]
    assert_same_run(tmp_path / "run", uninterrupted)


def test_sigterm_to_one_worker_stops_every_rank_at_one_step_and_the_resume_loses_none(
    synthetic_dataset: dict[str, Any], uninterrupted: Path, tmp_path: Path
) -> None:
    """SIGTERM to rank 1 alone (spawned workers): every rank checkpoints at the same step, the command ends with
    status 75 and says so; started again as a restarted attempt, it resumes at that step and ends as the
    uninterrupted run did, with the attempt on record."""
    cfg = config(synthetic_dataset, tmp_path, "run")
    run_dir, heartbeats = tmp_path / "run", tmp_path / "heartbeats"
    heartbeats.mkdir()
    proc = start(cfg, heartbeats, **{HEARTBEAT_INTERVAL_ENV: "0.2"})
    wait_for(lambda: (run_dir / "checkpoints" / "epoch_0001.pth").exists(), [proc], "the first epoch's checkpoint")
    with frozen([proc]):
        rank0 = json.loads((run_dir / "status.json").read_text())["pid"]
        rank1 = {int(f.name) for f in heartbeats.iterdir() if f.name.isdigit()} - {proc.pid, rank0}
        assert len(rank1) == 1, rank1
        # each rank's heartbeat carries its step clock's sums (trainer/pace.py: what the hub paces the nodes by)
        efforts = [beat.effort for pid in (rank0, *rank1) if (beat := read_beat(heartbeats / str(pid))) is not None]
        assert len(efforts) == 2 and all(e is not None and e.steps >= 1 and e.compute_s > 0 and e.start_step == 0
                                         for e in efforts), efforts
        os.kill(rank1.pop(), signal.SIGTERM)
    code, _, err = finish(proc)
    status = json.loads((run_dir / "status.json").read_text())
    step = status["step"]
    epoch = (step - 1) // 6  # the epoch the step belongs to, 0-based
    name = checkpoint.checkpoint_name(epoch, step)
    assert code == 75, err[-3000:]
    assert err.splitlines()[-1] == (f"preempted: stopped on a signal at step {step} (epoch {epoch + 1}) with "
                                    f"checkpoint {name}; start again to resume"), err[-3000:]
    assert status["state"] == "preempted" and 6 < step <= 18, status
    saved = torch.load(run_dir / "checkpoints" / name, weights_only=True)
    assert saved["step"] == step and len(saved["progress"]["ranks"]) == 2

    attempt = {"attempt": 1, "cause": "preempted", "node": "node0", "detected_at": time.time(), "detect_s": 0.5,
               "failed_step": step}
    out = run_trainer("-m", "trainer.train", "--config-file", cfg, **{ATTEMPT_ENV: json.dumps(attempt)})
    assert f"resumed from {run_dir / 'checkpoints' / name} at epoch {epoch}, step {step}" in out.stdout
    assert_same_run(run_dir, uninterrupted)
    records = [r for r in read_records(run_dir / "metrics.jsonl") if "epoch" not in r]
    assert len(records) == 1 and records[0]["resumed_step"] == step and records[0]["steps_lost"] == 0, records
    assert 0 < records[0]["restart_s"] < 300 and records[0]["cause"] == "preempted"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["attempts"] == records
    assert status["clips_per_s"] > 0 and status["running"]["step"] == 18 and 0 <= status["running"]["train_top1"] <= 100


def node_env(rank: int, port: int) -> dict[str, str]:
    """One process per node, started the way srun or torchrun start each task: its place in the environment."""
    return {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def test_two_nodes_keep_a_copy_each_and_resume_from_node_1_when_rank_0_lost_its_own(
    synthetic_dataset: dict[str, Any], uninterrupted: Path, tmp_path: Path
) -> None:
    """Two nodes, each with its own run directory: SIGUSR1 to node 1 stops both (status 75 from each) with the same
    checkpoint on both. Rank 0's directory is then wiped (its node replaced by an empty spare): the job resumes from
    node 1's copy and ends as the uninterrupted run did, and both metrics.jsonl hold exactly its records."""
    cfgs = [config(synthetic_dataset, tmp_path, f"node{rank}") for rank in (0, 1)]
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    port = free_port()
    procs = [start(cfg, **node_env(rank, port)) for rank, cfg in enumerate(cfgs)]
    wait_for(lambda: (dirs[1] / "checkpoints" / "epoch_0001.pth").exists(), procs, "node 1's copy of epoch 1")
    with frozen(procs):
        procs[1].send_signal(signal.SIGUSR1)
    results = [finish(proc) for proc in procs]
    assert [code for code, _, _ in results] == [75, 75], [err[-2000:] for _, _, err in results]
    names = [sorted(p.name for p in list_checkpoints(d / "checkpoints", mid_epoch=True)) for d in dirs]
    assert names[0] == names[1] and any(checkpoint.is_mid_epoch(n) for n in names[0]), names
    assert read_records(dirs[1] / "metrics.jsonl") == read_records(dirs[0] / "metrics.jsonl") != []

    shutil.rmtree(dirs[0])
    port = free_port()
    procs = [start(cfg, **node_env(rank, port)) for rank, cfg in enumerate(cfgs)]
    results = [finish(proc) for proc in procs]
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    assert f"rank 0 holds no copy of {names[1][-1]}: read by rank 1" in results[0][1]
    assert_same_run(dirs[0], uninterrupted)
    assert read_records(dirs[1] / "metrics.jsonl") == read_records(dirs[0] / "metrics.jsonl")
    assert (dirs[1] / "checkpoints" / f"epoch_{EPOCHS:04d}.pth").is_file()


def test_nodes_that_share_the_run_directory_write_it_once(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run", workers=2, TRAIN={"EPOCH_NUM": 1})
    port = free_port()
    procs = [start(cfg, **node_env(rank, port)) for rank in (0, 1)]
    results = [finish(proc) for proc in procs]
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    assert [r["epoch"] for r in read_records(tmp_path / "run" / "metrics.jsonl")] == [1]  # not twice
    assert "node 1 sees this run directory (shared storage): rank 0 alone writes the checkpoints" in results[0][1]
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")] == []  # the marker is gone


def test_data_that_disappears_mid_run_ends_it_with_one_line_and_status_2(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """The training videos vanish after the first epoch (an unmounted share): the run ends at the end of the first
    epoch that could read none of them, with one error line naming the list and the folder, and status 2 (no
    restart can fix it), not a traceback."""
    videos = tmp_path / "videos"
    shutil.copytree(synthetic_dataset["TRAIN_DATA_PATH"], videos)
    data = {**synthetic_dataset, "TRAIN_DATA_PATH": str(videos)}
    cfg = write_config(tmp_path / "cfg.yaml", data, tmp_path / "run", TRAIN={"EPOCH_NUM": EPOCHS})
    proc = start(cfg)
    wait_for(lambda: (tmp_path / "run" / "checkpoints" / "epoch_0001.pth").exists(), [proc], "epoch 1's checkpoint")
    with frozen([proc]):
        videos.rename(tmp_path / "gone")
    code, _, err = finish(proc)
    assert code == 2, err[-3000:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    line = err.splitlines()[0]
    assert line.startswith("error: CONFIG.DATA.TRAIN_ANNO_PATH: none of the 24 video(s) tried in epoch "), line
    assert f"(e.g. {videos}/" in line and "check that CONFIG.DATA.TRAIN_DATA_PATH is in place" in line
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "failed"


# ---------------------------------------------------------------------------------------------------------------------
# The parts


def test_checkpoint_files_sort_by_step_and_the_two_newest_mid_epoch_ones_stay(tmp_path: Path) -> None:
    for epoch, step in ((1, None), (1, 8), (1, 9), (2, None), (2, 14), (3, None), (4, None)):
        save_checkpoint({"epoch": epoch, "step": step}, tmp_path, epoch, is_best=False, keep_last=2, step=step)
    assert [p.name for p in list_checkpoints(tmp_path, mid_epoch=True)] == [
        "epoch_0001_step_00000009.pth", "epoch_0002_step_00000014.pth", "epoch_0003.pth", "epoch_0004.pth"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["epoch_0003.pth", "epoch_0004.pth"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in list_checkpoints(tmp_path, mid_epoch=True)]


def test_the_writer_saves_the_state_as_it_was_when_submitted_and_reports_its_failure(tmp_path: Path) -> None:
    model = torch.nn.Linear(256, 256)
    state = {"model": model.state_dict(), "step": 3}
    copy = cpu_copy(state)
    shared = [k for k, v in state["model"].items()
              if copy["model"][k].untyped_storage().data_ptr() == v.untyped_storage().data_ptr()]
    assert shared == [], "the snapshot shares memory with the live tensors"
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    writer = CheckpointWriter(tmp_path, keep_last=2)
    path = writer.submit(state, 0, step=3)
    with torch.no_grad():
        model.weight.add_(1.0)  # training goes on while the file is written
    writer.wait()
    saved = torch.load(path, weights_only=True)["model"]
    assert all(torch.equal(saved[k], v) for k, v in expected.items())

    class Unpicklable:
        def __reduce__(self) -> Any:
            raise RuntimeError("disk full")

    writer.submit({"x": Unpicklable()}, 0, step=4)
    with pytest.raises(RuntimeError, match="disk full"):
        writer.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file, the older one kept


def listing(*names: str, last: str | None = None) -> NodeCheckpoints:
    return NodeCheckpoints(names, last)


E1, E2, M7, M9 = "epoch_0001.pth", "epoch_0002.pth", "epoch_0002_step_00000007.pth", "epoch_0002_step_00000009.pth"


@pytest.mark.parametrize(("listings", "expected"), [
    ([None], None),  # a fresh run
    ([listing(E1, E2), None], (E2, 0)),  # one node: its newest
    ([listing(E1, E2, M9), None, listing(E1, E2, M7), None], (E2, 0)),  # M9, M7 on one node each: not yet twins
    ([listing(E1, E2, M9), listing(E1, E2, M9)], (M9, 0)),
    ([listing(), listing(E1, M7)], (M7, 1)),  # rank 0's node is an empty spare: node 1's copy, read by node 1
    ([listing(E1, M9), listing(E1, M7, last=M7)], (M7, 1)),  # M9's twin was never written; the run resumed from M7
], ids=["fresh", "one-node", "newest-not-on-two", "twins", "spare-rank-0", "last-resumed"])
def test_resume_takes_the_newest_checkpoint_that_counts(listings: list[Any], expected: tuple[str, int] | None) -> None:
    assert choose_checkpoint(listings) == expected


def test_checkpoints_none_of_which_counts_are_named_in_the_error() -> None:
    with pytest.raises(UserError, match=rf"no checkpoint is held by two nodes \(rank 0: {M9}; rank 1: {M7}\)"):
        choose_checkpoint([listing(M9), listing(M7)])


class CountingDataset(VideoClipDataset):
    """Counts every item it decodes in this process (a loader's workers, which unpickle it, count in theirs)."""

    read: ClassVar[list[int]] = []

    def __getitem__(self, key: Any) -> dict[str, Any]:
        self.read.append(key[0])
        return super().__getitem__(key)


@pytest.mark.parametrize(("multigrid", "workers"), [(False, 0), (True, 2)], ids=["in-process", "multigrid-workers"])
def test_a_resumed_pass_starts_at_its_batch_without_reading_the_ones_before(
    synthetic_dataset: dict[str, Any], multigrid: bool, workers: int
) -> None:
    cycles = {"MULTIGRID": {"USE_SHORT_CYCLE": True, "USE_LONG_CYCLE": False}} if multigrid else {}
    cfg = validate_config({"CONFIG": {"DATA": {**synthetic_dataset, "MULTIGRID": multigrid, "CROP_SIZE": 32,
                                               "SHORT_SIDE_SIZE": 32, "CLIP_LEN": 4, "NUM_WORKERS": workers},
                                      "TRAIN": {"BATCH_SIZE": 2, **cycles}}})
    plain = build_dataset(cfg, "train")
    read = CountingDataset.read

    def loader_at_epoch_2() -> Any:
        loader = build_loader(CountingDataset(plain.records, "train", plain.spec, seed=plain.seed), cfg, "train", None)
        set_loader_epoch(loader, 2)
        return loader

    full = [batch["index"].tolist() for batch in loader_at_epoch_2()]
    read.clear()
    resumed = loader_at_epoch_2()  # a resumed run's loader: its first pass is the rest of the epoch
    skip_batches(resumed, 3)
    assert len(resumed) == len(full) - 3
    rest = [batch["index"].tolist() for batch in resumed]
    assert rest == full[3:] and len(rest) > 1
    if workers == 0:  # (workers read in their own processes)
        assert sorted(read) == sorted(i for batch in full[3:] for i in batch)  # the skipped batches were never read
    assert [batch["index"].tolist() for batch in resumed] == full  # the next pass is whole again


def test_the_supervisors_attempt_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ATTEMPT_ENV, raising=False)
    assert attempt_from_env() is None
    good = {"attempt": 2, "cause": "exit 1", "node": "n1", "detected_at": 1.5, "detect_s": 3, "failed_step": None}
    monkeypatch.setenv(ATTEMPT_ENV, json.dumps(good))
    assert attempt_from_env() == good
    monkeypatch.setenv(ATTEMPT_ENV, json.dumps({**good, "attempt": "2", "node": None}))
    with pytest.raises(UserError, match=r"lacks or mistypes attempt \(int\), node \(str\)"):
        attempt_from_env()
    monkeypatch.setenv(ATTEMPT_ENV, "{")
    with pytest.raises(UserError, match=rf"{ATTEMPT_ENV}: not JSON"):
        attempt_from_env()



def test_an_attempt_that_resumed_past_the_failed_step_lost_none() -> None:
    # The hub's failed step is the last one rank 0 had reported when it named the failure; a stop where every rank
    # checkpoints at its next step (a straggler's swap, a preemption) resumes past it (the real cluster's swap
    # recorded -4 steps lost before).
    told = {"attempt": 1, "cause": "slow", "node": "node1", "detected_at": 10.0, "detect_s": 0.0, "failed_step": 96}
    assert attempt_record(told, 100, 12.0)["steps_lost"] == 0
    assert attempt_record(told, 90, 12.0)["steps_lost"] == 6  # a crash: what was trained since the checkpoint
    assert attempt_record({**told, "failed_step": None}, 90, 12.0)["steps_lost"] is None
