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
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self
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

from trainer.errors import UserError
from trainer.runtime.contract import run_name

# GluonCV spells it WOLRD_URLS; WORLD_URLS is accepted on input, WOLRD_URLS is what we write.
URLS_KEY, URLS_ALIAS = "WOLRD_URLS", "WORLD_URLS"


class ConfigError(UserError, ValueError):
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

    def _problem(self) -> tuple[str, str] | None:
        """A problem across this section's keys: (the key at fault, relative to the section; message), or None."""
        return None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problem = self._problem()
        if problem is not None:
            raise _key_error(*problem)
        return self


def _only(inert: Any, reason: str) -> AfterValidator:
    """A key whose feature is not provided: only GluonCV's no-op value loads, anything else is refused by name."""

    def check(value: Any) -> Any:
        if value != inert:
            raise PydanticCustomError("unsupported", reason)
        return value

    return AfterValidator(check)


class DDPConfig(_Section):
    AUTO_RANK_MATCH: bool = Field(
        True, description="Find this node's WORLD_RANK by matching its addresses to WOLRD_URLS."
    )
    WORLD_SIZE: int = Field(1, ge=1, description="Number of nodes (machines) in the job.")
    WORLD_RANK: int = Field(
        0,
        ge=0,
        description="Rank of this node; 0 hosts the rendezvous. With AUTO_RANK_MATCH, 0 or the rank it finds.",
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
            raise _key_error(URLS_KEY, f"also given as {URLS_ALIAS}; keep only one of the two spellings")
        return data

    def _problem(self) -> tuple[str, str] | None:
        return _url_problem(self.DIST_URL) or (_topology_problem(self) if self.DISTRIBUTED else None)


def _key_error(key: str, message: str) -> PydanticCustomError:
    # The key (relative to the section that raises) travels in the context, so the message can name the full
    # dotted key, not only the section whose validator found the problem.
    return PydanticCustomError("key", "{key}: {message}", {"key": key, "message": message})


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
    USE_LONG_CYCLE: bool = Field(
        False,
        description="Multigrid long cycle: epoch stages of (T/2, S/sqrt2) at 4x the batch, (T/2, S) at 2x, then "
        "(T, S), the LR scaled with the batch (trainer/data/multigrid.py).",
    )
    USE_SHORT_CYCLE: bool = Field(
        False, description="Multigrid short cycle: iterations at crops S/2 (4x batch), S/sqrt2 (2x), S, in turn."
    )
    LONG_CYCLE_EPOCH: list[int] = Field(
        default_factory=lambda: [10, 20, 30],
        description="Epochs (0-based) after which the long cycle moves to its next stage, wrapping around after the "
        "last as GluonCV does; the last epoch must train at the full shape.",
    )


def _multigrid_problem(train: TrainConfig) -> tuple[str, str] | None:
    multigrid = train.MULTIGRID
    if not multigrid.USE_LONG_CYCLE:
        if _changed(multigrid, "LONG_CYCLE_EPOCH"):
            return "MULTIGRID.LONG_CYCLE_EPOCH", "only USE_LONG_CYCLE: True uses it; remove it or set USE_LONG_CYCLE"
        return None
    epochs = multigrid.LONG_CYCLE_EPOCH
    if not epochs or epochs != sorted(set(epochs)) or epochs[0] < 0:
        return "MULTIGRID.LONG_CYCLE_EPOCH", f"is {epochs}; list increasing epochs (0-based), at least one"
    last_stage = sum(m < train.EPOCH_NUM - 1 for m in epochs) % 3
    if last_stage != 2:
        return "MULTIGRID.LONG_CYCLE_EPOCH", (
            f"is {epochs}: with EPOCH_NUM {train.EPOCH_NUM} the last epoch would train at long-cycle stage "
            f"{last_stage} of 0-2 (the stages wrap around, as GluonCV's), not at the full shape; list 2 (or 5, 8, ...) "
            "epochs before the last, e.g. [EPOCH_NUM // 4, EPOCH_NUM // 2]"
        )
    return None


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
    WARMUP_EPOCHS: int = Field(
        0, ge=0, description="Length of the warmup in epochs; >= 1 with USE_WARMUP, 0 without."
    )
    WARMUP_START_LR: float = Field(
        0.0,
        ge=0,
        description="LR at the start of the warmup. Unset: 0 for RECIPE gluoncv (its only value), 0.01 for pyslowfast.",
    )
    WARMUP_END_LR: Annotated[
        float | None,
        _only(
            None,
            "GluonCV's script never reads it (its warmup ends at LR) and PySlowFast has no such key; remove it: "
            "the warmup ends where the schedule starts",
        ),
    ] = Field(None, description="Refused: GluonCV declares it but never reads it; the warmup ends at the schedule.")
    RESUME_EPOCH: Annotated[
        int,
        _only(
            -1,
            "GluonCV's resume epoch is not supported; resume with CONFIG.TRAIN.RESUME (a checkpoint path, or 'auto' "
            "for the run's newest) and remove RESUME_EPOCH",
        ),
    ] = Field(-1, description="GluonCV's resume epoch: only -1 (start from the beginning) loads; use RESUME.")
    MULTIGRID: MultigridConfig = Field(default_factory=MultigridConfig, description="GluonCV multigrid settings.")
    OPTIMIZER: Literal["SGD", "AdamW"] = Field("SGD", description="Optimizer: SGD (momentum) or AdamW.")
    NESTEROV: bool = Field(False, description="Use Nesterov momentum with SGD.")
    AMP: Literal["auto", "off", "bf16", "fp16"] = Field(
        "auto",
        description="Mixed precision on CUDA: auto = bf16 where the GPU supports it (Ampere and newer), else fp16 "
        "(V100, T4); fp16 adds a grad scaler; bf16 on an older GPU (V100, T4) is refused on the node. CPUs always "
        "train in float32.",
    )
    CHANNELS_LAST: bool = Field(
        False, description="Model and clips in channels_last_3d memory order (faster 3D convs on recent GPUs)."
    )
    COMPILE: bool = Field(
        False, description="torch.compile the training model (the first steps compile; needs a C/C++ compiler and "
        "Python.h on the node, checked before the launch). DDP then runs without static_graph."
    )
    CUDNN_BENCHMARK: bool = Field(
        True, description="Let cuDNN time its convolution algorithms per input shape and keep the fastest (CUDA)."
    )
    DDP_BUCKET_CAP_MB: int = Field(
        25, ge=1, description="Gradient bucket size of DDP's all-reduce, in MiB (torch's default 25)."
    )
    CLIP_GRAD_NORM: float = Field(0.0, ge=0, description="Clip the global gradient norm to this value; 0 turns it off.")
    ACCUM_STEPS: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step (no_sync in between).")
    LABEL_SMOOTHING: float = Field(0.0, ge=0, lt=1, description="Label smoothing of the cross-entropy loss.")
    SEED: int = Field(
        0, ge=0, description="Seed for model init, sampling and augmentation (offset per rank and epoch)."
    )
    RESUME: str = Field(
        "auto",
        description="'auto' = the run's newest checkpoint (epoch or mid-epoch; on several nodes, the newest held by "
        "two nodes) if any, '' = never, or a path.",
    )
    KEEP_LAST: int = Field(3, ge=1, description="Epoch checkpoints kept besides best.pth.")
    CHECKPOINT_MINUTES: float = Field(
        20.0,
        ge=0,
        description="Minutes of training between mid-epoch checkpoints (rank 0's clock; every rank saves at the same "
        "optimizer step, written in the background; the two newest are kept); 0 = epoch checkpoints only.",
    )
    SCALE_LR: bool = Field(False, description="Scale LR by global batch / BASE_BATCH_SIZE (linear scaling rule).")
    BASE_BATCH_SIZE: int = Field(64, ge=1, description="Global batch at which LR applies unscaled when SCALE_LR is on.")
    SYNC_BN: bool = Field(
        False, description="Convert BatchNorm to SyncBatchNorm across processes (GPUs only: refused on a CPU node)."
    )
    FIND_UNUSED_PARAMETERS: bool = Field(
        False, description="DDP find_unused_parameters (only for models that need it)."
    )
    DROP_LAST: bool = Field(
        False, description="Drop each rank's last incomplete training batch (PySlowFast does; GluonCV does not)."
    )
    PRECISE_BN: bool = Field(
        False,
        description="Recompute BatchNorm statistics before each validation and checkpoint (PySlowFast's "
        "BN.USE_PRECISE_STATS), averaged over all ranks.",
    )
    PRECISE_BN_BATCHES: int = Field(
        200, ge=1, description="Training batches per rank for PRECISE_BN (PySlowFast's BN.NUM_BATCHES_PRECISE)."
    )
    HEAD_LR_MULT: float = Field(
        1.0, gt=0, description="Learning-rate multiplier of the classifier head (fine-tuning: e.g. 10)."
    )

    def _problem(self) -> tuple[str, str] | None:
        return _inert_train_key(self) or _multigrid_problem(self)


def _changed(section: BaseModel, key: str) -> bool:
    return getattr(section, key) != type(section).model_fields[key].get_default(call_default_factory=True)


def _inert_train_key(train: TrainConfig) -> tuple[str, str] | None:
    """A key set away from its default where nothing would read it: refused, so no setting is silently dropped."""
    if train.USE_WARMUP and train.WARMUP_EPOCHS < 1:
        return "WARMUP_EPOCHS", "is 0 but USE_WARMUP is True; set the warmup length in epochs (>= 1)"
    if not train.USE_WARMUP and train.WARMUP_EPOCHS > 0:
        return "WARMUP_EPOCHS", (
            f"is {train.WARMUP_EPOCHS} but USE_WARMUP is False, so no warmup runs (and GluonCV's cosine would "
            "still end that many epochs early); set USE_WARMUP: True or WARMUP_EPOCHS: 0"
        )
    unused_unless = (
        (train.OPTIMIZER == "AdamW", ("ADAM_BETA2", "ADAM_EPS"), "OPTIMIZER: AdamW"),
        (train.OPTIMIZER == "SGD", ("NESTEROV",), "OPTIMIZER: SGD"),
        (train.LR_POLICY == "Step", ("LR_MILESTONE", "STEP"), "LR_POLICY: Step"),
        (train.PRECISE_BN, ("PRECISE_BN_BATCHES",), "PRECISE_BN: True"),
        (train.SCALE_LR, ("BASE_BATCH_SIZE",), "SCALE_LR: True"),
    )
    for used, keys, condition in unused_unless:
        for key in keys:
            if not used and _changed(train, key):
                return key, f"only {condition} uses it; remove it or set {condition}"
    return None


class ValConfig(_Section):
    FREQ: int = Field(2, ge=1, description="Validate every FREQ epochs (and after the last).")
    BATCH_SIZE: int = Field(8, ge=1, description="Validation clips per batch per process.")


class InferenceConfig(_Section):
    FEAT: Annotated[
        bool,
        _only(False, "feature extraction (GluonCV's feat_extract_pytorch.py) is not provided; set it to False"),
    ] = Field(False, description="GluonCV feature extraction; not provided, only False loads.")


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
    NUM_CROP: Annotated[
        int, _only(1, "multi-crop training is not provided (GluonCV's own trainer ignores it too); set it to 1")
    ] = Field(1, description="Spatial crops per clip in training; only 1 loads (as GluonCV trains).")
    TEST_NUM_SEGMENT: int = Field(10, ge=1, description="Temporal views per video in multi-view test.")
    TEST_NUM_CROP: int = Field(
        3, ge=1, description="Spatial views per clip in multi-view test, evenly placed along the long side."
    )
    CROP_SIZE: int = Field(224, ge=1, description="Spatial crop size fed to the model in training and validation.")
    TEST_CROP_SIZE: int = Field(
        256,
        ge=1,
        description="Crop size of the multi-view test. Unset: SHORT_SIDE_SIZE, crops that cover the short side "
        "(GluonCV, PySlowFast, MMAction2).",
    )
    SHORT_SIDE_SIZE: int = Field(256, ge=1, description="Short side the frames are resized to before cropping.")
    NEW_HEIGHT: int = Field(256, ge=1, description="Frame height after resizing when not keeping the aspect ratio.")
    NEW_WIDTH: int = Field(340, ge=1, description="Frame width after resizing when not keeping the aspect ratio.")
    NUM_WORKERS: int = Field(0, ge=0, description="DataLoader worker processes per training process.")
    PREFETCH_FACTOR: int = Field(
        2, ge=1, description="Batches each DataLoader worker keeps ready (needs NUM_WORKERS > 0)."
    )
    MULTIGRID: bool = Field(
        False,
        description="GluonCV's multigrid dataset switch: True needs TRAIN.MULTIGRID.USE_SHORT_CYCLE or "
        "USE_LONG_CYCLE, which alone decide the grids.",
    )
    CLASS_INDEX: UserPath = Field("", description="Optional file with one class name per line, in label order.")
    RANDOM_FLIP: bool = Field(
        True, description="Random horizontal flip in training; turn off when left/right motion defines the class."
    )
    SCALE_JITTER: tuple[float, float] = Field(
        (1.0, 1.25),
        strict=False,  # YAML writes the pair as a list
        description="Training short side is drawn from SHORT_SIDE_SIZE x [lo, hi] (PySlowFast's 256-320).",
    )

    MEAN: list[float] = Field(
        default_factory=list,
        description="Per-channel (RGB) mean subtracted from frames scaled to [0, 1]; [] = what the initial "
        "weights expect (0.45 for PySlowFast/pytorchvideo, torchvision's own, else ImageNet's).",
    )
    STD: list[float] = Field(
        default_factory=list,
        description="Per-channel (RGB) standard deviation frames are divided by; [] = follows the weights, as MEAN.",
    )
    DECODER: Literal["decord", "torchcodec", "auto"] = Field(
        "decord",
        description="Video decoder: decord (GluonCV's), torchcodec, or auto (decord, and torchcodec for a video "
        "decord cannot open, such as AV1; each such video is logged once).",
    )
    DECODER_DEVICE: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="Where torchcodec decodes: cuda = this process's GPU (NVDEC; needs DECODER torchcodec, "
        "NUM_WORKERS 0 and torchcodec's CUDA build: a CPU-only build is refused), on the CPU with a warning when no "
        "GPU is visible.",
    )
    DECODE_TIME_LIMIT: float = Field(
        60.0,
        ge=0,
        strict=False,  # YAML's 60 is an int
        description="Seconds one clip may take to decode: a decoder that hangs or crashes on a file is "
        "abandoned and the video counted bad ('decoding took longer than N s'), and not decoded again; 0 = no "
        "limit (decoding then runs in the loading process itself). Below DDP_CONFIG.TIMEOUT_SECONDS. GPU decoding "
        "(DECODER_DEVICE cuda) has it too (in a spawned helper process; the frames come back through the CPU).",
    )

    @field_validator("MEAN", "STD")
    @classmethod
    def _per_channel(cls, value: list[float]) -> list[float]:
        if value and (len(value) != 3 or min(value) < 0):
            raise ValueError("needs three non-negative values (R, G, B), or [] to follow the weights")
        return value

    @field_validator("STD")
    @classmethod
    def _positive_std(cls, value: list[float]) -> list[float]:
        if value and min(value) == 0:
            raise ValueError("a standard deviation of 0 would divide by zero")
        return value

    @field_validator("SCALE_JITTER")
    @classmethod
    def _jitter_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 < value[0] <= value[1]:
            raise ValueError(f"needs 0 < lo <= hi, got {list(value)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _test_crop_defaults_to_short_side(cls, data: Any) -> Any:
        if isinstance(data, dict) and "TEST_CROP_SIZE" not in data and isinstance(data.get("SHORT_SIDE_SIZE"), int):
            data = {**data, "TEST_CROP_SIZE": data["SHORT_SIDE_SIZE"]}
        return data

    def _problem(self) -> tuple[str, str] | None:
        if self.NUM_WORKERS == 0 and _changed(self, "PREFETCH_FACTOR"):
            return "PREFETCH_FACTOR", "only DataLoader workers prefetch; set NUM_WORKERS > 0 or remove it"
        if self.TEST_CROP_SIZE > self.SHORT_SIDE_SIZE:
            return "TEST_CROP_SIZE", (
                f"is {self.TEST_CROP_SIZE}, larger than SHORT_SIDE_SIZE {self.SHORT_SIDE_SIZE}, so test crops would "
                "be upscaled; use at most the short side"
            )
        return None

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
    LOAD: bool = Field(
        False,
        description="Start from the weights file PRETRAINED_PATH (ours, PySlowFast .pyth/.pkl, pytorchvideo, "
        "GluonCV or torchvision; detected from the file).",
    )
    PRETRAINED_PATH: UserPath = Field(
        "",
        description="With LOAD: the weights file. With PRETRAINED: a local copy of the published file "
        "(default: the fetch-weights cache).",
    )
    PRETRAINED: bool = Field(
        False,
        description="Start from the published Kinetics-400 weights of NAME (GluonCV meaning), fetched beforehand "
        "with 'python -m trainer fetch-weights NAME'.",
    )
    PARTIAL_LOAD: bool = Field(
        False,
        description="Allow initial weights that do not cover the whole model (the rest stays randomly "
        "initialised); False makes that an error. A classifier of another size is always re-initialised.",
    )
    ALLOW_OTHER_CLIP: bool = Field(
        False,
        description="With PRETRAINED: train on a clip (DATA.CLIP_LEN, FRAME_RATE, CROP_SIZE) other than the one the "
        "weights were trained on; False refuses that, naming the weights' values.",
    )
    PRETRAINED_BASE: bool = Field(
        True,
        description="GluonCV: start its I3D/C2D/TPN backbones from ImageNet; not provided, so with such a model it "
        "needs PRETRAINED or LOAD (or False).",
    )
    BN_EVAL: bool = Field(
        False, description="Every BatchNorm normalises with its running statistics and never updates them; "
        "weight and bias still train."
    )
    PARTIAL_BN: bool = Field(
        False, description="Partial BN (TSN): every BatchNorm but the first is frozen (statistics, weight and bias)."
    )
    BN_FROZEN: bool = Field(
        False, description="Every BatchNorm is frozen: running statistics, weight and bias stay as loaded."
    )
    USE_AFFINE: Annotated[
        bool,
        _only(False, "GluonCV's r2plus1d_v2 affine layers are not provided (no model here has them); set it to False"),
    ] = Field(False, description="GluonCV r2plus1d_v2's fixed affine layers; not provided, only False loads.")
    FREEZE_BACKBONE: bool = Field(
        False, description="Train only the classifier head; the backbone (BatchNorm included) stays as loaded."
    )
    DROPOUT_RATE: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None, description="Dropout before the classifier; unset keeps the model's own (0.5 for the ResNets here)."
    )

    def _problem(self) -> tuple[str, str] | None:
        return _model_problem(self)


