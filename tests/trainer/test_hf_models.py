"""VideoMAE, TimeSformer and V-JEPA 2 from transformers: a tiny checkpoint of each family, with random weights, saved
by the library itself (save_pretrained), loads into the project's model by the zoo's strict rules and gives the
library's own logits; a missing or reshaped tensor, another clip, or a node without the library are refused by name."""

from __future__ import annotations

import hashlib
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file, save_file

from trainer.config import ConfigError, load_config
from trainer.hf_models import FAMILIES, HF_MODELS, hf_family
from trainer.model_setup import build_model_from_config
from trainer.models import build_model, list_models
from trainer.weights.formats import WeightsError
from trainer.weights.pretrained import initial_weights, initialise, load_initial, resolve_normalisation

ROOT = Path(__file__).resolve().parents[2]
FRAMES, SIZE = 4, 32
_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "num_frames": FRAMES, "image_size": SIZE, "patch_size": 16}
TINY: dict[str, dict[str, Any]] = {
    "videomae_base": _VIT,
    "timesformer_base": _VIT,
    "vjepa2_vitl": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "frames_per_clip": FRAMES,
                    "crop_size": SIZE, "pred_hidden_size": 16, "pred_num_hidden_layers": 1,
                    "pred_num_attention_heads": 2, "num_pooler_layers": 1},
}
PROCESSORS = {"videomae": "VideoMAEVideoProcessor", "timesformer": "TimesformerVideoProcessor",
              "vjepa2": "VJEPA2VideoProcessor"}
MEAN, STD = [0.45, 0.45, 0.45], [0.225, 0.225, 0.225]
TENSOR = {"videomae_base": "videomae.encoder.layer.1.attention.output.dense.weight",
          "timesformer_base": "timesformer.encoder.layer.1.output.dense.weight",
          "vjepa2_vitl": "vjepa2.encoder.layer.1.mlp.fc2.weight"}


def save_checkpoint(folder: Path, name: str, num_labels: int) -> Path:
    """A tiny random checkpoint of ``name``'s family with its processor, both saved by transformers."""
    family = hf_family(name)
    assert family is not None
    config = getattr(transformers, family.config_class)(**TINY[name], num_labels=num_labels)
    torch.manual_seed(0)
    getattr(transformers, family.model_class)(config).save_pretrained(folder)
    processor = getattr(transformers, PROCESSORS[family.model_type])
    processor(crop_size={"height": SIZE, "width": SIZE}, image_mean=MEAN, image_std=STD).save_pretrained(folder)
    return folder


def hub_cache(home: Path, hub: str, name: str, num_labels: int = 5) -> Path:
    """A tiny checkpoint of ``name`` as huggingface_hub keeps a download of ``hub`` in the cache of $HF_HOME ``home``:
    ``hub/models--OWNER--NAME/{refs/main, blobs/HASH, snapshots/REVISION/FILE -> ../../blobs/HASH}``; returns the
    snapshot folder."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / f"models--{hub.replace('/', '--')}"
    snapshot = save_checkpoint(repo / "snapshots" / revision, name, num_labels)
    (repo / "blobs").mkdir()
    for file in snapshot.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        file.rename(blob)
        file.symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def config_for(tmp_path: Path, name: str, weights: Path | str, classes: int, model: dict[str, Any] | None = None,
               **data: Any) -> Any:
    cfg = {"CONFIG": {"DATA": {"CLIP_LEN": FRAMES, "CROP_SIZE": SIZE, "NUM_CLASSES": classes, **data},
                      "MODEL": {"NAME": name, "LOAD": True, "PRETRAINED_PATH": str(weights), **(model or {})}}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(path)


def rewrite(folder: Path, change: Any) -> None:
    """Apply ``change`` to the checkpoint's tensors (a dict) and save them back as transformers reads them."""
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_every_size_is_registered() -> None:
    assert {"videomae_small", "videomae_base", "videomae_large", "videomae_huge", "timesformer_base",
            "vjepa2_vitl", "vjepa2_vith", "vjepa2_vitg"} <= set(HF_MODELS)
    assert set(HF_MODELS) <= set(list_models())
    for family in FAMILIES.values():  # the library's own classes, in the pinned version
        assert hasattr(transformers, family.config_class) and hasattr(transformers, family.model_class)


def test_attention_runs_through_torchs_sdpa_where_the_library_has_it() -> None:
    # scaled_dot_product_attention picks flash or memory-efficient kernels on a GPU that has them; transformers'
    # TimeSformer has only its own (eager) attention.
    used = {name: build_model(name, 3, **TINY[name]).config._attn_implementation for name in TINY}
    assert used == {"videomae_base": "sdpa", "vjepa2_vitl": "sdpa", "timesformer_base": "eager"}


