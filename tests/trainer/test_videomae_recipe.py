"""VideoMAE's fine-tuning recipe: Mixup and CutMix mix what the loss sees as drawn, the layer-wise LR decay and the
weight-decay exemptions give each parameter VideoMAE's LR and decay, drop path where the library has it (refused for
VideoMAE, whose class has none), repeated augmentation draws every video k times per epoch, and the shipped config
holds the paper's values and trains and tests (5 clips x 3 crops) a tiny VideoMAE end to end."""

from __future__ import annotations

import collections
import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
import yaml
from huggingface_hub.errors import StrictDataclassFieldValidationError
from torch import nn
from torch.nn import functional as F

from tests.trainer.test_config import run_cli
from tests.trainer.test_hf_models import FRAMES, SIZE, TINY
from trainer.accel import clip_normalizer
from trainer.config import ConfigError, load_config, validate_config
from trainer.data.loader import RepeatedAugSampler
from trainer.data.mixup import BatchMixer
from trainer.distributed import launch, single_process_context
from trainer.engine import _forward_loss
from trainer.hf_models import HF_MODELS, HfModel
from trainer.model_setup import build_model_from_config
from trainer.models import registry
from trainer.models.hf_video import build_hf_model
from trainer.reporting import read_metrics
from trainer.solver import build_optimizer, build_scheduler
from trainer.test import test_worker as multiview_test_worker
from trainer.train import train_worker

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "configs" / "videomae_base_k400_finetune.yaml"
CLASSES = 4


def tiny_cfg(train: dict[str, Any] | None = None, model: str = "videomae_small", **data: Any) -> Any:
    data = {"NUM_CLASSES": CLASSES, "CLIP_LEN": FRAMES, "CROP_SIZE": SIZE, **data}
    return validate_config({"CONFIG": {"TRAIN": train or {}, "MODEL": {"NAME": model}, "DATA": data}})


def tiny_model(name: str = "videomae_small", **overrides: Any) -> nn.Module:
    torch.manual_seed(0)
    return build_hf_model(name, CLASSES, **{**TINY["videomae_base"], **overrides})


def clips(batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, 3, FRAMES, SIZE, SIZE, generator=generator), torch.arange(batch) % CLASSES


# ---------------------------------------------------------------------------------------------------------------------
# Mixup and CutMix


