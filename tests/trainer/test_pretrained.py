"""CONFIG.MODEL.PRETRAINED and fine-tuning end to end: weights fetched once from a local HTTP server into the cache
and verified, the trainer loading them from the cache (never downloading), the normalisation they expect, a head
start from a model trained here and saved in a zoo's format, and prediction from the checkpoint file alone."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from tests.trainer.reference_models import save_as
from tests.trainer.test_train import metrics, write_config
from trainer import predict, train
from trainer.config import ConfigError, load_config
from trainer.data import make_synthetic_dataset
from trainer.data.dataset import ClipSpec
from trainer.data.transforms import IMAGENET_MEAN, eval_crop, normalize
from trainer.models import build_model
from trainer.weights import zoo


class Mirror:
    """A directory laid out like the weights cache, served over HTTP on 127.0.0.1 (counts the requests)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        mirror = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:
                mirror.requests.append(self.path)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def publish(mirror: Mirror, source: str, file: str, fmt: str, model: torch.nn.Module, kind: str,
            models: tuple[str, ...], mean: tuple[float, float, float] = zoo.IMAGENET[0]) -> zoo.ZooEntry:
    """Write ``model`` in ``fmt`` to the mirror and return its zoo entry, with the checksum the source would give."""
    path = mirror.root / source / file
    path.parent.mkdir(parents=True, exist_ok=True)
    save_as(fmt, model, path)
    data = path.read_bytes()
    checksum = {"sha1": hashlib.sha1(data).hexdigest(), "sha256-prefix": hashlib.sha256(data).hexdigest()[:8],
                "recorded": ""}[kind]
    return zoo.ZooEntry(source, f"https://zoo.invalid/{file}", fmt, kind, checksum, mean, (0.25, 0.25, 0.25), models,
                        zoo.TrainedClip(8, 1, 32))  # the clip of test_train.write_config


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mirror]:
    """A mirror publishing three tiny models, one per checksum kind, as the zoo table (and an empty cache)."""
    served = Mirror(tmp_path / "mirror")
    torch.manual_seed(0)
    entries = (
        publish(served, "gluoncv", "slowfast_tiny_kinetics400-12345678.pth", "gluoncv",
                build_model("slowfast_tiny", 4), "sha1", ("slowfast_tiny",)),
        publish(served, "pytorchvideo", "I3D_TINY.pyth", "pytorchvideo", build_model("i3d_tiny", 4), "recorded",
                ("i3d_tiny",), mean=zoo.KINETICS[0]),
        publish(served, "pyslowfast", "SLOW_TINY-abcdef12.pkl", "caffe2", build_model("slow_tiny", 4),
                "sha256-prefix", ("slow_tiny",)),
    )
    monkeypatch.setattr(zoo, "ZOO", entries)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(zoo.URL_ENV, raising=False)
    yield served
    served.close()


