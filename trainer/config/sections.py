"""CONFIG's sections: TRAIN (optimisation and schedule, multigrid), VAL, INFERENCE, DATA, MODEL, LOG, each with
its rules across its keys."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from trainer.config.section import UserPath, _changed, _only, _Section
from trainer.hf_models import HUB_ID, hf_family


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


class MixupConfig(_Section):
    ALPHA: float = Field(
        0.0, ge=0, description="Mixup: each batch is blended with itself reversed by a Beta(ALPHA, ALPHA) weight, the "
        "targets alike (timm's mixup, PySlowFast's MIXUP.ALPHA); 0 = off."
    )
    CUTMIX_ALPHA: float = Field(
        0.0, ge=0, description="CutMix: a box of each clip (all its frames) comes from the reversed batch, its area "
        "drawn from Beta(CUTMIX_ALPHA, CUTMIX_ALPHA), the targets mixed by area; 0 = off."
    )
    SWITCH_PROB: float = Field(
        0.5, ge=0, le=1, description="With both on: the chance that a batch gets CutMix rather than Mixup."
    )


def _mixup_problem(mixup: MixupConfig) -> tuple[str, str] | None:
    if not (mixup.ALPHA > 0 and mixup.CUTMIX_ALPHA > 0) and _changed(mixup, "SWITCH_PROB"):
        return "MIXUP.SWITCH_PROB", "only ALPHA and CUTMIX_ALPHA both above 0 use it; remove it or set both"
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
    LABEL_SMOOTHING: float = Field(
        0.0, ge=0, lt=1, description="Label smoothing of the cross-entropy loss (of the mixed targets under MIXUP)."
    )
    MIXUP: MixupConfig = Field(
        default_factory=MixupConfig, description="Mixup and CutMix of each training batch (trainer/data/mixup.py)."
    )
    REPEATED_AUG: int = Field(
        1,
        ge=1,
        description="Repeated augmentation (DeiT's RASampler, VideoMAE's num_sample): each video is drawn this many "
        "times per epoch, differently augmented, the copies spread over the ranks; an epoch is that many times "
        "longer in clips.",
    )
    LAYER_DECAY: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Layer-wise LR decay of a transformers ViT (BEiT's, VideoMAE's 0.75): encoder layer i "
        "(0-based, of L) learns at LR x LAYER_DECAY^(L - i), the embeddings at LAYER_DECAY^(L + 1), the rest "
        "(final norm, pooler, head) at LR; 1 = off.",
    )
    ZERO_WD_1D_PARAM: bool = Field(
        False,
        description="No weight decay on 1-D parameters (biases, norm weights) nor on tokens and position "
        "embeddings (parameters of no Linear, Conv or Embedding layer), as VideoMAE and PySlowFast's "
        "SOLVER.ZERO_WD_1D_PARAM do; on top of RECIPE's rule.",
    )
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
        return _inert_train_key(self) or _multigrid_problem(self) or _mixup_problem(self.MIXUP)


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
        "GluonCV or torchvision; detected from the file), or for a transformers model its Hugging Face checkpoint.",
    )
    PRETRAINED_PATH: UserPath = Field(
        "",
        description="With LOAD: the weights file, or a Hugging Face checkpoint folder or hub id (a launch resolves "
        "the id on the controller, from its Hugging Face cache or hub, and ships it; a run of its own reads "
        "$HF_HOME's cache offline). With PRETRAINED: a local copy of the published file "
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
    ATTENTIVE_PROBE: bool = Field(
        False, description="V-JEPA 2: train only its attentive probe (the pooler and classifier) over the frozen "
        "encoder, which stays in eval mode, out of the optimizer and of DDP's gradient sync; False fine-tunes the "
        "whole model. Refused for models without a probe."
    )
    DROPOUT_RATE: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None, description="Dropout before the classifier; unset keeps the model's own (0.5 for the ResNets here)."
    )
    DROP_PATH_RATE: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Stochastic depth of the last encoder layer (rising linearly from 0 at the first), for the "
        "transformers models whose config sets it: vjepa2_*. Refused for the others: VideoMAE's class has none, "
        "TimesformerConfig types the rate as an int; 0 = off.",
    )
    HF_CONFIG: dict[str, int | float | bool | str] = Field(
        {},
        description="transformers models: values of the library's config over NAME's size (e.g. a smaller model "
        "for a test or a prototype: hidden_size, num_hidden_layers, num_frames, image_size); a key the library's "
        "config lacks is refused by name. Refused for the zoo's own models.",
    )

    @field_validator("PRETRAINED", mode="before")
    @classmethod
    def _hub_id_elsewhere(cls, value: Any) -> Any:
        if isinstance(value, str) and HUB_ID.fullmatch(value):
            raise ValueError("a Hugging Face hub id goes in PRETRAINED_PATH, with LOAD: True (PRETRAINED: True starts "
                             "from the zoo's published weights of NAME)")
        return value

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
    family = hf_family(model.NAME)
    if model.DROP_PATH_RATE > 0 and (family is None or family.no_drop_path):
        why = family.no_drop_path if family else "none of the zoo's models has stochastic depth"
        return "DROP_PATH_RATE", f"cannot be set for model {model.NAME}: {why}; remove it, or choose a vjepa2_* model"
    if model.HF_CONFIG and family is None:
        return "HF_CONFIG", f"model {model.NAME or '(none)'} is not a transformers model; remove it"
    if model.ATTENTIVE_PROBE:
        if family is None or not family.probe_encoder:
            return "ATTENTIVE_PROBE", f"model {model.NAME or '(none)'} has no attentive probe (V-JEPA 2 has); remove it"
        if model.FREEZE_BACKBONE:
            return "FREEZE_BACKBONE", "freezes the probe's pooler too, which ATTENTIVE_PROBE trains; choose one"
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
    SAMPLE_LOG: bool = Field(
        False, description="Every rank appends, after each optimizer step, a JSON line with the step, epoch, "
        "attempt, its rank, the world size and the dataset indices the step trained on it, to samples/rank<R>.jsonl "
        "in the run directory: what shows each sample trained once per epoch, across world changes (trainer.elastic)."
    )
