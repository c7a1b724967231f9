"""Shared fixtures for every test folder: the local test cluster factory lives in tests/cluster/conftest.py.

The suite runs on two pytest-xdist workers (pyproject.toml): every cluster test goes to one of them, in order (they
share clusters built by session fixtures), while the trainer tests spread over both; so do the GPU tests, which
share the GPUs.

The test processes, and whatever they start, see no GPU: a test of a CPU path (gloo, CPU_WORKERS processes, crops
made in the DataLoader workers) means the same on a laptop and on a GPU node. CUDA_VISIBLE_DEVICES is emptied here,
before anything initialises CUDA; what it was is kept in GPUS_ENV (inherited by the xdist workers) for the GPU tests
(tests/trainer/test_gpu.py), whose own processes see the GPUs again.
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.conftest import local_cluster

__all__ = ["local_cluster"]

GPUS_ENV = "VIDCLUSTER_TEST_VISIBLE_GPUS"
ALL_GPUS = "all"  # CUDA_VISIBLE_DEVICES was not set
os.environ.setdefault(GPUS_ENV, os.environ.get("CUDA_VISIBLE_DEVICES", ALL_GPUS))
os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif "tests/trainer/test_gpu.py" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("gpu"))
