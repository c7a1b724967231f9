"""launch-training.yml, training-status.yml and stop-training.yml on a real 3-node local cluster whose nodes share one
home directory (like an NFS home on a real cluster), with real gloo training of a tiny I3D on synthetic H.264 videos.

The job belongs to its nodes: each node's supervisor (roles/ddp_launch/files/jobctl.py) watches its trainer and the
other nodes, so a dead or frozen trainer ends the job everywhere, naming the node that failed first, with or without
a controller; the controller only follows rank 0, and not hearing from it is not a failure.
  - errors before anything starts: an unknown config, a busy rendezvous port, a config the trainer rejects, nodes
    with different GPU counts;
  - a frozen trainer (SIGSTOP) while the launch follows: the play fails naming it with its log; a relaunch resumes;
  - a killed trainer with no controller watching (-e wait=false): every process ends within 2 minutes and
    training-status.yml names the node that failed first; stop-training.yml on a running job;
  - the controller cut off from the rank-0 node (its SSH fails or stalls) for longer than the grace period: following
    gives up without stopping anything, the job trains to the end, and a later launch reports it finished;
  - launching a running job again attaches to it and follows it to the end.
The shared home itself: setup-cluster.yml writes ~/.ssh once (rerun changed=0), stage-data.yml copies once, every
node keeps its own files in its own folder of the job.
Run: .venv/bin/python -m pytest tests/cluster/test_launch.py  (root; a few minutes on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import (
    REPO,
    VENV_BIN,
    LocalCluster,
    Node,
    changed_total,
    flat,
    job_processes,
    node_job_dir,
)

CONFIG = "i3d_cpu_test"  # reads ~/data/vidcluster-test on every node
# One home for all nodes, like NFS; sshd on port 2222, so known_hosts, the SSH check and the launch use [host]:2222.
CLUSTER_ARGS = ("-e", "shared_home=true", "-e", "ssh_port=2222")
TWO_NODES = ("--limit", "node0,node1")
# Short polls and a short watch for short runs; one thread per process: every node shares the same 2 cores.
LAUNCH_ARGS = (
    "-e", "ddp_launch_poll_seconds=2",
    "-e", "ddp_launch_omp_num_threads=1",
    "-e", "ddp_launch_heartbeat_timeout=10",
    "-e", "ddp_launch_stop_grace=5",
    "-e", "ddp_launch_follow_hours=0.25",
)  # fmt: skip
ENV = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "ANSIBLE_NOCOLOR": "1"}


def epochs(n: int) -> tuple[str, str]:
    return "-e", json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": n}}}})


def launch(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("launch-training.yml", *LAUNCH_ARGS, *args, check=check)


def launch_in_background(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory), "launch-training.yml", *LAUNCH_ARGS, *args],
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_dir(cluster: LocalCluster, job: str) -> Path:
    return cluster.nodes[0].home / "vidcluster" / "jobs" / job / "run"


def wait_for_epoch(cluster: LocalCluster, job: str, epoch: int, play: subprocess.Popen[str] | None = None) -> None:
    status = run_dir(cluster, job) / "status.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if json.loads(status.read_text()).get("epoch", 0) >= epoch:
                return
        except (OSError, ValueError):
            pass
        if play is not None and play.poll() is not None:
            pytest.fail(f"the play ended early:\n{play.communicate()[0][-4000:]}")
        time.sleep(0.3)
    pytest.fail(f"job {job} did not reach epoch {epoch}")


def trainer_pid(job: str, node: Node) -> int:
    """The trainer process (python -m trainer.train) of the node's part of the job."""
    for pid in job_processes(job):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        if b"trainer.train" in cmdline and f"/{job}/{node.name}\0".encode() in environ:
            return pid
    raise AssertionError(f"no trainer of {job} on {node.name}")


def wait_until_gone(job: str, seconds: float) -> float:
    started = time.monotonic()
    while job_processes(job) and time.monotonic() - started < seconds:
        time.sleep(0.5)
    assert job_processes(job) == [], f"processes of {job} still alive after {seconds} s"
    return time.monotonic() - started


def checkpoints_outside_run(cluster: LocalCluster, job: str) -> list[Path]:
    """Checkpoints anywhere in the job's folder but rank 0's run directory (there must be none)."""
    root = run_dir(cluster, job).parent
    return [p for p in root.rglob("*.pth") if run_dir(cluster, job) not in p.parents]