def fetch(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = zoo.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fetch_weights_downloads_once_verifies_and_prints_the_path(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    # A plain http mirror only when asked for: refused, naming the URL, before any request.
    code, out, err = fetch("slowfast_tiny", "--base-url", mirror.url, capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and not mirror.requests
    assert f"{mirror.url}/gluoncv/slowfast_tiny_kinetics400-12345678.pth: plain http" in err and "--allow-http" in err
    code, out, err = fetch("slowfast_tiny", "--base-url", mirror.url, "--allow-http", capsys=capsys)
    path = cache / "gluoncv" / "slowfast_tiny_kinetics400-12345678.pth"
    assert code == 0 and out == f"{path}\n" and path.read_bytes() == (mirror.root / "gluoncv" / path.name).read_bytes()
    assert mirror.requests == ["/gluoncv/slowfast_tiny_kinetics400-12345678.pth"]
    full = hashlib.sha256(path.read_bytes()).hexdigest()  # recorded for every kind, GluonCV's SHA-1 one included
    assert f"sha256 {full}, recorded in {path.name}.sha256" in err and "trusted on first use" not in err  # full SHA-1
    assert (cache / "gluoncv" / f"{path.name}.sha256").read_text().split()[0] == full
    assert fetch("slowfast_tiny", capsys=capsys)[0] == 0 and len(mirror.requests) == 1  # cached: no download

    monkeypatch.setenv(zoo.URL_ENV, mirror.url)  # the environment's mirror (http asked for there too)
    monkeypatch.setenv(zoo.ALLOW_HTTP_ENV, "1")
    code, _, err = fetch("slow_tiny", capsys=capsys)  # and the other checksum kinds, which say what is trusted
    assert code == 0 and ("pyslowfast publishes only the first 8 hex digits of its SHA-256 (in the file name, checked) "
                          "of SLOW_TINY-abcdef12.pkl: trusted on first use") in err
    code, out, err = fetch("i3d_tiny", "--cache", str(tmp_path / "other"), capsys=capsys)
    recorded = hashlib.sha256((mirror.root / "pytorchvideo" / "I3D_TINY.pyth").read_bytes()).hexdigest()
    assert code == 0 and out.strip() == str(tmp_path / "other" / "pytorchvideo" / "I3D_TINY.pyth")
    assert "pytorchvideo publishes no checksum of I3D_TINY.pyth: trusted on first use" in err
    assert f"sha256 {recorded}, recorded in I3D_TINY.pyth.sha256 and checked on every use" in err
    assert (tmp_path / "other" / "pytorchvideo" / "I3D_TINY.pyth.sha256").read_text().split()[0] == recorded


def test_every_use_checks_the_full_sha256_and_a_file_without_one_is_refused(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchvision's check is the 32-bit prefix in the file name: a forged file that matches it (simulated here by
    moving the entry's prefix to the forgery's) is refused by the full SHA-256 recorded at fetch."""
    monkeypatch.setenv(zoo.ALLOW_HTTP_ENV, "1")
    assert fetch("slow_tiny", "--base-url", mirror.url, capsys=capsys)[0] == 0
    cached = tmp_path / "cache" / "pyslowfast" / "SLOW_TINY-abcdef12.pkl"
    forged = cached.read_bytes() + b"forged"
    cached.write_bytes(forged)
    entry = zoo.entry_for("slow_tiny")
    collided = dataclasses.replace(entry, checksum=hashlib.sha256(forged).hexdigest()[:8])
    monkeypatch.setattr(zoo, "ZOO", tuple(collided if e is entry else e for e in zoo.ZOO))
    with pytest.raises(zoo.WeightsError, match=r"checksum mismatch for the pyslowfast weights of slow_tiny \(sha256 "):
        zoo.verify(collided, cached, "slow_tiny")
    assert fetch("slow_tiny", capsys=capsys)[0] == 2

    # A file of a source that publishes no checksum, copied in without its record: refused, saying how to fix it.
    assert fetch("i3d_tiny", "--base-url", mirror.url, capsys=capsys)[0] == 0
    pyth = tmp_path / "cache" / "pytorchvideo" / "I3D_TINY.pyth"
    pyth.with_name("I3D_TINY.pyth.sha256").unlink()
    code, _, err = fetch("i3d_tiny", capsys=capsys)
    assert code == 2 and err.count("\n") == 1
    assert "I3D_TINY.pyth: no record of its SHA-256 (I3D_TINY.pyth.sha256)" in err
    assert "fetch it again with 'python -m trainer fetch-weights i3d_tiny'" in err


def test_unknown_names_and_checksum_mismatches_are_one_line_errors(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(zoo.ALLOW_HTTP_ENV, "1")
    code, out, err = fetch("slowfast_4x16_tiny", "--base-url", mirror.url, capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "'slowfast_4x16_tiny' has no published Kinetics weights" in err and not mirror.requests

    corrupt = (mirror.root / "gluoncv" / "slowfast_tiny_kinetics400-12345678.pth")
    corrupt.write_bytes(corrupt.read_bytes() + b"\0")
    code, out, err = fetch("slowfast_tiny", "--base-url", mirror.url, capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "checksum mismatch for the gluoncv weights of slowfast_tiny" in err
    assert not any((tmp_path / "cache").rglob("*.pth*"))  # nothing half-verified left in the cache

    assert fetch("i3d_tiny", "--base-url", mirror.url, capsys=capsys)[0] == 0
    cached = tmp_path / "cache" / "pytorchvideo" / "I3D_TINY.pyth"
    cached.write_bytes(cached.read_bytes()[:-1] + b"\1")  # changed after its first fetch
    code, _, err = fetch("i3d_tiny", capsys=capsys)
    assert code == 2 and "(sha256 " in err and "checksum mismatch" in err


def test_pretrained_loads_the_cache_never_downloads_and_sets_the_sources_normalisation(
    mirror: Mirror, tmp_path: Path, capsys: pytest.CaptureFixture[str], synthetic_dataset: dict[str, Any]
) -> None:
    cfg_path = write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run",
                            MODEL={"NAME": "i3d_tiny", "PRETRAINED": True}, TRAIN={"EPOCH_NUM": 1})
    with pytest.raises(SystemExit) as exit_info:
        train.prepare_initial_weights(load_config(cfg_path))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and not mirror.requests
    assert "the pytorchvideo weights of i3d_tiny are not at" in err
    assert "python -m trainer fetch-weights i3d_tiny" in err

    assert fetch("i3d_tiny", "--base-url", mirror.url, "--allow-http", capsys=capsys)[0] == 0
    train.main(["--config-file", str(cfg_path)])  # in this process (not distributed): the node-side path
    out = capsys.readouterr().out
    assert "initialised from the pytorchvideo Kinetics-400 weights: loaded" in out
    assert "classifier re-initialised: head.fc.bias ((4,) in the file, (2,) in the model)" in out
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["CONFIG"]["DATA"]
    assert resolved["MEAN"] == [0.45, 0.45, 0.45] and resolved["STD"] == [0.25, 0.25, 0.25]
    assert len(mirror.requests) == 1  # the fetch; training downloaded nothing


@pytest.fixture(scope="module")
def related_task(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The synthetic task's motions plus a new one: 'left'/'right'/'up', other videos (seed 1)."""
    root = tmp_path_factory.mktemp("related")
    return make_synthetic_dataset(root, ("left", "right", "up"), (8, 8), size=32, frames=16, fps=8, seed=1)


def test_a_model_trained_here_saved_in_a_zoo_format_gives_a_fine_tune_a_head_start(
    synthetic_dataset: dict[str, Any], related_task: dict[str, Any], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Train on left/right, save as a Caffe2 .pkl (PySlowFast's zoo format), fine-tune on left/right/up for one
    epoch: a lower validation loss than the same epoch from scratch (its top-1, over a few videos of 3 classes, moves
    in coarse steps: after one epoch both may still be at chance); then predict from the checkpoint alone."""
    source = write_config(tmp_path / "source.yaml", synthetic_dataset, tmp_path / "source", TRAIN={"EPOCH_NUM": 4})
    train.main(["--config-file", str(source)])
    trained = build_model("i3d_tiny", 2)
    trained.load_state_dict(torch.load(tmp_path / "source" / "checkpoints" / "epoch_0004.pth",
                                       weights_only=True)["model"])
    zoo_file = save_as("caffe2", trained, tmp_path / "I3D_TINY.pkl")

    loss = {}
    for run, model in (("scratch", {}), ("finetune", {"LOAD": True, "PRETRAINED_PATH": str(zoo_file)})):
        cfg = write_config(tmp_path / f"{run}.yaml", related_task, tmp_path / run, TRAIN={"EPOCH_NUM": 1},
                           MODEL={"NAME": "i3d_tiny", **model})
        train.main(["--config-file", str(cfg)])
        loss[run] = metrics(tmp_path / run)[-1]["val_loss"]
    assert loss["finetune"] < loss["scratch"], loss

    # Predict on another machine with only best.pth: no config, and a config naming the cluster's class index.
    best = tmp_path / "finetune" / "checkpoints" / "best.pth"
    checkpoint = torch.load(best, weights_only=True)
    assert "rng" not in checkpoint and checkpoint["inference"]["class_names"] == ["left", "right", "up"]
    assert checkpoint["inference"]["clip"]["mean"] == [0.45, 0.45, 0.45]  # a Caffe2 file: PySlowFast's
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "best.pth").write_bytes(best.read_bytes())
    node_config = yaml.safe_load((tmp_path / "finetune" / "config.yaml").read_text())
    node_config["CONFIG"]["DATA"]["CLASS_INDEX"] = "/home/someone/data/classInd.txt"
    (elsewhere / "config.yaml").write_text(yaml.safe_dump(node_config))
    video = next(Path(related_task["VAL_DATA_PATH"]).glob("val/up/*.mp4"))
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    for extra in ([], ["--config-file", "config.yaml"]):
        predict.main([str(video), "--checkpoint", "best.pth", "--topk", "3", *extra])
        ranked = re.findall(r"^\d\. (\w+) ", capsys.readouterr().out, flags=re.MULTILINE)
        assert sorted(ranked) == ["left", "right", "up"]


def test_load_and_pretrained_together_and_load_without_a_file_are_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps({"CONFIG": {"MODEL": {"NAME": "i3d_tiny", "LOAD": True}}}))
    with pytest.raises(ConfigError, match=r"CONFIG\.MODEL\.PRETRAINED_PATH: is empty but LOAD is True"):
        load_config(path)
    path.write_text(json.dumps({"CONFIG": {"MODEL": {"NAME": "i3d_tiny", "LOAD": True, "PRETRAINED": True,
                                                     "PRETRAINED_PATH": "x.pth"}}}))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config-file", str(path)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "CONFIG.MODEL.LOAD: is True and so is PRETRAINED; keep one" in err


def test_data_mean_and_std_reach_the_transforms(synthetic_dataset: dict[str, Any], tmp_path: Path) -> None:
    cfg = load_config(write_config(tmp_path / "cfg.yaml", synthetic_dataset, tmp_path / "run",
                                   DATA={"MEAN": [0.5, 0.5, 0.5], "STD": [0.25, 0.5, 1.0]}))
    spec = ClipSpec.from_config(cfg)
    assert spec.mean == (0.5, 0.5, 0.5) and spec.std == (0.25, 0.5, 1.0)
    grey = np.full((4, 40, 40, 3), 102, dtype=np.uint8)  # 0.4 after scaling to [0, 1]
    clip = normalize(eval_crop(grey, 32, 32, 0.5), spec.mean, spec.std)
    assert clip[:, 0, 0, 0].tolist() == pytest.approx([-0.4, -0.2, -0.1], abs=1e-6)
    assert ClipSpec.from_config(load_config(write_config(tmp_path / "default.yaml", synthetic_dataset,
                                                         tmp_path / "run"))).mean == IMAGENET_MEAN
