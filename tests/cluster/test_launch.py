"""launch-training.yml, training-status.yml and stop-training.yml on a real 3-node local cluster whose nodes share one
home directory (like an NFS home on a real cluster), with real gloo training of a tiny I3D on synthetic H.264 videos.

The job belongs to its nodes: every node's supervisor (trainer/runtime) runs its trainer as the job's hub says, and
only the job's nodes are heard (every message is sealed with the launch's secret); the controller only follows the
hub, and not hearing from it is not a failure.
  - errors before anything starts: an unknown config, a busy rendezvous port, a config the trainer rejects, nodes
    with different GPU counts, COMPILE on nodes without a compiler, the rank-0 node's ports closed by a firewall
    (the launch's short collective names it); job ids that could name another folder, refused by every playbook
    before any node is touched; a login as root, refused on the node;
  - forged failure reports, a forged stop, thousands of connections and a 100 MB line from a host on the cluster
    network that is not a node of the job: ignored, logged once, the supervisor's memory bounded, the job trains to
    the end; its results are collected where the config's LOG keys put them, and following it prints a line per
    change of progress, not per poll;
  - the controller cut off from the hub's node for longer than the grace period: following gives up
    without stopping anything, the job trains to the end, and a later launch reports it finished;
  - launching a running job again attaches to it; stop-training.yml stops a running job on every node;
  - a node lost with no spare (vidcluster_min_nodes=2): the job goes on with the other two from their memory; a
    node that hangs, then answers again, rejoins the running job from a peer's memory; a node whose machine was lost
    (its supervisor gone) rejoins when the launch is run again.
The shared home itself: setup-cluster.yml writes ~/.ssh once (rerun changed=0), stage-data.yml copies once, every
node keeps its own files in its own folder of the job.
The whole module is the slow lane (`bash scripts/test.sh --slow`, about 12 minutes on 2 cores with test_resilience.py
beside it); the main lane launches in private homes (test_launch_private_homes.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
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
    closed_ports,
    cpu_quota,
    finish,
    flat,
    job_processes,
    node_job_dir,
    output_until,
    playbook_env,
    signal_netns,
    stage_dataset,
)
from trainer.runtime import report
from trainer.runtime.job.record import JobRecord, Kind, Start

CONFIG = "i3d_cpu_test"  # reads ~/data/vidcluster-test on every node
# One home for all nodes, like NFS; sshd on port 2222, so known_hosts, the SSH check and the launch use [host]:2222.
CLUSTER_ARGS = ("-e", "shared_home=true", "-e", "ssh_port=2222")
TWO_NODES = ("--limit", "node0,node1")
# Short polls and a short watch for short runs; one thread per process: every node shares the same 2 cores.
LAUNCH_ARGS = (
    "-e", "ddp_launch_poll_seconds=2",
    "-e", "ddp_config_omp_num_threads=1",
    "-e", "ddp_config_heartbeat_timeout=10",
    "-e", "ddp_config_stop_grace=5",
    "-e", "ddp_launch_follow_hours=0.25",
)  # fmt: skip
# Minutes of whole jobs on a cluster of its own: the slow lane, where its cluster is built once for every scenario.
pytestmark = pytest.mark.slow

PLAYBOOKS = ("launch-training.yml", "stop-training.yml", "training-status.yml", "setup-cluster.yml",
             "playbooks/stage-data.yml")  # fmt: skip


def training(n: int, **log: str) -> tuple[str, str]:
    return "-e", json.dumps({"ddp_config_overrides": {"CONFIG": {"TRAIN": {"EPOCH_NUM": n}, "LOG": log}}})


def launch(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.playbook("launch-training.yml", *LAUNCH_ARGS, *args, check=check)


def launch_in_background(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    return cluster.playbook_in_background("launch-training.yml", *LAUNCH_ARGS, *args)


def run_dir(cluster: LocalCluster, job: str) -> Path:
    return cluster.nodes[0].home / "vidcluster" / "jobs" / job / "run"


def wait_for_epoch(cluster: LocalCluster, job: str, epoch: int, play: subprocess.Popen[str] | None = None) -> None:
    status = run_dir(cluster, job) / "status.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(status.read_text()).get("epoch", 0) >= epoch:
                return
        if play is not None and play.poll() is not None:
            pytest.fail(f"the play ended early:\n{play.communicate()[0][-4000:]}")
        time.sleep(0.3)
    pytest.fail(f"job {job} did not reach epoch {epoch}")


def wait_until_gone(job: str, seconds: float) -> float:
    started = time.monotonic()
    while job_processes(job) and time.monotonic() - started < seconds:
        time.sleep(0.5)
    assert job_processes(job) == [], f"processes of {job} still alive after {seconds} s"
    return time.monotonic() - started


def node_state(node: Node, job: str) -> dict:
    return json.loads((node_job_dir(node, job) / "state.json").read_text())


def rss_kib(pid: int) -> int | None:
    """The process's resident memory, or None once it has ended."""
    try:
        found = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None
    return int(found[1]) if found else None