@pytest.mark.parametrize("name", sorted(TINY))
def test_gives_the_library_logits(tmp_path: Path, name: str) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", name, num_labels=7)
    cfg = config_for(tmp_path, name, folder, classes=7)
    init = initial_weights(cfg)
    assert init is not None
    ours = build_model(name, 7, **TINY[name]).eval()
    report = load_initial(ours, cfg, init)
    assert report.complete and not report.head_reinitialised
    assert len(report.loaded) == len(ours.state_dict())
    family = hf_family(name)
    assert family is not None
    theirs = getattr(transformers, family.model_class).from_pretrained(folder).eval()
    clip = torch.randn(2, 3, FRAMES, SIZE, SIZE)  # ours: (B, C, T, H, W)
    with torch.no_grad():
        expected = theirs(**{family.input_name: clip.transpose(1, 2).contiguous()}).logits
        got = ours(clip)
    assert got.shape == (2, 7)
    assert (got - expected).abs().max().item() <= 1e-5
    resolve_normalisation(cfg, init)  # the processor's mean and std, not ImageNet's default
    data = cfg.CONFIG.DATA
    assert ([round(v, 6) for v in data.MEAN], [round(v, 6) for v in data.STD]) == (MEAN, STD)


@pytest.mark.parametrize("name", sorted(TINY))
def test_missing_tensor_is_refused_by_name(tmp_path: Path, name: str) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", name, num_labels=5)
    rewrite(folder, lambda tensors: tensors.pop(TENSOR[name]))
    cfg = config_for(tmp_path, name, folder, classes=5)
    init = initial_weights(cfg)
    assert init is not None
    with pytest.raises(WeightsError, match=rf"1 tensor\(s\) missing from the file: {re.escape(TENSOR[name])};"):
        load_initial(build_model(name, 5, **TINY[name]), cfg, init)


@pytest.mark.parametrize("name", sorted(TINY))
def test_mismatched_tensor_is_refused_by_name(tmp_path: Path, name: str) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", name, num_labels=5)
    rewrite(folder, lambda tensors: tensors.update({TENSOR[name]: tensors[TENSOR[name]][:, :-1].contiguous()}))
    cfg = config_for(tmp_path, name, folder, classes=5)
    init = initial_weights(cfg)
    assert init is not None
    with pytest.raises(WeightsError, match=rf"1 of another shape: {TENSOR[name]} \(file \(32, \d+\) vs model"):
        load_initial(build_model(name, 5, **TINY[name]), cfg, init)


def test_head_of_another_size_is_reinitialised_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", "videomae_base", num_labels=7)
    cfg = config_for(tmp_path, "videomae_base", folder, classes=5)
    init = initial_weights(cfg)
    assert init is not None
    model = build_model("videomae_base", 5, **TINY["videomae_base"])
    logger = logging.getLogger("trainer")
    monkeypatch.setattr(logger, "propagate", False)  # as a run's setup_logging (in an earlier test) leaves it
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="trainer"):
            report = initialise(model, cfg, init)
    finally:
        logger.removeHandler(caplog.handler)
    assert sorted(report.head_reinitialised) == ["classifier.bias", "classifier.weight"]
    assert len(report.loaded) == len(model.state_dict()) - 2
    lines = [r.getMessage() for r in caplog.records if "re-initialised" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "classifier.weight ((7, 32) in the file, (5, 32) in the model)" in lines[0]


def test_another_clip_is_refused_by_name(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", "timesformer_base", num_labels=5)
    with pytest.raises(ConfigError, match=r"^CONFIG\.DATA\.CLIP_LEN 8, CROP_SIZE 64: the checkpoint .* expects "
                                          r"CLIP_LEN: 4, CROP_SIZE: 32"):
        initial_weights(config_for(tmp_path, "timesformer_base", folder, classes=5, CLIP_LEN=8, CROP_SIZE=64))
    with pytest.raises(ConfigError, match=r"^CONFIG\.DATA\.MEAN \[0\.485, 0\.456, 0\.406\]: .* MEAN: \[0\.45"):
        initial_weights(config_for(tmp_path, "timesformer_base", folder, classes=5, MEAN=[0.485, 0.456, 0.406]))


def test_hf_config_sets_the_librarys_values_and_refuses_a_key_it_lacks_or_a_zoo_model(tmp_path: Path) -> None:
    def config(model: dict[str, Any]) -> Any:
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump({"CONFIG": {"DATA": {"CLIP_LEN": FRAMES, "CROP_SIZE": SIZE, "NUM_CLASSES": 3},
                                                   "MODEL": model}}))
        return load_config(path)

    model = build_model_from_config(config({"NAME": "videomae_base", "HF_CONFIG": TINY["videomae_base"]}))
    assert model.config.hidden_size == 32 and len(model.videomae.encoder.layer) == 2
    assert model.takes_clip() == (FRAMES, SIZE)
    with pytest.raises(ConfigError, match=r"^CONFIG\.MODEL\.HF_CONFIG: videomae_base: unexpected keyword argument\(s\) "
                                          r"'hiden_size'"):
        build_model_from_config(config({"NAME": "videomae_base", "HF_CONFIG": {"hiden_size": 32}}))
    with pytest.raises(ConfigError, match=r"HF_CONFIG.*model i3d_tiny is not a transformers model"):
        config({"NAME": "i3d_tiny", "HF_CONFIG": {"hidden_size": 32}})


def test_a_model_with_fixed_position_embeddings_refuses_another_clip(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"CONFIG": {"DATA": {"CLIP_LEN": 8, "CROP_SIZE": 224, "NUM_CLASSES": 5},
                                               "MODEL": {"NAME": "videomae_small"}}}))
    with pytest.raises(ConfigError, match=r"^CONFIG\.DATA\.CLIP_LEN 8: model videomae_small takes only clips of "
                                          r"CLIP_LEN: 16, CROP_SIZE: 224"):
        build_model_from_config(load_config(path))


