"""Local test clusters for the cluster tests (and anyone else's): real network-namespace hosts with their
own sshd, built and torn down by playbooks/local-cluster.yml. Needs root."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

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

    def create(self, nodes: int, *extra: str) -> subprocess.CompletedProcess[str]:
        """Build (or repair) the cluster; ``extra``: more -e settings of playbooks/local-cluster.yml."""
        proc = run_playbook(CLUSTER_PLAYBOOK, "-e", f"nodes={nodes}", "-e", f"cluster_name={self.name}", *extra)
        self.settings = extra
        hosts = _inventory_hosts(self.inventory)
        self.nodes = [Node(index=i, name=name, ip=h["ansible_host"], netns=f"vc-{self.name}-{i}",
                           dir=self.state_dir / "nodes" / str(i), cluster_ip=h["cluster_ip"])
                      for i, (name, h) in enumerate(hosts.items())]
        return proc

    def repair(self) -> subprocess.CompletedProcess[str]:
        """Run playbooks/local-cluster.yml again with the settings the cluster was made with (a stopped sshd starts)."""
        return self.create(len(self.nodes), *self.settings)

    def destroy(self) -> None:
        """state=absent, then delete by name whatever is still there (processes, namespaces, links, state)."""
        run_playbook(CLUSTER_PLAYBOOK, "-e", f"cluster_name={self.name}", "-e", "state=absent", check=False)
        force_delete(self.name)


def _inventory_hosts(inventory: Path) -> dict[str, dict]:
    out = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(inventory), "--list"],
                         capture_output=True, text=True, check=True, cwd=REPO)
    data = json.loads(out.stdout)
    hostvars = data["_meta"]["hostvars"]
    names = [*data["trainers"]["hosts"], *data.get("spares", {}).get("hosts", [])]  # node0.. in order
    return {name: hostvars[name] for name in names}


def netns_names(cluster_name: str) -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ns["name"] for ns in json.loads(out or "[]") if re.fullmatch(rf"vc-{cluster_name}-\d+", ns["name"])]


def link_names(cluster_name: str) -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [link["ifname"] for link in json.loads(out)
            if re.fullmatch(rf"vcv-{cluster_name}-\d+|vcbr-{cluster_name}", link["ifname"])]


def force_delete(cluster_name: str) -> None:
    """Last-resort cleanup by name, for when the playbook itself could not run."""
    for ns in netns_names(cluster_name):
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
    for link in link_names(cluster_name):
        subprocess.run(["ip", "link", "delete", link], capture_output=True)
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