def peak_rss_kib(pid: int, during: subprocess.Popen[str], timeout: float = 240) -> tuple[int, int]:
    """(the largest resident memory of ``pid`` seen while ``during`` runs, samples taken while ``pid`` was alive);
    ``during`` is killed after ``timeout`` seconds."""
    peak, samples, deadline = 0, 0, time.monotonic() + timeout
    while during.poll() is None:
        if time.monotonic() > deadline:
            during.kill()
        rss = rss_kib(pid)
        if rss is not None:
            peak, samples = max(peak, rss), samples + 1
        time.sleep(0.1)
    return peak, samples


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
    # One ~/.ssh for all: the key once in authorized_keys (restricted to the cluster's addresses, no forwarding,
    # no pty), one known_hosts block naming every node.
    ssh = cluster.nodes[0].home / ".ssh"
    pub = (cluster.state_dir / "cluster-key" / "cluster_key.pub").read_text().split()[1]
    entry = next(line for line in (ssh / "authorized_keys").read_text().splitlines() if pub in line)
    assert entry.startswith('restrict,from="') and (ssh / "authorized_keys").read_text().count(pub) == 1
    known = (ssh / "known_hosts").read_text()
    assert known.count("BEGIN VIDCLUSTER") == 1 and all(f"vidcluster-node:{n.name}" in known for n in cluster.nodes)
    assert f"[node1]:2222,[{cluster.nodes[1].ip}]:2222 ssh-ed25519 " in known
    # Plain OpenSSH between the nodes, on the non-default port, host keys verified.
    out = cluster.ssh(cluster.nodes[0], "ssh -o BatchMode=yes node2 hostname -I; ssh -o BatchMode=yes "
                      f"{cluster.nodes[1].ip} true && echo reached")
    assert cluster.nodes[2].ip in out.stdout and "reached" in out.stdout, out.stderr

    folder = tmp_path_factory.mktemp("data")
    staged = stage_dataset(cluster, folder)
    assert "node0 writes it for them" in flat(staged.stdout)
    assert "[round 1/1] node0 <- controller: done" in staged.stdout  # one copy, for the one folder all nodes share
    assert changed_total(staged.stdout, ["node1", "node2"]) == 0  # the shared folder is written by node0 alone
    again = cluster.playbook("playbooks/stage-data.yml", "-e", f"src={folder / 'vidcluster-test'}",
                             "-e", "dest=data/vidcluster-test")
    assert changed_total(again.stdout, ["localhost", *cluster.names]) == 0
    yield cluster
    cluster.playbook("stop-training.yml", check=False)


def test_a_rank0_node_whose_ports_are_closed_stops_the_launch_before_any_trainer_starts(cluster: LocalCluster) -> None:
    node0 = cluster.nodes[0]
    job = f"{cluster.name}-closed"
    # The nodes' own firewall: new connections into node0 are dropped, SSH's excepted.
    with closed_ports(node0, cluster.ssh_port):
        proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", check=False)
    assert proc.returncode != 0
    out = flat(proc.stdout)
    found = re.search(rf"no node can reach node0's rendezvous {re.escape(node0.ip)}:(\d+) \(timed out\): a firewall "
                      r"on node0 closing port \1", out)
    assert found, proc.stdout[-3000:]
    # Within the short check's 30 s, before any trainer or supervisor started anywhere.
    check = proc.stdout.split("TASK [cluster_collective : Start the collective check", 1)[1]
    assert "TASK [ddp_launch : Start the supervisor" not in check
    assert job_processes(job) == []
    assert not any((node_job_dir(node, job) / "state.json").exists() for node in cluster.nodes)


def test_compile_on_nodes_without_a_compiler_is_refused_before_any_trainer_starts(cluster: LocalCluster) -> None:
    job = f"{cluster.name}-compile"
    no_compiler = {"ddp_config_extra_env": {"CXX": "/opt/no-such-compiler/g++"},
                   "ddp_config_overrides": {"CONFIG": {"TRAIN": {"COMPILE": True}}}}
    proc = launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", json.dumps(no_compiler),
                  check=False)
    assert proc.returncode != 0
    assert ("node1 cannot run i3d_cpu_test.yaml: CONFIG.TRAIN.COMPILE: torch.compile needs a C++ compiler for "
            "Inductor's CPU kernels (g++, or $CXX), and this node has none") in flat(proc.stdout), proc.stdout[-3000:]
    # Refused before the launch waited for its collective (which ends by itself within its timeout).
    assert "TASK [cluster_collective : Wait for the check" not in proc.stdout and job_processes(job) == []


