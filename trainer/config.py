"""Experiment configuration: a GluonCV-compatible schema with defaults, YAML loading, overrides, validation, dump.

A GluonCV ``*_kinetics400.yaml`` (``DDP_CONFIG`` + ``CONFIG.{TRAIN,VAL,INFERENCE,DATA,MODEL,LOG}``) loads unchanged;
keys GluonCV lacks (AMP, gradient clipping and accumulation, seeds, resume, ...) have defaults that keep its
behaviour. Every problem is reported before anything starts, as a ``ConfigError`` naming the file and dotted key.

Validate a node's file (what the Ansible launcher runs; exit status 2 on an error)::

    python -m trainer.config --config-file node.yaml --check                       # on the node itself
    python -m trainer.config --config-file node.yaml --check --no-runtime-checks   # on a controller without GPUs
    python -m trainer.config --config-file x.yaml CONFIG.TRAIN.BATCH_SIZE 16       # print the resolved YAML
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

# GluonCV spells it WOLRD_URLS; WORLD_URLS is accepted on input, WOLRD_URLS is what we write.
URLS_KEY, URLS_ALIAS = "WOLRD_URLS", "WORLD_URLS"


class ConfigError(ValueError):
    """An invalid configuration; the message names the file and the dotted key(s) and says what to change."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``; GluonCV files write ``1e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str) -> Any:
    """Parse YAML the way config files and override values are read (safe, ``1e-4`` is a float)."""
    return yaml.load(text, Loader=_Loader)


def _expand_user(value: str) -> str:
    return str(Path(value).expanduser()) if value.startswith("~") else value


# A path in the config: "~" is the home of the user running the trainer (each node's own, on a cluster).
UserPath = Annotated[str, AfterValidator(_expand_user)]


class _Section(BaseModel):
    # Strict: a quoted '16' is not an integer and 'yes' is not a boolean; YAML already gives the right types.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


def _false_only(value: bool) -> bool:
    if value:
        raise PydanticCustomError("unsupported", "multigrid training is not supported; set it to False")
    return value


NotSupported = Annotated[bool, AfterValidator(_false_only)]


class DDPConfig(_Section):
    AUTO_RANK_MATCH: bool = Field(
        True, description="Find this node's WORLD_RANK by matching its addresses to WOLRD_URLS."
    )
    WORLD_SIZE: int = Field(1, ge=1, description="Number of nodes (machines) in the job.")
    WORLD_RANK: int = Field(
        0, ge=0, description="Rank of this node; 0 hosts the rendezvous. Ignored with AUTO_RANK_MATCH."
    )
    GPU_WORLD_SIZE: int = Field(
        8, ge=1, description="Total worker processes; recomputed at launch, never read from here."
    )
    GPU_WORLD_RANK: int = Field(
        0, ge=0, description="Global rank of a worker; recomputed at launch, never read from here."
    )
    DIST_URL: str = Field("tcp://127.0.0.1:10001", description="Rendezvous tcp://host:port; host is WOLRD_URLS[0].")
    WOLRD_URLS: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        validation_alias=AliasChoices(URLS_KEY, URLS_ALIAS),
        description="One address per node in node-rank order (GluonCV spelling; WORLD_URLS is accepted).",
    )
    DIST_BACKEND: Literal["nccl", "gloo"] = Field("nccl", description="Collective backend: nccl (GPUs) or gloo (CPUs).")
    GPU: int = Field(
        0,
        ge=0,
        description="Device index of a worker on its node; set at launch (the device if not DISTRIBUTED).",
    )
    DISTRIBUTED: bool = Field(
        True, description="Use DistributedDataParallel; False trains in one process, no collectives."
    )
    CPU_WORKERS: int = Field(1, ge=1, description="Worker processes per node on a node without GPUs (gloo).")
    TIMEOUT_SECONDS: int = Field(
        300, ge=1, description="Rendezvous and collective timeout; a missing peer fails the run."
    )

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict) and URLS_KEY in data and URLS_ALIAS in data:
            raise _ddp_error(URLS_KEY, f"also given as {URLS_ALIAS}; keep only one of the two spellings")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> DDPConfig:
        problem = _url_problem(self.DIST_URL) or (_topology_problem(self) if self.DISTRIBUTED else None)
        if problem is not None:
            raise _ddp_error(*problem)
        return self


