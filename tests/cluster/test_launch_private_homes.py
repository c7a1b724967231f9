"""launch-training.yml on 3 nodes with private homes (the cluster the SSH mesh tests use): a dataset path missing on one
node, 3 nodes x 2 gloo workers writing their run where the config's LOG.BASE_PATH says (in the rank-0 node's home),
a relaunch that resumes from there after re-shipping the trainer code to the one node whose copy differs (the slow
lane), and CONFIG.MODEL.PRETRAINED: weights fetched once on the controller from a mirror, shipped, loaded on every
node."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import (
    REPO,
    VENV_BIN,
    LocalCluster,
    changed_total,
    flat,
    job_processes,
    node_job_dir,
    stage_dataset,
)

CONFIG = "i3d_cpu_test"
LAUNCH_ARGS = ("-e", "ddp_launch_poll_seconds=2", "-e", "ddp_config_omp_num_threads=1", "-e", "master_port=auto",
               "-e", "ddp_launch_follow_hours=0.25")  # fmt: skip
# The config's run location, "~" being the cluster user's home on the rank-0 node; EXP_NAME use_time = the job id.
SCRATCH = {"CONFIG": {"LOG": {"BASE_PATH": "~/scratch/exps", "EXP_NAME": "use_time"}}}


@pytest.fixture(scope="module")
def cluster(private_cluster: tuple[LocalCluster, str], tmp_path_factory: pytest.TempPathFactory) -> LocalCluster:
    cluster, _ = private_cluster
    staged = stage_dataset(cluster, tmp_path_factory.mktemp("data"), train=6, val=2)
    assert "No node shares" in flat(staged.stdout)  # private homes: each node unpacks its own copy
    return cluster


def launch(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("launch-training.yml", *LAUNCH_ARGS, *args, check=check)


def test_dataset_path_missing_on_one_node_fails_before_anything_starts(cluster: LocalCluster) -> None:
    node1 = cluster.nodes[1]
    job = f"{cluster.name}-nodata"
    data = node1.home / "data" / "vidcluster-test"
    data.rename(data.with_name("vidcluster-test-away"))
    try:
        proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", check=False)
    finally:
        data.with_name("vidcluster-test-away").rename(data)
    assert proc.returncode != 0
    assert "node1 lacks the dataset path(s) of i3d_cpu_test.yaml" in flat(proc.stdout), proc.stdout[-3000:]
    assert "CONFIG.DATA.TRAIN_ANNO_PATH = /home/vctrain/data/vidcluster-test/train.txt" in flat(proc.stdout)
    assert "node0 lacks" not in proc.stdout and "node2 lacks" not in proc.stdout
    assert job_processes(job) == []
    assert not any((node_job_dir(node, job) / "state.json").exists() for node in cluster.nodes)


@pytest.mark.slow  # two launches of 3 nodes x 2 workers: 5 minutes of the main lane's 2 cores
def test_runs_go_where_the_config_says_and_a_relaunch_resumes_there(cluster: LocalCluster) -> None:
    node0, node1, node2 = cluster.nodes
    job = f"{cluster.name}-scratch"
    overrides = {"ddp_config_overrides": {**SCRATCH, "CONFIG": {**SCRATCH["CONFIG"], "TRAIN": {"EPOCH_NUM": 2}}}}
    # The interface comes from the gathered facts here (the local inventory names it; "" makes the role look).
    proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "ddp_config_cpu_workers=2",
                  "-e", "vidcluster_network_interface=", "-e", json.dumps(overrides))  # fmt: skip
    assert "6 process(es), gloo" in flat(proc.stdout)
    run = f"/home/vctrain/scratch/exps/{job}"
    assert f"Run directory on node0: {run}" in flat(proc.stdout)
    assert f"Checkpoints: node0:{run}/checkpoints/ (best.pth, epoch_0001.pth, epoch_0002.pth)" in flat(proc.stdout)
    results = REPO / "runs" / job
    assert "world size 6 (3 node(s) x 2 worker(s)" in (results / "log.txt").read_text()
    digest = json.loads((results / "weights_digest.json").read_text())
    assert digest["world_size"] == 6 and len(set(digest["digests"])) == 1 and digest["identical"], digest
    assert json.loads((results / "bad_videos.json").read_text()) == {"count": 0, "videos": []}
    # In the rank-0 node's home, and a copy of the checkpoints (and of metrics.jsonl) in node rank 1's, so the run
    # survives the loss of either; none on node 2, and the job folders hold no run at all.
    for node in (node0, node1):
        run_dir = node.home / "scratch" / "exps" / job
        assert {"epoch_0001.pth", "epoch_0002.pth"} <= {p.name for p in (run_dir / "checkpoints").iterdir()}
        assert [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert not (node2.home / "scratch").exists()
    for node in cluster.nodes:
        assert list((node.home / "vidcluster" / "jobs" / job).rglob("*.pth")) == []
    rendered = (results / "nodes" / "node2.yaml").read_text()
    assert re.search(r"^  WORLD_RANK: 2$", rendered, re.M) and re.search(r"^  AUTO_RANK_MATCH: false$", rendered, re.M)
    plan = json.loads((node_job_dir(node2, job) / "plan.json").read_text())
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "eth0"  # found from the node's facts: the interface of cluster_ip
    # The role's node configs are the trainer's own output for the same job description, byte for byte.
    out = results / "rerendered"
    subprocess.run([str(VENV_BIN / "python"), "-m", "trainer.node_config", "--config-file",
                    str(REPO / "configs" / f"{CONFIG}.yaml"), "--job", str(results / "nodes" / "launch.json"),
                    "--out-dir", str(out)], cwd=REPO, check=True, capture_output=True, text=True)  # fmt: skip
    for node in cluster.nodes:
        for name in (f"{node.name}.yaml", f"{node.name}.plan.json"):
            assert (out / name).read_bytes() == (results / "nodes" / name).read_bytes()

    # node1's copy of the trainer drifts; node2's gains a sitecustomize.py (the version's folder is every job
    # process's PYTHONPATH) and its home a stray ~/trainer/ (an old checkout, where an SSH login lands): a relaunch
    # with one more epoch ships the code to node1 and node2 alone, runs neither stray, and resumes from the
    # checkpoint in ~/scratch on node0.
    version = Path(json.loads((node_job_dir(node1, job) / "plan.json").read_text())["paths"]["code_dir"])
    assert version.parent == Path("/home/vctrain/vidcluster/code")  # the node's folder of code versions
    code = node1.home / "vidcluster" / "code" / version.name / "trainer" / "engine.py"
    code.write_text(code.read_text() + "\n# drift\n")
    ran = node2.home / "stray-ran"  # /home/vctrain/stray-ran on node2
    planted = node2.home / "vidcluster" / "code" / version.name / "sitecustomize.py"
    stray = node2.home / "trainer"
    (stray / "runtime").mkdir(parents=True)
    for path in (planted, stray / "__init__.py", stray / "runtime" / "__init__.py"):
        path.write_text(f"open('/home/vctrain/stray-ran', 'a').write({path.name!r})\n")
    for path in (planted, stray, stray / "runtime", *stray.rglob("*.py")):  # the node user's own files
        os.chown(path, node2.home.stat().st_uid, node2.home.stat().st_gid)
    overrides["ddp_config_overrides"]["CONFIG"]["TRAIN"]["EPOCH_NUM"] = 3
    try:
        again = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "ddp_config_cpu_workers=2",
                       "-e", "vidcluster_network_interface=", "-e", json.dumps(overrides))  # fmt: skip
    finally:
        shutil.rmtree(stray)
    task = "TASK [ddp_launch : Unpack the trainer code into its version's folder]"
    unpack = again.stdout.split(task, 1)[1].split("TASK [", 1)[0]
    assert "changed: [node1]" in unpack and "changed: [node2]" in unpack, unpack
    assert not re.search(r"(ok|changed): \[node0\]", unpack), unpack
    assert "# drift" not in code.read_text() and not planted.exists() and not ran.exists()
    log = (results / "log.txt").read_text()
    assert f"resumed from {run}/checkpoints/epoch_0002.pth at epoch 2" in log
    assert [json.loads(line)["epoch"] for line in (results / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert job_processes(job) == []
    stop = cluster.playbook("stop-training.yml", "-e", f"job_id={job}")
    assert changed_total(stop.stdout, cluster.names) == 0 and flat(stop.stdout).count("nothing to stop") == 3


@contextlib.contextmanager
def weights_mirror(root: Path) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 serving ``root`` (laid out like the weights cache); yields its URL and the paths
    requested so far."""
    requested: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self) -> None:
            requested.append(self.path)
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        server.server_close()