def test_errors_come_before_any_training_process(cluster: LocalCluster, tmp_path: Path) -> None:
    node0, node1 = cluster.nodes[0], cluster.nodes[1]
    job = f"{cluster.name}-err"

    # Job ids that could name another folder or break a command line: every playbook refuses them on the controller,
    # before it connects to any node.
    for bad in ("../../x", "a;b", "a\nb"):
        for playbook in PLAYBOOKS:
            proc = cluster.playbook(playbook, "-e", json.dumps({"job_id": bad, "config": CONFIG}), check=False)
            assert proc.returncode != 0, (playbook, bad)
            assert f"job id {bad!r} (-e job_id) names a folder on every node" in flat(proc.stdout), proc.stdout[-2000:]
            assert "Ask each node which user" not in proc.stdout, (playbook, bad)  # no node was touched

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

    # Nodes that do not say how many GPUs they have are asked (nvidia-smi); different counts are refused. A fake
    # nvidia-smi, first on the nodes' PATH and bound over any of this machine's own in the two nodes' mount namespaces
    # only, shows 2 GPUs on node1 and none on node0.
    inventory = cluster.state_dir / "no-gpus.yml"
    inventory.write_text("".join(line for line in cluster.inventory.read_text().splitlines(keepends=True)
                                 if "gpus:" not in line))
    fake, script = Path("/usr/local/bin/nvidia-smi"), cluster.state_dir / "fake-nvidia-smi"
    script.write_text(f"#!/bin/sh\nip -4 -o addr show dev eth0 2>/dev/null | grep -q ' {node1.ip}/' || exit 127\n"
                      "echo '0, Fake GPU, 580.65.06, 81920 MiB'; echo '1, Fake GPU, 580.65.06, 81920 MiB'\n")
    script.chmod(0o755)
    placeholder = not fake.exists()  # then the fake itself, exiting 127 (no nvidia-smi) in every other namespace
    if placeholder:
        fake.write_bytes(script.read_bytes())
        fake.chmod(0o755)
    in_nodes = [["nsenter", "-t", str(node.sshd_pid), "-m", *cmd] for node in (node0, node1)
                for cmd in (["mount", "--bind", str(script), str(fake)], ["umount", str(fake)])]
    for mount in in_nodes[::2]:
        subprocess.run(mount, check=True)
    try:
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "launch-training.yml", *LAUNCH_ARGS,
             *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}"],
            cwd=REPO, env=playbook_env(), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        for umount in in_nodes[1::2]:
            subprocess.run(umount, check=True)
        if placeholder:
            fake.unlink()
    assert proc.returncode != 0
    assert "nodes have different numbers of GPUs (node0=0, node1=2)" in flat(proc.stdout), proc.stdout[-3000:]

    # None of these started anything: no process, no supervisor's state on any node.
    assert job_processes(job) == []
    assert not any((node_job_dir(node, job) / "state.json").exists() for node in cluster.nodes)


def test_a_login_as_root_is_refused_on_the_node(cluster: LocalCluster, tmp_path: Path) -> None:
    """`-u root` passes the inventory's rule when the inventory names no ansible_user; the check on the node does
    not let it through. node2's sshd lets root in for this test only (a key in a /root of its own)."""
    node2 = cluster.nodes[2]
    config = node2.dir / "ssh" / "sshd_config"
    original = config.read_text()
    sshd = node2.sshd_pid
    pub = cluster.key.with_suffix(".pub").read_text()
    enter = ["nsenter", "--target", str(sshd), "--mount", "sh", "-c"]
    subprocess.run([*enter, 'mount -t tmpfs -o mode=700 tmpfs /root && mkdir -m 700 /root/.ssh && printf %s "$KEY" '
                    "> /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys"],
                   env={**os.environ, "KEY": pub}, check=True)  # fmt: skip
    config.write_text(original.replace("PermitRootLogin no", "PermitRootLogin prohibit-password")
                      .replace("AllowUsers vctrain", "AllowUsers vctrain root"))
    os.kill(sshd, 1)  # sshd re-reads its config
    try:
        time.sleep(1)
        rootless = tmp_path / "inventory.yml"
        rootless.write_text(re.sub(r"(?m)^\s+ansible_user: .*\n", "", cluster.inventory.read_text()))
        proc = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(rootless), "training-status.yml", "-u", "root", "--limit",
             "node2"], cwd=REPO, env={**playbook_env(), "USER": "vctrain"}, capture_output=True, text=True, timeout=300,
            check=False)  # fmt: skip
    finally:
        config.write_text(original)
        os.kill(sshd, 1)
        subprocess.run([*enter, "umount /root"], check=True)
    assert proc.returncode != 0
    assert "node2: this connection logs in as root (-u root, remote_user or ansible_user)" in flat(proc.stdout), (
        proc.stdout[-3000:])
    assert "Show the jobs' state" not in proc.stdout


