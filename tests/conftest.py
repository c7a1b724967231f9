"""Shared fixtures for every test folder: the local test cluster factory lives in tests/cluster/conftest.py.

The suite runs on two pytest-xdist workers (pyproject.toml): every cluster test goes to one of them, in order (they
share clusters built by session fixtures), while the trainer tests spread over both.
"""

from __future__ import annotations

import pytest

from tests.cluster.conftest import local_cluster

__all__ = ["local_cluster"]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("cluster"))
