"""The shipped weights table (trainer/weights/zoo.py) as shipped, not a stand-in: every entry builds its model, names
a format the reader knows, and its name mapping places every tensor of a file of that format built by the source's
own implementation (reference_models.py); each entry records the clip its weights were trained on, every config
here that starts from published weights trains on that clip, and another clip is refused by name.

Published files cannot be downloaded here, so the reference files are state dicts of the reference implementations
on the meta device: every name and shape, no values (their values are tested in test_weights.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torchvision.models import video

from tests.trainer.reference_models import gluoncv_model, pyslowfast_reference, pytorchvideo_model
from trainer import train
from trainer.config import ConfigError, load_config, validate_config
from trainer.models import build_model
from trainer.weights import load_weights, zoo
from trainer.weights.formats import WeightsFile, detect_format
from trainer.weights.loading import match_weights
from trainer.weights.mapping import IDENTITY_FORMATS, MAPPED_FORMATS
from trainer.weights.pretrained import check_clip

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


def reference_tensors(entry: zoo.ZooEntry) -> dict[str, torch.Tensor]:
    """The tensors (meta) of a Kinetics-400 file of ``entry``'s source, named and shaped by the source's own code."""
    name = entry.models[0]
    if entry.source == "pyslowfast":  # the Caffe2 blobs PySlowFast's own loader reads, recorded from its code
        recorded = next(r for r in pyslowfast_reference().values() if r["model"] in entry.models)
        return {blob: torch.empty(recorded["shapes"][ours], device="meta") for blob, ours in recorded["caffe2"].items()}
    with torch.device("meta"):
        if entry.source == "gluoncv":
            return gluoncv_model(name).state_dict()
        if entry.source == "pytorchvideo":
            return pytorchvideo_model(name).state_dict()
        assert entry.source == "torchvision", entry
        return getattr(video, name)(weights=None).state_dict()


@pytest.mark.parametrize("entry", zoo.ZOO, ids=[entry.models[0] for entry in zoo.ZOO])
def test_every_entry_builds_its_models_and_maps_every_tensor_of_its_sources_file(entry: zoo.ZooEntry) -> None:
    tensors = reference_tensors(entry)
    # the reader's verdict on such a file: a .pkl is Caffe2's by its type, the others are told by their names
    read_as = "caffe2" if entry.file.endswith(".pkl") else detect_format(set(tensors), {})
    assert entry.format == read_as and read_as in IDENTITY_FORMATS + MAPPED_FORMATS
    source = WeightsFile(Path(entry.file), entry.format, tensors)
    for name in entry.models:
        with torch.device("meta"):
            model = build_model(name, 400)
        report, _ = match_weights(model, source, model_name=name)
        assert report.complete and not report.head_reinitialised, f"{name}: {report.problems()}"
    clip = entry.clip
    assert clip.CLIP_LEN >= 8 and clip.FRAME_RATE >= 1 and clip.CROP_SIZE in (112, 224), clip


def test_torchvisions_mvit_weights_load(tmp_path: Path) -> None:
    """Their transformer blocks are named blocks.0...: not pytorchvideo's stem."""
    reference = video.mvit_v2_s(weights=None)
    path = tmp_path / "mvit_v2_s-ae3be167.pth"
    torch.save(reference.state_dict(), path)
    model = build_model("mvit_v2_s", 400)
    report = load_weights(model, path, model_name="mvit_v2_s")
    assert report.format == "torchvision" and report.complete and not report.head_reinitialised
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_configs_that_start_from_published_weights_train_on_their_clip() -> None:
    configs = {path.name: load_config(path) for path in CONFIGS}
    pretrained = {name: cfg for name, cfg in configs.items() if cfg.CONFIG.MODEL.PRETRAINED}
    assert {"slowfast_finetune.yaml", "i3d_resnet50_v1_kinetics400.yaml"} <= set(pretrained)
    for name, cfg in pretrained.items():
        assert not cfg.CONFIG.MODEL.ALLOW_OTHER_CLIP, name
        check_clip(cfg, zoo.entry_for(cfg.CONFIG.MODEL.NAME))


def test_another_clip_is_refused_naming_the_keys_and_the_weights_values(capsys: pytest.CaptureFixture[str]) -> None:
    model = {"NAME": "slowfast_8x8_resnet50_kinetics400", "PRETRAINED": True}
    cfg = validate_config({"CONFIG": {"MODEL": model, "DATA": {"CLIP_LEN": 16, "CROP_SIZE": 160}}})
    with pytest.raises(SystemExit) as exit_info:
        train.prepare_initial_weights(cfg)  # before any file is looked for
    assert exit_info.value.code == 2 and capsys.readouterr().err == (
        "error: CONFIG.DATA.CLIP_LEN 16, CROP_SIZE 160: the gluoncv weights of slowfast_8x8_resnet50_kinetics400 "
        "(MODEL.PRETRAINED) were trained on CLIP_LEN: 32, FRAME_RATE: 2, CROP_SIZE: 224; train on that clip, or set "
        "CONFIG.MODEL.ALLOW_OTHER_CLIP: True to train on another\n"
    )
    allowed = validate_config({"CONFIG": {"MODEL": {**model, "ALLOW_OTHER_CLIP": True}, "DATA": {"CLIP_LEN": 16}}})
    check_clip(allowed, zoo.entry_for(model["NAME"]))
    with pytest.raises(ConfigError, match=re.escape("MODEL.ALLOW_OTHER_CLIP: only PRETRAINED: True")):
        validate_config({"CONFIG": {"MODEL": {"NAME": "i3d_tiny", "ALLOW_OTHER_CLIP": True}}})
