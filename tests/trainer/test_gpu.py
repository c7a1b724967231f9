"""What only a GPU can show: the node's environment report and the readiness check's bf16 matmul on its GPUs, nccl
training with one process per GPU, AMP (bf16, fp16 with the gradient scaler: the engine's forward in that dtype),
SyncBatchNorm (the trainer's model made of it), crops made on the GPU, torchcodec decoding on the GPU, channels_last
and torch.compile on CUDA, and a restart in place over nccl on two GPUs.

Each test runs in processes of its own that see the GPUs (the test processes do not: tests/conftest.py), and skips
saying why where there is no GPU, or where one thing it needs is missing (a second GPU, a torchcodec built with
CUDA). The checks themselves are in _gpu_checks.py; scripts/gpu-check.sh runs these tests and bench/gpu_step.py in
a short device window and prints one table of what held, what was measured and what could not be checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.trainer import test_in_place
from tests.trainer._gpu_checks import EXIT_SKIP
from tests.trainer.gpus import needs, visible_env
from tests.trainer.prepared_videos import KINETICS_LIKE, prepared_videos
from tests.trainer.test_resume import config as in_place_config
from tests.trainer.test_sync_bn import train_with_one_empty_batch
from tests.trainer.test_train import REPO, metrics, run_trainer, write_config

CHECK_TIMEOUT_S = 300


def run_check(name: str, devices: list[str], *args: str) -> dict[str, Any]:
    """``python -m tests.trainer._gpu_checks NAME ARGS`` on these GPUs: its figures, or a skip with its reason."""
    proc = subprocess.run([sys.executable, "-m", "tests.trainer._gpu_checks", name, *args], cwd=REPO,
                          env={**os.environ, **visible_env(devices)}, capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT_S, check=False)
    if proc.returncode == EXIT_SKIP:
        pytest.skip(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip())
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_json(devices: list[str], *argv: str) -> dict[str, Any]:
    """A Python program that prints one JSON object, run with these GPUs visible: its object."""
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env={**os.environ, **visible_env(devices)},
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"{argv}: exit status {proc.returncode}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_nodes_environment_report(gpus: list[str], record_property: pytest.RecordProperty) -> None:
    """roles/python_env's report (what setup compares across the nodes) here: torch with CUDA, cuDNN and NCCL, and
    its small CUDA operation right on every GPU."""
    report = run_json(gpus, str(REPO / "roles" / "python_env" / "files" / "env_report.py"))
    assert "n/a" not in (report["cuda"], report["cudnn"], report["nccl"]), report
    assert len(report["gpu_checks"]) == len(gpus) and {gpu["op"] for gpu in report["gpu_checks"]} == {"ok"}, report
    record_property("figures", json.dumps({key: report[key] for key in ("torch", "cuda", "nccl", "driver",
                                                                        "torch_gpus", "torchcodec")}))


def test_the_readiness_checks_bf16_matmul(gpus: list[str], record_property: pytest.RecordProperty) -> None:
    """roles/cluster_check's matmul (bf16 8192x8192 on every GPU, the slowest the node's figure) runs here."""
    found = run_json(gpus, "-c", "import json, sys; sys.path.insert(0, 'roles/cluster_check/files'); "
                                 "import node_check; print(json.dumps(node_check.matmul(2.0)))")
    assert found["unit"] == "TFLOP/s" and found["value"] > 0, found
    assert found["detail"].startswith(f"slowest of {len(gpus)} GPU(s), bf16 8192x8192"), found
    record_property("figures", json.dumps({"tflops": round(found["value"], 1), "detail": found["detail"]}))


class NcclNode(test_in_place.Node):
    """test_in_place's node with one GPU of its own and nccl."""

    def __init__(self, data: dict[str, Any], tmp: Path, rank: int, device: str) -> None:
        super().__init__(data, tmp, rank)
        self.device = device

    def popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return super().popen([*argv, "DDP_CONFIG.DIST_BACKEND", "nccl"], {**env, **visible_env([self.device])})


def same_run_within_gpu_rounding(run_dir: Path, reference: Path, metrics_dir: Path | None = None) -> None:
    """test_resume's assert_same_run for GPUs, whose kernels need not give the same bits once the ranks move to the
    other GPU: the same epochs, every rank's final weights identical, each epoch's losses the reference's within
    1e-3."""
    records, expected = metrics(metrics_dir or run_dir), metrics(reference)
    assert [r["epoch"] for r in records] == [r["epoch"] for r in expected], records
    assert json.loads((run_dir / "weights_digest.json").read_text())["identical"]
    for got, want in zip(records, expected, strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-3), (got, want)
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3), (got, want)