# GluonCV builds these families on ImageNet 2D weights when PRETRAINED_BASE is True and PRETRAINED is False
# (i3d_resnet.py and tpn.py inflate them, actionrec_resnetv1b.py loads them); its SlowFast, Slow and R(2+1)D ignore it.
_IMAGENET_BASED = re.compile(r"^(i3d_resnet|i3d_nl|tpn_|resnet\d+_v1b)")


def _model_problem(model: ModelConfig) -> tuple[str, str] | None:
    weights = _weights_problem(model)
    if weights is not None:
        return weights
    if model.PRETRAINED_BASE and not (model.PRETRAINED or model.LOAD) and _IMAGENET_BASED.match(model.NAME.lower()):
        return "PRETRAINED_BASE", (
            f"GluonCV starts {model.NAME} from ImageNet ResNet weights, which are not provided here; set "
            "PRETRAINED: True (Kinetics weights) or LOAD with PRETRAINED_PATH, or PRETRAINED_BASE: False to train "
            "from random initialisation"
        )
    if model.PARTIAL_BN and (model.BN_EVAL or model.BN_FROZEN or model.FREEZE_BACKBONE):
        other = next(k for k in ("BN_EVAL", "BN_FROZEN", "FREEZE_BACKBONE") if getattr(model, k))
        return "PARTIAL_BN", f"keeps the first BatchNorm training, which {other} freezes; choose one of the two"
    return None


