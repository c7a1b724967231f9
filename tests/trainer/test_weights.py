"""Weights from every zoo: each source's own implementation, saved in its own format with random weights, loaded by
our loader into our model, gives the same logits; a file that does not cover the model is an error naming what is
missing (see reference_models.py for how each reference is built)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torchvision.models import video

from tests.trainer.reference_models import (
    gluoncv_model,
    name_seeded,
    pyslowfast_reference,
    pytorchvideo_model,
    randomise_bn_and_head,
    save_as,
    write_caffe2,
)
from trainer.models import build_model
from trainer.weights import WeightsError, load_weights, read_weights
from trainer.weights.mapping import source_names_for


def clip(frames: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 3, frames, size, size, generator=torch.Generator().manual_seed(seed))


def assert_same_logits(ours: torch.Tensor, reference: torch.Tensor) -> None:
    scale = reference.abs().max().item()
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5 * scale)


@torch.no_grad()
def our_logits(model_name: str, path: Path, frames: int, num_classes: int = 400) -> tuple[torch.Tensor, str]:
    model = build_model(model_name, num_classes)
    report = load_weights(model, path, model_name=model_name)
    assert report.complete and not report.head_reinitialised, report.summary()
    return model.eval()(clip(frames)), report.format


@pytest.mark.parametrize(
    ("hub_name", "frames"), [("slowfast_r50", 32), ("slow_r50", 8), ("i3d_r50", 8)]
)
def test_pytorchvideo_hub_checkpoints_give_pytorchvideos_logits(tmp_path: Path, hub_name: str, frames: int) -> None:
    reference = randomise_bn_and_head(pytorchvideo_model(hub_name))
    path = tmp_path / "ptv.pyth"
    torch.save({"model_state": reference.state_dict()}, path)  # the hub's checkpoint layout
    x = clip(frames)
    with torch.no_grad():
        expected = reference([x[:, :, ::4], x]) if hub_name == "slowfast_r50" else reference(x)
    logits, fmt = our_logits(hub_name, path, frames)  # hub names are registered model names
    assert fmt == "pytorchvideo"
    assert_same_logits(logits, expected)


@pytest.mark.parametrize(
    ("name", "frames"),
    [
        ("slowfast_4x16_resnet50_kinetics400", 32),
        ("slowfast_8x8_resnet50_kinetics400", 32),
        ("i3d_resnet50_v1_kinetics400", 32),
        ("i3d_slow_resnet50_f8s8_kinetics400", 8),
        ("r2plus1d_v1_resnet50_kinetics400", 8),
        ("r2plus1d_v1_resnet18_kinetics400", 8),
    ],
)
def test_gluoncv_model_zoo_files_give_gluoncvs_logits(tmp_path: Path, name: str, frames: int) -> None:
    reference = randomise_bn_and_head(gluoncv_model(name))
    path = tmp_path / f"{name}-0123abcd.pth"
    torch.save(reference.state_dict(), path)  # GluonCV publishes plain state dicts
    with torch.no_grad():
        expected = reference(clip(frames))
    logits, fmt = our_logits(name, path, frames)
    assert fmt == "gluoncv"
    assert_same_logits(logits, expected)


# Each model in one of PySlowFast's two formats (both formats carry the same names: see reference_models.py), so
# each format is checked on a SlowFast and on a single-pathway model.
@pytest.mark.parametrize(
    ("config", "fmt"),
    [("SLOWFAST_8x8_R50", "pyslowfast"), ("SLOW_8x8_R50", "pyslowfast"),
     ("SLOWFAST_4x16_R50", "caffe2"), ("I3D_8x8_R50", "caffe2")],
)
def test_pyslowfast_pyth_and_caffe2_pkl_give_pyslowfasts_logits(tmp_path: Path, config: str, fmt: str) -> None:
    reference = pyslowfast_reference()[config]
    state = {name: name_seeded(name, tuple(shape)) for name, shape in reference["shapes"].items()}
    if fmt == "pyslowfast":
        path = tmp_path / f"{config}.pyth"
        torch.save({"model_state": state, "epoch": 196, "cfg": "MODEL:\n  ARCH: slowfast\n"}, path)
    else:
        path = tmp_path / f"{config}.pkl"
        write_caffe2(path, {blob: state[name].numpy() for blob, name in reference["caffe2"].items()})
    logits, detected = our_logits(reference["model"], path, reference["frames"])
    assert detected == fmt
    assert_same_logits(logits, torch.tensor([reference["logits"]]))


def test_torchvision_weights_load_into_the_registered_torchvision_model(tmp_path: Path) -> None:
    reference = randomise_bn_and_head(video.r2plus1d_18(weights=None))
    path = tmp_path / "r2plus1d_18-91a641e6.pth"
    torch.save(reference.state_dict(), path)
    with torch.no_grad():
        expected = reference(clip(8))
    model = build_model("torchvision_r2plus1d_18", 400)
    report = load_weights(model, path)
    assert report.format == "torchvision" and report.complete
    with torch.no_grad():
        assert_same_logits(model.eval()(clip(8)), expected)


@pytest.mark.parametrize("fmt", ["pytorchvideo", "caffe2", "gluoncv", "pyslowfast"])
def test_a_file_missing_a_stage_fails_naming_the_missing_tensors(tmp_path: Path, fmt: str) -> None:
    model = build_model("slowfast_tiny", 2)
    path = save_as(fmt, model, tmp_path / "full")
    complete = read_weights(path)
    stage = {name for ours, name in source_names_for(model, fmt, set()).items() if ours.startswith("slow_stages.2.")}
    tampered = {name: tensor for name, tensor in complete.tensors.items() if name not in stage}
    if fmt == "caffe2":
        write_caffe2(path, {name: tensor.numpy() for name, tensor in tampered.items()})
    else:
        torch.save({"model_state": tampered} if fmt in ("pyslowfast", "pytorchvideo") else tampered, path)
    required = sorted(name for name in stage if not name.endswith("num_batches_tracked"))

    with pytest.raises(WeightsError) as error:
        load_weights(build_model("slowfast_tiny", 2), path, model_name="slowfast_tiny")
    message = str(error.value)
    assert "\n" not in message and f"{len(required)} tensor(s) missing from the file" in message
    assert all(name in message for name in required[:12]) and "PARTIAL_LOAD" in message

    partial = build_model("slowfast_tiny", 2)
    report = load_weights(partial, path, allow_partial=True)
    assert sorted(report.missing) == required and "NOT loaded" in report.summary()
    assert torch.equal(partial.fast_stages[2][0].conv_a.weight, model.fast_stages[2][0].conv_a.weight)


def test_only_the_classifier_may_differ_and_is_reinitialised(tmp_path: Path) -> None:
    trained = randomise_bn_and_head(build_model("i3d_tiny", 5))
    path = tmp_path / "best.pth"
    torch.save({"model": trained.state_dict(), "epoch": 3, "inference": {"model": "i3d_tiny"}}, path)

    model = build_model("i3d_tiny", 3)
    fresh_head = model.head.fc.weight.detach().clone()
    report = load_weights(model, path)
    features = model.head.fc.in_features
    assert report.format == "vidcluster" and report.complete
    assert report.head_reinitialised == {
        "head.fc.weight": f"(5, {features}) in the file, (3, {features}) in the model",
        "head.fc.bias": "(5,) in the file, (3,) in the model",
    }
    assert torch.equal(model.head.fc.weight, fresh_head)
    for name, tensor in model.state_dict().items():
        if not name.startswith("head.fc."):
            assert torch.equal(tensor, trained.state_dict()[name]), name
    with pytest.raises(WeightsError, match=r"1 of another shape.*stages\.0\.0\.conv_a\.weight"):
        bad = {**trained.state_dict(), "stages.0.0.conv_a.weight": torch.zeros(4, 4, 1, 1, 1)}
        torch.save(bad, path)
        load_weights(build_model("i3d_tiny", 5), path)
    with pytest.raises(WeightsError, match=r"classifier|head\.fc\.weight"):
        torch.save(trained.state_dict(), path)
        load_weights(build_model("i3d_tiny", 3), path, allow_new_head=False)  # evaluation: the head must fit


@pytest.mark.parametrize("wrap", ["raw", "state_dict", "model_state", "model"])
def test_wrappers_and_ddp_prefixes_are_read_and_extra_tensors_refused(tmp_path: Path, wrap: str) -> None:
    trained = build_model("i3d_tiny", 4)
    state = {f"module.{name}": tensor for name, tensor in trained.state_dict().items()}
    path = tmp_path / "ckpt.pth"
    torch.save(state if wrap == "raw" else {wrap: state, "optimizer": {}}, path)
    model = build_model("i3d_tiny", 4)
    assert load_weights(model, path).complete
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained.state_dict()[name]), name

    state["module.extra.weight"] = torch.zeros(2)
    torch.save(state, path)
    with pytest.raises(WeightsError, match=r"1 in the file with no place in the model: extra\.weight"):
        load_weights(build_model("i3d_tiny", 4), path)


def test_unreadable_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"nope\.pth does not exist"):
        load_weights(build_model("i3d_tiny", 2), tmp_path / "nope.pth")
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with pytest.raises(WeightsError, match=r"junk\.pkl"):
        read_weights(tmp_path / "junk.pkl")
    hostile = tmp_path / "hostile.pkl"
    hostile.write_bytes(pickle.dumps({"blobs": {"x": Path("/")}}, protocol=2))
    with pytest.raises(WeightsError, match=r"refusing to load pathlib"):
        read_weights(hostile)
    path = tmp_path / "i3d.pth"
    torch.save(build_model("i3d_tiny", 2).state_dict(), path)
    with pytest.raises(WeightsError, match=r"not a 3D ResNet"):
        load_weights(build_model("r3d_18", 2), save_as("pytorchvideo", build_model("i3d_tiny", 2), path))
