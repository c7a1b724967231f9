"""launch-training.yml, stop-training.yml, training-status.yml and stage-data.yml on a real local cluster.

One 3-node cluster (network-namespace hosts with their own sshd and private homes) set up by setup-cluster.yml
(keys, trust, environment check, SSH check; the nodes train with the environment the local hosts come with),
then real gloo training of a tiny I3D on synthetic H.264 videos staged to every node:
  - 2 nodes (--limit node0,node1): an unknown config, a dataset path missing on one node and a busy rendezvous port
    each fail before any training process starts, naming what is wrong;
  - 2 nodes: killing one node's trainer mid-run fails the play naming that node, leaves no process behind, and a
    relaunch resumes from the last checkpoint and completes with identical weights on every rank, checkpoints on
    the rank-0 node only and the metrics on the controller;
  - 3 nodes x 2 CPU workers: trains to the end with world size 6.
Run: .venv/bin/python -m pytest tests/cluster/test_launch.py  (root; about 6 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import REPO, VENV_BIN, LocalCluster, Node

CONFIG = "i3d_cpu_test"  # reads ~/data/vidcluster-test on every node
TWO_NODES = ("--limit", "node0,node1")
EPOCHS = 30  # a tiny epoch takes about a second here: enough of them to kill a node mid-run
# Short polls for short runs; one thread per process: every node shares the same 2 cores.
LAUNCH_ARGS = (
    "-e", "ddp_launch_poll_seconds=3",
    "-e", "ddp_launch_omp_num_threads=1",
    "-e", "ddp_launch_follow_hours=0.25",
)  # fmt: skip


def launch(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("launch-training.yml", *LAUNCH_ARGS, *args, check=check)


def job_processes(job_id: str) -> list[int]:
    """Pids on this machine (every node's processes are here, in their namespaces) that belong to the job."""
    marker = f"VIDCLUSTER_JOB_DIR=/home/vctrain/vidcluster/jobs/{job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def job_dir(node: Node, job_id: str) -> Path:
    return node.home / "vidcluster" / "jobs" / job_id


def checkpoints(node: Node, job_id: str) -> list[str]:
    return sorted(p.name for p in job_dir(node, job_id).rglob("*.pth"))


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cluster(
    local_cluster: Callable[[int], LocalCluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A 3-node cluster after setup-cluster.yml, with a small two-class video dataset staged on every node."""
    cluster = local_cluster(3)
    cluster.playbook("setup-cluster.yml")
    data = tmp_path_factory.mktemp("data") / "vidcluster-test"
    subprocess.run(
        [str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left", "right",
         "--train-per-class", "8", "--val-per-class", "4", "--size", "32", "--frames", "16"],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    stage = ("playbooks/stage-data.yml", "-e", f"src={data}", "-e", "dest=data/vidcluster-test")
    cluster.playbook(*stage)
    again = cluster.playbook(*stage)
    assert "changed=0" in again.stdout and "changed=1" not in again.stdout, "staging again changed something"
    yield cluster
    cluster.playbook("stop-training.yml", check=False)


def test_errors_come_before_any_training_process(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes[0], cluster.nodes[1]
    job = f"{cluster.name}-err"

    proc = launch(cluster, *TWO_NODES, "-e", "config=no_such_config", "-e", f"job_id={job}", check=False)
    assert proc.returncode != 0
    assert "Unknown experiment config 'no_such_config'" in output(proc)
    assert "Available configs:" in output(proc) and "i3d_cpu_test" in output(proc) and "slowfast" in output(proc)

    data = node1.home / "data" / "vidcluster-test"
    data.rename(data.with_name("vidcluster-test-away"))
    try:
        proc = launch(cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}", check=False)
    finally:
        data.with_name("vidcluster-test-away").rename(data)
    assert proc.returncode != 0
    assert "node1 lacks the dataset path(s)" in output(proc)
    assert "CONFIG.DATA.TRAIN_ANNO_PATH = /home/vctrain/data/vidcluster-test/train.txt" in output(proc)
    assert "node0 lacks" not in output(proc)

    port = 29611
    blocker = subprocess.Popen(
        ["ip", "netns", "exec", node0.netns, str(VENV_BIN / "python"), "-c",
         "import socket, sys, time\n"
         f"s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert blocker.stdout is not None and blocker.stdout.readline().strip() == "ready"
        proc = launch(
            cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", f"master_port={port}",
            check=False,
        )
    finally:
        blocker.kill()
        blocker.wait()
    assert proc.returncode != 0
    assert f"The rendezvous port {port} is already in use on node0" in output(proc)
    assert "-e master_port=auto" in output(proc)

    # None of the three started anything: no process, no pid file on any node.
    assert job_processes(job) == []
    assert not any((job_dir(node, job) / "train.pid").exists() for node in cluster.nodes)


def test_killed_node_fails_the_play_then_relaunch_resumes(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes[0], cluster.nodes[1]
    job = f"{cluster.name}-kill"
    args = (*TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}",
            "-e", json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": EPOCHS}}}}))  # fmt: skip
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory), "launch-training.yml", *LAUNCH_ARGS, *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    saved = job_dir(node0, job) / "run" / "checkpoints"
    try:
        deadline = time.monotonic() + 240
        while not list(saved.glob("epoch_*.pth")) and play.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert play.poll() is None, f"the play ended before the kill:\n{play.communicate()[0][-4000:]}"
        assert list(saved.glob("epoch_*.pth")), "no checkpoint after the first epoch"
        # Kill node1's trainer (the python under its jobctl supervisor), as an OOM killer or a crash would.
        leader = int((job_dir(node1, job) / "train.pid").read_text())
        trainer = next(pid for pid in job_processes(job) if os.getpgid(pid) == leader and pid != leader
                       and b"trainer.train" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(trainer, signal.SIGKILL)
        killed_at = time.monotonic()
        out, _ = play.communicate(timeout=300)
        elapsed = time.monotonic() - killed_at
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode != 0, out[-4000:]
    assert "Training failed on node1: its training process was killed by signal 9" in out, out[-4000:]
    assert elapsed < 120, f"the play took {elapsed:.0f} s to notice and fail"
    assert job_processes(job) == [], "a training process was left behind"

    # Relaunch: resumes from the last checkpoint on node0 and completes.
    proc = launch(cluster, *args)
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "resumed from" in log and "/run/checkpoints/epoch_000" in log
    records = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["epoch"] == EPOCHS
    status = json.loads((REPO / "runs" / job / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 2
    digest = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert digest["world_size"] == 2 and len(set(digest["digests"])) == 1 and digest["identical"], digest
    assert f"epoch_{EPOCHS:04d}.pth" in checkpoints(node0, job)
    assert checkpoints(node1, job) == [] and checkpoints(cluster.nodes[2], job) == []
    assert f"Checkpoints: node0:/home/vctrain/vidcluster/jobs/{job}/run/checkpoints/" in proc.stdout
    assert (REPO / "runs" / job / "curves.png").stat().st_size > 0
    assert (REPO / "runs" / job / "logs" / "node1.log").exists()
    assert job_processes(job) == []

    status_proc = cluster.playbook("training-status.yml", "-e", f"job_id={job}")
    assert f"{job}: finished (exit status 0)" in status_proc.stdout


def test_three_nodes_with_two_workers_each_train_to_the_end(cluster: LocalCluster) -> None:
    job = f"{cluster.name}-3x2"
    # The interface comes from the gathered facts here (the local inventory names it; "" makes the role look).
    proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "ddp_config_cpu_workers=2",
                  "-e", "vidcluster_network_interface=", "-e", "master_port=auto")  # fmt: skip
    assert "6 process(es), gloo" in proc.stdout
    results = REPO / "runs" / job
    status = json.loads((results / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 6
    assert "world size 6 (3 node(s) x 2 worker(s)" in (results / "log.txt").read_text()
    digest = json.loads((results / "weights_digest.json").read_text())
    assert digest["world_size"] == 6 and len(set(digest["digests"])) == 1 and digest["identical"], digest
    assert [json.loads(line)["epoch"] for line in (results / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    node0, *others = cluster.nodes
    assert checkpoints(node0, job) and all(checkpoints(node, job) == [] for node in others)
    rendered = (results / "nodes" / "node2.yaml").read_text()
    assert "WORLD_RANK: 2" in rendered and "AUTO_RANK_MATCH: false" in rendered
    job_json = json.loads((job_dir(cluster.nodes[2], job) / "job.json").read_text())
    assert job_json["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert job_processes(job) == []

    stop = cluster.playbook("stop-training.yml", "-e", f"job_id={job}")
    assert "changed=0" in stop.stdout and "nothing to stop" in stop.stdout
