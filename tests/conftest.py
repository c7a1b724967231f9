"""Shared fixtures for every test folder: the local test cluster factory lives in tests/cluster/conftest.py."""

from tests.cluster.conftest import local_cluster

__all__ = ["local_cluster"]