def _ddp_error(key: str, message: str) -> PydanticCustomError:
    # The key travels in the context so the message can name DDP_CONFIG.<key>, not only the section.
    return PydanticCustomError("ddp", "{key}: {message}", {"key": key, "message": message})


def dist_url_host_port(url: str) -> tuple[str, int]:
    """Split ``tcp://host:port`` (IPv6 hosts in brackets); ValueError if it is not of that form."""
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(url)
    return parts.hostname, parts.port


def _url_problem(url: str) -> tuple[str, str] | None:
    try:
        dist_url_host_port(url)
    except ValueError:
        return "DIST_URL", f"{url!r} is not tcp://host:port; write it as e.g. 'tcp://10.0.0.1:23456'"
    return None


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def _topology_problem(ddp: DDPConfig) -> tuple[str, str] | None:
    urls, size = ddp.WOLRD_URLS, ddp.WORLD_SIZE
    if len(urls) != size:
        return "WORLD_SIZE", (
            f"is {size} but WOLRD_URLS lists {len(urls)} address(es); "
            f"list one address per node or set WORLD_SIZE to {len(urls)}"
        )
    host, port = dist_url_host_port(ddp.DIST_URL)
    if not _same_host(host, urls[0]):
        return "DIST_URL", (
            f"host {host} is not WOLRD_URLS[0] ({urls[0]}), the rank-0 node that hosts the rendezvous; "
            f"set DIST_URL to 'tcp://{urls[0]}:{port}' or put {host} first in WOLRD_URLS"
        )
    if size <= ddp.WORLD_RANK:
        return (
            "WORLD_RANK",
            f"is {ddp.WORLD_RANK} but WORLD_SIZE is {size}; use a node rank from 0 to {size - 1}",
        )
    if ddp.AUTO_RANK_MATCH and len(set(urls)) != len(urls):
        return (
            URLS_KEY,
            "lists an address twice, so AUTO_RANK_MATCH cannot tell the nodes apart; give each node its own",
        )
    return None


class MultigridConfig(_Section):
    USE_LONG_CYCLE: NotSupported = Field(False, description="GluonCV multigrid long cycle; not supported, keep False.")
    USE_SHORT_CYCLE: NotSupported = Field(
        False, description="GluonCV multigrid short cycle; not supported, keep False."
    )
    LONG_CYCLE_EPOCH: list[int] = Field(
        default_factory=lambda: [10, 20, 30], description="Multigrid long-cycle epochs."
    )


def _lr_policy(value: str) -> str:
    # GluonCV configs write 'Step'/'Cosine', other GluonCV tasks 'step'/'cosine': accept either, store one spelling.
    names = {"step": "Step", "cosine": "Cosine"}
    if value.lower() not in names:
        raise PydanticCustomError("lr_policy", "Input should be 'Step' or 'Cosine'")
    return names[value.lower()]


