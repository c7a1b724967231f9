"""A Hugging Face hub id in CONFIG.MODEL.PRETRAINED_PATH is resolved on the controller only: `python -m trainer
fetch-weights OWNER/NAME` takes the snapshot from the site's Hugging Face cache, or downloads it there from the hub
or a mirror, through huggingface_hub (HF_HOME, HF_ENDPOINT, HF_HUB_OFFLINE as it reads them). A miss it cannot
download is one line naming the id; a checkpoint of another family or size than MODEL.NAME is refused naming both, on
the controller and by the trainer. The launcher's render gives every node a config naming the node's copy, and the
ddp_launch weights task (a real ansible-playbook on this machine) puts the snapshot's files there. The mirror is a
server on loopback; where a cache is built by hand here, it is laid out as huggingface_hub lays it out."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import flat, local_play, playbook_env
from tests.ports import free_port
from tests.trainer.test_hf_models import TINY, hub_cache, save_checkpoint
from trainer.config import ConfigError, load_config, validate_config
from trainer.models import build_model
from trainer.node_config import JobSpec, render_job
from trainer.weights import zoo
from trainer.weights.formats import WeightsError
from trainer.weights.hf_checkpoint import check_hub_model
from trainer.weights.pretrained import initial_weights, load_initial

ROOT = Path(__file__).resolve().parents[2]
HUB = "vidcluster-test/tiny-vjepa2"
# the sizes of the published facebook/vjepa2-vitl-fpc16-256-ssv2 (its config.json), for a check that reads no tensor
VITL = {"model_type": "vjepa2", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
        "mlp_ratio": 4.0}


def fetch(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m trainer fetch-weights ARGS`` in a process of its own with $HF_HOME ``home``."""
    environ = {"PATH": "/usr/bin:/bin", "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", **env}
    return subprocess.run([sys.executable, "-m", "trainer", "fetch-weights", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


class Mirror:
    """A hub mirror on loopback ($HF_ENDPOINT) serving one repository, ``folder``'s files at one revision, through the
    routes huggingface_hub's snapshot_download asks: the revision, its file tree, and each file (HEAD, then GET)."""

    def __init__(self, hub: str, folder: Path, revision: str = "f" * 40) -> None:
        files = {p.name: p.read_bytes() for p in folder.iterdir()}
        tree = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for n, b in files.items()]
        routes = {f"/api/models/{hub}/revision/main": json.dumps({"id": hub, "sha": revision, "siblings": [
                      {"rfilename": n} for n in files]}).encode(),
                  f"/api/models/{hub}/tree/{revision}?recursive=true&expand=false": json.dumps(tree).encode(),
                  **{f"/{hub}/resolve/{revision}/{n}": b for n, b in files.items()}}
        self.asked: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(handler, body: bool) -> None:  # "handler": the request's, "self": the mirror's
                self.asked.append(f"{handler.command} {handler.path}")
                found = routes.get(handler.path)
                handler.send_response(200 if found is not None else 404)
                handler.send_header("Content-Length", str(len(found or b"")))
                handler.send_header("X-Repo-Commit", revision)
                handler.send_header("ETag", f'"{hashlib.sha256(found or b"").hexdigest()}"')
                handler.end_headers()
                if body and found:
                    handler.wfile.write(found)

            def do_GET(handler) -> None:
                handler.answer(True)

            def do_HEAD(handler) -> None:
                handler.answer(False)

            def log_message(handler, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_controller_downloads_a_hub_id_from_the_sites_mirror_into_its_cache_once(tmp_path: Path) -> None:
    mirror = Mirror(HUB, save_checkpoint(tmp_path / "published", "vjepa2_vitl", num_labels=5))
    try:
        result = fetch(tmp_path / "hf", HUB, "--model", "vjepa2_vitl", HF_ENDPOINT=mirror.url)
    finally:
        mirror.close()
    # the tiny V-JEPA 2 is not a ViT-L: refused in one line, but fetched first
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{HUB}: a vjepa2 checkpoint of no size here (hidden_size 32," in result.stderr
    assert {f"GET /{HUB}/resolve/{'f' * 40}/{n}" for n in ("config.json", "model.safetensors")} <= set(mirror.asked)
    # now in the cache, where huggingface_hub put it: offline, the mirror gone, the same snapshot
    result = fetch(tmp_path / "hf", HUB, HF_HUB_OFFLINE="1")
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.splitlines()[-1])
    assert snapshot == tmp_path / "hf" / "hub" / f"models--{HUB.replace('/', '--')}" / "snapshots" / ("f" * 40)
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "published").iterdir()}


