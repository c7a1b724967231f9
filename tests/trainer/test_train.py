"""End-to-end trainer runs: real processes, real gloo, real H.264 videos decoded by decord.

The runs are small (a tiny I3D on 32 px, 8-frame clips) but go through exactly the code a cluster runs:
``python -m trainer.train`` spawning its workers, checkpoints, resume, multi-view test and predict.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(path: Path, data: dict[str, Any], run_dir: Path, workers: int = 1, **sections: Any) -> Path:
    """A small CPU experiment on the synthetic dataset; ``sections`` maps e.g. TRAIN={...} onto CONFIG."""
    distributed = workers > 1
    cfg: dict[str, Any] = {
        "DDP_CONFIG": {
            "DISTRIBUTED": distributed, "AUTO_RANK_MATCH": False, "WORLD_SIZE": 1, "WORLD_RANK": 0,
            "DIST_URL": f"tcp://127.0.0.1:{free_port()}", "WOLRD_URLS": ["127.0.0.1"], "DIST_BACKEND": "gloo",
            "CPU_WORKERS": workers, "TIMEOUT_SECONDS": 120,
        },
        "CONFIG": {
            "TRAIN": {"EPOCH_NUM": EPOCHS, "BATCH_SIZE": 4 // workers, "LR": 0.1, "LR_POLICY": "Cosine",
                      "USE_WARMUP": True, "WARMUP_EPOCHS": 1, "WARMUP_START_LR": 0.01, "W_DECAY": 1e-4, "SEED": 7},
            "VAL": {"FREQ": 1, "BATCH_SIZE": 4},
            "DATA": {"CLIP_LEN": 8, "FRAME_RATE": 1, "CROP_SIZE": 32, "SHORT_SIDE_SIZE": 32,
                     "NEW_HEIGHT": 32, "NEW_WIDTH": 32, "RANDOM_FLIP": False, "NUM_WORKERS": 0,
                     "TEST_NUM_SEGMENT": 1, "TEST_NUM_CROP": 1, **data},
            "MODEL": {"NAME": "i3d_tiny"},
            "LOG": {"BASE_PATH": str(run_dir), "EXP_NAME": "", "SAVE_FREQ": 1, "DISPLAY_FREQ": 10},
        },
    }
    for section, values in sections.items():
        cfg["CONFIG"][section].update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_trainer(*args: str | Path, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"epoch_{EPOCHS:04d}.pth", weights_only=False)["model"]


@pytest.fixture(scope="module")
def two_process_run(synthetic_dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted two-process run, shared by the tests that compare against it."""
    tmp = tmp_path_factory.mktemp("ddp2")
    cfg = write_config(tmp / "cfg.yaml", synthetic_dataset, tmp / "run", workers=2)
    run_trainer("-m", "trainer.train", "--config-file", cfg)
    return tmp / "run"