class TrainConfig(_Section):
    EPOCH_NUM: int = Field(196, ge=1, description="Number of training epochs.")
    BATCH_SIZE: int = Field(8, ge=1, description="Clips per optimizer micro-step per process (per GPU), not global.")
    LR: float = Field(0.01, gt=0, description="Base learning rate (before SCALE_LR).")
    MOMENTUM: float = Field(0.9, ge=0, description="SGD momentum; AdamW beta1.")
    ADAM_BETA2: float = Field(0.98, description="AdamW beta2.")
    ADAM_EPS: float = Field(1.5e-09, gt=0, description="AdamW epsilon.")
    W_DECAY: float = Field(1e-4, ge=0, description="Weight decay (L2 regularisation).")
    LR_POLICY: Annotated[str, AfterValidator(_lr_policy)] = Field(
        "Step",
        description="LR schedule: 'Step' (LR_MILESTONE, STEP) or 'Cosine'; GluonCV's script uses Step if unset.",
    )
    LR_MILESTONE: list[int] = Field(
        default_factory=lambda: [40, 80], description="Epochs at which Step multiplies LR by STEP."
    )
    STEP: float = Field(0.1, gt=0, description="LR multiplier at each LR_MILESTONE.")
    USE_WARMUP: bool = Field(False, description="Warm the LR up linearly over WARMUP_EPOCHS first.")
    WARMUP_EPOCHS: int = Field(0, ge=0, description="Length of the warmup in epochs when USE_WARMUP is True.")
    WARMUP_START_LR: float = Field(0.01, ge=0, description="Learning rate at the start of the warmup.")
    WARMUP_END_LR: float = Field(
        0.1, ge=0, description="Learning rate at the end of the warmup (GluonCV's warmup target)."
    )
    RESUME_EPOCH: int = Field(-1, ge=-1, description="GluonCV's resume epoch (-1 = from the start); prefer RESUME.")
    MULTIGRID: MultigridConfig = Field(default_factory=MultigridConfig, description="GluonCV multigrid settings.")
    OPTIMIZER: Literal["SGD", "AdamW"] = Field("SGD", description="Optimizer: SGD (momentum) or AdamW.")
    NESTEROV: bool = Field(False, description="Use Nesterov momentum with SGD.")
    AMP: Literal["off", "bf16", "fp16"] = Field("off", description="Mixed precision on CUDA (fp16 adds a grad scaler).")
    CLIP_GRAD_NORM: float = Field(0.0, ge=0, description="Clip the global gradient norm to this value; 0 turns it off.")
    ACCUM_STEPS: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step (no_sync in between).")
    LABEL_SMOOTHING: float = Field(0.0, ge=0, lt=1, description="Label smoothing of the cross-entropy loss.")
    SEED: int = Field(
        0, ge=0, description="Seed for model init, sampling and augmentation (offset per rank and epoch)."
    )
    RESUME: str = Field("auto", description="'auto' = latest checkpoint in the run dir if any, '' = never, or a path.")
    KEEP_LAST: int = Field(3, ge=1, description="Epoch checkpoints kept besides best.pth.")
    SCALE_LR: bool = Field(False, description="Scale LR by global batch / BASE_BATCH_SIZE (linear scaling rule).")
    BASE_BATCH_SIZE: int = Field(64, ge=1, description="Global batch at which LR applies unscaled when SCALE_LR is on.")
    SYNC_BN: bool = Field(False, description="Convert BatchNorm to SyncBatchNorm across processes.")
    FIND_UNUSED_PARAMETERS: bool = Field(
        False, description="DDP find_unused_parameters (only for models that need it)."
    )


class ValConfig(_Section):
    FREQ: int = Field(2, ge=1, description="Validate every FREQ epochs (and after the last).")
    BATCH_SIZE: int = Field(8, ge=1, description="Validation clips per batch per process.")


class InferenceConfig(_Section):
    FEAT: bool = Field(False, description="Return features instead of class scores (GluonCV feature extraction).")


