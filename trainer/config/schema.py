"""The whole schema: Config (DDP_CONFIG and CONFIG), the recipe a file follows, and the rules across sections."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trainer.config.ddp import DDPConfig
from trainer.config.section import _Section
from trainer.config.sections import DataConfig, InferenceConfig, LogConfig, ModelConfig, TrainConfig, ValConfig
from trainer.hf_models import hf_family

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
    if train.LAYER_DECAY != 1 and hf_family(model.NAME) is None:
        return "TRAIN.LAYER_DECAY", (
            f"decays the LR by a ViT's encoder layers, and model {model.NAME or '(none)'} is not a transformers "
            "ViT (videomae_*, timesformer_*, vjepa2_*); remove it or set 1"
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
        if self.DDP_CONFIG.SHARDING == "fsdp2" and self.CONFIG.TRAIN.PRECISE_BN:
            # Each rank's precise-BN pass runs as many forwards as its own batches, and a sharded forward is a
            # collective: the ranks would wait for each other.
            return "CONFIG.TRAIN.PRECISE_BN", "is not supported with DDP_CONFIG.SHARDING fsdp2; turn one off"
        return None
