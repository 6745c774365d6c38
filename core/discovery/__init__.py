"""Service discovery: which worker instances are alive in a namespace, and watching them change.

``open_store(backend, namespace, root, etcd_endpoints=...)`` returns a ``DiscoveryStore``: the
``"file"`` backend (``FileDiscoveryStore``, one heartbeat-refreshed file per worker in a
per-namespace runtime directory, the default) or ``"etcd"`` (``EtcdDiscoveryStore``, one key per
worker bound to an etcd lease, for workers on several machines; docs/discovery.md). Workers register with
``async with store.lease(record, ttl_s):``; frontends and routers call ``list()`` or ``watch()``.
"""

from dyn.core.discovery.etcd_store import EtcdDiscoveryStore
from dyn.core.discovery.file_store import FileDiscoveryStore, default_root
from dyn.core.discovery.store import (
    BACKENDS,
    DEFAULT_TTL_S,
    DiscoveryEvent,
    DiscoveryStore,
    Lease,
    LeaseExpired,
    WorkerAdded,
    WorkerRemoved,
    open_store,
    validate_namespace,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_TTL_S",
    "DiscoveryEvent",
    "DiscoveryStore",
    "EtcdDiscoveryStore",
    "FileDiscoveryStore",
    "Lease",
    "LeaseExpired",
    "WorkerAdded",
    "WorkerRemoved",
    "default_root",
    "open_store",
    "validate_namespace",
]