def test_checkpoint_of_another_architecture_is_refused_by_key(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", "videomae_base", num_labels=5)
    cfg = config_for(tmp_path, "videomae_base", folder, classes=5)
    init = initial_weights(cfg)
    assert init is not None
    other = {**TINY["videomae_base"], "use_mean_pooling": False}
    with pytest.raises(WeightsError, match=r"config\.json does not describe model videomae_base: use_mean_pooling "
                                           r"True \(the model's False\)"):
        load_initial(build_model("videomae_base", 5, **other), cfg, init)


def test_a_self_supervised_videomae_checkpoint_fine_tunes_with_a_new_mean_pooled_head(tmp_path: Path) -> None:
    # MCG-NJU/videomae-base, as VideoMAE's paper fine-tunes it: saved by VideoMAEForPreTraining without mean pooling
    # (its encoder ends in a norm); the classifier pools by mean with a new fc_norm, the encoder loads whole.
    folder = tmp_path / "pretrained"
    config = transformers.VideoMAEConfig(**TINY["videomae_base"], use_mean_pooling=False)
    torch.manual_seed(0)
    pretraining = transformers.VideoMAEForPreTraining(config)
    pretraining.save_pretrained(folder)
    transformers.VideoMAEVideoProcessor(crop_size={"height": SIZE, "width": SIZE}, image_mean=MEAN,
                                        image_std=STD).save_pretrained(folder)
    cfg = config_for(tmp_path, "videomae_base", folder, classes=5, model={"PARTIAL_LOAD": True})
    init = initial_weights(cfg)
    assert init is not None
    model = build_model("videomae_base", 5, **TINY["videomae_base"])
    report = load_initial(model, cfg, init)
    fresh = set(model.state_dict()) - set(report.loaded)
    assert fresh == {"fc_norm.weight", "fc_norm.bias", "classifier.weight", "classifier.bias"}, fresh
    theirs = pretraining.state_dict()
    assert all(torch.equal(model.state_dict()[name], theirs[name]) for name in report.loaded)
    # strict loading names what the fine-tune starts afresh
    with pytest.raises(WeightsError, match=r"fc_norm\.weight"):
        load_initial(build_model("videomae_base", 5, **TINY["videomae_base"]), config_for(
            tmp_path, "videomae_base", folder, classes=5), init)


def test_hub_id_is_read_from_the_sites_cache_offline(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path / "hf", "vidcluster-test/tiny-videomae", "videomae_base")
    code = ("import sys; sys.path.insert(0, '.'); from trainer.weights.hf_checkpoint import read_checkpoint; "
            "c = read_checkpoint('vidcluster-test/tiny-videomae', 'videomae_base'); print(c.folder, c.frames, c.size)")
    env = {"PATH": "/usr/bin:/bin", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(snapshot), str(FRAMES), str(SIZE)]


def test_hub_id_not_in_the_cache_is_refused_without_fetching(tmp_path: Path) -> None:
    cfg = config_for(tmp_path, "videomae_base", "vidcluster-test/no-such-model", classes=5)
    with pytest.raises(WeightsError, match=r"^CONFIG\.MODEL\.PRETRAINED_PATH: vidcluster-test/no-such-model is not a "
                                           r"folder, and the Hugging Face cache .* has no copy"):
        initial_weights(cfg)


def test_node_without_transformers_refuses_such_a_model(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"CONFIG": {"MODEL": {"NAME": "videomae_base"}}}))
    # the library made unimportable in that process, as on a node that never installed it
    code = ("import sys; sys.path.insert(0, '.'); sys.modules['transformers'] = None; "
            "from trainer.config.__main__ import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-I", "-c", code, "--config-file", str(path), "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1
    assert f"error: {path}: MODEL.NAME videomae_base needs the transformers package:" in result.stderr