class DataConfig(_Section):
    TRAIN_ANNO_PATH: UserPath = Field("", description="Training annotation list (GluonCV or PySlowFast format).")
    TRAIN_DATA_PATH: UserPath = Field("", description="Root the training list's video paths are relative to.")
    VAL_ANNO_PATH: UserPath = Field("", description="Validation/test annotation list.")
    VAL_DATA_PATH: UserPath = Field("", description="Root the validation list's video paths are relative to.")
    NUM_CLASSES: int = Field(400, ge=1, description="Number of classes; sets the model's head.")
    CLIP_LEN: int = Field(16, ge=1, description="Frames per clip.")
    FRAME_RATE: int = Field(2, ge=1, description="Step between sampled frames of a clip.")
    KEEP_ASPECT_RATIO: bool = Field(
        False,
        description="Keep the aspect ratio when resizing (short side) instead of NEW_HEIGHT x NEW_WIDTH.",
    )
    NUM_SEGMENT: int = Field(1, ge=1, description="Segments per video in training, one clip from each.")
    NUM_CROP: int = Field(1, ge=1, description="Spatial crops per clip in training.")
    TEST_NUM_SEGMENT: int = Field(10, ge=1, description="Temporal views per video in multi-view test.")
    TEST_NUM_CROP: int = Field(3, ge=1, description="Spatial views per clip in multi-view test (1 or 3).")
    CROP_SIZE: int = Field(224, ge=1, description="Spatial crop size fed to the model.")
    SHORT_SIDE_SIZE: int = Field(256, ge=1, description="Short side the frames are resized to before cropping.")
    NEW_HEIGHT: int = Field(256, ge=1, description="Frame height after resizing when not keeping the aspect ratio.")
    NEW_WIDTH: int = Field(340, ge=1, description="Frame width after resizing when not keeping the aspect ratio.")
    NUM_WORKERS: int = Field(0, ge=0, description="DataLoader worker processes per training process.")
    MULTIGRID: NotSupported = Field(False, description="GluonCV multigrid sampler; not supported, keep False.")
    CLASS_INDEX: UserPath = Field("", description="Optional file with one class name per line, in label order.")
    RANDOM_FLIP: bool = Field(
        True, description="Random horizontal flip in training; turn off when left/right motion defines the class."
    )
    SCALE_JITTER: tuple[float, float] = Field(
        (1.0, 1.25),
        strict=False,  # YAML writes the pair as a list
        description="Training short side is drawn from SHORT_SIDE_SIZE x [lo, hi] (PySlowFast's 256-320).",
    )

    DECODER: Literal["decord", "torchcodec", "auto"] = Field(
        "decord",
        description="Video decoder: decord (GluonCV's), torchcodec, or auto (decord, and torchcodec for a video "
        "decord cannot open, such as AV1; each such video is logged once).",
    )
    DECODER_DEVICE: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Where torchcodec decodes: cuda = this process's GPU (NVDEC; needs DECODER torchcodec and "
        "NUM_WORKERS 0), on the CPU with a warning when there is no GPU or torchcodec is a CPU-only build.",
    )

    @field_validator("SCALE_JITTER")
    @classmethod
    def _jitter_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 < value[0] <= value[1]:
            raise ValueError(f"needs 0 < lo <= hi, got {list(value)}")
        return value

    @field_validator("DECODER_DEVICE")
    @classmethod
    def _gpu_decoding(cls, value: str, info: ValidationInfo) -> str:
        if value == "cuda" and info.data.get("DECODER", "torchcodec") != "torchcodec":
            raise ValueError(f"cuda decoding needs DECODER torchcodec (DECODER is {info.data['DECODER']!r})")
        if value == "cuda" and info.data.get("NUM_WORKERS", 0) > 0:
            # Frames decoded on the GPU cannot come out of forked DataLoader workers.
            raise ValueError("cuda decoding runs in the training process; set NUM_WORKERS to 0")
        return value


class ModelConfig(_Section):
    NAME: str = Field("", description="Model name in the registry (GluonCV names are aliases).")
    LOAD: bool = Field(False, description="Load weights from PRETRAINED_PATH before training (fine-tuning).")
    PRETRAINED_PATH: UserPath = Field("", description="Local checkpoint file to load when LOAD is True.")
    PRETRAINED: bool = Field(False, description="Use the model zoo's trained weights (GluonCV meaning).")
    PRETRAINED_BASE: bool = Field(
        True, description="Use a pretrained backbone where the model supports it (GluonCV meaning)."
    )
    BN_EVAL: bool = Field(False, description="Keep BatchNorm layers in eval mode while training.")
    PARTIAL_BN: bool = Field(False, description="Train only the first BatchNorm layer (partial BN).")
    BN_FROZEN: bool = Field(False, description="Freeze BatchNorm parameters.")
    USE_AFFINE: bool = Field(False, description="Use affine BatchNorm parameters in the GluonCV models that offer it.")


class LogConfig(_Section):
    BASE_PATH: UserPath = Field("", description="Base output directory; '' is the current directory.")
    EXP_NAME: str = Field(
        "use_time",
        description="Run subdirectory of BASE_PATH; '' = BASE_PATH itself, 'use_time' = start time.",
    )
    LOG_DIR: str = Field("tb_log", description="TensorBoard subdirectory of the run directory.")
    SAVE_DIR: str = Field("checkpoints", description="Checkpoint subdirectory of the run directory.")
    EVAL_DIR: UserPath = Field("", description="Directory for test outputs; '' = the run directory.")
    SAVE_FREQ: int = Field(1, ge=1, description="Save a checkpoint every SAVE_FREQ epochs (and after the last).")
    DISPLAY_FREQ: int = Field(1, ge=1, description="Log training progress every DISPLAY_FREQ iterations.")
    LEVEL: Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"] = Field("DEBUG", description="Log level.")
    LOG_FILENAME: str = Field("log.txt", description="Log file name in the run directory.")


