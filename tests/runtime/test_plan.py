"""The node plan: what `python -m trainer.node_config` writes for every member of a job, with private and shared
homes, trainers and spares, and the config's own LOG keys; and the plan's schema check."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.node_config import JobSpec, main, render_job
from trainer.runtime import layout
from trainer.runtime.plan import NodePlan, PlanError

EXPERIMENT = {
    "CONFIG": {
        "DATA": {"TRAIN_ANNO_PATH": "~/data/k/train.txt", "TRAIN_DATA_PATH": "~/data/k", "VAL_ANNO_PATH":
                 "~/data/k/val.txt", "VAL_DATA_PATH": "data/k", "NUM_CLASSES": 2},
        "MODEL": {"NAME": "i3d_tiny"},
        "LOG": {"BASE_PATH": "~/scratch/exps", "EXP_NAME": "use_time", "LOG_FILENAME": "train-log.txt",
                "SAVE_DIR": "ckpts"},
    }
}


def job(homes: list[str], spares: int = 0, net: str = "10.9.0", **extra: Any) -> JobSpec:
    """A job over nodes n0.. (the last ``spares`` are spares) with these homes, at ``net``.10, ``net``.11..."""
    nodes = [{"name": f"n{i}", "ip": f"{net}.{10 + i}", "gpus": 0, "home": home, "iface": "eth0"}
             for i, home in enumerate(homes)]
    count = len(nodes) - spares
    return JobSpec.from_json({"job_id": "k400-a", "port": 29500, "code_version": "abc123", "nodes": nodes[:count],
                              "spares": nodes[count:], **extra})


def plans(spec: JobSpec) -> dict[str, NodePlan]:
    rendered = render_job(EXPERIMENT, spec, "exp.yaml")
    return {name: member["plan"] for name, member in rendered["members"].items()}


@pytest.mark.parametrize("shared", [False, True], ids=["private-homes", "shared-home"])
def test_every_path_of_every_member_is_its_own(shared: bool) -> None:
    homes = ["/home/u"] * 3 if shared else ["/home/a", "/srv/b", "/home/c"]
    found = plans(job(homes, spares=1))
    for index, (name, plan) in enumerate(found.items()):
        home = homes[index]
        folder = f"{home}/vidcluster/jobs/k400-a/{name}"  # each node its own folder, also in a shared home
        run = f"{home}/scratch/exps/k400-a"  # EXP_NAME use_time is the job id: a relaunch finds the run
        assert plan.paths.job_dir == folder
        assert (plan.paths.plan, plan.paths.secret, plan.paths.config) == (
            f"{folder}/plan.json", f"{folder}/secret", f"{folder}/config.yaml")
        assert plan.paths.code_dir == f"{home}/vidcluster/code/abc123"
        assert plan.paths.env_python == f"{home}/vidcluster/venv/bin/python"
        assert plan.paths.run_dir == run
        assert plan.paths.checkpoints == f"{run}/ckpts"  # LOG.SAVE_DIR
        assert plan.paths.status_file == f"{run}/status.json"
        assert plan.paths.log_file == f"{run}/train-log.txt"  # LOG.LOG_FILENAME
        assert list(plan.paths.results) == [f"{run}/{f}" for f in (
            "metrics.jsonl", "status.json", "curves.png", "train-log.txt", "weights_digest.json", "config.yaml",
            "bad_videos.json")]
        assert plan.paths.weights_cache == f"{home}/.cache/vidcluster/weights"
        assert dict(plan.data_paths) == {"CONFIG.DATA.TRAIN_ANNO_PATH": f"{home}/data/k/train.txt",
                                         "CONFIG.DATA.TRAIN_DATA_PATH": f"{home}/data/k",
                                         "CONFIG.DATA.VAL_ANNO_PATH": f"{home}/data/k/val.txt",
                                         "CONFIG.DATA.VAL_DATA_PATH": f"{home}/data/k"}
        assert plan.argv == (f"{home}/vidcluster/venv/bin/python", "-P", "-m", "trainer.train", "--config-file",
                             f"{folder}/config.yaml")
        assert plan.env["PYTHONPATH"] == plan.paths.code_dir
        assert plan.env["GLOO_SOCKET_IFNAME"] == "eth0" and plan.env["CUDA_VISIBLE_DEVICES"] == ""
        assert plan.env["NCCL_SOCKET_IFNAME"] == "=eth0"  # exactly eth0: a plain name is a prefix to NCCL (eth01...)
        assert plan.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # device ids as nvidia-smi numbers them
        assert [(m.name, m.rank) for m in plan.members] == [("n0", 0), ("n1", 1), ("n2", None)]
        assert plan.me.spare == (name == "n2") and plan.world_size == 2


def test_the_plan_says_who_is_where_and_how_the_job_is_watched() -> None:
    spec = job(["/home/a", "/home/b"], watch={"heartbeat_timeout": 20, "stop_grace": 4},
               restarts={"max_restarts": 5, "node_wait": 60}, extra_env={"NCCL_DEBUG": "INFO"}, weights_table=True,
               jobs_dir="/scratch/jobs", code_root="code", env_path="/opt/env", omp_num_threads=3)
    plan = plans(spec)["n1"]
    assert plan.paths.job_dir == "/scratch/jobs/k400-a/n1" and plan.paths.code_dir == "/home/b/code/abc123"
    assert plan.paths.env_python == "/opt/env/bin/python"
    assert (plan.watch.heartbeat_timeout, plan.watch.startup_timeout, plan.watch.stop_grace) == (20.0, 300.0, 4.0)
    assert (plan.restarts.max_restarts, plan.restarts.node_wait) == (5, 60.0)
    assert plan.restarts.min_nodes is None and plan.min_nodes == 2  # unset: every trainer, the job never shrinks
    assert plans(job(["/home/a", "/home/b", "/home/c"], restarts={"min_nodes": 2}))["n0"].min_nodes == 2
    assert plan.env["NCCL_DEBUG"] == "INFO" and plan.env["OMP_NUM_THREADS"] == "3"
    assert plan.env["VIDCLUSTER_WEIGHTS_TABLE"] == "/scratch/jobs/k400-a/n1/weights-table.json"
    assert (plan.port, plan.backend, plan.workers) == (29500, "gloo", 1)


def test_a_plan_reads_back_exactly_and_a_wrong_key_is_named(tmp_path: Path) -> None:
    plan = plans(job(["/home/a", "/home/b"]))["n0"]
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    assert NodePlan.read(str(path)) == plan
    data = json.loads(plan.to_json())
    data["paths"]["chekpoints"] = data["paths"].pop("checkpoints")
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match=r"plan.json: paths: missing checkpoints; unknown chekpoints"):
        NodePlan.read(str(path))
    data = json.loads(plan.to_json())
    data["schema"] = 0
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="schema 0, this runtime reads schema 1"):
        NodePlan.read(str(path))
    data = json.loads(plan.to_json())
    data["restarts"]["min_nodes"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="restarts: min_nodes 3 must be between 1 and the job's 2 trainers"):
        NodePlan.read(str(path))


def test_the_renderer_writes_configs_and_plans_and_refuses_a_bad_job_id(tmp_path: Path, capsys: Any) -> None:
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(json.dumps(EXPERIMENT))
    described = {"job_id": "k400-a", "port": 29500, "nodes": [
        {"name": "n0", "ip": "fd00::10", "gpus": 0, "home": "/home/a", "iface": "eth0"},
        {"name": "n1", "ip": "fd00::11", "gpus": 0, "home": "/home/b", "iface": "eth0"}]}
    (tmp_path / "job.json").write_text(json.dumps(described))
    assert main(["--config-file", str(experiment), "--job", str(tmp_path / "job.json"),
                 "--out-dir", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["root_ip"] == "fd00::10"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "launch.json", "n0.plan.json", "n0.yaml", "n1.plan.json", "n1.yaml"]
    assert NodePlan.read(summary["members"]["n1"]["plan_file"]).paths.job_dir == "/home/b/vidcluster/jobs/k400-a/n1"
    assert "DIST_URL: tcp://[fd00::10]:29500" in (tmp_path / "out" / "n1.yaml").read_text()
    for bad in ("../../x", "a;b", "a\nb", ".hidden"):
        (tmp_path / "job.json").write_text(json.dumps({**described, "job_id": bad}))
        assert main(["--config-file", str(experiment), "--job", str(tmp_path / "job.json"),
                     "--out-dir", str(tmp_path / "out2")]) == 2
        assert f"error: job id {bad!r}: use letters" in capsys.readouterr().err
    assert not (tmp_path / "out2").exists()


def test_the_runs_own_ddp_keys_survive_the_launch_and_the_topology_is_the_clusters() -> None:
    # The experiment's DDP_CONFIG is one machine's (WORLD_SIZE 1, a local DIST_URL): replaced by the cluster's, but
    # its sharding is the run's choice and must reach every node (dropping it would train with DDP, unsaid).
    chosen = {"SHARDING": "fsdp2", "FSDP_PARAM_DTYPE": "float32", "FSDP_ACTIVATION_CHECKPOINTING": True}
    experiment = {**EXPERIMENT, "DDP_CONFIG": {"WORLD_SIZE": 1, "WORLD_RANK": 0, "DIST_URL": "tcp://127.0.0.1:1",
                                               "DIST_BACKEND": "nccl", **chosen}}
    rendered = render_job(experiment, job(["/home/a", "/home/a"]), "exp.yaml")
    for member in rendered["members"].values():
        section = yaml.safe_load(member["yaml"])["DDP_CONFIG"]
        assert {key: section[key] for key in chosen} == chosen
        assert section["WORLD_SIZE"] == 2 and section["DIST_URL"] == "tcp://10.9.0.10:29500"
        assert section["DIST_BACKEND"] == "gloo"


def test_layout_is_the_one_answer() -> None:
    assert layout.job_dir("~/vidcluster/jobs", "j", "n1", "/home/u") == "/home/u/vidcluster/jobs/j/n1"
    assert layout.job_dir("jobs", "j", "n1", "/home/u") == "/home/u/jobs/j/n1"
    assert layout.node_path("/abs//p/", "/home/u") == "/abs/p" and layout.url_host("fd00::1") == "[fd00::1]"
    with pytest.raises(ValueError, match=r"job id '\.\.'"):
        layout.job_dir("~/jobs", "..", "n1", "/home/u")
    assert posixpath.basename(layout.code_dir("~/code", "v1", "/h")) == "v1"
