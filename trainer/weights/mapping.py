"""Where each of our tensors lives in another zoo's file: one explicit name mapping per source format.

Our 3D ResNets (:mod:`trainer.models.resnet3d`, :mod:`trainer.models.slowfast`, :mod:`trainer.models.r2plus1d`) are
first described as *slots* (stem, block, fusion, head; pathway, stage, block index, layer, tensor), independently of
any naming scheme; each source format then spells a slot its own way:

* ``pyslowfast``: PySlowFast ``.pyth`` (``model_state``), e.g. ``s3.pathway0_res0.branch2.a.weight``
* ``caffe2``: PySlowFast's Caffe2 ``.pkl`` (``blobs``), e.g. ``res3_0_branch2a_w``
* ``pytorchvideo``: pytorchvideo hub ``.pyth`` (``model_state``), e.g.
  ``blocks.2.multipathway_blocks.0.res_blocks.0.branch2.conv_a.weight``
* ``gluoncv``: GluonCV's torch model zoo ``.pth`` (a plain state dict), e.g. ``slow_res3.0.conv1.weight``

(each example: the Slow pathway's res3, block 0, first conv.)
Our own checkpoints and torchvision's weights for the torchvision models need no mapping (the names are ours).
Stage numbers follow the papers: the stem is stage 1, residual stages are 2-5; fusion ``i`` follows stage ``i``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from trainer.models.r2plus1d import R2Plus1d
from trainer.models.resnet3d import ResNet3d
from trainer.models.slowfast import SlowFast

BN_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@dataclass(frozen=True)
class Slot:
    """One tensor of a 3D ResNet, named by position rather than by any library's module names."""

    part: str  # "stem", "block", "fuse" or "head"
    layer: str  # stem: conv/bn (R(2+1)D: conv_s/bn_s/conv_t/bn); block: conv_a..bn_c, proj_conv, proj_bn; fuse: conv/bn
    tensor: str  # weight, bias, running_mean, running_var, num_batches_tracked
    pathway: int = 0  # 0 = Slow (or the only pathway), 1 = Fast
    stage: int = 1
    block: int = 0

    @property
    def is_bn(self) -> bool:
        return "bn" in self.layer


@dataclass(frozen=True)
class Layout:
    """What a naming scheme needs to know about the model besides the slot: its family and stage depths."""

    family: str  # "resnet3d", "slowfast" or "r2plus1d"
    depths: tuple[int, ...]  # blocks per residual stage (res2..res5)
    stage_index: dict[int, int]  # our ``stages.<i>`` (or ``*_stages.<i>``) -> stage number 2..5


class UnsupportedModel(ValueError):
    """The model is not one of our 3D ResNets, so only identically named weights can load into it."""


