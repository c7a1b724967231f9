"""Shared fixtures for every test folder: the local test cluster factory lives in tests/cluster/conftest.py.

The suite runs on two pytest-xdist workers (pyproject.toml). The cluster tests of a module stay together on one
worker (they share the module's cluster), and the modules that share the session's private-home cluster
(``private_cluster``) stay together; the groups and the trainer tests spread over both workers. The GPU tests, which
share the GPUs, stay together too.

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

# Importing ansible (the launcher plugins' tests do) replaces sys.intern with a wrapper object (ansible-core 2.19),
# and torch._dynamo, which torchvision imports, then refuses to load. The suite holds both in one process, so
# torch's side loads first, here. (The launcher's own processes never import torch.)
import torch._dynamo  # noqa: E402, F401


def xdist_group(item: pytest.Item) -> str | None:
    """The worker group of a test: the tests that must run on one worker, in order, share one."""
    if "tests/trainer/test_gpu.py" in item.nodeid:
        return "gpu"
    if "tests/cluster/" not in item.nodeid:
        return None
    if "private_cluster" in getattr(item, "fixturenames", ()):
        return "cluster-private"
    return f"cluster-{item.nodeid.split('::')[0]}"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
