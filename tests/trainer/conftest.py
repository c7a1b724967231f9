"""Shared fixtures of the trainer tests, and ffmpeg for the videos they encode in other codecs."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.conftest import ALL_GPUS, GPUS_ENV
from tests.ports import free_port
from tests.trainer.prepared_videos import SYNTHETIC, make_synthetic_task, prepared_videos
from trainer.data.synthetic import dataset_settings
from trainer.distributed import DistContext

# Debian's ffmpeg encoder, fast settings; 8-frame GOPs so clips cross key frames. AV1 is what decord cannot open.
# One intra-op thread for the torch work the tests do in this process: the lane runs two pytest workers on two
# cores, where a second thread per worker only waits for a core (tests/trainer/test_weights.py alone: 28.8 s of CPU
# with two threads, 21.6 s with one). Set here, once, since a test module's own setting would hold for every module
# its worker runs.
torch.set_num_threads(1)

AV1 = ["-c:v", "libaom-av1", "-cpu-used", "8", "-row-mt", "1", "-g", "8", "-pix_fmt", "yuv420p"]


def ffmpeg(*args: str, data: bytes | None = None) -> bytes:
    """Run ffmpeg (quiet, overwriting outputs) and return its stdout; a failure fails the test with its stderr."""
    proc = subprocess.run(["ffmpeg", "-loglevel", "error", "-y", *args], input=data, capture_output=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"ffmpeg {' '.join(args)} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


@pytest.fixture(autouse=True)
def one_thread_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """One OpenMP thread in every process a test starts (spawned ranks, trainers, their workers): torch would give
    each all the cores, which the lane's two pytest workers and their ranks already share."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def one_rank_group() -> Iterator[DistContext]:
    """A gloo process group of this process alone, for DDP on the CPU."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        yield DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1,
                          device=torch.device("cpu"), backend="gloo", distributed=True, dist_url="")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def synthetic_dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The synthetic task (prepared_videos.make_synthetic_task), made here or made beforehand.

    The value holds CONFIG.DATA settings (TRAIN/VAL_ANNO_PATH, TRAIN/VAL_DATA_PATH, CLASS_INDEX, NUM_CLASSES).
    """
    prepared = prepared_videos()
    if prepared is not None:
        return dataset_settings(prepared / SYNTHETIC, 2)
    return make_synthetic_task(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def mixed_dataset(
    synthetic_dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], list[str]]:
    """The synthetic dataset with 3 of its videos (a 'left' and a 'right' training one, a validation one) replaced
    by AV1 re-encodings (.mkv), so the lists keep 24 + 12 videos; and the AV1 files' paths (train, train, val)."""
    out = tmp_path_factory.mktemp("mixed")
    root = Path(synthetic_dataset["TRAIN_DATA_PATH"])
    data = dict(synthetic_dataset)
    av1: list[str] = []
    for split, picks in (("TRAIN", ("train/left/left_000.mp4", "train/right/right_000.mp4")),
                         ("VAL", ("val/left/left_000.mp4",))):
        lines = Path(synthetic_dataset[f"{split}_ANNO_PATH"]).read_text()
        for rel in picks:
            target = out / Path(rel).with_suffix(".mkv")
            target.parent.mkdir(parents=True, exist_ok=True)
            ffmpeg("-i", str(root / rel), *AV1, str(target))
            lines = lines.replace(rel, str(target))  # an absolute path in a list is used as it is
            av1.append(str(target))
        (out / f"{split.lower()}.txt").write_text(lines)
        data[f"{split}_ANNO_PATH"] = str(out / f"{split.lower()}.txt")
    return data, av1


@pytest.fixture(scope="module")
def gpus() -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the GPUs the suite was started with (torch's count, asked in a process
    that sees them); the module's tests skip when there are none."""
    if not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA GPU here (no driver device /dev/nvidiactl)")
    given = os.environ.get(GPUS_ENV, ALL_GPUS)
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    if given != ALL_GPUS:
        env["CUDA_VISIBLE_DEVICES"] = given
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    count = int(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True,
                               timeout=120).stdout)
    if count == 0:
        pytest.skip(f"torch sees no CUDA GPU (CUDA_VISIBLE_DEVICES={given})")
    return [str(i) for i in range(count)] if given == ALL_GPUS else given.split(",")[:count]
