"""DDP_CONFIG.SHARDING fsdp2 (trainer.sharding): real runs of ``python -m trainer.train`` over gloo on the synthetic
videos, their DCP checkpoint folders resumed exactly on 2 ranks and resharded onto 1 and 3; the config's rules; a
checkpoint of the other kind refused naming the file; a transformers model sharded per block.

The trainer runs use the zoo's tiny I3D, which has no transformer blocks, so it is sharded at the root (as the log
says); the per-block sharding of a video transformer is checked on a tiny VideoMAE in spawned gloo processes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.distributed.fsdp import FSDPModule

from tests.trainer.test_distributed import ddp_cfg
from tests.trainer.test_resume import EVERY_STEP, assert_same_run, config, digests
from tests.trainer.test_train import run_trainer
from trainer.accel import wrap_ddp
from trainer.checkpoint import (
    TRAINER_STATE_FILE,
    find_eval_checkpoint,
    is_mid_epoch,
    list_checkpoints,
    load_model_weights,
    load_sharded_checkpoint,
    read_checkpoint,
    save_sharded_checkpoint,
)
from trainer.config import Config, ConfigError, run_dir, validate_config
from trainer.distributed import DistContext, launch
from trainer.errors import CheckpointError
from trainer.models import build_model
from trainer.models.hf_video import build_hf_model
from trainer.runtime import atomic
from trainer.sharding import check_resume_kind, full_model_state, transformer_blocks
from trainer.weights.formats import read_weights

TINY_VIDEOMAE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                 "image_size": 32, "num_frames": 4, "patch_size": 16, "tubelet_size": 2}


def sharded_config(data: dict[str, Any], tmp: Path, name: str, workers: int = 2, minutes: float = 0.0) -> Path:
    """test_resume's experiment (3 epochs, a checkpoint after each; mid-epoch ones every ``minutes``) under SHARDING
    fsdp2 on ``workers`` ranks, in float32 (I3D's BatchNorm layers cannot compute in bf16 under FSDP2)."""
    path = config(data, tmp, name, minutes)
    cfg = yaml.safe_load(path.read_text())
    cfg["DDP_CONFIG"].update({"SHARDING": "fsdp2", "FSDP_PARAM_DTYPE": "float32", "DISTRIBUTED": True,
                              "CPU_WORKERS": workers})
    cfg["CONFIG"]["TRAIN"]["BATCH_SIZE"] = max(4 // workers, 1)
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(cfg: Path, check: bool = True) -> Any:
    return run_trainer("-m", "trainer.train", "--config-file", cfg, check=check)


@pytest.fixture(scope="module")
def fsdp_run(synthetic_dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: a 2-rank FSDP2 run from start to end."""
    tmp = tmp_path_factory.mktemp("fsdp")
    out = train(sharded_config(synthetic_dataset, tmp, "run"))
    assert "has no transformer blocks: sharded over 2 rank(s) at the root only" in out.stdout + out.stderr
    ckpts = tmp / "run" / "checkpoints"
    assert {p.name for p in ckpts.iterdir()} == {"best.dcp", "epoch_0001.dcp", "epoch_0002.dcp", "epoch_0003.dcp"}
    assert len(set(digests(tmp / "run"))) == 1
    return tmp / "run"


def test_fsdp2_resumes_mid_epoch_exactly(synthetic_dataset: dict[str, Any], fsdp_run: Path, tmp_path: Path) -> None:
    """A checkpoint after every step, then the run started again from a mid-epoch folder in its last epoch (the ones
    after it removed): it ends with the uninterrupted run's weights and records."""
    cfg = sharded_config(synthetic_dataset, tmp_path, "run", minutes=EVERY_STEP)
    train(cfg)
    ckpts = tmp_path / "run" / "checkpoints"
    mid = [p for p in list_checkpoints(ckpts, mid_epoch=True) if is_mid_epoch(p.name)]
    assert [p.name.startswith("epoch_0002_step_") and p.suffix == ".dcp" for p in mid] == [True, True]
    shutil.rmtree(ckpts / "epoch_0003.dcp")
    out = train(cfg)
    assert f"resumed from {mid[-1]} at epoch 2" in out.stdout + out.stderr and "(mid-epoch: " in out.stdout + out.stderr
    assert_same_run(tmp_path / "run", fsdp_run)


def resumed_copy(reference: Path, tmp: Path, keep_epoch: int) -> Path:
    """``reference``'s run directory copied to tmp/run, its checkpoints after epoch ``keep_epoch`` removed."""
    run = tmp / "run"
    shutil.copytree(reference, run)
    for folder in (run / "checkpoints").glob("epoch_*.dcp"):
        if int(folder.name[6:10]) > keep_epoch:
            shutil.rmtree(folder)
    (run / "weights_digest.json").unlink()
    return run


def test_fsdp2_resumes_exactly(synthetic_dataset: dict[str, Any], fsdp_run: Path, tmp_path: Path) -> None:
    """Resumed from the epoch-1 folder, the 2-rank run ends with the uninterrupted run's weights and records."""
    run = resumed_copy(fsdp_run, tmp_path, keep_epoch=1)
    cfg = sharded_config(synthetic_dataset, tmp_path, "run")
    out = train(cfg)
    assert f"resumed from {run / 'checkpoints' / 'epoch_0001.dcp'} at epoch 1" in out.stdout + out.stderr
    assert_same_run(run, fsdp_run)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_two_rank_checkpoint_resumes_on_another_number_of_ranks(
    synthetic_dataset: dict[str, Any], fsdp_run: Path, tmp_path: Path, workers: int
) -> None:
    """The last folder, written by 2 ranks, loaded by ``workers`` ranks: no epoch is left, so the run's final weights
    (gathered from the new shards) are the checkpoint's, which are the 2-rank run's."""
    run = resumed_copy(fsdp_run, tmp_path, keep_epoch=3)
    train(sharded_config(synthetic_dataset, tmp_path, "run", workers=workers))
    assert digests(run) == digests(fsdp_run)[:1] * workers


def test_a_ddp_run_refuses_an_fsdp2_checkpoint_naming_it(
    synthetic_dataset: dict[str, Any], fsdp_run: Path, tmp_path: Path
) -> None:
    run = resumed_copy(fsdp_run, tmp_path, keep_epoch=2)
    cfg = sharded_config(synthetic_dataset, tmp_path, "run")
    data = yaml.safe_load(cfg.read_text())
    data["DDP_CONFIG"]["SHARDING"] = "ddp"
    del data["DDP_CONFIG"]["FSDP_PARAM_DTYPE"]
    cfg.write_text(yaml.safe_dump(data))
    out = train(cfg, check=False)
    assert out.returncode == 2, out.stderr[-2000:]
    assert (f"CONFIG.TRAIN.RESUME: {run / 'checkpoints' / 'epoch_0002.dcp'} is an FSDP2 checkpoint"
            in out.stdout + out.stderr), out.stderr[-2000:]


def test_an_fsdp2_run_refuses_a_ddp_checkpoint_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "epoch_0001.pth"
    torch.save({"model": {}, "epoch": 1}, path)
    ckpt = {**read_checkpoint(path), "path": str(path)}
    cfg = validate_config({"DDP_CONFIG": {"SHARDING": "fsdp2"}})
    with pytest.raises(CheckpointError, match=rf"^CONFIG\.TRAIN\.RESUME: {path} is a DDP checkpoint \(one file\)"):
        check_resume_kind(ckpt, cfg)
    check_resume_kind(ckpt, validate_config({}))  # the default, DDP, takes it


def test_an_fsdp2_folder_reads_whole_for_evaluation(fsdp_run: Path) -> None:
    """test.py and predict read the best folder whole (as they read a file): the model as the plain module names
    it, every tensor of it, and the clip settings it was trained with."""
    folder = fsdp_run / "checkpoints" / "best.dcp"
    assert find_eval_checkpoint(folder.parent) == folder
    ckpt = read_checkpoint(folder)
    assert ckpt["sharding"] == "fsdp2" and (folder / TRAINER_STATE_FILE).is_file()
    trained = read_weights(folder)
    assert trained.inference["model"] == "i3d_tiny"
    model = build_model("i3d_tiny", 2)
    load_model_weights(model, trained, "i3d_tiny")  # refuses a missing or mismatched tensor
    assert all(torch.equal(model.state_dict()[name], ckpt["model"][name]) for name in model.state_dict())


def test_a_checkpoint_folder_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    dest = tmp_path / "epoch_0001.dcp"
    dest.mkdir()
    (dest / "old").write_text("old")
    with pytest.raises(RuntimeError), atomic.replacing_folder(dest) as tmp:
        (tmp / "new").write_text("new")
        raise RuntimeError("a rank failed")
    assert [p.name for p in tmp_path.iterdir()] == [dest.name] and [p.name for p in dest.iterdir()] == ["old"]
    with atomic.replacing_folder(dest, durable=True) as tmp:
        (tmp / "new").write_text("new")
        assert tmp.stat().st_mode & 0o777 == 0o700 and not (dest / "new").exists()
    assert [p.name for p in tmp_path.iterdir()] == [dest.name] and [p.name for p in dest.iterdir()] == ["new"]


@pytest.mark.parametrize(("ddp", "message"), [
    ({"FSDP_ACTIVATION_CHECKPOINTING": True}, r"DDP_CONFIG\.FSDP_ACTIVATION_CHECKPOINTING: only SHARDING: fsdp2"),
    ({"FSDP_PARAM_DTYPE": "float32"}, r"DDP_CONFIG\.FSDP_PARAM_DTYPE: only SHARDING: fsdp2 uses it"),
    ({"SHARDING": "fsdp2", "DISTRIBUTED": False}, r"DDP_CONFIG\.SHARDING: fsdp2 shards over a process group"),
])
def test_sharding_keys_are_refused_where_nothing_reads_them(ddp: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config: {message}"):
        validate_config({"DDP_CONFIG": ddp})


def test_precise_bn_is_refused_with_fsdp2() -> None:
    with pytest.raises(ConfigError, match=r"^config: CONFIG\.TRAIN\.PRECISE_BN: is not supported with DDP_CONFIG"):
        validate_config({"DDP_CONFIG": {"SHARDING": "fsdp2"}, "CONFIG": {"TRAIN": {"PRECISE_BN": True}}})


def test_the_blocks_of_a_video_transformer_are_its_encoder_layers() -> None:
    model = build_hf_model("videomae_small", 4, **TINY_VIDEOMAE)
    blocks = [modules[i] for modules, i in transformer_blocks(model)]
    assert blocks == list(model.videomae.encoder.layer)
    assert transformer_blocks(nn.Sequential(nn.Linear(2, 2))) == []


# ---------------------------------------------------------------------------------------------------------------------
# A video transformer, sharded per block (spawned gloo workers: trainer.distributed.launch)


def sharded_videomae(ctx: DistContext, cfg: Config, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = wrap_ddp(build_hf_model("videomae_small", 4, **TINY_VIDEOMAE), ctx, cfg)
    assert all(isinstance(modules[i], FSDPModule) for modules, i in transformer_blocks(model))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_and_save(ctx: DistContext, cfg: Config) -> None:
    """Two steps on this rank's clips in bf16 with activations recomputed, then the FSDP2 checkpoint and (rank 0)
    the whole weights, gathered, beside it."""
    model, optimizer = sharded_videomae(ctx, cfg, seed=0)
    before = full_model_state(model)["classifier.weight"].clone()
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(2):
        clips = torch.randn(2, 3, 4, 32, 32, generator=generator)
        loss = nn.functional.cross_entropy(model(clips).float(), torch.tensor([0, 3]))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as TRAIN.CLIP_GRAD_NORM does, over sharded gradients
        optimizer.step()
        optimizer.zero_grad()
    out = run_dir(cfg)
    save_sharded_checkpoint(ctx, model, optimizer, {"epoch": 1}, out / "checkpoints", 1, False, 3)
    weights = full_model_state(model)
    assert torch.isfinite(loss) and not torch.equal(weights["classifier.weight"], before)
    if ctx.is_main:
        torch.save(weights, out / "trained.pth")


def load_and_record(ctx: DistContext, cfg: Config) -> None:
    """Another initialisation, sharded over this job's ranks, loaded from the checkpoint; rank 0 saves the whole."""
    model, optimizer = sharded_videomae(ctx, cfg, seed=1)
    out = run_dir(cfg)
    load_sharded_checkpoint(model, optimizer, out / "checkpoints" / "epoch_0001.dcp")
    weights = full_model_state(model)
    if ctx.is_main:
        torch.save(weights, out / f"loaded_{ctx.world_size}.pth")


def test_a_video_transformer_sharded_per_block_trains_in_bf16_and_reshards_onto_1_and_3_ranks(tmp_path: Path) -> None:
    fsdp = {"SHARDING": "fsdp2", "FSDP_PARAM_DTYPE": "bfloat16", "FSDP_ACTIVATION_CHECKPOINTING": True}
    launch(train_and_save, validate_config(ddp_cfg(tmp_path, CPU_WORKERS=2, **fsdp)))
    trained = torch.load(tmp_path / "trained.pth", weights_only=True)
    assert trained["classifier.weight"].dtype == torch.float32  # the sharded parameters stay float32
    for workers in (1, 3):
        launch(load_and_record, validate_config(ddp_cfg(tmp_path, CPU_WORKERS=workers, **fsdp)))
        loaded = torch.load(tmp_path / f"loaded_{workers}.pth", weights_only=True)
        assert loaded.keys() == trained.keys()
        assert all(torch.equal(loaded[name], trained[name]) for name in trained), workers
    whole = read_checkpoint(tmp_path / "checkpoints" / "epoch_0001.dcp")["model"]
    assert all(torch.equal(whole[name], trained[name]) for name in trained)
