"""SyncBatchNorm and a batch with no good video (engine.train_one_epoch): two gloo ranks, rank 1's second batch
lost all its videos. SyncBatchNorm's collectives run in every training forward and in none of the eval-mode
placeholder step a rank takes for such a batch, so the ranks agree before each step to take it together. Torch's
SyncBatchNorm runs on GPUs only; _sync_bn_entry's runs the same collectives on the CPU, and each rank counts the
collectives it issued by every optimizer step. Without the agreement rank 0's statistics all-reduce meets rank 1's
gradient all-reduce: gloo aborts on the sizes (nccl would hang until the timeout). The real SyncBatchNorm over nccl:
test_gpu.py, where there are two GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trainer.test_distributed import child_env, ddp_cfg, write_cfg

REPO = Path(__file__).resolve().parents[2]


def train_with_one_empty_batch(tmp_path: Path, backend: str, env: dict[str, str]) -> str:
    """_sync_bn_entry on one node with two workers (CPU processes with gloo, or GPUs with nccl); checks what both
    ranks did and returns the job's stderr."""
    out = tmp_path / "run"
    cfg = write_cfg(tmp_path, {**ddp_cfg(out, DIST_BACKEND=backend), "CONFIG": {
        "LOG": {"BASE_PATH": str(out), "EXP_NAME": ""},
        "DATA": {"CLIP_LEN": 2, "NUM_SEGMENT": 1, "CROP_SIZE": 8, "SHORT_SIDE_SIZE": 8}}})
    proc = subprocess.run([sys.executable, "-m", "tests.trainer._sync_bn_entry", "--config-file", str(cfg)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert len(ranks[0]["collectives"]) == 3 and ranks[0]["collectives"] == ranks[1]["collectives"]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the same steps on both ranks
    # Rank 0 set its second batch aside with rank 1's: 2 batches of 4 clips trained on each rank.
    assert ranks[0]["train_clips"] == 16
    assert "rank 0 skips a batch of 4 clips: another rank's batch had no video it could read" in proc.stderr
    return proc.stderr


def test_both_ranks_issue_the_same_collectives_when_one_ranks_batch_is_all_bad(tmp_path: Path) -> None:
    train_with_one_empty_batch(tmp_path, "gloo", child_env())