def _weights_problem(model: ModelConfig) -> tuple[str, str] | None:
    """One source of initial weights; the keys that only act on initial weights are refused without one."""
    if model.LOAD and model.PRETRAINED:
        return "LOAD", (
            "is True and so is PRETRAINED; keep one: LOAD starts from the file PRETRAINED_PATH, PRETRAINED from the "
            "published weights of NAME"
        )
    if model.LOAD and not model.PRETRAINED_PATH:
        return "PRETRAINED_PATH", "is empty but LOAD is True; name the weights file to start from"
    if not (model.LOAD or model.PRETRAINED):
        for key in ("PRETRAINED_PATH", "PARTIAL_LOAD"):
            if _changed(model, key):
                return key, "only LOAD: True or PRETRAINED: True (initial weights) use it; remove it or set one"
    if model.ALLOW_OTHER_CLIP and not model.PRETRAINED:
        return "ALLOW_OTHER_CLIP", "only PRETRAINED: True (published weights, whose clip is known) uses it; remove it"
    return None


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
    DISPLAY_FREQ: int = Field(
        1, ge=1, description="Log lr, loss and top-1 (and write them to TensorBoard) every DISPLAY_FREQ iterations."
    )
    LEVEL: Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"] = Field(
        "DEBUG", description="Level of rank 0's console and log file (other ranks log warnings and errors)."
    )
    LOG_FILENAME: str = Field("log.txt", description="Log file name in the run directory.")