def test_only_the_jobs_nodes_are_heard_and_the_follow_prints_per_change(cluster: LocalCluster) -> None:
    """A host on the cluster network that is not a node of the job (node2, outside this 2-node job) forges failure
    reports and a stop, opens thousands of connections and sends a 100 MB line: ignored, logged once, the hub's memory
    bounded; the job trains to the end. Its results are where LOG.LOG_FILENAME and LOG.SAVE_DIR say."""
    node0, node1, node2 = cluster.nodes
    job = f"{cluster.name}-forged"
    epochs = 50
    play = launch_in_background(cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}",
                                *training(epochs, LOG_FILENAME="train-log.txt", SAVE_DIR="ckpts"))
    try:
        wait_for_epoch(cluster, job, 2, play)
        hub, member = node_state(node0, job), node_state(node1, job)
        assert hub["mode"] == "hub" and member["mode"] == "member"
        before = rss_kib(hub["pid"])
        attack = subprocess.Popen(
            ["ip", "netns", "exec", node2.netns, "/usr/bin/python3", str(Path(__file__).with_name("forge.py")),
             hub["addr"], member["addr"]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        after, samples = peak_rss_kib(hub["pid"], attack)  # the job may end soon after the attack: watch it throughout
        stdout, stderr = attack.communicate()
        assert attack.returncode == 0, stderr
        sent = json.loads(stdout)
        # thousands reached the hub (a loaded machine's backlog may turn some of the 3,000 away first)
        assert sent["attempted"] == 3000 and sent["connections"] >= 1000 and sent["line_mib"] == 100, sent
        out, _ = play.communicate(timeout=400)
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode == 0, out[-4000:]
    assert before is not None and samples >= 10, (before, samples)
    assert (after - before) < 20 * 1024, f"the hub grew from {before} to {after} KiB"
    log = (node_job_dir(node0, job) / "train.log").read_text()
    # (counted anywhere in a line: a trainer's progress bar may have left its line open when the supervisor wrote)
    refused = log.count(f"supervisor: refused a connection from {node2.ip}:")
    assert refused == 1, (sent["said"], [line for line in log.splitlines() if "supervisor: " in line])  # logged once
    assert "supervisor: attempt 1" not in log and "failed first" not in log  # nothing was believed
    assert sent["line_mib_taken"] < 100  # the hub hung up on the long line long before its end
    member_log = (node_job_dir(node1, job) / "train.log").read_text()
    assert member_log.count(f"supervisor: refused a connection from {node2.ip}") == 1  # a member's listener too
    records = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if "epoch" in r][-1] == epochs
    # The config's LOG keys decide what is collected and where the checkpoints are.
    assert (REPO / "runs" / job / "train-log.txt").stat().st_size > 0
    assert not (REPO / "runs" / job / "log.txt").exists()
    assert (f"Checkpoints: node0:/home/vctrain/vidcluster/jobs/{job}/run/ckpts/ (best.pth, epoch_0049.pth, "
            f"epoch_0050.pth)") in flat(out)
    # Following printed a line per change of progress, not per poll: O(epochs), and the job's own words.
    follow = [line for line in out.splitlines() if line.startswith(f"{job}: ")]
    assert 3 <= len(follow) <= epochs + 5, follow
    assert any(f"epoch {epochs}/{epochs} done" in line and "val_top1" in line for line in follow)
    assert "included:" not in out.split("TASK [ddp_launch : Follow the job from its hub until it ends]")[1].split(
        "TASK [")[0]
    # Each node kept its own files in its own folder of the shared home.
    for node in (node0, node1):
        plan = json.loads((node_job_dir(node, job) / "plan.json").read_text())
        assert plan["node"] == node.name and plan["paths"]["job_dir"].endswith(f"/{job}/{node.name}")
        assert oct((node_job_dir(node, job) / "secret").stat().st_mode & 0o777) == "0o600"
    assert (REPO / "runs" / job / "logs" / "node1.log").exists()
    assert job_processes(job) == []

    # The same launch again: the job finished with this config, nothing is started or changed anywhere.
    again = launch(cluster, *TWO_NODES, "-e", f"config={CONFIG}", "-e", f"job_id={job}",
                   *training(epochs, LOG_FILENAME="train-log.txt", SAVE_DIR="ckpts"))
    assert "already finished with this config on every node: nothing to run" in flat(again.stdout)
    assert changed_total(again.stdout, ["node0", "node1"]) == 0


def test_a_launch_prints_what_matters_in_at_most_150_lines(cluster: LocalCluster) -> None:
    """The demo's launch step, as a user sees it (ansible.cfg's output): 2 nodes, 8 epochs, from the start of the
    playbook to the result."""
    job = f"{cluster.name}-lines"
    env = {key: value for key, value in playbook_env().items() if key != "ANSIBLE_STDOUT_CALLBACK"}
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(cluster.inventory), "launch-training.yml", *TWO_NODES,
         "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "ddp_config_omp_num_threads=1",
         "-e", "ddp_launch_poll_seconds=5", *training(8)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    lines = proc.stdout.splitlines()
    assert len(lines) <= 150, f"{len(lines)} lines:\n{proc.stdout}"
    out = flat(proc.stdout)
    assert f"Job {job} started: 2 node(s) (node0, node1), 2 process(es), gloo" in out  # where the job runs
    # A progress line as the epochs pass (which ones depends on where the 5 s polls fall: the last epoch's "8/8 done"
    # lasts as long as the final checkpoint, which a loaded machine's poll may not see), then the result.
    assert re.search(rf"{job}: running: epoch [1-8]/8 done", out) and f"Job {job} finished; last epoch:" in out, out
    assert "skipping: [" not in proc.stdout and "included: " not in proc.stdout
    # The hub's supervisor left as soon as every member had the end, not a heartbeat timeout (60 s) later.
    ended = re.search(r"^supervisor: the job finished: .* at (\S+ \S+)$",
                      (node_job_dir(cluster.nodes[0], job) / "train.log").read_text(), re.M)
    assert ended is not None
    left = node_state(cluster.nodes[0], job)["updated"] - time.mktime(time.strptime(ended[1], "%Y-%m-%d %H:%M:%S"))
    assert left < 20, f"the hub's supervisor left {left:.0f} s after the end"


def test_controller_losing_the_hub_stops_nothing_and_a_later_launch_reports_it(cluster: LocalCluster) -> None:
    node0 = cluster.nodes[0]
    job = f"{cluster.name}-blink"
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", *training(60))
    play = launch_in_background(cluster, *args, "-e", "ddp_launch_follow_grace=8",
                                "-e", "ddp_launch_recheck_seconds=600")
    try:
        wait_for_epoch(cluster, job, 2, play)
        with controller_cut_off_from(node0):  # until following gave up and the job has trained to the end
            out, _ = play.communicate(timeout=180)
            wait_until_gone(job, 300)
    finally:
        if play.poll() is None:
            play.kill()
    assert play.returncode == 0, out[-4000:]
    assert f"{job}: no answer from node0 (the job's hub) since" in flat(out) and "the job is not affected" in flat(out)
    assert f"{job}: lost contact with node0 (the job's hub) for more than 8 s" in flat(out)
    assert "nothing was stopped" in flat(out) and f"training-status.yml -e job_id={job} -e follow=true" in flat(out)
    for node in cluster.nodes:  # it trained to the end; nothing was ever stopped
        state = node_state(node, job)
        assert state["end"]["state"] == "finished" and JobRecord.read(state["record"]).restarts == 0, state["end"]

    # A later launch of the same job reports it finished and collects its results; nothing runs again.
    again = launch(cluster, *args)
    assert f"Job {job} already finished with this config on every node: nothing to run" in flat(again.stdout)
    assert f"Job {job} finished; last epoch:" in flat(again.stdout)
    assert json.loads((REPO / "runs" / job / "status.json").read_text())["state"] == "finished"
    assert [json.loads(line)["epoch"] for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()
            ][-1] == 60


def task_results(stdout: str, task: str) -> list[str]:
    """The per-host result lines Ansible's default output printed under a task's banner, sorted (none when the task
    was not reached)."""
    banner = f"TASK [{task}]"
    if banner not in stdout:
        return []
    block = stdout.split(banner, 1)[1].split("\nTASK [", 1)[0].split("\nPLAY RECAP", 1)[0]
    return sorted(line for line in block.splitlines() if re.match(r"^(ok|changed|skipping|failed|fatal): ", line))


def test_launching_a_running_job_again_attaches_to_it_and_stop_stops_it(cluster: LocalCluster) -> None:
    job = f"{cluster.name}-attach"
    # A 30 s heartbeat timeout: a step may stall 15 s before it is hung (trainer/runtime/job/timing.py), not 10.
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", *training(40), "-e", "ddp_config_heartbeat_timeout=30")
    launch(cluster, *args, "-e", "wait=false")
    wait_for_epoch(cluster, job, 1)
    # Every node slowed to a crawl until the second launch has looked, so the job is still running then however idle
    # the machine (the tiny model trains an epoch in under half a second: 30 epochs once ended first); all alike, so
    # no node is a straggler. Not below 30% of a CPU: the second launch's own tasks run on the nodes too, within the
    # same share, and at 15% on a slow day they held a trainer's step past the 10 s it then had before it was hung.
    with contextlib.ExitStack() as slowed:
        for node in cluster.nodes:
            slowed.enter_context(cpu_quota(node, 0.3))
        play = launch_in_background(cluster, *args)
        seen = output_until(play, "following it instead of starting it again")
    again = seen + finish(play)
    assert f"Job {job} is running (its hub on node0): following it instead of starting it again" in flat(again)
    for task in ("Start the supervisor of the job's hub (the rank-0 node) first",
                 "Start every other member's supervisor, reporting to the hub"):  # neither ran on any node
        assert all(line.startswith("skipping: ") for line in task_results(again, f"ddp_launch : {task}"))
    assert f"Job {job} finished; last epoch:" in flat(again)
    for node in cluster.nodes:  # one run, started once, never stopped
        log = (node_job_dir(node, job) / "train.log").read_text()
        assert log.count("supervisor: supervising ") == 1 and "stopping the trainer" not in log

    # stop-training.yml on a running job: every node's processes end, and the nodes say so; the status says why.
    job = f"{cluster.name}-stop"
    launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "wait=false", *training(200))
    wait_for_epoch(cluster, job, 1)
    running = cluster.playbook("training-status.yml", "-e", f"job_id={job}")
    assert flat(running.stdout).count(f"{job} on node") == 3 and "trainer running (attempt 0" in flat(running.stdout)
    assert f"Job {job} is running; its hub is on node0" in flat(running.stdout)
    stop = cluster.playbook("stop-training.yml", "-e", f"job_id={job}")
    assert job_processes(job) == []
    assert flat(stop.stdout).count("stopped now") == 3
    assert changed_total(stop.stdout, cluster.names) == 3
    assert flat(cluster.playbook("stop-training.yml", "-e", f"job_id={job}").stdout).count("nothing to stop") == 3
    status = cluster.playbook("training-status.yml", "-e", f"job_id={job}")
    assert "The job stopped:" in flat(status.stdout), status.stdout[-3000:]


