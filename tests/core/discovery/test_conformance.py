"""The discovery contract (``conformance.py``) on every backend: file, memory, and etcd on a real
server.

A new backend joins by adding a parameter to ``backend`` below.
"""

from __future__ import annotations

import pytest

from dyn.core.discovery import EtcdDiscoveryStore, FileDiscoveryStore, MemoryDiscoveryStore, MemoryHub
from tests.core.discovery.conformance import *  # noqa: F403 (the suite's tests run here)
from tests.core.discovery.conformance import Backend


@pytest.fixture(params=["file", "memory", "etcd"])
async def backend(request, tmp_path):
    if request.param == "file":
        made = Backend("file", lambda ns: FileDiscoveryStore(tmp_path, ns), ttl_s=1.0, expiry_slack_s=1.0)
    elif request.param == "memory":
        hub = MemoryHub()  # the place the stores share, as the file stores share tmp_path
        made = Backend("memory", lambda ns: MemoryDiscoveryStore(hub, ns), ttl_s=1.0, expiry_slack_s=1.0)
    else:
        server = request.getfixturevalue("etcd_server")
        # etcd checks for expired leases every 500 ms and revokes them through raft
        made = Backend("etcd", lambda ns: EtcdDiscoveryStore(server.url, ns), ttl_s=2.0, expiry_slack_s=2.0)
    yield made
    for store in made.stores:
        await store.aclose()
