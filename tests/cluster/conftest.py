"""Local test clusters for the cluster tests (and anyone else's): real network-namespace hosts with their
own sshd, built and torn down by playbooks/local-cluster.yml. Needs root."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from trainer.runtime.contract import CHANNEL_ENV, TRAINER_ENV
from trainer.runtime.host.channel import ProcState

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
STATE_ROOT = REPO / ".local-cluster"
CLUSTER_PLAYBOOK = REPO / "playbooks" / "local-cluster.yml"
USER = "vctrain"
_RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def playbook_env() -> dict[str, str]:
    """The playbooks' environment in the tests (this process's, as it is now): the venv's tools, no colours, and
    Ansible's default output, every task and host included (ansible.cfg's `vidcluster` output leaves out what says
    nothing; tests read it all)."""
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0", "PYTHONUNBUFFERED": "1", "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"}


def run_playbook(path: str | Path, *args: str, inventory: Path | None = None, check: bool = True,
                 timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ansible-playbook from the repo root with the venv's tools; on failure (check=True) fail the
    test with the tail of the output."""
    cmd = [str(VENV_BIN / "ansible-playbook")]
    if inventory is not None:
        cmd += ["-i", str(inventory)]
    cmd += [str(path), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env or playbook_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}")
    return proc


def local_play(folder: Path, play: list[dict[str, object]], env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """Run ``play`` on this machine alone (node0: a local connection with this Python), as run_playbook runs a
    playbook; the play and its inventory are written to ``folder``."""
    (folder / "play.yml").write_text(yaml.safe_dump(play))
    (folder / "hosts").write_text(f"node0 ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return run_playbook(folder / "play.yml", inventory=folder / "hosts", check=False, timeout=300, env=env)


def flat(text: str) -> str:
    """Output with every run of whitespace made one space: Ansible folds long messages at any space."""
    return " ".join(text.split())


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counters per host: {'node0': {'ok': 3, 'changed': 0, 'unreachable': 0, 'failed': 0}}."""
    return {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
            for m in _RECAP.finditer(stdout)}


def recap_of(stdout: str, hosts: Iterable[str]) -> dict[str, dict[str, int]]:
    """The PLAY RECAP counters of exactly these hosts; fails when one is missing (a regex that matched nothing must
    not pass for 'nothing changed')."""
    found = recap(stdout)
    missing = [host for host in hosts if host not in found]
    assert not missing, f"no PLAY RECAP line for {missing}:\n{stdout[-3000:]}"
    return {host: found[host] for host in hosts}


def changed_total(stdout: str, hosts: Iterable[str]) -> int:
    """Changed results summed over these hosts, every one of which must be in the recap."""
    return sum(counters["changed"] for counters in recap_of(stdout, hosts).values())


def load_file(path: Path) -> ModuleType:
    """A Python file of a role (a filter plugin, a script it runs on the nodes) as a module, for its plain functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Node:
    index: int
    name: str
    ip: str
    netns: str
    dir: Path  # controller-side node directory: home/, ssh/ (the node's /etc/ssh), sshd.pid, sshd.log
    cluster_ip: str = ""  # the inventory's cluster_ip (the IPv6 address on a cluster made with ipv6=true)

    @property
    def home(self) -> Path:
        """The node's home on the controller (one folder for every node of a cluster made with shared_home)."""
        shared = self.dir.parent.parent / "shared-home"
        return shared if shared.is_dir() else self.dir / "home"

    @property
    def sshd_pid(self) -> int:
        return int((self.dir / "sshd.pid").read_text().strip())


@dataclass
class LocalCluster:
    name: str
    state_dir: Path
    nodes: list[Node] = field(default_factory=list)
    settings: tuple[str, ...] = ()  # the -e settings it was made with, which a repair keeps

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory.yml"

    @property
    def key(self) -> Path:
        return self.state_dir / "id_ed25519"

    def playbook(self, path: str | Path, *extra_args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_playbook(path, *extra_args, inventory=self.inventory, check=check)

    def playbook_in_background(self, path: str | Path, *extra_args: str) -> subprocess.Popen[str]:
        """A play that runs while the test goes on (output_until, finish); stderr in its stdout."""
        return subprocess.Popen([str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory), str(path), *extra_args],
                                cwd=REPO, env=playbook_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def ssh(self, node: Node, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command on a node as the login user, over ssh from the controller with verified host keys."""
        cmd = ["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
               "-o", f"UserKnownHostsFile={self.state_dir / 'known_hosts'}", "-o", "ConnectTimeout=10",
               "-p", str(self.ssh_port), f"{USER}@{node.ip}", command]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)

    @property
    def ssh_port(self) -> int:
        match = re.search(r"ansible_port: (\d+)", self.inventory.read_text())
        return int(match[1]) if match else 22

    @property
    def names(self) -> list[str]:
        return [node.name for node in self.nodes]

    @property
    def slurm_conf(self) -> Path:
        """The configuration of a Slurm cluster (made with slurm=true); every node sees it at /etc/slurm."""
        return self.state_dir / "slurm" / "etc" / "slurm.conf"

    def create(self, nodes: int, *extra: str) -> subprocess.CompletedProcess[str]:
        """Build (or repair) the cluster; ``extra``: more -e settings of playbooks/local-cluster.yml. A Slurm
        cluster's nodes are its compute nodes (from its slurm.conf), then its login host."""
        proc = run_playbook(CLUSTER_PLAYBOOK, "-e", f"nodes={nodes}", "-e", f"cluster_name={self.name}", *extra)
        self.settings = extra
        hosts = {**slurm_compute_nodes(self.slurm_conf), **_inventory_hosts(self.inventory)}
        self.nodes = [Node(index=i, name=name, ip=h["ansible_host"], netns=f"vc-{self.name}-{i}",
                           dir=self.state_dir / "nodes" / str(i), cluster_ip=h["cluster_ip"])
                      for i, (name, h) in enumerate(hosts.items())]
        return proc

    def repair(self) -> subprocess.CompletedProcess[str]:
        """Run playbooks/local-cluster.yml again with the settings the cluster was made with (a stopped sshd starts)."""
        return self.create(len(self.nodes), *self.settings)

    def destroy(self) -> None:
        """state=absent (unless a test tore the cluster down already), then delete by name whatever is still there
        (processes, namespaces, links, state)."""
        if self.state_dir.exists():
            run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={self.name}", "-e", "state=absent", check=False)
        force_delete(self.name)


def _inventory_hosts(inventory: Path) -> dict[str, dict]:
    out = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(inventory), "--list"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    data = json.loads(out.stdout)
    hostvars = data["_meta"]["hostvars"]
    names = [name for group in ("trainers", "spares", "slurm_submit")
             for name in data.get(group, {}).get("hosts", [])]  # node0.. in order; a Slurm cluster's login host
    return {name: {"cluster_ip": hostvars[name]["ansible_host"], **hostvars[name]} for name in names}


def slurm_compute_nodes(conf: Path) -> dict[str, dict[str, str]]:
    """A Slurm cluster's compute nodes in order, with their addresses, as its slurm.conf names them (none without)."""
    lines = conf.read_text().splitlines() if conf.exists() else []
    found = [re.match(r"NodeName=(\S+) NodeAddr=(\S+)", line) for line in lines]
    return {m[1]: {"ansible_host": m[2], "cluster_ip": m[2]} for m in found if m}


def netns_names(cluster_name: str) -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ns["name"] for ns in json.loads(out or "[]") if re.fullmatch(rf"vc-{cluster_name}-\d+", ns["name"])]


def link_names(cluster_name: str) -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [link["ifname"] for link in json.loads(out)
            if re.fullmatch(rf"vcv-{cluster_name}-\d+|vcbr-{cluster_name}", link["ifname"])]


def netns_pids(netns: str) -> list[int]:
    """The processes of a network namespace: a test host's (none once it is gone)."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def signal_netns(netns: str, sig: signal.Signals) -> None:
    """``sig`` to every process of the namespace: SIGKILL, its machine is gone; SIGSTOP, it hangs. A process that
    ended between the listing and its signal (a play's ssh session) is passed over."""
    for pid in netns_pids(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def force_delete(cluster_name: str) -> None:
    """Last-resort cleanup by name, for when the playbook itself could not run."""
    for ns in netns_names(cluster_name):
        signal_netns(ns, signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for link in link_names(cluster_name):
        subprocess.run(["ip", "link", "delete", link], capture_output=True)
    # A Slurm cluster's slurmctld and munged run outside the namespaces: found by this cluster's paths in their argv.
    marks = (f"{STATE_ROOT / cluster_name}/slurm/".encode(), f"/run/vidcluster/slurm-{cluster_name}/".encode())
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and any(mark in (entry / "cmdline").read_bytes() for mark in marks):
                os.kill(int(entry.name), signal.SIGKILL)
    shutil.rmtree(f"/run/vidcluster/slurm-{cluster_name}", ignore_errors=True)
    shutil.rmtree(STATE_ROOT / cluster_name, ignore_errors=True)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Callable[..., LocalCluster]]:
    """Factory: ``local_cluster(nodes, *extra)`` builds a cluster with a unique name (``extra``: -e settings such as
    ``shared_home=true``); every cluster it made is torn down at the end of the session (call
    ``cluster.destroy()`` earlier to free it sooner)."""
    if os.geteuid() != 0:
        pytest.fail("the local test cluster needs root (network namespaces, sshd)")
    made: list[LocalCluster] = []
    suffixes = (f"{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in itertools.count())

    def make(nodes: int, *extra: str) -> LocalCluster:
        name = f"t{os.getpid() % 10000}{next(suffixes)}"
        cluster = LocalCluster(name=name, state_dir=STATE_ROOT / name)
        made.append(cluster)
        cluster.create(nodes, *extra)
        return cluster

    yield make
    for cluster in made:
        cluster.destroy()


def job_processes(job_id: str) -> list[int]:
    """Pids on this machine (every node's processes are here, in their namespaces) that belong to the job."""
    marker = f"/vidcluster/jobs/{job_id}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(var.startswith(b"VIDCLUSTER_JOB_DIR=") and marker in var for var in env):
                found.append(int(entry.name))
    return found


# A whole job in seconds on a local cluster: a poll every 2 s, one thread per trainer, a 10 s heartbeat timeout and
# stop grace, the hub looked for again after 15 s of silence, a quarter of an hour of following at most.
FAST_JOB_ARGS = (
    "-e", "ddp_launch_poll_seconds=2",
    "-e", "ddp_config_omp_num_threads=1",
    "-e", "ddp_config_heartbeat_timeout=10",
    "-e", "ddp_config_stop_grace=10",
    "-e", "ddp_launch_recheck_seconds=15",
    "-e", "ddp_launch_follow_hours=0.25",
)  # fmt: skip


def trainer_pid(job_id: str, node: str) -> int:
    """The job's trainer process on the node: of the processes that carry its node's job folder and attempt (its
    data loader workers and spawned workers inherit them), one its supervisor started (whose parent is none of them)
    and that says in its channel report that it trains. The other one its supervisor started is the standby, waiting
    for the next attempt: pids are no order (they wrap), and a standby handed an attempt keeps the environment it
    started with, so only its report tells them apart."""
    found: dict[int, dict[str, str]] = {}  # pid -> its environment
    for pid in job_processes(job_id):
        with contextlib.suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if f"/{job_id}/{node}\0".encode() in environ and f"{TRAINER_ENV}=".encode() in environ:
                found[pid] = dict(var.split("=", 1) for var in environ.decode().split("\0") if "=" in var)
    for pid, env in found.items():
        with contextlib.suppress(OSError, KeyError):  # gone, or without a report (a standby writes one once imported)
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) in found:
                continue
            # Through /proc/<pid>/root: the path as the process sees it, in its node's mount namespace. The channel's
            # own reader is not used: it trusts no file of another user (the nodes' login user), and this is root.
            report = json.loads(Path(f"/proc/{pid}/root{env[CHANNEL_ENV]}/{pid}.json").read_text())
            if report["state"] == ProcState.TRAINING:
                return pid
    raise AssertionError(f"no trainer of {job_id} on {node}")


def output_until(play: subprocess.Popen[str], text: str, seconds: float = 300) -> str:
    """A running play's output up to where it said ``text`` (failing the test if the play ends first)."""
    assert play.stdout is not None
    deadline, lines = time.monotonic() + seconds, []
    while time.monotonic() < deadline:
        line = play.stdout.readline()
        if not line:
            pytest.fail(f"the play ended before saying {text!r}:\n{''.join(lines)[-4000:]}")
        lines.append(line)
        if text in flat("".join(lines[-20:])):  # a message may be wrapped over lines
            return "".join(lines)
    play.kill()
    pytest.fail(f"the play did not say {text!r} in {seconds:.0f} s:\n{''.join(lines)[-4000:]}")


def finish(play: subprocess.Popen[str], timeout: float = 420) -> str:
    """A play's output once it ended (killed after ``timeout`` seconds)."""
    try:
        out, _ = play.communicate(timeout=timeout)
    finally:
        if play.poll() is None:
            play.kill()
    return out


def stage_dataset(cluster: LocalCluster, folder: Path, train: int = 8,
                  val: int = 4) -> subprocess.CompletedProcess[str]:
    """A small two-class H.264 dataset made in ``folder``/vidcluster-test and staged on every node at
    ~/data/vidcluster-test (what configs/i3d_cpu_test.yaml reads); the stage-data.yml run."""
    data = folder / "vidcluster-test"
    subprocess.run(
        [str(VENV_BIN / "python"), "-m", "trainer", "make-dataset", str(data), "--classes", "left", "right",
         "--train-per-class", str(train), "--val-per-class", str(val), "--size", "32", "--frames", "16"],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return cluster.playbook("playbooks/stage-data.yml", "-e", f"src={data}", "-e", "dest=data/vidcluster-test")


@contextlib.contextmanager
def closed_ports(node: Node, ssh_port: int) -> Iterator[None]:
    """The node's namespace drops every new TCP connection but SSH's (its sshd listens on ``ssh_port``) while the
    block runs."""
    # What a host firewall that does not know the cluster does: new TCP connections into the node are dropped; its
    # own connections (their replies) and SSH still work.
    rules = (f"table inet vidcluster_test {{\n chain input {{\n type filter hook input priority 0; policy accept;\n"
             f' ct state established,related accept\n iifname "lo" accept\n tcp dport {ssh_port} accept\n'
             " tcp flags syn drop\n }\n}\n")
    subprocess.run(["ip", "netns", "exec", node.netns, "nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", node.netns, "nft", "delete", "table", "inet", "vidcluster_test"],
                       check=True)


_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
_CPU_PERIOD_US = 100_000


def _cpu_cgroup_root() -> Path:
    """Where this machine's CPU controller lives: cgroup v2's unified tree when it offers ``cpu``, else v1's ``cpu``
    hierarchy (this machine's kind mounts v1)."""
    controllers = _CGROUP_V2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return _CGROUP_V2
    if (_CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return _CGROUP_V1_CPU
    pytest.fail("no CPU cgroup controller on this machine (neither cgroup v2's cpu nor v1's cpu hierarchy)")


def _move_to_cgroup(group: Path, pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, FileNotFoundError, OSError):  # it ended meanwhile
            (group / "cgroup.procs").write_text(f"{pid}\n")


@contextlib.contextmanager
def cpu_quota(node: Node, fraction: float) -> Iterator[Path]:
    """Every process of the test host (its sshd, and so every process a play or the job starts there later, and the
    ones already running: trainer, loader workers) gets ``fraction`` of one CPU while the block runs: a slow node,
    as a throttled GPU or a noisy neighbour makes one. Undone on the way out, on failure too. Yields the cgroup."""
    root = _cpu_cgroup_root()
    group = root / f"vidcluster-test-{node.netns}-{os.getpid()}"
    group.mkdir()
    try:
        quota = max(1000, int(fraction * _CPU_PERIOD_US))
        if root == _CGROUP_V2:
            (group / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}\n")
        else:
            (group / "cpu.cfs_period_us").write_text(f"{_CPU_PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        _move_to_cgroup(group, netns_pids(node.netns))
        yield group
    finally:
        # A process forked while a pass ran joins the group, and one that died stays in it until its parent reaps
        # it (it cannot be moved): move and retry until the group is empty.
        deadline = time.monotonic() + 60
        while True:
            _move_to_cgroup(root, [int(pid) for pid in (group / "cgroup.procs").read_text().split()])
            try:
                group.rmdir()
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def node_job_dir(node: Node, job_id: str) -> Path:
    """The node's own folder of a job, as the controller sees it."""
    return node.home / "vidcluster" / "jobs" / job_id / node.name


@pytest.fixture(scope="session")
def private_cluster(local_cluster: Callable[..., LocalCluster]) -> tuple[LocalCluster, str]:
    """3 nodes with private homes after one whole setup-cluster.yml run, and that run's output; the login user may use
    sudo on the nodes (the host firewall's tests). Shared by the SSH mesh tests, the private-home launch tests, the
    stage-data tests and the firewall tests, which put back whatever they break."""
    cluster = local_cluster(3, "-e", "sudo=true")
    return cluster, cluster.playbook("setup-cluster.yml").stdout
