"""The discovery backends by name: ``open_store`` picks one, ``register_backend`` adds one.

A backend is a name and an *opener*: a function of ``(namespace, root, *, etcd_endpoints,
check)`` that returns the ``DiscoveryStore``; each opener uses what it needs of those and imports
its store module only when called, so choosing ``file`` never imports etcd's client. Built in:

- ``file`` (``FileDiscoveryStore``, the default): ``root`` is the runtime directory.
- ``etcd`` (``EtcdDiscoveryStore``): ``etcd_endpoints`` are the cluster's URLs; ``check`` asks
  etcd once, synchronously, whether it answers.
- ``memory`` (``MemoryDiscoveryStore``): ``root`` names a ``MemoryHub`` made in this process.
  Records live in that process only, so it is for tests, and it is *not listed*: the command
  line's ``--discovery-backend`` help and the unknown-backend error name only the listed backends
  (``BACKENDS``).

The abstract store (``store.py``) knows none of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from dyn.core.discovery.store import DiscoveryStore, validate_namespace


class Opener(Protocol):
    """Makes the store of one backend (see the module docstring)."""

    def __call__(
        self, namespace: str, root: str | Path | None, *, etcd_endpoints: str | None, check: bool
    ) -> DiscoveryStore: ...


@dataclass(frozen=True)
class Backend:
    """A registered backend: its name, its opener, and whether the command line offers it."""

    name: str
    open: Opener
    listed: bool = True


_registry: dict[str, Backend] = {}


def register_backend(name: str, opener: Opener, *, listed: bool = True) -> None:
    """Make ``opener`` the backend ``name`` of ``open_store``; ``ValueError`` if the name is taken.

    ``listed``: named where the command line lists the backends (``--discovery-backend``'s
    unknown-backend error); an unlisted backend still opens by its name.
    """
    if name in _registry:
        raise ValueError(f"discovery backend {name!r} is already registered")
    _registry[name] = Backend(name, opener, listed)


def registered_backends() -> Mapping[str, Backend]:
    """Every registered backend by name, listed or not (a read-only view)."""
    return MappingProxyType(_registry)


def listed_backends() -> tuple[str, ...]:
    """The names of the listed backends, in the order they were registered."""
    return tuple(name for name, backend in _registry.items() if backend.listed)


def open_store(
    backend: str,
    namespace: str,
    root: str | Path | None = None,
    *,
    etcd_endpoints: str | None = None,
    check: bool = True,
) -> DiscoveryStore:
    """The discovery store ``backend`` for ``namespace``.

    ``root`` is the runtime directory of ``"file"`` (default ``file_store.default_root()``);
    ``etcd_endpoints`` the comma-separated URLs of ``"etcd"`` (default ``$DYN_ETCD_ENDPOINTS``,
    else ``http://127.0.0.1:2379``). Raises ``ValueError`` for an unknown backend or namespace,
    and ``ConfigError`` (a ``ValueError``) for malformed endpoints or, with ``check``, an etcd
    that does not answer: every command opens its store before its event loop starts, so a
    synchronous check here is where "etcd is unreachable" becomes one line (it blocks for one
    loopback round trip when etcd is up, at most 2 s per endpoint when a host does not answer).
    """
    validate_namespace(namespace)
    found = _registry.get(backend)
    if found is None:
        raise ValueError(
            f"unknown discovery backend {backend!r}; choose one of: {', '.join(listed_backends())}"
        )
    return found.open(namespace, root, etcd_endpoints=etcd_endpoints, check=check)


def _open_file(
    namespace: str, root: str | Path | None, *, etcd_endpoints: str | None, check: bool
) -> DiscoveryStore:
    from dyn.core.discovery.file_store import FileDiscoveryStore, default_root

    return FileDiscoveryStore(Path(root) if root is not None else default_root(), namespace)


def _open_etcd(
    namespace: str, root: str | Path | None, *, etcd_endpoints: str | None, check: bool
) -> DiscoveryStore:
    from dyn.core.discovery.etcd_store import EtcdDiscoveryStore

    store = EtcdDiscoveryStore(etcd_endpoints or os.environ.get("DYN_ETCD_ENDPOINTS") or None, namespace)
    if check:
        store.gateway.check()
    return store


def _open_memory(
    namespace: str, root: str | Path | None, *, etcd_endpoints: str | None, check: bool
) -> DiscoveryStore:
    from dyn.core.discovery.memory_store import MemoryDiscoveryStore, hub_named

    return MemoryDiscoveryStore(hub_named(root), namespace)


register_backend("file", _open_file)
register_backend("etcd", _open_etcd)
register_backend("memory", _open_memory, listed=False)

BACKENDS: tuple[str, ...] = listed_backends()
"""The built-in backends the command line offers: ``("file", "etcd")``."""
