"""V-JEPA 2's attentive probe (CONFIG.MODEL.ATTENTIVE_PROBE): a tiny V-JEPA 2 trained one step through the run's own
optimizer and DDP wrapper (gloo, one rank) keeps its encoder as it was and moves its pooler and classifier; only the
probe's parameters reach the optimizer and DDP's gradient buckets; full fine-tuning (the default) moves the encoder
too. The key is refused by name for a model without a probe."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.trainer.test_hf_models import FRAMES, SIZE, TINY
from trainer.accel import wrap_ddp
from trainer.config import ConfigError, validate_config
from trainer.distributed import DistContext
from trainer.model_setup import apply_training_controls
from trainer.models import build_model
from trainer.solver import build_optimizer

CLASSES = 3
TRAINED = ("pooler.", "classifier.")  # the probe: V-JEPA 2's attentive pooler and its classifier


def config(**model: Any) -> Any:
    return validate_config({"CONFIG": {"DATA": {"CLIP_LEN": FRAMES, "CROP_SIZE": SIZE, "NUM_CLASSES": CLASSES},
                                       "MODEL": {"NAME": "vjepa2_vitl", **model}, "TRAIN": {"LR": 0.1}}})


def one_step(probe: bool, ctx: DistContext) -> tuple[nn.Module, dict[str, torch.Tensor], set[str], set[str]]:
    """(the model, its tensors before the step, the names the optimizer holds, the names DDP's buckets carried)."""
    cfg = config(ATTENTIVE_PROBE=probe)
    torch.manual_seed(0)
    # dropout everywhere, so an encoder left in train mode would differ from step to step
    model = build_model("vjepa2_vitl", CLASSES, **TINY["vjepa2_vitl"], attention_probs_dropout_prob=0.5)
    apply_training_controls(model, cfg)
    names = {id(param): name for name, param in model.named_parameters()}
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    optimizer = build_optimizer(cfg, model, 0.1)
    held = {names[id(param)] for group in optimizer.param_groups for param in group["params"]}
    ddp = wrap_ddp(model, ctx, cfg)
    synced: set[str] = set()

    def record(_, bucket):  # type: ignore[no-untyped-def] # DDP reads the annotations, which are strings here
        synced.update(names[id(param)] for param in bucket.parameters())
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, record)
    ddp.train()
    clip = torch.randn(2, 3, FRAMES, SIZE, SIZE)
    nn.functional.cross_entropy(ddp(clip), torch.tensor([0, 2])).backward()
    optimizer.step()
    return model, before, held, synced


def changed(model: nn.Module, before: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, param in model.named_parameters() if not torch.equal(param.detach(), before[name])}


def test_the_probe_trains_the_pooler_and_classifier_over_a_frozen_encoder(one_rank_group: DistContext) -> None:
    model, before, held, synced = one_step(True, one_rank_group)
    probe = {name for name in before if name.startswith(TRAINED)}
    assert probe and held == probe and synced == probe
    moved = changed(model, before)
    assert moved and moved <= probe
    assert not any(name.startswith("vjepa2.") for name in moved)
    encoder = model.get_submodule("vjepa2")
    assert model.training and not any(module.training for module in encoder.modules())  # after ddp.train() too
    assert all(module.training for module in model.pooler.modules())


def test_full_fine_tuning_trains_the_encoder_too(one_rank_group: DistContext) -> None:
    model, before, held, synced = one_step(False, one_rank_group)
    encoder_moved = {name for name in changed(model, before) if name.startswith("vjepa2.encoder.")}
    assert encoder_moved and "vjepa2.encoder.layer.0.mlp.fc1.weight" in held & synced
    assert model.get_submodule("vjepa2").training


@pytest.mark.parametrize(("model", "problem"), [
    ({"NAME": "videomae_base"}, "CONFIG.MODEL.ATTENTIVE_PROBE: model videomae_base has no attentive probe"),
    ({"NAME": "slowfast_4x16_resnet50"}, "CONFIG.MODEL.ATTENTIVE_PROBE: model slowfast_4x16_resnet50 has no"),
    ({"NAME": "vjepa2_vitl", "FREEZE_BACKBONE": True}, "CONFIG.MODEL.FREEZE_BACKBONE: freezes the probe's pooler"),
])
def test_the_probe_is_refused_by_name_where_there_is_none(model: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match="^config: " + re.escape(problem)):
        validate_config({"CONFIG": {"MODEL": {**model, "ATTENTIVE_PROBE": True}}})