def test_pretrained_weights_are_fetched_once_on_the_controller_and_loaded_on_every_node(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from trainer.models import build_model

    # A site's own published weights for the model of the test config, served by a mirror (nodes have no network
    # here, like many real ones: they must get the file from the controller).
    weights = tmp_path / "mirror" / "site" / "i3d_tiny_site.pth"
    weights.parent.mkdir(parents=True)
    torch.manual_seed(7)
    torch.save({"model": build_model("i3d_tiny", num_classes=2).state_dict()}, weights)
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()

    def table(checksum: str) -> Path:
        path = tmp_path / f"table-{checksum[:8]}.json"
        path.write_text(json.dumps([{"source": "site", "url": "https://weights.invalid/site/i3d_tiny_site.pth",
                                     "format": "vidcluster", "checksum_kind": "sha256", "checksum": checksum,
                                     "mean": [0.45, 0.45, 0.45], "std": [0.225, 0.225, 0.225],
                                     "models": ["i3d_tiny"], "clip": [8, 1, 32]}]))  # fmt: skip
        return path

    job = f"{cluster.name}-pretrained"
    pretrained = {"ddp_config_overrides": {"CONFIG": {"MODEL": {"PRETRAINED": True}, "TRAIN": {"EPOCH_NUM": 1}}}}
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", json.dumps(pretrained))
    monkeypatch.setenv("VIDCLUSTER_WEIGHTS_CACHE", str(tmp_path / "controller-cache"))
    with weights_mirror(tmp_path / "mirror") as (url, requested):
        monkeypatch.setenv("VIDCLUSTER_WEIGHTS_URL", url)
        monkeypatch.setenv("VIDCLUSTER_WEIGHTS_ALLOW_HTTP", "1")  # a plain http mirror, asked for
        # A checksum that does not match: refused on the controller, before anything starts.
        monkeypatch.setenv("VIDCLUSTER_WEIGHTS_TABLE", str(table("0" * 64)))
        proc = launch(cluster, *args, check=False)
        assert proc.returncode != 0
        assert "checksum mismatch for the site weights of i3d_tiny" in flat(proc.stdout), proc.stdout[-3000:]
        assert job_processes(job) == [] and not any((node_job_dir(n, job) / "state.json").exists()
                                                    for n in cluster.nodes)
        # The right table: fetched once, shipped, and every rank starts from it.
        monkeypatch.setenv("VIDCLUSTER_WEIGHTS_TABLE", str(table(sha256)))
        proc = launch(cluster, *args)
        assert requested.count("/site/i3d_tiny_site.pth") == 2  # the refused download, then once for every node
    for node in cluster.nodes:
        copy = node.home / ".cache" / "vidcluster" / "weights" / "site" / "i3d_tiny_site.pth"
        assert copy.read_bytes() == weights.read_bytes(), node.name
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "initialised from the site Kinetics-400 weights" in log and "loaded" in log
    config = (REPO / "runs" / job / "config.yaml").read_text()
    assert "- 0.45" in config  # normalisation from the weights' entry

    # A model without published weights: refused on the controller, naming it.
    proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}-none", "-e", json.dumps(
        {"ddp_config_overrides": {"CONFIG": {"MODEL": {"PRETRAINED": True, "NAME": "slow_tiny"}}}}), check=False)
    assert proc.returncode != 0
    assert "model 'slow_tiny' has no published Kinetics weights" in flat(proc.stdout), proc.stdout[-3000:]
    assert job_processes(f"{job}-none") == []


def test_training_status_without_a_job_lists_every_job_of_every_node(cluster: LocalCluster) -> None:
    status = cluster.playbook("training-status.yml")
    shown = status.stdout.split("TASK [ddp_launch : Show each job's state on the node]", 1)[1].split("TASK [", 1)[0]
    for node in cluster.nodes:  # each node's own line about the job
        block = flat(shown.split(f"ok: [{node.name}] =>", 1)[1].split("ok: [", 1)[0])
        assert f"{cluster.name}-pretrained on {node.name}: finished: attempt 0 trained to the end" in block, block
    assert Path(REPO / "runs" / f"{cluster.name}-pretrained" / "curves.png").stat().st_size > 0