@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_a_tiny_videomae_trains_on_two_nodes_and_a_relaunch_resumes_it_exactly(cluster: LocalCluster,
                                                                               sharding: str) -> None:
    # transformers' VideoMAE (on the nodes from requirements-node.txt), made tiny by MODEL.HF_CONFIG, on two nodes,
    # with DDP or sharded by FSDP2 (its checkpoint folders in the one home the nodes share); a Step schedule, so one
    # epoch and then a relaunch to two is the two-epoch run, tensor for tensor.
    def videomae(epochs: int) -> tuple[str, str]:
        return "-e", json.dumps({"ddp_config_overrides": {"DDP_CONFIG": {"SHARDING": sharding}, "CONFIG": {
            "TRAIN": {"EPOCH_NUM": epochs, "LR_POLICY": "Step", "LR": 0.01}, "DATA": {"CLIP_LEN": 4},
            "MODEL": {"NAME": "videomae_base", "HF_CONFIG": {
                "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                "num_frames": 4, "image_size": 32, "patch_size": 16}}}}})

    ref, resumed = f"{cluster.name}-{sharding}", f"{cluster.name}-{sharding}-resumed"
    whole = flat(launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={ref}", *videomae(2), *TWO_NODES).stdout)
    assert f"Job {ref} started: 2 node(s) (node0, node1)" in whole and f"Job {ref} finished" in whole
    first = flat(launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={resumed}", *videomae(1),
                        *TWO_NODES).stdout)
    assert f"Job {resumed} finished" in first
    again = flat(launch(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={resumed}", *videomae(2),
                        *TWO_NODES).stdout)
    assert f"Job {resumed} finished" in again
    log = (REPO / "runs" / resumed / "log.txt").read_text()
    suffix = "dcp" if sharding == "fsdp2" else "pth"
    assert re.search(rf"resumed from \S*epoch_0001\.{suffix} at epoch 1", log), log[-3000:]
    assert ("FSDP2: model videomae_base sharded over 2 rank(s)" in log) == (sharding == "fsdp2"), log[-3000:]
    digests = [json.loads((REPO / "runs" / job / "weights_digest.json").read_text()) for job in (ref, resumed)]
    assert all(d["identical"] and d["world_size"] == 2 for d in digests), digests
    assert digests[0]["digests"][0] == digests[1]["digests"][0]


def test_a_node_lost_with_no_spare_leaves_the_world_and_the_survivors_go_on_from_memory(cluster: LocalCluster
                                                                                         ) -> None:
    """Three trainers, no spare, vidcluster_min_nodes=2: node2's machine goes (every process of its namespace
    killed) mid-run; the job trains to the end on node0 and node1 without a person, both survivors going on from the
    step they held in memory (no checkpoint read), the global batch kept by accumulation, the change on record."""
    job = f"{cluster.name}-shrink"
    epochs = 20
    play = launch_in_background(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}",
                                "-e", "vidcluster_min_nodes=2", *training(epochs))  # fmt: skip
    try:
        wait_for_epoch(cluster, job, 5, play)
        signal_netns(cluster.nodes[2].netns, signal.SIGKILL)  # its machine is gone (its disk, the shared home, stays)
        out = finish(play, timeout=600)
    finally:
        cluster.create(len(cluster.nodes), *CLUSTER_ARGS)  # node2's sshd back, for the scenarios after this one
    assert play.returncode == 0 and f"Job {job} finished" in flat(out), out[-4000:]
    # the accumulation as the trainers said it: 3 micro-batches of a step over 2 ranks take 2 each
    assert "node2 left the world (lost, no spare): 3 nodes -> 2, accumulation 1 -> 2" in flat(out), out[-4000:]
    rec = JobRecord.read(node_state(cluster.nodes[0], job)["record"])
    assert rec.assignment == {"node0": 0, "node1": 1} and rec.restarts == 1, rec
    [change] = rec.world_changes
    assert (change.left, change.before, change.after, change.cause) == (("node2",), 3, 2, Kind.LOST), change
    for survivor in ("node0", "node1"):  # each one's pause on record: its last step before, its first one after
        timeline = rec.attempts[1].nodes[survivor]
        assert timeline.step_before is not None and timeline.first_step is not None, timeline
        assert timeline.step_before < change.at < timeline.first_step, (change, timeline)
    assert report.timeline_lines(rec)[1].count(" s since its last step before") == 2, report.timeline_lines(rec)
    # what the change cost, in goodput: its restart (the hub's decision to the first batch after it), of the restarts
    assert rec.goodput is not None and 0 < rec.goodput.world_change_s <= rec.goodput.restart_s, rec.goodput
    # The survivors went on from memory: nothing trained twice, no checkpoint read, soon after the hub named the loss
    # (restart_s: the loss named to the first step after it), neither waiting out node_wait (300 s) nor a
    # collective's timeout (gloo: trainer.distributed.abort_groups). Issue 37 asks for a step and 2 s: 0.5 s here
    # (detect_s, the node's silence up to the heartbeat timeout, 10 s, comes before it).
    metrics = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    [attempt] = [line for line in metrics if "attempt" in line]
    assert attempt["resumed_from"] == "memory" and attempt["steps_lost"] == 0, attempt
    assert attempt["restart_s"] < 20, attempt
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "resumed from" not in log, log[-3000:]
    trained = [line["epoch"] for line in metrics if "epoch" in line and "attempt" not in line]
    assert trained == list(range(1, epochs + 1)), trained
    digest = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert digest["world_size"] == 2 and digest["identical"], digest


def test_a_rebooted_node_comes_back_into_the_running_job_when_the_launch_is_run_again(cluster: LocalCluster) -> None:
    """Three trainers, no spare, vidcluster_min_nodes=2: node2's machine goes (every process of its namespace killed:
    nothing of its supervisor is left to come back by itself) and the world shrinks to two. Its machine back (its sshd
    started again, its job folder kept, as a reboot keeps a disk), the same launch run again attaches to the running
    job and starts node2's supervisor anew, which rejoins: node2 trains as rank 2 again from a peer's memory."""
    job = f"{cluster.name}-rejoin"
    args = ("-e", f"config={CONFIG}", "-e", f"job_id={job}", "-e", "vidcluster_min_nodes=2", *training(300))
    launch(cluster, *args, "-e", "wait=false")
    lost = cluster.nodes[2]
    try:
        wait_for_epoch(cluster, job, 3)
        signal_netns(lost.netns, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not JobRecord.read(node_state(cluster.nodes[0], job)["record"]).world_changes:
            assert time.monotonic() < deadline, "the world never shrank"
            time.sleep(0.2)
    finally:
        cluster.create(len(cluster.nodes), *CLUSTER_ARGS)  # node2's machine back: its sshd, the same home
    again = flat(launch(cluster, *args, "-e", "wait=false").stdout)
    assert f"Job {job} is running (its hub on node0): following it instead of starting it again" in again
    assert f"node2 comes back into job {job} (its supervisor had died)" in again
    log, deadline = node_job_dir(lost, job) / "train.log", time.monotonic() + 120
    while "rank 2 joined at step" not in log.read_text():
        assert time.monotonic() < deadline, ("node2 never joined", log.read_text()[-3000:])
        time.sleep(0.5)
    rec = JobRecord.read(node_state(cluster.nodes[0], job)["record"])
    cluster.playbook("stop-training.yml", "-e", f"job_id={job}")
    assert job_processes(job) == []  # the relaunched supervisor, its trainer and its standby too
    left, joined = rec.world_changes
    assert (left.left, left.cause, joined.joined, joined.after, joined.cause) == (
        ("node2",), Kind.LOST, ("node2",), 3, Kind.JOINED), rec.world_changes
    assert rec.assignment == {"node0": 0, "node1": 1, "node2": 2}, rec.assignment
    node2_log = log.read_text()
    assert node2_log.count("supervisor: supervising ") == 2, node2_log[-3000:]  # the launch's, and the relaunch's
    assert "from rank 0's memory" in node2_log, node2_log[-3000:]


def test_a_lost_node_that_answers_again_rejoins_the_world_from_a_peers_memory(cluster: LocalCluster) -> None:
    """Three trainers, no spare, vidcluster_min_nodes=2: node2's machine hangs (every process of its namespace
    stopped: silent, as a machine cut off) and the world shrinks to node0 and node1; then node2 answers again: its
    trainer leaves its old attempt and waits in place, and joins the running job as rank 2 in its own process, from
    rank 0's memory (its own is stale; no checkpoint read anywhere), the accumulation back to the launch's. The grow
    is not a restart."""
    job = f"{cluster.name}-grow"
    epochs = 60
    # The role's default stop grace (15 s), not this module's 5: node2's trainer, thawed on a machine the other lane's
    # worker keeps busy, once took over 4 s to leave its attempt and was killed for it (its standby then joined).
    play = launch_in_background(cluster, "-e", f"config={CONFIG}", "-e", f"job_id={job}",
                                "-e", "vidcluster_min_nodes=2", "-e", "ddp_config_stop_grace=15",
                                *training(epochs))  # fmt: skip
    lost = cluster.nodes[2]
    try:
        wait_for_epoch(cluster, job, 5, play)
        signal_netns(lost.netns, signal.SIGSTOP)  # its machine hangs
        deadline = time.monotonic() + 120
        while not JobRecord.read(node_state(cluster.nodes[0], job)["record"]).world_changes:
            assert time.monotonic() < deadline and play.poll() is None, "the world never shrank"
            time.sleep(0.2)
        thawed = time.time()
        signal_netns(lost.netns, signal.SIGCONT)
        out = finish(play, timeout=600)
    finally:
        signal_netns(lost.netns, signal.SIGCONT)
    assert play.returncode == 0 and f"Job {job} finished" in flat(out), out[-4000:]
    rec = JobRecord.read(node_state(cluster.nodes[0], job)["record"])
    assert rec.assignment == {"node0": 0, "node1": 1, "node2": 2} and rec.restarts == 1, rec
    left, joined = rec.world_changes
    assert (left.left, left.before, left.after, left.cause) == (("node2",), 3, 2, Kind.LOST), left
    assert (joined.joined, joined.before, joined.after, joined.cause) == (("node2",), 2, 3, Kind.JOINED), joined
    assert [report.accumulation(rec, attempt) for attempt in (0, 1, 2)] == [1, 2, 1], rec.attempts
    metrics = [json.loads(line) for line in (REPO / "runs" / job / "metrics.jsonl").read_text().splitlines()]
    attempts = [line for line in metrics if "attempt" in line]
    assert [(a["cause"], a["resumed_from"], a["steps_lost"]) for a in attempts] == [
        ("lost", "memory", 0), ("joined", "memory", 0)], attempts
    log = (REPO / "runs" / job / "log.txt").read_text()
    assert "resumed from" not in log and "accumulation 1 -> 2" in log and "accumulation 2 -> 1" in log, log[-3000:]
    node2_log = (node_job_dir(lost, job) / "train.log").read_text()
    assert "rank 2 joined at step" in node2_log and "from rank 0's memory" in node2_log, node2_log[-3000:]
    joiner = rec.attempts[-1].nodes["node2"]
    # Its trainer, stopped as long as its supervisor, was not taken for frozen: it parked, ready at once (no new
    # process's imports to wait for), and went on in place. Unless gloo left it in a send on a connection that failed
    # while it was stopped (trainer.inplace, STUCK_S): then it said so and ended, and its standby joined.
    stuck = "ending this process so that its supervisor starts the next attempt in its standby" in node2_log
    assert joiner.start == (Start.STANDBY if stuck else Start.IN_PLACE), (stuck, rec.attempts[-1])
    first_step = joiner.first_step
    assert first_step is not None and first_step - thawed < 60, (first_step - thawed, rec.attempts[-1])
    trained = [line["epoch"] for line in metrics if "epoch" in line and "attempt" not in line]
    assert trained == list(range(1, epochs + 1)), trained
    digest = json.loads((REPO / "runs" / job / "weights_digest.json").read_text())
    assert digest["world_size"] == 3 and digest["identical"], digest
