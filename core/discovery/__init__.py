"""Service discovery: which worker instances are alive in a namespace, and watching them change.

``open_store(backend, namespace, root)`` returns a ``DiscoveryStore``; the ``"file"`` backend
(``FileDiscoveryStore``, one heartbeat-refreshed file per worker in a per-namespace runtime
directory) is the default and the only one built so far. Workers register with
``async with store.lease(record, ttl_s):``; frontends and routers call ``list()`` or ``watch()``.
"""

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
    "FileDiscoveryStore",
    "Lease",
    "LeaseExpired",
    "WorkerAdded",
    "WorkerRemoved",
    "default_root",
    "open_store",
    "validate_namespace",
]
