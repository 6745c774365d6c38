"""Build the router a frontend (or ``dyn router``) asks for by mode (``dyn.core.router.modes``)
and config, with what only a live router has: KV-event ingestion from the workers' sockets, a
remote ``dyn router`` or ``dyn indexer``, replica sync.

The router metrics are registered on ``registry`` in every mode (Dynamo registers them eagerly,
so dashboards see zeros rather than gaps outside ``kv``); the routers of several models built on
one registry (a frontend serving several models) share them, so they count every model together. In ``kv`` mode the router is a
``RemoteRouter`` when ``router_address`` names a ``dyn router`` (``tcp://...``, or ``auto``: found
in discovery), else an embedded ``KvRouter``; with ``config.replica_sync`` that router gets a
``ReplicaSync`` companion (started by ``KvRouter.run``) that binds its PUB on ``host`` and
advertises ``serve_endpoint`` (a ``dyn router``'s query socket) in the routers' namespace.

A ``RemoteRouter`` gets a least-loaded router of its own (``least-loaded`` mode, built here) to
route with while its ``dyn router`` is unreachable. Where a ``dyn router`` or ``dyn indexer`` is
asked, ``dyn_router_remote_reachable{service="router"|"indexer", model}`` is 1 while it answers
and 0 while it does not (or none is found yet).
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Gauge

from dyn.core.router.config import KvRouterConfig
from dyn.core.router.metrics import RouterMetrics
from dyn.core.router.modes import RouterContext, router_mode
from dyn.core.router.policy import Router
from dyn.core.router.pool import WorkerPool

log = logging.getLogger("dyn.router")
INDEXER_LOOKUP_S = 1.0


def build_router(
    mode: str,
    pool: WorkerPool,
    config: KvRouterConfig,
    registry: CollectorRegistry,
    *,
    namespace: str = "default",
    router_address: str | None = None,
    router_id: str = "0",
    host: str = "127.0.0.1",
    serve_endpoint: str | None = None,
) -> Router:
    """The router of ``mode`` (``dyn.core.router.modes``) over ``pool``; ``ValueError``
    (``ConfigError``) names what to fix.

    ``kv`` embeds a ``KvRouter`` unless ``router_address`` names a ``dyn router`` to ask instead.
    """
    spec = router_mode(mode)
    if config.uses_aic and mode != "kv":
        raise ValueError(
            f"--router-prefill-load-model {config.prefill_load_model} models the KV router's "
            f"prompt load: it needs --router-mode kv, not {mode}"
        )
    metrics = _shared(
        registry, ("router", namespace, router_id), lambda: RouterMetrics(registry, namespace, router_id)
    )
    if router_address is not None:
        if mode != "kv":
            raise ValueError("--router-address needs --router-mode kv")
        if config.replica_sync:
            raise ValueError(
                "--router-replica-sync syncs routers that route in their own "
                "process; with --router-address the dyn router routes: pass "
                "--router-replica-sync to the dyn router replicas instead"
            )
        if config.uses_aic:
            raise ValueError(
                "with --router-address the dyn router routes: pass --router-prefill-load-model "
                f"{config.prefill_load_model} and the --aic-* flags to the dyn router instead"
            )
        from dyn.core.router.remote import RemoteRouter

        fallback = build_router(
            "least-loaded", pool, config, registry, namespace=namespace, router_id=router_id
        )
        remote = RemoteRouter(pool, router_address, fallback=fallback)
        _reachable(registry, "router", pool.model_name, lambda: remote.reachable)
        return remote

    from dyn.core.kv.ingest import KvEventIngestor, KvEventMetrics

    event_metrics = functools.partial(_shared, registry, ("kv-events",), lambda: KvEventMetrics(registry))
    if mode == "kv":
        event_metrics()  # registered eagerly, as the router metrics are

    def ingest(indexer: Any) -> KvEventIngestor:
        return KvEventIngestor(indexer, event_metrics(), event_threads=config.event_threads)

    from dyn.core.router.disagg import DisaggRouter
    from dyn.core.router.kv import KvRouter

    def build(role_pool: WorkerPool, role_config: KvRouterConfig) -> Router:
        return spec.build(RouterContext(pool=role_pool, config=role_config, metrics=metrics, ingest=ingest))

    disagg = DisaggRouter(pool, build, config, metrics)
    router = disagg.agg
    if not isinstance(router, KvRouter):  # what follows serves the KV router only
        return disagg
    if config.use_remote_indexer and config.uses_indexer:
        router.companions.append(functools.partial(_remote_indexer, router, pool, config.indexer_address))
        kv = router
        _reachable(
            registry,
            "indexer",
            pool.model_name,
            lambda: kv.remote_indexer is not None and kv.remote_indexer.reachable,
        )
    if config.replica_sync:
        from dyn.core.router.sync import ReplicaSync

        sync = ReplicaSync(
            router, pool.store, model_name=pool.model_name, host=host, request_endpoint=serve_endpoint
        )
        router.companions.append(sync.run)
    return disagg


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, dict[tuple[str, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


def _shared(registry: CollectorRegistry, key: tuple[str, ...], make: Any) -> Any:
    """The metrics ``make()`` registers on ``registry``, made once per ``key`` (a registry
    refuses a second registration of the same names)."""
    made = _METRICS.setdefault(registry, {})
    if key not in made:
        made[key] = make()
    return made[key]


def _reachable(registry: CollectorRegistry, service: str, model: str | None, answers: Any) -> None:
    """Show ``answers()`` (read at scrape) as the ``service``'s reachability gauge."""
    gauge = _shared(
        registry,
        ("remote-reachable",),
        lambda: Gauge(
            "dyn_router_remote_reachable",
            "1 while the dyn router (service=router) or dyn indexer (service=indexer) this "
            "process asks answers, else 0 (routing is on load alone meanwhile)",
            ["service", "model"],
            registry=registry,
        ),
    )
    gauge.labels(service, model or "").set_function(lambda: float(answers()))


async def _remote_indexer(
    router: Any, pool: WorkerPool, address: str | None, *, task_status: Any = anyio.TASK_STATUS_IGNORED
) -> None:
    """``--use-remote-indexer``: ask the ``dyn indexer`` at ``address`` (or the one found in
    discovery, looked up every second until there is one) for overlaps. Until it answers, the
    router routes on load alone."""
    from dyn.core.indexer.client import (
        RemoteIndexer,
        indexers_store,
        live_indexer_address,
    )

    task_status.started()
    if address is None:
        store = indexers_store(pool.store)
        warned = False
        while (address := await live_indexer_address(store, pool.model_name)) is None:
            if not warned:
                router.remote_indexer_missing = (
                    f"--use-remote-indexer: no dyn indexer for model {pool.model_name!r} in discovery yet"
                )
                log.warning("%s; routing on load alone until one starts", router.remote_indexer_missing)
                warned = True
            await anyio.sleep(INDEXER_LOOKUP_S)
        router.remote_indexer_missing = None
    log.info("asking the dyn indexer at %s for KV overlaps", address)
    indexer = RemoteIndexer(address)
    async with anyio.create_task_group() as tg:
        await tg.start(indexer.run)
        router.remote_indexer = indexer
        try:
            await anyio.sleep_forever()
        finally:
            router.remote_indexer = None