def test_a_hub_id_the_controller_cannot_have_is_one_line_naming_it(tmp_path: Path) -> None:
    hub_cache(tmp_path / "hf", HUB, "vjepa2_vitl")
    result = fetch(tmp_path / "hf", "vidcluster-test/not-cached", HF_HUB_OFFLINE="1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: vidcluster-test/not-cached: not in the Hugging Face cache "
                                    f"{tmp_path / 'hf' / 'hub'}, and HF_HUB_OFFLINE is set;"), result.stderr
    port = free_port()
    result = fetch(tmp_path / "hf", "vidcluster-test/not-cached", HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: vidcluster-test/not-cached: not in the Hugging Face cache "
                                    f"{tmp_path / 'hf' / 'hub'}, and http://127.0.0.1:{port} cannot be reached;")


def test_the_zoos_options_are_refused_with_a_hub_id(capsys: pytest.CaptureFixture[str]) -> None:
    for option in (["--cache", "/tmp/zoo"], ["--base-url", "https://mirror.invalid"], ["--allow-http"]):
        assert zoo.main([HUB, *option]) == 2
        assert capsys.readouterr().err == (f"error: {option[0]}: a hub id is fetched into the Hugging Face cache from "
                                           "the hub or its mirror ($HF_HOME / $HF_HUB_CACHE, $HF_ENDPOINT), not the "
                                           "zoo's\n")


def test_a_hub_id_in_pretrained_is_refused_naming_the_key_it_goes_in() -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "config: CONFIG.MODEL.PRETRAINED: a Hugging Face hub id goes in PRETRAINED_PATH, with LOAD: True "
            f"(PRETRAINED: True starts from the zoo's published weights of NAME), got '{HUB}'")):
        validate_config({"CONFIG": {"MODEL": {"NAME": "vjepa2_vitl", "PRETRAINED": HUB}}})


def published_vitl(snapshot: Path) -> None:
    """The snapshot's config.json (a link into the blobs) replaced by one of the published ViT-L's size."""
    config = json.loads((snapshot / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").write_text(json.dumps({**config, **VITL}))


def test_a_checkpoint_of_another_family_or_size_than_model_name_is_refused_naming_both(tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path / "hf", HUB, "vjepa2_vitl")
    published_vitl(snapshot)
    check_hub_model(snapshot, HUB, "vjepa2_vitl")
    with pytest.raises(WeightsError, match=re.escape(
            f"{HUB}: a vjepa2_vitl checkpoint (hidden_size 1024, num_hidden_layers 24, num_attention_heads 16, "
            "mlp_ratio 4.0), but MODEL.NAME vjepa2_vith is hidden_size 1280, num_hidden_layers 32, "
            "num_attention_heads 16, mlp_ratio 4.0; set MODEL.NAME to vjepa2_vitl")):
        check_hub_model(snapshot, HUB, "vjepa2_vith")
    with pytest.raises(WeightsError, match=f"^{HUB}: model_type 'vjepa2', but MODEL.NAME videomae_base is a videomae "):
        check_hub_model(snapshot, HUB, "videomae_base")


def test_a_node_refuses_a_checkpoint_of_another_size_naming_both(tmp_path: Path) -> None:
    folder = save_checkpoint(tmp_path / "ckpt", "videomae_base", num_labels=5)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"CONFIG": {"DATA": {"CLIP_LEN": 4, "CROP_SIZE": 32, "NUM_CLASSES": 5},
                                               "MODEL": {"NAME": "videomae_base", "LOAD": True,
                                                         "PRETRAINED_PATH": str(folder)}}}))
    cfg = load_config(path)
    init = initial_weights(cfg)
    assert init is not None
    wider = build_model("videomae_base", 5, **{**TINY["videomae_base"], "hidden_size": 48})
    with pytest.raises(WeightsError, match=r"config\.json: a videomae checkpoint of no size here \(hidden_size 32, "
                                           r"num_hidden_layers 2, num_attention_heads 2, intermediate_size 64\), but "
                                           r"MODEL\.NAME videomae_base is hidden_size 48, "):
        load_initial(wider, cfg, init)