@contextlib.contextmanager
def controller_cut_off_from(node: Node) -> Iterator[None]:
    """This machine (the controller) cannot reach the node while inside: an 'unreachable' route in the root network
    namespace breaks the controller's SSH to it, open connections included. The nodes reach each other through
    their own namespaces and the bridge, so training traffic is not touched."""
    route = ["ip", "route", "add", "unreachable", f"{node.ip}/32"]
    subprocess.run(route, check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "route", "del", *route[3:]], check=True)


@pytest.fixture(scope="module")
def cluster(local_cluster: Callable[..., LocalCluster], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalCluster]:
    """3 nodes sharing one home, after setup-cluster.yml, with a small two-class video dataset staged once."""
    cluster = local_cluster(3, *CLUSTER_ARGS)
    first = cluster.playbook("setup-cluster.yml")
    assert "is shared by node0, node1, node2: node0 writes it for them" in flat(first.stdout)
    rerun = cluster.playbook("setup-cluster.yml")
    assert changed_total(rerun.stdout, ["localhost", *cluster.names]) == 0, rerun.stdout[-3000:]
    # One ~/.ssh for all: the key once in authorized_keys, one known_hosts block naming every node.
    ssh = cluster.nodes[0].home / ".ssh"
    pub = (cluster.state_dir / "cluster-key" / "cluster_key.pub").read_text().split()[1]
    assert (ssh / "authorized_keys").read_text().count(pub) == 1
    known = (ssh / "known_hosts").read_text()
    assert known.count("BEGIN VIDCLUSTER") == 1 and all(f"vidcluster-node:{n.name}" in known for n in cluster.nodes)
    assert f"[node1]:2222,[{cluster.nodes[1].ip}]:2222 ssh-ed25519 " in known
    # Plain OpenSSH between the nodes, on the non-default port, host keys verified.
    out = cluster.ssh(cluster.nodes[0], "ssh -o BatchMode=yes node2 hostname -I; ssh -o BatchMode=yes "
                      f"{cluster.nodes[1].ip} true && echo reached")
    assert cluster.nodes[2].ip in out.stdout and "reached" in out.stdout, out.stderr

    data = tmp_path_factory.mktemp("data") / "vidcluster-test"
    subprocess.run(
        [str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left", "right",
         "--train-per-class", "8", "--val-per-class", "4", "--size", "32", "--frames", "16"],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    stage = ("playbooks/stage-data.yml", "-e", f"src={data}", "-e", "dest=data/vidcluster-test")
    staged = cluster.playbook(*stage)
    assert "node0 writes it for them" in flat(staged.stdout)
    assert "[round 1/1] node0 <- controller: done" in staged.stdout  # one copy, for the one folder all nodes share
    assert changed_total(staged.stdout, ["node1", "node2"]) == 0  # the shared folder is written by node0 alone
    assert changed_total(cluster.playbook(*stage).stdout, ["localhost", *cluster.names]) == 0
    yield cluster
    cluster.playbook("stop-training.yml", check=False)


def test_errors_come_before_any_training_process(cluster: LocalCluster) -> None:
    node0, node1 = cluster.nodes[0], cluster.nodes[1]
    job = f"{cluster.name}-err"

    proc = launch(cluster, *TWO_NODES, "-e", "config=no_such_config", "-e", f"job_id={job}", check=False)
    assert proc.returncode != 0
    assert "Unknown experiment config 'no_such_config'" in flat(proc.stdout)
    assert "Available configs:" in proc.stdout and "i3d_cpu_test" in proc.stdout and "slowfast" in proc.stdout

    # A config the trainer rejects: its own message, naming the key.
    proc = launch(cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e",
                  json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"BATCH_SIZ": 4}}}}), check=False)
    assert proc.returncode != 0
    assert "The trainer rejects" in flat(proc.stdout)
    assert "CONFIG.TRAIN.BATCH_SIZ: unknown key; did you mean CONFIG.TRAIN.BATCH_SIZE?" in flat(proc.stdout)

    port = 29611
    blocker = subprocess.Popen(
        ["ip", "netns", "exec", node0.netns, str(VENV_BIN / "python"), "-c",
         "import socket, sys, time\n"
         f"s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert blocker.stdout is not None and blocker.stdout.readline().strip() == "ready"
        proc = launch(cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e",
                      f"master_port={port}", check=False)
    finally:
        blocker.kill()
        blocker.wait()
    assert proc.returncode != 0
    assert f"The rendezvous port {port} is already in use on node0" in flat(proc.stdout)
    assert "-e master_port=auto" in flat(proc.stdout)

    # Nodes that do not say how many GPUs they have are asked (nvidia-smi); different counts are refused. The fake
    # nvidia-smi (on every node's PATH: they share this machine's /usr/local/bin) shows 2 GPUs on node1 only.
    inventory = cluster.state_dir / "no-gpus.yml"
    inventory.write_text("".join(line for line in cluster.inventory.read_text().splitlines(keepends=True)
                                 if "gpus:" not in line))
    fake = Path("/usr/local/bin/nvidia-smi")
    assert not fake.exists(), "this machine has an nvidia-smi of its own"
    fake.write_text(f"#!/bin/sh\nip -4 -o addr show dev eth0 2>/dev/null | grep -q ' {node1.ip}/' || exit 127\n"
                    "echo 'GPU 0: Fake GPU (UUID: GPU-0)'; echo 'GPU 1: Fake GPU (UUID: GPU-1)'\n")
    fake.chmod(0o755)
    try:
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", *LAUNCH_ARGS,
             *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}"],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        fake.unlink()
    assert proc.returncode != 0
    assert "nodes have different numbers of GPUs (node0=0, node1=2)" in flat(proc.stdout), proc.stdout[-3000:]

    # None of these started anything: no process, no pid file on any node.
    assert job_processes(job) == []
    assert not any((node_job_dir(node, job) / "train.pid").exists() for node in cluster.nodes)


def test_frozen_trainer_fails_the_play_naming_it_then_relaunch_resumes(cluster: LocalCluster) -> None:
    node1 = cluster.nodes[1]
    job = f"{cluster.name}-frozen"
    args = (*TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}", *epochs(40))
    play = launch_in_background(cluster, *args)
    try:
        wait_for_epoch(cluster, job, 2, play)
        os.kill(trainer_pid(job, node1), signal.SIGSTOP)  # frozen, not dead: only its silence can tell
        frozen_at = time.monotonic()
        out, _ = play.communicate(timeout=240)
        elapsed = time.monotonic() - frozen_at
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode != 0, out[-4000:]
    assert "Training failed on node1: its trainer (pid " in flat(out), out[-4000:]
    assert "is frozen: no heartbeat for" in flat(out)
    assert "node0: stopped (node1 failed first" in flat(out)
    assert f"Last lines of node1's log (/home/vctrain/vidcluster/jobs/{job}/node1/train.log)" in flat(out)
    assert "jobctl: stopping the trainer: node1 failed" in flat(out)  # node1's log tail, shown in the failure
    assert elapsed < 120, f"{elapsed:.0f} s to end the job"
    assert job_processes(job) == [], "a training process was left behind"
    status = json.loads((run_dir(cluster, job) / "status.json").read_text())
    assert status["state"] == "failed" and status["first_failure"]["node"] == "node1"

    # Relaunch: resumes from the last checkpoint on rank 0 and trains to the end.
    proc = launch(cluster, *args)
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "resumed from" in log and f"/home/vctrain/vidcluster/jobs/{job}/run/checkpoints/epoch_00" in log
    records = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["epoch"] == 40
    digest = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert digest["world_size"] == 2 and len(set(digest["digests"])) == 1 and digest["identical"], digest
    assert (run_dir(cluster, job) / "checkpoints" / "epoch_0040.pth").exists()
    assert checkpoints_outside_run(cluster, job) == []
    assert f"Checkpoints: node0:/home/vctrain/vidcluster/jobs/{job}/run/checkpoints/" in flat(proc.stdout)
    # Each node kept its own files in its own folder of the shared home.
    for node in cluster.nodes[:2]:
        spec = json.loads((node_job_dir(node, job) / "job.json").read_text())
        assert spec["node"] == node.name and spec["rank"] == cluster.nodes.index(node)
        assert (node_job_dir(node, job) / "train.log").stat().st_size > 0
    assert (REPO / "runs" / job / "logs" / "node1.log").exists()

    # The same launch again: the job finished with this config, nothing is started or changed.
    again = launch(cluster, *args)
    assert "already finished with this config on every node: nothing to run" in flat(again.stdout)
    assert changed_total(again.stdout, ["node1"]) == 0


def test_killed_trainer_ends_the_job_without_a_controller(cluster: LocalCluster) -> None:
    job = f"{cluster.name}-alone"
    launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "wait=false", *epochs(200))
    wait_for_epoch(cluster, job, 1)
    running = cluster.playbook("training-status.yml", "-e", f"job_id={job}")
    assert flat(running.stdout).count(f"{job}: running (pid ") == 3, running.stdout[-3000:]
    assert "rank 0 running: epoch" in flat(running.stdout)

    os.kill(trainer_pid(job, cluster.nodes[2]), signal.SIGKILL)
    elapsed = wait_until_gone(job, 120)
    print(f"every process of the job ended {elapsed:.1f} s after the kill")
    status = cluster.playbook("training-status.yml", "-e", f"job_id={job}")
    assert (f"Job {job}: the first failure was on node2: its trainer was killed by signal 9 (SIGKILL)"
            in flat(status.stdout)), status.stdout[-3000:]
    assert f"{job}: stopped (node2 failed first: its trainer was killed by signal 9" in flat(status.stdout)
    # The reason is in every node's log and in rank 0's status file.
    for node in cluster.nodes[:2]:
        assert "node2 failed first: its trainer was killed by signal 9" in (node_job_dir(node, job) / "train.log"
                                                                            ).read_text()
    assert json.loads((run_dir(cluster, job) / "status.json").read_text())["first_failure"]["node"] == "node2"

    # stop-training.yml on a running job: every node's processes end, and the nodes say so.
    job = f"{cluster.name}-stop"
    launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "wait=false", *epochs(200))
    wait_for_epoch(cluster, job, 1)
    stop = cluster.playbook("stop-training.yml", "-e", f"job_id={job}")
    assert job_processes(job) == []
    assert flat(stop.stdout).count("stopped now") == 3
    assert changed_total(stop.stdout, cluster.names) == 3
    assert flat(cluster.playbook("stop-training.yml", "-e", f"job_id={job}").stdout).count("nothing to stop") == 3


