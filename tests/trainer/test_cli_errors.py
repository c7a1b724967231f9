"""Bad input stops the real CLI with one line naming the bad thing and a non-zero exit, never a traceback: in a
single process, in spawned workers and under torchrun, where every worker fails alike (a missing list) or rank 0 fails
alone (its checkpoint) and its peers lose it in a collective."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ports import free_port
from tests.trainer.test_train import REPO, run_trainer, write_config
from trainer import checkpoint, predict
from trainer.config import validate_config
from trainer.models import build_model


def missing_list(tmp: Path, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    expected = f"error: {tmp / 'nope.txt'}: annotation file not found"
    return {**data, "TRAIN_ANNO_PATH": str(tmp / "nope.txt")}, {}, expected


def unknown_model(tmp: Path, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    expected = "error: CONFIG.MODEL.NAME: unknown model 'i3d_tinny'; nearest registered names: i3d_tiny"
    return data, {"MODEL": {"NAME": "i3d_tinny"}}, expected


def garbage_checkpoint(tmp: Path, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    (tmp / "bad.pth").write_bytes(b"\x80\x02not a checkpoint" * 64)
    expected = f"error: {tmp / 'bad.pth'}: not loadable as plain tensors (UnpicklingError: Unsupported operand"
    return data, {"TRAIN": {"EPOCH_NUM": 1, "RESUME": str(tmp / "bad.pth")}}, expected


def other_models_checkpoint(tmp: Path, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    torch.save({"model": build_model("slow_tiny", 2).state_dict()}, tmp / "slow.pth")
    expected = (f"error: CONFIG.TRAIN.RESUME '{tmp / 'slow.pth'}' (checkpoints in {tmp / 'run' / 'checkpoints'}): "
                "cannot load it (RuntimeError: Error(s) in loading state_dict for ResNet3d:")
    return data, {"TRAIN": {"EPOCH_NUM": 1, "RESUME": str(tmp / "slow.pth")}}, expected


def launcher_args(mode: str, cfg: Path) -> list[str | Path]:
    if mode == "torchrun":
        torchrun = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        return [*torchrun, "--master_port", str(free_port()), "-m", "trainer.train", "--config-file", cfg]
    return ["-m", "trainer.train", "--config-file", cfg]


@pytest.mark.parametrize(
    ("mode", "case"),
    [("single", missing_list), ("single", unknown_model), ("single", other_models_checkpoint),
     ("spawn", garbage_checkpoint), ("torchrun", missing_list), ("torchrun", garbage_checkpoint)],
    ids=["single-missing-list", "single-unknown-model", "single-wrong-model-checkpoint",
         "spawn-garbage-checkpoint-on-rank0", "torchrun-missing-list", "torchrun-garbage-checkpoint-on-rank0"],
)  # fmt: skip
def test_bad_input_is_one_line_and_an_exit_status(
    synthetic_dataset: dict[str, Any], tmp_path: Path, mode: str, case: Any
) -> None:
    data, sections, expected = case(tmp_path, synthetic_dataset)
    workers = 1 if mode == "single" else 2
    cfg = write_config(tmp_path / "cfg.yaml", data, tmp_path / "run", workers=workers, **sections)
    proc = run_trainer(*launcher_args(mode, cfg), check=False, timeout=120)
    output = proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert f'File "{REPO / "trainer"}' not in output, output  # no traceback through the trainer's code
    if mode == "torchrun":
        # Each worker reports its own failure in one line, a peer that lost the failed rank says so; torchrun then
        # prints its own summary of the exit codes.
        assert any(line.startswith(expected) for line in errors), output
        others = [line for line in errors if not line.startswith(expected)]
        assert all(" lost its peers in a collective " in line for line in others), output
        assert "exitcode  : 2" in output and proc.returncode != 0
    else:
        assert len(errors) == 1 and errors[0].startswith(expected), output
        assert proc.returncode == 2 and "Traceback" not in output, output


def checkpoint_of(model: str, *leave_out: str) -> dict[str, Any]:
    """A checkpoint whose record says i3d_tiny with 2 classes, holding ``model``'s weights."""
    cfg = validate_config({"CONFIG": {"DATA": {"NUM_CLASSES": 2}, "MODEL": {"NAME": "i3d_tiny"}}})
    inference = checkpoint.inference_info(cfg, ["a", "b"])
    return {"model": build_model(model, 2).state_dict(),
            "inference": {key: value for key, value in inference.items() if key not in leave_out}}


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"\x80\x02not a checkpoint", "{path}: neither a torch file nor a Caffe2 pickle of arrays"),
     (checkpoint_of("slow_tiny"), "{path} (vidcluster weights) does not fit model i3d_tiny: "),
     (checkpoint_of("i3d_tiny", "class_names"), "checkpoint {path}: cannot load it (KeyError: 'class_names')")],
    ids=["garbage", "another-models-weights", "incomplete-inference-record"],
)  # fmt: skip
def test_predict_refuses_a_bad_checkpoint_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: Any, expected: str
) -> None:
    path = tmp_path / "best.pth"
    if isinstance(content, bytes):
        path.write_bytes(content * 64)
    else:
        torch.save(content, path)
    with pytest.raises(SystemExit) as exit_info:
        predict.main([str(tmp_path / "video.mp4"), "--checkpoint", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {expected.format(path=path)}"), err
    assert "PARTIAL_LOAD" not in err  # evaluating a trained model: it loads whole or not at all