Recipe = Literal["gluoncv", "pyslowfast"]
RECIPE_DEFAULT_WARMUP_START_LR: dict[str, float] = {"gluoncv": 0.0, "pyslowfast": 0.01}


def detect_recipe(training: dict[str, Any]) -> Recipe:
    """RECIPE 'auto' (or unset): pyslowfast when TRAIN sets WARMUP_START_LR, a PySlowFast key GluonCV's script never
    reads; otherwise gluoncv, whose schema this is (its files load unchanged and keep their meaning)."""
    train = training.get("TRAIN")
    return "pyslowfast" if isinstance(train, dict) and "WARMUP_START_LR" in train else "gluoncv"


class TrainingConfig(_Section):
    RECIPE: Recipe = Field(
        "gluoncv",
        description="Whose meaning the keys follow (schedule, weight decay, test views): gluoncv or pyslowfast; "
        "'auto'/unset: pyslowfast if TRAIN sets WARMUP_START_LR, else gluoncv.",
    )
    TRAIN: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation and schedule.")
    VAL: ValConfig = Field(default_factory=ValConfig, description="Validation during training.")
    INFERENCE: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference options.")
    DATA: DataConfig = Field(default_factory=DataConfig, description="Data, sampling and augmentation.")
    MODEL: ModelConfig = Field(default_factory=ModelConfig, description="Model choice and weights.")
    LOG: LogConfig = Field(default_factory=LogConfig, description="Output locations and logging.")

    @model_validator(mode="before")
    @classmethod
    def _resolve_recipe(cls, data: Any) -> Any:
        # The resolved config names its recipe and the recipe's warmup start, so a dump says what ran.
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("RECIPE", "auto") == "auto":
            data["RECIPE"] = detect_recipe(data)
        train, start = data.get("TRAIN", {}), RECIPE_DEFAULT_WARMUP_START_LR.get(data["RECIPE"])
        if isinstance(train, dict) and "WARMUP_START_LR" not in train and start is not None:
            data["TRAIN"] = {**train, "WARMUP_START_LR": start}
        return data

    def _problem(self) -> tuple[str, str] | None:
        return _training_problem(self)


