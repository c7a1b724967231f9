"""trainer.config: GluonCV files and the tutorial block load as written; every error names its key and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from trainer.config import (
    Config,
    ConfigError,
    apply_overrides,
    config_to_dict,
    dump_config,
    load_config,
    parse_yaml,
    run_dir,
    validate_config,
)
from trainer.node_checks import check_runtime

REPO = Path(__file__).resolve().parents[2]
GLUONCV = sorted((REPO / "configs" / "gluoncv").glob("*.yaml"))

TUTORIAL = """\
DDP_CONFIG:
  AUTO_RANK_MATCH: True
  WORLD_SIZE: 2 # Total Number of machines
  WORLD_RANK: 0 # Rank of this machine
  DIST_URL: 'tcp://172.31.72.195:23456'
  WOLRD_URLS: ['172.31.72.195', '172.31.72.196']
  GPU_WORLD_SIZE: 8 # Total Number of GPUs, will be assigned automatically
  GPU_WORLD_RANK: 0 # Rank of GPUs, will be assigned automatically
  DIST_BACKEND: 'nccl'
  GPU: 0 # Rank of GPUs in the machine, will be assigned automatically
  DISTRIBUTED: True
"""

# Every default assigned in GluonCV's gluoncv/torch/engine/config/action_recognition.py.
GLUONCV_DEFAULTS: dict[str, Any] = {
    "DDP_CONFIG.WORLD_SIZE": 1,
    "DDP_CONFIG.WORLD_RANK": 0,
    "DDP_CONFIG.GPU_WORLD_SIZE": 8,
    "DDP_CONFIG.GPU_WORLD_RANK": 0,
    "DDP_CONFIG.DIST_URL": "tcp://127.0.0.1:10001",
    "DDP_CONFIG.WOLRD_URLS": ["127.0.0.1"],
    "DDP_CONFIG.AUTO_RANK_MATCH": True,
    "DDP_CONFIG.DIST_BACKEND": "nccl",
    "DDP_CONFIG.GPU": 0,
    "DDP_CONFIG.DISTRIBUTED": True,
    "CONFIG.TRAIN.EPOCH_NUM": 196,
    "CONFIG.TRAIN.BATCH_SIZE": 8,
    "CONFIG.TRAIN.LR": 0.01,
    "CONFIG.TRAIN.MOMENTUM": 0.9,
    "CONFIG.TRAIN.ADAM_BETA2": 0.98,
    "CONFIG.TRAIN.ADAM_EPS": 1.5e-09,
    "CONFIG.TRAIN.W_DECAY": 1e-4,
    "CONFIG.TRAIN.LR_MILESTONE": [40, 80],
    "CONFIG.TRAIN.STEP": 0.1,
    "CONFIG.TRAIN.MULTIGRID.USE_LONG_CYCLE": False,
    "CONFIG.TRAIN.MULTIGRID.USE_SHORT_CYCLE": False,
    "CONFIG.TRAIN.MULTIGRID.LONG_CYCLE_EPOCH": [10, 20, 30],
    "CONFIG.VAL.FREQ": 2,
    "CONFIG.VAL.BATCH_SIZE": 8,
    "CONFIG.INFERENCE.FEAT": False,
    "CONFIG.DATA.TRAIN_ANNO_PATH": "",
    "CONFIG.DATA.TRAIN_DATA_PATH": "",
    "CONFIG.DATA.VAL_ANNO_PATH": "",
    "CONFIG.DATA.VAL_DATA_PATH": "",
    "CONFIG.DATA.NUM_CLASSES": 400,
    "CONFIG.DATA.CLIP_LEN": 16,
    "CONFIG.DATA.FRAME_RATE": 2,
    "CONFIG.DATA.KEEP_ASPECT_RATIO": False,
    "CONFIG.DATA.NUM_SEGMENT": 1,
    "CONFIG.DATA.NUM_CROP": 1,
    "CONFIG.DATA.TEST_NUM_SEGMENT": 10,
    "CONFIG.DATA.TEST_NUM_CROP": 3,
    "CONFIG.DATA.CROP_SIZE": 224,
    "CONFIG.DATA.SHORT_SIDE_SIZE": 256,
    "CONFIG.DATA.NEW_HEIGHT": 256,
    "CONFIG.DATA.NEW_WIDTH": 340,
    "CONFIG.DATA.NUM_WORKERS": 0,
    "CONFIG.MODEL.NAME": "",
    "CONFIG.MODEL.LOAD": False,
    "CONFIG.MODEL.PRETRAINED_PATH": "",
    "CONFIG.MODEL.PRETRAINED": False,
    "CONFIG.MODEL.PRETRAINED_BASE": True,
    "CONFIG.MODEL.BN_EVAL": False,
    "CONFIG.MODEL.PARTIAL_BN": False,
    "CONFIG.MODEL.BN_FROZEN": False,
    "CONFIG.MODEL.USE_AFFINE": False,
    "CONFIG.LOG.BASE_PATH": "",
    "CONFIG.LOG.EXP_NAME": "use_time",
    "CONFIG.LOG.LOG_DIR": "tb_log",
    "CONFIG.LOG.SAVE_DIR": "checkpoints",
    "CONFIG.LOG.EVAL_DIR": "",
    "CONFIG.LOG.SAVE_FREQ": 1,
    "CONFIG.LOG.DISPLAY_FREQ": 1,
    "CONFIG.LOG.LEVEL": "DEBUG",
    "CONFIG.LOG.LOG_FILENAME": "log.txt",
}


def get(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        data = data[part]
    return data


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def typed(value: Any) -> Any:
    """``value`` with the type of every element spelled out: 1, 1.0 and True compare equal, these do not."""
    if isinstance(value, list | tuple):
        return type(value).__name__, [typed(item) for item in value]
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    return type(value).__name__, value


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), overrides or [])
    return str(info.value)


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.config", *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------------------------------------------------------------
# What loads


def test_three_gluoncv_configs_are_present() -> None:
    assert len(GLUONCV) == 3


@pytest.mark.parametrize("path", GLUONCV, ids=lambda p: p.stem)
def test_gluoncv_config_loads_unchanged(path: Path) -> None:
    cfg = load_config(path)
    loaded = config_to_dict(cfg)
    written = leaves(parse_yaml(path.read_text()))
    for key, value in written.items():
        assert typed(get(loaded, key)) == typed(value), key  # value and type kept, in lists too
    assert path.stem == cfg.CONFIG.MODEL.NAME
    assert isinstance(cfg.CONFIG.TRAIN.W_DECAY, float) and cfg.CONFIG.TRAIN.W_DECAY in (1e-4, 1e-5)


def test_defaults_are_gluoncvs() -> None:
    defaults = config_to_dict(Config())
    for key, value in GLUONCV_DEFAULTS.items():
        assert typed(get(defaults, key)) == typed(value), key


def test_tutorial_block_loads_as_written(tmp_path: Path) -> None:
    ddp = load_config(write(tmp_path, TUTORIAL)).DDP_CONFIG
    assert typed([ddp.AUTO_RANK_MATCH, ddp.DISTRIBUTED, ddp.WORLD_SIZE, ddp.WORLD_RANK, ddp.DIST_BACKEND]) == typed(
        [True, True, 2, 0, "nccl"])
    assert typed(ddp.WOLRD_URLS) == typed(["172.31.72.195", "172.31.72.196"])
    assert ddp.DIST_URL == "tcp://172.31.72.195:23456"


def test_exponent_without_dot_is_a_float(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "CONFIG:\n  TRAIN:\n    W_DECAY: 1e-4\n    LR: 2E-3\n"))
    train = cfg.CONFIG.TRAIN
    assert (train.W_DECAY, train.LR) == (0.0001, 0.002)  # float('1e-4') is exactly the literal 0.0001
    overridden = load_config(write(tmp_path, ""), ["CONFIG.TRAIN.W_DECAY", "5e-5"]).CONFIG.TRAIN
    assert isinstance(overridden.W_DECAY, float) and overridden.W_DECAY == 0.00005


def test_world_urls_alias_is_read_and_written_as_wolrd_urls(tmp_path: Path) -> None:
    text = TUTORIAL.replace("WOLRD_URLS", "WORLD_URLS")
    cfg = load_config(write(tmp_path, text))
    assert cfg.DDP_CONFIG.WOLRD_URLS == ["172.31.72.195", "172.31.72.196"]
    out = tmp_path / "out.yaml"
    dump_config(cfg, out)
    assert "WOLRD_URLS:" in out.read_text() and "WORLD_URLS" not in out.read_text()
    both = text.replace("  DISTRIBUTED: True", "  DISTRIBUTED: True\n  WOLRD_URLS: ['172.31.72.195', '172.31.72.196']")
    assert "DDP_CONFIG.WOLRD_URLS: also given as WORLD_URLS" in error_of(tmp_path, both)


def test_dump_then_load_gives_the_same_config(tmp_path: Path) -> None:
    overrides = ["CONFIG.TRAIN.AMP", "bf16", "CONFIG.TRAIN.OPTIMIZER", "AdamW", "CONFIG.TRAIN.ADAM_EPS", "1e-8",
                 "CONFIG.LOG.EXP_NAME", ""]
    cfg = load_config(GLUONCV[0], overrides)
    out = tmp_path / "resolved.yaml"
    dump_config(cfg, out)
    again = load_config(out)
    assert again == cfg and typed(config_to_dict(again)) == typed(config_to_dict(cfg))


def test_every_key_has_a_description() -> None:
    def check(model: type[BaseModel], prefix: str) -> int:
        count = 0
        for name, field in model.model_fields.items():
            assert field.description and "\n" not in field.description, prefix + name
            sub = field.annotation
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                count += check(sub, f"{prefix}{name}.")
            count += 1
        return count

    assert check(Config, "") > len(GLUONCV_DEFAULTS)


def test_recipe_is_explicit_or_detected_and_the_resolved_config_says_which(tmp_path: Path) -> None:
    def resolved(text: str) -> tuple[str, float]:
        cfg = load_config(write(tmp_path, text))
        again = tmp_path / "again.yaml"
        dump_config(cfg, again)
        assert load_config(again) == cfg and f"RECIPE: {cfg.CONFIG.RECIPE}" in again.read_text()
        return cfg.CONFIG.RECIPE, cfg.CONFIG.TRAIN.WARMUP_START_LR

    assert resolved("") == ("gluoncv", 0.0)  # GluonCV's schema: its warmup starts at 0
    warmup = "    USE_WARMUP: true\n    WARMUP_EPOCHS: 2\n"
    assert resolved(f"CONFIG:\n  TRAIN:\n{warmup}    WARMUP_START_LR: 0.02\n") == ("pyslowfast", 0.02)
    assert resolved(f"CONFIG:\n  RECIPE: auto\n  TRAIN:\n{warmup}") == ("gluoncv", 0.0)
    assert resolved(f"CONFIG:\n  RECIPE: pyslowfast\n  TRAIN:\n{warmup}") == ("pyslowfast", 0.01)  # PySlowFast's
    assert {load_config(path).CONFIG.RECIPE for path in GLUONCV} == {"gluoncv"}
    assert load_config(REPO / "configs" / "slowfast.yaml").CONFIG.RECIPE == "pyslowfast"


def test_test_crop_defaults_to_the_short_side(tmp_path: Path) -> None:
    r2plus1d = load_config(REPO / "configs" / "gluoncv" / "r2plus1d_v1_resnet50_kinetics400.yaml").CONFIG.DATA
    assert (r2plus1d.SHORT_SIDE_SIZE, r2plus1d.TEST_CROP_SIZE, r2plus1d.CROP_SIZE) == (128, 128, 112)
    assert validate_config({}).CONFIG.DATA.TEST_CROP_SIZE == 256
    data = load_config(write(tmp_path, "CONFIG:\n  DATA:\n    TEST_CROP_SIZE: 224\n")).CONFIG.DATA
    assert (data.SHORT_SIDE_SIZE, data.TEST_CROP_SIZE) == (256, 224)


WARMUP = ["CONFIG.TRAIN.USE_WARMUP", "true", "CONFIG.TRAIN.WARMUP_EPOCHS", "2"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["CONFIG.TRAIN.RESUME_EPOCH", "3"], "CONFIG.TRAIN.RESUME_EPOCH: GluonCV's resume epoch is not supported; "
         "resume with CONFIG.TRAIN.RESUME (a checkpoint path, or 'auto' for the run's newest)"),
        (["CONFIG.TRAIN.WARMUP_END_LR", "0.1"], "CONFIG.TRAIN.WARMUP_END_LR: GluonCV's script never reads it"),
        (["CONFIG.INFERENCE.FEAT", "true"], "CONFIG.INFERENCE.FEAT: feature extraction"),
        (["CONFIG.MODEL.USE_AFFINE", "true"], "CONFIG.MODEL.USE_AFFINE: GluonCV's r2plus1d_v2 affine layers"),
        (["CONFIG.DATA.NUM_CROP", "3"], "CONFIG.DATA.NUM_CROP: multi-crop training is not provided"),
        (["CONFIG.TRAIN.MULTIGRID.LONG_CYCLE_EPOCH", "[5]"],
         "CONFIG.TRAIN.MULTIGRID.LONG_CYCLE_EPOCH: only USE_LONG_CYCLE: True uses it"),
        (["CONFIG.TRAIN.MULTIGRID.USE_LONG_CYCLE", "true"],
         "CONFIG.TRAIN.MULTIGRID.LONG_CYCLE_EPOCH: is [10, 20, 30]: with EPOCH_NUM 196 the last epoch would train at "
         "long-cycle stage 0"),
        (["CONFIG.DATA.PREFETCH_FACTOR", "4"], "CONFIG.DATA.PREFETCH_FACTOR: only DataLoader workers prefetch"),
        (["CONFIG.MODEL.NAME", "i3d_resnet50_v1_kinetics400"],
         "CONFIG.MODEL.PRETRAINED_BASE: GluonCV starts i3d_resnet50_v1_kinetics400 from ImageNet ResNet weights"),
        (["CONFIG.TRAIN.ADAM_EPS", "1e-8"], "CONFIG.TRAIN.ADAM_EPS: only OPTIMIZER: AdamW uses it"),
        (["CONFIG.TRAIN.OPTIMIZER", "AdamW", "CONFIG.TRAIN.NESTEROV", "true"],
         "CONFIG.TRAIN.NESTEROV: only OPTIMIZER: SGD uses it"),
        (["CONFIG.TRAIN.LR_POLICY", "Cosine", "CONFIG.TRAIN.STEP", "0.5"], "CONFIG.TRAIN.STEP: only LR_POLICY: Step"),
        (["CONFIG.TRAIN.PRECISE_BN_BATCHES", "50"], "CONFIG.TRAIN.PRECISE_BN_BATCHES: only PRECISE_BN: True uses it"),
        (["CONFIG.TRAIN.BASE_BATCH_SIZE", "128"], "CONFIG.TRAIN.BASE_BATCH_SIZE: only SCALE_LR: True uses it"),
        (["CONFIG.TRAIN.WARMUP_EPOCHS", "5"], "CONFIG.TRAIN.WARMUP_EPOCHS: is 5 but USE_WARMUP is False"),
        (["CONFIG.TRAIN.USE_WARMUP", "true"], "CONFIG.TRAIN.WARMUP_EPOCHS: is 0 but USE_WARMUP is True"),
        (["CONFIG.RECIPE", "gluoncv", *WARMUP, "CONFIG.TRAIN.WARMUP_START_LR", "0.01"],
         "CONFIG.TRAIN.WARMUP_START_LR: RECIPE gluoncv warms up from 0"),
        (["CONFIG.RECIPE", "pyslowfast", "CONFIG.TRAIN.WARMUP_START_LR", "0.05"],
         "CONFIG.TRAIN.WARMUP_START_LR: USE_WARMUP is False, so no warmup runs"),
        (["CONFIG.TRAIN.EPOCH_NUM", "2", *WARMUP, "CONFIG.TRAIN.LR_POLICY", "Cosine"],
         "CONFIG.TRAIN.EPOCH_NUM: is 2, not more than WARMUP_EPOCHS 2"),
        (["CONFIG.MODEL.BN_FROZEN", "true", "CONFIG.TRAIN.SYNC_BN", "true"],
         "CONFIG.TRAIN.SYNC_BN: MODEL.BN_FROZEN keeps every BatchNorm's statistics fixed"),
        (["CONFIG.MODEL.FREEZE_BACKBONE", "true", "CONFIG.TRAIN.PRECISE_BN", "true"],
         "CONFIG.TRAIN.PRECISE_BN: MODEL.FREEZE_BACKBONE keeps every BatchNorm's statistics fixed"),
        (["CONFIG.MODEL.PARTIAL_BN", "true", "CONFIG.MODEL.BN_EVAL", "true"],
         "CONFIG.MODEL.PARTIAL_BN: keeps the first BatchNorm training, which BN_EVAL freezes"),
        (["CONFIG.DATA.TEST_CROP_SIZE", "300"], "CONFIG.DATA.TEST_CROP_SIZE: is 300, larger than SHORT_SIDE_SIZE 256"),
        (["CONFIG.MODEL.DROPOUT_RATE", "1.5"], "CONFIG.MODEL.DROPOUT_RATE: Input should be less than 1"),
        (["CONFIG.MODEL.PARTIAL_LOAD", "true"],
         "CONFIG.MODEL.PARTIAL_LOAD: only LOAD: True or PRETRAINED: True (initial weights) use it"),
        (["CONFIG.MODEL.PRETRAINED_PATH", "w.pth"],
         "CONFIG.MODEL.PRETRAINED_PATH: only LOAD: True or PRETRAINED: True (initial weights) use it"),
    ],
    ids=lambda value: value[-2].rsplit(".", 1)[-1] if isinstance(value, list) else "",
)
def test_keys_that_would_do_nothing_are_refused_by_name(tmp_path: Path, overrides: list[str], expected: str) -> None:
    message = error_of(tmp_path, "", overrides)
    assert message.startswith(str(tmp_path / "cfg.yaml")) and expected in message, message


# ---------------------------------------------------------------------------------------------------------------------
# Overrides


def test_overrides_set_dotted_keys_with_yaml_values(tmp_path: Path) -> None:
    overrides = [
        "CONFIG.TRAIN.BATCH_SIZE", "16",
        "CONFIG.TRAIN.LR_MILESTONE", "[5, 9]",
        "CONFIG.TRAIN.SYNC_BN", "true",
        "CONFIG.MODEL.NAME", "i3d_tiny",
        "CONFIG.TRAIN.RESUME", "",
        "DDP_CONFIG.WORLD_URLS", "['10.0.0.1', '10.0.0.2']",
        "DDP_CONFIG.WORLD_SIZE", "2",
        "DDP_CONFIG.DIST_URL", "tcp://10.0.0.1:29500",
    ]  # fmt: skip
    cfg = load_config(write(tmp_path, TUTORIAL), overrides)
    train = cfg.CONFIG.TRAIN
    assert typed([train.BATCH_SIZE, train.LR_MILESTONE, train.SYNC_BN, train.RESUME]) == typed([16, [5, 9], True, ""])
    assert cfg.CONFIG.MODEL.NAME == "i3d_tiny"
    assert cfg.DDP_CONFIG.WOLRD_URLS == ["10.0.0.1", "10.0.0.2"]  # the alias replaced the file's list


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["CONFIG.TRAIN.BATCH_SIZE"], "KEY VALUE pairs; 'CONFIG.TRAIN.BATCH_SIZE' has no value"),
        (["CONFIG.TRAIN.BACH_SIZE", "4"], "CONFIG.TRAIN.BACH_SIZE: unknown key; did you mean CONFIG.TRAIN.BATCH_SIZE?"),
        (["CONFIG.TRAIN.BATCH_SIZE", "many"], "CONFIG.TRAIN.BATCH_SIZE: Input should be a valid integer"),
        (["CONFIG.TRAIN.LR.VALUE", "1"], "override CONFIG.TRAIN.LR.VALUE: CONFIG.TRAIN.LR is a value, not a section"),
        (["CONFIG.TRAIN.LR_MILESTONE", "[1,"], "override CONFIG.TRAIN.LR_MILESTONE: value '[1,' is not valid YAML"),
        (["--CONFIG.TRAIN.LR", "1"], "override '--CONFIG.TRAIN.LR': not a dotted key"),
    ],
)
def test_override_errors_name_the_key(tmp_path: Path, overrides: list[str], expected: str) -> None:
    assert expected in error_of(tmp_path, "CONFIG:\n  TRAIN:\n    LR: 0.1\n", overrides)


def test_apply_overrides_leaves_other_keys(tmp_path: Path) -> None:
    data = {"CONFIG": {"TRAIN": {"LR": 0.5}}}
    assert apply_overrides(data, ["CONFIG.TRAIN.EPOCH_NUM", "3"]) == {"CONFIG": {"TRAIN": {"LR": 0.5, "EPOCH_NUM": 3}}}


# ---------------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "CONFIG:\n  TRAIN:\n    BATCH_SIZ: 4\n",
            "CONFIG.TRAIN.BATCH_SIZ: unknown key; did you mean CONFIG.TRAIN.BATCH_SIZE?",
        ),
        ("CONFIG:\n  DATA:\n    BATCH_SIZE: 4\n", "did you mean CONFIG.TRAIN.BATCH_SIZE or CONFIG.VAL.BATCH_SIZE?"),
        ("CONFG:\n  TRAIN: {}\n", "CONFG: unknown key; did you mean CONFIG?"),
        ("DDP_CONFIG:\n  WORLD_SIZ: 2\n", "DDP_CONFIG.WORLD_SIZ: unknown key; did you mean DDP_CONFIG.WORLD_SIZE?"),
        (
            "CONFIG:\n  TRAIN:\n    MULTIGRID:\n      LONG_CYCLE: 1\n",
            "did you mean CONFIG.TRAIN.MULTIGRID.USE_LONG_CYCLE?",
        ),
    ],
)
def test_unknown_key_names_it_and_the_nearest_valid_key(tmp_path: Path, text: str, expected: str) -> None:
    message = error_of(tmp_path, text)
    assert message.startswith(str(tmp_path / "cfg.yaml")) and expected in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "CONFIG:\n  TRAIN:\n    BATCH_SIZE: 'abc'\n",
            "CONFIG.TRAIN.BATCH_SIZE: Input should be a valid integer, got 'abc'",
        ),
        ("CONFIG:\n  TRAIN:\n    BATCH_SIZE: 2.5\n", "CONFIG.TRAIN.BATCH_SIZE: Input should be a valid integer"),
        ("CONFIG:\n  TRAIN:\n    LR: fast\n", "CONFIG.TRAIN.LR: Input should be a valid number"),
        ("DDP_CONFIG:\n  DISTRIBUTED: 'yes'\n", "DDP_CONFIG.DISTRIBUTED: Input should be a valid boolean"),
        ("DDP_CONFIG:\n  DIST_BACKEND: mpi\n", "DDP_CONFIG.DIST_BACKEND: Input should be 'nccl' or 'gloo'"),
        ("DDP_CONFIG:\n  WOLRD_URLS: 10.0.0.1\n", "DDP_CONFIG.WOLRD_URLS: Input should be a valid list"),
        ("DDP_CONFIG:\n  WOLRD_URLS: [1]\n", "DDP_CONFIG.WOLRD_URLS[0]: Input should be a valid string"),
        ("CONFIG:\n  TRAIN:\n    LR_POLICY: poly\n", "CONFIG.TRAIN.LR_POLICY: Input should be 'Step' or 'Cosine'"),
        ("CONFIG:\n  TRAIN:\n    AMP: fp8\n", "CONFIG.TRAIN.AMP: Input should be 'auto', 'off', 'bf16' or 'fp16'"),
        ("CONFIG:\n  DATA: 5\n", "CONFIG.DATA: Input should be a valid dictionary"),
        ("CONFIG:\n  TRAIN:\n    EPOCH_NUM: 0\n", "CONFIG.TRAIN.EPOCH_NUM: Input should be greater than or equal to 1"),
        ("CONFIG:\n  DATA:\n    MULTIGRID: True\n", "CONFIG.DATA.MULTIGRID: is True but no multigrid cycle is on"),
    ],
)
def test_wrong_type_names_the_key_and_expected_type(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)


def test_lr_policy_spelling_is_normalised(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "CONFIG:\n  TRAIN:\n    LR_POLICY: cosine\n")).CONFIG.TRAIN.LR_POLICY == "Cosine"


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    message = error_of(tmp_path, "CONFIG:\n  TRAIN:\n    BATCH_SIZ: 4\n    LR: fast\n")
    assert "2 problems" in message and "CONFIG.TRAIN.BATCH_SIZ" in message and "CONFIG.TRAIN.LR" in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "WORLD_SIZE: 2",
            "WORLD_SIZE: 3",
            "DDP_CONFIG.WORLD_SIZE: is 3 but WOLRD_URLS lists 2 address(es); "
            "list one address per node or set WORLD_SIZE to 2",
        ),
        (
            "DIST_URL: 'tcp://172.31.72.195:23456'",
            "DIST_URL: 'tcp://172.31.72.196:23456'",
            "DDP_CONFIG.DIST_URL: host 172.31.72.196 is not WOLRD_URLS[0] (172.31.72.195), the rank-0 node that hosts "
            "the rendezvous; set DIST_URL to 'tcp://172.31.72.195:23456' or put 172.31.72.196 first in WOLRD_URLS",
        ),
        (
            "WORLD_RANK: 0",
            "WORLD_RANK: 2",
            "DDP_CONFIG.WORLD_RANK: is 2 but WORLD_SIZE is 2; use a node rank from 0 to 1",
        ),
        (
            "DIST_URL: 'tcp://172.31.72.195:23456'",
            "DIST_URL: '172.31.72.195:23456'",
            "DDP_CONFIG.DIST_URL: '172.31.72.195:23456' is not tcp://host:port",
        ),
        (
            "['172.31.72.195', '172.31.72.196']",
            "['172.31.72.195', '172.31.72.195']",
            "DDP_CONFIG.WOLRD_URLS: lists an address twice, so AUTO_RANK_MATCH cannot tell the nodes apart",
        ),
        ("WORLD_RANK: 0", "WORLD_RANK: -1", "DDP_CONFIG.WORLD_RANK: Input should be greater than or equal to 0"),
    ],
    ids=["size-vs-urls", "url-host", "rank-range", "url-form", "duplicate-urls", "negative-rank"],
)
def test_inconsistent_ddp_settings_say_what_to_change(tmp_path: Path, old: str, new: str, expected: str) -> None:
    assert old in TUTORIAL
    assert expected in error_of(tmp_path, TUTORIAL.replace(old, new))


def test_ddp_topology_is_not_checked_when_not_distributed(tmp_path: Path) -> None:
    text = TUTORIAL.replace("WORLD_SIZE: 2", "WORLD_SIZE: 3").replace("DISTRIBUTED: True", "DISTRIBUTED: False")
    assert load_config(write(tmp_path, text)).DDP_CONFIG.WORLD_SIZE == 3


def test_duplicate_urls_are_fine_without_auto_rank_match(tmp_path: Path) -> None:
    text = TUTORIAL.replace("AUTO_RANK_MATCH: True", "AUTO_RANK_MATCH: False").replace(
        "'172.31.72.196'", "'172.31.72.195'"
    )
    assert load_config(write(tmp_path, text)).DDP_CONFIG.WOLRD_URLS == ["172.31.72.195"] * 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [("- a\n- b\n", "the top level must be a mapping"), ("DDP_CONFIG: [\n", "not valid YAML")],
)
def test_unreadable_files_are_config_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in error_of(tmp_path, text)
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "missing.yaml")


def test_validate_config_accepts_a_dict() -> None:
    cfg = validate_config({"CONFIG": {"DATA": {"NUM_CLASSES": 5}}})
    assert cfg.CONFIG.DATA.NUM_CLASSES == 5 and cfg.DDP_CONFIG.CPU_WORKERS == 1
    with pytest.raises(ConfigError, match=r"CONFIG\.DATA\.NUM_CLASES: unknown key"):
        validate_config({"CONFIG": {"DATA": {"NUM_CLASES": 5}}})


# ---------------------------------------------------------------------------------------------------------------------
# This machine, the run directory, the command line


def test_check_runtime_passes_for_gloo_and_for_non_distributed(tmp_path: Path) -> None:
    check_runtime(load_config(write(tmp_path, TUTORIAL.replace("'nccl'", "'gloo'"))))
    check_runtime(load_config(write(tmp_path, TUTORIAL.replace("DISTRIBUTED: True", "DISTRIBUTED: False"))))


def test_nccl_without_a_gpu_is_an_error_unless_runtime_checks_are_off(tmp_path: Path) -> None:
    path = str(write(tmp_path, TUTORIAL))
    done = run_cli("--config-file", path, "--check", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2
    assert f"error: {path}: DDP_CONFIG.DIST_BACKEND: nccl needs a GPU" in done.stderr
    assert "set DIST_BACKEND: 'gloo'" in done.stderr
    done = run_cli("--config-file", path, "--check", "--no-runtime-checks", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {path}: 2 node(s), backend nccl")


def test_cli_prints_the_resolved_yaml_and_reports_errors(tmp_path: Path) -> None:
    path = str(write(tmp_path, TUTORIAL))
    done = run_cli("--config-file", path, "--no-runtime-checks", "CONFIG.TRAIN.BATCH_SIZE", "16")
    assert done.returncode == 0, done.stderr
    resolved = validate_config(parse_yaml(done.stdout))
    assert resolved.CONFIG.TRAIN.BATCH_SIZE == 16 and resolved.DDP_CONFIG.WORLD_SIZE == 2
    done = run_cli("--config-file", path, "--no-runtime-checks", "CONFIG.TRAIN.BATCH_SIZ", "16")
    assert done.returncode == 2 and "did you mean CONFIG.TRAIN.BATCH_SIZE?" in done.stderr and done.stdout == ""


@pytest.fixture
def india_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC+05:30 (a POSIX TZ rule: no time-zone database needed) while the test runs."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_run_dir_follows_base_path_and_exp_name(tmp_path: Path, india_time: None) -> None:
    def with_log(**log: str) -> Config:
        return validate_config({"CONFIG": {"LOG": {"BASE_PATH": str(tmp_path), **log}}})

    assert run_dir(with_log(EXP_NAME="")) == tmp_path
    assert run_dir(with_log(EXP_NAME="exp1")) == tmp_path / "exp1"
    # EXP_NAME defaults to 'use_time': GluonCV's local-time name; 1_700_000_000 is 2023-11-14 22:13:20 UTC
    assert run_dir(with_log(), now=1_700_000_000.0) == tmp_path / "2023-11-15-03-43-20"