def launch() -> dict[str, Any]:
    """What the launcher's render says of a two-node job training V-JEPA 2 from ``HUB``."""
    experiment = {"CONFIG": {"DATA": {"NUM_CLASSES": 5, "CLIP_LEN": 4, "CROP_SIZE": 32},
                             "MODEL": {"NAME": "vjepa2_vitl", "LOAD": True, "PRETRAINED_PATH": HUB,
                                       "ATTENTIVE_PROBE": True}}}
    nodes = [{"name": f"n{i}", "ip": f"10.9.0.{10 + i}", "gpus": 0, "home": f"/home/n{i}", "iface": "eth0"}
             for i in range(2)]
    spec = JobSpec.from_json({"job_id": "hub", "port": 29500, "code_version": "abc", "nodes": nodes})
    return render_job(experiment, spec, "exp.yaml")


def test_every_node_is_given_its_own_copy_of_the_snapshot_to_load(tmp_path: Path) -> None:
    rendered = launch()
    assert (rendered["pretrained"], rendered["pretrained_folder"], rendered["pretrained_model"]) == (
        HUB, f"huggingface/{HUB}", "vjepa2_vitl")
    for name, member in rendered["members"].items():
        plan = member["plan"]
        model = yaml.safe_load(member["yaml"])["CONFIG"]["MODEL"]
        assert model["PRETRAINED_PATH"] == f"{plan.paths.weights_cache}/huggingface/{HUB}"
        assert plan.paths.weights_cache.startswith(f"/home/{name}/")
        # the launcher's preflight checks the node's inputs before the weights are shipped: not this one
        assert "CONFIG.MODEL.PRETRAINED_PATH" not in dict(plan.data_paths)


def weights_play(tmp_path: Path, rendered: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """roles/ddp_launch/tasks/weights_fetch.yml then weights.yml run by ansible-playbook on this machine, with the
    render's facts."""
    node_cache = tmp_path / "node" / "weights"
    job = {key: rendered[key] for key in ("pretrained", "pretrained_folder", "pretrained_model")}
    play = [{"hosts": "all", "gather_facts": False,
             "vars": {"ddp_config_job": {**job, "config_path": str(tmp_path / "exp.yaml"),
                                         "plan": {"paths": {"weights_cache": str(node_cache)}}},
                      "vidcluster_trainer_dir": str(ROOT / "trainer")},
             "tasks": [{"ansible.builtin.include_role": {"name": "ddp_launch", "tasks_from": tasks}}
                       for tasks in ("weights_fetch.yml", "weights.yml")]}]
    return local_play(tmp_path, play, {**playbook_env(), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})


def test_the_weights_task_ships_the_controllers_snapshot(tmp_path: Path) -> None:
    rendered = launch()
    snapshot = hub_cache(tmp_path / "hf", HUB, "vjepa2_vitl")
    result = weights_play(tmp_path, rendered)  # a tiny V-JEPA 2, not MODEL.NAME's ViT-L: the play stops naming both
    assert result.returncode != 0
    assert (f"CONFIG.MODEL.PRETRAINED_PATH of exp.yaml: {HUB}: a vjepa2 checkpoint of no size here (hidden_size 32, "
            "num_hidden_layers 2, num_attention_heads 2, mlp_ratio 4.0), but MODEL.NAME vjepa2_vitl is hidden_size "
            "1024," in flat(result.stdout)), result.stdout[-3000:]
    copy = tmp_path / "node" / "weights" / "huggingface" / HUB
    assert not copy.exists()
    published_vitl(snapshot)
    result = weights_play(tmp_path, rendered)
    assert result.returncode == 0, result.stdout[-3000:]
    # the files, not links into the controller's blobs, where the nodes' configs name them
    assert not any(p.is_symlink() for p in copy.iterdir())
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == {p.name: p.read_bytes() for p in snapshot.iterdir()}
