"""Where routers announce themselves: the ``{namespace}.routers`` discovery namespace.

Routers are services (``dyn.core.discovery.services``) of kind ``routers``:

- ``engine`` is ``"dyn-router"``, ``model_name`` the model it routes, the KV fields are 0;
- ``endpoints.request`` is the router's ZMQ query socket (``dyn router``), or ``""`` when it takes
  no queries (a frontend's embedded router that only syncs);
- ``endpoints.kv_events`` is its replica-sync PUB socket, or ``None`` without
  ``--router-replica-sync``.
"""

from __future__ import annotations

from dyn.core.discovery.services import service_record, service_store
from dyn.core.discovery.store import DiscoveryStore
from dyn.core.messages import WorkerRecord

ROUTER_ENGINE = "dyn-router"


def routers_store(store: DiscoveryStore) -> DiscoveryStore:
    """A store on the same backend as the workers' ``store``, for its routers' namespace."""
    return service_store(store, "routers")


def router_record(
    store: DiscoveryStore,
    model_name: str | None,
    instance_id: int,
    *,
    request: str | None = None,
    kv_events: str | None = None,
) -> WorkerRecord:
    """The record a router registers in ``store`` (a ``routers_store``)."""
    return service_record(
        store.namespace, ROUTER_ENGINE, model_name, instance_id, request=request, kv_events=kv_events
    )


def serves_queries(record: WorkerRecord, model_name: str | None) -> bool:
    """Whether ``record`` is a ``dyn router`` that answers route queries for ``model_name``."""
    return (
        record.engine == ROUTER_ENGINE
        and bool(record.endpoints.request)
        and (model_name is None or record.model_name in (model_name, ""))
    )