def test_single_process_learns_motion_well_above_chance(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run")
    out = run_trainer("-m", "trainer.train", "--config-file", cfg)
    records = metrics(tmp_path / "run")
    assert [r["epoch"] for r in records] == list(range(1, EPOCHS + 1))
    assert records[-1]["val_top1"] >= 80.0, records  # two classes: chance is 50%
    assert records[-1]["val_count"] == 12  # every validation video counted exactly once
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 1
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    assert list((tmp_path / "run" / "tb_log").glob("events.out.tfevents.*"))
    assert "global batch 4" in out.stdout


def test_two_processes_learn_and_end_with_identical_weights(two_process_run: Path) -> None:
    records = metrics(two_process_run)
    assert records[-1]["val_top1"] >= 80.0, records
    digest = json.loads((two_process_run / "weights_digest.json").read_text())
    assert digest["world_size"] == 2 and len(digest["digests"]) == 2
    assert digest["identical"] and digest["digests"][0] == digest["digests"][1]


def test_interrupted_and_resumed_run_matches_uninterrupted(
    synthetic_dataset: dict[str, Any], two_process_run: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, run_dir, workers=2, TRAIN={"RESUME": "auto"})
    first = run_dir / "checkpoints" / "epoch_0001.pth"
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", "--config-file", str(cfg)], cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.exists(), "no checkpoint after the first epoch"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group: launcher and both workers
        proc.wait()
    assert not (run_dir / "checkpoints" / f"epoch_{EPOCHS:04d}.pth").exists(), "run was not interrupted"

    out = run_trainer("-m", "trainer.train", "--config-file", cfg)
    assert "resumed from" in out.stdout
    resumed, reference = final_weights(run_dir), final_weights(two_process_run)
    assert resumed.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
    assert metrics(run_dir)[-1]["lr"] == pytest.approx(metrics(two_process_run)[-1]["lr"])


def _odd_val_list(data: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Drop one validation video so two ranks get unequal shards (DistributedSampler would pad one)."""
    lines = Path(data["VAL_ANNO_PATH"]).read_text().splitlines()[:-1]
    (tmp / "val_odd.txt").write_text("\n".join(lines) + "\n")
    return {**data, "VAL_ANNO_PATH": str(tmp / "val_odd.txt")}


@pytest.mark.parametrize("views", [(1, 1), (2, 3)])
def test_distributed_test_is_exact_and_merges_views(
    synthetic_dataset: dict[str, Any], two_process_run: Path, tmp_path: Path, views: tuple[int, int]
) -> None:
    data = {**_odd_val_list(synthetic_dataset, tmp_path), "TEST_NUM_SEGMENT": views[0], "TEST_NUM_CROP": views[1]}
    ckpt = two_process_run / "checkpoints" / "best.pth"
    results = []
    for workers in (1, 2):
        run_dir = tmp_path / f"test{workers}"
        cfg = write_config(tmp_path / f"cfg{workers}.yaml", data, run_dir, workers=workers)
        run_trainer("-m", "trainer.test", "--config-file", cfg, "--checkpoint", ckpt)
        results.append(json.loads((run_dir / "test_results.json").read_text()))
    one, two = results
    assert one["videos"] == two["videos"] == 11
    assert one["views_per_video"] == views[0] * views[1]
    assert one["top1"] == pytest.approx(two["top1"]) and one["top5"] == pytest.approx(two["top5"])
    assert one["top1"] >= 70.0


def _corrupt_copies(data: dict[str, Any], tmp: Path) -> tuple[dict[str, Any], list[str]]:
    """The training list plus a missing, an empty, a truncated and an undecodable video."""
    root = tmp / "bad"
    root.mkdir()
    good = next(Path(data["TRAIN_DATA_PATH"]).rglob("*.mp4")).read_bytes()
    (root / "empty.mp4").write_bytes(b"")
    (root / "truncated.mp4").write_bytes(good[: len(good) // 3])
    (root / "garbage.mp4").write_bytes(os.urandom(4096))
    bad = [str(root / n) for n in ("missing.mp4", "empty.mp4", "truncated.mp4", "garbage.mp4")]
    lines = Path(data["TRAIN_ANNO_PATH"]).read_text().splitlines() + [f"{p} 16 0" for p in bad]
    (tmp / "train_bad.txt").write_text("\n".join(lines) + "\n")
    return {**data, "TRAIN_ANNO_PATH": str(tmp / "train_bad.txt")}, bad


def test_bad_videos_are_skipped_counted_and_named(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    data, bad = _corrupt_copies(synthetic_dataset, tmp_path)
    cfg = write_config(tmp_path / "cfg.yaml", data, tmp_path / "run", workers=2, TRAIN={"EPOCH_NUM": 1})
    out = run_trainer("-m", "trainer.train", "--config-file", cfg)
    assert metrics(tmp_path / "run")[-1]["bad_videos"] == len(bad)
    log_text = (tmp_path / "run" / "log.txt").read_text()
    for path in bad:
        assert f"skipped bad video {path}" in log_text
    check = run_trainer("-m", "trainer", "check-data", "--config-file", cfg, check=False)
    assert check.returncode == 1 and f"{len(bad)} bad video(s)" in check.stdout, out.stdout


def test_predict_prints_top_classes(synthetic_dataset: dict[str, Any], two_process_run: Path) -> None:
    video = next(Path(synthetic_dataset["VAL_DATA_PATH"]).glob("val/right/*.mp4"))
    out = run_trainer("-m", "trainer", "predict", video, "--config-file", two_process_run / "config.yaml",
                      "--checkpoint", two_process_run / "checkpoints" / "best.pth", "--topk", "2")
    ranked = [line.split()[1] for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert sorted(ranked) == ["left", "right"]


def test_gluoncv_tutorial_command_under_legacy_launcher(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    """`python -m torch.distributed.launch --nproc_per_node=2 train_ddp_pytorch.py --config-file X`."""
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run", workers=2,
                       TRAIN={"EPOCH_NUM": 1})
    run_trainer("-m", "torch.distributed.launch", "--nproc_per_node=2", "--master_port", str(free_port()),
                "scripts/action-recognition/train_ddp_pytorch.py", "--config-file", cfg)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 2


def test_gradient_accumulation_steps_and_keeps_ranks_identical(
    synthetic_dataset: dict[str, Any], tmp_path: Path
) -> None:
    """ACCUM_STEPS 2: half as many optimizer steps (no_sync on the first micro-batch), still one set of weights."""
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run", workers=2,
                       TRAIN={"EPOCH_NUM": 1, "ACCUM_STEPS": 2, "BATCH_SIZE": 2})
    out = run_trainer("-m", "trainer.train", "--config-file", cfg)
    # 24 training videos over 2 ranks at 2 clips per micro-batch: 6 micro-batches, 3 optimizer steps per epoch
    assert "3 optimizer steps per epoch" in out.stdout and "global batch 8" in out.stdout
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 3
    assert json.loads((tmp_path / "run" / "weights_digest.json").read_text())["identical"]


@pytest.mark.parametrize("decoder", ["auto", "decord"])
def test_mixed_h264_and_av1_dataset_with_auto_and_with_decord(
    mixed_dataset: tuple[dict[str, Any], list[str]], tmp_path: Path, decoder: str
) -> None:
    """auto trains on every video and names the AV1 ones it read with torchcodec, once; decord skips and names them."""
    data, av1 = mixed_dataset
    cfg = write_config(tmp_path / "cfg.yaml", {**data, "DECODER": decoder}, tmp_path / "run",
                       TRAIN={"EPOCH_NUM": 2})  # fmt: skip
    run_trainer("-m", "trainer.train", "--config-file", cfg)
    records = metrics(tmp_path / "run")
    log_text = (tmp_path / "run" / "log.txt").read_text()
    check = run_trainer("-m", "trainer", "check-data", "--config-file", cfg, check=False)
    if decoder == "auto":
        assert check.returncode == 0 and check.stdout.splitlines() == ["0 bad video(s)"], check.stdout
        assert [(r["bad_videos"], r["decoder_fallbacks"], r["val_count"]) for r in records] == [(0, 3, 12)] * 2
        for path in av1:
            assert log_text.count(f"decoded with torchcodec, as decord cannot open it: {path} (cannot open: ") == 1
        assert "skipped bad video" not in log_text
    else:
        assert [(r["bad_videos"], r["decoder_fallbacks"], r["val_count"]) for r in records] == [(3, 0, 11)] * 2
        for path in av1:
            assert f"skipped bad video {path}: cannot open: " in log_text
        assert "decoded with torchcodec" not in log_text
        assert check.returncode == 1 and f"{len(av1)} bad video(s)" in check.stdout, check.stdout
        for path in av1:
            assert re.search(rf"^BAD {re.escape(path)}: cannot open: .*; torchcodec reads it$", check.stdout, re.M)