def layout_of(model: nn.Module) -> Layout:
    if isinstance(model, SlowFast):
        depths = tuple(len(stage) for stage in model.slow_stages)
        return Layout("slowfast", depths, {i: i + 2 for i in range(len(depths))})
    if isinstance(model, ResNet3d | R2Plus1d):
        # ResNet3d.stages may hold I3D's parameter-free temporal pool between res2 and res3.
        residual = [i for i, stage in enumerate(model.stages) if isinstance(stage, nn.Sequential)]
        depths = tuple(len(model.stages[i]) for i in residual)
        family = "r2plus1d" if isinstance(model, R2Plus1d) else "resnet3d"
        return Layout(family, depths, {i: n + 2 for n, i in enumerate(residual)})
    raise UnsupportedModel(type(model).__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Our names -> slots

_OUR_BLOCK_LAYERS = {
    "conv_a": "conv_a", "bn_a": "bn_a", "conv_b": "conv_b", "bn_b": "bn_b", "conv_c": "conv_c", "bn_c": "bn_c",
    "shortcut.0": "proj_conv", "shortcut.1": "proj_bn",
    # R(2+1)D: conv_b (or, in basic blocks, conv_a/conv_b) is spatial conv, BN, ReLU, temporal conv
    "conv_a.0": "conv_a_s", "conv_a.1": "conv_a_bn", "conv_a.3": "conv_a_t",
    "conv_b.0": "conv_b_s", "conv_b.1": "conv_b_bn", "conv_b.3": "conv_b_t",
}
_OUR_R2PLUS1D_STEM = {"0": "conv_s", "1": "bn_s", "3": "conv_t", "4": "bn"}
_OURS = re.compile(
    r"^(?:(?P<path>slow|fast)_)?(?:"
    r"stem\.(?P<stem>conv|bn|\d)"
    r"|stages\.(?P<stage>\d+)\.(?P<block>\d+)\.(?P<layer>[a-z_]+(?:\.\d)?)"
    r"|fusions\.(?P<fuse>\d+)\.(?P<fuse_layer>conv|bn)"
    r"|head\.(?P<head>fc)"
    r")\.(?P<tensor>[a-z_]+)$"
)


def slot_of(name: str, layout: Layout) -> Slot:
    """The slot of one of our state-dict names; ValueError for a name outside the 3D ResNet vocabulary."""
    match = _OURS.match(name)
    if match is None:
        raise ValueError(f"{name}: not a 3D ResNet tensor name")
    g = match.groupdict()
    pathway = 1 if g["path"] == "fast" else 0
    tensor = g["tensor"]
    if g["stem"] is not None:
        layer = _OUR_R2PLUS1D_STEM[g["stem"]] if layout.family == "r2plus1d" else g["stem"]
        return Slot("stem", layer, tensor, pathway)
    if g["stage"] is not None:
        layer = _OUR_BLOCK_LAYERS[g["layer"]]
        return Slot("block", layer, tensor, pathway, layout.stage_index[int(g["stage"])], int(g["block"]))
    if g["fuse"] is not None:
        return Slot("fuse", g["fuse_layer"], tensor, 1, int(g["fuse"]) + 1)
    return Slot("head", "fc", tensor)


# ---------------------------------------------------------------------------------------------------------------------
# Slots -> each source's names


def pyslowfast_name(slot: Slot, layout: Layout) -> str:
    """PySlowFast's own modules (video_model_builder.ResNet / SlowFast)."""
    if slot.part == "stem":
        return f"s1.pathway{slot.pathway}_stem.{slot.layer}.{slot.tensor}"
    if slot.part == "block":
        layer = {"proj_conv": "branch1", "proj_bn": "branch1_bn"}.get(slot.layer)
        if layer is None:  # conv_a -> branch2.a, bn_a -> branch2.a_bn
            kind, letter = slot.layer.split("_")
            layer = f"branch2.{letter}" + ("_bn" if kind == "bn" else "")
        return f"s{slot.stage}.pathway{slot.pathway}_res{slot.block}.{layer}.{slot.tensor}"
    if slot.part == "fuse":
        return f"s{slot.stage}_fuse.{'conv_f2s' if slot.layer == 'conv' else 'bn'}.{slot.tensor}"
    return f"head.projection.{slot.tensor}"


_CAFFE2_TENSOR = {"weight": "s", "bias": "b", "running_mean": "rm", "running_var": "riv"}


def caffe2_name(slot: Slot, layout: Layout) -> str:
    """Blob names of PySlowFast's Caffe2 models (the Fast pathway's carry a ``t_`` prefix)."""
    fast = "t_" if slot.pathway else ""
    if slot.part == "head":
        return f"pred_{slot.tensor[0]}"  # pred_w, pred_b
    if slot.part == "stem":
        base = f"{fast}conv1" if not slot.is_bn else f"{fast}res_conv1"
    elif slot.part == "block":
        branch = "1" if slot.layer.startswith("proj") else "2" + slot.layer[-1]
        base = f"{fast}res{slot.stage}_{slot.block}_branch{branch}"
    elif slot.stage == 1:  # fusions read the Fast pathway: after the stem ...
        base = "t_pool1_subsample"
    else:  # ... and after the last block of each stage
        base = f"t_res{slot.stage}_{layout.depths[slot.stage - 2] - 1}_branch2c_bn_subsample"
    return f"{base}_bn_{_CAFFE2_TENSOR[slot.tensor]}" if slot.is_bn else f"{base}_w"


_PTV_BLOCK_LAYERS = {"proj_conv": "branch1_conv", "proj_bn": "branch1_norm"}


def pytorchvideo_name(slot: Slot, layout: Layout) -> str:
    """pytorchvideo's ``Net``: ``blocks.<i>``, with ``multipathway_blocks.<p>`` for SlowFast."""
    two_path = layout.family == "slowfast"
    path = f"multipathway_blocks.{slot.pathway}." if two_path else ""
    if slot.part == "head":
        # after the stem and the stages come I3D's pool (single pathway) or the pathway pool-concat (SlowFast)
        return f"blocks.{1 + max(layout.stage_index) + 1 + (1 if two_path else 0)}.proj.{slot.tensor}"
    if slot.part == "stem":
        return f"blocks.0.{path}{'norm' if slot.is_bn else 'conv'}.{slot.tensor}"
    if slot.part == "fuse":
        layer = "norm" if slot.is_bn else "conv_fast_to_slow"
        return f"blocks.{slot.stage - 1}.multipathway_fusion.{layer}.{slot.tensor}"
    index = {stage: i + 1 for i, stage in layout.stage_index.items()}[slot.stage]
    layer = _PTV_BLOCK_LAYERS.get(slot.layer) or "branch2." + slot.layer.replace("bn_", "norm_")
    return f"blocks.{index}.{path}res_blocks.{slot.block}.{layer}.{slot.tensor}"


_GLUONCV_BLOCK_LAYERS = {
    "conv_a": "conv1", "bn_a": "bn1", "conv_b": "conv2", "bn_b": "bn2", "conv_c": "conv3", "bn_c": "bn3",
    "proj_conv": "downsample.0", "proj_bn": "downsample.1",
    "conv_a_s": "conv1.conv1", "conv_a_bn": "conv1.bn1", "conv_a_t": "conv1.conv2",
    "conv_b_s": "conv2.conv1", "conv_b_bn": "conv2.bn1", "conv_b_t": "conv2.conv2",
}


def gluoncv_name(slot: Slot, layout: Layout, i3d_naming: bool) -> str:
    """GluonCV's torch models: SlowFast, I3D_ResNetV1 (``first_stage``, ``res_layers``), ResNet_SlowFast (the
    slow-only ``i3d_slow_*``: ``conv1``, ``layer1``) and R2Plus1D (``conv1``/``conv2`` stem, ``layer1``)."""
    if slot.part == "head":
        return f"fc.{slot.tensor}"
    if layout.family == "slowfast":
        path = "fast_" if slot.pathway else "slow_"
        if slot.part == "stem":
            return f"{path}{'bn1' if slot.is_bn else 'conv1'}.{slot.tensor}"
        if slot.part == "fuse":
            lateral = "lateral_p1" if slot.stage == 1 else f"lateral_res{slot.stage}"
            return f"{lateral}.{1 if slot.is_bn else 0}.{slot.tensor}"
        return f"{path}res{slot.stage}.{slot.block}.{_GLUONCV_BLOCK_LAYERS[slot.layer]}.{slot.tensor}"
    if slot.part == "stem":
        if i3d_naming:
            return f"first_stage.{1 if slot.is_bn else 0}.{slot.tensor}"
        stem = {"conv": "conv1", "bn": "bn1", "conv_s": "conv1", "bn_s": "bn1", "conv_t": "conv2"}
        if layout.family == "r2plus1d":
            stem["bn"] = "bn2"
        return f"{stem[slot.layer]}.{slot.tensor}"
    stage = f"res_layers.{slot.stage - 2}" if i3d_naming else f"layer{slot.stage - 1}"
    return f"{stage}.{slot.block}.{_GLUONCV_BLOCK_LAYERS[slot.layer]}.{slot.tensor}"


def source_namer(fmt: str, source_names: set[str]) -> Callable[[Slot, Layout], str]:
    """The slot -> name function of ``fmt``; GluonCV's two single-pathway ResNets are told apart by the file."""
    if fmt == "gluoncv":
        i3d_naming = "first_stage.0.weight" in source_names
        return lambda slot, layout: gluoncv_name(slot, layout, i3d_naming)
    return {"pyslowfast": pyslowfast_name, "caffe2": caffe2_name, "pytorchvideo": pytorchvideo_name}[fmt]


def source_names_for(model: nn.Module, fmt: str, source_names: set[str]) -> dict[str, str]:
    """Our state-dict name -> the name the same tensor has in a ``fmt`` file (identity for our own names)."""
    ours = list(model.state_dict())
    if fmt in IDENTITY_FORMATS:
        return {name: name for name in ours}
    layout = layout_of(model)
    namer = source_namer(fmt, source_names)
    mapping = {}
    for name in ours:
        slot = slot_of(name, layout)
        if fmt == "caffe2" and slot.tensor == "num_batches_tracked":
            continue  # Caffe2 has no such counter
        mapping[name] = namer(slot, layout)
    return mapping


IDENTITY_FORMATS = ("vidcluster", "torchvision")
MAPPED_FORMATS = ("pyslowfast", "caffe2", "pytorchvideo", "gluoncv")