def smoothed_ce(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Per-clip cross-entropy against the one-hot label with label smoothing, written out."""
    target = F.one_hot(labels, CLASSES).float() * (1 - smoothing) + smoothing / CLASSES
    return -(target * logits.log_softmax(1)).sum(1)


def test_mixup_gives_the_loss_the_mixed_clips_and_the_mixed_smoothed_targets() -> None:
    cfg = tiny_cfg({"LABEL_SMOOTHING": 0.1, "MIXUP": {"ALPHA": 0.8}})
    mixer = BatchMixer.from_config(cfg)
    assert mixer is not None
    video, labels = clips()
    key = (0, 3, 7)  # rank, epoch, batch
    mix = mixer.draw(key, SIZE, SIZE)
    assert mix.box is None and 0 < mix.lam < 1
    model = tiny_model().train()
    ctx = single_process_context(cfg)
    normalizer = clip_normalizer(cfg, ctx)
    batch = {"video": video, "label": labels}
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    torch.manual_seed(5)
    loss, _, seen_labels = _forward_loss(model, batch, criterion, cfg, ctx, normalizer, False,
                                         lambda v, y: mixer(v, y, key=key))
    normalised = normalizer(video, None)
    mixed = normalised * mix.lam + normalised.flip(0) * (1 - mix.lam)
    torch.manual_seed(5)
    logits = model(mixed)
    # the loss is linear in its targets: the mixed targets' loss is the mix of the two labels' losses
    expected = (mix.lam * smoothed_ce(logits, labels, 0.1) + (1 - mix.lam) * smoothed_ce(logits, labels.flip(0), 0.1))
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-5)
    assert torch.equal(seen_labels, labels)  # top-1 is counted against each clip's own label
    unmixed, _, _ = _forward_loss(model, batch, criterion, cfg, ctx, normalizer, False)
    assert abs(unmixed.item() - loss.item()) > 1e-3


def test_cutmix_pastes_a_box_of_the_partner_into_every_frame_and_mixes_the_targets_by_its_area() -> None:
    mixer = BatchMixer(alpha=0.0, cutmix_alpha=1.0, switch_prob=0.5, num_classes=CLASSES, seed=0)
    video, labels = clips()
    for batch_index in range(20):
        key = (1, 0, batch_index)
        mix = mixer.draw(key, SIZE, SIZE)
        assert mix.box is not None
        top, bottom, left, right = mix.box
        assert mix.lam == pytest.approx(1 - (bottom - top) * (right - left) / SIZE**2)
        mixed, targets = mixer(video, labels, key=key)
        inside = torch.zeros(SIZE, SIZE, dtype=torch.bool)
        inside[top:bottom, left:right] = True
        assert torch.equal(mixed[..., inside], video.flip(0)[..., inside])
        assert torch.equal(mixed[..., ~inside], video[..., ~inside])
        one_hot = F.one_hot(labels, CLASSES).float()
        assert torch.allclose(targets, one_hot * mix.lam + one_hot.flip(0) * (1 - mix.lam))


def test_the_switch_chooses_cutmix_with_its_probability_and_a_seeded_draw_repeats() -> None:
    def cutmix_share(switch: float) -> float:
        mixer = BatchMixer(alpha=0.8, cutmix_alpha=1.0, switch_prob=switch, num_classes=CLASSES, seed=0)
        return sum(mixer.draw((0, 0, b), SIZE, SIZE).box is not None for b in range(1000)) / 1000

    assert cutmix_share(0.0) == 0.0 and cutmix_share(1.0) == 1.0
    assert 0.2 <= cutmix_share(0.25) <= 0.3
    mixer = BatchMixer(alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, num_classes=CLASSES, seed=3)
    draws = [mixer.draw((0, 2, b), SIZE, SIZE) for b in range(8)]
    assert draws == [mixer.draw((0, 2, b), SIZE, SIZE) for b in range(8)]  # the same key, the same mix
    assert len({d.lam for d in draws}) == 8
    other_seed = BatchMixer(alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, num_classes=CLASSES, seed=4)
    assert other_seed.draw((0, 2, 0), SIZE, SIZE) != draws[0]


def test_mixup_keys_that_nothing_reads_are_refused_by_name() -> None:
    assert BatchMixer.from_config(tiny_cfg()) is None
    with pytest.raises(ConfigError, match=r"CONFIG\.TRAIN\.MIXUP\.SWITCH_PROB: only ALPHA and CUTMIX_ALPHA both"):
        tiny_cfg({"MIXUP": {"CUTMIX_ALPHA": 1.0, "SWITCH_PROB": 0.3}})


# ---------------------------------------------------------------------------------------------------------------------
# Layer-wise LR decay, weight-decay exemptions, drop path


def group_of(optimizer: torch.optim.Optimizer, param: nn.Parameter) -> dict[str, Any]:
    return next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))


@pytest.mark.parametrize("name", ["videomae_small", "timesformer_base"])
def test_layer_decay_gives_each_layer_its_lr_and_1d_and_position_parameters_no_weight_decay(name: str) -> None:
    lr, decay, wd = 1e-3, 0.75, 0.05
    cfg = tiny_cfg({"OPTIMIZER": "AdamW", "LR": lr, "W_DECAY": wd, "LAYER_DECAY": decay, "ZERO_WD_1D_PARAM": True,
                    "LR_POLICY": "Cosine", "EPOCH_NUM": 4}, model=name)
    model = tiny_model(name)
    optimizer = build_optimizer(cfg, model, lr)
    scheduler = build_scheduler(cfg, optimizer, 1)
    model(clips()[0]).sum().backward()
    optimizer.step()
    scheduler.step()
    factor = 0.5 * (1 + math.cos(math.pi * 1 / 4))  # GluonCV's cosine in epoch 1 of 4: the schedule moves them all
    prefix = name.split("_")[0]
    depth = {f"{prefix}.embeddings.patch_embeddings.projection.weight": 0,
             f"{prefix}.encoder.layer.0.intermediate.dense.weight": 1,
             f"{prefix}.encoder.layer.1.intermediate.dense.weight": 2, "classifier.weight": 3}
    params = dict(model.named_parameters())
    for param_name, layer in depth.items():  # VideoMAE: scale decay^(num_layers + 1 - layer_id), 2 layers here
        group = group_of(optimizer, params[param_name])
        assert group["lr"] == pytest.approx(lr * factor * decay ** (3 - layer)), param_name
        assert group["weight_decay"] == wd, param_name
    tokens = [n for n in params if n.endswith(("cls_token", "position_embeddings", "time_embeddings"))]
    assert len(tokens) == (3 if name.startswith("timesformer") else 0)  # VideoMAE's are fixed, not parameters
    exempt = [n for n in params if n.endswith(".bias") or "norm" in n.split(".")[-2]] + tokens
    for param_name in exempt:
        assert group_of(optimizer, params[param_name])["weight_decay"] == 0.0, param_name
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(params)


def test_layer_decay_is_refused_for_a_model_without_vit_layers() -> None:
    with pytest.raises(ConfigError, match=r"CONFIG\.TRAIN\.LAYER_DECAY: .* model i3d_tiny is not a transformers ViT"):
        validate_config({"CONFIG": {"TRAIN": {"LAYER_DECAY": 0.75}, "MODEL": {"NAME": "i3d_tiny"}}})


@pytest.mark.parametrize(("name", "why"), [
    ("videomae_base", "its config has no drop_path_rate and its layers no stochastic depth"),
    ("timesformer_base", "transformers types TimesformerConfig.drop_path_rate as an int"),
    ("i3d_tiny", "none of the zoo's models has stochastic depth")])
def test_drop_path_is_refused_where_the_library_cannot_set_it(name: str, why: str) -> None:
    message = rf"^config: CONFIG\.MODEL\.DROP_PATH_RATE: cannot be set for model {name}: {why}"
    with pytest.raises(ConfigError, match=message):
        validate_config({"CONFIG": {"MODEL": {"NAME": name, "DROP_PATH_RATE": 0.1}}})


def test_timesformers_config_still_refuses_a_float_drop_path_rate() -> None:
    """The reason the key is refused for TimeSformer: when this fails, the library takes a rate, and
    hf_models.FAMILIES['timesformer'].no_drop_path can become ''."""
    with pytest.raises(StrictDataclassFieldValidationError, match="drop_path_rate"):
        transformers.TimesformerConfig(drop_path_rate=0.1)


@pytest.fixture
def tiny_registered(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tiny V-JEPA 2 and a tiny VideoMAE registered by name, as CONFIG.MODEL.NAME builds them."""
    for name, family, config in (("vjepa2_tiny", "vjepa2", TINY["vjepa2_vitl"]),
                                 ("videomae_tiny", "videomae", TINY["videomae_base"])):
        monkeypatch.setitem(HF_MODELS, name, HfModel(family, config))
        monkeypatch.setitem(registry._REGISTRY, name,
                            lambda classes, _name=name, **kw: build_hf_model(_name, classes, **kw))
    return "vjepa2_tiny"


def test_drop_path_is_honoured_where_the_library_has_it(tiny_registered: str) -> None:
    model = build_model_from_config(validate_config(
        {"CONFIG": {"MODEL": {"NAME": tiny_registered, "DROP_PATH_RATE": 0.2},
                    "DATA": {"NUM_CLASSES": CLASSES, "CLIP_LEN": FRAMES, "CROP_SIZE": SIZE}}}))
    assert model.config.drop_path_rate == 0.2
    rates = [getattr(layer.drop_path, "drop_prob", 0.0) for layer in model.vjepa2.encoder.layer]
    assert rates == [0.0, pytest.approx(0.2)]  # rising from 0 at the first layer to the rate at the last
    video = clips()[0]
    with torch.no_grad():
        model.eval()
        assert torch.equal(model(video), model(video))
        model.train()  # no dropout in the tiny model: only drop path makes two passes differ
        torch.manual_seed(0)
        outputs = [model(video) for _ in range(4)]
    assert any(not torch.equal(outputs[0], other) for other in outputs[1:])


# ---------------------------------------------------------------------------------------------------------------------
# Repeated augmentation


@pytest.mark.parametrize(("length", "world", "repeats"), [(10, 2, 2), (10, 3, 2), (7, 4, 3), (9, 1, 2)])
def test_repeated_augmentation_draws_every_sample_k_times_per_epoch(length: int, world: int, repeats: int) -> None:
    dataset: Any = range(length)  # the sampler reads only its length
    for epoch in (0, 1):
        keys: list[tuple[int, int]] = []
        for rank in range(world):
            sampler = RepeatedAugSampler(dataset, world, rank, seed=5, repeats=repeats)
            sampler.set_epoch(epoch)
            drawn = list(sampler)
            assert len(drawn) == len(sampler)
            keys += drawn
        counts = collections.Counter(index for index, _ in keys)
        assert set(counts) == set(range(length))
        assert min(counts.values()) == repeats  # the rank padding adds fewer than one per rank
        assert sum(counts.values()) - length * repeats < world
        assert len(set(keys)) == length * repeats  # each copy augmented under its own key (padding repeats some)
        assert {key for _, key in keys if key < RepeatedAugSampler.COPY_KEY_STRIDE} == {epoch}


def test_repeated_copies_go_to_different_ranks() -> None:
    per_rank = []
    for rank in range(2):
        sampler = RepeatedAugSampler(range(8), 2, rank, seed=0, repeats=2)  # type: ignore[arg-type]
        per_rank.append({index for index, _ in sampler})
    assert per_rank[0] == per_rank[1] == set(range(8))


# ---------------------------------------------------------------------------------------------------------------------
# The shipped config


def test_shipped_config_passes_the_check_and_holds_the_papers_values() -> None:
    done = run_cli("--config-file", str(SHIPPED), "--check", "--no-runtime-checks", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr
    cfg = load_config(SHIPPED)
    train, data, model = cfg.CONFIG.TRAIN, cfg.CONFIG.DATA, cfg.CONFIG.MODEL
    assert (train.OPTIMIZER, train.MOMENTUM, train.ADAM_BETA2, train.W_DECAY) == ("AdamW", 0.9, 0.999, 0.05)
    assert train.ZERO_WD_1D_PARAM and train.LAYER_DECAY == 0.75
    # base LR 1e-3 per 256 videos; a video is REPEATED_AUG clips here, and BATCH_SIZE counts clips
    assert train.SCALE_LR and pytest.approx(1e-3) == train.LR / (train.BASE_BATCH_SIZE / train.REPEATED_AUG) * 256
    assert (train.LR_POLICY, train.USE_WARMUP, train.WARMUP_EPOCHS, train.EPOCH_NUM) == ("Cosine", True, 5, 75)
    assert cfg.CONFIG.RECIPE == "pyslowfast"  # per-iteration LR, as VideoMAE's
    assert train.LABEL_SMOOTHING == 0.1 and train.REPEATED_AUG == 2
    assert (train.MIXUP.ALPHA, train.MIXUP.CUTMIX_ALPHA, train.MIXUP.SWITCH_PROB) == (0.8, 1.0, 0.5)
    assert (data.CLIP_LEN, data.FRAME_RATE, data.CROP_SIZE, data.TEST_CROP_SIZE) == (16, 4, 224, 224)
    assert (data.TEST_NUM_SEGMENT, data.TEST_NUM_CROP) == (5, 3)
    assert model.NAME == "videomae_base" and model.DROP_PATH_RATE == 0  # VideoMAE's class has no drop path


def test_shipped_config_trains_and_tests_a_tiny_videomae(
    tiny_registered: str, synthetic_dataset: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = {
        "DDP_CONFIG.DISTRIBUTED": False, "DDP_CONFIG.DIST_BACKEND": "gloo", "CONFIG.MODEL.NAME": "videomae_tiny",
        "CONFIG.MODEL.LOAD": False, "CONFIG.MODEL.PRETRAINED_PATH": "", "CONFIG.MODEL.PARTIAL_LOAD": False,
        "CONFIG.TRAIN.EPOCH_NUM": 2, "CONFIG.TRAIN.WARMUP_EPOCHS": 1, "CONFIG.TRAIN.BATCH_SIZE": 8,
        "CONFIG.VAL.BATCH_SIZE": 15, "CONFIG.VAL.FREQ": 2, "CONFIG.DATA.NUM_WORKERS": 0,
        "CONFIG.DATA.CLIP_LEN": FRAMES, "CONFIG.DATA.FRAME_RATE": 2, "CONFIG.DATA.CROP_SIZE": SIZE,
        "CONFIG.DATA.SHORT_SIDE_SIZE": SIZE, "CONFIG.DATA.TEST_CROP_SIZE": SIZE,
        "CONFIG.LOG.BASE_PATH": str(tmp_path / "run"), "CONFIG.LOG.LEVEL": "WARNING",
        **{f"CONFIG.DATA.{k}": v for k, v in synthetic_dataset.items() if k != "CLASS_INDEX"},
    }  # fmt: skip
    cfg = load_config(SHIPPED, [str(item) for key, value in small.items() for item in (key, value)])
    mixed: list[tuple[int, ...]] = []
    mix = BatchMixer.__call__

    def recording(self: BatchMixer, video: torch.Tensor, labels: torch.Tensor, key: tuple[int, ...]) -> Any:
        mixed.append(key)
        return mix(self, video, labels, key)

    monkeypatch.setattr(BatchMixer, "__call__", recording)
    launch(train_worker, cfg)
    epochs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    videos = len(Path(synthetic_dataset["TRAIN_ANNO_PATH"]).read_text().splitlines())
    assert [e["train_clips"] for e in epochs] == [2 * videos] * 2  # REPEATED_AUG 2: every video twice an epoch
    steps = 2 * videos // 8
    assert mixed == [(0, epoch, batch) for epoch in range(2) for batch in range(1, steps + 1)]  # every batch mixed
    # the schedule's LR (not a layer's): 1e-3 x 8 clips / 512, warmed up from 1e-6 (scaled alike) to the cosine's
    # value after 1 of 2 epochs
    scaled = 8 / 512
    assert [e["lr"] for e in epochs] == pytest.approx([1e-6 * scaled, 1e-3 * scaled * 0.5], rel=1e-6)
    launch(functools.partial(multiview_test_worker, ckpt=None), cfg)
    tested = json.loads((tmp_path / "run" / "test_results.json").read_text())
    val_videos = len(Path(synthetic_dataset["VAL_ANNO_PATH"]).read_text().splitlines())
    assert tested["videos"] == val_videos and tested["views_per_video"] == 15


def test_test_crop_the_model_cannot_take_is_refused_by_name(tiny_registered: str, tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"CONFIG": {"MODEL": {"NAME": "videomae_tiny"}, "DATA": {
        "CLIP_LEN": FRAMES, "CROP_SIZE": SIZE, "SHORT_SIDE_SIZE": 48, "TEST_CROP_SIZE": 48},
        "LOG": {"BASE_PATH": str(tmp_path / "run"), "EXP_NAME": ""}}}))
    cfg = load_config(path)
    with pytest.raises(ConfigError, match=r"CONFIG\.DATA\.TEST_CROP_SIZE 48: model videomae_tiny takes only clips "
                                          r"of CLIP_LEN: 4, TEST_CROP_SIZE: 32"):
        multiview_test_worker(single_process_context(cfg), cfg, tmp_path / "none.pth")  # before any weights
