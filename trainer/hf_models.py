"""The video transformers of Hugging Face ``transformers`` that ``CONFIG.MODEL.NAME`` can name: their families (the
library's classes) and sizes. Imports neither torch nor transformers: the node check (:mod:`trainer.node_checks`)
reads it to refuse such a model where the library is missing; :mod:`trainer.models.hf_video` builds them.

Sizes: the library's configs define one default each (ViT-B VideoMAE, TimeSformer-B, ViT-L V-JEPA 2); the other sizes
are those of the published checkpoints (``MCG-NJU/videomae-{small,base,large,huge}-finetuned-kinetics``,
``facebook/timesformer-{base,hr,large}-finetuned-k400``, ``facebook/vjepa2-vit{l,h,g}-fpc64-{256,384}``).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name on the Hugging Face Hub
HUB_FOLDER = "huggingface"  # where the launcher puts a hub id's snapshot in a node's weights cache


@dataclass(frozen=True)
class HfFamily:
    model_type: str  # config.json's model_type
    config_class: str  # in transformers
    model_class: str  # its video classifier
    input_name: str  # the forward argument taking (B, T, C, H, W)
    frames_key: str  # the config key of the frames per clip its weights expect
    size_key: str  # ... and of the square image size
    fixed_clip: bool  # the model takes only that clip (fixed position embeddings), not any
    unused_parameters: bool = False  # parameters classifying does not use (V-JEPA 2's predictor)
    # why MODEL.DROP_PATH_RATE cannot be set for it; "" where its config's drop_path_rate (stochastic depth) can
    no_drop_path: str = "its config has no drop_path_rate and its layers no stochastic depth"
    # the submodule an attentive probe freezes (MODEL.ATTENTIVE_PROBE): its encoder; "" for a family without a probe
    probe_encoder: str = ""
    # config keys that change the computation without changing a tensor's shape: a checkpoint must agree on them
    arch_keys: tuple[str, ...] = ("hidden_act", "layer_norm_eps")
    # the library's self-supervised pretraining class, and the arch_keys of the head a fine-tune of its checkpoint
    # sets anew (VideoMAE's fine-tuning pools by mean: the encoder's last norm goes, fc_norm is new)
    pretraining_class: str = ""
    head_keys: tuple[str, ...] = ()
    # the config keys that make a size (MODEL.NAME's videomae_base or _large): a checkpoint of another is refused
    size_keys: tuple[str, ...] = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


FAMILIES: dict[str, HfFamily] = {
    "videomae": HfFamily("videomae", "VideoMAEConfig", "VideoMAEForVideoClassification", "pixel_values",
                         "num_frames", "image_size", fixed_clip=True,
                         arch_keys=("hidden_act", "layer_norm_eps", "num_frames", "image_size", "tubelet_size",
                                    "patch_size", "use_mean_pooling"),
                         pretraining_class="VideoMAEForPreTraining", head_keys=("use_mean_pooling",)),
    "timesformer": HfFamily("timesformer", "TimesformerConfig", "TimesformerForVideoClassification", "pixel_values",
                            "num_frames", "image_size", fixed_clip=False,
                            no_drop_path="transformers types TimesformerConfig.drop_path_rate as an int (its "
                                         "layers have stochastic depth, but no rate between 0 and 1 can be set)",
                            arch_keys=("hidden_act", "layer_norm_eps", "attention_type")),
    "vjepa2": HfFamily("vjepa2", "VJEPA2Config", "VJEPA2ForVideoClassification", "pixel_values_videos",
                       "frames_per_clip", "crop_size", fixed_clip=False, unused_parameters=True, no_drop_path="",
                       probe_encoder="vjepa2", arch_keys=("hidden_act", "layer_norm_eps", "tubelet_size", "patch_size"),
                       size_keys=("hidden_size", "num_hidden_layers", "num_attention_heads", "mlp_ratio")),
}


@dataclass(frozen=True)
class HfModel:
    family: str
    config: dict[str, Any] = field(default_factory=dict)  # what differs from the library's default config


_VIT_S = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536}
_VIT_L = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
_VIT_H = {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "intermediate_size": 5120}
_VJEPA2_G = {"hidden_size": 1408, "num_hidden_layers": 40, "num_attention_heads": 22, "mlp_ratio": 48 / 11}

HF_MODELS: dict[str, HfModel] = {
    "videomae_small": HfModel("videomae", _VIT_S),
    "videomae_base": HfModel("videomae"),
    "videomae_large": HfModel("videomae", _VIT_L),
    "videomae_huge": HfModel("videomae", _VIT_H),
    "timesformer_base": HfModel("timesformer"),
    "timesformer_hr": HfModel("timesformer", {"num_frames": 16, "image_size": 448}),
    "timesformer_large": HfModel("timesformer", {"num_frames": 96}),
    "vjepa2_vitl": HfModel("vjepa2"),
    "vjepa2_vith": HfModel("vjepa2", {"hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16}),
    "vjepa2_vitg": HfModel("vjepa2", _VJEPA2_G),
    "vjepa2_vitg_384": HfModel("vjepa2", {**_VJEPA2_G, "crop_size": 384}),
}


def hf_family(model_name: str) -> HfFamily | None:
    """The library family of ``model_name`` (as in CONFIG.MODEL.NAME), None for a model of our own zoo."""
    spec = HF_MODELS.get(model_name.lower())
    return FAMILIES[spec.family] if spec else None


def missing_library(model_name: str) -> str | None:
    """One line when ``model_name`` is a transformers model and this machine lacks the library, else None."""
    if hf_family(model_name) is None or importlib.util.find_spec("transformers") is not None:
        return None
    return (f"MODEL.NAME {model_name} needs the transformers package: it is not installed on this machine; install "
            "the version requirements.txt pins, or choose a model of the zoo")


def hub_id(model_name: str, load: bool, path: str) -> str | None:
    """The Hugging Face hub id (owner/name) that MODEL.PRETRAINED_PATH names for a transformers model loaded with
    LOAD, and that is no local file or folder; None otherwise."""
    if not load or hf_family(model_name) is None or HUB_ID.fullmatch(path) is None or Path(path).exists():
        return None
    return path


def hub_folder(hub: str) -> str:
    """Where in a node's weights cache the launcher puts the snapshot of hub id ``hub``: ``huggingface/OWNER/NAME``."""
    return f"{HUB_FOLDER}/{hub}"