class TrainingConfig(_Section):
    TRAIN: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation and schedule.")
    VAL: ValConfig = Field(default_factory=ValConfig, description="Validation during training.")
    INFERENCE: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference options.")
    DATA: DataConfig = Field(default_factory=DataConfig, description="Data, sampling and augmentation.")
    MODEL: ModelConfig = Field(default_factory=ModelConfig, description="Model choice and weights.")
    LOG: LogConfig = Field(default_factory=LogConfig, description="Output locations and logging.")


class Config(_Section):
    DDP_CONFIG: DDPConfig = Field(default_factory=DDPConfig, description="Nodes, ranks and rendezvous (GluonCV keys).")
    CONFIG: TrainingConfig = Field(default_factory=TrainingConfig, description="Training, data, model and logging.")


# ---------------------------------------------------------------------------------------------------------------------
# Error messages


def _schema_keys(model: type[BaseModel], prefix: str = "") -> dict[str, type[BaseModel] | None]:
    """Every dotted key of the schema -> its section model (None for a leaf)."""
    keys: dict[str, type[BaseModel] | None] = {}
    for name, field in model.model_fields.items():
        sub = (
            field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
        )
        keys[prefix + name] = sub
        if sub is not None:
            keys.update(_schema_keys(sub, f"{prefix}{name}."))
    return keys


def _nearest_key(section: str, name: str) -> str:
    """Where an unknown key probably belongs: the same name in another section, else the closest valid key."""
    keys = _schema_keys(Config)
    elsewhere = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if elsewhere:
        return " or ".join(elsewhere)
    prefix = f"{section}." if section else ""
    siblings = [k.removeprefix(prefix) for k in keys if k.startswith(prefix) and "." not in k.removeprefix(prefix)]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return prefix + close[0]
    leaves = {k.rsplit(".", 1)[-1]: k for k in reversed(keys)}
    close = difflib.get_close_matches(name, list(leaves), n=1, cutoff=0.6)
    if close:
        return leaves[close[0]]
    return prefix + difflib.get_close_matches(name, siblings, n=1, cutoff=0.0)[0]


