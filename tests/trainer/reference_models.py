"""The reference implementations the weights tests compare against, built with random weights.

* pytorchvideo 0.1.5 (requirements-reference.txt): its hub builders, with head pool sizes for 32 px clips.
* GluonCV 0.10.5's torch model files, imported directly: ``import gluoncv`` refuses torch >= 2 at import time, but
  its model code is plain torch. Models are built with the arguments of GluonCV's ``*_kinetics400`` builders.
* PySlowFast (not on PyPI, not importable here): ``data/pyslowfast_reference.json.gz`` holds what its own code gave
  (facebookresearch/SlowFast at 287ec00, ``video_model_builder.SlowFast``/``ResNet`` built from
  ``configs/Kinetics/c2/{SLOWFAST_4x16,SLOWFAST_8x8,SLOW_8x8,I3D_8x8}_R50.yaml`` at 32 px with ``HEAD_ACT: none``):
  every state-dict name and shape; for each, the Caffe2 blob name that PySlowFast's own
  ``c2_model_loading.get_name_convert_func`` turns into it; and the logits of the model loaded with
  :func:`name_seeded` weights on ``torch.randn(1, 3, T, 32, 32)`` from a generator seeded 0.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import pickle
import sys
import types
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.weights.mapping import source_names_for

REFERENCE_JSON = Path(__file__).parent / "data" / "pyslowfast_reference.json.gz"


def randomise_bn_and_head(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BN affine parameters and running statistics and a random classifier (the convs are random already),
    so that any tensor loaded into the wrong place changes the logits. Returns the model in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm3d):
                channels = module.num_features
                module.weight.copy_(torch.rand(channels, generator=gen) + 0.5)
                module.bias.copy_(torch.randn(channels, generator=gen) * 0.1)
                module.running_mean.copy_(torch.randn(channels, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
            elif isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * 0.05)
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen))
    return model.eval()


def name_seeded(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor that depends only on its (PySlowFast) name and shape: how the PySlowFast logits were recorded."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    if name.endswith("num_batches_tracked"):
        return torch.zeros((), dtype=torch.long)
    if name.endswith("running_var") or (name.endswith(".weight") and len(shape) == 1):
        return torch.rand(shape, generator=gen) + 0.5
    if len(shape) == 1:
        return torch.randn(shape, generator=gen) * 0.1
    fan_in = 1
    for size in shape[1:]:
        fan_in *= size
    return torch.randn(shape, generator=gen) * (2.0 / fan_in) ** 0.5


def pyslowfast_reference() -> dict[str, Any]:
    with gzip.open(REFERENCE_JSON, "rt") as handle:
        return json.load(handle)


def gluoncv_action_recognition(module: str) -> types.ModuleType:
    """``gluoncv.torch.model_zoo.action_recognition.<module>`` without running gluoncv's package __init__ files."""
    if "gluoncv" in sys.modules:  # our stub from an earlier call
        root = Path(sys.modules["gluoncv"].__path__[0])
    else:
        spec = importlib.util.find_spec("gluoncv")
        assert spec is not None and spec.submodule_search_locations, "gluoncv is not installed"
        root = Path(spec.submodule_search_locations[0])
    for package in ("gluoncv", "gluoncv.torch", "gluoncv.torch.model_zoo", "gluoncv.torch.utils",
                    "gluoncv.torch.model_zoo.action_recognition"):
        if package not in sys.modules or not hasattr(sys.modules[package], "__path__"):
            stub = types.ModuleType(package)
            stub.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
            sys.modules[package] = stub
    return importlib.import_module(f"gluoncv.torch.model_zoo.action_recognition.{module}")


def gluoncv_model(name: str) -> nn.Module:
    """GluonCV's Kinetics-400 model ``name`` with random weights (arguments of its ``<name>`` builder)."""
    if name.startswith("slowfast"):
        alpha, kernel, slow_stride = (8, 5, 16) if "4x16" in name else (4, 7, 8)
        return gluoncv_action_recognition("slowfast").SlowFast(
            num_classes=400, layers=[3, 4, 6, 3], pretrained=False, pretrained_base=False, alpha=alpha, beta_inv=8,
            fusion_conv_channel_ratio=2, fusion_kernel_size=kernel, width_per_group=64, num_groups=1,
            slow_temporal_stride=slow_stride, fast_temporal_stride=2, slow_frames=32 // alpha, fast_frames=32,
            bn_eval=False)
    if name == "i3d_resnet50_v1_kinetics400":
        # pretrained=True only skips the ImageNet inflation (a download) in the constructor
        return gluoncv_action_recognition("i3d_resnet").I3D_ResNetV1(
            num_classes=400, depth=50, pretrained=True, out_indices=[3], bn_eval=False,
            inflate_freq=((1, 1, 1), (1, 0, 1, 0), (1, 0, 1, 0, 1, 0), (0, 1, 0)))
    if name.startswith("i3d_slow_resnet50"):
        return gluoncv_action_recognition("i3d_slow").ResNet_SlowFast(
            num_classes=400, depth=50, pretrained=True, bn_eval=False)
    r2plus1d = gluoncv_action_recognition("r2plus1dv1")
    block, layers = {"18": (r2plus1d.BasicBlock, [2, 2, 2, 2]), "34": (r2plus1d.BasicBlock, [3, 4, 6, 3]),
                     "50": (r2plus1d.Bottleneck, [3, 4, 6, 3])}[name.split("resnet")[1].split("_")[0]]
    return r2plus1d.R2Plus1D(num_classes=400, block=block, layers=layers)


def pytorchvideo_model(name: str) -> nn.Module:
    """pytorchvideo's hub model ``name`` (random weights), pooling a 32 px clip's 1 x 1 final map."""
    from pytorchvideo.models import hub

    if name == "slowfast_r50":
        return hub.slowfast_r50(head_pool_kernel_sizes=((8, 1, 1), (32, 1, 1)))
    if name == "slow_r50":  # hub.slow_r50 fixes its pool size, so call its builder with its other arguments
        from pytorchvideo.models.resnet import create_resnet

        return create_resnet(stem_conv_kernel_size=(1, 7, 7), head_pool_kernel_size=(8, 1, 1), model_depth=50)
    return hub.i3d_r50(head_pool_kernel_size=(4, 1, 1))


def write_caffe2(path: Path, blobs: dict[str, np.ndarray]) -> None:
    """PySlowFast's Caffe2 model file: a pickle of {'blobs': {name: array}}, with the solver's extra blobs."""
    extra = {"lr": np.float32(0.1), "model_iter": np.int64(0), "conv1_w_momentum": np.zeros(1, np.float32)}
    with path.open("wb") as handle:
        pickle.dump({"blobs": {**blobs, **{k: np.asarray(v) for k, v in extra.items()}}}, handle, protocol=2)


def save_as(fmt: str, model: torch.nn.Module, path: Path) -> Path:
    """``model``'s weights written under ``fmt``'s names, as that source saves them."""
    names = source_names_for(model, fmt, set())
    state = {names[ours]: tensor for ours, tensor in model.state_dict().items() if ours in names}
    if fmt == "caffe2":
        write_caffe2(path, {name: tensor.numpy() for name, tensor in state.items()})
    else:
        torch.save({"model_state": state} if fmt in ("pyslowfast", "pytorchvideo") else state, path)
    return path