def test_restart_in_place_over_nccl(
    gpus: list[str], synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_in_place's ranks-swapped restart with each node on a GPU of its own over nccl: told their attempt is
    over, both park (their communicators torn down) and go on in place with their ranks swapped, to the end of the
    run of one uninterrupted nccl job on the same two GPUs."""
    devices = needs(gpus, 2)
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    run_trainer("-m", "trainer.train", "--config-file", in_place_config(synthetic_dataset, reference, "run"),
                "DDP_CONFIG.DIST_BACKEND", "nccl", **visible_env(devices))
    assert "backend nccl" in (reference / "run" / "log.txt").read_text()
    monkeypatch.setattr(test_in_place, "Node", lambda data, tmp, rank: NcclNode(data, tmp, rank, devices[rank]))
    monkeypatch.setattr(test_in_place, "assert_same_run", same_run_within_gpu_rounding)
    in_place = tmp_path / "in_place"
    in_place.mkdir()
    test_in_place.test_told_their_attempt_is_over_both_park_and_go_on_in_place_with_their_ranks_swapped(
        synthetic_dataset, reference / "run", in_place)
    assert all("backend nccl" in (in_place / name / "log.txt").read_text() for name in ("node0", "node1"))


@pytest.mark.parametrize("processes", [1, 2], ids=["1 GPU", "2 GPUs"])
def test_nccl_training_one_process_per_gpu(
    gpus: list[str], processes: int, synthetic_dataset: dict[str, Any], tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    """python -m trainer.train on 1 or 2 GPUs: nccl, one process each, AMP auto, SyncBatchNorm; every rank ends with
    the same weights and the loss falls."""
    devices = needs(gpus, processes)
    cfg = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run", TRAIN={"SYNC_BN": True})
    node = yaml.safe_load(cfg.read_text())
    node["DDP_CONFIG"].update(DISTRIBUTED=True, DIST_BACKEND="nccl")  # one process per visible GPU
    cfg.write_text(yaml.safe_dump(node))
    run_trainer("-m", "trainer.train", "--config-file", cfg, **visible_env(devices))
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == processes
    log = (tmp_path / "run" / "log.txt").read_text()
    assert f"world size {processes} (1 node(s) x {processes} worker(s), backend nccl)" in log
    assert json.loads((tmp_path / "run" / "weights_digest.json").read_text())["identical"]
    records = metrics(tmp_path / "run")
    assert records[-1]["train_loss"] < records[0]["train_loss"], records
    record_property("figures", json.dumps({"epochs": len(records), "val_top1": records[-1]["val_top1"],
                                           "train_loss": [records[0]["train_loss"], records[-1]["train_loss"]]}))


def test_amp_bf16_and_fp16_with_the_scaler_match_float32(
    gpus: list[str], record_property: pytest.RecordProperty
) -> None:
    record_property("figures", json.dumps(run_check("amp", needs(gpus, 1))))


@pytest.mark.parametrize("processes", [1, 2], ids=["1 GPU", "2 GPUs"])
def test_sync_batchnorm_forward_and_backward_match_batchnorm_over_the_whole_batch(
    gpus: list[str], processes: int, record_property: pytest.RecordProperty
) -> None:
    figures = run_check("sync_bn", needs(gpus, processes), str(processes))
    record_property("figures", json.dumps(figures))


def test_sync_batchnorm_ranks_agree_on_a_batch_with_no_good_video(gpus: list[str], tmp_path: Path) -> None:
    """Two GPUs over nccl, rank 1's second batch all bad: both ranks take the placeholder step together (without the
    agreement rank 0 would wait in SyncBatchNorm's forward until the timeout)."""
    train_with_one_empty_batch(tmp_path, "nccl", {**os.environ, "PYTHONPATH": str(REPO), **visible_env(needs(gpus, 2))})


def test_a_single_process_run_uses_its_gpu(gpus: list[str], record_property: pytest.RecordProperty) -> None:
    """DISTRIBUTED False with DDP_CONFIG.GPU 1: the current device is GPU 1, so what is allocated without a device
    (a checkpoint snapshot's copies) lands there."""
    record_property("figures", json.dumps(run_check("single_process_device", needs(gpus, 2))))


def test_crops_made_on_the_gpu_match_the_cpus_within_a_level(
    gpus: list[str], record_property: pytest.RecordProperty
) -> None:
    record_property("figures", json.dumps(run_check("gpu_crops", needs(gpus, 1))))


@pytest.fixture(scope="module")
def h264_video(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 340x256 H.264 video of 300 frames (bench/decoders.py's), prepared or made here."""
    prepared = prepared_videos()
    if prepared is not None:
        return str(sorted((prepared / KINETICS_LIKE).glob("*.mp4"))[0])
    from bench.loader import kinetics_like

    return kinetics_like(tmp_path_factory.mktemp("h264"), 1)[0]


def test_decoder_device_cuda_frames_match_the_cpus(
    gpus: list[str], h264_video: str, record_property: pytest.RecordProperty
) -> None:
    record_property("figures", json.dumps(run_check("cuda_decoding", needs(gpus, 1), h264_video)))


def test_channels_last_leaves_a_training_step_unchanged(
    gpus: list[str], record_property: pytest.RecordProperty
) -> None:
    record_property("figures", json.dumps(run_check("channels_last", needs(gpus, 1))))


def test_compile_leaves_a_training_step_unchanged(gpus: list[str], record_property: pytest.RecordProperty) -> None:
    record_property("figures", json.dumps(run_check("compile", needs(gpus, 1))))