def _training_problem(cfg: TrainingConfig) -> tuple[str, str] | None:
    """Problems across sections: a recipe's fixed meanings, and BatchNorm settings that leave nothing to act on."""
    train, model = cfg.TRAIN, cfg.MODEL
    if cfg.DATA.MULTIGRID and not (train.MULTIGRID.USE_SHORT_CYCLE or train.MULTIGRID.USE_LONG_CYCLE):
        return "DATA.MULTIGRID", (
            "is True but no multigrid cycle is on; set TRAIN.MULTIGRID.USE_SHORT_CYCLE and/or USE_LONG_CYCLE "
            "(DATA.MULTIGRID alone changes nothing, in GluonCV too)"
        )
    if cfg.RECIPE == "gluoncv" and train.WARMUP_START_LR != 0:
        return "TRAIN.WARMUP_START_LR", (
            "RECIPE gluoncv warms up from 0 (GluonCV's GradualWarmupScheduler); set RECIPE: pyslowfast to start the "
            "warmup at WARMUP_START_LR, or remove it"
        )
    if not train.USE_WARMUP and RECIPE_DEFAULT_WARMUP_START_LR[cfg.RECIPE] != train.WARMUP_START_LR:
        return "TRAIN.WARMUP_START_LR", "USE_WARMUP is False, so no warmup runs; set USE_WARMUP: True or remove it"
    if cfg.RECIPE == "gluoncv" and train.LR_POLICY == "Cosine" and train.EPOCH_NUM <= train.WARMUP_EPOCHS:
        return "TRAIN.EPOCH_NUM", (
            f"is {train.EPOCH_NUM}, not more than WARMUP_EPOCHS {train.WARMUP_EPOCHS}: GluonCV's cosine runs over "
            "the epochs after the warmup, and there are none"
        )
    if model.BN_EVAL or model.BN_FROZEN or model.FREEZE_BACKBONE:
        frozen_by = next(k for k in ("BN_EVAL", "BN_FROZEN", "FREEZE_BACKBONE") if getattr(model, k))
        for key in ("SYNC_BN", "PRECISE_BN"):
            if getattr(train, key):
                return f"TRAIN.{key}", f"MODEL.{frozen_by} keeps every BatchNorm's statistics fixed; turn one off"
    return None


