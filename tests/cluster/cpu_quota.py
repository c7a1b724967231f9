"""A CPU quota on a test host's processes: the host computes at a fraction of one CPU, as a throttling GPU or a noisy
neighbour makes a real node slow (the straggler tests, check-cluster's). A cgroup of this machine's: cgroup v2's
``cpu.max`` where a unified hierarchy has the cpu controller, else cgroup v1's cpu controller
(``cpu.cfs_quota_us``). Every process of the host's network namespace moves into it (their children follow them),
and back out when the block ends; the cgroup is then removed."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

PERIOD_US = 100_000


def _hierarchy() -> tuple[Path, int]:
    """(a cgroup hierarchy with the cpu controller, its version): v2 first."""
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    for _, where, kind, *_ in mounts:
        controllers = Path(where) / "cgroup.controllers"
        if kind == "cgroup2" and controllers.is_file() and "cpu" in controllers.read_text().split():
            return Path(where), 2
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "cpu" in options.split(","):
            return Path(where), 1
    raise AssertionError("this machine has no cgroup hierarchy with the cpu controller")


def namespace_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout
    return [int(pid) for pid in out.split()]


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            (group / "cgroup.procs").write_text(str(pid))


@contextlib.contextmanager
def cpu_quota(netns: str, fraction: float, name: str) -> Iterator[Path]:
    """Every process of ``netns`` (and what they start) limited to ``fraction`` of one CPU while the block runs; the
    cgroup's folder."""
    root, version = _hierarchy()
    group = root / name
    group.mkdir()
    try:
        quota = max(1000, int(fraction * PERIOD_US))
        if version == 2:
            with contextlib.suppress(OSError):  # already enabled
                (root / "cgroup.subtree_control").write_text("+cpu")
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        _move(namespace_pids(netns), group)
        yield group
    finally:
        _move([int(pid) for pid in (group / "cgroup.procs").read_text().split()], root)
        group.rmdir()
