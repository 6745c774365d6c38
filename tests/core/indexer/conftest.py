"""Fixtures of the ``dyn indexer`` unit tests."""

from __future__ import annotations

import pytest

from dyn.core.discovery.memory_store import MemoryDiscoveryStore
from tests.memory_discovery import memory_store


@pytest.fixture
def store(tmp_path) -> MemoryDiscoveryStore:
    """The discovery store of namespace ``ns`` an indexer under test reads."""
    return memory_store(tmp_path / "discovery", "ns")