def _dotted(loc: Sequence[str | int]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _describe(error: ErrorDetails) -> str:
    loc = [p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    ctx = error.get("ctx") or {}
    if error["type"] == "extra_forbidden":
        section, name = _dotted(loc[:-1]), str(loc[-1])
        return f"{_dotted(loc)}: unknown key; did you mean {_nearest_key(section, name)}?"
    if error["type"] == "ddp":
        return f"{_dotted([*loc, ctx['key']])}: {ctx['message']}"
    return f"{_dotted(loc)}: {error['msg'].removeprefix('Value error, ')}, got {error['input']!r}"


def _error(source: str, exc: ValidationError) -> ConfigError:
    lines = [_describe(e) for e in exc.errors()]
    if len(lines) == 1:
        return ConfigError(f"{source}: {lines[0]}")
    return ConfigError(f"{source}: {len(lines)} problems:\n  " + "\n  ".join(lines))


# ---------------------------------------------------------------------------------------------------------------------
# Loading, overrides, dumping


def _canonical_key(key: str) -> str:
    return f"DDP_CONFIG.{URLS_KEY}" if key == f"DDP_CONFIG.{URLS_ALIAS}" else key


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *sections, leaf = key.split(".")
    node = data
    for i, part in enumerate(sections):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(sections[: i + 1])} is a value, not a section")
        node = child
    if leaf == URLS_KEY and sections == ["DDP_CONFIG"]:
        node.pop(URLS_ALIAS, None)  # the override replaces the list whichever spelling the file used
    node[leaf] = value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``KEY VALUE`` pairs (dotted keys, values parsed as YAML) to a raw config dict, in place."""
    if len(overrides) % 2:
        raise ConfigError(f"overrides come in KEY VALUE pairs; {overrides[-1]!r} has no value")
    for key, text in zip(overrides[::2], overrides[1::2], strict=True):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
            raise ConfigError(f"override {key!r}: not a dotted key such as CONFIG.TRAIN.BATCH_SIZE")
        try:
            value = "" if text == "" else parse_yaml(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {key}: value {text!r} is not valid YAML ({exc})") from exc
        _set_dotted(data, _canonical_key(key), value)
    return data


def validate_config(data: Any, source: str = "config") -> Config:
    """Build a Config from a raw dict; any problem becomes one ConfigError listing every bad key."""
    try:
        return Config.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise _error(source, exc) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config, apply ``KEY VALUE`` overrides, validate. GPU availability is checked by check_runtime."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with DDP_CONFIG and CONFIG sections")
    data = apply_overrides(data or {}, overrides)
    source = f"{path} (with overrides)" if overrides else str(path)
    return validate_config(data, source)


def check_runtime(cfg: Config) -> None:
    """Checks that need this machine, not only the file: a distributed nccl run needs a visible GPU, and DECODER
    torchcodec or auto needs a torchcodec that loads FFmpeg's libraries."""
    decoder = cfg.CONFIG.DATA.DECODER
    if decoder != "decord":
        from trainer.data.decoders import torchcodec_problem  # imports torch and decord: only on a node

        problem = torchcodec_problem()
        if problem is not None:
            raise ConfigError(f"CONFIG.DATA.DECODER: {decoder} needs torchcodec, which cannot run here: {problem}")
    ddp = cfg.DDP_CONFIG
    if not (ddp.DISTRIBUTED and ddp.DIST_BACKEND == "nccl"):
        return
    import torch  # here, not at the top: the controller validates files without torch installed

    if not torch.cuda.is_available():
        raise ConfigError(
            "DDP_CONFIG.DIST_BACKEND: nccl needs a GPU but none is visible on this machine; "
            "set DIST_BACKEND: 'gloo' to train on CPUs (or check the driver and CUDA_VISIBLE_DEVICES)"
        )


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (keys as GluonCV writes them), safe to dump or store in a checkpoint."""
    return cfg.model_dump(mode="json")


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML that load_config reads back to an equal Config."""
    Path(path).write_text(config_to_yaml(cfg))


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def run_dir(cfg: Config, now: float | None = None) -> Path:
    """LOG.BASE_PATH/EXP_NAME; EXP_NAME '' is BASE_PATH itself, 'use_time' the start time (now) as GluonCV names it."""
    log = cfg.CONFIG.LOG
    base = Path(log.BASE_PATH)
    if log.EXP_NAME == "use_time":
        return base / time.strftime("%Y-%m-%d-%H-%M-%S", time.localtime(now))
    return base / log.EXP_NAME if log.EXP_NAME else base


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def describe_schema() -> str:
    """Every key with its default and meaning, as a Markdown table: the config reference (docs/CONFIG.md)."""
    defaults = config_to_dict(Config())
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], values: dict[str, Any], prefix: str) -> None:
        for name, field in model.model_fields.items():
            sub = _schema_keys(model)[name]
            if sub is not None:
                walk(sub, values[name], f"{prefix}{name}.")
            else:
                default = yaml.safe_dump(values[name], default_flow_style=True).strip().removesuffix("...").strip()
                rows.append(f"| `{prefix}{name}` | `{default}` | {field.description} |")

    walk(Config, defaults, "")
    return "\n".join(rows) + "\n"


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.config",
        description="Validate a config and print it resolved.",
        add_help=add_help,
    )
    parser.add_argument("--config-file", type=Path, help="experiment or node YAML (GluonCV DDP format)")
    parser.add_argument("--describe", action="store_true", help="print every key, its default and meaning (Markdown)")
    parser.add_argument("--check", action="store_true", help="print a one-line summary instead of the resolved YAML")
    parser.add_argument(
        "--no-runtime-checks",
        action="store_true",
        help="skip checks about this machine (GPU for nccl): for validating another node's file on a controller",
    )
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE overrides")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.describe:
        print(describe_schema(), end="")
        return 0
    if args.config_file is None:
        parser.error("--config-file is required (or --describe)")
    try:
        cfg = load_config(args.config_file, args.opts)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if not args.no_runtime_checks:
            check_runtime(cfg)
    except ConfigError as exc:
        print(f"error: {args.config_file}: {exc}", file=sys.stderr)
        return 2
    ddp = cfg.DDP_CONFIG
    if args.check:
        print(
            f"ok: {args.config_file}: {ddp.WORLD_SIZE} node(s), backend {ddp.DIST_BACKEND}, "
            f"distributed {ddp.DISTRIBUTED}, rendezvous {ddp.DIST_URL}"
        )
    else:
        print(config_to_yaml(cfg), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
