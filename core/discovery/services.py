"""Discovery of the services that are not workers: routers and indexers.

They use the same store and the same ``WorkerRecord`` shape as workers, each kind in a namespace
of its own (``{namespace}.routers``, ``{namespace}.indexers``) so worker pools never see them.
``engine`` names the kind (``dyn-router``, ``dyn-indexer``), ``model_name`` the model served,
``endpoints.request`` the service's ZMQ query socket (``""`` when it takes no queries), and the
KV fields are 0 unless the kind gives them a meaning (an indexer's ``block_size``). A service
holds its record with ``store.lease`` (heartbeats, deleted on shutdown), like a worker.
"""

from __future__ import annotations

import os
import secrets
import time

import dyn.core as core_pkg
from dyn.core.discovery.store import DiscoveryStore, validate_namespace
from dyn.core.messages import WorkerEndpoints, WorkerRecord


def new_instance_id() -> int:
    """A random positive 63-bit instance id (workers, routers and indexers alike)."""
    return secrets.randbits(63) or 1


def service_namespace(namespace: str, kind: str) -> str:
    """The namespace services of ``kind`` (``routers``, ``indexers``) of ``namespace`` use."""
    return validate_namespace(f"{namespace}.{kind}")


def service_store(store: DiscoveryStore, kind: str) -> DiscoveryStore:
    """A store on the same backend as the workers' ``store``, for its ``kind`` services."""
    services = store.for_namespace(service_namespace(store.namespace, kind))
    if services is None:
        raise ValueError(f"{kind} discovery is not built for {type(store).__name__}")
    return services


def service_record(
    namespace: str,
    engine: str,
    model_name: str | None,
    instance_id: int,
    *,
    request: str | None = None,
    kv_events: str | None = None,
    metrics: str | None = None,
    block_size: int = 0,
) -> WorkerRecord:
    """The record a service of kind ``engine`` registers in ``namespace`` (a service namespace)."""
    return WorkerRecord(
        instance_id=instance_id,
        namespace=namespace,
        model_name=model_name or "",
        engine=engine,
        endpoints=WorkerEndpoints(request=request or "", kv_events=kv_events, metrics=metrics),
        block_size=block_size,
        total_kv_blocks=0,
        max_num_batched_tokens=0,
        pid=os.getpid(),
        started_at=time.time(),
        version=core_pkg.__version__,
    )
