"""Service discovery: which worker instances are alive in a namespace, and watching them change.

``open_store(backend, namespace, root, etcd_endpoints=...)`` returns a ``DiscoveryStore`` of the
backend registered under that name (``backends.py``): ``"file"`` (``FileDiscoveryStore``, one
heartbeat-refreshed file per worker in a per-namespace runtime directory, the default) or
``"etcd"`` (``EtcdDiscoveryStore``, one key per worker bound to an etcd lease, for workers on
several machines; docs/discovery.md); ``"memory"`` (``MemoryDiscoveryStore`` on a ``MemoryHub``)
keeps its records inside one process, for tests, and is not offered on the command line. Workers
register with ``async with store.lease(record, ttl_s):``; frontends and routers call ``list()``
or ``watch()``.
"""

from dyn.core.discovery.backends import (
    BACKENDS,
    listed_backends,
    open_store,
    register_backend,
    registered_backends,
)
from dyn.core.discovery.etcd_store import EtcdDiscoveryStore
from dyn.core.discovery.file_store import FileDiscoveryStore, default_root
from dyn.core.discovery.memory_store import MemoryDiscoveryStore, MemoryHub
from dyn.core.discovery.store import (
    DEFAULT_TTL_S,
    DiscoveryEvent,
    DiscoveryStore,
    Lease,
    LeaseExpired,
    WorkerAdded,
    WorkerRemoved,
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
    "MemoryDiscoveryStore",
    "MemoryHub",
    "WorkerAdded",
    "WorkerRemoved",
    "default_root",
    "listed_backends",
    "open_store",
    "register_backend",
    "registered_backends",
    "validate_namespace",
]
