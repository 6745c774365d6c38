"""In-memory discovery stores for unit tests that use discovery only as plumbing (a worker pool to
feed, a host to register): ``memory_store(tmp_path, "t")`` where a test used to make
``FileDiscoveryStore(tmp_path, "t")``. No files, no watcher thread, and a watcher hears of a change
at once instead of after inotify's 50 ms batching. Tests of the file or etcd backend themselves,
and tests whose processes must see each other, keep the real backends.
"""

from __future__ import annotations

from pathlib import Path

from dyn.core.discovery.memory_store import MemoryDiscoveryStore, MemoryHub, hub_named


def memory_hub(place: str | Path) -> MemoryHub:
    """The hub named after ``place`` (a test's ``tmp_path``), made if none lives: stores of one
    place share their records, as file stores of one directory do, for as long as one of them
    (or the hub) is referenced."""
    try:
        return hub_named(place)
    except ValueError:
        return MemoryHub(str(place))


def memory_store(place: str | Path, namespace: str, **options) -> MemoryDiscoveryStore:
    """An in-memory store of ``namespace`` on the hub of ``place`` (``options``: ``clock``)."""
    return MemoryDiscoveryStore(memory_hub(place), namespace, **options)
