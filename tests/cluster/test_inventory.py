"""playbooks/validate-inventory.yml: the inventory contract is checked before any node is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import REPO, run_playbook

PLAYBOOK = REPO / "playbooks" / "validate-inventory.yml"


def test_sample_inventory_is_valid() -> None:
    run_playbook(PLAYBOOK, inventory=REPO / "inventory" / "sample" / "hosts.yml")


@pytest.mark.parametrize(
    ("host_b", "message"),
    [
        ("{ansible_host: 192.0.2.11, cluster_ip: 192.0.2.10, node_rank: 1}", "192.0.2.10 is used by a, b"),
        ("{ansible_host: 192.0.2.11, node_rank: 2}", "a=0, b=2"),
    ],
    ids=["duplicate-address", "rank-gap"],
)
def test_duplicate_address_and_bad_ranks_are_named(tmp_path: Path, host_b: str, message: str) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    trainers:\n      hosts:\n"
        "        a: {ansible_host: 192.0.2.10, node_rank: 0}\n"
        f"        b: {host_b}\n"
    )
    proc = run_playbook(PLAYBOOK, inventory=inventory, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout


def test_empty_trainers_group_fails_clearly(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    other: {ansible_host: 192.0.2.20}\n")
    proc = run_playbook(PLAYBOOK, inventory=inventory, check=False)
    assert proc.returncode != 0
    assert "no hosts in the group 'trainers'" in proc.stdout