class Config(_Section):
    DDP_CONFIG: DDPConfig = Field(default_factory=DDPConfig, description="Nodes, ranks and rendezvous (GluonCV keys).")
    CONFIG: TrainingConfig = Field(default_factory=TrainingConfig, description="Training, data, model and logging.")

    def _problem(self) -> tuple[str, str] | None:
        limit, timeout = self.CONFIG.DATA.DECODE_TIME_LIMIT, self.DDP_CONFIG.TIMEOUT_SECONDS
        if limit >= timeout:
            # A rank waiting that long for a clip would leave its peers in a collective until they give up.
            return "CONFIG.DATA.DECODE_TIME_LIMIT", (
                f"is {limit:g} s, not below DDP_CONFIG.TIMEOUT_SECONDS ({timeout} s): a rank decoding a hung video "
                "that long would make its peers' collectives time out; lower it or raise TIMEOUT_SECONDS"
            )
        return None


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
    if error["type"] == "key":
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
    """Checks that need this machine, not only the file: a distributed nccl run needs a visible GPU, so does a
    distributed SYNC_BN (SyncBatchNorm works on GPU modules only), DECODER torchcodec or auto needs a torchcodec
    that loads FFmpeg's libraries, and AMP bf16, COMPILE and DECODER_DEVICE cuda need what trainer.hardware says."""
    from trainer.hardware import check_config  # imports torch where a rule needs it: only on a node

    problems = check_config(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    decoder = cfg.CONFIG.DATA.DECODER
    if decoder != "decord":
        from trainer.data.decoders import torchcodec_problem  # imports torch and decord: only on a node

        problem = torchcodec_problem()
        if problem is not None:
            raise ConfigError(f"CONFIG.DATA.DECODER: {decoder} needs torchcodec, which cannot run here: {problem}")
    ddp = cfg.DDP_CONFIG
    if not (ddp.DISTRIBUTED and (ddp.DIST_BACKEND == "nccl" or cfg.CONFIG.TRAIN.SYNC_BN)):
        return
    import torch  # here, not at the top: the controller validates files without torch installed

    if torch.cuda.is_available():
        return
    if ddp.DIST_BACKEND == "nccl":
        raise ConfigError(
            "DDP_CONFIG.DIST_BACKEND: nccl needs a GPU but none is visible on this machine; "
            "set DIST_BACKEND: 'gloo' to train on CPUs (or check the driver and CUDA_VISIBLE_DEVICES)"
        )
    raise ConfigError(
        "CONFIG.TRAIN.SYNC_BN: SyncBatchNorm synchronises statistics between GPU processes only, and no GPU is "
        "visible on this machine; turn SYNC_BN off to train on CPUs (or check the driver and CUDA_VISIBLE_DEVICES)"
    )


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (keys as GluonCV writes them), safe to dump or store in a checkpoint."""
    return cfg.model_dump(mode="json")


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML that load_config reads back to an equal Config."""
    Path(path).write_text(config_to_yaml(cfg))


def config_to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def path_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Dotted keys of every path in the schema (the ``UserPath`` fields), e.g. ``CONFIG.DATA.TRAIN_ANNO_PATH``."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        sub = _schema_keys(model)[name]
        if sub is not None:
            keys += path_keys(sub, f"{prefix}{name}.")
        elif any(getattr(meta, "func", None) is _expand_user for meta in field.metadata):
            keys.append(prefix + name)
    return keys


def input_paths(cfg: Config) -> list[tuple[str, str]]:
    """(dotted key, path) of every file or folder the trainer reads before it starts: the data lists, their video
    roots, the class index and fine-tuning weights. A launcher checks them on every node first."""
    data, model = cfg.CONFIG.DATA, cfg.CONFIG.MODEL
    found = [(f"CONFIG.DATA.{key}", getattr(data, key)) for key in
             ("TRAIN_ANNO_PATH", "TRAIN_DATA_PATH", "VAL_ANNO_PATH", "VAL_DATA_PATH", "CLASS_INDEX")]
    if model.LOAD or model.PRETRAINED:  # the file to start from, or a local copy of the published weights
        found.append(("CONFIG.MODEL.PRETRAINED_PATH", model.PRETRAINED_PATH))
    return [(key, path) for key, path in found if path]


def run_dir(cfg: Config, now: float | None = None) -> Path:
    """LOG.BASE_PATH/EXP_NAME; EXP_NAME '' is BASE_PATH itself, 'use_time' the start time (now) as GluonCV names it."""
    log = cfg.CONFIG.LOG
    base = Path(log.BASE_PATH)
    if log.EXP_NAME == "use_time":
        return base / run_name(now)
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