def test_controller_losing_rank0_stops_nothing_and_a_later_launch_reports_it(cluster: LocalCluster) -> None:
    node0 = cluster.nodes[0]
    job = f"{cluster.name}-blink"
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", *epochs(60))
    play = launch_in_background(cluster, *args, "-e", "ddp_launch_follow_grace=8", "-e", "ddp_launch_ssh_retries=1",
                                "-e", "ddp_launch_poll_timeout=6")
    try:
        wait_for_epoch(cluster, job, 2, play)
        with controller_cut_off_from(node0):  # until following gave up and the job has trained to the end
            out, _ = play.communicate(timeout=180)
            wait_until_gone(job, 300)
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode == 0, out[-4000:]
    assert "no answer from node0 (rank 0) for" in flat(out) and "the job is not affected" in flat(out)
    assert "Lost contact with node0 (rank 0) for more than 8 s" in flat(out) and "nothing was stopped" in flat(out)
    assert "training-status.yml -e job_id=" in flat(out) and "-e follow=true" in flat(out)
    for node in cluster.nodes:  # it trained to the end; nothing was ever stopped
        assert not (node_job_dir(node, job) / "train.stopped").exists()
        assert json.loads((node_job_dir(node, job) / "train.exit").read_text())["rc"] == 0

    # A later launch of the same job reports it finished and collects its results; nothing runs again.
    again = launch(cluster, *args)
    assert f"Job {job} already finished with this config on every node: nothing to run" in flat(again.stdout)
    assert f"Job {job} finished; last epoch:" in flat(again.stdout)
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    assert [json.loads(line)["epoch"] for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()
            ][-1] == 60


def test_launching_a_running_job_again_attaches_to_it(cluster: LocalCluster) -> None:
    job = f"{cluster.name}-attach"
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", *epochs(30))
    launch(cluster, *args, "-e", "wait=false")
    wait_for_epoch(cluster, job, 1)
    again = launch(cluster, *args)
    assert f"Job {job} is running (rank 0 on node0): following it instead of starting it again" in flat(again.stdout)
    assert "Start the training process on the rank-0 node" not in again.stdout
    assert f"Job {job} finished; last epoch:" in flat(again.stdout)
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    for node in cluster.nodes:  # one run, started once, never stopped
        assert not (node_job_dir(node, job) / "train.stopped").exists()
        assert (node_job_dir(node, job) / "train.log").read_text().count("jobctl: starting ") == 1
