"""Jobs that heal themselves, on a real local cluster of 2 trainers and 1 spare with private homes and IPv6 cluster
addresses (gloo, the watch and the rendezvous all over IPv6), a 10 s heartbeat timeout:
  - an uninterrupted run (the reference: its final weights);
  - a trainer killed (SIGKILL) mid-run: the job restarts by itself, from the step the survivor held in memory (the
    killed node's new trainer receives it: no checkpoint read, no step trained twice), and ends with the reference's
    weights;
  - the rank-0 trainer frozen (SIGSTOP): caught within the heartbeat timeout, restarted from the survivor's memory;
  - restarts off (-e max_restarts=0): a kill ends the job, saying why;
  - a node lost for good (every process of its namespace killed): the spare takes its rank and the job ends with the
    reference's weights;
  In each restart, the surviving trainer goes on in place and the failed node's (or the spare's) starts in its
  standby (restart in place, the default).
  - the rank-0 node (the job's hub) lost: the nodes choose a new hub, the spare joins from the memory of the node
    left, the job finishes, and the controller follows the new hub;
  - SIGTERM to every supervisor (a preemption): every rank checkpoints at the same step, the job restarts and loses
    no step: it ends with the reference's weights;
  - every training video of one node unreadable from epoch 2 on: the trainer's exit status 2, no restart loop, one
    clear message naming the node.
Slow (a few minutes): the slow lane, `bash scripts/test.sh --slow` (.ci/run runs it after the main lane).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.conftest import (
    FAST_JOB_ARGS,
    REPO,
    VENV_BIN,
    LocalCluster,
    Node,
    finish,
    flat,
    job_processes,
    node_job_dir,
    playbook_env,
    signal_netns,
    stage_dataset,
    trainer_pid,
)
from trainer.runtime.job.record import JobRecord, Start

pytestmark = pytest.mark.slow

CONFIG = "i3d_cpu_test"
# Epochs of every job: the last fault comes at epoch 8, and no job can train past a fault before it is healed (each
# step waits for every rank), so the epochs after it are margin for the poll that sees epoch 8, not for the
# healing; each epoch more is about half a second of every whole job here (2 steps, a validation, a checkpoint).
EPOCHS = 14
LAUNCH_ARGS = (
    "-e", f"config={CONFIG}",
    *FAST_JOB_ARGS,
    "-e", "ddp_config_node_wait=30",
    "-e", json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": EPOCHS}}}}),
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster(local_cluster: Callable[..., LocalCluster], tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalCluster]:
    cluster = local_cluster(3, "-e", "spares=1", "-e", "ipv6=true")
    assert [n.cluster_ip.count(":") >= 2 for n in cluster.nodes] == [True] * 3  # IPv6 cluster addresses
    setup = cluster.playbook("setup-cluster.yml")
    assert "9 pairs probed among 3 nodes: 9 work" in flat(setup.stdout)  # the spare is checked like the trainers
    stage_dataset(cluster, tmp_path_factory.mktemp("data"))
    yield cluster
    cluster.playbook("stop-training.yml", check=False)


def launch(cluster: LocalCluster, job: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory), "launch-training.yml", *LAUNCH_ARGS,
         "-e", f"job_id={job}", *args],
        cwd=REPO, env=playbook_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def status_of(node: Node, job: str) -> dict:
    """The trainer's status.json in the node's own run directory (rank 0's, while the node has rank 0)."""
    try:
        return json.loads((node.home / "vidcluster" / "jobs" / job / "run" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for_epoch(node: Node, job: str, epoch: int, play: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 300
    while status_of(node, job).get("epoch", 0) < epoch:
        if play.poll() is not None:
            pytest.fail(f"the play ended early:\n{play.communicate()[0][-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{job} did not reach epoch {epoch}")
        time.sleep(0.3)


def record(node: Node, job: str) -> JobRecord:
    """The job's record as the node last held it (its state.json), read through the record's schema."""
    return JobRecord.read(json.loads((node_job_dir(node, job) / "state.json").read_text())["record"])


def restarted(job: str) -> dict[str, Any]:
    """What the restarted attempt's rank 0 recorded once it trained again (metrics.jsonl, collected from it): the
    step it resumed from, the steps lost; with the steps of an epoch."""
    lines = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    [attempt] = [line for line in lines if "attempt" in line]
    per_epoch = json.loads((REPO / "runs" / job / "status.json").read_text())["steps_per_epoch"]
    return {**attempt, "steps_per_epoch": per_epoch}


def came_back(rec: JobRecord) -> dict[str, Start]:
    """How each node's trainer came to the restarted attempt (restart in place: the survivors in place, the failed
    node's or the spare's in its standby), every phase of it on record."""
    nodes = rec.attempts[1].nodes
    assert nodes.keys() == rec.attempts[1].assignment.keys(), rec.attempts[1]
    assert all(None not in (t.imported, t.group, t.checkpoint, t.first_step) for t in nodes.values()), nodes
    return {node: timeline.start for node, timeline in nodes.items()}


def digest(job: str) -> str:
    found = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert found["identical"], found
    return found["digests"][0]


@pytest.fixture(scope="module")
def reference(cluster: LocalCluster) -> str:
    """The final weights of an uninterrupted run (same config, same seed)."""
    job = f"{cluster.name}-ref"
    out = finish(launch(cluster, job))
    assert f"Job {job} finished" in flat(out), out[-3000:]
    assert record(cluster.nodes[0], job).restarts == 0
    return digest(job)


def test_an_ipv6_cluster_trains_to_the_end(cluster: LocalCluster, reference: str) -> None:
    plan = json.loads((node_job_dir(cluster.nodes[1], f"{cluster.name}-ref") / "plan.json").read_text())
    rendered = (REPO / "runs" / f"{cluster.name}-ref" / "nodes" / "node1.yaml").read_text()
    assert f"DIST_URL: tcp://[{cluster.nodes[0].cluster_ip}]:" in rendered
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and len(reference) == 64


def test_a_killed_trainer_restarts_by_itself_and_ends_with_the_same_weights(cluster: LocalCluster,
                                                                             reference: str) -> None:
    node0, node1, _ = cluster.nodes
    job = f"{cluster.name}-kill"
    play = launch(cluster, job)
    wait_for_epoch(node0, job, 8, play)
    os.kill(trainer_pid(job, node1.name), signal.SIGKILL)
    out = finish(play)
    assert play.returncode == 0, out[-4000:]
    rec = record(node0, job)
    assert rec.restarts == 1 and rec.assignment == {"node0": 0, "node1": 1}  # the same nodes, same ranks
    assert came_back(rec) == {"node0": Start.IN_PLACE, "node1": Start.STANDBY}
    cause = rec.attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("node1", "killed") and cause.detect_s < 5
    assert f"{job}: restarting (attempt 2 of 4): node1 killed, detected in " in out  # the follow says so
    # Went on from the step node0 held in memory, which node1's new trainer received (no checkpoint read, nothing
    # trained twice: trainer.continuation.shared_memory), and the final weights are the uninterrupted run's (every
    # rank's randomness after a step depends on the run's history alone).
    attempt = restarted(job)
    assert attempt["resumed_from"] == "memory" and attempt["resumed_step"] >= 7 * attempt["steps_per_epoch"], attempt
    assert attempt["steps_lost"] == 0, attempt
    assert "resumed from" not in (REPO / "runs" / job / "log.txt").read_text()
    assert digest(job) == reference


def test_a_frozen_trainer_is_caught_within_the_heartbeat_timeout_and_restarted(cluster: LocalCluster,
                                                                              reference: str) -> None:
    node0 = cluster.nodes[0]
    job = f"{cluster.name}-frozen"
    play = launch(cluster, job)
    wait_for_epoch(node0, job, 5, play)
    os.kill(trainer_pid(job, node0.name), signal.SIGSTOP)  # frozen, not dead: only its silence can tell
    out = finish(play)
    assert play.returncode == 0, out[-4000:]
    cause = record(node0, job).attempts[1].cause
    assert cause is not None and (cause.node, cause.kind) == ("node0", "frozen")
    assert cause.detect_s <= 10 + 5  # detected within the heartbeat timeout (+ 5 s)
    assert came_back(record(node0, job)) == {"node0": Start.STANDBY, "node1": Start.IN_PLACE}
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    # Rank 0's new trainer received node1's memory: its parameters go on as the uninterrupted run's, its BatchNorm
    # running statistics of the epoch are node1's (the frozen rank's went with it), so the digest need not be the
    # reference's; every rank ends with the same weights (digest checks it).
    assert restarted(job)["resumed_from"] == "memory"
    assert len(digest(job)) == 64


def test_with_restarts_off_a_kill_ends_the_job_saying_why(cluster: LocalCluster) -> None:
    node0, node1, _ = cluster.nodes
    job = f"{cluster.name}-norestart"
    play = launch(cluster, job, "-e", "max_restarts=0")
    wait_for_epoch(node0, job, 3, play)
    os.kill(trainer_pid(job, node1.name), signal.SIGKILL)
    out = finish(play)
    assert play.returncode != 0, out[-4000:]
    assert "node1 failed first: its trainer was killed by signal 9 (SIGKILL); restarts are off (max_restarts 0)" in (
        flat(out)), out[-4000:]
    ended = record(node0, job)
    assert ended.restarts == 0 and job_processes(job) == [], [(a.attempt, a.cause) for a in ended.attempts]


def repair(cluster: LocalCluster) -> None:
    """Bring the local cluster's nodes back (their sshd) after a test killed a whole node."""
    cluster.create(len(cluster.nodes), "-e", "spares=1", "-e", "ipv6=true")


def lose_node(cluster: LocalCluster, job: str, lost: Node) -> tuple[subprocess.Popen[str], str]:
    """Launch ``job``, then kill every process of ``lost``'s namespace mid-run (its sshd, its supervisor, its trainer:
    the machine is gone); the play and its output once the job ended. The node is brought back afterwards."""
    play = launch(cluster, job)
    try:
        wait_for_epoch(cluster.nodes[0], job, 5, play)
        signal_netns(lost.netns, signal.SIGKILL)
        return play, finish(play, timeout=600)
    finally:
        repair(cluster)


def test_a_node_lost_for_good_is_replaced_by_the_spare(cluster: LocalCluster, reference: str) -> None:
    node0, node1, _ = cluster.nodes
    job = f"{cluster.name}-lost"
    play, out = lose_node(cluster, job, node1)
    assert play.returncode == 0, out[-4000:]
    rec = record(node0, job)
    assert rec.assignment == {"node0": 0, "node2": 1} and "node1" in rec.lost  # the spare took rank 1
    assert rec.cause is not None and rec.cause.node == "node1"
    assert came_back(rec) == {"node0": Start.IN_PLACE, "node2": Start.STANDBY}
    assert "node2 replaces node1" in (node_job_dir(node0, job) / "train.log").read_text()
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    assert digest(job) == reference


def test_the_rank0_node_lost_the_job_goes_on_with_a_new_hub(cluster: LocalCluster) -> None:
    node0, node1, node2 = cluster.nodes
    job = f"{cluster.name}-root"
    play, out = lose_node(cluster, job, node0)
    assert play.returncode == 0, out[-4000:]
    rec = record(node1, job)
    assert rec.hub == "node1" and rec.term >= 1 and "node0" in rec.lost
    assert rec.assignment == {"node1": 0, "node2": 1}  # the node with the second copy is rank 0 now
    assert "this node is the job's hub now" in (node_job_dir(node1, job) / "train.log").read_text()
    assert f"{job}: no answer from node0 (the job's hub)" in flat(out)  # the controller found the new hub
    assert "Job " + job + " finished" in flat(out), out[-6000:]
    assert status_of(node1, job)["state"] == "finished"
    # It went on from the step node1, now rank 0, held in memory (node0 was lost after epoch 5), which the spare
    # received: no checkpoint read.
    attempt = restarted(job)
    assert attempt["resumed_from"] == "memory" and attempt["resumed_step"] >= 5 * attempt["steps_per_epoch"], attempt
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "resumed from" not in log and "rank 1 joined at step" in (node_job_dir(node2, job) / "train.log").read_text()


def supervisor_pid(node: Node, job: str) -> int:
    return int(json.loads((node_job_dir(node, job) / "state.json").read_text())["pid"])


def test_sigterm_to_every_supervisor_checkpoints_at_a_common_step_and_loses_no_step(cluster: LocalCluster,
                                                                                  reference: str) -> None:
    node0, node1, _ = cluster.nodes
    job = f"{cluster.name}-preempt"
    play = launch(cluster, job)
    wait_for_epoch(node0, job, 6, play)
    for node in (node0, node1):  # what a scheduler or a cloud's spot notice sends
        os.kill(supervisor_pid(node, job), signal.SIGTERM)
    out = finish(play)
    assert play.returncode == 0, out[-4000:]
    rec = record(node0, job)
    cause = rec.attempts[1].cause
    assert cause is not None and cause.kind == "preempted" and rec.restarts == 1
    restarted = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()
                 if '"attempt"' in line]
    assert restarted and restarted[0]["attempt"] == 1 and restarted[0]["steps_lost"] == 0, restarted
    for node in (node0, node1):  # the trainers stopped with the checkpoint's status, 75
        assert "the trainer exited with status 75" in (node_job_dir(node, job) / "train.log").read_text()
    assert digest(job) == reference  # the restart lost no step and replayed nothing differently


def test_a_data_error_at_epoch_2_ends_the_job_in_one_message_without_a_restart(cluster: LocalCluster) -> None:
    node0, node1, _ = cluster.nodes
    job = f"{cluster.name}-baddata"
    data = node1.home / "data" / "vidcluster-test"
    saved = data.with_name("vidcluster-test-saved")
    play = launch(cluster, job)
    bad = data.with_name("vidcluster-test-garbage")  # the same lists, every training video garbage
    for video in (data / "train").rglob("*.mp4"):
        garbage = bad / video.relative_to(data)
        garbage.parent.mkdir(parents=True, exist_ok=True)
        garbage.write_bytes(b"not a video" * 100)
    for listed in data.glob("*.txt"):
        (bad / listed.name).write_bytes(listed.read_bytes())
    try:
        wait_for_epoch(node0, job, 1, play)
        data.rename(saved)  # every training video of node1, from now on, is garbage: swapped in at once, so the
        bad.rename(data)  # trainer never finds its lists or folder missing (a crash, which a restart would follow)
        out = finish(play)
    finally:
        if saved.exists():
            shutil.rmtree(data, ignore_errors=True)
            saved.rename(data)
        shutil.rmtree(bad, ignore_errors=True)
    assert play.returncode != 0, out[-4000:]
    assert "The job failed: node1 failed first: its trainer rejected its input (exit status 2" in flat(out), (
        out[-4000:])
    assert "a restart cannot fix a bad input" in flat(out) and "error: " in out  # the trainer's own line, shown
    ended = record(node0, job)
    assert ended.restarts == 0 and job_processes(job) == [], [(a.attempt, a.cause) for a in ended.attempts]
